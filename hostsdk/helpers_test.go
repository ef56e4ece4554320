package hostsdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const (
	capEcho   = "test.echo"
	capBlock  = "test.block"
	capStream = "test.stream"
)

// testConnector is a small connector for the host's tests: test.echo echoes
// {"message"} and counts runs per action ID; test.block blocks until
// released or cancelled; test.stream sends n chunks.
type testConnector struct {
	agentID     string
	manifestErr error
	healthErr   atomic.Pointer[error]
	runs        sync.Map // action ID -> *atomic.Int64
	started     chan string
	release     chan struct{}
	reconcile   func(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error)
	cancels     atomic.Int64
	probeDelay  atomic.Int64 // nanoseconds CheckHealth takes
	causes      sync.Map     // action ID -> context.Cause of a test.block's cancelled ctx
}

func newTestConnector() *testConnector {
	return &testConnector{agentID: "agent:test-connector", started: make(chan string, 64), release: make(chan struct{})}
}

func (c *testConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	if c.manifestErr != nil {
		return nil, c.manifestErr
	}
	contract := &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{"write"},
		Idempotency: aip.IdempotencyContract{Requirement: "required", CollisionBehavior: "return_original_result", KeyScope: "action"},
		Execution: aip.ExecutionContract{SupportsSync: true, SupportsStreaming: true, SupportsCancel: true,
			ExpectedCompletion: "any", RetrySafety: "safe_with_idempotency_key"},
		Data: aip.DataContract{Sensitivity: "internal"},
	}
	schema := json.RawMessage(`{"type":"object","properties":{"message":{"type":"string"},"n":{"type":"integer"}},"required":["message"],"additionalProperties":false}`)
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: c.agentID, Kind: aip.PrincipalAgent},
		Profiles:        []string{aip.NativeHTTPProfile},
		Channels:        []json.RawMessage{json.RawMessage(`"test.events"`)},
		Capabilities: []aip.Capability{
			{ID: capEcho, Name: "Echo", Kind: aip.KindTool, InputSchema: schema,
				OutputSchema: json.RawMessage(`{"type":"object","required":["message","runs"]}`), Contract: contract},
			{ID: capBlock, Name: "Block", Kind: aip.KindTool, InputSchema: schema, Contract: contract},
			{ID: capStream, Name: "Stream", Kind: aip.KindTool, InputSchema: schema, Contract: contract},
		},
	}, nil
}

func (c *testConnector) runCount(actionID string) int64 {
	v, ok := c.runs.Load(actionID)
	if !ok {
		return 0
	}
	return v.(*atomic.Int64).Load()
}

func (c *testConnector) countRun(actionID string) int64 {
	v, _ := c.runs.LoadOrStore(actionID, new(atomic.Int64))
	return v.(*atomic.Int64).Add(1)
}

type testInput struct {
	Message string `json:"message"`
	N       int    `json:"n"`
}

func (c *testConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in testInput
	if err := json.Unmarshal(call.Action.Input, &in); err != nil {
		return nil, err
	}
	runs := c.countRun(call.Action.ID)
	switch call.Action.CapabilityID {
	case capBlock:
		c.started <- call.Action.ID
		select {
		case <-c.release:
		case <-ctx.Done():
			c.causes.Store(call.Action.ID, context.Cause(ctx))
			return nil, ctx.Err()
		}
	case capEcho:
		if in.Message == "fail" {
			return nil, aip.NewProtocolError("test.failed", aip.CategoryConnector, false, 0, "asked to fail")
		}
		if in.Message == "unknown" {
			return nil, fmt.Errorf("provider timed out: %w", hostsdk.ErrOutcomeUnknown)
		}
		if in.Message == "bad-output" {
			return call.Complete(map[string]any{"nope": true})
		}
		if in.Message == "huge-output" {
			return call.Complete(map[string]any{"message": strings.Repeat("x", aip.MaxMessageBytes), "runs": runs})
		}
	}
	return call.Complete(map[string]any{"message": in.Message, "runs": runs, "tenant": call.Action.Identity.Tenant.ID})
}

func (c *testConnector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	var in testInput
	if err := json.Unmarshal(call.Action.Input, &in); err != nil {
		return nil, err
	}
	c.countRun(call.Action.ID)
	for i := range in.N {
		if err := chunks.Send(aip.ChunkProgress, map[string]int{"step": i}); err != nil {
			return nil, err
		}
	}
	return call.Complete(map[string]any{"message": in.Message, "chunks": chunks.Sent()})
}

func (c *testConnector) CheckHealth(ctx context.Context) error {
	if d := time.Duration(c.probeDelay.Load()); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if p := c.healthErr.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *testConnector) setHealth(err error) {
	if err == nil {
		c.healthErr.Store(nil)
		return
	}
	c.healthErr.Store(&err)
}

func (c *testConnector) Cancel(ctx context.Context, call *hostsdk.Call, reason string) error {
	c.cancels.Add(1)
	return nil
}

// reconcilingConnector adds a Reconciler.
type reconcilingConnector struct{ *testConnector }

func (c reconcilingConnector) Reconcile(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	return c.reconcile(ctx, a)
}

// fleet is a control plane, a dispatcher and a host config for one test.
type fleet struct {
	cp  *hostsdktest.ControlPlane
	d   *hostsdktest.Dispatcher
	cfg hostsdk.Config
	j   *memjournal.Journal
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)
	j := memjournal.New()
	cfg.Journal = j
	return &fleet{cp: cp, d: d, cfg: cfg, j: j}
}

func (f *fleet) start(t *testing.T, conn hostsdk.Connector) (*hostsdk.Host, hostsdktest.Target) {
	t.Helper()
	h := hostsdktest.StartHost(t, f.cfg, conn)
	return h, hostsdktest.TargetOf(h, f.cfg)
}

func action(capID string, input string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: capID, Input: json.RawMessage(input)}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func wantCode(t *testing.T, resp *hostsdktest.Response, status int, code string) *aip.ProtocolError {
	t.Helper()
	if resp.Status != status {
		t.Fatalf("HTTP status %d, want %d (body %s)", resp.Status, status, resp.Raw)
	}
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != code {
		t.Fatalf("error %+v, want code %s (body %s)", pe, code, resp.Raw)
	}
	return pe
}

func ops(cp *hostsdktest.ControlPlane) []aip.Operation {
	var out []aip.Operation
	for _, o := range cp.Operations() {
		out = append(out, o.Op)
	}
	return out
}

var errUnhealthy = errors.New("provider unreachable")

// scrapeMetric reads one sample ("name" or `name{label="v"}`) from the
// /metrics of the host behind client (a hostsdktest.MemListener's); ok is
// false when it is absent.
func scrapeMetric(t *testing.T, client *http.Client, sample string) (v float64, ok bool) {
	t.Helper()
	resp, err := client.Get("http://127.0.0.1:9/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	page, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(page), "\n") {
		if s, found := strings.CutPrefix(line, sample+" "); found {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v, true
		}
	}
	return 0, false
}

// signedAction is the action envelope d would send target for a, signed.
func signedAction(t *testing.T, d *hostsdktest.Dispatcher, target hostsdktest.Target, a *aip.Action) []byte {
	t.Helper()
	env, err := d.Envelope(target, aip.Body{Action: a}, d.Route(target, a.ID, a.CapabilityID, a.Mode))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// postRaw posts the signed message raw to target with client and returns
// the response with its body unread (the caller closes it).
func postRaw(t *testing.T, ctx context.Context, client *http.Client, target hostsdktest.Target, raw []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.Endpoint, bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}
