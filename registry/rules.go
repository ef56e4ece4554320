package registry

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// The functions in this file are the cross-record rules every backend
// applies once it has loaded the records involved. They hold no state.

// MissingReference reports a reference to a record that does not exist.
func MissingReference(record, id, field, what, ref string) error {
	return missing(record, id, field, "%s %s does not exist; create it first", what, ref)
}

// CheckTypePut accepts an identical re-put of a connector type and rejects
// any difference.
func CheckTypePut(stored, next *ConnectorType) error {
	const r = RecordConnectorType
	switch {
	case stored.Name != next.Name:
		return conflict(r, next.ID, "name", "is fixed at %q", stored.Name)
	case stored.Owner != next.Owner:
		return conflict(r, next.ID, "owner", "is fixed at %q", stored.Owner)
	case stored.Enabled != next.Enabled:
		return conflict(r, next.ID, "enabled", "changes only through SetConnectorTypeEnabled")
	}
	return nil
}

// CheckVersionAdmission checks a new version against its connector type: the
// type is enabled and owns the artifact.
func CheckVersionAdmission(t *ConnectorType, v *ConnectorVersion) error {
	const r = RecordConnectorVersion
	if !t.Enabled {
		return refused(r, v.ID, "connector_type_id", "connector type %s is disabled; enable it before admitting versions", t.ID)
	}
	if v.Attestation.Owner != t.Owner {
		return refused(r, v.ID, "attestation.owner", "%q is not the owner %q of connector type %s", v.Attestation.Owner, t.Owner, t.ID)
	}
	return nil
}

// CheckVersionReadmission accepts re-admitting the same release in the same
// status and rejects anything else under an admitted version ID.
func CheckVersionReadmission(stored, next *ConnectorVersion) error {
	const r = RecordConnectorVersion
	if err := CheckSameRelease(stored, next); err != nil {
		return err
	}
	if stored.Status != next.Status {
		return conflict(r, next.ID, "status", "is %s; change it with SetVersionStatus", stored.Status)
	}
	return nil
}

// CheckSameRelease rejects next when its immutable content differs from
// the admitted version stored under its ID, naming the field that differs
// and both values.
func CheckSameRelease(stored, next *ConnectorVersion) error {
	if stored.SameRelease(next) {
		return nil
	}
	const todo = "versions are immutable: give the new release a new version ID, with its own version and artifact_digest"
	field, values := ReleaseDifference(stored, next)
	if field == "" {
		return conflict(RecordConnectorVersion, next.ID, "id", "is already admitted with different content; %s", todo)
	}
	return conflict(RecordConnectorVersion, next.ID, field, "differs from the admitted version %s (%s); %s", next.ID, values, todo)
}

// DuplicateRelease rejects a second version ID for a (type, version) pair.
func DuplicateRelease(v *ConnectorVersion, otherID string) error {
	return conflict(RecordConnectorVersion, v.ID, "version", "%s of connector type %s is already admitted as %s", v.Version, v.ConnectorTypeID, otherID)
}

// DuplicateArtifact rejects a second version for one artifact.
func DuplicateArtifact(v *ConnectorVersion, otherID string) error {
	return conflict(RecordConnectorVersion, v.ID, "attestation.artifact_digest", "artifact %s is already admitted as %s", v.Attestation.ArtifactDigest, otherID)
}

// CheckDefinition rejects a capability contract that differs from the
// definition already published under the same ID. i is the capability's
// index in the manifest.
func CheckDefinition(versionID string, i int, stored, next *CapabilityDefinition) error {
	if stored.ContractDigest != next.ContractDigest {
		return conflict(RecordConnectorVersion, versionID, "manifest.capabilities["+strconv.Itoa(i)+"]",
			"capability %s is already published with contract %s, not %s; publish a changed contract under a new capability ID",
			next.Capability.ID, stored.ContractDigest, next.ContractDigest)
	}
	return nil
}

