package pgregistry

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// TestResumeOfAReservationReleasedMeanwhile: a Resolve that read the
// action's route as reserved and then finds it released before it marks
// the hand-out (lease maintenance took the route's replica offline and
// released the reservation, holding the replica and route row locks but
// not the action lock) does not hand out a reservation that no longer
// exists. It judges the route again as released: here its replica is
// offline, so the Resolve fails with ErrReplicaUnavailable and the route
// keeps its hand-out number, as memregistry answers the same sequence
// (the release first, then the Resolve). Before, the Resolve succeeded,
// numbering a hand-out of a reservation nobody held.
func TestResumeOfAReservationReleasedMeanwhile(t *testing.T) {
	w := newChainWorld(t)
	ctx := t.Context()
	a := w.resolve(t)
	if a.ReplicaID != w.ra.ID {
		t.Fatalf("routed to %s, want %s", a.ReplicaID, w.ra.ID)
	}
	// The replica goes offline another way (an administrator's write),
	// keeping its reservation; the grace passes.
	rep, err := w.r.ConnectorReplica(ctx, w.ra.ID)
	must(t, err)
	rep.Status, rep.LeaseExpiresAt, rep.HealthRevision = aip.ReplicaOffline, w.clock.Now(), rep.HealthRevision+1
	must(t, w.r.PutReplica(ctx, rep))
	w.clock.Advance(registry.StrandedReservationGrace + time.Minute)

	req := registry.RouteRequest{ActionID: a.ActionID, TenantID: a.TenantID, CapabilityID: a.CapabilityID}
	var resumed error
	err = w.r.inPipe(ctx, w.r.data, "resolve action "+req.ActionID, func(p *pipe) error {
		b := &pgx.Batch{}
		b.Queue(lockRouting, req.ActionID, lockClass, lockCatalog)
		if err := p.send(ctx, b); err != nil {
			return err
		}
		s, pin, err := w.r.fallback(ctx, p, &req)
		if err != nil {
			return err
		}
		if !s.reserved {
			t.Fatal("the route is not reserved before the release")
		}
		// Lease maintenance, in its own transaction, between the
		// Resolve's read and its write.
		got, err := w.r.ReleaseStrandedReservations(ctx, registry.StrandedReservationGrace, 10)
		must(t, err)
		if got.Reservations != 1 {
			t.Fatalf("released %+v, want the one reservation", got)
		}
		_, resumed = w.r.resume(ctx, p, &s, pin, &req, w.r.clock(), &stripeTry{})
		return resumed
	})
	if !errors.Is(resumed, errReplicaTaken) {
		t.Fatalf("resume after the release: %v, want errReplicaTaken (the route is read again)", resumed)
	}
	if !errors.Is(err, errReplicaTaken) {
		t.Fatalf("the attempt: %v", err)
	}
	// The whole Resolve reads the route again and refuses the offline
	// replica, as memregistry does.
	_, err = w.r.Resolve(ctx, req)
	if !errors.Is(err, registry.ErrReplicaUnavailable) {
		t.Fatalf("Resolve after the release: %v, want ErrReplicaUnavailable", err)
	}
	res, err := w.r.Reservation(ctx, a.ActionID)
	must(t, err)
	if res.Reserved || res.HandOut != 1 || res.LastSettlement != registry.SettlementLeaseExpired {
		t.Fatalf("reservation %+v, want released as lease_expired at hand-out 1", res)
	}
}
