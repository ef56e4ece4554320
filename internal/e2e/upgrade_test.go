package e2e

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// catalogIDs reads the tenant's catalog through the dispatcher (GET
// /aip/v1/capabilities) and returns its capability IDs, its total and its
// revision.
func (f *fleet) catalogIDs(tok string) (ids []string, total int, revision uint64) {
	f.t.Helper()
	code, raw := f.get(dispatch.PathCapabilities+"?limit=200", tok)
	var page dispatch.CapabilitiesResponse
	if err := json.Unmarshal(raw, &page); code != http.StatusOK || err != nil || page.NextCursor != "" {
		f.t.Fatalf("GET %s: %d %v %s", dispatch.PathCapabilities, code, err, raw)
	}
	for _, d := range page.Capabilities {
		ids = append(ids, d.Capability.ID)
	}
	return ids, page.Total, page.CatalogRevision
}

// TestBlueGreenVersionUpgrade is the zero-downtime rollout of a new
// connector version that docs/operator-guide.md ("A new connector
// version") describes: a second instance of the tenant on the new version,
// bound at a better (lower) priority than the old instance. While 16
// clients send actions continuously:
//
//   - one `aipfleet registry apply` admits version 2 (the same echo
//     manifest under a new version ID and artifact digest: a new release),
//     adds instance B on it with two pre-provisioned replicas, binds B's
//     capabilities at priority 0 and moves A's bindings to priority 1. The
//     tenant's catalog lists the same capabilities, once each. Until one of
//     B's replicas is ready every new action still goes to A: none is
//     answered 503;
//   - B's hosts start; from the moment the first is ready every new action
//     goes to B;
//   - a second apply disables A's bindings, A's replicas are stopped with
//     SIGTERM and drain, and a third apply disables instance A.
//
// Every action of the run completes exactly once (echo counts its side
// effect in each replica's journal), on the replica that answered.
func TestBlueGreenVersionUpgrade(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 2})
	rf := f.rf
	blue := f.replicaList()
	v1 := rf.Version()
	instA := rf.InstanceID()
	tok := f.token(tenantID)
	var caps []string
	for _, c := range v1.Manifest.Capabilities {
		if c.Kind != aip.KindResource {
			caps = append(caps, c.ID)
		}
	}
	slices.Sort(caps)
	before, total, rev0 := f.catalogIDs(tok)
	if !slices.Equal(before, caps) || total != len(caps) {
		t.Fatalf("catalog before the upgrade: %v (total %d), want %v", before, total, caps)
	}

	l := startLoad(t, f, 16, `,"hold_ms":5`)
	progress := l.progress
	progress(100)

	// 1. Version 2, instance B, its replicas and bindings, in one file.
	v2 := registrytest.Version(aip.NewID(aip.PrefixVersion), rf.TypeID(), "2.0.0", v1.Attestation.Owner, registry.VersionActive, v1.Manifest)
	instB := registry.ConnectorInstance{ID: aip.NewID(aip.PrefixInstance), ConnectorTypeID: rf.TypeID(), VersionID: v2.ID,
		TenantID: tenantID, ConfigRevision: 1, SecretProviderRef: rf.SecretProviderRef(), Status: registry.InstanceEnabled}
	file := &registry.FleetFile{Versions: []registry.ConnectorVersion{v2}, Instances: []registry.ConnectorInstance{instB}}
	var green []*replica
	for range 2 {
		sr := rf.ReplicaOf(t, instB.ID, &v2, replicaOptions)
		green = append(green, f.newReplica(sr))
		file.Replicas = append(file.Replicas, rf.ReplicaRecord(sr))
	}
	bindings := func(instance string, priority uint32, revision uint64, enabled bool) {
		for _, c := range caps {
			file.Bindings = append(file.Bindings, registry.CapabilityBinding{TenantID: tenantID, CapabilityID: c, InstanceID: instance,
				Priority: priority, PolicyRevision: revision, Enabled: enabled})
		}
	}
	bindings(instB.ID, 0, 1, true)
	bindings(instA, 1, 2, true)
	t.Logf("apply: %s", rf.ApplyFleetFile(t, file))
	applied := time.Now()

	// The tenant sees each capability once, now served by two instances.
	ids, total, rev1 := f.catalogIDs(tok)
	if !slices.Equal(ids, caps) || total != len(caps) || rev1 <= rev0 {
		t.Fatalf("catalog after adding instance B: %v (total %d) at revision %d (was %d), want %v", ids, total, rev1, rev0, caps)
	}

	// 2. B is bound first but has no ready replica yet: A keeps serving.
	progress(100)
	greenStart := time.Now()
	f.startHost(green[0])
	greenReady := time.Now() // the registry has green[0] ready, with a lease
	f.startHost(green[1])
	progress(200)

	// 3. Retire A: disable its bindings, drain its replicas, disable it.
	file = &registry.FleetFile{}
	bindings(instA, 1, 3, false)
	t.Logf("apply: %s", rf.ApplyFleetFile(t, file))
	ids, total, _ = f.catalogIDs(tok)
	if !slices.Equal(ids, caps) || total != len(caps) {
		t.Fatalf("catalog once A's bindings are disabled: %v (total %d), want %v", ids, total, caps)
	}
	for _, old := range blue {
		if err := old.proc.Term(t); err != nil {
			t.Fatalf("replica %s of instance A did not drain cleanly: %v\n%s", old.id, err, old.proc.Log())
		}
		waitFor(t, "the stopped replica's routes to settle", []*process{f.disp}, func() bool {
			rep, err := f.reg.ConnectorReplica(f.ctx, old.id)
			return err == nil && rep.Status == aip.ReplicaOffline && rep.ActiveAssignments == 0
		})
	}
	a := registry.ConnectorInstance{ID: instA, ConnectorTypeID: rf.TypeID(), VersionID: v1.ID, TenantID: tenantID, ConfigRevision: 2,
		SecretProviderRef: rf.SecretProviderRef(), Status: registry.InstanceDisabled}
	t.Logf("apply: %s", rf.ApplyFleetFile(t, &registry.FleetFile{Instances: []registry.ConnectorInstance{a}}))
	progress(100)
	l.stop()

	// Where each action went, by when its client sent it.
	var onA, onB, waited int
	for _, r := range l.results {
		if r.resp.Route == nil {
			continue // l.check reports it
		}
		route := r.resp.Route
		switch {
		case route.InstanceID == instA && route.VersionID == v1.ID:
			onA++
			if r.start.After(greenReady) {
				t.Errorf("action %s sent after instance B had a ready replica went to %s of instance A", r.id, route.ReplicaID)
			}
		case route.InstanceID == instB.ID && route.VersionID == v2.ID:
			onB++
			// By when the registry assigned it, not when its client sent
			// it: a request sent just before B's host started may wait
			// in the dispatcher (a loaded machine) and be assigned once
			// B is ready, as it should.
			if route.AssignedAt.Before(greenStart) {
				t.Errorf("action %s assigned at %s, before instance B's first host started (%s), went to %s",
					r.id, route.AssignedAt.Format(time.RFC3339Nano), greenStart.Format(time.RFC3339Nano), route.ReplicaID)
			}
		default:
			t.Errorf("action %s routed to instance %s version %s", r.id, route.InstanceID, route.VersionID)
		}
		if r.start.After(applied) && r.start.Before(greenStart) {
			waited++
		}
	}
	t.Logf("%d actions: %d on instance A (version 1), %d on instance B (version 2); %d sent between the apply and B's first host",
		len(l.results), onA, onB, waited)
	if waited == 0 || onB == 0 {
		t.Fatalf("the run did not cover the upgrade: %d actions between the apply and B's start, %d on B", waited, onB)
	}
	// No tolerance: every action completed, with its one side effect, on the
	// replica that answered — no 503 while B started, none lost while A
	// drained.
	l.check(t, f)
}
