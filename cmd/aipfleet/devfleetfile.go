package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
)

// The dev fleet file, in the YAML form of docs/fleet-file.md. Field order
// follows the documentation.
type (
	devFleetYAML struct {
		Format    string            `yaml:"format"`
		Types     []devTypeYAML     `yaml:"types"`
		Versions  []devVersionYAML  `yaml:"versions"`
		Instances []devInstanceYAML `yaml:"instances"`
		Bindings  []devBindingYAML  `yaml:"bindings"`
		Replicas  []devReplicaYAML  `yaml:"replicas"`
	}
	devTypeYAML struct {
		ID    string `yaml:"id"`
		Name  string `yaml:"name"`
		Owner string `yaml:"owner"`
	}
	devVersionYAML struct {
		ID                    string              `yaml:"id"`
		ConnectorTypeID       string              `yaml:"connector_type_id"`
		Version               string              `yaml:"version"`
		Status                string              `yaml:"status"`
		Manifest              any                 `yaml:"manifest"`
		ImplementationSupport map[string][]string `yaml:"implementation_support"`
		Attestation           devAttestationYAML  `yaml:"attestation"`
	}
	devAttestationYAML struct {
		ArtifactDigest            string   `yaml:"artifact_digest"`
		SBOMDigest                string   `yaml:"sbom_digest"`
		ProvenanceDigest          string   `yaml:"provenance_digest"`
		ConformanceReportDigest   string   `yaml:"conformance_report_digest"`
		VulnerabilityReportDigest string   `yaml:"vulnerability_report_digest"`
		LicenseReportDigest       string   `yaml:"license_report_digest"`
		SignatureRef              string   `yaml:"signature_ref"`
		SignerIdentity            string   `yaml:"signer_identity"`
		Owner                     string   `yaml:"owner"`
		SupportedAIPVersions      []string `yaml:"supported_aip_versions,flow"`
		SDKVersionRequirement     string   `yaml:"sdk_version_requirement"`
		ConformanceStatus         string   `yaml:"conformance_status"`
		VulnerabilityPolicyStatus string   `yaml:"vulnerability_policy_status"`
		LicensePolicyStatus       string   `yaml:"license_policy_status"`
		RevocationStatus          string   `yaml:"revocation_status"`
	}
	devInstanceYAML struct {
		ID                string `yaml:"id"`
		ConnectorTypeID   string `yaml:"connector_type_id"`
		VersionID         string `yaml:"version_id"`
		TenantID          string `yaml:"tenant_id"`
		ConfigRevision    uint64 `yaml:"config_revision"`
		SecretProviderRef string `yaml:"secret_provider_ref"`
	}
	devBindingYAML struct {
		TenantID       string `yaml:"tenant_id"`
		CapabilityID   string `yaml:"capability_id"`
		InstanceID     string `yaml:"instance_id"`
		PolicyRevision uint64 `yaml:"policy_revision"`
	}
	devReplicaYAML struct {
		ID                string `yaml:"id"`
		InstanceID        string `yaml:"instance_id"`
		Endpoint          string `yaml:"endpoint"`
		PeerPrincipalID   string `yaml:"peer_principal_id"`
		PeerPrincipalKind string `yaml:"peer_principal_kind"`
		PeerDID           string `yaml:"peer_did"`
		TrustDomain       string `yaml:"trust_domain"`
		Capacity          uint32 `yaml:"capacity"`
	}
)

const devFleetHeader = `# The development fleet of aipfleet dev, regenerated and applied at every
# start (docs/fleet-file.md describes the format). It admits the %[1]s
# connector built into aipfleet as one version, gives tenant %[2]s one
# instance of it with a binding per capability, and pre-provisions one
# replica per "aipfleet host" process dev runs. Replicas are offline until
# their host registers; their endpoint and DID never change.
`

