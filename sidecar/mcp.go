package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/netutil"
)

// Defaults of MCPConfig.
const (
	DefaultConnectTimeout = 30 * time.Second
	// progressBuffer bounds the progress notifications queued for one
	// streaming action; beyond it the oldest-pending ones are dropped
	// (progress is a gauge: the next notification supersedes them).
	progressBuffer = 256
	// progressSettle bounds the wait, after a tool call that reported
	// progress returned, for its last progress notifications (those not
	// yet at their total).
	progressSettle = 250 * time.Millisecond
	// progressQuiet is that wait when the call reported no progress yet.
	progressQuiet = 20 * time.Millisecond
)

// MCP metadata keys the sidecar puts in a tools/call's _meta.
const (
	MetaActionID       = "io.aipfleet/action_id"
	MetaIdempotencyKey = "io.aipfleet/idempotency_key"
)

// MCPConfig configures an MCP connector. Exactly one of Command, URL and
// Transport is required.
type MCPConfig struct {
	// Command runs a stdio MCP server: the program and its arguments. The
	// sidecar starts it (in its own process group; on Linux it is killed
	// if the sidecar dies), restarts it with backoff when it
	// crashes, and stops it after the host's drain and offline. Whenever
	// it exits, what remains of its process group is stopped (SIGTERM,
	// SIGKILL after StopTimeout; Linux) before it is started again or
	// counts as stopped.
	Command []string
	// Dir is the command's working directory; Env is added to the
	// inherited environment; Stderr receives its standard error (nil
	// discards it).
	Dir    string
	Env    []string
	Stderr io.Writer
	// childOf is the replica ID the server is marked with (EnvChildOf),
	// set by the sidecar.
	childOf string
	// URL is a Streamable HTTP MCP endpoint: https, or http on a loopback
	// address.
	URL string
	// HTTPClient is used for URL. Defaults to a client without redirects.
	HTTPClient *http.Client
	// Transport, when set, returns a fresh transport for each connection
	// (tests and programs that embed an MCP server).
	Transport func() mcp.Transport

	// CapabilityPrefix is prepended to tool names to form capability IDs.
	// Defaults to "mcp.".
	CapabilityPrefix string
	// Tools, when set, lists the only tools exposed as capabilities. At
	// discovery (Manifest) each must be a tool the server lists that can
	// become a capability, or discovery fails with a *ConfigError naming
	// the others and the tools the server offers (checkAllowList).
	Tools []string
	// AgentID is the manifest agent's principal ID. Defaults to
	// "agent:mcp:" followed by the server's name.
	AgentID string

	// ConnectTimeout bounds connecting and initializing (and the first
	// tools/list), and each later tools/list. Defaults to 30s.
	ConnectTimeout time.Duration
	// StopTimeout is how long a stdio server (and its process group) has
	// to exit after SIGTERM (and its input closed) before SIGKILL to the
	// group. At the sidecar's shutdown (Close) it bounds the whole stop:
	// the server's input is closed first and it has half of StopTimeout
	// to exit on its own (MCP's stdio shutdown), then SIGTERM, then
	// SIGKILL at StopTimeout; a server, or a process of its group, that
	// has not exited 5s after SIGKILL (uninterruptible sleep) is given up
	// on (terminateServer, child.stopGroupRest).
	// Defaults to 10s.
	StopTimeout time.Duration
	// MaxActionDuration bounds a tool call without timeout_ms (or with
	// 0). Defaults to 1h.
	MaxActionDuration time.Duration
	// RestartBackoff and MaxBackoff shape the reconnect (and restart)
	// backoff after the session breaks. Default to 250ms and 30s.
	RestartBackoff time.Duration
	MaxBackoff     time.Duration
	// StableAfter: a session that lasted this long before it broke is
	// re-established after RestartBackoff again; shorter ones continue
	// the backoff. Defaults to 1m.
	StableAfter time.Duration
	// RestartUnresponsiveAfter: after this many health checks in a row
	// (one per heartbeat) whose MCP ping got no answer at all — it timed
	// out or failed (an HTTP failure without the server's JSON-RPC
	// answer, a proxy's 502 say, included); an MCP error answer of the
	// server is an answer — the session is
	// taken as hung and taken down, and the session is re-established
	// with the reconnect backoff as after a crash. A stdio server, which
	// the sidecar owns, is stopped (SIGTERM to its process group, SIGKILL
	// after StopTimeout) and started again; its calls in flight end as
	// when it crashes. A server the sidecar did not start (URL, Transport)
	// cannot be restarted: its session is closed and a new one opened
	// (calls in flight on the old session keep waiting for their answers,
	// bounded by their deadlines; the new session serves new calls). A
	// ping left unanswered while a tool call on the session is in
	// progress and within its deadline does not count (nor does it end
	// the row), as for an --exec child busy with an action: a server that
	// handles one message at a time cannot answer it meanwhile. 0, the
	// default, never takes a session down for unanswered pings.
	RestartUnresponsiveAfter int
	// OnManifestChange says what a tools/list change after registration
	// does. Defaults to ManifestChangeReport.
	OnManifestChange ManifestChangePolicy
	Logger           *slog.Logger

	// killWait bounds the wait for a stdio server to exit after SIGKILL
	// (defaultKillWait when 0), as superviseConfig.KillWait does for an
	// --exec child.
	killWait time.Duration
	// awaitExit, when set, is what the reaper waits for a stdio server's
	// exit with instead of awaitExitUnreaped (tests: a server that cannot
	// be reaped in time).
	awaitExit func(pid int) error
}

// MCP is a hostsdk connector that wraps an MCP server: its tools are the
// capabilities (see toolCapability for the mapping), actions become
// tools/call, progress notifications become stream chunks, a cancel
// becomes an MCP cancel, and health is an MCP ping. It implements
// hostsdk.Connector, HealthChecker, Streamer, Reconciler and RouteProvider.
// Create it with NewMCP, Connect it before starting the host, and Close
// it after the host stopped.
type MCP struct {
	cfg    MCPConfig
	log    *slog.Logger
	client *mcp.Client
	drift  *drift
	status *statusSource
	// query is "?" + the URL's query ("" without one): errors never
	// show it (redact).
	query string

	mu       sync.Mutex
	sess     *mcp.ClientSession
	sessDone chan struct{} // closed when sess ends
	srv      *child        // the stdio server of sess
	init     *mcp.InitializeResult
	starts   int
	restarts int
	lastErr  string
	since    time.Time
	tools    map[string]toolInfo // admitted: capability ID -> tool
	stopped  bool
	// unanswered counts the pings in a row on sess that got no answer
	// (see MCPConfig.RestartUnresponsiveAfter).
	unanswered int
	// working counts the tool calls on sess in progress and within their
	// deadline (trackWork); while there are any, unanswered pings do not
	// count (noteUnanswered). Each session has its own.
	working *atomic.Int64
	// downSess and downWhy ask the loop to take sess down (requestDown).
	downSess *mcp.ClientSession
	downWhy  string
	// pinging is the health check's ping in flight, if any (MCP.ping).
	pinging *pingRun
	// crashed is the stdio server whose session ended on its own (it
	// exited, or closed its output) and that no new server has replaced
	// yet; Close reports it as an unclean stop (crashedResult).
	crashed *child

	progress sync.Map // progress token (string) -> chan *mcp.ProgressNotificationParams

	// ctx is the connector's own lifecycle context, cancelled by Close.
	ctx      context.Context
	cancel   context.CancelFunc
	closing  sync.WaitGroup // broken sessions being closed
	loopDone chan struct{}
	// reconnect wakes the loop to read downSess.
	reconnect chan struct{}
	changed   chan struct{}
}

