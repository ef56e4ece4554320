package sidecar

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Defaults of the supervision knobs.
const (
	DefaultStartTimeout   = 30 * time.Second
	DefaultStopTimeout    = 10 * time.Second
	DefaultRestartBackoff = 250 * time.Millisecond
	DefaultMaxBackoff     = 30 * time.Second
	// DefaultStableAfter: a process that ran this long before crashing
	// restarts after the initial backoff again.
	DefaultStableAfter = time.Minute
	// readyPollInterval is how often start-up polls the connector's health.
	readyPollInterval = 100 * time.Millisecond
	// defaultKillWait bounds the wait for a child to exit after SIGKILL: a
	// process in uninterruptible sleep (a system call on a dead network
	// file system or a hung device) does not die of SIGKILL until that
	// call returns, which may be never.
	defaultKillWait = 5 * time.Second
)

// superviseConfig configures a supervisor.
type superviseConfig struct {
	Command []string
	Dir     string
	// Env is added to the inherited environment.
	Env []string
	// ChildOf, when set, is the replica ID the child is marked with
	// (EnvChildOf).
	ChildOf        string
	Stdout, Stderr io.Writer
	// Ready probes the connector; start-up waits until it returns nil.
	Ready func(ctx context.Context) error
	// ListenEnv is the variable of Env that tells the child where to
	// listen ("AIP_SIDECAR_LOCAL_SOCKET=/run/c.sock"): a start that runs
	// out of time while the child runs but nothing listens there names it.
	ListenEnv string
	// Vacant, when set, fails when another process already serves where
	// the child is to listen (Local.vacant). It is asked before every
	// start: at start-up a taken address fails the start, after a crash it
	// holds the restart back (see monitor); and after the exit of a
	// restarted child within StartTimeout, which is then taken for one
	// kept from its address rather than a crash (takenAtStart).
	Vacant         func(ctx context.Context) error
	ProbeTimeout   time.Duration
	StartTimeout   time.Duration
	StopTimeout    time.Duration
	RestartBackoff time.Duration
	MaxBackoff     time.Duration
	StableAfter    time.Duration
	// KillWait bounds the wait for the child to exit after SIGKILL
	// (defaultKillWait when 0).
	KillWait time.Duration
	Logger   *slog.Logger
	// awaitExit, when set, is what the reaper waits for the child's exit
	// with instead of awaitExitUnreaped (tests: a child that cannot be
	// reaped in time).
	awaitExit func(pid int) error
	// groupRemains, when set, replaces groupRemains in looking for what is
	// left of an exited child's process group (tests: a process of the
	// group that does not die of SIGKILL).
	groupRemains func(pgid, leader int) bool
	// afterVacant, when set, is called by the monitor between a
	// successful Vacant and the restart (tests: another process takes the
	// address in between).
	afterVacant func()
}

// supervisor runs the local connector as a child process: it starts it,
// waits for its health, restarts it with exponential backoff after a
// crash, and stops it (SIGTERM to its process group, then SIGKILL after
// StopTimeout) when asked. The child runs in its own process group, so a
// terminal's Ctrl-C reaches only the sidecar, which decides when the child
// stops; on Linux the child is also killed (SIGKILL) if the sidecar dies
// (kill -9), so a restarted sidecar never finds an orphan holding the port
// or finishing an action it reconciles with the new child,
// and the rest of the group is stopped when the child exits (reap), so a
// restarted child never does either.
type supervisor struct {
	cfg superviseConfig
	log *slog.Logger

	mu       sync.Mutex
	cur      *child
	starts   int
	restarts int
	lastExit string
	since    time.Time
	stopping bool
	// held says why the restart of the crashed child is held back (empty
	// when it is not): another process listens at its address.
	held string
	// crashed is the child that exited on its own (a crash, or an exit
	// the sidecar did not ask for) and that no new child has replaced
	// yet; stop reports it as an unclean stop (crashedResult).
	crashed *child
	stopCh  chan struct{}
	monDone chan struct{}
	// hung tracks the terminations restartHung starts; stop waits for
	// them. Add is called under mu while not stopping, so none is added
	// once stop waits.
	hung sync.WaitGroup
}

