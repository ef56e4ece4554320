package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	sidecartest.RemoveBuilds()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func newFleet(t testing.TB, opt fleetOptions) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("end-to-end tests start real processes; skipped in -short mode")
	}
	return startFleet(t, opt)
}

// load runs actions from clients goroutines until stop is closed (or n
// actions, when n > 0) and records every answer.
type load struct {
	mu      sync.Mutex
	results []sent
	done    atomic.Int64
}

type sent struct {
	id string
	// start is when the client sent the action.
	start   time.Time
	status  int
	resp    dispatch.ActionResponse
	err     error
	latency time.Duration
}

// runningLoad is a load whose clients send actions until stop.
type runningLoad struct {
	*load
	t        *testing.T
	f        *fleet
	stopCh   chan struct{}
	finished chan struct{}
}

// startLoad starts clients sending actions (each with extra in its input)
// until stop, which the test's end calls too.
func startLoad(t *testing.T, f *fleet, clients int, extra string) *runningLoad {
	r := &runningLoad{load: &load{}, t: t, f: f, stopCh: make(chan struct{}), finished: make(chan struct{})}
	go func() {
		defer close(r.finished)
		r.run(f, clients, 0, extra, r.stopCh)
	}()
	t.Cleanup(r.stop)
	return r
}

// stop ends the load and waits for its clients' last answers.
func (r *runningLoad) stop() {
	select {
	case <-r.stopCh:
	default:
		close(r.stopCh)
	}
	<-r.finished
}

// progress waits until more actions than now have completed.
func (r *runningLoad) progress(more int64) {
	target := r.done.Load() + more
	waitFor(r.t, fmt.Sprintf("%d more actions", more), []*process{r.f.disp}, func() bool { return r.done.Load() >= target })
}

func (l *load) run(f *fleet, clients, n int, extra string, stop <-chan struct{}) {
	tok := f.token(tenantID)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				if n > 0 && next.Add(1) > int64(n) {
					return
				}
				if stop != nil {
					select {
					case <-stop:
						return
					default:
					}
				}
				id := aip.NewActionID()
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				start := time.Now()
				status, resp, err := f.send(ctx, tok, id, "m-"+id[len(id)-6:], extra)
				cancel()
				l.mu.Lock()
				l.results = append(l.results, sent{id: id, start: start, status: status, resp: resp, err: err, latency: time.Since(start)})
				l.mu.Unlock()
				l.done.Add(1)
			}
		})
	}
	wg.Wait()
}