// fleetFile renders the dev fleet file: the connector's type and version
// (its bound manifest, implementation claims derived from each capability's
// contract, a development attestation), the tenant's instance and
// bindings, and every replica of the state.
func (f *devFleet) fleetFile() ([]byte, error) {
	raw, err := json.Marshal(&f.manifest)
	if err != nil {
		return nil, err
	}
	var manifest any
	if err := json.Unmarshal(raw, &manifest); err != nil {
		return nil, err
	}
	_, reconciles := builtinConnectors[f.connector]().(hostsdk.Reconciler)
	claims := map[string][]string{}
	for _, c := range f.manifest.Capabilities {
		claims[c.ID] = implementationClaims(&c, reconciles)
	}
	label := func(what string) string { return aip.DigestBytes([]byte("aipfleet dev " + what + " " + f.artifact)) }
	owner := "aipfleet-dev"
	passed := string(registry.EvidencePassed)
	doc := devFleetYAML{
		Format: registry.FleetFileFormat,
		Types:  []devTypeYAML{{ID: f.state.TypeID, Name: f.connector, Owner: owner}},
		Versions: []devVersionYAML{{
			ID: f.state.VersionID, ConnectorTypeID: f.state.TypeID, Version: "dev", Status: string(registry.VersionActive),
			Manifest: manifest, ImplementationSupport: claims,
			Attestation: devAttestationYAML{
				ArtifactDigest: f.artifact, SBOMDigest: label("sbom"), ProvenanceDigest: label("provenance"),
				ConformanceReportDigest: label("conformance"), VulnerabilityReportDigest: label("vulnerability"),
				LicenseReportDigest: label("license"), SignatureRef: "dev://unsigned/" + f.connector,
				SignerIdentity: "aipfleet dev", Owner: owner, SupportedAIPVersions: []string{registry.SupportedAIPVersion},
				SDKVersionRequirement: "^1.0", ConformanceStatus: passed,
				VulnerabilityPolicyStatus: passed, LicensePolicyStatus: passed, RevocationStatus: passed,
			},
		}},
		Instances: []devInstanceYAML{{ID: f.state.InstanceID, ConnectorTypeID: f.state.TypeID, VersionID: f.state.VersionID,
			TenantID: DevTenant, ConfigRevision: 1, SecretProviderRef: devSecretProviderOf + f.connector}},
	}
	for _, c := range f.manifest.Capabilities {
		doc.Bindings = append(doc.Bindings, devBindingYAML{TenantID: DevTenant, CapabilityID: c.ID, InstanceID: f.state.InstanceID, PolicyRevision: 1})
	}
	for i, id := range f.state.ReplicaIDs {
		doc.Replicas = append(doc.Replicas, devReplicaYAML{
			ID: id, InstanceID: f.state.InstanceID, Endpoint: "http://" + f.replicaAddr(i) + aip.MessagesPath,
			PeerPrincipalID: f.manifest.Agent.ID, PeerPrincipalKind: string(f.manifest.Agent.Kind), PeerDID: f.keys.replicaDIDs[i],
			TrustDomain: devTrustDomain, Capacity: devReplicaCapacity,
		})
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, devFleetHeader, f.connector, DevTenant)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// implementationClaims lists the features a built-in connector implements
// for a capability: what the registry requires of its contract
// (registry.RequiredSupport), plus reconciliation when the connector is a
// hostsdk.Reconciler.
func implementationClaims(c *aip.Capability, reconciles bool) []string {
	s := registry.RequiredSupport(c)
	s.Reconciliation = s.Reconciliation || reconciles
	features := []struct {
		on   bool
		name string
	}{
		{s.Invocation, "invocation"}, {s.Cancellation, "cancellation"}, {s.Streaming, "streaming"}, {s.Retry, "retry"},
		{s.Transaction, "transaction"}, {s.Reconciliation, "reconciliation"}, {s.Compensation, "compensation"},
		{s.Approval, "approval"}, {s.Credentials, "credentials"},
	}
	var claims []string
	for _, f := range features {
		if f.on {
			claims = append(claims, f.name)
		}
	}
	return claims
}
