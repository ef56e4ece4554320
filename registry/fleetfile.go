package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/netip"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/aip"
)

// FleetFileFormat is the required value of a fleet file's format field.
const FleetFileFormat = "aipfleet.fleet/v1"

// MaxFleetFileBytes bounds a fleet file.
const MaxFleetFileBytes = 64 << 20

// FleetFile is a declarative description of registry state: admission
// policies, connector types, versions with their manifests, instances,
// capability bindings and pre-provisioned replicas. ParseFleetFile reads the
// YAML form documented in docs/fleet-file.md; Apply applies it.
type FleetFile struct {
	Policies  []AdmissionPolicy
	Types     []ConnectorType
	Versions  []ConnectorVersion
	Instances []ConnectorInstance
	Bindings  []CapabilityBinding
	Replicas  []ConnectorReplica
}

// Fleet file sections, as named in the YAML and in errors and reports.
const (
	SectionPolicies  = "policies"
	SectionTypes     = "types"
	SectionVersions  = "versions"
	SectionInstances = "instances"
	SectionBindings  = "bindings"
	SectionReplicas  = "replicas"
)

// FleetFileError names the fleet file entry (section, index and identity)
// and field an error is about. It unwraps to the underlying error, so
// errors.Is(err, ErrInvalid), errors.Is(err, ErrConflict) and the like
// work.
//
// Its text is one sentence for the person who wrote the file: the file
// (File, when the program that read it set it), the entry, its line, then
// the field and what is wrong with it, without the sentinel's text
// ("registry: invalid: "), which says nothing the reason does not:
//
//	fleet file fleet.yaml: instances[0] cinst_acme_echo (line 12): config_revision is required; raise it with every change to the instance
type FleetFileError struct {
	// File is the file's name as the person who gave it wrote it; ""
	// leaves it out. ParseFleetFile and Apply, which see only the
	// file's content, leave it empty for the program that read the
	// file to set.
	File    string
	Section string // a Section constant; "" for the file as a whole
	Index   int    // the entry's position in its section
	ID      string // the entry's identity, when it has one
	Field   string // the field, dotted for nested fields; "" for the entry
	Line    int    // the entry's (or field's) line in the file; 0 if unknown
	Err     error
}

// Error implements error.
func (e *FleetFileError) Error() string {
	var b strings.Builder
	b.WriteString("fleet file")
	if e.File != "" {
		b.WriteString(" " + e.File)
	}
	if e.Section != "" {
		fmt.Fprintf(&b, ": %s[%d]", e.Section, e.Index)
		if e.ID != "" {
			b.WriteString(" " + e.ID)
		}
	}
	if e.Line > 0 {
		fmt.Fprintf(&b, " (line %d)", e.Line)
	}
	field, msg := e.Field, e.Err.Error()
	var fe *FieldError
	if errors.As(e.Err, &fe) {
		// The reason alone: the record and the field are said above.
		msg = fe.Reason
		if field == "" {
			field = fe.Field
		}
	}
	b.WriteString(": ")
	if field != "" {
		b.WriteString(field)
		if readsOn(msg) {
			b.WriteString(" ")
		} else {
			b.WriteString(": ")
		}
	}
	return b.String() + msg
}

// readsOn reports whether reason continues a sentence whose subject is
// the field: it starts with a verb ("is required", "must be a mapping"),
// or with the field's value followed by one (`"eu west 1b" must be ...`,
// "1 is not newer than ..."). Other reasons ("unknown field; ...") follow
// the field after a colon.
func readsOn(reason string) bool {
	if reason == "" {
		return false
	}
	if c := reason[0]; c == '"' || c >= '0' && c <= '9' {
		return true
	}
	for _, verb := range []string{"is ", "are ", "must ", "has ", "differs ", "does ", "changes "} {
		if strings.HasPrefix(reason, verb) {
			return true
		}
	}
	return false
}

// Unwrap returns the underlying error.
func (e *FleetFileError) Unwrap() error { return e.Err }

// ---------------------------------------------------------------- YAML form

type yamlFile struct {
	Format    string      `yaml:"format"`
	Policies  []yaml.Node `yaml:"policies"`
	Types     []yaml.Node `yaml:"types"`
	Versions  []yaml.Node `yaml:"versions"`
	Instances []yaml.Node `yaml:"instances"`
	Bindings  []yaml.Node `yaml:"bindings"`
	Replicas  []yaml.Node `yaml:"replicas"`
}

// yamlLimit is an admission limit: a positive integer or "unlimited".
type yamlLimit struct {
	set bool
	v   uint32
}

func (l *yamlLimit) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && n.Value == "unlimited" {
		*l = yamlLimit{set: true, v: Unlimited}
		return nil
	}
	var v uint64
	if err := n.Decode(&v); err != nil || n.Tag == "!!float" || v == 0 || v >= uint64(Unlimited) {
		return fmt.Errorf("%q must be an integer from 1 to %d, or unlimited", n.Value, Unlimited-1)
	}
	*l = yamlLimit{set: true, v: uint32(v)}
	return nil
}

type yamlPolicy struct {
	PolicyRef                string    `yaml:"policy_ref"`
	Preset                   string    `yaml:"preset,omitempty"`
	Revision                 uint64    `yaml:"revision"`
	Enabled                  *bool     `yaml:"enabled,omitempty"`
	MaxGlobalInFlight        yamlLimit `yaml:"max_global_in_flight"`
	MaxTenantInFlight        yamlLimit `yaml:"max_tenant_in_flight"`
	MaxConnectorTypeInFlight yamlLimit `yaml:"max_connector_type_in_flight"`
	MaxInstanceInFlight      yamlLimit `yaml:"max_instance_in_flight"`
	MaxBindingInFlight       yamlLimit `yaml:"max_binding_in_flight"`
	MaxTenantRetryInFlight   yamlLimit `yaml:"max_tenant_retry_in_flight"`
	CircuitFailureThreshold  yamlLimit `yaml:"circuit_failure_threshold"`
	CircuitOpenMS            *uint64   `yaml:"circuit_open_ms"`
}

type yamlType struct {
	ID      string `yaml:"id"`
	Name    string `yaml:"name"`
	Owner   string `yaml:"owner"`
	Enabled *bool  `yaml:"enabled,omitempty"`
}

// yamlAttestation is ArtifactAttestation with YAML names: the same fields,
// in the same order and of the same types, so each converts to the other.
type yamlAttestation struct {
	ArtifactDigest            string         `yaml:"artifact_digest"`
	SchemaBundleDigest        string         `yaml:"schema_bundle_digest,omitempty"`
	SBOMDigest                string         `yaml:"sbom_digest"`
	ProvenanceDigest          string         `yaml:"provenance_digest"`
	ConformanceReportDigest   string         `yaml:"conformance_report_digest"`
	VulnerabilityReportDigest string         `yaml:"vulnerability_report_digest"`
	LicenseReportDigest       string         `yaml:"license_report_digest"`
	SignatureRef              string         `yaml:"signature_ref"`
	SignerIdentity            string         `yaml:"signer_identity"`
	Owner                     string         `yaml:"owner"`
	SupportedAIPVersions      []string       `yaml:"supported_aip_versions,flow"`
	SDKVersionRequirement     string         `yaml:"sdk_version_requirement"`
	ConformanceStatus         EvidenceStatus `yaml:"conformance_status"`
	VulnerabilityPolicyStatus EvidenceStatus `yaml:"vulnerability_policy_status"`
	LicensePolicyStatus       EvidenceStatus `yaml:"license_policy_status"`
	RevocationStatus          EvidenceStatus `yaml:"revocation_status"`
}

