package controlplane_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
)

// lookupCounter counts the replica lookups of the control plane's key
// cache (a database query on the PostgreSQL backend).
type lookupCounter struct {
	controlplane.Store
	n atomic.Int64
}

func (s *lookupCounter) LifecycleReplica(ctx context.Context, id string) (registry.ConnectorReplica, error) {
	s.n.Add(1)
	return s.Store.LifecycleReplica(ctx, id)
}

// TestMalformedReplicaIDIsNotLookedUp: a signed request naming a replica
// ID no registry can hold (every replica record's ID is "crepl_" and up to
// 250 letters, digits, '.', '_' or '-') is refused as not pre-provisioned
// before any lookup: an unauthenticated caller could otherwise make each
// request cost a registry query carrying up to 64 KiB of ID, copied into
// the logs, the trace and the answer. The answer quotes the ID cut short.
func TestMalformedReplicaIDIsNotLookedUp(t *testing.T) {
	counter := &lookupCounter{}
	e := newWrappedEnv(t, newMemBackend, func(s controlplane.Store) controlplane.Store { counter.Store = s; return counter })
	h := e.provision("a1")
	for _, id := range []string{
		aip.PrefixReplica + strings.Repeat("x", 60_000),
		aip.PrefixReplica + strings.Repeat("x", aip.MaxRecordIDBytes),
		"cinst_not-a-replica",
		aip.PrefixReplica + "a/../b",
		aip.PrefixReplica,
	} {
		req := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: 1, ConnectorReady: true}))
		r := e.post(h.seal(req), req.RequestID)
		r.rejected(t, http.StatusForbidden, "is not a replica ID")
		if len(r.outcome.Message) > 1000 {
			t.Errorf("the answer to a %d-byte replica ID is %d bytes: %.200s...", len(id), len(r.outcome.Message), r.outcome.Message)
		}
	}
	if n := counter.n.Load(); n != 0 {
		t.Fatalf("%d replica lookups for IDs no replica can have", n)
	}
	// A well-formed ID is looked up (and this one is not provisioned).
	req := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: aip.PrefixReplica + "ghost", PreviousSequence: 1, ConnectorReady: true}))
	e.post(h.seal(req), req.RequestID).rejected(t, http.StatusForbidden, "not pre-provisioned")
	if n := counter.n.Load(); n != 1 {
		t.Fatalf("%d lookups for a well-formed unknown ID, want 1", n)
	}
}
