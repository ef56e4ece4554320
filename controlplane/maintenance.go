package controlplane

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/aipfleet/aipfleet/registry"
)

// maintenanceFailuresNotReady is the number of consecutive failed
// maintenance cycles after which /ready fails its maintenance check.
const maintenanceFailuresNotReady = 3

// maintenanceState is what /ready reports of the loop.
type maintenanceState struct {
	mu          sync.Mutex
	lastSuccess time.Time
	lastErr     error
	failures    int // consecutive
}

func (m *maintenanceState) record(now time.Time, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		m.lastErr = err
		m.failures++
		return
	}
	m.lastSuccess, m.lastErr, m.failures = now, nil, 0
}

func (m *maintenanceState) snapshot() (last time.Time, failures int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastSuccess, m.failures, m.lastErr
}

// runMaintenance runs a maintenance cycle every MaintenanceInterval until
// ctx is done. After a failed cycle the next one waits an exponentially
// growing, jittered interval (up to MaintenanceMaxBackoff); a success
// returns to the regular interval.
func (s *Service) runMaintenance(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = s.cfg.MaintenanceInterval
	bo.MaxInterval = s.cfg.MaintenanceMaxBackoff
	bo.MaxElapsedTime = 0
	bo.RandomizationFactor = 0.5
	bo.Multiplier = 2
	bo.Reset()
	timer := time.NewTimer(s.cfg.MaintenanceInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		next := s.cfg.MaintenanceInterval
		if _, err := s.Maintain(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			next = bo.NextBackOff()
			s.log.Warn("lease maintenance failed; backing off", "error", err, "retry_in", next.String())
		} else {
			bo.Reset()
		}
		timer.Reset(next)
	}
}

// Maintain runs one maintenance cycle now: it expires stale leases in up
// to ExpiryMaxBatches batches of ExpiryBatchSize (each batch releases the
// expired replicas' reservations), releases the reservations stranded on
// replicas offline for longer than registry.StrandedReservationGrace in as
// many batches, then refreshes the fleet gauges from the store's status. Each store call is bounded by StoreTimeout, so a cycle
// that waits on a lock another session holds fails (and counts towards
// /ready's maintenance check) instead of hanging. It returns how many
// replicas it expired.
func (s *Service) Maintain(ctx context.Context) (int, error) {
	ctx, span := s.tracer.Start(ctx, "controlplane.maintenance")
	defer span.End()
	n, released, err := s.maintain(ctx)
	span.SetAttributes(attribute.Int("aip.control.expired", n), attribute.Int("aip.control.stranded_released", released))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		s.m.maintenanceErrors.Inc()
	}
	s.maint.record(s.cfg.Now(), err)
	return n, err
}

func (s *Service) maintain(ctx context.Context) (expired, released int, err error) {
	total := 0
	for range s.cfg.ExpiryMaxBatches {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		n, err := s.store.ExpireStaleReplicas(sctx, s.cfg.ExpiryBatchSize)
		cancel()
		total += n
		s.m.leasesExpired.Add(float64(n))
		if err != nil {
			return total, 0, fmt.Errorf("expire stale leases: %w", err)
		}
		if n < s.cfg.ExpiryBatchSize {
			break
		}
	}
	if total > 0 {
		s.log.Info("expired stale leases", "replicas", total)
	}
	released, err = s.releaseStranded(ctx)
	if err != nil {
		return total, released, err
	}
	sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	st, err := s.store.Status(sctx)
	cancel()
	if err != nil {
		return total, released, fmt.Errorf("fleet status: %w", err)
	}
	s.observeFleet(&st)
	s.pruneEvents(ctx)
	return total, released, nil
}

// releaseStranded releases the reservations stranded on offline replicas
// (registry.FleetStatus.ReleaseStrandedReservations with
// registry.StrandedReservationGrace), in up to ExpiryMaxBatches batches of
// ExpiryBatchSize replicas, as expiry is bounded. A failure fails the cycle:
// it is the same lease maintenance, on the same store. It returns how many
// reservations it released.
func (s *Service) releaseStranded(ctx context.Context) (int, error) {
	var total registry.StrandedRelease
	for range s.cfg.ExpiryMaxBatches {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		rel, err := s.store.ReleaseStrandedReservations(sctx, registry.StrandedReservationGrace, s.cfg.ExpiryBatchSize)
		cancel()
		total.Replicas += rel.Replicas
		total.Reservations += rel.Reservations
		s.m.strandedReleased.Add(float64(rel.Reservations))
		if err != nil {
			return total.Reservations, fmt.Errorf("release stranded reservations: %w", err)
		}
		if rel.Replicas < s.cfg.ExpiryBatchSize {
			break
		}
	}
	if total.Reservations > 0 {
		s.log.Info("released reservations stranded on offline replicas", "replicas", total.Replicas,
			"reservations", total.Reservations, "grace", registry.StrandedReservationGrace.String())
	}
	return total.Reservations, nil
}