type yamlVersion struct {
	ID                    string                  `yaml:"id"`
	ConnectorTypeID       string                  `yaml:"connector_type_id"`
	Version               string                  `yaml:"version"`
	Status                string                  `yaml:"status"`
	ManifestDigest        string                  `yaml:"manifest_digest,omitempty"`
	Manifest              yaml.Node               `yaml:"manifest"`
	ImplementationSupport map[string]yamlFeatures `yaml:"implementation_support"`
	Attestation           yamlAttestation         `yaml:"attestation"`
}

// yamlFeatures is one capability's implementation-support feature names.
type yamlFeatures []string

// MarshalYAML writes the names as a flow sequence, [invocation, retry].
func (f yamlFeatures) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, name := range f {
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: name})
	}
	return n, nil
}

type yamlInstance struct {
	ID                string  `yaml:"id"`
	ConnectorTypeID   string  `yaml:"connector_type_id"`
	VersionID         string  `yaml:"version_id"`
	TenantID          string  `yaml:"tenant_id"`
	ConfigRevision    *uint64 `yaml:"config_revision"`
	SecretProviderRef string  `yaml:"secret_provider_ref"`
	Status            string  `yaml:"status,omitempty"`
}

type yamlBinding struct {
	TenantID              string  `yaml:"tenant_id"`
	CapabilityID          string  `yaml:"capability_id"`
	InstanceID            string  `yaml:"instance_id"`
	Priority              uint32  `yaml:"priority,omitempty"`
	PolicyRevision        *uint64 `yaml:"policy_revision"`
	CredentialRevisionRef string  `yaml:"credential_revision_ref,omitempty"`
	QuotaPolicyRef        string  `yaml:"quota_policy_ref,omitempty"`
	Enabled               *bool   `yaml:"enabled,omitempty"`
}

type yamlTopology struct {
	Region        string `yaml:"region,omitempty"`
	Zone          string `yaml:"zone,omitempty"`
	CapacityClass string `yaml:"capacity_class,omitempty"`
}

type yamlReplica struct {
	ID                string       `yaml:"id"`
	InstanceID        string       `yaml:"instance_id"`
	VersionID         string       `yaml:"version_id,omitempty"`
	Endpoint          string       `yaml:"endpoint"`
	PeerPrincipalID   string       `yaml:"peer_principal_id"`
	PeerPrincipalKind string       `yaml:"peer_principal_kind,omitempty"`
	PeerDID           string       `yaml:"peer_did"`
	TrustDomain       string       `yaml:"trust_domain"`
	TransportProfile  string       `yaml:"transport_profile,omitempty"`
	Topology          yamlTopology `yaml:"topology,omitempty"`
	Capacity          uint32       `yaml:"capacity"`
}

// supportFeature is an implementation-support feature name in a fleet file
// and the claim it sets.
type supportFeature struct {
	name  string
	claim func(*aip.ImplementationSupport) *bool
}

// supportFeatures lists the features in the order MarshalFleetFile writes
// them.
var supportFeatures = []supportFeature{
	{"invocation", func(s *aip.ImplementationSupport) *bool { return &s.Invocation }},
	{"cancellation", func(s *aip.ImplementationSupport) *bool { return &s.Cancellation }},
	{"streaming", func(s *aip.ImplementationSupport) *bool { return &s.Streaming }},
	{"retry", func(s *aip.ImplementationSupport) *bool { return &s.Retry }},
	{"transaction", func(s *aip.ImplementationSupport) *bool { return &s.Transaction }},
	{"reconciliation", func(s *aip.ImplementationSupport) *bool { return &s.Reconciliation }},
	{"compensation", func(s *aip.ImplementationSupport) *bool { return &s.Compensation }},
	{"approval", func(s *aip.ImplementationSupport) *bool { return &s.Approval }},
	{"credentials", func(s *aip.ImplementationSupport) *bool { return &s.Credentials }},
}

// SupportFeatureNames returns the features s claims, by their fleet-file
// names, in the order a fleet file writes them.
func SupportFeatureNames(s aip.ImplementationSupport) []string {
	var out []string
	for _, f := range supportFeatures {
		if *f.claim(&s) {
			out = append(out, f.name)
		}
	}
	return out
}

// ---------------------------------------------------------------- parsing

