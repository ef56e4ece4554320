package registrytest

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func runRecords(t *testing.T, nb NewBackend) {
	t.Run("ConnectorType", func(t *testing.T) { testTypeRules(t, nb) })
	t.Run("VersionAdmission", func(t *testing.T) { testVersionAdmission(t, nb) })
	t.Run("VersionLifecycle", func(t *testing.T) { testVersionLifecycle(t, nb) })
	t.Run("Instance", func(t *testing.T) { testInstanceRules(t, nb) })
	t.Run("Binding", func(t *testing.T) { testBindingRules(t, nb) })
	t.Run("AdmissionPolicy", func(t *testing.T) { testPolicyRules(t, nb) })
	t.Run("Replica", func(t *testing.T) { testReplicaRules(t, nb) })
	t.Run("ReadersReturnCopies", func(t *testing.T) { testCopies(t, nb) })
}

func testTypeRules(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	got, err := f.b.Admin.ConnectorType(f.ctx, ct.ID)
	f.must(err)
	if got != ct {
		t.Fatalf("ConnectorType = %+v, want %+v", got, ct)
	}
	changed := ct
	changed.Name = "renamed"
	f.wantField(f.b.Admin.PutConnectorType(f.ctx, changed), registry.ErrConflict, "name", "renaming a type")
	changed = ct
	changed.Owner = "someone-else"
	f.wantField(f.b.Admin.PutConnectorType(f.ctx, changed), registry.ErrConflict, "owner", "changing a type's owner")
	changed = ct
	changed.Enabled = false
	f.wantField(f.b.Admin.PutConnectorType(f.ctx, changed), registry.ErrConflict, "enabled", "disabling through a put")
	f.wantErr(f.b.Admin.SetConnectorTypeEnabled(f.ctx, "ctype_missing", true), registry.ErrNotFound, "enabling a missing type")
	for _, bad := range []registry.ConnectorType{
		{ID: "alpha", Name: "a", Owner: "o"},
		{ID: "ctype_", Name: "a", Owner: "o"},
		{ID: "ctype_a b", Name: "a", Owner: "o"},
		{ID: "ctype_ok", Name: "", Owner: "o"},
		{ID: "ctype_ok", Name: "a", Owner: " padded"},
	} {
		if err := f.b.Admin.PutConnectorType(f.ctx, bad); err == nil {
			t.Fatalf("PutConnectorType(%+v) succeeded", bad)
		} else {
			f.wantErr(err, registry.ErrInvalid, "invalid type")
		}
	}
	_, err = f.b.Admin.ConnectorType(f.ctx, "ctype_missing")
	f.wantErr(err, registry.ErrNotFound, "reading a missing type")
}

