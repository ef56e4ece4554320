package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestKilledReplicaNewActionsMove: after a replica is killed with SIGKILL,
// the registry still routes new actions to it until its lease runs out (or
// its circuit opens). Those actions are never delivered — the dispatcher
// cannot connect — so they move to a live replica and complete there, each
// exactly once: no client sees an error.
func TestKilledReplicaNewActionsMove(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 3})
	tok := f.token(tenantID)
	victim := f.replicaList()[0]
	victim.proc.Kill()
	var ids []string
	moved := 0
	for i := range 30 {
		act := aip.NewActionID()
		ids = append(ids, act)
		status, resp, err := f.send(context.Background(), tok, act, fmt.Sprintf("after the kill %d", i), "")
		if err != nil || status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
			t.Fatalf("action %d: %d %v %+v", i, status, err, resp.Error)
		}
		if resp.Route.ReplicaID == victim.id {
			t.Fatalf("action %d completed on the killed replica %s", i, victim.id)
		}
		for _, r := range resp.Route.Reroutes {
			if r.FromReplicaID != victim.id || r.RefusalCode != dispatch.CodeReplicaUnreachable {
				t.Fatalf("action %d moved %+v", i, r)
			}
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("no action was routed to the killed replica %s while its lease ran", victim.id)
	}
	t.Logf("%d of %d actions moved off the killed replica", moved, len(ids))
	f.stopAll()
	ran, effects := f.audit(ids)
	for _, id := range ids {
		if effects[id] != 1 || len(ran[id]) != 1 || ran[id][0] == victim.id {
			t.Errorf("action %s: %d side effects on %v", id, effects[id], ran[id])
		}
	}
}

// TestRestartedReplicaNewActionsMove: a replica killed with SIGKILL and
// started again at once on its state directory waits for the lease of its
// previous run to expire before it registers (lease_live), and the
// registry routes new actions to it under that lease meanwhile. Its
// listener is bound, so the dispatcher's connections are accepted: the
// host answers each new action with a signed not_ready (it serves its
// native ingress from recovery on, and runs nothing before it has
// registered), and the dispatcher moves the action to the live replica,
// where it completes — instead of waiting unanswered until the restarted
// host registers or the action's timeout ends. Every action runs exactly
// once.
func TestRestartedReplicaNewActionsMove(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 2})
	tok := f.token(tenantID)
	victim := f.replicaList()[0]
	victim.proc.Kill()
	victim.proc = startProcess(t, "echo "+victim.id, f.echoBin, victim.env)
	victim.proc.Await(t, "registration refused while the replica's previous lease is live in the registry (a run that stopped without going offline, or another process with this replica ID); registering again once it can have expired")
	serving := func() bool {
		for _, m := range victim.proc.Records() {
			if m["msg"] == "serving" {
				return true
			}
		}
		return false
	}
	var ids []string
	refused := 0
	for i := 0; refused == 0 && !serving(); i++ {
		act := aip.NewActionID()
		ids = append(ids, act)
		status, resp, err := f.send(context.Background(), tok, act, fmt.Sprintf("during the restart %d", i), "")
		if err != nil || status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
			t.Fatalf("action %d: %d %v %+v", i, status, err, resp.Error)
		}
		for _, r := range resp.Route.Reroutes {
			if r.FromReplicaID != victim.id {
				t.Fatalf("action %d moved %+v", i, r)
			}
			if r.RefusalCode == hostsdk.CodeNotReady {
				refused++
			}
		}
	}
	if refused == 0 {
		t.Fatalf("no action sent while the restarted replica %s waited for its previous lease was refused with %s and moved (%d sent)", victim.id, hostsdk.CodeNotReady, len(ids))
	}
	t.Logf("%d actions sent while the restarted replica waited; one moved off it on its signed %s", len(ids), hostsdk.CodeNotReady)
	waitFor(t, "the restarted replica to be ready", []*process{victim.proc, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, victim.id)
		return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
	})
	f.stopAll()
	ran, effects := f.audit(ids)
	for _, id := range ids {
		if effects[id] != 1 || len(ran[id]) != 1 {
			t.Errorf("action %s: %d side effects on %v", id, effects[id], ran[id])
		}
	}
}
