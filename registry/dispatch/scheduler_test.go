package dispatch_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// queue starts an Acquire for tenant in the bubble and returns a channel
// that yields its permit (or error) once it returns. It waits until the
// goroutine is blocked, so calls enqueue in order.
type result struct {
	tenant string
	p      *dispatch.Permit
	err    error
}

func enqueue(ctx context.Context, s *dispatch.Scheduler, tenant string, size int64, out chan<- result) {
	go func() {
		p, err := s.Acquire(ctx, tenant, size)
		out <- result{tenant, p, err}
	}()
	synctest.Wait()
}

func newScheduler(t *testing.T, l dispatch.AdmissionLimits) *dispatch.Scheduler {
	t.Helper()
	s, err := dispatch.NewScheduler(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestSchedulerDefaultsAndValidation(t *testing.T) {
	for _, c := range []struct {
		l    dispatch.AdmissionLimits
		want string // what the error must name
	}{
		{dispatch.AdmissionLimits{MaxInFlight: -1}, "MaxInFlight -1"},
		{dispatch.AdmissionLimits{MaxInFlightPerTenant: -2}, "MaxInFlightPerTenant -2"},
		{dispatch.AdmissionLimits{MaxQueueBytes: -5}, "MaxQueueBytes -5"},
		{dispatch.AdmissionLimits{MaxRequestBytes: -7}, "MaxRequestBytes -7"},
		{dispatch.AdmissionLimits{MaxRequestBytes: 10, MaxQueueBytes: 5}, "MaxRequestBytes 10 exceeds MaxQueueBytes 5"},
		{dispatch.AdmissionLimits{TenantWeights: map[string]int{"a": 0}}, `tenant "a" has weight 0`},
		{dispatch.AdmissionLimits{MaxQueueAge: -time.Second}, "MaxQueueAge -1s"},
	} {
		_, err := dispatch.NewScheduler(c.l, nil)
		if !errors.Is(err, dispatch.ErrInvalidLimits) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewScheduler(%+v) = %v, want ErrInvalidLimits naming %q", c.l, err, c.want)
		}
	}
	s := newScheduler(t, dispatch.AdmissionLimits{})
	var permits []*dispatch.Permit
	for range dispatch.DefaultMaxInFlightPerTenant {
		p, err := s.Acquire(t.Context(), "a", 1)
		if err != nil {
			t.Fatal(err)
		}
		permits = append(permits, p)
	}
	if snap := s.Snapshot(); snap.Active != dispatch.DefaultMaxInFlightPerTenant || snap.ActiveTenants != 1 || snap.Queued != 0 {
		t.Fatalf("snapshot %+v", snap)
	}
	if _, err := s.Acquire(t.Context(), "a", dispatch.DefaultMaxRequestBytes+1); !errors.Is(err, dispatch.ErrRequestTooLarge) {
		t.Fatalf("oversized acquire: %v", err)
	}
	for _, p := range permits {
		p.Release()
		p.Release() // idempotent
	}
	if snap := s.Snapshot(); snap.Active != 0 || snap.ActiveTenants != 0 {
		t.Fatalf("after releases: %+v", snap)
	}
}

// TestSchedulerWithoutQueue: a negative queue bound queues nothing: an
// action beyond the in-flight bounds is refused at once (a zero one is the
// default). Validate refused a negative bound ("must be zero or
// positive"), and a zero one became the default 4096 or 512, so an
// operator could not turn queueing off.
func TestSchedulerWithoutQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 1, MaxQueued: -1})
		hold, err := s.Acquire(t.Context(), "a", 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(t.Context(), "b", 1); !errors.Is(err, dispatch.ErrQueueFull) {
			t.Fatalf("beyond MaxInFlight without a queue: %v, want ErrQueueFull at once", err)
		}
		hold.Release()

		s = newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 4, MaxInFlightPerTenant: 1, MaxQueuedPerTenant: -1})
		if hold, err = s.Acquire(t.Context(), "a", 1); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Acquire(t.Context(), "a", 1); !errors.Is(err, dispatch.ErrTenantQueueFull) {
			t.Fatalf("beyond MaxInFlightPerTenant without a tenant queue: %v, want ErrTenantQueueFull at once", err)
		}
		other, err := s.Acquire(t.Context(), "b", 1)
		if err != nil {
			t.Fatalf("another tenant: %v", err)
		}
		if snap := s.Snapshot(); snap.Active != 2 || snap.Queued != 0 {
			t.Fatalf("snapshot %+v", snap)
		}
		hold.Release()
		other.Release()
	})
}

