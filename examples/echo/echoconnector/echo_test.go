package echoconnector

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func output(t *testing.T, resp *hostsdktest.Response) (*aip.ActionResult, Output) {
	t.Helper()
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	var out Output
	if len(res.Output) > 0 {
		if err := json.Unmarshal(res.Output, &out); err != nil {
			t.Fatal(err)
		}
	}
	return res, out
}

func say(message string, extra string) *aip.Action {
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: CapSay,
		Input: json.RawMessage(`{"message":` + quote(message) + extra + `}`)}
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

func newEcho(t testing.TB) (*hostsdktest.ControlPlane, *hostsdktest.Dispatcher, *hostsdk.Host, hostsdktest.Target) {
	return newEchoWith(t, nil)
}

func newEchoWith(t testing.TB, edit func(*hostsdk.Config)) (*hostsdktest.ControlPlane, *hostsdktest.Dispatcher, *hostsdk.Host, hostsdktest.Target) {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil) // embedded SQLite journal in a temp dir
	if edit != nil {
		edit(&cfg)
	}
	h := hostsdktest.StartHost(t, cfg, Connector{})
	return cp, d, h, hostsdktest.TargetOf(h, cfg)
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func TestSayCountsOneSideEffect(t *testing.T) {
	_, d, _, target := newEcho(t)
	ctx := ctxT(t)
	a := say("hello", "")
	res, out := output(t, must(d.Act(ctx, target, a)))
	if res.Status != aip.ResultCompleted || (out.Message == nil || *out.Message != "hello") || out.SideEffects != 1 || res.Receipt == nil {
		t.Fatalf("result %+v output %+v", res, out)
	}
	// The same action again, in new messages: journaled, never re-run.
	for range 3 {
		_, again := output(t, must(d.Act(ctx, target, a)))
		if again.SideEffects != 1 {
			t.Fatalf("side effects %d after a duplicate delivery", again.SideEffects)
		}
	}
	st, _, err := d.Status(ctx, target, a.ID, CapSay)
	if err != nil || st.State != aip.StateCompleted {
		t.Fatalf("status %+v, %v", st, err)
	}
}

func TestSayRejectsInvalidInput(t *testing.T) {
	_, d, _, target := newEcho(t)
	resp := must(d.Act(ctxT(t), target, &aip.Action{ID: aip.NewActionID(), CapabilityID: CapSay, Input: json.RawMessage(`{"msg":"x"}`)}))
	if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
		t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
	}
}

func TestStream(t *testing.T) {
	_, d, _, target := newEcho(t)
	a := &aip.Action{ID: aip.NewActionID(), CapabilityID: CapStream, Mode: aip.ModeStreaming,
		Input: json.RawMessage(`{"message":"tick","chunks":5}`)}
	resp := must(d.Act(ctxT(t), target, a))
	if len(resp.Chunks) != 5 {
		t.Fatalf("%d chunks: %s", len(resp.Chunks), resp.Raw)
	}
	for i, c := range resp.Chunks {
		var data struct{ Index, Of int }
		json.Unmarshal(c.Data, &data)
		if c.Sequence != uint64(i) || data.Index != i || data.Of != 5 {
			t.Errorf("chunk %d: %+v %s", i, c, c.Data)
		}
	}
	if _, out := output(t, resp); out.Chunks != 5 || out.SideEffects != 1 {
		t.Errorf("final output %+v", out)
	}
}

func TestCancelDuringDelay(t *testing.T) {
	_, d, _, target := newEcho(t)
	ctx := ctxT(t)
	a := say("slow", `,"delay_ms":60000`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(d.Act(ctx, target, a)) }()
	// Wait until the action runs (the journal says so), then cancel it.
	for {
		st, _, err := d.Status(ctx, target, a.ID, CapSay)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == aip.StateRunning {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling a real server for a state change
	}
	res, _ := output(t, must(d.Cancel(ctx, target, a.ID, CapSay, "test")))
	if res.Status != aip.ResultCancelled {
		t.Fatalf("cancel answered %+v", res)
	}
	if res, _ := output(t, <-done); res.Status != aip.ResultCancelled {
		t.Fatalf("the action answered %+v", res)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestOutputJSON: each output shape marshals to the bytes of the JSON
// object with sorted keys that the handlers produced before Output existed
// (an empty message included, absent fields left out), and validates
// against the capabilities' output schema.
func TestOutputJSON(t *testing.T) {
	empty, msg := "", "hi"
	cases := []struct {
		name string
		out  Output
		want map[string]any
	}{
		{"say", Output{Message: &msg, SideEffects: 1}, map[string]any{"message": "hi", "side_effects": 1}},
		{"say empty message", Output{Message: &empty, SideEffects: 1}, map[string]any{"message": "", "side_effects": 1}},
		{"stream", Output{Message: &msg, SideEffects: 2, Chunks: 3}, map[string]any{"message": "hi", "side_effects": 2, "chunks": 3}},
		{"reconciled", Output{SideEffects: 1, Reconciled: true}, map[string]any{"side_effects": 1, "reconciled": true}},
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(outputSchema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("urn:echo:output", doc); err != nil {
		t.Fatal(err)
	}
	schema, err := c.Compile("urn:echo:output")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		got, err := json.Marshal(tc.out)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(tc.want)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: %s, want %s", tc.name, got, want)
		}
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(got))
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(v); err != nil {
			t.Errorf("%s: %s does not validate: %v", tc.name, got, err)
		}
	}
	// The schema is not vacuous: an output without side_effects fails.
	v, _ := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(`{"message":"hi"}`)))
	if schema.Validate(v) == nil {
		t.Error("an output without side_effects validated")
	}
}
