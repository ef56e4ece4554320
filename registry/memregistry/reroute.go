package memregistry

import (
	"context"
	"slices"

	"github.com/aipfleet/aipfleet/registry"
)

// Compile-time guard: Registry implements the reroute contract.
var _ registry.Rerouter = (*Registry)(nil)

// Compile-time guard: Registry pins routes a cancel is sent under.
var _ registry.RoutePinner = (*Registry)(nil)

// Compile-time guard: Registry releases unsent hand-outs (memregistry.go).
var _ registry.UnsentReleaser = (*Registry)(nil)

// Reroute implements registry.Rerouter. The evidence (or the unsent
// claim's form) is checked before the mutex is taken; the rest runs under
// it, so it is atomic with routing, settlement and lease expiry.
func (r *Registry) Reroute(ctx context.Context, req registry.RerouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	cur := &req.Current
	rreq := registry.RerouteRouteRequest(&req)
	if err := rreq.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if err := registry.CheckRerouteGrounds(&req); err != nil {
		return registry.RouteAssignment{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[cur.ActionID]
	if !ok {
		return registry.RouteAssignment{}, registry.RouteNotFound(cur.ActionID)
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
	// rt.claim is always the last hand-out's (every hand-out sets it).
	if err := registry.UnsentHolder(&req, rt.claim, rt.a.HandOut, rt.a.HandOut); err != nil {
		return registry.RouteAssignment{}, err
	}
	now := r.clock()
	bestB, bestR, err := r.pick(&rreq, now, cur.ReplicaID)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	next, err := r.place(&rreq, bestB, bestR, rt, now)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	if r.history == nil {
		r.history = make(map[string][]registry.RouteAssignment)
	}
	r.history[cur.ActionID] = append(r.history[cur.ActionID], rt.a.Clone())
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
		return nil, registry.RouteNotFound(actionID)
	}
	h := r.history[actionID]
	out := make([]registry.RouteAssignment, len(h))
	for i := range h {
		out[i] = h[i].Clone()
	}
	return slices.Clip(out), nil
}

// PinRoute implements registry.RoutePinner, under the mutex, so it is
// atomic with Reroute.
func (r *Registry) PinRoute(ctx context.Context, a registry.RouteAssignment) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[a.ActionID]
	if !ok {
		return registry.RouteNotFound(a.ActionID)
	}
	if !rt.a.Equal(&a) {
		return registry.RerouteFenceLost(&a)
	}
	rt.resolvedAgain = true
	return nil
}
