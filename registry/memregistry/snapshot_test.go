package memregistry_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// fleetState is a registry brought into a state that exercises every part
// of a snapshot: policies, an enabled and a disabled type, active, admitted
// and revoked versions (two of them publishing the same capability),
// instances of two tenants, bindings with and without a policy (two for
// one capability, in different key and priority orders), replicas
// ready, draining and offline, routes reserved, settled, re-reserved and
// rerouted, an open circuit, and live replay claims.
type fleetState struct {
	reg      *memregistry.Registry
	clock    *registrytest.Clock
	world    *registrytest.LifecycleWorld
	actions  []string
	replicas []string
	leases   map[string]uint64 // replica -> current sequence
	cmds     []registry.LifecycleCommand
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func newFleetState(t *testing.T) *fleetState {
	t.Helper()
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	reg, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	must(t, err)
	s := &fleetState{reg: reg, clock: clock, world: w, leases: map[string]uint64{}}

	// A second release of alpha offering alpha.read and alpha.extra, a
	// revoked third one, and a disabled type beta.
	caps := []aip.Capability{registrytest.Capability("alpha.read", "reads alpha"), registrytest.Capability("alpha.extra", "extra <alpha> & more")}
	v2 := registrytest.Version("cver_alpha2", w.Type.ID, "2.0.0", w.Type.Owner, registry.VersionAdmitted, registrytest.Manifest("service:alpha", caps))
	must(t, reg.AdmitVersion(ctx, v2))
	v3 := registrytest.Version("cver_alpha3", w.Type.ID, "3.0.0", w.Type.Owner, registry.VersionActive, registrytest.Manifest("service:alpha", caps[:1]))
	must(t, reg.AdmitVersion(ctx, v3))
	must(t, reg.SetVersionStatus(ctx, v3.ID, registry.VersionRevoked))
	beta := registry.ConnectorType{ID: "ctype_beta", Name: "beta", Owner: "owner-beta", Enabled: true}
	must(t, reg.PutConnectorType(ctx, beta))
	must(t, reg.AdmitVersion(ctx, registrytest.Version("cver_beta1", beta.ID, "1.0.0", beta.Owner, registry.VersionActive,
		registrytest.Manifest("service:beta", []aip.Capability{registrytest.Capability("beta.read", "reads beta")}))))
	must(t, reg.SetConnectorTypeEnabled(ctx, beta.ID, false))

	// Tenant 2 uses alpha.write under a conservative policy.
	pol := registry.ConservativePolicy("quota:t2")
	pol.MaxTenantInFlight = 50
	pol.CircuitFailureThreshold = 1
	must(t, reg.PutAdmissionPolicy(ctx, pol))
	inst2 := registry.ConnectorInstance{ID: "cinst_b", ConnectorTypeID: w.Type.ID, VersionID: w.Version.ID, TenantID: "tenant-2",
		ConfigRevision: 1, SecretProviderRef: "secret://alpha/b", Status: registry.InstanceEnabled}
	must(t, reg.PutInstance(ctx, inst2))
	must(t, reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: "tenant-2", CapabilityID: "alpha.write", InstanceID: inst2.ID,
		Priority: 3, PolicyRevision: 1, QuotaPolicyRef: pol.PolicyRef, CredentialRevisionRef: "cred-v1", Enabled: true}))
	must(t, reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "alpha.write", InstanceID: w.Instance.ID,
		PolicyRevision: 1, Enabled: false}))
	// A fallback instance of tenant 1 whose binding sorts before cinst_a's
	// by key but after it by priority, so the binding index order is not
	// the snapshot's order.
	inst0 := registry.ConnectorInstance{ID: "cinst_0", ConnectorTypeID: w.Type.ID, VersionID: w.Version.ID, TenantID: "tenant-1",
		ConfigRevision: 1, SecretProviderRef: "secret://alpha/0", Status: registry.InstanceEnabled}
	must(t, reg.PutInstance(ctx, inst0))
	must(t, reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: inst0.ID,
		Priority: 9, PolicyRevision: 1, Enabled: true}))

	// Replicas: three of tenant 1's instance, one of tenant 2's.
	for _, id := range []string{"crepl_a1", "crepl_a2", "crepl_a3"} {
		rep := w.ProvisionedReplica(id, clock.Now())
		must(t, reg.PutReplica(ctx, rep))
		s.register(t, rep)
	}
	rb := w.ProvisionedReplica("crepl_b1", clock.Now())
	rb.InstanceID = inst2.ID
	must(t, reg.PutReplica(ctx, rb))
	reg2 := w.Registration(&rb)
	reg2.TenantID, reg2.SecretProviderRef, reg2.ConfigRevision = inst2.TenantID, inst2.SecretProviderRef, inst2.ConfigRevision
	s.apply(t, aip.RegisterCommand(reg2), rb.ID)
	must(t, reg.PutReplica(ctx, w.ProvisionedReplica("crepl_a4", clock.Now()))) // never registers
	// crepl_a5 registers and shuts down: offline, with why and when.
	ra5 := w.ProvisionedReplica("crepl_a5", clock.Now())
	must(t, reg.PutReplica(ctx, ra5))
	s.register(t, ra5)
	s.apply(t, aip.TransitionCommand(aip.OpOffline, aip.Transition{ReplicaID: ra5.ID, PreviousSequence: s.leases[ra5.ID]}), ra5.ID)

	// Routes.
	for i := range 6 {
		a, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.read", TenantID: "tenant-1"})
		must(t, err)
		s.actions = append(s.actions, a.ActionID)
		switch i {
		case 0, 1:
			must(t, reg.Settle(ctx, a, registry.SettlementCompleted))
		case 2:
			must(t, reg.Settle(ctx, a, registry.SettlementCancelled))
			_, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: a.ActionID, CapabilityID: "alpha.read", TenantID: "tenant-1"})
			must(t, err) // re-reserved with the retry scope
		case 3:
			_, err := reg.Reroute(ctx, registry.RerouteRequest{Current: a, Evidence: registrytest.RefusalEvidence(a, registry.RefusalNotReady)})
			must(t, err)
		}
	}
	b, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.write", TenantID: "tenant-2"})
	must(t, err)
	s.actions = append(s.actions, b.ActionID)
	must(t, reg.Settle(ctx, b, registry.SettlementOutcomeUnknown)) // opens crepl_b1's circuit

	// Lifecycle: a heartbeat of crepl_a1 and a drain of crepl_a2.
	s.clock.Advance(5 * time.Second)
	s.apply(t, aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: "crepl_a1", PreviousSequence: s.leases["crepl_a1"], InFlight: 1, ConnectorReady: true}), "crepl_a1")
	s.apply(t, aip.TransitionCommand(aip.OpDrain, aip.Transition{ReplicaID: "crepl_a2", PreviousSequence: s.leases["crepl_a2"]}), "crepl_a2")

	// Event logs of two tenants, one with a redelivery and an event
	// without data, an actor and optional fields.
	b1 := registrytest.EventBatch("tenant-1", "a1", "evt_1", "evt_2")
	b1.Events[1].Data, b1.Events[1].SessionID, b1.Events[1].ActionID, b1.Events[1].CorrelationID = nil, "sess-1", "act-1", "corr-1"
	b1.Events[1].Actor = &aip.Principal{ID: "user-1", Kind: aip.PrincipalHuman, ExternalRefs: []aip.ExternalRef{{System: "chatwoot", Type: "agent", ID: "7"}}}
	_, err = reg.AppendEvents(ctx, b1)
	must(t, err)
	_, err = reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a2", "evt_1", "evt_3"))
	must(t, err)
	_, err = reg.AppendEvents(ctx, registrytest.EventBatch("tenant-2", "b1", "evt_1"))
	must(t, err)
	return s
}

