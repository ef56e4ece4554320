package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Codes of the results recovery writes.
const (
	// CodeInterrupted: the action was journaled but never started before
	// the process stopped, so it was not run (not retryable: send a new
	// action ID); or it was a read-only capability's (ReadOnly), cut off
	// by a restart, a panic, a hang, a timeout or the shutdown before the
	// connector said what it did (retryable: the read changed nothing).
	// See Interrupted.
	CodeInterrupted = "connector_host.interrupted"
)

const recoveryBatch = 100

// Step 6: recover durable work before registering. Actions a previous
// process journaled but never started are failed (they never ran, and a
// retry under the same ID returns that result); a record a cancel journaled
// before its action arrived is cancelled, as the cancel would have left it.
// Actions left running go to the connector's Reconciler when it has one,
// else become outcome_unknown — except a read-only capability's (ReadOnly)
// that no reconciler settled, which fails connector_host.interrupted: a
// read changed nothing. Any recovery error blocks registration;
// when every error is ctx's cancellation (a shutdown requested while
// starting cut recovery short) the step's error wraps it, so that Run
// takes the stop for a clean one, while an error of recovery's own is a
// failed start even if the cancellation came too.
func (h *Host) stepRecover(ctx context.Context) error {
	sum := journal.RecoverySummary{RecoveredAt: h.cfg.Now()}
	rec, hasReconciler := h.conn.(Reconciler)
	// Every finished action leaves the received/running set, so paging from
	// the start always makes progress; failed ones are remembered and skipped.
	skip := map[string]bool{}
	// own counts the errors that are not the cancellation of ctx (see
	// the end).
	own := 0
	for {
		batch, err := h.journal.ActionsByStatus(ctx, recoveryBatch+len(skip), aip.StateReceived, aip.StateRunning)
		if err != nil {
			return fmt.Errorf("list unfinished actions: %w", err)
		}
		progressed := false
		for _, a := range batch {
			if skip[a.ActionID] {
				continue
			}
			progressed = true
			if err := h.recoverAction(ctx, a, rec, hasReconciler, &sum); err != nil {
				sum.Errors = append(sum.Errors, fmt.Sprintf("action %s: %v", a.ActionID, err))
				skip[a.ActionID] = true
				if !stoppedByCancel(ctx, err) {
					own++
				}
			}
		}
		if !progressed {
			break
		}
	}
	pending, err := h.journal.PendingEvents(ctx)
	if err != nil {
		sum.Errors = append(sum.Errors, fmt.Sprintf("count pending events: %v", err))
		if !stoppedByCancel(ctx, err) {
			own++
		}
	}
	sum.PendingEvents = pending
	h.recovery = sum
	h.log.Info("recovery", "reconciled", sum.Reconciled, "outcome_unknown", sum.OutcomeUnknown, "reads_interrupted", sum.ReadsInterrupted,
		"received_not_started", sum.Received, "pending_events", sum.PendingEvents, "errors", len(sum.Errors))
	if n := len(sum.Errors); n > 0 {
		if own == 0 {
			// Every error is the shutdown requested while starting
			// (SIGTERM) cutting recovery short: the start stopped
			// because of it, and what was not recovered is recovered at
			// the next start. The error wraps the cancellation so that
			// Run takes it for a clean stop.
			return fmt.Errorf("durable runtime recovery stopped by a shutdown request (%d step(s) cut short: %v): %w", n, sum.Errors, context.Cause(ctx))
		}
		return fmt.Errorf("durable runtime recovery produced %d error(s); replica admission is blocked until they are reconciled: %v", n, sum.Errors)
	}
	return nil
}

