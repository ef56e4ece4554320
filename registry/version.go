package registry

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// SDKVersion is the version of the aipfleet connector SDK this registry
// admits artifacts for: an attestation's SDKVersionRequirement must match it.
const SDKVersion = "1.0.0"

// SupportedAIPVersion must be listed in every attestation's
// SupportedAIPVersions.
const SupportedAIPVersion = "1.0"

// EvidenceStatus is the verdict of one supply-chain evaluation.
type EvidenceStatus string

// Evidence statuses.
const (
	EvidenceNotEvaluated EvidenceStatus = "not_evaluated"
	EvidencePassed       EvidenceStatus = "passed"
	EvidenceFailed       EvidenceStatus = "failed"
)

// Valid reports whether s is a known status.
func (s EvidenceStatus) Valid() bool {
	return s == EvidenceNotEvaluated || s == EvidencePassed || s == EvidenceFailed
}

// ArtifactAttestation is the supply-chain evidence bound to a connector
// version: digests of the artifact and of every evidence document, the
// signature reference, the signer and owner, the AIP and SDK versions the
// artifact supports, and the verdicts of the four policy evaluations.
type ArtifactAttestation struct {
	ArtifactDigest            string         `json:"artifact_digest"`
	SchemaBundleDigest        string         `json:"schema_bundle_digest"`
	SBOMDigest                string         `json:"sbom_digest"`
	ProvenanceDigest          string         `json:"provenance_digest"`
	ConformanceReportDigest   string         `json:"conformance_report_digest"`
	VulnerabilityReportDigest string         `json:"vulnerability_report_digest"`
	LicenseReportDigest       string         `json:"license_report_digest"`
	SignatureRef              string         `json:"signature_ref"`
	SignerIdentity            string         `json:"signer_identity"`
	Owner                     string         `json:"owner"`
	SupportedAIPVersions      []string       `json:"supported_aip_versions"`
	SDKVersionRequirement     string         `json:"sdk_version_requirement"`
	ConformanceStatus         EvidenceStatus `json:"conformance_status"`
	VulnerabilityPolicyStatus EvidenceStatus `json:"vulnerability_policy_status"`
	LicensePolicyStatus       EvidenceStatus `json:"license_policy_status"`
	RevocationStatus          EvidenceStatus `json:"revocation_status"`
}

// Qualify checks that the attestation qualifies the manifest for the supply
// chain: well-formed digests and references, AIP 1.0 support, an SDK
// requirement SDKVersion satisfies, every verdict passed, and a schema bundle
// digest equal to SchemaBundleDigest(manifest). Shape errors match
// ErrInvalid; unqualified evidence matches ErrAdmission.
func (a *ArtifactAttestation) Qualify(versionID string, m *aip.Manifest) error {
	const r = RecordConnectorVersion
	digests := []struct{ field, v string }{
		{"attestation.artifact_digest", a.ArtifactDigest},
		{"attestation.schema_bundle_digest", a.SchemaBundleDigest},
		{"attestation.sbom_digest", a.SBOMDigest},
		{"attestation.provenance_digest", a.ProvenanceDigest},
		{"attestation.conformance_report_digest", a.ConformanceReportDigest},
		{"attestation.vulnerability_report_digest", a.VulnerabilityReportDigest},
		{"attestation.license_report_digest", a.LicenseReportDigest},
	}
	for _, d := range digests {
		if err := aip.ValidateDigest(d.v); err != nil {
			return invalid(r, versionID, d.field, "%v", err)
		}
	}
	for _, f := range []struct{ field, v string }{
		{"attestation.signature_ref", a.SignatureRef},
		{"attestation.signer_identity", a.SignerIdentity},
		{"attestation.owner", a.Owner},
	} {
		if f.v == "" || len(f.v) > 4*MaxIdentifierBytes {
			return invalid(r, versionID, f.field, "must be 1 to %d bytes", 4*MaxIdentifierBytes)
		}
		if err := checkPrintable(r, versionID, f.field, f.v); err != nil {
			return err
		}
	}
	if !slices.Contains(a.SupportedAIPVersions, SupportedAIPVersion) {
		return refused(r, versionID, "attestation.supported_aip_versions", "must include %q", SupportedAIPVersion)
	}
	ok, err := MatchVersionRequirement(a.SDKVersionRequirement, SDKVersion)
	if err != nil {
		return invalid(r, versionID, "attestation.sdk_version_requirement", "%v", err)
	}
	if !ok {
		return refused(r, versionID, "attestation.sdk_version_requirement", "%q does not admit SDK version %s", a.SDKVersionRequirement, SDKVersion)
	}
	for _, s := range []struct {
		field string
		v     EvidenceStatus
	}{
		{"attestation.conformance_status", a.ConformanceStatus},
		{"attestation.vulnerability_policy_status", a.VulnerabilityPolicyStatus},
		{"attestation.license_policy_status", a.LicensePolicyStatus},
		{"attestation.revocation_status", a.RevocationStatus},
	} {
		if !s.v.Valid() {
			return invalid(r, versionID, s.field, "unknown status %q (want not_evaluated, passed or failed)", s.v)
		}
		if s.v != EvidencePassed {
			return refused(r, versionID, s.field, "is %s; only passed evidence qualifies a version", s.v)
		}
	}
	bundle, err := SchemaBundleDigest(m)
	if err != nil {
		return invalid(r, versionID, "manifest", "%v", err)
	}
	if bundle != a.SchemaBundleDigest {
		return refused(r, versionID, "attestation.schema_bundle_digest", "%s does not match the manifest's schemas (%s)", a.SchemaBundleDigest, bundle)
	}
	return nil
}

