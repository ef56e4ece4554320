package registry

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// RouteTopologyPreference is the deployment-owned placement preference of a
// route request. Region and zone are preferences that order candidates;
// CapacityClass is a filter; ForbidCrossRegion turns Region into a filter.
// None of them changes an existing route.
type RouteTopologyPreference struct {
	Region            string `json:"region,omitempty"`
	Zone              string `json:"zone,omitempty"`
	CapacityClass     string `json:"capacity_class,omitempty"`
	ForbidCrossRegion bool   `json:"forbid_cross_region,omitempty"`
}

// RouteRequest asks for the route of one action. It carries only verified
// coordinates: no instance, replica, endpoint, credential or peer key.
type RouteRequest struct {
	ActionID     string                  `json:"action_id"`
	CapabilityID string                  `json:"capability_id"`
	TenantID     string                  `json:"tenant_id"`
	Topology     RouteTopologyPreference `json:"topology"`
	// Claim, when not empty, is the caller's random name for this one
	// hand-out (ValidClaim): the registry stores it with the hand-out the
	// call makes, so that a caller who never learned whether the call
	// committed, and so never sent the action, can release exactly that
	// reservation (UnsentReleaser). Empty stores no claim: the hand-out can
	// only be settled, as before.
	Claim string `json:"claim,omitempty"`
}

// Validate checks the request: a verified tenant, an act_ action ID, a
// capability ID and well-formed topology labels.
func (q *RouteRequest) Validate() error {
	const r = RecordRouteRequest
	if q.TenantID == "" {
		return invalid(r, q.ActionID, "tenant_id", "is empty: routing needs a verified tenant and never derives one from the payload")
	}
	if err := checkIdent(r, q.ActionID, "tenant_id", q.TenantID); err != nil {
		return err
	}
	if err := aip.ValidateID(aip.PrefixAction, q.ActionID); err != nil {
		return invalid(r, q.ActionID, "action_id", "%v", err)
	}
	if err := checkIdent(r, q.ActionID, "capability_id", q.CapabilityID); err != nil {
		return err
	}
	if q.Claim != "" && !ValidClaim(q.Claim) {
		return invalid(r, q.ActionID, "claim", "%q must be 1 to %d letters, digits, '_' or '-'", truncate(q.Claim), MaxClaimBytes)
	}
	return q.Topology.validate(q.ActionID)
}

// MaxClaimBytes bounds a hand-out claim (RouteRequest.Claim).
const MaxClaimBytes = 64

// ValidClaim reports whether c is a well-formed hand-out claim: 1 to
// MaxClaimBytes ASCII letters, digits, '_' or '-'. A claim names one
// hand-out and nothing else, so its caller should draw at least 128 random
// bits for it (crypto/rand.Text does).
func ValidClaim(c string) bool {
	if c == "" || len(c) > MaxClaimBytes {
		return false
	}
	for i := 0; i < len(c); i++ {
		switch b := c[i]; {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9', b == '_', b == '-':
		default:
			return false
		}
	}
	return true
}

// UnsentReleaser releases the reservation of a hand-out its caller never
// used: a Resolve or Reroute that may have committed although its caller
// got an error (a storage failure, a connection lost after COMMIT was
// sent, a deadline that passed after the commit), so the caller never sent
// the action. Both backends implement it, and registrytest holds them to
// the same behaviour.
type UnsentReleaser interface {
	// ReleaseUnsent releases, in one atomic step (ordered with every
	// Resolve, Reroute and settlement of the action), the action's
	// reservation only if the route is reserved, its last hand-out carries
	// claim (RouteRequest.Claim) and that hand-out made the reservation.
	// The release is a cancelled settlement: the replica's count and every
	// admission counter go down, the circuit is left alone. It reports
	// whether it released anything. Everything else succeeds changing
	// nothing: an unknown action, a claim that never committed, a route
	// released already, a later hand-out (a retry of the action ID, sharing
	// the reservation or making it again, or a reroute: its holder may be
	// sending the action), and a claimed hand-out that only shared a
	// reservation an earlier hand-out made (that one's holder may be
	// sending it). A malformed action ID or claim is ErrInvalid.
	ReleaseUnsent(ctx context.Context, actionID, claim string) (bool, error)
}