func (s *fleetState) register(t *testing.T, rep registry.ConnectorReplica) {
	t.Helper()
	s.apply(t, aip.RegisterCommand(s.world.Registration(&rep)), rep.ID)
}

func (s *fleetState) apply(t *testing.T, c aip.ControlCommand, replicaID string) {
	t.Helper()
	cmd := registrytest.LifecycleCommand(s.clock.Now(), c)
	res, err := s.reg.ApplyLifecycle(context.Background(), []registry.LifecycleCommand{cmd})
	must(t, err)
	if res[0].Err != nil {
		t.Fatalf("%s %s: %v", c.Operation, replicaID, res[0].Err)
	}
	if res[0].Outcome.Lease != nil {
		s.leases[replicaID] = res[0].Outcome.Lease.Sequence
	}
	s.cmds = append(s.cmds, cmd)
	if !contains(s.replicas, replicaID) {
		s.replicas = append(s.replicas, replicaID)
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if x == y {
			return true
		}
	}
	return false
}

func snapshotOf(t *testing.T, r *memregistry.Registry) []byte {
	t.Helper()
	var b bytes.Buffer
	must(t, r.Snapshot(&b))
	return b.Bytes()
}

func restored(t *testing.T, raw []byte, clock *registrytest.Clock) *memregistry.Registry {
	t.Helper()
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	must(t, r.Restore(bytes.NewReader(raw)))
	return r
}