// SchemaBundleDigest returns the digest of {"schemas": [{"capability_id",
// "input", "output"}, ...]} over the manifest's capabilities in order, with a
// missing output schema as null.
func SchemaBundleDigest(m *aip.Manifest) (string, error) {
	type entry struct {
		CapabilityID string          `json:"capability_id"`
		Input        json.RawMessage `json:"input"`
		Output       json.RawMessage `json:"output"`
	}
	schemas := make([]entry, len(m.Capabilities))
	for i, c := range m.Capabilities {
		out := c.OutputSchema
		if len(out) == 0 {
			out = json.RawMessage("null")
		}
		schemas[i] = entry{CapabilityID: c.ID, Input: c.InputSchema, Output: out}
	}
	return aip.Digest(map[string]any{"schemas": schemas})
}

// ConnectorVersion binds a connector type to one immutable artifact: its
// manifest (capabilities and profiles), manifest digest, attestation and
// implementation-support claims. Only Status changes after admission.
// AdmittedAt is set by the registry's clock.
type ConnectorVersion struct {
	ID                    string                               `json:"id"`
	ConnectorTypeID       string                               `json:"connector_type_id"`
	Version               string                               `json:"version"`
	Status                VersionStatus                        `json:"status"`
	Manifest              aip.Manifest                         `json:"manifest"`
	ManifestDigest        string                               `json:"manifest_digest"`
	Attestation           ArtifactAttestation                  `json:"attestation"`
	ImplementationSupport map[string]aip.ImplementationSupport `json:"implementation_support"`
	AdmittedAt            time.Time                            `json:"admitted_at,omitzero"`
}

// Implements reports whether the version's manifest declares the capability.
func (v *ConnectorVersion) Implements(capabilityID string) bool {
	_, ok := v.Manifest.Capability(capabilityID)
	return ok
}

// SupportsProfile reports whether the manifest lists the profile.
func (v *ConnectorVersion) SupportsProfile(profile string) bool {
	return slices.Contains(v.Manifest.Profiles, profile)
}

// SameRelease reports whether two versions carry the same immutable content:
// everything except Status and AdmittedAt.
func (v *ConnectorVersion) SameRelease(o *ConnectorVersion) bool {
	if v.ID != o.ID || v.ConnectorTypeID != o.ConnectorTypeID || v.Version != o.Version || v.ManifestDigest != o.ManifestDigest {
		return false
	}
	a, errA := aip.CanonicalJSON(struct {
		A ArtifactAttestation                  `json:"a"`
		I map[string]aip.ImplementationSupport `json:"i"`
	}{v.Attestation, v.ImplementationSupport})
	b, errB := aip.CanonicalJSON(struct {
		A ArtifactAttestation                  `json:"a"`
		I map[string]aip.ImplementationSupport `json:"i"`
	}{o.Attestation, o.ImplementationSupport})
	return errA == nil && errB == nil && string(a) == string(b)
}

