package registrytest

import (
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// GatewayKey is the dispatcher key evidence requests are signed with.
func GatewayKey() *aip.SigningKey { return Key("registrytest gateway") }

// GatewayPrincipal is the dispatcher principal evidence requests come from.
const GatewayPrincipal = "service:registrytest-gateway"

// EvidenceParts are the two envelopes of refusal evidence before signing,
// so tests can tamper with them.
type EvidenceParts struct {
	// Request is the dispatcher's action envelope, signed with RequestKey.
	Request    *aip.Envelope
	RequestKey *aip.SigningKey
	// Response is the replica's error envelope, signed with ResponseKey.
	Response    *aip.Envelope
	ResponseKey *aip.SigningKey
}

// NewEvidenceParts returns the envelopes of a refusal of a's action with
// code, as a dispatcher and the replica (key Key(a.ReplicaID)) build them:
// the request carries a's route, the response answers it.
func NewEvidenceParts(a registry.RouteAssignment, code string) *EvidenceParts {
	now := time.Now()
	gw := GatewayKey()
	req, err := aip.NewEnvelope(now, aip.Body{Action: &aip.Action{
		ID: a.ActionID, CapabilityID: a.CapabilityID, Input: []byte(`{"text":"hello"}`),
		Identity: &aip.IdentityContext{Tenant: &aip.TenantRef{ID: a.TenantID}},
	}})
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	req.From = &aip.Principal{ID: GatewayPrincipal, Kind: aip.PrincipalService, TrustDomain: a.TrustDomain, DID: gw.DID()}
	req.To = &aip.Principal{ID: a.PeerPrincipalID, Kind: a.PeerPrincipalKind}
	req.CorrelationID = aip.NewID(aip.PrefixCorrelation)
	if err := req.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil)); err != nil {
		panic("registrytest: " + err.Error())
	}
	pe := aip.NewProtocolError(code, aip.CategoryTemporary, true, 100, "refused before anything ran")
	resp, err := aip.NewEnvelope(now, aip.Body{Error: &aip.ErrorBody{Error: *pe}})
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	resp.InResponseTo = &aip.MessageReference{Message: req.MessageID}
	resp.CorrelationID = req.CorrelationID
	resp.To = req.From
	resp.From = &aip.Principal{ID: a.PeerPrincipalID, Kind: a.PeerPrincipalKind, TrustDomain: a.TrustDomain, DID: a.PeerDID}
	return &EvidenceParts{Request: req, RequestKey: gw, Response: resp, ResponseKey: Key(a.ReplicaID)}
}

// Sign signs both envelopes and returns the evidence.
func (p *EvidenceParts) Sign() registry.RefusalEvidence {
	req, err := aip.SignEnvelope(p.RequestKey, p.Request)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	resp, err := aip.SignEnvelope(p.ResponseKey, p.Response)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return registry.RefusalEvidence{Request: req, Response: resp}
}

// RefusalEvidence returns valid evidence that a's replica refused a's action
// with code (registry.RefusalNotReady or registry.RefusalCapacity).
func RefusalEvidence(a registry.RouteAssignment, code string) registry.RefusalEvidence {
	return NewEvidenceParts(a, code).Sign()
}

func runReroute(t *testing.T, nb NewBackend) {
	for _, c := range []struct {
		name string
		fn   func(*testing.T, NewBackend)
	}{
		{"MovesToAnotherReplica", testRerouteMoves},
		{"FollowsNewRouteOrder", testRerouteOrder},
		{"EvidenceRejected", testRerouteEvidence},
		{"UnsafeAfterSecondResolve", testRerouteUnsafe},
		{"FenceLost", testRerouteFenceLost},
		{"NoOtherReplica", testRerouteNoReplica},
		{"CapacityIsReleasedFirst", testRerouteCapacity},
		{"CapacityExceededChangesNothing", testRerouteCapacityExceeded},
		{"AfterLeaseExpiry", testRerouteAfterExpiry},
		{"HistoryBound", testRerouteHistoryBound},
		{"UnknownAction", testRerouteUnknown},
		{"RacesWithResolve", testRerouteRace},
		{"Unsent", testRerouteUnsent},
		{"Pinned", testReroutePinned},
	} {
		t.Run(c.name, func(t *testing.T) { c.fn(t, nb) })
	}
}

func (f *fx) rerouter() registry.Rerouter { return f.b.Rerouter }