// CheckInstanceVersion checks the version an instance is created with or
// switched to: it belongs to the instance's type and is admitted or active.
func CheckInstanceVersion(i *ConnectorInstance, v *ConnectorVersion) error {
	const r = RecordConnectorInstance
	if v.ConnectorTypeID != i.ConnectorTypeID {
		return invalid(r, i.ID, "version_id", "version %s belongs to connector type %s, not %s", v.ID, v.ConnectorTypeID, i.ConnectorTypeID)
	}
	if v.Status != VersionAdmitted && v.Status != VersionActive {
		return refused(r, i.ID, "version_id", "version %s is %s; only admitted or active versions can be installed", v.ID, v.Status)
	}
	return nil
}

// VersionLacksBoundCapability rejects switching an instance to a version
// that lacks capabilities its enabled bindings need.
func VersionLacksBoundCapability(i *ConnectorInstance, capabilityIDs []string) error {
	return conflict(RecordConnectorInstance, i.ID, "version_id",
		"version %s does not implement %s, which enabled bindings of this instance need; disable or retarget those bindings first",
		i.VersionID, strings.Join(capabilityIDs, ", "))
}

// CheckBindingTarget checks a binding against its instance and the
// instance's version: same tenant, and the version implements the capability
// (required on creation and whenever the binding is enabled).
func CheckBindingTarget(b *CapabilityBinding, i *ConnectorInstance, v *ConnectorVersion, creating bool) error {
	const r = RecordCapabilityBinding
	if i.TenantID != b.TenantID {
		return invalid(r, b.Key().String(), "instance_id", "instance %s belongs to tenant %s, not %s", i.ID, i.TenantID, b.TenantID)
	}
	if (creating || b.Enabled) && !v.Implements(b.CapabilityID) {
		return invalid(r, b.Key().String(), "capability_id", "version %s of instance %s does not implement %s", v.ID, i.ID, b.CapabilityID)
	}
	return nil
}

// CheckNewReplica checks a replica being created: it runs the instance's
// current version and starts with no assignments and a closed circuit. A
// replica of another version is refused with both ways to roll that
// version out: switching the instance, or a second instance on it.
func CheckNewReplica(rep *ConnectorReplica, i *ConnectorInstance) error {
	const r = RecordConnectorReplica
	if rep.VersionID != i.VersionID {
		return invalid(r, rep.ID, "version_id", "instance %[1]s runs version %[2]s; a new replica must run it too. "+
			"To roll out %[3]s, switch instance %[1]s to %[3]s in the same fleet file (its version_id, with a greater config_revision): "+
			"the replicas are applied after the instances; then start the new replicas' hosts with that --config-revision "+
			"(new actions are answered 503 until the first registers). Without that gap: declare a second instance of the tenant on %[3]s "+
			"for these replicas, bind its capabilities at a lower priority number than %[1]s's bindings (a route tries the lowest number first; "+
			"bindings at the default 0 move to 1, with a greater policy_revision), start its replicas, "+
			"then disable %[1]s's bindings (docs/operator-guide.md, \"A new connector version\")",
			i.ID, i.VersionID, rep.VersionID)
	}
	if rep.ActiveAssignments != 0 {
		return invalid(r, rep.ID, "active_assignments", "a new replica starts with 0 (the registry counts them)")
	}
	if rep.Circuit != (CircuitState{}) {
		return invalid(r, rep.ID, "circuit", "a new replica starts with a closed circuit (the registry keeps it)")
	}
	return nil
}

// ReplicaEligible reports whether a replica may take a new route now: it
// runs the instance's current version, is ready with an unexpired lease and
// spare capacity, its circuit is closed, and it passes the request's
// topology filters. The caller has checked the binding chain.
func ReplicaEligible(rep *ConnectorReplica, instanceVersionID string, pref *RouteTopologyPreference, now time.Time) bool {
	return rep.VersionID == instanceVersionID && rep.Status == aip.ReplicaReady && rep.LeaseValid(now) &&
		rep.ActiveAssignments < rep.Capacity && rep.Circuit.Closed(now) && pref.Admits(rep.Topology)
}