// ReleaseDifference names the first field, by its fleet-file name, in
// which next's immutable content differs from stored's, and the two values
// ("stored ..., here ..."). It returns "" when it finds none; SameRelease
// decides whether two versions differ, this only says where.
func ReleaseDifference(stored, next *ConnectorVersion) (field, values string) {
	q := func(s string) string { return strconv.Quote(truncate(s)) }
	switch {
	case stored.ConnectorTypeID != next.ConnectorTypeID:
		return "connector_type_id", "stored " + q(stored.ConnectorTypeID) + ", here " + q(next.ConnectorTypeID)
	case stored.Version != next.Version:
		return "version", "stored " + q(stored.Version) + ", here " + q(next.Version)
	case stored.ManifestDigest != next.ManifestDigest:
		return "manifest", "the admitted manifest's digest is " + stored.ManifestDigest + ", this one's " + next.ManifestDigest
	}
	sa, na := reflect.ValueOf(stored.Attestation), reflect.ValueOf(next.Attestation)
	for i := range sa.NumField() {
		a, b := sa.Field(i).Interface(), na.Field(i).Interface()
		if reflect.DeepEqual(a, b) {
			continue
		}
		name, _, _ := strings.Cut(sa.Type().Field(i).Tag.Get("json"), ",")
		if x, ok := a.([]string); ok {
			return "attestation." + name, fmt.Sprintf("stored %v, here %v", x, b)
		}
		return "attestation." + name, "stored " + q(fmt.Sprint(a)) + ", here " + q(fmt.Sprint(b))
	}
	caps := slices.Sorted(maps.Keys(stored.ImplementationSupport))
	for c := range next.ImplementationSupport {
		if _, ok := stored.ImplementationSupport[c]; !ok {
			caps = append(caps, c)
		}
	}
	slices.Sort(caps)
	for _, c := range caps {
		a, inA := stored.ImplementationSupport[c]
		b, inB := next.ImplementationSupport[c]
		if a == b && inA == inB {
			continue
		}
		claims := func(s aip.ImplementationSupport, ok bool) string {
			if !ok {
				return "no claim"
			}
			return fmt.Sprint(SupportFeatureNames(s))
		}
		return "implementation_support." + c, "stored " + claims(a, inA) + ", here " + claims(b, inB)
	}
	return "", ""
}

// Clone returns a deep copy.
func (v ConnectorVersion) Clone() ConnectorVersion {
	v.Manifest = cloneManifest(v.Manifest)
	v.Attestation.SupportedAIPVersions = slices.Clone(v.Attestation.SupportedAIPVersions)
	v.ImplementationSupport = maps.Clone(v.ImplementationSupport)
	return v
}

// PreparedVersion is a validated version with its capability definitions
// (in manifest order) and their canonical JSON sizes, ready to store.
type PreparedVersion struct {
	Version     ConnectorVersion
	Definitions []CapabilityDefinition
	Sizes       []int
}

