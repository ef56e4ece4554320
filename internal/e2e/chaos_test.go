package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
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
	load := startCareful(f, seed, chaosClients, 0)
	defer load.halt()

	// usable waits until the fleet completes more answers.
	usable := func(what string) {
		t.Helper()
		load.usable(t, what, f.disp, f.cp)
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
		live := f.runningReplicas()
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
		t.Logf("fault %d: %s (%d answers so far)", len(plan), plan[len(plan)-1], load.answered.Load())
		usable("the fleet to answer after " + plan[len(plan)-1])
		time.Sleep(time.Duration(200+rng.IntN(800)) * time.Millisecond) // load between faults
	}
	restartPending(true)
	usable("the fleet to answer after the faults")
	load.halt()
	t.Logf("faults: %s", strings.Join(plan, "; "))
	verifySettled(t, f, tok, load.all(), strings.Join(plan, "; "))
	if err := f.disp.Term(t); err != nil {
		t.Errorf("the dispatcher did not stop cleanly: %v", err)
	}
	if err := f.cp.Term(t); err != nil {
		t.Errorf("the control plane did not stop cleanly: %v", err)
	}
}
