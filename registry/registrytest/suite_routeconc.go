package registrytest

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// The routing core under concurrency: several goroutines act as several
// dispatchers, each with its own registry handle where the backend has
// more than one (Backend.Another: for pgregistry, separate Registry values
// with their own pools on one database), and the cases check invariants
// afterwards (and, from a concurrent reader, on consistent ledger
// snapshots during the run), never timings. Randomised cases take their
// seed from AIP_REGISTRYTEST_SEED when it is set and log it when they
// fail.
func runRouteConcurrency(t *testing.T, nb NewBackend) {
	t.Run("SameActionOneAssignment", func(t *testing.T) { testSameActionOneAssignment(t, nb) })
	t.Run("SettlementsLifecycleAndPolicyRace", func(t *testing.T) { testRoutingRace(t, nb) })
	t.Run("LoweredLimit", func(t *testing.T) { testLoweredLimit(t, nb) })
	t.Run("RaisedLimit", func(t *testing.T) { testRaisedLimit(t, nb) })
	t.Run("CircuitBreaker", func(t *testing.T) { testConcurrentCircuit(t, nb) })
	t.Run("RerouteRacesRetryAndSettlement", func(t *testing.T) { testRerouteRacesRetry(t, nb) })
}

// dispatchers returns n handles on f's registry: f.b and n-1 more opened
// with Backend.Another, or f.b n times when the backend has one handle.
func (f *fx) dispatchers(n int) []Backend {
	f.t.Helper()
	ds := []Backend{f.b}
	for len(ds) < n {
		if f.b.Another == nil {
			ds = append(ds, f.b)
			continue
		}
		ds = append(ds, f.b.Another(f.t))
	}
	return ds
}

// testSeed returns the seed of a randomised case (AIP_REGISTRYTEST_SEED,
// or a fresh one) and logs it if the case fails.
func testSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("AIP_REGISTRYTEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("AIP_REGISTRYTEST_SEED=%q is not an unsigned integer", s)
		}
		seed = v
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("random seed %d: rerun with AIP_REGISTRYTEST_SEED=%d", seed, seed)
		}
	})
	return seed
}

// ledgerBounds are what a ledger snapshot must respect besides balancing:
// the most each counter kind may hold and each replica's capacity.
type ledgerBounds struct {
	limit    map[registry.AdmissionScopeKind]uint32
	capacity map[string]uint32
}

// policyBounds returns the counter bounds of policy p.
func policyBounds(p *registry.AdmissionPolicy) map[registry.AdmissionScopeKind]uint32 {
	return map[registry.AdmissionScopeKind]uint32{
		registry.ScopeGlobal: p.MaxGlobalInFlight, registry.ScopeTenant: p.MaxTenantInFlight,
		registry.ScopeConnectorType: p.MaxConnectorTypeInFlight, registry.ScopeInstance: p.MaxInstanceInFlight,
		registry.ScopeBinding: p.MaxBindingInFlight, registry.ScopeTenantRetry: p.MaxTenantRetryInFlight,
	}
}

// ledgerError checks one ledger snapshot: every counter above zero equals
// the live reservations holding its scope, no held scope lacks its
// counter, no counter is over its bound and no replica holds more live
// reservations than its capacity.
func ledgerError(l registry.Ledger, b ledgerBounds) error {
	type key struct {
		kind registry.AdmissionScopeKind
		key  string
	}
	held := map[key]uint32{}
	perReplica := map[string]uint32{}
	for _, r := range l.Reservations {
		if !r.Reserved {
			return fmt.Errorf("ledger lists the released reservation of %s", r.ActionID)
		}
		perReplica[r.ReplicaID]++
		for _, s := range r.Scopes {
			held[key{s.Kind, s.Key}]++
		}
	}
	for _, c := range l.Counters {
		if got := held[key{c.Kind, c.Key}]; c.Active == 0 || got != c.Active {
			return fmt.Errorf("counter %s %q is %d, but %d live reservations hold it", c.Kind, c.Key, c.Active, got)
		}
		if limit, ok := b.limit[c.Kind]; ok && c.Active > limit {
			return fmt.Errorf("counter %s %q is %d, over its limit %d", c.Kind, c.Key, c.Active, limit)
		}
		delete(held, key{c.Kind, c.Key})
	}
	for k, n := range held {
		return fmt.Errorf("%d live reservations hold scope %s %q, which has no counter", n, k.kind, k.key)
	}
	for id, n := range perReplica {
		if c, ok := b.capacity[id]; ok && n > c {
			return fmt.Errorf("replica %s holds %d live reservations, over its capacity %d", id, n, c)
		}
	}
	return nil
}

// watchLedger reads ledger snapshots through the handles in turn until
// stop is called, checking each with check; stop returns how many it read
// and the first problem.
func (f *fx) watchLedger(ds []Backend, check func(registry.Ledger) error) (stop func() (int, error)) {
	done := make(chan struct{})
	var (
		wg    sync.WaitGroup
		reads int
		first error
	)
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			l, err := ds[reads%len(ds)].Fleet.Ledger(f.ctx)
			if err == nil {
				err = check(l)
			}
			reads++
			if err != nil {
				first = fmt.Errorf("ledger snapshot %d: %w", reads, err)
				return
			}
		}
	})
	return func() (int, error) {
		close(done)
		wg.Wait()
		return reads, first
	}
}

