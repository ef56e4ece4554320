package dispatch

import (
	"context"
	"crypto/rand"
	"errors"
	"strconv"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/aipfleet/aipfleet/registry"
)

// A Resolve (or Reroute) can commit in the registry while the dispatcher
// gets an error: the connection is reset after COMMIT was sent, the
// database restarts, the deadline passes after the commit. The dispatcher
// then answers the client a retryable error and never sends the action,
// yet the route holds a reservation — the replica's slot and the tenant's,
// instance's and binding's admission counters — that, without more, only
// reconciliation releases (Config.ReconcileAfter and the hosts' envelope
// window later: about 10 minutes). After a database blip with many clients
// that gave up, the fleet's capacity would shrink for that long.
//
// So when the registry implements registry.UnsentReleaser, every Resolve
// and Reroute names its hand-out with a fresh random claim, which the
// registry stores in the statements it already runs. When the call fails
// in a way that may have committed (unsentMayHaveCommitted), the
// dispatcher releases that hand-out by its claim in the background, with
// bounded retries: the registry releases the reservation only while its
// last hand-out carries the claim and made the reservation, so a retry of
// the action ID that was handed the route since (and may be sending it)
// keeps it. Releasing is safe because the dispatcher sends an action
// envelope only after its Resolve or Reroute returned an assignment: no
// envelope carries the claimed hand-out's fence, nothing can run under it,
// and the reservation guards nothing (docs/routing.md, "Lost commits").

// newClaim returns a fresh hand-out claim: 128 random bits, as 26 base32
// letters and digits (registry.ValidClaim).
func newClaim() string { return rand.Text() }

// unsentReleaser returns the registry's UnsentReleaser, or nil when it has
// none (the dispatcher then names no claims, as before).
func (d *Dispatcher) unsentReleaser() registry.UnsentReleaser {
	u, _ := d.deps.Resolver.(registry.UnsentReleaser)
	return u
}

// claimFor returns a fresh claim when the registry can release by one,
// else "".
func (d *Dispatcher) claimFor() string {
	if d.unsentReleaser() == nil {
		return ""
	}
	return newClaim()
}

// unsentMayHaveCommitted reports whether a failed Resolve or Reroute may
// have committed its hand-out: anything but a definite refusal, which
// changes nothing by the contract (an invalid request, no binding or
// replica, a full scope, a conflict, a lost fence, an unsafe reroute,
// rejected evidence). A storage failure or a context error may have
// committed; so may an error the contract does not name. A release whose
// hand-out never committed changes nothing, so erring this way costs one
// registry call.
func unsentMayHaveCommitted(err error) bool {
	for _, definite := range []error{
		registry.ErrInvalid, registry.ErrBindingUnavailable, registry.ErrReplicaUnavailable, registry.ErrCapacityExceeded,
		registry.ErrConflict, registry.ErrNotFound, registry.ErrFenceLost, registry.ErrRerouteUnsafe, registry.ErrEvidence,
	} {
		if errors.Is(err, definite) {
			return false
		}
	}
	return err != nil
}

// maxPendingUnsentReleases bounds the releases pending in the background
// at once. Every Resolve that fails while the registry is down may have
// committed, so without a bound a database outage would start one release
// per failed request — clients retry registry_unavailable, so that is
// their request rate times SettleRetryTimeout — each retrying until the
// database is back, and then all of them at once, against a registry that
// is only recovering. A release over the bound is given up at once
// (gave_up) and its reservation, if it made one, is left to
// reconciliation, as when the retries run out.
const maxPendingUnsentReleases = 1024

// Results of aip_dispatch_unsent_releases_total.
const (
	unsentReleased  = "released"
	unsentUnchanged = "unchanged"
	unsentGaveUp    = "gave_up"
)

// releaseUnsent releases, in the background, the hand-out named claim of
// actionID that a Resolve or Reroute (op) may have committed although it
// failed with first. It retries a storage failure or a timeout with
// exponential backoff (100 ms growing to 5 s, jittered) for at most
// SettleRetryTimeout (once when that is negative), then gives up and
// leaves the reservation to reconciliation; so does a release beyond
// maxPendingUnsentReleases pending ones, at once. It logs once, with the
// outcome, and counts it in aip_dispatch_unsent_releases_total.
func (d *Dispatcher) releaseUnsent(op, actionID, claim string, first error) {
	u := d.unsentReleaser()
	if u == nil || claim == "" || !unsentMayHaveCommitted(first) {
		return
	}
	log := d.log.With("action_id", actionID, "op", op)
	if d.unsentPending.Add(1) > int64(d.maxUnsentPending) {
		d.unsentPending.Add(-1)
		d.m.unsentReleases.WithLabelValues(unsentGaveUp).Inc()
		// Once per overflow: clients retry registry_unavailable, and a
		// line per failed request would flood the log for the outage.
		if d.unsentOverflowed.CompareAndSwap(false, true) {
			log.Error("the "+op+" failed and may have reserved the route; "+strconv.Itoa(d.maxUnsentPending)+
				" releases are pending already (the registry keeps failing), so reconciliation releases it and the"+
				" reservations of the next such failures (counted in aip_dispatch_unsent_releases_total{result=\"gave_up\"},"+
				" logged again once the pending releases have drained)", "error", first)
		}
		return
	}
	started := d.retries.start(func() {
		defer func() {
			if d.unsentPending.Add(-1) == 0 {
				d.unsentOverflowed.Store(false)
			}
		}()
		b := backoff.NewExponentialBackOff()
		b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 100*time.Millisecond, 5*time.Second, max(d.cfg.SettleRetryTimeout, 0)
		b.Reset()
		var policy backoff.BackOff = b
		if d.cfg.SettleRetryTimeout <= 0 {
			policy = &backoff.StopBackOff{}
		}
		attempts, released := 0, false
		err := backoff.Retry(func() error {
			attempts++
			ctx, cancel := context.WithTimeout(d.retries.ctx, d.cfg.RegistryTimeout)
			defer cancel()
			var err error
			released, err = u.ReleaseUnsent(ctx, actionID, claim)
			if err != nil && !retryableSettle(err) {
				return backoff.Permanent(err)
			}
			return err
		}, backoff.WithContext(policy, d.retries.ctx))
		switch {
		case err != nil:
			d.m.unsentReleases.WithLabelValues(unsentGaveUp).Inc()
			log.Error("the "+op+" failed and may have reserved the route; releasing it failed, so reconciliation releases it",
				"attempts", attempts, "error", err, "first_error", first)
		case released:
			d.m.unsentReleases.WithLabelValues(unsentReleased).Inc()
			log.Info("the "+op+" failed after it reserved the route; the action was not sent, so the reservation was released",
				"attempts", attempts, "first_error", first)
		default:
			d.m.unsentReleases.WithLabelValues(unsentUnchanged).Inc()
			// The common case after an outage (most failed calls never
			// committed): debug, not a line per failed request.
			log.Debug("the "+op+" failed; it reserved nothing this dispatcher holds, so there was nothing to release",
				"attempts", attempts, "first_error", first)
		}
	})
	if !started {
		d.unsentPending.Add(-1)
		d.m.unsentReleases.WithLabelValues(unsentGaveUp).Inc()
		log.Error("the "+op+" failed and may have reserved the route; the dispatcher stopped, so reconciliation releases it", "error", first)
	}
}