// child is one run of a process the sidecar starts and owns: the --exec
// connector or a stdio MCP server. It runs in its own process group (on
// Linux), and reap stops what is left of that group when it exits.
type child struct {
	cmd       *exec.Cmd
	startedAt time.Time
	// gone is closed when the process itself exited; exited when, after
	// that, the rest of its process group is gone too and the process was
	// reaped (see reap).
	gone   chan struct{}
	exited chan struct{}
	err    error // cmd.Wait's result, set before exited closes
	// terminating is set once the process group was sent SIGTERM to stop
	// it (terminate, an MCP session's close).
	terminating atomic.Bool
	// input is a stdio MCP server's standard input (nil for an --exec
	// child), closed first at an orderly stop (MCP.shutdownServer).
	input io.Closer
	// output is the read end of a stdio MCP server's standard output (nil
	// for an --exec child), which its session reads; closed StopTimeout
	// after the server was reaped, or when the sidecar gives up on a
	// server that did not exit after SIGKILL (MCP.terminateServer).
	output io.Closer
	// awaitExit replaces awaitExitUnreaped when set (superviseConfig).
	awaitExit func(pid int) error
	// remains replaces groupRemains when set (superviseConfig).
	remains func(pgid, leader int) bool
	// abandoned is set, before exited closes, when processes of c's group
	// did not exit within the kill wait after SIGKILL and were given up on
	// (stopGroupRest).
	abandoned bool
	// killed is closed when c's process group is first sent SIGKILL, at
	// killedAt (under mu): from then on what is left of the group has the
	// kill wait to exit, whoever sent it (terminate, stopGroupRest).
	killed chan struct{}

	// mu orders signals with reaping: once reaped is set the pid — the
	// group's ID — may belong to another process, and signal sends
	// nothing.
	mu       sync.Mutex
	reaped   bool
	killedAt time.Time
}

func newChild(cmd *exec.Cmd) *child {
	return &child{cmd: cmd, startedAt: time.Now(), gone: make(chan struct{}), exited: make(chan struct{}), killed: make(chan struct{})}
}

// signal sends sig to c's process group (elsewhere than on Linux, to c),
// unless c was reaped (os.ErrProcessDone). The first SIGKILL is noted
// (killed, killedAt).
func (c *child) signal(sig syscall.Signal) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reaped {
		return os.ErrProcessDone
	}
	err := signalGroupOf(c.cmd, sig)
	if sig == syscall.SIGKILL && c.killedAt.IsZero() {
		c.killedAt = time.Now()
		close(c.killed)
	}
	return err
}

// sinceKilled is how long ago c's group was first sent SIGKILL.
func (c *child) sinceKilled() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.killedAt)
}

func newSupervisor(cfg superviseConfig) *supervisor {
	return &supervisor{cfg: cfg, log: cfg.Logger, stopCh: make(chan struct{})}
}

// newBackoff is the restart and reconnect backoff of both modes (the
// --exec child and the MCP server): from initial, doubling with 20%
// jitter up to max, never giving up.
func newBackoff(initial, max time.Duration) *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = initial
	b.MaxInterval = max
	b.MaxElapsedTime = 0
	b.RandomizationFactor = 0.2
	b.Multiplier = 2
	b.Reset()
	return b
}

