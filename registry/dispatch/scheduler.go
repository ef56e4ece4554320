package dispatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// AdmissionLimits bound the dispatcher's fair admission scheduler
// (reference §7.2). A zero field means its default.
type AdmissionLimits struct {
	// MaxInFlight bounds the actions dispatched at once. Defaults to 1024.
	MaxInFlight int
	// MaxInFlightPerTenant bounds one tenant's actions dispatched at once.
	// Defaults to 128.
	MaxInFlightPerTenant int
	// MaxQueued bounds the actions waiting for admission. Defaults to 4096;
	// negative queues none: an action beyond the in-flight bounds is
	// refused at once.
	MaxQueued int
	// MaxQueuedPerTenant bounds one tenant's waiting actions. Defaults to
	// 512; negative queues none of a tenant's actions.
	MaxQueuedPerTenant int
	// MaxQueueBytes bounds the summed size of waiting actions. Defaults to
	// 64 MiB.
	MaxQueueBytes int64
	// MaxRequestBytes bounds one action's size. Defaults to 4 MiB.
	MaxRequestBytes int64
	// MaxQueueAge bounds how long an action waits for admission. Defaults
	// to 30s.
	MaxQueueAge time.Duration
	// TenantWeights gives tenants more than the default weight of 1 in the
	// weighted round robin: a tenant of weight w is admitted up to w times
	// in a row before the next waiting tenant's turn. Weights must be
	// positive.
	TenantWeights map[string]int
}

// Default admission limits.
const (
	DefaultMaxInFlight          = 1024
	DefaultMaxInFlightPerTenant = 128
	DefaultMaxQueued            = 4096
	DefaultMaxQueuedPerTenant   = 512
	DefaultMaxQueueBytes        = 64 << 20
	DefaultMaxRequestBytes      = 4 << 20
	DefaultMaxQueueAge          = 30 * time.Second
)

func (l AdmissionLimits) withDefaults() AdmissionLimits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxInFlight, DefaultMaxInFlight)
	def(&l.MaxInFlightPerTenant, DefaultMaxInFlightPerTenant)
	def(&l.MaxQueued, DefaultMaxQueued)
	def(&l.MaxQueuedPerTenant, DefaultMaxQueuedPerTenant)
	if l.MaxQueueBytes == 0 {
		l.MaxQueueBytes = DefaultMaxQueueBytes
	}
	if l.MaxRequestBytes == 0 {
		l.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if l.MaxQueueAge == 0 {
		l.MaxQueueAge = DefaultMaxQueueAge
	}
	return l
}

// Validate checks every limit (zero is the default; the queue bounds may be
// negative, for no queue; the rest must be positive, MaxRequestBytes at
// most MaxQueueBytes) and every tenant weight (at least 1), and names the
// first one that is wrong.
func (l AdmissionLimits) Validate() error {
	l = l.withDefaults()
	bad := func(field string, v any, rule string) error {
		return fmt.Errorf("%w: %s %v must be %s", ErrInvalidLimits, field, v, rule)
	}
	switch {
	case l.MaxInFlight < 1:
		return bad("MaxInFlight", l.MaxInFlight, "positive")
	case l.MaxInFlightPerTenant < 1:
		return bad("MaxInFlightPerTenant", l.MaxInFlightPerTenant, "positive")
	case l.MaxQueueBytes < 1:
		return bad("MaxQueueBytes", l.MaxQueueBytes, "positive")
	case l.MaxRequestBytes < 1:
		return bad("MaxRequestBytes", l.MaxRequestBytes, "positive")
	case l.MaxQueueAge <= 0:
		return bad("MaxQueueAge", l.MaxQueueAge, "positive")
	case l.MaxRequestBytes > l.MaxQueueBytes:
		return fmt.Errorf("%w: MaxRequestBytes %d exceeds MaxQueueBytes %d, so a request could never wait", ErrInvalidLimits, l.MaxRequestBytes, l.MaxQueueBytes)
	}
	for t, w := range l.TenantWeights {
		if w < 1 {
			return fmt.Errorf("%w: tenant %q has weight %d; weights must be at least 1", ErrInvalidLimits, t, w)
		}
	}
	return nil
}

