package sidecar

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Component names the sidecar in logs.
const Component = "aip-sidecar"

// Config configures a Sidecar: the replica (exactly hostsdk's Config) and
// the local side, which is an MCP server when MCP names one, and otherwise
// a connector speaking the local contract at Local.URL or Local.Socket,
// started by the sidecar when Exec is set.
type Config struct {
	// Host is the replica's configuration (the AIP_CONNECTOR_HOST_*
	// contract). Its Logger is also the sidecar's default logger.
	Host hostsdk.Config
	// Local configures the forwarding to a local-contract connector.
	Local LocalConfig
	// MCP configures the wrapping of an MCP server; it is used when
	// MCP.Command, MCP.URL or MCP.Transport is set.
	MCP MCPConfig

	// EventsToken, in local mode, enables POST /sidecar/events on the
	// replica's listener, where the connector publishes provider events
	// with this bearer token (docs/sidecar-protocol.md). With Exec and no
	// EventsToken a fresh one is generated per run. It must differ from
	// Local.Token: a leak of one must not grant the other direction.
	// Without it (and without Exec) the route is not mounted.
	EventsToken string

	// Exec, in local mode, starts the connector as a child process (the
	// program and its arguments). Without it the sidecar attaches to a
	// connector that is already running. The child gets
	// AIP_SIDECAR_LOCAL_URL or AIP_SIDECAR_LOCAL_SOCKET (where to listen),
	// AIP_SIDECAR_LOCAL_TOKEN (the bearer token the sidecar sends),
	// AIP_SIDECAR_EVENTS_URL and AIP_SIDECAR_EVENTS_TOKEN (where and with
	// which token it publishes events) on top of the inherited
	// environment and ExecEnv.
	Exec    []string
	ExecDir string
	ExecEnv []string
	// ExecStdout and ExecStderr receive the child's output (nil discards).
	ExecStdout, ExecStderr io.Writer
	// StartTimeout bounds the wait for the connector's health (or the MCP
	// connection) before the host bootstraps. Defaults to 30s.
	StartTimeout time.Duration
	// StopTimeout is how long the child and its process group have to exit
	// after SIGTERM before the group is killed (and how long what remains
	// of the group of a child that exited on its own has). Defaults to 10s.
	// A child, or a process of its group, that has not exited 5s after
	// SIGKILL (uninterruptible sleep) is given up on, logged, and not
	// waited for any longer: a stop takes at most StopTimeout and 5s.
	StopTimeout time.Duration
	// RestartBackoff and MaxBackoff shape the exponential backoff between
	// restarts of a crashed child. Default to 250ms and 30s.
	RestartBackoff time.Duration
	MaxBackoff     time.Duration
	// StableAfter: a child that ran this long before crashing (or an MCP
	// session that lasted this long) restarts after RestartBackoff again.
	// Defaults to 1m.
	StableAfter time.Duration
	// RestartUnresponsiveAfter, with Exec: after this many health checks
	// in a row (one per heartbeat) that the running child did not answer
	// at all — the probe timed out or the connection failed; an answer
	// saying it is not ready does not count — the child is taken as hung
	// and restarted: SIGTERM, SIGKILL after StopTimeout, then a restart
	// with backoff as after a crash (its in-flight actions become
	// outcome_unknown; a read-only capability's fail
	// connector_host.interrupted, retryable). A child started by a restart has StartTimeout to
	// answer its first check before its unanswered checks count, as its
	// first start has. A check left unanswered while an action forwarded to
	// the child is in progress and within its deadline does not count (nor
	// does it end the row): a connector serving one request at a time
	// cannot answer its health endpoint meanwhile, and killing it would
	// leave the action outcome_unknown; a child hung with an action in
	// flight is caught once that action's deadline (timeout_ms, else
	// Local.MaxActionDuration) has passed (in MCP mode the same holds for
	// a ping left unanswered while a tool call is in progress on the
	// session). In MCP mode it is MCP.RestartUnresponsiveAfter
	// when that is 0: the health check is an MCP ping (an MCP error answer
	// is an answer); a stdio server is restarted the same way, and a URL
	// server's session is re-opened. 0, the default, never restarts a
	// running child. An attached connector is not the sidecar's to
	// restart: it is refused without Exec or an MCP server.
	RestartUnresponsiveAfter int
	// Logger defaults to Host.Logger, then to discarding.
	Logger *slog.Logger
}

