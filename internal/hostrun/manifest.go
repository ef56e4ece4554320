package hostrun

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
)

// ManifestReport is what --print-manifest prints (aipfleet host, aip-host
// and aip-sidecar alike): the manifest a replica registers, bound to its
// trust domain, with what a fleet file's version entry needs beside it.
type ManifestReport struct {
	// ManifestDigest is the bound manifest's digest (the version's
	// manifest_digest).
	ManifestDigest string `json:"manifest_digest"`
	// CapabilityCount is the number of capabilities of Manifest,
	// resources included: what the replica's registrations carry, which
	// the control plane checks against the admitted manifest's. It is no
	// field of a fleet file (the registry counts the version's manifest).
	CapabilityCount int `json:"capability_count"`
	// ImplementationSupport holds, for every capability that is not a
	// resource, the features to claim in the version's
	// implementation_support: what the capability's contract needs
	// (registry.RequiredSupport), plus reconciliation when the connector
	// reconciles uncertain actions.
	ImplementationSupport map[string][]string `json:"implementation_support"`
	// Manifest is the bound manifest, for the version's manifest.
	Manifest *aip.Manifest `json:"manifest"`
}

// NewManifestReport builds the report of a bound manifest and its digest;
// reconciles says whether the connector is a hostsdk.Reconciler.
func NewManifestReport(bound *aip.Manifest, digest string, reconciles bool) *ManifestReport {
	support := map[string][]string{}
	for i := range bound.Capabilities {
		c := &bound.Capabilities[i]
		if c.Kind == aip.KindResource {
			continue
		}
		s := registry.RequiredSupport(c)
		s.Reconciliation = s.Reconciliation || reconciles
		support[c.ID] = registry.SupportFeatureNames(s)
	}
	return &ManifestReport{ManifestDigest: digest, CapabilityCount: len(bound.Capabilities), ImplementationSupport: support, Manifest: bound}
}

// DescribeConnector asks conn for its manifest for the tenant and trust
// domain of cfg (only those two settings are used) and binds it as the
// host's bootstrap would (hostsdk.BindManifest).
func DescribeConnector(ctx context.Context, conn hostsdk.Connector, cfg hostsdk.Config) (*ManifestReport, error) {
	tenant := hostsdk.TenantContext{TenantID: cfg.TenantID, TrustDomain: cfg.TrustDomain}
	m, err := conn.Manifest(ctx, tenant)
	if err != nil {
		return nil, fmt.Errorf("the connector's manifest: %w", err)
	}
	bound, digest, err := hostsdk.BindManifest(m, tenant.TrustDomain)
	if err != nil {
		return nil, fmt.Errorf("the connector's manifest: %w", err)
	}
	_, reconciles := conn.(hostsdk.Reconciler)
	return NewManifestReport(bound, digest, reconciles), nil
}

// Print writes the report as indented JSON and a newline.
func (r *ManifestReport) Print(w io.Writer) error {
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}