// answers collects what every read contract answers, as comparable text.
func answers(t *testing.T, r *memregistry.Registry, s *fleetState) map[string]any {
	t.Helper()
	ctx := context.Background()
	out := map[string]any{}
	put := func(key string, v any, err error) {
		if err != nil {
			out[key] = "error: " + err.Error()
			return
		}
		out[key] = v
	}
	for _, id := range []string{"ctype_alpha", "ctype_beta", "ctype_none"} {
		v, err := r.ConnectorType(ctx, id)
		put("type "+id, v, err)
	}
	for _, id := range []string{"cver_alpha1", "cver_alpha2", "cver_alpha3", "cver_beta1"} {
		v, err := r.ConnectorVersion(ctx, id)
		put("version "+id, v, err)
	}
	for _, id := range []string{"cinst_0", "cinst_a", "cinst_b"} {
		v, err := r.ConnectorInstance(ctx, id)
		put("instance "+id, v, err)
	}
	for _, id := range append(s.replicas, "crepl_a4") {
		v, err := r.ConnectorReplica(ctx, id)
		put("replica "+id, v, err)
	}
	for _, k := range []registry.BindingKey{
		{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: "cinst_0"},
		{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: "cinst_a"},
		{TenantID: "tenant-1", CapabilityID: "alpha.write", InstanceID: "cinst_a"},
		{TenantID: "tenant-2", CapabilityID: "alpha.write", InstanceID: "cinst_b"},
	} {
		v, err := r.CapabilityBinding(ctx, k)
		put("binding "+k.String(), v, err)
	}
	pol, err := r.AdmissionPolicy(ctx, "quota:t2")
	put("policy", pol, err)
	rev, err := r.CatalogRevision(ctx)
	put("revision", rev, err)
	for _, rc := range []registry.ReadContext{{TenantID: "tenant-1"}, {TenantID: "tenant-2"}, {Internal: true}, {}} {
		page, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 1}, rc)
		put(fmt.Sprintf("page1 %+v", rc), page, err)
		if err == nil && page.NextCursor != "" {
			next, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 10, Cursor: page.NextCursor}, rc)
			put(fmt.Sprintf("page2 %+v", rc), next, err)
		}
		search, err := r.QueryCapabilities(ctx, registry.CatalogQuery{Text: "<alpha>"}, rc)
		put(fmt.Sprintf("search %+v", rc), search, err)
		for _, c := range []string{"alpha.read", "alpha.write", "alpha.extra", "beta.read"} {
			v, err := r.Capability(ctx, c, rc)
			put(fmt.Sprintf("capability %s %+v", c, rc), v, err)
		}
	}
	for _, id := range append(s.actions, "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d") { // the last has no route
		a, err := r.Assignment(ctx, id)
		put("assignment "+id, a, err)
		res, err := r.Reservation(ctx, id)
		put("reservation "+id, res, err)
		h, err := r.RouteHistory(ctx, id)
		put("history "+id, h, err)
	}
	st, err := r.Status(ctx)
	put("status", st, err)
	l, err := r.Ledger(ctx)
	put("ledger", l, err)
	reps, err := r.ListReplicas(ctx, "", 100)
	put("list", reps, err)
	rd, err := r.Readiness(ctx)
	put("readiness", rd, err)
	for _, tenant := range []string{"tenant-1", "tenant-2", "tenant-3"} {
		for _, after := range []uint64{0, 1, 3} {
			p, err := r.Events(ctx, tenant, after, 2)
			put(fmt.Sprintf("events %s after %d", tenant, after), p, err)
		}
	}
	return out
}