// spawn starts one child unless the supervisor is stopping.
func (s *supervisor) spawn() (*child, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return nil, errStopping
	}
	cmd := exec.Command(s.cfg.Command[0], s.cfg.Command[1:]...)
	cmd.Dir = s.cfg.Dir
	cmd.Env = childEnv(withChildOf(s.cfg.Env, s.cfg.ChildOf))
	cmd.Stdout, cmd.Stderr = s.cfg.Stdout, s.cfg.Stderr
	// A writer that is not a file is fed through a pipe, which a process
	// that left the child's group (setsid) can hold open after the child
	// and its group are gone: Wait would wait for it, and the exit would
	// never be recorded. Its output is given StopTimeout to drain.
	cmd.WaitDelay = s.cfg.StopTimeout
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := newChild(cmd)
	c.awaitExit, c.remains = s.cfg.awaitExit, s.cfg.groupRemains
	go c.reap("the connector process", s.cfg.StopTimeout, s.killWait(), s.log)
	s.cur, s.since, s.held, s.crashed = c, c.startedAt, "", nil
	s.starts++
	s.log.Info("connector process started", "pid", cmd.Process.Pid, "command", s.cfg.Command[0], "start", s.starts)
	return c, nil
}

var errStopping = errors.New("sidecar: the supervisor is stopping")

// groupPollInterval is how often reap looks for the rest of an exited
// child's process group.
const groupPollInterval = 20 * time.Millisecond

// reap waits for c to exit and reaps it; what names c in logs ("the
// connector process", "the MCP server"). The child and the processes it
// started in its process group (workers of a pre-fork server, the program
// a shell wrapper runs, a helper an MCP server started) are one process
// to the sidecar: when the child exits — a crash, a hung child's
// termination, or a stop — whatever remains of its group is stopped
// before the exit counts (SIGTERM, unless the group was sent it already,
// then SIGKILL stopTimeout after the child's exit unless it was sent
// earlier, and whatever still runs killWait after SIGKILL is given up on:
// stopGroupRest). Left running, such a
// process would hold the child's socket, port or files against the
// restarted child, go on with actions already recorded as
// outcome_unknown, and outlive the sidecar. The child stays an unreaped
// zombie meanwhile (waitid WNOWAIT), so its pid — the group's ID — cannot
// be reused and only the group is signalled; c.signal sends nothing once
// the child is reaped. (Linux; elsewhere the child has no group of its own
// and is just reaped.)
func (c *child) reap(what string, stopTimeout, killWait time.Duration, log *slog.Logger) {
	pid := c.cmd.Process.Pid
	awaitExit := awaitExitUnreaped
	if c.awaitExit != nil {
		awaitExit = c.awaitExit
	}
	if awaitExit(pid) == nil {
		close(c.gone)
		c.stopGroupRest(what, stopTimeout, killWait, log)
		c.mu.Lock()
		c.reaped = true
		c.mu.Unlock()
	}
	c.err = c.cmd.Wait()
	select {
	case <-c.gone:
	default:
		close(c.gone)
	}
	close(c.exited)
}

// stopGroupRest stops the processes left in the process group of the
// exited, unreaped child (see reap), and reaps those of them that were
// orphaned to the sidecar (reapGroupOrphans). They have stopTimeout after
// SIGTERM — sent here, or already by the stop under way (terminating),
// whose own SIGKILL then ends this wait — and killWait after SIGKILL,
// counted from the first SIGKILL to the group: one in uninterruptible
// sleep is then given up on (abandoned), as terminate gives up on the
// child itself, so that a stop takes at most stopTimeout and killWait.
func (c *child) stopGroupRest(what string, stopTimeout, killWait time.Duration, log *slog.Logger) {
	pid := c.cmd.Process.Pid
	defer reapGroupOrphans(pid, pid)
	if !c.groupRemains() {
		return
	}
	if !c.terminating.Load() {
		log.Warn(what+" exited while other processes of its process group still run; stopping them", "pid", pid, "signal", "SIGTERM")
		c.signal(syscall.SIGTERM)
	}
	if c.awaitGroupGone(stopTimeout, c.killed) {
		return
	}
	select {
	case <-c.killed: // by the stop under way, which logged it
	default:
		log.Error("processes left in the process group of "+what+" (exited) did not stop in time; killing them", "pgid", pid, "stop_timeout_ms", stopTimeout.Milliseconds())
		c.signal(syscall.SIGKILL)
	}
	if !c.awaitGroupGone(killWait-c.sinceKilled(), nil) {
		c.abandoned = true
		log.Error("processes left in the process group of "+what+" (exited) survived SIGKILL (uninterruptible?); giving up on them", "pgid", pid, "kill_wait_ms", killWait.Milliseconds())
	}
}

