package registrytest

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// RandomWorkload drives a fresh backend through a seeded random sequence of
// steps operations — new routes and retries with assorted topology
// preferences, settlements with every outcome (of the last hand-out, of
// earlier hand-outs of the current assignment, and of superseded
// assignments), orphan settlements of the hand-out read or an earlier one,
// reroutes on valid evidence, bindings,
// instances and the policy disabled and enabled again, replica drains,
// offline transitions, re-registrations, lease expiry and the release of
// reservations stranded on offline replicas as the clock moves — on a small
// fleet whose limits bind. After every operation it checks the rules a
// simple model of the registry gives:
//
//   - every admission counter equals the live reservations holding its
//     scope, and every replica's active assignments equal the live
//     reservations on it (no leak, no double release, nothing negative);
//   - an action's assignment changes only through a successful Reroute, to
//     another replica: a Resolve of a routed action returns its current
//     assignment or fails, never a new one;
//   - hand-outs are numbered: a new route is hand-out 1, every successful
//     Resolve of a routed action and every Reroute takes the next number,
//     and nothing else does;
//   - a settlement or reroute presenting a superseded assignment is
//     ErrFenceLost and changes nothing;
//   - a settlement presenting a hand-out earlier than the one that made
//     the current reservation (the model knows which did: a Resolve that
//     found the route released, or a Reroute) succeeds and changes
//     nothing — not the reservation, the ledger or any replica; one at or
//     after it releases the reservation;
//   - an orphan settlement releases the reservation exactly when the
//     hand-out it presents is the route's last one, and is ErrConflict
//     otherwise while the route is reserved;
//   - after a stranded-reservation release that took fewer replicas than
//     its limit, no live reservation is stranded (registry.Stranded).
//
// It returns the trace of the run: one line per operation with its result
// class and the replica it chose, without fence tokens or times, so two
// backends given the same seed can be compared line by line. Only the
// stripe-independent limits are used (every finite admission limit equal),
// so the trace does not depend on pgregistry's counter stripes.
func RandomWorkload(t *testing.T, nb NewBackend, seed uint64, steps int) []string {
	t.Helper()
	return randomWorkload(t, nb, seed, steps, registry.AdmissionPolicy{
		PolicyRef: "quota:model", Revision: 1, Enabled: true,
		MaxGlobalInFlight: registry.Unlimited, MaxTenantInFlight: 4, MaxConnectorTypeInFlight: registry.Unlimited,
		MaxInstanceInFlight: 4, MaxBindingInFlight: 4, MaxTenantRetryInFlight: 4,
		CircuitFailureThreshold: 2, CircuitOpenMS: 3_000,
	})
}

