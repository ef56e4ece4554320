package hostsdk

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// shutdown drains the replica and takes it offline. The order is the
// lifecycle guide's:
//
//  1. set the local draining flag before contacting the lifecycle service,
//     and close the in-flight slots (an action that found the replica
//     ready just before is refused like one that arrives after);
//  2. replay a lease recovery whose answers were lost (the registry may
//     hold it as ready at a sequence this host has not seen), then send
//     the signed drain transition with the current lease sequence (a
//     failure is recorded and the local drain stays in force); without a
//     valid lease (expired, or offline after an unhealthy heartbeat) the
//     registry routes nothing here and refuses a drain, so it is skipped;
//     a drain whose outcome is unknown stays pending, and the renewals of
//     step 5 replay it; a drain refused because the replica holds no
//     lease at that sequence there (lease maintenance ended it, an
//     operator took the replica offline, another request won the fence:
//     leaseGone) ends the local lease at once, as a heartbeat refused so
//     does, and is the one failure recorded for it: nothing is left to
//     renew, the listener is not held for that lease (step 5), no offline
//     is sent (step 9), and nothing registers again;
//  3. heartbeat renewals stop (the worker skips its ticks while draining);
//  4. new actions are refused with a signed connector_host.not_ready, and
//     provider-event publication stops (the event source is cancelled and
//     the publisher refuses);
//  5. the listener stays up while the actions being handled finish (not
//     the connector calls the host abandoned, whose actions were journaled
//     and answered outcome_unknown, or a read's failed
//     connector_host.interrupted, already), and
//     for at least DrainLinger after the drain began (and after the
//     control plane accepted it), so an action routed just before the
//     registry recorded the drain is refused with the signed not_ready
//     rather than a closed socket; when the drain did not get through
//     (the control plane stopped, hung, or refused the connection or the
//     drain), the registry may go on routing actions here while the lease
//     it granted last is valid, so the listener stays up, refusing them
//     so, until that lease has expired (plus a second's margin and the
//     linger) or a renewal's replay of the drain is accepted, and at most
//     DrainTimeout after the drain step and after the drain began (or two
//     lifecycle timeouts, when longer: the unanswered window, which the
//     drain step's requests are part of; holdListener); from here until
//     the offline transition the draining lease is renewed each heartbeat
//     interval (renewDrain), until a renewal is refused because the lease
//     is gone, which ends the local lease as at step 2;
//  6. after that (or DrainTimeout) and the linger, the actions still being
//     handled are cancelled while the listener and their connections stay
//     open, and their requests awaited (DrainTimeout, and HandleGrace
//     more): each call returns, or is abandoned HandleGrace after the
//     cancellation and its action journaled outcome_unknown (a read's
//     failed connector_host.interrupted: Interrupted), and its
//     request journals the outcome and writes the signed answer on the
//     connection the action came on (each write bounded: see
//     answerWriteTimeout), so the dispatcher learns it rather than settle
//     the action from its own timeout; actions cancelled so make the
//     shutdown unclean;
//  7. the HTTP server shuts down gracefully: connections that never
//     carried a request are closed at once, busy ones are awaited
//     (bounded by DrainTimeout, then closed);
//  8. the heartbeat worker (and the event source) are stopped and awaited;
//     the event delivery loop (Config.EventEndpoint), which kept
//     delivering the outbox through the drain, makes one last pass over
//     the due batches (bounded by ControlTimeout) and stops;
//  9. the signed offline transition is sent; when the control plane
//     answered neither the drain nor a renewal's replay of it (stopped,
//     hung, unreachable), only within what is left of the unanswered
//     window (DrainTimeout after the drain began, or two lifecycle
//     timeouts when longer), and not at all once it has passed: the
//     replica's lease runs out by itself, and the whole shutdown's
//     lifecycle requests stay within that window, as
//     docs/operator-guide.md says; and not after a drain refused because
//     the lease is gone (steps 2 and 5): the replica holds no lease at
//     that sequence to take offline;
//  10. the result is nil only when actions, server, heartbeat, drain and
//     offline (and the event source and delivery loop) were all clean;
//     otherwise a *ShutdownError joins every failure.
//
// Abandoned calls still running are not awaited (the host cannot end
// them) but named in the *ShutdownError; the State refuses further calls
// (journal.ErrClosed) and a journal the host opened is closed (a request
// step 6 gave up on then fails to journal its action, which recovery
// settles at the next start).
func (h *Host) shutdown() error {
	var (
		errsMu sync.Mutex // fail is called from the renewals too (step 5)
		errs   []error
	)
	fail := func(step string, err error) {
		h.log.Error("shutdown step failed", "step", step, "error", err)
		errsMu.Lock()
		errs = append(errs, fmt.Errorf("%s: %w", step, err))
		errsMu.Unlock()
	}
	ctx, span := h.tracer.Start(context.Background(), "hostsdk.shutdown")
	defer span.End()

	// 1. The in-flight slots close with the flag: a request that found the
	// replica ready just before takes none from here on (it is refused
	// like any later one), so the wait of step 5 cannot end with nothing
	// in flight and an action start after it, which step 6 would cancel
	// as soon as the linger ends.
	drainStart := time.Now()
	h.draining.Store(true)
	h.inflight.close()
	h.log.Info("draining", "in_flight", h.inflight.handled(), "abandoned_calls", h.abandoned.Load())
	// 2. Taking controlMu waits for a heartbeat already on the wire, so the
	// drain carries the newest sequence.
	// The step's lifecycle requests, replays of earlier ones whose
	// outcome is unknown included, share lifecycleStepBudget.
	h.controlMu.Lock()
	dctx, dcancel := context.WithTimeout(ctx, lifecycleStepBudget*h.cfg.ControlTimeout)
	h.settlePendingRegister(dctx)
	drained, drainFailed, drainUnanswered := false, false, false
	var leaseEnded atomic.Bool // the control plane ended the lease, refusing a drain (step 2 or 5)
	if seq, exp := h.lease.get(); !exp.After(h.cfg.Now()) {
		h.log.Info("no valid lease to drain; going offline without a drain transition", "sequence", seq, "lease_expired_at", aip.At(exp).String())
	} else if err := h.transition(dctx, aip.OpDrain); isLeaseEnded(err) {
		// Nothing is routed here at that lease any more, so the listener
		// is not held for it (drainFailed stays false: the linger is
		// kept), and nothing is left to renew or take offline.
		leaseEnded.Store(true)
		fail("registry drain", drainLeaseEnded(err))
	} else if err != nil {
		fail("registry drain", err)
		drainFailed = true
		drainUnanswered = errors.Is(err, ErrControlUnavailable)
		// Its outcome unknown, the drain is replayed at each renewal: the
		// registry may hold the replica draining with a lease to renew,
		// or still ready (routing actions here) until the drain gets
		// through.
		drained = h.pendingDrain != nil
	} else {
		drained = true
	}
	dcancel()
	h.controlMu.Unlock()
	// 3. The worker sees the draining flag on its next tick.
	// 4.
	if h.evCancel != nil {
		h.evCancel()
	}
	// 5. Until the offline transition, the draining lease is renewed each
	// heartbeat interval (renewDrain).
	rctx, stopRenewing := context.WithCancel(ctx)
	renewed := make(chan struct{})
	renewalEnded := make(chan struct{}) // closed when a renewal's refusal ended the lease
	if drained {
		go func() {
			defer close(renewed)
			if err := h.renewDrain(rctx); err != nil {
				leaseEnded.Store(true)
				close(renewalEnded)
				fail("registry drain", drainLeaseEnded(err))
			}
		}()
	} else {
		close(renewed)
	}
	// Abandoned calls are not waited for: their actions were journaled
	// and answered, and nothing they return is kept.
	wctx, cancel := context.WithTimeout(ctx, h.cfg.DrainTimeout)
	if err := h.inflight.waitHandled(wctx); err != nil {
		h.log.Warn("drain timeout passed with actions in flight", "error", err)
	}
	// The linger, and the hold while the registry may still route actions
	// here (a drain that did not get through), end at wctx's deadline at
	// the latest, and at the end of the unanswered window (the drain
	// step's requests are part of the hold: the listener was up, refusing
	// actions, while they waited).
	window := drainStart.Add(max(h.cfg.DrainTimeout, lifecycleStepBudget*h.cfg.ControlTimeout))
	hctx, hcancel := context.WithDeadline(wctx, window)
	h.holdListener(hctx, drainStart, drainFailed, renewalEnded)
	hcancel()
	cancel()
	// 6. No action starts from here (the slots closed at step 1).
	// Cancelling those still running before the server shuts down lets
	// their requests answer on connections that are still open: the
	// server's shutdown would close them first.
	// Counted before the cancellation: a cancelled action can return,
	// answer and leave the count before it is read.
	n := h.inflight.handled()
	h.hardStop()
	if n > 0 {
		h.log.Warn("drain timeout passed; cancelling the actions still running, which answer on their connections", "in_flight", n, "handle_grace", h.cfg.HandleGrace)
		actx, cancel := context.WithTimeout(ctx, h.cfg.DrainTimeout+h.cfg.HandleGrace)
		err := h.inflight.waitHandled(actx)
		cancel()
		if err == nil {
			err = fmt.Errorf("%s still running at the drain timeout cancelled; journaled and answered with what the call returned then, or outcome_unknown (a read failed %s)", counted(n, "action"), CodeInterrupted)
		}
		fail("actions", err)
	}
	// 7. Shutdown closes the listener and idle connections; connections
	// that were opened but never sent a request would hold it for seconds,
	// and closing them loses nothing (the host read nothing from them).
	sctx, cancel := context.WithTimeout(ctx, h.cfg.DrainTimeout)
	shut := make(chan error, 1)
	go func() { shut <- h.server.Shutdown(sctx) }()
	h.conns.closeUnused()
	if err := <-shut; err != nil {
		h.server.Close()
		fail("HTTP server", fmt.Errorf("graceful shutdown: %w", err))
	}
	cancel()
	<-h.serveDone
	if h.serveErr != nil {
		fail("HTTP server", h.serveErr)
	}
	// 8.
	h.hbCancel()
	if err := waitFor(h.hbDone, h.cfg.DrainTimeout); err != nil {
		fail("heartbeat worker", err)
	}
	if h.evDone != nil {
		if err := waitFor(h.evDone, h.cfg.DrainTimeout); err != nil {
			fail("event source", err)
		} else if h.evErr != nil {
			fail("event source", h.evErr)
		}
	}
	if err := h.stopEventDelivery(h.cfg.ControlTimeout + h.cfg.DrainTimeout); err != nil {
		fail("event delivery", err)
	}
	// 9.
	stopRenewing()
	<-renewed
	h.controlMu.Lock()
	// A control plane that answered neither the drain nor a renewal's
	// replay of it (stopped, hung, unreachable) gets what is left of the
	// window for the offline transition, and none once it has passed: the
	// listener is closed, the registry routes nothing here once the lease
	// runs out, and lease maintenance then takes the replica offline.
	budget := lifecycleStepBudget * h.cfg.ControlTimeout
	unanswered := drainUnanswered && h.drainAcceptedAt.IsZero()
	if unanswered {
		budget = min(budget, time.Until(window))
	}
	seq, exp := h.lease.get()
	switch {
	case leaseEnded.Load():
		// The drain's refusal, failed above, said so: the replica holds
		// no lease at seq, and an offline from it is not sent.
	case unanswered && budget <= 0:
		fail("registry offline transition", fmt.Errorf("offline at sequence %d not sent: the control plane answered no lifecycle request of the shutdown within its %s (the drain timeout, or two lifecycle timeouts when longer)%s",
			seq, max(h.cfg.DrainTimeout, lifecycleStepBudget*h.cfg.ControlTimeout), h.leaseRunsOut(exp)))
	default:
		octx, ocancel := context.WithTimeout(ctx, budget)
		if err := h.transition(octx, aip.OpOffline); err != nil {
			if errors.Is(err, ErrControlUnavailable) {
				err = fmt.Errorf("%w%s", err, h.leaseRunsOut(exp))
			}
			fail("registry offline transition", err)
		}
		ocancel()
	}
	h.controlMu.Unlock()

	// 10. Abandoned calls are not awaited: the host cannot end them, and
	// what they return is dropped.
	if ids, calls := h.inflight.abandonedRunning(); calls > 0 {
		fail("actions", abandonedError(ids, calls, h.cfg.HandleGrace))
	}
	// An abandoned call may still run: its State calls fail from here on
	// (a journal the host opened is closed next; one the caller owns is
	// not written by this host again), and its publications since the
	// drain began (ErrNotServing).
	h.state.close()
	if h.ownsJournal {
		if err := h.journal.Close(); err != nil {
			fail("journal", err)
		}
	}
	if len(errs) > 0 {
		err := &ShutdownError{Errs: errs}
		span.RecordError(err)
		return err
	}
	h.log.Info("offline; shutdown was clean")
	return nil
}

