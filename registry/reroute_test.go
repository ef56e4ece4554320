package registry_test

import (
	"errors"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func rerouteAssignment() registry.RouteAssignment {
	rep := registrytest.Replica("crepl_r1", "cinst_a", "cver_a", registrytest.Epoch.Add(time.Minute))
	return registry.RouteAssignment{
		ActionID: aip.NewActionID(), CapabilityID: "alpha.read", TenantID: "tenant-1",
		InstanceID: rep.InstanceID, VersionID: rep.VersionID, ManifestDigest: registrytest.Digest("manifest"),
		ReplicaID: rep.ID, Endpoint: rep.Endpoint, PeerPrincipalID: rep.PeerPrincipalID, PeerPrincipalKind: rep.PeerPrincipalKind,
		PeerDID: rep.PeerDID, TrustDomain: rep.TrustDomain, TransportProfile: rep.TransportProfile, Topology: rep.Topology,
		CatalogRevision: 3, BindingPolicyRevision: 1, ReplicaHealthRevision: 2, FenceToken: aip.NewID(aip.PrefixRoute),
	}
}

func TestCheckRefusalAccepts(t *testing.T) {
	for _, code := range []string{registry.RefusalNotReady, registry.RefusalCapacity} {
		a := rerouteAssignment()
		p := registrytest.NewEvidenceParts(a, code)
		ref, err := registry.CheckRefusal(&a, new(p.Sign()))
		if err != nil {
			t.Fatalf("%s: %v", code, err)
		}
		if ref.Code != code || ref.MessageID != p.Request.MessageID || ref.ResponseID != p.Response.MessageID || ref.RetryAfter != 100*time.Millisecond {
			t.Fatalf("%s: refusal = %+v", code, ref)
		}
	}
}

func TestCheckRefusalBindsTheWholeRoute(t *testing.T) {
	// Every pinned coordinate of the request's route must be the
	// assignment's: evidence for a route with any one of them changed is
	// refused.
	mods := map[string]func(*aip.ConnectorRoute){
		"capability_id":   func(r *aip.ConnectorRoute) { r.CapabilityID = "alpha.write" },
		"tenant_id":       func(r *aip.ConnectorRoute) { r.TenantID = "tenant-2" },
		"instance_id":     func(r *aip.ConnectorRoute) { r.InstanceID = "cinst_b" },
		"replica_id":      func(r *aip.ConnectorRoute) { r.ReplicaID = "crepl_r2" },
		"version_id":      func(r *aip.ConnectorRoute) { r.VersionID = "cver_b" },
		"manifest_digest": func(r *aip.ConnectorRoute) { r.ManifestDigest = registrytest.Digest("other") },
		"fence_token":     func(r *aip.ConnectorRoute) { r.FenceToken = aip.NewID(aip.PrefixRoute) },
	}
	for field, mod := range mods {
		a := rerouteAssignment()
		p := registrytest.NewEvidenceParts(a, registry.RefusalNotReady)
		route := a.Route(nil)
		mod(&route)
		if err := p.Request.SetSecurity(aip.SecurityConnectorRoute, route); err != nil {
			t.Fatal(err)
		}
		if _, err := registry.CheckRefusal(&a, new(p.Sign())); !errors.Is(err, registry.ErrEvidence) {
			t.Errorf("route with another %s: %v, want ErrEvidence", field, err)
		}
	}
}

func TestCheckRefusalRejectsOtherAnswers(t *testing.T) {
	a := rerouteAssignment()
	// A signed result is an answer, not a refusal.
	p := registrytest.NewEvidenceParts(a, registry.RefusalNotReady)
	p.Response.Body = aip.Body{ActionResult: &aip.ActionResult{ActionID: a.ActionID, Status: aip.ResultCompleted}}
	p.Response.MessageType = aip.TypeActionResult
	if _, err := registry.CheckRefusal(&a, new(p.Sign())); !errors.Is(err, registry.ErrEvidence) {
		t.Fatalf("a result as evidence: %v, want ErrEvidence", err)
	}
	// A refusal signed by the right key but claiming another principal.
	p = registrytest.NewEvidenceParts(a, registry.RefusalNotReady)
	p.Response.From = &aip.Principal{ID: "service:other", Kind: aip.PrincipalService}
	if _, err := registry.CheckRefusal(&a, new(p.Sign())); !errors.Is(err, registry.ErrEvidence) {
		t.Fatalf("a refusal from another principal: %v, want ErrEvidence", err)
	}
	// Tampering with a signed refusal breaks its signature.
	ev := registrytest.RefusalEvidence(a, registry.RefusalCapacity)
	tampered := []byte(string(ev.Response))
	for i := range tampered {
		if string(tampered[i:i+8]) == "capacity" {
			copy(tampered[i:], "notready")
			break
		}
	}
	if _, err := registry.CheckRefusal(&a, &registry.RefusalEvidence{Request: ev.Request, Response: tampered}); !errors.Is(err, registry.ErrEvidence) {
		t.Fatalf("a tampered refusal: %v, want ErrEvidence", err)
	}
}
