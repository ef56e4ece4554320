package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// carefulAttempts bounds a careful client's sends of one action ID
// (startCareful's default).
const carefulAttempts = 6

// carefulAction is what one client saw for one action ID over its attempts.
type carefulAction struct {
	id       string
	attempts int
	// completed is the route replica of a completed answer ("" if none).
	completed string
	last      string // the last answer, for the failure message
}

// carefulLoad is clients that send actions and resend the same action ID
// after an error or an uncertain answer, as a careful client does, with a
// seeded mix of patient and impatient clients. It records every action
// and, per error code, how often it was answered.
type carefulLoad struct {
	f   *fleet
	tok string
	// attempts bounds the sends of one action ID.
	attempts int

	mu      sync.Mutex
	actions []*carefulAction
	// codes counts the error answers by "HTTP status code", and
	// undocumented lists the ones a client could not act on: an error
	// that is neither retryable (with Retry-After on a 503 or 429) nor a
	// definitive answer.
	codes        map[string]int
	undocumented []string
	answered     atomic.Int64 // completed answers, to see the fleet is usable
	// noAnswer counts patient sends (10 s) that got no answer at all.
	noAnswer atomic.Int64

	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup
}

// startCareful starts n careful clients, seeded by seed, each sending an
// action ID at most attempts times (0: carefulAttempts).
func startCareful(f *fleet, seed uint64, n, attempts int) *carefulLoad {
	if attempts == 0 {
		attempts = carefulAttempts
	}
	l := &carefulLoad{f: f, tok: f.token(tenantID), attempts: attempts, codes: map[string]int{}, stop: make(chan struct{})}
	for c := range n {
		rng := rand.New(rand.NewPCG(seed, uint64(c)+1))
		l.wg.Go(func() { l.client(rng) })
	}
	f.t.Cleanup(l.halt)
	return l
}

func (l *carefulLoad) client(rng *rand.Rand) {
	for {
		select {
		case <-l.stop:
			return
		default:
		}
		a := &carefulAction{id: aip.NewActionID()}
		l.mu.Lock()
		l.actions = append(l.actions, a)
		l.mu.Unlock()
		hold, timeout := rng.IntN(30), 10*time.Second
		if rng.IntN(20) == 0 {
			// An impatient client: it gives up on its first send
			// while the action still runs, and resends the ID.
			hold, timeout = 300+rng.IntN(500), 150*time.Millisecond
		}
		extra := fmt.Sprintf(`,"hold_ms":%d`, hold)
		backoff := 100 * time.Millisecond
		for a.attempts < l.attempts {
			a.attempts++
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			patient := timeout == 10*time.Second
			timeout = 10 * time.Second
			status, header, resp, err := l.f.sendH(ctx, l.tok, a.id, "careful", extra)
			cancel()
			if err != nil && status == 0 && patient {
				l.noAnswer.Add(1)
			}
			if err == nil && status == http.StatusOK && resp.Settlement == registry.SettlementCompleted &&
				resp.Result != nil && resp.Result.Status == aip.ResultCompleted && resp.Route != nil {
				o, oerr := outputOf(&resp)
				if oerr != nil || o.SideEffects != 1 {
					a.last = fmt.Sprintf("completed with output %s (%v)", resp.Result.Output, oerr)
				} else {
					a.completed = resp.Route.ReplicaID
					l.answered.Add(1)
				}
				break
			}
			a.last = fmt.Sprintf("status %d err %v settlement %q error %+v", status, err, resp.Settlement, resp.Error)
			if err == nil && resp.Error != nil {
				l.record(status, header, resp.Error)
			}
			if resp.Result != nil && resp.Result.Status == aip.ResultFailed {
				break // a definitive answer: the action did not run
			}
			time.Sleep(backoff) // a careful client's pause before resending
			backoff = min(2*backoff, time.Second)
		}
	}
}

// record counts an error answer and notes it when a client could not tell
// what to do with it.
func (l *carefulLoad) record(status int, header http.Header, pe *aip.ProtocolError) {
	key := fmt.Sprintf("%d %s", status, pe.Code)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.codes[key]++
	switch {
	case pe.Code == dispatch.CodeOutcomeUnknown && status == http.StatusBadGateway:
		// Documented: retry with the same action ID, or GET the action.
	case !pe.IsRetryable():
		l.undocumented = append(l.undocumented, fmt.Sprintf("%s (not retryable): %s", key, pe.Message))
	case (status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests) && header.Get("Retry-After") == "":
		l.undocumented = append(l.undocumented, fmt.Sprintf("%s without Retry-After: %s", key, pe.Message))
	}
}

// halt stops the clients and waits for them.
func (l *carefulLoad) halt() {
	l.stopOnce.Do(func() { close(l.stop); l.wg.Wait() })
}

// usable waits until the fleet completes ten more answers.
func (l *carefulLoad) usable(t testing.TB, what string, procs ...*process) {
	t.Helper()
	target := l.answered.Load() + 10
	waitFor(t, what, procs, func() bool { return l.answered.Load() >= target })
}

