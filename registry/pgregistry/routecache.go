package pgregistry

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// A new route usually goes to the best binding of its tenant and
// capability, and which binding that is, with its policy and admission
// reservation, is catalog state: it changes only with the catalog
// revision. routeChains keeps it, for the newest revision a route has
// read, per tenant and capability, when that binding is the only one of
// its priority (so it is first whatever the replicas do). A new route of a
// cached pair then costs one round trip, one implicit transaction: the
// action and shared publication locks, one statement that checks that the catalog is still at the cached
// revision and the action still unrouted, ranks the binding's eligible
// replicas, takes the first no other transaction holds (FOR UPDATE ...
// SKIP LOCKED), counts the assignment on it and inserts the route, then
// the counter reservations. When that statement can take
// nothing (another revision, a routed action, no free eligible replica of
// the binding) it aborts the transaction, and the route is resolved the
// two-round-trip way, which reads the candidates of every binding.

// maxRouteChains bounds the cached pairs; the cache starts over when full.
const maxRouteChains = 4096

type chainKey struct{ tenant, capability string }

// routeChain is the decision a new route of one pair takes from its best
// binding at revision, everything but the replica. It is never changed
// once cached.
type routeChain struct {
	revision       uint64
	binding        registry.CapabilityBinding
	versionID      string
	manifestDigest string
	admission      registry.AdmissionReservation
	doc            []byte // admission, encoded
}

type routeChains struct {
	mu       sync.Mutex
	revision uint64
	chains   map[chainKey]*routeChain
}

func newRouteChains() *routeChains { return &routeChains{chains: map[chainKey]*routeChain{}} }

func (c *routeChains) get(k chainKey) *routeChain {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chains[k]
}

// put caches ch unless a newer revision has been cached; a newer revision
// drops the older one's chains.
func (c *routeChains) put(k chainKey, ch *routeChain) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case ch.revision < c.revision:
		return
	case ch.revision > c.revision || len(c.chains) >= maxRouteChains:
		clear(c.chains)
		c.revision = ch.revision
	}
	c.chains[k] = ch
}

// drop forgets k's chain if it is still ch.
func (c *routeChains) drop(k chainKey, ch *routeChain) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chains[k] == ch {
		delete(c.chains, k)
	}
}

// bestBindings reads the revision and the two best valid bindings of a
// tenant ($1) and capability ($2): the first is cacheable when the second
// is missing or of a later priority.
const bestBindings = `SELECT (SELECT revision FROM aip_registry.catalog_revision), b.instance_id, b.priority
` + chainJoins + `
WHERE ` + chainValid + `
ORDER BY b.priority, b.instance_id
LIMIT 2`

// bestBinding is a row of bestBindings.
type bestBinding struct {
	revision   uint64
	instanceID string
	priority   int64
}

// queueBestBindings queues bestBindings and collects its rows into out.
func queueBestBindings(b *pgx.Batch, req *registry.RouteRequest, out *[]bestBinding) {
	b.Queue(bestBindings, req.TenantID, req.CapabilityID).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				bb  bestBinding
				rev int64
			)
			if err := rows.Scan(&rev, &bb.instanceID, &bb.priority); err != nil {
				return err
			}
			bb.revision = uint64(rev)
			*out = append(*out, bb)
		}
		return rows.Err()
	})
}

// chainOf returns the cacheable chain of the binding a route was just
// made on (candidate c, admission and its encoding doc), or nil when that
// binding is not the first of the pair whatever the replicas do.
func chainOf(best []bestBinding, c *candidate, admission registry.AdmissionReservation, doc []byte) *routeChain {
	switch {
	case len(best) == 0 || best[0].revision != c.revision || best[0].instanceID != c.replica.InstanceID:
		return nil
	case len(best) > 1 && best[1].priority == best[0].priority:
		return nil
	}
	return &routeChain{revision: c.revision, binding: c.binding, versionID: c.replica.VersionID,
		manifestDigest: c.manifestDigest, admission: admission, doc: doc}
}

// takeBest is the one-round-trip route's statement: when the catalog is at
// revision $1 and action $2 has no route, it ranks the eligible replicas of
// instance $3 at version $4 (at $5, capacity class $6 ("" = any), $7
// forbid cross-region, $8 preferred region, $9 preferred zone) as the
// candidate query does, locks the first no other transaction holds, counts
// the assignment on it and inserts the route ($10 capability, $11 tenant,
// $12 manifest digest, $13 binding policy revision, $14 credential
// revision, $15 quota policy, $16 fence token, $17 admission, $18 counter
// stripe, $19 the hand-out's claim, $20 the stripes of a reservation with
// a stripe per scope: stripeColumns). It returns
// the taken replica; when it took none, replica_taken aborts the
// transaction.
var takeBest = "WITH " + takeBestChoice + ",\n" + countAndRoute(routeParams{
	action: 2, capability: 10, tenant: 11, manifest: 12, catalogRevision: 1, policyRevision: 13,
	credential: 14, quota: 15, fence: 16, admission: 17, now: 5, stripe: 18, claim: 19, scopeStripes: 20,
}, "1") + `
SELECT ` + replicaColumnsOf("counted") + ` FROM (SELECT COALESCE((SELECT 1 FROM chosen), aip_registry.replica_taken()) AS ok) AS taken
LEFT JOIN counted ON true`