// ParseFleetFile parses and validates a fleet file. Unknown fields,
// duplicate entries and invalid records are errors (*FleetFileError) that
// name the entry and the field. Versions are checked against the default
// Limits; the registry applies its own when the file is applied.
func ParseFleetFile(data []byte) (*FleetFile, error) {
	if len(data) > MaxFleetFileBytes {
		return nil, &FleetFileError{Err: fileInvalidf("the file is %d bytes, over the limit of %d", len(data), MaxFleetFileBytes)}
	}
	// First pass: the document as nodes, so unknown sections get an error
	// that lists the known ones.
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &FleetFileError{Err: fileInvalidf("the file is empty; start it with format: %s", FleetFileFormat)}
		}
		line, msg := syntaxError(err)
		return nil, &FleetFileError{Line: line, Err: fileInvalidf("not valid YAML: %s", msg)}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &FleetFileError{Line: extra.Line, Err: fileInvalidf("a fleet file holds one YAML document")}
	}
	p := parser{seen: map[string]int{}}
	if root := doc.Content[0]; root.Kind != yaml.MappingNode {
		return nil, &FleetFileError{Line: root.Line, Err: fileInvalidf("a fleet file is a mapping of sections")}
	} else if e := p.knownFields(root, reflect.TypeFor[yamlFile](), ""); e != nil {
		return nil, e
	} else if e := checkSections(root); e != nil {
		return nil, e
	}
	// Second pass: the sections, strictly.
	dec = yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var raw yamlFile
	if err := dec.Decode(&raw); err != nil {
		return nil, &FleetFileError{Err: fileInvalidf("%s", cleanYAMLError(err))}
	}
	if raw.Format != FleetFileFormat {
		return nil, &FleetFileError{Field: "format", Err: fileInvalidf("%q is not a known format; start the file with format: %s", raw.Format, FleetFileFormat)}
	}
	f := &FleetFile{}
	for i := range raw.Policies {
		var y yamlPolicy
		if e := entry(&p, SectionPolicies, i, &raw.Policies[i], &y, func(y *yamlPolicy) string { return y.PolicyRef }); e != nil {
			return nil, e
		}
		pol, err := y.record()
		if err != nil {
			return nil, p.fail(err)
		}
		f.Policies = append(f.Policies, pol)
	}
	for i := range raw.Types {
		var y yamlType
		if e := entry(&p, SectionTypes, i, &raw.Types[i], &y, func(y *yamlType) string { return y.ID }); e != nil {
			return nil, e
		}
		t := ConnectorType{ID: y.ID, Name: y.Name, Owner: y.Owner, Enabled: orTrue(y.Enabled)}
		if err := t.Validate(); err != nil {
			return nil, p.fail(err)
		}
		f.Types = append(f.Types, t)
	}
	for i := range raw.Versions {
		var y yamlVersion
		if e := entry(&p, SectionVersions, i, &raw.Versions[i], &y, func(y *yamlVersion) string { return y.ID }); e != nil {
			return nil, e
		}
		v, err := y.record()
		if err != nil {
			return nil, p.fail(err)
		}
		f.Versions = append(f.Versions, v)
	}
	// The manifest agent of each version in the file: its replicas sign
	// as that principal (the registry refuses a registration otherwise).
	versionAgents := make(map[string]aip.Principal, len(f.Versions))
	for _, v := range f.Versions {
		versionAgents[v.ID] = v.Manifest.Agent
	}
	instanceVersions := map[string]string{}
	for i := range raw.Instances {
		var y yamlInstance
		if e := entry(&p, SectionInstances, i, &raw.Instances[i], &y, func(y *yamlInstance) string { return y.ID }); e != nil {
			return nil, e
		}
		if y.ConfigRevision == nil {
			return nil, p.fail(invalid(RecordConnectorInstance, y.ID, "config_revision", "is required; raise it with every change to the instance"))
		}
		inst := ConnectorInstance{
			ID: y.ID, ConnectorTypeID: y.ConnectorTypeID, VersionID: y.VersionID, TenantID: y.TenantID,
			ConfigRevision: *y.ConfigRevision, SecretProviderRef: y.SecretProviderRef, Status: InstanceStatus(orDefault(y.Status, string(InstanceEnabled))),
		}
		if err := inst.Validate(); err != nil {
			return nil, p.fail(err)
		}
		instanceVersions[inst.ID] = inst.VersionID
		f.Instances = append(f.Instances, inst)
	}
	for i := range raw.Bindings {
		var y yamlBinding
		key := func(y *yamlBinding) string { return y.TenantID + "/" + y.CapabilityID + "/" + y.InstanceID }
		if e := entry(&p, SectionBindings, i, &raw.Bindings[i], &y, key); e != nil {
			return nil, e
		}
		if y.PolicyRevision == nil {
			return nil, p.fail(invalid(RecordCapabilityBinding, key(&y), "policy_revision", "is required; raise it with every change to the binding"))
		}
		b := CapabilityBinding{
			TenantID: y.TenantID, CapabilityID: y.CapabilityID, InstanceID: y.InstanceID, Priority: y.Priority,
			PolicyRevision: *y.PolicyRevision, CredentialRevisionRef: y.CredentialRevisionRef, QuotaPolicyRef: y.QuotaPolicyRef,
			Enabled: orTrue(y.Enabled),
		}
		if err := b.Validate(); err != nil {
			return nil, p.fail(err)
		}
		f.Bindings = append(f.Bindings, b)
	}
	for i := range raw.Replicas {
		var y yamlReplica
		if e := entry(&p, SectionReplicas, i, &raw.Replicas[i], &y, func(y *yamlReplica) string { return y.ID }); e != nil {
			return nil, e
		}
		version := y.VersionID
		if version == "" {
			version = instanceVersions[y.InstanceID]
		}
		if version == "" {
			hint := ""
			if len(instanceVersions) > 0 {
				// A misspelled instance_id is the likelier mistake.
				hint = fmt.Sprintf(" (this file's instances are %s: is instance_id misspelled?)", strings.Join(slices.Sorted(maps.Keys(instanceVersions)), ", "))
			}
			return nil, p.fail(invalid(RecordConnectorReplica, y.ID, "version_id", "is required when instance %s is not in this file%s", y.InstanceID, hint))
		}
		principalID, principalKind := y.PeerPrincipalID, orDefault(y.PeerPrincipalKind, string(aip.PrincipalService))
		if agent, ok := versionAgents[version]; ok {
			principalID, principalKind = orDefault(y.PeerPrincipalID, agent.ID), orDefault(y.PeerPrincipalKind, string(agent.Kind))
			for _, c := range []struct{ field, got, want string }{
				{"peer_principal_id", principalID, agent.ID}, {"peer_principal_kind", principalKind, string(agent.Kind)},
			} {
				if c.got != c.want {
					return nil, p.fail(invalid(RecordConnectorReplica, y.ID, c.field,
						"%q is not version %s's manifest agent's %q: a replica signs as its manifest's agent, and the registry refuses its registration otherwise (leave peer_principal_id and peer_principal_kind out to take them from the version)",
						c.got, version, c.want))
				}
			}
		}
		top := aip.Topology{
			Region:        orDefault(y.Topology.Region, aip.DefaultRegion),
			Zone:          orDefault(y.Topology.Zone, aip.DefaultZone),
			CapacityClass: orDefault(y.Topology.CapacityClass, aip.DefaultCapacityClass),
		}
		r := ConnectorReplica{
			ID: y.ID, InstanceID: y.InstanceID, VersionID: version, Endpoint: y.Endpoint,
			PeerPrincipalID: principalID, PeerPrincipalKind: aip.PrincipalKind(principalKind),
			PeerDID: y.PeerDID, TrustDomain: y.TrustDomain, TransportProfile: orDefault(y.TransportProfile, aip.NativeHTTPProfile),
			Topology: top, Status: aip.ReplicaOffline, Capacity: y.Capacity,
		}
		if err := r.Validate(); err != nil {
			return nil, p.fail(err)
		}
		if err := checkRegistrable(&r, versionAgents); err != nil {
			return nil, p.fail(err)
		}
		f.Replicas = append(f.Replicas, r)
	}
	return f, nil
}

// checkRegistrable refuses a replica entry no host could ever register
// with, which the registry would keep for good (a replica's identity never
// changes, and its ID is never used for another): a native replica's
// endpoint is the --public-endpoint its host registers, which every host
// (hostsdk, aip-host, aip-sidecar) requires to have the path
// /aip/v1/messages and to be https, or http on a loopback host; and a
// replica signs as its version's manifest agent, whose trust domain, when
// the manifest names one, is the host's --trust-domain and so the
// replica's.
func checkRegistrable(r *ConnectorReplica, versionAgents map[string]aip.Principal) error {
	if agent, ok := versionAgents[r.VersionID]; ok && agent.TrustDomain != "" && agent.TrustDomain != r.TrustDomain {
		return invalid(RecordConnectorReplica, r.ID, "trust_domain",
			"%q is not version %s's manifest agent's trust domain %q: a host binds its --trust-domain into the manifest it registers, so no host could register this replica (use the version's trust domain, or print the manifest again with --print-manifest --trust-domain %s for a new version)",
			truncate(r.TrustDomain), r.VersionID, agent.TrustDomain, truncate(r.TrustDomain))
	}
	if r.TransportProfile != aip.NativeHTTPProfile {
		return nil
	}
	u, err := url.Parse(r.Endpoint)
	if err != nil {
		return nil // Validate reported it
	}
	if u.Path != aip.MessagesPath || u.EscapedPath() != aip.MessagesPath {
		want := *u
		want.Path, want.RawPath = aip.MessagesPath, ""
		return invalid(RecordConnectorReplica, r.ID, "endpoint",
			"%q must have the path %s: it is the host's --public-endpoint, whose path every host requires to be exactly that, so no host could register this replica (write %s)",
			truncate(r.Endpoint), aip.MessagesPath, truncate(want.String()))
	}
	if u.Scheme == "http" && !loopbackHost(u.Hostname()) {
		return invalid(RecordConnectorReplica, r.ID, "endpoint",
			"%q must be https: a host accepts an http --public-endpoint only on a loopback host (127.0.0.1, ::1, localhost), so no host could register this replica",
			truncate(r.Endpoint))
	}
	return nil
}

