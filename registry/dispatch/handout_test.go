package dispatch_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// heldSettle is the registry with every settlement held until the test
// releases the hand-out it presents, or ends (done).
type heldSettle struct {
	*memregistry.Registry
	entered  chan registry.RouteAssignment
	releases map[uint64]chan struct{}
	done     chan struct{}
}

func (h *heldSettle) Settle(ctx context.Context, a registry.RouteAssignment, s registry.RouteSettlement) error {
	select {
	case h.entered <- a:
	case <-h.done:
	}
	select {
	case <-h.releases[a.HandOut]:
	case <-h.done:
	}
	return h.Registry.Settle(ctx, a, s)
}

// TestLateSettlementKeepsTheNextHandOut: an execution of an action (D1)
// is handed its route and sends it; the replica's lease expires and lease
// maintenance releases the reservation; the replica recovers; a retry of
// the action (D2) reserves the pinned route again and sends it; then D1
// settles. D1's settlement must not release the reservation D2 holds:
// the replica's slot and the tenant's, instance's and binding's counters
// stay taken until D2 settles, and D2's settlement releases them.
func TestLateSettlementKeepsTheNextHandOut(t *testing.T) {
	var (
		ahead atomic.Int64 // how far the registry's clock is ahead
		held  *heldSettle
	)
	w := newWorld(t, worldOptions{
		cfg: func(c *dispatch.Config) { c.RegistryTimeout = time.Minute },
		resolver: func(r *memregistry.Registry) registry.Resolver {
			held = &heldSettle{Registry: r, entered: make(chan registry.RouteAssignment),
				releases: map[uint64]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}, done: make(chan struct{})}
			return held
		},
		regNow: func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) },
	})
	// Registered after the world's, so it runs before them: a failing
	// test lets every held settlement go, so the dispatcher can stop.
	t.Cleanup(func() { close(held.done) })
	rh := w.startHost(8, 8)
	id := aip.NewActionID()
	act := func() <-chan dispatch.ActionResponse {
		out := make(chan dispatch.ActionResponse, 1)
		go func() {
			status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("once", "")})
			if status != http.StatusOK {
				t.Errorf("execution of %s answered %d: %+v", id, status, resp.Error)
			}
			out <- resp
		}()
		return out
	}
	reservation := func() registry.RouteReservation {
		t.Helper()
		res, err := w.reg.Reservation(w.ctx, id)
		must(t, err)
		return res
	}
	ledger := func() registry.Ledger {
		t.Helper()
		l, err := w.reg.Ledger(w.ctx)
		must(t, err)
		registrytest.CheckLedger(t, l)
		return l
	}

	d1 := act()
	if a := <-held.entered; a.HandOut != 1 {
		t.Fatalf("the first execution settles hand-out %d, want 1", a.HandOut)
	}
	// The replica's lease lapses: maintenance releases the reservation;
	// then the replica renews its lease.
	rep, err := w.reg.ConnectorReplica(w.ctx, rh.cfg.ReplicaID)
	must(t, err)
	ahead.Store(int64(2 * time.Hour))
	if n, err := w.reg.ExpireStaleReplicas(w.ctx, 10); err != nil || n != 1 {
		t.Fatalf("lease expiry: %d, %v", n, err)
	}
	rep, err = w.reg.ConnectorReplica(w.ctx, rep.ID)
	must(t, err)
	rep.Status, rep.LeaseExpiresAt, rep.HealthRevision = aip.ReplicaReady, time.Now().Add(3*time.Hour), rep.HealthRevision+1
	must(t, w.reg.PutReplica(w.ctx, rep))

	d2 := act()
	if a := <-held.entered; a.HandOut != 2 {
		t.Fatalf("the retry settles hand-out %d, want 2", a.HandOut)
	}
	want := ledger()
	if len(want.Reservations) != 1 || !want.Reservations[0].Reserved || want.Reservations[0].HandOut != 2 {
		t.Fatalf("while the retry runs the ledger holds %+v, want hand-out 2 reserved", want.Reservations)
	}

	close(held.releases[1]) // D1's settlement arrives late
	if resp := <-d1; resp.Settlement != registry.SettlementCompleted {
		t.Fatalf("the first execution's settlement: %q, want completed (confirmed, changing nothing)", resp.Settlement)
	}
	if res := reservation(); !res.Reserved || res.HandOut != 2 {
		t.Fatalf("the first execution's late settlement released the retry's reservation: %+v", res)
	}
	if got := ledger(); len(got.Counters) != len(want.Counters) || len(got.Reservations) != 1 {
		t.Fatalf("after the late settlement the ledger holds %+v, want %+v", got, want)
	}
	if got, err := w.reg.ConnectorReplica(w.ctx, rep.ID); err != nil || got.ActiveAssignments != 1 {
		t.Fatalf("the replica counts %d active assignments after the late settlement (%v), want the retry's 1", got.ActiveAssignments, err)
	}

	close(held.releases[2]) // D2's hop ends
	if resp := <-d2; resp.Settlement != registry.SettlementCompleted {
		t.Fatalf("the retry's settlement: %q", resp.Settlement)
	}
	if res := reservation(); res.Reserved || res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("after the retry settled: %+v", res)
	}
	if l := ledger(); len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("both executions settled, yet the ledger holds %+v", l)
	}
	if n := len(w.counter.runs(id)); n != 1 {
		t.Fatalf("the action ran %d times, want once (the retry gets the journaled result)", n)
	}
}
