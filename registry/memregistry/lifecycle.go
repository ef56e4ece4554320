package memregistry

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/registry"
)

// Compile-time guards: Registry implements the lifecycle contract and the
// optional lister and readiness probe of the lifecycle service.
var (
	_ registry.Lifecycle     = (*Registry)(nil)
	_ registry.ReplicaLister = (*Registry)(nil)
	_ registry.Readiness     = (*Registry)(nil)
)

// lifecycleState holds the replay claims: a map by request ID and a heap by
// expiry for pruning.
type lifecycleState struct {
	claims map[string]*registry.ReplayClaim
	expiry claimHeap
}

type claimHeap []*registry.ReplayClaim

func (h claimHeap) Len() int           { return len(h) }
func (h claimHeap) Less(i, j int) bool { return h[i].ExpiresAt.Before(h[j].ExpiresAt) }
func (h claimHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *claimHeap) Push(x any)        { *h = append(*h, x.(*registry.ReplayClaim)) }
func (h *claimHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}

// lifecycle returns the lifecycle state, creating it on first use. Callers
// hold r.mu.
func (r *Registry) lifecycle() *lifecycleState {
	if r.lc == nil {
		r.lc = &lifecycleState{claims: make(map[string]*registry.ReplayClaim)}
	}
	return r.lc
}

// pruneClaims drops every claim that expired at now.
func (s *lifecycleState) pruneClaims(now time.Time) {
	for len(s.expiry) > 0 && !s.expiry[0].Live(now) {
		c := heap.Pop(&s.expiry).(*registry.ReplayClaim)
		if s.claims[c.RequestID] == c {
			delete(s.claims, c.RequestID)
		}
	}
}

// LifecycleReplica implements registry.Lifecycle.
func (r *Registry) LifecycleReplica(ctx context.Context, replicaID string) (registry.ConnectorReplica, error) {
	return r.ConnectorReplica(ctx, replicaID)
}

// ApplyLifecycle implements registry.Lifecycle: the call runs under the
// registry's mutex, so it is atomic and serialised with routing and lease
// expiry. It cannot fail part-way: once the context is checked, every
// command is decided and the changes and claims are stored together.
func (r *Registry) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := registry.CheckLifecycleBatch(cmds); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	lc := r.lifecycle()
	lc.pruneClaims(now)
	replicaIDs, requestIDs, registering := registry.LifecycleKeys(cmds)
	b := registry.LifecycleBatch{
		Now:       now,
		Replicas:  make(map[string]*registry.ConnectorReplica, len(replicaIDs)),
		Instances: make(map[string]*registry.ConnectorInstance, len(registering)),
		Versions:  make(map[string]*registry.LifecycleVersion, len(registering)),
		Claims:    make(map[string]*registry.ReplayClaim, len(requestIDs)),
	}
	for _, id := range replicaIDs {
		if e, ok := r.replicas[id]; ok {
			rec := e.rec
			b.Replicas[id] = &rec
		}
	}
	for _, id := range registering {
		rep, ok := b.Replicas[id]
		if !ok {
			continue
		}
		if inst, ok := r.instances[rep.InstanceID]; ok {
			rec := inst.rec
			b.Instances[rec.ID] = &rec
		}
		if _, done := b.Versions[rep.VersionID]; !done {
			if v, ok := r.versions[rep.VersionID]; ok {
				lv := registry.NewLifecycleVersion(&v.rec)
				b.Versions[lv.ID] = &lv
			}
		}
	}
	for _, id := range requestIDs {
		if c, ok := lc.claims[id]; ok && c.Live(now) {
			cl := *c
			b.Claims[id] = &cl
		}
	}
	results := b.Apply(cmds)
	for _, rep := range b.ChangedReplicas() {
		e := r.replicas[rep.ID]
		e.rec = rep
		r.track(e)
	}
	for _, c := range b.NewClaims() {
		cl := c
		lc.claims[cl.RequestID] = &cl
		heap.Push(&lc.expiry, &cl)
	}
	return results, nil
}

// ListReplicas implements registry.ReplicaLister.
func (r *Registry) ListReplicas(ctx context.Context, after string, limit int) ([]registry.ConnectorReplica, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit = registry.ClampReplicaPage(limit)
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]string, 0, len(r.replicas))
	for id := range r.replicas {
		if id > after {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, strings.Compare)
	ids = ids[:min(limit, len(ids))]
	out := make([]registry.ConnectorReplica, len(ids))
	for i, id := range ids {
		out[i] = r.replicas[id].rec
	}
	return out, nil
}

// Readiness implements registry.Readiness: the in-memory backend has no
// schema (version 0) and no pool, and is ready while it answers.
func (r *Registry) Readiness(ctx context.Context) (registry.StoreReadiness, error) {
	if err := ctx.Err(); err != nil {
		return registry.StoreReadiness{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return registry.StoreReadiness{
		Backend:         "memory",
		CatalogRevision: r.revision,
		Checks: []registry.ReadinessCheck{
			{Name: "catalog", OK: true, Message: fmt.Sprintf("catalog revision %d", r.revision)},
			{Name: "replicas", OK: true, Message: fmt.Sprintf("%d replicas, %d live", len(r.replicas), len(r.live))},
		},
	}, nil
}

// replayClaims returns the number of stored claims (tests).
func (r *Registry) replayClaims() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lifecycle().claims)
}