// groupRemains reports whether a process other than the exited child is
// in its process group.
func (c *child) groupRemains() bool {
	pid := c.cmd.Process.Pid
	if c.remains != nil {
		return c.remains(pid, pid)
	}
	return groupRemains(pid, pid)
}

// awaitGroupGone polls until no process other than the exited child is in
// its process group (true), for at most d, or until stop is closed.
func (c *child) awaitGroupGone(d time.Duration, stop <-chan struct{}) bool {
	deadline := time.Now().Add(d)
	for c.groupRemains() {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-stop:
			return false
		case <-time.After(groupPollInterval):
		}
	}
	return true
}

// childEnvDropped are the prefixes of the sidecar's own configuration
// variables, which a connector or MCP server it starts does not inherit:
// they name the replica's signing-seed file, its database URL file and the
// rest of its host configuration, none of which the connector needs (it
// gets what it needs, AIP_SIDECAR_LOCAL_* and AIP_SIDECAR_EVENTS_*, set
// explicitly). The seed file stays readable to a child of the same user
// that knows its path; run the connector as another user to keep it out.
var childEnvDropped = []string{"AIP_CONNECTOR_HOST_", EnvPrefix}

// childEnv is the environment of a child process: the sidecar's, without
// its own configuration variables (childEnvDropped), then extra.
func childEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !slices.ContainsFunc(childEnvDropped, func(p string) bool { return strings.HasPrefix(kv, p) }) {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// withChildOf is env with the EnvChildOf marker naming replicaID (env when
// replicaID is empty).
func withChildOf(env []string, replicaID string) []string {
	if replicaID == "" {
		return env
	}
	return append(slices.Clip(env), EnvChildOf+"="+replicaID)
}

// start starts the connector and waits until Ready succeeds, restarting it
// with backoff if it exits meanwhile, for at most StartTimeout. On success
// it hands the child to the monitor, which restarts it after crashes.
// Before every start Vacant is asked: an address another process serves
// fails the start, the first one and a restart alike (nothing is
// registered yet; the operator is told which address is taken).
func (s *supervisor) start(parent context.Context) error {
	ctx, cancel := context.WithTimeout(parent, s.cfg.StartTimeout)
	defer cancel()
	bo := newBackoff(s.cfg.RestartBackoff, s.cfg.MaxBackoff)
	var lastErr error
	for {
		if s.cfg.Vacant != nil {
			if err := s.cfg.Vacant(ctx); err != nil {
				return err
			}
		}
		c, err := s.spawn()
		if err != nil {
			return fmt.Errorf("sidecar: start the connector %q: %w", s.cfg.Command[0], err)
		}
		lastErr = s.awaitReady(ctx, c)
		if lastErr == nil {
			s.monDone = make(chan struct{})
			go s.monitor(c)
			return nil
		}
		select {
		case <-c.exited:
			s.recordExit(c, false, nil)
		default:
			// Still running but not ready in time (or asked to stop).
			s.terminate(c)
			s.recordExit(c, false, nil)
			if err := parent.Err(); err != nil {
				return fmt.Errorf("sidecar: start of the connector interrupted: %w", err)
			}
			if s.cfg.ListenEnv != "" && (errors.Is(lastErr, syscall.ECONNREFUSED) || errors.Is(lastErr, syscall.ENOENT)) {
				// A connector that listens on an address of its own
				// (a port written in its code) runs and is never reached.
				lastErr = fmt.Errorf("%w; the connector process ran, but nothing listened there: it is to listen where %s says", lastErr, s.cfg.ListenEnv)
			}
			return fmt.Errorf("%w within %s (--%s): %v", ErrStartTimeout, s.cfg.StartTimeout, settingOf["StartTimeout"], lastErr)
		}
		wait := bo.NextBackOff()
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			if err := parent.Err(); err != nil {
				return fmt.Errorf("sidecar: start of the connector interrupted: %w", err)
			}
			return fmt.Errorf("%w within %s (--%s): the process keeps exiting (last: %s)", ErrStartTimeout, s.cfg.StartTimeout, settingOf["StartTimeout"], s.lastExitText())
		case <-t.C:
		}
	}
}

