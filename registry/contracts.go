package registry

import (
	"context"
	"time"
)

// The five contracts below are the registry's one seam: memregistry and
// pgregistry implement all of them, and registrytest holds both to the same
// behaviour. Each method that fails returns one of this package's errors
// (possibly wrapped); a backend that cannot tell whether a write committed
// returns ErrStorage. A method whose context is done returns an error and
// changes nothing.

// Catalog publishes the revisioned, tenant-scoped capability catalog.
//
// A tenant read (ForTenant) sees a capability only while all of these hold:
// the tenant has an enabled binding for it; the bound instance belongs to
// the tenant and is enabled; the instance's version is active (and so
// supply-chain qualified); the connector type is enabled; and the version
// implements the capability (and lists the profile, when one is asked for).
// An internal read (InternalRead) sees every capability implemented by an
// active version of an enabled type. A read with neither sees nothing.
type Catalog interface {
	// Capability returns one visible definition, or ErrNotFound.
	Capability(ctx context.Context, capabilityID string, rc ReadContext) (ResolvedCapability, error)
	// QueryCapabilities returns one page ordered by capability ID (byte
	// order), bounded by the clamped limit and by Limits.MaxPageBytes of
	// definitions. Every page of one read comes from the same revision: a
	// cursor presented after the revision moved fails with ErrStaleCursor.
	QueryCapabilities(ctx context.Context, q CatalogQuery, rc ReadContext) (CapabilityPage, error)
}

// Resolver creates, reads and settles durable route assignments.
type Resolver interface {
	// Resolve returns the action's route, as its next hand-out
	// (RouteAssignment.HandOut). An existing assignment is returned as it
	// is but for the hand-out (ErrConflict when the request's tenant or
	// capability differ);
	// if its reservation was released, the pinned scopes plus the retry scope
	// and the pinned replica are reserved again, or the call fails with
	// ErrReplicaUnavailable — never a replacement route. A new route picks
	// the first eligible replica in CompareCandidates order, reserves every
	// admission scope and the replica atomically with the assignment, and
	// carries a fresh fence token. The hand-out carries req.Claim (none
	// when it is empty; see UnsentReleaser). Failures: ErrInvalid, ErrBindingUnavailable,
	// ErrReplicaUnavailable, *CapacityExceededError.
	Resolve(ctx context.Context, req RouteRequest) (RouteAssignment, error)
	// Assignment returns the action's assignment (kept after settlement), or
	// ErrNotFound.
	Assignment(ctx context.Context, actionID string) (RouteAssignment, error)
	// Reservation returns the bookkeeping of the action's route, or
	// ErrNotFound.
	Reservation(ctx context.Context, actionID string) (RouteReservation, error)
	// Settle releases the route's reservation with an outcome and applies
	// the outcome to the replica's circuit. The presented assignment must
	// equal the stored one (RouteAssignment.Equal; else ErrFenceLost); an
	// unknown action is ErrNotFound. Only the hand-outs of the current
	// reservation settle it (SettlesReservation): a.HandOut at or after
	// the hand-out that made it, or zero (an assignment that predates
	// hand-out numbers: it settles whatever is reserved, as before).
	// Settling a released route, or presenting an earlier hand-out whose
	// reservation was released and made again since for someone else,
	// succeeds and changes nothing: not the reservation, not the counters,
	// not the circuit. Of several callers handed the same reservation, the
	// first settlement releases it and the others change nothing.
	Settle(ctx context.Context, a RouteAssignment, outcome RouteSettlement) error
}

// Reader reads registry records by identity. Missing records are
// ErrNotFound. Returned records are copies the caller may keep.
type Reader interface {
	ConnectorType(ctx context.Context, id string) (ConnectorType, error)
	ConnectorVersion(ctx context.Context, id string) (ConnectorVersion, error)
	ConnectorInstance(ctx context.Context, id string) (ConnectorInstance, error)
	ConnectorReplica(ctx context.Context, id string) (ConnectorReplica, error)
	CapabilityBinding(ctx context.Context, key BindingKey) (CapabilityBinding, error)
	AdmissionPolicy(ctx context.Context, policyRef string) (AdmissionPolicy, error)
	// CatalogRevision returns the current catalog revision (0 before the
	// first catalog write).
	CatalogRevision(ctx context.Context) (uint64, error)
}

