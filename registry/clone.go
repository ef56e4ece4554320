package registry

import (
	"encoding/json"
	"slices"

	"github.com/aipfleet/aipfleet/aip"
)

func cloneRaw(r json.RawMessage) json.RawMessage { return slices.Clone(r) }

func cloneRaws(rs []json.RawMessage) []json.RawMessage {
	if rs == nil {
		return nil
	}
	out := make([]json.RawMessage, len(rs))
	for i, r := range rs {
		out[i] = cloneRaw(r)
	}
	return out
}

func clonePrincipal(p aip.Principal) aip.Principal {
	p.ExternalRefs = slices.Clone(p.ExternalRefs)
	if p.DelegatedAuthority != nil {
		d := make([]aip.DelegatedAuthority, len(p.DelegatedAuthority))
		for i, a := range p.DelegatedAuthority {
			a.Scopes = slices.Clone(a.Scopes)
			if a.ExpiresAt != nil {
				t := *a.ExpiresAt
				a.ExpiresAt = &t
			}
			d[i] = a
		}
		p.DelegatedAuthority = d
	}
	p.AuthContext = cloneRaw(p.AuthContext)
	return p
}

func cloneManifest(m aip.Manifest) aip.Manifest {
	m.Agent = clonePrincipal(m.Agent)
	if m.Capabilities != nil {
		caps := make([]aip.Capability, len(m.Capabilities))
		for i, c := range m.Capabilities {
			caps[i] = cloneCapability(c)
		}
		m.Capabilities = caps
	}
	m.Profiles = slices.Clone(m.Profiles)
	m.Resources = cloneRaws(m.Resources)
	m.Channels = cloneRaws(m.Channels)
	m.Security = cloneRaw(m.Security)
	m.Governance = cloneRaw(m.Governance)
	m.Limits = cloneRaw(m.Limits)
	m.Compatibility = cloneRaw(m.Compatibility)
	m.Extensions = cloneRaw(m.Extensions)
	return m
}

func cloneCapability(c aip.Capability) aip.Capability {
	c.InputSchema = cloneRaw(c.InputSchema)
	c.OutputSchema = cloneRaw(c.OutputSchema)
	c.Cost = cloneRaw(c.Cost)
	c.Auth = cloneRaw(c.Auth)
	if c.Bindings != nil {
		b := make([]aip.ProfileBinding, len(c.Bindings))
		for i, pb := range c.Bindings {
			if pb.Metadata != nil {
				md := make(map[string]json.RawMessage, len(pb.Metadata))
				for k, v := range pb.Metadata {
					md[k] = cloneRaw(v)
				}
				pb.Metadata = md
			}
			b[i] = pb
		}
		c.Bindings = b
	}
	if c.RequiresHumanApproval != nil {
		v := *c.RequiresHumanApproval
		c.RequiresHumanApproval = &v
	}
	if c.Contract != nil {
		k := cloneContract(*c.Contract)
		c.Contract = &k
	}
	return c
}

func cloneContract(k aip.CapabilityContract) aip.CapabilityContract {
	k.SideEffects = slices.Clone(k.SideEffects)
	if k.Idempotency.TTLMS != nil {
		v := *k.Idempotency.TTLMS
		k.Idempotency.TTLMS = &v
	}
	if k.Credentials != nil {
		c := *k.Credentials
		c.AcceptedIssuers = slices.Clone(c.AcceptedIssuers)
		c.RequiredScopes = slices.Clone(c.RequiredScopes)
		k.Credentials = &c
	}
	k.Approval = cloneRaw(k.Approval)
	if k.SLA != nil {
		s := *k.SLA
		s.ExpectedLatencyMS = clonePtr(s.ExpectedLatencyMS)
		s.TimeoutMS = clonePtr(s.TimeoutMS)
		s.MaxQueueDelayMS = clonePtr(s.MaxQueueDelayMS)
		s.AvailabilityTarget = clonePtr(s.AvailabilityTarget)
		k.SLA = &s
	}
	if k.Transaction != nil {
		t := *k.Transaction
		t.SupportedModes = slices.Clone(t.SupportedModes)
		k.Transaction = &t
	}
	if k.Compensation != nil {
		c := *k.Compensation
		c.CompensationWindowMS = clonePtr(c.CompensationWindowMS)
		k.Compensation = &c
	}
	return k
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}
