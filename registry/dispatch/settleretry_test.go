package dispatch_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// flakySettle is the registry with its next fails settlements failing
// with err.
type flakySettle struct {
	*memregistry.Registry
	mu    sync.Mutex
	fails int
	err   error
	calls int
}

func (f *flakySettle) Settle(ctx context.Context, a registry.RouteAssignment, s registry.RouteSettlement) error {
	f.mu.Lock()
	f.calls++
	if f.fails > 0 {
		f.fails--
		f.mu.Unlock()
		return f.err
	}
	f.mu.Unlock()
	return f.Registry.Settle(ctx, a, s)
}

// heal makes the next settlements succeed.
func (f *flakySettle) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails = 0
}

// errRegistryDown is the storage failure of a registry that is down.
var errRegistryDown = fmt.Errorf("%w: connection refused", registry.ErrStorage)

func (f *flakySettle) settleCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func flakyWorld(t *testing.T, fails int, err error, cfg func(*dispatch.Config)) (*world, *flakySettle) {
	var flaky *flakySettle
	w := newWorld(t, worldOptions{cfg: cfg, resolver: func(r *memregistry.Registry) registry.Resolver {
		flaky = &flakySettle{Registry: r, fails: fails, err: err}
		return flaky
	}})
	w.startHost(8, 8)
	return w, flaky
}

// TestFailedSettlementIsRetried: a settlement the registry did not confirm
// (a storage failure) does not hold the route's reservation: the client
// gets its result at once, without a settlement it cannot trust, and the
// dispatcher settles the route in the background once the registry answers.
func TestFailedSettlementIsRetried(t *testing.T) {
	w, flaky := flakyWorld(t, 3, fmt.Errorf("%w: connection refused", registry.ErrStorage), nil)
	id := aip.NewActionID()
	status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCompleted {
		t.Fatalf("action answered %d: %+v", status, resp)
	}
	if resp.Settlement != "" {
		t.Fatalf("the answer reports settlement %q, which the registry did not confirm", resp.Settlement)
	}
	eventually(t, "the route settled in the background", func() bool {
		res, err := w.reg.Reservation(w.ctx, id)
		return err == nil && !res.Reserved && res.LastSettlement == registry.SettlementCompleted
	})
	if n := flaky.settleCalls(); n != 4 {
		t.Fatalf("%d settlement calls, want 1 + 3 retries", n)
	}
	// The action counts as unsettled (answered before the registry
	// confirmed its settlement), not under an empty outcome.
	series := strings.Join(w.metricSeries("aip_dispatch_actions_total"), "\n")
	if !strings.Contains(series, `aip_dispatch_actions_total{outcome="unsettled"} 1`) || strings.Contains(series, `outcome=""`) {
		t.Fatalf("aip_dispatch_actions_total:\n%s\nwant outcome=\"unsettled\" 1 and no empty outcome", series)
	}
	if n := len(w.counter.runs(id)); n != 1 {
		t.Fatalf("the action ran %d times", n)
	}
}

// TestSettlementErrorsThatCannotPassAreNotRetried: a lost fence will not
// change by trying again, so it is not retried; nor is anything when
// retries are disabled.
func TestSettlementErrorsThatCannotPassAreNotRetried(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		cfg  func(*dispatch.Config)
	}{
		{"fence lost", fmt.Errorf("%w: moved", registry.ErrFenceLost), nil},
		{"retries disabled", fmt.Errorf("%w: connection refused", registry.ErrStorage), func(c *dispatch.Config) { c.SettleRetryTimeout = -1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, flaky := flakyWorld(t, 1, c.err, c.cfg)
			id := aip.NewActionID()
			if status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")}); status != http.StatusOK || resp.Settlement != "" {
				t.Fatalf("action answered %d: %+v", status, resp)
			}
			time.Sleep(300 * time.Millisecond) // longer than the first retry's backoff
			if n := flaky.settleCalls(); n != 1 {
				t.Fatalf("%d settlement calls, want 1", n)
			}
			if res, err := w.reg.Reservation(w.ctx, id); err != nil || !res.Reserved {
				t.Fatalf("reservation %+v, %v: want it still held", res, err)
			}
		})
	}
}

// TestCloseGivesUpOnSettlementRetries: Close does not wait for a registry
// that stays down; the retry goroutine ends (goleak checks) and the route
// stays reserved.
func TestCloseGivesUpOnSettlementRetries(t *testing.T) {
	w, flaky := flakyWorld(t, 1<<30, fmt.Errorf("%w: connection refused", registry.ErrStorage), nil)
	id := aip.NewActionID()
	if status, _ := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")}); status != http.StatusOK {
		t.Fatalf("action answered %d", status)
	}
	eventually(t, "a background retry", func() bool { return flaky.settleCalls() >= 2 })
	start := time.Now()
	w.d.Close()
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("Close waited %s for the retries", waited)
	}
	if res, err := w.reg.Reservation(w.ctx, id); err != nil || !res.Reserved {
		t.Fatalf("reservation %+v, %v: want it still held", res, err)
	}
}

// TestFailedCancelSettlementIsRetried: a cancel whose settlement the
// registry did not confirm releases the route once the registry answers,
// like an action's; it was only logged, leaving the reservation held.
func TestFailedCancelSettlementIsRetried(t *testing.T) {
	// The action's own settlement is refused for good, so the route is
	// still reserved when the cancel settles it.
	w, flaky := flakyWorld(t, 1, fmt.Errorf("%w: moved", registry.ErrFenceLost), nil)
	id := aip.NewActionID()
	if status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")}); status != http.StatusOK || resp.Settlement != "" {
		t.Fatalf("action answered %d: %+v", status, resp)
	}
	if res, err := w.reg.Reservation(w.ctx, id); err != nil || !res.Reserved {
		t.Fatalf("reservation %+v, %v: want it held", res, err)
	}
	flaky.mu.Lock()
	flaky.fails, flaky.err = 2, errRegistryDown
	flaky.mu.Unlock()
	status, body, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+id+"/cancel", tenant, nil)
	if status != http.StatusOK {
		t.Fatalf("cancel: %d %s", status, body)
	}
	eventually(t, "the cancel's settlement retried in the background", func() bool {
		res, err := w.reg.Reservation(w.ctx, id)
		return err == nil && !res.Reserved && res.LastSettlement == registry.SettlementCancelled
	})
}
