package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
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