// awaitReady polls Ready until it succeeds, the child exits or ctx ends.
func (s *supervisor) awaitReady(ctx context.Context, c *child) error {
	last, err := pollReady(ctx, s.cfg.ProbeTimeout, s.cfg.Ready, c.exited)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errExitedBeforeReady):
		return fmt.Errorf("the process exited before it was ready: %v", c.err)
	default:
		return fmt.Errorf("last health check: %w", detailed{last})
	}
}

// errExitedBeforeReady is pollReady's answer when exited is closed.
var errExitedBeforeReady = errors.New("exited before it was ready")

// pollReady calls probe, each call bounded by probeTimeout, every
// readyPollInterval until it succeeds (nil), exited is closed
// (errExitedBeforeReady; nil: never) or ctx ends (ctx.Err()). last is the
// last probe's error — the one before, when ctx ended during the last
// probe, whose error then only says it was cut off.
func pollReady(ctx context.Context, probeTimeout time.Duration, probe func(context.Context) error, exited <-chan struct{}) (last, err error) {
	tick := time.NewTicker(readyPollInterval)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		perr := probe(pctx)
		cancel()
		if perr == nil || last == nil || ctx.Err() == nil {
			last = perr
		}
		if last == nil {
			return nil, nil
		}
		select {
		case <-exited:
			return last, errExitedBeforeReady
		case <-ctx.Done():
			return last, ctx.Err()
		case <-tick.C:
		}
	}
}

// monitor restarts the child after crashes until stop. Before each
// restart Vacant is asked: while another process serves the child's
// address (one started by hand, or a process an earlier child started
// that left its process group), the child is not started — that process
// would answer for it, and the sidecar would forward signed actions to
// it. The restart is held back, logged and tried again with the
// backoff, as a failed start is, and the replica stays unhealthy (check
// says why) until the address is free. The check and the start are two
// steps: a process that takes the address in between makes the child (a
// TCP server) fail to bind and exit at once. Such an exit — within
// StartTimeout of the start, while another process now serves the
// address (takenAtStart) — is a held restart too, not a crash: it is
// logged as the address taken, holds the restart back the same way, and
// does not count as a restart after a crash.
func (s *supervisor) monitor(c *child) {
	defer close(s.monDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stopCh:
			cancel()
		case <-ctx.Done():
		}
	}()
	bo := newBackoff(s.cfg.RestartBackoff, s.cfg.MaxBackoff)
	// restarted: c was started here, not by start, which saw it healthy.
	restarted := false
	for {
		select {
		case <-c.exited:
		case <-s.stopCh:
			return
		}
		var taken error
		if restarted {
			taken = s.takenAtStart(ctx, c)
		}
		s.recordExit(c, true, taken)
		if taken == nil && time.Since(c.startedAt) >= s.cfg.StableAfter {
			bo.Reset()
		}
		for {
			wait := bo.NextBackOff()
			s.log.Warn("restarting the connector process", "after_ms", wait.Milliseconds())
			t := time.NewTimer(wait)
			select {
			case <-s.stopCh:
				t.Stop()
				return
			case <-t.C:
			}
			if s.cfg.Vacant != nil {
				if err := s.cfg.Vacant(ctx); err != nil {
					s.mu.Lock()
					s.held = err.Error()
					s.mu.Unlock()
					s.log.Error("not restarting the connector process while another process listens where it is to listen; the replica stays unhealthy, checking again with backoff", "error", err)
					continue
				}
				if s.cfg.afterVacant != nil {
					s.cfg.afterVacant()
				}
			}
			next, err := s.spawn()
			if errors.Is(err, errStopping) {
				return
			}
			if err != nil {
				s.log.Error("restart the connector process", "error", err)
				continue
			}
			c, restarted = next, true
			break
		}
	}
}

