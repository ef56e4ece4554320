package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// How the test server answers a ping.
const (
	pingAnswer = iota
	pingHang   // no answer until the client gives up
	pingError  // an MCP error answer
)

// answerPings makes the server answer pings as *mode says.
func answerPings(server *mcp.Server, mode *atomic.Int32) {
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "ping" {
				switch mode.Load() {
				case pingHang:
					<-ctx.Done() // the client's notifications/cancelled
					return nil, ctx.Err()
				case pingError:
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "test: busy, but answering"}
				}
			}
			return next(ctx, method, req)
		}
	})
}

// TestMCPUnansweredPingsTakeTheSessionDown: with RestartUnresponsiveAfter
// N, N health checks in a row whose ping got no answer take the session
// down as hung and a new one comes up with the reconnect backoff; an MCP
// error answer is an answer (it neither counts nor lets the count go on),
// an answered ping resets the count, and 0 never takes a session down.
// Each case runs in a synctest bubble: an unanswered ping times out at
// once on the bubble's clock.
func TestMCPUnansweredPingsTakeTheSessionDown(t *testing.T) {
	type step struct {
		mode     int32
		restarts int // the session restarts after this health check
	}
	for _, tc := range []struct {
		name  string
		n     int
		steps []step
	}{
		{"N unanswered pings in a row take the session down", 3,
			[]step{{pingHang, 0}, {pingHang, 0}, {pingHang, 1}}},
		{"an MCP error answer is an answer", 2,
			[]step{{pingError, 0}, {pingError, 0}, {pingError, 0}, {pingHang, 0}, {pingError, 0}, {pingHang, 0}, {pingHang, 1}}},
		{"an answered ping resets the count", 2,
			[]step{{pingHang, 0}, {pingAnswer, 0}, {pingHang, 0}, {pingAnswer, 0}, {pingHang, 0}, {pingHang, 1}}},
		{"0 never takes the session down", 0,
			[]step{{pingHang, 0}, {pingHang, 0}, {pingHang, 0}, {pingHang, 0}, {pingHang, 0}, {pingHang, 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := newTestMCPServer(t)
				var mode atomic.Int32
				answerPings(ts.server, &mode)
				rig := &severingRig{server: ts.server, conns: make(chan *severableConn, 4)}
				m, _ := rig.start(t, MCPConfig{RestartUnresponsiveAfter: tc.n, RestartBackoff: 250 * time.Millisecond})
				check := func() error {
					ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
					defer cancel()
					return m.CheckHealth(ctx)
				}
				for i, s := range tc.steps {
					mode.Store(s.mode)
					err := check()
					if (err == nil) != (s.mode == pingAnswer) {
						t.Fatalf("health check %d (ping mode %d): %v", i+1, s.mode, err)
					}
					synctest.Wait() // the loop acted on a request to take the session down
					if st := m.snapshot(); st.Restarts != s.restarts {
						t.Fatalf("after health check %d of %v (RestartUnresponsiveAfter %d): %d restarts, want %d (status %+v)",
							i+1, tc.steps, tc.n, st.Restarts, s.restarts, st)
					}
				}
				if tc.steps[len(tc.steps)-1].restarts == 0 {
					return
				}
				if st := m.snapshot(); st.Running || !strings.Contains(st.LastExit, "did not answer") {
					t.Errorf("status after the session was taken down as hung: %+v", st)
				}
				mode.Store(pingAnswer)
				rig.await(t, m, 2)
				if err := check(); err != nil {
					t.Errorf("the new session does not answer: %v", err)
				}
			})
		})
	}
}

// missingSessionConn fails the writes of tools/call requests for a tool
// as an HTTP client does when the server no longer knows the session,
// while the connection's other traffic goes on: the SDK does not end such
// a session while another call on it still waits for its answer.
type missingSessionConn struct {
	mcp.Connection
	tool string
}

func (c missingSessionConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "tools/call" && bytes.Contains(req.Params, []byte(`"name":"`+c.tool+`"`)) {
		return fmt.Errorf("test: POST answered 404: %w", mcp.ErrSessionMissing)
	}
	return c.Connection.Write(ctx, msg)
}

// TestMCPCallFindingTheSessionGoneReconnects: a tools/call that fails
// with ErrSessionMissing has the session re-established at once, without
// waiting for the next health check (none runs here), even while another
// call keeps the old session open.
func TestMCPCallFindingTheSessionGoneReconnects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ts := newTestMCPServer(t)
		rig := &severingRig{server: ts.server, conns: make(chan *severableConn, 4)}
		var first atomic.Bool
		first.Store(true)
		rig.wrap = func(c mcp.Connection) mcp.Connection {
			if first.Swap(false) {
				return missingSessionConn{c, "lookup"}
			}
			return c
		}
		m, _ := rig.start(t, MCPConfig{RestartBackoff: 250 * time.Millisecond})
		man, err := m.Manifest(t.Context(), hostsdk.TenantContext{})
		if err != nil {
			t.Fatal(err)
		}
		call := func(ctx context.Context, tool, input string) (*aip.ActionResult, error) {
			return m.Handle(ctx, toolCall(t, man, tool, input))
		}
		// A call that keeps the session open.
		slowCtx, stopSlow := context.WithCancel(t.Context())
		defer stopSlow()
		slowDone := make(chan error, 1)
		go func() {
			_, err := call(slowCtx, "slow_ro", `{}`)
			slowDone <- err
		}()
		<-ts.started
		res, err := call(t.Context(), "lookup", `{"word":"x"}`)
		var pe *aip.ProtocolError
		if !errors.As(err, &pe) || pe.Code != hostsdk.CodeInterrupted || !pe.IsRetryable() || !strings.Contains(pe.Message, "session not found") {
			t.Fatalf("a read-only call on a missing session: %+v %v; want %s, retryable", res, err, hostsdk.CodeInterrupted)
		}
		synctest.Wait()
		if st := m.snapshot(); st.Restarts != 1 || st.Running {
			t.Fatalf("after a call found the session missing: status %+v; want the session taken down", st)
		}
		rig.await(t, m, 2)
		if res, err := call(t.Context(), "lookup", `{"word":"y"}`); err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("a call on the new session: %+v %v", res, err)
		}
		stopSlow()
		if err := <-slowDone; !errors.Is(err, context.Canceled) {
			t.Errorf("the slow read-only call: %v", err)
		}
	})
}