// loopbackHost reports whether host is localhost or a loopback address,
// as hosts judge their http endpoints.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// checkSections checks that every section of the file's root mapping is a
// list (or empty) and the format a scalar, so a mistyped section gets an
// error naming it and its line.
func checkSections(root *yaml.Node) *FleetFileError {
	for k := 0; k+1 < len(root.Content); k += 2 {
		key, val := root.Content[k], resolveAlias(root.Content[k+1])
		switch {
		case key.Value == "format" && val.Kind != yaml.ScalarNode:
			return &FleetFileError{Field: "format", Line: val.Line, Err: fileInvalidf("must be %s", FleetFileFormat)}
		case key.Value != "format" && val.Kind != yaml.SequenceNode && val.Tag != "!!null":
			return &FleetFileError{Field: key.Value, Line: val.Line,
				Err: fileInvalidf("must be a list of entries, each starting with \"- \" (or [] for none)")}
		}
	}
	return nil
}

// parser tracks the entry being parsed, for errors.
type parser struct {
	section string
	index   int
	id      string
	line    int
	seen    map[string]int // section + id -> index
}

// entry checks and decodes one entry into the struct y points to, field by
// field so errors name the field, and records the entry's identity; it
// returns a *FleetFileError on failure.
func entry[T any](p *parser, section string, i int, n *yaml.Node, y *T, id func(*T) string) *FleetFileError {
	p.section, p.index, p.id, p.line = section, i, "", n.Line
	n = resolveAlias(n)
	if n.Kind != yaml.MappingNode {
		return p.errorf("", n.Line, "each entry is a mapping of field: value")
	}
	p.id = id(peekID[T](n))
	if e := p.decodeFields(n, reflect.ValueOf(y).Elem(), ""); e != nil {
		return e
	}
	p.id = id(y)
	if first, dup := p.seen[section+"\x00"+p.id]; dup {
		return p.errorf("", n.Line, "repeats entry %d of %s; each record appears once", first, section)
	}
	p.seen[section+"\x00"+p.id] = i
	return nil
}

// peekID decodes only the string fields of an entry, leniently, so errors
// about its other fields can name it.
func peekID[T any](n *yaml.Node) *T {
	y := new(T)
	v := reflect.ValueOf(y).Elem()
	for k := 0; k+1 < len(n.Content); k += 2 {
		for j := range v.NumField() {
			f := v.Type().Field(j)
			if name, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); name == n.Content[k].Value && f.Type.Kind() == reflect.String {
				_ = n.Content[k+1].Decode(v.Field(j).Addr().Interface())
			}
		}
	}
	return y
}

// yamlFields maps the yaml names of struct t's fields to their indexes.
func yamlFields(t reflect.Type) map[string]int {
	fields := map[string]int{}
	for j := range t.NumField() {
		if name, _, _ := strings.Cut(t.Field(j).Tag.Get("yaml"), ","); name != "" {
			fields[name] = j
		}
	}
	return fields
}

func unknownField(p *parser, fields map[string]int, key *yaml.Node, prefix string) *FleetFileError {
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names)
	return p.errorf(prefix+key.Value, key.Line, "unknown field; the fields here are %s", strings.Join(names, ", "))
}

// knownFields reports the first key of mapping n that is not a yaml-tagged
// field of struct t.
func (p *parser) knownFields(n *yaml.Node, t reflect.Type, prefix string) *FleetFileError {
	fields := yamlFields(t)
	for k := 0; k+1 < len(n.Content); k += 2 {
		if _, ok := fields[n.Content[k].Value]; !ok {
			return unknownField(p, fields, n.Content[k], prefix)
		}
	}
	return nil
}

// resolveAlias returns the node an alias (*name) refers to, or n itself.
func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// decodeFields decodes mapping n into struct v one field at a time,
// recursing into nested structs, and rejects unknown, repeated and merged
// (<<) fields.
func (p *parser) decodeFields(n *yaml.Node, v reflect.Value, prefix string) *FleetFileError {
	fields := yamlFields(v.Type())
	seen := map[string]int{}
	for k := 0; k+1 < len(n.Content); k += 2 {
		key, val := n.Content[k], resolveAlias(n.Content[k+1])
		if key.Tag == "!!merge" {
			return p.errorf(prefix+key.Value, key.Line, "merge keys (<<) are not supported; write the fields out")
		}
		j, ok := fields[key.Value]
		if !ok {
			return unknownField(p, fields, key, prefix)
		}
		if first, dup := seen[key.Value]; dup {
			return p.errorf(prefix+key.Value, key.Line, "is set twice (first on line %d); keep one", first)
		}
		seen[key.Value] = key.Line
		fv := v.Field(j)
		if fv.Kind() == reflect.Struct && fv.Type() != reflect.TypeFor[yaml.Node]() && fv.Type() != reflect.TypeFor[yamlLimit]() {
			if val.Kind != yaml.MappingNode {
				return p.errorf(prefix+key.Value, val.Line, "must be a mapping of field: value")
			}
			if e := p.decodeFields(val, fv, prefix+key.Value+"."); e != nil {
				return e
			}
			continue
		}
		if isInteger(fv.Type()) && val.Kind == yaml.ScalarNode && val.Tag == "!!float" {
			// yaml.v3 would truncate 8.5 to 8.
			return p.errorf(prefix+key.Value, val.Line, "%q is not a whole number; write an integer", val.Value)
		}
		if err := val.Decode(fv.Addr().Interface()); err != nil {
			return p.errorf(prefix+key.Value, val.Line, "%s", cleanYAMLError(err))
		}
	}
	return nil
}

// isInteger reports whether t, or what it points to, is an integer type.
func isInteger(t reflect.Type) bool {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return true
	}
	return false
}

// cleanYAMLError turns a yaml.v3 error into one line without the package
// prefix and line markers (the FleetFileError carries the line), a value
// of the wrong kind said in words ("want a whole number, not the text
// `1`; write it without quotes" for yaml.v3's "cannot unmarshal !!str `1`
// into uint64").
func cleanYAMLError(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, len(te.Errors))
		for i, m := range te.Errors {
			if _, rest, ok := strings.Cut(m, ": "); ok && strings.HasPrefix(m, "line ") {
				m = rest
			}
			msgs[i] = wrongKind(m)
		}
		return strings.Join(msgs, "; ")
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

// yamlMismatch matches yaml.v3's message for a value of the wrong kind:
// the value's tag, the value (for a scalar) and the Go type it was for.
var yamlMismatch = regexp.MustCompile("^cannot unmarshal !!(\\w+) (?:`(.*)` )?into (\\S+)$")

// wrongKind words yaml.v3's "cannot unmarshal !!str `1` into uint64" for
// the person who wrote the file; other messages are returned as they are.
func wrongKind(msg string) string {
	m := yamlMismatch.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	tag, value, into := m[1], m[2], m[3]
	var want string
	switch {
	case strings.HasPrefix(into, "uint"):
		want = "a whole number, 0 or more"
	case strings.HasPrefix(into, "int"):
		want = "a whole number"
	case into == "bool" || into == "*bool":
		want = "true or false"
	case strings.HasPrefix(into, "float"):
		want = "a number"
	case into == "string":
		want = "text"
	case strings.HasPrefix(into, "[]"):
		want = "a list"
	default:
		want = "a mapping of field: value"
	}
	got := map[string]string{"str": "the text", "int": "the number", "float": "the number", "bool": "the boolean",
		"null": "null", "seq": "a list", "map": "a mapping", "binary": "binary data", "timestamp": "the timestamp"}[tag]
	if got == "" {
		got = "!!" + tag
	}
	if value != "" {
		got += " `" + value + "`"
	}
	out := "want " + want + ", not " + got
	// Quoted, a value of the kind wanted is text: say so.
	if tag == "str" {
		_, errInt := strconv.ParseInt(value, 10, 64)
		_, errUint := strconv.ParseUint(value, 10, 64)
		_, errFloat := strconv.ParseFloat(value, 64)
		if (strings.HasPrefix(want, "a whole number") && (errInt == nil || errUint == nil)) ||
			(want == "true or false" && (value == "true" || value == "false")) || (want == "a number" && errFloat == nil) {
			out += "; write it without quotes"
		}
	}
	return out
}

