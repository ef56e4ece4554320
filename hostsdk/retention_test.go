package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// fenceAt returns a registry fence token carrying t, as the registry
// issues it when it assigns a route at t.
func fenceAt(t time.Time) string { return hostsdktest.FenceToken(t) }

// routed is an action with the route the registry assigned it, so it can be
// delivered again under the same route, as the dispatcher does for a retry.
type routed struct {
	a     *aip.Action
	route aip.ConnectorRoute
}

func (b *bubbleFleet) routeNow(a *aip.Action) routed {
	r := b.d.Route(hostsdktest.TargetOf(b.h, b.cfg), a.ID, a.CapabilityID, "")
	r.FenceToken = fenceAt(time.Now())
	return routed{a: a, route: r}
}

func (b *bubbleFleet) deliver(t *testing.T, r routed, body aip.Body) *hostsdktest.Response {
	t.Helper()
	target := hostsdktest.TargetOf(b.h, b.cfg)
	env, err := b.d.Envelope(target, body, r.route)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := b.d.Send(context.Background(), target, env)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (b *bubbleFleet) status(t *testing.T, r routed) aip.ActionState {
	t.Helper()
	resp := b.deliver(t, r, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: r.a.ID}})
	if resp.Status != http.StatusOK || resp.Envelope.Body.ActionStatus == nil {
		t.Fatalf("status query: HTTP %d %s", resp.Status, resp.Raw)
	}
	return resp.Envelope.Body.ActionStatus.State
}

// A finished action's record is pruned once it is older than the action
// retention; a delivery of that action afterwards (a late retry under its
// old route) is refused with connector_host.action_expired and never runs a
// second time, and a cancel of it journals nothing. Newer actions are kept
// and answered from the journal as before.
func TestFinishedActionsArePrunedAndNeverRunAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) { c.ActionRetention = time.Hour })
		ctx := b.awaitFirstBeat(t)
		j := b.cfg.Journal

		old := b.routeNow(action(capEcho, `{"message":"once"}`))
		if resp := b.deliver(t, old, aip.Body{Action: old.a}); resp.Status != http.StatusOK {
			t.Fatalf("first delivery: HTTP %d %s", resp.Status, resp.Raw)
		}
		running := b.routeNow(action(capBlock, `{"message":"hold"}`))
		blocked := make(chan *hostsdktest.Response)
		go func() { blocked <- b.deliver(t, running, aip.Body{Action: running.a}) }()
		<-b.conn.started

		time.Sleep(50 * time.Minute)
		recent := b.routeNow(action(capEcho, `{"message":"recent"}`))
		if resp := b.deliver(t, recent, aip.Body{Action: recent.a}); resp.Status != http.StatusOK {
			t.Fatalf("recent action: HTTP %d %s", resp.Status, resp.Raw)
		}
		time.Sleep(20 * time.Minute) // old finished 70 minutes ago, recent 20
		synctest.Wait()

		if _, err := j.Action(ctx, old.a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("the action finished 70 minutes ago under a 1 h retention is still journaled (%v)", err)
		}
		if got := b.metric(t, hostsdk.MetricActionsPruned); got != 1 {
			t.Errorf("%s = %v, want 1", hostsdk.MetricActionsPruned, got)
		}
		// Neither the newer action nor the one still running is pruned.
		if a, err := j.Action(ctx, recent.a.ID); err != nil || a.Status != aip.StateCompleted {
			t.Fatalf("recent action: %+v, %v", a, err)
		}
		if a, err := j.Action(ctx, running.a.ID); err != nil || a.Status != aip.StateRunning {
			t.Fatalf("running action (70 minutes old): %+v, %v", a, err)
		}

		// A late retry of the pruned action under its old route.
		wantCode(t, b.deliver(t, old, aip.Body{Action: old.a}), http.StatusGone, hostsdk.CodeActionExpired)
		if n := b.conn.runCount(old.a.ID); n != 1 {
			t.Fatalf("the pruned action ran %d times, want 1", n)
		}
		if st := b.status(t, old); st != aip.StatePruned {
			t.Errorf("status of the pruned action: %s, want %s", st, aip.StatePruned)
		}
		cancel := aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: old.a.ID}, Reason: "late"}}
		wantCode(t, b.deliver(t, old, cancel), http.StatusGone, hostsdk.CodeActionExpired)
		if _, err := j.Action(ctx, old.a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("a cancel of the pruned action journaled a record (%v)", err)
		}
		if got := b.metric(t, hostsdk.MetricActionsExpired); got != 2 {
			t.Errorf("%s = %v, want 2", hostsdk.MetricActionsExpired, got)
		}

		// The kept action is answered from its record, without a second run.
		resp := b.deliver(t, recent, aip.Body{Action: recent.a})
		if resp.Status != http.StatusOK || b.conn.runCount(recent.a.ID) != 1 {
			t.Fatalf("retry of the kept action: HTTP %d, %d runs", resp.Status, b.conn.runCount(recent.a.ID))
		}
		// So is the old action still running: the retry waits for it.
		close(b.conn.release)
		if resp := <-blocked; resp.Status != http.StatusOK {
			t.Fatalf("blocked action: HTTP %d %s", resp.Status, resp.Raw)
		}
		if resp := b.deliver(t, running, aip.Body{Action: running.a}); resp.Status != http.StatusOK || b.conn.runCount(running.a.ID) != 1 {
			t.Fatalf("retry of the long-running action: HTTP %d %s, %d runs", resp.Status, resp.Raw, b.conn.runCount(running.a.ID))
		}
		// A new action runs; a new unknown one is not_found, not pruned.
		fresh := b.routeNow(action(capEcho, `{"message":"fresh"}`))
		if st := b.status(t, fresh); st != aip.StateNotFound {
			t.Errorf("status of an action never sent: %s, want %s", st, aip.StateNotFound)
		}
		if resp := b.deliver(t, fresh, aip.Body{Action: fresh.a}); resp.Status != http.StatusOK {
			t.Fatalf("fresh action: HTTP %d %s", resp.Status, resp.Raw)
		}
	})
}