func (h *Host) recoverAction(ctx context.Context, a journal.Action, rec Reconciler, hasReconciler bool, sum *journal.RecoverySummary) error {
	now := h.cfg.Now()
	if a.Status == aip.StateReceived && a.InputDigest == "" {
		// A cancel that arrived before its action journals a record with
		// no input, then finishes it as cancelled; a stop between the two
		// left it received. Finish what the cancel began, so the action
		// arriving later is answered cancelled (see cancel).
		_, raw := cancelledBeforeArrival(a.ActionID)
		if _, err := h.journal.FinishAction(ctx, a.ActionID, aip.StateCancelled, raw, detailCancelledBeforeArrival, now); err != nil {
			return err
		}
		sum.Received++
		h.log.Warn("recovered a cancel that arrived before its action", "action_id", a.ActionID)
		return nil
	}
	if a.Status == aip.StateReceived {
		if err := h.failInterrupted(ctx, a.ActionID, false,
			"the replica stopped after journaling this action and before running it; it was not run", "not started before restart"); err != nil {
			return err
		}
		sum.Received++
		h.log.Warn("recovered an action that never started", "action_id", a.ActionID)
		return nil
	}
	if !hasReconciler && h.readOnly(a.CapabilityID) {
		return h.interruptedRead(ctx, a, "the connector has no reconciler", sum)
	}
	if !hasReconciler {
		if _, err := h.journal.FinishAction(ctx, a.ActionID, aip.StateOutcomeUnknown, nil,
			"the replica stopped while the action was running and the connector has no reconciler", now); err != nil {
			return err
		}
		sum.OutcomeUnknown++
		h.log.Warn("running action left by a previous process is outcome_unknown", "action_id", a.ActionID, "capability_id", a.CapabilityID)
		return nil
	}
	var res *aip.ActionResult
	err := h.guard("Reconcile", func() (err error) {
		res, err = rec.Reconcile(ctx, &UncertainAction{Action: a, Tenant: h.tenant.clone(), State: h.state,
			Logger: h.log.With("action_id", a.ActionID)})
		return err
	})
	if errors.Is(err, ErrOutcomeUnknown) && h.readOnly(a.CapabilityID) {
		return h.interruptedRead(ctx, a, "the reconciler could not tell its result: "+err.Error(), sum)
	}
	if errors.Is(err, ErrOutcomeUnknown) {
		if _, ferr := h.journal.FinishAction(ctx, a.ActionID, aip.StateOutcomeUnknown, nil, err.Error(), now); ferr != nil {
			return ferr
		}
		sum.OutcomeUnknown++
		h.log.Warn("reconciler could not tell the outcome", "action_id", a.ActionID, "error", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	if res == nil {
		return errors.New("reconcile returned no result")
	}
	if res.ActionID == "" {
		res.ActionID = a.ActionID
	}
	if res.ActionID != a.ActionID {
		return fmt.Errorf("reconcile returned a result for another action (%s)", res.ActionID)
	}
	if err := res.Validate(); err != nil {
		return fmt.Errorf("reconcile returned an invalid result: %v", err)
	}
	status := stateOf(res.Status)
	res.Receipt = nil
	raw, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("reconcile returned a result that cannot be encoded: %w", err)
	}
	// A result no signed answer can carry is what the host journals for
	// Handle's (see execute): the action's effect is settled, but no one
	// can be told what it was.
	if problem := carriable(raw); problem != nil {
		if _, err := h.journal.FinishAction(ctx, a.ActionID, aip.StateOutcomeUnknown, nil, "the reconciled result "+problem.Error(), now); err != nil {
			return err
		}
		sum.OutcomeUnknown++
		h.log.Warn("reconciler returned a result no answer can carry", "action_id", a.ActionID, "problem", problem)
		return nil
	}
	if _, err := h.journal.FinishAction(ctx, a.ActionID, status, raw, "reconciled after restart", now); err != nil {
		return err
	}
	sum.Reconciled++
	h.log.Info("reconciled an action left running", "action_id", a.ActionID, "status", status)
	return nil
}

// stateOf maps a result status to the journal state.
func stateOf(s aip.ResultStatus) aip.ActionState {
	switch s {
	case aip.ResultFailed:
		return aip.StateFailed
	case aip.ResultCancelled:
		return aip.StateCancelled
	default:
		// completed, and pending_approval / requires_human: the action
		// returned a result and is finished on this replica.
		return aip.StateCompleted
	}
}

// readOnly reports whether the bound manifest's capability capID only
// reads (ReadOnly); false for a capability the manifest no longer has.
func (h *Host) readOnly(capID string) bool {
	c := h.caps[capID]
	return c != nil && ReadOnly(c.cap)
}

// interruptedRead finishes a read-only capability's action a crash left
// running, which no reconciler settled, as failed connector_host.interrupted:
// a read changed nothing, so outcome_unknown would only tell the caller
// not to send it again. why says what the reconciler (or its absence)
// could not tell.
func (h *Host) interruptedRead(ctx context.Context, a journal.Action, why string, sum *journal.RecoverySummary) error {
	if err := h.failInterrupted(ctx, a.ActionID, true,
		"the replica stopped while this read ran; a read changes nothing: send it again under a new action ID", "read interrupted by a restart; "+why); err != nil {
		return err
	}
	sum.ReadsInterrupted++
	h.log.Warn("running read left by a previous process failed as interrupted", "action_id", a.ActionID, "capability_id", a.CapabilityID)
	return nil
}

// failInterrupted journals the action's result as failed
// connector_host.interrupted with message (retryable or not), detail
// being the journal's note: recovery's answer for an action it knows did
// nothing.
func (h *Host) failInterrupted(ctx context.Context, actionID string, retryable bool, message, detail string) error {
	res := &aip.ActionResult{ActionID: actionID, Status: aip.ResultFailed, Error: interruptedError(retryable, message)}
	raw, _ := json.Marshal(res)
	_, err := h.journal.FinishAction(ctx, actionID, aip.StateFailed, raw, detail, h.cfg.Now())
	return err
}

// interruptedError is the error of every connector_host.interrupted
// result: recovery's (failInterrupted) and a read cut off while this
// process ran it (Interrupted).
func interruptedError(retryable bool, message string) *aip.ProtocolError {
	return aip.NewProtocolError(CodeInterrupted, aip.CategoryConnector, retryable, 0, aip.TruncateUTF8(message, aip.MaxErrorMessageBytes))
}
