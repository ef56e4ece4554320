package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/netutil"
)

// Defaults and bounds of LocalConfig.
const (
	DefaultCancelGrace       = 5 * time.Second
	DefaultMaxActionDuration = time.Hour
	DefaultMaxResultBytes    = aip.MaxMessageBytes
	DefaultMaxChunkBytes     = 1 << 20
	DefaultMaxChunks         = 100_000
	DefaultRequestTimeout    = 10 * time.Second
	DefaultReconcileWait     = 30 * time.Second
	// MaxManifestBytes bounds GET /aip/manifest.
	MaxManifestBytes = hostsdk.MaxManifestBytes
	// maxSmallBody bounds health, cancel and error bodies.
	maxSmallBody = 64 << 10
	// maxSocketPath is the longest unix socket path Linux accepts.
	maxSocketPath = 107
)

// LocalConfig configures a Local connector. Exactly one of URL and Socket
// is required; every other zero field means its documented default.
type LocalConfig struct {
	// URL is the local connector's origin on a loopback address, for
	// example http://127.0.0.1:8700 (no path, query or credentials).
	URL string
	// Socket is the path of the local connector's unix socket.
	Socket string
	// Token, when set, is sent as "Authorization: Bearer <token>" on every
	// request so that other local processes cannot drive the connector.
	Token string
	// CancelGrace is how long the sidecar waits for the connector's answer
	// after cancelling an action (a cancel, the action's timeout or the
	// host's shutdown) before it records outcome_unknown. Defaults to 5s.
	CancelGrace time.Duration
	// MaxActionDuration bounds an action whose timeout_ms is not set (or
	// 0). Defaults to 1h.
	MaxActionDuration time.Duration
	// MaxResultBytes bounds an action's result. Defaults to 4 MiB.
	MaxResultBytes int64
	// MaxChunkBytes bounds one NDJSON line of a streaming answer. Defaults
	// to 1 MiB.
	MaxChunkBytes int
	// MaxChunks bounds the chunks of one streaming action, and the empty
	// lines between them (which are skipped). Defaults to 100000.
	MaxChunks int
	// RequestTimeout bounds GET /aip/manifest, cancel and reconcile
	// requests. Health requests are bounded by the host's probe timeout.
	// Defaults to 10s.
	RequestTimeout time.Duration
	// ReconcileWait bounds how long recovery waits for an action the
	// connector reports as still running. Defaults to 30s.
	ReconcileWait time.Duration
	// OnManifestChange says what a manifest that differs from the admitted
	// one does. Defaults to ManifestChangeReport.
	OnManifestChange ManifestChangePolicy
	// Logger defaults to a logger that discards everything.
	Logger *slog.Logger
}

// Local is a hostsdk connector that forwards to a local process speaking
// the local connector contract (docs/sidecar-protocol.md). It implements
// hostsdk.Connector, HealthChecker, Canceler, Streamer, Reconciler and
// RouteProvider. Create it with NewLocal.
type Local struct {
	cfg    LocalConfig
	base   string // http://host:port, or http://unix for a socket
	client *http.Client
	log    *slog.Logger
	drift  *drift
	status *statusSource
	// proc is the supervised child (nil when attached).
	proc processView
	// restartUnresponsiveAfter and unresponsive: see
	// Config.RestartUnresponsiveAfter; unresponsive counts the health
	// checks in a row the running child did not answer.
	restartUnresponsiveAfter int
	unresponsive             atomic.Int64
	// working counts the actions forwarded to the connector that are in
	// progress and within their deadline (trackWork); while there are
	// any, unanswered health checks do not count (noteUnanswered).
	working atomic.Int64
	// startGrace is how long a child started by a restart may leave
	// health checks unanswered before it answered one (the start timeout
	// its first start is given): it is starting, not hung.
	startGrace time.Duration
	// events is POST /sidecar/events (nil: not mounted).
	events *eventsRoute
	// checkedGen is the process generation whose manifest was compared
	// with the admitted one.
	checkedGen atomic.Int64
}

// NewLocal validates cfg and returns a Local. It does no I/O.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	l := &Local{cfg: cfg, log: cfg.Logger}
	tr := &http.Transport{
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		// A local connector answers headers when its action is done or its
		// stream starts; actions are bounded by their own deadlines.
		ResponseHeaderTimeout: 0,
		ForceAttemptHTTP2:     false,
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	if cfg.Socket != "" {
		path := cfg.Socket
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		}
		l.base = "http://unix"
	} else {
		tr.DialContext = dialer.DialContext
		l.base = strings.TrimSuffix(cfg.URL, "/")
	}
	l.client = &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	l.drift = newDrift(cfg.OnManifestChange, cfg.Logger)
	l.status = &statusSource{mode: "local", target: l.Target(), drift: l.drift}
	return l, nil
}

