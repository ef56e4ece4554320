package registry

import (
	"math"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
)

// VersionStatus is a connector version's lifecycle status.
type VersionStatus string

// Version lifecycle statuses. A version moves from candidate to admitted or
// active, between admitted and active, and to revoked from any status;
// nothing returns to candidate and nothing leaves revoked.
const (
	VersionCandidate VersionStatus = "candidate"
	VersionAdmitted  VersionStatus = "admitted"
	VersionActive    VersionStatus = "active"
	VersionRevoked   VersionStatus = "revoked"
)

// Valid reports whether s is a known status.
func (s VersionStatus) Valid() bool {
	return s == VersionCandidate || s == VersionAdmitted || s == VersionActive || s == VersionRevoked
}

// CheckVersionTransition reports whether a version may move from one status
// to another. Staying in the same status is allowed.
func CheckVersionTransition(id string, from, to VersionStatus) error {
	if !to.Valid() {
		return invalid(RecordConnectorVersion, id, "status", "unknown status %q (want candidate, admitted, active or revoked)", to)
	}
	switch {
	case from == to:
		return nil
	case from == VersionRevoked:
		return conflict(RecordConnectorVersion, id, "status", "a revoked version never becomes %s again; admit a new version", to)
	case to == VersionCandidate:
		return conflict(RecordConnectorVersion, id, "status", "a %s version cannot return to candidate", from)
	}
	return nil
}

// InstanceStatus says whether a connector instance takes work.
type InstanceStatus string

// Instance statuses.
const (
	InstanceEnabled  InstanceStatus = "enabled"
	InstanceDisabled InstanceStatus = "disabled"
)

// Valid reports whether s is a known status.
func (s InstanceStatus) Valid() bool { return s == InstanceEnabled || s == InstanceDisabled }

// ConnectorType identifies an implementation family and its owner. Only
// Enabled changes after creation, through SetConnectorTypeEnabled.
type ConnectorType struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Owner   string `json:"owner"`
	Enabled bool   `json:"enabled"`
}

// Validate checks the record's shape.
func (t *ConnectorType) Validate() error {
	if err := checkPrefixedID(RecordConnectorType, t.ID, "id", t.ID, aip.PrefixType); err != nil {
		return err
	}
	if err := checkText(RecordConnectorType, t.ID, "name", t.Name); err != nil {
		return err
	}
	return checkText(RecordConnectorType, t.ID, "owner", t.Owner)
}

// CapabilityDefinition is one capability as published in the catalog: the
// complete capability with its contract digest (of the canonical capability)
// and schema digest (of its input and output schemas). A capability ID has
// one definition fleet-wide; a version that declares a different contract
// under a published ID is refused.
type CapabilityDefinition struct {
	Capability     aip.Capability `json:"capability"`
	ContractDigest string         `json:"contract_digest"`
	SchemaDigest   string         `json:"schema_digest"`
}

// NewCapabilityDefinition computes a capability's digests.
func NewCapabilityDefinition(c aip.Capability) (CapabilityDefinition, error) {
	contract, schema, err := aip.CapabilityDigests(&c)
	if err != nil {
		return CapabilityDefinition{}, err
	}
	return CapabilityDefinition{Capability: c, ContractDigest: contract, SchemaDigest: schema}, nil
}

// Clone returns a deep copy.
func (d CapabilityDefinition) Clone() CapabilityDefinition {
	d.Capability = cloneCapability(d.Capability)
	return d
}

// ConnectorInstance is one tenant-owned installation of a connector type at
// one version. Its ID, type and tenant never change; every other change
// needs a strictly greater ConfigRevision.
type ConnectorInstance struct {
	ID                string         `json:"id"`
	ConnectorTypeID   string         `json:"connector_type_id"`
	VersionID         string         `json:"version_id"`
	TenantID          string         `json:"tenant_id"`
	ConfigRevision    uint64         `json:"config_revision"`
	SecretProviderRef string         `json:"secret_provider_ref"`
	Status            InstanceStatus `json:"status"`
}