// Errors of the scheduler. ErrInvalidLimits and ErrRequestTooLarge are
// permanent; the others are temporary overload.
var (
	ErrInvalidLimits       = errors.New("dispatch: invalid admission limits")
	ErrRequestTooLarge     = errors.New("dispatch: request too large")
	ErrQueueFull           = errors.New("dispatch: admission queue full")
	ErrTenantQueueFull     = errors.New("dispatch: tenant admission queue full")
	ErrQueueBytesExhausted = errors.New("dispatch: admission queue bytes exhausted")
	ErrQueueExpired        = errors.New("dispatch: waited too long for admission")
	ErrSchedulerStopped    = errors.New("dispatch: scheduler stopped")
)

// Scheduler is the per-dispatcher fair admission scheduler: bounded
// in-flight actions globally and per tenant, bounded queues (count, bytes,
// age), and weighted round robin over the tenants that wait. An action is
// admitted at once only when its tenant has nobody waiting and both
// in-flight bounds allow it; otherwise it queues, and every release admits
// the next waiters in round-robin order, skipping tenants at their own
// bound. It starts no goroutines.
type Scheduler struct {
	l   AdmissionLimits
	now func() time.Time

	mu          sync.Mutex
	stopped     bool
	active      int
	activeBy    map[string]int
	queues      map[string]*tenantQueue
	ring        []*tenantQueue // tenants with waiters, in round-robin order
	cursor      int            // ring index whose turn it is
	credit      int            // admissions left in the current tenant's turn
	queued      int
	queuedBytes int64
}

type tenantQueue struct {
	tenant  string
	weight  int
	waiters []*waiter
}

type waiter struct {
	tenant  string
	size    int64
	ready   chan struct{} // closed when admitted or failed
	err     error         // set before ready is closed when failed
	granted bool
}

// SchedulerSnapshot is the scheduler's state at one instant.
type SchedulerSnapshot struct {
	Active        int   `json:"active"`
	Queued        int   `json:"queued"`
	QueuedBytes   int64 `json:"queued_bytes"`
	ActiveTenants int   `json:"active_tenants"`
	QueuedTenants int   `json:"queued_tenants"`
}

// NewScheduler validates the limits and returns an idle scheduler. now is
// the clock of queue ages (time.Now when nil).
func NewScheduler(l AdmissionLimits, now func() time.Time) (*Scheduler, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &Scheduler{l: l.withDefaults(), now: now, activeBy: map[string]int{}, queues: map[string]*tenantQueue{}}, nil
}

// Permit is one admitted action. Release it exactly when the action is done;
// Release is idempotent.
type Permit struct {
	s      *Scheduler
	tenant string
	once   sync.Once
	// Waited is how long the action queued before admission.
	Waited time.Duration
}

// Release returns the permit's slot and admits waiters.
func (p *Permit) Release() {
	p.once.Do(func() { p.s.release(p.tenant) })
}

// Acquire admits one action of tenant whose size is size bytes, waiting in
// the tenant's queue when needed. It fails with ErrRequestTooLarge, a
// queue-full error, ErrQueueExpired after MaxQueueAge, ctx's error, or
// ErrSchedulerStopped.
func (s *Scheduler) Acquire(ctx context.Context, tenant string, size int64) (*Permit, error) {
	if size > s.l.MaxRequestBytes {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", ErrRequestTooLarge, size, s.l.MaxRequestBytes)
	}
	start := s.now()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil, ErrSchedulerStopped
	}
	q := s.queues[tenant]
	if (q == nil || len(q.waiters) == 0) && s.active < s.l.MaxInFlight && s.activeBy[tenant] < s.l.MaxInFlightPerTenant {
		s.admit(tenant)
		s.mu.Unlock()
		return &Permit{s: s, tenant: tenant}, nil
	}
	waiting := 0 // the tenant's (a negative bound refuses even the first)
	if q != nil {
		waiting = len(q.waiters)
	}
	switch {
	case s.queued >= s.l.MaxQueued:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %d actions wait", ErrQueueFull, s.queued)
	case waiting >= s.l.MaxQueuedPerTenant:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: tenant %s has %d actions waiting", ErrTenantQueueFull, tenant, waiting)
	case s.queuedBytes+size > s.l.MaxQueueBytes:
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %d bytes wait", ErrQueueBytesExhausted, s.queuedBytes)
	}
	w := &waiter{tenant: tenant, size: size, ready: make(chan struct{})}
	s.enqueue(w)
	s.mu.Unlock()

	timer := time.NewTimer(s.l.MaxQueueAge)
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
	case <-ctx.Done():
		cause = ctx.Err()
	case <-timer.C:
		cause = fmt.Errorf("%w: %s", ErrQueueExpired, s.l.MaxQueueAge)
	}
	s.mu.Lock()
	if cause != nil && !w.granted && w.err == nil {
		s.remove(w)
		s.mu.Unlock()
		return nil, cause
	}
	granted, err := w.granted, w.err
	s.mu.Unlock()
	if !granted {
		return nil, err
	}
	p := &Permit{s: s, tenant: tenant, Waited: s.now().Sub(start)}
	if cause != nil && ctx.Err() != nil {
		// Admitted just as the caller gave up: give the slot back.
		p.Release()
		return nil, ctx.Err()
	}
	return p, nil
}