// PrepareVersion validates a version for admission without looking at other
// records: identifiers, status (any but revoked), limits, the manifest and its
// digest, its agent ID (held to the rule of a replica's peer_principal_id,
// which every replica of the version must set to it), implementation claims
// for every capability and their consistency with the contracts, and the
// attestation's qualification. The owner check
// against the connector type, the type's state and the uniqueness rules are
// the backend's. The returned version is a deep copy.
func PrepareVersion(v ConnectorVersion, l Limits) (PreparedVersion, error) {
	const r = RecordConnectorVersion
	l = l.WithDefaults()
	v = v.Clone()
	id := v.ID
	if err := checkPrefixedID(r, id, "id", v.ID, aip.PrefixVersion); err != nil {
		return PreparedVersion{}, err
	}
	if err := checkPrefixedID(r, id, "connector_type_id", v.ConnectorTypeID, aip.PrefixType); err != nil {
		return PreparedVersion{}, err
	}
	if err := checkIdent(r, id, "version", v.Version); err != nil {
		return PreparedVersion{}, err
	}
	switch v.Status {
	case VersionCandidate, VersionAdmitted, VersionActive:
	case VersionRevoked:
		return PreparedVersion{}, invalid(r, id, "status", "a version cannot be admitted as revoked")
	default:
		return PreparedVersion{}, invalid(r, id, "status", "unknown status %q (want candidate, admitted or active)", v.Status)
	}
	m := &v.Manifest
	// AIP's own rules only: manifest_version and the contracts are a
	// host's rules for the manifest it binds (aip.Manifest.Validate), and
	// a version another implementation's host bound must still admit.
	if err := m.ValidateShape(); err != nil {
		return PreparedVersion{}, invalid(r, id, "manifest", "%v", err)
	}
	if m.Agent.DID != "" {
		return PreparedVersion{}, invalid(r, id, "manifest.agent.did", "must be empty: every replica of a version shares its manifest and has its own DID")
	}
	if err := checkAgentID(id, m.Agent.ID); err != nil {
		return PreparedVersion{}, err
	}
	if len(m.Capabilities) == 0 {
		return PreparedVersion{}, invalid(r, id, "manifest.capabilities", "a version must offer at least one capability")
	}
	if len(m.Capabilities) > l.MaxCapabilitiesPerVersion {
		return PreparedVersion{}, invalid(r, id, "manifest.capabilities", "%d capabilities exceed the limit of %d per version", len(m.Capabilities), l.MaxCapabilitiesPerVersion)
	}
	for i, p := range m.Profiles {
		if err := checkIdent(r, id, "manifest.profiles["+strconv.Itoa(i)+"]", p); err != nil {
			return PreparedVersion{}, err
		}
	}
	canonical, err := aip.CanonicalJSON(m)
	if err != nil {
		return PreparedVersion{}, invalid(r, id, "manifest", "%v", err)
	}
	if len(canonical) > l.MaxManifestBytes {
		return PreparedVersion{}, invalid(r, id, "manifest", "%d bytes of canonical JSON exceed the limit of %d", len(canonical), l.MaxManifestBytes)
	}
	if jsonHasNUL(canonical) {
		field := "manifest"
		for i := range m.Capabilities {
			if b, err := aip.CanonicalJSON(&m.Capabilities[i]); err == nil && jsonHasNUL(b) {
				field = "manifest.capabilities[" + strconv.Itoa(i) + "]"
				break
			}
		}
		return PreparedVersion{}, invalid(r, id, field, "holds a NUL character (\\u0000), which the registry cannot store; remove it")
	}
	digest := aip.DigestBytes(canonical)
	if v.ManifestDigest != digest {
		return PreparedVersion{}, invalid(r, id, "manifest_digest", "%q does not match the manifest (%s)", truncate(v.ManifestDigest), digest)
	}
	p := PreparedVersion{Definitions: make([]CapabilityDefinition, len(m.Capabilities)), Sizes: make([]int, len(m.Capabilities))}
	for i := range m.Capabilities {
		c := &m.Capabilities[i]
		field := "manifest.capabilities[" + strconv.Itoa(i) + "]"
		if err := checkIdent(r, id, field+".id", c.ID); err != nil {
			return PreparedVersion{}, err
		}
		d, err := NewCapabilityDefinition(*c)
		if err != nil {
			return PreparedVersion{}, invalid(r, id, field, "%v", err)
		}
		size, err := DefinitionSize(&d)
		if err != nil {
			return PreparedVersion{}, invalid(r, id, field, "%v", err)
		}
		if size > l.MaxCapabilityBytes {
			return PreparedVersion{}, invalid(r, id, field, "capability %s is %d bytes of canonical JSON, over the limit of %d", c.ID, size, l.MaxCapabilityBytes)
		}
		p.Definitions[i], p.Sizes[i] = d, size
		claim, ok := v.ImplementationSupport[c.ID]
		if !ok {
			return PreparedVersion{}, invalid(r, id, "implementation_support", "has no claim for capability %s; every capability needs one", c.ID)
		}
		if err := checkClaim(id, c, claim); err != nil {
			return PreparedVersion{}, err
		}
	}
	for capID := range v.ImplementationSupport {
		if _, ok := m.Capability(capID); !ok {
			return PreparedVersion{}, invalid(r, id, "implementation_support", "claims capability %s, which the manifest does not declare", capID)
		}
	}
	if err := v.Attestation.Qualify(id, m); err != nil {
		return PreparedVersion{}, err
	}
	v.AdmittedAt = Millis(v.AdmittedAt)
	p.Version = v
	return p, nil
}