func TestSnapshotRoundTrip(t *testing.T) {
	s := newFleetState(t)
	ctx := context.Background()
	raw := snapshotOf(t, s.reg)
	if !bytes.Contains(raw, []byte(`"format":"`+memregistry.SnapshotFormat+`"`)) || !bytes.Contains(raw, []byte("extra <alpha> & more")) {
		t.Fatalf("snapshot does not carry its format or escapes text:\n%.400s", raw)
	}
	checkPopulated(t, raw)
	r := restored(t, raw, s.clock)

	// The restored registry encodes to the same bytes and answers every
	// read the same way.
	if again := snapshotOf(t, r); !bytes.Equal(again, raw) {
		t.Fatalf("snapshot of the restored registry differs:\n%s", cmp.Diff(string(raw), string(again)))
	}
	if diff := cmp.Diff(answers(t, s.reg, s), answers(t, r, s)); diff != "" {
		t.Fatalf("answers differ after Restore (-original +restored):\n%s", diff)
	}
	// Every field of the state is in use in the original (the fixture
	// exercises it) and rebuilt in the restored registry (catalog views
	// once the reads above have cached them).
	if unset := memregistry.UnsetStateFields(s.reg); len(unset) > 0 {
		t.Fatalf("the fixture leaves state fields empty, so a field lost on restore would go unnoticed; populate them: %v", unset)
	}
	if unset := memregistry.UnsetStateFields(r); len(unset) > 0 {
		t.Fatalf("Restore leaves state fields empty that the original holds: %v", unset)
	}
	for name, reg := range map[string]*memregistry.Registry{"original": s.reg, "restored": r} {
		if err := memregistry.CheckIndexes(reg); err != nil {
			t.Fatalf("%s registry: %v", name, err)
		}
	}
	l, err := r.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)

	// Both registries take the same writes the same way from here on.
	type step struct {
		name string
		do   func(reg *memregistry.Registry) (any, error)
	}
	newAction := aip.NewActionID()
	replay := s.cmds[len(s.cmds)-1] // crepl_a2's drain, answered from its claim
	steps := []step{
		{"reroute a route resolved twice before the snapshot", func(reg *memregistry.Registry) (any, error) {
			a, err := reg.Assignment(ctx, s.actions[2])
			if err != nil {
				return nil, err
			}
			return reg.Reroute(ctx, registry.RerouteRequest{Current: a, Evidence: registrytest.RefusalEvidence(a, registry.RefusalNotReady)})
		}},
		{"resolve an existing route", func(reg *memregistry.Registry) (any, error) {
			return reg.Resolve(ctx, registry.RouteRequest{ActionID: s.actions[5], CapabilityID: "alpha.read", TenantID: "tenant-1"})
		}},
		{"resolve a settled route again", func(reg *memregistry.Registry) (any, error) {
			return reg.Resolve(ctx, registry.RouteRequest{ActionID: s.actions[0], CapabilityID: "alpha.read", TenantID: "tenant-1"})
		}},
		{"resolve a rerouted action with another capability", func(reg *memregistry.Registry) (any, error) {
			return reg.Resolve(ctx, registry.RouteRequest{ActionID: s.actions[3], CapabilityID: "alpha.write", TenantID: "tenant-1"})
		}},
		{"resolve a new action", func(reg *memregistry.Registry) (any, error) {
			a, err := reg.Resolve(ctx, registry.RouteRequest{ActionID: newAction, CapabilityID: "alpha.read", TenantID: "tenant-1"})
			a.FenceToken = "" // fresh in each registry
			return a, err
		}},
		{"resolve while tenant 2's circuit is open", func(reg *memregistry.Registry) (any, error) {
			return reg.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), CapabilityID: "alpha.write", TenantID: "tenant-2"})
		}},
		{"reroute a route resolved twice after the snapshot", func(reg *memregistry.Registry) (any, error) {
			a, err := reg.Assignment(ctx, s.actions[5])
			if err != nil {
				return nil, err
			}
			return reg.Reroute(ctx, registry.RerouteRequest{Current: a, Evidence: registrytest.RefusalEvidence(a, registry.RefusalNotReady)})
		}},
		{"replay the drain request", func(reg *memregistry.Registry) (any, error) {
			return reg.ApplyLifecycle(ctx, []registry.LifecycleCommand{replay})
		}},
		{"settle a live route", func(reg *memregistry.Registry) (any, error) {
			a, err := reg.Assignment(ctx, s.actions[4])
			if err != nil {
				return nil, err
			}
			return nil, reg.Settle(ctx, a, registry.SettlementCompleted)
		}},
		{"expire stale leases", func(reg *memregistry.Registry) (any, error) {
			s.clock.Advance(2 * registrytest.LeaseTTL)
			n, err := reg.ExpireStaleReplicas(ctx, 100)
			s.clock.Advance(-2 * registrytest.LeaseTTL)
			return n, err
		}},
		{"append events, one redelivered", func(reg *memregistry.Registry) (any, error) {
			return reg.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a3", "evt_4", "evt_2"))
		}},
		{"append a conflicting event", func(reg *memregistry.Registry) (any, error) {
			b := registrytest.EventBatch("tenant-2", "b1", "evt_1")
			b.Events[0].Kind = "other.kind"
			return reg.AppendEvents(ctx, b)
		}},
		{"append a new tenant's events", func(reg *memregistry.Registry) (any, error) {
			return reg.AppendEvents(ctx, registrytest.EventBatch("tenant-3", "c1", "evt_1"))
		}},
		{"status", func(reg *memregistry.Registry) (any, error) { return reg.Status(ctx) }},
		{"ledger", func(reg *memregistry.Registry) (any, error) { return reg.Ledger(ctx) }},
	}
	for _, st := range steps {
		got1, err1 := st.do(s.reg)
		got2, err2 := st.do(r)
		if fmt.Sprint(err1) != fmt.Sprint(err2) {
			t.Fatalf("%s: original error %v, restored error %v", st.name, err1, err2)
		}
		if diff := cmp.Diff(got1, got2); diff != "" {
			t.Fatalf("%s: answers differ (-original +restored):\n%s", st.name, diff)
		}
	}
}