// all returns every action sent so far.
func (l *carefulLoad) all() []*carefulAction {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*carefulAction(nil), l.actions...)
}

// errorCodes formats the error answers counted, sorted.
func (l *carefulLoad) errorCodes() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for k, n := range l.codes {
		out = append(out, fmt.Sprintf("%s ×%d", k, n))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// verifySettled waits until the fleet releases every reservation and
// counter, then checks the actions' invariants against their statuses and
// every replica's journal: no action ran more than once; every completed
// answer has exactly one side effect, on the replica that answered; every
// action's status agrees with its side effects; no replica counts an
// active assignment. It stops every host (the audit reads their
// journals), and returns the final states counted. what names the faults
// in failure messages.
func verifySettled(t *testing.T, f *fleet, tok string, all []*carefulAction, what string) map[string]int {
	t.Helper()
	ids := make([]string, len(all))
	incomplete, resent := 0, 0
	for i, a := range all {
		ids[i] = a.id
		if a.completed == "" {
			incomplete++
		}
		if a.attempts > 1 {
			resent++
		}
	}
	t.Logf("%d actions, %d sent more than once, %d without a completed answer", len(all), resent, incomplete)

	// Settle: reconciliation and lease maintenance release every
	// reservation still held.
	waitFor(t, "every reservation and counter to be released", []*process{f.disp, f.cp}, func() bool {
		l, err := f.reg.Ledger(f.ctx)
		return err == nil && len(l.Reservations) == 0 && len(l.Counters) == 0
	})
	for _, r := range f.replicaList() {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		must(t, err)
		if rep.ActiveAssignments != 0 {
			t.Errorf("replica %s (%s) still counts %d active assignments", r.id, rep.Status, rep.ActiveAssignments)
		}
	}

	// Every action's status, as a client asks for it.
	type status struct {
		code int
		st   dispatch.ActionStatusResponse
		raw  string
	}
	statuses := make(map[string]status, len(all))
	for _, a := range all {
		code, body := f.get(dispatch.PathActions+"/"+a.id, tok)
		var st dispatch.ActionStatusResponse
		if code == http.StatusOK {
			must(t, json.Unmarshal(body, &st))
		}
		statuses[a.id] = status{code: code, st: st, raw: string(body)}
	}
	liveAtEnd := map[string]bool{}
	for _, r := range f.runningReplicas() {
		liveAtEnd[r.id] = true
	}

	if f.disp.Exited() || f.cp.Exited() {
		t.Fatalf("a central process exited by itself: dispatcher %v, control plane %v", f.disp.Exited(), f.cp.Exited())
	}
	f.stopAll()
	ran, effects := f.audit(ids)
	violations, outcomes := 0, map[string]int{}
	fail := func(format string, args ...any) {
		t.Helper()
		if violations++; violations <= 20 {
			t.Errorf(format, args...)
		}
	}
	for _, a := range all {
		n, on := effects[a.id], ran[a.id]
		s := statuses[a.id]
		if n > 1 || len(on) > 1 {
			fail("action %s ran %d times, on %v", a.id, n, on)
		}
		if a.completed != "" && (n != 1 || len(on) != 1 || on[0] != a.completed) {
			fail("action %s: completed on %s but %d side effects on %v", a.id, a.completed, n, on)
		}
		switch {
		case s.code == http.StatusNotFound:
			outcomes["no route"]++
		case !s.st.Replica.Reachable:
			outcomes["replica gone"]++
		default:
			outcomes[string(s.st.Replica.State)]++
		}
		switch {
		case s.code == http.StatusNotFound:
			if n != 0 || a.completed != "" {
				fail("action %s has no route but %d side effects on %v (completed on %q)", a.id, n, on, a.completed)
			}
		case s.code != http.StatusOK || s.st.Route == nil:
			fail("action %s: status answer %d %s", a.id, s.code, s.raw)
		case s.st.Reservation.Reserved:
			fail("action %s: still reserved after settling: %s", a.id, s.raw)
		case !s.st.Replica.Reachable:
			if liveAtEnd[s.st.Route.ReplicaID] {
				fail("action %s: its replica %s runs but is unreachable: %s", a.id, s.st.Route.ReplicaID, s.raw)
			}
			if a.completed != "" && a.completed != s.st.Route.ReplicaID {
				fail("action %s completed on %s but is routed to %s", a.id, a.completed, s.st.Route.ReplicaID)
			}
		default:
			want := -1 // side effects the replica's state implies
			switch s.st.Replica.State {
			case aip.StateCompleted:
				want = 1
			case aip.StateFailed, aip.StateCancelled, aip.StateNotFound:
				want = 0
			}
			if want < 0 || n != want || (want == 1 && on[0] != s.st.Route.ReplicaID) {
				fail("action %s: the replica says %q (%s) but it has %d side effects on %v", a.id, s.st.Replica.State, s.raw, n, on)
			}
		}
	}
	t.Logf("final states: %v", outcomes)
	if violations > 0 {
		t.Fatalf("%d invariant violations; faults: %s", violations, what)
	}
	return outcomes
}
