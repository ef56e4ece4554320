package memregistry

import (
	"context"
	"fmt"
	"slices"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Compile-time guard: Registry implements the reroute contract.
var _ registry.Rerouter = (*Registry)(nil)

// Reroute implements registry.Rerouter. The evidence is checked before the
// mutex is taken; the rest runs under it, so it is atomic with routing,
// settlement and lease expiry.
func (r *Registry) Reroute(ctx context.Context, req registry.RerouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	cur := &req.Current
	rreq := registry.RerouteRouteRequest(&req)
	if err := rreq.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if _, err := registry.CheckRefusal(cur, &req.Evidence); err != nil {
		return registry.RouteAssignment{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[cur.ActionID]
	if !ok {
		return registry.RouteAssignment{}, fmt.Errorf("route of action %s: %w", cur.ActionID, registry.ErrNotFound)
	}
	if !rt.a.Equal(cur) {
		return registry.RouteAssignment{}, registry.RerouteFenceLost(cur)
	}
	if rt.resolvedAgain {
		return registry.RouteAssignment{}, registry.RerouteUnsafe(cur)
	}
	if len(r.history[cur.ActionID]) >= registry.MaxRouteHistory {
		return registry.RouteAssignment{}, registry.RerouteHistoryFull(cur.ActionID)
	}
	now := r.clock()
	bestB, bestR, err := r.pick(&rreq, now, cur.ReplicaID)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	inst := bestB.inst
	admission := registry.NewReservation(r.policyFor(bestB), &bestB.rec, inst.rec.ConnectorTypeID, bestB.scopeKey)
	// Release the old reservation first (its scopes may be the ones the new
	// route needs), and take it back if the new one cannot be made.
	wasReserved, oldRetry, oldLast := rt.reserved, rt.retry, rt.last
	if wasReserved {
		r.unreserve(rt, registry.SettlementCancelled)
	}
	if err := r.reserve(admission.BaseScopes); err != nil {
		if wasReserved {
			rt.retry = oldRetry
			for _, s := range rt.scopes() { // the exact inverse of release
				r.counters[scopeID{s.Kind, s.Key}]++
			}
			rt.replica.rec.ActiveAssignments++
			rt.replica.reserved[cur.ActionID] = rt
			rt.reserved, rt.retry, rt.last = true, oldRetry, oldLast
		}
		return registry.RouteAssignment{}, err
	}
	bestR.rec.ActiveAssignments++
	next := &routeEntry{
		a:        registry.NewAssignment(&rreq, &bestB.rec, &inst.version.rec, &bestR.rec, r.revision, admission, aip.NewID(aip.PrefixRoute), now),
		replica:  bestR,
		reserved: true,
	}
	if r.history == nil {
		r.history = make(map[string][]registry.RouteAssignment)
	}
	r.history[cur.ActionID] = append(r.history[cur.ActionID], rt.a.Clone())
	r.routes[cur.ActionID] = next
	bestR.reserved[cur.ActionID] = next
	return next.a.Clone(), nil
}

// RouteHistory implements registry.Rerouter.
func (r *Registry) RouteHistory(ctx context.Context, actionID string) ([]registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.routes[actionID]; !ok {
		return nil, fmt.Errorf("route of action %s: %w", actionID, registry.ErrNotFound)
	}
	h := r.history[actionID]
	out := make([]registry.RouteAssignment, len(h))
	for i := range h {
		out[i] = h[i].Clone()
	}
	return slices.Clip(out), nil
}
