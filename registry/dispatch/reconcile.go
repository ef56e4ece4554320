package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Reconciliation defaults.
const (
	DefaultReconcileInterval = time.Minute
	DefaultReconcileAfter    = 10 * time.Minute
	DefaultReconcileBatch    = 100
)

// Orphans is what Reconcile needs of the registry: the live reservations
// (registry.FleetStatus.Ledger) and the orphan settlement
// (registry.OrphanSettler). Both backends provide both.
type Orphans interface {
	Ledger(ctx context.Context) (registry.Ledger, error)
	registry.OrphanSettler
}

// ReconcileReport is what one reconciliation pass did.
type ReconcileReport struct {
	// Stale counts the reservations older than Config.ReconcileAfter that
	// the pass looked at (at most Config.ReconcileBatch).
	Stale int `json:"stale"`
	// Settled counts those it settled from their replica's journal.
	Settled int `json:"settled"`
	// InProgress counts those whose replica still runs the action, that
	// were handed out again while the pass looked at them, or whose
	// replica never received the action while an envelope sent at the
	// last handout could still arrive.
	InProgress int `json:"in_progress"`
	// Unanswered counts those whose replica did not answer verifiably, or
	// whose assignment or settlement the registry did not confirm.
	Unanswered int `json:"unanswered"`
}

// Reconcile settles orphaned reservations: routes still reserved longer
// than Config.ReconcileAfter after they were last handed out
// (registry.RouteReservation.HandedOutAt), which no dispatcher will settle
// any more (the one that sent the action stopped or crashed before its
// settlement, or its settlement retries gave up). For each, oldest first
// and at most Config.ReconcileBatch, it asks the pinned replica for its
// journaled state with a signed status query and settles by it: a
// completed or failed action completed (one failed
// connector_host.interrupted outcome_unknown, as its answer settles:
// resultSettlement), an uncertain one outcome_unknown,
// a cancelled one cancelled, one the replica's journal pruned pruned
// (outcome unknown, circuit kept), and one the replica never received cancelled
// once no envelope sent at the last handout can still be accepted
// (aip.MaxEnvelopeAge + aip.MaxEnvelopeSkew later; a later retry of the
// action ID reserves the route again). The settlement is
// registry.OrphanSettler.SettleOrphan with the hand-out the pass read
// (registry.RouteReservation.HandOut): if a Resolve handed the route out
// again while the pass looked (a client retrying the action ID, sharing
// the reservation or reserving it again), it changes nothing, so what the
// replica said is never applied to a reservation someone else is using.
// The comparison is of hand-out numbers, so it does not depend on clocks. An action still received or running,
// and a replica that does not answer verifiably, are left for a later pass
// (lease maintenance releases the reservations of a replica whose lease
// ends). Settlement is idempotent and checks the fence, so dispatchers may
// reconcile at the same time.
//
// Run calls it every Config.ReconcileInterval when Deps.Reservations is
// set.
func (d *Dispatcher) Reconcile(ctx context.Context) (ReconcileReport, error) {
	var rep ReconcileReport
	if d.deps.Reservations == nil {
		return rep, nil
	}
	lctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	l, err := d.deps.Reservations.Ledger(lctx)
	cancel()
	if err != nil {
		return rep, fmt.Errorf("dispatch: reconcile: read the reservations: %w", err)
	}
	cutoff := d.cfg.Now().Add(-d.cfg.ReconcileAfter)
	var stale []registry.RouteReservation
	for _, r := range l.Reservations {
		if r.Reserved && r.HandedOutAt.Before(cutoff) {
			stale = append(stale, r)
		}
	}
	slices.SortFunc(stale, func(a, b registry.RouteReservation) int { return a.HandedOutAt.Compare(b.HandedOutAt) })
	if len(stale) > d.cfg.ReconcileBatch {
		stale = stale[:d.cfg.ReconcileBatch]
	}
	rep.Stale = len(stale)
	for _, r := range stale {
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		switch d.reconcileOne(ctx, &r) {
		case reconcileSettled:
			rep.Settled++
		case reconcileInProgress:
			rep.InProgress++
		default:
			rep.Unanswered++
		}
	}
	return rep, nil
}