func testVersionAdmission(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	f.clock.Advance(1234 * time.Millisecond)
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	got, err := f.b.Admin.ConnectorVersion(f.ctx, v.ID)
	f.must(err)
	if !got.AdmittedAt.Equal(f.clock.Now()) {
		t.Fatalf("admitted_at %v, want the registry clock %v", got.AdmittedAt, f.clock.Now())
	}
	if !got.SameRelease(&v) || got.Status != registry.VersionActive {
		t.Fatalf("stored version differs from the admitted one")
	}
	// The same release again changes nothing; different content under the
	// same ID, or another status, is refused.
	f.must(f.b.Admin.AdmitVersion(f.ctx, v))
	other := Version(v.ID, ct.ID, "alpha1", ct.Owner, registry.VersionActive, Manifest("service:alpha", []aip.Capability{Capability("alpha.write", "w")}))
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, other), registry.ErrConflict, "manifest", "re-admitting a different manifest")
	again := v
	again.Status = registry.VersionAdmitted
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, again), registry.ErrConflict, "status", "re-admitting in another status")

	fresh := func(id, version string) registry.ConnectorVersion {
		return Version(id, ct.ID, version, ct.Owner, registry.VersionActive, Manifest("service:alpha", []aip.Capability{Capability("alpha.read", "does alpha.read")}))
	}
	dup := fresh("cver_alpha2", "alpha1")
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, dup), registry.ErrConflict, "version", "a second ID for one release")
	sameArtifact := fresh("cver_alpha3", "alpha3")
	sameArtifact.Attestation.ArtifactDigest = v.Attestation.ArtifactDigest
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, sameArtifact), registry.ErrConflict, "attestation.artifact_digest", "a second version of one artifact")

	orphan := fresh("cver_orphan", "x")
	orphan.ConnectorTypeID = "ctype_missing"
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, orphan), registry.ErrNotFound, "connector_type_id", "a version of a missing type")

	cases := []struct {
		name   string
		mod    func(*registry.ConnectorVersion)
		target error
		field  string
	}{
		{"owner mismatch", func(v *registry.ConnectorVersion) { v.Attestation.Owner = "intruder" }, registry.ErrAdmission, "attestation.owner"},
		{"failed conformance", func(v *registry.ConnectorVersion) { v.Attestation.ConformanceStatus = registry.EvidenceFailed }, registry.ErrAdmission, "attestation.conformance_status"},
		{"unevaluated licence", func(v *registry.ConnectorVersion) { v.Attestation.LicensePolicyStatus = registry.EvidenceNotEvaluated }, registry.ErrAdmission, "attestation.license_policy_status"},
		{"revocation failed", func(v *registry.ConnectorVersion) { v.Attestation.RevocationStatus = registry.EvidenceFailed }, registry.ErrAdmission, "attestation.revocation_status"},
		{"no AIP 1.0", func(v *registry.ConnectorVersion) { v.Attestation.SupportedAIPVersions = []string{"0.9"} }, registry.ErrAdmission, "attestation.supported_aip_versions"},
		{"SDK requirement", func(v *registry.ConnectorVersion) { v.Attestation.SDKVersionRequirement = ">=2.0" }, registry.ErrAdmission, "attestation.sdk_version_requirement"},
		{"bad SDK requirement", func(v *registry.ConnectorVersion) { v.Attestation.SDKVersionRequirement = "one" }, registry.ErrInvalid, "attestation.sdk_version_requirement"},
		{"schema bundle", func(v *registry.ConnectorVersion) { v.Attestation.SchemaBundleDigest = Digest("wrong") }, registry.ErrAdmission, "attestation.schema_bundle_digest"},
		{"malformed sbom digest", func(v *registry.ConnectorVersion) { v.Attestation.SBOMDigest = "md5:00" }, registry.ErrInvalid, "attestation.sbom_digest"},
		{"no signer", func(v *registry.ConnectorVersion) { v.Attestation.SignerIdentity = "" }, registry.ErrInvalid, "attestation.signer_identity"},
		{"manifest digest", func(v *registry.ConnectorVersion) { v.ManifestDigest = Digest("other manifest") }, registry.ErrInvalid, "manifest_digest"},
		{"agent DID", func(v *registry.ConnectorVersion) { v.Manifest.Agent.DID = DID("x") }, registry.ErrInvalid, "manifest.agent.did"},
		{"missing claim", func(v *registry.ConnectorVersion) { delete(v.ImplementationSupport, "alpha.read") }, registry.ErrInvalid, "implementation_support"},
		{"extra claim", func(v *registry.ConnectorVersion) { v.ImplementationSupport["ghost"] = FullSupport }, registry.ErrInvalid, "implementation_support"},
		{"claim lacks cancellation", func(v *registry.ConnectorVersion) {
			s := FullSupport
			s.Cancellation = false
			v.ImplementationSupport["alpha.read"] = s
		}, registry.ErrInvalid, "implementation_support.alpha.read"},
		{"admitted as revoked", func(v *registry.ConnectorVersion) { v.Status = registry.VersionRevoked }, registry.ErrInvalid, "status"},
		{"empty version", func(v *registry.ConnectorVersion) { v.Version = "" }, registry.ErrInvalid, "version"},
		{"bad id", func(v *registry.ConnectorVersion) { v.ID = "version-9" }, registry.ErrInvalid, "id"},
		{"no capabilities", func(v *registry.ConnectorVersion) {
			v.Manifest.Capabilities = nil
			v.ImplementationSupport = nil
			v.ManifestDigest, _ = aip.ManifestDigest(&v.Manifest)
		}, registry.ErrInvalid, "manifest.capabilities"},
		{"invalid manifest", func(v *registry.ConnectorVersion) {
			v.Manifest.Profiles = nil
			v.ManifestDigest, _ = aip.ManifestDigest(&v.Manifest)
		}, registry.ErrInvalid, "manifest"},
	}
	for i, c := range cases {
		v := fresh("cver_case"+string(rune('a'+i)), "case"+string(rune('a'+i)))
		v.Attestation.ArtifactDigest = Digest("case artifact " + c.name)
		c.mod(&v)
		f.wantField(f.b.Admin.AdmitVersion(f.ctx, v), c.target, c.field, c.name)
	}
	// PostgreSQL stores no NUL (jsonb refuses \u0000): a manifest holding
	// one is invalid on every backend. The six characters \u0000 (an escaped
	// backslash, not a NUL) are text like any other.
	nulDesc := Capability("alpha.nul", "reads\x00alpha")
	nulKey := Capability("alpha.nulkey", "reads alpha")
	nulKey.InputSchema = json.RawMessage(`{"type":"object","properties":{"a\u0000b":{"type":"string"}}}`)
	for i, c := range []aip.Capability{nulDesc, nulKey} {
		nul := Version("cver_nul"+strconv.Itoa(i), ct.ID, "nul"+strconv.Itoa(i), ct.Owner, registry.VersionActive, Manifest("service:alpha", []aip.Capability{c}))
		f.wantField(f.b.Admin.AdmitVersion(f.ctx, nul), registry.ErrInvalid, "manifest.capabilities[0]", "a NUL in capability "+c.ID)
	}
	// The six characters \u0000 (an escaped backslash, not a NUL) are text
	// like any other.
	literal := Version("cver_literal", ct.ID, "literal", ct.Owner, registry.VersionActive,
		Manifest("service:alpha", []aip.Capability{Capability("alpha.literal", `matches \u0000 literally`)}))
	f.must(f.b.Admin.AdmitVersion(f.ctx, literal))
	rev := f.revision()
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, ct.ID, false))
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, fresh("cver_late", "late")), registry.ErrAdmission, "connector_type_id", "a version of a disabled type")
	if got := f.revision(); got != rev+1 {
		t.Fatalf("refused versions moved the catalog revision to %d, want %d", got, rev+1)
	}
}