// settleAll settles every listed action's route with its last hand-out
// and requires the ledger to be empty and the replicas idle afterwards.
func (f *fx) settleAll(actions []string, replicas ...string) {
	f.t.Helper()
	for _, id := range actions {
		a, err := f.b.Resolver.Assignment(f.ctx, id)
		if errors.Is(err, registry.ErrNotFound) {
			continue
		}
		f.must(err)
		f.must(f.b.Resolver.Settle(f.ctx, a, registry.SettlementCompleted))
	}
	l := f.checkLedger(replicas...)
	if len(l.Counters) != 0 || len(l.Reservations) != 0 {
		f.t.Fatalf("after settling every route the ledger still holds %d counters and %d reservations: %+v", len(l.Counters), len(l.Reservations), l)
	}
	for _, id := range replicas {
		if n := f.getReplica(id).ActiveAssignments; n != 0 {
			f.t.Fatalf("replica %s has %d active assignments after every route was settled", id, n)
		}
	}
}

// testSameActionOneAssignment resolves twelve action IDs of one tenant,
// each six times at once through three dispatchers, against replicas and
// a binding limit smaller than the demand: each routed action has one assignment
// that every Resolve of it returned, its hand-outs are 1..n for n
// successful Resolves, nothing is over a limit, and settling every holder's
// copy at once releases each reservation once.
func testSameActionOneAssignment(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:same")
	// The binding's limit is the smallest scope: pgregistry's striped
	// counters can refuse a route while a scope with a larger limit below
	// counterStripes... has room (see its package documentation), so the
	// tenant and the instance are left wide.
	pol.MaxTenantInFlight, pol.MaxInstanceInFlight, pol.MaxBindingInFlight = 100, 100, 5
	w := newRouteWorld(f, &pol)
	bounds := ledgerBounds{limit: policyBounds(&pol), capacity: map[string]uint32{}}
	var reps []string
	for n := range 3 {
		r := f.replica(fmt.Sprintf("s%d", n), w.i, func(r *registry.ConnectorReplica) { r.Capacity = 2 })
		reps, bounds.capacity[r.ID] = append(reps, r.ID), r.Capacity
	}
	ds := f.dispatchers(3)
	const actions, per = 12, 6
	reqs := make([]registry.RouteRequest, actions)
	for i := range reqs {
		reqs[i] = request("tenant-1", "alpha.read")
	}
	type result struct {
		a   registry.RouteAssignment
		err error
		d   int
	}
	res := make([][]result, actions)
	for i := range res {
		res[i] = make([]result, per)
	}
	stop := f.watchLedger(ds, func(l registry.Ledger) error { return ledgerError(l, bounds) })
	parallel(actions*per, func(k int) {
		i, j, d := k/per, k%per, k%len(ds)
		a, err := ds[d].Resolver.Resolve(f.ctx, reqs[i])
		res[i][j] = result{a, err, d}
	})
	if n, err := stop(); err != nil {
		t.Fatalf("during the resolves (%d snapshots): %v", n, err)
	}
	var routed []string
	for i := range actions {
		var first *registry.RouteAssignment
		var handOuts []uint64
		for j := range res[i] {
			r := &res[i][j]
			if r.err != nil {
				if !expectedRouteError(r.err) {
					t.Fatalf("resolve %d of action %d: %v", j, i, r.err)
				}
				continue
			}
			if first == nil {
				first = &r.a
			} else if !r.a.Equal(first) {
				t.Fatalf("action %d: one resolve got replica %s fence %s, another replica %s fence %s",
					i, first.ReplicaID, first.FenceToken, r.a.ReplicaID, r.a.FenceToken)
			}
			handOuts = append(handOuts, r.a.HandOut)
		}
		id := reqs[i].ActionID
		if first == nil {
			_, err := f.b.Resolver.Assignment(f.ctx, id)
			f.wantErr(err, registry.ErrNotFound, fmt.Sprintf("action %d, which no resolve routed", i))
			continue
		}
		routed = append(routed, id)
		slices.Sort(handOuts)
		for k, h := range handOuts {
			if h != uint64(k+1) {
				t.Fatalf("action %d: %d successful resolves were handed out %v, want 1..%d", i, len(handOuts), handOuts, len(handOuts))
			}
		}
		cur, err := f.b.Resolver.Assignment(f.ctx, id)
		f.must(err)
		if rsv := f.reservation(id); !cur.Equal(first) || cur.HandOut != uint64(len(handOuts)) || !rsv.Reserved || rsv.HandOut != cur.HandOut {
			t.Fatalf("action %d: stored route %s hand-out %d (reservation %+v), want %s hand-out %d, reserved",
				i, cur.FenceToken, cur.HandOut, rsv, first.FenceToken, len(handOuts))
		}
	}
	l := f.checkLedger(reps...)
	if err := ledgerError(l, bounds); err != nil {
		t.Fatal(err)
	}
	if len(l.Reservations) != len(routed) {
		t.Fatalf("%d live reservations for %d routed actions", len(l.Reservations), len(routed))
	}
	// Contention may leave slots unused (bounded retries); serially, the
	// binding's 5 fill exactly and the next is refused at the binding.
	for len(routed) < int(pol.MaxBindingInFlight) {
		req := request("tenant-1", "alpha.read")
		if _, err := f.b.Resolver.Resolve(f.ctx, req); err != nil {
			t.Fatalf("with %d of %d routed and nothing else running: %v", len(routed), pol.MaxBindingInFlight, err)
		}
		routed = append(routed, req.ActionID)
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	var full *registry.CapacityExceededError
	if !errors.As(err, &full) || full.Scope != registry.ScopeBinding {
		t.Fatalf("a sixth route under binding limit 5: %v, want the binding's CapacityExceeded", err)
	}
	// Every holder settles its own copy at once.
	var holders []func() error
	for i := range actions {
		for j := range res[i] {
			if r := res[i][j]; r.err == nil {
				holders = append(holders, func() error { return ds[r.d].Resolver.Settle(f.ctx, r.a, registry.SettlementCompleted) })
			}
		}
	}
	errs := make([]error, len(holders))
	parallel(len(holders), func(k int) { errs[k] = holders[k]() })
	for k, err := range errs {
		if err != nil {
			t.Fatalf("settlement %d of a shared reservation: %v", k, err)
		}
	}
	f.settleAll(routed, reps...)
}

// raceWorld is the fleet of the randomised race: tenant-1's instance bound
// to alpha.read and alpha.write under one policy, four replicas of
// capacity 3 on short leases.
type raceWorld struct {
	pol  registry.AdmissionPolicy
	reps []string
}

func newRaceWorld(f *fx) raceWorld {
	pol := registry.ConservativePolicy("quota:race")
	pol.MaxTenantInFlight, pol.MaxInstanceInFlight, pol.MaxBindingInFlight, pol.MaxTenantRetryInFlight = 8, 8, 6, 4
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = 3, 200
	w := newRouteWorld(f, &pol)
	f.bind(w.i, "alpha.write", 0, pol.PolicyRef)
	rw := raceWorld{pol: pol}
	for n := range 4 {
		rw.reps = append(rw.reps, f.replica(fmt.Sprintf("q%d", n), w.i, func(r *registry.ConnectorReplica) {
			r.Capacity, r.LeaseExpiresAt = 3, f.clock.Now().Add(time.Second)
		}).ID)
	}
	return rw
}

// putReplicaStatus moves replica id to status through d (offline ends its
// lease now; ready renews it for a second), re-reading it when a
// concurrent write raced the health revision.
func putReplicaStatus(t *testing.T, f *fx, d Backend, id string, status aip.ReplicaStatus) {
	for attempt := 0; ; attempt++ {
		r, err := d.Admin.ConnectorReplica(f.ctx, id)
		if err != nil {
			t.Errorf("read replica %s: %v", id, err)
			return
		}
		r.Status = status
		switch status {
		case aip.ReplicaOffline:
			r.LeaseExpiresAt = f.clock.Now()
		case aip.ReplicaReady:
			r.LeaseExpiresAt = f.clock.Now().Add(time.Second)
		}
		r.HealthRevision++
		switch err = d.Admin.PutReplica(f.ctx, r); {
		case err == nil:
			return
		case errors.Is(err, registry.ErrConflict) && attempt < 100:
			// A concurrent settlement or heartbeat changed it: re-read.
		default:
			t.Errorf("replica %s to %s: %v", id, status, err)
			return
		}
	}
}

// testRoutingRace is a seeded random workload of six dispatchers on three
// handles: new routes and retries of two capabilities, settlements of the
// hand-outs they got (completed, outcome_unknown, cancelled), orphan
// settlements, replicas drained, taken offline and back, lease expiry, the
// release of stranded reservations and admission policy changes that
// lower and raise the limits, all at once. A reader checks ledger
// snapshots during the run; afterwards every action has one assignment
// whose hand-outs are exactly the successful Resolves', and settling
// everything empties the ledger.
func testRoutingRace(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	seed := testSeed(t)
	rw := newRaceWorld(f)
	ds := f.dispatchers(3)
	// A reservation holds the limits of the policy revision it was made
	// under, so a counter never exceeds the highest limit of any revision
	// (the changes below stay within the first revision's).
	bounds := ledgerBounds{limit: policyBounds(&rw.pol), capacity: map[string]uint32{}}
	for _, id := range rw.reps {
		bounds.capacity[id] = 3
	}
	var (
		mu      sync.Mutex
		known   []registry.RouteRequest
		held    []registry.RouteAssignment
		gotten  = map[string][]registry.RouteAssignment{} // every successful Resolve per action
		polRev  = rw.pol.Revision
		changes int
	)
	outcomes := []registry.RouteSettlement{registry.SettlementCompleted, registry.SettlementOutcomeUnknown, registry.SettlementCancelled}
	got := func(req registry.RouteRequest, a registry.RouteAssignment, isNew bool) {
		mu.Lock()
		defer mu.Unlock()
		if isNew {
			known = append(known, req)
		}
		held = append(held, a)
		gotten[req.ActionID] = append(gotten[req.ActionID], a)
	}
	stop := f.watchLedger(ds, func(l registry.Ledger) error { return ledgerError(l, bounds) })
	worker := func(k int) {
		d := ds[k%len(ds)]
		rng := rand.New(rand.NewPCG(seed, uint64(k)))
		for range 50 {
			switch op := rng.IntN(20); {
			case op < 6: // a new route
				req := request("tenant-1", []string{"alpha.read", "alpha.write"}[rng.IntN(2)])
				a, err := d.Resolver.Resolve(f.ctx, req)
				switch {
				case err == nil:
					got(req, a, true)
				case !expectedRouteError(err):
					t.Errorf("new route: %v", err)
				}
			case op < 10: // a retry of a known action
				mu.Lock()
				var req registry.RouteRequest
				if len(known) > 0 {
					req = known[rng.IntN(len(known))]
				}
				mu.Unlock()
				if req.ActionID == "" {
					continue
				}
				a, err := d.Resolver.Resolve(f.ctx, req)
				switch {
				case err == nil:
					got(req, a, false)
				case !expectedRouteError(err):
					t.Errorf("retry of %s: %v", req.ActionID, err)
				}
			case op < 15: // settle a hand-out this test holds
				mu.Lock()
				var a registry.RouteAssignment
				if len(held) > 0 {
					i := rng.IntN(len(held))
					a = held[i]
					held = slices.Delete(held, i, i+1)
				}
				mu.Unlock()
				if a.ActionID != "" {
					if err := d.Resolver.Settle(f.ctx, a, outcomes[rng.IntN(len(outcomes))]); err != nil {
						t.Errorf("settle hand-out %d of %s: %v", a.HandOut, a.ActionID, err)
					}
				}
			case op == 15: // reconciliation of a reservation it read
				mu.Lock()
				var id string
				if len(known) > 0 {
					id = known[rng.IntN(len(known))].ActionID
				}
				mu.Unlock()
				if id == "" {
					continue
				}
				rsv, err := d.Resolver.Reservation(f.ctx, id)
				if err != nil {
					t.Errorf("reservation of %s: %v", id, err)
					continue
				}
				a, err := d.Resolver.Assignment(f.ctx, id)
				if err != nil {
					t.Errorf("assignment of %s: %v", id, err)
					continue
				}
				if err := d.Orphans.SettleOrphan(f.ctx, a, registry.SettlementCancelled, rsv.HandOut); err != nil && !errors.Is(err, registry.ErrConflict) {
					t.Errorf("orphan settlement of %s at hand-out %d: %v", id, rsv.HandOut, err)
				}
			case op == 16: // a replica drains, goes offline or comes back
				id := rw.reps[rng.IntN(len(rw.reps))]
				putReplicaStatus(t, f, d, id, []aip.ReplicaStatus{aip.ReplicaDraining, aip.ReplicaOffline, aip.ReplicaReady, aip.ReplicaReady}[rng.IntN(4)])
			case op == 17: // lease maintenance
				f.clock.Advance(time.Duration(50+rng.IntN(300)) * time.Millisecond)
				if _, err := d.Fleet.ExpireStaleReplicas(f.ctx, 1+rng.IntN(3)); err != nil {
					t.Errorf("expire stale replicas: %v", err)
				}
				if _, err := d.Fleet.ReleaseStrandedReservations(f.ctx, 0, 1+rng.IntN(3)); err != nil {
					t.Errorf("release stranded reservations: %v", err)
				}
			case op == 18: // an administrator changes the limits
				mu.Lock()
				p := rw.pol
				polRev++
				p.Revision = polRev
				p.MaxTenantInFlight = 2 + uint32(rng.IntN(7))
				p.MaxInstanceInFlight = 2 + uint32(rng.IntN(7))
				p.MaxBindingInFlight = 2 + uint32(rng.IntN(5))
				p.MaxTenantRetryInFlight = 1 + uint32(rng.IntN(4))
				err := d.Admin.PutAdmissionPolicy(f.ctx, p)
				changes++
				mu.Unlock()
				if err != nil {
					t.Errorf("policy revision %d: %v", p.Revision, err)
				}
			default: // a heartbeat
				putReplicaStatus(t, f, d, rw.reps[rng.IntN(len(rw.reps))], aip.ReplicaReady)
			}
		}
	}
	parallel(6, worker)
	n, err := stop()
	if err != nil {
		t.Fatalf("during the race (%d snapshots): %v", n, err)
	}
	if t.Failed() {
		return
	}
	l := f.checkLedger(rw.reps...)
	if err := ledgerError(l, bounds); err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, req := range known {
		id := req.ActionID
		actions = append(actions, id)
		as := gotten[id]
		var handOuts []uint64
		for _, a := range as {
			if !a.Equal(&as[0]) {
				t.Fatalf("action %s was handed out fence %s and fence %s", id, as[0].FenceToken, a.FenceToken)
			}
			handOuts = append(handOuts, a.HandOut)
		}
		slices.Sort(handOuts)
		for k, h := range handOuts {
			if h != uint64(k+1) {
				t.Fatalf("action %s: %d successful resolves were handed out %v, want 1..%d", id, len(handOuts), handOuts, len(handOuts))
			}
		}
		if rsv := f.reservation(id); rsv.HandOut != uint64(len(as)) {
			t.Fatalf("action %s: its route's last hand-out is %d, but %d resolves succeeded", id, rsv.HandOut, len(as))
		}
	}
	t.Logf("%d actions, %d hand-outs, %d policy changes, %d ledger snapshots", len(actions), func() int {
		s := 0
		for _, as := range gotten {
			s += len(as)
		}
		return s
	}(), changes, n)
	f.settleAll(actions, rw.reps...)
}

// limitWorld is tenant-1's instance bound to alpha.read under a policy
// whose binding limit is binding, with two replicas of capacity 20.
func limitWorld(f *fx, binding uint32) (registry.AdmissionPolicy, []string) {
	pol := registry.ConservativePolicy("quota:limit")
	pol.MaxTenantInFlight, pol.MaxInstanceInFlight, pol.MaxBindingInFlight = 100, 100, binding
	w := newRouteWorld(f, &pol)
	var reps []string
	for n := range 2 {
		reps = append(reps, f.replica(fmt.Sprintf("l%d", n), w.i, func(r *registry.ConnectorReplica) { r.Capacity = 20 }).ID)
	}
	return pol, reps
}

// bindingHeld returns the binding counter of a ledger snapshot and how
// many of its live reservations belong to actions in set.
func bindingHeld(l registry.Ledger, set map[string]bool) (total, in int) {
	for _, r := range l.Reservations {
		for _, s := range r.Scopes {
			if s.Kind == registry.ScopeBinding {
				total++
				if set[r.ActionID] {
					in++
				}
			}
		}
	}
	return total, in
}

// testLoweredLimit holds 8 routes under binding limit 8, lowers the limit
// to 3 and then resolves new actions from six dispatchers while the old
// routes are settled one by one. Every route made after the change is
// admitted under the new limit (its reservation names revision 2 and
// limit 3), never more than 3 of them are made, and each only while fewer
// than 3 routes of the binding, old or new, are held: in every ledger
// snapshot that holds a new route, the binding holds at most 3, plus
// pgregistry's documented slack of the reservations in flight in other
// stripes. The old routes keep limit 8.
func testLoweredLimit(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol, reps := limitWorld(f, 8)
	ds := f.dispatchers(3)
	var old []registry.RouteAssignment
	for range 8 {
		old = append(old, f.resolve(request("tenant-1", "alpha.read")))
	}
	lowered := pol
	lowered.Revision, lowered.MaxBindingInFlight = 2, 3
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, lowered))
	const workers, attempts = 6, 12
	// memregistry admits a new route only while fewer than 3 routes of
	// the binding are held. pgregistry's documented gap: its striped
	// counters read the scope's sum without locking the other stripes, so
	// reservations under the lower limit made at the same moment in
	// different stripes (at most one per stripe with a share of limit 3)
	// can each pass it once, the old routes counting.
	const loweredSlack = 3 - 1
	var (
		mu    sync.Mutex
		fresh = map[string]bool{}
		made  []registry.RouteAssignment
	)
	stop := f.watchLedger(ds, func(l registry.Ledger) error {
		mu.Lock()
		set := maps.Clone(fresh)
		mu.Unlock()
		// Every new action is in the set before its Resolve starts.
		total, in := bindingHeld(l, set)
		if in > 0 && total > int(lowered.MaxBindingInFlight+loweredSlack) {
			return fmt.Errorf("the binding holds %d routes (%d made after its limit was lowered to %d, allowed %d more in flight)",
				total, in, lowered.MaxBindingInFlight, loweredSlack)
		}
		return nil
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i, a := range old {
			if err := ds[i%len(ds)].Resolver.Settle(f.ctx, a, registry.SettlementCompleted); err != nil {
				t.Errorf("settle old route %d: %v", i, err)
			}
		}
	})
	parallel(workers, func(k int) {
		d := ds[k%len(ds)]
		for range attempts {
			req := request("tenant-1", "alpha.read")
			mu.Lock()
			fresh[req.ActionID] = true
			mu.Unlock()
			a, err := d.Resolver.Resolve(f.ctx, req)
			switch {
			case err == nil:
				mu.Lock()
				made = append(made, a)
				mu.Unlock()
			case !expectedRouteError(err):
				t.Errorf("resolve after the limit was lowered: %v", err)
			}
		}
	})
	wg.Wait()
	n, err := stop()
	if err != nil {
		t.Fatalf("%v (%d snapshots)", err, n)
	}
	if t.Failed() {
		return
	}
	if len(made) > int(lowered.MaxBindingInFlight) {
		t.Fatalf("%d routes were made after the binding limit was lowered to %d", len(made), lowered.MaxBindingInFlight)
	}
	for _, a := range made {
		if s := bindingScope(&a); a.Admission.PolicyRevision != 2 || s.Limit != 3 {
			t.Fatalf("a route made after the change was admitted under revision %d, binding limit %d", a.Admission.PolicyRevision, s.Limit)
		}
	}
	// Serially, the lowered limit fills exactly.
	ids := []string{}
	for _, a := range made {
		ids = append(ids, a.ActionID)
	}
	for len(ids) < 3 {
		ids = append(ids, f.resolve(request("tenant-1", "alpha.read")).ActionID)
	}
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrCapacityExceeded, "a fourth route under the lowered limit 3")
	// An old route retried keeps its own limit 8: it fits beside the 3.
	retried := f.resolve(registry.RouteRequest{ActionID: old[0].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	if s := bindingScope(&retried); s.Limit != 8 {
		t.Fatalf("an old route retried reserved binding limit %d, want its own 8", s.Limit)
	}
	f.settleAll(append(ids, old[0].ActionID), reps...)
	t.Logf("%d routes made under the lowered limit while 8 old ones were settled (%d snapshots)", len(made), n)
}

// testRaisedLimit holds 3 routes under binding limit 3, raises it to 6 and
// resolves new actions from six dispatchers at once: the binding never
// holds more than 6, the new routes carry the new limit, and serially it
// fills to exactly 6. A released old route retried is still held to its
// own limit 3.
func testRaisedLimit(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol, reps := limitWorld(f, 3)
	ds := f.dispatchers(3)
	var old []registry.RouteAssignment
	for range 3 {
		old = append(old, f.resolve(request("tenant-1", "alpha.read")))
	}
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrCapacityExceeded, "a fourth route under limit 3")
	raised := pol
	raised.Revision, raised.MaxBindingInFlight = 2, 6
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, raised))
	bounds := ledgerBounds{limit: policyBounds(&raised), capacity: map[string]uint32{reps[0]: 20, reps[1]: 20}}
	stop := f.watchLedger(ds, func(l registry.Ledger) error { return ledgerError(l, bounds) })
	var (
		mu   sync.Mutex
		made []registry.RouteAssignment
	)
	parallel(6, func(k int) {
		d := ds[k%len(ds)]
		for range 4 {
			a, err := d.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
			switch {
			case err == nil:
				mu.Lock()
				made = append(made, a)
				mu.Unlock()
			case !expectedRouteError(err):
				t.Errorf("resolve after the limit was raised: %v", err)
			}
		}
	})
	n, err := stop()
	if err != nil {
		t.Fatalf("%v (%d snapshots)", err, n)
	}
	if t.Failed() {
		return
	}
	if len(made) > 3 {
		t.Fatalf("%d routes made beside 3 held under the raised limit 6", len(made))
	}
	ids := []string{}
	for _, a := range made {
		if s := bindingScope(&a); a.Admission.PolicyRevision != 2 || s.Limit != 6 {
			t.Fatalf("a route made after the raise was admitted under revision %d, binding limit %d", a.Admission.PolicyRevision, s.Limit)
		}
		ids = append(ids, a.ActionID)
	}
	for len(ids) < 3 {
		ids = append(ids, f.resolve(request("tenant-1", "alpha.read")).ActionID)
	}
	_, err = f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrCapacityExceeded, "a seventh route under the raised limit 6")
	// Release one old route and one new: 4 held. The old route retried
	// needs fewer than its own 3 and is refused; a new one fits.
	f.settle(old[0], registry.SettlementCompleted)
	last, err := f.b.Resolver.Assignment(f.ctx, ids[0])
	f.must(err)
	f.settle(last, registry.SettlementCompleted)
	_, err = f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: old[0].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	f.wantErr(err, registry.ErrCapacityExceeded, "an old route retried beside 4 held, over its own limit 3")
	ids = append(ids, f.resolve(request("tenant-1", "alpha.read")).ActionID)
	all := append(ids, old[1].ActionID, old[2].ActionID)
	f.settleAll(all, reps...)
}