// PinnedReplicaUnusable says why an existing route's pinned replica
// cannot be reserved again at now — it must be ready or draining, with an
// unexpired lease, spare capacity, a closed circuit, its instance enabled,
// the version active and the type enabled — naming the first rule it
// breaks, worded for the operator; "" when it can. i is the replica's
// instance and v the route's version (its ID may be all a backend knows of
// it besides its status).
func PinnedReplicaUnusable(rep *ConnectorReplica, i *ConnectorInstance, v *ConnectorVersion, typeEnabled bool, now time.Time) string {
	switch {
	case rep.Status != aip.ReplicaReady && rep.Status != aip.ReplicaDraining:
		return fmt.Sprintf("the replica is %s: it takes the action again once its host registers", rep.Status)
	case !rep.LeaseValid(now):
		return fmt.Sprintf("the replica's lease expired at %s: it takes the action again once its host heartbeats or registers", aip.At(rep.LeaseExpiresAt))
	case rep.ActiveAssignments >= rep.Capacity:
		return fmt.Sprintf("the replica is at its capacity of %d actions in flight", rep.Capacity)
	case !rep.Circuit.Closed(now):
		return fmt.Sprintf("the replica's circuit is open until %s after %d consecutive unknown outcomes",
			aip.At(rep.Circuit.OpenUntil), rep.Circuit.ConsecutiveFailures)
	case i.Status != InstanceEnabled:
		return fmt.Sprintf("instance %s is %s", i.ID, i.Status)
	case v.Status != VersionActive:
		return fmt.Sprintf("version %s is %s, not active", v.ID, v.Status)
	case !typeEnabled:
		return fmt.Sprintf("connector type %s is disabled", i.ConnectorTypeID)
	}
	return ""
}

// PinnedReplicaUnavailable is the ErrReplicaUnavailable of a Resolve whose
// released route's pinned replica cannot take the action again: why
// (PinnedReplicaUnusable's reason) and that the action is never rerouted.
func PinnedReplicaUnavailable(a *RouteAssignment, why string) error {
	return fmt.Errorf("%w: action %s is pinned to replica %s of instance %s, which cannot take it now (%s); it is never rerouted",
		ErrReplicaUnavailable, a.ActionID, a.ReplicaID, a.InstanceID, why)
}

// RouteNotFound is the error for an action that has no route, worded as
// the backends word every missing record ("<what>: registry: not found").
func RouteNotFound(actionID string) error {
	return fmt.Errorf("route of action %s: %w", actionID, ErrNotFound)
}

// RouteConflict rejects a request whose coordinates differ from the action's
// existing assignment.
func RouteConflict(a *RouteAssignment, req *RouteRequest) error {
	return fmt.Errorf("%w: action %s is already routed for tenant %s and capability %s, not tenant %s and capability %s",
		ErrConflict, a.ActionID, a.TenantID, a.CapabilityID, req.TenantID, req.CapabilityID)
}

// NewAssignment builds the assignment of a new route: its first hand-out
// (a reroute's backend numbers it after the action's last one).
func NewAssignment(req *RouteRequest, b *CapabilityBinding, v *ConnectorVersion, rep *ConnectorReplica, catalogRevision uint64, admission AdmissionReservation, fenceToken string, now time.Time) RouteAssignment {
	return RouteAssignment{
		ActionID:              req.ActionID,
		CapabilityID:          req.CapabilityID,
		TenantID:              req.TenantID,
		InstanceID:            rep.InstanceID,
		VersionID:             rep.VersionID,
		ManifestDigest:        v.ManifestDigest,
		ReplicaID:             rep.ID,
		Endpoint:              rep.Endpoint,
		PeerPrincipalID:       rep.PeerPrincipalID,
		PeerPrincipalKind:     rep.PeerPrincipalKind,
		PeerDID:               rep.PeerDID,
		TrustDomain:           rep.TrustDomain,
		TransportProfile:      rep.TransportProfile,
		Topology:              rep.Topology,
		CatalogRevision:       catalogRevision,
		BindingPolicyRevision: b.PolicyRevision,
		CredentialRevisionRef: b.CredentialRevisionRef,
		QuotaPolicyRef:        b.QuotaPolicyRef,
		ReplicaHealthRevision: rep.HealthRevision,
		FenceToken:            fenceToken,
		Admission:             admission,
		AssignedAt:            Millis(now),
		HandOut:               1,
	}
}

