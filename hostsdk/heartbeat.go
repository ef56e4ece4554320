package hostsdk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// replayPruneBatch bounds the expired message IDs deleted per journal
// call; a heartbeat tick deletes batches until none is left (see
// pruneMessages).
const replayPruneBatch = 256

// firstBeatDelay returns floor(3I/4) + r milliseconds with r uniform in
// [0, floor(I/2)] drawn by randN(n) (uniform in [0, n)), so the first beat
// falls uniformly in [0.75·I, 1.25·I].
func firstBeatDelay(interval time.Duration, randN func(n uint64) uint64) time.Duration {
	ms := uint64(interval.Milliseconds())
	return time.Duration(ms*3/4+randN(ms/2+1)) * time.Millisecond
}

// nextBeat returns the first slot of the grid prev + k·interval (k ≥ 1)
// after now: ticks missed while a beat ran long are skipped, never replayed
// in a burst.
func nextBeat(prev, now time.Time, interval time.Duration) time.Time {
	next := prev.Add(interval)
	if next.After(now) {
		return next
	}
	return next.Add((now.Sub(next)/interval + 1) * interval)
}

// The retries of a beat that failed for a reason that may pass
// (ErrControlUnavailable: no connection, no answer or one that does not
// verify, a timeout, the control plane's signed 503) while the local lease
// is valid, between the heartbeat ticks (nextBeatRetry): the n-th retry in
// a row comes after a delay drawn uniformly in [d/2, d], where d is
// beatRetryFirst doubled n-1 times and capped at half the heartbeat
// interval, so a fleet whose beats all failed in the same outage does not
// retry in step against a control plane that is coming back (their ticks
// are spread over the interval already: see firstBeatDelay). The last
// retry is made beatRetryLastMargin before the local lease runs out (a
// quarter of the interval when that is less), so that a control plane
// back by then renews the lease before the registry's copy of it ends
// (which ends no sooner: see localLease).
const (
	beatRetryFirst      = time.Second
	beatRetryLastMargin = time.Second
)

// beatRetryCeiling is d, the longest delay before the n-th retry in a row
// (n ≥ 1) of a failed beat: beatRetryFirst doubled n-1 times, at most
// limit.
func beatRetryCeiling(n int, limit time.Duration) time.Duration {
	if n > 30 { // the doubling would overflow; it is far above any limit
		return limit
	}
	return min(beatRetryFirst<<(n-1), limit)
}

// beatRetryDelay returns the delay before the n-th retry in a row of a
// failed beat: uniform in [d/2, d] (d = beatRetryCeiling(n, limit)),
// drawn by randN(k) (uniform in [0, k)).
func beatRetryDelay(n int, limit time.Duration, randN func(n uint64) uint64) time.Duration {
	d := beatRetryCeiling(n, limit)
	return d - d/2 + time.Duration(randN(uint64(d/2)+1))
}

// nextBeatRetry returns how long after now to make the n-th retry in a row
// of a beat that failed for a reason that may pass, with the next tick
// due in untilTick and the local lease running out in untilExpiry; false
// when none is made because the tick comes first (it renews then), or the
// lease runs out before a retry could reach the control plane (the tick
// after that recovers the lease). A delay past the last useful moment
// (the margin before the expiry) is cut to that moment, the last chance,
// unless that comes sooner than the first retry's least delay.
func nextBeatRetry(n int, untilTick, untilExpiry, interval time.Duration, randN func(n uint64) uint64) (time.Duration, bool) {
	limit := interval / 2
	delay := beatRetryDelay(n, limit, randN)
	if last := untilExpiry - min(beatRetryLastMargin, interval/4); delay > last {
		first := beatRetryCeiling(1, limit)
		if last < first-first/2 {
			return 0, false
		}
		delay = last
	}
	if delay >= untilTick {
		return 0, false
	}
	return delay, true
}

// beatMayPass reports whether a failed renewal is worth retrying before
// the next tick: the control plane did not decide it, or its answer was
// lost (ErrControlUnavailable; a beat whose outcome is unknown is then
// replayed, not sent afresh). A signed refusal (a lost fence, a lease the
// registry ended) or a local failure is not: a retry would be refused or
// fail alike.
func beatMayPass(err error) bool {
	return errors.Is(err, ErrControlUnavailable)
}

