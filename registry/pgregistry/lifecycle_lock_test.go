package pgregistry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestLifecyclePastAStuckReplicaLock: a session stuck mid-transaction
// holding one replica's row (a dispatcher partitioned from the database)
// keeps that replica's lifecycle commands from being decided, but not
// those of the replicas coalesced with it into the same call: they are
// decided within the caller's deadline, and the held one is answered
// undecided (ErrStorage, nothing claimed), so its resend is decided once
// the lock is gone.
func TestLifecyclePastAStuckReplicaLock(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	must(t, err)
	var reps [2]registry.ConnectorReplica
	for i, id := range []string{"crepl_a", "crepl_b"} {
		reps[i] = w.ProvisionedReplica(id, clock.Now())
		must(t, r.PutReplica(ctx, reps[i]))
		res, err := r.ApplyLifecycle(ctx, []registry.LifecycleCommand{
			registrytest.LifecycleCommand(clock.Now(), aip.RegisterCommand(w.Registration(&reps[i]))),
		})
		must(t, err)
		must(t, res[0].Err)
	}
	heartbeat := func(id string) registry.LifecycleCommand {
		return registrytest.LifecycleCommand(clock.Now(), aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: 1, ConnectorReady: true}))
	}
	clock.Advance(time.Second)
	hbA, hbB := heartbeat(reps[0].ID), heartbeat(reps[1].ID)

	holder := connect(t, dbURL)
	tx, err := holder.Begin(ctx)
	must(t, err)
	defer tx.Rollback(context.Background())
	var locked int
	must(t, tx.QueryRow(ctx, `WITH l AS (SELECT 1 FROM aip_registry.connector_replicas WHERE replica_id = $1 FOR UPDATE) SELECT count(*) FROM l`, reps[0].ID).Scan(&locked))
	if locked != 1 {
		t.Fatalf("locked %d rows of %s, want 1", locked, reps[0].ID)
	}

	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	res, err := r.ApplyLifecycle(dctx, []registry.LifecycleCommand{hbA, hbB})
	cancel()
	if err != nil {
		t.Fatalf("ApplyLifecycle with %s held by another session failed as a whole: %v; want %s's heartbeat decided", reps[0].ID, err, reps[1].ID)
	}
	if res[1].Err != nil || res[1].Outcome.Lease == nil || res[1].Outcome.Lease.Sequence != 2 {
		t.Fatalf("%s's heartbeat: %+v (%v), want a lease at sequence 2", reps[1].ID, res[1].Outcome, res[1].Err)
	}
	var rej *registry.LifecycleRejection
	if !errors.Is(res[0].Err, registry.ErrStorage) || errors.As(res[0].Err, &rej) {
		t.Fatalf("%s's heartbeat: %+v (%v), want undecided (ErrStorage, not a rejection)", reps[0].ID, res[0].Outcome, res[0].Err)
	}

	must(t, tx.Rollback(ctx))
	for i, want := range []uint64{1, 2} {
		got, err := r.ConnectorReplica(ctx, reps[i].ID)
		must(t, err)
		if got.HealthRevision != want {
			t.Fatalf("%s is at health revision %d, want %d", reps[i].ID, got.HealthRevision, want)
		}
	}
	// Nothing of the held heartbeat was claimed: resent, it is decided.
	res, err = r.ApplyLifecycle(ctx, []registry.LifecycleCommand{hbA})
	must(t, err)
	if res[0].Err != nil || res[0].Outcome.Lease == nil || res[0].Outcome.Lease.Sequence != 2 {
		t.Fatalf("%s's heartbeat resent after the lock ended: %+v (%v), want a lease at sequence 2", reps[0].ID, res[0].Outcome, res[0].Err)
	}
}