// leaseRunsOut is what an offline transition the control plane did not
// answer leaves the operator to do: nothing but check, the lease (until
// exp, the last one this host learned of) running out by itself. Callers
// hold controlMu.
func (h *Host) leaseRunsOut(exp time.Time) string {
	until := aip.At(exp).String()
	if p := h.pendingDrain; p != nil && p.maybeApplied {
		until += fmt.Sprintf(", or a lease's length after the drain whose answer was lost (request %s) if the control plane applied it", p.req.RequestID)
	}
	return fmt.Sprintf("; the replica's lease (until %s) runs out by itself, and the control plane's lease maintenance then takes it offline and releases its reservations: "+
		"nothing is left to do on this host; once the control plane is back, `aipfleet fleet status` shows the replica offline", until)
}

// maxNamedAbandoned bounds the action IDs a *ShutdownError names.
const maxNamedAbandoned = 10

// abandonedError reports the abandoned connector calls still running at
// the end of a shutdown (nil: none), naming their actions.
func abandonedError(ids []string, calls int, grace time.Duration) error {
	if calls == 0 {
		return nil
	}
	named := strings.Join(ids[:min(len(ids), maxNamedAbandoned)], ", ")
	if len(ids) > maxNamedAbandoned {
		named += fmt.Sprintf(" and %d more", len(ids)-maxNamedAbandoned)
	}
	actions := "actions"
	if len(ids) == 1 {
		actions = "action"
	}
	return fmt.Errorf("%s still running (%s %s): each outlived its action's deadline, a cancel or the shutdown by more than %s (the handle grace: %s), "+
		"so its action was journaled and answered outcome_unknown (a read's failed "+CodeInterrupted+", retryable) and the host stopped without waiting for it; "+
		"nothing such a call does now counts: what it returns is discarded, what it still tries to record or publish through the host is refused (the host's journal is closed), and it ends when this process exits. "+
		"Callers: before acting again on an action answered outcome_unknown, check with the provider whether it took effect. "+
		"Operator: fix the connector so that a call returns once its context is cancelled (a provider call without a deadline, a lock held)",
		counted(calls, "abandoned connector call"), actions, named, grace, settingName("HandleGrace"))
}