// takeBestChoice is the part of takeBest that checks the revision and the
// action and selects and locks the replica.
const takeBestChoice = `usable AS (
	SELECT 1 FROM aip_registry.catalog_revision WHERE revision = $1
		AND NOT EXISTS (SELECT 1 FROM aip_registry.route_assignments x WHERE x.action_id = $2)),
chosen AS (
	SELECT r.replica_id FROM aip_registry.connector_replicas r
	WHERE EXISTS (SELECT 1 FROM usable) AND r.instance_id = $3 AND r.version_id = $4
		AND r.status = 'ready' AND r.lease_expires_at_ms > $5 AND r.active_assignments < r.capacity
		AND r.circuit_open_until_ms <= $5 AND ($6 = '' OR r.capacity_class = $6) AND (NOT $7 OR r.region = $8)
	ORDER BY (r.region = $8) DESC, (r.zone = $9) DESC, r.active_assignments,
		substring(sha256(convert_to(r.replica_id || $2, 'UTF8')) FROM 1 FOR 8), r.replica_id
	LIMIT 1
	FOR UPDATE OF r SKIP LOCKED)`

// resolveBest is the one-round-trip attempt of a new route on a cached
// chain. errReplicaTaken means it made no route and the route must be
// resolved the two-round-trip way.
func (r *Registry) resolveBest(ctx context.Context, p *pipe, req *registry.RouteRequest, ch *routeChain, st *stripeTry) (registry.RouteAssignment, error) {
	now := r.clock()
	pref := &req.Topology
	fence := aip.NewID(aip.PrefixRoute)
	stripes := st.stripes(ch.admission.BaseScopes)
	stripe, perScope := stripeColumns(stripes)
	var rep registry.ConnectorReplica
	b := &pgx.Batch{}
	b.Queue(lockRouting, req.ActionID, lockClass, lockCatalog)
	b.Queue(takeBest, int64(ch.revision), req.ActionID, ch.binding.InstanceID, ch.versionID, toMS(now),
		pref.CapacityClass, pref.ForbidCrossRegion, pref.Region, pref.Zone,
		req.CapabilityID, req.TenantID, ch.manifestDigest, int64(ch.binding.PolicyRevision),
		nullable(ch.binding.CredentialRevisionRef), nullable(ch.binding.QuotaPolicyRef), fence, ch.doc, stripe, nullable(req.Claim), perScope).QueryRow(func(row pgx.Row) error {
		var err error
		rep, err = scanReplica(row)
		return err
	})
	queueReserve(b, ch.admission.BaseScopes, stripes)
	if err := p.once(ctx, b); err != nil {
		if isReplicaTaken(err) {
			return registry.RouteAssignment{}, errReplicaTaken
		}
		return registry.RouteAssignment{}, st.refused(err, ch.admission.BaseScopes, stripes)
	}
	binding := ch.binding
	binding.TenantID, binding.CapabilityID = req.TenantID, req.CapabilityID
	admission := ch.admission
	admission.BaseScopes = slices.Clone(admission.BaseScopes) // the assignment is the caller's
	version := registry.ConnectorVersion{ID: rep.VersionID, ManifestDigest: ch.manifestDigest}
	return registry.NewAssignment(req, &binding, &version, &rep, ch.revision, admission, fence, now), nil
}

// admissionFor is the admission reservation of a route to candidate c for
// req, under c's quota policy or the implicit one. It fills c's binding with
// the request's tenant and capability, as the reservation and the
// assignment name them.
func (r *Registry) admissionFor(req *registry.RouteRequest, c *candidate) registry.AdmissionReservation {
	c.binding.TenantID, c.binding.CapabilityID = req.TenantID, req.CapabilityID
	pol := &r.implicit
	if c.policy != nil {
		pol = c.policy
	}
	return registry.NewReservation(pol, &c.binding, c.typeID, c.scopeKey)
}

// encodeAdmission encodes a route's admission reservation for its column.
func encodeAdmission(actionID string, a *registry.AdmissionReservation) ([]byte, error) {
	doc, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("%w: encode the admission of %s: %v", registry.ErrInvalid, actionID, err)
	}
	return doc, nil
}