func (c *LocalConfig) withDefaults() error {
	switch {
	case c.URL == "" && c.Socket == "":
		return cfgErr("Local.URL", "is empty: give the local connector's loopback URL, or its unix socket with --local-socket (AIP_SIDECAR_LOCAL_SOCKET)")
	case c.URL != "" && c.Socket != "":
		return cfgErr("Local.URL", "and --local-socket (AIP_SIDECAR_LOCAL_SOCKET) are both set; give exactly one")
	case c.URL != "":
		if err := checkLoopbackURL(c.URL); err != nil {
			return cfgErr("Local.URL", err.Error())
		}
	default:
		if len(c.Socket) > maxSocketPath {
			return cfgErr("Local.Socket", fmt.Sprintf("is %d bytes; a unix socket path is at most %d bytes", len(c.Socket), maxSocketPath))
		}
	}
	// The token goes into an Authorization header (and, with Exec, the
	// child's environment): a byte net/http refuses there would fail
	// every request, start-up only after StartTimeout, with no word of
	// the token.
	if err := checkToken(c.Token); err != nil {
		return cfgErr("Local.Token", err.Error())
	}
	for _, d := range []struct {
		field string
		p     *time.Duration
		def   time.Duration
	}{
		{"Local.CancelGrace", &c.CancelGrace, DefaultCancelGrace},
		{"Local.MaxActionDuration", &c.MaxActionDuration, DefaultMaxActionDuration},
		{"Local.RequestTimeout", &c.RequestTimeout, DefaultRequestTimeout},
		{"Local.ReconcileWait", &c.ReconcileWait, DefaultReconcileWait},
	} {
		if *d.p == 0 {
			*d.p = d.def
		}
		if *d.p < 0 {
			return cfgErr(d.field, "is negative")
		}
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	if c.MaxChunkBytes == 0 {
		c.MaxChunkBytes = DefaultMaxChunkBytes
	}
	if c.MaxChunks == 0 {
		c.MaxChunks = DefaultMaxChunks
	}
	for _, l := range []struct {
		field string
		v     int64
	}{
		{"Local.MaxResultBytes", c.MaxResultBytes},
		{"Local.MaxChunkBytes", int64(c.MaxChunkBytes)},
		{"Local.MaxChunks", int64(c.MaxChunks)},
	} {
		if l.v < 0 {
			return cfgErr(l.field, "is negative")
		}
	}
	if err := c.OnManifestChange.validate("Local.OnManifestChange"); err != nil {
		return err
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// checkToken accepts a bearer token that can be sent in an Authorization
// header (and put in a child's environment).
func checkToken(token string) error {
	for i := 0; i < len(token); i++ {
		if b := token[i]; b <= ' ' || b >= 0x7f {
			return fmt.Errorf("has byte %#02x at offset %d; a bearer token is one word of visible ASCII (no whitespace, control or non-ASCII characters)", b, i)
		}
	}
	return nil
}

// checkLoopbackURL accepts http://<loopback host>:<port> with no path.
func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("is %q; want http://<loopback address>:<port>, for example http://127.0.0.1:8700", raw)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("is %q; give only the origin (no path, query, fragment or credentials)", raw)
	}
	if u.Port() == "" {
		return fmt.Errorf("is %q; give the port", raw)
	}
	if !netutil.IsLoopbackHost(u.Hostname()) {
		return fmt.Errorf("is %q; the local connector must listen on a loopback address (127.0.0.0/8, ::1 or localhost) or a unix socket", raw)
	}
	return nil
}

// Target names where the connector listens (for logs and status).
func (l *Local) Target() string {
	if l.cfg.Socket != "" {
		return "unix:" + l.cfg.Socket
	}
	return l.cfg.URL
}

// vacant fails when a process already accepts connections where the
// connector is to listen, before the sidecar starts it (--exec), and
// before every restart of it (superviseConfig.Vacant): that process would
// answer for the child — its health, its manifest, the actions — while
// the child fails to bind and crash-loops (TCP), or races it for the
// socket path. (The processes a killed sidecar of this replica left
// running are killed before the first start: stopOrphans.)
func (l *Local) vacant(ctx context.Context) error {
	network, addr, flag := "unix", l.cfg.Socket, "--local-socket"
	if l.cfg.Socket == "" {
		u, err := url.Parse(l.cfg.URL)
		if err != nil {
			return cfgErr("Local.URL", err.Error())
		}
		network, addr, flag = "tcp", u.Host, "--local-url"
	}
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil // refused (or a stale socket file): free for the child
	}
	conn.Close()
	return fmt.Errorf("sidecar: another process already listens at %s, where the connector is to listen: it would answer for the connector (an earlier connector still running, one started by hand, or a process an earlier child started that left its process group?); stop it, or give the connector another address with %s",
		l.Target(), flag)
}

// Close releases idle connections.
func (l *Local) Close() { l.client.CloseIdleConnections() }

// newRequest builds a request to the connector with the bearer token.
func (l *Local) newRequest(ctx context.Context, method, path string, body any) (*http.Request, error) {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, l.base+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json, "+hostsdk.ContentTypeNDJSON)
	if l.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+l.cfg.Token)
	}
	return req, nil
}

// Manifest implements hostsdk.Connector: GET /aip/manifest. The first
// manifest fetched is the one the host admits; later fetches are compared
// with it.
func (l *Local) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m, err := l.fetchManifest(ctx)
	if err != nil {
		return nil, err
	}
	l.drift.admit(m)
	if l.proc != nil {
		l.checkedGen.Store(int64(l.proc.generation()))
	}
	return m, nil
}