// counted is n and noun, in the plural unless n is 1 ("2 actions").
func counted(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// lifecycleStepBudget is how many lifecycle timeouts (Config.ControlTimeout)
// each of the shutdown's two lifecycle steps may take, the drain and the
// offline, the replays that come first included (a heartbeat, register or
// drain whose answers were lost): the time of a request and its resend.
// With the outbox's last delivery that makes the 5 × the lifecycle timeout
// that docs/operator-guide.md counts in the process supervisor's
// termination grace; without the bound, a control plane that stopped
// answering made each replay add two more. A control plane that answers
// none of the shutdown's requests gets less: the offline step has what is
// left of DrainTimeout after the drain began (see shutdown, step 9).
const lifecycleStepBudget = 2

// renewDrain renews the draining lease every heartbeat interval until ctx
// ends (just before the offline transition, which does not wait for a
// renewal in flight: ctx cuts it short, and the drain it sent, its outcome
// unknown, is replayed by the offline step). The heartbeat worker stops at
// the drain, and a drain can outlast the lease it was granted (waiting for
// the actions, then for their connections, each up to DrainTimeout, which
// is the lease's 30 s by default): lease maintenance would then take the
// replica offline and release the reservations of the actions still
// running here, and the offline transition would lose its fence. A drain of a draining replica at the
// current sequence is a transition the lifecycle rules admit (status
// draining, sequence one up, a fresh lease), so each renewal is another
// signed drain. A failed renewal is logged; the next tick tries again (an
// ambiguous one is replayed first, like any lost drain, and stays pending
// until the control plane decides it: see replayDrain). It also runs when
// the shutdown's first drain failed with its outcome unknown, replaying it.
//
// A renewal the control plane refuses because the lease is gone there
// (lease maintenance ended it, an operator took the replica offline,
// another request won the fence: leaseGone) ended the local lease: there
// is nothing left to renew, and renewDrain returns that refusal (a
// *leaseEndedError), unlogged, for the shutdown to report; nil when ctx
// ended.
func (h *Host) renewDrain(ctx context.Context) error {
	t := time.NewTicker(h.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		h.controlMu.Lock()
		if ctx.Err() != nil {
			h.controlMu.Unlock()
			return nil
		}
		if _, exp := h.lease.get(); exp.After(h.cfg.Now()) {
			// ctx ends the renewal in flight at the offline step, which
			// does not wait for it: a drain it cut short has an unknown
			// outcome, and the offline step replays it first, as it does
			// any such drain.
			if err := h.transition(ctx, aip.OpDrain); isLeaseEnded(err) {
				h.controlMu.Unlock()
				return err
			} else if err != nil {
				h.log.Warn("renew the draining lease", "in_flight", h.inflight.count(), "error", err)
			}
		}
		h.controlMu.Unlock()
	}
}

// isLeaseEnded reports whether err is a refusal that ended the local
// lease (a *leaseEndedError).
func isLeaseEnded(err error) bool {
	var ended *leaseEndedError
	return errors.As(err, &ended)
}

// drainLeaseEnded is the shutdown's failure for a drain the control plane
// refused because the lease is gone there (a *leaseEndedError), which
// ended the local lease: what happened and what the host does next.
func drainLeaseEnded(err error) error {
	var ended *leaseEndedError
	errors.As(err, &ended)
	return fmt.Errorf("the control plane ended the lease, refusing the drain: %w; the host holds no lease from here: "+
		"the actions in flight finish, no offline transition is sent (the replica holds no lease at sequence %d to take offline) "+
		"and the host does not register again",
		err, ended.sequence)
}

// settlePendingRegister replays a registration whose answers were lost
// (same request ID and payload) before a drain or offline transition and
// applies the lease it answers. The registry may have committed it: the
// replica is then ready there, at a sequence one above the one this host
// holds, and a transition from the old sequence would lose the fence and
// leave the replica routable until its lease ran out. A definitive answer
// clears the pending registration; after another ambiguous failure it
// stays pending, for the offline transition to try again. A registration
// none of whose attempts can have been applied (each answered with the
// control plane's signed 503, or never sent: a lease recovery during an
// outage) is dropped unsent: there is nothing to learn, and sending it
// would register the replica afresh — ready and routable, on the way to
// its drain — for a host that is stopping without a lease. Callers hold
// controlMu.
func (h *Host) settlePendingRegister(ctx context.Context) {
	sr := h.pendingRegister
	if sr == nil {
		return
	}
	if !sr.maybeApplied {
		h.pendingRegister = nil
		h.log.Info("dropping the registration no attempt of which was applied; not sending it again", "request_id", sr.req.RequestID)
		return
	}
	sr, err := h.control.refresh(sr)
	if err != nil {
		h.log.Warn("replay the registration whose outcome is unknown", "error", err)
		return
	}
	out, err := h.control.do(ctx, sr)
	if err != nil {
		var rej *ControlRejectedError
		if errors.As(err, &rej) || !sr.maybeApplied {
			// Decided, or never applied by any attempt.
			h.pendingRegister = nil
		}
		h.log.Warn("replay the registration whose outcome is unknown", "request_id", sr.req.RequestID, "error", err)
		return
	}
	h.pendingRegister = nil
	if out.Lease != nil {
		h.lease.apply(out.Lease)
		h.log.Info("registration whose answers were lost was committed", "request_id", sr.req.RequestID,
			"sequence", out.Lease.Sequence, "expires_at", out.Lease.ExpiresAt.String())
	}
}

// transition sends drain or offline with the current lease sequence. A
// drain (or the replay of one whose outcome is unknown) that the control
// plane refuses because the replica holds no lease at that sequence
// (leaseGone) ends the local lease at once and fails with a
// *leaseEndedError, as a heartbeat refused so does. Callers hold
// controlMu.
func (h *Host) transition(ctx context.Context, op aip.Operation) error {
	h.settlePendingRegister(ctx)
	seq, _ := h.lease.get()
	if p := h.pendingHeartbeat; p != nil && p.req.Command.Heartbeat.PreviousSequence == seq {
		// A beat whose answers were lost may have moved the sequence on:
		// learn its outcome first, or the transition loses the fence.
		if err := h.heartbeat(ctx, p); err != nil {
			h.log.Warn("replay the heartbeat whose outcome is unknown before "+string(op), "error", err)
		}
		seq, _ = h.lease.get()
	}
	if p := h.pendingDrain; p != nil && p.req.Command.Transition.PreviousSequence == seq {
		// Likewise a drain whose outcome is unknown (before the offline
		// transition, or before a renewal of the draining lease). Until
		// the control plane decides it, it stays pending: this drain or
		// offline is sent from a sequence it may have moved on.
		if err := h.replayDrain(ctx, p); err != nil {
			var ended *leaseEndedError
			switch {
			case op == aip.OpDrain && errors.As(err, &ended):
				// The control plane ended the lease at seq: a fresh drain
				// from it would be refused alike.
				return err
			case op == aip.OpDrain:
				// The replay is this attempt's drain from seq; a fresh
				// one would be a second drain whose outcome is unknown.
				return fmt.Errorf("%s at sequence %d: replay of the drain whose outcome is unknown (kept for the next attempt): %w", op, seq, err)
			case errors.As(err, &ended):
				h.log.Warn("replay the drain whose outcome is unknown: not applied", "request_id", p.req.RequestID, "error", err)
			}
		}
		seq, _ = h.lease.get()
	}
	sr, err := h.control.seal(aip.TransitionCommand(op, aip.Transition{ReplicaID: h.cfg.ReplicaID, PreviousSequence: seq}))
	if err != nil {
		return err
	}
	out, err := h.control.do(ctx, sr)
	if err != nil {
		var rej *ControlRejectedError
		if op == aip.OpDrain && !errors.As(err, &rej) {
			h.pendingDrain = sr // it may have been applied: the next attempt replays it first
		}
		if p := h.pendingDrain; p != nil && p.maybeApplied && op == aip.OpOffline {
			return fmt.Errorf("%s at sequence %d: %w; a drain whose outcome is unknown (request %s) may have moved the sequence on: the registry may keep the replica draining until its lease expires",
				op, seq, err, p.req.RequestID)
		}
		err = fmt.Errorf("%s at sequence %d: %w", op, seq, err)
		if op == aip.OpDrain {
			// A drain refused because the lease is gone at seq ends the
			// local lease, as a heartbeat refused so does.
			return h.endLeaseIfGone(err, seq)
		}
		return err
	}
	// The transition took the fence at seq: a drain still pending from it
	// can never apply.
	h.pendingDrain = nil
	switch {
	case op == aip.OpOffline:
		h.lease.expire(h.cfg.Now(), seq+1)
		h.log.Info("offline transition accepted", "previous_sequence", seq)
	case out.Lease != nil:
		h.lease.apply(out.Lease)
		h.noteDrainAccepted()
		h.log.Info("drain transition accepted", "sequence", out.Lease.Sequence)
	default:
		return fmt.Errorf("%s answered %s without a lease", op, out.Status)
	}
	return nil
}

// replayDrain sends the pending drain p again (same request ID and
// payload) and applies the lease it answers. An answer, a definitive
// rejection, or a failure of every attempt so far with the control
// plane's signed word that it applied nothing (p never moved the
// sequence) settles it; after another ambiguous failure it stays pending,
// for the next attempt: the next renewal of the draining lease, or the
// offline transition. A rejection saying that the lease is gone at p's
// sequence (leaseGone) ends the local lease and is returned as a
// *leaseEndedError (not logged here); any other settles p with nil.
// Callers hold controlMu.
func (h *Host) replayDrain(ctx context.Context, p *sealedRequest) error {
	rp, err := h.control.refresh(p)
	if err != nil {
		h.log.Warn("replay the drain whose outcome is unknown", "request_id", p.req.RequestID, "error", err)
		return err
	}
	h.pendingDrain = rp
	out, err := h.control.do(ctx, rp)
	if err != nil {
		var rej *ControlRejectedError
		if errors.As(err, &rej) || !rp.maybeApplied {
			h.pendingDrain = nil
			seq := rp.req.Command.Transition.PreviousSequence
			var ended *leaseEndedError
			if errors.As(h.endLeaseIfGone(fmt.Errorf("drain at sequence %d (request %s, replayed): %w", seq, rp.req.RequestID, err), seq), &ended) {
				return ended
			}
			h.log.Warn("replay the drain whose outcome is unknown: not applied", "request_id", rp.req.RequestID, "error", err)
			return nil
		}
		h.log.Warn("replay the drain whose outcome is unknown; it stays pending for the next attempt", "request_id", rp.req.RequestID, "error", err)
		return err
	}
	h.pendingDrain = nil
	if out.Lease != nil {
		h.lease.apply(out.Lease)
		h.noteDrainAccepted()
		h.log.Info("drain transition accepted on replay", "sequence", out.Lease.Sequence)
	}
	return nil
}

// noteDrainAccepted records that the control plane accepted a drain (it
// answered the draining lease): the registry holds the replica draining
// and routes no new action here. Callers hold controlMu.
func (h *Host) noteDrainAccepted() {
	if h.drainAcceptedAt.IsZero() {
		h.drainAcceptedAt = time.Now()
		close(h.drainAccepted)
	}
}

// leaseHoldMargin is added to the lease's expiry while holdListener waits
// for it: the expiry this host holds (localLease) can precede the
// registry's by the round trip of the request that granted it, and the
// registry compares it with its own clock.
const leaseHoldMargin = time.Second

// holdListener returns when step 5 may end and the listener close (the
// actions still in flight then are cancelled at step 6): no sooner than
// the linger (DrainLinger after drainStart, capped at DrainTimeout from
// there) and, once a drain was accepted, DrainLinger after it was (an
// action the dispatcher routed just before is on its way).
//
// While the shutdown's drain has not got through (drainFailed: the control
// plane stopped, hung, refused the connection or the drain), the registry
// may hold the replica ready until the lease it granted last expires, and
// route actions here until then. The listener stays up meanwhile,
// answering them with the signed not_ready that lets the dispatcher
// reroute them (a refused connection proves nothing: the dispatcher
// answers outcome_unknown and the action stays pinned here): until that
// expiry (this host's clock),
// leaseHoldMargin and DrainLinger have passed — or until a renewal's
// replay of the drain is accepted (renewDrain), when the linger after it
// applies instead, or refused because the lease is gone there (leaseEnded
// is closed): the registry routes nothing here at that lease, and the
// linger alone applies.
//
// Every wait ends by ctx's deadline: DrainTimeout after the drain step
// (step 5's, which bounds the wait for the actions in flight already, so
// the hold does not lengthen the longest shutdown: the termination grace
// docs/operator-guide.md gives), and at most DrainTimeout after the drain
// began (or two lifecycle timeouts when longer), so that a host whose
// control plane does not answer exits within it.
func (h *Host) holdListener(ctx context.Context, drainStart time.Time, drainFailed bool, leaseEnded <-chan struct{}) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = drainStart.Add(h.cfg.DrainTimeout)
	}
	lingerEnd := drainStart.Add(min(h.cfg.DrainLinger, h.cfg.DrainTimeout))
	logged := false
	for {
		end := lingerEnd
		var accepted, ended <-chan struct{} // what the wait below wakes for
		select {
		case <-h.drainAccepted:
			if after := earliest(h.drainAcceptedAt.Add(h.cfg.DrainLinger), deadline); after.After(end) {
				end = after
			}
		default:
			accepted = h.drainAccepted
			select {
			case <-leaseEnded:
				// The control plane refused a drain because the lease is
				// gone there: it routes nothing here at that lease, and
				// the listener is not held for it.
			default:
				ended = leaseEnded
				if !drainFailed {
					break
				}
				seq, exp := h.lease.get()
				hold := time.Now().Add(exp.Sub(h.cfg.Now()) + leaseHoldMargin + h.cfg.DrainLinger)
				if until := earliest(hold, deadline); until.After(end) {
					end = until
					if !logged {
						logged = true
						h.log.Warn("the drain transition did not get through: the registry may route actions here until the replica's lease expires; "+
							"the listener stays up until then, refusing them with the signed not_ready so the dispatcher reroutes them",
							"sequence", seq, "lease_expires_at", aip.At(exp).String(),
							"listener_until", aip.At(h.cfg.Now().Add(time.Until(end))).String(), "capped_by_drain_timeout", hold.After(deadline))
					}
				}
			}
		}
		wait := time.Until(end)
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-accepted:
		case <-ended:
		case <-ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func waitFor(done <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		return errors.New("did not stop within the drain timeout")
	}
}

// connTracker keeps the server's connections that have not carried a
// request yet, so shutdown can close them (http.Server.Shutdown closes idle
// connections and waits for active ones, but waits for new ones too).
type connTracker struct {
	mu    sync.Mutex
	fresh map[net.Conn]struct{}
}

// observe is the server's ConnState hook: a connection is fresh from
// StateNew until its first request (or its end).
func (t *connTracker) observe(c net.Conn, st http.ConnState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st != http.StateNew {
		delete(t.fresh, c)
		return
	}
	if t.fresh == nil {
		t.fresh = make(map[net.Conn]struct{})
	}
	t.fresh[c] = struct{}{}
}

// closeUnused closes connections still waiting for their first request.
func (t *connTracker) closeUnused() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for c := range t.fresh {
		c.Close()
	}
	clear(t.fresh)
}