// connectHTTPMCP connects an MCP adapter to the Streamable HTTP server
// srv (serving ts at /mcp), reconnecting after 1 ms, and closes the
// adapter, ts's sessions and srv at the test's end.
func connectHTTPMCP(t *testing.T, ts *testMCPServer, srv *httptest.Server) (*MCP, *logWatch) {
	t.Helper()
	return connectHTTPMCPWith(t, ts, srv, nil)
}

// connectHTTPMCPWith is connectHTTPMCP with the configuration edit makes
// (nil: none).
func connectHTTPMCPWith(t *testing.T, ts *testMCPServer, srv *httptest.Server, edit func(*MCPConfig)) (*MCP, *logWatch) {
	t.Helper()
	logs := newLogWatch()
	cfg := MCPConfig{URL: srv.URL + "/mcp", RestartBackoff: time.Millisecond, Logger: logs.logger()}
	if edit != nil {
		edit(&cfg)
	}
	m, err := NewMCP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		for s := range ts.server.Sessions() {
			s.Close()
		}
		srv.CloseClientConnections()
		srv.Close()
	})
	if err := m.Connect(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	return m, logs
}

// roundTripFunc is an http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestMCPHTTPCallFailures: how a tools/call whose HTTP exchange failed
// without the server's answer ends. One whose request could not even
// connect (here: connection refused) never reached the server, so it did
// not run: it fails retryably as not delivered, as a local connector's
// action does, rather than leaving a write's outcome unknown. One that got
// a 503 without a JSON-RPC error (a proxy's) may have reached the server:
// a write's outcome is unknown, and a read fails interrupted, retryable,
// with the status in its message — the SDK reports both as its own
// JSON-RPC error "rejected by transport", which was taken for the
// server's answer: the read failed for good as mcp.error without its
// cause. The session stays up and serves the next call.
func TestMCPHTTPCallFailures(t *testing.T) {
	ts := newTestMCPServer(t)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server }, nil))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	refusing := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, closed)
	}}
	const (
		pass = iota
		refuse
		unavailable
	)
	var mode atomic.Int32
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method != http.MethodPost {
			return http.DefaultTransport.RoundTrip(r)
		}
		switch mode.Load() {
		case refuse:
			return refusing.RoundTrip(r)
		case unavailable:
			r.Body.Close()
			return &http.Response{StatusCode: http.StatusServiceUnavailable, Status: "503 Service Unavailable", Header: http.Header{},
				Body: http.NoBody, Request: r}, nil
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	m, _ := connectHTTPMCPWith(t, ts, srv, func(c *MCPConfig) { c.HTTPClient = hc })
	ctx := ctxT(t)
	man, err := m.Manifest(ctx, hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		mode int32
		tool string
		code string // "" for outcome unknown
		says string
	}{
		{refuse, "slow", CodeConnectorUnavailable, "connection refused"},
		{refuse, "lookup", CodeConnectorUnavailable, "connection refused"},
		{unavailable, "slow", "", "Service Unavailable"},
		{unavailable, "lookup", hostsdk.CodeInterrupted, "Service Unavailable"},
	} {
		mode.Store(tc.mode)
		_, err := m.Handle(ctx, toolCall(t, man, tc.tool, `{"word":"x","steps":1}`))
		mode.Store(pass)
		var pe *aip.ProtocolError
		switch {
		case err == nil || !strings.Contains(err.Error(), tc.says):
			t.Errorf("%s (HTTP mode %d): %v; want an error saying %q", tc.tool, tc.mode, err, tc.says)
		case tc.code == "" && !errors.Is(err, hostsdk.ErrOutcomeUnknown):
			t.Errorf("%s (HTTP mode %d): %v; want outcome unknown", tc.tool, tc.mode, err)
		case tc.code != "" && (!errors.As(err, &pe) || pe.Code != tc.code || !pe.IsRetryable()):
			t.Errorf("%s (HTTP mode %d): %v; want %s, retryable", tc.tool, tc.mode, err, tc.code)
		}
	}
	if res, err := m.Handle(ctx, toolCall(t, man, "lookup", `{"word":"x"}`)); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("a call once the server is reachable again: %+v %v", res, err)
	}
}

