package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
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

// failingPruner is a store whose event pruning and forgetting of pruned
// IDs fail.
type failingPruner struct{ controlplane.Store }

func (failingPruner) PruneEvents(context.Context, time.Time, int) (int, error) {
	return 0, errors.Join(registry.ErrStorage, errors.New("permission denied for table events"))
}

func (failingPruner) ForgetPrunedEvents(context.Context, time.Time, int) (int, error) {
	return 0, errors.Join(registry.ErrStorage, errors.New("permission denied for table pruned_events"))
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

// TestMaintenanceForgetsPrunedEventIDs: maintenance forgets the IDs of
// pruned events received longer than PrunedEventIDsRetention ago (their
// storage is bounded), keeps the newer ones, counts and logs what it
// forgot; an event delivered again after its ID was forgotten is stored
// again. A failure is counted without failing the cycle;
// KeepPrunedEventIDsForever keeps them; forgetting goes on when events are
// kept for ever (IDs pruned before); the retention is validated.
func TestMaintenanceForgetsPrunedEventIDs(t *testing.T) {
	logs := &syncBuffer{}
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.EventRetention, c.PrunedEventIDsRetention = time.Hour, 3*time.Hour
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	log := e.b.Store.(registry.EventLog)
	deliver := func(log registry.EventLog, id string) registry.StoredEvent {
		t.Helper()
		b := registrytest.EventBatch("tenant-p", "r1", id)
		b.ReceivedAt = e.clock.Now()
		got, err := log.AppendEvents(e.ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		return got[0]
	}
	maintain := func(svc *controlplane.Service) {
		t.Helper()
		if _, err := svc.Maintain(e.ctx); err != nil {
			t.Fatal(err)
		}
	}
	deliver(log, "old")
	e.clock.Advance(30 * time.Minute)
	deliver(log, "newer")
	e.clock.Advance(61 * time.Minute) // old 91 min, newer 61 min: both pruned
	maintain(e.svc)
	if v := metricValue(t, e, controlplane.MetricEventsPruned, ""); v != 2 {
		t.Fatalf("%s = %v, want 2", controlplane.MetricEventsPruned, v)
	}
	e.clock.Advance(time.Hour) // old 151 min: its ID is kept
	maintain(e.svc)
	if g := deliver(log, "old"); !g.Pruned {
		t.Fatalf("old, 151 min after its receipt, delivered again: %+v, want Pruned (the IDs are kept 3 h)", g)
	}
	e.clock.Advance(40 * time.Minute) // old 191 min, newer 161 min
	maintain(e.svc)
	if v := metricValue(t, e, controlplane.MetricPrunedEventIDsForgotten, ""); v != 1 {
		t.Fatalf("%s = %v, want 1", controlplane.MetricPrunedEventIDsForgotten, v)
	}
	if g := deliver(log, "newer"); !g.Pruned {
		t.Fatalf("newer, 161 min after its receipt, delivered again: %+v, want Pruned", g)
	}
	// The documented consequence: delivered again after its ID was
	// forgotten, the event is stored a second time.
	if g := deliver(log, "old"); g.Pruned || g.Sequence != 3 {
		t.Fatalf("old delivered again after its ID was forgotten: %+v, want it stored as sequence 3", g)
	}
	if !slices.Contains(logs.messages(t), "INFO forgot the IDs of pruned events older than the pruned-event-ID retention; delivered again, those events are stored again") {
		t.Fatalf("no log line of the forgotten IDs: %v", logs.messages(t))
	}

	// A forgetting that fails is counted; the cycle succeeds.
	svc, err := controlplane.New(controlKey, failingPruner{e.b.Store}, controlplane.Config{Now: e.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Maintain(e.ctx); err != nil {
		t.Fatalf("a failed forgetting failed the cycle: %v", err)
	}
	rec := httptestGet(svc, controlplane.PathMetrics)
	if !strings.Contains(rec.Body.String(), controlplane.MetricPrunedEventIDsForgetFailures+" 1") {
		t.Fatalf("%s not counted:\n%s", controlplane.MetricPrunedEventIDsForgetFailures, rec.Body.String())
	}

	// KeepPrunedEventIDsForever forgets nothing; events kept for ever do
	// not stop the forgetting of IDs pruned before.
	for _, c := range []struct {
		name             string
		events, ids      time.Duration
		storedAgainAfter bool
	}{
		{"KeepPrunedEventIDsForever", time.Hour, controlplane.KeepPrunedEventIDsForever, false},
		{"KeepEventsForever", controlplane.KeepEventsForever, 2 * time.Hour, true},
	} {
		k := newEnv(t, newMemBackend, func(cfg *controlplane.Config) { cfg.EventRetention, cfg.PrunedEventIDsRetention = c.events, c.ids })
		klog := k.b.Store.(registry.EventLog)
		b := registrytest.EventBatch("tenant-k", "r1", "gone")
		b.ReceivedAt = k.clock.Now()
		if _, err := klog.AppendEvents(k.ctx, b); err != nil {
			t.Fatal(err)
		}
		k.clock.Advance(90 * time.Minute)
		if n, err := k.b.Store.(registry.EventPruner).PruneEvents(k.ctx, k.clock.Now(), 10); err != nil || n != 1 {
			t.Fatalf("%s: PruneEvents = %d, %v", c.name, n, err)
		}
		k.clock.Advance(10 * 365 * 24 * time.Hour)
		if _, err := k.svc.Maintain(k.ctx); err != nil {
			t.Fatal(err)
		}
		b.ReceivedAt = k.clock.Now()
		got, err := klog.AppendEvents(k.ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		if got[0].Pruned == c.storedAgainAfter {
			t.Fatalf("%s: the pruned event delivered again 10 years later: %+v, want stored again %t", c.name, got[0], c.storedAgainAfter)
		}
	}

	// The retention is validated.
	for _, c := range []struct {
		cfg  controlplane.Config
		want string
	}{
		{controlplane.Config{PrunedEventIDsRetention: time.Minute}, "PrunedEventIDsRetention 1m0s is below 1h0m0s"},
		{controlplane.Config{PrunedEventIDsRetention: -2}, "PrunedEventIDsRetention -2ns is below 1h0m0s"},
		{controlplane.Config{PrunedEventIDsRetention: 24 * time.Hour}, "PrunedEventIDsRetention 24h0m0s is below EventRetention 720h0m0s"},
		{controlplane.Config{EventRetention: 400 * 24 * time.Hour}, "PrunedEventIDsRetention 8760h0m0s is below EventRetention 9600h0m0s"},
	} {
		err := c.cfg.Validate()
		var ce *controlplane.ConfigError
		if !errors.As(err, &ce) || ce.Field != "PrunedEventIDsRetention" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want a ConfigError %q", c.cfg, err, c.want)
		}
	}
	for _, cfg := range []controlplane.Config{
		{},
		{EventRetention: 400 * 24 * time.Hour, PrunedEventIDsRetention: 400 * 24 * time.Hour},
		{EventRetention: controlplane.KeepEventsForever, PrunedEventIDsRetention: time.Hour},
		{PrunedEventIDsRetention: controlplane.KeepPrunedEventIDsForever},
	} {
		if err := cfg.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", cfg, err)
		}
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