func testVersionLifecycle(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionCandidate, "alpha.read")
	inst := registry.ConnectorInstance{ID: "cinst_a", ConnectorTypeID: ct.ID, VersionID: v.ID, TenantID: "tenant-1", ConfigRevision: 1, SecretProviderRef: "s", Status: registry.InstanceEnabled}
	f.wantField(f.b.Admin.PutInstance(f.ctx, inst), registry.ErrAdmission, "version_id", "installing a candidate version")
	steps := []struct {
		to     registry.VersionStatus
		target error
	}{
		{registry.VersionAdmitted, nil},
		{registry.VersionCandidate, registry.ErrConflict},
		{registry.VersionActive, nil},
		{registry.VersionAdmitted, nil},
		{registry.VersionActive, nil},
		{"retired", registry.ErrInvalid},
		{registry.VersionRevoked, nil},
		{registry.VersionRevoked, nil},
		{registry.VersionActive, registry.ErrConflict},
		{registry.VersionAdmitted, registry.ErrConflict},
	}
	for _, s := range steps {
		err := f.b.Admin.SetVersionStatus(f.ctx, v.ID, s.to)
		if s.target == nil {
			f.must(err)
		} else {
			f.wantErr(err, s.target, "moving to "+string(s.to))
		}
	}
	got, err := f.b.Admin.ConnectorVersion(f.ctx, v.ID)
	f.must(err)
	if got.Status != registry.VersionRevoked {
		t.Fatalf("status %s, want revoked", got.Status)
	}
	f.wantErr(f.b.Admin.SetVersionStatus(f.ctx, "cver_missing", registry.VersionActive), registry.ErrNotFound, "missing version")
	f.wantField(f.b.Admin.PutInstance(f.ctx, inst), registry.ErrAdmission, "version_id", "installing a revoked version")
}

