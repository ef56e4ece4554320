package hostsdk_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// restartedReplica is a bubble fleet's replica killed (its lease left live
// in the registry) and started again at once, on a new listener, while
// that lease runs: its Start waits for the lease to expire.
type restartedReplica struct {
	b       *bubbleFleet
	h       *hostsdk.Host
	conn    *testConnector // the restarted process's connector
	d       *hostsdktest.Dispatcher
	client  *http.Client // to the restarted host's listener
	target  hostsdktest.Target
	expires time.Time // when the previous lease expires
	started chan error
}

// restartDuringLease crashes b's host and starts it again on journal j
// (nil: the same journal, as a process killed and started again on its
// state directory) with Start(ctx), or Run(ctx) when run is set; it
// returns once the registration was refused as lease_live, while the
// previous lease is still live.
func restartDuringLease(t *testing.T, b *bubbleFleet, j *memjournal.Journal, ctx context.Context, run bool, wrap func(*testConnector) hostsdk.Connector) *restartedReplica {
	t.Helper()
	expires := b.crash(t)
	ml := hostsdktest.NewMemListener()
	client := ml.Client()
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: client})
	cfg := b.cfg
	cfg.Listener, cfg.GatewayDID, cfg.GatewayPrincipalID = ml, d.DID(), d.PrincipalID()
	if j != nil {
		cfg.Journal = j
	}
	r := &restartedReplica{b: b, conn: newTestConnector(), d: d, client: client, expires: expires, started: make(chan error, 1)}
	var hc hostsdk.Connector = r.conn
	if wrap != nil {
		hc = wrap(r.conn)
	}
	h, err := hostsdk.New(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	r.h = h
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		h.Stop(ctx)
	})
	refusedBefore := len(rejectedRegistrations(b.cp.Operations()))
	go func() {
		if run {
			r.started <- h.Run(ctx)
			return
		}
		r.started <- h.Start(ctx)
	}()
	if err := b.cp.Await(context.Background(), func(ops []hostsdktest.Operation) bool {
		return len(rejectedRegistrations(ops)) > refusedBefore
	}); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	if !time.Now().Before(expires) {
		t.Fatal("the previous lease expired before the restarted host was refused")
	}
	// The same key, principal and manifest: the registry's view of it.
	r.target = hostsdktest.TargetOf(b.h, b.cfg)
	return r
}

func rejectedRegistrations(ops []hostsdktest.Operation) []hostsdktest.Operation {
	var out []hostsdktest.Operation
	for _, o := range ops {
		if o.Op == aip.OpRegister && o.Outcome == aip.OutcomeRejected {
			out = append(out, o)
		}
	}
	return out
}

// route is the route the registry assigns now (the replica's current
// health revision, under the previous lease while it runs).
func (r *restartedReplica) route(t *testing.T, a *aip.Action) aip.ConnectorRoute {
	t.Helper()
	st, ok := r.b.cp.Replica(r.b.cfg.ReplicaID)
	if !ok || st.HealthRevision == 0 {
		t.Fatalf("replica state %+v (%t): want a registered replica", st, ok)
	}
	route := r.d.Route(r.target, a.ID, a.CapabilityID, "")
	route.ReplicaHealthRevision = st.HealthRevision
	return route
}

// sign signs body under route for the restarted host.
func (r *restartedReplica) sign(t *testing.T, body aip.Body, route aip.ConnectorRoute) (raw []byte, messageID string) {
	t.Helper()
	env, err := r.d.Envelope(r.target, body, route)
	if err != nil {
		t.Fatal(err)
	}
	raw, err = r.d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	return raw, env.MessageID
}