// runHeartbeats renews the lease until ctx is cancelled: the first beat
// after a jittered delay, then every HeartbeatInterval on a fixed grid.
// A beat that failed for a reason that may pass while the local lease is
// valid is retried before the next tick with backoff (nextBeatRetry):
// from this goroutine, so one lifecycle request at most is in flight, and
// not while draining (the tick and retries then do nothing). A success
// ends the retries; so do a failure that will not pass, and the local
// lease running out, after which the ticks recover the lease as before.
// A refusal by which the control plane ended the lease (leaseEndedError)
// ended the local lease too: it is logged once, and the next tick
// re-registers.
func (h *Host) runHeartbeats(ctx context.Context) {
	interval := h.cfg.HeartbeatInterval
	next := time.Now().Add(firstBeatDelay(interval, rand.Uint64N))
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	failed := 0       // beats failed in a row for a reason that may pass
	retrying := false // the timer is set for a retry, before next
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		var err error
		if retrying && time.Now().Before(next) {
			err = h.retryBeat(ctx)
			if !time.Now().Before(next) {
				// The retry ran past the tick (a control plane that does
				// not answer): it was that tick's renewal.
				next = nextBeat(next, time.Now(), interval)
			}
		} else {
			err = h.heartbeatTick(ctx)
			next = nextBeat(next, time.Now(), interval)
		}
		if ctx.Err() != nil {
			return
		}
		retrying = false
		wake := next
		if err != nil && beatMayPass(err) {
			failed++
			_, exp := h.lease.get()
			if d, ok := nextBeatRetry(failed, time.Until(next), exp.Sub(h.cfg.Now()), interval, rand.Uint64N); ok {
				retrying, wake = true, time.Now().Add(d)
			}
		} else {
			failed = 0
		}
		if err != nil {
			h.m.heartbeatFailures.Inc()
			var ended *leaseEndedError
			switch {
			case errors.As(err, &ended) && h.draining.Load():
				h.log.Warn("the control plane ended the lease: new actions are refused; the host is draining and does not register again",
					"sequence", ended.sequence, "error", err)
			case errors.As(err, &ended):
				h.log.Warn("the control plane ended the lease: new actions are refused until the host registers again at its next heartbeat",
					"sequence", ended.sequence, "register_in", time.Until(wake).Round(time.Millisecond).String(), "error", err)
			case retrying:
				h.log.Warn("heartbeat failed", "error", err, "retry_in", time.Until(wake).Round(time.Millisecond).String(), "failed_in_a_row", failed)
			default:
				h.log.Warn("heartbeat failed", "error", err)
			}
		}
		timer.Reset(time.Until(wake))
	}
}

// heartbeatTick probes health and renews or recovers the lease, then prunes
// the replay registry and the finished actions past their retention. It
// returns the renewal's failure (nil when draining: nothing is sent);
// runHeartbeats counts it in aip_connector_host_heartbeat_failures_total
// and may retry it. The lease is kept until its recorded expiry, unless
// the control plane refused the beat because the lease is gone there
// (leaseEndedError): then it ends at once, and the next tick re-registers.
func (h *Host) heartbeatTick(ctx context.Context) error {
	if h.draining.Load() {
		return nil
	}
	storageErr, connErr := h.probe(ctx)
	ready := storageErr == nil && connErr == nil
	if !ready {
		h.log.Warn("replica is not healthy", "storage_error", errString(storageErr), "connector_error", errString(connErr))
	}
	err := h.renewOrRecover(ctx, ready, false)
	h.pruneMessages(ctx)
	h.pruneActions(ctx)
	return err
}