// Validate checks the record's shape.
func (i *ConnectorInstance) Validate() error {
	const r = RecordConnectorInstance
	if err := checkPrefixedID(r, i.ID, "id", i.ID, aip.PrefixInstance); err != nil {
		return err
	}
	if err := checkPrefixedID(r, i.ID, "connector_type_id", i.ConnectorTypeID, aip.PrefixType); err != nil {
		return err
	}
	if err := checkPrefixedID(r, i.ID, "version_id", i.VersionID, aip.PrefixVersion); err != nil {
		return err
	}
	if err := checkIdent(r, i.ID, "tenant_id", i.TenantID); err != nil {
		return err
	}
	if err := checkIdent(r, i.ID, "secret_provider_ref", i.SecretProviderRef); err != nil {
		return err
	}
	if err := checkRevision(r, i.ID, "config_revision", i.ConfigRevision); err != nil {
		return err
	}
	if !i.Status.Valid() {
		return invalid(r, i.ID, "status", "unknown status %q (want enabled or disabled)", i.Status)
	}
	return nil
}

// CheckInstanceUpdate applies the mutability rules of an instance: type and
// tenant are fixed, and any change needs a strictly greater config revision.
// It returns changed=false for an identical re-put.
func CheckInstanceUpdate(stored, next *ConnectorInstance) (changed bool, err error) {
	const r = RecordConnectorInstance
	if *stored == *next {
		return false, nil
	}
	if stored.ConnectorTypeID != next.ConnectorTypeID {
		return false, conflict(r, next.ID, "connector_type_id", "is fixed at %s; create another instance", stored.ConnectorTypeID)
	}
	if stored.TenantID != next.TenantID {
		return false, conflict(r, next.ID, "tenant_id", "is fixed at %s; create another instance", stored.TenantID)
	}
	if next.ConfigRevision <= stored.ConfigRevision {
		return false, conflict(r, next.ID, "config_revision", "%d is not newer than the stored revision %d; raise it with every change", next.ConfigRevision, stored.ConfigRevision)
	}
	return true, nil
}

// BindingKey identifies a capability binding.
type BindingKey struct {
	TenantID     string `json:"tenant_id"`
	CapabilityID string `json:"capability_id"`
	InstanceID   string `json:"instance_id"`
}

// String returns "tenant/capability/instance".
func (k BindingKey) String() string { return k.TenantID + "/" + k.CapabilityID + "/" + k.InstanceID }

// CapabilityBinding makes one tenant and capability eligible to use one
// instance. Lower Priority wins. The key never changes; every other change
// needs a strictly greater PolicyRevision. An empty QuotaPolicyRef uses the
// implicit fleet policy (ImplicitAdmissionPolicy).
type CapabilityBinding struct {
	TenantID              string `json:"tenant_id"`
	CapabilityID          string `json:"capability_id"`
	InstanceID            string `json:"instance_id"`
	Priority              uint32 `json:"priority"`
	PolicyRevision        uint64 `json:"policy_revision"`
	CredentialRevisionRef string `json:"credential_revision_ref,omitempty"`
	QuotaPolicyRef        string `json:"quota_policy_ref,omitempty"`
	Enabled               bool   `json:"enabled"`
}

// Key returns the binding's identity.
func (b *CapabilityBinding) Key() BindingKey {
	return BindingKey{TenantID: b.TenantID, CapabilityID: b.CapabilityID, InstanceID: b.InstanceID}
}