func (l *Local) fetchManifest(ctx context.Context) (*aip.Manifest, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	req, err := l.newRequest(ctx, http.MethodGet, PathLocalManifest, nil)
	if err != nil {
		return nil, err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, &LocalError{Op: "GET " + PathLocalManifest, Target: l.Target(), Err: err}
	}
	defer resp.Body.Close()
	body, err := readLimited(resp.Body, MaxManifestBytes)
	if err != nil {
		return nil, &LocalError{Op: "GET " + PathLocalManifest, Target: l.Target(), Err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, &LocalError{Op: "GET " + PathLocalManifest, Target: l.Target(), Status: resp.StatusCode, Err: errors.New(errorText(body))}
	}
	var m aip.Manifest
	if err := aip.DecodeStrict(body, &m); err != nil {
		return nil, &LocalError{Op: "GET " + PathLocalManifest, Target: l.Target(), Status: resp.StatusCode,
			Err: fmt.Errorf("the manifest is not an AIP manifest: %w", err)}
	}
	if err := m.Validate(); err != nil {
		return nil, &LocalError{Op: "GET " + PathLocalManifest, Target: l.Target(), Status: resp.StatusCode, Err: fmt.Errorf("invalid manifest: %w", err)}
	}
	return &m, nil
}

// CheckHealth implements hostsdk.HealthChecker: the supervised process must
// be running, GET /aip/health must answer 200 {"status":"ok"}, and (with
// ManifestChangeUnready) the connector's manifest must still be the
// admitted one. After the connector comes back from being unhealthy (and,
// under ManifestChangeUnready, on every check while a change is in force),
// its manifest is fetched again and compared with the admitted one.
func (l *Local) CheckHealth(ctx context.Context) error {
	gen := int64(0)
	if l.proc != nil {
		if err := l.proc.check(); err != nil {
			l.status.setHealthy(false)
			return err
		}
		gen = int64(l.proc.generation())
	}
	if err := l.probe(ctx); err != nil {
		l.status.setHealthy(false)
		l.noteUnanswered(err)
		return err
	}
	l.unresponsive.Store(0)
	recovered := l.status.setHealthy(true)
	if l.checkedGen.Swap(gen) != gen {
		recovered = true // a new process since the last check
	}
	if (recovered || l.drift.err() != nil) && l.drift.hasAdmitted() {
		// Back after being unhealthy (a restart, or an attached connector
		// that was down): is it still the admitted connector? And while
		// a change keeps the replica unready, is it the admitted one
		// again (a roll-back need not fail a health check)?
		m, err := l.fetchManifest(ctx)
		if err != nil {
			l.status.setHealthy(false)
			return fmt.Errorf("re-read the manifest after the connector came back: %w", err)
		}
		l.drift.observe(m)
	}
	return l.drift.err()
}

// noteUnanswered counts a health check the running child did not answer at
// all (no HTTP answer: the probe timed out or the connection failed; an
// answer saying it is not ready does not count) and, at the configured
// limit, has the supervisor restart it as hung.
//
// A check left unanswered while an action forwarded to the child is in
// progress and within its deadline does not count (nor does it end the
// row): the child is working on it, and a connector that serves one
// request at a time cannot answer its health endpoint meanwhile — killing
// it would cut the action off, leaving it outcome_unknown. A child hung
// with an action in flight is caught once that action's deadline
// (timeout_ms, else MaxActionDuration) has passed: its checks count from
// then on.
func (l *Local) noteUnanswered(err error) {
	var le *LocalError
	if l.proc == nil || l.restartUnresponsiveAfter <= 0 || !errors.As(err, &le) || le.Status != 0 {
		l.unresponsive.Store(0)
		return
	}
	if l.working.Load() > 0 {
		return
	}
	if l.checkedGen.Load() != int64(l.proc.generation()) {
		// This child has not answered a check yet: a restart's child still
		// starting (it may not listen yet) is given the start timeout, as
		// the first start is, before unanswered checks count; else a
		// connector slower to start than RestartUnresponsiveAfter health
		// checks would be killed again at every restart.
		if st := l.proc.snapshot(); st.Running && time.Since(st.Since) < l.startGrace {
			return
		}
	}
	if n := l.unresponsive.Add(1); n >= int64(l.restartUnresponsiveAfter) {
		l.unresponsive.Store(0)
		l.proc.restartHung(fmt.Sprintf("no answer to %d health checks in a row; the last: %v", n, err))
	}
}

// probe asks GET /aip/health.
func (l *Local) probe(ctx context.Context) error {
	req, err := l.newRequest(ctx, http.MethodGet, PathLocalHealth, nil)
	if err != nil {
		return err
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return &LocalError{Op: "GET " + PathLocalHealth, Target: l.Target(), Err: err}
	}
	defer resp.Body.Close()
	body := readPrefix(resp.Body, maxSmallBody)
	var h localHealth
	_ = json.Unmarshal(body, &h)
	if resp.StatusCode == http.StatusOK && h.Status == "ok" {
		return nil
	}
	return &LocalError{Op: "GET " + PathLocalHealth, Target: l.Target(), Status: resp.StatusCode,
		Err: l.notReady(resp.StatusCode, h, body)}
}

// notReady says why a health answer other than 200 {"status":"ok"} leaves
// the connector not ready, and what the sidecar expected where the answer
// looks like a mistake rather than a connector reporting itself unready:
// a refused token, or a 200 whose body is not a health answer.
func (l *Local) notReady(status int, h localHealth, body []byte) error {
	switch {
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		sent := "the sidecar sends \"Authorization: Bearer <token>\" with the token it hands an --exec child in " +
			EnvLocalToken + " (or reads from --local-token-file)"
		if l.cfg.Token == "" {
			sent = "the sidecar has no token to send: give an attached sidecar the connector's token with --local-token-file"
		}
		return fmt.Errorf("the connector refused the sidecar's credentials (%s): %s", sent, errorText(body))
	case status == http.StatusOK && h.Status != "unavailable":
		return fmt.Errorf("the connector is not ready: a ready connector answers 200 {\"status\":\"ok\"} (JSON; names and values are case-sensitive), this answer was: %s", errorText(body))
	}
	detail := h.Detail
	if detail == "" {
		detail = errorText(body)
	}
	return fmt.Errorf("the connector is not ready: %s", detail)
}

// Handle implements hostsdk.Connector: POST /aip/actions in sync mode.
func (l *Local) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return l.forward(ctx, call, nil)
}

