package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// Chaos test knobs: AIP_CHAOS_SEED replays a run (the seed is logged), and
// AIP_CHAOS_DURATION (a Go duration) lengthens or shortens the fault phase.
const (
	envChaosSeed     = "AIP_CHAOS_SEED"
	envChaosDuration = "AIP_CHAOS_DURATION"
	// defaultChaosSeed keeps CI deterministic in the faults it tries.
	defaultChaosSeed     = 20261130
	defaultChaosDuration = 20 * time.Second
	chaosClients         = 16
	chaosReplicas        = 3
	// chaosAttempts bounds a client's sends of one action ID.
	chaosAttempts = 6
)

// chaosFault is one kind of injected fault.
type chaosFault int

const (
	faultKillReplace    chaosFault = iota // SIGKILL a replica, start a fresh one (new replica ID)
	faultKillRestart                      // SIGKILL a replica, later restart it on its own identity and journal
	faultDrainReplace                     // start a fresh replica, SIGTERM (drain) an old one
	faultKillDispatcher                   // SIGKILL the dispatcher and start it again
	faultKillControl                      // SIGKILL the control plane and start it again
	faultPause                            // SIGSTOP a replica for a moment, then SIGCONT
	numFaults
)

func (c chaosFault) String() string {
	return [...]string{"kill+replace replica", "kill+restart replica", "drain+replace replica", "kill dispatcher",
		"kill control plane", "pause replica"}[c]
}

// chaosAction is what one client saw for one action ID over its attempts.
type chaosAction struct {
	id       string
	attempts int
	// completed is the route replica of a completed answer ("" if none).
	completed string
	last      string // the last answer, for the failure message
}