// Validate checks the record's shape.
func (b *CapabilityBinding) Validate() error {
	const r = RecordCapabilityBinding
	id := b.Key().String()
	if err := checkIdent(r, id, "tenant_id", b.TenantID); err != nil {
		return err
	}
	if err := checkIdent(r, id, "capability_id", b.CapabilityID); err != nil {
		return err
	}
	if err := checkPrefixedID(r, id, "instance_id", b.InstanceID, aip.PrefixInstance); err != nil {
		return err
	}
	if b.CredentialRevisionRef != "" {
		if err := checkIdent(r, id, "credential_revision_ref", b.CredentialRevisionRef); err != nil {
			return err
		}
	}
	if b.QuotaPolicyRef != "" {
		if err := checkIdent(r, id, "quota_policy_ref", b.QuotaPolicyRef); err != nil {
			return err
		}
	}
	return checkRevision(r, id, "policy_revision", b.PolicyRevision)
}

// CheckBindingUpdate applies the mutability rule of a binding: any change
// needs a strictly greater policy revision. It returns changed=false for an
// identical re-put.
func CheckBindingUpdate(stored, next *CapabilityBinding) (changed bool, err error) {
	if *stored == *next {
		return false, nil
	}
	if next.PolicyRevision <= stored.PolicyRevision {
		return false, conflict(RecordCapabilityBinding, next.Key().String(), "policy_revision",
			"%d is not newer than the stored revision %d; raise it with every change", next.PolicyRevision, stored.PolicyRevision)
	}
	return true, nil
}

// CircuitState is a replica's registry-owned circuit breaker: consecutive
// outcome_unknown settlements and the time until which the circuit is open.
type CircuitState struct {
	ConsecutiveFailures uint32    `json:"consecutive_failures"`
	OpenUntil           time.Time `json:"open_until,omitzero"`
}

// Closed reports whether the circuit lets new work through at now.
func (c CircuitState) Closed(now time.Time) bool { return !c.OpenUntil.After(now) }

// ConnectorReplica is one pre-provisioned host identity of an instance and
// version. Its identity (ID, instance, version, endpoint, peer principal, DID,
// trust domain, transport profile, topology) never changes. Status, lease,
// capacity and the lifecycle request fields change only with a strictly
// greater HealthRevision. ActiveAssignments and Circuit are owned by the
// registry: a write must carry the stored values (new replicas start at
// zero). Replica writes never advance the catalog revision.
type ConnectorReplica struct {
	ID                       string            `json:"id"`
	InstanceID               string            `json:"instance_id"`
	VersionID                string            `json:"version_id"`
	Endpoint                 string            `json:"endpoint"`
	PeerPrincipalID          string            `json:"peer_principal_id"`
	PeerPrincipalKind        aip.PrincipalKind `json:"peer_principal_kind"`
	PeerDID                  string            `json:"peer_did"`
	TrustDomain              string            `json:"trust_domain"`
	TransportProfile         string            `json:"transport_profile"`
	Topology                 aip.Topology      `json:"topology"`
	Status                   aip.ReplicaStatus `json:"status"`
	LeaseExpiresAt           time.Time         `json:"lease_expires_at"`
	Capacity                 uint32            `json:"capacity"`
	ActiveAssignments        uint32            `json:"active_assignments"`
	HealthRevision           uint64            `json:"health_revision"`
	LastControlRequestID     string            `json:"last_control_request_id,omitempty"`
	LastControlRequestDigest string            `json:"last_control_request_digest,omitempty"`
	Circuit                  CircuitState      `json:"circuit"`
	// OfflineReason says why the replica last went offline and OfflineAt
	// when; both are empty while it is ready or draining (registration
	// clears them) and for a pre-provisioned replica that never went
	// offline. The registry owns them: the lifecycle, lease expiry and
	// PutReplica set them (AdminOffline), whatever a written record says.
	OfflineReason OfflineReason `json:"offline_reason,omitempty"`
	OfflineAt     time.Time     `json:"offline_at,omitzero"`
}

// OfflineReason says why a replica went offline.
type OfflineReason string