// With KeepActionsForever nothing is pruned, however old.
func TestKeepActionsForever(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) { c.ActionRetention = hostsdk.KeepActionsForever })
		ctx := b.awaitFirstBeat(t)
		old := b.routeNow(action(capEcho, `{"message":"kept"}`))
		if resp := b.deliver(t, old, aip.Body{Action: old.a}); resp.Status != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
		}
		time.Sleep(3 * time.Hour)
		synctest.Wait()
		if _, err := b.cfg.Journal.Action(ctx, old.a.ID); err != nil {
			t.Fatalf("action pruned although retention is unlimited: %v", err)
		}
		if resp := b.deliver(t, old, aip.Body{Action: old.a}); resp.Status != http.StatusOK || b.conn.runCount(old.a.ID) != 1 {
			t.Fatalf("retry: HTTP %d %s, %d runs", resp.Status, resp.Raw, b.conn.runCount(old.a.ID))
		}
	})
}

// runsKeeper keeps a per-action record in its state store, as the product
// adapters keep a provider's run ID, and declares the namespace.
type runsKeeper struct{ *testConnector }

const runsNamespace = "test.runs"

func (runsKeeper) ActionStateNamespaces() []string { return []string{runsNamespace} }

func (k runsKeeper) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	if _, err := call.State().Put(ctx, runsNamespace, call.Action.ID, map[string]string{"run": "r-" + call.Action.ID}, 0); err != nil {
		return nil, err
	}
	return k.testConnector.Handle(ctx, call)
}