// supportNeed is one implementation claim a capability requires, and why.
type supportNeed struct {
	what, because string
	claim         func(*aip.ImplementationSupport) *bool
}

// supportNeeds lists, in the order checkClaim reports them, the claims
// capability c requires: invocation always, and a feature for every promise
// of its approval flag and contract. It is the one statement of the
// admission rule; RequiredSupport and checkClaim both read it.
func supportNeeds(c *aip.Capability) []supportNeed {
	needs := []supportNeed{{"invocation", "every admitted capability is callable", func(s *aip.ImplementationSupport) *bool { return &s.Invocation }}}
	add := func(cond bool, what, because string, claim func(*aip.ImplementationSupport) *bool) {
		if cond {
			needs = append(needs, supportNeed{what, because, claim})
		}
	}
	approval := func(s *aip.ImplementationSupport) *bool { return &s.Approval }
	add(c.RequiresHumanApproval != nil && *c.RequiresHumanApproval, "approval", "the capability requires human approval", approval)
	k := c.Contract
	if k == nil {
		return needs
	}
	add(k.Execution.SupportsCancel, "cancellation", "the contract supports cancel", func(s *aip.ImplementationSupport) *bool { return &s.Cancellation })
	add(k.Execution.SupportsStreaming, "streaming", "the contract supports streaming", func(s *aip.ImplementationSupport) *bool { return &s.Streaming })
	add(k.Execution.SupportsRetry, "retry", "the contract supports retry", func(s *aip.ImplementationSupport) *bool { return &s.Retry })
	add(len(k.Approval) > 0 && string(k.Approval) != "null", "approval", "the contract has an approval policy", approval)
	add(k.Credentials != nil && k.Credentials.Required, "credentials", "the contract requires credentials", func(s *aip.ImplementationSupport) *bool { return &s.Credentials })
	add(k.Compensation != nil && (k.Compensation.Mode == aip.CompensationSupported || k.Compensation.Mode == aip.CompensationBestEffort),
		"compensation", "the contract offers compensation", func(s *aip.ImplementationSupport) *bool { return &s.Compensation })
	if k.Transaction != nil {
		for _, mode := range k.Transaction.SupportedModes {
			switch mode {
			case aip.TxExecute, aip.TxRollbackUnsupported:
			case aip.TxReconcile:
				add(true, "reconciliation", "the contract supports the reconcile transaction mode", func(s *aip.ImplementationSupport) *bool { return &s.Reconciliation })
			default:
				add(true, "transaction", "the contract supports the "+string(mode)+" transaction mode", func(s *aip.ImplementationSupport) *bool { return &s.Transaction })
			}
		}
	}
	return needs
}

// RequiredSupport returns the least implementation claim the registry admits
// for capability c: invocation, plus the feature of every promise its
// approval flag and contract make (cancel, streaming, retry, approval,
// credentials, compensation, and the transaction modes beyond execute:
// reconcile needs reconciliation, the others transaction). A claim may add
// features; one that lacks any of these is refused.
func RequiredSupport(c *aip.Capability) aip.ImplementationSupport {
	var s aip.ImplementationSupport
	for _, n := range supportNeeds(c) {
		*n.claim(&s) = true
	}
	return s
}