func testInstanceRules(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v1 := f.version(ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	v2 := f.version(ct, "alpha2", registry.VersionActive, "alpha.read")
	other := f.typ("beta")
	vb := f.version(other, "beta1", registry.VersionActive, "beta.read")
	i := f.instance("a", v1, "tenant-1")
	got, err := f.b.Admin.ConnectorInstance(f.ctx, i.ID)
	f.must(err)
	if got != i {
		t.Fatalf("ConnectorInstance = %+v, want %+v", got, i)
	}
	mod := func(m func(*registry.ConnectorInstance)) registry.ConnectorInstance {
		c := i
		m(&c)
		return c
	}
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.TenantID = "tenant-2"; c.ConfigRevision = 9 })), registry.ErrConflict, "tenant_id", "moving an instance to another tenant")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.ConnectorTypeID = other.ID; c.ConfigRevision = 9 })), registry.ErrConflict, "connector_type_id", "changing an instance's type")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.SecretProviderRef = "new" })), registry.ErrConflict, "config_revision", "a change without a newer config revision")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.SecretProviderRef = "new"; c.ConfigRevision = 0 })), registry.ErrConflict, "config_revision", "a change with an older config revision")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.VersionID = vb.ID; c.ConfigRevision = 2 })), registry.ErrInvalid, "version_id", "a version of another type")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.VersionID = "cver_missing"; c.ConfigRevision = 2 })), registry.ErrNotFound, "version_id", "a missing version")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.Status = "paused"; c.ConfigRevision = 2 })), registry.ErrInvalid, "status", "an unknown status")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.ID = "cinst_new"; c.ConnectorTypeID = "ctype_missing" })), registry.ErrNotFound, "connector_type_id", "a missing type")
	f.wantField(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.ConfigRevision = registry.MaxRevision + 1 })), registry.ErrInvalid, "config_revision", "a config revision over MaxRevision")
	f.must(f.b.Admin.PutInstance(f.ctx, mod(func(c *registry.ConnectorInstance) { c.ID = "cinst_maxrev"; c.ConfigRevision = registry.MaxRevision })))

	// Switching versions is refused while an enabled binding needs a
	// capability the new version lacks.
	b := f.bind(i, "alpha.write", 0, "")
	f.bind(i, "alpha.read", 0, "")
	switched := mod(func(c *registry.ConnectorInstance) { c.VersionID = v2.ID; c.ConfigRevision = 2 })
	f.wantField(f.b.Admin.PutInstance(f.ctx, switched), registry.ErrConflict, "version_id", "dropping a bound capability")
	b.Enabled, b.PolicyRevision = false, 2
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	f.must(f.b.Admin.PutInstance(f.ctx, switched))
	got, err = f.b.Admin.ConnectorInstance(f.ctx, i.ID)
	f.must(err)
	if got != switched {
		t.Fatalf("ConnectorInstance = %+v, want %+v", got, switched)
	}
	// Re-enabling the binding is refused now: the version lacks it.
	b.Enabled, b.PolicyRevision = true, 3
	f.wantField(f.b.Admin.PutBinding(f.ctx, b), registry.ErrInvalid, "capability_id", "enabling a binding the version lacks")
	_, err = f.b.Admin.ConnectorInstance(f.ctx, "cinst_missing")
	f.wantErr(err, registry.ErrNotFound, "reading a missing instance")
}