func (f *fx) reroute(a registry.RouteAssignment, code string) (registry.RouteAssignment, error) {
	return f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Evidence: RefusalEvidence(a, code)})
}

func (f *fx) history(actionID string) []registry.RouteAssignment {
	f.t.Helper()
	h, err := f.rerouter().RouteHistory(f.ctx, actionID)
	f.must(err)
	return h
}

// unchanged fails unless the action's current assignment is still a, its
// reservation is still res and it has no history beyond hist.
func (f *fx) unchanged(a registry.RouteAssignment, res registry.RouteReservation, hist int, what string) {
	f.t.Helper()
	cur, err := f.b.Resolver.Assignment(f.ctx, a.ActionID)
	f.must(err)
	if !cur.Equal(&a) {
		f.t.Fatalf("%s: the current assignment changed to replica %s fence %s", what, cur.ReplicaID, cur.FenceToken)
	}
	if got := f.reservation(a.ActionID); got.Reserved != res.Reserved || got.Retry != res.Retry || got.LastSettlement != res.LastSettlement {
		f.t.Fatalf("%s: the reservation changed from %+v to %+v", what, res, got)
	}
	if h := f.history(a.ActionID); len(h) != hist {
		f.t.Fatalf("%s: the history has %d assignments, want %d", what, len(h), hist)
	}
}

// twoReplicas builds a route world with replicas r1 and r2 of one instance.
func twoReplicas(f *fx, policy *registry.AdmissionPolicy) (routeWorld, registry.ConnectorReplica, registry.ConnectorReplica) {
	w := newRouteWorld(f, policy)
	r1 := f.replica("r1", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10 })
	r2 := f.replica("r2", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 10 })
	return w, r1, r2
}

func other(a registry.RouteAssignment, r1, r2 registry.ConnectorReplica) registry.ConnectorReplica {
	if a.ReplicaID == r1.ID {
		return r2
	}
	return r1
}

func testRerouteMoves(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	w, r1, r2 := twoReplicas(f, &pol)
	req := request("tenant-1", "alpha.read")
	old := f.resolve(req)
	want := other(old, r1, r2)
	f.clock.Advance(250 * time.Millisecond)
	next, err := f.reroute(old, registry.RefusalNotReady)
	f.must(err)
	if next.ReplicaID != want.ID {
		t.Fatalf("rerouted to %s, want the other replica %s", next.ReplicaID, want.ID)
	}
	if next.FenceToken == old.FenceToken || aip.ValidateID(aip.PrefixRoute, next.FenceToken) != nil {
		t.Fatalf("new fence token %q must be a fresh route_ ID (old %q)", next.FenceToken, old.FenceToken)
	}
	if next.ActionID != old.ActionID || next.TenantID != old.TenantID || next.CapabilityID != old.CapabilityID ||
		next.InstanceID != w.i.ID || next.PeerDID != want.PeerDID || next.Endpoint != want.Endpoint ||
		next.CatalogRevision != f.revision() || !next.AssignedAt.Equal(f.clock.Now()) {
		t.Fatalf("new assignment %+v does not describe the new replica at now", next)
	}
	if next.Admission.PolicyRef != "quota:c" || len(next.Admission.BaseScopes) != len(old.Admission.BaseScopes) {
		t.Fatalf("new assignment admission %+v, want the binding's base scopes", next.Admission)
	}
	// The new assignment is current; the old one is history.
	cur, err := f.b.Resolver.Assignment(f.ctx, req.ActionID)
	f.must(err)
	if !cur.Equal(&next) {
		t.Fatalf("Assignment = fence %s, want the new fence %s", cur.FenceToken, next.FenceToken)
	}
	if h := f.history(req.ActionID); len(h) != 1 || !h[0].Equal(&old) {
		t.Fatalf("history = %+v, want exactly the old assignment", h)
	}
	// Capacity moved with it: the new route is reserved (not as a retry),
	// the refusing replica holds nothing.
	if res := f.reservation(req.ActionID); !res.Reserved || res.Retry || res.ReplicaID != want.ID || res.LastSettlement != "" {
		t.Fatalf("reservation after reroute = %+v", res)
	}
	if got := f.getReplica(old.ReplicaID).ActiveAssignments; got != 0 {
		t.Fatalf("refusing replica keeps %d active assignments", got)
	}
	if got := f.getReplica(want.ID).ActiveAssignments; got != 1 {
		t.Fatalf("new replica has %d active assignments, want 1", got)
	}
	f.checkLedger(r1.ID, r2.ID)
	// Resolve returns the current assignment; the old one cannot settle.
	if again := f.resolve(req); !again.Equal(&next) {
		t.Fatalf("Resolve after reroute = fence %s, want %s", again.FenceToken, next.FenceToken)
	}
	f.wantErr(f.b.Resolver.Settle(f.ctx, old, registry.SettlementCompleted), registry.ErrFenceLost, "settling the superseded assignment")
	f.settle(next, registry.SettlementCompleted)
	if l := f.checkLedger(r1.ID, r2.ID); len(l.Reservations) != 0 || len(l.Counters) != 0 {
		t.Fatalf("ledger after settlement = %+v, want empty", l)
	}
	// The refusal does not count against the refusing replica's circuit.
	if c := f.getReplica(old.ReplicaID).Circuit; c != (registry.CircuitState{}) {
		t.Fatalf("refusing replica circuit = %+v, want untouched", c)
	}
}