// Offline reasons.
const (
	// OfflineShutdown: the replica's own signed offline transition, which
	// a host sends when it shuts down cleanly (after its drain).
	OfflineShutdown OfflineReason = "shutdown"
	// OfflineUnhealthy: a heartbeat with connector_ready false (the
	// host's connector health check or its journal failed); its lease
	// ended at once.
	OfflineUnhealthy OfflineReason = "unhealthy"
	// OfflineLeaseExpired: lease maintenance took the ready or draining
	// replica offline because its lease ran out without a heartbeat (the
	// host crashed, hung or lost its path to the control plane).
	OfflineLeaseExpired OfflineReason = "lease_expired"
	// OfflineAdministrator: an administrator's PutReplica wrote the
	// replica offline.
	OfflineAdministrator OfflineReason = "administrator"
)

// Valid reports whether r is a known reason; the empty reason (a replica
// that is not offline, or never went offline) is valid too.
func (r OfflineReason) Valid() bool {
	switch r {
	case "", OfflineShutdown, OfflineUnhealthy, OfflineLeaseExpired, OfflineAdministrator:
		return true
	}
	return false
}

// SetOffline records that the replica went offline now for reason.
func (r *ConnectorReplica) SetOffline(reason OfflineReason, now time.Time) {
	r.OfflineReason, r.OfflineAt = reason, Millis(now)
}

// ClearOffline forgets why the replica last went offline (it is live
// again).
func (r *ConnectorReplica) ClearOffline() { r.OfflineReason, r.OfflineAt = "", time.Time{} }

// LeaseValid reports whether the lease is unexpired at now.
func (r *ConnectorReplica) LeaseValid(now time.Time) bool { return r.LeaseExpiresAt.After(now) }

// Normalize truncates the replica's times to milliseconds in UTC, the
// precision every backend stores.
func (r *ConnectorReplica) Normalize() {
	r.LeaseExpiresAt = Millis(r.LeaseExpiresAt)
	r.Circuit.OpenUntil = Millis(r.Circuit.OpenUntil)
	r.OfflineAt = Millis(r.OfflineAt)
}

// Millis truncates t to milliseconds in UTC; the zero time stays zero.
func Millis(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC().Truncate(time.Millisecond)
}

// Validate checks the record's shape.
func (r *ConnectorReplica) Validate() error {
	const rec = RecordConnectorReplica
	id := r.ID
	if err := checkPrefixedID(rec, id, "id", r.ID, aip.PrefixReplica); err != nil {
		return err
	}
	if err := checkPrefixedID(rec, id, "instance_id", r.InstanceID, aip.PrefixInstance); err != nil {
		return err
	}
	if err := checkPrefixedID(rec, id, "version_id", r.VersionID, aip.PrefixVersion); err != nil {
		return err
	}
	if err := checkEndpoint(id, r.Endpoint); err != nil {
		return err
	}
	if err := checkIdent(rec, id, "peer_principal_id", r.PeerPrincipalID); err != nil {
		return err
	}
	if !r.PeerPrincipalKind.Valid() {
		return invalid(rec, id, "peer_principal_kind", "unknown principal kind %q", r.PeerPrincipalKind)
	}
	if _, err := aip.ParseDIDKey(r.PeerDID); err != nil {
		return invalid(rec, id, "peer_did", "must be the host's Ed25519 did:key: %v", err)
	}
	if err := checkIdent(rec, id, "trust_domain", r.TrustDomain); err != nil {
		return err
	}
	if err := checkIdent(rec, id, "transport_profile", r.TransportProfile); err != nil {
		return err
	}
	for _, l := range []struct{ field, v string }{
		{"topology.region", r.Topology.Region},
		{"topology.zone", r.Topology.Zone},
		{"topology.capacity_class", r.Topology.CapacityClass},
	} {
		if err := checkLabel(id, l.field, l.v); err != nil {
			return err
		}
	}
	if !r.Status.Valid() {
		return invalid(rec, id, "status", "unknown status %q (want ready, draining or offline)", r.Status)
	}
	if r.Capacity == 0 {
		return invalid(rec, id, "capacity", "must be at least 1")
	}
	if err := checkRevision(rec, id, "health_revision", r.HealthRevision); err != nil {
		return err
	}
	if !r.OfflineReason.Valid() {
		return invalid(rec, id, "offline_reason", "unknown reason %q (want shutdown, unhealthy, lease_expired, administrator or none)", truncate(string(r.OfflineReason)))
	}
	if r.ActiveAssignments > r.Capacity {
		return invalid(rec, id, "active_assignments", "%d exceeds the capacity %d", r.ActiveAssignments, r.Capacity)
	}
	if (r.LastControlRequestID == "") != (r.LastControlRequestDigest == "") {
		return invalid(rec, id, "last_control_request_id", "the last control request ID and digest are set together or not at all")
	}
	if r.LastControlRequestID != "" {
		if len(r.LastControlRequestID) > aip.MaxRequestIDBytes {
			return invalid(rec, id, "last_control_request_id", "is longer than %d bytes", aip.MaxRequestIDBytes)
		}
		if err := aip.ValidateDigest(r.LastControlRequestDigest); err != nil {
			return invalid(rec, id, "last_control_request_digest", "%v", err)
		}
	}
	return nil
}