// CheckUnsentRelease is the ErrInvalid of a ReleaseUnsent call with a
// malformed action ID or claim.
func CheckUnsentRelease(actionID, claim string) error {
	const r = RecordRouteRequest
	if err := aip.ValidateID(aip.PrefixAction, actionID); err != nil {
		return invalid(r, actionID, "action_id", "%v", err)
	}
	if !ValidClaim(claim) {
		return invalid(r, actionID, "claim", "%q must be 1 to %d letters, digits, '_' or '-': pass the claim of the Resolve or Reroute whose answer was lost", truncate(claim), MaxClaimBytes)
	}
	return nil
}

// ReleasesUnsent reports whether ReleaseUnsent presenting claim releases a
// route that is reserved, whose last hand-out is last carrying lastClaim,
// and whose reservation hand-out reservedBy made.
func ReleasesUnsent(claim, lastClaim string, last, reservedBy uint64) bool {
	return claim != "" && claim == lastClaim && last == reservedBy
}

// Validate checks the preference's labels, as RouteRequest.Validate does: a
// *FieldError of a route request, naming the topology.* field.
func (p *RouteTopologyPreference) Validate() error { return p.validate("") }

// validate checks the preference of the route request of action id.
func (p *RouteTopologyPreference) validate(id string) error {
	const r = RecordRouteRequest
	for _, l := range []struct{ field, v string }{
		{"topology.region", p.Region}, {"topology.zone", p.Zone}, {"topology.capacity_class", p.CapacityClass},
	} {
		if l.v != "" && !ValidTopologyLabel(l.v) {
			return invalid(r, id, l.field, "%q must be 1 to %d letters, digits, '.', '_' or '-'", truncate(l.v), MaxTopologyLabelBytes)
		}
	}
	if p.ForbidCrossRegion && p.Region == "" {
		return invalid(r, id, "topology.forbid_cross_region", "needs a region to stay in")
	}
	return nil
}

// Admits reports whether a replica at topology t passes the request's
// filters: the capacity class and, when cross-region routing is forbidden,
// the region.
func (p *RouteTopologyPreference) Admits(t aip.Topology) bool {
	if p.CapacityClass != "" && t.CapacityClass != p.CapacityClass {
		return false
	}
	return !p.ForbidCrossRegion || t.Region == p.Region
}

// RouteCandidate is one eligible replica for a new route, with the priority
// of the binding that reaches it.
type RouteCandidate struct {
	Priority   uint32
	InstanceID string
	ReplicaID  string
	Topology   aip.Topology
	Active     uint32
}

// CompareCandidates orders eligible replicas for a new route of actionID:
// lower binding priority, then a preferred-region match, a preferred-zone
// match, fewer active assignments, RouteHash(actionID, replica) ascending,
// and finally instance and replica IDs. The first candidate wins. Every
// backend orders exactly this way.
func CompareCandidates(pref *RouteTopologyPreference, actionID string, a, b *RouteCandidate) int {
	if c := cmp.Compare(a.Priority, b.Priority); c != 0 {
		return c
	}
	if pref.Region != "" {
		if c := cmpMatch(a.Topology.Region == pref.Region, b.Topology.Region == pref.Region); c != 0 {
			return c
		}
	}
	if pref.Zone != "" {
		if c := cmpMatch(a.Topology.Zone == pref.Zone, b.Topology.Zone == pref.Zone); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(a.Active, b.Active); c != 0 {
		return c
	}
	if a.ReplicaID != b.ReplicaID {
		if c := cmp.Compare(RouteHash(actionID, a.ReplicaID), RouteHash(actionID, b.ReplicaID)); c != 0 {
			return c
		}
	}
	if c := cmp.Compare(a.InstanceID, b.InstanceID); c != 0 {
		return c
	}
	return cmp.Compare(a.ReplicaID, b.ReplicaID)
}

func cmpMatch(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return -1
	}
	return 1
}

// RouteHash is the action-dependent tie-breaker of replica selection: the
// first 8 bytes, big-endian, of SHA-256(replicaID || actionID). In SQL it is
// substring(sha256(convert_to(replica_id || action_id, 'UTF8')) from 1 for 8)
// compared as bytea.
func RouteHash(actionID, replicaID string) uint64 {
	var buf [2 * MaxIdentifierBytes]byte
	b := append(append(buf[:0], replicaID...), actionID...)
	sum := sha256.Sum256(b)
	return binary.BigEndian.Uint64(sum[:8])
}