// check fails the test for every action that did not complete exactly
// once, on the replica that answered (audited in every replica's journal,
// stopped ones included), and returns the action IDs.
func (l *load) check(t *testing.T, f *fleet) (ids []string) {
	t.Helper()
	failed := 0
	for _, r := range l.results {
		ids = append(ids, r.id)
		o, oerr := outputOf(&r.resp)
		if r.err != nil || r.status != http.StatusOK || r.resp.Settlement != registry.SettlementCompleted || oerr != nil || o.SideEffects != 1 {
			failed++
			if failed <= 10 {
				t.Errorf("action %s: status %d err %v settlement %q error %+v output %+v", r.id, r.status, r.err, r.resp.Settlement, r.resp.Error, o)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d actions did not complete", failed, len(l.results))
	}
	f.stopAll()
	ran, effects := f.audit(ids)
	for _, r := range l.results {
		if effects[r.id] != 1 || len(ran[r.id]) != 1 || ran[r.id][0] != r.resp.Route.ReplicaID {
			t.Errorf("action %s: side effect %d times on %v; answered by %s", r.id, effects[r.id], ran[r.id], r.resp.Route.ReplicaID)
		}
	}
	return ids
}

// TestActionsSpreadAndRepeat: 500 actions from 32 clients complete, spread
// over all three replicas, each with one side effect; sending an action ID
// again returns the same result from the same replica without a second
// side effect; a streaming action relays its chunks.
func TestActionsSpreadAndRepeat(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 3})
	var l load
	l.run(f, 32, 500, "", nil)
	perReplica := map[string]int{}
	for _, r := range l.results {
		if r.resp.Route != nil {
			perReplica[r.resp.Route.ReplicaID]++
		}
	}
	for _, r := range f.replicaList() {
		if perReplica[r.id] < 500/10 {
			t.Errorf("replica %s answered %d of 500 actions: %v", r.id, perReplica[r.id], perReplica)
		}
	}
	t.Logf("spread over replicas: %v", perReplica)

	// The same action IDs again, concurrently: same replica, same result.
	tok := f.token(tenantID)
	var wg sync.WaitGroup
	for _, first := range l.results[:40] {
		wg.Go(func() {
			status, again, err := f.send(context.Background(), tok, first.id, "m-"+first.id[len(first.id)-6:], "")
			o, _ := outputOf(&again)
			if err != nil || again.Route == nil || again.Result == nil {
				t.Errorf("resend of %s: %d %v %+v", first.id, status, err, again.Error)
				return
			}
			if status != http.StatusOK || again.Route.FenceToken != first.resp.Route.FenceToken ||
				again.Route.ReplicaID != first.resp.Route.ReplicaID || o.SideEffects != 1 || !bytes.Equal(again.Result.Output, first.resp.Result.Output) {
				t.Errorf("resend of %s: %d %v route %+v output %s (first %s on %+v)", first.id, status, err, again.Route,
					again.Result.Output, first.resp.Result.Output, first.resp.Route)
			}
		})
	}
	wg.Wait()

	// A streaming action.
	raw := []byte(`{"capability_id":"echo.stream","mode":"streaming","input":{"message":"flow","chunks":3}}`)
	req, _ := http.NewRequest(http.MethodPost, f.apiURL+dispatch.PathActions, bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := f.client.Do(req)
	must(t, err)
	var lines []dispatch.StreamLine
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var line dispatch.StreamLine
		must(t, json.Unmarshal(sc.Bytes(), &line))
		lines = append(lines, line)
	}
	resp.Body.Close()
	if resp.Header.Get("Content-Type") != dispatch.ContentTypeNDJSON || len(lines) != 4 || lines[3].ActionResponse == nil ||
		lines[3].Result == nil || lines[3].Result.Status != aip.ResultCompleted {
		t.Fatalf("streaming answer %s with %d lines", resp.Header.Get("Content-Type"), len(lines))
	}
	l.check(t, f)
	if ledger, err := f.reg.Ledger(f.ctx); err != nil || len(ledger.Reservations) != 0 {
		t.Fatalf("reservations left after the run: %+v %v", ledger.Reservations, err)
	}
}

// TestRollingRestartUnderLoad: while 32 clients send actions, each replica
// in turn is replaced by a fresh one (new replica ID) and stopped with
// SIGTERM. No action is lost, failed or executed twice, and every replica
// exits cleanly.
func TestRollingRestartUnderLoad(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 3})
	original := f.replicaList()
	l := startLoad(t, f, 32, `,"hold_ms":5`)
	progress := l.progress
	progress(200)
	for _, old := range original {
		fresh := f.addReplica()
		if err := old.proc.Term(t); err != nil {
			t.Fatalf("replica %s did not drain cleanly: %v\n%s", old.id, err, old.proc.Log())
		}
		// Its last answers are settled right after it stopped.
		waitFor(t, "the stopped replica's routes to settle", []*process{f.disp}, func() bool {
			rep, err := f.reg.ConnectorReplica(f.ctx, old.id)
			return err == nil && rep.Status == aip.ReplicaOffline && rep.ActiveAssignments == 0
		})
		t.Logf("replaced %s with %s after %d actions", old.id, fresh.id, l.done.Load())
		progress(200)
	}
	l.stop()
	rerouted := 0
	for _, r := range l.results {
		if r.resp.Route != nil && len(r.resp.Route.Reroutes) > 0 {
			rerouted++
		}
	}
	t.Logf("%d actions during the rolling restart, %d rerouted after a signed refusal", len(l.results), rerouted)
	// No tolerance: every action completed exactly once. A refusal from a
	// draining replica must have been rerouted (the registry implements
	// registry.Rerouter), and the host's drain linger answers actions routed
	// just before a drain with a signed refusal instead of a closed socket.
	if _, ok := any(f.reg).(registry.Rerouter); !ok {
		t.Fatal("the registry under test does not implement registry.Rerouter")
	}
	l.check(t, f)
}