func testRerouteOrder(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	hi := f.instance("hi", v, "tenant-1")
	lo := f.instance("lo", v, "tenant-1")
	f.bind(hi, "alpha.read", 0, "")
	f.bind(lo, "alpha.read", 1, "")
	big := func(r *registry.ConnectorReplica) { r.Capacity = 50 }
	hiReps := []registry.ConnectorReplica{f.replica("h1", hi, big), f.replica("h2", hi, big), f.replica("h3", hi, big)}
	loRep := f.replica("l1", lo, big)
	drained := f.replica("h4", hi, big)
	f.update(drained.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	for range 12 {
		req := request("tenant-1", "alpha.read")
		a := f.resolve(req)
		// The next choice: the priority-0 instance's ready replicas minus
		// the refusing one, in CompareCandidates order (all equally loaded
		// before this action, minus its own reservation which moves).
		rest := slices.DeleteFunc(slices.Clone(hiReps), func(r registry.ConnectorReplica) bool { return r.ID == a.ReplicaID })
		want := slices.MinFunc(rest, func(x, y registry.ConnectorReplica) int {
			cx := registry.RouteCandidate{InstanceID: x.InstanceID, ReplicaID: x.ID, Topology: x.Topology, Active: f.getReplica(x.ID).ActiveAssignments}
			cy := registry.RouteCandidate{InstanceID: y.InstanceID, ReplicaID: y.ID, Topology: y.Topology, Active: f.getReplica(y.ID).ActiveAssignments}
			return registry.CompareCandidates(&req.Topology, req.ActionID, &cx, &cy)
		})
		next, err := f.reroute(a, registry.RefusalCapacity)
		f.must(err)
		if next.ReplicaID != want.ID {
			t.Fatalf("action %s rerouted from %s to %s, want %s (new-route order without the refusing replica)", req.ActionID, a.ReplicaID, next.ReplicaID, want.ID)
		}
		f.settle(next, registry.SettlementCompleted) // keep loads equal
	}
	// With every priority-0 replica but the refusing one gone, the next
	// priority takes it; the draining replica never does.
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	for _, r := range hiReps {
		if r.ID != a.ReplicaID {
			f.update(r.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaOffline })
		}
	}
	next, err := f.reroute(a, registry.RefusalNotReady)
	f.must(err)
	if next.ReplicaID != loRep.ID || next.InstanceID != lo.ID {
		t.Fatalf("rerouted to %s, want the priority-1 replica %s", next.ReplicaID, loRep.ID)
	}
	f.checkLedger(append([]string{loRep.ID, drained.ID}, hiReps[0].ID, hiReps[1].ID, hiReps[2].ID)...)
}