// takenAtStart is why c, a restarted child that exited without being
// asked to, is taken for one kept from its address rather than a crashed
// one: it exited within StartTimeout of its start (the time a child has to
// come up, and the host's grace for a restarted one: Local.startGrace) and
// another process now serves its address (Vacant fails). Vacant found the
// address free just before c started, so that process took it in
// between, and c, a TCP server, could not bind. Nil otherwise, and for a
// child that was being terminated (restartHung).
func (s *supervisor) takenAtStart(ctx context.Context, c *child) error {
	if s.cfg.Vacant == nil || c.terminating.Load() || time.Since(c.startedAt) >= s.cfg.StartTimeout {
		return nil
	}
	return s.cfg.Vacant(ctx)
}

// recordExit notes that c exited (or, terminated, was given up on: see
// awaitKilled); crash says it was not asked to. taken, for a crash, says
// that c exited because another process took its address
// (takenAtStart): that is logged, and the restart held back (held), as
// monitor does for an address found taken before a restart; it is not
// counted as a crash.
func (s *supervisor) recordExit(c *child, crash bool, taken error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	exit := exitOf(c)
	s.lastExit = exit
	if s.cur == c {
		s.cur, s.since = nil, time.Now()
	}
	if crash && !c.terminating.Load() {
		s.crashed = c
	}
	switch {
	case crash && taken != nil:
		s.held = taken.Error()
		s.log.Error("the connector process exited right after its start while another process listens where it is to listen (that process took the address between the check and the start); not counted as a crash: the restart is held back, the replica stays unhealthy, checking again with backoff",
			"pid", c.cmd.Process.Pid, "exit", exit, "error", taken)
	case crash:
		s.restarts++
		s.log.Error("the connector process exited; the replica reports unhealthy until it is back", "pid", c.cmd.Process.Pid, "exit", exit)
	case c.terminating.Load():
		// Stopped on purpose: terminate logged how it ended.
	default:
		s.log.Warn("the connector process exited", "pid", c.cmd.Process.Pid, "exit", exit)
	}
}

// exitOf describes how c ended: its exit, or, when it has not exited (a
// process that did not die of SIGKILL in time, which terminate gave up
// on), that. Its ProcessState is read only once it was reaped.
func exitOf(c *child) string {
	select {
	case <-c.exited:
	default:
		return errNotExited
	}
	if c.err != nil {
		return c.err.Error()
	}
	if c.cmd.ProcessState != nil {
		return c.cmd.ProcessState.String()
	}
	return "exited"
}

// errNotExited is exitOf's text for a child given up on after SIGKILL.
const errNotExited = "did not exit after SIGKILL (uninterruptible sleep?)"

func (s *supervisor) lastExitText() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastExit
}