// TestKillMidAction: a replica killed with SIGKILL while it runs an action
// leaves the action outcome_unknown and pinned: retries never move it, the
// status query says the replica is unreachable, and once the same replica
// recovers its journal settles the outcome — the action never ran anywhere.
func TestKillMidAction(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 3})
	tok := f.token(tenantID)
	act := aip.NewActionID()
	answer := make(chan sent, 1)
	go func() {
		status, resp, err := f.send(context.Background(), tok, act, "doomed", `,"delay_ms":60000`)
		answer <- sent{id: act, status: status, resp: resp, err: err}
	}()
	a := f.awaitRunning(t, act)
	victim := f.replicaByID(a.ReplicaID)
	victim.proc.Kill()
	got := <-answer
	if got.err != nil || got.status != http.StatusBadGateway || got.resp.Error == nil || got.resp.Error.Code != dispatch.CodeOutcomeUnknown ||
		got.resp.Settlement != registry.SettlementOutcomeUnknown || got.resp.Route.FenceToken != a.FenceToken {
		t.Fatalf("answer after the kill: %d %v %+v %q %+v", got.status, got.err, got.resp.Error, got.resp.Settlement, got.resp.Route)
	}
	// Lease maintenance takes the dead replica offline; a retry is refused
	// rather than moved.
	waitFor(t, "the dead replica's lease to expire", []*process{f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, victim.id)
		return err == nil && rep.Status == aip.ReplicaOffline
	})
	status, retry, err := f.send(context.Background(), tok, act, "doomed", `,"delay_ms":60000`)
	if err != nil || status != http.StatusServiceUnavailable || retry.Error.Code != dispatch.CodeReplicaUnavailable {
		t.Fatalf("retry while the pinned replica is down: %d %v %+v", status, err, retry.Error)
	}
	pinned := func(what string) {
		t.Helper()
		cur, err := f.reg.Assignment(f.ctx, act)
		must(t, err)
		if !cur.Equal(&a) {
			t.Fatalf("%s: the route moved to %s (fence %s)", what, cur.ReplicaID, cur.FenceToken)
		}
		if rr, ok := any(f.reg).(registry.Rerouter); ok {
			if h, err := rr.RouteHistory(f.ctx, act); err != nil || len(h) != 0 {
				t.Fatalf("%s: route history %+v %v", what, h, err)
			}
		}
	}
	pinned("after the retry")
	code, body := f.get(dispatch.PathActions+"/"+act, tok)
	var st dispatch.ActionStatusResponse
	must(t, json.Unmarshal(body, &st))
	if code != http.StatusOK || st.Replica.Reachable || st.Route.ReplicaID != victim.id || st.Reservation.Reserved {
		t.Fatalf("status while down: %d %s", code, body)
	}
	// The same replica recovers from its journal and reconciles the action:
	// echo finds no side effect, so it did not happen.
	f.startHost(victim)
	code, body = f.get(dispatch.PathActions+"/"+act, tok)
	must(t, json.Unmarshal(body, &st))
	if code != http.StatusOK || !st.Replica.Reachable || st.Replica.State != aip.StateFailed || st.Replica.Result == nil ||
		st.Replica.Result.Error == nil || st.Replica.Result.Error.Code != "echo.not_executed" {
		t.Fatalf("status after recovery: %d %s", code, body)
	}
	status, final, err := f.send(context.Background(), tok, act, "doomed", `,"delay_ms":60000`)
	if err != nil || status != http.StatusOK || final.Result == nil || final.Result.Status != aip.ResultFailed || final.Route.FenceToken != a.FenceToken {
		t.Fatalf("retry after recovery: %d %v %+v %+v", status, err, final.Result, final.Route)
	}
	pinned("after recovery")
	f.stopAll()
	if ran, effects := f.audit([]string{act}); effects[act] != 0 || len(ran[act]) != 0 {
		t.Fatalf("the killed action ran on %v", ran[act])
	}
}

// awaitRunning waits until action act runs on its pinned replica and
// returns its route.
func (f *fleet) awaitRunning(t *testing.T, act string) registry.RouteAssignment {
	t.Helper()
	// Running means journaled as running on the replica (its signed status
	// answer, through the dispatcher), not only admitted: the host counts
	// an action in flight before its accept commit is durable, and a kill
	// in between leaves nothing journaled.
	tok := f.token(tenantID)
	var a registry.RouteAssignment
	waitFor(t, "the action to run on its replica", []*process{f.disp}, func() bool {
		var err error
		if a, err = f.reg.Assignment(f.ctx, act); err != nil {
			return false
		}
		code, body := f.get(dispatch.PathActions+"/"+act, tok)
		var st dispatch.ActionStatusResponse
		return code == http.StatusOK && json.Unmarshal(body, &st) == nil && st.Replica.State == aip.StateRunning
	})
	return a
}