func testRerouteEvidence(t *testing.T, nb NewBackend) {
	type tamper func(p *EvidenceParts, a registry.RouteAssignment)
	cases := []struct {
		name string
		fn   tamper
	}{
		{"not a refusal", func(p *EvidenceParts, _ registry.RouteAssignment) {
			p.Response.Body.Error.Error.Code = "connector_host.execution"
		}},
		{"signed by another key", func(p *EvidenceParts, _ registry.RouteAssignment) { p.ResponseKey = Key("impostor") }},
		{"signed by the dispatcher", func(p *EvidenceParts, _ registry.RouteAssignment) { p.ResponseKey = p.RequestKey }},
		{"answers another message", func(p *EvidenceParts, _ registry.RouteAssignment) {
			p.Response.InResponseTo = &aip.MessageReference{Message: aip.NewMessageID()}
		}},
		{"another fence", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.FenceToken = aip.NewID(aip.PrefixRoute)
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"another replica in the route", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.ReplicaID = "crepl_elsewhere"
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"another action", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.ActionID = aip.NewActionID()
			p.Request.Body.Action.ID = a.ActionID
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"a cancel, not an action", func(p *EvidenceParts, a registry.RouteAssignment) {
			p.Request.Body = aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: a.ActionID}}}
			p.Request.MessageType = aip.TypeCancel
		}},
		{"addressed to another principal", func(p *EvidenceParts, _ registry.RouteAssignment) {
			p.Request.To = &aip.Principal{ID: "service:someone-else", Kind: aip.PrincipalService}
		}},
		{"response echoes another fence", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.FenceToken = aip.NewID(aip.PrefixRoute)
			p.Response.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"response echoes another action", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.ActionID = aip.NewActionID()
			p.Response.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"response from another principal", func(p *EvidenceParts, _ registry.RouteAssignment) {
			p.Response.From = &aip.Principal{ID: "service:someone-else", Kind: aip.PrincipalService}
		}},
		{"response is a result, not an error", func(p *EvidenceParts, a registry.RouteAssignment) {
			p.Response.Body = aip.Body{ActionResult: &aip.ActionResult{ActionID: a.ActionID, Status: aip.ResultFailed,
				Error: aip.NewProtocolError(registry.RefusalNotReady, aip.CategoryTemporary, true, 100, "refused")}}
			p.Response.MessageType = aip.TypeActionResult
		}},
		{"a refusal code in another namespace", func(p *EvidenceParts, _ registry.RouteAssignment) {
			p.Response.Body.Error.Error.Code = "dispatch.not_ready"
		}},
		{"another tenant in the route", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.TenantID = "tenant-2"
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"another version in the route", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.VersionID, a.ManifestDigest = "cver_other", Digest("other manifest")
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"another capability", func(p *EvidenceParts, a registry.RouteAssignment) {
			a.CapabilityID = "alpha.write"
			p.Request.Body.Action.CapabilityID = a.CapabilityID
			p.Request.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil))
		}},
		{"no route in the request", func(p *EvidenceParts, _ registry.RouteAssignment) {
			delete(p.Request.Security, aip.SecurityConnectorRoute)
		}},
	}
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	for _, c := range cases {
		req := request("tenant-1", "alpha.read")
		a := f.resolve(req)
		res := f.reservation(req.ActionID)
		p := NewEvidenceParts(a, registry.RefusalNotReady)
		c.fn(p, a)
		_, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Evidence: p.Sign()})
		f.wantErr(err, registry.ErrEvidence, c.name)
		f.unchanged(a, res, 0, c.name)
	}
	// Unsigned, truncated and missing evidence.
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	res := f.reservation(req.ActionID)
	good := RefusalEvidence(a, registry.RefusalCapacity)
	for name, ev := range map[string]registry.RefusalEvidence{
		"no response":        {Request: good.Request},
		"no request":         {Response: good.Response},
		"unsigned response":  {Request: good.Request, Response: []byte(`{"error":{"code":"connector_host.not_ready","message":"x","category":"temporary"}}`)},
		"truncated response": {Request: good.Request, Response: good.Response[:len(good.Response)-2]},
		"unsigned request":   {Request: unsigned(good.Request), Response: good.Response},
		"swapped":            {Request: good.Response, Response: good.Request},
	} {
		_, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Evidence: ev})
		f.wantErr(err, registry.ErrEvidence, name)
		f.unchanged(a, res, 0, name)
	}
	// An echoed route that matches is fine.
	p := NewEvidenceParts(a, registry.RefusalCapacity)
	f.must(p.Response.SetSecurity(aip.SecurityConnectorRoute, a.Route(nil)))
	_, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Evidence: p.Sign()})
	f.must(err)
	f.checkLedger(r1.ID, r2.ID)
}

// unsigned returns a signed envelope without its security.signature.
func unsigned(raw []byte) []byte {
	var env map[string]any
	if err := json.Unmarshal(raw, &env); err != nil {
		panic("registrytest: " + err.Error())
	}
	delete(env["security"].(map[string]any), aip.SecuritySignature)
	out, err := json.Marshal(env)
	if err != nil {
		panic("registrytest: " + err.Error())
	}
	return out
}