// TestMCPHTTPPingAnsweredByAProxyIsUnanswered: a ping answered 502 by a
// proxy pinned to a dead backend got no answer from the server: with
// RestartUnresponsiveAfter N, N of them take the session down and a new
// one is opened. The SDK reports such a failure as its own JSON-RPC error
// "rejected by transport", which was taken for the server's MCP error
// answer: it reset the count, and the session was never re-opened.
func TestMCPHTTPPingAnsweredByAProxyIsUnanswered(t *testing.T) {
	ts := newTestMCPServer(t)
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server }, nil))
	var badGateway atomic.Bool
	hc := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Method == http.MethodPost && badGateway.Load() {
			body, _ := io.ReadAll(r.Body)
			r.Body.Close()
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"method":"ping"`)) {
				return &http.Response{StatusCode: http.StatusBadGateway, Status: "502 Bad Gateway", Header: http.Header{},
					Body: http.NoBody, Request: r}, nil
			}
		}
		return http.DefaultTransport.RoundTrip(r)
	})}
	m, logs := connectHTTPMCPWith(t, ts, srv, func(c *MCPConfig) { c.HTTPClient = hc; c.RestartUnresponsiveAfter = 2 })
	ctx := ctxT(t)
	if err := m.CheckHealth(ctx); err != nil {
		t.Fatal(err)
	}
	badGateway.Store(true)
	for i := range 2 {
		if err := m.CheckHealth(ctx); err == nil || !strings.Contains(err.Error(), "Bad Gateway") {
			t.Fatalf("health check %d through a proxy answering 502: %v", i+1, err)
		}
	}
	badGateway.Store(false)
	logs.await(t, func(r slog.Record) bool {
		return r.Message == "connected to the MCP server" && attr(r, "connection") == "2"
	})
	if st := m.snapshot(); st.Restarts != 1 || !strings.Contains(st.LastExit, "did not answer 2 pings") {
		t.Errorf("status %+v after 2 pings answered 502 by a proxy", st)
	}
	if err := m.CheckHealth(ctx); err != nil {
		t.Errorf("health on the new session: %v", err)
	}
}

// TestMCPHTTPServerRestartReconnects: after a Streamable HTTP server
// restarts (it no longer knows the session), the first call fails and the
// session is re-established without a health check; the next call works.
// (With go-sdk v1.8.0 the SDK itself ends a session whose POST got 404,
// so this passes without the sidecar's own reconnect request too; it
// guards the end-to-end behaviour, TestMCPCallFindingTheSessionGoneReconnects
// the sidecar's part.)
func TestMCPHTTPServerRestartReconnects(t *testing.T) {
	ts := newTestMCPServer(t)
	var handler atomic.Pointer[http.Handler]
	restart := func() {
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server }, nil)
		var hh http.Handler = h
		handler.Store(&hh)
	}
	restart()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }))
	m, logs := connectHTTPMCP(t, ts, srv)
	ctx := ctxT(t)
	man, err := m.Manifest(ctx, hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	restart()
	call := func(tool string) (*aip.ActionResult, error) {
		return m.Handle(ctx, toolCall(t, man, tool, `{"word":"x"}`))
	}
	if _, err := call("lookup"); err == nil {
		t.Fatal("a call on a session the server no longer knows succeeded")
	}
	logs.await(t, func(r slog.Record) bool {
		return r.Message == "connected to the MCP server" && attr(r, "connection") == "2"
	})
	if res, err := call("lookup"); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("a call after the reconnect: %+v %v", res, err)
	}
}

// TestMCPHTTPSessionGoneWithJSONBodyReconnects: a Streamable HTTP server
// that restarted answers the old session's requests 404, as the transport
// requires, and servers may put a JSON-RPC error in that 404's body (with
// a null ID, as the TypeScript SDK does, or naming the request's ID). The
// health ping must take such a session as gone and the sidecar open a new
// one. With a body naming the request's ID the SDK reported the JSON-RPC
// error instead of the missing session, and the replica stayed unhealthy
// for good.
func TestMCPHTTPSessionGoneWithJSONBodyReconnects(t *testing.T) {
	for _, echoID := range []bool{false, true} {
		t.Run(fmt.Sprintf("echo_id=%v", echoID), func(t *testing.T) {
			ts := newTestMCPServer(t)
			// The restarted server: a new handler, which no longer knows
			// the sessions the old one opened; a request of one of those
			// is answered 404 with a JSON-RPC error body.
			var (
				handler atomic.Pointer[http.Handler]
				mu      sync.Mutex
				seen    = map[string]bool{} // session IDs the old handler served
				stale   map[string]bool
			)
			restart := func() {
				h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server }, nil)
				var hh http.Handler = h
				mu.Lock()
				if handler.Load() != nil {
					stale = seen
				}
				mu.Unlock()
				handler.Store(&hh)
			}
			restart()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				sid := r.Header.Get("Mcp-Session-Id")
				mu.Lock()
				gone := stale[sid]
				if stale == nil && sid != "" {
					seen[sid] = true
				}
				mu.Unlock()
				if !gone {
					(*handler.Load()).ServeHTTP(w, r)
					return
				}
				body, _ := io.ReadAll(r.Body)
				id := json.RawMessage("null")
				if echoID {
					var req struct{ ID json.RawMessage }
					if json.Unmarshal(body, &req) == nil && req.ID != nil {
						id = req.ID
					}
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprintf(w, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":%s}`, id)
			}))
			m, logs := connectHTTPMCP(t, ts, srv)
			ctx := ctxT(t)
			if err := m.CheckHealth(ctx); err != nil {
				t.Fatal(err)
			}
			restart()
			if err := m.CheckHealth(ctx); err == nil {
				t.Fatal("a ping on a session the server no longer knows succeeded")
			}
			logs.await(t, func(r slog.Record) bool {
				return r.Message == "connected to the MCP server" && attr(r, "connection") == "2"
			})
			if err := m.CheckHealth(ctx); err != nil {
				t.Errorf("health after the reconnect: %v", err)
			}
		})
	}
}

