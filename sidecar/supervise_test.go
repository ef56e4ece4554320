package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// execReplica runs a sidecar whose connector is this test binary started
// as a child (--exec), serving the fake connector on a unix socket.
func execReplica(t *testing.T, env []string, edit func(*Config)) *replica {
	t.Helper()
	sock := socketPath(t)
	return startReplica(t, func(c *Config) {
		c.Local = LocalConfig{Socket: sock}
		c.Exec = []string{os.Args[0], "-test.run=^$"}
		c.ExecEnv = append([]string{envChild + "=1"}, env...)
		c.ExecStderr = os.Stderr
		c.Host.HeartbeatInterval, c.Host.LeaseTTL = 100*time.Millisecond, time.Second
		if edit != nil {
			edit(c)
		}
	})
}

type signalRecord struct {
	Signal     string `json:"signal"`
	TimeUnixNS int64  `json:"time_unix_ns"`
	PID        int    `json:"pid"`
}

func readSignal(t *testing.T, path string) signalRecord {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the child recorded no signal: %v", err)
	}
	var rec signalRecord
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatalf("signal log %q: %v", raw, err)
	}
	return rec
}

// awaitReady polls the host until it accepts actions.
func awaitReady(t *testing.T, r *replica) {
	t.Helper()
	ctx := ctxT(t)
	for !r.s.Host().Ready() {
		if ctx.Err() != nil {
			t.Fatal("the replica did not become ready")
		}
		time.Sleep(5 * time.Millisecond) // polling for the lease being applied
	}
}

// awaitRunning polls the replica's journal until the action runs.
func awaitRunning(t *testing.T, r *replica, id, capability string) {
	t.Helper()
	ctx := ctxT(t)
	for {
		st, _, err := r.d.Status(ctx, r.target, id, capability)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == aip.StateRunning {
			return
		}
		time.Sleep(5 * time.Millisecond) // polling a child process for a state change
	}
}

func lastOp(ops []hostsdktest.Operation, op aip.Operation) (hostsdktest.Operation, bool) {
	for i := len(ops) - 1; i >= 0; i-- {
		if ops[i].Op == op {
			return ops[i], true
		}
	}
	return hostsdktest.Operation{}, false
}