func testRerouteUnsafe(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	// A concurrent duplicate (or a retry while reserved) resolved it again.
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	f.resolve(req)
	res := f.reservation(req.ActionID)
	_, err := f.reroute(a, registry.RefusalNotReady)
	f.wantErr(err, registry.ErrRerouteUnsafe, "reroute after a second resolve")
	f.unchanged(a, res, 0, "unsafe reroute")
	// A retry after settlement (the pinned replica re-reserved).
	req = request("tenant-1", "alpha.read")
	a = f.resolve(req)
	f.settle(a, registry.SettlementOutcomeUnknown)
	f.resolve(req)
	res = f.reservation(req.ActionID)
	_, err = f.reroute(a, registry.RefusalCapacity)
	f.wantErr(err, registry.ErrRerouteUnsafe, "reroute of a retried route")
	f.unchanged(a, res, 0, "unsafe reroute of a retry")
	// A resolve that failed (the pinned replica unavailable) handed nothing
	// out: the route can still be rerouted.
	req = request("tenant-1", "alpha.read")
	a = f.resolve(req)
	_, err = f.b.Resolver.Resolve(f.ctx, registry.RouteRequest{ActionID: req.ActionID, TenantID: "tenant-2", CapabilityID: "alpha.read"})
	f.wantErr(err, registry.ErrConflict, "resolve with another tenant")
	if _, err := f.reroute(a, registry.RefusalCapacity); err != nil {
		t.Fatalf("reroute after a refused resolve: %v", err)
	}
	// After a reroute the new assignment has been handed out once: it can
	// be rerouted again, until it is resolved again.
	next := f.resolve(request("tenant-1", "alpha.read"))
	moved, err := f.reroute(next, registry.RefusalNotReady)
	f.must(err)
	if _, err := f.reroute(moved, registry.RefusalNotReady); err != nil {
		t.Fatalf("second reroute of a fresh assignment: %v", err)
	}
	f.checkLedger(r1.ID, r2.ID)
}

func testRerouteFenceLost(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	next, err := f.reroute(a, registry.RefusalNotReady)
	f.must(err)
	res := f.reservation(req.ActionID)
	// The superseded assignment, with perfectly good evidence, cannot move
	// the route again.
	_, err = f.reroute(a, registry.RefusalNotReady)
	f.wantErr(err, registry.ErrFenceLost, "reroute of a superseded assignment")
	f.unchanged(next, res, 1, "stale reroute")
	// Nor can an altered copy of the current one (evidence built for it).
	forged := next
	forged.ReplicaHealthRevision++
	_, err = f.reroute(forged, registry.RefusalNotReady)
	f.wantErr(err, registry.ErrFenceLost, "reroute of an altered assignment")
	f.unchanged(next, res, 1, "forged reroute")
	f.checkLedger(r1.ID, r2.ID)
}

