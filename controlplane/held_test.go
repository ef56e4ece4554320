package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
)

// heldStore answers the next command of replica held undecided, as a
// database backend does when another session holds the replica's row past
// its bounded lock wait (registry.LifecycleBatch.Held); the other commands
// of the call are decided by the store.
type heldStore struct {
	controlplane.Store
	mu   sync.Mutex
	held string
}

func (s *heldStore) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	s.mu.Lock()
	held := s.held
	s.held = ""
	s.mu.Unlock()
	var rest []registry.LifecycleCommand
	for _, c := range cmds {
		if c.ReplicaID() != held {
			rest = append(rest, c)
		}
	}
	var got []registry.LifecycleResult
	if len(rest) > 0 {
		var err error
		if got, err = s.Store.ApplyLifecycle(ctx, rest); err != nil {
			return nil, err
		}
	}
	out := make([]registry.LifecycleResult, 0, len(cmds))
	for _, c := range cmds {
		if c.ReplicaID() == held {
			out = append(out, registry.LifecycleResult{Err: fmt.Errorf("%w: replica %s is held", registry.ErrStorage, held)})
			continue
		}
		out, got = append(out, got[0]), got[1:]
	}
	return out, nil
}

// TestHeldReplicaIsUnavailable: a command the registry left undecided
// because its replica was held by another transaction is answered 503,
// retryable (nothing of it was committed or claimed), not refused as
// malformed: the same bytes resent are decided.
func TestHeldReplicaIsUnavailable(t *testing.T) {
	held := &heldStore{}
	e := newWrappedEnv(t, newMemBackend, func(s controlplane.Store) controlplane.Store { held.Store = s; return held })
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))
	hb := h.request(h.heartbeat(1, 0, true))
	body := h.seal(hb)
	held.mu.Lock()
	held.held = h.rep.ID
	held.mu.Unlock()
	e.post(body, hb.RequestID).rejected(t, http.StatusServiceUnavailable, "resend the same request")
	if rep := e.replica(h.rep.ID); rep.HealthRevision != 1 {
		t.Fatalf("an undecided heartbeat changed the replica: %s at %d", rep.Status, rep.HealthRevision)
	}
	e.post(body, hb.RequestID).wantLease(t, 2, e.clock.Now().Add(leaseTTL))
	if got := metricValue(t, e, controlplane.MetricRejections, `reason="replica_held"`); got != 1 {
		t.Fatalf("rejections{replica_held} = %v, want 1", got)
	}
}