// NewMCP validates cfg and returns an MCP connector. It does no I/O.
func NewMCP(cfg MCPConfig) (*MCP, error) {
	n := 0
	for _, set := range []bool{len(cfg.Command) > 0, cfg.URL != "", cfg.Transport != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return nil, cfgErr("MCP.Command", "and --mcp-url (AIP_SIDECAR_MCP_URL): give exactly one MCP server")
	}
	if len(cfg.Command) > 0 && cfg.Command[0] == "" {
		return nil, cfgErr("MCP.Command", "has an empty program name")
	}
	var query string // "?" + the URL's query, which errors must not show
	if cfg.URL != "" {
		u, err := url.Parse(cfg.URL)
		if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
			return nil, cfgErr("MCP.URL", fmt.Sprintf("is %q; want the absolute URL of a Streamable HTTP MCP endpoint", redactURL(cfg.URL)))
		}
		if u.Scheme == "http" && !netutil.IsLoopbackHost(u.Hostname()) {
			return nil, cfgErr("MCP.URL", fmt.Sprintf("is %q; http is accepted only on a loopback address; use https", redactURL(cfg.URL)))
		}
		if u.User != nil {
			return nil, cfgErr("MCP.URL", "must not carry credentials")
		}
		if u.RawQuery != "" {
			query = "?" + u.RawQuery
		}
	}
	if cfg.CapabilityPrefix == "" {
		cfg.CapabilityPrefix = DefaultCapabilityPrefix
	}
	for _, d := range []struct {
		field string
		p     *time.Duration
		def   time.Duration
	}{
		{"MCP.ConnectTimeout", &cfg.ConnectTimeout, DefaultConnectTimeout}, {"MCP.StopTimeout", &cfg.StopTimeout, DefaultStopTimeout},
		{"MCP.MaxActionDuration", &cfg.MaxActionDuration, DefaultMaxActionDuration},
		{"MCP.RestartBackoff", &cfg.RestartBackoff, DefaultRestartBackoff}, {"MCP.MaxBackoff", &cfg.MaxBackoff, DefaultMaxBackoff},
		{"MCP.StableAfter", &cfg.StableAfter, DefaultStableAfter},
	} {
		if *d.p < 0 {
			return nil, cfgErr(d.field, fmt.Sprintf("is %s; it must not be negative", *d.p))
		}
		if *d.p == 0 {
			*d.p = d.def
		}
	}
	if cfg.RestartUnresponsiveAfter < 0 {
		return nil, cfgErr("MCP.RestartUnresponsiveAfter", fmt.Sprintf("is %d; it must not be negative (0 never takes a session down for unanswered pings)", cfg.RestartUnresponsiveAfter))
	}
	if err := cfg.OnManifestChange.validate("MCP.OnManifestChange"); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	m := &MCP{
		cfg: cfg, log: cfg.Logger, query: query,
		reconnect: make(chan struct{}, 1), changed: make(chan struct{}, 1),
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.drift = newDrift(cfg.OnManifestChange, cfg.Logger)
	m.status = &statusSource{mode: "mcp", target: m.Target(), drift: m.drift}
	m.status.setProcess(m)
	m.client = mcp.NewClient(&mcp.Implementation{Name: "aip-sidecar", Title: "aipfleet sidecar", Version: "1.0"}, &mcp.ClientOptions{
		Logger: cfg.Logger,
		// The bridge answers input_required results itself (callTool).
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
		// A server's elicitation/create (protocol 2025-11-25 and older)
		// is answered cancel: no user is present to accept or decline.
		// Setting it advertises the elicitation capability (form mode),
		// so that a server asks, learns the answer, and says what its
		// tool did, rather than failing the call on its own.
		ElicitationHandler: func(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			msg := ""
			if req != nil && req.Params != nil {
				msg = req.Params.Message
			}
			m.log.Warn("the MCP server asked for user input (elicitation); the bridge has no user and answered cancel",
				"message", aip.TruncateUTF8(msg, 200))
			return &mcp.ElicitResult{Action: "cancel"}, nil
		},
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case m.changed <- struct{}{}:
			default:
			}
		},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			if req == nil || req.Params == nil {
				return
			}
			tok, ok := req.Params.ProgressToken.(string)
			if !ok {
				return
			}
			if v, ok := m.progress.Load(tok); ok {
				ch := v.(chan *mcp.ProgressNotificationParams)
				for {
					select {
					case ch <- req.Params:
						return
					default:
					}
					// The receiver is slow: drop the oldest pending one;
					// this later one supersedes it.
					select {
					case <-ch:
					default:
					}
				}
			}
		},
	})
	// sampling/createMessage (protocol 2025-11-25 and older; not
	// advertised, but some servers send it anyway) is refused with a
	// JSON-RPC error that says why.
	m.client.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "sampling/createMessage" {
				m.log.Warn("the MCP server asked for sampling; the bridge has no model and refused it")
				return nil, &jsonrpc.Error{Code: codeNoSampling, Message: msgNoSampling}
			}
			return next(ctx, method, req)
		}
	})
	return m, nil
}

// The bridge's answer to sampling/createMessage: the code of MCP's
// example of a client refusing sampling (its user rejected it), not
// "method not found", which a server that passes its client's error on
// puts in its answer to the tools/call, where it reads as the server
// refusing the call.
const (
	codeNoSampling = -1
	msgNoSampling  = "sampling/createMessage is not available: the AIP bridge (aip-sidecar) calling this tool has no model and no user"
)

// Target names the MCP server (for logs, errors and GET /sidecar/status,
// which any client of the replica's listener can read): a stdio server by
// its program alone, since its arguments may carry credentials, and a URL
// without its user information and query.
func (m *MCP) Target() string {
	switch {
	case len(m.cfg.Command) > 0:
		t := "mcp+stdio:" + m.cfg.Command[0]
		if n := len(m.cfg.Command) - 1; n > 0 {
			t += fmt.Sprintf(" (%d arguments not shown)", n)
		}
		return t
	case m.cfg.URL != "":
		return redactURL(m.cfg.URL)
	}
	return "mcp+transport"
}

// redact returns err with the MCP URL's query (which may carry the
// server's credentials) left out of its message: net/http quotes the
// request URL in transport errors, and these messages reach action
// results, GET /ready, GET /sidecar/status and the logs. errors.Is and
// errors.As still see err.
func (m *MCP) redact(err error) error {
	if err == nil || m.query == "" {
		return err
	}
	msg := err.Error()
	clean := strings.ReplaceAll(msg, m.query, "?(query not shown)")
	if quoted := strconv.Quote(m.query); len(quoted) > 2 {
		clean = strings.ReplaceAll(clean, quoted[1:len(quoted)-1], "?(query not shown)")
	}
	if clean == msg {
		return err
	}
	return &redactedError{msg: clean, err: err}
}

// redactedError is an error with a redacted message.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactURL returns raw without the user information, query and fragment
// that may carry credentials (marked as left out), or a placeholder when
// it does not parse.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(an unparsable URL)"
	}
	out := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}
	s := out.String()
	if u.User != nil {
		s = strings.Replace(s, "://", "://(user info not shown)@", 1)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		s += "?(query not shown)"
	}
	return s
}

// transport returns a fresh transport of a URL or Transport server.
func (m *MCP) transport() mcp.Transport {
	if m.cfg.Transport != nil {
		return m.cfg.Transport()
	}
	hc := m.cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	c := *hc
	c.Transport = closingCodeTransport{sessionGoneTransport{base: hc.Transport}}
	return &mcp.StreamableClientTransport{Endpoint: m.cfg.URL, HTTPClient: &c}
}

// sessionGoneTransport drops the body of a 404 answer to a request that
// carries an Mcp-Session-Id. Per the Streamable HTTP transport, that 404
// means the server no longer knows the session (it restarted, or ended
// the session), and servers may send it with a JSON-RPC error body. The
// Go SDK reports a 404 as ErrSessionMissing only when the body is not a
// JSON-RPC error response; with one naming the request's ID (as a small
// server that echoes every request's ID sends) it reports the JSON-RPC
// error, which the sidecar took as an answer: the session was never
// re-established and the replica stayed unhealthy until the sidecar
// restarted.
type sessionGoneTransport struct{ base http.RoundTripper }