// retryBeat retries, before the next tick, the renewal of a beat that
// failed for a reason that may pass: through the tick's own renewal
// (renewOrRecover), so a beat whose outcome is unknown is replayed with
// its request ID and payload, as the tick would, and with the readiness
// the host recorded last (no new probe: a storage write that failed since
// is reported at once). It only renews: once the local lease has run out
// it sends nothing, and the next tick recovers the lease.
func (h *Host) retryBeat(ctx context.Context) error {
	if h.draining.Load() {
		return nil
	}
	return h.renewOrRecover(ctx, h.storageOK() && h.connectorReady.Load(), true)
}

// actionPruneBatch bounds the finished actions deleted per journal call,
// and actionPruneEvery how often, at most, a heartbeat tick prunes them.
const (
	actionPruneBatch = 500
	actionPruneEvery = time.Minute
)

// pruneActions deletes the finished actions older than the action
// retention (with their receipts), in batches, until none is left or a
// quarter of a heartbeat interval has passed. It runs at most once a
// minute, so an idle journal is not asked every beat — unless the last
// run stopped with old actions left: then the next tick goes on, so
// pruning keeps up however many actions a minute brings.
func (h *Host) pruneActions(ctx context.Context) {
	if h.cfg.ActionRetention == KeepActionsForever {
		return
	}
	now := time.Now()
	if !h.lastActionPrune.IsZero() && now.Sub(h.lastActionPrune) < actionPruneEvery {
		return
	}
	h.lastActionPrune = now
	before := h.cfg.Now().Add(-h.cfg.ActionRetention)
	total, more := pruneInBatches(ctx, h.log, "prune finished actions from the journal", actionPruneBatch, now.Add(h.cfg.HeartbeatInterval/4),
		func(ctx context.Context) (int, error) {
			n, err := h.journal.PruneActions(ctx, before, actionPruneBatch, h.actionStateNS)
			h.m.actionsPruned.Add(float64(n))
			return n, err
		})
	if more {
		h.lastActionPrune = time.Time{} // the next tick goes on
	}
	if total > 0 {
		h.log.Info("pruned finished actions older than the action retention", "count", total,
			"completed_before", before.UTC().Format(time.RFC3339), "retention", h.cfg.ActionRetention.String())
	}
}

// pruneMessages deletes the message IDs expired in the replay registry, in
// batches, until none is left or half a heartbeat interval has passed (the
// rest waits for the next tick), so the registry stays bounded however many
// messages an interval brings.
func (h *Host) pruneMessages(ctx context.Context) {
	total, _ := pruneInBatches(ctx, h.log, "prune the replay registry", replayPruneBatch, time.Now().Add(h.cfg.HeartbeatInterval/2),
		func(ctx context.Context) (int, error) {
			return h.journal.PruneMessages(ctx, h.cfg.Now(), replayPruneBatch)
		})
	if total > 0 {
		h.log.Debug("pruned expired message IDs", "count", total)
	}
}