func (p *parser) errorf(field string, line int, format string, args ...any) *FleetFileError {
	if p.section == "" {
		return &FleetFileError{Field: field, Line: line, Err: fileInvalidf(format, args...)}
	}
	return &FleetFileError{Section: p.section, Index: p.index, ID: p.id, Field: field, Line: line, Err: fileInvalidf(format, args...)}
}

// fileInvalid is an error about the file's YAML: the file as a whole (its
// syntax, its sections, its format) or an entry's field (unknown, set
// twice, of the wrong kind). It matches ErrInvalid, but its text is only
// what to fix: the FleetFileError around it already says it is the fleet
// file that is wrong, so "registry: invalid" would be noise to the person
// who wrote it.
type fileInvalid string

func fileInvalidf(format string, args ...any) error { return fileInvalid(fmt.Sprintf(format, args...)) }

// Error implements error.
func (e fileInvalid) Error() string { return string(e) }

// Is reports whether target is ErrInvalid.
func (e fileInvalid) Is(target error) bool { return target == ErrInvalid }

// yamlSyntax matches yaml.v3's syntax errors, "yaml: line 3: could not find
// expected ':'".
var yamlSyntax = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// syntaxError splits a yaml.v3 syntax error into its line (0 if it names
// none) and its message without the package prefix.
func syntaxError(err error) (line int, msg string) {
	if m := yamlSyntax.FindStringSubmatch(err.Error()); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil {
			return n, m[2]
		}
	}
	return 0, strings.TrimPrefix(err.Error(), "yaml: ")
}

// fail wraps a record error, lifting its field.
func (p *parser) fail(err error) *FleetFileError {
	e := &FleetFileError{Section: p.section, Index: p.index, ID: p.id, Line: p.line, Err: err}
	var fe *FieldError
	if errors.As(err, &fe) {
		e.Field = fe.Field
	}
	return e
}

func orTrue(b *bool) bool { return b == nil || *b }

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func (y *yamlPolicy) record() (AdmissionPolicy, error) {
	var p AdmissionPolicy
	if y.Preset != "" {
		var ok bool
		if p, ok = PolicyPreset(y.Preset, y.PolicyRef); !ok {
			return p, invalid(RecordAdmissionPolicy, y.PolicyRef, "preset", "%q is not a preset; use conservative or fleet", y.Preset)
		}
	}
	p.PolicyRef, p.Revision, p.Enabled = y.PolicyRef, y.Revision, orTrue(y.Enabled)
	limits := []struct {
		field string
		v     yamlLimit
		dst   *uint32
	}{
		{"max_global_in_flight", y.MaxGlobalInFlight, &p.MaxGlobalInFlight},
		{"max_tenant_in_flight", y.MaxTenantInFlight, &p.MaxTenantInFlight},
		{"max_connector_type_in_flight", y.MaxConnectorTypeInFlight, &p.MaxConnectorTypeInFlight},
		{"max_instance_in_flight", y.MaxInstanceInFlight, &p.MaxInstanceInFlight},
		{"max_binding_in_flight", y.MaxBindingInFlight, &p.MaxBindingInFlight},
		{"max_tenant_retry_in_flight", y.MaxTenantRetryInFlight, &p.MaxTenantRetryInFlight},
		{"circuit_failure_threshold", y.CircuitFailureThreshold, &p.CircuitFailureThreshold},
	}
	for _, l := range limits {
		switch {
		case l.v.set:
			*l.dst = l.v.v
		case y.Preset == "":
			return p, invalid(RecordAdmissionPolicy, y.PolicyRef, l.field, "is required without a preset (or set preset: conservative or fleet)")
		}
	}
	switch {
	case y.CircuitOpenMS != nil:
		p.CircuitOpenMS = *y.CircuitOpenMS
	case y.Preset == "":
		return p, invalid(RecordAdmissionPolicy, y.PolicyRef, "circuit_open_ms", "is required without a preset")
	}
	return p, p.Validate()
}

func (y *yamlVersion) record() (ConnectorVersion, error) {
	const r = RecordConnectorVersion
	v := ConnectorVersion{ID: y.ID, ConnectorTypeID: y.ConnectorTypeID, Version: y.Version, Status: VersionStatus(orDefault(y.Status, string(VersionActive)))}
	if y.Manifest.Kind == 0 {
		return v, invalid(r, y.ID, "manifest", "is required: write the connector's manifest inline")
	}
	raw, err := yamlToJSON(&y.Manifest, "manifest")
	if err != nil {
		return v, err.(*FieldError).withID(y.ID)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v.Manifest); err != nil {
		return v, invalid(r, y.ID, "manifest", "%v", err)
	}
	digest, err := aip.ManifestDigest(&v.Manifest)
	if err != nil {
		return v, invalid(r, y.ID, "manifest", "%v", err)
	}
	if y.ManifestDigest != "" && y.ManifestDigest != digest {
		return v, invalid(r, y.ID, "manifest_digest", "%s does not match the manifest, whose digest is %s", y.ManifestDigest, digest)
	}
	v.ManifestDigest = digest
	v.ImplementationSupport = make(map[string]aip.ImplementationSupport, len(y.ImplementationSupport))
	for capID, features := range y.ImplementationSupport {
		var s aip.ImplementationSupport
		for _, name := range features {
			i := slices.IndexFunc(supportFeatures, func(f supportFeature) bool { return f.name == name })
			if i < 0 {
				names := make([]string, 0, len(supportFeatures))
				for _, f := range supportFeatures {
					names = append(names, f.name)
				}
				slices.Sort(names)
				return v, invalid(r, y.ID, "implementation_support."+capID, "%q is not a feature; use %s", name, strings.Join(names, ", "))
			}
			*supportFeatures[i].claim(&s) = true
		}
		v.ImplementationSupport[capID] = s
	}
	v.Attestation = ArtifactAttestation(y.Attestation)
	if v.Attestation.SchemaBundleDigest == "" {
		if v.Attestation.SchemaBundleDigest, err = SchemaBundleDigest(&v.Manifest); err != nil {
			return v, invalid(r, y.ID, "manifest", "%v", err)
		}
	}
	p, err := PrepareVersion(v, Limits{})
	return p.Version, err
}

func (e *FieldError) withID(id string) *FieldError { e.ID = id; return e }

// yamlToJSON converts a YAML node to JSON text: mappings with string keys
// become objects, sequences arrays, and scalars strings, numbers, booleans
// or null by their resolved tag. Aliases are expanded, within a budget of
// DefaultMaxManifestBytes (a manifest's bound under the default Limits), so
// that nested aliases (a "billion laughs" file) cannot expand a small file
// into gigabytes.
func yamlToJSON(n *yaml.Node, path string) ([]byte, error) {
	c := yamlConverter{budget: DefaultMaxManifestBytes}
	v, err := c.value(n, path, 0)
	if err != nil {
		return nil, err
	}
	return json.Marshal(v)
}

