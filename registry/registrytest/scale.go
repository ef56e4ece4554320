package registrytest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// ScaleProfile describes a synthetic fleet. DefaultScaleProfile is the
// reference scale profile: 1 000 connector types (one active version each),
// 1 000 capabilities (100 per version), 10 000 instances with one replica
// each, 100 tenants, 10 bindings per instance (100 000 bindings).
type ScaleProfile struct {
	ConnectorTypes         int
	Capabilities           int
	CapabilitiesPerVersion int
	Instances              int
	ReplicasPerInstance    int
	Tenants                int
	BindingsPerInstance    int
	// ReplicaCapacity is every replica's capacity.
	ReplicaCapacity uint32
	// LeaseUntil is every replica's lease expiry; set it after the
	// backend's clock.
	LeaseUntil time.Time
	// Seed makes the fleet's random shape reproducible.
	Seed uint64
}

// DefaultScaleProfile returns the reference scale profile with leases until
// leaseUntil.
func DefaultScaleProfile(leaseUntil time.Time) ScaleProfile {
	return ScaleProfile{
		ConnectorTypes: 1000, Capabilities: 1000, CapabilitiesPerVersion: 100,
		Instances: 10_000, ReplicasPerInstance: 1, Tenants: 100, BindingsPerInstance: 10,
		ReplicaCapacity: 64, LeaseUntil: leaseUntil, Seed: 1,
	}
}

// ScalePolicyRef is the admission policy every scale binding uses: the
// fleet preset.
const ScalePolicyRef = "quota:scale"

// RouteTarget is a tenant and a capability the tenant has an enabled binding
// for.
type RouteTarget struct {
	TenantID     string
	CapabilityID string
}

// ScaleFleet describes what SeedScale created.
type ScaleFleet struct {
	Profile ScaleProfile
	Tenants []string
	// Bindings lists every binding's key, in creation order.
	Bindings []registry.BindingKey
	Replicas int
	// Targets lists every routable (tenant, capability), sorted.
	Targets []RouteTarget
	// Visible counts the capabilities each tenant's catalog shows.
	Visible map[string]int
}

// Validate checks the profile's proportions.
func (p *ScaleProfile) Validate() error {
	switch {
	case p.ConnectorTypes < 1, p.Capabilities < 1, p.Instances < 1, p.Tenants < 1, p.ReplicasPerInstance < 1, p.BindingsPerInstance < 1:
		return fmt.Errorf("registrytest: every scale profile count must be at least 1: %+v", *p)
	case p.CapabilitiesPerVersion < 1 || p.CapabilitiesPerVersion > p.Capabilities:
		return fmt.Errorf("registrytest: CapabilitiesPerVersion %d must be within 1..Capabilities (%d)", p.CapabilitiesPerVersion, p.Capabilities)
	case p.BindingsPerInstance > p.CapabilitiesPerVersion:
		return fmt.Errorf("registrytest: BindingsPerInstance %d exceeds CapabilitiesPerVersion %d", p.BindingsPerInstance, p.CapabilitiesPerVersion)
	case p.ReplicaCapacity < 1:
		return fmt.Errorf("registrytest: ReplicaCapacity must be at least 1")
	case p.LeaseUntil.IsZero():
		return fmt.Errorf("registrytest: set LeaseUntil after the backend's clock")
	}
	return nil
}

// ScaleCapabilityID returns the ID of scale capability j.
func ScaleCapabilityID(j int) string { return fmt.Sprintf("scale.cap%05d", j) }