// Stop fails every waiter and every later Acquire with
// ErrSchedulerStopped. Permits already granted stay valid.
func (s *Scheduler) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	for _, q := range s.ring {
		for _, w := range q.waiters {
			w.err = ErrSchedulerStopped
			close(w.ready)
		}
		q.waiters = nil
		delete(s.queues, q.tenant)
	}
	s.ring, s.cursor, s.credit, s.queued, s.queuedBytes = nil, 0, 0, 0, 0
}

// Snapshot returns the current counts.
func (s *Scheduler) Snapshot() SchedulerSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SchedulerSnapshot{Active: s.active, Queued: s.queued, QueuedBytes: s.queuedBytes,
		ActiveTenants: len(s.activeBy), QueuedTenants: len(s.ring)}
}

func (s *Scheduler) admit(tenant string) {
	s.active++
	s.activeBy[tenant]++
}

func (s *Scheduler) release(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if n := s.activeBy[tenant]; n > 1 {
		s.activeBy[tenant] = n - 1
	} else {
		delete(s.activeBy, tenant)
	}
	s.dispatch()
}

func (s *Scheduler) enqueue(w *waiter) {
	q := s.queues[w.tenant]
	if q == nil {
		weight := s.l.TenantWeights[w.tenant]
		if weight < 1 {
			weight = 1
		}
		q = &tenantQueue{tenant: w.tenant, weight: weight}
		s.queues[w.tenant] = q
	}
	if len(q.waiters) == 0 {
		// Join the ring just before the tenant whose turn it is, so a new
		// tenant waits a full round at most.
		if len(s.ring) == 0 {
			s.credit = q.weight
		}
		s.ring = append(s.ring, nil)
		copy(s.ring[s.cursor+1:], s.ring[s.cursor:])
		s.ring[s.cursor] = q
		if len(s.ring) > 1 {
			s.cursor++
		}
	}
	q.waiters = append(q.waiters, w)
	s.queued++
	s.queuedBytes += w.size
	s.dispatch()
}

// remove takes a waiter that gave up out of its queue.
func (s *Scheduler) remove(w *waiter) {
	q := s.queues[w.tenant]
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			s.queued--
			s.queuedBytes -= w.size
			break
		}
	}
	if len(q.waiters) == 0 {
		s.dropTenant(q)
	}
	s.dispatch()
}

// dropTenant takes a tenant without waiters out of the ring.
func (s *Scheduler) dropTenant(q *tenantQueue) {
	delete(s.queues, q.tenant)
	for i, x := range s.ring {
		if x != q {
			continue
		}
		s.ring = append(s.ring[:i], s.ring[i+1:]...)
		switch {
		case i < s.cursor:
			s.cursor--
		case i == s.cursor:
			s.credit = 0 // the next tenant starts a fresh turn
		}
		if s.cursor >= len(s.ring) {
			s.cursor = 0
		}
		return
	}
}

// dispatch admits waiters in weighted round-robin order while capacity
// lasts, skipping tenants at their in-flight bound.
func (s *Scheduler) dispatch() {
	for s.active < s.l.MaxInFlight && len(s.ring) > 0 {
		admitted := false
		for range len(s.ring) {
			q := s.ring[s.cursor]
			if s.credit <= 0 {
				s.credit = q.weight
			}
			if s.activeBy[q.tenant] >= s.l.MaxInFlightPerTenant {
				s.advance()
				continue
			}
			w := q.waiters[0]
			q.waiters = q.waiters[1:]
			s.queued--
			s.queuedBytes -= w.size
			s.admit(w.tenant)
			w.granted = true
			close(w.ready)
			s.credit--
			if len(q.waiters) == 0 {
				s.dropTenant(q)
			} else if s.credit <= 0 {
				s.advance()
			}
			admitted = true
			break
		}
		if !admitted {
			return // every waiting tenant is at its own bound
		}
	}
}

func (s *Scheduler) advance() {
	s.cursor = (s.cursor + 1) % len(s.ring)
	s.credit = 0
}