func testRerouteNoReplica(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	only := f.replica("only", w.i)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	res := f.reservation(req.ActionID)
	_, err := f.reroute(a, registry.RefusalNotReady)
	f.wantErr(err, registry.ErrReplicaUnavailable, "reroute without another replica")
	f.unchanged(a, res, 0, "reroute without another replica")
	// A full or draining alternative is no alternative either.
	full := f.replica("full", w.i, func(r *registry.ConnectorReplica) { r.Capacity = 1 })
	f.resolve(request("tenant-1", "alpha.read")) // takes the full replica's slot or only's
	f.update(full.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	_, err = f.reroute(a, registry.RefusalCapacity)
	f.wantErr(err, registry.ErrReplicaUnavailable, "reroute with only a draining alternative")
	f.unchanged(a, res, 0, "reroute with only a draining alternative")
	f.checkLedger(only.ID, full.ID)
}

func testRerouteCapacity(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.FleetPolicy("quota:one")
	pol.MaxTenantInFlight, pol.MaxBindingInFlight, pol.MaxInstanceInFlight = 1, 1, 1
	_, r1, r2 := twoReplicas(f, &pol)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	_, err := f.b.Resolver.Resolve(f.ctx, request("tenant-1", "alpha.read"))
	f.wantErr(err, registry.ErrCapacityExceeded, "second action at tenant limit 1")
	// The action's own scopes are released before the new route reserves
	// them, so a reroute fits under limits of one.
	next, err := f.reroute(a, registry.RefusalCapacity)
	f.must(err)
	if next.ReplicaID == a.ReplicaID {
		t.Fatalf("rerouted to the refusing replica %s", a.ReplicaID)
	}
	f.checkLedger(r1.ID, r2.ID)
}

func testRerouteCapacityExceeded(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("alpha")
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	pol := registry.FleetPolicy("quota:narrow")
	pol.MaxBindingInFlight = 1
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, pol))
	main := f.instance("main", v, "tenant-1")
	spare := f.instance("spare", v, "tenant-1")
	f.bind(main, "alpha.read", 0, "")
	f.bind(spare, "alpha.read", 1, pol.PolicyRef)
	m := f.replica("m", main)
	s := f.replica("s", spare)
	// Fill the spare binding's single slot while the main replica drains.
	f.update(m.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaDraining })
	if x := f.resolve(request("tenant-1", "alpha.read")); x.ReplicaID != s.ID {
		t.Fatalf("filler routed to %s, want %s", x.ReplicaID, s.ID)
	}
	f.update(m.ID, func(r *registry.ConnectorReplica) { r.Status = aip.ReplicaReady })
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	if a.ReplicaID != m.ID {
		t.Fatalf("action routed to %s, want %s", a.ReplicaID, m.ID)
	}
	res := f.reservation(req.ActionID)
	_, err := f.reroute(a, registry.RefusalNotReady)
	var ce *registry.CapacityExceededError
	if !errors.As(err, &ce) || ce.Scope != registry.ScopeBinding {
		t.Fatalf("reroute onto a full binding: %v, want a binding *CapacityExceededError", err)
	}
	f.unchanged(a, res, 0, "reroute onto a full binding")
	if got := f.getReplica(m.ID).ActiveAssignments; got != 1 {
		t.Fatalf("refusing replica has %d active assignments after the failed reroute, want 1 (restored)", got)
	}
	f.checkLedger(m.ID, s.ID)
}

func testRerouteAfterExpiry(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	short := f.replica("short", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Second) })
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	long := f.replica("long", w.i, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	f.clock.Advance(2 * time.Second)
	n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n != 1 {
		t.Fatalf("expired %d replicas, want 1", n)
	}
	if res := f.reservation(req.ActionID); res.Reserved || res.LastSettlement != registry.SettlementLeaseExpired {
		t.Fatalf("reservation after expiry = %+v", res)
	}
	next, err := f.reroute(a, registry.RefusalNotReady)
	f.must(err)
	if next.ReplicaID != long.ID {
		t.Fatalf("rerouted to %s, want %s", next.ReplicaID, long.ID)
	}
	if res := f.reservation(req.ActionID); !res.Reserved || res.Retry {
		t.Fatalf("reservation after reroute = %+v", res)
	}
	f.checkLedger(short.ID, long.ID)
}

func testRerouteHistoryBound(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	req := request("tenant-1", "alpha.read")
	a := f.resolve(req)
	fences := map[string]bool{a.FenceToken: true}
	for i := range registry.MaxRouteHistory {
		next, err := f.reroute(a, registry.RefusalCapacity)
		if err != nil {
			t.Fatalf("reroute %d: %v", i+1, err)
		}
		if next.ReplicaID == a.ReplicaID || fences[next.FenceToken] {
			t.Fatalf("reroute %d stayed on %s or reused a fence", i+1, a.ReplicaID)
		}
		fences[next.FenceToken] = true
		a = next
	}
	res := f.reservation(req.ActionID)
	_, err := f.reroute(a, registry.RefusalCapacity)
	f.wantErr(err, registry.ErrConflict, "reroute beyond the history bound")
	f.unchanged(a, res, registry.MaxRouteHistory, "reroute beyond the history bound")
	h := f.history(req.ActionID)
	for i := 1; i < len(h); i++ {
		if h[i].ReplicaID == h[i-1].ReplicaID {
			t.Fatalf("history %d and %d are both on %s", i-1, i, h[i].ReplicaID)
		}
	}
	f.checkLedger(r1.ID, r2.ID)
}