func (t sessionGoneTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	resp, err := base.RoundTrip(r)
	if err == nil && resp.StatusCode == http.StatusNotFound && r.Header.Get("Mcp-Session-Id") != "" {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		resp.Body, resp.ContentLength = http.NoBody, 0
		resp.Header.Del("Content-Type")
		resp.Header.Del("Content-Length")
	}
	return resp, err
}

// startServer starts the stdio MCP server and returns it with a transport
// over its standard input and output.
//
// The sidecar starts and reaps the server itself, as it does an --exec
// child (child.reap), rather than through the SDK's CommandTransport:
// that transport reaps the server in its Close, which the SDK calls on its
// own when the connection ends, so by the time the sidecar looked for what
// is left of the server's process group the server's pid — the group's ID —
// could be reused. The group's ID stays taken while any member lives, but
// finding a member and signalling the group are two steps, and the last
// member can exit in between. Kept unreaped until its group is gone, the
// server holds its pid, and the group is stopped whenever the server
// exits: it crashed, exited on SIGTERM at once, or was stopped.
//
// The server's output is a pipe of the sidecar's own, not
// exec.Cmd.StdoutPipe, which Wait closes at once: what the server wrote
// before it exited (its last answers) is still read. The read end is
// closed StopTimeout after the server was reaped, for a process that left
// its group (setsid) and holds the output open; closing the transport
// closes only the server's input (MCP's stdio shutdown), as
// CommandTransport does.
func (m *MCP) startServer() (*child, mcp.Transport, error) {
	cmd := exec.Command(m.cfg.Command[0], m.cfg.Command[1:]...)
	cmd.Dir = m.cfg.Dir
	cmd.Env = childEnv(withChildOf(m.cfg.Env, m.cfg.childOf))
	cmd.Stderr = m.cfg.Stderr
	// A Stderr that is not a file is fed through a pipe, which a process
	// that left the server's group can hold open: bounded as for --exec.
	cmd.WaitDelay = m.cfg.StopTimeout
	cmd.SysProcAttr = childProcAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	out, w, err := os.Pipe()
	if err != nil {
		stdin.Close()
		return nil, nil, err
	}
	cmd.Stdout = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		out.Close()
		return nil, nil, err
	}
	c := newChild(cmd)
	c.input, c.output, c.awaitExit = stdin, out, m.cfg.awaitExit
	go func() {
		c.reap("the MCP server", m.cfg.StopTimeout, killWaitOr(m.cfg.killWait), m.log)
		time.AfterFunc(m.cfg.StopTimeout, func() { out.Close() })
	}()
	// frameGuard takes a line longer than maxMCPLine out (failing only
	// the call it answers); the SDK's own limit, above it, only catches a
	// message spread over several lines, which MCP's stdio transport
	// forbids.
	return c, writeWatch{&mcp.IOTransport{
		Reader: io.NopCloser(newFrameGuard(out, maxMCPLine, m.log)), Writer: stdin,
		MaxLineLength: maxMCPLine + 1<<20,
	}}, nil
}

// writeWatch wraps a stdio server's transport so that a tools/call knows
// whether any of its messages was handed to the connection to be written
// (see MCP.call), and so that the server's own JSON-RPC error answers
// reach their calls as answers (watchedConn.Read). Every message the SDK
// writes for a call goes through the connection's Write with the call's
// context (or one derived from it: its notifications/cancelled, a
// multi-round-trip retry), which carries the call's *atomic.Bool under
// wroteKey. Write marks it before it writes anything, so an unmarked call
// provably sent the server nothing: the SDK refused it before writing
// because the connection was already broken or closing.
type writeWatch struct{ mcp.Transport }

func (t writeWatch) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return watchedConn{c}, nil
}

type watchedConn struct{ mcp.Connection }

// Read hands the SDK a server's JSON-RPC error answer whose code the SDK
// takes for the connection's end — -32003 and -32004, the codes of its
// own "client is closing" and "server is closing", in the range JSON-RPC
// leaves to implementations (-32000..-32099), where a server is free to
// use them for errors of its own — as a serverAnswer, which the SDK does
// not match with its closing errors. Reported as mcp.ErrConnectionClosed,
// such an answer to one tools/call (or ping) made the bridge take the
// whole session down — the server restarted, every call on it cut off —
// and the call itself lost the server's code. A closing go-sdk server's
// "server is closing" answer is its answer too: the session's end, if it
// ends, is seen as such (the loop watches it). A Streamable HTTP server's
// answers are kept from the SDK's closing errors by closingCodeTransport.
func (c watchedConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if r, ok := msg.(*jsonrpc.Response); ok {
		if we, ok := r.Error.(*jsonrpc.Error); ok && (we.Code == codeSDKClientClosing || we.Code == codeSDKServerClosing) {
			r.Error = &serverAnswer{we}
		}
	}
	return msg, err
}

// The codes of the go-sdk's (internal) jsonrpc2 ErrClientClosing and
// ErrServerClosing, which its client reports as mcp.ErrConnectionClosed
// whatever their origin.
const (
	codeSDKClientClosing = -32003
	codeSDKServerClosing = -32004
)

// serverAnswer is a JSON-RPC error answer of the server that the SDK must
// not match with its own errors (watchedConn.Read): it neither unwraps to
// the *jsonrpc.Error nor has an Is method, but errors.As finds the
// *jsonrpc.Error (serverError), so the call is settled as the server's
// answer.
type serverAnswer struct{ err *jsonrpc.Error }

func (e *serverAnswer) Error() string { return e.err.Error() }

func (e *serverAnswer) As(target any) bool {
	if p, ok := target.(**jsonrpc.Error); ok {
		*p = e.err
		return true
	}
	return false
}

func (c watchedConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if w, ok := ctx.Value(wroteKey{}).(*atomic.Bool); ok {
		w.Store(true)
	}
	return c.Connection.Write(ctx, msg)
}

// wroteKey is the context key of a tools/call's "a message was handed to
// the connection" mark (writeWatch).
type wroteKey struct{}

// dial connects once (starting a stdio server) and lists the tools.
func (m *MCP) dial(ctx context.Context) (*mcp.ClientSession, *child, []*mcp.Tool, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout)
	defer cancel()
	var (
		t   mcp.Transport
		srv *child
	)
	if len(m.cfg.Command) > 0 {
		var err error
		if srv, t, err = m.startServer(); err != nil {
			return nil, nil, nil, fmt.Errorf("sidecar: start the MCP server %s: %w", m.Target(), err)
		}
	} else {
		t = m.transport()
	}
	sess, err := m.client.Connect(ctx, t, nil)
	if err != nil {
		var exited string
		if srv != nil {
			m.stopServer(srv, nil)
			// A server that died on its own (a missing script, a crash at
			// start) ends the handshake with a bare EOF: say how it ended.
			// SIGTERM and SIGKILL are the stop's own.
			if st := exitOf(srv); st != "signal: terminated" && st != "signal: killed" && st != errNotExited {
				exited = " (the MCP server process exited: " + st + "; its standard error, above, says why)"
			}
		}
		return nil, nil, nil, fmt.Errorf("sidecar: connect to the MCP server %s: %w%s", m.Target(), m.redact(err), exited)
	}
	tools, err := listTools(ctx, sess)
	if err != nil {
		m.closeSession(sess, srv)
		return nil, nil, nil, fmt.Errorf("sidecar: tools/list on %s: %w", m.Target(), m.redact(err))
	}
	return sess, srv, tools, nil
}

func listTools(ctx context.Context, sess *mcp.ClientSession) ([]*mcp.Tool, error) {
	var tools []*mcp.Tool
	for t, err := range sess.Tools(ctx, nil) {
		if err != nil {
			return nil, err
		}
		tools = append(tools, t)
	}
	return tools, nil
}

