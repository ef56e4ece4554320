package main

import (
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
)

const devFleetHeader = `# The development fleet of aipfleet dev, regenerated and applied at every
# start (docs/fleet-file.md describes the format). It admits the %[1]s
# connector built into aipfleet as one version, gives tenant %[2]s one
# instance of it with a binding per capability, and pre-provisions one
# replica per "aipfleet host" process dev runs. Replicas are offline until
# their host registers; their endpoint and DID never change.
`

// fleet builds the dev fleet: the connector's type and version (its bound
// manifest, implementation claims derived from each capability's contract,
// a development attestation), the tenant's instance and bindings, and every
// replica of the state. The records are complete, as registry.ParseFleetFile
// would return them from fleet.yaml.
func (f *devFleet) fleet() (*registry.FleetFile, error) {
	manifestDigest, err := aip.ManifestDigest(&f.manifest)
	if err != nil {
		return nil, err
	}
	schemaDigest, err := registry.SchemaBundleDigest(&f.manifest)
	if err != nil {
		return nil, err
	}
	_, reconciles := builtinConnectors[f.connector]().(hostsdk.Reconciler)
	claims := map[string]aip.ImplementationSupport{}
	for _, c := range f.manifest.Capabilities {
		claims[c.ID] = implementationClaims(&c, reconciles)
	}
	label := func(what string) string { return aip.DigestBytes([]byte("aipfleet dev " + what + " " + f.artifact)) }
	const owner = "aipfleet-dev"
	fleet := &registry.FleetFile{
		Types: []registry.ConnectorType{{ID: f.state.TypeID, Name: f.connector, Owner: owner, Enabled: true}},
		Versions: []registry.ConnectorVersion{{
			ID: f.state.VersionID, ConnectorTypeID: f.state.TypeID, Version: "dev", Status: registry.VersionActive,
			Manifest: f.manifest, ManifestDigest: manifestDigest, ImplementationSupport: claims,
			Attestation: registry.ArtifactAttestation{
				ArtifactDigest: f.artifact, SchemaBundleDigest: schemaDigest, SBOMDigest: label("sbom"), ProvenanceDigest: label("provenance"),
				ConformanceReportDigest: label("conformance"), VulnerabilityReportDigest: label("vulnerability"),
				LicenseReportDigest: label("license"), SignatureRef: "dev://unsigned/" + f.connector,
				SignerIdentity: "aipfleet dev", Owner: owner, SupportedAIPVersions: []string{registry.SupportedAIPVersion},
				SDKVersionRequirement: "^1.0", ConformanceStatus: registry.EvidencePassed,
				VulnerabilityPolicyStatus: registry.EvidencePassed, LicensePolicyStatus: registry.EvidencePassed, RevocationStatus: registry.EvidencePassed,
			},
		}},
		Instances: []registry.ConnectorInstance{{ID: f.state.InstanceID, ConnectorTypeID: f.state.TypeID, VersionID: f.state.VersionID,
			TenantID: DevTenant, ConfigRevision: 1, SecretProviderRef: devSecretProviderOf + f.connector, Status: registry.InstanceEnabled}},
	}
	for _, c := range f.manifest.Capabilities {
		fleet.Bindings = append(fleet.Bindings, registry.CapabilityBinding{TenantID: DevTenant, CapabilityID: c.ID, InstanceID: f.state.InstanceID, PolicyRevision: 1, Enabled: true})
	}
	for i, id := range f.state.ReplicaIDs {
		fleet.Replicas = append(fleet.Replicas, registry.ConnectorReplica{
			ID: id, InstanceID: f.state.InstanceID, VersionID: f.state.VersionID, Endpoint: "http://" + f.replicaAddr(i) + aip.MessagesPath,
			PeerPrincipalID: f.manifest.Agent.ID, PeerPrincipalKind: f.manifest.Agent.Kind, PeerDID: f.keys.replicaDIDs[i],
			TrustDomain: devTrustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
			Status: aip.ReplicaOffline, Capacity: devReplicaCapacity,
		})
	}
	return fleet, nil
}

// fleetFile renders fleet as fleet.yaml: a header that says what it is,
// then registry.MarshalFleetFile's YAML.
func (f *devFleet) fleetFile(fleet *registry.FleetFile) ([]byte, error) {
	body, err := registry.MarshalFleetFile(fleet)
	if err != nil {
		return nil, err
	}
	return append(fmt.Appendf(nil, devFleetHeader, f.connector, DevTenant), body...), nil
}

// implementationClaims is what a built-in connector claims for a
// capability: what the registry requires of its contract
// (registry.RequiredSupport), plus reconciliation when the connector is a
// hostsdk.Reconciler.
func implementationClaims(c *aip.Capability, reconciles bool) aip.ImplementationSupport {
	s := registry.RequiredSupport(c)
	s.Reconciliation = s.Reconciliation || reconciles
	return s
}