// checkPopulated fails unless every list of the snapshot has entries and
// the snapshot carries an open circuit, a retry reservation, a route
// resolved again, a superseded assignment and a replica's offline reason: the byte-for-byte round trip
// must cover every part of the state.
func checkPopulated(t *testing.T, raw []byte) {
	t.Helper()
	var doc map[string]json.RawMessage
	must(t, json.Unmarshal(raw, &doc))
	for key, v := range doc {
		if key == "format" || key == "catalog_revision" {
			continue
		}
		var list []json.RawMessage
		if err := json.Unmarshal(v, &list); err != nil || len(list) == 0 {
			t.Errorf("snapshot field %s is not a non-empty list (%v): %.200s", key, err, v)
		}
	}
	if string(doc["catalog_revision"]) == "0" {
		t.Errorf("snapshot catalog revision is 0")
	}
	for _, want := range []string{`"open_until":`, `"retry":true`, `"resolved_again":true`, `"last_settlement":"`, `"offline_reason":"shutdown","offline_at":"`} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Errorf("snapshot has no %s", want)
		}
	}
}

func TestRestoreRefusesBadSnapshots(t *testing.T) {
	s := newFleetState(t)
	raw := string(snapshotOf(t, s.reg))
	cases := []struct {
		name, doc, want string
	}{
		{"not JSON", "{", "unexpected EOF"},
		{"wrong format", strings.Replace(raw, memregistry.SnapshotFormat, "other/v9", 1), `format "other/v9"`},
		{"unknown field", strings.Replace(raw, `"catalog_revision"`, `"catalog_revisions"`, 1), "unknown field"},
		{"trailing data", raw + "{}", "data after"},
		{"missing instance", strings.Replace(raw, `"id":"cinst_b"`, `"id":"cinst_z"`, 1), "missing"},
		{"event sequence repeated", strings.Replace(raw, `"sequence":2,`, `"sequence":1,`, 1), "sequences must increase"},
		{"event ID repeated", strings.Replace(raw, `"id":"evt_3"`, `"id":"evt_1"`, 1), "appears twice"},
		{"event without kind", strings.Replace(raw, `"kind":"thing.happened"`, `"kind":""`, 1), "kind"},
		{"unknown offline reason", strings.Replace(raw, `"offline_reason":"shutdown"`, `"offline_reason":"crashed"`, 1), "offline reason"},
		{"counter without reservation", strings.Replace(raw, `"counters":[`, `"counters":[{"kind":"tenant","key":"nobody","active":1},`, 1), "live reservations"},
	}
	for _, c := range cases {
		r, err := memregistry.New(memregistry.Config{Now: s.clock.Now})
		must(t, err)
		err = r.Restore(strings.NewReader(c.doc))
		if !errors.Is(err, memregistry.ErrSnapshot) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrSnapshot mentioning %q", c.name, err, c.want)
		}
		if rev, _ := r.CatalogRevision(context.Background()); rev != 0 {
			t.Errorf("%s: a refused restore left catalog revision %d", c.name, rev)
		}
	}
	// Restoring into a registry that holds state is refused.
	if err := s.reg.Restore(strings.NewReader(raw)); !errors.Is(err, memregistry.ErrSnapshot) || !strings.Contains(err.Error(), "already holds state") {
		t.Fatalf("restore into a used registry: err = %v", err)
	}
}