// Sidecar runs one replica for a connector that is not written in Go: a
// hostsdk host whose connector forwards to the local side. Create it with
// New and call Run.
type Sidecar struct {
	cfg   Config
	log   *slog.Logger
	local *Local
	mcp   *MCP
	sup   *supervisor
	host  *hostsdk.Host
	// probeTimeout bounds one health probe of the local connector
	// (Host.HealthProbeTimeout or its default).
	probeTimeout time.Duration
	// startErr is why the local side did not start (at the host's
	// bootstrap step 2, see Run), started that it did; written and read
	// on Run's goroutine.
	startErr error
	started  bool
}

// New validates cfg and builds the sidecar and its host. It does no I/O
// and starts nothing.
func New(cfg Config) (*Sidecar, error) {
	s, err := newLocalSide(cfg)
	if err != nil {
		return nil, err
	}
	if s.local != nil && s.local.events != nil {
		s.cfg.Host.Collectors = append(append([]prometheus.Collector(nil), s.cfg.Host.Collectors...), s.local.events.m.collectors()...)
	}
	// The local side starts once the host holds the replica's journal.
	s.cfg.Host.AfterOpenJournal = s.afterOpenJournal(s.cfg.Host.AfterOpenJournal)
	h, err := hostsdk.New(s.cfg.Host, s.Connector())
	if err != nil {
		return nil, err
	}
	s.host = h
	return s, nil
}