// RouteAssignment is the persistent route of one action: the verified work,
// the logical target, the concrete peer, the catalog and policy decision, the
// capacity and fence, and the time it was made. It never changes once made;
// reservation and settlement bookkeeping live beside it (RouteReservation).
type RouteAssignment struct {
	// Work identity.
	ActionID     string `json:"action_id"`
	CapabilityID string `json:"capability_id"`
	TenantID     string `json:"tenant_id"`
	// Logical target.
	InstanceID     string `json:"instance_id"`
	VersionID      string `json:"version_id"`
	ManifestDigest string `json:"manifest_digest"`
	// Concrete peer.
	ReplicaID         string            `json:"replica_id"`
	Endpoint          string            `json:"endpoint"`
	PeerPrincipalID   string            `json:"peer_principal_id"`
	PeerPrincipalKind aip.PrincipalKind `json:"peer_principal_kind"`
	PeerDID           string            `json:"peer_did"`
	TrustDomain       string            `json:"trust_domain"`
	TransportProfile  string            `json:"transport_profile"`
	Topology          aip.Topology      `json:"topology"`
	// Catalog and policy.
	CatalogRevision       uint64 `json:"catalog_revision"`
	BindingPolicyRevision uint64 `json:"binding_policy_revision"`
	CredentialRevisionRef string `json:"credential_revision_ref,omitempty"`
	QuotaPolicyRef        string `json:"quota_policy_ref,omitempty"`
	// Capacity and fencing.
	ReplicaHealthRevision uint64               `json:"replica_health_revision"`
	FenceToken            string               `json:"fence_token"`
	Admission             AdmissionReservation `json:"admission"`
	// Evidence time, in milliseconds.
	AssignedAt time.Time `json:"assigned_at"`
	// HandOut is which hand-out of the route this copy is: the route's
	// hand-outs are numbered from 1, and every Resolve or Reroute that
	// hands the route out (makes its reservation, makes it again after a
	// settlement, or returns it while it is held) takes the next number.
	// Settle releases the reservation only for a hand-out at or after the
	// one that made it (see Resolver.Settle); Assignment reports the last
	// hand-out. It is bookkeeping, not part of the route: Equal ignores
	// it and Route does not send it to the replica. Zero is an assignment
	// that does not know its hand-out (decoded from a JSON written before
	// hand-outs were numbered): its settlement releases whatever
	// reservation the route holds, as it always did.
	HandOut uint64 `json:"hand_out,omitempty"`
}

// Equal reports whether two assignments are the same route: identical in
// every field but HandOut. Settlement compares the presented assignment
// with the stored one this way (the fence); which hand-out it is decides
// only what the settlement releases.
func (a *RouteAssignment) Equal(b *RouteAssignment) bool {
	return a.AssignedAt.Equal(b.AssignedAt) && a.Admission.equal(&b.Admission) && a.fixed() == b.fixed()
}

// routeFixed is the comparable part of a RouteAssignment.
type routeFixed struct {
	actionID, capabilityID, tenantID, instanceID, versionID, manifestDigest string
	replicaID, endpoint, peerPrincipalID                                    string
	peerPrincipalKind                                                       aip.PrincipalKind
	peerDID, trustDomain, transportProfile                                  string
	topology                                                                aip.Topology
	catalogRevision, bindingPolicyRevision                                  uint64
	credentialRevisionRef, quotaPolicyRef                                   string
	replicaHealthRevision                                                   uint64
	fenceToken                                                              string
}

func (a *RouteAssignment) fixed() routeFixed {
	return routeFixed{
		a.ActionID, a.CapabilityID, a.TenantID, a.InstanceID, a.VersionID, a.ManifestDigest,
		a.ReplicaID, a.Endpoint, a.PeerPrincipalID, a.PeerPrincipalKind, a.PeerDID, a.TrustDomain, a.TransportProfile,
		a.Topology, a.CatalogRevision, a.BindingPolicyRevision, a.CredentialRevisionRef, a.QuotaPolicyRef,
		a.ReplicaHealthRevision, a.FenceToken,
	}
}

