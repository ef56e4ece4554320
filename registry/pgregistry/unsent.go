package pgregistry

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/registry"
)

var _ registry.UnsentReleaser = (*Registry)(nil)

// selectClaim reads the claim of a route's hand-out claim_hand_out
// (migration 0010); both are NULL for a route whose hand-outs named none.
const selectClaim = `SELECT hand_out_claim, claim_hand_out FROM aip_registry.route_assignments WHERE action_id = $1`

// ReleaseUnsent implements registry.UnsentReleaser. Every statement that
// hands a route out writes its claim (hand_out_claim) and number
// (claim_hand_out) in the statement it already sends, so the hot path
// costs no round trip for it; the release itself is rare (only after a
// Resolve or Reroute whose answer was lost) and takes settleRead's path:
// one transaction on the data pool that takes the action lock and the
// route's replica lock, reads the route and its claim, compares them in Go
// (registry.ReleasesUnsent, with claim_hand_out equal to the last
// hand-out, so a hand-out by an older build that writes no claim never
// matches), and releases the reservation as a cancelled settlement with
// the replica's circuit written back as it read it. The action lock orders
// it with every Resolve, Reroute and settlement of the action; lease
// maintenance takes the replica lock first, as it does.
func (r *Registry) ReleaseUnsent(ctx context.Context, actionID, claim string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := registry.CheckUnsentRelease(actionID, claim); err != nil {
		return false, err
	}
	var released bool
	err := r.inPipe(ctx, r.data, "release unsent hand-out of action "+actionID, func(p *pipe) error {
		released = false
		var (
			s                storedRoute
			found            bool
			failures, openMS int64
			stored           *string
			claimed          *int64
		)
		b := &pgx.Batch{}
		b.Queue(lockRouteReplica, actionID).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&failures, &openMS)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		queueRoute(b, actionID, &s, &found)
		b.Queue(selectClaim, actionID).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&stored, &claimed)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		if err := p.send(ctx, b); err != nil {
			return err
		}
		if !found || !s.reserved || stored == nil || claimed == nil || uint64(*claimed) != s.a.HandOut ||
			!registry.ReleasesUnsent(claim, *stored, s.a.HandOut, s.reservedBy) {
			return nil
		}
		kinds, keys, amounts, stripes := scopeArrays(s.a.Admission.Scopes(s.retry), s.stripesOf())
		b = &pgx.Batch{}
		b.Queue(settleRoute, actionID, string(registry.SettlementCancelled), toMS(r.clock()), kinds, keys, amounts,
			s.a.ReplicaID, failures, openMS, stripes)
		if err := p.commit(ctx, b); err != nil {
			return err
		}
		released = true
		return nil
	})
	if err != nil {
		return false, err
	}
	return released, nil
}