// TestMCPHungStdioServerIsRestarted: a stdio server that stops answering
// (pings and tool calls) and ignores SIGTERM is stopped after
// RestartUnresponsiveAfter unanswered pings — SIGKILL after StopTimeout —
// and a new server is started. Pings left unanswered while its calls were
// in progress do not count (TestMCPBusyServerFinishesItsCall): the calls
// end at their deadline (a read-only tool's with the deadline's error,
// another's outcome unknown), and the pings after it count.
func TestMCPHungStdioServerIsRestarted(t *testing.T) {
	hang := filepath.Join(t.TempDir(), "hang")
	m, logs, man := connectRestartingStdioMCP(t, envChildHang+"="+hang)
	ctx := ctxT(t)
	first := m.snapshot()
	if err := os.WriteFile(hang, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		tool string
		err  error
	}
	calls := make(chan outcome, 2)
	callCtx, cancelCalls := context.WithTimeout(ctx, time.Second)
	defer cancelCalls()
	for _, tool := range []string{"stuck", "stuck_ro"} {
		go func() {
			_, err := m.Handle(callCtx, toolCall(t, man, tool, `{}`))
			calls <- outcome{tool, err}
		}()
	}
	check := func(i int) {
		pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := m.CheckHealth(pctx)
		cancel()
		if err == nil {
			t.Fatalf("health check %d: the hung server answered", i)
		}
	}
	for i := range 3 { // while the calls are in progress: not counted
		check(i + 1)
	}
	for range 2 {
		o := <-calls
		switch {
		case o.tool == "stuck_ro" && !errors.Is(o.err, context.DeadlineExceeded):
			t.Errorf("%s: %v; want its deadline's error", o.tool, o.err)
		case o.tool == "stuck" && !errors.Is(o.err, hostsdk.ErrOutcomeUnknown):
			t.Errorf("%s: %v; want outcome unknown", o.tool, o.err)
		}
	}
	if st := m.snapshot(); st.Restarts != 0 {
		t.Fatalf("the server was restarted while its calls were in progress: %+v", st)
	}
	for i := range 2 {
		check(i + 4)
	}
	logs.await(t, func(r slog.Record) bool { return strings.Contains(r.Message, "sending SIGKILL") })
	os.Remove(hang)
	logs.await(t, func(r slog.Record) bool {
		return r.Message == "connected to the MCP server" && attr(r, "connection") == "2"
	})
	st := m.snapshot()
	if st.Restarts != 1 || st.PID == 0 || st.PID == first.PID || !strings.Contains(st.LastExit, "did not answer 2 pings") {
		t.Errorf("status %+v after the hung server %d was replaced", st, first.PID)
	}
	if err := m.CheckHealth(ctx); err != nil {
		t.Errorf("the new server: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestMCPPingThatCannotBeWrittenIsUnanswered: a stdio server that stopped
// reading its input (here: stopped with SIGSTOP) fills the pipe to it, and
// the SDK's write of the next request blocks without heeding its context.
// The health check must still return at its deadline and count the ping
// as unanswered, so that RestartUnresponsiveAfter restarts the server; it
// hung instead, and the replica stayed unready with the server never
// restarted.
func TestMCPPingThatCannotBeWrittenIsUnanswered(t *testing.T) {
	m, logs, man := connectRestartingStdioMCP(t)
	ctx := ctxT(t)
	first := m.snapshot()
	if err := syscall.Kill(first.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(first.PID, syscall.SIGCONT)
	// Arguments larger than any pipe's buffer: their write blocks, and
	// every later request's waits behind it. Pings do not count while
	// the call is within its deadline (TestMCPBusyServerFinishesItsCall).
	callCtx, cancelCall := context.WithTimeout(ctx, 2*time.Second)
	defer cancelCall()
	callDone := make(chan error, 1)
	go func() {
		_, err := m.Handle(callCtx, toolCall(t, man, "stuck", `{"pad":"`+strings.Repeat("x", 1<<20)+`"}`))
		callDone <- err
	}()
	// Only a ping sent once the call's write blocks waits behind it.
	awaitBlockedPipeWrite(t)
	<-callCtx.Done()
	for i := range 2 {
		checked := make(chan error, 1)
		go func() {
			pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			checked <- m.CheckHealth(pctx)
		}()
		select {
		case err := <-checked:
			if err == nil {
				t.Fatalf("health check %d: the stopped server answered", i+1)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("health check %d did not return within 10 s of its 100 ms deadline (a ping that cannot be written)", i+1)
		}
	}
	logs.await(t, func(r slog.Record) bool {
		return r.Message == "connected to the MCP server" && attr(r, "connection") == "2"
	})
	if st := m.snapshot(); st.Restarts != 1 || st.PID == first.PID || !strings.Contains(st.LastExit, "did not answer 2 pings") {
		t.Errorf("status %+v after the stopped server %d was replaced", st, first.PID)
	}
	if err := <-callDone; !errors.Is(err, hostsdk.ErrOutcomeUnknown) {
		t.Errorf("the call whose arguments were being written: %v; want outcome unknown", err)
	}
	if err := m.CheckHealth(ctx); err != nil {
		t.Errorf("the new server: %v", err)
	}
}

// awaitBlockedPipeWrite waits until a goroutine is blocked writing an MCP
// message to a stdio server's input (its pipe is full).
func awaitBlockedPipeWrite(t *testing.T) {
	t.Helper()
	buf := make([]byte, 4<<20)
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if strings.Contains(g, "(*ioConn).Write") && strings.Contains(g, "waitWrite") {
				return
			}
		}
	}
	t.Fatal("no write to the MCP server's input blocked within a minute")
}

// envMCPChild makes the test binary run as a stdio MCP server: tools
// lookup (read-only), huge (read-only) and huge_rw (which answer a text of
// the input's "bytes" x's), stuck and stuck_ro (which never answer), busy
// (which answers after the input's "delay_ms", answering no ping
// meanwhile, as a server handling one message at a time), rpc_error
// (read-only) and rpc_error_rw (which answer with the JSON-RPC error of
// the input's "code" and "message"), and those of addInteractiveTools.
// With envMCPPingError it answers every ping with that JSON-RPC error
// code. While the
// file named by envChildHang exists it answers no ping and ignores
// SIGTERM (a hung server). With envMCPStopLog it appends "term" to that
// file on SIGTERM (then exits), and "eof" when its input ends, after which
// it exits only 2 s later, so that a SIGTERM sent with the input's end is
// recorded too. With envMCPEOFStatus it exits with that status when its
// input ends; with envMCPEOFSignal ("TERM" or "KILL") it dies of that
// signal then, sent by itself.
const (
	envMCPChild     = "SIDECAR_TEST_MCP_CHILD"
	envMCPStopLog   = "SIDECAR_TEST_MCP_STOP_LOG"
	envMCPEOFStatus = "SIDECAR_TEST_MCP_EOF_STATUS"
	envMCPEOFSignal = "SIDECAR_TEST_MCP_EOF_SIGNAL"
	envMCPPingError = "SIDECAR_TEST_MCP_PING_ERROR"
	// envMCPLegacy restricts the server to protocol 2025-11-25, where it
	// asks for input with requests of its own (elicitation/create,
	// sampling/createMessage) rather than input_required results.
	envMCPLegacy = "SIDECAR_TEST_MCP_LEGACY"
)

func runMCPChild() int {
	hang := os.Getenv(envChildHang)
	hung := func() bool { _, err := os.Stat(hang); return hang != "" && err == nil }
	stopLog := os.Getenv(envMCPStopLog)
	record := func(what string) {
		if stopLog == "" {
			return
		}
		f, err := os.OpenFile(stopLog, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			fmt.Fprintln(f, what)
			f.Close()
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	go func() {
		for range sigs {
			record("term")
			if !hung() {
				os.Exit(0)
			}
		}
	}()
	var opts *mcp.ServerOptions
	if os.Getenv(envMCPLegacy) == "1" {
		opts = &mcp.ServerOptions{SupportedProtocolVersions: []string{"2025-11-25"}}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "test-stdio-server", Version: "1.0"}, opts)
	addInteractiveTools(server)
	var busy sync.Mutex // held by the busy tool while it runs
	server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "ping" && hung() {
				select {} // hung: no answer, not even to a cancel
			}
			if method == "ping" {
				busy.Lock() // no answer while the busy tool runs
				defer busy.Unlock()
				if code, err := strconv.ParseInt(os.Getenv(envMCPPingError), 10, 64); err == nil {
					return nil, &jsonrpc.Error{Code: code, Message: "the server refuses pings"}
				}
			}
			return next(ctx, method, req)
		}
	})
	rpcError := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		}
		json.Unmarshal(req.Params.Arguments, &in)
		return nil, &jsonrpc.Error{Code: in.Code, Message: in.Message}
	}
	server.AddTool(&mcp.Tool{Name: "rpc_error", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, rpcError)
	server.AddTool(&mcp.Tool{Name: "rpc_error_rw", InputSchema: objectSchema}, rpcError)
	server.AddTool(&mcp.Tool{Name: "busy", InputSchema: objectSchema},
		func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct {
				DelayMS int `json:"delay_ms"`
			}
			json.Unmarshal(req.Params.Arguments, &in)
			busy.Lock()
			defer busy.Unlock()
			time.Sleep(time.Duration(in.DelayMS) * time.Millisecond)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil
		})
	server.AddTool(&mcp.Tool{Name: "lookup", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	huge := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct{ Bytes int }
		json.Unmarshal(req.Params.Arguments, &in)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.Bytes)}}}, nil
	}
	server.AddTool(&mcp.Tool{Name: "huge", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, huge)
	server.AddTool(&mcp.Tool{Name: "huge_rw", InputSchema: objectSchema}, huge)
	stuck := func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) { select {} }
	server.AddTool(&mcp.Tool{Name: "stuck", InputSchema: objectSchema}, stuck)
	server.AddTool(&mcp.Tool{Name: "stuck_ro", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, stuck)
	if err := server.Run(ctx, &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "mcp child:", err)
		return 1
	}
	if stopLog != "" {
		record("eof")
		time.Sleep(2 * time.Second) // a SIGTERM sent with the input's end is recorded meanwhile
	}
	if s, err := strconv.Atoi(os.Getenv(envMCPEOFStatus)); err == nil {
		return s
	}
	if sig, ok := map[string]syscall.Signal{"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL}[os.Getenv(envMCPEOFSignal)]; ok {
		signal.Reset(sig)
		syscall.Kill(os.Getpid(), sig)
		time.Sleep(time.Minute) // the signal ends it
	}
	return 0
}