func testBindingRules(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	i := f.instance("a", v, "tenant-1")
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, registry.FleetPolicy("quota:a")))
	b := f.bind(i, "alpha.read", 3, "quota:a")
	got, err := f.b.Admin.CapabilityBinding(f.ctx, b.Key())
	f.must(err)
	if got != b {
		t.Fatalf("CapabilityBinding = %+v, want %+v", got, b)
	}
	changed := b
	changed.Priority = 1
	f.wantField(f.b.Admin.PutBinding(f.ctx, changed), registry.ErrConflict, "policy_revision", "a change without a newer policy revision")
	changed.PolicyRevision = 2
	changed.CredentialRevisionRef = "cred-rev-2"
	f.must(f.b.Admin.PutBinding(f.ctx, changed))
	got, err = f.b.Admin.CapabilityBinding(f.ctx, b.Key())
	f.must(err)
	if got != changed {
		t.Fatalf("CapabilityBinding = %+v, want %+v", got, changed)
	}
	nopol := changed
	nopol.QuotaPolicyRef, nopol.PolicyRevision = "quota:missing", 3
	f.wantField(f.b.Admin.PutBinding(f.ctx, nopol), registry.ErrNotFound, "quota_policy_ref", "a missing quota policy")
	noinst := registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: "cinst_missing", PolicyRevision: 1, Enabled: true}
	f.wantField(f.b.Admin.PutBinding(f.ctx, noinst), registry.ErrNotFound, "instance_id", "a missing instance")
	empty := registry.CapabilityBinding{TenantID: "", CapabilityID: "alpha.read", InstanceID: i.ID, PolicyRevision: 1, Enabled: true}
	f.wantField(f.b.Admin.PutBinding(f.ctx, empty), registry.ErrInvalid, "tenant_id", "a binding without a tenant")
	overRev := changed
	overRev.Priority, overRev.PolicyRevision = 2, registry.MaxRevision+1
	f.wantField(f.b.Admin.PutBinding(f.ctx, overRev), registry.ErrInvalid, "policy_revision", "a policy revision over MaxRevision")
	overRev.PolicyRevision = registry.MaxRevision
	f.must(f.b.Admin.PutBinding(f.ctx, overRev))
	_, err = f.b.Admin.CapabilityBinding(f.ctx, registry.BindingKey{TenantID: "tenant-2", CapabilityID: "alpha.read", InstanceID: i.ID})
	f.wantErr(err, registry.ErrNotFound, "reading a missing binding")
}

func testPolicyRules(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	c := registry.ConservativePolicy("quota:c")
	want := registry.AdmissionPolicy{PolicyRef: "quota:c", Revision: 1, Enabled: true, MaxGlobalInFlight: 10000, MaxTenantInFlight: 1000,
		MaxConnectorTypeInFlight: 2000, MaxInstanceInFlight: 500, MaxBindingInFlight: 250, MaxTenantRetryInFlight: 100,
		CircuitFailureThreshold: 5, CircuitOpenMS: 30000}
	if c != want {
		t.Fatalf("conservative preset = %+v, want %+v", c, want)
	}
	fl := registry.FleetPolicy("quota:f")
	want.PolicyRef, want.MaxGlobalInFlight, want.MaxConnectorTypeInFlight = "quota:f", registry.Unlimited, registry.Unlimited
	if fl != want {
		t.Fatalf("fleet preset = %+v, want %+v", fl, want)
	}
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, c))
	got, err := f.b.Admin.AdmissionPolicy(f.ctx, c.PolicyRef)
	f.must(err)
	if got != c {
		t.Fatalf("AdmissionPolicy = %+v, want %+v", got, c)
	}
	changed := c
	changed.MaxTenantInFlight = 5
	f.wantField(f.b.Admin.PutAdmissionPolicy(f.ctx, changed), registry.ErrConflict, "revision", "a change without a newer revision")
	changed.Revision = 2
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, changed))
	for _, bad := range []struct {
		field string
		mod   func(*registry.AdmissionPolicy)
	}{
		{"revision", func(p *registry.AdmissionPolicy) { p.Revision = 0 }},
		{"revision", func(p *registry.AdmissionPolicy) { p.Revision = registry.MaxRevision + 1 }},
		{"revision", func(p *registry.AdmissionPolicy) { p.Revision = math.MaxUint64 }},
		{"max_binding_in_flight", func(p *registry.AdmissionPolicy) { p.MaxBindingInFlight = 0 }},
		{"circuit_failure_threshold", func(p *registry.AdmissionPolicy) { p.CircuitFailureThreshold = 0 }},
		{"circuit_open_ms", func(p *registry.AdmissionPolicy) { p.CircuitOpenMS = 99 }},
		{"circuit_open_ms", func(p *registry.AdmissionPolicy) { p.CircuitOpenMS = 3_600_001 }},
		// Values whose conversion to a time.Duration wraps around into
		// the allowed range (1 000 + 2^58 ms and 2^63 + 1 000 ms are 1 s as
		// a Duration): refused as what they say, not as what they wrap to.
		{"circuit_open_ms", func(p *registry.AdmissionPolicy) { p.CircuitOpenMS = 1<<58 + 1_000 }},
		{"circuit_open_ms", func(p *registry.AdmissionPolicy) { p.CircuitOpenMS = 1<<63 + 1_000 }},
		{"policy_ref", func(p *registry.AdmissionPolicy) { p.PolicyRef = registry.ImplicitPolicyRef }},
		{"policy_ref", func(p *registry.AdmissionPolicy) { p.PolicyRef = "" }},
	} {
		p := registry.FleetPolicy("quota:bad")
		bad.mod(&p)
		f.wantField(f.b.Admin.PutAdmissionPolicy(f.ctx, p), registry.ErrInvalid, bad.field, "invalid policy "+bad.field)
	}
	_, err = f.b.Admin.AdmissionPolicy(f.ctx, "quota:bad")
	f.wantErr(err, registry.ErrNotFound, "reading a refused policy")
}