func (f *fleet) replicaByID(id string) *replica {
	for _, r := range f.replicaList() {
		if r.id == id {
			return r
		}
	}
	f.t.Fatalf("no replica %s", id)
	return nil
}

// inFlight reads a host's aip_connector_host_in_flight gauge (-1 when it
// cannot be read).
func inFlight(r *replica) int {
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "aip_connector_host_in_flight "); ok {
			var n float64
			fmt.Sscan(v, &n)
			return int(n)
		}
	}
	return -1
}

// TestRefusedRequestsChangeNothing: a bad token, a foreign tenant's
// capability, an oversized body and a malformed action each get their
// documented error; no route is made and nothing runs.
func TestRefusedRequestsChangeNothing(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 3, dispatchArgs: []string{"--max-body-bytes", "65536"}})
	tok := f.token(tenantID)
	stranger, _ := aip.GenerateSigningKey()
	now := time.Now()
	forged, err := mintWith(stranger, tenantID, now)
	must(t, err)
	var ids []string
	body := func(extra string) (string, []byte) {
		id := aip.NewActionID()
		ids = append(ids, id)
		return id, []byte(fmt.Sprintf(`{"action_id":%q,"capability_id":"echo.say","input":{"message":"x"}%s}`, id, extra))
	}
	_, ok := body("")
	_, big := body(`,"idempotency_key":"` + strings.Repeat("k", 100<<10) + `"`)
	_, unknownField := body(`,"tenant_id":"` + tenantID + `"`)
	cases := []struct {
		name   string
		token  string
		raw    []byte
		status int
		code   string
	}{
		{"no token", "", ok, http.StatusUnauthorized, dispatch.CodeUnauthorized},
		{"bad token", "not-a-jwt", ok, http.StatusUnauthorized, dispatch.CodeUnauthorized},
		{"token of an untrusted key", forged, ok, http.StatusUnauthorized, dispatch.CodeUnauthorized},
		{"foreign tenant's capability", f.token("tenant-other"), ok, http.StatusNotFound, dispatch.CodeBindingUnavailable},
		{"oversized body", tok, big, http.StatusRequestEntityTooLarge, dispatch.CodeRequestTooLarge},
		{"not JSON", tok, []byte(`{"capability_id":`), http.StatusBadRequest, dispatch.CodeRequestInvalid},
		{"unknown field", tok, unknownField, http.StatusBadRequest, dispatch.CodeRequestInvalid},
		{"no input", tok, []byte(`{"capability_id":"echo.say"}`), http.StatusUnprocessableEntity, dispatch.CodeActionInvalid},
		{"malformed action ID", tok, []byte(`{"action_id":"act_x","capability_id":"echo.say","input":{}}`), http.StatusUnprocessableEntity, dispatch.CodeActionInvalid},
	}
	for _, c := range cases {
		status, raw, err := f.post(context.Background(), dispatch.PathActions, c.token, c.raw)
		must(t, err)
		var e dispatch.ErrorResponse
		if json.Unmarshal(raw, &e) != nil || e.Error == nil || status != c.status || e.Error.Code != c.code {
			t.Errorf("%s: %d %s, want %d %s", c.name, status, raw, c.status, c.code)
		}
	}
	// The catalog, too, is the caller's own.
	if code, raw := f.get(dispatch.PathCapabilities, f.token("tenant-other")); code != http.StatusOK || !strings.Contains(string(raw), `"total":0`) {
		t.Errorf("foreign catalog: %d %s", code, raw)
	}
	if code, raw := f.get(dispatch.PathCapabilities, tok); code != http.StatusOK || !strings.Contains(string(raw), capSay) || !strings.Contains(string(raw), capStream) {
		t.Errorf("own catalog: %d %s", code, raw)
	}
	for _, id := range ids {
		if _, err := f.reg.Assignment(f.ctx, id); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("refused action %s has a route: %v", id, err)
		}
	}
	if ledger, err := f.reg.Ledger(f.ctx); err != nil || len(ledger.Reservations) != 0 || len(ledger.Counters) != 0 {
		t.Fatalf("refused requests changed the ledger: %+v %v", ledger, err)
	}
	f.stopAll()
	if ran, _ := f.audit(ids); len(ran) != 0 {
		t.Fatalf("refused actions ran: %v", ran)
	}
}