// SeedScale creates the profile's fleet through any Administrator: one
// fleet-preset policy, the types with one active version each, the
// instances, their bindings and ready replicas. The same profile always
// yields the same fleet.
func SeedScale(ctx context.Context, admin registry.Administrator, p ScaleProfile) (*ScaleFleet, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(p.Seed, 0x5ca1e))
	pol := registry.FleetPolicy(ScalePolicyRef)
	if err := admin.PutAdmissionPolicy(ctx, pol); err != nil {
		return nil, fmt.Errorf("seed policy: %w", err)
	}
	caps := make([]aip.Capability, p.Capabilities)
	for j := range caps {
		caps[j] = Capability(ScaleCapabilityID(j), fmt.Sprintf("scale capability number %d", j))
	}
	versions := make([]registry.ConnectorVersion, p.ConnectorTypes)
	versionCaps := make([][]int, p.ConnectorTypes)
	for i := range p.ConnectorTypes {
		t := registry.ConnectorType{ID: fmt.Sprintf("ctype_scale%04d", i), Name: fmt.Sprintf("scale-%04d", i), Owner: "owner-scale", Enabled: true}
		if err := admin.PutConnectorType(ctx, t); err != nil {
			return nil, fmt.Errorf("seed type %s: %w", t.ID, err)
		}
		set := map[int]bool{i % p.Capabilities: true}
		for len(set) < p.CapabilitiesPerVersion {
			set[rng.IntN(p.Capabilities)] = true
		}
		idx := make([]int, 0, len(set))
		for j := range set {
			idx = append(idx, j)
		}
		slices.Sort(idx)
		versionCaps[i] = idx
		mc := make([]aip.Capability, len(idx))
		for k, j := range idx {
			mc[k] = caps[j]
		}
		v := Version(fmt.Sprintf("cver_scale%04d", i), t.ID, "1.0.0", t.Owner, registry.VersionActive, Manifest("service:"+t.Name, mc))
		if err := admin.AdmitVersion(ctx, v); err != nil {
			return nil, fmt.Errorf("seed version %s: %w", v.ID, err)
		}
		versions[i] = v
	}
	f := &ScaleFleet{Profile: p, Visible: map[string]int{}}
	for t := range p.Tenants {
		f.Tenants = append(f.Tenants, fmt.Sprintf("tenant-%03d", t))
	}
	targets := map[RouteTarget]bool{}
	regions := []string{"region-a", "region-b", "region-c"}
	zones := []string{"zone-1", "zone-2"}
	for k := range p.Instances {
		ti := rng.IntN(p.ConnectorTypes)
		v := versions[ti]
		inst := registry.ConnectorInstance{
			ID: fmt.Sprintf("cinst_scale%05d", k), ConnectorTypeID: v.ConnectorTypeID, VersionID: v.ID,
			TenantID: f.Tenants[k%p.Tenants], ConfigRevision: 1, SecretProviderRef: fmt.Sprintf("secret://scale/%05d", k),
			Status: registry.InstanceEnabled,
		}
		if err := admin.PutInstance(ctx, inst); err != nil {
			return nil, fmt.Errorf("seed instance %s: %w", inst.ID, err)
		}
		for _, n := range rng.Perm(len(versionCaps[ti]))[:p.BindingsPerInstance] {
			b := registry.CapabilityBinding{
				TenantID: inst.TenantID, CapabilityID: ScaleCapabilityID(versionCaps[ti][n]), InstanceID: inst.ID,
				Priority: uint32(rng.IntN(4)), PolicyRevision: 1, QuotaPolicyRef: ScalePolicyRef, Enabled: true,
			}
			if err := admin.PutBinding(ctx, b); err != nil {
				return nil, fmt.Errorf("seed binding %s: %w", b.Key(), err)
			}
			f.Bindings = append(f.Bindings, b.Key())
			targets[RouteTarget{TenantID: b.TenantID, CapabilityID: b.CapabilityID}] = true
		}
		for n := range p.ReplicasPerInstance {
			id := fmt.Sprintf("crepl_scale%05d_%d", k, n)
			r := Replica(id, inst.ID, inst.VersionID, p.LeaseUntil)
			r.Capacity = p.ReplicaCapacity
			r.Topology = aip.Topology{Region: regions[rng.IntN(len(regions))], Zone: zones[rng.IntN(len(zones))], CapacityClass: aip.DefaultCapacityClass}
			if err := admin.PutReplica(ctx, r); err != nil {
				return nil, fmt.Errorf("seed replica %s: %w", id, err)
			}
			f.Replicas++
		}
	}
	for t := range targets {
		f.Targets = append(f.Targets, t)
		f.Visible[t.TenantID]++
	}
	slices.SortFunc(f.Targets, func(a, b RouteTarget) int {
		if a.TenantID != b.TenantID {
			if a.TenantID < b.TenantID {
				return -1
			}
			return 1
		}
		if a.CapabilityID < b.CapabilityID {
			return -1
		}
		if a.CapabilityID > b.CapabilityID {
			return 1
		}
		return 0
	})
	return f, nil
}