// HandleStream implements hostsdk.Streamer: POST /aip/actions in streaming
// mode; the connector's NDJSON chunks are sent on as signed stream chunks.
func (l *Local) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	return l.forward(ctx, call, chunks)
}

// Cancel implements hostsdk.Canceler: POST /aip/actions/{id}/cancel with the
// dispatcher's reason. (The running forward also sends a cancel when its
// context ends; the connector treats cancels idempotently.)
func (l *Local) Cancel(ctx context.Context, call *hostsdk.Call, reason string) error {
	return l.sendCancel(ctx, call.Action.ID, call.IdempotencyKey, reason)
}

func (l *Local) sendCancel(ctx context.Context, actionID, key, reason string) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	path := PathLocalActions + "/" + url.PathEscape(actionID) + "/cancel"
	req, err := l.newRequest(ctx, http.MethodPost, path, localCancel{ActionID: actionID, Reason: aip.TruncateUTF8(reason, 2048)})
	if err != nil {
		return err
	}
	req.Header.Set(HeaderActionID, actionID)
	req.Header.Set(HeaderIdempotencyKey, key)
	resp, err := l.client.Do(req)
	if err != nil {
		return &LocalError{Op: "POST " + path, Target: l.Target(), Err: err}
	}
	defer resp.Body.Close()
	body := readPrefix(resp.Body, maxSmallBody)
	switch resp.StatusCode {
	case http.StatusOK, http.StatusAccepted, http.StatusNoContent, http.StatusNotFound, http.StatusConflict:
		return nil
	}
	return &LocalError{Op: "POST " + path, Target: l.Target(), Status: resp.StatusCode, Err: errors.New(errorText(body))}
}

// forward sends one action and turns the answer into a result. The request
// is not tied to ctx: when ctx ends (cancel, timeout, shutdown) the
// connector is told to cancel and has CancelGrace from then to answer
// (whether or not it answers the cancel); only then is the request
// abandoned and the outcome recorded as unknown (a read's as failed
// connector_host.interrupted: hostsdk.Interrupted).
func (l *Local) forward(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	a := call.Action
	body := localAction{
		ActionID: a.ID, IdempotencyKey: call.IdempotencyKey, CapabilityID: a.CapabilityID, Input: a.Input,
		Mode: "sync", TimeoutMS: a.TimeoutMS, MessageID: call.MessageID, Identity: a.Identity,
		Tenant: localTenant{
			TenantID: call.Tenant.TenantID, ConnectorTypeID: call.Tenant.ConnectorTypeID, VersionID: call.Tenant.VersionID,
			InstanceID: call.Tenant.InstanceID, ReplicaID: call.Tenant.ReplicaID, ConfigRevision: call.Tenant.ConfigRevision,
			TrustDomain: call.Tenant.TrustDomain, MembershipID: call.Tenant.MembershipID,
			CredentialRevisionRef: call.Tenant.CredentialRevisionRef,
		},
	}
	if chunks != nil {
		body.Mode = "streaming"
	}
	if l.proc != nil {
		if err := l.proc.check(); err != nil {
			return nil, notDelivered(err)
		}
	}
	if a.TimeoutMS == nil || *a.TimeoutMS == 0 {
		// timeout_ms 0 sets no deadline in the host either.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.cfg.MaxActionDuration)
		defer cancel()
	}
	if l.restartUnresponsiveAfter > 0 {
		defer l.trackWork(ctx)()
	}
	// reqCtx ends when forward returns or the cancel grace passes.
	reqCtx, abort := context.WithCancelCause(context.WithoutCancel(ctx))
	watchDone := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		defer close(watchDone)
		reason := "cancelled"
		if cause := context.Cause(ctx); cause != nil {
			reason = cause.Error()
		}
		// The grace runs from the cancellation, also while the cancel
		// itself is unanswered (a wedged connector answers neither).
		graceCtx, cancelGrace := context.WithTimeoutCause(reqCtx, l.cfg.CancelGrace, errCancelGrace)
		defer cancelGrace()
		if err := l.sendCancel(graceCtx, a.ID, call.IdempotencyKey, reason); err != nil && graceCtx.Err() == nil {
			call.Logger.Warn("cancel the local action", "error", err)
		}
		<-graceCtx.Done()
		if errors.Is(context.Cause(graceCtx), errCancelGrace) {
			abort(errCancelGrace)
		}
	})
	defer func() {
		abort(nil)
		if !stopWatch() {
			<-watchDone // the watcher ran: wait for it (reqCtx is done, so it returns)
		}
	}()

	req, err := l.newRequest(reqCtx, http.MethodPost, PathLocalActions, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set(HeaderActionID, a.ID)
	req.Header.Set(HeaderIdempotencyKey, call.IdempotencyKey)
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, l.transportError(reqCtx, call.Capability, err)
	}
	defer resp.Body.Close()
	return l.answer(reqCtx, call, resp, chunks)
}