// randomWorkload is RandomWorkload under admission policy pol.
func randomWorkload(t *testing.T, nb NewBackend, seed uint64, steps int, pol registry.AdmissionPolicy) []string {
	t.Helper()
	f := newFx(t, nb)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, pol))
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	ia := f.instance("a", v, "tenant-1")
	ib := f.instance("b", v, "tenant-1")
	f.bind(ia, "alpha.read", 0, pol.PolicyRef)
	bindB := f.bind(ib, "alpha.read", 1, pol.PolicyRef)
	type replicaSpec struct {
		name string
		inst registry.ConnectorInstance
		topo aip.Topology
		cap  uint32
	}
	specs := []replicaSpec{
		{"a1", ia, aip.Topology{Region: "eu", Zone: "eu-1", CapacityClass: "std"}, 2},
		{"a2", ia, aip.Topology{Region: "us", Zone: "us-1", CapacityClass: "std"}, 2},
		{"a3", ia, aip.Topology{Region: "eu", Zone: "eu-2", CapacityClass: "big"}, 1},
		{"b1", ib, aip.Topology{Region: "us", Zone: "us-2", CapacityClass: "std"}, 3},
	}
	replicaIDs := make([]string, len(specs))
	for i, s := range specs {
		r := f.replica(s.name, s.inst, func(r *registry.ConnectorReplica) {
			r.Topology, r.Capacity = s.topo, s.cap
			r.LeaseExpiresAt = f.clock.Now().Add(time.Duration(20+rng.IntN(40)) * time.Second)
		})
		replicaIDs[i] = r.ID
	}
	actions := make([]string, 14)
	for i := range actions {
		actions[i] = modelActionID(rng)
	}
	prefs := []registry.RouteTopologyPreference{
		{}, {Region: "eu"}, {Region: "us", Zone: "us-2"}, {Region: "eu", ForbidCrossRegion: true}, {CapacityClass: "big"},
	}
	var trace []string
	step := 0
	current := map[string]registry.RouteAssignment{}
	superseded := map[string][]registry.RouteAssignment{}
	// handOuts are the hand-outs of each action's current assignment, in
	// order; reservedBy the one that made its latest reservation.
	handOuts := map[string][]registry.RouteAssignment{}
	reservedBy := map[string]uint64{}
	// snapshot is what a settlement that changes nothing must leave.
	type snapshot struct {
		ledger   registry.Ledger
		res      registry.RouteReservation
		replicas []registry.ConnectorReplica
	}
	snap := func(id string) snapshot {
		t.Helper()
		l, err := f.b.Fleet.Ledger(f.ctx)
		f.must(err)
		s := snapshot{ledger: l, res: f.reservation(id)}
		for _, rid := range replicaIDs {
			s.replicas = append(s.replicas, f.getReplica(rid))
		}
		return s
	}
	sameSnap := func(before snapshot, id, what string) {
		t.Helper()
		after := snap(id)
		if diff := cmp.Diff(before.ledger, after.ledger); diff != "" {
			t.Fatalf("step %d %s: the ledger changed (-before +after):\n%s", step, what, diff)
		}
		if diff := cmp.Diff(before.res, after.res); diff != "" {
			t.Fatalf("step %d %s: the reservation of %s changed (-before +after):\n%s", step, what, id, diff)
		}
		for i := range before.replicas {
			if !registry.ReplicaEqual(&before.replicas[i], &after.replicas[i]) {
				t.Fatalf("step %d %s: replica %s changed: %+v, was %+v", step, what, replicaIDs[i], after.replicas[i], before.replicas[i])
			}
		}
	}
	logf := func(format string, args ...any) {
		trace = append(trace, fmt.Sprintf("%03d ", step)+fmt.Sprintf(format, args...))
	}
	outcomes := []registry.RouteSettlement{registry.SettlementCompleted, registry.SettlementOutcomeUnknown, registry.SettlementCancelled}
	// unchanged fails unless the action's stored assignment is still the
	// model's current one.
	unchanged := func(id, what string) {
		t.Helper()
		cur, ok := current[id]
		got, err := f.b.Resolver.Assignment(f.ctx, id)
		switch {
		case !ok && !errors.Is(err, registry.ErrNotFound):
			t.Fatalf("step %d %s: unrouted action %s has assignment %+v (%v)", step, what, id, got, err)
		case ok && (err != nil || !got.Equal(&cur)):
			t.Fatalf("step %d %s: action %s's assignment moved from replica %s to %s (%v)", step, what, id, cur.ReplicaID, got.ReplicaID, err)
		}
	}
	for step = range steps {
		id := actions[rng.IntN(len(actions))]
		switch op := rng.IntN(100); {
		case op < 33: // resolve: a new route or a retry
			req := registry.RouteRequest{ActionID: id, TenantID: "tenant-1", CapabilityID: "alpha.read", Topology: prefs[rng.IntN(len(prefs))]}
			cur, routed := current[id]
			wasReserved := routed && f.reservation(id).Reserved
			a, err := f.b.Resolver.Resolve(f.ctx, req)
			switch {
			case err != nil:
				unchanged(id, "failed resolve")
				if routed && f.reservation(id).HandOut != cur.HandOut {
					t.Fatalf("step %d: a failed resolve of %s moved its hand-out from %d to %d", step, id, cur.HandOut, f.reservation(id).HandOut)
				}
			case routed && !a.Equal(&cur):
				t.Fatalf("step %d: a resolve of routed action %s returned a new assignment (replica %s, was %s)", step, id, a.ReplicaID, cur.ReplicaID)
			case routed && a.HandOut != cur.HandOut+1, !routed && a.HandOut != 1:
				t.Fatalf("step %d: a resolve of %s (routed %t, last hand-out %d) was handed out as %d", step, id, routed, cur.HandOut, a.HandOut)
			default:
				current[id] = a
				handOuts[id] = append(handOuts[id], a)
				if !wasReserved {
					reservedBy[id] = a.HandOut
				}
			}
			logf("resolve %s routed=%t: %s %s #%d", id, routed, errClass(err), a.ReplicaID, a.HandOut)
		case op < 48: // settle the last hand-out of the current assignment
			cur, ok := current[id]
			if !ok {
				continue
			}
			outcome := outcomes[rng.IntN(len(outcomes))]
			err := f.b.Resolver.Settle(f.ctx, cur, outcome)
			if err != nil {
				t.Fatalf("step %d: settling the current assignment of %s: %v", step, id, err)
			}
			if f.reservation(id).Reserved {
				t.Fatalf("step %d: settling the last hand-out of %s left it reserved", step, id)
			}
			logf("settle %s %s: %s", id, outcome, errClass(err))
		case op < 60: // settle an earlier hand-out of the current assignment
			// Of the actions handed out more than once (not only the one
			// drawn), mostly one whose earlier hand-outs lost their
			// reservation.
			var withEarlier, withStale []string
			for _, a := range actions {
				if hs := handOuts[a]; len(hs) > 1 {
					withEarlier = append(withEarlier, a)
					if hs[0].HandOut < reservedBy[a] {
						withStale = append(withStale, a)
					}
				}
			}
			if len(withEarlier) == 0 {
				continue
			}
			id = withEarlier[rng.IntN(len(withEarlier))]
			if len(withStale) > 0 && rng.IntN(3) > 0 {
				id = withStale[rng.IntN(len(withStale))]
			}
			hs := handOuts[id]
			h := hs[rng.IntN(len(hs)-1)]
			outcome := outcomes[rng.IntN(len(outcomes))]
			before := snap(id)
			if err := f.b.Resolver.Settle(f.ctx, h, outcome); err != nil {
				t.Fatalf("step %d: settling hand-out %d of %s: %v", step, h.HandOut, id, err)
			}
			stale := h.HandOut < reservedBy[id]
			switch {
			case stale:
				sameSnap(before, id, fmt.Sprintf("a settlement of hand-out %d of %s (reserved by %d)", h.HandOut, id, reservedBy[id]))
			case f.reservation(id).Reserved:
				t.Fatalf("step %d: settling hand-out %d of %s, which shares its reservation (made by %d), left it reserved", step, h.HandOut, id, reservedBy[id])
			}
			logf("settle-earlier %s #%d %s: stale=%t", id, h.HandOut, outcome, stale)
		case op < 65: // settle a superseded assignment
			old := superseded[id]
			if len(old) == 0 {
				continue
			}
			err := f.b.Resolver.Settle(f.ctx, old[rng.IntN(len(old))], outcomes[rng.IntN(len(outcomes))])
			if !errors.Is(err, registry.ErrFenceLost) {
				t.Fatalf("step %d: settling a superseded assignment of %s: got %v, want ErrFenceLost", step, id, err)
			}
			unchanged(id, "stale settle")
			logf("settle-stale %s: %s", id, errClass(err))
		case op < 70: // orphan settlement of what the reservation says now, or before
			cur, ok := current[id]
			if !ok {
				continue
			}
			res := f.reservation(id)
			seen := res.HandOut
			if rng.IntN(3) == 0 && seen > 1 {
				seen -= 1 + uint64(rng.IntN(int(seen-1)))
			}
			err := f.b.Orphans.SettleOrphan(f.ctx, cur, registry.SettlementCancelled, seen)
			switch released := !f.reservation(id).Reserved; {
			case res.Reserved && seen == res.HandOut && (err != nil || !released):
				t.Fatalf("step %d: an orphan settlement of %s's last hand-out %d: %v, released %t", step, id, seen, err, released)
			case res.Reserved && seen != res.HandOut && (!errors.Is(err, registry.ErrConflict) || released):
				t.Fatalf("step %d: an orphan settlement of %s's hand-out %d (last %d): %v, released %t; want ErrConflict, kept", step, id, seen, res.HandOut, err, released)
			case !res.Reserved && err != nil:
				t.Fatalf("step %d: an orphan settlement of %s's released route: %v", step, id, err)
			}
			logf("orphan %s reserved=%t #%d/%d: %s", id, res.Reserved, seen, res.HandOut, errClass(err))
		case op < 80: // reroute on valid evidence, or on a superseded assignment
			cur, ok := current[id]
			if !ok {
				continue
			}
			stale := false
			if old := superseded[id]; len(old) > 0 && rng.IntN(4) == 0 {
				cur, stale = old[rng.IntN(len(old))], true
			}
			code := registry.RefusalNotReady
			if rng.IntN(2) == 0 {
				code = registry.RefusalCapacity
			}
			req := registry.RerouteRequest{Current: cur, Evidence: RefusalEvidence(cur, code), Topology: prefs[rng.IntN(len(prefs))]}
			a, err := f.b.Rerouter.Reroute(f.ctx, req)
			switch {
			case stale && !errors.Is(err, registry.ErrFenceLost):
				t.Fatalf("step %d: rerouting a superseded assignment of %s: got %v, want ErrFenceLost", step, id, err)
			case err != nil:
				unchanged(id, "failed reroute")
			case a.ReplicaID == cur.ReplicaID:
				t.Fatalf("step %d: reroute of %s stayed on the refusing replica %s", step, id, a.ReplicaID)
			case a.HandOut != current[id].HandOut+1:
				t.Fatalf("step %d: reroute of %s (last hand-out %d) was handed out as %d", step, id, current[id].HandOut, a.HandOut)
			default:
				superseded[id] = append(superseded[id], cur)
				current[id] = a
				handOuts[id] = []registry.RouteAssignment{a}
				reservedBy[id] = a.HandOut
				unchanged(id, "reroute")
			}
			logf("reroute %s stale=%t: %s %s", id, stale, errClass(err), a.ReplicaID)
		case op < 88: // the clock moves; lease maintenance runs
			f.clock.Advance(time.Duration(rng.IntN(8000)) * time.Millisecond)
			n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 1+rng.IntN(3))
			f.must(err)
			// The model's clock moves seconds a step, so its grace is
			// seconds too.
			rel, err := f.b.Fleet.ReleaseStrandedReservations(f.ctx, modelStrandedGrace, modelStrandedLimit)
			f.must(err)
			if rel.Replicas < modelStrandedLimit {
				noneStranded(t, f, step, replicaIDs)
			}
			logf("expire: %d; stranded: %d replicas, %d reservations", n, rel.Replicas, rel.Reservations)
		case op < 92: // the catalog changes: a binding, an instance or the policy toggles
			switch rng.IntN(3) {
			case 0:
				bindB.Enabled, bindB.PolicyRevision = !bindB.Enabled, bindB.PolicyRevision+1
				f.must(f.b.Admin.PutBinding(f.ctx, bindB))
				logf("binding b enabled=%t", bindB.Enabled)
			case 1:
				ia.Status, ia.ConfigRevision = registry.InstanceDisabled, ia.ConfigRevision+1
				if rng.IntN(2) == 0 {
					ia.Status = registry.InstanceEnabled
				}
				f.must(f.b.Admin.PutInstance(f.ctx, ia))
				logf("instance a %s", ia.Status)
			default:
				pol.Enabled, pol.Revision = !pol.Enabled, pol.Revision+1
				f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, pol))
				logf("policy enabled=%t", pol.Enabled)
			}
		default: // a replica heartbeats, drains, goes offline, or re-registers
			rid := replicaIDs[rng.IntN(len(replicaIDs))]
			status := aip.ReplicaReady
			switch rng.IntN(6) {
			case 0, 1:
				status = aip.ReplicaDraining
			case 2:
				status = aip.ReplicaOffline
			}
			until := f.clock.Now().Add(time.Duration(5+rng.IntN(30)) * time.Second)
			if status == aip.ReplicaOffline {
				until = f.clock.Now() // going offline ends the lease, as the lifecycle does
			}
			f.update(rid, func(r *registry.ConnectorReplica) {
				r.Status, r.LeaseExpiresAt = status, until
			})
			logf("replica %s %s", rid, status)
		}
		f.checkLedger(replicaIDs...)
	}
	// Every route's history is what the model saw moved.
	for _, id := range actions {
		if _, ok := current[id]; !ok {
			continue
		}
		h := f.history(id)
		if len(h) != len(superseded[id]) {
			t.Fatalf("action %s has %d superseded assignments, the model %d", id, len(h), len(superseded[id]))
		}
		for i := range h {
			if !h[i].Equal(&superseded[id][i]) {
				t.Fatalf("action %s history[%d] is replica %s, the model's %s", id, i, h[i].ReplicaID, superseded[id][i].ReplicaID)
			}
		}
		unchanged(id, "end")
	}
	// Settling every live reservation brings every counter and replica
	// back to zero.
	l, err := f.b.Fleet.Ledger(f.ctx)
	f.must(err)
	for _, res := range l.Reservations {
		a, err := f.b.Resolver.Assignment(f.ctx, res.ActionID)
		f.must(err)
		if err := f.b.Resolver.Settle(f.ctx, a, registry.SettlementCompleted); err != nil {
			t.Fatalf("end: settling the reservation of %s: %v", res.ActionID, err)
		}
	}
	if l := f.checkLedger(replicaIDs...); len(l.Counters) > 0 || len(l.Reservations) > 0 {
		t.Fatalf("end: after settling every reservation the ledger holds %d counters and %d reservations: %+v", len(l.Counters), len(l.Reservations), l.Counters)
	}
	return trace
}

