package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// recordingStore records when ExpireStaleReplicas is called and fails the
// calls whose 1-based numbers are in fail.
type recordingStore struct {
	controlplane.Store
	mu    sync.Mutex
	calls []time.Time
	fail  map[int]bool
}

func (s *recordingStore) ExpireStaleReplicas(ctx context.Context, limit int) (int, error) {
	s.mu.Lock()
	s.calls = append(s.calls, time.Now())
	n := len(s.calls)
	fail := s.fail[n]
	s.mu.Unlock()
	if fail {
		return 0, errors.Join(registry.ErrStorage, errors.New("injected: connection refused"))
	}
	return s.Store.ExpireStaleReplicas(ctx, limit)
}

func (s *recordingStore) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.calls...)
}

// TestMaintenanceLoop runs the real loop on the fake clock of a
// testing/synctest bubble: a stale lease is expired within a cycle of its
// expiry, and storage errors back off exponentially with jitter, then the
// loop returns to its interval.
func TestMaintenanceLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		reg, err := memregistry.New(memregistry.Config{Now: time.Now})
		if err != nil {
			t.Fatal(err)
		}
		w, err := registrytest.NewLifecycleWorld(ctx, reg)
		if err != nil {
			t.Fatal(err)
		}
		rep := w.ProvisionedReplica("crepl_a1", time.Now())
		if err := reg.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}
		store := &recordingStore{Store: reg, fail: map[int]bool{40: true, 41: true, 42: true, 43: true}}
		svc, err := controlplane.New(controlKey, store, controlplane.Config{})
		if err != nil {
			t.Fatal(err)
		}
		stop := runService(t, svc)

		key := registrytest.Key(rep.ID)
		req := aip.NewControlRequest(time.Now(), key.DID(), aip.RegisterCommand(w.Registration(&rep)))
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, controlplane.PathControl, bytes.NewReader(sealWith(t, key, req))))
		if rec.Code != http.StatusOK {
			t.Fatalf("register: HTTP %d %s", rec.Code, rec.Body)
		}
		registered := time.Now()

		// The lease lasts 30 s; within one cycle after that it is expired.
		time.Sleep(registry.DefaultLeaseTTL - 500*time.Millisecond)
		synctest.Wait()
		if got, _ := reg.ConnectorReplica(ctx, rep.ID); got.Status != aip.ReplicaReady {
			t.Fatalf("before expiry the replica is %s", got.Status)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		got, _ := reg.ConnectorReplica(ctx, rep.ID)
		if got.Status != aip.ReplicaOffline || got.HealthRevision != 2 {
			t.Fatalf("after expiry: %s at %d", got.Status, got.HealthRevision)
		}
		if !got.LeaseExpiresAt.Equal(registered.Add(registry.DefaultLeaseTTL)) {
			t.Fatalf("lease ended at %s, want %s", got.LeaseExpiresAt, registered.Add(registry.DefaultLeaseTTL))
		}

		// Let the loop run into the injected failures and out again.
		time.Sleep(time.Minute)
		synctest.Wait()
		stop()
		calls := store.times()
		if len(calls) < 50 {
			t.Fatalf("%d maintenance calls in ~91 s", len(calls))
		}
		gap := func(i int) time.Duration { return calls[i].Sub(calls[i-1]) } // before call i+1
		for i := 1; i < 39; i++ {
			if gap(i) != time.Second {
				t.Fatalf("gap before call %d is %s, want the 1s interval", i+1, gap(i))
			}
		}
		// Calls 40..43 fail: the waits after them grow 1s, 2s, 4s, 8s, each
		// jittered by ±50%.
		for k, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second} {
			g := gap(40 + k)
			if g < base/2 || g > base*3/2 {
				t.Fatalf("backoff after failure %d is %s, want %s ± 50%%", k+1, g, base)
			}
		}
		for i := 44; i < len(calls); i++ {
			if gap(i) != time.Second {
				t.Fatalf("gap before call %d is %s: after a success the loop returns to 1s", i+1, gap(i))
			}
		}
		if doc := readyDoc(t, svc); doc.Status != "not_ready" || !contains(doc.Failing, "service") || contains(doc.Failing, "maintenance") {
			t.Fatalf("ready after stop: %+v", doc)
		}
	})
}