// ExpireReplica applies lease expiry to a replica record: offline
// (OfflineLeaseExpired, now), lease ended at most now, no active
// assignments, health revision raised by one, lifecycle request fields
// cleared. The caller releases its reservations.
func ExpireReplica(rep *ConnectorReplica, now time.Time) {
	rep.Status = aip.ReplicaOffline
	rep.SetOffline(OfflineLeaseExpired, now)
	if now = Millis(now); rep.LeaseExpiresAt.After(now) {
		rep.LeaseExpiresAt = now
	}
	rep.ActiveAssignments = 0
	rep.HealthRevision++
	rep.LastControlRequestID, rep.LastControlRequestDigest = "", ""
}

// AdminOffline sets the offline reason and time of a replica record an
// administrator writes (PutReplica), which the registry owns whatever the
// written record says: a replica the write leaves ready or draining has
// none; one that was offline and stays offline keeps the stored ones; one
// the write takes offline went offline now for OfflineAdministrator. A new
// replica (stored nil) starts with none: it has not gone offline, it has
// not registered yet. Call it before CheckReplicaUpdate.
func AdminOffline(stored, next *ConnectorReplica, now time.Time) {
	switch {
	case next.Status != aip.ReplicaOffline || stored == nil:
		next.ClearOffline()
	case stored.Status == aip.ReplicaOffline:
		next.OfflineReason, next.OfflineAt = stored.OfflineReason, stored.OfflineAt
	default:
		next.SetOffline(OfflineAdministrator, now)
	}
}

// Retired reports whether a replica is retired at now: offline after it
// registered (health revision above 0), its lease ended RecentOfflineWindow
// or longer ago. FleetStatusSummary counts these apart, and aipfleet fleet
// status does not list them.
func Retired(status aip.ReplicaStatus, healthRevision uint64, leaseExpiresAt, now time.Time) bool {
	return status == aip.ReplicaOffline && healthRevision > 0 && !leaseExpiresAt.After(Millis(now.Add(-RecentOfflineWindow)))
}

// CountReplica adds one replica to a fleet summary observed at now.
func CountReplica(s *FleetStatusSummary, rep *ConnectorReplica, now time.Time) {
	s.Replicas++
	s.ActiveAssignments += uint64(rep.ActiveAssignments)
	if rep.Status != aip.ReplicaOffline {
		s.LiveReplicas++
	}
	switch {
	case rep.Status == aip.ReplicaOffline:
		s.OfflineReplicas++
		switch {
		case rep.HealthRevision == 0:
			s.UnregisteredReplicas++
		case Retired(rep.Status, rep.HealthRevision, rep.LeaseExpiresAt, now):
			s.RetiredReplicas++
		default:
			s.RecentlyOfflineReplicas++
		}
	case !rep.LeaseValid(now):
		s.ExpiredLeases++
	case rep.Status == aip.ReplicaReady:
		s.ReadyReplicas++
		s.ReadyCapacity += uint64(rep.Capacity)
	default:
		s.DrainingReplicas++
	}
}

// SortLedger puts a ledger in its documented order.
func SortLedger(l *Ledger) {
	slices.SortFunc(l.Counters, func(a, b AdmissionCounter) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Key, b.Key))
	})
	slices.SortFunc(l.Reservations, func(a, b RouteReservation) int { return strings.Compare(a.ActionID, b.ActionID) })
}