func TestSchedulerWeightedRoundRobin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 1, TenantWeights: map[string]int{"heavy": 2}})
		hold, err := s.Acquire(t.Context(), "x", 1)
		if err != nil {
			t.Fatal(err)
		}
		out := make(chan result, 64)
		for range 6 {
			enqueue(t.Context(), s, "light", 1, out)
		}
		for range 6 {
			enqueue(t.Context(), s, "heavy", 1, out)
		}
		if snap := s.Snapshot(); snap.Queued != 12 || snap.QueuedTenants != 2 || snap.QueuedBytes != 12 {
			t.Fatalf("snapshot %+v", snap)
		}
		hold.Release()
		var order string
		for range 12 {
			r := <-out
			if r.err != nil {
				t.Fatal(r.err)
			}
			order += r.tenant[:1]
			synctest.Wait()
			r.p.Release()
		}
		// light was waiting first; heavy joined before its turn came round
		// again and takes two admissions per turn.
		if want := "lhhlhhlhhlll"; order != want {
			t.Fatalf("admission order %s, want %s", order, want)
		}
	})
}

func TestSchedulerNoisyTenantDoesNotStarveOthers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 4, MaxInFlightPerTenant: 4})
		out := make(chan result, 256)
		var noisy []*dispatch.Permit
		for range 4 {
			p, err := s.Acquire(t.Context(), "noisy", 1)
			if err != nil {
				t.Fatal(err)
			}
			noisy = append(noisy, p)
		}
		for range 100 {
			enqueue(t.Context(), s, "noisy", 1, out)
		}
		enqueue(t.Context(), s, "quiet", 1, out)
		noisy[0].Release()
		first := <-out
		synctest.Wait()
		noisy[1].Release()
		second := <-out
		if first.tenant != "quiet" && second.tenant != "quiet" {
			t.Fatalf("after two releases the quiet tenant still waits behind 100 noisy actions (%s, %s)", first.tenant, second.tenant)
		}
		// Drain everything.
		noisy[2].Release()
		noisy[3].Release()
		first.p.Release()
		second.p.Release()
		for range 99 {
			r := <-out
			r.p.Release()
		}
		if snap := s.Snapshot(); snap.Active != 0 || snap.Queued != 0 {
			t.Fatalf("snapshot after drain %+v", snap)
		}
	})
}

func TestSchedulerTenantBoundLetsOthersThrough(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 3, MaxInFlightPerTenant: 1})
		a, err := s.Acquire(t.Context(), "a", 1)
		if err != nil {
			t.Fatal(err)
		}
		out := make(chan result, 4)
		enqueue(t.Context(), s, "a", 1, out) // waits for a's own bound
		b, err := s.Acquire(t.Context(), "b", 1)
		if err != nil {
			t.Fatalf("b is admitted at once while a waits on its own bound: %v", err)
		}
		select {
		case r := <-out:
			t.Fatalf("a's second action was admitted over its bound: %+v", r)
		default:
		}
		a.Release()
		r := <-out
		if r.err != nil || r.tenant != "a" {
			t.Fatalf("after a's release: %+v", r)
		}
		r.p.Release()
		b.Release()
	})
}

func TestSchedulerQueueBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 1, MaxQueued: 3, MaxQueuedPerTenant: 2, MaxQueueBytes: 70, MaxRequestBytes: 60})
		hold, _ := s.Acquire(ctx, "x", 1)
		out := make(chan result, 8)
		enqueue(ctx, s, "a", 10, out)
		enqueue(ctx, s, "a", 10, out)
		if _, err := s.Acquire(ctx, "a", 10); !errors.Is(err, dispatch.ErrTenantQueueFull) {
			t.Fatalf("third of a: %v", err)
		}
		if _, err := s.Acquire(ctx, "b", 60); !errors.Is(err, dispatch.ErrQueueBytesExhausted) {
			t.Fatalf("bytes: %v", err)
		}
		enqueue(ctx, s, "b", 50, out)
		if _, err := s.Acquire(ctx, "c", 1); !errors.Is(err, dispatch.ErrQueueFull) {
			t.Fatalf("fourth waiter: %v", err)
		}
		cancel()
		for range 3 {
			if r := <-out; !errors.Is(r.err, context.Canceled) {
				t.Fatalf("cancelled waiter: %+v", r)
			}
		}
		if snap := s.Snapshot(); snap.Queued != 0 || snap.QueuedBytes != 0 || snap.QueuedTenants != 0 {
			t.Fatalf("cancelled waiters left %+v", snap)
		}
		hold.Release()
	})
}

func TestSchedulerQueueAge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 1, MaxQueueAge: time.Second})
		hold, _ := s.Acquire(t.Context(), "x", 1)
		out := make(chan result, 2)
		enqueue(t.Context(), s, "a", 1, out)
		time.Sleep(999 * time.Millisecond)
		synctest.Wait()
		select {
		case r := <-out:
			t.Fatalf("expired early: %+v", r)
		default:
		}
		time.Sleep(time.Millisecond)
		if r := <-out; !errors.Is(r.err, dispatch.ErrQueueExpired) {
			t.Fatalf("after the maximum age: %+v", r)
		}
		// A waiter admitted in time reports how long it waited.
		enqueue(t.Context(), s, "a", 1, out)
		time.Sleep(300 * time.Millisecond)
		hold.Release()
		r := <-out
		if r.err != nil || r.p.Waited != 300*time.Millisecond {
			t.Fatalf("admitted waiter: %+v (waited %v)", r, r.p.Waited)
		}
		r.p.Release()
	})
}

func TestSchedulerStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: 1})
		hold, _ := s.Acquire(t.Context(), "x", 1)
		out := make(chan result, 2)
		enqueue(t.Context(), s, "a", 1, out)
		s.Stop()
		if r := <-out; !errors.Is(r.err, dispatch.ErrSchedulerStopped) {
			t.Fatalf("waiter after stop: %+v", r)
		}
		if _, err := s.Acquire(t.Context(), "a", 1); !errors.Is(err, dispatch.ErrSchedulerStopped) {
			t.Fatalf("acquire after stop: %v", err)
		}
		hold.Release() // a permit granted before Stop stays valid
	})
}

// TestSchedulerUnderLoad hammers the scheduler from many goroutines and
// checks that no bound is ever exceeded and every action is admitted.
func TestSchedulerUnderLoad(t *testing.T) {
	const maxInFlight, perTenant = 8, 3
	s := newScheduler(t, dispatch.AdmissionLimits{MaxInFlight: maxInFlight, MaxInFlightPerTenant: perTenant})
	var active atomic.Int64
	var mu sync.Mutex
	perActive := map[string]int{}
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for g := range 40 {
		tenant := fmt.Sprintf("t%d", g%5)
		wg.Go(func() {
			for range 50 {
				p, err := s.Acquire(t.Context(), tenant, 1)
				if err != nil {
					t.Error(err)
					return
				}
				if n := active.Add(1); n > maxInFlight {
					t.Errorf("%d in flight, bound %d", n, maxInFlight)
				}
				mu.Lock()
				perActive[tenant]++
				if perActive[tenant] > perTenant {
					t.Errorf("tenant %s has %d in flight, bound %d", tenant, perActive[tenant], perTenant)
				}
				mu.Unlock()
				admitted.Add(1)
				mu.Lock()
				perActive[tenant]--
				mu.Unlock()
				active.Add(-1)
				p.Release()
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 40*50 {
		t.Fatalf("admitted %d of %d", admitted.Load(), 40*50)
	}
	if snap := s.Snapshot(); snap != (dispatch.SchedulerSnapshot{}) {
		t.Fatalf("snapshot after load %+v", snap)
	}
}
