package hostsdk_test

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestStopDoesNotSendARegistrationThatWasNeverApplied: a host whose lease
// ran out during a control-plane outage tried to recover it, and the
// control plane answered each attempt with its signed 503 (nothing
// applied). Stopped once the control plane is back, the host sent that
// registration again before its offline transition, as if its answers
// had been lost: the control plane registered the replica afresh (ready
// and routable, though the host was stopping without a lease), and the
// host then had to drain it. Nothing of it was applied, so nothing is
// sent: the shutdown skips the drain (no valid lease) and goes offline.
func TestStopDoesNotSendARegistrationThatWasNeverApplied(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		// t1: the first beat renewed the lease to t1+30.
		b.cp.SetUnavailable(true)
		time.Sleep(35 * time.Second) // +30: the recovery is answered 503, twice
		if regs := opsOf(b.cp, aip.OpRegister); len(regs) != 3 || regs[1].RequestID != regs[2].RequestID ||
			regs[1].Fault != hostsdktest.FaultUnavailable || regs[2].Fault != hostsdktest.FaultUnavailable {
			t.Fatalf("register attempts %+v: want the start's and one recovery sent twice, refused 503", regs)
		}
		b.cp.SetUnavailable(false)
		seen := len(b.cp.Operations())
		if err := b.h.Stop(context.Background()); err != nil {
			t.Errorf("Stop: %v", err)
		}
		var after []aip.Operation
		for _, o := range b.cp.Operations()[seen:] {
			after = append(after, o.Op)
		}
		if want := []aip.Operation{aip.OpOffline}; !slices.Equal(after, want) {
			t.Errorf("the shutdown sent %v, want %v: the replica had no lease, and the pending registration was never applied", after, want)
		}
		if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
			t.Errorf("replica %s after the shutdown, want offline", st.Status)
		}
	})
}
