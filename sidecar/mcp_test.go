package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

func boolp(b bool) *bool { return &b }

var objectSchema = json.RawMessage(`{"type":"object"}`)

// testMCPServer is an in-process MCP server reached over in-memory
// transports: one server session per connection.
type testMCPServer struct {
	server *mcp.Server
	mu     sync.Mutex
	sess   []*mcp.ServerSession
	// cancelled receives the names of calls whose context the server saw
	// cancelled (an MCP cancel arrived).
	cancelled chan string
	started   chan string
	// down refuses new connections (a server that is not back yet).
	down atomic.Bool
}

// refusedTransport fails to connect.
type refusedTransport struct{}

func (refusedTransport) Connect(context.Context) (mcp.Connection, error) {
	return nil, errors.New("test: connection refused")
}

func newTestMCPServer(t *testing.T) *testMCPServer {
	t.Helper()
	ts := &testMCPServer{
		server:    mcp.NewServer(&mcp.Implementation{Name: "test-server", Title: "Test server", Version: "1.0"}, nil),
		cancelled: make(chan string, 16), started: make(chan string, 16),
	}
	text := func(s string) *mcp.CallToolResult {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
	}
	ts.server.AddTool(&mcp.Tool{Name: "lookup", Description: "Looks up a word", InputSchema: json.RawMessage(
		`{"type":"object","properties":{"word":{"type":"string"}},"required":["word"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, Title: "Look up"}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var in struct{ Word string }
			json.Unmarshal(req.Params.Arguments, &in)
			return text("definition of " + in.Word + " (" + req.Params.Meta[MetaActionID].(string) + ")"), nil
		})
	ts.server.AddTool(&mcp.Tool{Name: "structured", InputSchema: objectSchema,
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"sum":{"type":"integer"}},"required":["sum"]}`),
		Annotations:  &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"sum":3}`}}, StructuredContent: map[string]int{"sum": 3}}, nil
		})
	ts.server.AddTool(&mcp.Tool{Name: "fail", InputSchema: objectSchema},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			r := text("the provider said no")
			r.IsError = true
			return r, nil
		})
	slow := func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		var in struct{ Steps int }
		json.Unmarshal(req.Params.Arguments, &in)
		ts.started <- req.Params.Name
		tok := req.Params.GetProgressToken()
		for i := 1; i <= in.Steps; i++ {
			if tok != nil {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: float64(in.Steps), Message: "step"})
			}
		}
		if in.Steps > 0 {
			return text("done"), nil
		}
		<-ctx.Done()
		ts.cancelled <- req.Params.Name
		return nil, ctx.Err()
	}
	ts.server.AddTool(&mcp.Tool{Name: "slow", InputSchema: objectSchema}, slow)
	ts.server.AddTool(&mcp.Tool{Name: "slow_ro", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}}, slow)
	return ts
}

// transport returns MCPConfig.Transport: each connection gets a fresh
// in-memory pair and server session.
func (ts *testMCPServer) transport(t *testing.T) func() mcp.Transport {
	return func() mcp.Transport {
		if ts.down.Load() {
			return refusedTransport{}
		}
		ct, st := mcp.NewInMemoryTransports()
		ss, err := ts.server.Connect(context.Background(), st, nil)
		if err != nil {
			t.Errorf("server connect: %v", err)
		}
		ts.mu.Lock()
		ts.sess = append(ts.sess, ss)
		ts.mu.Unlock()
		return ct
	}
}

// dropSessions closes the server side of every session (a crashed server).
func (ts *testMCPServer) dropSessions() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	for _, s := range ts.sess {
		s.Close()
	}
	ts.sess = nil
}

func mcpReplica(t *testing.T, edit func(*Config)) (*replica, *testMCPServer) {
	t.Helper()
	ts := newTestMCPServer(t)
	r := startReplica(t, func(c *Config) {
		c.MCP = MCPConfig{Transport: ts.transport(t), RestartBackoff: 20 * time.Millisecond}
		if testing.Verbose() {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
		}
		if edit != nil {
			edit(c)
		}
	})
	t.Cleanup(ts.dropSessions)
	return r, ts
}

func TestToolCapabilityMapping(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ann     *mcp.ToolAnnotations
		effects []aip.SideEffect
		risk    aip.Risk
		retry   aip.RetrySafety
	}{
		{"no annotations (MCP defaults: destructive, open world)", nil,
			[]aip.SideEffect{aip.EffectWrite, aip.EffectDelete, aip.EffectExternalNetwork}, aip.RiskHigh, aip.RetryUnsafe},
		{"read-only, closed world", &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)},
			[]aip.SideEffect{aip.EffectRead}, aip.RiskLow, aip.RetrySafe},
		{"additive idempotent", &mcp.ToolAnnotations{DestructiveHint: boolp(false), IdempotentHint: true, OpenWorldHint: boolp(false)},
			[]aip.SideEffect{aip.EffectWrite}, aip.RiskMedium, aip.RetrySafe},
		{"destructive idempotent", &mcp.ToolAnnotations{IdempotentHint: true},
			[]aip.SideEffect{aip.EffectWrite, aip.EffectDelete, aip.EffectExternalNetwork}, aip.RiskHigh, aip.RetrySafe},
		{"read-only open world", &mcp.ToolAnnotations{ReadOnlyHint: true},
			[]aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}, aip.RiskLow, aip.RetrySafe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, info, err := toolCapability("x.", &mcp.Tool{Name: "t", Annotations: tc.ann, InputSchema: map[string]any{"type": "object"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			ct := c.Contract
			if c.ID != "x.t" || c.Kind != aip.KindTool || c.Risk != tc.risk || ct.Execution.RetrySafety != tc.retry ||
				!ct.Execution.SupportsStreaming || !ct.Execution.SupportsCancel || ct.Execution.SupportsRetry != (tc.retry == aip.RetrySafe) {
				t.Errorf("capability %+v contract %+v", c, ct)
			}
			if diff := cmp.Diff(tc.effects, ct.SideEffects); diff != "" {
				t.Errorf("side effects (-want +got):\n%s", diff)
			}
			if info.readOnly != (tc.ann != nil && tc.ann.ReadOnlyHint) {
				t.Errorf("readOnly %v", info.readOnly)
			}
		})
	}
	if _, _, err := toolCapability("x.", &mcp.Tool{Name: "bad", InputSchema: []int{1}}); err == nil {
		t.Error("an array input schema was accepted")
	}
	if _, _, err := toolCapability("x.", &mcp.Tool{Name: "ref", InputSchema: map[string]any{"$ref": "https://example.com/s.json"}}); err == nil {
		t.Error("a schema with an external reference was accepted")
	}
	if _, _, err := toolCapability("x.", &mcp.Tool{Name: "out", InputSchema: map[string]any{"type": "object"},
		OutputSchema: map[string]any{"type": "objekt"}}); err == nil || !strings.Contains(err.Error(), "x.out output_schema") {
		t.Errorf("an output schema that does not compile: %v", err)
	}
}

func TestMCPManifest(t *testing.T) {
	r, _ := mcpReplica(t, func(c *Config) {
		c.MCP.CapabilityPrefix = "kb."
		c.MCP.Tools = []string{"lookup", "structured", "fail", "slow", "slow_ro"}
	})
	var m aip.Manifest
	getJSON(t, "http://"+r.s.Host().Addr().String()+hostsdk.PathManifest, &m)
	var ids []string
	for _, c := range m.Capabilities {
		ids = append(ids, c.ID)
	}
	if diff := cmp.Diff([]string{"kb.fail", "kb.lookup", "kb.slow", "kb.slow_ro", "kb.structured"}, ids); diff != "" {
		t.Errorf("capabilities (-want +got):\n%s", diff)
	}
	if m.Agent.ID != "agent:mcp:test-server" || m.Agent.DisplayName != "Test server (MCP)" {
		t.Errorf("agent %+v", m.Agent)
	}
	lookup, _ := m.Capability("kb.lookup")
	if lookup.Name != "Look up" || lookup.Description != "Looks up a word" || !strings.Contains(string(lookup.InputSchema), `"word"`) {
		t.Errorf("lookup %+v", lookup)
	}
}

func TestMCPActions(t *testing.T) {
	r, _ := mcpReplica(t, nil)
	ctx := ctxT(t)
	a := act("mcp.lookup", `{"word":"sidecar"}`)
	res, err := must(r.d.Act(ctx, r.target, a)).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	want := "definition of sidecar (" + a.ID + ")"
	if len(res.Message) != 1 || res.Message[0].Text != want || !strings.Contains(string(res.Output), want) {
		t.Errorf("result %+v output %s", res, res.Output)
	}
	res, err = must(r.d.Act(ctx, r.target, act("mcp.structured", `{}`))).Result()
	if err != nil || string(res.Output) != `{"sum":3}` {
		t.Errorf("structured: %+v %v", res, err)
	}
	res, err = must(r.d.Act(ctx, r.target, act("mcp.fail", `{}`))).Result()
	if err != nil || res.Status != aip.ResultFailed || res.Error.Code != CodeToolError || res.Error.Message != "the provider said no" {
		t.Errorf("fail: %+v %v", res, err)
	}
	// The input schema is the tool's: the host refuses what does not match.
	resp := must(r.d.Act(ctx, r.target, act("mcp.lookup", `{}`)))
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeInputInvalid {
		t.Errorf("invalid input: HTTP %d %s", resp.Status, resp.Raw)
	}
}

// TestMCPLargeTextResultFits: a tool's text blocks are the result's
// output and also its message; a result of a few MB of text that fits an
// answer once but not twice is completed with the text in its output
// alone. Carrying it twice made the host record the write's outcome as
// unknown although the tool had completed.
func TestMCPLargeTextResultFits(t *testing.T) {
	ts := newTestMCPServer(t)
	text := strings.Repeat("a", hostsdk.MaxResultBytes*5/8)
	ts.server.AddTool(&mcp.Tool{Name: "dump", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false)}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		})
	ts.server.AddTool(&mcp.Tool{Name: "dump_fail", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false)}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: true}, nil
		})
	r := startReplica(t, func(c *Config) { c.MCP = MCPConfig{Transport: ts.transport(t)} })
	t.Cleanup(ts.dropSessions)
	short := func(raw []byte) string { return aip.TruncateUTF8(string(raw), 300) }
	resp := must(r.d.Act(ctxT(t), r.target, act("mcp.dump", `{}`)))
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("a completed call with %d bytes of text: %v; HTTP %d %s", len(text), err, resp.Status, short(resp.Raw))
	}
	if len(res.Message) != 0 || !strings.Contains(string(res.Output), text) {
		t.Errorf("result: %d message parts, output %s", len(res.Message), short(res.Output))
	}
	resp = must(r.d.Act(ctxT(t), r.target, act("mcp.dump_fail", `{}`)))
	res, err = resp.Result()
	if err != nil || res.Status != aip.ResultFailed || res.Error.Code != CodeToolError || len(res.Message) != 0 || !strings.Contains(string(res.Error.Details), text) {
		t.Fatalf("an isError answer with %d bytes of text: %v; HTTP %d %s", len(text), err, resp.Status, short(resp.Raw))
	}
	// A small result keeps its message.
	res, err = must(r.d.Act(ctxT(t), r.target, act("mcp.lookup", `{"word":"x"}`))).Result()
	if err != nil || len(res.Message) != 1 {
		t.Errorf("a small result: %+v %v", res, err)
	}
}

func TestMCPProgressStreams(t *testing.T) {
	r, _ := mcpReplica(t, nil)
	a := act("mcp.slow", `{"steps":5}`)
	a.Mode = aip.ModeStreaming
	resp := must(r.d.Act(ctxT(t), r.target, a))
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	if len(resp.Chunks) != 5 {
		t.Fatalf("%d chunks: %s", len(resp.Chunks), resp.Raw)
	}
	for i, c := range resp.Chunks {
		var p struct {
			Progress, Total float64
			Message         string
		}
		json.Unmarshal(c.Data, &p)
		if c.Kind != aip.ChunkProgress || p.Progress != float64(i+1) || p.Total != 5 || p.Message != "step" {
			t.Errorf("chunk %d: %+v %s", i, c, c.Data)
		}
	}
	// The same tool in sync mode sends no progress token.
	res, err = must(r.d.Act(ctxT(t), r.target, act("mcp.slow", `{"steps":2}`))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("sync: %+v %v", res, err)
	}
}

func TestMCPCancel(t *testing.T) {
	r, ts := mcpReplica(t, nil)
	ctx := ctxT(t)
	for _, tc := range []struct {
		tool string
		// read-only tools end cancelled; others outcome_unknown (MCP does
		// not confirm what a cancelled call did)
		cancelled bool
	}{{"slow_ro", true}, {"slow", false}} {
		a := act("mcp."+tc.tool, `{}`)
		done := make(chan *hostsdktest.Response, 1)
		go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
		if got := <-ts.started; got != tc.tool {
			t.Fatalf("started %s", got)
		}
		cresp := must(r.d.Cancel(ctx, r.target, a.ID, a.CapabilityID, "stop"))
		if got := <-ts.cancelled; got != tc.tool {
			t.Errorf("the server saw %s cancelled", got)
		}
		resp := <-done
		if tc.cancelled {
			if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
				t.Errorf("%s: %+v %v", tc.tool, res, err)
			}
			if res, err := cresp.Result(); err != nil || res.Status != aip.ResultCancelled {
				t.Errorf("%s cancel answer: %+v %v", tc.tool, res, err)
			}
			continue
		}
		if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "notifications/cancelled") {
			t.Errorf("%s: HTTP %d %s", tc.tool, resp.Status, resp.Raw)
		}
	}
}

func TestMCPToolListChangeIsReported(t *testing.T) {
	r, ts := mcpReplica(t, nil)
	ctx := ctxT(t)
	ts.server.AddTool(&mcp.Tool{Name: "late", InputSchema: objectSchema}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{}, nil
	})
	ts.server.RemoveTools("fail")
	var change *ManifestChange
	for change == nil || len(change.Removed) == 0 {
		change = r.status(t).ManifestChange
		if ctx.Err() != nil {
			t.Fatal("the tool list change was not reported")
		}
		time.Sleep(5 * time.Millisecond) // the notification is handled asynchronously
	}
	if diff := cmp.Diff(&ManifestChange{Added: []string{"mcp.late"}, Removed: []string{"mcp.fail"}, DetectedAt: change.DetectedAt}, change); diff != "" {
		t.Errorf("change (-want +got):\n%s", diff)
	}
	// Not applied: the new tool is no capability of the admitted manifest.
	resp := must(r.d.Act(ctx, r.target, act("mcp.late", `{}`)))
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeRouteMismatch && pe.Code != hostsdk.CodeCapabilityUnknown {
		t.Errorf("a tool added after registration was callable: HTTP %d %s", resp.Status, resp.Raw)
	}
	// The default policy keeps the replica healthy.
	if err := r.s.Connector().(hostsdk.HealthChecker).CheckHealth(ctx); err != nil {
		t.Errorf("CheckHealth: %v", err)
	}
}

func TestMCPReconnects(t *testing.T) {
	r, ts := mcpReplica(t, func(c *Config) {
		c.Host.HeartbeatInterval, c.Host.LeaseTTL = 100*time.Millisecond, time.Second
	})
	ctx := ctxT(t)
	n := len(r.cp.Operations())
	ts.down.Store(true)
	ts.dropSessions()
	// The replica reports unhealthy while the server is away...
	if err := r.cp.Await(ctx, func(o []hostsdktest.Operation) bool {
		for _, op := range o[n:] {
			if op.Op == aip.OpHeartbeat && !op.ConnectorReady {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatal(err)
	}
	if st := r.status(t); st.Healthy || st.Process.Running {
		t.Errorf("status while the server is away: %+v", st)
	}
	// ... and re-registers once reconnected.
	n = len(r.cp.Operations())
	ts.down.Store(false)
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
	awaitReady(t, r)
	st := r.status(t)
	if st.Process == nil || st.Process.Starts < 2 || st.Process.Restarts < 1 {
		t.Errorf("status %+v", st.Process)
	}
	res, err := must(r.d.Act(ctx, r.target, act("mcp.lookup", `{"word":"again"}`))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("after reconnecting: %+v %v", res, err)
	}
}

func TestMCPReconcile(t *testing.T) {
	m, err := NewMCP(MCPConfig{Transport: func() mcp.Transport { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	m.tools = map[string]toolInfo{"mcp.ro": {name: "ro", readOnly: true}, "mcp.rw": {name: "rw"}}
	// The host's recovery fails a read-only tool's action failed
	// connector_host.interrupted when its reconciler cannot tell.
	if _, err := m.Reconcile(ctxT(t), &hostsdk.UncertainAction{Action: journalActionFor("act_1", "mcp.ro")}); !errors.Is(err, hostsdk.ErrOutcomeUnknown) {
		t.Errorf("read-only tool: %v", err)
	}
	if _, err := m.Reconcile(ctxT(t), &hostsdk.UncertainAction{Action: journalActionFor("act_2", "mcp.rw")}); !errors.Is(err, hostsdk.ErrOutcomeUnknown) {
		t.Errorf("writing tool: %v", err)
	}
	m.Close()
}

func TestMCPConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  MCPConfig
		want string
	}{
		{MCPConfig{}, "exactly one"},
		{MCPConfig{Command: []string{"x"}, URL: "https://example.com/mcp"}, "exactly one"},
		{MCPConfig{URL: "http://example.com/mcp"}, "loopback"},
		{MCPConfig{URL: "ftp://x/"}, "Streamable HTTP"},
		{MCPConfig{Command: []string{""}}, "empty program"},
		{MCPConfig{Command: []string{"x"}, OnManifestChange: "apply"}, "report or unready"},
		{MCPConfig{Command: []string{"x"}, ConnectTimeout: -time.Second}, "--start-timeout-ms (AIP_SIDECAR_START_TIMEOUT_MS, Config.MCP.ConnectTimeout) is -1s"},
		{MCPConfig{Command: []string{"x"}, StopTimeout: -time.Second}, "MCP.StopTimeout"},
		{MCPConfig{Command: []string{"x"}, MaxActionDuration: -time.Second}, "MCP.MaxActionDuration"},
		{MCPConfig{Command: []string{"x"}, RestartBackoff: -time.Second}, "MCP.RestartBackoff"},
		{MCPConfig{Command: []string{"x"}, MaxBackoff: -time.Second}, "MCP.MaxBackoff"},
		{MCPConfig{Command: []string{"x"}, StableAfter: -time.Second}, "MCP.StableAfter"},
	} {
		_, err := NewMCP(tc.cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewMCP(%+v) = %v; want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestMCPZeroTimeoutIsBoundedByMaxActionDuration: timeout_ms 0 sets no
// deadline in the host, so the tool call is bounded by MaxActionDuration
// like one without timeout_ms.
func TestMCPZeroTimeoutIsBoundedByMaxActionDuration(t *testing.T) {
	r, ts := mcpReplica(t, func(c *Config) { c.MCP.MaxActionDuration = 50 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // fail-safe only
	defer cancel()
	a := act("mcp.slow", `{}`)
	zero := uint64(0)
	a.TimeoutMS = &zero
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, _ := r.d.Act(ctx, r.target, a)
		done <- resp
	}()
	select {
	case got := <-ts.cancelled:
		if got != "slow" {
			t.Errorf("the server saw %s cancelled", got)
		}
	case <-ctx.Done():
		t.Fatal("the tool call was never cancelled: timeout_ms 0 left it unbounded")
	}
	if resp := <-done; resp == nil || resp.ProtocolError() == nil || resp.ProtocolError().Code != hostsdk.CodeOutcomeUnknown {
		t.Errorf("answer %+v", resp)
	}
}

// TestMCPReconnectBackoff: as a crashing --exec child is restarted, an MCP
// session that breaks is re-established with a backoff that doubles after
// every session shorter than StableAfter (up to MaxBackoff) and starts again
// from RestartBackoff only after a session that lasted StableAfter. Each
// case runs in a testing/synctest bubble: a session "lasts" on the bubble's
// clock, and the delay chosen is the bubble time between the break and the
// next connection attempt, exactly (no wall-clock measurement).
func TestMCPReconnectBackoff(t *testing.T) {
	const (
		initial    = 250 * time.Millisecond
		maxBackoff = 4 * time.Second
		stable     = time.Minute
	)
	for _, tc := range []struct {
		name string
		// lasted is how long each session lasts before it breaks; want
		// the nominal delay (±20 % jitter) before the next connection.
		lasted, want []time.Duration
	}{
		{"sessions that break at once double the delay up to MaxBackoff",
			[]time.Duration{0, 0, 0, 0, 0, 0},
			[]time.Duration{initial, 2 * initial, 4 * initial, 8 * initial, maxBackoff, maxBackoff}},
		{"a session that lasted StableAfter starts the backoff again",
			[]time.Duration{0, 0, 0, stable - time.Nanosecond, stable, 0},
			[]time.Duration{initial, 2 * initial, 4 * initial, 8 * initial, initial, 2 * initial}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rig := &severingRig{server: newTestMCPServer(t).server, conns: make(chan *severableConn, 4)}
				cfg := MCPConfig{RestartBackoff: initial, MaxBackoff: maxBackoff, StableAfter: stable}
				if testing.Verbose() {
					cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
				}
				m, conn := rig.start(t, cfg)
				var got []time.Duration
				for i, lasted := range tc.lasted {
					time.Sleep(lasted) // the session is up for this long (bubble time)
					broke := time.Now()
					conn.sever()
					conn = rig.await(t, m, i+2)
					got = append(got, conn.at.Sub(broke))
				}
				if err := m.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				for i, want := range tc.want {
					if lo, hi := want-want/5, want+want/5; got[i] < lo || got[i] > hi {
						t.Errorf("reconnect delays %v after sessions that lasted %v; delay %d is %v, want %v ±20%% (RestartBackoff %v doubling up to MaxBackoff %v, starting again after a session of StableAfter %v)",
							got, tc.lasted, i+1, got[i], want, initial, maxBackoff, stable)
						break
					}
				}
			})
		})
	}
}

// A reconnect attempt that fails moves the backoff one step, like a
// session that broke at once: the delays between attempts double once per
// attempt (the log line of a failed attempt used to draw a backoff of its
// own, so the delays grew fourfold and skipped steps).
func TestMCPReconnectBackoffAfterFailedAttempts(t *testing.T) {
	const initial, maxBackoff = 250 * time.Millisecond, 8 * time.Second
	synctest.Test(t, func(t *testing.T) {
		rig := &severingRig{server: newTestMCPServer(t).server, conns: make(chan *severableConn, 4)}
		m, conn := rig.start(t, MCPConfig{RestartBackoff: initial, MaxBackoff: maxBackoff, StableAfter: time.Minute})
		rig.refuse.Store(3)
		broke := time.Now()
		conn.sever()
		select {
		case <-rig.conns:
		case <-time.After(time.Hour):
			t.Fatal("the sidecar did not reconnect within an hour (bubble time)")
		}
		rig.mu.Lock()
		attempts := slices.Clone(rig.attempts)
		rig.mu.Unlock()
		if len(attempts) != 5 {
			t.Fatalf("%d connection attempts, want 5 (the first, 3 refused, 1 that connected)", len(attempts))
		}
		var got []time.Duration
		prev := broke
		for _, at := range attempts[1:] {
			got = append(got, at.Sub(prev))
			prev = at
		}
		for i, want := range []time.Duration{initial, 2 * initial, 4 * initial, 8 * initial} {
			if lo, hi := want-want/5, want+want/5; got[i] < lo || got[i] > hi {
				t.Fatalf("delays before the reconnect attempts %v; delay %d is %v, want %v ±20%% (doubling once per attempt from %v)",
					got, i+1, got[i], want, initial)
			}
		}
		if err := m.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// severingRig connects the sidecar to an in-process server over in-memory
// pipes and lets the test break a session from the client side: closing
// the client's connection fails its reads, so the session ends as when the
// server exits. The server's session then ends on its own (its pipe is
// closed): the test never calls ServerSession.Close, which on the
// in-memory transport waited for its reader for ever when sessions were
// broken as fast as they came up.
type severingRig struct {
	server *mcp.Server
	// conns receives each client connection as the sidecar opens it.
	conns chan *severableConn
	// refuse is how many of the next connection attempts fail.
	refuse atomic.Int32
	// wrap, when set, wraps each client connection.
	wrap func(mcp.Connection) mcp.Connection

	mu       sync.Mutex
	sessions []*mcp.ServerSession
	attempts []time.Time // when the sidecar tried to connect, refused or not
}

// severableConn is the client's end of one connection.
type severableConn struct {
	mcp.Connection
	at time.Time // when the sidecar connected
}

// sever breaks the session: the client's reads and writes fail from now on.
func (c *severableConn) sever() { c.Connection.Close() }

// transport returns MCPConfig.Transport.
func (r *severingRig) transport(t *testing.T) func() mcp.Transport {
	return func() mcp.Transport {
		r.mu.Lock()
		r.attempts = append(r.attempts, time.Now())
		r.mu.Unlock()
		if r.refuse.Load() > 0 {
			r.refuse.Add(-1)
			return refusedTransport{}
		}
		ct, st := mcp.NewInMemoryTransports()
		ss, err := r.server.Connect(context.Background(), st, nil)
		if err != nil {
			t.Errorf("server connect: %v", err)
			return refusedTransport{}
		}
		r.mu.Lock()
		r.sessions = append(r.sessions, ss)
		r.mu.Unlock()
		return severableTransport{ct, r.conns, r.wrap}
	}
}

type severableTransport struct {
	inner mcp.Transport
	conns chan<- *severableConn
	wrap  func(mcp.Connection) mcp.Connection
}

func (s severableTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := s.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	if s.wrap != nil {
		c = s.wrap(c)
	}
	sc := &severableConn{Connection: c, at: time.Now()}
	s.conns <- sc
	return sc, nil
}

// await returns the client connection of the sidecar's nth connection
// once its session is up. The bubble's clock bounds the wait: if the
// sidecar stops reconnecting, time jumps to the limit at once.
// start connects an MCP connector with cfg (its Transport set to the
// rig's) and returns it with the rig's first connection. The connector is
// closed, and the rig's server sessions awaited, when the test (or its
// testing/synctest bubble) ends, on t.Fatal too.
func (r *severingRig) start(t *testing.T, cfg MCPConfig) (*MCP, *severableConn) {
	t.Helper()
	cfg.Transport = r.transport(t)
	m, err := NewMCP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.awaitServerSessions)
	t.Cleanup(func() { m.Close() })
	if err := m.Connect(t.Context()); err != nil {
		t.Fatal(err)
	}
	return m, r.await(t, m, 1)
}

func (r *severingRig) await(t *testing.T, m *MCP, n int) *severableConn {
	t.Helper()
	select {
	case c := <-r.conns:
		synctest.Wait() // initialize and tools/list are over; the sidecar watches the session
		if st := m.snapshot(); st.Starts != n || !st.Running {
			t.Fatalf("after connection attempt %d: status %+v; want session %d up", n, st, n)
		}
		return c
	case <-time.After(time.Hour):
		t.Fatalf("the sidecar did not open connection %d within an hour (bubble time) of the last break", n)
	}
	return nil
}

// awaitServerSessions waits until every server session ended (their
// client closed). In the bubble, one that never ends makes synctest fail
// the test at once with a deadlock (every goroutine blocked), not hang.
func (r *severingRig) awaitServerSessions() {
	r.mu.Lock()
	sessions := r.sessions
	r.mu.Unlock()
	for _, ss := range sessions {
		ss.Wait()
	}
}

// TestMCPProgressKeepsTheLatest: when the dispatcher reads a streaming
// action more slowly than the server reports progress, the sidecar drops
// the oldest pending notifications, not the newest: the last chunk is the
// server's last progress.
func TestMCPProgressKeepsTheLatest(t *testing.T) {
	// Enough chunks to fill the loopback connection's buffers while the
	// reader pauses (a few MB), so that notifications queue up.
	const n = 20000
	ts := newTestMCPServer(t)
	sent := make(chan struct{})
	ts.server.AddTool(&mcp.Tool{Name: "burst", InputSchema: objectSchema, Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			tok := req.Params.GetProgressToken()
			for i := 1; i <= n; i++ {
				req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: n})
			}
			close(sent)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
		})
	r := startReplica(t, func(c *Config) { c.MCP = MCPConfig{Transport: ts.transport(t)} })
	t.Cleanup(ts.dropSessions)
	a := act("mcp.burst", `{}`)
	a.Mode = aip.ModeStreaming
	env, err := r.d.Envelope(r.target, aip.Body{Action: a}, r.d.Route(r.target, a.ID, a.CapabilityID, a.Mode))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := r.d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, r.target.Endpoint, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// A slow reader: nothing is read until the server sent everything, or
	// for 3 s. Not longer: a receiver that takes no line for the answer
	// write deadline (at least 10 s) has stopped reading, and the host
	// cuts the stream off (under -race on a loaded machine the 20000
	// notifications can take that long, and the test read a cut line).
	select {
	case <-sent:
	case <-time.After(3 * time.Second):
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, aip.MaxMessageBytes)
	var last *aip.StreamChunk
	var final *aip.ActionResult
	for sc.Scan() {
		var e aip.Envelope
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatal(err)
		}
		if e.Body.StreamChunk != nil {
			last = e.Body.StreamChunk
		}
		if e.Body.ActionResult != nil {
			final = e.Body.ActionResult
		}
	}
	if final == nil || final.Status != aip.ResultCompleted {
		t.Fatalf("final result %+v", final)
	}
	var p struct{ Progress, Total float64 }
	if last == nil || json.Unmarshal(last.Data, &p) != nil || p.Progress != n || p.Total != n {
		t.Errorf("last progress chunk %s; want the last progress %d/%d", last.Data, n, n)
	}
}

// TestMCPManifestIsBounded: discovery's tools/list is bounded by
// ConnectTimeout like the first one, so a server that stops answering
// after connecting fails the start instead of hanging it.
func TestMCPManifestIsBounded(t *testing.T) {
	ts := newTestMCPServer(t)
	var lists atomic.Int32
	release := make(chan struct{})
	defer close(release)
	ts.server.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "tools/list" && lists.Add(1) > 1 {
				select { // hangs from the second tools/list on
				case <-ctx.Done():
				case <-release:
				}
				return nil, ctx.Err()
			}
			return next(ctx, method, req)
		}
	})
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	s, err := New(Config{Host: hostsdktest.HostConfig(t, cp, d, nil),
		MCP: MCPConfig{Transport: ts.transport(t), ConnectTimeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer ts.dropSessions()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "tools/list") {
			t.Errorf("Run = %v; want the discovery's tools/list to fail", err)
		}
	case <-time.After(20 * time.Second): // fail-safe only
		cancel()
		<-errc
		t.Fatal("the start hung on an unanswered tools/list")
	}
}

// TestMCPTargetShowsNoCredentials: the target appears in logs, errors and
// the unauthenticated GET /sidecar/status, so a stdio server's arguments
// and a URL's query are left out.
func TestMCPTargetShowsNoCredentials(t *testing.T) {
	for _, tc := range []struct {
		cfg  MCPConfig
		want string
	}{
		{MCPConfig{Command: []string{"npx", "mcp-server", "--api-key", "s3cret"}}, "mcp+stdio:npx (3 arguments not shown)"},
		{MCPConfig{Command: []string{"/usr/local/bin/server"}}, "mcp+stdio:/usr/local/bin/server"},
		{MCPConfig{URL: "https://mcp.example.com/mcp?token=s3cret#frag"}, "https://mcp.example.com/mcp?(query not shown)"},
		{MCPConfig{URL: "http://127.0.0.1:9000/mcp"}, "http://127.0.0.1:9000/mcp"},
	} {
		m, err := NewMCP(tc.cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Target(); got != tc.want || strings.Contains(got, "s3cret") {
			t.Errorf("Target() = %q, want %q", got, tc.want)
		}
	}
	_, err := NewMCP(MCPConfig{URL: "http://mcp.example.com/mcp?token=s3cret"})
	if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("config error %v; want the loopback rule without the query", err)
	}
}

// TestMCPServerCrashDuringACall: a read-only tool call the server dropped
// (its session broke) had no effect and fails, as after a sidecar
// restart; any other tool's outcome is unknown.
func TestMCPServerCrashDuringACall(t *testing.T) {
	ctx := ctxT(t)
	for _, tool := range []string{"slow_ro", "slow"} {
		r, ts := mcpReplica(t, nil)
		a := act("mcp."+tool, `{}`)
		done := make(chan *hostsdktest.Response, 1)
		go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
		select {
		case got := <-ts.started:
			if got != tool {
				t.Fatalf("started %s", got)
			}
		case resp := <-done:
			t.Fatalf("%s did not start: HTTP %d %s", tool, resp.Status, resp.Raw)
		}
		ts.dropSessions()
		resp := <-done
		pe := resp.ProtocolError()
		if tool == "slow_ro" {
			res, err := resp.Result()
			if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInterrupted || !res.Error.IsRetryable() {
				t.Errorf("%s: HTTP %d %s; want failed %s, retryable", tool, resp.Status, resp.Raw, hostsdk.CodeInterrupted)
			}
			continue
		}
		if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
			t.Errorf("%s: HTTP %d %s; want outcome_unknown", tool, resp.Status, resp.Raw)
		}
	}
}

// TestMCPAllowListNamesUnknownTool: a tool in the allow-list (--mcp-tools)
// that the server does not offer fails the start with a setting error
// naming it and the tools the server offers, rather than starting the
// replica without it; a listed tool that cannot become a capability does
// too. The error starts with the setting, not with the host's bootstrap
// step.
func TestMCPAllowListNamesUnknownTool(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tools []string
		want  []string
	}{
		{"typo", []string{"lookup", "lookpu", "lookpu"}, []string{
			"--mcp-tools (AIP_SIDECAR_MCP_TOOLS, Config.MCP.Tools) names tools the MCP server",
			"does not offer: lookpu (its tools/list offers: broken, fail, lookup, slow, slow_ro, structured)"}},
		{"unusable", []string{"lookup", "broken"}, []string{
			"cannot become capabilities: broken (tool broken: ", "output_schema does not compile", "remove them from the list"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTestMCPServer(t)
			ts.server.AddTool(&mcp.Tool{Name: "broken", InputSchema: objectSchema, OutputSchema: map[string]any{"type": "objekt"}}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return &mcp.CallToolResult{}, nil
			})
			cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
			d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
			s, err := New(Config{Host: hostsdktest.HostConfig(t, cp, d, nil),
				MCP: MCPConfig{Transport: ts.transport(t), Tools: tc.tools}})
			if err != nil {
				t.Fatal(err)
			}
			defer ts.dropSessions()
			// Bounded: the old code started the replica and ran until ctx ended.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			err = s.Run(ctx)
			if !errors.Is(err, hostsdk.ErrSetting) {
				t.Errorf("Run = %v; want a setting error (exit status 2)", err)
			}
			// The setting first, not the host's bootstrap step it
			// failed (the text started "hostsdk: bootstrap step 3
			// (discover): --mcp-tools ...").
			if err == nil || !strings.HasPrefix(err.Error(), "--mcp-tools (AIP_SIDECAR_MCP_TOOLS, Config.MCP.Tools) names tools") {
				t.Errorf("Run = %v; want it to start with the setting", err)
			}
			var de *hostsdk.DiscoverError
			if !errors.As(err, &de) {
				t.Errorf("Run = %v; want it to still match *hostsdk.DiscoverError", err)
			}
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("Run = %v; want it to say %q", err, w)
				}
			}
			if n := len(cp.Operations()); n != 0 {
				t.Errorf("%d control-plane operations; want none (no registration)", n)
			}
		})
	}
}
