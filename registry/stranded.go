package registry

import (
	"fmt"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// StrandedReservationGrace is how long lease maintenance leaves the live
// reservations of an offline replica alone before it releases them
// (FleetStatus.ReleaseStrandedReservations): the grace runs from the later
// of the replica's lease end (a replica that goes offline by a lifecycle
// offline, an unhealthy heartbeat or lease expiry has its lease ended at
// that moment) and the reservation's last handout.
//
// Within it the dispatcher that holds a reservation settles it itself: its
// settlement retries give up after two minutes (dispatch's
// DefaultSettleRetryTimeout), and its reconciliation asks the replica about
// reservations handed out ten minutes ago or more, once a minute (dispatch's
// DefaultReconcileAfter and DefaultReconcileInterval), settling them with
// the outcome the replica journaled. Fifteen minutes gives both their
// chance with a margin; a reservation still held after that belongs to a
// dispatcher that crashed or gave up on a replica that does not answer, and
// nothing but maintenance will ever release it (a replaced replica's ID is
// never used again). Releasing it earlier would return the tenant's
// admission capacity while an action may still be finishing; later only
// keeps the capacity from the tenant longer.
const StrandedReservationGrace = 15 * time.Minute

// StrandedRelease is what one ReleaseStrandedReservations call released.
type StrandedRelease struct {
	// Replicas counts the offline replicas it took (at most the limit).
	Replicas int `json:"replicas"`
	// Reservations counts the reservations on them it released.
	Reservations int `json:"reservations"`
}

// CheckStrandedRelease validates the arguments of
// ReleaseStrandedReservations as the ErrInvalid a backend returns.
func CheckStrandedRelease(grace time.Duration, limit int) error {
	if grace < 0 {
		return fmt.Errorf("%w: stranded-reservation grace %s must not be negative", ErrInvalid, grace)
	}
	if limit < 1 {
		return fmt.Errorf("%w: stranded-release limit %d must be at least 1", ErrInvalid, limit)
	}
	return nil
}

// StrandedCutoff is the newest lease end and handout a stranded
// reservation may have at now: now minus grace, in milliseconds.
func StrandedCutoff(now time.Time, grace time.Duration) time.Time {
	return Millis(now.Add(-grace))
}

// Stranded reports whether a live reservation handed out at handedOut on
// replica rep is stranded at cutoff (StrandedCutoff): the replica is
// offline, its lease ended at or before cutoff, and the reservation was last
// handed out at or before cutoff.
func Stranded(rep *ConnectorReplica, handedOut, cutoff time.Time) bool {
	return rep.Status == aip.ReplicaOffline && !rep.LeaseExpiresAt.After(cutoff) && !handedOut.After(cutoff)
}
