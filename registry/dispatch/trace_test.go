package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// spanTree indexes the ended spans of one trace.
type spanTree struct {
	byID     map[string]sdktrace.ReadOnlySpan
	children map[string][]sdktrace.ReadOnlySpan
	root     sdktrace.ReadOnlySpan
}

func traceOf(t *testing.T, spans []sdktrace.ReadOnlySpan, actionID string) *spanTree {
	t.Helper()
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == dispatch.SpanAction && attr(s, dispatch.AttrAction) == actionID {
			root = s
		}
	}
	if root == nil {
		t.Fatalf("no %s span for %s", dispatch.SpanAction, actionID)
	}
	tr := &spanTree{byID: map[string]sdktrace.ReadOnlySpan{}, children: map[string][]sdktrace.ReadOnlySpan{}, root: root}
	for _, s := range spans {
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			continue
		}
		tr.byID[s.SpanContext().SpanID().String()] = s
		tr.children[s.Parent().SpanID().String()] = append(tr.children[s.Parent().SpanID().String()], s)
	}
	return tr
}

func (tr *spanTree) kids(s sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range tr.children[s.SpanContext().SpanID().String()] {
		if c.Name() == name {
			out = append(out, c)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// TestOneTracePerAction checks the span tree of an action that is refused
// by one replica, rerouted and completed by another: the entry point's span
// is the root; admission, resolution, both hops, the reroute and the
// settlement are its children; each hop's child is the replica's ingress
// span, whose children are the connector's span and the journal's accept
// and finish spans.
func TestOneTracePerAction(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	w := newWorld(t, worldOptions{tracer: tp})
	busy := w.startHost(1, 8)
	spare := w.startHost(8, 8)
	blockerID := aip.NewActionID()
	var wg sync.WaitGroup
	wg.Go(func() {
		w.fake.Act(w.ctx, w.target(busy), &aip.Action{ID: blockerID, CapabilityID: capSay, Input: say("block", `,"delay_ms":60000`)})
	})
	defer wg.Wait()
	defer w.fake.Cancel(context.Background(), w.target(busy), blockerID, capSay, "test over")
	eventually(t, "the blocker to occupy the slot", func() bool { return w.busy(busy) })

	act := w.actionFavoring(busy.cfg.ReplicaID, busy.cfg.ReplicaID, spare.cfg.ReplicaID)
	status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("traced", "")})
	if status != http.StatusOK || resp.Route.ReplicaID != spare.cfg.ReplicaID {
		t.Fatalf("answer %d %+v", status, resp.Error)
	}
	var tr *spanTree
	eventually(t, "both replicas' spans", func() bool {
		tr = traceOf(t, rec.Ended(), act)
		sends := tr.kids(tr.root, dispatch.SpanSend)
		if len(sends) != 2 {
			return false
		}
		for _, s := range sends {
			if len(tr.kids(s, "hostsdk.message")) != 1 {
				return false
			}
		}
		return true
	})
	root := tr.root
	if root.Parent().IsValid() {
		t.Fatalf("the action span has a parent %v", root.Parent())
	}
	for key, want := range map[string]string{
		dispatch.AttrTenant: tenant, dispatch.AttrCapability: capSay, dispatch.AttrAction: act,
		dispatch.AttrReplica: spare.cfg.ReplicaID, dispatch.AttrOutcome: "completed",
	} {
		if got := attr(root, key); got != want {
			t.Errorf("action span %s = %q, want %q", key, got, want)
		}
	}
	for _, name := range []string{dispatch.SpanAdmission, dispatch.SpanResolve, dispatch.SpanReroute, dispatch.SpanSettle} {
		if n := len(tr.kids(root, name)); n != 1 {
			t.Errorf("%d %s spans under the action span, want 1", n, name)
		}
	}
	if got := attr(tr.kids(root, dispatch.SpanResolve)[0], dispatch.AttrReplica); got != busy.cfg.ReplicaID {
		t.Errorf("resolve span replica %q, want the first route's %s", got, busy.cfg.ReplicaID)
	}
	if got := attr(tr.kids(root, dispatch.SpanReroute)[0], dispatch.AttrReplica); got != spare.cfg.ReplicaID {
		t.Errorf("reroute span replica %q, want %s", got, spare.cfg.ReplicaID)
	}
	if got := attr(tr.kids(root, dispatch.SpanSettle)[0], dispatch.AttrOutcome); got != "completed" {
		t.Errorf("settle span outcome %q", got)
	}
	replicas := map[string]bool{}
	for _, send := range tr.kids(root, dispatch.SpanSend) {
		replicas[attr(send, dispatch.AttrReplica)] = true
		msg := tr.kids(send, "hostsdk.message")[0]
		if attr(msg, "aip.action_id") != act {
			t.Errorf("host span action %q", attr(msg, "aip.action_id"))
		}
		conn := tr.kids(msg, "hostsdk.action "+capSay)
		journaled := len(tr.kids(msg, "hostsdk.journal.accept")) + len(tr.kids(msg, "hostsdk.journal.finish"))
		switch attr(send, dispatch.AttrReplica) {
		case spare.cfg.ReplicaID:
			if len(conn) != 1 || attr(conn[0], "aip.action_id") != act {
				t.Errorf("the completing hop has %d connector spans", len(conn))
			}
			if journaled != 2 {
				t.Errorf("the completing hop has %d journal spans, want accept and finish", journaled)
			}
		case busy.cfg.ReplicaID:
			if len(conn) != 0 || journaled != 0 {
				t.Errorf("the refused hop ran the connector or journaled the action")
			}
		}
	}
	if !replicas[busy.cfg.ReplicaID] || !replicas[spare.cfg.ReplicaID] {
		t.Errorf("send spans went to %v", replicas)
	}
}

// TestCallerBaggageIsNotSigned: a caller's traceparent is continued into
// the envelope a replica gets, but not its baggage header. The baggage
// members are whatever the caller chose (a "tenant_id" among them): the
// gateway signed them into every hop's envelope, and the replica's
// context, and every instrumented client under it, carried them on as if
// the fleet had set them.
func TestCallerBaggageIsNotSigned(t *testing.T) {
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.MaxReroutes = -1 }})
	got := make(chan map[string]string, 1)
	key, _ := aip.GenerateSigningKey()
	id := w.fakeReplica(aip.NewID(aip.PrefixReplica), key, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		var env aip.Envelope
		if err := json.NewDecoder(r.Body).Decode(&env); err == nil {
			select {
			case got <- env.Trace:
			default:
			}
		}
		rw.WriteHeader(http.StatusServiceUnavailable)
	}))
	const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	raw, err := json.Marshal(dispatch.ActionRequest{ActionID: w.actionFavoring(id, id), CapabilityID: capSay, Input: say("x", "")})
	must(t, err)
	req, err := http.NewRequestWithContext(w.ctx, http.MethodPost, w.srv.URL+dispatch.PathActions, bytes.NewReader(raw))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+w.token(tenant))
	req.Header.Set("traceparent", traceparent)
	req.Header.Set("baggage", "tenant_id=another-tenant,role=operator")
	resp, err := w.api.Do(req)
	must(t, err)
	resp.Body.Close()
	var tr map[string]string
	select {
	case tr = <-got:
	default:
		t.Fatalf("the replica got no envelope (answer %d)", resp.StatusCode)
	}
	if tr["baggage"] != "" {
		t.Errorf("the envelope carries the caller's baggage %q", tr["baggage"])
	}
	if !strings.Contains(tr["traceparent"], "4bf92f3577b34da6a3ce929d0e0e4736") {
		t.Errorf("the envelope's trace %v does not continue the caller's trace", tr)
	}
}