// logWatch records log records for a test to wait on.
type logWatch struct {
	mu      sync.Mutex
	records []slog.Record
	changed chan struct{} // closed and replaced on each record
}

func newLogWatch() *logWatch { return &logWatch{changed: make(chan struct{})} }

func (w *logWatch) logger() *slog.Logger {
	var h slog.Handler = logWatchHandler{w}
	if testing.Verbose() {
		h = slog.NewMultiHandler(h, slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(h)
}

// await returns once a record matching ok was logged (at most a minute,
// a fail-safe).
func (w *logWatch) await(t *testing.T, ok func(slog.Record) bool) {
	t.Helper()
	deadline := time.NewTimer(time.Minute)
	defer deadline.Stop()
	for seen := 0; ; {
		w.mu.Lock()
		recs, changed := w.records[seen:], w.changed
		seen = len(w.records)
		w.mu.Unlock()
		for _, r := range recs {
			if ok(r) {
				return
			}
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatal("the awaited log record did not come within a minute")
		}
	}
}

type logWatchHandler struct{ w *logWatch }

func (h logWatchHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h logWatchHandler) Handle(_ context.Context, r slog.Record) error {
	h.w.mu.Lock()
	defer h.w.mu.Unlock()
	h.w.records = append(h.w.records, r.Clone())
	close(h.w.changed)
	h.w.changed = make(chan struct{})
	return nil
}
func (h logWatchHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logWatchHandler) WithGroup(string) slog.Handler      { return h }

// attr returns the value of a record's attribute as text.
func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

// TestMCPRestartUnresponsiveConfig: RestartUnresponsiveAfter must not be
// negative; the sidecar's setting reaches an MCP server (stdio or URL),
// and an attached local connector still refuses it.
func TestMCPRestartUnresponsiveConfig(t *testing.T) {
	var ce *ConfigError
	if _, err := NewMCP(MCPConfig{Command: []string{"x"}, RestartUnresponsiveAfter: -1}); !errors.As(err, &ce) || ce.Field != "MCP.RestartUnresponsiveAfter" {
		t.Errorf("negative: %v", err)
	}
	for _, mc := range []MCPConfig{{Command: []string{"x"}}, {URL: "https://mcp.example.com/mcp"}} {
		s, err := newLocalSide(Config{MCP: mc, RestartUnresponsiveAfter: 3})
		if err != nil {
			t.Fatalf("%s: %v", mc.Command, err)
		}
		if got := s.mcp.cfg.RestartUnresponsiveAfter; got != 3 {
			t.Errorf("%s: MCP.RestartUnresponsiveAfter %d, want the sidecar's 3", s.mcp.Target(), got)
		}
		s.mcp.Close()
	}
	_, err := newLocalSide(Config{Local: LocalConfig{Socket: "/tmp/x.sock"}, RestartUnresponsiveAfter: 3})
	if !errors.As(err, &ce) || ce.Field != "RestartUnresponsiveAfter" {
		t.Errorf("attached: %v", err)
	}
}

// missingListConn fails the writes of tools/list requests, once armed, as
// an HTTP client does when the server no longer knows the session.
type missingListConn struct {
	mcp.Connection
	armed *atomic.Bool
}

func (c missingListConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if req, ok := msg.(*jsonrpc.Request); ok && req.Method == "tools/list" && c.armed.Load() {
		return fmt.Errorf("test: POST answered 404: %w", mcp.ErrSessionMissing)
	}
	return c.Connection.Write(ctx, msg)
}

// TestMCPToolListFindingTheSessionGoneReconnects: a tools/list that finds
// the session gone — the host asking for the manifest, or the sidecar
// checking the list after a list_changed notification — has the session
// re-established at once, as a call or a ping that finds it gone does,
// without waiting for the next health check (none runs here).
func TestMCPToolListFindingTheSessionGoneReconnects(t *testing.T) {
	for _, via := range []string{"manifest", "list_changed"} {
		t.Run(via, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ts := newTestMCPServer(t)
				rig := &severingRig{server: ts.server, conns: make(chan *severableConn, 4)}
				var armed atomic.Bool
				var first atomic.Bool
				first.Store(true)
				rig.wrap = func(c mcp.Connection) mcp.Connection {
					if first.Swap(false) {
						return missingListConn{c, &armed}
					}
					return c
				}
				m, _ := rig.start(t, MCPConfig{RestartBackoff: 250 * time.Millisecond})
				if _, err := m.Manifest(t.Context(), hostsdk.TenantContext{}); err != nil {
					t.Fatal(err)
				}
				armed.Store(true)
				switch via {
				case "manifest":
					if _, err := m.Manifest(t.Context(), hostsdk.TenantContext{}); !errors.Is(err, mcp.ErrSessionMissing) {
						t.Fatalf("Manifest on a missing session: %v; want ErrSessionMissing", err)
					}
				case "list_changed":
					ts.server.AddTool(&mcp.Tool{Name: "late", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
						return &mcp.CallToolResult{}, nil
					})
					time.Sleep(50 * time.Millisecond) // the server sends the notification 10 ms after the change
				}
				synctest.Wait()
				if st := m.snapshot(); st.Restarts != 1 || st.Running || !strings.Contains(st.LastExit, "tools/list") {
					t.Fatalf("after tools/list found the session missing: status %+v; want the session taken down, saying why", st)
				}
				rig.await(t, m, 2)
				if _, err := m.Manifest(t.Context(), hostsdk.TenantContext{}); err != nil {
					t.Errorf("Manifest on the new session: %v", err)
				}
			})
		})
	}
}