// Connect connects to the MCP server (starting a stdio server), lists its
// tools and starts the loop that reconnects after the session breaks and
// reports tools/list changes. Call it once, before starting the host.
func (m *MCP) Connect(parent context.Context) error {
	// The server may still be starting (a URL server in another
	// container): retry with backoff for at most ConnectTimeout.
	ctx, cancel := context.WithTimeout(parent, m.cfg.ConnectTimeout)
	defer cancel()
	bo := newBackoff(m.cfg.RestartBackoff, m.cfg.MaxBackoff)
	var (
		sess *mcp.ClientSession
		srv  *child
		err  error
	)
	for {
		var derr error
		if sess, srv, _, derr = m.dial(ctx); derr == nil {
			break
		}
		// An attempt the deadline cut off ("context deadline exceeded")
		// says less than the one before it, which is kept.
		if err == nil || ctx.Err() == nil {
			err = derr
		}
		m.log.Warn("the MCP server is not reachable yet", "error", derr)
		t := time.NewTimer(bo.NextBackOff())
		select {
		case <-ctx.Done():
			t.Stop()
			if perr := parent.Err(); perr != nil {
				return fmt.Errorf("sidecar: connecting to the MCP server %s was interrupted: %w (last: %s)", m.Target(), perr, detail(err))
			}
			return fmt.Errorf("%w within %s (--%s): last attempt to connect to the MCP server: %s", ErrStartTimeout, m.cfg.ConnectTimeout, settingOf["MCP.ConnectTimeout"], detail(err))
		case <-t.C:
		}
	}
	m.setSession(sess, srv)
	m.loopDone = make(chan struct{})
	go m.loop()
	return nil
}

func (m *MCP) setSession(sess *mcp.ClientSession, srv *child) {
	done := make(chan struct{})
	go func() {
		sess.Wait()
		close(done)
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sess, m.sessDone, m.srv, m.init = sess, done, srv, sess.InitializeResult()
	m.unanswered, m.downSess, m.downWhy = 0, nil, ""
	m.crashed = nil
	m.working = new(atomic.Int64)
	m.starts++
	m.since = time.Now()
	attrs := []any{"target", m.Target(), "connection", m.starts}
	if srv != nil {
		attrs = append(attrs, "pid", srv.cmd.Process.Pid)
	}
	m.log.Info("connected to the MCP server", attrs...)
}

func (m *MCP) session() (*mcp.ClientSession, chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sess, m.sessDone
}

// loop watches the session: when it ends (the server exited), or a health
// check or tools/call found it broken or hung (requestDown), it takes it
// down and reconnects with backoff; when the server says its tool list
// changed, the new list is compared with the admitted one.
func (m *MCP) loop() {
	defer close(m.loopDone)
	bo := newBackoff(m.cfg.RestartBackoff, m.cfg.MaxBackoff)
	for {
		m.mu.Lock()
		sess, done, up := m.sess, m.sessDone, m.since
		m.mu.Unlock()
		var old *child
		select {
		case <-m.ctx.Done():
			return
		case <-m.changed:
			m.checkTools(sess)
			continue
		case <-done:
			old = m.down(sess, "the MCP session ended (did the server exit?)")
			if old != nil {
				m.mu.Lock()
				m.crashed = old
				m.mu.Unlock()
			}
		case <-m.reconnect:
			m.mu.Lock()
			req, why := m.downSess, m.downWhy
			m.downSess, m.downWhy = nil, ""
			m.mu.Unlock()
			if req == nil || req != sess {
				continue // a request about a session already replaced
			}
			old = m.down(sess, why)
		}
		// As an --exec child is restarted only once its process group is
		// gone, a stdio server is: a process left from the old one would
		// hold what the new one needs (a port, a lock, its files).
		if old != nil {
			select {
			case <-old.exited:
			case <-m.ctx.Done():
				return
			}
		}
		// As for a crashed --exec child: only a session that lasted
		// starts the backoff again, so a server that keeps crashing soon
		// after connecting is not restarted at the initial rate forever.
		if time.Since(up) >= m.cfg.StableAfter {
			bo.Reset()
		}
		for {
			wait := bo.NextBackOff()
			m.log.Warn("reconnecting to the MCP server", "after_ms", wait.Milliseconds())
			t := time.NewTimer(wait)
			select {
			case <-m.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			next, srv, tools, err := m.dial(m.ctx)
			if err != nil {
				m.mu.Lock()
				m.lastErr = err.Error()
				m.mu.Unlock()
				// The next turn draws the delay and logs it: drawing one
				// here too would move the backoff two steps per attempt.
				m.log.Error("reconnect to the MCP server", "error", err)
				continue
			}
			m.mu.Lock()
			stopped := m.stopped
			m.mu.Unlock()
			if stopped {
				m.closeSession(next, srv)
				return
			}
			m.setSession(next, srv)
			m.observe(tools, next.InitializeResult())
			break
		}
	}
}

// requestDown asks the loop to take sess down (when it is still the
// current session) and says why; it does not block.
func (m *MCP) requestDown(sess *mcp.ClientSession, why string) {
	m.mu.Lock()
	if sess == nil || m.sess != sess || m.downSess != nil {
		m.mu.Unlock()
		return // replaced already, or a request is pending
	}
	m.downSess, m.downWhy = sess, why
	m.mu.Unlock()
	select {
	case m.reconnect <- struct{}{}:
	default: // the loop is woken already and reads downSess
	}
}

// down closes a broken session and records why. It returns the session's
// stdio server (nil for another transport), which is being stopped.
func (m *MCP) down(sess *mcp.ClientSession, why string) *child {
	m.mu.Lock()
	var srv *child
	if m.sess == sess {
		srv = m.srv
		m.sess, m.sessDone, m.srv = nil, nil, nil
		m.restarts++
		m.lastErr = why
		m.since = time.Now()
	}
	m.mu.Unlock()
	m.log.Error(why+"; the replica reports unhealthy until the session is back", "target", m.Target())
	if sess != nil {
		// A stdio server is stopped (see closeSession); Close waits for it.
		m.closing.Go(func() { m.closeSession(sess, srv) })
	}
	return srv
}

// checkTools lists the tools after a tools/list_changed notification.
func (m *MCP) checkTools(sess *mcp.ClientSession) {
	if sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, m.cfg.ConnectTimeout)
	defer cancel()
	tools, err := listTools(ctx, sess)
	if err != nil {
		err = m.redact(err)
		m.log.Warn("tools/list after a list_changed notification", "error", err)
		m.downIfGone(sess, "tools/list", err)
		return
	}
	m.observe(tools, sess.InitializeResult())
}

// observe compares a tool list with the admitted manifest.
func (m *MCP) observe(tools []*mcp.Tool, init *mcp.InitializeResult) {
	man, _, skipped := toolManifest(agentFor(m.cfg.AgentID, init), m.cfg.CapabilityPrefix, m.cfg.Tools, tools)
	for _, s := range skipped {
		m.log.Warn("MCP tool left out of the manifest", "reason", s)
	}
	m.drift.observe(man)
}

// Manifest implements hostsdk.Connector: the server's tools as
// capabilities. The first manifest is the admitted one; later tool lists
// are compared with it, never applied.
func (m *MCP) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	sess, _ := m.session()
	if sess == nil {
		return nil, fmt.Errorf("%w: call Connect before starting the host", ErrNotConnected)
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.ConnectTimeout)
	defer cancel()
	tools, err := listTools(ctx, sess)
	if err != nil {
		err = m.redact(err)
		m.downIfGone(sess, "tools/list", err)
		return nil, fmt.Errorf("sidecar: tools/list on %s: %w", m.Target(), err)
	}
	man, infos, skipped := toolManifest(agentFor(m.cfg.AgentID, sess.InitializeResult()), m.cfg.CapabilityPrefix, m.cfg.Tools, tools)
	for _, s := range skipped {
		m.log.Warn("MCP tool left out of the manifest", "reason", s)
	}
	if err := m.checkAllowList(tools, infos); err != nil {
		return nil, err
	}
	if len(man.Capabilities) == 0 {
		return nil, fmt.Errorf("sidecar: the MCP server %s exposes no usable tools (%d listed, allow-list %v)", m.Target(), len(tools), m.cfg.Tools)
	}
	m.mu.Lock()
	m.tools = infos
	m.mu.Unlock()
	m.drift.admit(man)
	return man, nil
}