// pruneEvents deletes the events received longer than EventRetention ago,
// then forgets the IDs of pruned events received longer than
// PrunedEventIDsRetention ago, at most once a minute, each in batches,
// each batch bounded by StoreTimeout. A pruning bounds its batches so that
// it holds up the cycle's lease work little; when it stops at that bound
// with events or IDs left, the next cycle prunes again rather than
// waiting a minute, so a fleet that stores more events a minute than one
// pruning deletes does not keep ever more of them (or of their IDs) than
// its retentions say. A failure is logged and counted but does not fail
// the cycle: leases matter more than old events.
func (s *Service) pruneEvents(ctx context.Context) {
	if s.pruner == nil {
		return
	}
	now := s.cfg.Now()
	s.pruneMu.Lock()
	if !s.lastEventPrune.IsZero() && now.Sub(s.lastEventPrune) < eventPruneEvery && now.After(s.lastEventPrune) {
		s.pruneMu.Unlock()
		return
	}
	s.lastEventPrune = now
	s.pruneMu.Unlock()
	backlog := false
	if s.cfg.EventRetention != KeepEventsForever {
		before := now.Add(-s.cfg.EventRetention)
		total, more := s.pruneBatches(ctx, before, s.pruner.PruneEvents, s.m.eventsPruned, s.m.eventPruneErrors, "prune the event log")
		backlog = more
		if total > 0 {
			s.log.Info("pruned events older than the event retention", "events", total,
				"received_before", before.UTC().Format(time.RFC3339), "retention", s.cfg.EventRetention.String())
		}
	}
	if s.cfg.PrunedEventIDsRetention != KeepPrunedEventIDsForever {
		before := now.Add(-s.cfg.PrunedEventIDsRetention)
		total, more := s.pruneBatches(ctx, before, s.pruner.ForgetPrunedEvents, s.m.idsForgotten, s.m.idForgetErrors,
			"forget the IDs of pruned events")
		backlog = backlog || more
		if total > 0 {
			s.log.Info("forgot the IDs of pruned events older than the pruned-event-ID retention; delivered again, those events are stored again",
				"ids", total, "received_before", before.UTC().Format(time.RFC3339), "retention", s.cfg.PrunedEventIDsRetention.String())
		}
	}
	if backlog {
		s.pruneMu.Lock()
		s.lastEventPrune = time.Time{} // the next cycle goes on
		s.pruneMu.Unlock()
	}
}

// pruneBatches calls prune(before, eventPruneBatch) up to
// eventPruneMaxBatches times, each bounded by StoreTimeout, until a call
// deletes less than a batch, adding what each deletes to done. A failure
// is counted in failed and logged (as what), and ends the pruning. It
// returns how many were deleted, and whether the last batch was full (more
// may be left).
func (s *Service) pruneBatches(ctx context.Context, before time.Time, prune func(context.Context, time.Time, int) (int, error),
	done, failed prometheus.Counter, what string) (total int, more bool) {
	for range eventPruneMaxBatches {
		sctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
		n, err := prune(sctx, before, eventPruneBatch)
		cancel()
		total += n
		done.Add(float64(n))
		if err != nil {
			if ctx.Err() == nil {
				failed.Inc()
				s.log.Warn(what, "error", err, "received_before", before.UTC().Format(time.RFC3339))
			}
			return total, false // a failing store is asked again in a minute
		}
		if n < eventPruneBatch {
			return total, false
		}
	}
	return total, true
}

func (s *Service) observeFleet(st *registry.FleetStatusSummary) {
	m := s.m
	m.replicas.WithLabelValues("ready").Set(float64(st.ReadyReplicas))
	m.replicas.WithLabelValues("draining").Set(float64(st.DrainingReplicas))
	// Retired replicas (offline for longer than registry.RecentOfflineWindow)
	// are counted apart: a replaced replica's ID is never used again, so
	// their number only grows, and "offline" would grow with it.
	m.replicas.WithLabelValues("offline").Set(float64(st.OfflineReplicas - st.RetiredReplicas))
	m.replicas.WithLabelValues("retired").Set(float64(st.RetiredReplicas))
	m.replicas.WithLabelValues("expired").Set(float64(st.ExpiredLeases))
	m.readyCapacity.Set(float64(st.ReadyCapacity))
	m.activeAssignments.Set(float64(st.ActiveAssignments))
	m.maintenanceLast.Set(float64(s.cfg.Now().UnixMilli()) / 1000)
}