func TestSnapshotOfEmptyRegistry(t *testing.T) {
	r, err := memregistry.New(memregistry.Config{})
	must(t, err)
	raw := snapshotOf(t, r)
	back := restored(t, raw, registrytest.NewClock(registrytest.Epoch))
	if again := snapshotOf(t, back); !bytes.Equal(raw, again) {
		t.Fatalf("empty snapshot changed:\n%s\n%s", raw, again)
	}
}

// TestSnapshotWithoutEvents: a snapshot written before the registry kept
// event logs restores with empty ones, which then take events from
// sequence 1.
func TestSnapshotWithoutEvents(t *testing.T) {
	s := newFleetState(t)
	ctx := context.Background()
	var doc map[string]json.RawMessage
	must(t, json.Unmarshal(snapshotOf(t, s.reg), &doc))
	if _, ok := doc["events"]; !ok {
		t.Fatal("the snapshot carries no events")
	}
	delete(doc, "events")
	old, err := json.Marshal(doc)
	must(t, err)
	r := restored(t, old, s.clock)
	p, err := r.Events(ctx, "tenant-1", 0, 10)
	must(t, err)
	if len(p.Events) != 0 || p.More {
		t.Fatalf("a snapshot without events restored %d events (more %v)", len(p.Events), p.More)
	}
	got, err := r.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_1"))
	must(t, err)
	if got[0].Sequence != 1 {
		t.Fatalf("the first event after restoring an empty log got sequence %d, want 1", got[0].Sequence)
	}
}

// TestSnapshotWithoutHandoutTimes: a snapshot written before reservations
// kept their handout time restores each reserved route as handed out when
// it is restored, the latest it can have been (so reconciliation never
// takes it for older than it is), and the current format keeps the time.
func TestSnapshotWithoutHandoutTimes(t *testing.T) {
	s := newFleetState(t)
	ctx := context.Background()
	// A retry while reserved hands a route out again, later.
	s.clock.Advance(time.Minute)
	l, err := s.reg.Ledger(ctx)
	must(t, err)
	a, err := s.reg.Assignment(ctx, l.Reservations[0].ActionID)
	must(t, err)
	_, err = s.reg.Resolve(ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: a.TenantID, CapabilityID: a.CapabilityID})
	must(t, err)
	raw := snapshotOf(t, s.reg)
	var doc map[string]any
	must(t, json.Unmarshal(raw, &doc))
	stripped := 0
	for _, rt := range doc["routes"].([]any) {
		if _, ok := rt.(map[string]any)["handed_out_at"]; ok {
			delete(rt.(map[string]any), "handed_out_at")
			stripped++
		}
	}
	if stripped == 0 {
		t.Fatal("the snapshot keeps no handout times")
	}
	old, err := json.Marshal(doc)
	must(t, err)
	s.clock.Advance(time.Minute)
	kept, legacy := restored(t, raw, s.clock), restored(t, old, s.clock)
	l, err = s.reg.Ledger(ctx)
	must(t, err)
	later := 0
	for _, res := range l.Reservations {
		if res.HandedOutAt.After(res.AssignedAt) {
			later++
		}
		k, err := kept.Reservation(ctx, res.ActionID)
		must(t, err)
		g, err := legacy.Reservation(ctx, res.ActionID)
		must(t, err)
		if !k.HandedOutAt.Equal(res.HandedOutAt) || !g.HandedOutAt.Equal(s.clock.Now()) {
			t.Fatalf("reservation of %s handed out at %s: restored %s, from the old format %s (want the restore time %s)",
				res.ActionID, res.HandedOutAt, k.HandedOutAt, g.HandedOutAt, s.clock.Now())
		}
	}
	if later == 0 {
		t.Fatal("the fixture hands no reservation out after its assignment, so a restore that kept only assignment times would pass")
	}
}