// yamlConverter converts YAML nodes to JSON values within a budget: each
// node costs at least a byte, a scalar or key its length.
type yamlConverter struct {
	budget int
}

func (c *yamlConverter) value(n *yaml.Node, path string, depth int) (any, error) {
	bad := func(format string, args ...any) error {
		return &FieldError{Err: ErrInvalid, Record: RecordConnectorVersion, Field: path, Reason: fmt.Sprintf("line %d: ", n.Line) + fmt.Sprintf(format, args...)}
	}
	if depth > 128 {
		return nil, bad("is nested too deeply")
	}
	if c.budget -= 1 + len(n.Value); c.budget < 0 {
		return nil, bad("expands to more than %d bytes (a manifest's limit); aliases (*name) repeat what they refer to, so nested aliases multiply", DefaultMaxManifestBytes)
	}
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) != 1 {
			return nil, bad("is empty")
		}
		return c.value(n.Content[0], path, depth+1)
	case yaml.AliasNode:
		return c.value(n.Alias, path, depth+1)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		lines := make(map[string]int, len(n.Content)/2)
		for k := 0; k+1 < len(n.Content); k += 2 {
			key := n.Content[k]
			if key.Kind != yaml.ScalarNode || key.Tag != "!!str" {
				if key.Tag == "!!merge" {
					return nil, bad("merge keys (<<) are not supported")
				}
				return nil, bad("key %q is not a string; quote it", key.Value)
			}
			if first, dup := lines[key.Value]; dup {
				return nil, bad("key %q is set twice (first on line %d); keep one", key.Value, first)
			}
			lines[key.Value] = key.Line
			c.budget -= len(key.Value)
			v, err := c.value(n.Content[k+1], path+"."+key.Value, depth+1)
			if err != nil {
				return nil, err
			}
			m[key.Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		s := make([]any, len(n.Content))
		for i, e := range n.Content {
			v, err := c.value(e, path+"["+strconv.Itoa(i)+"]", depth+1)
			if err != nil {
				return nil, err
			}
			s[i] = v
		}
		return s, nil
	case yaml.ScalarNode:
		switch n.Tag {
		case "!!str", "!!binary", "!!timestamp":
			return n.Value, nil
		case "!!null":
			return nil, nil
		case "!!bool":
			var b bool
			if err := n.Decode(&b); err != nil {
				return nil, bad("%v", err)
			}
			return b, nil
		case "!!int":
			var i int64
			if err := n.Decode(&i); err != nil {
				return nil, bad("%q is not a 64-bit integer", n.Value)
			}
			return json.Number(strconv.FormatInt(i, 10)), nil
		case "!!float":
			var f float64
			if err := n.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				return nil, bad("%q is not a finite number", n.Value)
			}
			return f, nil
		}
		return nil, bad("unsupported YAML tag %s", n.Tag)
	}
	return nil, bad("is empty")
}

// ---------------------------------------------------------------- writing

// yamlOut is the document MarshalFleetFile writes, in the field order of
// docs/fleet-file.md.
type yamlOut struct {
	Format    string         `yaml:"format"`
	Policies  []yamlPolicy   `yaml:"policies,omitempty"`
	Types     []yamlType     `yaml:"types,omitempty"`
	Versions  []yamlVersion  `yaml:"versions,omitempty"`
	Instances []yamlInstance `yaml:"instances,omitempty"`
	Bindings  []yamlBinding  `yaml:"bindings,omitempty"`
	Replicas  []yamlReplica  `yaml:"replicas,omitempty"`
}

// MarshalYAML writes a limit as ParseFleetFile reads it.
func (l yamlLimit) MarshalYAML() (any, error) {
	if l.v == Unlimited {
		return "unlimited", nil
	}
	return l.v, nil
}

// MarshalFleetFile writes f in the YAML form ParseFleetFile reads
// (docs/fleet-file.md), so that ParseFleetFile returns records equal to
// those of a file it parsed. Sections and fields are written in the
// documented order; optional fields that hold their default (enabled: true,
// an empty reference, priority 0) are left out, and policies are written with
// every limit and no preset. A fleet file declares state, so what the
// registry owns is not written: a version's admission time and a replica's
// lifecycle (status, lease, assignments, health revision, circuit, last
// control request), which ParseFleetFile sets to a new offline replica's.
// Records are not validated here; ParseFleetFile and Apply do that.
func MarshalFleetFile(f *FleetFile) ([]byte, error) {
	out := yamlOut{Format: FleetFileFormat}
	disabled := func(enabled bool) *bool {
		if enabled {
			return nil
		}
		return new(bool)
	}
	for _, p := range f.Policies {
		open := p.CircuitOpenMS
		out.Policies = append(out.Policies, yamlPolicy{
			PolicyRef: p.PolicyRef, Revision: p.Revision, Enabled: disabled(p.Enabled),
			MaxGlobalInFlight: yamlLimit{true, p.MaxGlobalInFlight}, MaxTenantInFlight: yamlLimit{true, p.MaxTenantInFlight},
			MaxConnectorTypeInFlight: yamlLimit{true, p.MaxConnectorTypeInFlight}, MaxInstanceInFlight: yamlLimit{true, p.MaxInstanceInFlight},
			MaxBindingInFlight: yamlLimit{true, p.MaxBindingInFlight}, MaxTenantRetryInFlight: yamlLimit{true, p.MaxTenantRetryInFlight},
			CircuitFailureThreshold: yamlLimit{true, p.CircuitFailureThreshold}, CircuitOpenMS: &open,
		})
	}
	for _, t := range f.Types {
		out.Types = append(out.Types, yamlType{ID: t.ID, Name: t.Name, Owner: t.Owner, Enabled: disabled(t.Enabled)})
	}
	for i := range f.Versions {
		y, err := versionYAML(&f.Versions[i])
		if err != nil {
			return nil, &FleetFileError{Section: SectionVersions, Index: i, ID: f.Versions[i].ID, Field: "manifest", Err: err}
		}
		out.Versions = append(out.Versions, y)
	}
	for _, inst := range f.Instances {
		rev := inst.ConfigRevision
		out.Instances = append(out.Instances, yamlInstance{
			ID: inst.ID, ConnectorTypeID: inst.ConnectorTypeID, VersionID: inst.VersionID, TenantID: inst.TenantID,
			ConfigRevision: &rev, SecretProviderRef: inst.SecretProviderRef, Status: string(inst.Status),
		})
	}
	for _, b := range f.Bindings {
		rev := b.PolicyRevision
		out.Bindings = append(out.Bindings, yamlBinding{
			TenantID: b.TenantID, CapabilityID: b.CapabilityID, InstanceID: b.InstanceID, Priority: b.Priority,
			PolicyRevision: &rev, CredentialRevisionRef: b.CredentialRevisionRef, QuotaPolicyRef: b.QuotaPolicyRef, Enabled: disabled(b.Enabled),
		})
	}
	for _, r := range f.Replicas {
		out.Replicas = append(out.Replicas, yamlReplica{
			ID: r.ID, InstanceID: r.InstanceID, VersionID: r.VersionID, Endpoint: r.Endpoint,
			PeerPrincipalID: r.PeerPrincipalID, PeerPrincipalKind: string(r.PeerPrincipalKind), PeerDID: r.PeerDID,
			TrustDomain: r.TrustDomain, TransportProfile: r.TransportProfile,
			Topology: yamlTopology{Region: r.Topology.Region, Zone: r.Topology.Zone, CapacityClass: r.Topology.CapacityClass},
			Capacity: r.Capacity,
		})
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&out); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// versionYAML is the YAML form of a version: its manifest inline, in the
// field order of its JSON form, and its claims as feature names.
func versionYAML(v *ConnectorVersion) (yamlVersion, error) {
	y := yamlVersion{ID: v.ID, ConnectorTypeID: v.ConnectorTypeID, Version: v.Version, Status: string(v.Status), ManifestDigest: v.ManifestDigest}
	raw, err := json.Marshal(&v.Manifest)
	if err != nil {
		return y, err
	}
	// JSON is YAML: decode it to nodes, then drop the JSON styles (quotes,
	// braces) so the encoder writes block YAML and quotes only what needs it.
	var doc yaml.Node
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return y, err
	}
	var plain func(n *yaml.Node)
	plain = func(n *yaml.Node) {
		n.Style = 0
		for _, c := range n.Content {
			plain(c)
		}
	}
	plain(doc.Content[0])
	y.Manifest = *doc.Content[0]
	y.ImplementationSupport = make(map[string]yamlFeatures, len(v.ImplementationSupport))
	for capID, s := range v.ImplementationSupport {
		features := yamlFeatures{}
		for _, f := range supportFeatures {
			if *f.claim(&s) {
				features = append(features, f.name)
			}
		}
		y.ImplementationSupport[capID] = features
	}
	y.Attestation = yamlAttestation(v.Attestation)
	return y, nil
}

