package pgregistry

import (
	"errors"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/registry"
)

// Striped admission counters (migrations 0004 and 0011). Each admission
// scope's counter is kept in counterStripes rows; a route reserves each
// scope of its reservation in one of its stripes, recorded with the route
// (counter_stripe when they share one, else scope_stripes; stripeColumns),
// and its settlement, reroute, lease expiry or stranded release releases
// each scope in its stripe. Stripe s of a scope with limit L admits
// stripeLimit(L, s), and those shares add up to L, so the stripes of a
// scope never admit more than L together. A reservation starts every
// scope in one stripe (the lane's, so a route's counters are usually one
// stripe's) and moves a scope whose stripe is full to its next stripe, in
// a transaction of its own, until every stripe with a share of that scope
// was found full (stripeTry): each scope is judged by its own limit, so
// scopes of different limits do not refuse each other's routes. The
// reservations of one scope may carry different limits (policies sharing a
// tenant, type or the global scope; a lowered limit), and the shares of a
// higher one can fill stripes a lower one has no share in, so a
// reservation also requires the scope's stripes together to hold less
// than its own limit (reserveScopes), and a scope whose stripes together
// hold its limit is refused at once.
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

// scopeStripes is the number of stripes with a share of a scope with
// limit: all of them unless the limit is below counterStripes, when only
// the stripes below the limit have one.
func scopeStripes(limit uint32) int {
	return max(min(counterStripes, int(limit)), 1)
}

// usableStripes is the number of stripes with a share of every scope in
// scopes.
func usableStripes(scopes []registry.AdmissionScope) int {
	n := counterStripes
	for _, s := range scopes {
		n = min(n, scopeStripes(s.Limit))
	}
	return n
}

// scopeID names an admission scope.
type scopeID struct {
	kind registry.AdmissionScopeKind
	key  string
}

// maxStripeAttempts bounds a reservation's attempts. Every attempt that
// striped repeats found at least one stripe full that no attempt had found
// full before, so a reservation of six scopes makes at most 48; the bound
// only guards against a catalog that changes the reservation's scopes at
// every attempt.
const maxStripeAttempts = 64

// stripeTry is a reservation's walk over the stripes, scope by scope. Its
// attempts start every scope at one stripe (from, modulo the stripes every
// scope has a share in), or at the scope's stripe in start; an attempt
// that finds some scopes' stripes full moves only those scopes on, each to
// the next of its own stripes not yet found full. A scope is full when its
// stripes together hold its limit, or when every stripe with a share of it
// was found full; then the reservation is refused naming it. So a scope is
// refused by its own limit alone, whatever the limits of the scopes beside
// it: their shares need not lie in the same stripes.
type stripeTry struct {
	from  int
	start map[scopeID]int16 // a reroute's: each scope's stripe in the reservation it releases
	full  map[scopeID]uint8 // the stripes found full, per scope
	again bool              // set by refused: try other stripes
	tries int
}

// stripes returns the stripe this attempt reserves each of scopes in.
func (t *stripeTry) stripes(scopes []registry.AdmissionScope) []int16 {
	t.again = false
	base := t.from % usableStripes(scopes)
	out := make([]int16, len(scopes))
	for i, s := range scopes {
		id := scopeID{s.Kind, s.Key}
		n := scopeStripes(s.Limit)
		first := base
		if p, ok := t.start[id]; ok && int(p) < n {
			first = int(p)
		}
		out[i] = int16(first)
		for k := range n {
			if c := (first + k) % n; t.full[id]&(1<<c) == 0 {
				out[i] = int16(c)
				break
			}
		}
	}
	return out
}

// refused translates the failure of an attempt that reserved scopes in
// stripes. When scopes_full aborted it (SQLSTATE AIP01), it records the
// stripes found full; if one of those scopes is full (its stripes together
// hold its limit, or each of its stripes was found full) it returns the
// *registry.CapacityExceededError of the first such scope in the
// reservation, else that of the first scope refused, marking the attempt
// to be made again (striped). Other errors pass through.
func (t *stripeTry) refused(err error, scopes []registry.AdmissionScope, stripes []int16) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "AIP01" {
		return err
	}
	refused, ok := parseScopesFull(pgErr.Detail, len(scopes))
	if !ok {
		return err
	}
	if t.full == nil {
		t.full = map[scopeID]uint8{}
	}
	full := -1
	for _, r := range refused {
		s := scopes[r.index]
		id := scopeID{s.Kind, s.Key}
		t.full[id] |= 1 << stripes[r.index]
		all := uint8(uint16(1)<<scopeStripes(s.Limit) - 1)
		if full < 0 && (r.whole || t.full[id]&all == all) {
			full = r.index
		}
	}
	if full >= 0 || len(refused) == 0 {
		return registry.CapacityExceeded(scopes[max(full, 0)])
	}
	t.again = true
	return registry.CapacityExceeded(scopes[refused[0].index])
}

// scopeRefusal is one scope scopes_full names: its index in the
// reservation, and whether its stripes together hold its limit.
type scopeRefusal struct {
	index int
	whole bool
}

// parseScopesFull parses scopes_full's detail ("0,3*": the indexes in
// ascending order, '*' marking a scope full as a whole) for a reservation
// of n scopes.
func parseScopesFull(detail string, n int) ([]scopeRefusal, bool) {
	var out []scopeRefusal
	for _, f := range strings.Split(detail, ",") {
		r := scopeRefusal{}
		f, r.whole = strings.CutSuffix(f, "*")
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 || i >= n {
			return nil, false
		}
		r.index = i
		out = append(out, r)
	}
	return out, len(out) > 0
}

// striped runs attempt until it was not refused for full stripes only
// (refused marks that), and returns its error.
func striped(t *stripeTry, attempt func(t *stripeTry) error) error {
	for {
		t.again = false
		err := attempt(t)
		if !t.again || t.tries+1 >= maxStripeAttempts {
			return err
		}
		t.tries++
	}
}

// laneTry is the walk of a routing transaction in lane of its tenant's gate:
// the registry's lanes start at different stripes (offset by the
// registry's own random base, so two registries' lanes tend to differ too).
func (r *Registry) laneTry(lane int) *stripeTry {
	return &stripeTry{from: r.stripeBase + lane}
}

// stripeColumns returns a reservation's route_assignments.counter_stripe
// and scope_stripes (migration 0011) for its scopes' stripes: the stripe
// and NULL when every scope is in one stripe (as routes always were
// before), else -1 and the stripes.
func stripeColumns(stripes []int16) (int16, []int16) {
	for _, s := range stripes {
		if s != stripes[0] {
			return -1, stripes
		}
	}
	if len(stripes) == 0 {
		return 0, nil
	}
	return stripes[0], nil
}

// releasedStripe is the counter_stripe of a released route: -1 (a reserved
// route with a stripe per scope) becomes -2, which builds that know only
// counter_stripe may not write (migration 0011).
const releasedStripe = `counter_stripe = CASE counter_stripe WHEN -1 THEN -2 ELSE counter_stripe END`

// routeStripeSQL is the stripe of scope s (s.idx: its index in the
// reservation) of a route row route: stripeOf in SQL.
const routeStripeSQL = `CASE WHEN route.counter_stripe >= 0 THEN route.counter_stripe ELSE route.scope_stripes[s.idx + 1] END`

// stripeShareSQL is stripeLimit in SQL: the share of limit s.lim that
// stripe st.stripe admits.
const stripeShareSQL = `s.lim / 8 + (st.stripe < s.lim % 8)::int`