// newToken returns 32 random bytes in hex: a token only the sidecar and its
// child know.
func newToken() string {
	var b [32]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// newLocalSide validates the sidecar's own settings and builds the
// connector (and supervisor) without the host.
func newLocalSide(cfg Config) (*Sidecar, error) {
	log := cfg.Logger
	if log == nil {
		log = cfg.Host.Logger
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", Component)
	for _, d := range []struct {
		field string
		p     *time.Duration
		def   time.Duration
	}{
		{"StartTimeout", &cfg.StartTimeout, DefaultStartTimeout}, {"StopTimeout", &cfg.StopTimeout, DefaultStopTimeout},
		{"RestartBackoff", &cfg.RestartBackoff, DefaultRestartBackoff}, {"MaxBackoff", &cfg.MaxBackoff, DefaultMaxBackoff},
		{"StableAfter", &cfg.StableAfter, DefaultStableAfter},
	} {
		if *d.p < 0 {
			return nil, cfgErr(d.field, fmt.Sprintf("is %s; it must not be negative", *d.p))
		}
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if cfg.RestartUnresponsiveAfter < 0 {
		return nil, cfgErr("RestartUnresponsiveAfter", fmt.Sprintf("is %d; it must not be negative (0 never restarts a running child)", cfg.RestartUnresponsiveAfter))
	}
	mcpMode := len(cfg.MCP.Command) > 0 || cfg.MCP.URL != "" || cfg.MCP.Transport != nil
	if cfg.RestartUnresponsiveAfter > 0 && len(cfg.Exec) == 0 && !mcpMode {
		return nil, cfgErr("RestartUnresponsiveAfter", "restarts a child the sidecar started or re-opens an MCP session; it needs --exec, --mcp-command or --mcp-url (an attached connector is not the sidecar's to restart)")
	}
	probe := cfg.Host.HealthProbeTimeout
	if probe == 0 {
		probe = hostsdk.DefaultHealthProbeTimeout
	}
	s := &Sidecar{cfg: cfg, log: log, probeTimeout: probe}
	if mcpMode {
		if len(cfg.Exec) > 0 {
			return nil, cfgErr("Exec", "is for a local-contract connector; in MCP mode give the server's command with --mcp-command")
		}
		if cfg.Local.URL != "" || cfg.Local.Socket != "" {
			field := "Local.URL"
			if cfg.Local.URL == "" {
				field = "Local.Socket"
			}
			return nil, cfgErr(field, "is set together with an MCP server; choose the local contract (--local-url/--local-socket) or MCP (--mcp-command/--mcp-url)")
		}
		if cfg.EventsToken != "" {
			return nil, cfgErr("EventsToken", "is set together with an MCP server; MCP servers do not publish AIP events, so the sidecar serves no "+PathEvents+" in MCP mode")
		}
		mc := cfg.MCP
		mc.childOf = cfg.Host.ReplicaID
		if mc.Logger == nil {
			mc.Logger = log
		}
		if mc.RestartBackoff == 0 {
			mc.RestartBackoff = cfg.RestartBackoff
		}
		if mc.MaxBackoff == 0 {
			mc.MaxBackoff = cfg.MaxBackoff
		}
		if mc.StableAfter == 0 {
			mc.StableAfter = cfg.StableAfter
		}
		if mc.StopTimeout == 0 {
			mc.StopTimeout = cfg.StopTimeout
		}
		if mc.ConnectTimeout == 0 {
			mc.ConnectTimeout = cfg.StartTimeout
		}
		if mc.RestartUnresponsiveAfter == 0 {
			mc.RestartUnresponsiveAfter = cfg.RestartUnresponsiveAfter
		}
		m, err := NewMCP(mc)
		if err != nil {
			return nil, err
		}
		s.mcp = m
	} else {
		lc := cfg.Local
		if lc.Logger == nil {
			lc.Logger = log
		}
		if len(cfg.Exec) > 0 && cfg.Exec[0] == "" {
			return nil, cfgErr("Exec", "has an empty program name")
		}
		if len(cfg.Exec) > 0 && lc.Token == "" {
			// Only the sidecar and its child know the token.
			lc.Token = newToken()
		}
		l, err := NewLocal(lc)
		if err != nil {
			return nil, err
		}
		s.local = l
		eventsToken := cfg.EventsToken
		if len(cfg.Exec) > 0 && eventsToken == "" {
			eventsToken = newToken()
		}
		var eventsURL string
		if eventsToken != "" {
			if err := checkToken(eventsToken); err != nil {
				return nil, cfgErr("EventsToken", err.Error())
			}
			if subtle.ConstantTimeCompare([]byte(eventsToken), []byte(lc.Token)) == 1 {
				return nil, cfgErr("EventsToken", "is the local connector's token (--local-token-file); use another token for the events route, so that a leak of one does not grant the other direction")
			}
			l.events = &eventsRoute{token: eventsToken, m: newEventsMetrics()}
			if len(cfg.Exec) > 0 {
				listen := cfg.Host.Bind
				if cfg.Host.Listener != nil {
					listen = cfg.Host.Listener.Addr().String()
				} else if listen == "" {
					listen = hostsdk.DefaultBind
				}
				u, err := eventsURLFor(listen)
				switch {
				case errors.Is(err, errEventsPortUnknown):
					// The child cannot be told where to publish: no route.
					log.Warn("the replica binds port 0, so the --exec child cannot be told the events URL before the listener binds; it gets no "+
						EnvEventsURL+" and POST "+PathEvents+" is not served: bind a fixed port (--bind) to publish events", "bind", listen)
					l.events, eventsToken = nil, ""
				case err != nil:
					return nil, cfgErr("Host.Bind", err.Error())
				default:
					eventsURL = u
				}
			}
		}
		if len(cfg.Exec) > 0 {
			env := append([]string{}, cfg.ExecEnv...)
			listenEnv := EnvLocalURL + "=" + lc.URL
			if lc.Socket != "" {
				listenEnv = EnvLocalSocket + "=" + lc.Socket
			}
			env = append(env, listenEnv)
			env = append(env, EnvLocalToken+"="+lc.Token)
			if eventsURL != "" {
				env = append(env, EnvEventsURL+"="+eventsURL, EnvEventsToken+"="+eventsToken)
			}
			s.sup = newSupervisor(superviseConfig{
				Command: cfg.Exec, Dir: cfg.ExecDir, Env: env, ChildOf: cfg.Host.ReplicaID, Stdout: cfg.ExecStdout, Stderr: cfg.ExecStderr,
				Ready: l.probe, ListenEnv: listenEnv, Vacant: l.vacant, ProbeTimeout: probe, StartTimeout: cfg.StartTimeout, StopTimeout: cfg.StopTimeout,
				RestartBackoff: cfg.RestartBackoff, MaxBackoff: cfg.MaxBackoff, StableAfter: cfg.StableAfter,
				Logger: log,
			})
			l.proc = s.sup
			l.restartUnresponsiveAfter = cfg.RestartUnresponsiveAfter
			l.startGrace = cfg.StartTimeout
			if l.startGrace <= 0 {
				l.startGrace = DefaultStartTimeout
			}
			l.status.setProcess(s.sup)
		}
	}
	return s, nil
}

// Describe starts the local side as Run would, reads the connector's
// manifest, binds it to cfg.Host.TrustDomain with hostsdk.BindManifest
// (the checks and binding of the host's bootstrap), and stops the local
// side. It returns the bound manifest and its digest: what
// an operator admits as the connector version. Only the sidecar's own
// settings and Host.TrustDomain are needed.
// It holds no journal, so it kills no process a killed sidecar of the
// replica left running (see Run).
func Describe(ctx context.Context, cfg Config) (*aip.Manifest, string, error) {
	s, err := newLocalSide(cfg)
	if err != nil {
		return nil, "", err
	}
	if err := s.startLocal(ctx); err != nil {
		return nil, "", errors.Join(err, s.stopLocal())
	}
	m, err := s.Connector().Manifest(ctx, hostsdk.TenantContext{TenantID: cfg.Host.TenantID, TrustDomain: cfg.Host.TrustDomain})
	if stopErr := s.stopLocal(); err == nil {
		err = stopErr
	}
	if err != nil {
		return nil, "", err
	}
	bound, digest, err := hostsdk.BindManifest(m, cfg.Host.TrustDomain)
	if err != nil {
		return nil, "", fmt.Errorf("sidecar: the connector's manifest: %w", err)
	}
	return bound, digest, nil
}

// Host returns the replica's host (for its address, DID and manifest
// digest).
func (s *Sidecar) Host() *hostsdk.Host { return s.host }

// Connector returns the hostsdk connector the host runs (a *Local or an
// *MCP).
func (s *Sidecar) Connector() hostsdk.Connector {
	if s.mcp != nil {
		return s.mcp
	}
	return s.local
}

// Run runs the host until ctx is cancelled (SIGTERM, Ctrl-C), bringing up
// the local side during its bootstrap, and stops the local side. The order
// is what keeps in-flight work safe:
//
//  1. the host validates its configuration and opens the replica's
//     journal, whose lock proves that no other sidecar of this replica
//     runs; then (hostsdk.Config.AfterOpenJournal) the processes a killed
//     sidecar of this replica left running are killed (stopOrphans), and
//     the connector (--exec) or the MCP server is started and awaited
//     until it is healthy — or, attached, the running connector is — for
//     at most StartTimeout; nothing is registered before;
//  2. the host goes on: discovery and recovery talk to the connector,
//     register, heartbeat; a crashed child is restarted with backoff
//     while health checks report the replica unhealthy;
//  3. on ctx cancellation the host drains: it sends drain, refuses new
//     actions, waits for in-flight actions — which still reach the running
//     connector — shuts its listener down and sends offline;
//  4. only after the host returned, the child is stopped (SIGTERM to its
//     process group, SIGKILL after StopTimeout) or the MCP session closed.
//
// The result is nil only when the host's shutdown was clean and the local
// side stopped cleanly in time (a child that exits with a failure status
// after SIGTERM, or has to be killed, makes it an error; so does a stdio
// MCP server whose stop ends in its death by a signal the sidecar did not
// send, or that exited before its stop began: MCP.exitResult).
func (s *Sidecar) Run(ctx context.Context) error {
	runErr := s.host.Run(ctx)
	switch {
	case s.startErr != nil:
		// The host reports it as its step 2 (or, interrupted, not at
		// all); the start's own error says what failed.
		return errors.Join(s.startErr, s.stopLocal())
	case !s.started && ctx.Err() != nil:
		// Stopped before the host reached the local side's start: the
		// host reports a clean stop; it is an interrupted start, as one
		// during the local side's start is.
		return errors.Join(fmt.Errorf("sidecar: start interrupted before the connector was started: %w", ctx.Err()), s.stopLocal())
	}
	if runErr != nil {
		runErr = settingFirst(runErr)
		s.log.Error("host stopped with an error", "error", runErr)
	}
	return errors.Join(runErr, s.stopLocal())
}

// settingFirst returns err, the host's, as the sidecar's *ConfigError it
// holds when bootstrap step 3 (discovery) failed because the connector
// refused a setting of the sidecar (an --mcp-tools naming a tool the MCP
// server does not offer, MCP.checkAllowList): that error's text without
// the host's "hostsdk: bootstrap step 3 (discover): " in front, since
// the operator has a setting to correct, not a step to debug; what the
// host adds after it (what the failed start could not release) is kept.
// It still matches what err matches (the *hostsdk.DiscoverError and
// hostsdk.ErrSetting, exit status 2).
func settingFirst(err error) error {
	var de *hostsdk.DiscoverError
	var ce *ConfigError
	if !errors.As(err, &de) || !errors.As(de.Err, &ce) {
		return err
	}
	return &reworded{msg: strings.Replace(err.Error(), de.Error(), ce.Error(), 1), err: err}
}

// reworded is err with another text.
type reworded struct {
	msg string
	err error
}

func (r *reworded) Error() string { return r.msg }
func (r *reworded) Unwrap() error { return r.err }

// afterOpenJournal is the host's AfterOpenJournal (after prev, a
// caller's own): with the replica's journal held, the processes a killed
// sidecar of this replica left running are killed before the local side
// starts (step 1 of Run).
func (s *Sidecar) afterOpenJournal(prev func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if prev != nil {
			if err := prev(ctx); err != nil {
				return err
			}
		}
		stopOrphans(s.cfg.Host.ReplicaID, s.cfg.StopTimeout, s.log)
		if err := s.startLocal(ctx); err != nil {
			s.startErr = err
			return err
		}
		s.started = true
		return nil
	}
}

// startLocal is the end of step 1 of Run (and Describe's start).
func (s *Sidecar) startLocal(ctx context.Context) error {
	switch {
	case s.mcp != nil:
		s.log.Info("connecting to the MCP server", "target", s.mcp.Target())
		return s.mcp.Connect(ctx)
	case s.sup != nil:
		s.log.Info("starting the connector", "command", s.cfg.Exec[0], "target", s.local.Target())
		return s.sup.start(ctx)
	}
	s.log.Info("waiting for the running connector", "target", s.local.Target())
	return s.awaitAttached(ctx)
}

// awaitAttached polls an attached connector's health until it answers.
func (s *Sidecar) awaitAttached(ctx context.Context) error {
	wctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	if last, err := pollReady(wctx, s.probeTimeout, s.local.probe, nil); err != nil {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("sidecar: the wait for the connector at %s was interrupted: %w", s.local.Target(), err)
		}
		return fmt.Errorf("%w within %s (--%s) at %s: last health check: %s", ErrStartTimeout, s.cfg.StartTimeout, settingOf["StartTimeout"], s.local.Target(), detail(last))
	}
	return nil
}

// stopLocal is step 4 of Run.
func (s *Sidecar) stopLocal() error {
	switch {
	case s.mcp != nil:
		return s.mcp.Close()
	case s.sup != nil:
		err := s.sup.stop()
		s.local.Close()
		return err
	}
	s.local.Close()
	return nil
}