// stop stops restarting and terminates the running child: SIGTERM to its
// process group, SIGKILL after StopTimeout, given up on KillWait after
// SIGKILL (terminate). It returns after the monitor
// and any termination restartHung started have finished. It is idempotent.
func (s *supervisor) stop() error {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return nil
	}
	s.stopping = true
	close(s.stopCh)
	c := s.cur
	s.mu.Unlock()
	defer s.hung.Wait()
	if s.monDone != nil {
		<-s.monDone
	}
	if c == nil {
		s.mu.Lock()
		crashed := s.crashed
		s.mu.Unlock()
		if crashed != nil {
			return s.crashedResult(crashed)
		}
		return nil
	}
	// A child that exited on its own before its stop began, which the
	// monitor had not seen yet, was found dead too.
	early := false
	select {
	case <-c.gone:
		early = !c.terminating.Load()
	default:
	}
	err := s.terminate(c)
	if early {
		select {
		case <-c.exited:
			// The crash is what went wrong; terminate logged how the
			// rest of its group stopped.
			err = s.crashedResult(c)
		default: // given up on after SIGKILL: err says so
		}
	}
	s.mu.Lock()
	if s.cur == c {
		s.cur, s.since = nil, time.Now()
	}
	select {
	case <-c.exited:
		if c.cmd.ProcessState != nil {
			s.lastExit = c.cmd.ProcessState.String()
		}
	default:
		s.lastExit = errNotExited
	}
	s.mu.Unlock()
	return err
}

// crashedResult reports a child that exited on its own (a crash, or an
// exit with any status the sidecar did not ask for) and that was not
// restarted yet when the stop began: it was found dead, not stopped, so
// the stop is unclean, as for an MCP server (MCP.crashedResult). A child
// the sidecar took down as hung is not a crash here. c has been reaped.
func (s *supervisor) crashedResult(c *child) error {
	pid := c.cmd.Process.Pid
	exit := exitOf(c)
	s.log.Error("the connector process did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted", "pid", pid, "exit", exit)
	return fmt.Errorf("sidecar: the connector process %d did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted: %s", pid, exit)
}

// terminate signals c to stop and waits for it: StopTimeout after SIGTERM
// for c and its process group, then, after SIGKILL, at most KillWait for
// them to exit (awaitKilled, stopGroupRest) — a process in uninterruptible
// sleep is given up on, so that neither a shutdown nor a restart waits for
// it for ever: the whole wait is StopTimeout plus KillWait (and reapGrace).
// It fails when c had to be killed or exited with a failure status.
func (s *supervisor) terminate(c *child) error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	pid := c.cmd.Process.Pid
	s.log.Info("stopping the connector process", "pid", pid, "signal", "SIGTERM")
	c.terminating.Store(true)
	if err := c.signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		s.log.Warn("signal the connector process", "pid", pid, "error", err)
	}
	t := time.NewTimer(s.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-c.exited:
		// Exiting on SIGTERM, or with status 0, is a clean stop; a
		// failure status (the child could not finish its own shutdown)
		// is reported, as for an MCP server.
		if ps := c.cmd.ProcessState; ps != nil && !stoppedCleanly(ps) {
			s.log.Error("the connector process did not stop cleanly", "pid", pid, "exit", ps.String())
			return fmt.Errorf("sidecar: the connector process %d did not stop cleanly after SIGTERM: %s", pid, ps)
		}
		s.log.Info("connector process stopped", "pid", pid, "exit", exitText(c))
		return nil
	case <-t.C:
	}
	s.log.Error("the connector process (or another process of its process group) did not stop in time; killing its process group", "pid", pid, "stop_timeout_ms", s.cfg.StopTimeout.Milliseconds())
	c.signal(syscall.SIGKILL)
	if !c.awaitKilled("the connector process", s.killWait(), s.log) {
		return fmt.Errorf("sidecar: the connector process %d (or another process of its process group) did not stop within %s after SIGTERM, and did not exit within %s after SIGKILL either (uninterruptible sleep, e.g. on a dead network file system?); the sidecar stopped waiting for it",
			pid, s.cfg.StopTimeout, s.killWait())
	}
	return fmt.Errorf("sidecar: the connector process %d (or another process of its process group) did not stop within %s after SIGTERM and was killed", pid, s.cfg.StopTimeout)
}

