package pgregistry_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestTwoPoolsNeverOverbook resolves 1 000 distinct actions at once through
// two independent registries (each with its own pools) on one database,
// settling some as it goes, and checks that no replica and no admission
// counter was ever booked past its limit: every counter equals the live
// reservations holding it, every replica's active count equals the live
// reservations on it and stays within its capacity. It runs on two fleet
// shapes: two bindings of one priority per tenant and capability (every
// route reads and ranks the candidates of both), and one binding (routes
// go straight to the cached binding's replicas).
func TestTwoPoolsNeverOverbook(t *testing.T) {
	// 80 replica slots either way; the global limit and the replicas run
	// out first.
	t.Run("two bindings", func(t *testing.T) { testTwoPoolsNeverOverbook(t, 2, 2) })
	t.Run("one binding", func(t *testing.T) { testTwoPoolsNeverOverbook(t, 1, 4) })
}

func testTwoPoolsNeverOverbook(t *testing.T, instancesPer, replicasPer int) {
	ctx := t.Context()
	a, dbURL, clock := openClock(t, pgregistry.Config{})
	pol := registry.ConservativePolicy("quota:tight")
	pol.MaxGlobalInFlight, pol.MaxTenantInFlight, pol.MaxInstanceInFlight, pol.MaxBindingInFlight = 70, 30, 14, 12
	w := seedWorld(t, a, clock, pol, 4, instancesPer, replicasPer, 5)
	b, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL, Now: clock.Now, DataMaxConns: 16})
	must(t, err)
	defer b.Close()

	const actions, workers = 1000, 16
	regs := []*pgregistry.Registry{a, b}
	var (
		mu                            sync.Mutex
		routed, settled, full, noRoom int
		held                          = map[string]int{} // live routes per replica, as the callers saw them
		unexpected                    []error
		wg                            sync.WaitGroup
	)
	next := make(chan int, actions)
	for i := range actions {
		next <- i
	}
	close(next)
	for k := range 2 * workers {
		reg := regs[k%2]
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(k), 11))
			for i := range next {
				req := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantName(i % 4), CapabilityID: []string{"alpha.read", "alpha.write"}[i%2]}
				as, err := reg.Resolve(ctx, req)
				mu.Lock()
				switch {
				case err == nil:
					routed++
					held[as.ReplicaID]++
				case errors.Is(err, registry.ErrCapacityExceeded):
					full++
				case errors.Is(err, registry.ErrReplicaUnavailable):
					noRoom++
				default:
					unexpected = append(unexpected, err)
				}
				mu.Unlock()
				if err == nil && rng.IntN(3) == 0 {
					// Settle through the other registry.
					other := regs[(k+1)%2]
					if err := other.Settle(ctx, as, registry.SettlementCompleted); err != nil {
						mu.Lock()
						unexpected = append(unexpected, fmt.Errorf("settle: %w", err))
						mu.Unlock()
						continue
					}
					mu.Lock()
					settled++
					held[as.ReplicaID]--
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for _, err := range unexpected {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	if routed == 0 || full+noRoom == 0 {
		t.Fatalf("%d routed, %d refused: the test must both route and hit limits", routed, full+noRoom)
	}
	l, err := a.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)
	if len(l.Reservations) != routed-settled {
		t.Fatalf("%d live reservations, want %d routed - %d settled", len(l.Reservations), routed, settled)
	}
	perReplica := map[string]int{}
	for _, r := range l.Reservations {
		perReplica[r.ReplicaID]++
	}
	for _, rep := range w.replicas {
		got, err := b.ConnectorReplica(ctx, rep.ID)
		must(t, err)
		if int(got.ActiveAssignments) != perReplica[rep.ID] || perReplica[rep.ID] != held[rep.ID] {
			t.Fatalf("replica %s: %d active, %d live reservations, callers hold %d", rep.ID, got.ActiveAssignments, perReplica[rep.ID], held[rep.ID])
		}
		if got.ActiveAssignments > got.Capacity {
			t.Fatalf("replica %s overbooked: %d active over capacity %d", rep.ID, got.ActiveAssignments, got.Capacity)
		}
	}
	limits := map[registry.AdmissionScopeKind]uint32{
		registry.ScopeGlobal: pol.MaxGlobalInFlight, registry.ScopeTenant: pol.MaxTenantInFlight,
		registry.ScopeConnectorType: pol.MaxConnectorTypeInFlight, registry.ScopeInstance: pol.MaxInstanceInFlight,
		registry.ScopeBinding: pol.MaxBindingInFlight,
	}
	for _, c := range l.Counters {
		if c.Active > limits[c.Kind] {
			t.Fatalf("counter %s %q overbooked: %d over its limit %d", c.Kind, c.Key, c.Active, limits[c.Kind])
		}
	}
	t.Logf("%d actions through two pools: %d routed (%d settled), %d at an admission limit, %d without a replica", actions, routed, settled, full, noRoom)
}