// post posts a signed message to the restarted host and returns its
// verified answer.
func (r *restartedReplica) post(t *testing.T, raw []byte, messageID string) *hostsdktest.Response {
	t.Helper()
	resp, err := r.d.Post(context.Background(), r.target, raw, messageID)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func (r *restartedReplica) deliver(t *testing.T, body aip.Body, route aip.ConnectorRoute) *hostsdktest.Response {
	t.Helper()
	raw, messageID := r.sign(t, body, route)
	return r.post(t, raw, messageID)
}

// awaitStarted waits for the restarted host's Start.
func (r *restartedReplica) awaitStarted(t *testing.T) {
	t.Helper()
	if err := <-r.started; err != nil {
		t.Fatalf("the restarted host's Start: %v", err)
	}
	if time.Now().Before(r.expires) {
		t.Fatalf("registered at %s, before the previous lease expired at %s", time.Now(), r.expires)
	}
}

// TestRestartedReplicaRefusesNewActionsWhileItsLeaseWaits: a replica
// killed and started again at once on its journal waits (lease_live) for
// the lease of its previous run, under which the registry still routes
// new actions to it. Meanwhile it answers them with a signed not_ready
// naming their route (the evidence a dispatcher presents to move them:
// before, their connections waited unanswered until the host registered
// or their timeout ended), never runs them, and claims their message IDs,
// so a replay once it serves is refused; an action its journal holds is
// answered from the journal, and a status query too.
func TestRestartedReplicaRefusesNewActionsWhileItsLeaseWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCrashableFleet(t, nil)
		b.awaitFirstBeat(t)
		// An action the first run completed, under a route of the
		// journal's service of the replica.
		done := action(capEcho, `{"message":"before the kill"}`)
		st, _ := b.cp.Replica(b.cfg.ReplicaID)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		doneRoute := b.d.Route(target, done.ID, done.CapabilityID, "")
		doneRoute.ReplicaHealthRevision = st.HealthRevision
		env, err := b.d.Envelope(target, aip.Body{Action: done}, doneRoute)
		if err != nil {
			t.Fatal(err)
		}
		first, err := b.d.Send(context.Background(), target, env)
		if err != nil {
			t.Fatal(err)
		}
		firstRes, err := first.Result()
		if err != nil || firstRes.Status != aip.ResultCompleted {
			t.Fatalf("the first run's action: %+v %v", firstRes, err)
		}

		r := restartDuringLease(t, b, nil, context.Background(), false, nil)

		// A new action: refused, signed, naming its route; not run.
		fresh := action(capEcho, `{"message":"during the wait"}`)
		freshRoute := r.route(t, fresh)
		raw, msgID := r.sign(t, aip.Body{Action: fresh}, freshRoute)
		resp := r.post(t, raw, msgID)
		pe := wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
		if pe.Retryable == nil || !*pe.Retryable || !strings.Contains(pe.Message, "will never execute here") {
			t.Errorf("refusal %+v: want retryable, saying the message never executes here", pe)
		}
		var echoed aip.ConnectorRoute
		if ok, err := resp.Envelope.SecurityValue(aip.SecurityConnectorRoute, &echoed); !ok || err != nil ||
			echoed.FenceToken != freshRoute.FenceToken || echoed.ActionID != fresh.ID {
			t.Fatalf("the refusal's route %+v (%t, %v): want the request's, fence %s", echoed, ok, err, freshRoute.FenceToken)
		}
		if !time.Now().Before(r.expires) {
			t.Fatalf("answered at %s, once the previous lease (until %s) had expired; want an answer during the wait", time.Now(), r.expires)
		}

		// The action the journal holds: its journaled result, not run again.
		again := r.deliver(t, aip.Body{Action: done}, doneRoute)
		res, err := again.Result()
		if err != nil || res.Status != aip.ResultCompleted || res.Receipt == nil || firstRes.Receipt == nil || res.Receipt.ID != firstRes.Receipt.ID {
			t.Fatalf("the journaled action during the wait: %+v %v; want its result with receipt %+v", res, err, firstRes.Receipt)
		}
		status := r.deliver(t, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: done.ID}}, doneRoute)
		if as := status.Envelope.Body.ActionStatus; status.Status != http.StatusOK || as == nil || as.State != aip.StateCompleted {
			t.Fatalf("status query during the wait: HTTP %d %s", status.Status, status.Raw)
		}
		// The same action under another ID but a different input is
		// another action: an idempotency conflict, as when ready.
		conflicting := *done
		conflicting.Input = []byte(`{"message":"other"}`)
		wantCode(t, r.deliver(t, aip.Body{Action: &conflicting}, doneRoute), http.StatusConflict, hostsdk.CodeIdempotencyConflict)

		r.awaitStarted(t)
		// The refused envelope never runs: its replay is refused.
		wantCode(t, r.post(t, raw, msgID), http.StatusConflict, hostsdk.CodeReplay)
		if n := r.conn.runCount(fresh.ID) + b.conn.runCount(fresh.ID); n != 0 {
			t.Fatalf("the refused action ran %d times", n)
		}
		if n := r.conn.runCount(done.ID); n != 0 {
			t.Fatalf("the journaled action ran %d times in the restarted process", n)
		}
		// Once serving, a new action runs.
		later := action(capEcho, `{"message":"after the wait"}`)
		if res, err := r.deliver(t, aip.Body{Action: later}, r.route(t, later)).Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("an action once the host serves: %+v %v", res, err)
		}
	})
}