// A connector's per-action state values go with the action's record.
func TestPruningDeletesTheActionsState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newWrappedBubbleFleet(t, func(c *hostsdk.Config) { c.ActionRetention = time.Hour },
			func(c *testConnector) hostsdk.Connector { return runsKeeper{c} })
		ctx := b.awaitFirstBeat(t)
		old := b.routeNow(action(capEcho, `{"message":"old"}`))
		if resp := b.deliver(t, old, aip.Body{Action: old.a}); resp.Status != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
		}
		time.Sleep(40 * time.Minute)
		kept := b.routeNow(action(capEcho, `{"message":"kept"}`))
		if resp := b.deliver(t, kept, aip.Body{Action: kept.a}); resp.Status != http.StatusOK {
			t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
		}
		if _, err := b.cfg.Journal.State(ctx, runsNamespace, old.a.ID); err != nil {
			t.Fatalf("the connector's record was not written: %v", err)
		}
		time.Sleep(30 * time.Minute)
		synctest.Wait()
		if _, err := b.cfg.Journal.State(ctx, runsNamespace, old.a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Fatalf("the pruned action's state value is still there (%v)", err)
		}
		if _, err := b.cfg.Journal.State(ctx, runsNamespace, kept.a.ID); err != nil {
			t.Fatalf("the kept action's state value: %v", err)
		}
	})
}

// New refuses ActionStateNamespaces the state store would refuse.
func TestActionStateNamespacesAreChecked(t *testing.T) {
	for _, ns := range []string{"", hostsdk.ReservedStatePrefix + "journal", "bad\x00"} {
		cfg := hostsdktest.HostConfig(t, hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true}),
			hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain}), hostsdktest.NewMemListener())
		_, err := hostsdk.New(cfg, badKeeper{newTestConnector(), ns})
		var ve *hostsdk.ValidateError
		if !errors.As(err, &ve) || !strings.Contains(err.Error(), "ActionStateNamespaces") {
			t.Errorf("New with action state namespace %q: %v, want a *ValidateError naming ActionStateNamespaces", ns, err)
		}
		// The connector named no key: the error quotes none (it quoted
		// the placeholder "key" for an empty or non-text namespace).
		if err != nil && strings.Contains(err.Error(), "key") && ns != "" {
			t.Errorf("New with action state namespace %q: %v mentions a key", ns, err)
		}
		if ns == "" && (err == nil || !strings.Contains(err.Error(), "a state namespace is empty")) {
			t.Errorf("New with an empty action state namespace: %v, want it to say a state namespace is empty", err)
		}
	}
}

type badKeeper struct {
	*testConnector
	ns string
}

func (k badKeeper) ActionStateNamespaces() []string { return []string{"ok", k.ns} }

// A registry whose clock is ahead of the replica's by more than the skew
// the host allows issues fence tokens from the replica's future: an action
// routed that way is refused, not journaled, since once its record was
// pruned its old route would look newer than the prune horizon and a retry
// under it would run the action a second time.
func TestARouteFromTheFutureIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) { c.ActionRetention = time.Hour })
		ctx := b.awaitFirstBeat(t)
		ahead := b.routeNow(action(capEcho, `{"message":"skewed"}`))
		ahead.route.FenceToken = fenceAt(time.Now().Add(hostsdk.MaxMessageSkew + time.Minute))
		resp := b.deliver(t, ahead, aip.Body{Action: ahead.a})
		if resp.Status == http.StatusOK {
			// Then it must never run again once pruned.
			time.Sleep(70 * time.Minute)
			synctest.Wait()
			if _, err := b.cfg.Journal.Action(ctx, ahead.a.ID); !errors.Is(err, journal.ErrNotFound) {
				t.Fatalf("not pruned after 70 minutes (%v)", err)
			}
			resp := b.deliver(t, ahead, aip.Body{Action: ahead.a})
			t.Fatalf("an action whose fence token is %s ahead of the replica's clock was run; pruned and delivered again under its route: HTTP %d, ran %d times",
				hostsdk.MaxMessageSkew+time.Minute, resp.Status, b.conn.runCount(ahead.a.ID))
		}
		wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
		if n := b.conn.runCount(ahead.a.ID); n != 0 {
			t.Fatalf("the refused action ran %d times", n)
		}
		// Within the skew, it runs.
		near := b.routeNow(action(capEcho, `{"message":"near"}`))
		near.route.FenceToken = fenceAt(time.Now().Add(hostsdk.MaxMessageSkew))
		if resp := b.deliver(t, near, aip.Body{Action: near.a}); resp.Status != http.StatusOK {
			t.Fatalf("a fence token within the skew: HTTP %d %s", resp.Status, resp.Raw)
		}
	})
}