// trackWork counts an action forwarded to the connector as in progress
// (Local.working) until ctx — the action's, with its deadline — ends or
// the returned function is called, whichever comes first.
func (l *Local) trackWork(ctx context.Context) (done func()) { return trackWork(ctx, &l.working) }

// trackWork counts one piece of work in n — an action forwarded to an
// --exec child (Local), a tool call on an MCP session (MCP.call) — until
// ctx, the action's with its deadline, ends or the returned function is
// called, whichever comes first: while n is not 0 the process is evidently
// working, and its unanswered health checks do not count as a hang.
func trackWork(ctx context.Context, n *atomic.Int64) (done func()) {
	n.Add(1)
	var once sync.Once
	end := func() { once.Do(func() { n.Add(-1) }) }
	stop := context.AfterFunc(ctx, end)
	return func() {
		stop()
		end()
	}
}

var errCancelGrace = errors.New("sidecar: the connector did not answer within the cancel grace")

// transportError classifies a failed exchange of capability c's action: a
// dial failure means the action never reached the connector; anything
// later cut it off (hostsdk.Interrupted: outcome_unknown, or for a read a
// failed, retryable connector_host.interrupted).
func (l *Local) transportError(reqCtx context.Context, c *aip.Capability, err error) error {
	if errors.Is(context.Cause(reqCtx), errCancelGrace) {
		return hostsdk.Interrupted(c, fmt.Sprintf("the action was cancelled and the connector did not answer within %s", l.cfg.CancelGrace))
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return notDelivered(&LocalError{Op: "POST " + PathLocalActions, Target: l.Target(), Err: err})
	}
	return hostsdk.Interrupted(c, fmt.Sprintf("the exchange with the connector broke before it answered (did it crash?): %v", err))
}

// notDelivered is a failed result for an action that never reached the
// local connector: it did not run, and a new action may be sent.
func notDelivered(err error) error { return notDeliveredTo("the local connector", err) }

// notDeliveredTo is notDelivered for an action that never reached what
// ("the local connector", "the MCP server").
func notDeliveredTo(what string, err error) error {
	return aip.NewProtocolError(CodeConnectorUnavailable, aip.CategoryTemporary, true, 1000,
		aip.TruncateUTF8(what+" is unavailable; the action was not delivered and did not run: "+err.Error(), aip.MaxErrorMessageBytes))
}

// answer reads the connector's response.
func (l *Local) answer(reqCtx context.Context, call *hostsdk.Call, resp *http.Response, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	id := call.Action.ID
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case resp.StatusCode == http.StatusOK && ct == hostsdk.ContentTypeNDJSON:
		return l.readStream(reqCtx, call, resp.Body, chunks)
	case resp.StatusCode == http.StatusOK:
		raw, err := readLimited(resp.Body, l.cfg.MaxResultBytes)
		if errors.Is(err, errBodyTooLarge) {
			return nil, hostsdk.UnusableResult(call.Capability, fmt.Sprintf("the connector's result is larger than the %d bytes the sidecar takes", l.cfg.MaxResultBytes))
		}
		if err != nil {
			return nil, l.readError(reqCtx, call.Capability, err)
		}
		var r localResult
		if err := aip.DecodeStrict(raw, &r); err != nil {
			// A read's unusable answer changed nothing (failed
			// output_invalid); any other's outcome is unknown.
			stream := looksLikeStream(raw)
			if what, ok := invalidJSON(raw, err, "answer"); ok && !stream {
				return nil, malformedAnswer(call.Capability, "the connector answered 200 with a body that is not valid JSON: "+what)
			}
			problem := fmt.Sprintf("the connector answered 200 with a body that is not a result: %v", err)
			if stream {
				problem += fmt.Sprintf("; it holds stream lines, which are read only with Content-Type: %s (this answer's: %q)",
					hostsdk.ContentTypeNDJSON, resp.Header.Get("Content-Type"))
			}
			return nil, hostsdk.UnusableResult(call.Capability, problem)
		}
		return l.result(call.Capability, id, &r)
	}
	raw := readPrefix(resp.Body, maxSmallBody)
	var le localError
	_ = json.Unmarshal(raw, &le)
	text := errorText(raw)
	if le.Error != nil && le.Error.Validate() == nil {
		text = le.Error.Error()
	}
	if resp.StatusCode >= 400 && resp.StatusCode < 500 || resp.StatusCode == http.StatusServiceUnavailable {
		// Refused before it ran.
		if le.Error != nil && le.Error.Validate() == nil {
			return nil, le.Error
		}
		retryable := refusedForNow(resp.StatusCode)
		var after uint64
		if retryable {
			after = retryAfterMS(resp.Header.Get("Retry-After"))
		}
		return nil, aip.NewProtocolError(CodeConnectorRejected, aip.CategoryConnector, retryable, after,
			aip.TruncateUTF8(fmt.Sprintf("the local connector refused the action with HTTP %d: %s", resp.StatusCode, text), aip.MaxErrorMessageBytes))
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// A success status other than 200 (201 for a create, 202, 204):
		// the action may well have run, but the body is not read as a
		// result, which only a 200 carries.
		return nil, fmt.Errorf("%w: the local connector answered HTTP %d, not 200; answer a result (and a stream) with HTTP 200 — other statuses are not read as results: %s",
			hostsdk.ErrOutcomeUnknown, resp.StatusCode, text)
	}
	return nil, fmt.Errorf("%w: the local connector answered HTTP %d: %s", hostsdk.ErrOutcomeUnknown, resp.StatusCode, text)
}