// TestRestartedReplicaOnANewJournalDoesNotAnswerEarly: restarted on a
// journal that never served the replica (its state directory lost), the
// host cannot tell which actions routed to it under the previous lease
// started there: it answers none before it serves, and then refuses them
// as routed before its journal (action_expired), never runs them. Its
// /health answers meanwhile.
func TestRestartedReplicaOnANewJournalDoesNotAnswerEarly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCrashableFleet(t, nil)
		b.awaitFirstBeat(t)
		r := restartDuringLease(t, b, memjournal.New(), context.Background(), false, nil)
		if status := getStatus(t, r, hostsdk.PathHealth); status != http.StatusOK {
			t.Fatalf("/health during the wait: %d, want 200", status)
		}
		a := action(capEcho, `{"message":"during the wait"}`)
		raw, msgID := r.sign(t, aip.Body{Action: a}, r.route(t, a))
		answered := make(chan *hostsdktest.Response, 1)
		go func() { answered <- r.post(t, raw, msgID) }()
		synctest.Wait()
		select {
		case resp := <-answered:
			t.Fatalf("answered during the wait: HTTP %d %s", resp.Status, resp.Raw)
		default:
		}
		r.awaitStarted(t)
		wantCode(t, <-answered, http.StatusGone, hostsdk.CodeActionExpired)
		if n := r.conn.runCount(a.ID); n != 0 {
			t.Fatalf("the action ran %d times", n)
		}
	})
}

// getStatus is the status of a GET of path on the restarted replica.
func getStatus(t *testing.T, r *restartedReplica, path string) int {
	t.Helper()
	resp, err := r.client.Get("http://replica" + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// countingRoutes mounts a product route that counts its calls.
type countingRoutes struct {
	*testConnector
	calls *atomic.Int64
}

func (c countingRoutes) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	return []hostsdk.Route{{Pattern: "POST /webhooks/early", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.calls.Add(1)
		io.WriteString(w, "ok")
	})}}, nil
}

// TestOnlyTheNativeIngressIsServedBeforeTheHostServes: while the native
// ingress answers during the registration wait, a product webhook and
// /metrics wait until the host serves, as their connections waited in the
// listener's queue before: the webhook never runs before the host serves.
// /health answers (it waited too, so a liveness probe with a short
// timeout could kill a replica that was only waiting out its previous
// lease), and /ready answers 503 until the host serves.
func TestOnlyTheNativeIngressIsServedBeforeTheHostServes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCrashableFleet(t, nil)
		b.awaitFirstBeat(t)
		calls := new(atomic.Int64)
		r := restartDuringLease(t, b, nil, context.Background(), false, func(c *testConnector) hostsdk.Connector {
			return countingRoutes{c, calls}
		})
		type answer struct {
			path   string
			status int
			err    error
		}
		if status := getStatus(t, r, hostsdk.PathHealth); status != http.StatusOK {
			t.Fatalf("/health during the wait: %d, want 200", status)
		}
		if status := getStatus(t, r, hostsdk.PathReady); status != http.StatusServiceUnavailable {
			t.Fatalf("/ready during the wait: %d, want 503", status)
		}
		answers := make(chan answer, 2)
		for _, req := range []struct{ method, path string }{{"POST", "/webhooks/early"}, {"GET", hostsdk.PathMetrics}} {
			go func() {
				hr, _ := http.NewRequest(req.method, "http://replica"+req.path, strings.NewReader("{}"))
				resp, err := r.client.Do(hr)
				a := answer{path: req.path, err: err}
				if err == nil {
					a.status = resp.StatusCode
					resp.Body.Close()
				}
				answers <- a
			}()
		}
		// The native ingress answers meanwhile.
		a := action(capEcho, `{"message":"during the wait"}`)
		wantCode(t, r.deliver(t, aip.Body{Action: a}, r.route(t, a)), http.StatusServiceUnavailable, hostsdk.CodeNotReady)
		synctest.Wait()
		select {
		case got := <-answers:
			t.Fatalf("%s answered during the wait: %d %v", got.path, got.status, got.err)
		default:
		}
		if n := calls.Load(); n != 0 {
			t.Fatalf("the webhook ran %d times before the host served", n)
		}
		r.awaitStarted(t)
		for range 2 {
			got := <-answers
			if got.err != nil || got.status != http.StatusOK {
				t.Errorf("%s once the host serves: %d %v; want 200", got.path, got.status, got.err)
			}
		}
		if status := getStatus(t, r, hostsdk.PathReady); status != http.StatusOK {
			t.Fatalf("/ready once the host serves: %d, want 200", status)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("the webhook ran %d times, want once, after the host served", n)
		}
	})
}