// Route returns the pinned security.connector_route a dispatcher signs into
// the native action envelope. mode is the action's original mode, or nil.
func (a *RouteAssignment) Route(mode *aip.ActionMode) aip.ConnectorRoute {
	r := aip.ConnectorRoute{
		ActionID:              a.ActionID,
		CapabilityID:          a.CapabilityID,
		TenantID:              a.TenantID,
		InstanceID:            a.InstanceID,
		ReplicaID:             a.ReplicaID,
		VersionID:             a.VersionID,
		ManifestDigest:        a.ManifestDigest,
		CatalogRevision:       a.CatalogRevision,
		BindingPolicyRevision: a.BindingPolicyRevision,
		ReplicaHealthRevision: a.ReplicaHealthRevision,
		FenceToken:            a.FenceToken,
	}
	if a.CredentialRevisionRef != "" {
		ref := a.CredentialRevisionRef
		r.CredentialRevisionRef = &ref
	}
	if a.QuotaPolicyRef != "" {
		ref := a.QuotaPolicyRef
		r.QuotaPolicyRef = &ref
	}
	if mode != nil {
		m := *mode
		r.OriginalMode = &m
	}
	return r
}

// Clone returns a deep copy.
func (a RouteAssignment) Clone() RouteAssignment {
	a.Admission.BaseScopes = append([]AdmissionScope(nil), a.Admission.BaseScopes...)
	a.Admission.RetryScope = clonePtr(a.Admission.RetryScope)
	return a
}

// RouteSettlement is how an attempt ended.
type RouteSettlement string

// Settlement outcomes.
const (
	// SettlementCompleted: the replica answered; resets the circuit.
	SettlementCompleted RouteSettlement = "completed"
	// SettlementOutcomeUnknown: the outcome is uncertain; counts toward
	// opening the replica's circuit.
	SettlementOutcomeUnknown RouteSettlement = "outcome_unknown"
	// SettlementCancelled: released after cancellation; the circuit is kept.
	SettlementCancelled RouteSettlement = "cancelled"
	// SettlementLeaseExpired: released because the replica's lease expired;
	// the circuit is kept.
	SettlementLeaseExpired RouteSettlement = "lease_expired"
	// SettlementPruned: released by reconciliation after the replica's
	// journal pruned the action (aip.StatePruned): the outcome is unknown
	// (the action may have completed there long ago, and never runs there
	// now). The circuit is kept: pruning old records says nothing about the
	// replica's health.
	SettlementPruned RouteSettlement = "pruned"
)

// Valid reports whether s is a known outcome.
func (s RouteSettlement) Valid() bool {
	return s == SettlementCompleted || s == SettlementOutcomeUnknown || s == SettlementCancelled || s == SettlementLeaseExpired ||
		s == SettlementPruned
}

// Check is Valid as the ErrInvalid a backend returns for an unknown
// outcome.
func (s RouteSettlement) Check() error {
	if !s.Valid() {
		return fmt.Errorf("%w: settlement outcome %q (want completed, outcome_unknown, cancelled, lease_expired or pruned)", ErrInvalid, s)
	}
	return nil
}

// RouteReservation is the bookkeeping beside an assignment: whether it holds
// capacity now, the scopes it holds (base scopes, plus the retry scope when
// Retry), and the last settlement since it was last reserved.
type RouteReservation struct {
	ActionID  string `json:"action_id"`
	ReplicaID string `json:"replica_id"`
	// AssignedAt is when the current assignment was made (a retry that
	// reserves the route again keeps it).
	AssignedAt time.Time `json:"assigned_at"`
	// HandedOutAt is, while Reserved, when the reservation was last handed
	// out: made with the assignment (by Resolve or Reroute), made again by
	// a Resolve after a settlement, or returned again by a Resolve while it
	// was held. Whoever it was handed to may still be sending the action.
	// It is zero when the route is not reserved. It is for display and for
	// judging age; which hand-out it was is HandOut.
	HandedOutAt time.Time `json:"handed_out_at,omitzero"`
	// HandOut is the number of the route's last hand-out
	// (RouteAssignment.HandOut), kept after its release; zero only for a
	// route no hand-out was numbered for.
	HandOut        uint64           `json:"hand_out,omitempty"`
	Reserved       bool             `json:"reserved"`
	Retry          bool             `json:"retry"`
	Scopes         []AdmissionScope `json:"scopes"`
	LastSettlement RouteSettlement  `json:"last_settlement,omitempty"`
}

// OrphanSettler releases reservations that no dispatcher will settle any
// more (the one that sent the action crashed before its settlement):
// dispatch's reconciliation. Both backends implement it, and registrytest
// holds them to the same behaviour.
type OrphanSettler interface {
	// SettleOrphan is Settle for a reservation the caller found idle, with
	// handOut its RouteReservation.HandOut then (≥ 1, else ErrInvalid;
	// a.HandOut is not consulted). In one atomic step it requires a to
	// equal the stored assignment (ErrFenceLost; an unknown action is
	// ErrNotFound), succeeds changing nothing when the route is no longer
	// reserved, and changes nothing and returns ErrConflict when the route
	// was handed out at all after handOut — its reservation made again, or
	// returned again while held: whoever received it may be sending the
	// action now, so what the caller learned about the action before may
	// no longer hold. The comparison is of hand-out numbers, exact
	// whatever the clocks.
	SettleOrphan(ctx context.Context, a RouteAssignment, outcome RouteSettlement, handOut uint64) error
}