// TestSnapshotKeepsPrunedSequences: a tenant whose events were all pruned
// keeps its last sequence through a snapshot, so its next event does not
// reuse a sequence a reader has already passed, and the pruned IDs, so a
// pruned event delivered again is not stored again.
func TestSnapshotKeepsPrunedSequences(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	_, err = r.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_1", "evt_2", "evt_3"))
	must(t, err)
	if n, err := r.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 3 {
		t.Fatalf("PruneEvents = %d, %v", n, err)
	}
	back := restored(t, snapshotOf(t, r), clock)
	got, err := back.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_4"))
	must(t, err)
	if got[0].Sequence != 4 {
		t.Fatalf("the first event after a restored, fully pruned log got sequence %d, want 4", got[0].Sequence)
	}
	// The pruned IDs are kept too: delivered again, they are not stored.
	again, err := back.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_2"))
	must(t, err)
	if !again[0].Pruned || !again[0].ReceivedAt.Equal(registrytest.Epoch) {
		t.Fatalf("a pruned event delivered again to the restored registry: %+v, want it pruned, first received at %s", again[0], registrytest.Epoch)
	}
	// A snapshot naming an event both stored and pruned is refused.
	var both map[string]json.RawMessage
	must(t, json.Unmarshal(snapshotOf(t, back), &both))
	dup := strings.Replace(string(both["events"]), `"evt_1":`, `"evt_4":`, 1)
	if dup == string(both["events"]) {
		t.Fatalf("the snapshot's event log does not list pruned evt_1: %s", both["events"])
	}
	both["events"] = json.RawMessage(dup)
	rawBoth, err := json.Marshal(both)
	must(t, err)
	other, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	if err := other.Restore(bytes.NewReader(rawBoth)); err == nil || !strings.Contains(err.Error(), "both stored and pruned") {
		t.Fatalf("Restore of an event both stored and pruned: %v", err)
	}
	// A snapshot whose last_sequence is below its events' is refused.
	var doc map[string]json.RawMessage
	must(t, json.Unmarshal(snapshotOf(t, back), &doc))
	bad := strings.Replace(string(doc["events"]), `"last_sequence":4`, `"last_sequence":2`, 1)
	if bad == string(doc["events"]) {
		t.Fatalf("the snapshot's event log has no last_sequence 4: %s", doc["events"])
	}
	doc["events"] = json.RawMessage(bad)
	raw, err := json.Marshal(doc)
	must(t, err)
	fresh, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	if err := fresh.Restore(bytes.NewReader(raw)); err == nil || !strings.Contains(err.Error(), "last_sequence") {
		t.Fatalf("Restore with last_sequence below the last event: %v", err)
	}
}