// CheckReplicaUpdate applies the mutability rules of a replica write: the
// identity is fixed, the health revision must be strictly newer, and the
// registry-owned active assignments and circuit must equal the stored ones.
// Both records must be normalized. It returns changed=false for an identical
// re-put.
func CheckReplicaUpdate(stored, next *ConnectorReplica) (changed bool, err error) {
	const rec = RecordConnectorReplica
	if ReplicaEqual(stored, next) {
		return false, nil
	}
	if err := CheckReplicaIdentity(stored, next); err != nil {
		return false, err
	}
	if next.HealthRevision <= stored.HealthRevision {
		return false, conflict(rec, next.ID, "health_revision", "%d is not newer than the stored revision %d", next.HealthRevision, stored.HealthRevision)
	}
	if next.ActiveAssignments != stored.ActiveAssignments {
		return false, conflict(rec, next.ID, "active_assignments", "is owned by the registry (stored %d, got %d); re-read the replica and retry", stored.ActiveAssignments, next.ActiveAssignments)
	}
	if next.Circuit.ConsecutiveFailures != stored.Circuit.ConsecutiveFailures || !next.Circuit.OpenUntil.Equal(stored.Circuit.OpenUntil) {
		return false, conflict(rec, next.ID, "circuit", "is owned by the registry; re-read the replica and retry")
	}
	return true, nil
}

// CheckReplicaIdentity rejects a replica record whose fixed identity
// (instance, version, endpoint, peer principal, DID, trust domain, transport
// profile, topology) differs from the stored one.
func CheckReplicaIdentity(stored, next *ConnectorReplica) error {
	fixed := []struct {
		field     string
		old, next string
	}{
		{"instance_id", stored.InstanceID, next.InstanceID},
		{"version_id", stored.VersionID, next.VersionID},
		{"endpoint", stored.Endpoint, next.Endpoint},
		{"peer_principal_id", stored.PeerPrincipalID, next.PeerPrincipalID},
		{"peer_principal_kind", string(stored.PeerPrincipalKind), string(next.PeerPrincipalKind)},
		{"peer_did", stored.PeerDID, next.PeerDID},
		{"trust_domain", stored.TrustDomain, next.TrustDomain},
		{"transport_profile", stored.TransportProfile, next.TransportProfile},
		{"topology.region", stored.Topology.Region, next.Topology.Region},
		{"topology.zone", stored.Topology.Zone, next.Topology.Zone},
		{"topology.capacity_class", stored.Topology.CapacityClass, next.Topology.CapacityClass},
	}
	for _, f := range fixed {
		if f.old != f.next {
			return conflict(RecordConnectorReplica, next.ID, f.field, "is part of the replica's fixed identity (stored %q); pre-provision a new replica instead", f.old)
		}
	}
	return nil
}