func testRerouteUnknown(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, _ := twoReplicas(f, nil)
	_, err := f.rerouter().RouteHistory(f.ctx, aip.NewActionID())
	f.wantErr(err, registry.ErrNotFound, "history of an unknown action")
	a := f.resolve(request("tenant-1", "alpha.read"))
	if h := f.history(a.ActionID); len(h) != 0 {
		t.Fatalf("history of a fresh route = %+v, want empty", h)
	}
	ghost := a
	ghost.ActionID = aip.NewActionID()
	_, err = f.reroute(ghost, registry.RefusalNotReady)
	f.wantErr(err, registry.ErrNotFound, "reroute of an unknown action")
	// A request that fails validation is ErrInvalid.
	bad := a
	bad.TenantID = ""
	_, err = f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: bad, Evidence: RefusalEvidence(bad, registry.RefusalNotReady)})
	f.wantErr(err, registry.ErrInvalid, "reroute without a tenant")
	f.checkLedger(r1.ID)
}

// testRerouteRace runs reroutes against concurrent resolves of the same
// actions: each action ends either rerouted (and every resolve that saw
// the old fence happened before) or pinned with ErrRerouteUnsafe, never
// both, and the ledger stays exact.
func testRerouteRace(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newRouteWorld(f, nil)
	var ids []string
	for _, n := range []string{"x1", "x2", "x3"} {
		ids = append(ids, f.replica(n, w.i, func(r *registry.ConnectorReplica) { r.Capacity = 200 }).ID)
	}
	const actions = 24
	type outcome struct {
		a        registry.RouteAssignment
		moved    registry.RouteAssignment
		rerouted bool
		resolved registry.RouteAssignment
	}
	outs := make([]outcome, actions)
	var wg sync.WaitGroup
	for i := range actions {
		req := request("tenant-1", "alpha.read")
		outs[i].a = f.resolve(req)
		wg.Add(2)
		go func() {
			defer wg.Done()
			next, err := f.reroute(outs[i].a, registry.RefusalNotReady)
			switch {
			case err == nil:
				outs[i].moved, outs[i].rerouted = next, true
			case !errors.Is(err, registry.ErrRerouteUnsafe):
				t.Errorf("reroute: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			a, err := f.b.Resolver.Resolve(f.ctx, req)
			if err != nil {
				t.Errorf("resolve: %v", err)
				return
			}
			outs[i].resolved = a
		}()
	}
	wg.Wait()
	for i, o := range outs {
		cur, err := f.b.Resolver.Assignment(f.ctx, o.a.ActionID)
		f.must(err)
		h := f.history(o.a.ActionID)
		if o.rerouted {
			// The resolve came after the reroute (it returned the new
			// assignment): the old fence was handed out exactly once.
			if !o.resolved.Equal(&o.moved) || !cur.Equal(&o.moved) || len(h) != 1 {
				t.Fatalf("action %d rerouted but resolve returned fence %s (new %s, history %d)", i, o.resolved.FenceToken, o.moved.FenceToken, len(h))
			}
		} else if !cur.Equal(&o.a) || len(h) != 0 {
			t.Fatalf("action %d refused as unsafe but its route changed", i)
		}
	}
	f.checkLedger(ids...)
}

// testRerouteUnsent: the holder of an assignment's only hand-out, which
// never got a connection to the replica, moves the action with the
// hand-out's claim instead of refusal evidence (after settling it
// outcome_unknown, as the dispatcher does). Anyone else — another claim, a
// hand-out without one, an assignment handed out twice, a request giving
// both grounds or a malformed claim — changes nothing.
func testRerouteUnsent(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	unsent := func(a registry.RouteAssignment, claim, next string) (registry.RouteAssignment, error) {
		return f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Unsent: claim, Claim: next})
	}

	req := claimed(request("tenant-1", "alpha.read"), "claim-a")
	a := f.resolve(req)
	f.settle(a, registry.SettlementOutcomeUnknown)
	next, err := unsent(a, "claim-a", "claim-b")
	f.must(err)
	if want := other(a, r1, r2); next.ReplicaID != want.ID || next.FenceToken == a.FenceToken || next.HandOut != a.HandOut+1 {
		t.Fatalf("rerouted to %s fence %s hand-out %d, want %s, a new fence, hand-out %d", next.ReplicaID, next.FenceToken, next.HandOut, want.ID, a.HandOut+1)
	}
	if h := f.history(req.ActionID); len(h) != 1 || !h[0].Equal(&a) {
		t.Fatalf("history = %+v, want exactly the old assignment", h)
	}
	if res := f.reservation(req.ActionID); !res.Reserved || res.ReplicaID != next.ReplicaID {
		t.Fatalf("reservation after the reroute = %+v", res)
	}
	if got := f.getReplica(a.ReplicaID).ActiveAssignments; got != 0 {
		t.Fatalf("the unreachable replica keeps %d active assignments", got)
	}
	// The settlement before it counted the failure; the reroute did not
	// undo it.
	if c := f.getReplica(a.ReplicaID).Circuit; c.ConsecutiveFailures != 1 {
		t.Fatalf("unreachable replica circuit = %+v, want one failure", c)
	}
	// The new assignment's holder vouches with its own claim; the old
	// claim no longer names the last hand-out.
	_, err = unsent(next, "claim-a", "")
	f.wantErr(err, registry.ErrEvidence, "the superseded hand-out's claim")
	f.settle(next, registry.SettlementCompleted)

	refused := func(a registry.RouteAssignment, claim string, evidence registry.RefusalEvidence, target error, what string) {
		t.Helper()
		res := f.reservation(a.ActionID)
		_, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Unsent: claim, Evidence: evidence})
		f.wantErr(err, target, what)
		f.unchanged(a, res, 0, what)
	}
	b := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-x"))
	refused(b, "claim-y", registry.RefusalEvidence{}, registry.ErrEvidence, "another claim")
	refused(b, "claim-x", RefusalEvidence(b, registry.RefusalNotReady), registry.ErrEvidence, "both grounds")
	refused(b, "claim x", registry.RefusalEvidence{}, registry.ErrEvidence, "a malformed claim")
	later := b
	later.HandOut++
	refused(later, "claim-x", registry.RefusalEvidence{}, registry.ErrEvidence, "another hand-out number")
	c := f.resolve(request("tenant-1", "alpha.read"))
	refused(c, "claim-z", registry.RefusalEvidence{}, registry.ErrEvidence, "a hand-out without a claim")
	dreq := claimed(request("tenant-1", "alpha.read"), "claim-1")
	d := f.resolve(dreq)
	d2 := f.resolve(claimed(dreq, "claim-2"))
	refused(d, "claim-1", registry.RefusalEvidence{}, registry.ErrRerouteUnsafe, "the first of two hand-outs")
	refused(d2, "claim-2", registry.RefusalEvidence{}, registry.ErrRerouteUnsafe, "the second of two hand-outs")
	f.checkLedger(r1.ID, r2.ID)
}