// TestExecShutdownOrder: on SIGTERM the host drains while the child still
// serves its in-flight action, goes offline, and only then is the child
// sent SIGTERM.
func TestExecShutdownOrder(t *testing.T) {
	sigLog := filepath.Join(t.TempDir(), "signals")
	r := execReplica(t, []string{envChildSignalLog + "=" + sigLog}, nil)
	ctx := ctxT(t)
	st := r.status(t)
	if st.Process == nil || !st.Process.Running || st.Process.PID == 0 {
		t.Fatalf("status %+v", st)
	}
	a := act("echo.slow", `{"delay_ms":300}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
	awaitRunning(t, r, a.ID, "echo.slow")

	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res, err := (<-done).Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("the in-flight action answered %+v %v; the child must serve it during the drain", res, err)
	}
	ops := r.cp.Operations()
	drain, okDrain := lastOp(ops, aip.OpDrain)
	offline, okOff := lastOp(ops, aip.OpOffline)
	if !okDrain || !okOff || offline.Outcome != aip.OutcomeOffline || ops[len(ops)-1].Op != aip.OpOffline {
		t.Fatalf("lifecycle operations %+v", ops)
	}
	sig := readSignal(t, sigLog)
	if sig.Signal != "terminated" || sig.PID != st.Process.PID {
		t.Errorf("signal record %+v (child pid %d)", sig, st.Process.PID)
	}
	if got := time.Unix(0, sig.TimeUnixNS); !got.After(offline.At) || !got.After(drain.At) {
		t.Errorf("the child got SIGTERM at %s, the control plane saw drain at %s and offline at %s; the child must outlive both",
			got.Format(time.RFC3339Nano), drain.At.Format(time.RFC3339Nano), offline.At.Format(time.RFC3339Nano))
	}
	if err := syscall.Kill(sig.PID, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child %d still exists after Run returned: %v", sig.PID, err)
	}
}

// TestExecCrashRestart: a crashed child turns its in-flight action into
// outcome_unknown; the replica reports unhealthy (connector_ready=false)
// until the restarted child is healthy, then re-registers and serves.
func TestExecCrashRestart(t *testing.T) {
	gate := filepath.Join(t.TempDir(), "gate")
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r := execReplica(t, []string{envChildGate + "=" + gate}, func(c *Config) { c.RestartBackoff = 20 * time.Millisecond })
	ctx := ctxT(t)
	pid := r.status(t).Process.PID

	a := act("echo.slow", `{"delay_ms":60000}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
	awaitRunning(t, r, a.ID, "echo.slow")
	// The restarted child stays unhealthy until the gate file is back.
	os.Remove(gate)
	syscall.Kill(pid, syscall.SIGKILL)

	if pe := (<-done).ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("the action in flight during the crash did not end outcome_unknown")
	}
	if err := r.cp.Await(ctx, func(o []hostsdktest.Operation) bool {
		last := o[len(o)-1]
		return last.Op == aip.OpHeartbeat && !last.ConnectorReady && last.Outcome == aip.OutcomeLease
	}); err != nil {
		t.Fatal(err)
	}
	if code, doc := r.ready(t); code != http.StatusServiceUnavailable || doc.Connector.Ready {
		t.Errorf("/ready %d %+v while the child is unhealthy", code, doc.Connector)
	}
	st := r.status(t)
	if st.Process.Restarts != 1 || st.Process.PID == pid || !strings.Contains(st.Process.LastExit, "killed") {
		t.Errorf("status after the crash %+v", st.Process)
	}
	n := len(r.cp.Operations())
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.cp.Await(ctx, func(o []hostsdktest.Operation) bool {
		for _, op := range o[n:] {
			if op.Op == aip.OpRegister && op.Outcome == aip.OutcomeLease {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	awaitReady(t, r) // the register was answered; the host applies the lease right after
	res, err := must(r.d.Act(ctx, r.target, act("echo.say", `{"message":"back"}`))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("after the restart: %+v %v", res, err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

// TestExecManifestChangeAfterRestart: a restarted child with another
// manifest is reported; under ManifestChangeUnready the replica stays
// unhealthy.
func TestExecManifestChangeAfterRestart(t *testing.T) {
	dir := t.TempDir()
	suffix := filepath.Join(dir, "suffix")
	r := execReplica(t, []string{envChildManifest + "=" + suffix}, func(c *Config) {
		c.RestartBackoff = 20 * time.Millisecond
		c.Local.OnManifestChange = ManifestChangeUnready
	})
	ctx := ctxT(t)
	if err := os.WriteFile(suffix, []byte(" v2"), 0o600); err != nil {
		t.Fatal(err)
	}
	pid := r.status(t).Process.PID
	syscall.Kill(pid, syscall.SIGKILL)
	for {
		st := r.status(t)
		if st.ManifestChange != nil {
			if len(st.ManifestChange.Changed) != len(fakeManifest("").Capabilities) || len(st.ManifestChange.Added)+len(st.ManifestChange.Removed) != 0 {
				t.Errorf("change %+v", st.ManifestChange)
			}
			break
		}
		if err := ctx.Err(); err != nil {
			t.Fatal("the manifest change was not reported")
		}
		time.Sleep(10 * time.Millisecond) // polling for the supervisor's restart and the next probe
	}
	if err := r.s.Connector().(hostsdk.HealthChecker).CheckHealth(ctx); !errors.Is(err, ErrManifestChanged) {
		t.Errorf("CheckHealth = %v; want ErrManifestChanged", err)
	}
}

func TestExecStartFailure(t *testing.T) {
	sock := socketPath(t)
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	s, err := New(Config{
		Host: hostsdktest.HostConfig(t, cp, d, nil), Local: LocalConfig{Socket: sock},
		Exec: []string{"/bin/sh", "-c", "exit 3"}, StartTimeout: 3 * time.Second, RestartBackoff: 20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Run(ctxT(t))
	if !errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Run = %v; want ErrStartTimeout naming the exit status", err)
	}
	if len(cp.Operations()) != 0 {
		t.Errorf("a connector that never became healthy was registered: %+v", cp.Operations())
	}
	if st := s.local.proc.snapshot(); st.Starts < 2 || st.Running {
		t.Errorf("process status %+v; want restarts during start-up", st)
	}

	s, err = New(Config{Host: hostsdktest.HostConfig(t, cp, d, nil), Local: LocalConfig{Socket: sock}, Exec: []string{"/nonexistent/connector"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(ctxT(t)); err == nil || !strings.Contains(err.Error(), "/nonexistent/connector") {
		t.Fatalf("Run with a missing program = %v", err)
	}
}

// TestExecStartTimeoutNamesItsSetting: both ways a start runs out of
// time name the setting that bounds it, --start-timeout-ms (a child that
// keeps exiting said only "within 3s"), and a child that runs but never
// becomes healthy, stopped at the timeout, is logged as stopped, once:
// not also as a process that "exited" at warn level, as if it had crashed.
// A child that runs while nothing listens where it was told to (a
// connector with its own port written in its code) is told apart: the
// error names the variable that says where to listen.
func TestExecStartTimeoutNamesItsSetting(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeURL := "http://" + l.Addr().String()
	l.Close()
	sock := socketPath(t)
	for _, c := range []struct {
		name   string
		argv   []string
		local  LocalConfig
		listen string
	}{
		{"keeps exiting", []string{"/bin/sh", "-c", "exit 3"}, LocalConfig{Socket: sock}, ""},
		{"never healthy", []string{"/bin/sh", "-c", "exec sleep 60"}, LocalConfig{Socket: sock}, EnvLocalSocket + "=" + sock},
		{"never healthy on a port", []string{"/bin/sh", "-c", "exec sleep 60"}, LocalConfig{URL: freeURL}, EnvLocalURL + "=" + freeURL},
	} {
		t.Run(c.name, func(t *testing.T) {
			var logs hostsdktest.LogBuffer
			s, err := New(Config{
				Host: hostsdktest.HostConfig(t, cp, d, nil), Local: c.local, Exec: c.argv,
				StartTimeout: 500 * time.Millisecond, RestartBackoff: 20 * time.Millisecond,
				Logger: slog.New(slog.NewJSONHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			err = s.Run(ctxT(t))
			if !errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), "within 500ms (--start-timeout-ms)") {
				t.Fatalf("Run = %v; want ErrStartTimeout naming --start-timeout-ms", err)
			}
			if hint := "nothing listened there: it is to listen where " + c.listen + " says"; c.listen != "" && !strings.Contains(err.Error(), hint) {
				t.Errorf("Run = %v; want %q", err, hint)
			}
			if c.listen != "" {
				out := logs.String()
				if !strings.Contains(out, `"msg":"connector process stopped"`) || strings.Contains(out, `"msg":"the connector process exited"`) {
					t.Errorf("want the stop logged once, as stopped:\n%s", out)
				}
			}
		})
	}
}

// TestExecStubbornChildIsKilled: a child that ignores SIGTERM is killed
// after StopTimeout and Run reports it.
func TestExecStubbornChildIsKilled(t *testing.T) {
	r := execReplica(t, []string{envChildIgnoreTerm + "=1"}, func(c *Config) { c.StopTimeout = 100 * time.Millisecond })
	pid := r.status(t).Process.PID
	err := r.stop(t)
	if err == nil || !strings.Contains(err.Error(), "did not stop within") {
		t.Fatalf("Run = %v", err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the child %d still exists: %v", pid, err)
	}
	// The host itself shut down cleanly: offline was sent before the kill.
	if o := r.cp.Operations(); o[len(o)-1].Op != aip.OpOffline {
		t.Errorf("last operation %+v", o[len(o)-1])
	}
}

// TestExecChildFailingItsStopIsReported: a child that exits with a
// failure status after SIGTERM (it could not flush its own journal, say)
// did not stop cleanly; Run says so (with the exit status) instead of
// reporting a clean shutdown.
func TestExecChildFailingItsStopIsReported(t *testing.T) {
	r := execReplica(t, []string{envChildExitCode + "=3"}, nil)
	awaitReady(t, r)
	err := r.stop(t)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("Run = %v; want an error naming the child's exit status 3", err)
	}
	if st := r.s.sup.snapshot(); st.LastExit != "exit status 3" {
		t.Errorf("last exit %q", st.LastExit)
	}
	if o := r.cp.Operations(); o[len(o)-1].Op != aip.OpOffline {
		t.Errorf("last operation %+v", o[len(o)-1])
	}
}

func TestExecGetsTokenAndAddress(t *testing.T) {
	r := execReplica(t, nil, nil)
	if r.s.local.cfg.Token == "" || len(r.s.local.cfg.Token) != 64 {
		t.Fatalf("token %q", r.s.local.cfg.Token)
	}
	// The child checks the token: an action goes through.
	if res, err := must(r.d.Act(ctxT(t), r.target, act("echo.say", `{"message":"t"}`))).Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	// And a request without it is refused.
	l, err := NewLocal(LocalConfig{Socket: r.s.local.cfg.Socket})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.probe(ctxT(t)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("probe without the token: %v", err)
	}
}

// TestExecStartInterrupted: a SIGTERM during start-up (the child started,
// not healthy yet) stops the child and registers nothing.
func TestExecStartInterrupted(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	s, err := New(Config{Host: hostsdktest.HostConfig(t, cp, d, nil), Local: LocalConfig{Socket: socketPath(t)},
		Exec: []string{"/bin/sh", "-c", "sleep 60"}, StopTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	for s.local.proc.snapshot().Starts == 0 {
		time.Sleep(5 * time.Millisecond) // polling for the child's start
	}
	cancel()
	err = <-errc
	if err == nil || errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), "interrupted") {
		t.Fatalf("Run = %v; want an interrupted start", err)
	}
	if st := s.local.proc.snapshot(); st.Running || st.Starts != 1 {
		t.Errorf("process %+v", st)
	}
	if len(cp.Operations()) != 0 {
		t.Errorf("operations %+v", cp.Operations())
	}
}

// TestStartInterruptedIsNotATimeout: a SIGTERM during start-up is reported
// as an interrupted start, not as a connector that did not become healthy
// in time, in every mode.
func TestStartInterruptedIsNotATimeout(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	for name, cfg := range map[string]Config{
		"attached": {Local: LocalConfig{Socket: socketPath(t)}},
		"mcp":      {MCP: MCPConfig{Transport: func() mcp.Transport { return refusedTransport{} }}},
	} {
		cfg.Host = hostsdktest.HostConfig(t, cp, d, nil)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := s.Run(ctx); err == nil || errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), "interrupted") {
			t.Errorf("%s: Run = %v; want an interrupted start", name, err)
		}
	}
	// A child that keeps exiting: interrupted in the backoff before its
	// restart.
	s, err := New(Config{Host: hostsdktest.HostConfig(t, cp, d, nil), Local: LocalConfig{Socket: socketPath(t)},
		Exec: []string{"/bin/sh", "-c", "exit 3"}, RestartBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	for s.local.proc.snapshot().LastExit == "" {
		time.Sleep(5 * time.Millisecond) // polling for the child's exit
	}
	cancel()
	if err := <-errc; err == nil || errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), "interrupted") {
		t.Errorf("exec: Run = %v; want an interrupted start", err)
	}
	if len(cp.Operations()) != 0 {
		t.Errorf("operations %+v", cp.Operations())
	}
}

// TestHungChildIsRestarted: a child that stops answering its health checks
// (it still runs) is restarted after RestartUnresponsiveAfter unanswered
// checks in a row, and the replica is ready again with the new child.
func TestHungChildIsRestarted(t *testing.T) {
	hang := filepath.Join(t.TempDir(), "hang")
	r := execReplica(t, []string{envChildHang + "=" + hang}, func(c *Config) {
		c.RestartUnresponsiveAfter = 2
		c.Host.HealthProbeTimeout = 50 * time.Millisecond
	})
	ctx := ctxT(t)
	first := r.status(t).Process.PID
	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for {
		st := r.status(t)
		if st.Process.Restarts >= 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the hung child was not restarted: %+v", st.Process)
		}
		time.Sleep(20 * time.Millisecond) // polling a child process for a restart
	}
	os.Remove(hang)
	awaitReady(t, r)
	st := r.status(t)
	if !st.Process.Running || st.Process.PID == first || st.Process.Starts < 2 {
		t.Fatalf("after the restart: %+v", st.Process)
	}
	res, err := must(r.d.Act(ctx, r.target, act("echo.say", `{"message":"back"}`))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("after the restart: %+v %v", res, err)
	}
}

// hungView is a processView that records restartHung calls; gen is its
// generation, and its child runs since since.
type hungView struct {
	processView
	restarts []string
	gen      int
	since    time.Time
}

func (v *hungView) restartHung(reason string) { v.restarts = append(v.restarts, reason) }
func (v *hungView) generation() int           { return v.gen }
func (v *hungView) snapshot() ProcessStatus {
	return ProcessStatus{Running: true, PID: 1, Starts: v.gen, Since: v.since}
}

// TestRestartedChildIsGivenItsStartTimeout: a child started by a restart
// that has not answered a health check yet is starting, not hung: its
// unanswered checks count only once it ran longer than the start timeout
// (before, a connector slower to start than two health checks was killed
// again at every restart, and never became ready).
func TestRestartedChildIsGivenItsStartTimeout(t *testing.T) {
	v := &hungView{gen: 2, since: time.Now()}
	l := &Local{proc: v, restartUnresponsiveAfter: 2, startGrace: time.Minute}
	l.checkedGen.Store(1) // the first child answered; the second has not yet
	noAnswer := &LocalError{Op: "GET /aip/health", Err: syscall.ECONNREFUSED}
	for range 5 {
		l.noteUnanswered(noAnswer)
	}
	if len(v.restarts) != 0 {
		t.Fatalf("a starting child was restarted as hung: %v", v.restarts)
	}
	v.since = time.Now().Add(-2 * time.Minute) // past its start timeout
	l.noteUnanswered(noAnswer)
	l.noteUnanswered(noAnswer)
	if len(v.restarts) != 1 {
		t.Fatalf("restarts %v, want one once the start timeout passed", v.restarts)
	}
	// Once it answered, its unanswered checks count at once.
	v.restarts, v.since = nil, time.Now()
	l.checkedGen.Store(2)
	l.noteUnanswered(noAnswer)
	l.noteUnanswered(noAnswer)
	if len(v.restarts) != 1 {
		t.Fatalf("restarts %v, want one after two unanswered checks of an answering child", v.restarts)
	}
}

// TestOnlyUnansweredChecksCountAsHung: an answer saying not ready is no
// hang and ends a run of unanswered checks; the limit restarts once and
// starts counting again.
func TestOnlyUnansweredChecksCountAsHung(t *testing.T) {
	v := &hungView{gen: 1, since: time.Now()}
	l := &Local{proc: v, restartUnresponsiveAfter: 2, startGrace: time.Minute}
	l.checkedGen.Store(1) // the child answered before
	noAnswer := &LocalError{Op: "GET /aip/health", Err: context.DeadlineExceeded}
	notReady := &LocalError{Op: "GET /aip/health", Status: 503, Err: errors.New("not ready")}
	for _, err := range []error{noAnswer, notReady, noAnswer, notReady, notReady, noAnswer} {
		l.noteUnanswered(err)
	}
	if len(v.restarts) != 0 {
		t.Fatalf("restarted after interleaved answers: %v", v.restarts)
	}
	l.noteUnanswered(noAnswer) // the second in a row
	if len(v.restarts) != 1 || !strings.Contains(v.restarts[0], "no answer to 2 health checks") {
		t.Fatalf("restarts %v, want one after two unanswered checks", v.restarts)
	}
	l.noteUnanswered(noAnswer)
	if len(v.restarts) != 1 {
		t.Fatalf("the count did not start again: %v", v.restarts)
	}
	off := &Local{proc: v}
	for range 5 {
		off.noteUnanswered(noAnswer)
	}
	if len(v.restarts) != 1 {
		t.Fatal("restarted with RestartUnresponsiveAfter 0")
	}
}

// TestBusyChildIsNotTakenAsHung: a health check left unanswered while an
// action forwarded to the child is in progress and within its deadline
// does not count (a connector serving one request at a time cannot answer
// it meanwhile); once the action ended or its deadline passed, they count
// again.
func TestBusyChildIsNotTakenAsHung(t *testing.T) {
	v := &hungView{gen: 1, since: time.Now()}
	l := &Local{proc: v, restartUnresponsiveAfter: 2, startGrace: time.Minute}
	l.checkedGen.Store(1) // the child answered before
	noAnswer := &LocalError{Op: "GET /aip/health", Err: context.DeadlineExceeded}

	l.noteUnanswered(noAnswer) // one before the action
	ctx, cancel := context.WithCancel(context.Background())
	done := l.trackWork(ctx)
	for range 10 {
		l.noteUnanswered(noAnswer)
	}
	if len(v.restarts) != 0 {
		t.Fatalf("restarted while an action was in progress: %v", v.restarts)
	}
	cancel() // its deadline passed (or it was cancelled): the child is no longer evidently working
	for l.working.Load() != 0 {
		time.Sleep(time.Millisecond) // polling for context.AfterFunc's goroutine
	}
	l.noteUnanswered(noAnswer)
	if len(v.restarts) != 1 {
		t.Fatalf("restarts %v; want one: the check before the action and the one after its deadline are two in a row", v.restarts)
	}
	done()
	done() // idempotent, also after the deadline
	if n := l.working.Load(); n != 0 {
		t.Fatalf("working = %d after the action", n)
	}

	// An action that ends before its deadline stops counting at its end.
	v.restarts = nil
	done = l.trackWork(context.Background())
	l.noteUnanswered(noAnswer)
	l.noteUnanswered(noAnswer)
	done()
	if len(v.restarts) != 0 || l.working.Load() != 0 {
		t.Fatalf("restarts %v, working %d", v.restarts, l.working.Load())
	}
	l.noteUnanswered(noAnswer)
	l.noteUnanswered(noAnswer)
	if len(v.restarts) != 1 {
		t.Fatalf("restarts %v; want one after two unanswered checks of an idle child", v.restarts)
	}
}

// TestBusyChildFinishesItsAction: a child that cannot answer its health
// endpoint while it runs an action (a single-threaded connector; here its
// health handler hangs) is not taken as hung in the middle of it: it gets
// no SIGTERM, and the action completes. Once it is idle and still does
// not answer, it is restarted.
func TestBusyChildFinishesItsAction(t *testing.T) {
	dir := t.TempDir()
	hang, sigLog := filepath.Join(dir, "hang"), filepath.Join(dir, "signals")
	r := execReplica(t, []string{envChildHang + "=" + hang, envChildSignalLog + "=" + sigLog}, func(c *Config) {
		// Three checks: the action's result is read before an idle
		// child's next three can pass.
		c.RestartUnresponsiveAfter = 3
		c.Host.HealthProbeTimeout = 50 * time.Millisecond
	})
	ctx := ctxT(t)
	first := r.status(t).Process.PID
	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Fifteen heartbeats (and health checks) long.
	res, err := must(r.d.Act(ctx, r.target, act("echo.slow", `{"delay_ms":1500}`))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("the action of a busy child: %+v %v; want it completed", res, err)
	}
	if raw, err := os.ReadFile(sigLog); err == nil {
		t.Fatalf("the child was stopped as hung during its action: %s", raw)
	}
	for {
		st := r.status(t)
		if st.Process.Restarts >= 1 && st.Process.PID != first {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the idle child that does not answer was not restarted: %+v", st.Process)
		}
		time.Sleep(20 * time.Millisecond) // polling a child process for a restart
	}
	os.Remove(hang)
	awaitReady(t, r)
}

func TestRestartUnresponsiveNeedsExec(t *testing.T) {
	_, err := New(Config{Local: LocalConfig{Socket: "/tmp/x.sock"}, RestartUnresponsiveAfter: 3})
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Field != "RestartUnresponsiveAfter" {
		t.Fatalf("New without Exec: %v", err)
	}
	_, err = New(Config{Local: LocalConfig{Socket: "/tmp/x.sock"}, Exec: []string{"x"}, RestartUnresponsiveAfter: -1})
	if !errors.As(err, &ce) || ce.Field != "RestartUnresponsiveAfter" {
		t.Fatalf("negative: %v", err)
	}
}

// orderHandler is a slog handler that records the messages it is given,
// in order, and holds the first record with message hold until release is
// closed (signalling held when it starts holding).
type orderHandler struct {
	hold    string
	held    chan struct{}
	release chan struct{}

	mu   sync.Mutex
	seen []string
	once sync.Once
}

func (h *orderHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *orderHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *orderHandler) WithGroup(string) slog.Handler            { return h }
func (h *orderHandler) Handle(_ context.Context, r slog.Record) error {
	first := false
	if r.Message == h.hold {
		h.once.Do(func() { first = true })
	}
	if first {
		close(h.held)
		<-h.release
	}
	h.note(r.Message)
	return nil
}

func (h *orderHandler) note(msg string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, msg)
}

func (h *orderHandler) messages() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.seen...)
}

// TestStopWaitsForTheHungTermination: the termination restartHung starts
// is owned by the supervisor; stop returns only after it finished, so
// nothing of the supervisor outlives Run.
func TestStopWaitsForTheHungTermination(t *testing.T) {
	before := goleak.IgnoreCurrent()
	h := &orderHandler{hold: "stopping the connector process", held: make(chan struct{}), release: make(chan struct{})}
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", "exec sleep 60"}, Ready: func(context.Context) error { return nil },
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: time.Minute,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(h),
	})
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	s.restartHung("the test says so")
	<-h.held // the hung termination is under way (held before it signals)

	stopped := make(chan error, 1)
	go func() {
		err := s.stop()
		h.note("stop returned")
		stopped <- err
	}()
	// Release the hung termination once stop returned; a stop that waits
	// for it returns only after the release, which a timer provides.
	t0 := time.NewTimer(200 * time.Millisecond)
	defer t0.Stop()
	var err error
	select {
	case err = <-stopped:
		close(h.release)
	case <-t0.C:
		close(h.release)
		err = <-stopped
	}
	if err != nil {
		t.Fatalf("stop: %v", err)
	}
	got := h.messages()
	last := -1
	for i, m := range got {
		if m == "connector process stopped" {
			last = i
		}
	}
	if n := len(got); n == 0 || got[n-1] != "stop returned" || last < 0 || strings.Count(strings.Join(got, "|"), "connector process stopped") != 2 {
		t.Fatalf("log %q: want both terminations' \"connector process stopped\" before stop returned", got)
	}
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
}

// TestHungChildIsTerminatedOnce: while a child taken as hung stops (it
// has StopTimeout after SIGTERM) its health checks go on failing; the
// restarts they ask for leave it to the termination under way instead of
// signalling it and waiting for it once more each time.
func TestHungChildIsTerminatedOnce(t *testing.T) {
	w := newLogWatch()
	ready := filepath.Join(t.TempDir(), "ready")
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", `trap '' TERM; touch "$OUT"; exec sleep 60`}, Env: []string{"OUT=" + ready},
		Ready: func(context.Context) error {
			_, err := os.Stat(ready) // SIGTERM is ignored from now on
			return err
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 300 * time.Millisecond,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: w.logger(),
	})
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()
	s.restartHung("the first check")
	w.await(t, func(r slog.Record) bool { return r.Message == "stopping the connector process" })
	s.restartHung("the next check")
	s.restartHung("the one after")
	<-c.exited
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	n := 0
	w.mu.Lock()
	for _, r := range w.records {
		if r.Message == "stopping the connector process" {
			n++
		}
	}
	w.mu.Unlock()
	if n != 1 {
		t.Fatalf("the hung child was sent SIGTERM %d times; want once", n)
	}
}

// TestChildDoesNotInheritTheSidecarsConfiguration: a connector the sidecar
// starts does not see the sidecar's own configuration variables (the
// replica's signing-seed file path among them), but does see the rest of
// the environment and the variables the sidecar sets for it.
func TestChildDoesNotInheritTheSidecarsConfiguration(t *testing.T) {
	t.Setenv("AIP_CONNECTOR_HOST_SIGNING_SEED_FILE", "/secret/replica.seed")
	t.Setenv("AIP_SIDECAR_EXEC", "whatever")
	t.Setenv("CONNECTOR_API_KEY_FILE", "/run/key")
	out := filepath.Join(t.TempDir(), "env")
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", `env > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 60`}, Env: []string{"OUT=" + out, EnvLocalToken + "=t0k"},
		Ready: func(context.Context) error {
			if _, err := os.Stat(out); err != nil {
				return err
			}
			return nil
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: time.Minute,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(slog.DiscardHandler),
	})
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	env, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=", "AIP_SIDECAR_EXEC="} {
		if strings.Contains(string(env), gone) {
			t.Errorf("the child inherited %s...:\n%s", gone, env)
		}
	}
	for _, kept := range []string{"CONNECTOR_API_KEY_FILE=/run/key", EnvLocalToken + "=t0k"} {
		if !strings.Contains(string(env), kept) {
			t.Errorf("the child lacks %s:\n%s", kept, env)
		}
	}
}

// groupChild supervises a connector that starts a worker process in its
// process group (as a pre-fork server or a shell wrapper does) and
// returns the supervisor, the leader's pid and the worker's. With
// stubborn the worker ignores SIGTERM. edit, when set, changes the
// supervisor's configuration.
func groupChild(t *testing.T, stubborn bool, stop time.Duration, edit func(*superviseConfig)) (*supervisor, int, int) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("process groups are supervised on Linux")
	}
	out := filepath.Join(t.TempDir(), "worker.pid")
	// The worker writes its own pid (its shell's, which exec keeps) once
	// it ignores SIGTERM: written by the leader right after starting it,
	// a stop could come before the worker's trap, and the worker die of
	// the SIGTERM it was to ignore.
	worker := `echo $$ > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 300`
	if stubborn {
		worker = "trap '' TERM; " + worker
	}
	cfg := superviseConfig{
		Command: []string{"/bin/sh", "-c", `/bin/sh -c "$WORKER" & exec sleep 300`},
		Env:     []string{"OUT=" + out, "WORKER=" + worker},
		Ready: func(context.Context) error {
			_, err := os.Stat(out)
			return err
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: stop,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(slog.DiscardHandler),
	}
	if edit != nil {
		edit(&cfg)
	}
	s := newSupervisor(cfg)
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	wpid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(wpid, syscall.SIGKILL) }) // a leaked worker, when the test fails
	pid := s.snapshot().PID
	if !running(wpid) || pid == 0 {
		t.Fatalf("worker %d, leader %d: not running", wpid, pid)
	}
	return s, pid, wpid
}