// maxExcerpt bounds the bytes of a malformed answer invalidJSON quotes
// on each side of where it went wrong.
const maxExcerpt = 24

// invalidJSON describes raw, an answer (or a stream line: noun says
// which) aip.DecodeStrict refused with err, when that is because raw is
// not (I-)JSON at all — aip's reason, which names the byte offset in raw,
// and a short excerpt of raw from a little before it — rather than JSON that is not the message wanted; ok is false for
// any other refusal. Such an answer is the connector's fault (how it
// writes JSON), which the generic advice of hostsdk.UnusableResult ("ask
// for less ... else send it again") does not fit.
func invalidJSON(raw []byte, err error, noun string) (what string, ok bool) {
	if !errors.Is(err, aip.ErrInvalidJSON) {
		return "", false
	}
	reason := strings.TrimPrefix(err.Error(), aip.ErrInvalidJSON.Error()+": ")
	if len(bytes.TrimSpace(raw)) == 0 {
		return "it is empty", true
	}
	// aip's positional errors end "at offset N" (a duplicate member
	// name's has none: the excerpt is then the start).
	off := 0
	if _, n, found := strings.Cut(reason, " at offset "); found {
		if o, err := strconv.Atoi(n); err == nil && o >= 0 && o <= len(raw) {
			off = o
		}
	}
	from, to := max(off-maxExcerpt, 0), min(off+maxExcerpt, len(raw))
	excerpt := strings.ToValidUTF8(string(raw[from:to]), "\uFFFD")
	if from > 0 {
		excerpt = "…" + excerpt
	}
	if to < len(raw) {
		excerpt += "…"
	}
	return fmt.Sprintf("%s (the %s from byte %d: %q)", reason, noun, from, excerpt), true
}

// malformedAnswer is the error of an action whose answer (problem says
// how) is not valid JSON: for a read-only capability a failed
// connector_host.output_invalid that says the read changed nothing and
// the connector must be fixed, for any other an error wrapping
// hostsdk.ErrOutcomeUnknown (the effect may have happened), as
// hostsdk.UnusableResult decides, without its advice to ask for less or
// send it again: the same request would get the same broken answer.
func malformedAnswer(c *aip.Capability, problem string) error {
	if !hostsdk.ReadOnly(c) {
		return fmt.Errorf("%w: %s", hostsdk.ErrOutcomeUnknown, problem)
	}
	const advice = "; the read changed nothing; the connector must answer valid JSON (its operator must fix it: sending the read again would likely get the same answer)"
	return aip.NewProtocolError(hostsdk.CodeOutputInvalid, aip.CategoryConnector, false, 0,
		aip.TruncateUTF8(problem, max(aip.MaxErrorMessageBytes-len(advice), 0))+advice)
}

// looksLikeStream reports whether raw, a 200 answer that is not a result,
// starts with an NDJSON stream line ({"chunk":...} or {"result":...}): a
// stream sent with another Content-Type (application/json,
// application/jsonl, none), whose lines were read as one result.
func looksLikeStream(raw []byte) bool {
	first, _, _ := bytes.Cut(bytes.TrimLeft(raw, " \t\r\n"), []byte("\n"))
	var line localLine
	return json.Unmarshal(first, &line) == nil && (line.Chunk != nil || line.Result != nil)
}