// maxOfferedNamed bounds the server's tool names an allow-list error
// quotes.
const maxOfferedNamed = 30

// checkAllowList refuses, at discovery, an allow-list (Tools) naming a
// tool the server does not list, or one it lists that cannot become a
// capability (toolCapability): started without it, the replica would
// silently lack a capability the operator asked for (a typo in
// --mcp-tools). The error names those tools and the tools the server
// offers. A tool list that changes after registration is only reported
// (observe, drift): the running replica keeps its admitted manifest.
func (m *MCP) checkAllowList(tools []*mcp.Tool, admitted map[string]toolInfo) error {
	if len(m.cfg.Tools) == 0 {
		return nil
	}
	listed := make(map[string]*mcp.Tool, len(tools))
	offered := make([]string, 0, len(tools))
	for _, t := range tools {
		if _, dup := listed[t.Name]; !dup {
			offered = append(offered, t.Name)
		}
		listed[t.Name] = t
	}
	var unknown, unusable []string
	seen := make(map[string]bool, len(m.cfg.Tools))
	for _, name := range m.cfg.Tools {
		if seen[name] {
			continue
		}
		seen[name] = true
		t, ok := listed[name]
		switch {
		case !ok:
			unknown = append(unknown, name)
		case admitted[m.cfg.CapabilityPrefix+name].name == "":
			why := "listed twice"
			if _, _, err := toolCapability(m.cfg.CapabilityPrefix, t); err != nil {
				why = err.Error()
			}
			unusable = append(unusable, fmt.Sprintf("%s (%s)", name, why))
		}
	}
	if len(unknown) == 0 && len(unusable) == 0 {
		return nil
	}
	var parts []string
	if len(unknown) > 0 {
		slices.Sort(offered)
		list := "none"
		if len(offered) > 0 {
			list = strings.Join(offered[:min(len(offered), maxOfferedNamed)], ", ")
			if len(offered) > maxOfferedNamed {
				list += fmt.Sprintf(" and %d more", len(offered)-maxOfferedNamed)
			}
		}
		parts = append(parts, fmt.Sprintf("names tools the MCP server %s does not offer: %s (its tools/list offers: %s); correct the names, or leave the setting unset to expose every tool",
			m.Target(), strings.Join(unknown, ", "), list))
	}
	if len(unusable) > 0 {
		parts = append(parts, fmt.Sprintf("names tools of the MCP server %s that cannot become capabilities: %s; remove them from the list",
			m.Target(), strings.Join(unusable, "; ")))
	}
	return cfgErr("MCP.Tools", strings.Join(parts, "; it also "))
}

// CheckHealth implements hostsdk.HealthChecker: the session must be up and
// answer an MCP ping (and, with ManifestChangeUnready, the tool list must
// be the admitted one). A session the ping finds gone is taken down at
// once; with RestartUnresponsiveAfter, so is one whose pings went
// unanswered that many times in a row — a ping that could not even be
// written by ctx's deadline included (see ping).
func (m *MCP) CheckHealth(ctx context.Context) error {
	sess, _ := m.session()
	if sess == nil {
		m.status.setHealthy(false)
		m.mu.Lock()
		last := m.lastErr
		m.mu.Unlock()
		return fmt.Errorf("%w (%s); reconnecting with backoff", ErrNotConnected, last)
	}
	if err := m.ping(ctx, sess); err != nil {
		m.status.setHealthy(false)
		err = m.redact(err)
		if sessionGone(err) {
			m.downIfGone(sess, "ping", err)
		} else {
			m.noteUnanswered(ctx, sess, err)
		}
		return fmt.Errorf("sidecar: MCP ping: %w", err)
	}
	m.noteAnswered(sess)
	m.status.setHealthy(true)
	return m.drift.err()
}

// ping sends an MCP ping on sess and returns its error, or an error
// wrapping ctx's once ctx ends first. The SDK heeds ctx while it waits for
// the answer but not while it writes the request: the write to a stdio
// server that stopped reading its input (stopped, deadlocked, stuck) blocks
// once the pipe is full — behind a large tool call's arguments, say — and
// a health check that waited for it would never return, so its ping would
// never count as unanswered and RestartUnresponsiveAfter would never
// restart the server. A ping still being written when ctx ends goes on
// waiting on its goroutine, and later checks on sess wait for it rather
// than queue a ping of their own behind it: at most one ping per session
// is in flight. It ends once the write does (a restart stops the server,
// which fails the write).
func (m *MCP) ping(ctx context.Context, sess *mcp.ClientSession) error {
	m.mu.Lock()
	p := m.pinging
	if p == nil || p.sess != sess {
		p = &pingRun{sess: sess, done: make(chan struct{})}
		m.pinging = p
		go func() {
			p.err = sess.Ping(ctx, nil)
			m.mu.Lock()
			if m.pinging == p {
				m.pinging = nil
			}
			m.mu.Unlock()
			close(p.done)
		}()
	}
	m.mu.Unlock()
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		return fmt.Errorf("no answer before the health check's deadline (the ping request may not even have been written: a stdio server that stopped reading its input): %w", ctx.Err())
	}
}

// pingRun is a ping in flight on sess (MCP.ping).
type pingRun struct {
	sess *mcp.ClientSession
	done chan struct{} // closed when the ping returned
	err  error
}

// downIfGone has the loop take sess down at once when err, from a request
// of method on it, says the session is over, rather than waiting for the
// next health check's ping to find out.
func (m *MCP) downIfGone(sess *mcp.ClientSession, method string, err error) {
	if sessionGone(err) {
		m.requestDown(sess, fmt.Sprintf("the MCP session is gone (%s: %v)", method, err))
	}
}

// sessionGone reports the errors that say the session is over: the
// connection closed, or an HTTP server no longer knows the session (it
// restarted, or ended the session).
func sessionGone(err error) bool {
	return errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, mcp.ErrSessionMissing)
}

// noteUnanswered counts a ping on sess that got no answer at all (it timed
// out or failed — an HTTP failure the SDK reports as "rejected by
// transport", a proxy's 502 say, included; an MCP error answer of the
// server is an answer, and resets the count)
// and, at RestartUnresponsiveAfter in a row, has the loop take the session
// down as hung. A ping cut short by the caller's cancellation (not its
// deadline) says nothing about the server and is not counted.
//
// Nor is a ping left unanswered while a tool call on the session is in
// progress and within its deadline (and it does not end the row either),
// as an --exec child's health check is not while it runs an action
// (Local.noteUnanswered): many servers handle one message at a time — a
// stdio server reading its input in a loop, a Python server whose tool is
// a plain (blocking) function — and cannot answer a ping while a tool
// runs; taking the session down would cut the call off (outcome_unknown)
// and restart a server that was working. A server hung with a call in
// flight is caught once that call's deadline (timeout_ms, else
// MaxActionDuration) has passed: its pings count from then on, and the
// replica reports unhealthy meanwhile, so no new actions reach it.
func (m *MCP) noteUnanswered(ctx context.Context, sess *mcp.ClientSession, err error) {
	var we *jsonrpc.Error
	if serverError(err, &we) {
		m.noteAnswered(sess)
		return
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	limit := m.cfg.RestartUnresponsiveAfter
	m.mu.Lock()
	if limit <= 0 || m.sess != sess || m.working.Load() > 0 {
		m.mu.Unlock()
		return
	}
	m.unanswered++
	n := m.unanswered
	if n >= limit {
		m.unanswered = 0
	}
	srv := m.srv
	m.mu.Unlock()
	if n < limit {
		m.log.Warn("the MCP server did not answer a ping", "in_a_row", n, "restart_after", limit, "error", err)
		return
	}
	what := "opening a new session (the sidecar did not start this server and cannot restart it)"
	if srv != nil {
		what = "stopping the server and starting it again"
	}
	m.requestDown(sess, fmt.Sprintf("the MCP server did not answer %d pings in a row (the last: %v); taken as hung, %s", n, err, what))
}

// noteAnswered resets the count of unanswered pings on sess.
func (m *MCP) noteAnswered(sess *mcp.ClientSession) {
	m.mu.Lock()
	if m.sess == sess {
		m.unanswered = 0
	}
	m.mu.Unlock()
}

// Handle implements hostsdk.Connector: tools/call.
func (m *MCP) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return m.call(ctx, call, nil)
}