// ReplicaEqual reports whether two replica records are identical.
func ReplicaEqual(a, b *ConnectorReplica) bool {
	x, y := *a, *b
	if !x.LeaseExpiresAt.Equal(y.LeaseExpiresAt) || !x.Circuit.OpenUntil.Equal(y.Circuit.OpenUntil) || !x.OfflineAt.Equal(y.OfflineAt) {
		return false
	}
	x.LeaseExpiresAt, y.LeaseExpiresAt = time.Time{}, time.Time{}
	x.Circuit.OpenUntil, y.Circuit.OpenUntil = time.Time{}, time.Time{}
	x.OfflineAt, y.OfflineAt = time.Time{}, time.Time{}
	return x == y
}

// ReplicaFromWire converts the replica of a register request.
func ReplicaFromWire(w *aip.Replica) ConnectorReplica {
	r := ConnectorReplica{
		ID:                       w.ID,
		InstanceID:               w.InstanceID,
		VersionID:                w.VersionID,
		Endpoint:                 w.Endpoint,
		PeerPrincipalID:          w.PeerPrincipalID,
		PeerPrincipalKind:        w.PeerPrincipalKind,
		PeerDID:                  w.PeerDID,
		TrustDomain:              w.TrustDomain,
		TransportProfile:         w.TransportProfile,
		Topology:                 w.Topology,
		Status:                   w.Status,
		LeaseExpiresAt:           w.LeaseExpiresAt.Time,
		Capacity:                 w.Capacity,
		ActiveAssignments:        w.ActiveAssignments,
		HealthRevision:           w.HealthRevision,
		LastControlRequestID:     w.LastControlRequestID,
		LastControlRequestDigest: w.LastControlRequestDigest,
	}
	r.Normalize()
	return r
}

// Wire returns the replica in its lifecycle wire form (without the circuit,
// which never travels).
func (r *ConnectorReplica) Wire() aip.Replica {
	return aip.Replica{
		ID:                       r.ID,
		InstanceID:               r.InstanceID,
		VersionID:                r.VersionID,
		Endpoint:                 r.Endpoint,
		PeerPrincipalID:          r.PeerPrincipalID,
		PeerPrincipalKind:        r.PeerPrincipalKind,
		PeerDID:                  r.PeerDID,
		TrustDomain:              r.TrustDomain,
		TransportProfile:         r.TransportProfile,
		Topology:                 r.Topology,
		Status:                   r.Status,
		LeaseExpiresAt:           aip.At(r.LeaseExpiresAt),
		Capacity:                 r.Capacity,
		ActiveAssignments:        r.ActiveAssignments,
		HealthRevision:           r.HealthRevision,
		LastControlRequestID:     r.LastControlRequestID,
		LastControlRequestDigest: r.LastControlRequestDigest,
	}
}

// checkPrefixedID checks prefix + 1.. of [A-Za-z0-9._-], at most
// aip.MaxRecordIDBytes in all (aip.ValidateRecordID, which hosts check
// too).
func checkPrefixedID(record, id, field, v, prefix string) error {
	if v == "" {
		return invalid(record, id, field, "is empty; want %s followed by letters, digits, '.', '_' or '-'", prefix)
	}
	if aip.ValidateRecordID(prefix, v) != nil {
		return invalid(record, id, field, "%q must be %s followed by 1 to %d letters, digits, '.', '_' or '-'", truncate(v), prefix, aip.MaxRecordIDBytes-len(prefix))
	}
	return nil
}

// MaxRevision bounds the revisions an operator sets (a policy's revision,
// an instance's config revision, a binding's policy revision, a replica's
// health revision): PostgreSQL stores them as bigint, and both backends
// accept the same records.
const MaxRevision = math.MaxInt64