// pruneInBatches calls prune, which deletes up to batch records, until it
// deletes fewer, fails (logged as what, unless ctx ended) or deadline has
// passed, and returns how many it deleted and whether it stopped at the
// deadline with a full batch just deleted (more may be left).
func pruneInBatches(ctx context.Context, log *slog.Logger, what string, batch int, deadline time.Time, prune func(context.Context) (int, error)) (total int, more bool) {
	for {
		n, err := prune(ctx)
		total += n
		if err != nil {
			if ctx.Err() == nil {
				log.Warn(what, "error", err)
			}
			return total, false
		}
		if n < batch {
			return total, false
		}
		if !time.Now().Before(deadline) {
			return total, true
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// renewOrRecover sends a heartbeat while the local lease is valid (reporting
// connector_ready=false when unhealthy, which takes the replica offline);
// after local expiry a healthy host re-registers — on a tick, not on a
// retry (retry set), which then sends nothing.
//
// A beat whose answers were all lost is replayed first (same request ID and
// payload), also when the local lease has run out since: the control plane
// may have applied it, and its outcome is the replica's sequence and lease.
// A fresh beat from the old sequence would lose the fence; a registration
// would be refused (lease_live) while the lease that beat renewed there
// lives, leaving the replica routed to but refusing actions; and an
// unhealthy beat it applied ended the lease, so the host must register
// rather than beat again. While the local lease is valid a failed replay is
// this tick's failure (a retry or the next tick replays again); once it has run out
// the beat is replayed once, and recovery goes on whatever it answers — and
// not at all when the control plane said, signed, that it applied none of
// its attempts (a 503 during an outage). A failed replay counts in
// aip_connector_host_heartbeat_failures_total either way.
//
// A beat (fresh or replayed) that the control plane refuses because the
// replica holds no lease at its sequence there ends the local lease at
// once (heartbeat): the host stops taking actions, and the next tick
// re-registers, as after a local expiry.
func (h *Host) renewOrRecover(ctx context.Context, ready, retry bool) error {
	if !retry {
		h.controlMu.Lock()
	} else if !h.controlMu.TryLock() {
		// While the heartbeats run, only the shutdown takes controlMu,
		// after setting the draining flag: a retry would send nothing.
		return nil
	}
	defer h.controlMu.Unlock()
	if h.draining.Load() {
		return nil
	}
	seq, _ := h.lease.get()
	wasValid := h.lease.valid(h.cfg.Now())
	if retry && !wasValid {
		return nil
	}
	if p := h.pendingHeartbeat; p != nil && p.req.Command.Heartbeat.PreviousSequence == seq && (wasValid || p.maybeApplied) {
		err := h.heartbeat(ctx, p)
		switch {
		case err != nil && wasValid:
			return err
		case err != nil:
			// A failed renewal attempt like any other, counted although
			// the tick goes on to recover the lease (which counts its own
			// failure).
			h.pendingHeartbeat = nil
			if ctx.Err() == nil {
				h.m.heartbeatFailures.Inc()
			}
			h.log.Warn("replay the heartbeat whose outcome is unknown after the local lease ran out", "error", err)
		case wasValid && p.req.Command.Heartbeat.ConnectorReady == ready:
			return nil // the replay was this tick's beat
		}
		// Readiness changed, or the local lease had run out: the lease the
		// replay answered decides what comes next.
		seq, _ = h.lease.get()
	}
	h.pendingHeartbeat = nil
	if !h.lease.valid(h.cfg.Now()) {
		if !ready {
			return nil
		}
		return h.recoverLease(ctx)
	}
	sr, err := h.control.seal(aip.HeartbeatCommand(aip.Heartbeat{
		ReplicaID: h.cfg.ReplicaID, PreviousSequence: seq,
		InFlight: uint32(h.inflight.count()), ConnectorReady: ready,
	}))
	if err != nil {
		return err
	}
	if err := h.heartbeat(ctx, sr); err != nil {
		return err
	}
	if !ready {
		seq, _ := h.lease.get()
		h.log.Warn("reported connector_ready=false; the control plane takes the replica offline until it recovers", "sequence", seq)
	}
	return nil
}

// heartbeat sends sr (refreshed if its signed window is running out) and
// applies the lease it answers. After an ambiguous failure sr stays
// pending, to be replayed by the next beat; an answer or a definitive
// rejection clears it. A definitive rejection saying that the replica
// holds no lease at sr's sequence (leaseGone) ends the local lease, when
// it was still valid at that sequence, and returns a *leaseEndedError.
// Callers hold controlMu.
func (h *Host) heartbeat(ctx context.Context, sr *sealedRequest) error {
	hb := sr.req.Command.Heartbeat
	sr, err := h.control.refresh(sr)
	if err != nil {
		return err
	}
	h.pendingHeartbeat = sr
	out, err := h.control.do(ctx, sr)
	if err != nil {
		var rej *ControlRejectedError
		if errors.As(err, &rej) {
			h.pendingHeartbeat = nil
		}
		return h.endLeaseIfGone(fmt.Errorf("heartbeat at sequence %d (request %s): %w", hb.PreviousSequence, sr.req.RequestID, err), hb.PreviousSequence)
	}
	h.pendingHeartbeat = nil
	if out.Lease == nil {
		return fmt.Errorf("heartbeat answered %s without a lease", out.Status)
	}
	h.lease.apply(out.Lease)
	return nil
}

// leaseGone reports whether rej, the definitive rejection of a heartbeat
// or a drain, is the control plane's signed word that the replica holds
// no lease at the request's previous_sequence: the registry is at another
// sequence (the sequence rule: a newer lifecycle request won the fence),
// or the replica is offline (lease maintenance ended its lease, an
// operator or an unhealthy beat took it offline) or its lease expired
// (the state rule). Those two are the requests the registry admits only
// on a live lease at previous_sequence; an offline needs none (the
// registry takes an offline replica offline again), so its refusal is
// not read so. Any other refusal (in_flight above the capacity, a replay
// refused, a malformed request) says nothing of the lease; an unsigned
// answer, a 503, a timeout or a lost answer is no rejection at all
// (ErrControlUnavailable).
func leaseGone(rej *ControlRejectedError) bool {
	if (rej.Operation != string(aip.OpHeartbeat) && rej.Operation != string(aip.OpDrain)) || rej.Code != aip.CodeControlRejected {
		return false
	}
	return strings.HasPrefix(rej.Message, aip.ControlRuleSequence+": ") || strings.HasPrefix(rej.Message, aip.ControlRuleState+": ")
}

// endLeaseIfGone ends the local lease at once when err, the failure of a
// heartbeat or drain sent at sequence, is a refusal saying that the lease
// is gone at the control plane (leaseGone) and the local lease was still
// valid at that sequence, and returns err as a *leaseEndedError then; err
// as it is otherwise.
func (h *Host) endLeaseIfGone(err error, sequence uint64) error {
	var rej *ControlRejectedError
	if errors.As(err, &rej) && leaseGone(rej) && h.lease.end(h.cfg.Now(), sequence) {
		return &leaseEndedError{err: err, sequence: sequence}
	}
	return err
}

// leaseEndedError is a heartbeat or drain the control plane refused
// because the lease is gone there (leaseGone), which ended the local
// lease at sequence: new actions are refused (not_ready, /ready 503), and
// the next heartbeat tick re-registers — unless the host is draining,
// when nothing registers again (see shutdown). Its text is the refused
// request's.
type leaseEndedError struct {
	err      error
	sequence uint64
}

func (e *leaseEndedError) Error() string { return e.err.Error() }
func (e *leaseEndedError) Unwrap() error { return e.err }

// recoverLease re-registers after the local lease expired. After an
// ambiguous failure the same request (ID and payload) is sent again on the
// next attempt, so a registration whose answer was lost is replayed
// idempotently; after a definitive rejection, or a replay answering a lease
// that has expired since, the pending request is dropped and the next
// attempt uses a fresh request ID.
func (h *Host) recoverLease(ctx context.Context) error {
	h.m.recoveryAttempts.Inc()
	var err error
	sr := h.pendingRegister
	if sr == nil {
		sr, err = h.control.seal(aip.RegisterCommand(h.registration()))
	} else {
		sr, err = h.control.refresh(sr)
	}
	if err != nil {
		return err
	}
	h.pendingRegister = sr
	out, err := h.control.do(ctx, sr)
	if err != nil {
		var rej *ControlRejectedError
		if errors.As(err, &rej) {
			h.pendingRegister = nil
		}
		return fmt.Errorf("lease recovery (request %s): %w", sr.req.RequestID, err)
	}
	h.pendingRegister = nil
	if out.Lease == nil {
		return fmt.Errorf("register answered %s without a lease", out.Status)
	}
	h.lease.apply(out.Lease)
	if now := h.cfg.Now(); !out.Lease.ExpiresAt.After(now) {
		// The replay of a registration committed earlier, whose lease ran
		// out while its answers were lost: no recovery (its sequence is
		// kept for the fence). The replica is eligible again, and the next
		// attempt registers afresh.
		return fmt.Errorf("lease recovery (request %s): the control plane answered the lease committed earlier at sequence %d, which expired at %s", sr.req.RequestID, out.Lease.Sequence, out.Lease.ExpiresAt)
	}
	h.m.recoveries.Inc()
	h.log.Info("lease recovered", "sequence", out.Lease.Sequence, "expires_at", out.Lease.ExpiresAt.String())
	return nil
}
