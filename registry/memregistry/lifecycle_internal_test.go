package memregistry

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestReplayClaimsArePruned checks that claims do not accumulate: each is
// dropped once its request's expiry plus the grace has passed.
func TestReplayClaimsArePruned(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := New(Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	rep := w.ProvisionedReplica("crepl_a1", clock.Now())
	if err := r.PutReplica(ctx, rep); err != nil {
		t.Fatal(err)
	}
	apply := func(c aip.ControlCommand) registry.LifecycleResult {
		t.Helper()
		res, err := r.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(), c)})
		if err != nil {
			t.Fatal(err)
		}
		return res[0]
	}
	if res := apply(aip.RegisterCommand(w.Registration(&rep))); res.Err != nil {
		t.Fatal(res.Err)
	}
	seq := uint64(1)
	for range 10 {
		clock.Advance(10 * time.Second)
		res := apply(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: seq, ConnectorReady: true}))
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		seq = res.Outcome.Lease.Sequence
	}
	// Claims live 30 s (request lifetime) + 60 s (grace): at most 9 of the
	// 11 requests, 10 s apart, are still held after the last one.
	if n := r.replayClaims(); n > 9 || n < 1 {
		t.Fatalf("%d replay claims held, want between 1 and 9", n)
	}
	clock.Advance(aip.MaxMessageLifetime + registry.ReplayClaimGrace)
	apply(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 0, ConnectorReady: true}))
	if n := r.replayClaims(); n != 1 {
		t.Fatalf("%d replay claims held after all expired, want only the newest", n)
	}
}
