package hostsdk_test

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// A lease recovery the control plane committed but whose answers (the send
// and its resend) were both lost left the replica ready in the registry at
// a sequence the host never saw. A shutdown then skipped the drain (the
// local lease had expired) and sent offline from the old sequence, which
// lost the fence: the replica stayed ready and routable, with nobody
// serving it, until its lease ran out. The shutdown replays the pending
// registration first, then drains and goes offline from its sequence.
func TestStopAfterALostRecoveryAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := b.awaitFirstBeat(t)
		// t1: the first heartbeat renewed the lease to t1+30.
		b.cp.SetUnavailable(true)
		// Beats at +10, +20 and their retries failed, the last retry a
		// second before the lease runs out at +30.
		time.Sleep(29500 * time.Millisecond)
		b.cp.SetUnavailable(false)
		b.cp.FailNext(2, hostsdktest.FaultDropResponse)
		time.Sleep(5 * time.Second) // +30: the recovery commits; both answers are lost
		regs := opsOf(b.cp, aip.OpRegister)
		if len(regs) != 3 || regs[2].Fault != hostsdktest.FaultDropResponse {
			t.Fatalf("register attempts %+v: want one committed recovery whose answers were dropped", regs)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaReady {
			t.Fatalf("replica is %s after the committed recovery", st.Status)
		}
		if err := b.h.Stop(ctx); err != nil {
			t.Errorf("Stop = %v, want a clean shutdown", err)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Fatalf("replica is %s after shutdown, want offline", st.Status)
		}
		o := b.cp.Operations()
		last := o[len(o)-3:]
		if last[0].Op != aip.OpRegister || last[0].RequestID != regs[2].RequestID || !last[0].Replayed ||
			last[1].Op != aip.OpDrain || last[2].Op != aip.OpOffline || last[2].Outcome != aip.OutcomeOffline {
			t.Fatalf("shutdown operations %+v: want the lost registration replayed, then drain and offline", last)
		}
	})
}

// A start whose registration the control plane committed but whose answers
// were both lost failed at step 8 and left the replica ready in the
// registry, routable with nobody serving it, until its lease ran out (and
// a restarted host could not register before then: the lease was live).
// The failed start replays the registration to learn its outcome and takes
// the replica offline. (Without the wait for the control plane: with it,
// the start replays the registration and succeeds.
// TestFailedStartAfterTheRegisterWaitGoesOffline fails the start after
// the wait.)
func TestFailedStartAfterALostRegisterAnswerGoesOffline(t *testing.T) {
	f := newFleet(t)
	f.cfg.RegisterWait = hostsdk.NoRegisterWait
	f.cp.FailNext(2, hostsdktest.FaultDropResponse)
	h, err := hostsdk.New(f.cfg, newTestConnector())
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start(ctxT(t))
	var stepErr hostsdk.StepError
	if !errors.As(err, &stepErr) || stepErr.Step() != hostsdk.StepRegister {
		t.Fatalf("Start = %v, want a failure at the register step", err)
	}
	if st, _ := f.cp.Replica(f.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
		t.Errorf("replica is %s after a failed start, want offline", st.Status)
	}
	regs := opsOf(f.cp, aip.OpRegister)
	if len(regs) != 3 || !regs[2].Replayed || regs[2].RequestID != regs[0].RequestID {
		t.Errorf("register attempts %+v: want the lost registration replayed", regs)
	}
	if diff := cmp.Diff([]aip.Operation{aip.OpRegister, aip.OpRegister, aip.OpRegister, aip.OpOffline}, ops(f.cp)); diff != "" {
		t.Errorf("lifecycle operations (-want +got):\n%s", diff)
	}
}