// toolCall is the Call the host makes of an action of MCP tool tool: its
// capability from the manifest man (which says whether it only reads).
func toolCall(t testing.TB, man *aip.Manifest, tool, input string) *hostsdk.Call {
	t.Helper()
	for i := range man.Capabilities {
		if c := &man.Capabilities[i]; c.ID == "mcp."+tool {
			return &hostsdk.Call{Action: act(c.ID, input), Capability: c, Logger: slog.New(slog.DiscardHandler)}
		}
	}
	t.Fatalf("the manifest has no capability mcp.%s", tool)
	return nil
}

// connectRestartingStdioMCP connects a bridge to the test's stdio MCP
// server (env added to its environment) that restarts it after 2
// unanswered pings, with a 200 ms stop timeout; it returns the bridge
// (closed when the test ends), its log and its manifest.
func connectRestartingStdioMCP(t *testing.T, env ...string) (*MCP, *logWatch, *aip.Manifest) {
	t.Helper()
	logs := newLogWatch()
	m, err := NewMCP(MCPConfig{
		Command: []string{os.Args[0], "-test.run=^$"},
		// With -race, exiting would take a second: more than StopTimeout.
		Env:                      append([]string{envMCPChild + "=1", "GORACE=atexit_sleep_ms=0"}, env...),
		RestartUnresponsiveAfter: 2, StopTimeout: 200 * time.Millisecond, RestartBackoff: 10 * time.Millisecond,
		Logger: logs.logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	ctx := ctxT(t)
	if err := m.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	man, err := m.Manifest(ctx, hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	return m, logs, man
}

// TestMCPBusyServerFinishesItsCall: a stdio server that cannot answer a
// ping while it runs a tool (one message at a time; here its pings wait
// for the tool) is not taken as hung in the middle of the call: it is not
// stopped, and the call completes. With RestartUnresponsiveAfter 2 its
// unanswered pings counted, calls in flight or not, and the server was
// killed during the call, which ended outcome_unknown.
func TestMCPBusyServerFinishesItsCall(t *testing.T) {
	m, _, man := connectRestartingStdioMCP(t)
	ctx := ctxT(t)
	first := m.snapshot()
	type outcome struct {
		res *aip.ActionResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := m.Handle(ctx, toolCall(t, man, "busy", `{"delay_ms":2000}`))
		done <- outcome{res, err}
	}()
	unanswered := 0
	var o outcome
	for got := false; !got; {
		select {
		case o = <-done:
			got = true
		default:
			pctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			if m.CheckHealth(pctx) != nil {
				unanswered++
			}
			cancel()
			<-pctx.Done() // one check per 100 ms, as heartbeats would, only faster
		}
	}
	if o.err != nil || o.res.Status != aip.ResultCompleted {
		t.Fatalf("the call to the busy server: %+v, %v; want it completed", o.res, o.err)
	}
	if unanswered < 3 {
		t.Fatalf("only %d pings went unanswered during the call; the test needs more than RestartUnresponsiveAfter", unanswered)
	}
	if st := m.snapshot(); st.Restarts != 0 || st.PID != first.PID {
		t.Fatalf("the busy server was restarted during its call: %+v", st)
	}
	if err := m.CheckHealth(ctx); err != nil {
		t.Errorf("the server, idle again: %v", err)
	}
}

// TestMCPBusySessionIsNotTakenAsHung: a ping left unanswered while a tool
// call on the session is in progress and within its deadline neither
// counts nor ends the row; once the call ended (or its deadline passed)
// pings count again. Calls on another session do not hold back the
// session's count.
func TestMCPBusySessionIsNotTakenAsHung(t *testing.T) {
	m, err := NewMCP(MCPConfig{Transport: func() mcp.Transport { return refusedTransport{} }, RestartUnresponsiveAfter: 2})
	if err != nil {
		t.Fatal(err)
	}
	sess := new(mcp.ClientSession)
	m.sess, m.working = sess, new(atomic.Int64)
	noAnswer := fmt.Errorf("no answer before the health check's deadline: %w", context.DeadlineExceeded)
	down := func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return m.downSess == sess
	}

	m.noteUnanswered(t.Context(), sess, noAnswer) // one before the call
	callCtx, cancel := context.WithCancel(t.Context())
	end := trackWork(callCtx, m.working)
	for range 10 {
		m.noteUnanswered(t.Context(), sess, noAnswer)
	}
	if down() {
		t.Fatal("the session was taken down while a call was in progress")
	}
	cancel() // its deadline passed (or it was cancelled)
	for m.working.Load() != 0 {
		time.Sleep(time.Millisecond) // polling for context.AfterFunc's goroutine
	}
	m.noteUnanswered(t.Context(), sess, noAnswer)
	if !down() {
		t.Fatal("the session was not taken down: the ping before the call and the one after its deadline are two in a row")
	}
	end()
	end() // idempotent, also after the deadline
	if n := m.working.Load(); n != 0 {
		t.Fatalf("working = %d after the call", n)
	}

	// A call still waiting on an old session (an HTTP session re-opened)
	// does not hold back the new session's count.
	old := m.working
	defer trackWork(t.Context(), old)()
	next := new(mcp.ClientSession)
	m.mu.Lock()
	m.sess, m.working, m.downSess, m.unanswered = next, new(atomic.Int64), nil, 0
	m.mu.Unlock()
	m.noteUnanswered(t.Context(), next, noAnswer)
	m.noteUnanswered(t.Context(), next, noAnswer)
	m.mu.Lock()
	taken := m.downSess == next
	m.mu.Unlock()
	if !taken {
		t.Fatal("the new session was not taken down after two unanswered pings: a call on the old one held back its count")
	}
}

// TestMCPServerErrorCodesFailOnlyTheirCall: a stdio server that answers a
// tools/call with a JSON-RPC error of its own in the range JSON-RPC leaves
// to implementations (-32000..-32099) fails that call alone, with the
// server's code and message: the session stays up (the server is not
// restarted), a call in flight beside it completes, and later calls work.
// The go-sdk takes -32003 and -32004 (its own "client is closing" and
// "server is closing") for the connection's end and reported them as
// mcp.ErrConnectionClosed, so the bridge took the session down, killing
// the server and every call on it, and the call itself ended
// connector_host.interrupted or outcome_unknown without the server's code.
// A ping answered with such an error is an answer: the server is not
// restarted for it either.
func TestMCPServerErrorCodesFailOnlyTheirCall(t *testing.T) {
	m, _, man := connectRestartingStdioMCP(t)
	ctx := ctxT(t)
	first := m.snapshot()
	beside := make(chan error, 1)
	go func() {
		res, err := m.Handle(ctx, toolCall(t, man, "busy", `{"delay_ms":300}`))
		if err == nil && res.Status != aip.ResultCompleted {
			err = fmt.Errorf("status %s", res.Status)
		}
		beside <- err
	}()
	for _, code := range []int64{-32003, -32004, -32000, -32099} {
		input := fmt.Sprintf(`{"code":%d,"message":"the server's own error %d"}`, code, code)
		_, err := m.Handle(ctx, toolCall(t, man, "rpc_error", input))
		var pe *aip.ProtocolError
		if !errors.As(err, &pe) || pe.Code != CodeMCPError || pe.Message != fmt.Sprintf("the server's own error %d", code) ||
			!strings.Contains(string(pe.Details), fmt.Sprintf(`"jsonrpc_code":%d`, code)) {
			t.Errorf("read-only tool answered JSON-RPC error %d: %v; want %s with the server's message and code", code, err, CodeMCPError)
		}
		_, err = m.Handle(ctx, toolCall(t, man, "rpc_error_rw", input))
		if !errors.Is(err, hostsdk.ErrOutcomeUnknown) || !strings.Contains(err.Error(), fmt.Sprintf("the server's own error %d", code)) {
			t.Errorf("tool answered JSON-RPC error %d: %v; want outcome unknown with the server's message", code, err)
		}
	}
	if err := <-beside; err != nil {
		t.Errorf("the call in flight beside them: %v; want it completed", err)
	}
	if err := m.CheckHealth(ctx); err != nil {
		t.Errorf("health after the error answers: %v", err)
	}
	if _, err := m.Handle(ctx, toolCall(t, man, "lookup", `{}`)); err != nil {
		t.Errorf("a later call: %v", err)
	}
	if st := m.snapshot(); st.Restarts != 0 || st.PID != first.PID {
		t.Errorf("the session was taken down for a call's error answer: %+v", st)
	}

	// A ping answered -32004: the replica is unhealthy (the server
	// answered with an error), the server is not restarted.
	m2, _, _ := connectRestartingStdioMCP(t, envMCPPingError+"=-32004")
	before := m2.snapshot()
	for i := range 3 {
		if err := m2.CheckHealth(ctx); err == nil || !strings.Contains(err.Error(), "the server refuses pings") {
			t.Errorf("health check %d: %v; want the server's error answer", i+1, err)
		}
	}
	time.Sleep(100 * time.Millisecond) // a reconnect the checks requested would have begun
	if st := m2.snapshot(); st.Restarts != 0 || st.PID != before.PID {
		t.Errorf("the session was taken down for a ping's error answer: %+v", st)
	}
}

// TestMCPHTTPServerErrorCodesFailOnlyTheirCall is
// TestMCPServerErrorCodesFailOnlyTheirCall over Streamable HTTP (--mcp-url),
// with answers in JSON and in SSE: a server's JSON-RPC error answer
// -32003 or -32004 to a tools/call fails that call alone, with the
// server's code and message, and a ping answered so is an answer. The
// go-sdk takes these codes for the connection's end (mcp.ErrConnectionClosed)
// and the wrapper that keeps them from it on stdio cannot wrap the HTTP
// connection (the SDK tells its HTTP connection the negotiated session
// through an unexported method a wrapper hides), so a call answered so
// took the session down: a new session was opened, and the call ended
// interrupted or outcome_unknown without the server's code.
func TestMCPHTTPServerErrorCodesFailOnlyTheirCall(t *testing.T) {
	for _, jsonResponse := range []bool{false, true} {
		t.Run(fmt.Sprintf("JSONResponse=%v", jsonResponse), func(t *testing.T) {
			ts := newTestMCPServer(t)
			rpcError := func(_ context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				var in struct {
					Code    int64           `json:"code"`
					Message string          `json:"message"`
					Data    json.RawMessage `json:"data"`
				}
				json.Unmarshal(req.Params.Arguments, &in)
				return nil, &jsonrpc.Error{Code: in.Code, Message: in.Message, Data: in.Data}
			}
			ts.server.AddTool(&mcp.Tool{Name: "rpc_error", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, rpcError)
			ts.server.AddTool(&mcp.Tool{Name: "rpc_error_rw", InputSchema: objectSchema}, rpcError)
			var pingCode atomic.Int64
			ts.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
				return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
					if code := pingCode.Load(); method == "ping" && code != 0 {
						return nil, &jsonrpc.Error{Code: code, Message: "the server refuses pings"}
					}
					return next(ctx, method, req)
				}
			})
			srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ts.server },
				&mcp.StreamableHTTPOptions{JSONResponse: jsonResponse}))
			m, _ := connectHTTPMCP(t, ts, srv)
			ctx := ctxT(t)
			man, err := m.Manifest(ctx, hostsdk.TenantContext{})
			if err != nil {
				t.Fatal(err)
			}
			for _, code := range []int64{-32003, -32004, -32000} {
				input := fmt.Sprintf(`{"code":%d,"message":"the server's own error %d","data":{"n":1}}`, code, code)
				_, err := m.Handle(ctx, toolCall(t, man, "rpc_error", input))
				var pe *aip.ProtocolError
				if !errors.As(err, &pe) || pe.Code != CodeMCPError || pe.Message != fmt.Sprintf("the server's own error %d", code) ||
					!strings.Contains(string(pe.Details), fmt.Sprintf(`"jsonrpc_code":%d`, code)) {
					t.Errorf("read-only tool answered JSON-RPC error %d: %v; want %s with the server's message and code", code, err, CodeMCPError)
				}
				_, err = m.Handle(ctx, toolCall(t, man, "rpc_error_rw", input))
				if !errors.Is(err, hostsdk.ErrOutcomeUnknown) || !strings.Contains(err.Error(), fmt.Sprintf("the server's own error %d", code)) {
					t.Errorf("tool answered JSON-RPC error %d: %v; want outcome unknown with the server's message", code, err)
				}
				if res, err := m.Handle(ctx, toolCall(t, man, "lookup", `{"word":"x"}`)); err != nil || res.Status != aip.ResultCompleted {
					t.Errorf("a call after the error answer %d: %+v %v", code, res, err)
				}
			}
			pingCode.Store(-32004)
			for i := range 2 {
				if err := m.CheckHealth(ctx); err == nil || !strings.Contains(err.Error(), "the server refuses pings") {
					t.Errorf("health check %d with pings answered -32004: %v; want the server's error answer", i+1, err)
				}
			}
			pingCode.Store(0)
			if err := m.CheckHealth(ctx); err != nil {
				t.Errorf("health after the error answers: %v", err)
			}
			time.Sleep(100 * time.Millisecond) // a reconnect requested would have begun
			if st := m.snapshot(); st.Restarts != 0 || st.Starts != 1 {
				t.Errorf("the session was taken down for an error answer: %+v", st)
			}
		})
	}
}
