package hostsdk_test

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// originFleet delivers messages under routes carrying the replica's
// health revision, as the registry assigns them.
type originFleet struct {
	*fleet
	conn   *testConnector
	h      *hostsdk.Host
	target hostsdktest.Target
}

func newOriginFleet(t *testing.T) *originFleet {
	f := &originFleet{fleet: newFleet(t), conn: newTestConnector()}
	f.restart(t, f.j)
	return f
}

// restart stops the running host, if any, and starts one with the same
// replica ID on j.
func (f *originFleet) restart(t *testing.T, j *memjournal.Journal) {
	t.Helper()
	if f.h != nil {
		if err := f.h.Stop(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	f.cfg.Journal = j
	if f.h != nil {
		// The same address: the registry's record names the endpoint.
		l, err := net.Listen("tcp", f.cfg.Bind)
		if err != nil {
			t.Fatal(err)
		}
		f.cfg.Listener = l
	}
	f.h, f.target = f.start(t, f.conn)
}

// route is the route the registry assigns now: the replica's current
// health revision.
func (f *originFleet) route(t *testing.T, a *aip.Action) aip.ConnectorRoute {
	t.Helper()
	st, ok := f.cp.Replica(f.cfg.ReplicaID)
	if !ok || st.HealthRevision == 0 {
		t.Fatalf("replica state %+v (%t): want a registered replica", st, ok)
	}
	r := f.d.Route(f.target, a.ID, a.CapabilityID, "")
	r.ReplicaHealthRevision = st.HealthRevision
	return r
}

func (f *originFleet) deliver(t *testing.T, route aip.ConnectorRoute, body aip.Body) *hostsdktest.Response {
	t.Helper()
	env, err := f.d.Envelope(f.target, body, route)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := f.d.Send(ctxT(t), f.target, env)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestLostJournalNeverRunsAnActionAgain: a replica that starts again under
// its replica ID on an empty journal (its state directory lost) refuses
// the actions routed to it before: a retry is action_expired and does not
// run again, a status query answers pruned (not not_found, which a
// dispatcher settles as never run), a cancel is action_expired. Actions
// routed after its registration run.
func TestLostJournalNeverRunsAnActionAgain(t *testing.T) {
	f := newOriginFleet(t)
	a := action(capEcho, `{"message":"once"}`)
	route := f.route(t, a)
	if resp := f.deliver(t, route, aip.Body{Action: a}); resp.Status != http.StatusOK {
		t.Fatalf("first delivery: HTTP %d %s", resp.Status, resp.Raw)
	}

	f.restart(t, memjournal.New())
	pe := wantCode(t, f.deliver(t, route, aip.Body{Action: a}), http.StatusGone, hostsdk.CodeActionExpired)
	if !strings.Contains(pe.Message, "before its current journal served it") {
		t.Errorf("refusal message %q does not say why", pe.Message)
	}
	if n := f.conn.runCount(a.ID); n != 1 {
		t.Fatalf("the action ran %d times, want once", n)
	}
	resp := f.deliver(t, route, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: a.ID}})
	if st := resp.Envelope.Body.ActionStatus; resp.Status != http.StatusOK || st == nil || st.State != aip.StatePruned {
		t.Fatalf("status query after the journal was lost: HTTP %d %s, want state pruned", resp.Status, resp.Raw)
	}
	wantCode(t, f.deliver(t, route, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: a.ID}}}), http.StatusGone, hostsdk.CodeActionExpired)

	b := action(capEcho, `{"message":"new"}`)
	broute := f.route(t, b)
	if resp := f.deliver(t, broute, aip.Body{Action: b}); resp.Status != http.StatusOK {
		t.Fatalf("an action routed after the registration: HTTP %d %s", resp.Status, resp.Raw)
	}
	// The journal keeps its origin across restarts: b, routed to it, is
	// answered from its record, and a routed before still is refused.
	f.restart(t, f.cfg.Journal.(*memjournal.Journal))
	if resp := f.deliver(t, broute, aip.Body{Action: b}); resp.Status != http.StatusOK || f.conn.runCount(b.ID) != 1 {
		t.Fatalf("b again after a restart: HTTP %d %s, ran %d times", resp.Status, resp.Raw, f.conn.runCount(b.ID))
	}
	wantCode(t, f.deliver(t, route, aip.Body{Action: a}), http.StatusGone, hostsdk.CodeActionExpired)
	if n := f.conn.runCount(a.ID); n != 1 {
		t.Fatalf("the action ran %d times, want once", n)
	}
}

// TestJournalFromBeforeOriginsIsTrusted: a journal written before journals
// kept their origin (an owner record and nothing else) answers for every
// route of the replica ID it is opened under, as it always did; the same
// route on a new journal is refused.
func TestJournalFromBeforeOriginsIsTrusted(t *testing.T) {
	f := newOriginFleet(t)
	early := action(capEcho, `{"message":"early"}`)
	route := f.route(t, early)

	legacy := memjournal.New()
	owner, _ := json.Marshal(map[string]string{"tenant_id": f.cfg.TenantID, "connector_type_id": f.cfg.ConnectorTypeID})
	if _, err := legacy.PutState(ctxT(t), hostsdk.ReservedStatePrefix+"host", "owner", owner, 0); err != nil {
		t.Fatal(err)
	}
	f.restart(t, legacy)
	if resp := f.deliver(t, route, aip.Body{Action: early}); resp.Status != http.StatusOK {
		t.Fatalf("an earlier route on a journal from before origins: HTTP %d %s", resp.Status, resp.Raw)
	}

	late := action(capEcho, `{"message":"late"}`)
	route = f.d.Route(f.target, late.ID, late.CapabilityID, "")
	route.ReplicaHealthRevision = 1
	f.restart(t, memjournal.New())
	wantCode(t, f.deliver(t, route, aip.Body{Action: late}), http.StatusGone, hostsdk.CodeActionExpired)
	if n := f.conn.runCount(late.ID); n != 0 {
		t.Fatalf("an action routed before the new journal ran %d times", n)
	}
}