// TestSnapshotAfterForgettingPrunedIDs: the IDs ForgetPrunedEvents forgot
// stay forgotten through a snapshot and the ones it kept stay kept; a
// tenant whose every pruned ID was forgotten keeps its last sequence.
func TestSnapshotAfterForgettingPrunedIDs(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	b := registrytest.EventBatch("tenant-1", "a1", "evt_1", "evt_2")
	_, err = r.AppendEvents(ctx, b)
	must(t, err)
	b = registrytest.EventBatch("tenant-1", "a1", "evt_3")
	b.ReceivedAt = registrytest.Epoch.Add(time.Hour)
	_, err = r.AppendEvents(ctx, b)
	must(t, err)
	_, err = r.AppendEvents(ctx, registrytest.EventBatch("tenant-2", "a2", "evt_9"))
	must(t, err)
	if n, err := r.PruneEvents(ctx, registrytest.Epoch.Add(2*time.Hour), 10); err != nil || n != 4 {
		t.Fatalf("PruneEvents = %d, %v; want 4", n, err)
	}
	// evt_1, evt_2 and tenant-2's evt_9 were received at Epoch, evt_3 an
	// hour later.
	if n, err := r.ForgetPrunedEvents(ctx, registrytest.Epoch.Add(time.Minute), 10); err != nil || n != 3 {
		t.Fatalf("ForgetPrunedEvents = %d, %v; want 3", n, err)
	}
	back := restored(t, snapshotOf(t, r), clock)
	got, err := back.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_1", "evt_3"))
	must(t, err)
	if got[0].Pruned || got[0].Sequence != 4 {
		t.Fatalf("forgotten evt_1 delivered again to the restored registry: %+v, want it stored as sequence 4", got[0])
	}
	if !got[1].Pruned || !got[1].ReceivedAt.Equal(registrytest.Epoch.Add(time.Hour)) {
		t.Fatalf("evt_3, pruned and not forgotten, delivered again to the restored registry: %+v, want it pruned", got[1])
	}
	// tenant-2 has no event and no pruned ID left, but its sequences go on.
	got, err = back.AppendEvents(ctx, registrytest.EventBatch("tenant-2", "a2", "evt_9"))
	must(t, err)
	if got[0].Pruned || got[0].Sequence != 2 {
		t.Fatalf("tenant-2's forgotten evt_9 delivered again to the restored registry: %+v, want it stored as sequence 2", got[0])
	}
	// A snapshot taken after every ID was forgotten restores too.
	if n, err := back.ForgetPrunedEvents(ctx, registrytest.Epoch.Add(3*time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("ForgetPrunedEvents on the restored registry = %d, %v; want 1 (evt_3)", n, err)
	}
	raw := snapshotOf(t, back)
	if bytes.Contains(raw, []byte(`"pruned"`)) {
		t.Fatalf("a snapshot with every pruned ID forgotten still lists some: %s", raw)
	}
	again := restored(t, raw, clock)
	got, err = again.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_3", "evt_1"))
	must(t, err)
	if got[0].Pruned || got[0].Sequence != 5 || got[1].Pruned || got[1].Sequence != 4 {
		t.Fatalf("evt_3 (forgotten) and evt_1 (stored) delivered to the twice restored registry: %+v, want evt_3 stored as 5, evt_1 stored as 4", got)
	}
}

// TestSnapshotKeepsPrunedDigests: the digests of pruned events survive a
// snapshot, so a different event delivered under a pruned ID to the
// restored registry is a conflict; a snapshot written before digests were
// kept restores its pruned IDs without one (a delivery under them is
// answered pruned, as before), and one with a malformed digest is refused.
func TestSnapshotKeepsPrunedDigests(t *testing.T) {
	ctx := context.Background()
	clock := registrytest.NewClock(registrytest.Epoch)
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	must(t, err)
	_, err = r.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a1", "evt_1"))
	must(t, err)
	if n, err := r.PruneEvents(ctx, registrytest.Epoch.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneEvents = %d, %v", n, err)
	}
	changed := registrytest.EventBatch("tenant-1", "a1", "evt_1")
	changed.Events[0].Kind = "thing.changed"
	snap := snapshotOf(t, r)
	back := restored(t, snap, clock)
	if _, err := back.AppendEvents(ctx, changed); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a changed event under a pruned ID, delivered to the restored registry: %v, want ErrConflict", err)
	}
	if again, err := back.AppendEvents(ctx, registrytest.EventBatch("tenant-1", "a2", "evt_1")); err != nil || !again[0].Pruned {
		t.Fatalf("the pruned event delivered again to the restored registry: %+v, %v; want it pruned", again, err)
	}

	// rewrite returns snap with edit applied to its first event log.
	rewrite := func(edit func(log map[string]any)) []byte {
		t.Helper()
		var doc map[string]any
		must(t, json.Unmarshal(snap, &doc))
		edit(doc["events"].([]any)[0].(map[string]any))
		raw, err := json.Marshal(doc)
		must(t, err)
		return raw
	}
	old := restored(t, rewrite(func(log map[string]any) {
		if _, ok := log["pruned_digests"]; !ok {
			t.Fatalf("the snapshot's event log keeps no pruned_digests: %v", log)
		}
		delete(log, "pruned_digests")
	}), clock)
	if again, err := old.AppendEvents(ctx, changed); err != nil || !again[0].Pruned {
		t.Fatalf("a changed event under an ID pruned without a digest: %+v, %v; want it answered pruned", again, err)
	}
	for name, digests := range map[string]map[string]any{
		"short":      {"evt_1": "AAAA"},
		"not pruned": {"evt_9": base64.StdEncoding.EncodeToString(make([]byte, 32))},
	} {
		fresh, err := memregistry.New(memregistry.Config{Now: clock.Now})
		must(t, err)
		raw := rewrite(func(log map[string]any) { log["pruned_digests"] = digests })
		if err := fresh.Restore(bytes.NewReader(raw)); err == nil || !strings.Contains(err.Error(), "pruned") {
			t.Errorf("Restore with a %s pruned digest: %v, want it refused", name, err)
		}
	}
}