// awaitKilled waits for c, sent SIGKILL, to exit, for at most killWait,
// and then for its reaping, which gives up on what remains of its group
// killWait after the SIGKILL (stopGroupRest) — awaited for reapGrace more
// at most; what names c in the log ("the connector process", "the MCP
// server"). A process in uninterruptible sleep does not die of SIGKILL
// until its system call returns, which may be never (a dead NFS mount):
// it is given up on, with an error logged, and false returned; so is c
// when processes of its group were given up on, or its reaping did not
// end in time. Such a process runs none of its own code again — the
// pending SIGKILL ends it when the call returns — but it may hold its
// files, socket or port until then; the child is reaped by the reaper if
// it ever exits.
func (c *child) awaitKilled(what string, killWait time.Duration, log *slog.Logger) bool {
	deadline := time.Now().Add(killWait)
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-c.gone:
	case <-t.C:
		log.Error(what+" did not exit after SIGKILL (uninterruptible sleep, e.g. on a dead network file system?); no longer waiting for it",
			"pid", c.cmd.Process.Pid, "kill_wait_ms", killWait.Milliseconds())
		return false
	}
	reaped := time.NewTimer(time.Until(deadline) + reapGrace)
	defer reaped.Stop()
	select {
	case <-c.exited:
		return !c.abandoned // stopGroupRest logged it
	case <-reaped.C:
	}
	log.Error(what+" exited after SIGKILL but was not reaped in time: what remains of its process group (or a process holding its output) did not exit; no longer waiting for it",
		"pid", c.cmd.Process.Pid, "kill_wait_ms", killWait.Milliseconds())
	return false
}

// reapGrace is how much longer than the kill wait awaitKilled waits for
// the reaping of a child that exited after SIGKILL: the reaper, which
// gives up on the rest of the group at the kill wait, needs a moment to
// see the deadline pass and finish.
const reapGrace = 500 * time.Millisecond

func (s *supervisor) killWait() time.Duration { return killWaitOr(s.cfg.KillWait) }

// killWaitOr is a configured bound of the wait after SIGKILL, or
// defaultKillWait when it is 0.
func killWaitOr(d time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return defaultKillWait
}

func exitText(c *child) string {
	if c.err != nil {
		return c.err.Error()
	}
	return "exit status 0"
}

// check implements processView.
func (s *supervisor) check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur != nil {
		select {
		case <-s.cur.gone:
		default:
			return nil
		}
	}
	return &ProcessError{LastExit: s.lastExit, Restarts: s.restarts, Held: s.held}
}

// restartHung implements processView: the running child is taken as hung
// and terminated (SIGTERM to its process group, SIGKILL after
// StopTimeout); the monitor sees it exit and restarts it with backoff, as
// after a crash. A child already being terminated (its checks go on
// failing while it stops, or it did not die of SIGKILL) is left to that
// termination: it is not signalled and waited for again.
func (s *supervisor) restartHung(reason string) {
	s.mu.Lock()
	c := s.cur
	if s.stopping || c == nil || !c.terminating.CompareAndSwap(false, true) {
		s.mu.Unlock()
		return
	}
	s.hung.Add(1)
	s.mu.Unlock()
	s.log.Error("the connector process does not answer; restarting it", "pid", c.cmd.Process.Pid, "reason", reason)
	go func() {
		defer s.hung.Done()
		s.terminate(c)
	}()
}

// generation implements processView.
func (s *supervisor) generation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts
}

// snapshot implements processView.
func (s *supervisor) snapshot() ProcessStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := ProcessStatus{Starts: s.starts, Restarts: s.restarts, Since: s.since.UTC(), LastExit: s.lastExit}
	if s.cur != nil {
		select {
		case <-s.cur.gone:
		default:
			st.Running, st.PID = true, s.cur.cmd.Process.Pid
		}
	}
	return st
}