// refusedForNow reports whether an HTTP refusal says "not now" rather than
// "not this": 408 Request Timeout, 425 Too Early, 429 Too Many Requests
// and 503 Service Unavailable. The same action sent again later may run.
func refusedForNow(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// maxRetryAfter bounds the Retry-After a refusal's retry_after_ms takes.
const maxRetryAfter = time.Hour

// retryAfterMS is a Retry-After header's delay in seconds as milliseconds
// (at most maxRetryAfter); 0 when it is absent or not a number of seconds.
func retryAfterMS(v string) uint64 {
	secs, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil {
		return 0
	}
	return min(secs, uint64(maxRetryAfter/time.Second)) * 1000
}

// readError classifies an error while reading the answer to capability
// c's action: the exchange was cut off (hostsdk.Interrupted).
func (l *Local) readError(reqCtx context.Context, c *aip.Capability, err error) error {
	if errors.Is(context.Cause(reqCtx), errCancelGrace) {
		return hostsdk.Interrupted(c, fmt.Sprintf("the action was cancelled and the connector did not finish its answer within %s", l.cfg.CancelGrace))
	}
	return hostsdk.Interrupted(c, fmt.Sprintf("reading the connector's answer: %v", err))
}

// result converts a decoded local result to capability c's action (nil
// from recovery, which decides a read's outcome itself): an invalid one is
// hostsdk.UnusableResult.
func (l *Local) result(c *aip.Capability, actionID string, r *localResult) (*aip.ActionResult, error) {
	if r.Status == localOutcomeUnknown {
		detail := r.Detail
		if detail == "" && r.Error != nil {
			detail = r.Error.Message
		}
		return nil, fmt.Errorf("%w: the connector reported: %s", hostsdk.ErrOutcomeUnknown, detail)
	}
	res, err := r.toResult(actionID)
	if err != nil {
		return nil, hostsdk.UnusableResult(c, fmt.Sprintf("the connector's result is invalid: %v", err))
	}
	return res, nil
}

// readStream reads NDJSON lines: chunks, then exactly one result line. A
// stream that ends without a result (the connector crashed) leaves the
// outcome unknown, but a read-only capability's action fails
// connector_host.interrupted, retryable (hostsdk.Interrupted). A stream
// that breaks the protocol (a line over the limit, one that is not a chunk
// or result, too many chunks or empty lines) leaves it unknown too, but
// for a read-only capability, which changed nothing: its action fails with
// connector_host.output_invalid (hostsdk.UnusableResult), as a read's
// result too large to answer does.
func (l *Local) readStream(reqCtx context.Context, call *hostsdk.Call, body io.Reader, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	limit := max(l.cfg.MaxResultBytes, int64(l.cfg.MaxChunkBytes))
	br := bufio.NewReaderSize(body, 64<<10)
	n, blank := 0, 0
	forward := chunks != nil
	broken := func(format string, args ...any) error {
		return hostsdk.UnusableResult(call.Capability, "the connector's stream is not usable: "+fmt.Sprintf(format, args...))
	}
	for {
		line, err := readLine(br, int(limit))
		if err != nil {
			switch {
			case errors.Is(err, io.EOF):
				return nil, hostsdk.Interrupted(call.Capability, "the connector's stream ended without a result line (did it crash?)")
			case errors.Is(err, errLineTooLong):
				return nil, broken("%v", err)
			}
			return nil, l.readError(reqCtx, call.Capability, err)
		}
		if len(bytes.TrimSpace(line)) == 0 {
			// Skipped, but bounded as chunks are: a connector sending
			// only newlines would otherwise hold the action until its
			// deadline.
			if blank++; blank > l.cfg.MaxChunks {
				return nil, broken("the connector sent more than %d empty lines in its stream", l.cfg.MaxChunks)
			}
			continue
		}
		var ln localLine
		if err := aip.DecodeStrict(line, &ln); err != nil || (ln.Chunk == nil) == (ln.Result == nil) {
			if what, ok := invalidJSON(line, err, "line"); ok {
				return nil, malformedAnswer(call.Capability, fmt.Sprintf("the connector's stream line %d is not valid JSON: %s", n+1, what))
			}
			if err == nil {
				err = errors.New(`want exactly one of "chunk" and "result"`)
			}
			return nil, broken("stream line %d is not a chunk or result: %v", n+1, err)
		}
		if ln.Result != nil {
			return l.result(call.Capability, call.Action.ID, ln.Result)
		}
		if len(line) > l.cfg.MaxChunkBytes {
			return nil, broken("a chunk of %d bytes exceeds the %d-byte limit", len(line), l.cfg.MaxChunkBytes)
		}
		n++
		if n > l.cfg.MaxChunks {
			return nil, broken("the connector sent more than %d chunks", l.cfg.MaxChunks)
		}
		if !forward {
			continue
		}
		c := ln.Chunk
		if c.Part != nil {
			err = chunks.SendPart(c.Kind, *c.Part)
		} else if len(c.Data) > 0 {
			err = chunks.Send(c.Kind, c.Data)
		} else {
			err = chunks.Send(c.Kind, nil)
		}
		if err != nil {
			// The dispatcher went away or the chunk is invalid: keep
			// reading so the final result is still journaled.
			call.Logger.Warn("stream chunk not delivered; later chunks are dropped", "error", err)
			forward = false
		}
	}
}

// errLineTooLong is readLine's error for a line over its limit.
var errLineTooLong = errors.New("a stream line is too long")

// readLine reads one line of at most limit bytes (without the newline).
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var buf []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(buf)+len(frag) > limit+1 {
			return nil, fmt.Errorf("%w: more than %d bytes", errLineTooLong, limit)
		}
		buf = append(buf, frag...)
		switch {
		case err == nil:
			return bytes.TrimRight(buf, "\r\n"), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(buf) > 0:
			return buf, nil
		default:
			return nil, err
		}
	}
}