// TestChaos: while chaosClients clients send actions (resending the same
// action ID after an error or an uncertain answer, as a careful client
// does), a seeded random sequence of faults hits the fleet — replicas
// killed (replaced, or restarted on their own journal), drained, paused;
// the dispatcher and the control plane killed and restarted. Once the
// faults stop and the fleet settles: no action ran more than once (side
// effects summed over every journal, replaced replicas' included); every
// completed answer has exactly one side effect, on the replica that
// answered; every action's status agrees with its side effects; no
// reservation, counter or active assignment is left held; and no process
// exited that the test did not stop.
func TestChaos(t *testing.T) {
	seed := uint64(defaultChaosSeed)
	if s := os.Getenv(envChaosSeed); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want an unsigned integer", envChaosSeed, s)
		}
		seed = v
	}
	duration := defaultChaosDuration
	if s := os.Getenv(envChaosDuration); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration", envChaosDuration, s)
		}
		duration = d
	}
	t.Logf("chaos seed %d (replay with %s=%d), faults for %s", seed, envChaosSeed, seed, duration)

	f := newFleet(t, fleetOptions{replicas: chaosReplicas, dispatchArgs: []string{
		"--max-timeout", "3s", "--action-timeout", "3s", "--reconcile-after", "10s", "--reconcile-interval", "500ms"}})
	tok := f.token(tenantID)

	var (
		mu       sync.Mutex
		actions  []*chaosAction
		answered atomic.Int64 // completed answers, to see the fleet is usable
	)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for c := range chaosClients {
		rng := rand.New(rand.NewPCG(seed, uint64(c)+1))
		clients.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				a := &chaosAction{id: aip.NewActionID()}
				mu.Lock()
				actions = append(actions, a)
				mu.Unlock()
				hold, timeout := rng.IntN(30), 10*time.Second
				if rng.IntN(20) == 0 {
					// An impatient client: it gives up on its first send
					// while the action still runs, and resends the ID.
					hold, timeout = 300+rng.IntN(500), 150*time.Millisecond
				}
				extra := fmt.Sprintf(`,"hold_ms":%d`, hold)
				backoff := 100 * time.Millisecond
				for a.attempts < chaosAttempts {
					a.attempts++
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					timeout = 10 * time.Second
					status, resp, err := f.send(ctx, tok, a.id, "chaos", extra)
					cancel()
					if err == nil && status == http.StatusOK && resp.Settlement == registry.SettlementCompleted &&
						resp.Result != nil && resp.Result.Status == aip.ResultCompleted && resp.Route != nil {
						o, oerr := outputOf(&resp)
						if oerr != nil || o.SideEffects != 1 {
							a.last = fmt.Sprintf("completed with output %s (%v)", resp.Result.Output, oerr)
						} else {
							a.completed = resp.Route.ReplicaID
							answered.Add(1)
						}
						break
					}
					a.last = fmt.Sprintf("status %d err %v settlement %q error %+v", status, err, resp.Settlement, resp.Error)
					if resp.Result != nil && resp.Result.Status == aip.ResultFailed {
						break // a definitive answer: the action did not run
					}
					time.Sleep(backoff) // a careful client's pause before resending
					backoff = min(2*backoff, time.Second)
				}
			}
		})
	}
	stopClients := sync.OnceFunc(func() { close(stop); clients.Wait() })
	defer stopClients()

	// usable waits until the fleet completes more answers.
	usable := func(what string) {
		t.Helper()
		target := answered.Load() + 10
		waitFor(t, what, []*process{f.disp, f.cp}, func() bool { return answered.Load() >= target })
	}
	running := func() []*replica {
		var out []*replica
		for _, r := range f.replicaList() {
			if !r.proc.Exited() {
				out = append(out, r)
			}
		}
		return out
	}
	restartable := func(r *replica) bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && rep.Status == aip.ReplicaOffline && !rep.LeaseValid(time.Now())
	}
	var pending []*replica // killed, to be restarted on their own identity
	restartPending := func(wait bool) {
		t.Helper()
		var left []*replica
		for _, r := range pending {
			if wait {
				waitFor(t, "killed replica "+r.id+" to go offline", []*process{f.cp}, func() bool { return restartable(r) })
			}
			if !restartable(r) {
				left = append(left, r)
				continue
			}
			f.startHost(r)
			t.Logf("restarted %s on its own journal", r.id)
		}
		pending = left
	}

	rng := rand.New(rand.NewPCG(seed, 0))
	usable("the first answers")
	var plan []string
	for end := time.Now().Add(duration); time.Now().Before(end); {
		restartPending(false)
		fault := chaosFault(rng.IntN(int(numFaults)))
		live := running()
		if fault == faultKillRestart && (len(live) < 3 || len(pending) > 0) {
			fault = faultKillReplace // keep two replicas serving
		}
		victim := live[rng.IntN(len(live))]
		switch fault {
		case faultKillReplace:
			victim.proc.Kill()
			fresh := f.addReplica()
			plan = append(plan, fmt.Sprintf("%s %s → %s", fault, victim.id, fresh.id))
		case faultKillRestart:
			victim.proc.Kill()
			pending = append(pending, victim)
			plan = append(plan, fmt.Sprintf("%s %s", fault, victim.id))
		case faultDrainReplace:
			fresh := f.addReplica()
			if err := victim.proc.Term(t); err != nil {
				t.Errorf("replica %s did not drain cleanly: %v", victim.id, err)
			}
			plan = append(plan, fmt.Sprintf("%s %s → %s", fault, victim.id, fresh.id))
		case faultKillDispatcher:
			f.disp.Kill()
			f.startDispatcher()
			plan = append(plan, fault.String())
		case faultKillControl:
			f.cp.Kill()
			f.startControlPlane()
			plan = append(plan, fault.String())
		case faultPause:
			pause := time.Duration(500+rng.IntN(2000)) * time.Millisecond
			victim.proc.Signal(t, syscall.SIGSTOP)
			time.Sleep(pause) // the fault itself: the replica is frozen this long
			victim.proc.Signal(t, syscall.SIGCONT)
			plan = append(plan, fmt.Sprintf("%s %s for %s", fault, victim.id, pause))
		}
		t.Logf("fault %d: %s (%d answers so far)", len(plan), plan[len(plan)-1], answered.Load())
		usable("the fleet to answer after " + plan[len(plan)-1])
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // load between faults
	}
	restartPending(true)
	usable("the fleet to answer after the faults")
	stopClients()

	mu.Lock()
	all := append([]*chaosAction(nil), actions...)
	mu.Unlock()
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
	t.Logf("faults: %s", strings.Join(plan, "; "))
	t.Logf("%d actions, %d sent more than once, %d without a completed answer", len(all), resent, incomplete)

	// Settle: reconciliation (10 s after a hand-out) and lease maintenance
	// release every reservation still held.
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
	for _, r := range running() {
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
		t.Fatalf("%d invariant violations; faults: %s", violations, strings.Join(plan, "; "))
	}
	if err := f.disp.Term(t); err != nil {
		t.Errorf("the dispatcher did not stop cleanly: %v", err)
	}
	if err := f.cp.Term(t); err != nil {
		t.Errorf("the control plane did not stop cleanly: %v", err)
	}
}
