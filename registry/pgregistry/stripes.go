package pgregistry

import (
	"errors"

	"github.com/aipfleet/aipfleet/registry"
)

// Striped admission counters (migration 0004). Each admission scope's
// counter is kept in counterStripes rows; a route reserves all the scopes of
// its reservation in one stripe, recorded in the route's counter_stripe
// column, and its settlement, reroute or lease expiry releases that stripe.
// Stripe s of a scope with limit L admits stripeLimit(L, s), and those
// shares add up to L, so the stripes of a scope never admit more than L
// together. The reservations of one scope may carry different limits
// (policies sharing a tenant, type or the global scope; a lowered limit),
// and the shares of a higher one can fill stripes a lower one has no share
// in, so a reservation also requires the scope's stripes together to hold
// less than its own limit (reserveScopes). A reservation that finds its stripe full tries the scope's
// other usable stripes, each in a transaction of its own, before it reports
// the scope full.
//
// The point is the commit: a counter row stays locked until the
// transaction holding it has flushed its commit to the WAL, so with one row
// per scope the routing transactions of a busy tenant took turns, one WAL
// flush each. The transactions a registry runs for a tenant at once hold
// different lanes of the tenant's gate (tenantGates) and start at different
// stripes, so they do not wait for each other on the counters and their WAL
// flushes can be shared.

// counterStripes is the number of stripes per scope. Migration 0004's CHECK
// constraints pin it: changing it needs a migration, so every registry
// process of one schema version divides limits the same way.
const counterStripes = 8

// stripeLimit is the share of limit that stripe s admits.
func stripeLimit(limit int64, s int16) int64 {
	share := limit / counterStripes
	if int64(s) < limit%counterStripes {
		share++
	}
	return share
}

// usableStripes is the number of stripes with a share of every scope in
// scopes: all of them unless a scope's limit is below counterStripes, when
// only the stripes below that limit have one.
func usableStripes(scopes []registry.AdmissionScope) int {
	n := counterStripes
	for _, s := range scopes {
		n = min(n, int(s.Limit))
	}
	return max(n, 1)
}

// stripeTry is a reservation's walk over the stripes: it starts at from and
// moves one stripe on for each attempt that found its stripe full.
type stripeTry struct {
	from    int // the first stripe (modulo the usable ones)
	attempt int
	usable  int // set by stripe, for the scopes of the attempt
}

// stripe returns the stripe this attempt reserves scopes in.
func (t *stripeTry) stripe(scopes []registry.AdmissionScope) int16 {
	t.usable = usableStripes(scopes)
	return int16((t.from + t.attempt) % t.usable)
}

// laneTry is the walk of a routing transaction in lane of its tenant's gate:
// the registry's lanes start at different stripes (offset by the
// registry's own random base, so two registries' lanes tend to differ too).
func (r *Registry) laneTry(lane int) *stripeTry {
	return &stripeTry{from: r.stripeBase + lane}
}

// striped runs attempt until it did not find its stripe full, or every
// usable stripe was full; then the scope is full and the last attempt's
// *registry.CapacityExceededError is returned.
func striped(t *stripeTry, attempt func(t *stripeTry) error) error {
	for {
		t.usable = 0
		err := attempt(t)
		var full *registry.CapacityExceededError
		if !errors.As(err, &full) || t.usable == 0 || t.attempt+1 >= t.usable {
			return err
		}
		t.attempt++
	}
}

// stripeShareSQL is stripeLimit in SQL, for settleMatching: the share of
// limit s.lim that the stripe of CTE route admits.
const stripeShareSQL = `s.lim / 8 + (route.counter_stripe < s.lim % 8)::int`