func bindingScope(a *registry.RouteAssignment) registry.AdmissionScope {
	for _, s := range a.Admission.BaseScopes {
		if s.Kind == registry.ScopeBinding {
			return s
		}
	}
	return registry.AdmissionScope{}
}

// testConcurrentCircuit drives one replica's circuit from several
// dispatchers at once, and across new handles (dispatcher restarts):
// concurrent outcome_unknown settlements each count once, the circuit
// opens exactly at the threshold (one below it stays closed), while open
// no new route or released retry reaches the replica, it lets work through
// again exactly when the open interval ends (half-open: the failures are
// kept, so one more unknown outcome reopens it at once), and a completed
// settlement closes it.
func testConcurrentCircuit(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	const threshold = 4
	open := time.Second
	pol := registry.FleetPolicy("quota:circuit")
	pol.CircuitFailureThreshold, pol.CircuitOpenMS = threshold, uint64(open.Milliseconds())
	w := newRouteWorld(f, &pol)
	rep := f.replica("c0", w.i, func(r *registry.ConnectorReplica) { r.Capacity, r.LeaseExpiresAt = 64, f.clock.Now().Add(time.Hour) })
	ds := f.dispatchers(3)
	var all []string
	// resolveN resolves n new actions at once through ds.
	resolveN := func(ds []Backend, n int) []registry.RouteAssignment {
		t.Helper()
		out, errs := make([]registry.RouteAssignment, n), make([]error, n)
		parallel(n, func(k int) {
			req := request("tenant-1", "alpha.read")
			out[k], errs[k] = ds[k%len(ds)].Resolver.Resolve(f.ctx, req)
		})
		for k, err := range errs {
			if err != nil {
				t.Fatalf("resolve %d of %d on a closed circuit: %v", k, n, err)
			}
			all = append(all, out[k].ActionID)
		}
		return out
	}
	// settleN settles as at once through ds, outcome(k) for the k-th.
	settleN := func(ds []Backend, as []registry.RouteAssignment, outcome func(k int) registry.RouteSettlement) {
		t.Helper()
		errs := make([]error, len(as))
		parallel(len(as), func(k int) { errs[k] = ds[k%len(ds)].Resolver.Settle(f.ctx, as[k], outcome(k)) })
		for k, err := range errs {
			if err != nil {
				t.Fatalf("settlement %d: %v", k, err)
			}
		}
	}
	unknown := func(int) registry.RouteSettlement { return registry.SettlementOutcomeUnknown }
	circuit := func(d Backend) registry.CircuitState {
		t.Helper()
		r, err := d.Admin.ConnectorReplica(f.ctx, rep.ID)
		f.must(err)
		return r.Circuit
	}
	// refusedN requires n concurrent new routes through ds to be refused.
	refusedN := func(ds []Backend, n int, what string) {
		t.Helper()
		errs := make([]error, n)
		parallel(n, func(k int) { _, errs[k] = ds[k%len(ds)].Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read")) })
		for _, err := range errs {
			f.wantErr(err, registry.ErrReplicaUnavailable, what)
		}
	}

	// One below the threshold: counted once each, still closed.
	below := resolveN(ds, threshold-1)
	settleN(ds, below, unknown)
	if c := circuit(f.b); c.ConsecutiveFailures != threshold-1 || !c.OpenUntil.IsZero() {
		t.Fatalf("after %d concurrent unknown outcomes: %+v, want %d failures and closed", threshold-1, c, threshold-1)
	}
	// Hold 6 more, then settle them all as unknown at once: the circuit
	// opens with the first and stays open until now + the interval.
	heldOpen := resolveN(ds, 6)
	keep := resolveN(ds, 2) // held across the open interval
	opened := f.clock.Now()
	settleN(ds, heldOpen, unknown)
	if c := circuit(ds[1]); c.ConsecutiveFailures != threshold-1+6 || !c.OpenUntil.Equal(opened.Add(open)) {
		t.Fatalf("after 6 more concurrent unknown outcomes: %+v, want %d failures, open until %s", c, threshold+5, opened.Add(open))
	}
	// While open: no new route, no released route retried, through any
	// handle; a held route's retry shares its reservation.
	refusedN(ds, 6, "a new route to an open circuit")
	errs := make([]error, len(below))
	parallel(len(below), func(k int) {
		_, errs[k] = ds[k%len(ds)].Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: below[k].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	})
	for _, err := range errs {
		f.wantErr(err, registry.ErrReplicaUnavailable, "a released route retried on an open circuit")
	}
	again := make([]registry.RouteAssignment, len(keep))
	parallel(len(keep), func(k int) {
		again[k], errs[k] = ds[k%len(ds)].Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: keep[k].ActionID, TenantID: "tenant-1", CapabilityID: "alpha.read"})
	})
	for k := range keep {
		if errs[k] != nil || !again[k].Equal(&keep[k]) {
			t.Fatalf("a held route retried on an open circuit: %v", errs[k])
		}
	}
	// A dispatcher restarted meanwhile sees the same circuit.
	restarted := f.dispatchers(2)[1:]
	refusedN(restarted, 3, "a new route to an open circuit through a new handle")
	// Half-open exactly at the end of the interval.
	f.clock.Set(opened.Add(open - time.Millisecond))
	refusedN(ds, 6, "a millisecond before the circuit's interval ends")
	f.clock.Set(opened.Add(open))
	probe := resolveN(append(ds, restarted...), 8)
	// One more unknown outcome reopens it at once; the held hand-outs too.
	reopened := f.clock.Now()
	settleN(ds, append(probe, keep...), unknown)
	if c := circuit(restarted[0]); c.ConsecutiveFailures != threshold+5+10 || !c.OpenUntil.Equal(reopened.Add(open)) {
		t.Fatalf("half-open, after 10 concurrent unknown outcomes: %+v, want %d failures, open until %s", c, threshold+15, reopened.Add(open))
	}
	refusedN(restarted, 3, "a reopened circuit")
	// Recovery: after the interval, concurrent completed and unknown
	// settlements (fewer unknown than the threshold): whatever their order,
	// the last completed clears the failures and the few unknown outcomes
	// after it cannot reopen the circuit.
	f.clock.Set(reopened.Add(open))
	mixed := resolveN(append(restarted, ds...), 8)
	settleN(append(restarted, ds...), mixed, func(k int) registry.RouteSettlement {
		if k < threshold-1 {
			return registry.SettlementOutcomeUnknown
		}
		return registry.SettlementCompleted
	})
	if c := circuit(ds[2]); c.ConsecutiveFailures >= threshold || !c.OpenUntil.IsZero() {
		t.Fatalf("after %d completed and %d unknown concurrent settlements: %+v, want closed with fewer than %d failures", 8-threshold+1, threshold-1, c, threshold)
	}
	resolveN(restarted, 4)
	f.settleAll(all, rep.ID)
	if c := circuit(f.b); c != (registry.CircuitState{}) {
		t.Fatalf("completed settlements left the circuit at %+v", c)
	}
}