// CheckOrphanHandOut is the ErrInvalid of an orphan settlement presenting
// no hand-out.
func CheckOrphanHandOut(actionID string, handOut uint64) error {
	if handOut == 0 {
		return fmt.Errorf("%w: orphan settlement of action %s names hand-out 0; pass the RouteReservation.HandOut the caller read", ErrInvalid, actionID)
	}
	return nil
}

// HandedOutAgain rejects an orphan settlement of a reservation that was
// handed out after the caller looked at it (hand-out seen; last is the
// route's last hand-out now).
func HandedOutAgain(actionID string, seen, last uint64) error {
	return fmt.Errorf("%w: the reservation of action %s was handed out again (hand-out %d, after %d): it is in use, not orphaned",
		ErrConflict, actionID, last, seen)
}

// SettlesReservation reports whether a settlement presenting hand-out
// presented releases a reservation made by hand-out reservedBy: a zero
// hand-out (an assignment that does not know it) always does, as
// settlements did before hand-outs were numbered; otherwise only a
// hand-out at or after the one that made the reservation. An earlier one
// is a late settlement of a reservation released already (by lease
// maintenance, reconciliation, or whoever shared it), made again since
// for someone else.
func SettlesReservation(presented, reservedBy uint64) bool {
	return presented == 0 || presented >= reservedBy
}

// AdmissionCounter is one admission counter's in-flight count.
type AdmissionCounter struct {
	Kind   AdmissionScopeKind `json:"kind"`
	Key    string             `json:"key"`
	Active uint32             `json:"active"`
}

// Ledger lists every admission counter above zero (ordered by kind, then
// key) and every live reservation (ordered by action ID). In a consistent
// registry each counter equals the number of live reservations holding its
// scope, and each replica's active assignments equal the live reservations
// on it.
type Ledger struct {
	Counters     []AdmissionCounter `json:"counters"`
	Reservations []RouteReservation `json:"reservations"`
}

// FleetStatusSummary is the fixed-size aggregate state of the fleet at
// ObservedAt. Replicas counts every replica record the registry holds,
// including those retired long ago (a replica ID is never reused, so each
// replacement leaves one behind); LiveReplicas the current ones, which are
// ready, draining or expired. Replicas are partitioned: ready and draining
// count unexpired leases, ExpiredLeases counts ready or draining replicas
// whose lease has expired (what lease maintenance will take offline),
// OfflineReplicas the rest. OfflineReplicas is in turn partitioned:
// UnregisteredReplicas were pre-provisioned and never registered (health
// revision 0), RecentlyOfflineReplicas registered and went offline (their
// lease ended) within RecentOfflineWindow before ObservedAt, and
// RetiredReplicas went offline before that.
type FleetStatusSummary struct {
	CatalogRevision         uint64    `json:"catalog_revision"`
	ConnectorTypes          int       `json:"connector_types"`
	ActiveVersions          int       `json:"active_versions"`
	EnabledInstances        int       `json:"enabled_instances"`
	Replicas                int       `json:"replicas"`
	LiveReplicas            int       `json:"live_replicas"`
	ReadyReplicas           int       `json:"ready_replicas"`
	DrainingReplicas        int       `json:"draining_replicas"`
	OfflineReplicas         int       `json:"offline_replicas"`
	UnregisteredReplicas    int       `json:"unregistered_replicas"`
	RecentlyOfflineReplicas int       `json:"recently_offline_replicas"`
	RetiredReplicas         int       `json:"retired_replicas"`
	ExpiredLeases           int       `json:"expired_leases"`
	ReadyCapacity           uint64    `json:"ready_capacity"`
	ActiveAssignments       uint64    `json:"active_assignments"`
	ObservedAt              time.Time `json:"observed_at"`
}

// RecentOfflineWindow is how long after its lease ended an offline replica
// counts as recently offline in a FleetStatusSummary, and is listed by
// aipfleet fleet status without --all; after it, the replica is retired.
const RecentOfflineWindow = 24 * time.Hour