// checkClaim checks that an implementation claim covers what the capability's
// contract promises.
func checkClaim(id string, c *aip.Capability, s aip.ImplementationSupport) error {
	for _, n := range supportNeeds(c) {
		if !*n.claim(&s) {
			return invalid(RecordConnectorVersion, id, "implementation_support."+c.ID, "must claim %s because %s", n.what, n.because)
		}
	}
	return nil
}

// DefinitionSize returns the canonical JSON size of a definition, the unit of
// the page byte budget.
func DefinitionSize(d *CapabilityDefinition) (int, error) {
	b, err := aip.CanonicalJSON(d)
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// MatchVersionRequirement reports whether version (MAJOR.MINOR.PATCH)
// satisfies a Cargo-style requirement: comma-separated comparators, each one
// of "*", "=V", "^V", "~V", ">V", ">=V", "<V", "<=V" or a bare V (same as
// ^V), where V has one to three numeric parts. Pre-release tags are not
// supported.
func MatchVersionRequirement(req, version string) (bool, error) {
	v, n, err := parseSemver(version)
	if err != nil || n != 3 {
		return false, fmt.Errorf("version %q is not MAJOR.MINOR.PATCH", version)
	}
	req = strings.TrimSpace(req)
	if req == "" {
		return false, fmt.Errorf("the requirement is empty; write for example \"^1.0\"")
	}
	for part := range strings.SplitSeq(req, ",") {
		part = strings.TrimSpace(part)
		if part == "*" {
			continue
		}
		op := ""
		for _, o := range []string{">=", "<=", ">", "<", "=", "^", "~"} {
			if strings.HasPrefix(part, o) {
				op, part = o, strings.TrimSpace(part[len(o):])
				break
			}
		}
		c, parts, err := parseSemver(part)
		if err != nil {
			return false, fmt.Errorf("comparator %q: %v", part, err)
		}
		lo, hi := versionRange(op, c, parts)
		if compareSemver(v, lo) < 0 || (hi != nil && compareSemver(v, *hi) >= 0) {
			return false, nil
		}
	}
	return true, nil
}

type semver [3]uint64

func parseSemver(s string) (semver, int, error) {
	var v semver
	fields := strings.Split(s, ".")
	if s == "" || len(fields) > 3 {
		return v, 0, fmt.Errorf("%q is not a version of one to three numeric parts", s)
	}
	for i, f := range fields {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return v, 0, fmt.Errorf("%q is not a version of one to three numeric parts", s)
		}
		v[i] = n
	}
	return v, len(fields), nil
}

func compareSemver(a, b semver) int {
	for i := range a {
		if a[i] != b[i] {
			if a[i] < b[i] {
				return -1
			}
			return 1
		}
	}
	return 0
}

// versionRange returns [lo, hi) for a comparator; hi nil means unbounded.
func versionRange(op string, c semver, parts int) (lo semver, hi *semver) {
	bump := func(i int) *semver {
		var n semver
		copy(n[:i], c[:i])
		n[i] = c[i] + 1
		return &n
	}
	zero := semver{}
	switch op {
	case "", "^":
		switch {
		case c[0] > 0 || parts == 1:
			return c, bump(0)
		case c[1] > 0 || parts == 2:
			return c, bump(1)
		default:
			return c, bump(2)
		}
	case "~":
		if parts == 1 {
			return c, bump(0)
		}
		return c, bump(1)
	case "=":
		return c, bump(parts - 1)
	case ">=":
		return c, nil
	case ">":
		return *bump(parts - 1), nil
	case "<":
		return zero, &c
	case "<=":
		return zero, bump(parts - 1)
	}
	return c, nil
}

// jsonHasNUL reports whether JSON text b holds the escape \u0000 (a NUL in
// a string or key), which PostgreSQL's jsonb and text refuse: a backslash
// that starts an escape is preceded by an even number of backslashes.
func jsonHasNUL(b []byte) bool {
	for i := 0; ; i++ {
		j := bytes.Index(b[i:], []byte(`\u0000`))
		if j < 0 {
			return false
		}
		i += j
		n := 0
		for k := i - 1; k >= 0 && b[k] == '\\'; k-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
	}
}