// slowPruner takes a second (of bubble time) for each batch it prunes.
type slowPruner struct{ *memjournal.Journal }

func (s slowPruner) PruneActions(ctx context.Context, before time.Time, limit int, ns []string) (int, error) {
	time.Sleep(time.Second)
	return s.Journal.PruneActions(ctx, before, limit, ns)
}

// Pruning keeps up with a journal that holds more old actions than one run
// deletes in its time: a run that stops with old actions left goes on at
// the next heartbeat, not a minute later.
func TestPruningKeepsUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mj := memjournal.New()
		ctx := context.Background()
		old := time.Now().Add(-2 * time.Hour)
		const n = 1500 // three batches; each run has time for one
		for i := range n {
			id := aip.NewActionID()
			if _, _, err := mj.BeginAction(ctx, journal.Action{ActionID: id, CapabilityID: capEcho, TenantID: "t", MessageID: fmt.Sprint("m", i), ReceivedAt: old}); err != nil {
				t.Fatal(err)
			}
			if _, err := mj.FinishAction(ctx, id, aip.StateCompleted, json.RawMessage(`{}`), "", old); err != nil {
				t.Fatal(err)
			}
		}
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.ActionRetention, c.HeartbeatInterval, c.Journal = time.Hour, 4*time.Second, slowPruner{mj}
		})
		b.awaitFirstBeat(t)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		left, err := mj.ActionsByStatus(ctx, 10*n, aip.StateCompleted)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Fatalf("%d of %d old actions left 20 s after the first beat (heartbeats every 4 s, one batch of 500 a run)", len(left), n)
		}
	})
}

// A delivery of a pruned action while the replica is not ready (the
// connector unhealthy here; draining and capacity take the same path) is
// refused with action_expired, as when it is ready: not with the signed
// not_ready (or capacity) refusal, which tells the dispatcher that the
// action did not start here and may be rerouted, when it may have run here
// before its record was pruned.
func TestAPrunedActionIsExpiredWhileNotReady(t *testing.T) {
	for _, dj := range durableJournals {
		t.Run(dj.name, func(t *testing.T) {
			open := dj.storage(t)
			synctest.Test(t, func(t *testing.T) {
				j := open(t)
				t.Cleanup(func() { j.Close() })
				b := newBubbleFleet(t, func(c *hostsdk.Config) { c.ActionRetention, c.Journal = time.Hour, j })
				ctx := b.awaitFirstBeat(t)

				old := b.routeNow(action(capEcho, `{"message":"once"}`))
				if resp := b.deliver(t, old, aip.Body{Action: old.a}); resp.Status != http.StatusOK {
					t.Fatalf("first delivery: HTTP %d %s", resp.Status, resp.Raw)
				}
				time.Sleep(70 * time.Minute)
				synctest.Wait()
				if _, err := j.Action(ctx, old.a.ID); !errors.Is(err, journal.ErrNotFound) {
					t.Fatalf("the action finished 70 minutes ago under a 1 h retention is still journaled (%v)", err)
				}

				b.conn.setHealth(errUnhealthy)
				time.Sleep(2 * hostsdk.DefaultHeartbeatInterval)
				synctest.Wait()
				if b.h.Ready() {
					t.Fatal("the host is ready with an unhealthy connector")
				}
				wantCode(t, b.deliver(t, old, aip.Body{Action: old.a}), http.StatusGone, hostsdk.CodeActionExpired)
				// A new action is refused not_ready: it did not start here.
				fresh := b.routeNow(action(capEcho, `{"message":"fresh"}`))
				wantCode(t, b.deliver(t, fresh, aip.Body{Action: fresh.a}), http.StatusServiceUnavailable, hostsdk.CodeNotReady)
				if n := b.conn.runCount(old.a.ID); n != 1 {
					t.Fatalf("the pruned action ran %d times, want 1", n)
				}
			})
		})
	}
}