// Administrator changes catalog and admission state, and replica records.
// Every catalog write that changes something advances the catalog revision
// by exactly one; an identical re-put changes nothing and succeeds. Replica
// writes never advance it.
type Administrator interface {
	Reader
	// PutAdmissionPolicy creates a policy or replaces it with a strictly
	// newer revision.
	PutAdmissionPolicy(ctx context.Context, p AdmissionPolicy) error
	// PutConnectorType creates a type; a re-put must be identical (use
	// SetConnectorTypeEnabled to change Enabled).
	PutConnectorType(ctx context.Context, t ConnectorType) error
	// SetConnectorTypeEnabled enables or disables a type.
	SetConnectorTypeEnabled(ctx context.Context, id string, enabled bool) error
	// AdmitVersion admits an immutable version (see PrepareVersion) of an
	// existing, enabled type whose owner equals the attestation's owner. Its
	// (type, version) pair and artifact digest are unique, and each
	// capability's contract must equal any definition already published
	// under that ID (else ErrConflict). Re-admitting the same release in the
	// same status changes nothing.
	AdmitVersion(ctx context.Context, v ConnectorVersion) error
	// SetVersionStatus moves a version through its lifecycle
	// (CheckVersionTransition).
	SetVersionStatus(ctx context.Context, id string, status VersionStatus) error
	// PutInstance creates an instance or changes it under a strictly newer
	// config revision (CheckInstanceUpdate). Its version must belong to its
	// type and be admitted or active; switching version is refused while an
	// enabled binding needs a capability the new version lacks.
	PutInstance(ctx context.Context, i ConnectorInstance) error
	// PutBinding creates a binding or changes it under a strictly newer
	// policy revision. The instance must belong to the tenant, its version
	// must implement the capability, and a quota policy it names must exist.
	PutBinding(ctx context.Context, b CapabilityBinding) error
	// PutReplica creates or updates a replica (CheckReplicaUpdate). Its
	// instance must exist and its version must be the instance's version.
	// The registry sets the offline reason and time (AdminOffline), not
	// the written record.
	PutReplica(ctx context.Context, r ConnectorReplica) error
}

// FleetStatus maintains leases and reports aggregate state. The control
// plane's maintenance calls ExpireStaleReplicas and then
// ReleaseStrandedReservations every cycle, so every reservation is
// eventually released: by its dispatcher, by reconciliation, by lease
// expiry with its replica, or as stranded on an offline replica.
type FleetStatus interface {
	// ExpireStaleReplicas takes at most limit (≥ 1) ready or draining
	// replicas whose lease expired, oldest lease first: each goes offline
	// (OfflineLeaseExpired, now) with its lease ended, its active
	// assignments zero and its health revision raised by one, its
	// lifecycle request fields cleared, and every
	// reservation on it released as lease_expired. Assignments keep their
	// destinations. It returns how many replicas it expired.
	ExpireStaleReplicas(ctx context.Context, limit int) (int, error)
	// ReleaseStrandedReservations releases the reservations no dispatcher
	// will settle on replicas that went offline some other way (a
	// lifecycle offline, an unhealthy heartbeat, an administrator's
	// PutReplica): it takes at most limit (≥ 1) offline replicas whose
	// lease ended at least grace (≥ 0; StrandedReservationGrace in
	// production) ago and that hold a live reservation last handed out at
	// least grace ago, oldest lease first, and releases each such
	// reservation as lease_expired, lowering the replica's active
	// assignments by one each. Reservations handed out more recently stay
	// (whoever received them may still settle them); the replica record is
	// otherwise unchanged. Assignments keep their destinations, and a later
	// Settle or SettleOrphan of a released route changes nothing. Replicas
	// another transaction holds may be left for a later call.
	ReleaseStrandedReservations(ctx context.Context, grace time.Duration, limit int) (StrandedRelease, error)
	// Status returns the aggregate fleet state now.
	Status(ctx context.Context) (FleetStatusSummary, error)
	// Ledger returns every admission counter above zero and every live
	// reservation.
	Ledger(ctx context.Context) (Ledger, error)
}
