package dispatch

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/aipfleet/aipfleet/registry"
)

// DefaultSettleRetryTimeout is how long a settlement the registry did not
// confirm is retried in the background by default.
const DefaultSettleRetryTimeout = 2 * time.Minute

// settleRetries runs the background retries of settlements the registry did
// not confirm (a storage failure or a timeout, during a database outage for
// example). Until its settlement commits, a route keeps its reservation: its
// replica's slot and its admission counters stay taken, so a failed
// settlement that was only logged would shrink the fleet's capacity until
// the replica's lease ended. The answer to the client does not wait for the
// retries.
type settleRetries struct {
	ctx    context.Context // cancelled to give up on every pending retry
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	closed bool // no retry starts any more
}

// start runs f in a goroutine the dispatcher waits for, unless it stopped
// taking retries.
func (r *settleRetries) start(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
	return true
}

func newSettleRetries() *settleRetries {
	ctx, cancel := context.WithCancel(context.Background())
	return &settleRetries{ctx: ctx, cancel: cancel}
}

// retryableSettle reports whether a settlement error may pass: a storage
// failure or a timeout. A lost fence, a missing route or an invalid
// settlement will not change by trying again.
func retryableSettle(err error) bool {
	return errors.Is(err, registry.ErrStorage) || errors.Is(err, context.DeadlineExceeded)
}

// retrySettle settles a in the background after the settlement failed with
// first, with exponential backoff (100 ms growing to 5 s, jittered) for at
// most SettleRetryTimeout, unless first cannot pass or retries are disabled.
// a is the hand-out the execution holds: if the first attempt committed
// unseen and a retry of the action reserved the route again meanwhile, the
// registry takes the repeat as a settlement of an earlier hand-out and
// changes nothing (the outcome is not counted twice).
func (d *Dispatcher) retrySettle(a registry.RouteAssignment, s registry.RouteSettlement, first error) {
	log := d.log.With("action_id", a.ActionID, "replica_id", a.ReplicaID, "settlement", s)
	if errors.Is(first, registry.ErrFenceLost) {
		// The route was reassigned since this hand-out (a reroute, perhaps
		// one whose answer was lost): the reassignment released the
		// reservation this settlement was for, and the new one is its
		// holder's (or released unsent, unsent.go).
		log.Warn("settle found the route reassigned; the reassignment released this reservation", "error", first)
		return
	}
	if d.cfg.SettleRetryTimeout < 0 || !retryableSettle(first) {
		log.Error("settle failed; the route stays reserved", "error", first)
		return
	}
	log.Warn("settle failed; retrying in the background", "error", first, "for", d.cfg.SettleRetryTimeout.String())
	started := d.retries.start(func() {
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, d.cfg.SettleRetryTimeout
		b.Reset()
		attempts := 0
		err := backoff.Retry(func() error {
			attempts++
			d.m.settleRetries.Inc()
			err := d.settle(d.retries.ctx, &a, s)
			if err != nil && !retryableSettle(err) {
				return backoff.Permanent(err)
			}
			return err
		}, backoff.WithContext(b, d.retries.ctx))
		if err != nil {
			log.Error("settle retries gave up; the route stays reserved", "attempts", attempts, "error", err)
			return
		}
		log.Info("settled after retrying", "attempts", attempts)
	})
	if !started {
		log.Error("the dispatcher stopped: the settlement is not retried and the route stays reserved", "error", first)
	}
}

// waitRetries waits for the pending settlement retries until ctx ends, then
// gives up on the rest.
func (d *Dispatcher) waitRetries(ctx context.Context) {
	d.retries.mu.Lock()
	d.retries.closed = true
	d.retries.mu.Unlock()
	done := make(chan struct{})
	go func() { d.retries.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		d.retries.cancel()
		<-done
	}
	d.retries.cancel()
}