// TestCrashedChildLeavesNoProcessBehind: when the connector process exits
// on its own (a crash; here SIGKILL, as the OOM killer sends), the rest of
// its process group — a worker it started — is stopped before the exit is
// recorded and the child restarted: left running, it would hold the
// connector's socket or port against the restarted child and go on with
// actions already recorded as outcome_unknown. A worker that ignores
// SIGTERM is killed after StopTimeout.
func TestCrashedChildLeavesNoProcessBehind(t *testing.T) {
	for _, stubborn := range []bool{false, true} {
		t.Run(fmt.Sprintf("stubborn=%v", stubborn), func(t *testing.T) {
			s, pid, wpid := groupChild(t, stubborn, 100*time.Millisecond, nil)
			defer s.stop()
			syscall.Kill(pid, syscall.SIGKILL)
			ctx := ctxT(t)
			for s.snapshot().Restarts == 0 {
				if ctx.Err() != nil {
					t.Fatal("the crash was not recorded")
				}
				time.Sleep(5 * time.Millisecond) // polling for the supervisor to record the crash
			}
			if running(wpid) {
				t.Fatalf("the crashed connector's worker %d still runs after the crash was recorded", wpid)
			}
		})
	}
}

// TestCrashSeenThoughAnEscapedProcessHoldsTheOutput: a library user's
// ExecStdout that is not a file is fed through a pipe, which a process
// that left the child's group (setsid) keeps open after the child died;
// exec's Wait then waited for that process, so the crash was never
// recorded and the connector never restarted. The wait for the output is
// bounded by StopTimeout.
func TestCrashSeenThoughAnEscapedProcessHoldsTheOutput(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("process groups are supervised on Linux")
	}
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("no setsid command")
	}
	out := filepath.Join(t.TempDir(), "escaped.pid")
	var output bytes.Buffer
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", `setsid sleep 300 & echo $! > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"; exec sleep 300`},
		Env:     []string{"OUT=" + out},
		Stdout:  &output,
		Ready: func(context.Context) error {
			_, err := os.Stat(out)
			return err
		},
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 100 * time.Millisecond,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: slog.New(slog.DiscardHandler),
	})
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	escaped, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(escaped, syscall.SIGKILL) })
	syscall.Kill(s.snapshot().PID, syscall.SIGKILL)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for s.snapshot().Restarts == 0 {
		if ctx.Err() != nil {
			t.Fatal("the crash was not recorded while an escaped process held the child's output")
		}
		time.Sleep(5 * time.Millisecond) // polling for the supervisor to record the crash
	}
}

// TestStopLeavesNoProcessBehind: stop ends the whole process group. A
// connector that exits on SIGTERM at once while a worker of its group
// ignores it does not leave the worker running after the sidecar: the
// worker is killed after StopTimeout and stop reports the unclean stop.
func TestStopLeavesNoProcessBehind(t *testing.T) {
	s, _, wpid := groupChild(t, true, 100*time.Millisecond, nil)
	err := s.stop()
	if running(wpid) {
		t.Fatalf("the worker %d still runs after stop returned (%v)", wpid, err)
	}
	if err == nil || !strings.Contains(err.Error(), "did not stop within") {
		t.Errorf("stop = %v; want the kill of the group reported", err)
	}
}

// TestStopOfAGroupSurvivingSIGKILLIsBounded: a process of the child's
// group that does not die of SIGKILL (uninterruptible sleep; here the
// group is reported as remaining for ever) is given up on KillWait after
// the SIGKILL, as the child itself is: the stop takes StopTimeout and
// KillWait, as the docs say. It was waited for another StopTimeout after
// SIGKILL, and the stop for the child's reaping without bound — twice
// StopTimeout. The stop reports that it stopped waiting.
func TestStopOfAGroupSurvivingSIGKILLIsBounded(t *testing.T) {
	const stop, killWait = 3 * time.Second, 100 * time.Millisecond
	w := newLogWatch()
	s, pid, wpid := groupChild(t, true, stop, func(cfg *superviseConfig) {
		cfg.KillWait, cfg.Logger = killWait, w.logger()
		cfg.groupRemains = func(pgid, leader int) bool { return true }
	})
	t0 := time.Now()
	err := s.stop()
	took := time.Since(t0)
	// Generous: StopTimeout and KillWait are 3.1s; twice StopTimeout 6s.
	if bound := stop + killWait + 2*time.Second; took > bound {
		t.Errorf("stop took %s; want about StopTimeout + KillWait (%s), at most %s", took, stop+killWait, bound)
	}
	if err == nil || !strings.Contains(err.Error(), "did not exit within 100ms after SIGKILL") {
		t.Errorf("stop = %v; want it to say the group did not exit after SIGKILL", err)
	}
	w.await(t, func(r slog.Record) bool {
		return strings.HasSuffix(r.Message, "survived SIGKILL (uninterruptible?); giving up on them") && attr(r, "pgid") == strconv.Itoa(pid)
	})
	if running(wpid) {
		t.Errorf("the worker %d still runs after stop returned", wpid)
	}
}

// startHelperSidecar runs the test binary as a sidecar process (env
// selects which, see TestMain), waits until it writes the pid of the
// process it started to out, and returns it and that pid, which is
// SIGKILLed when the test ends (a leak, when the test fails).
func startHelperSidecar(t *testing.T, out string, env ...string) (*exec.Cmd, int) {
	t.Helper()
	helper := exec.Command(os.Args[0], "-test.run=^$")
	helper.Env = append(os.Environ(), env...)
	helper.Stderr = os.Stderr
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	var raw []byte
	for {
		var err error
		if raw, err = os.ReadFile(out); err == nil {
			break
		}
		if ctx.Err() != nil {
			helper.Process.Kill()
			helper.Wait()
			t.Fatal("the helper sidecar did not start its child")
		}
		time.Sleep(10 * time.Millisecond) // polling another process for the pid
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		helper.Process.Kill()
		helper.Wait()
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	return helper, pid
}

// TestChildDiesWithTheSidecar: when the sidecar itself dies (kill -9, the
// OOM killer), its child is killed with it, even a child that would take
// its time over SIGTERM (a graceful server finishing its requests) or
// ignores it: a restarted sidecar starts a new child and asks it to
// reconcile the actions the dead sidecar left running, and an old child
// still at work could complete an action after the new one answered
// "not_found" (no effect: send a new action) — a second run.
func TestChildDiesWithTheSidecar(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Pdeathsig is Linux's")
	}
	out := filepath.Join(t.TempDir(), "child.pid")
	helper, pid := startHelperSidecar(t, out, envSupervisorHelper+"="+out)
	ctx := ctxT(t)
	helper.Process.Kill()
	helper.Wait()
	deadline, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for running(pid) {
		if deadline.Err() != nil {
			t.Fatalf("the child %d still runs after its sidecar was killed", pid)
		}
		time.Sleep(10 * time.Millisecond) // polling for the kernel's signal to take effect
	}
}

// TestPollReadyKeepsTheLastCompletedProbesError: a probe cut off by the
// start deadline says only "context deadline exceeded"; the start-timeout
// error reports the probe before it, which says why the connector was not
// ready.
func TestPollReadyKeepsTheLastCompletedProbesError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	notReady := errors.New("the connector is not ready: warming up")
	calls := 0
	last, err := pollReady(ctx, time.Minute, func(pctx context.Context) error {
		calls++
		if calls == 1 {
			return notReady
		}
		<-pctx.Done() // hangs until the start deadline cuts it off
		return fmt.Errorf("GET /aip/health: %w", pctx.Err())
	}, nil)
	if !errors.Is(err, context.DeadlineExceeded) || last != notReady || calls < 2 {
		t.Fatalf("pollReady = %v, %v after %d probes; want the first probe's %q and the deadline", last, err, calls, notReady)
	}
}

// TestExecRefusesAnAddressAlreadyServed: when another process already
// serves where the --exec child is to listen (an earlier connector left
// running, one started by hand), its answers would be taken for the
// child's — its health, its manifest, the actions — while the child fails
// to bind and crash-loops (TCP) or races it for the socket path. The start
// fails naming the address instead; nothing is registered or sent to that
// process.
func TestExecRefusesAnAddressAlreadyServed(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			other := newFakeConnector()
			var lc LocalConfig
			if network == "tcp" {
				addr := freeAddr(t)
				l, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				srv := &http.Server{Handler: other}
				go srv.Serve(l)
				t.Cleanup(func() { srv.Close() })
				lc.URL = "http://" + addr
			} else {
				lc.Socket = socketPath(t)
				serveAt(t, other, lc.Socket)
			}
			cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
			d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
			s, err := New(Config{
				Host: hostsdktest.HostConfig(t, cp, d, nil), Local: lc,
				Exec: []string{os.Args[0], "-test.run=^$"}, ExecEnv: []string{envChild + "=1"}, ExecStderr: os.Stderr,
				StartTimeout: 10 * time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(ctxT(t))
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- s.Run(ctx) }()
			registered := make(chan error, 1)
			go func() {
				registered <- cp.Await(ctx, func(o []hostsdktest.Operation) bool { return len(o) > 0 && o[0].Op == aip.OpRegister })
			}()
			select {
			case err := <-errc:
				cancel()
				<-registered
				if err == nil || !strings.Contains(err.Error(), s.local.Target()) || !strings.Contains(err.Error(), "already") {
					t.Fatalf("Run = %v; want a start refused naming %s", err, s.local.Target())
				}
			case <-registered:
				cancel()
				<-errc
				t.Fatalf("the sidecar registered while another process served %s (the child's address)", s.local.Target())
			}
			if len(cp.Operations()) != 0 {
				t.Errorf("registered: %+v", cp.Operations())
			}
		})
	}
}

// TestExecRestartHeldWhileAnotherProcessServesTheAddress: when another
// process took the child's address while the crashed child was down, the
// child is not restarted — that process would answer for it, and the
// sidecar would forward signed actions to it. The restart is held back
// (logged, retried with backoff) and the replica stays unhealthy, saying
// why, until the address is free; then the child is restarted and serves.
// Nothing reaches the other process.
func TestExecRestartHeldWhileAnotherProcessServesTheAddress(t *testing.T) {
	const held = "not restarting the connector process while another process listens where it is to listen; the replica stays unhealthy, checking again with backoff"
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			var lc LocalConfig
			if network == "tcp" {
				lc.URL = "http://" + freeAddr(t)
			} else {
				lc.Socket = socketPath(t)
			}
			w := newLogWatch()
			r := execReplica(t, nil, func(c *Config) {
				c.Local = lc
				c.RestartBackoff, c.MaxBackoff = time.Second, time.Second
				c.Logger = w.logger()
			})
			ctx := ctxT(t)
			pid := r.status(t).Process.PID

			// The other process: counts every request it is sent.
			var requests atomic.Int64
			other := newFakeConnector()
			srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
				requests.Add(1)
				other.ServeHTTP(rw, req)
			})}
			syscall.Kill(pid, syscall.SIGKILL)
			var l net.Listener
			for {
				var err error
				if network == "tcp" {
					l, err = net.Listen("tcp", strings.TrimPrefix(lc.URL, "http://"))
				} else {
					os.Remove(lc.Socket) // the killed child's
					l, err = net.Listen("unix", lc.Socket)
				}
				if err == nil {
					break
				}
				if ctx.Err() != nil {
					t.Fatalf("listen where the child listened: %v", err)
				}
				time.Sleep(5 * time.Millisecond) // polling for the killed child's port to be released
			}
			served := make(chan struct{})
			go func() { defer close(served); srv.Serve(l) }()
			closeOther := func() { srv.Close(); <-served }
			t.Cleanup(closeOther)

			// Twice held back (the backoff retries), never started.
			for {
				w.mu.Lock()
				n := 0
				for _, rec := range w.records {
					if rec.Message == held && strings.Contains(attr(rec, "error"), r.s.local.Target()) {
						n++
					}
				}
				w.mu.Unlock()
				if n >= 2 {
					break
				}
				if st := r.status(t); st.Process.Starts > 1 {
					t.Fatalf("the child was restarted while another process served %s: %+v", r.s.local.Target(), st.Process)
				}
				if ctx.Err() != nil {
					t.Fatal("the held restart was not logged")
				}
				time.Sleep(20 * time.Millisecond) // polling the supervisor's restart attempts
			}
			if st := r.status(t); st.Process.Running || st.Process.Starts != 1 || st.Process.Restarts != 1 {
				t.Errorf("status while the restart is held: %+v", st.Process)
			}
			err := r.s.Connector().(hostsdk.HealthChecker).CheckHealth(ctx)
			if !errors.Is(err, ErrProcessDown) || !strings.Contains(err.Error(), "not restarted") || !strings.Contains(err.Error(), r.s.local.Target()) {
				t.Errorf("CheckHealth while the restart is held = %v; want it to say another process serves %s", err, r.s.local.Target())
			}
			if code, doc := r.ready(t); code != http.StatusServiceUnavailable || doc.Connector.Ready {
				t.Errorf("/ready %d %+v while the restart is held", code, doc.Connector)
			}

			closeOther()
			awaitReady(t, r)
			if st := r.status(t); !st.Process.Running || st.Process.Starts != 2 {
				t.Errorf("status once the address is free: %+v", st.Process)
			}
			res, err := must(r.d.Act(ctx, r.target, act("echo.say", `{"message":"back"}`))).Result()
			if err != nil || res.Status != aip.ResultCompleted {
				t.Fatalf("after the restart: %+v %v", res, err)
			}
			if n := requests.Load(); n != 0 {
				t.Errorf("the other process was sent %d requests", n)
			}
		})
	}
}

// TestExecRestartHeldWhenTheAddressIsTakenBetweenCheckAndStart: the
// address check and the restart are two steps, and a process that takes
// the address in between makes the restarted child (a TCP server) fail to
// bind and exit at once. That exit is no crash of the connector, and no
// reason to restart it again: it is logged as the address taken, the
// restart is held back as when the check finds the address taken (the
// replica unhealthy, saying why), it does not count as a restart after a
// crash, and the address is checked again before the next start, which
// comes once it is free.
func TestExecRestartHeldWhenTheAddressIsTakenBetweenCheckAndStart(t *testing.T) {
	const (
		crashed = "the connector process exited; the replica reports unhealthy until it is back"
		taken   = "the connector process exited right after its start while another process listens where it is to listen"
		held    = "not restarting the connector process while another process listens where it is to listen; the replica stays unhealthy, checking again with backoff"
	)
	addr := freeAddr(t)
	l, err := NewLocal(LocalConfig{URL: "http://" + addr, Token: "t0k"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// The other process takes the address once the first restart's check
	// found it free, before the child starts.
	var (
		other    net.Listener
		otherErr error
		once     sync.Once
		took     = make(chan struct{})
	)
	w := newLogWatch()
	s := newSupervisor(superviseConfig{
		Command: []string{os.Args[0], "-test.run=^$"},
		Env:     []string{envChild + "=1", EnvLocalURL + "=http://" + addr, EnvLocalToken + "=t0k"},
		Ready:   l.probe, Vacant: l.vacant,
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 10 * time.Second,
		RestartBackoff: 100 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, StableAfter: time.Hour,
		Logger: w.logger(),
		afterVacant: func() {
			once.Do(func() {
				other, otherErr = net.Listen("tcp", addr)
				close(took)
			})
		},
	})
	ctx := ctxT(t)
	if err := s.start(ctx); err != nil {
		t.Fatal(err)
	}
	defer s.stop()
	first := s.snapshot().PID
	syscall.Kill(first, syscall.SIGKILL)
	select {
	case <-took:
	case <-ctx.Done():
		t.Fatal("the crashed child was not restarted")
	}
	if otherErr != nil {
		t.Fatalf("take the address between the check and the start: %v", otherErr)
	}
	var requests atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		requests.Add(1)
		http.Error(rw, "not the connector", http.StatusTeapot)
	})}
	served := make(chan struct{})
	go func() { defer close(served); srv.Serve(other) }()
	closeOther := func() { srv.Close(); <-served }
	defer closeOther()

	// The restarted child's exit, however it is taken.
	var exit slog.Record
	w.await(t, func(r slog.Record) bool {
		if (r.Message == crashed || strings.HasPrefix(r.Message, taken)) && attr(r, "pid") != strconv.Itoa(first) {
			exit = r
			return true
		}
		return false
	})
	if !strings.HasPrefix(exit.Message, taken) || !strings.Contains(attr(exit, "error"), addr) {
		t.Errorf("the exit of the child started while another process took %s was logged as %q (error %q); want it logged as the address taken", addr, exit.Message, attr(exit, "error"))
	}
	// The next start waits for the check, which finds the address taken.
	w.await(t, func(r slog.Record) bool { return r.Message == held && strings.Contains(attr(r, "error"), addr) })
	if st := s.snapshot(); st.Running || st.Starts != 2 || st.Restarts != 1 {
		t.Errorf("status while the address is taken: %+v; want 2 starts and the one crash counted", st)
	}
	var pe *ProcessError
	if err := s.check(); !errors.As(err, &pe) || !strings.Contains(pe.Held, addr) || pe.Restarts != 1 {
		t.Errorf("check while the address is taken = %v; want the restart held, naming %s, after 1 crash", err, addr)
	}

	closeOther()
	for {
		if st := s.snapshot(); st.Running && st.Starts == 3 && l.probe(ctx) == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the child was not restarted once the address was free: %+v", s.snapshot())
		}
		time.Sleep(20 * time.Millisecond) // polling for the restart and the child's health
	}
	if st := s.snapshot(); st.Restarts != 1 {
		t.Errorf("restarts after crashes = %d; want 1 (the address taken is no crash)", st.Restarts)
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("the other process was sent %d requests", n)
	}
}

// TestStopGivesUpOnAChildThatDoesNotExitAfterSIGKILL: a child that does
// not exit after SIGKILL (uninterruptible sleep on a dead NFS mount; here a
// reaper that does not see its exit) does not hang the stop for ever: it
// is given up on KillWait after SIGKILL, logged, and stop returns an error
// saying so, so that the sidecar finishes its shutdown.
func TestStopGivesUpOnAChildThatDoesNotExitAfterSIGKILL(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	defer unblock()
	w := newLogWatch()
	s := newSupervisor(superviseConfig{
		Command: []string{"/bin/sh", "-c", "trap '' TERM; exec sleep 60"}, Ready: func(context.Context) error { return nil },
		ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 100 * time.Millisecond, KillWait: 300 * time.Millisecond,
		RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: w.logger(),
		// The child's exit is not seen until the test releases it.
		awaitExit: func(pid int) error {
			<-release
			return awaitExitUnreaped(pid)
		},
	})
	if err := s.start(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	c := s.cur
	s.mu.Unlock()

	stopped := make(chan error, 1)
	t0 := time.Now()
	go func() { stopped <- s.stop() }()
	var err error
	select {
	case err = <-stopped:
	case <-time.After(10 * time.Second):
		unblock()
		<-stopped
		t.Fatal("stop waited for a child that did not exit after SIGKILL")
	}
	if took := time.Since(t0); took > 5*time.Second {
		t.Errorf("stop took %s; want about StopTimeout + KillWait", took)
	}
	if err == nil || !strings.Contains(err.Error(), "did not exit within 300ms after SIGKILL") {
		t.Errorf("stop = %v; want it to say the child did not exit after SIGKILL", err)
	}
	w.await(t, func(r slog.Record) bool {
		return strings.HasPrefix(r.Message, "the connector process did not exit after SIGKILL") && attr(r, "pid") == strconv.Itoa(c.cmd.Process.Pid)
	})
	if st := s.snapshot(); st.Running || st.LastExit != errNotExited {
		t.Errorf("status after the stop: %+v", st)
	}
	// The reaper still reaps the child once its exit is seen.
	unblock()
	select {
	case <-c.exited:
	case <-time.After(time.Minute):
		t.Fatal("the child was not reaped once its exit was seen")
	}
}

// TestChildFoundDeadAtStopIsUnclean: a child that exited on its own (a
// crash, or an exit with status 0 the sidecar did not ask for) and was
// not restarted yet when the stop began was found dead, not stopped: stop,
// and so the sidecar's exit status, report it with the child's pid and
// exit, whether the monitor had seen the exit (and waits to restart it)
// or not yet (a process of its group, which ignores SIGTERM, holds the
// exit back). Both returned nil, or named only the group's kill.
func TestChildFoundDeadAtStopIsUnclean(t *testing.T) {
	for _, tc := range []struct {
		name string
		sig  syscall.Signal
		exit string
		// seen: the monitor saw the exit before the stop began.
		seen bool
	}{
		{"crash_seen", syscall.SIGKILL, "signal: killed", true},
		{"exit_0_seen", syscall.SIGUSR1, "exit status 0", true},
		{"crash_unseen", syscall.SIGKILL, "signal: killed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newLogWatch()
			ready := filepath.Join(t.TempDir(), "ready")
			script := `trap 'exit 0' USR1; sleep 60 & touch "$OUT"; wait`
			if !tc.seen {
				script = `(trap '' TERM; exec sleep 60) & touch "$OUT"; wait`
			}
			s := newSupervisor(superviseConfig{
				Command: []string{"/bin/sh", "-c", script}, Env: []string{"OUT=" + ready},
				Ready: func(context.Context) error {
					_, err := os.Stat(ready)
					return err
				},
				ProbeTimeout: time.Second, StartTimeout: time.Minute, StopTimeout: 2 * time.Second,
				RestartBackoff: time.Hour, MaxBackoff: time.Hour, StableAfter: time.Hour, Logger: w.logger(),
			})
			if err := s.start(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			c := s.cur
			s.mu.Unlock()
			pid := c.cmd.Process.Pid
			syscall.Kill(pid, tc.sig)
			if tc.seen {
				w.await(t, func(r slog.Record) bool { return r.Message == "restarting the connector process" })
			} else {
				<-c.gone // the sleep left in its group keeps c.exited open
			}
			err := s.stop()
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the connector process %d did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted", pid)) ||
				!strings.Contains(err.Error(), tc.exit) {
				t.Errorf("stop after the child exited with %s, not restarted: %v; want an unclean stop naming it", tc.exit, err)
			}
		})
	}
}