type reconcileResult int

const (
	reconcileSettled reconcileResult = iota
	reconcileInProgress
	reconcileUnanswered
)

// reconcileOne settles one orphaned reservation by its replica's journal.
func (d *Dispatcher) reconcileOne(ctx context.Context, r *registry.RouteReservation) reconcileResult {
	log := d.log.With("action_id", r.ActionID)
	rctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	a, err := d.deps.Resolver.Assignment(rctx, r.ActionID)
	cancel()
	if err != nil {
		log.Warn("reconcile: read the assignment", "error", err)
		d.m.reconciled.WithLabelValues("unanswered").Inc()
		return reconcileUnanswered
	}
	log = log.With("replica_id", a.ReplicaID)
	st, pe := d.queryStatus(ctx, &a)
	if pe != nil {
		log.Info("reconcile: the replica did not answer the status query", "code", pe.Code, "message", pe.Message)
		d.m.reconciled.WithLabelValues("unanswered").Inc()
		return reconcileUnanswered
	}
	s, ok := settlementOfStatus(st)
	if ok && st.State == aip.StateNotFound && d.cfg.Now().Sub(r.HandedOutAt) < aip.MaxEnvelopeAge+aip.MaxEnvelopeSkew {
		// An envelope sent at the last handout may still arrive and run.
		ok = false
	}
	if !ok {
		d.m.reconciled.WithLabelValues("in_progress").Inc()
		return reconcileInProgress
	}
	sctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	err = d.deps.Reservations.SettleOrphan(sctx, a, s, r.HandOut)
	cancel()
	switch {
	case errors.Is(err, registry.ErrConflict):
		log.Info("reconcile: the reservation was handed out again; it is in use", "error", err)
		d.m.reconciled.WithLabelValues("in_progress").Inc()
		return reconcileInProgress
	case err != nil:
		d.m.settleFailures.Inc()
		log.Warn("reconcile: settle", "settlement", s, "error", err)
		d.m.reconciled.WithLabelValues("unanswered").Inc()
		return reconcileUnanswered
	}
	log.Info("reconciled an orphaned reservation", "state", st.State, "settlement", s)
	d.m.reconciled.WithLabelValues("settled").Inc()
	return reconcileSettled
}

// settlementOfStatus is the settlement a journaled status stands for;
// false while the action is still under way. A failed action settles as
// its result would (resultSettlement: outcome_unknown for
// connector_host.interrupted, completed otherwise). pruned (the replica's journal no
// longer holds an action that old: it may have completed there, and never
// runs there now) settles pruned, not cancelled, which would tell a caller
// reading the action's status something nobody knows: the reservation is
// released, the outcome reported unknown, and the circuit left as it is
// (outcome_unknown would count a failure against a replica that only
// pruned old records).
func settlementOfStatus(st *aip.ActionStatus) (registry.RouteSettlement, bool) {
	switch st.State {
	case aip.StateFailed:
		if st.Result != nil {
			return resultSettlement(st.Result), true
		}
		return registry.SettlementCompleted, true
	case aip.StateCompleted:
		return registry.SettlementCompleted, true
	case aip.StateOutcomeUnknown:
		return registry.SettlementOutcomeUnknown, true
	case aip.StateCancelled, aip.StateNotFound:
		return registry.SettlementCancelled, true
	case aip.StatePruned:
		return registry.SettlementPruned, true
	}
	return "", false
}

// reconcileLoop runs Reconcile every ReconcileInterval until ctx ends.
func (d *Dispatcher) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rep, err := d.Reconcile(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			d.log.Warn("reconcile", "error", err)
		case rep.Stale > 0:
			d.log.Info("reconciled", "stale", rep.Stale, "settled", rep.Settled, "in_progress", rep.InProgress, "unanswered", rep.Unanswered)
		}
	}
}
