package controlplane_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
)

// gatedStore holds every ApplyLifecycle call until open is closed.
type gatedStore struct {
	controlplane.Store
	open chan struct{}
}

func (g *gatedStore) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Store.ApplyLifecycle(ctx, cmds)
}

// One replica flooding the service with signed requests (a broken or
// compromised host) queued all of them: every other replica's heartbeat
// waited behind the flood, past its timeout. Beyond MaxRequestsPerReplica
// requests being decided, a replica's further requests are answered 503 at
// once (nothing decided), and other replicas still get in.
func TestFloodFromOneReplicaIsBounded(t *testing.T) {
	e := newEnv(t, newMemBackend)
	flooder, other := e.provision("flood"), e.provision("other")
	for _, h := range []*host{flooder, other} {
		r, _ := h.send(h.registration())
		r.wantLease(t, 1, e.clock.Now().Add(leaseTTL))
	}
	// A second service on the same registry whose store is held shut.
	gate := &gatedStore{Store: e.b.Store, open: make(chan struct{})}
	e.stopSvc()
	e.start(gate, func(c *controlplane.Config) { c.MaxBatch, c.BatchWorkers, c.StoreTimeout = 1, 1, time.Minute })

	const flood = 3 * controlplane.MaxRequestsPerReplica
	type answer struct {
		r   reply
		err error
	}
	answers := make(chan answer, flood)
	for range flood {
		req := flooder.request(flooder.heartbeat(1, 0, true))
		body := flooder.seal(req)
		go func() {
			r, err := e.tryPost(body, req.RequestID)
			answers <- answer{r, err}
		}()
	}
	// While the store is shut, every request beyond the bound is answered.
	deadline := time.After(time.Minute)
	for i := range flood - controlplane.MaxRequestsPerReplica {
		select {
		case a := <-answers:
			if a.err != nil {
				t.Fatal(a.err)
			}
			a.r.rejected(t, http.StatusServiceUnavailable, fmt.Sprintf("already has %d lifecycle requests", controlplane.MaxRequestsPerReplica))
		case <-deadline:
			t.Fatalf("after %d answers the flood's other requests wait for the store: they are queued, not refused", i)
		}
	}
	// The other replica is not refused: it is decided once the store opens.
	otherDone := make(chan reply, 1)
	go func() {
		r, _ := other.send(other.heartbeat(1, 0, true))
		otherDone <- r
	}()
	close(gate.open)
	(<-otherDone).wantLease(t, 2, e.clock.Now().Add(leaseTTL))
	// The flooder's admitted requests are decided: exactly one wins the
	// fence, the others lose it.
	var leases int
	for range controlplane.MaxRequestsPerReplica {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.r.outcome.Status == aip.OutcomeLease {
			leases++
		} else {
			a.r.rejected(t, http.StatusForbidden, "sequence")
		}
	}
	if leases != 1 {
		t.Fatalf("%d of the admitted heartbeats won the fence, want 1", leases)
	}
	if got := metricValue(t, e, "aip_connector_control_rejections_total", `reason="replica_busy"`); got != flood-controlplane.MaxRequestsPerReplica {
		t.Errorf("replica_busy rejections %v, want %d", got, flood-controlplane.MaxRequestsPerReplica)
	}
}