// ---------------------------------------------------------------- applying

// Change says what Apply did to one entry.
type Change string

// Changes.
const (
	Created   Change = "created"
	Updated   Change = "updated"
	Unchanged Change = "unchanged"
)

// AppliedEntry is one line of an ApplyReport.
type AppliedEntry struct {
	Section string `json:"section"`
	ID      string `json:"id"`
	Change  Change `json:"change"`
}

// ApplyReport lists what Apply did, entry by entry, in the order applied.
type ApplyReport struct {
	Entries []AppliedEntry `json:"entries"`
}

// Count returns how many entries had the change.
func (r *ApplyReport) Count(c Change) int {
	n := 0
	for _, e := range r.Entries {
		if e.Change == c {
			n++
		}
	}
	return n
}

// Changed reports whether Apply created or updated anything.
func (r *ApplyReport) Changed() bool { return r.Count(Created)+r.Count(Updated) > 0 }

// ApplyDisableTimeout bounds the step of Apply that disables the types the
// file marks disabled when it runs after the apply's own context has ended
// (a failed or interrupted apply).
const ApplyDisableTimeout = 30 * time.Second

// Apply brings the registry to the state the fleet file describes, through
// admin, and reports what it changed. It applies policies, then types
// (created enabled) and versions, then disables the types the file marks
// disabled, then disables the bindings the file marks disabled that the
// registry holds enabled (so one file can switch an instance to a version
// without their capability and disable them), and then applies instances,
// replicas and the other bindings: a file can
// create a type, admit its versions and disable it, and none of the file's
// instances and bindings of a type it disables is routable at any moment
// of the apply (versions are admitted only into an enabled type;
// instances, replicas and bindings do not need their type enabled). A type
// already disabled stays disabled while the file is applied, so a file
// that adds a version to it is refused before anything is written, with
// an error that says how to stage the version.
// Applying the same file again changes nothing.
//
// Existing records are compared with the file: equal ones are unchanged;
// policies, instances and bindings that differ are put (their revision must
// be newer, else the registry refuses); a version may only change status; a
// type only its enabled flag. Replicas belong to the lifecycle once created:
// an existing replica with the file's identity is unchanged whatever its
// status, lease or capacity, and one with a different identity is an error.
//
// Apply stops at the first error, which is a *FleetFileError naming the
// entry; the report lists what was done before it. The types the file
// disables are disabled before Apply returns, error or not, so an apply
// that fails among the types or versions does not leave routable a type
// the file disables; also when ctx ends midway (that step then runs on a
// context of its own, bounded by ApplyDisableTimeout).
func Apply(ctx context.Context, admin Administrator, f *FleetFile) (ApplyReport, error) {
	var rep ApplyReport
	record := func(section, id string, c Change) {
		rep.Entries = append(rep.Entries, AppliedEntry{Section: section, ID: id, Change: c})
	}
	wrap := func(section string, i int, id string, err error) *FleetFileError {
		e := &FleetFileError{Section: section, Index: i, ID: id, Err: err}
		var fe *FieldError
		if errors.As(err, &fe) {
			e.Field = fe.Field
		}
		return e
	}
	// disableTypes disables the first n types of the file that it marks
	// disabled and the registry holds enabled. It runs also when ctx has
	// ended (Ctrl-C or the timeout of aipfleet registry apply, which stop
	// the apply midway): on a context of its own, bounded by
	// ApplyDisableTimeout, so an apply cut short does not leave routable a
	// type the file disables.
	typeIndex := map[string]int{}
	disableTypes := func(n int) error {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ApplyDisableTimeout)
		defer cancel()
		for i, t := range f.Types[:n] {
			if t.Enabled {
				continue
			}
			stored, err := admin.ConnectorType(dctx, t.ID)
			if err != nil {
				return wrap(SectionTypes, i, t.ID, err)
			}
			if stored.Enabled {
				if err := admin.SetConnectorTypeEnabled(dctx, t.ID, false); err != nil {
					return wrap(SectionTypes, i, t.ID, err)
				}
				if e := &rep.Entries[typeIndex[t.ID]]; e.Change == Unchanged {
					e.Change = Updated
				}
			}
		}
		return nil
	}
	typesDone := 0
	fail := func(section string, i int, id string, err error) (ApplyReport, error) {
		// A type the file disables was created (or left) enabled so that its
		// versions could be admitted; a failed apply must not leave it
		// routable.
		e := wrap(section, i, id, err)
		if derr := disableTypes(typesDone); derr != nil {
			return rep, errors.Join(e, derr)
		}
		return rep, e
	}
	if err := checkDisabledTypes(ctx, admin, f); err != nil {
		return rep, err
	}
	for i, p := range f.Policies {
		c, err := applyPolicy(ctx, admin, p)
		if err != nil {
			return fail(SectionPolicies, i, p.PolicyRef, err)
		}
		record(SectionPolicies, p.PolicyRef, c)
	}
	for i, t := range f.Types {
		c, err := applyType(ctx, admin, t)
		if err != nil {
			return fail(SectionTypes, i, t.ID, err)
		}
		typeIndex[t.ID] = len(rep.Entries)
		record(SectionTypes, t.ID, c)
		typesDone = i + 1
	}
	for i, v := range f.Versions {
		c, err := applyVersion(ctx, admin, v)
		if err != nil {
			return fail(SectionVersions, i, v.ID, err)
		}
		record(SectionVersions, v.ID, c)
	}
	// The versions are in: the types the file disables are disabled now,
	// before any of the file's instances or bindings is put, so none of
	// them is ever routable.
	if err := disableTypes(len(f.Types)); err != nil {
		return rep, err
	}
	// The bindings the file turns from enabled to disabled are put before
	// the instances: an instance switched to a version that lacks their
	// capability (a rollback, a release that drops one) is refused while
	// they are enabled, and the file that switches it disables them.
	// Disabling first never makes anything routable.
	early := map[int]bool{}
	for i, b := range f.Bindings {
		if b.Enabled {
			continue
		}
		stored, ok, err := lookup(admin.CapabilityBinding(ctx, b.Key()))
		if err != nil {
			return fail(SectionBindings, i, b.Key().String(), err)
		}
		if !ok || !stored.Enabled {
			continue
		}
		c, err := applyBinding(ctx, admin, b)
		if err != nil {
			return fail(SectionBindings, i, b.Key().String(), err)
		}
		record(SectionBindings, b.Key().String(), c)
		early[i] = true
	}
	for i, inst := range f.Instances {
		c, err := applyInstance(ctx, admin, inst)
		if err != nil {
			return fail(SectionInstances, i, inst.ID, err)
		}
		record(SectionInstances, inst.ID, c)
	}
	for i, r := range f.Replicas {
		c, err := applyReplica(ctx, admin, r)
		if err != nil {
			return fail(SectionReplicas, i, r.ID, err)
		}
		record(SectionReplicas, r.ID, c)
	}
	for i, b := range f.Bindings {
		if early[i] {
			continue
		}
		c, err := applyBinding(ctx, admin, b)
		if err != nil {
			return fail(SectionBindings, i, b.Key().String(), err)
		}
		record(SectionBindings, b.Key().String(), c)
	}
	return rep, nil
}