// The model workload's stranded-reservation release.
const (
	modelStrandedGrace = 2 * time.Second
	modelStrandedLimit = 2
)

// noneStranded fails unless no live reservation is stranded (after a
// release that took fewer replicas than its limit).
func noneStranded(t *testing.T, f *fx, step int, replicaIDs []string) {
	t.Helper()
	l, err := f.b.Fleet.Ledger(f.ctx)
	f.must(err)
	cutoff := registry.StrandedCutoff(f.clock.Now(), modelStrandedGrace)
	replicas := map[string]registry.ConnectorReplica{}
	for _, id := range replicaIDs {
		replicas[id] = f.getReplica(id)
	}
	for _, res := range l.Reservations {
		if rep := replicas[res.ReplicaID]; registry.Stranded(&rep, res.HandedOutAt, cutoff) {
			t.Fatalf("step %d: the reservation of %s on offline replica %s (lease ended %s, handed out %s) is still held after a release that took fewer replicas than its limit",
				step, res.ActionID, rep.ID, rep.LeaseExpiresAt, res.HandedOutAt)
		}
	}
}

// modelActionID returns an action ID drawn from rng, so two runs with one
// seed route the same actions (the route hash depends on the ID).
func modelActionID(rng *rand.Rand) string {
	b := make([]byte, 16)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%s%x", aip.PrefixAction, b)
}

// errClass names the contract error err matches ("ok" for nil), with the
// scope of a capacity refusal.
func errClass(err error) string {
	if err == nil {
		return "ok"
	}
	var ce *registry.CapacityExceededError
	if errors.As(err, &ce) {
		return "capacity:" + string(ce.Scope)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"invalid", registry.ErrInvalid}, {"not_found", registry.ErrNotFound}, {"conflict", registry.ErrConflict},
		{"fence_lost", registry.ErrFenceLost}, {"binding_unavailable", registry.ErrBindingUnavailable},
		{"replica_unavailable", registry.ErrReplicaUnavailable}, {"reroute_unsafe", registry.ErrRerouteUnsafe},
		{"evidence", registry.ErrEvidence}, {"storage", registry.ErrStorage},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	return "other:" + err.Error()
}

func runModel(t *testing.T, nb NewBackend) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("Seed%d", seed), func(t *testing.T) { RandomWorkload(t, nb, seed, 150) })
		t.Run(fmt.Sprintf("ScopeLimitsSeed%d", seed), func(t *testing.T) { RandomScopeWorkload(t, nb, seed, 150) })
	}
}