// TestMaintenanceBoundedBatches checks the batch bounds: one cycle expires
// at most ExpiryMaxBatches × ExpiryBatchSize replicas.
func TestMaintenanceBoundedBatches(t *testing.T) {
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.ExpiryBatchSize, c.ExpiryMaxBatches = 2, 3 })
	var hosts []*host
	for _, n := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		h := e.provision(n)
		r, _ := h.send(h.registration())
		r.lease(t)
		hosts = append(hosts, h)
	}
	e.clock.Advance(leaseTTL)
	if n, err := e.svc.Maintain(e.ctx); err != nil || n != 6 {
		t.Fatalf("first cycle expired %d (%v), want 3 batches of 2", n, err)
	}
	if n, err := e.svc.Maintain(e.ctx); err != nil || n != 2 {
		t.Fatalf("second cycle expired %d (%v), want the remaining 2", n, err)
	}
	for _, h := range hosts {
		if r := e.replica(h.rep.ID); r.Status != aip.ReplicaOffline {
			t.Fatalf("replica %s is %s", h.rep.ID, r.Status)
		}
	}
}

func TestMaintenanceFailuresMakeNotReady(t *testing.T) {
	e := newEnv(t, newMemBackend)
	svc, err := controlplane.New(controlKey, brokenStore{e.b.Store}, controlplane.Config{Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := svc.Maintain(e.ctx); !errors.Is(err, registry.ErrStorage) {
			t.Fatalf("cycle %d: %v", i+1, err)
		}
	}
	doc := readyDoc(t, svc)
	if !contains(doc.Failing, "maintenance") {
		t.Fatalf("after 3 failed cycles: %+v", doc)
	}
}

// failingPruner is a store whose event pruning fails.
type failingPruner struct{ controlplane.Store }

func (failingPruner) PruneEvents(context.Context, time.Time, int) (int, error) {
	return 0, errors.Join(registry.ErrStorage, errors.New("permission denied for table events"))
}

// TestMaintenancePrunesEvents: maintenance deletes the events received
// longer than EventRetention ago, at most once a minute; a failed pruning
// is counted but does not fail the cycle; KeepEventsForever keeps them.
func TestMaintenancePrunesEvents(t *testing.T) {
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.EventRetention = time.Hour })
	log := e.b.Store.(registry.EventLog)
	appendAt := func(at time.Time, ids ...string) {
		t.Helper()
		b := registrytest.EventBatch("tenant-p", "r1", ids...)
		b.ReceivedAt = at
		if _, err := log.AppendEvents(e.ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	ids := func() []string {
		t.Helper()
		p, err := log.Events(e.ctx, "tenant-p", 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, ev := range p.Events {
			out = append(out, ev.Event.ID)
		}
		return out
	}
	appendAt(e.clock.Now(), "old1", "old2")
	e.clock.Advance(30 * time.Minute)
	appendAt(e.clock.Now(), "mid")
	e.clock.Advance(45 * time.Minute) // old ones 75 min old, mid 45
	if _, err := e.svc.Maintain(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{"mid"}) {
		t.Fatalf("after maintenance with a 1 h retention: %v, want [mid]", got)
	}
	if v := metricValue(t, e, controlplane.MetricEventsPruned, ""); v != 2 {
		t.Fatalf("%s = %v, want 2", controlplane.MetricEventsPruned, v)
	}
	// At most once a minute: an event received long ago (a batch that
	// waited in a host's outbox) waits for the next pruning.
	appendAt(e.clock.Now().Add(-2*time.Hour), "late")
	e.clock.Advance(30 * time.Second)
	if _, err := e.svc.Maintain(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{"mid", "late"}) {
		t.Fatalf("30 s after a pruning: %v, want [mid late] (no pruning yet)", got)
	}
	e.clock.Advance(31 * time.Second)
	if _, err := e.svc.Maintain(e.ctx); err != nil {
		t.Fatal(err)
	}
	if got := ids(); !slices.Equal(got, []string{"mid"}) {
		t.Fatalf("61 s after a pruning: %v, want [mid]", got)
	}

	// A pruning that fails is counted; the cycle succeeds.
	svc, err := controlplane.New(controlKey, failingPruner{e.b.Store}, controlplane.Config{Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Maintain(e.ctx); err != nil {
		t.Fatalf("a failed event pruning failed the cycle: %v", err)
	}
	rec := httptestGet(svc, controlplane.PathMetrics)
	if !strings.Contains(rec.Body.String(), controlplane.MetricEventPruneFailures+" 1") {
		t.Fatalf("%s not counted:\n%s", controlplane.MetricEventPruneFailures, rec.Body.String())
	}

	// KeepEventsForever prunes nothing.
	keep := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.EventRetention = controlplane.KeepEventsForever })
	klog := keep.b.Store.(registry.EventLog)
	b := registrytest.EventBatch("tenant-k", "r1", "kept")
	b.ReceivedAt = keep.clock.Now()
	if _, err := klog.AppendEvents(keep.ctx, b); err != nil {
		t.Fatal(err)
	}
	keep.clock.Advance(365 * 24 * time.Hour)
	keep.svc.Maintain(keep.ctx)
	if p, err := klog.Events(keep.ctx, "tenant-k", 0, 10); err != nil || len(p.Events) != 1 {
		t.Fatalf("KeepEventsForever: %+v, %v", p, err)
	}
	// And a retention below an hour is refused.
	if err := (controlplane.Config{EventRetention: time.Minute}).Validate(); err == nil || !strings.Contains(err.Error(), "EventRetention") {
		t.Fatalf("Validate(EventRetention 1m) = %v", err)
	}
}

// TestMaintenanceReleasesStrandedReservations: reservations left on
// replicas that went offline cleanly are released by maintenance once
// registry.StrandedReservationGrace has passed, in bounded batches, and
// counted; a store that fails the release fails the cycle.
func TestMaintenanceReleasesStrandedReservations(t *testing.T) {
	forEachBackend(t, func(t *testing.T, nb newBackendFunc) {
		e := newEnv(t, nb, func(c *controlplane.Config) { c.ExpiryBatchSize, c.ExpiryMaxBatches = 1, 2 })
		var hosts []*host
		for _, n := range []string{"a", "b", "c"} {
			h := e.provision(n)
			r, _ := h.send(h.registration())
			r.lease(t)
			hosts = append(hosts, h)
		}
		var held []registry.RouteAssignment
		for range hosts {
			a, err := e.b.Resolver.Resolve(e.ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: e.w.Instance.TenantID, CapabilityID: "alpha.read"})
			if err != nil {
				t.Fatal(err)
			}
			held = append(held, a)
		}
		for _, h := range hosts {
			if r, _ := h.send(h.transition(aip.OpOffline, 1)); r.status != http.StatusOK || r.outcome.Status != aip.OutcomeOffline {
				t.Fatalf("offline: HTTP %d %+v", r.status, r.outcome)
			}
			if r := e.replica(h.rep.ID); r.Status != aip.ReplicaOffline || r.ActiveAssignments != 1 {
				t.Fatalf("replica %s after a clean offline: %s with %d active assignments, want offline with 1", r.ID, r.Status, r.ActiveAssignments)
			}
		}
		live := func() int {
			t.Helper()
			l, err := e.b.Fleet.Ledger(e.ctx)
			if err != nil {
				t.Fatal(err)
			}
			return len(l.Reservations)
		}
		e.clock.Advance(registry.StrandedReservationGrace - time.Millisecond)
		if _, err := e.svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n := live(); n != 3 || metricValue(t, e, controlplane.MetricStrandedReleased, "") != 0 {
			t.Fatalf("within the grace: %d live reservations, want 3 and nothing released", n)
		}
		e.clock.Advance(time.Millisecond)
		if _, err := e.svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n, v := live(), metricValue(t, e, controlplane.MetricStrandedReleased, ""); n != 1 || v != 2 {
			t.Fatalf("after the grace, one cycle of 2 batches of 1: %d live reservations and %s = %v, want 1 and 2", n, controlplane.MetricStrandedReleased, v)
		}
		if _, err := e.svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
		if n, v := live(), metricValue(t, e, controlplane.MetricStrandedReleased, ""); n != 0 || v != 3 {
			t.Fatalf("after the second cycle: %d live reservations and %s = %v, want 0 and 3", n, controlplane.MetricStrandedReleased, v)
		}
		for _, a := range held {
			res, err := e.b.Resolver.Reservation(e.ctx, a.ActionID)
			if err != nil || res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
				t.Fatalf("reservation %+v (%v), want released as lease_expired", res, err)
			}
		}
		for _, h := range hosts {
			if r := e.replica(h.rep.ID); r.ActiveAssignments != 0 {
				t.Fatalf("replica %s keeps %d active assignments", r.ID, r.ActiveAssignments)
			}
		}

		svc, err := controlplane.New(controlKey, failingRelease{e.b.Store}, controlplane.Config{Now: e.clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			if _, err := svc.Maintain(e.ctx); !errors.Is(err, registry.ErrStorage) {
				t.Fatalf("cycle %d with a failing release: %v", i+1, err)
			}
		}
		if doc := readyDoc(t, svc); !contains(doc.Failing, "maintenance") {
			t.Fatalf("after 3 failed releases: %+v", doc)
		}
	})
}

// failingRelease is a store whose stranded-reservation release fails.
type failingRelease struct{ controlplane.Store }

func (failingRelease) ReleaseStrandedReservations(context.Context, time.Duration, int) (registry.StrandedRelease, error) {
	return registry.StrandedRelease{}, errors.Join(registry.ErrStorage, errors.New("injected: connection refused"))
}