// Reconcile implements hostsdk.Reconciler: POST /aip/reconcile asks the
// connector what became of an action a crash left running. A connector
// without the endpoint (404, 405, 501) leaves the outcome unknown.
func (l *Local) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	a := u.Action
	body := localReconcile{
		ActionID: a.ActionID, IdempotencyKey: a.IdempotencyKey, CapabilityID: a.CapabilityID,
		InputDigest: a.InputDigest, ReceivedAt: aip.At(a.ReceivedAt),
	}
	if !a.StartedAt.IsZero() {
		t := aip.At(a.StartedAt)
		body.StartedAt = &t
	}
	deadline := time.Now().Add(l.cfg.ReconcileWait)
	for {
		res, running, err := l.reconcileOnce(ctx, &body)
		if err != nil || !running {
			return res, err
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: the connector still runs the action after %s", hostsdk.ErrOutcomeUnknown, l.cfg.ReconcileWait)
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (l *Local) reconcileOnce(ctx context.Context, body *localReconcile) (res *aip.ActionResult, running bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	req, err := l.newRequest(rctx, http.MethodPost, PathLocalReconcile, body)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set(HeaderActionID, body.ActionID)
	req.Header.Set(HeaderIdempotencyKey, body.IdempotencyKey)
	resp, err := l.client.Do(req)
	if err != nil {
		return nil, false, &LocalError{Op: "POST " + PathLocalReconcile, Target: l.Target(), Err: err}
	}
	defer resp.Body.Close()
	raw, err := readLimited(resp.Body, l.cfg.MaxResultBytes)
	if err != nil {
		return nil, false, &LocalError{Op: "POST " + PathLocalReconcile, Target: l.Target(), Err: err}
	}
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed, http.StatusNotImplemented:
		return nil, false, fmt.Errorf("%w: the connector does not implement %s (HTTP %d)", hostsdk.ErrOutcomeUnknown, PathLocalReconcile, resp.StatusCode)
	default:
		return nil, false, &LocalError{Op: "POST " + PathLocalReconcile, Target: l.Target(), Status: resp.StatusCode, Err: errors.New(errorText(raw))}
	}
	var r localResult
	if err := aip.DecodeStrict(raw, &r); err != nil {
		// The same answer would come after every restart: retrying would
		// keep the replica from registering for ever. Never re-run, never
		// claim a result.
		l.log.Warn("the connector's 200 answer to "+PathLocalReconcile+" is not a reconcile answer; the action is outcome_unknown",
			"action_id", body.ActionID, "error", err)
		return nil, false, fmt.Errorf("%w: the connector answered %s with HTTP 200 and a body that is not a reconcile answer: %v", hostsdk.ErrOutcomeUnknown, PathLocalReconcile, err)
	}
	switch r.Status {
	case localRunning, localNotFound:
		// These answers carry only status and detail (and, optionally,
		// this action's ID): "no record" of another action, or a body
		// with a result's members, says nothing about this one, and
		// not_found would invite a second run.
		if r.ActionID != "" && r.ActionID != body.ActionID {
			return nil, false, fmt.Errorf("%w: the connector answered %s for action %s, not %s", hostsdk.ErrOutcomeUnknown, r.Status, r.ActionID, body.ActionID)
		}
		if r.Output != nil || r.Message != nil || r.Usage != nil || r.Error != nil {
			return nil, false, fmt.Errorf("%w: the connector's %s answer carries a result's members (output, message, usage or error)", hostsdk.ErrOutcomeUnknown, r.Status)
		}
	}
	switch r.Status {
	case localRunning:
		return nil, true, nil
	case localNotFound:
		detail := r.Detail
		if detail == "" {
			detail = "the connector has no record of the action; it never ran"
		}
		return &aip.ActionResult{ActionID: body.ActionID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(CodeNotExecuted, aip.CategoryConnector, false, 0, aip.TruncateUTF8(detail, aip.MaxErrorMessageBytes))}, false, nil
	}
	res, err = l.result(nil, body.ActionID, &r) // recovery decides for a read
	return res, false, err
}

// Routes implements hostsdk.RouteProvider: GET /sidecar/status, and POST
// /sidecar/events when an events token is configured.
func (l *Local) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	routes := []hostsdk.Route{{Pattern: "GET " + PathStatus, Handler: l.status.handler()}}
	if l.events != nil {
		routes = append(routes, hostsdk.Route{Pattern: "POST " + PathEvents,
			Handler: eventsHandler(l.events.token, rc.Events.Publish, l.events.m, l.log)})
	}
	return routes, nil
}

// errBodyTooLarge is readLimited's error for a body over its limit.
var errBodyTooLarge = errors.New("the body is too large")

// readLimited reads at most limit bytes and fails beyond.
func readLimited(r io.Reader, limit int64) ([]byte, error) {
	raw, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, limit)
	}
	return raw, nil
}

// readPrefix reads at most limit bytes (what arrived before an error): a
// body that is only quoted in a message.
func readPrefix(r io.Reader, limit int64) []byte {
	raw, _ := io.ReadAll(io.LimitReader(r, limit))
	return raw
}

// errorText renders an error body for a message: the error object's
// message when there is one, else the start of the body.
func errorText(raw []byte) string {
	var le localError
	if json.Unmarshal(raw, &le) == nil && le.Error != nil && le.Error.Message != "" {
		return le.Error.Code + ": " + le.Error.Message
	}
	s := strings.TrimSpace(string(raw))
	if s == "" {
		return "(empty body)"
	}
	return aip.TruncateUTF8(s, 256)
}

var (
	_ hostsdk.Connector     = (*Local)(nil)
	_ hostsdk.HealthChecker = (*Local)(nil)
	_ hostsdk.Canceler      = (*Local)(nil)
	_ hostsdk.Streamer      = (*Local)(nil)
	_ hostsdk.Reconciler    = (*Local)(nil)
	_ hostsdk.RouteProvider = (*Local)(nil)
)
