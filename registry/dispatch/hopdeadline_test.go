package dispatch_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// slowResolve is the registry answering every Resolve after delay (a
// loaded database).
type slowResolve struct {
	*memregistry.Registry
	delay time.Duration
}

func (s slowResolve) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	time.Sleep(s.delay)
	return s.Registry.Resolve(ctx, req)
}

// TestSlowResolveDoesNotEatTheHop: the wait for the replica's answer is
// the action's timeout plus the hop slack from when the envelope is sent;
// a resolve that took longer than that expired the hop before it was sent,
// so the action never ran and was reported (and settled) as an unknown
// outcome that counts toward opening a healthy replica's circuit.
func TestSlowResolveDoesNotEatTheHop(t *testing.T) {
	const timeout = 2 * time.Second
	w := newWorld(t, worldOptions{
		cfg: func(c *dispatch.Config) { c.HopSlack = time.Millisecond },
		resolver: func(r *memregistry.Registry) registry.Resolver {
			return slowResolve{Registry: r, delay: timeout + 100*time.Millisecond}
		},
	})
	w.startHost(8, 8)
	id := aip.NewActionID()
	ms := uint64(timeout.Milliseconds())
	status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", ""), TimeoutMS: &ms})
	if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted || resp.Settlement != registry.SettlementCompleted {
		t.Fatalf("action answered %d: result %+v error %+v settlement %q", status, resp.Result, resp.Error, resp.Settlement)
	}
	if n := len(w.counter.runs(id)); n != 1 {
		t.Fatalf("the action ran %d times", n)
	}
	w.idle()
}