// HandleStream implements hostsdk.Streamer: tools/call with a progress
// token; each progress notification becomes a progress chunk
// {"progress", "total", "message"}.
func (m *MCP) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	return m.call(ctx, call, chunks)
}

func (m *MCP) call(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	a := call.Action
	m.mu.Lock()
	info, ok := m.tools[a.CapabilityID]
	sess, working := m.sess, m.working
	watched := m.srv != nil // a stdio session: its writes are watched (writeWatch)
	m.mu.Unlock()
	if !ok {
		return nil, aip.NewProtocolError(CodeMCPError, aip.CategoryPermanent, false, 0, "capability "+a.CapabilityID+" is not an admitted MCP tool")
	}
	if sess == nil {
		return nil, notDeliveredTo("the MCP server", ErrNotConnected)
	}
	if a.TimeoutMS == nil || *a.TimeoutMS == 0 {
		// timeout_ms 0 sets no deadline in the host either.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.cfg.MaxActionDuration)
		defer cancel()
	}
	if m.cfg.RestartUnresponsiveAfter > 0 {
		defer trackWork(ctx, working)()
	}
	params := &mcp.CallToolParams{
		Name: info.name, Arguments: json.RawMessage(a.Input),
		Meta: mcp.Meta{MetaActionID: a.ID, MetaIdempotencyKey: call.IdempotencyKey},
	}
	var progress chan *mcp.ProgressNotificationParams
	if chunks != nil {
		progress = make(chan *mcp.ProgressNotificationParams, progressBuffer)
		token := a.ID
		m.progress.Store(token, progress)
		defer m.progress.Delete(token)
		params.SetProgressToken(token)
	}
	type outcome struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan outcome, 1)
	wrote := new(atomic.Bool)
	asked := new(interaction)
	go func() {
		res, err := m.callTool(context.WithValue(ctx, wroteKey{}, wrote), sess, params, asked, call.Logger)
		done <- outcome{res, err}
	}()
	forward := chunks != nil
	var last *mcp.ProgressNotificationParams
	send := func(p *mcp.ProgressNotificationParams) {
		last = p
		if !forward {
			return
		}
		data := map[string]any{"progress": p.Progress}
		if p.Total != 0 {
			data["total"] = p.Total
		}
		if p.Message != "" {
			data["message"] = p.Message
		}
		if err := chunks.Send(aip.ChunkProgress, data); err != nil {
			call.Logger.Warn("progress chunk not delivered; later chunks are dropped", "error", err)
			forward = false
		}
	}
	for {
		select {
		case p := <-progress:
			send(p)
		case o := <-done:
			if o.err != nil && sessionGone(o.err) {
				// Reconnect now, not at the next health check: calls on
				// this session fail until then. The SDK usually ends such
				// a session itself, but does not promise to (a session
				// whose write side broke stays up while its other calls
				// wait for their answers). This call's own outcome is
				// settled as any broken session's: ErrSessionMissing does
				// not prove the call was not delivered (the SDK also
				// returns it for calls whose request the server had
				// accepted, when their resumed stream finds the session
				// gone).
				m.requestDown(sess, fmt.Sprintf("a tools/call found the MCP session gone (%v)", m.redact(o.err)))
			}
			if o.err != nil && watched && !wrote.Load() && ctx.Err() == nil {
				// Nothing of the call reached the stdio server: the
				// session broke (the server exited, or the session was
				// being taken down) before the bridge noticed and the
				// SDK refused the call before writing it. It did not
				// run, as a call made once the session was down.
				return nil, notDeliveredTo("the MCP server", fmt.Errorf("tools/call %s was not sent: %w", info.name, m.redact(o.err)))
			}
			// The SDK hands notifications to their handler on another
			// goroutine than responses, so the last progress notifications
			// (sent before the result) can still be on their way.
			if progress != nil {
				wait := progressSettle
				if last == nil {
					wait = progressQuiet
				}
				settle := time.NewTimer(wait)
				for settling := true; settling; {
					if last != nil && last.Total != 0 && last.Progress >= last.Total {
						break
					}
					select {
					case p := <-progress:
						send(p)
					case <-settle.C:
						settling = false
					}
				}
				settle.Stop()
			}
			for drained := false; !drained; {
				select {
				case p := <-progress:
					send(p)
				default:
					drained = true
				}
			}
			return m.settle(ctx, call, info, asked, o.res, o.err)
		}
	}
}

// settle turns a tools/call outcome into a result.
func (m *MCP) settle(ctx context.Context, call *hostsdk.Call, info toolInfo, asked *interaction, res *mcp.CallToolResult, err error) (*aip.ActionResult, error) {
	a := call.Action
	if err != nil {
		err = m.redact(err)
		var (
			we *jsonrpc.Error
			op *net.OpError
			ie *interactionError
		)
		switch {
		case ctx.Err() != nil && info.readOnly:
			// A read-only tool had no effect: the context's error lets the
			// host record cancelled (a cancel) or its timeout.
			return nil, ctx.Err()
		case ctx.Err() != nil:
			return nil, fmt.Errorf("%w: the tool call was cancelled on the MCP server (notifications/cancelled: %v); MCP does not confirm whether a cancelled call had an effect",
				hostsdk.ErrOutcomeUnknown, context.Cause(ctx))
		case errors.As(err, &ie) && info.readOnly:
			return nil, aip.NewProtocolError(CodeInteractionUnavailable, aip.CategoryPermanent, false, 0, aip.TruncateUTF8(ie.Error(), aip.MaxErrorMessageBytes))
		case errors.As(err, &ie):
			return nil, fmt.Errorf("%w: %v; MCP does not say whether the tool did anything before it asked", hostsdk.ErrOutcomeUnknown, ie)
		case errors.As(err, &we) && we.Code == codeAnswerTooLarge && we.Message == msgAnswerTooLarge:
			// frameGuard discarded the server's answer: the tool ran, and
			// its result cannot be returned (as a result no answer can
			// carry).
			return nil, hostsdk.UnusableResult(call.Capability, fmt.Sprintf("MCP tool %s answered with a message larger than the %d bytes the bridge reads from a stdio server; it was discarded", info.name, maxMCPLine))
		case errors.As(err, &op) && op.Op == "dial":
			// The HTTP request never left the sidecar: no connection to
			// the server could be opened (refused, no route, name not
			// found), so the call did not run — as a local connector's
			// action whose POST could not connect.
			return nil, notDeliveredTo("the MCP server", fmt.Errorf("tools/call %s: %w", info.name, err))
		case serverError(err, &we) && refusedBeforeRun(we.Code):
			pe := aip.NewProtocolError(CodeMCPError, aip.CategoryPermanent, false, 0, asked.explain(we.Message))
			pe.Details, _ = json.Marshal(map[string]any{"jsonrpc_code": we.Code})
			return nil, pe
		case serverError(err, &we) && info.readOnly:
			pe := aip.NewProtocolError(CodeMCPError, aip.CategoryConnector, false, 0, asked.explain(we.Message))
			pe.Details, _ = json.Marshal(map[string]any{"jsonrpc_code": we.Code})
			return nil, pe
		case info.readOnly:
			// The session broke (the server crashed or the connection
			// dropped), or the HTTP exchange failed without the server's
			// answer (a reset connection, a 503 from a proxy), during a
			// read-only call: it had no effect, so it fails
			// connector_host.interrupted, retryable, as every read cut
			// off live does (and Reconcile's after a restart).
			return nil, hostsdk.Interrupted(call.Capability, fmt.Sprintf("the MCP session broke, or the exchange with the server failed, while read-only tool %s ran (%v)", info.name, err))
		}
		return nil, fmt.Errorf("%w: tools/call %s: %v", hostsdk.ErrOutcomeUnknown, info.name, asked.explain(err.Error()))
	}
	content, err := json.Marshal(res.Content)
	if err != nil {
		return nil, fmt.Errorf("%w: the tool's content cannot be encoded: %v", hostsdk.ErrOutcomeUnknown, err)
	}
	if string(content) == "null" {
		content = json.RawMessage("[]")
	}
	var parts []aip.MessagePart
	var texts []string
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, aip.TextPart(t.Text))
			texts = append(texts, t.Text)
		}
	}
	if res.IsError {
		msg := strings.Join(texts, "\n")
		if msg == "" {
			msg = "the tool reported an error"
		}
		pe := aip.NewProtocolError(CodeToolError, aip.CategoryConnector, false, 0, asked.explain(msg))
		pe.Details, _ = json.Marshal(map[string]json.RawMessage{"content": content})
		return fitResult(&aip.ActionResult{ActionID: a.ID, Status: aip.ResultFailed, Error: pe, Message: parts}, call.Logger), nil
	}
	var output json.RawMessage
	switch {
	case info.hasOutput && res.StructuredContent != nil:
		output, err = json.Marshal(res.StructuredContent)
	default:
		o := map[string]any{"content": json.RawMessage(content)}
		if res.StructuredContent != nil {
			o["structured_content"] = res.StructuredContent
		}
		output, err = json.Marshal(o)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: the tool's output cannot be encoded: %v", hostsdk.ErrOutcomeUnknown, err)
	}
	return fitResult(&aip.ActionResult{ActionID: a.ID, Status: aip.ResultCompleted, Output: output, Message: parts}, call.Logger), nil
}