// testRerouteRacesRetry races, per action, a reroute with valid refusal
// evidence of hand-out 1, a client's retry Resolve of the action and the
// settlement of hand-out 1, each through its own dispatcher. Either the
// reroute came first (the retry got the new assignment as hand-out 3, a
// later settlement of hand-out 1 lost its fence) or the retry did (the
// reroute is unsafe, the retry got hand-out 2 of the old route); each
// unknown outcome that settled counts once on the old replica's circuit
// and the ledger balances.
func testRerouteRacesRetry(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	seed := testSeed(t)
	pol := registry.FleetPolicy("quota:reroute")
	pol.CircuitFailureThreshold = 1 << 30 // count, never open
	w := newRouteWorld(f, &pol)
	var reps []string
	for _, n := range []string{"m1", "m2", "m3"} {
		reps = append(reps, f.replica(n, w.i, func(r *registry.ConnectorReplica) { r.Capacity = 100 }).ID)
	}
	ds := f.dispatchers(3)
	const actions = 24
	rng := rand.New(rand.NewPCG(seed, 1))
	type race struct {
		req                  registry.RouteRequest
		old                  registry.RouteAssignment
		evidence             registry.RefusalEvidence
		outcome              registry.RouteSettlement
		moved, resolved      registry.RouteAssignment
		rerouteErr, settleEr error
		resolveErr           error
	}
	races := make([]race, actions)
	for i := range races {
		r := &races[i]
		r.req = request("tenant-1", "alpha.read")
		r.old = f.resolve(r.req)
		r.evidence = RefusalEvidence(r.old, []string{registry.RefusalNotReady, registry.RefusalCapacity}[rng.IntN(2)])
		r.outcome = []registry.RouteSettlement{registry.SettlementOutcomeUnknown, registry.SettlementCancelled}[rng.IntN(2)]
	}
	perm := rng.Perm(3) // which handle runs which part
	parallel(3*actions, func(k int) {
		r := &races[k/3]
		d := ds[perm[k%3]]
		switch k % 3 {
		case 0:
			r.moved, r.rerouteErr = d.Rerouter.Reroute(f.ctx, registry.RerouteRequest{Current: r.old, Evidence: r.evidence})
		case 1:
			r.resolved, r.resolveErr = d.Resolver.Resolve(f.ctx, r.req)
		default:
			r.settleEr = d.Resolver.Settle(f.ctx, r.old, r.outcome)
		}
	})
	failures := map[string]uint32{}
	var ids []string
	for i := range races {
		r := &races[i]
		id := r.old.ActionID
		ids = append(ids, id)
		if r.resolveErr != nil {
			t.Fatalf("action %d: the retry failed: %v", i, r.resolveErr)
		}
		cur, err := f.b.Resolver.Assignment(f.ctx, id)
		f.must(err)
		rsv := f.reservation(id)
		h := f.history(id)
		switch {
		case r.rerouteErr == nil:
			if r.moved.ReplicaID == r.old.ReplicaID || r.moved.HandOut != 2 || !cur.Equal(&r.moved) || len(h) != 1 || !h[0].Equal(&r.old) {
				t.Fatalf("action %d rerouted to %s (hand-out %d): current %s, history %d", i, r.moved.ReplicaID, r.moved.HandOut, cur.FenceToken, len(h))
			}
			// The retry came after the reroute (had it come before,
			// the reroute would have been unsafe).
			if !r.resolved.Equal(&r.moved) || r.resolved.HandOut != 3 {
				t.Fatalf("action %d rerouted, but the retry got fence %s hand-out %d (new fence %s)", i, r.resolved.FenceToken, r.resolved.HandOut, r.moved.FenceToken)
			}
			if !rsv.Reserved || rsv.ReplicaID != r.moved.ReplicaID || rsv.HandOut != 3 {
				t.Fatalf("action %d rerouted: reservation %+v, want held on %s at hand-out 3", i, rsv, r.moved.ReplicaID)
			}
			if r.settleEr != nil && !errors.Is(r.settleEr, registry.ErrFenceLost) {
				t.Fatalf("action %d: the settlement of hand-out 1 beside a reroute: %v", i, r.settleEr)
			}
		case errors.Is(r.rerouteErr, registry.ErrRerouteUnsafe):
			if !r.resolved.Equal(&r.old) || r.resolved.HandOut != 2 || !cur.Equal(&r.old) || len(h) != 0 || rsv.HandOut != 2 {
				t.Fatalf("action %d: reroute unsafe, but the retry got fence %s hand-out %d; current %s, history %d, reservation %+v",
					i, r.resolved.FenceToken, r.resolved.HandOut, cur.FenceToken, len(h), rsv)
			}
			if r.settleEr != nil {
				t.Fatalf("action %d: the settlement of hand-out 1 of an unmoved route: %v", i, r.settleEr)
			}
			// Settled after the retry shared the reservation: released;
			// settled before it: the retry reserved it again.
			if rsv.Reserved != rsv.Retry || (!rsv.Reserved && rsv.LastSettlement != r.outcome) {
				t.Fatalf("action %d: reservation %+v after a settlement as %s and a retry", i, rsv, r.outcome)
			}
		default:
			t.Fatalf("action %d: reroute: %v, want success or ErrRerouteUnsafe", i, r.rerouteErr)
		}
		if r.settleEr == nil && r.outcome == registry.SettlementOutcomeUnknown {
			failures[r.old.ReplicaID]++
		}
	}
	for _, id := range reps {
		if got := f.getReplica(id).Circuit.ConsecutiveFailures; got != failures[id] {
			t.Fatalf("replica %s counts %d unknown outcomes, but %d settlements of its routes released one", id, got, failures[id])
		}
	}
	f.settleAll(ids, reps...)
}