func checkRevision(record, id, field string, v uint64) error {
	if v > MaxRevision {
		return invalid(record, id, field, "%d is over the largest revision, %d", v, uint64(MaxRevision))
	}
	return nil
}

// checkIdent checks a free-form identifier: 1..MaxIdentifierBytes of UTF-8
// without control characters, formatting characters or surrounding spaces.
func checkIdent(record, id, field, v string) error {
	if err := checkText(record, id, field, v); err != nil {
		return err
	}
	return checkFormatChars(record, id, field, v)
}

// checkFormatChars is checkIdent's rule beyond checkText: no invisible
// formatting character (RuleFormatCharacter).
func checkFormatChars(record, id, field, v string) error {
	// An invisible formatting character (a zero-width space or joiner, a
	// bidirectional control, a byte order mark, a soft hyphen: Unicode's
	// Cf) makes two identifiers that print alike name different things
	// (tenant "acme" and "acme\u200b" in a log or a fleet file). Names
	// (checkText) may hold them: a Persian name needs its zero-width
	// non-joiner.
	if r, ok := FormatCharacter(v); ok {
		return invalid(record, id, field, "%q contains the invisible formatting character U+%04X, so it would print like an identifier it is not; remove it", truncate(v), r)
	}
	return nil
}

// FormatCharacter returns the first invisible formatting character
// (Unicode Cf) in v and true, or false when v holds none: the character
// RuleFormatCharacter refuses in an identifier. A backend loading records
// an earlier build stored, which may hold one, uses it to say which, and
// the dispatcher to refuse a tenant or capability ID before it reaches
// the registry. It is aip.FormatCharacter, which a host, without the
// registry, checks its settings with.
func FormatCharacter(v string) (rune, bool) { return aip.FormatCharacter(v) }

// checkText checks a name or an owner: 1..MaxIdentifierBytes of UTF-8
// without control characters or surrounding spaces (formatting characters
// are allowed).
func checkText(record, id, field, v string) error {
	if v == "" {
		return invalid(record, id, field, "is empty")
	}
	if len(v) > MaxIdentifierBytes {
		return invalid(record, id, field, "is longer than %d bytes", MaxIdentifierBytes)
	}
	return checkPrintable(record, id, field, v)
}

func checkPrintable(record, id, field, v string) error {
	if !utf8.ValidString(v) {
		return invalid(record, id, field, "is not valid UTF-8")
	}
	if strings.TrimSpace(v) != v {
		return invalid(record, id, field, "%q has leading or trailing spaces", truncate(v))
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return invalid(record, id, field, "%q contains a control character", truncate(v))
		}
	}
	return nil
}

func labelByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// ValidTopologyLabel reports whether v is 1..128 of [A-Za-z0-9._-].
func ValidTopologyLabel(v string) bool {
	if v == "" || len(v) > MaxTopologyLabelBytes {
		return false
	}
	for i := 0; i < len(v); i++ {
		if !labelByte(v[i]) {
			return false
		}
	}
	return true
}

func checkLabel(id, field, v string) error {
	if !ValidTopologyLabel(v) {
		return invalid(RecordConnectorReplica, id, field, "%q must be 1 to %d letters, digits, '.', '_' or '-'", truncate(v), MaxTopologyLabelBytes)
	}
	return nil
}

func checkEndpoint(id, v string) error {
	const rec = RecordConnectorReplica
	if len(v) > MaxEndpointBytes {
		return invalid(rec, id, "endpoint", "is longer than %d bytes", MaxEndpointBytes)
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Hostname() == "" {
		return invalid(rec, id, "endpoint", "%q must be an absolute http or https URL with a host", truncate(v))
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return invalid(rec, id, "endpoint", "%q must not carry user info, a query or a fragment", truncate(v))
	}
	return nil
}

func truncate(s string) string { return aip.TruncateUTF8(s, 80) }