// fitResult leaves a result's message parts out when, with them, the
// result is larger than an answer can carry (hostsdk.MaxResultBytes) and,
// without them, it fits. They repeat the tool's text blocks, which the
// output (or the error's details) holds already, and the host records a
// result no answer can carry as outcome_unknown (a read's as failed):
// carrying the text twice made a tool call that completed with a few MB of
// text look as if its outcome were unknown.
func fitResult(r *aip.ActionResult, log *slog.Logger) *aip.ActionResult {
	if len(r.Message) == 0 {
		return r
	}
	raw, err := json.Marshal(r)
	if err != nil || len(raw) <= hostsdk.MaxResultBytes {
		return r
	}
	lean := *r
	lean.Message = nil
	if raw, err := json.Marshal(&lean); err != nil || len(raw) > hostsdk.MaxResultBytes {
		return r
	}
	if log != nil {
		log.Info("the tool's text is left out of the result's message: with it the result would be too large for an answer; the output carries it",
			"with_message_bytes", len(raw), "max_bytes", hostsdk.MaxResultBytes)
	}
	return &lean
}

// serverError reports whether err carries a JSON-RPC error answer of the
// server, and sets *we to it. The SDK's Streamable HTTP client wraps what
// is not one — any failure of the HTTP request (connection refused or
// reset, a timeout), a 429 or 5xx answer without a JSON-RPC error body —
// in its own JSON-RPC error "rejected by transport" (code -32005), which
// says nothing of what the server did with the call: taken for the
// server's answer, a read cut off by a reset connection or a proxy's 503
// failed for good, as mcp.error "rejected by transport", without its cause.
func serverError(err error, we **jsonrpc.Error) bool {
	if !errors.As(err, we) || ((*we).Code == codeTransportRejected && (*we).Message == "rejected by transport") {
		return false
	}
	*we = unrelayed(*we) // a -32003 or -32004 of an HTTP server (closingCodeTransport)
	return true
}

// codeTransportRejected is the code of the go-sdk's (internal) jsonrpc2
// ErrRejected.
const codeTransportRejected = -32005

// refusedBeforeRun reports JSON-RPC errors that mean the request was not
// run: malformed, unknown method, invalid params.
func refusedBeforeRun(code int64) bool {
	switch code {
	case jsonrpc.CodeParseError, jsonrpc.CodeInvalidRequest, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidParams:
		return true
	}
	return false
}

// Reconcile implements hostsdk.Reconciler: MCP has no way to ask what
// became of a call, so a tool left running by a crash is outcome unknown,
// which the host's recovery turns into a failed connector_host.interrupted,
// retryable, for a read-only tool (it had no effect).
func (m *MCP) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	return nil, fmt.Errorf("%w: the replica restarted while MCP tool %s ran and MCP has no way to ask what became of a call", hostsdk.ErrOutcomeUnknown, u.Action.CapabilityID)
}

// Routes implements hostsdk.RouteProvider: GET /sidecar/status.
func (m *MCP) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	return []hostsdk.Route{{Pattern: "GET " + PathStatus, Handler: m.status.handler()}}, nil
}

// Close stops reconnecting and closes the session; a stdio server is
// stopped as MCP's stdio shutdown says (shutdownServer): its input closed
// first, SIGTERM to its process group only if it still runs after half of
// StopTimeout, SIGKILL at StopTimeout, and given up on if it has not exited
// 5s after SIGKILL (terminateServer).
func (m *MCP) Close() error {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return nil
	}
	m.stopped = true
	m.cancel()
	m.mu.Unlock()
	if m.loopDone != nil {
		<-m.loopDone
	}
	m.closing.Wait()
	m.mu.Lock()
	sess, srv, crashed := m.sess, m.srv, m.crashed
	m.sess, m.sessDone, m.srv = nil, nil, nil
	m.mu.Unlock()
	if sess == nil {
		if crashed != nil {
			return m.crashedResult(crashed)
		}
		return nil
	}
	m.log.Info("closing the MCP session", "target", m.Target())
	if srv != nil {
		return m.shutdownServer(srv, sess)
	}
	return m.closeSession(sess, srv)
}

// closeSession ends a session. A stdio server is stopped (stopServer)
// while the session closes its input.
func (m *MCP) closeSession(sess *mcp.ClientSession, srv *child) error {
	if srv == nil {
		err := sess.Close()
		if errors.Is(err, mcp.ErrConnectionClosed) {
			err = nil
		}
		return err
	}
	return m.stopServer(srv, sess)
}

// shutdownServer is the orderly stop of a stdio server at the sidecar's
// shutdown (Close), MCP's stdio shutdown: the server's input is closed
// first, and a server that exits on its own within half of StopTimeout
// (as the MCP specification expects a server to do when its input ends)
// gets no signal, and has stopped cleanly only with exit status 0
// (exitResult); otherwise its process group is sent SIGTERM, and
// SIGKILL when StopTimeout has passed since the input was closed
// (stopServer). The whole stop is bounded by StopTimeout, as before. A
// session taken down as broken or hung is stopped by stopServer at once.
func (m *MCP) shutdownServer(srv *child, sess *mcp.ClientSession) error {
	start := time.Now()
	early := false // it had exited before its stop: a crash
	select {
	case <-srv.gone:
		early = true
	default:
	}
	if srv.input != nil {
		srv.input.Close()
	}
	closed := make(chan error, 1)
	go func() { closed <- sess.Close() }()
	eof := time.NewTimer(m.cfg.StopTimeout / 2)
	defer eof.Stop()
	select {
	case <-srv.gone:
		// The server exited on its own; the reaper stops what remains of
		// its group, and whatever still runs at StopTimeout is killed.
		rest := time.NewTimer(max(0, m.cfg.StopTimeout-time.Since(start)))
		defer rest.Stop()
		select {
		case <-srv.exited:
			<-closed
			return m.exitResult(srv, early)
		case <-rest.C:
		}
	case <-eof.C:
		m.log.Info("the MCP server did not exit after its input was closed; sending SIGTERM", "pid", srv.cmd.Process.Pid, "after_ms", (m.cfg.StopTimeout / 2).Milliseconds())
	}
	return m.terminateServer(srv, closed, max(0, m.cfg.StopTimeout-time.Since(start)))
}

