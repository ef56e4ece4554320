package registrytest

import (
	"crypto/sha256"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Epoch is where a fresh Clock starts: a fixed, millisecond-aligned instant.
var Epoch = time.Date(2030, time.January, 1, 0, 0, 0, 0, time.UTC)

// Clock is a controllable clock for backends under test. Pass its Now to the
// backend's Config.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock standing at start.
func NewClock(start time.Time) *Clock { return &Clock{now: start} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Set moves the clock to t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// Options is what a backend under test must be built with.
type Options struct {
	// Clock drives every time-dependent rule; pass Clock.Now as the
	// backend's clock.
	Clock *Clock
	// Limits are the registry limits to configure (zero fields: defaults).
	Limits registry.Limits
}

// Backend bundles the contracts of one backend instance. All must be set
// and be views of the same registry state; the suite fails on a nil one.
type Backend struct {
	Catalog  registry.Catalog
	Resolver registry.Resolver
	Admin    registry.Administrator
	Fleet    registry.FleetStatus
	// Lifecycle is the backend's lifecycle contract (suite_lifecycle.go).
	Lifecycle registry.Lifecycle
	// Rerouter moves a refused action to another replica
	// (suite_reroute.go).
	Rerouter registry.Rerouter
	// Orphans settles reservations no dispatcher will settle
	// (suite_orphan.go).
	Orphans registry.OrphanSettler
	// Replicas pages through the provisioned replicas (suite_lifecycle.go).
	Replicas registry.ReplicaLister
	// Readiness reports whether the backend can serve (suite_lifecycle.go).
	Readiness registry.Readiness
	// Events is the backend's event log (suite_events.go).
	Events registry.EventLog
	// EventPruner is the event log's retention (suite_events.go).
	EventPruner registry.EventPruner
	// Another, when set, opens another handle on the same registry state,
	// as another dispatcher process (or the same one restarted) would: for
	// pgregistry, a Registry with its own pools on the same database. Its
	// resources are released with t.Cleanup. Nil means the backend has one
	// handle (memregistry): the concurrency suites share this Backend.
	Another func(t *testing.T) Backend
}

// Key returns a deterministic replica signing key derived from name, so
// tests can pre-provision a replica's DID and sign as that replica.
func Key(name string) *aip.SigningKey {
	seed := sha256.Sum256([]byte("registrytest replica key " + name))
	k, err := aip.NewSigningKey(seed[:])
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return k
}

// DID returns the did:key of Key(name).
func DID(name string) string { return Key(name).DID() }

// Capability returns a small callable tool capability with a full contract.
// Description is searchable text.
func Capability(id, description string) aip.Capability {
	return aip.Capability{
		ID:          id,
		Name:        "Capability " + id,
		Kind:        aip.KindTool,
		Description: description,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`),
		Contract: &aip.CapabilityContract{
			SideEffects: []aip.SideEffect{aip.EffectRead},
			Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
			Execution:   aip.ExecutionContract{SupportsSync: true, SupportsCancel: true, ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafeWithIdempotencyKey},
			Data:        aip.DataContract{Sensitivity: aip.SensitivityInternal},
		},
	}
}

// Manifest returns a manifest of agent agentID offering caps over the native
// HTTP profile and any extra profiles.
func Manifest(agentID string, caps []aip.Capability, extraProfiles ...string) aip.Manifest {
	return aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: agentID, Kind: aip.PrincipalService},
		Capabilities:    caps,
		Profiles:        append([]string{aip.NativeHTTPProfile}, extraProfiles...),
	}
}

// Digest returns a well-formed evidence digest derived from label.
func Digest(label string) string { return aip.DigestBytes([]byte(label)) }

// Attestation returns a qualified attestation of manifest m owned by owner;
// artifact distinguishes the artifact digest.
func Attestation(m *aip.Manifest, owner, artifact string) registry.ArtifactAttestation {
	bundle, err := registry.SchemaBundleDigest(m)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return registry.ArtifactAttestation{
		ArtifactDigest:            Digest("artifact " + artifact),
		SchemaBundleDigest:        bundle,
		SBOMDigest:                Digest("sbom " + artifact),
		ProvenanceDigest:          Digest("provenance " + artifact),
		ConformanceReportDigest:   Digest("conformance " + artifact),
		VulnerabilityReportDigest: Digest("vulnerability " + artifact),
		LicenseReportDigest:       Digest("license " + artifact),
		SignatureRef:              "did:key:example#" + Digest("signature "+artifact),
		SignerIdentity:            "release-signer@" + owner,
		Owner:                     owner,
		SupportedAIPVersions:      []string{registry.SupportedAIPVersion},
		SDKVersionRequirement:     "^1.0",
		ConformanceStatus:         registry.EvidencePassed,
		VulnerabilityPolicyStatus: registry.EvidencePassed,
		LicensePolicyStatus:       registry.EvidencePassed,
		RevocationStatus:          registry.EvidencePassed,
	}
}

// FullSupport claims every implementation feature.
var FullSupport = aip.ImplementationSupport{
	Invocation: true, Cancellation: true, Streaming: true, Retry: true, Transaction: true,
	Reconciliation: true, Compensation: true, Approval: true, Credentials: true,
}

// Version returns an admissible version of type typeID (owned by owner)
// offering the manifest, with full implementation claims and a qualified
// attestation whose artifact is derived from id.
func Version(id, typeID, version, owner string, status registry.VersionStatus, m aip.Manifest) registry.ConnectorVersion {
	digest, err := aip.ManifestDigest(&m)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	claims := make(map[string]aip.ImplementationSupport, len(m.Capabilities))
	for _, c := range m.Capabilities {
		claims[c.ID] = FullSupport
	}
	return registry.ConnectorVersion{
		ID: id, ConnectorTypeID: typeID, Version: version, Status: status,
		Manifest: m, ManifestDigest: digest, Attestation: Attestation(&m, owner, id), ImplementationSupport: claims,
	}
}

// Replica returns a ready replica of instance and version with a lease until
// leaseUntil, capacity 4, health revision 1, default topology and a DID
// derived from its ID.
func Replica(id, instanceID, versionID string, leaseUntil time.Time) registry.ConnectorReplica {
	return registry.ConnectorReplica{
		ID: id, InstanceID: instanceID, VersionID: versionID,
		Endpoint:        "https://" + id + ".replicas.test:8443",
		PeerPrincipalID: "service:" + id, PeerPrincipalKind: aip.PrincipalService,
		PeerDID: DID(id), TrustDomain: "fleet.test", TransportProfile: aip.NativeHTTPProfile,
		Topology: aip.DefaultTopology(), Status: aip.ReplicaReady, LeaseExpiresAt: leaseUntil,
		Capacity: 4, HealthRevision: 1,
	}
}