// TestDispatcherCrashMidAction: the dispatcher is killed (SIGKILL) while
// its action runs on a replica, so nothing settles the route. The action
// finishes on its replica; the restarted dispatcher finds the reservation
// still held past --reconcile-after, asks the replica for its journaled
// state and settles the route completed, releasing the replica's slot and
// the counters. The action ran once, on its pinned replica.
func TestDispatcherCrashMidAction(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 1, dispatchArgs: []string{
		"--max-timeout", "3s", "--action-timeout", "3s", "--reconcile-after", "10s", "--reconcile-interval", "500ms"}})
	tok := f.token(tenantID)
	act := aip.NewActionID()
	go f.send(context.Background(), tok, act, "orphan", `,"hold_ms":1500`) // its answer dies with the dispatcher
	a := f.awaitRunning(t, act)
	f.disp.Kill()
	waitFor(t, "the action to finish on its replica", nil, func() bool { return inFlight(f.replicaByID(a.ReplicaID)) == 0 })
	if res, err := f.reg.Reservation(f.ctx, act); err != nil || !res.Reserved {
		t.Fatalf("after the crash the reservation is %+v (%v): want it held, nothing settled it", res, err)
	}
	f.startDispatcher()
	waitFor(t, "reconciliation to settle the orphaned reservation", []*process{f.disp}, func() bool {
		res, err := f.reg.Reservation(f.ctx, act)
		return err == nil && !res.Reserved
	})
	res, err := f.reg.Reservation(f.ctx, act)
	must(t, err)
	if res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("the orphaned reservation settled %q, want completed (the replica's journal has the result)", res.LastSettlement)
	}
	rep, err := f.reg.ConnectorReplica(f.ctx, a.ReplicaID)
	must(t, err)
	if rep.ActiveAssignments != 0 {
		t.Fatalf("replica %s still counts %d active assignments", a.ReplicaID, rep.ActiveAssignments)
	}
	l, err := f.reg.Ledger(f.ctx)
	must(t, err)
	if len(l.Counters) != 0 || len(l.Reservations) != 0 {
		t.Fatalf("the ledger still holds %+v", l)
	}
	f.disp.Await(t, "reconciled an orphaned reservation", "action_id", act)
	f.stopAll()
	ran, effects := f.audit([]string{act})
	if len(ran[act]) != 1 || ran[act][0] != a.ReplicaID || effects[act] != 1 {
		t.Fatalf("the action ran on %v with %d side effects, want once on %s", ran[act], effects[act], a.ReplicaID)
	}
}

// TestLostJournalNeverRunsTwice: a replica stopped and started again under
// its replica ID on an empty state directory (its journal lost) refuses a
// retry of the action it ran before — 410 connector_host.action_expired
// through the dispatcher, settled pruned, its status pruned rather than
// not_found — and runs it nowhere again, while new actions run there.
func TestLostJournalNeverRunsTwice(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 1})
	tok := f.token(tenantID)
	act := aip.NewActionID()
	status, first, err := f.send(context.Background(), tok, act, "once", "")
	if err != nil || status != http.StatusOK || first.Result == nil || first.Result.Status != aip.ResultCompleted {
		t.Fatalf("first send: %d %v %+v", status, err, first)
	}
	r := f.replicaByID(first.Route.ReplicaID)
	must(t, r.proc.Term(t))
	must(t, os.Rename(r.stateDir, r.stateDir+".lost"))
	f.startHost(r)

	status, retry, err := f.send(context.Background(), tok, act, "once", "")
	if err != nil || status != http.StatusGone || retry.Error == nil || retry.Error.Code != hostsdk.CodeActionExpired ||
		retry.Settlement != registry.SettlementPruned || retry.Route.FenceToken != first.Route.FenceToken {
		t.Fatalf("retry on the new journal: %d %v %+v %q %+v", status, err, retry.Error, retry.Settlement, retry.Route)
	}
	code, body := f.get(dispatch.PathActions+"/"+act, tok)
	var st dispatch.ActionStatusResponse
	must(t, json.Unmarshal(body, &st))
	if code != http.StatusOK || st.Replica.State != aip.StatePruned {
		t.Fatalf("status on the new journal: %d %s", code, body)
	}
	status, fresh, err := f.send(context.Background(), tok, "", "new", "")
	if err != nil || status != http.StatusOK || fresh.Result == nil || fresh.Result.Status != aip.ResultCompleted {
		t.Fatalf("a new action on the new journal: %d %v %+v", status, err, fresh)
	}
	f.stopAll()
	if ran, effects := f.audit([]string{act}); effects[act] != 0 {
		t.Fatalf("the action ran again on %v", ran[act])
	}
}
