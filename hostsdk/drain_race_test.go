package hostsdk_test

import (
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestActionReadyJustBeforeTheDrainIsNotCancelledAfterTheLinger: an
// action whose request found the replica ready just before the drain
// began, and takes its in-flight slot only after the drain's wait found
// nothing in flight, is refused with the signed not_ready (the dispatcher
// reroutes it), as one that arrives after the drain began. The slots were
// closed only at step 6: the action took one, ran, and was cancelled as
// soon as the linger ended (2 s, not the drain timeout), answered
// outcome_unknown, and made the shutdown unclean ("still running at the
// drain timeout").
func TestActionReadyJustBeforeTheDrainIsNotCancelledAfterTheLinger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, func(c *hostsdk.Config) {
			c.DrainTimeout, c.DrainLinger = time.Minute, 2*time.Second
		})
		defer close(b.conn.release)
		ctx := b.awaitFirstBeat(t)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		entered, proceed := make(chan struct{}), make(chan struct{})
		b.h.SetBeforeAcquire(func() {
			close(entered)
			<-proceed
		})

		a := action(capBlock, `{"message":"x"}`)
		answered := make(chan *hostsdktest.Response, 1)
		go func() {
			resp, err := b.d.Act(ctx, target, a)
			if err != nil {
				t.Error(err)
			}
			answered <- resp
		}()
		<-entered // ready, not yet in flight
		stopped := make(chan error, 1)
		go func() { stopped <- b.h.Stop(ctx) }()
		synctest.Wait() // the drain found nothing in flight; it lingers
		close(proceed)
		if resp := <-answered; resp != nil {
			wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
		}
		if err := <-stopped; err != nil {
			t.Errorf("Stop: %v, want a clean shutdown", err)
		}
		if n := b.conn.runCount(a.ID); n != 0 {
			t.Errorf("the action ran %d times during the drain", n)
		}
	})
}