// testReroutePinned: once an assignment is pinned (a cancel is about to be
// sent under it), no ground moves the action off it — neither the only
// hand-out's unsent claim nor a signed refusal — and the pin reserves and
// settles nothing. Pinning an assignment that is no longer current is
// ErrFenceLost, an unknown action ErrNotFound.
func testReroutePinned(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	_, r1, r2 := twoReplicas(f, nil)
	p, ok := f.rerouter().(registry.RoutePinner)
	if !ok {
		t.Fatalf("the backend's Rerouter is no registry.RoutePinner")
	}
	a := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-a"))
	res := f.reservation(a.ActionID)
	f.must(p.PinRoute(f.ctx, a))
	f.must(p.PinRoute(f.ctx, a))
	f.unchanged(a, res, 0, "pinned")
	_, err := f.rerouter().Reroute(f.ctx, registry.RerouteRequest{Current: a, Unsent: "claim-a"})
	f.wantErr(err, registry.ErrRerouteUnsafe, "an unsent reroute of a pinned assignment")
	_, err = f.reroute(a, registry.RefusalCapacity)
	f.wantErr(err, registry.ErrRerouteUnsafe, "a refused reroute of a pinned assignment")
	f.unchanged(a, res, 0, "pinned, after the reroutes")
	f.settle(a, registry.SettlementCancelled)

	b := f.resolve(claimed(request("tenant-1", "alpha.read"), "claim-b"))
	next, err := f.reroute(b, registry.RefusalCapacity)
	f.must(err)
	f.wantErr(p.PinRoute(f.ctx, b), registry.ErrFenceLost, "a superseded assignment")
	f.must(p.PinRoute(f.ctx, next))
	f.settle(next, registry.SettlementCancelled)

	unknown := a
	unknown.ActionID = aip.NewActionID()
	f.wantErr(p.PinRoute(f.ctx, unknown), registry.ErrNotFound, "an unknown action")
	f.checkLedger(r1.ID, r2.ID)
}