// lookup reads a record, reporting whether it exists.
func lookup[T any](v T, err error) (T, bool, error) {
	if errors.Is(err, ErrNotFound) {
		return v, false, nil
	}
	return v, err == nil, err
}

func applyPolicy(ctx context.Context, admin Administrator, p AdmissionPolicy) (Change, error) {
	stored, ok, err := lookup(admin.AdmissionPolicy(ctx, p.PolicyRef))
	switch {
	case err != nil:
		return "", err
	case ok && stored == p:
		return Unchanged, nil
	}
	if err := admin.PutAdmissionPolicy(ctx, p); err != nil {
		return "", err
	}
	return createdOr(ok), nil
}

func applyType(ctx context.Context, admin Administrator, t ConnectorType) (Change, error) {
	stored, ok, err := lookup(admin.ConnectorType(ctx, t.ID))
	if err != nil {
		return "", err
	}
	if !ok {
		t.Enabled = true // disabled, if the file says so, right after the versions
		return Created, admin.PutConnectorType(ctx, t)
	}
	want := stored
	want.Enabled = t.Enabled
	if err := CheckTypePut(&want, &t); err != nil {
		return "", err
	}
	if t.Enabled && !stored.Enabled {
		return Updated, admin.SetConnectorTypeEnabled(ctx, t.ID, true)
	}
	return Unchanged, nil
}

// checkDisabledTypes refuses, before anything is written, a file that adds
// a version to a type the registry holds disabled and the file does not
// enable: the registry admits versions only into an enabled type, and Apply
// never enables a disabled type, even for a moment, since its instances
// would be routable.
func checkDisabledTypes(ctx context.Context, admin Administrator, f *FleetFile) error {
	enables := map[string]bool{}
	for _, t := range f.Types {
		enables[t.ID] = t.Enabled
	}
	disabled := map[string]bool{}
	for i, v := range f.Versions {
		if enables[v.ConnectorTypeID] {
			continue
		}
		if _, ok, err := lookup(admin.ConnectorVersion(ctx, v.ID)); err != nil || ok {
			if err != nil {
				return &FleetFileError{Section: SectionVersions, Index: i, ID: v.ID, Err: err}
			}
			continue
		}
		off, seen := disabled[v.ConnectorTypeID]
		if !seen {
			t, ok, err := lookup(admin.ConnectorType(ctx, v.ConnectorTypeID))
			if err != nil {
				return &FleetFileError{Section: SectionVersions, Index: i, ID: v.ID, Err: err}
			}
			off = ok && !t.Enabled
			disabled[v.ConnectorTypeID] = off
		}
		if off {
			return &FleetFileError{Section: SectionVersions, Index: i, ID: v.ID, Field: "connector_type_id", Err: refused(RecordConnectorVersion, v.ID, "connector_type_id",
				"connector type %[1]s is disabled, and a version is admitted only into an enabled type; apply never enables a disabled type, not even for a moment, as that would make its instances routable. "+
					"To stage %[2]s while %[1]s serves nothing, apply in three steps: first a file that disables %[1]s's instances (status: disabled, with a greater config_revision) and keeps %[1]s disabled; "+
					"then this file with %[1]s enabled: true; then with enabled: false again (not in one apply: it enables a type before it applies the instances). "+
					"Or apply it with enabled: true once %[1]s may serve again", v.ConnectorTypeID, v.ID)}
		}
	}
	return nil
}

func applyVersion(ctx context.Context, admin Administrator, v ConnectorVersion) (Change, error) {
	stored, ok, err := lookup(admin.ConnectorVersion(ctx, v.ID))
	if err != nil {
		return "", err
	}
	if !ok {
		return Created, admin.AdmitVersion(ctx, v)
	}
	if err := CheckSameRelease(&stored, &v); err != nil {
		return "", err
	}
	if stored.Status == v.Status {
		return Unchanged, nil
	}
	return Updated, admin.SetVersionStatus(ctx, v.ID, v.Status)
}

func applyInstance(ctx context.Context, admin Administrator, inst ConnectorInstance) (Change, error) {
	stored, ok, err := lookup(admin.ConnectorInstance(ctx, inst.ID))
	switch {
	case err != nil:
		return "", err
	case ok && stored == inst:
		return Unchanged, nil
	}
	if err := admin.PutInstance(ctx, inst); err != nil {
		return "", err
	}
	return createdOr(ok), nil
}

func applyBinding(ctx context.Context, admin Administrator, b CapabilityBinding) (Change, error) {
	stored, ok, err := lookup(admin.CapabilityBinding(ctx, b.Key()))
	switch {
	case err != nil:
		return "", err
	case ok && stored == b:
		return Unchanged, nil
	}
	if err := admin.PutBinding(ctx, b); err != nil {
		return "", err
	}
	return createdOr(ok), nil
}

func applyReplica(ctx context.Context, admin Administrator, r ConnectorReplica) (Change, error) {
	stored, ok, err := lookup(admin.ConnectorReplica(ctx, r.ID))
	if err != nil {
		return "", err
	}
	if !ok {
		return Created, admin.PutReplica(ctx, r)
	}
	// Compare the identity only: the lifecycle owns the rest.
	if err := CheckReplicaIdentity(&stored, &r); err != nil {
		if stored.VersionID != r.VersionID {
			// Most often an entry without version_id, which takes its
			// instance's current version, after the instance's upgrade.
			return "", conflict(RecordConnectorReplica, r.ID, "version_id", "is %s, but the registered replica runs version %s for good (an entry without version_id takes its instance's current version): to keep this replica write version_id: %s in its entry; the new version's replicas need new IDs",
				r.VersionID, stored.VersionID, stored.VersionID)
		}
		return "", err
	}
	return Unchanged, nil
}

func createdOr(existed bool) Change {
	if existed {
		return Updated
	}
	return Created
}