func testReplicaRules(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v1 := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	v2 := f.version(ct, "alpha2", registry.VersionActive, "alpha.read")
	i := f.instance("a", v1, "tenant-1")
	rev := f.revision()
	// Times are stored to the millisecond.
	r := f.replica("a1", i, func(r *registry.ConnectorReplica) {
		r.LeaseExpiresAt = f.clock.Now().Add(30*time.Second + 1234567*time.Nanosecond)
		r.Status = aip.ReplicaOffline
		r.HealthRevision = 0
	})
	if want := f.clock.Now().Add(30*time.Second + time.Millisecond); !r.LeaseExpiresAt.Equal(want) {
		t.Fatalf("lease %v, want %v (milliseconds)", r.LeaseExpiresAt, want)
	}
	wantNew := Replica("crepl_a1", i.ID, i.VersionID, r.LeaseExpiresAt)
	wantNew.Status, wantNew.HealthRevision = aip.ReplicaOffline, 0
	if !registry.ReplicaEqual(&r, &wantNew) {
		t.Fatalf("stored replica %+v, want %+v", r, wantNew)
	}
	for _, c := range []struct {
		field string
		mod   func(*registry.ConnectorReplica)
	}{
		{"instance_id", func(r *registry.ConnectorReplica) { r.InstanceID = "cinst_other" }},
		{"version_id", func(r *registry.ConnectorReplica) { r.VersionID = v2.ID }},
		{"endpoint", func(r *registry.ConnectorReplica) { r.Endpoint = "https://elsewhere.test" }},
		{"peer_principal_id", func(r *registry.ConnectorReplica) { r.PeerPrincipalID = "service:other" }},
		{"peer_principal_kind", func(r *registry.ConnectorReplica) { r.PeerPrincipalKind = aip.PrincipalAgent }},
		{"peer_did", func(r *registry.ConnectorReplica) { r.PeerDID = DID("other") }},
		{"trust_domain", func(r *registry.ConnectorReplica) { r.TrustDomain = "other.test" }},
		{"transport_profile", func(r *registry.ConnectorReplica) { r.TransportProfile = "aip.other.v1" }},
		{"topology.region", func(r *registry.ConnectorReplica) { r.Topology.Region = "eu" }},
		{"topology.zone", func(r *registry.ConnectorReplica) { r.Topology.Zone = "z9" }},
		{"topology.capacity_class", func(r *registry.ConnectorReplica) { r.Topology.CapacityClass = "large" }},
		{"health_revision", func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaReady; r.HealthRevision = 0 }},
		{"active_assignments", func(r *registry.ConnectorReplica) { r.ActiveAssignments = 1; r.HealthRevision = 5 }},
		{"circuit", func(r *registry.ConnectorReplica) { r.Circuit.ConsecutiveFailures = 2; r.HealthRevision = 5 }},
	} {
		next := r
		c.mod(&next)
		if c.field != "health_revision" && c.field != "active_assignments" && c.field != "circuit" {
			next.HealthRevision = 7
		}
		f.wantField(f.b.Admin.PutReplica(f.ctx, next), registry.ErrConflict, c.field, "changing "+c.field)
	}
	// Status, lease, capacity and request fields change with a newer health
	// revision, without moving the catalog.
	next := r
	next.Status, next.LeaseExpiresAt, next.Capacity, next.HealthRevision = aip.ReplicaReady, f.clock.Now().Add(time.Minute), 8, 1
	next.LastControlRequestID, next.LastControlRequestDigest = aip.NewMessageID(), Digest("request")
	f.must(f.b.Admin.PutReplica(f.ctx, next))
	if got := f.getReplica(r.ID); !registry.ReplicaEqual(&got, &next) {
		t.Fatalf("stored replica %+v, want %+v", got, next)
	}
	f.must(f.b.Admin.PutReplica(f.ctx, next)) // identical: no-op
	over := next
	over.HealthRevision = registry.MaxRevision + 1
	f.wantField(f.b.Admin.PutReplica(f.ctx, over), registry.ErrInvalid, "health_revision", "a health revision over MaxRevision")
	if got := f.revision(); got != rev {
		t.Fatalf("replica writes moved the catalog revision to %d, want %d", got, rev)
	}
	for _, c := range []struct {
		field  string
		target error
		mod    func(*registry.ConnectorReplica)
	}{
		{"version_id", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.VersionID = v2.ID }},
		{"active_assignments", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.ActiveAssignments = 1 }},
		{"instance_id", registry.ErrNotFound, func(r *registry.ConnectorReplica) { r.InstanceID = "cinst_missing" }},
		{"endpoint", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.Endpoint = "ftp://x.test" }},
		{"endpoint", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.Endpoint = "/relative" }},
		{"peer_did", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.PeerDID = "did:web:example.test" }},
		{"topology.zone", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.Topology.Zone = "zone 1" }},
		{"capacity", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.Capacity = 0 }},
		{"status", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.Status = "sleeping" }},
		{"last_control_request_id", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.LastControlRequestID = "msg_x" }},
		{"last_control_request_digest", registry.ErrInvalid, func(r *registry.ConnectorReplica) {
			r.LastControlRequestID, r.LastControlRequestDigest = "msg_x", "sha256:zz"
		}},
		{"id", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.ID = "replica-1" }},
		{"health_revision", registry.ErrInvalid, func(r *registry.ConnectorReplica) { r.HealthRevision = registry.MaxRevision + 1 }},
	} {
		nr := Replica("crepl_new", i.ID, i.VersionID, f.clock.Now().Add(time.Minute))
		c.mod(&nr)
		f.wantField(f.b.Admin.PutReplica(f.ctx, nr), c.target, c.field, "new replica with bad "+c.field)
	}
	_, err := f.b.Admin.ConnectorReplica(f.ctx, "crepl_new")
	f.wantErr(err, registry.ErrNotFound, "reading a refused replica")
}

func testCopies(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	got, err := f.b.Admin.ConnectorVersion(f.ctx, v.ID)
	f.must(err)
	got.Manifest.Capabilities[0].InputSchema[0] = '['
	got.Manifest.Profiles[0] = "changed"
	got.Attestation.SupportedAIPVersions[0] = "changed"
	again, err := f.b.Admin.ConnectorVersion(f.ctx, v.ID)
	f.must(err)
	if !json.Valid(again.Manifest.Capabilities[0].InputSchema) || again.Manifest.Profiles[0] != aip.NativeHTTPProfile || !again.SameRelease(&v) {
		t.Fatal("changing a returned version changed the stored one")
	}
	i := f.instance("a", v, "tenant-1")
	f.bind(i, "alpha.read", 0, "")
	p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 5}, registry.ForTenant("tenant-1"))
	f.must(err)
	p.Capabilities[0].Capability.InputSchema[0] = '['
	r, err := f.b.Catalog.Capability(f.ctx, "alpha.read", registry.ForTenant("tenant-1"))
	f.must(err)
	if !json.Valid(r.Definition.Capability.InputSchema) {
		t.Fatal("changing a returned definition changed the stored one")
	}
}