// TestStopWhileServingEarlyIsClean: a shutdown requested while the
// restarted host waits for the previous lease, its native ingress served,
// ends the start cleanly (Run returns nil): the listener is closed, a
// request waiting for the host to serve is dropped unanswered, and
// nothing is registered.
func TestStopWhileServingEarlyIsClean(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCrashableFleet(t, nil)
		b.awaitFirstBeat(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // Run returns when the test fails early too
		r := restartDuringLease(t, b, nil, ctx, true, nil)
		a := action(capEcho, `{"message":"during the wait"}`)
		wantCode(t, r.deliver(t, aip.Body{Action: a}, r.route(t, a)), http.StatusServiceUnavailable, hostsdk.CodeNotReady)
		held := make(chan error, 1)
		go func() {
			resp, err := r.client.Get("http://replica" + hostsdk.PathMetrics)
			if err == nil {
				resp.Body.Close()
				err = errors.New("answered " + resp.Status)
			}
			held <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-r.started; err != nil {
			t.Fatalf("Run stopped while serving early = %v; want a clean stop", err)
		}
		if err := <-held; err == nil || strings.Contains(err.Error(), "answered") {
			t.Fatalf("the held /metrics request: %v; want it dropped", err)
		}
		if _, err := r.d.Act(context.Background(), r.target, action(capEcho, `{"message":"after the stop"}`)); err == nil {
			t.Fatal("a message after the failed start was answered")
		}
		if regs := opsOf(b.cp, aip.OpRegister); regs[len(regs)-1].Outcome != aip.OutcomeRejected {
			t.Fatalf("the last registration %+v; want the refused one (nothing registered)", regs[len(regs)-1])
		}
	})
}

// TestRestartedReplicaExpiresRoutesOlderThanItsJournal: during the lease
// wait, an action, cancel or status query routed to the replica before
// its journal served it (an earlier journal of the replica ID is gone) is
// answered as once the host serves: action_expired and pruned, never a
// not_ready that would move an action that may have run on the lost
// journal.
func TestRestartedReplicaExpiresRoutesOlderThanItsJournal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newCrashableFleet(t, nil)
		b.awaitFirstBeat(t)
		st, _ := b.cp.Replica(b.cfg.ReplicaID)
		oldRevision := st.HealthRevision
		// The replica goes offline cleanly and starts again on another
		// journal (its state directory lost), whose origin is its new
		// registration.
		if err := b.h.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		cfg := b.cfg
		ml := hostsdktest.NewMemListener()
		cfg.Journal, cfg.Listener = memjournal.New(), ml
		b.h, b.cfg = hostsdktest.StartHost(t, cfg, b.conn), cfg
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.HealthRevision <= oldRevision {
			t.Fatalf("health revision %d after the new registration; want above %d", st.HealthRevision, oldRevision)
		}

		r := restartDuringLease(t, b, nil, context.Background(), false, nil)
		a := action(capEcho, `{"message":"routed to the lost journal"}`)
		old := r.route(t, a)
		old.ReplicaHealthRevision = oldRevision
		pe := wantCode(t, r.deliver(t, aip.Body{Action: a}, old), http.StatusGone, hostsdk.CodeActionExpired)
		if !strings.Contains(pe.Message, "before its current journal served it") {
			t.Errorf("refusal message %q does not say why", pe.Message)
		}
		wantCode(t, r.deliver(t, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: a.ID}}}, old), http.StatusGone, hostsdk.CodeActionExpired)
		status := r.deliver(t, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: a.ID}}, old)
		if as := status.Envelope.Body.ActionStatus; status.Status != http.StatusOK || as == nil || as.State != aip.StatePruned {
			t.Fatalf("status query during the wait: HTTP %d %s; want state pruned", status.Status, status.Raw)
		}
		if !time.Now().Before(r.expires) {
			t.Fatalf("answered at %s, once the previous lease (until %s) had expired; want answers during the wait", time.Now(), r.expires)
		}
		r.awaitStarted(t)
		if n := r.conn.runCount(a.ID); n != 0 {
			t.Fatalf("the action ran %d times", n)
		}
	})
}