// exitResult reports how a stdio server that exited without being sent
// SIGTERM ended (shutdownServer): on its own once its input was closed, or
// early, before the sidecar stopped it. Exit status 0 once its input was
// closed is a clean stop. A death by a signal (the sidecar sent none: a
// segfault, an abort, the OOM killer) is a crash, and so is any exit
// before the stop began, with status 0 too (the server was not running
// when it was to be stopped; crashedResult is the same for one the loop
// had noticed already): either
// makes the stop, and so the sidecar's exit status, unclean. A failure
// status once its input was closed is counted as stopped, and logged:
// several servers exit 1 whenever their input ends, which is how MCP's
// stdio shutdown ends them, and counting that as a crash would fail every
// stop of theirs; a crash of such a server that ends in an exit status
// (an uncaught exception) at that moment is told apart only by its log.
func (m *MCP) exitResult(srv *child, early bool) error {
	pid := srv.cmd.Process.Pid
	ps := srv.cmd.ProcessState
	if ps != nil && ps.Success() && !early {
		m.log.Info("MCP server stopped", "pid", pid, "exit", ps.String())
		return nil
	}
	if ps != nil && ps.Exited() && !early {
		m.log.Warn("the MCP server exited with an error status once its input was closed; counted as stopped (several servers exit 1 when their input ends; a death by a signal would not be)", "pid", pid, "exit", ps.String())
		return nil
	}
	exit := exitOf(srv)
	when := "once its input was closed (MCP's stdio shutdown; a server that stops cleanly exits with status 0 when its input ends)"
	if early {
		when = "before the sidecar stopped it"
	}
	m.log.Error("the MCP server did not stop cleanly: it exited "+when, "pid", pid, "exit", exit)
	return fmt.Errorf("sidecar: the MCP server %d did not stop cleanly: it exited %s: %s", pid, when, exit)
}

// crashedResult reports a stdio server whose session had ended on its own
// (it exited or closed its output; the loop took it down) and that was
// not restarted yet when Close began: the server was found dead, not
// stopped, so the stop is unclean. Without it a crash the loop noticed
// just before Close was dropped, and the sidecar exited 0, while one
// Close noticed first (shutdownServer) made it exit 1. A session the
// sidecar took down itself (a broken or hung server, stopped by it) is
// not a crash here.
func (m *MCP) crashedResult(srv *child) error {
	pid := srv.cmd.Process.Pid
	exit := exitOf(srv)
	m.log.Error("the MCP server did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted", "pid", pid, "exit", exit)
	return fmt.Errorf("sidecar: the MCP server %d did not stop cleanly: it exited before the sidecar stopped it, and had not been restarted: %s", pid, exit)
}

// stopServer stops a stdio server: SIGTERM to its process group (as an
// --exec child gets), and its input closed by closing sess (when not nil);
// it has StopTimeout to exit, with the rest of its group, before SIGKILL
// to the group. Exiting on SIGTERM is a clean stop. The SDK closes the
// server's input only once no call is in flight, so a hung server that
// ignores SIGTERM with calls in flight is killed here rather than left
// until their deadlines. It returns once the server was reaped, after the
// rest of its group is gone (child.reap) — also when the server had
// exited already —, or once it was given up on after SIGKILL
// (terminateServer).
func (m *MCP) stopServer(srv *child, sess *mcp.ClientSession) error {
	closed := make(chan error, 1)
	if sess != nil {
		go func() { closed <- sess.Close() }()
	} else {
		closed <- nil
	}
	return m.terminateServer(srv, closed, m.cfg.StopTimeout)
}

// terminateServer sends SIGTERM to a stdio server's process group, and
// SIGKILL after wait; closed reports the end of its session. After SIGKILL
// the server has the KillWait of an --exec child (child.awaitKilled) to
// exit: one in uninterruptible sleep (a dead network file system) is
// given up on, logged, and its input and output closed so that its
// session ends although the server still holds them; the error returned
// says so. Neither the sidecar's shutdown nor a restart waits for it for
// ever.
func (m *MCP) terminateServer(srv *child, closed <-chan error, wait time.Duration) error {
	pid := srv.cmd.Process.Pid
	srv.terminating.Store(true)
	if err := srv.signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		m.log.Warn("signal the MCP server", "pid", pid, "error", err)
	}
	killed := false
	kill := time.NewTimer(wait)
	select {
	case <-srv.exited:
	case <-kill.C:
		m.log.Warn("the MCP server (or another process of its process group) did not stop after SIGTERM; sending SIGKILL to its process group", "pid", pid, "after_ms", wait.Milliseconds())
		srv.signal(syscall.SIGKILL)
		killed = true
		kw := killWaitOr(m.cfg.killWait)
		if !srv.awaitKilled("the MCP server", kw, m.log) {
			m.abandon(srv, closed, kw)
			return fmt.Errorf("sidecar: the MCP server %d (or another process of its process group) did not stop within %s after SIGTERM, and did not exit within %s after SIGKILL either (uninterruptible sleep, e.g. on a dead network file system?); the sidecar stopped waiting for it",
				pid, m.cfg.StopTimeout, kw)
		}
	}
	kill.Stop()
	// The server's output ends with its group (or StopTimeout after it),
	// so the session's reader, and Close, end too.
	<-closed
	return m.stopResult(srv, killed)
}

// abandon ends the session of a stdio server the sidecar gave up on
// (terminateServer): its input and output are closed, which ends the
// session's reader and writes, and the session's close is awaited for at
// most killWait. The reaper still reaps the server if it ever exits.
func (m *MCP) abandon(srv *child, closed <-chan error, killWait time.Duration) {
	if srv.input != nil {
		srv.input.Close()
	}
	if srv.output != nil {
		srv.output.Close()
	}
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-closed:
	case <-t.C:
		m.log.Error("the session of the MCP server given up on did not end; no longer waiting for it", "pid", srv.cmd.Process.Pid)
	}
}

// stopResult reports how a stdio server that was stopped ended.
func (m *MCP) stopResult(srv *child, killed bool) error {
	pid := srv.cmd.Process.Pid
	ps := srv.cmd.ProcessState
	switch {
	case killed:
		return fmt.Errorf("sidecar: the MCP server %d (or another process of its process group) did not stop within %s and was killed", pid, m.cfg.StopTimeout)
	case ps != nil && stoppedCleanly(ps):
		m.log.Info("MCP server stopped", "pid", pid, "exit", ps.String())
		return nil
	case ps != nil:
		return fmt.Errorf("sidecar: the MCP server %d did not stop cleanly: %s", pid, ps)
	}
	return fmt.Errorf("sidecar: the MCP server %d did not stop: %v", pid, srv.err)
}

// snapshot implements processSnapshot (stdio servers).
func (m *MCP) snapshot() ProcessStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	st := ProcessStatus{Starts: m.starts, Restarts: m.restarts, Since: m.since.UTC(), LastExit: m.lastErr}
	if m.sess != nil {
		st.Running = true
		if m.srv != nil {
			st.PID = m.srv.cmd.Process.Pid
		}
	}
	return st
}

var (
	_ hostsdk.Connector     = (*MCP)(nil)
	_ hostsdk.HealthChecker = (*MCP)(nil)
	_ hostsdk.Streamer      = (*MCP)(nil)
	_ hostsdk.Reconciler    = (*MCP)(nil)
	_ hostsdk.RouteProvider = (*MCP)(nil)
)
