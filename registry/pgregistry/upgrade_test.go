package pgregistry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// oldRolesSQL returns deploy/postgres/roles.sql as it shipped with schema
// versions 5 and 6: the lifecycle role had no privilege on events.
func oldRolesSQL(t *testing.T) string {
	t.Helper()
	const now = `('events',                    'SELECT, INSERT',                   'SELECT (tenant_id, sequence, received_at_ms), DELETE')`
	const then = `('events',                    'SELECT, INSERT',                   '')`
	sql := rolesSQL(t)
	if !strings.Contains(sql, now) {
		t.Fatalf("roles.sql no longer grants events as %s; update oldRolesSQL", now)
	}
	return strings.Replace(sql, now, then, 1)
}

// TestUpgradeKeepsData upgrades a database that the builds of schema
// versions 5 to 13 populated, the documented way (deploy/postgres/roles.sql
// of that build, `registry migrate` as the admin role, the data role
// serving dispatch), to this build: two migrations at once and then one
// more change nothing but the schema (the columns migration 0008 adds hold
// their defaults, 0009's pruned_events starts empty, the columns 0010 adds
// are NULL, as is 0011's scope_stripes: every route's scopes are in its
// counter_stripe, 0012's digest of the IDs pruned before, 0013's
// offline reason and time of every replica, and 0014's event_text of every
// event, which reads back as jsonb wrote it), every row and every record
// read back is the one written,
// roles.sql run again gives the roles exactly what it documents (as on a
// fresh install), and the new behaviour works on the old data: old events
// are pruned by the lifecycle role and not stored again when delivered
// again (a different event under the ID of one is a conflict, under an ID
// pruned before the upgrade it is answered as stored, as before),
// sequences go on, reservations made before the upgrade settle (handed
// out by the older build, they carry no hand-out) and are handed out
// again as hand-out 2, a claim of a hand-out that shared a reservation
// made before the upgrade releases nothing, a new route's claim releases
// it, the catalog pages in byte order.
//
// This build routes only on a schema with 0010's columns, so it cannot
// act as an older build that routes: the older build's database is made
// by populating one of this build's schema and undoing the later
// migrations (olderSchema), and checked to have exactly the schema a
// fresh install of the older version has.
func TestUpgradeKeepsData(t *testing.T) {
	t.Parallel()
	for _, from := range []int{5, 6, 7, 8, 9, 10, 11, 12, 13} {
		t.Run(fmt.Sprintf("FromVersion%d", from), func(t *testing.T) {
			t.Parallel()
			testUpgrade(t, from)
		})
	}
}

// upgradeWorld is what populate wrote.
type upgradeWorld struct {
	types, versions, instances, replicas, policies []string
	bindings                                       []registry.BindingKey
	// routes are the assignments made; settled[i] says whether routes[i]
	// was settled.
	routes  []registry.RouteAssignment
	settled []bool
	// events are the events each tenant's log holds, as AppendEvents
	// returned them.
	events map[string][]registry.StoredEvent
	// catalog is the capability IDs each tenant sees, in byte order.
	catalog map[string][]string
}

const (
	tenantA = "tenant-aa"
	tenantB = "tenant-ab"
	// tenantC's one event is pruned by the older build (schema 9 and
	// later), before the upgrade (pruneBeforeUpgrade).
	tenantC = "tenant-ac"
)

// populate writes a fleet through r (an older build): the catalog (two
// types, one with capability IDs a linguistic collation orders unlike
// bytes), replicas, routes (some settled, the others still reserved) and
// events of two tenants received at different times.
func populate(t *testing.T, r *pgregistry.Registry, clock *registrytest.Clock) *upgradeWorld {
	t.Helper()
	ctx := t.Context()
	pol := registry.ConservativePolicy("quota:c")
	sw := seedWorld(t, r, clock, pol, 2, 1, 2, 4)
	w := &upgradeWorld{
		types: []string{"ctype_alpha", "ctype_beta"}, versions: []string{sw.version.ID, "cver_beta1"},
		instances: []string{"cinst_tenant-aa-a", "cinst_tenant-ab-a", "cinst_beta"}, policies: []string{pol.PolicyRef},
		events: map[string][]registry.StoredEvent{},
	}
	for _, rep := range sw.replicas {
		w.replicas = append(w.replicas, rep.ID)
	}
	for _, tn := range []string{tenantA, tenantB} {
		for _, c := range []string{"alpha.read", "alpha.write"} {
			w.bindings = append(w.bindings, registry.BindingKey{TenantID: tn, CapabilityID: c, InstanceID: "cinst_" + tn + "-a"})
		}
	}

	beta := registry.ConnectorType{ID: "ctype_beta", Name: "beta", Owner: "owner-beta", Enabled: true}
	must(t, r.PutConnectorType(ctx, beta))
	betaCaps := []string{"beta.x_1", "beta.B", "beta.x1", "beta.a", "beta.Z"}
	var caps []aip.Capability
	for _, c := range betaCaps {
		caps = append(caps, registrytest.Capability(c, "does "+c))
	}
	must(t, r.AdmitVersion(ctx, registrytest.Version("cver_beta1", beta.ID, "1.0.0", beta.Owner, registry.VersionActive, registrytest.Manifest("service:beta", caps))))
	must(t, r.PutInstance(ctx, registry.ConnectorInstance{ID: "cinst_beta", ConnectorTypeID: beta.ID, VersionID: "cver_beta1", TenantID: tenantA,
		ConfigRevision: 2, SecretProviderRef: "secret://beta", Status: registry.InstanceEnabled}))
	for i, c := range betaCaps {
		b := registry.CapabilityBinding{TenantID: tenantA, CapabilityID: c, InstanceID: "cinst_beta", Priority: uint32(i), PolicyRevision: 1, QuotaPolicyRef: pol.PolicyRef, Enabled: true}
		must(t, r.PutBinding(ctx, b))
		w.bindings = append(w.bindings, b.Key())
	}
	rep := registrytest.Replica("crepl_beta-0", "cinst_beta", "cver_beta1", clock.Now().Add(time.Hour))
	must(t, r.PutReplica(ctx, rep))
	w.replicas = append(w.replicas, rep.ID)
	w.catalog = map[string][]string{
		tenantA: append([]string{"alpha.read", "alpha.write"}, betaCaps...),
		tenantB: {"alpha.read", "alpha.write"},
	}
	for _, ids := range w.catalog {
		slices.Sort(ids) // Go compares bytes
	}

	// Three routes per tenant; the first is settled, the others stay
	// reserved across the upgrade.
	for _, tn := range []string{tenantA, tenantB} {
		for i, c := range []string{"alpha.read", "alpha.write", "alpha.read"} {
			clock.Advance(time.Second)
			a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tn, CapabilityID: c})
			must(t, err)
			if i == 0 {
				must(t, r.Settle(ctx, a, registry.SettlementCompleted))
			}
			w.routes, w.settled = append(w.routes, a), append(w.settled, i == 0)
		}
	}

	// Events, received at different times.
	for _, b := range []struct {
		tenant string
		at     time.Duration
		ids    []string
	}{
		{tenantA, time.Minute, []string{"evt_a1", "evt_a2"}},
		{tenantB, 2 * time.Minute, []string{"evt_b1"}},
		{tenantA, 3 * time.Minute, []string{"evt_a3"}},
		{tenantA, 20 * time.Minute, []string{"evt_a4"}},
		{tenantB, 30 * time.Minute, []string{"evt_b2", "evt_b3"}},
	} {
		batch := registrytest.EventBatch(b.tenant, "r", b.ids...)
		batch.ReceivedAt = registrytest.Epoch.Add(b.at)
		stored, err := r.AppendEvents(ctx, batch)
		must(t, err)
		w.events[b.tenant] = append(w.events[b.tenant], stored...)
	}
	return w
}

// readBack is every record of w as r reads it.
type readBack struct {
	Types        []registry.ConnectorType
	Versions     []registry.ConnectorVersion
	Instances    []registry.ConnectorInstance
	Replicas     []registry.ConnectorReplica
	Bindings     []registry.CapabilityBinding
	Policies     []registry.AdmissionPolicy
	Assignments  []registry.RouteAssignment
	Reservations []registry.RouteReservation
	Events       map[string][]registry.StoredEvent
	Revision     uint64
	Ledger       registry.Ledger
	Status       registry.FleetStatusSummary
}

func readAllRecords(t *testing.T, r *pgregistry.Registry, w *upgradeWorld) readBack {
	t.Helper()
	ctx := t.Context()
	var actionIDs []string
	for _, a := range w.routes {
		actionIDs = append(actionIDs, a.ActionID)
	}
	rb := readBack{
		Types:        readEach(t, "", w.types, r.ConnectorType),
		Versions:     readEach(t, "", w.versions, r.ConnectorVersion),
		Instances:    readEach(t, "", w.instances, r.ConnectorInstance),
		Replicas:     readEach(t, "", w.replicas, r.ConnectorReplica),
		Bindings:     readEach(t, "", w.bindings, r.CapabilityBinding),
		Policies:     readEach(t, "", w.policies, r.AdmissionPolicy),
		Assignments:  readEach(t, "assignment ", actionIDs, r.Assignment),
		Reservations: readEach(t, "reservation ", actionIDs, r.Reservation),
		Events:       map[string][]registry.StoredEvent{},
	}
	for tn := range w.events {
		rb.Events[tn] = tenantEvents(t, r, tn)
	}
	get := func(err error, what string) {
		t.Helper()
		if err != nil {
			t.Fatalf("read %s: %v", what, err)
		}
	}
	var err error
	rb.Revision, err = r.CatalogRevision(ctx)
	get(err, "catalog revision")
	rb.Ledger, err = r.Ledger(ctx)
	get(err, "ledger")
	rb.Status, err = r.Status(ctx)
	get(err, "fleet status")
	return rb
}

// readEach reads the record of every key through read, in order; a
// failure names the key after what.
func readEach[K, V any](t *testing.T, what string, keys []K, read func(context.Context, K) (V, error)) []V {
	t.Helper()
	var out []V
	for _, k := range keys {
		v, err := read(t.Context(), k)
		if err != nil {
			t.Fatalf("read %s%v: %v", what, k, err)
		}
		out = append(out, v)
	}
	return out
}

// tenantEvents reads a tenant's whole log, two events a page.
func tenantEvents(t *testing.T, r registry.EventLog, tenant string) []registry.StoredEvent {
	t.Helper()
	var out []registry.StoredEvent
	var after uint64
	for {
		p, err := r.Events(t.Context(), tenant, after, 2)
		must(t, err)
		out = append(out, p.Events...)
		if !p.More {
			return out
		}
		// Paging must advance (however many events a busy machine let
		// the traffic append).
		if len(p.Events) == 0 || p.Events[len(p.Events)-1].Sequence <= after {
			t.Fatalf("the event log of %s does not advance after sequence %d", tenant, after)
		}
		after = p.Events[len(p.Events)-1].Sequence
	}
}

// catalogIDs pages through a tenant's catalog, two capabilities a page.
func catalogIDs(t *testing.T, r registry.Catalog, tenant string) []string {
	t.Helper()
	var out []string
	q := registry.CatalogQuery{Limit: 2}
	for range 100 {
		p, err := r.QueryCapabilities(t.Context(), q, registry.ForTenant(tenant))
		must(t, err)
		for _, d := range p.Capabilities {
			out = append(out, d.Capability.ID)
		}
		if p.NextCursor == "" {
			return out
		}
		q.Cursor = p.NextCursor
	}
	t.Fatalf("the catalog of %s pages for ever: %v...", tenant, out[:10])
	return nil
}

// sameJSON compares JSON documents by value: jsonb keeps neither key order
// nor spacing.
var sameJSON = cmp.Comparer(func(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	return cmp.Equal(x, y)
})

// tableRows returns every row of every table of schema aip_registry but
// the migrations table, as JSON text without the columns omit names per
// table, sorted per table.
func tableRows(t *testing.T, dbURL string, omit map[string][]string) map[string][]string {
	t.Helper()
	ctx := t.Context()
	c := connect(t, dbURL)
	rows, err := c.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = 'aip_registry' AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations'`)
	must(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	out := map[string][]string{}
	for _, tbl := range tables {
		rows, err := c.Query(ctx, `SELECT (to_jsonb(t) - $1::text[])::text FROM aip_registry.`+pgx.Identifier{tbl}.Sanitize()+` t`, append([]string{}, omit[tbl]...))
		must(t, err)
		out[tbl], err = pgx.CollectRows(rows, pgx.RowTo[string])
		must(t, err)
		slices.Sort(out[tbl])
	}
	return out
}

// migrationRows returns the migrations table, one "version name checksum
// applied_at_ms" line per row.
func migrationRows(t *testing.T, dbURL string) []string {
	t.Helper()
	rows, err := connect(t, dbURL).Query(t.Context(), `SELECT format('%s %s %s %s', version, name, checksum, applied_at_ms)
		FROM aip_registry.schema_migrations ORDER BY version`)
	must(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	return out
}

func testUpgrade(t *testing.T, from int) {
	ctx := t.Context()
	superURL := pgtest.NewDatabase(t)
	adminURL := asRole(t, superURL, "aip_registry_admin")
	dataURL := asRole(t, superURL, "aip_registry_data")
	lifecycleURL := asRole(t, superURL, "aip_registry_lifecycle")

	// The older build, installed the documented way (roles.sql of that
	// build) and populated; its schema is then the older version's.
	oldRoles := oldRolesSQL(t)
	if from >= 7 {
		oldRoles = rolesSQL(t) // the lifecycle role's event grants came with 0007 (0009's table is skipped while missing)
	}
	applyRoles(t, superURL, oldRoles)
	must(t, pgregistry.MigrateBuild(ctx, adminURL, pgregistry.SchemaVersion))
	applyRoles(t, superURL, oldRoles)
	clock := registrytest.NewClock(registrytest.Epoch)
	old, err := pgregistry.OpenBuild(ctx, pgregistry.Config{ControlURL: adminURL, DataURL: dataURL, Now: clock.Now}, pgregistry.SchemaVersion)
	must(t, err)
	defer old.Close()
	w := populate(t, old, clock)
	wantRecords := readAllRecords(t, old, w)
	if diff := cmp.Diff(w.events, wantRecords.Events, sameJSON); diff != "" {
		t.Fatalf("the older build reads back other events than it wrote (-written +read):\n%s", diff)
	}
	old.Close()
	olderSchema(t, superURL, from)
	if from >= 9 {
		pruneBeforeUpgrade(t, dataURL, lifecycleURL, clock, from)
	}
	wantRows := tableRows(t, superURL, nil)
	oldLedger := migrationRows(t, superURL)
	if len(oldLedger) != from {
		t.Fatalf("the older build recorded %d migrations, want %d", len(oldLedger), from)
	}

	// The upgrade: two processes migrate at once, then an operator runs
	// the migration again.
	var g errgroup.Group
	for range 2 {
		g.Go(func() error { return pgregistry.Migrate(ctx, adminURL) })
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("concurrent migrations of the populated version-%d database: %v", from, err)
	}
	must(t, pgregistry.Migrate(ctx, adminURL))
	gotLedger := migrationRows(t, superURL)
	if len(gotLedger) != pgregistry.SchemaVersion || !slices.Equal(gotLedger[:from], oldLedger) {
		t.Fatalf("migrations recorded after the upgrade:\n%s\nwant the %d of the older build unchanged, then up to %d:\n%s",
			strings.Join(gotLedger, "\n"), from, pgregistry.SchemaVersion, strings.Join(oldLedger, "\n"))
	}

	// Until roles.sql runs again the lifecycle role may not prune (the
	// operator guide says so: pruning fails, the events are kept).
	lc, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: lifecycleURL, Now: clock.Now})
	must(t, err)
	defer lc.Close()
	if from < 7 {
		if _, err := lc.PruneEvents(ctx, registrytest.Epoch.Add(5*time.Minute), 100); !privilegeFailure(err) {
			t.Fatalf("PruneEvents through the lifecycle role before roles.sql ran again: %v, want a privilege failure", err)
		}
	}
	applyRoles(t, superURL, rolesSQL(t))

	// Every row is unchanged but for the columns the upgrade added: 0008's
	// hold their defaults (every route handed out once), 0010's are NULL
	// (no hand-out named a claim), 0011's scope_stripes is NULL (every
	// route's scopes in its counter_stripe); 0009's pruned_events starts
	// empty; and every record reads back the same.
	gotRows := tableRows(t, superURL, addedColumns(from))
	if from < 9 {
		if n := len(gotRows["pruned_events"]); n != 0 {
			t.Fatalf("pruned_events holds %d rows right after the upgrade, want none", n)
		}
		delete(gotRows, "pruned_events")
	}
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Fatalf("rows changed by the upgrade (-before +after):\n%s", diff)
	}
	var odd int
	must(t, connect(t, superURL).QueryRow(ctx, `SELECT count(*) FROM aip_registry.route_assignments WHERE hand_out <> 1 OR reserved_hand_out <> 1`).Scan(&odd))
	if odd != 0 {
		t.Fatalf("%d routes made before the upgrade do not count as handed out once", odd)
	}
	if from < 10 {
		must(t, connect(t, superURL).QueryRow(ctx, `SELECT count(*) FROM aip_registry.route_assignments WHERE hand_out_claim IS NOT NULL OR claim_hand_out IS NOT NULL`).Scan(&odd))
		if odd != 0 {
			t.Fatalf("%d routes made before the upgrade carry a claim", odd)
		}
	}
	must(t, connect(t, superURL).QueryRow(ctx, `SELECT count(*) FROM aip_registry.route_assignments
		WHERE scope_stripes IS NOT NULL OR counter_stripe NOT BETWEEN 0 AND 7`).Scan(&odd))
	if odd != 0 {
		t.Fatalf("%d routes made before the upgrade do not keep every scope in their counter_stripe", odd)
	}
	must(t, connect(t, superURL).QueryRow(ctx, `SELECT count(*) FROM aip_registry.connector_replicas
		WHERE offline_reason IS NOT NULL OR offline_at_ms IS NOT NULL`).Scan(&odd))
	if odd != 0 {
		t.Fatalf("%d replicas provisioned before the upgrade carry an offline reason", odd)
	}
	r, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: adminURL, DataURL: dataURL, Now: clock.Now})
	must(t, err)
	defer r.Close()
	if diff := cmp.Diff(wantRecords, readAllRecords(t, r, w), sameJSON); diff != "" {
		t.Fatalf("records read back differently after the upgrade (-before +after):\n%s", diff)
	}
	for tn, want := range w.catalog {
		if got := catalogIDs(t, r, tn); !slices.Equal(got, want) {
			t.Errorf("catalog of %s after the upgrade: %v, want %v (byte order)", tn, got, want)
		}
		for _, id := range want {
			if _, err := r.Capability(ctx, id, registry.ForTenant(tn)); err != nil {
				t.Errorf("capability %s of %s after the upgrade: %v", id, tn, err)
			}
		}
	}

	checkRolePrivileges(t, superURL)

	// Event retention on the old events: the data role may not prune, the
	// lifecycle role deletes those received before the cutoff, oldest
	// first, and each tenant's sequences go on.
	cutoff := registrytest.Epoch.Add(5 * time.Minute)
	if _, err := r.PruneEvents(ctx, cutoff, 100); !privilegeFailure(err) {
		t.Fatalf("PruneEvents through the data role: %v, want a privilege failure", err)
	}
	if n, err := lc.PruneEvents(ctx, cutoff, 3); err != nil || n != 3 { // a1, a2 (1 min), b1 (2 min)
		t.Fatalf("PruneEvents(limit 3) of the events stored before the upgrade: %d, %v; want 3", n, err)
	}
	if n, err := lc.PruneEvents(ctx, cutoff, 100); err != nil || n != 1 { // a3 (3 min)
		t.Fatalf("PruneEvents of the rest stored before the cutoff: %d, %v; want 1", n, err)
	}
	if diff := cmp.Diff(w.events[tenantA][3:], tenantEvents(t, r, tenantA), sameJSON); diff != "" {
		t.Fatalf("%s's events after pruning (-want +got):\n%s", tenantA, diff)
	}
	if diff := cmp.Diff(w.events[tenantB][1:], tenantEvents(t, r, tenantB), sameJSON); diff != "" {
		t.Fatalf("%s's events after pruning (-want +got):\n%s", tenantB, diff)
	}
	// A different event under the ID of an event stored before the
	// upgrade and pruned after it is a conflict; under the ID the older
	// build pruned, it is answered as stored (that ID has no digest) —
	// unless that build, of schema 12 or later, kept the digest too.
	changed := registrytest.EventBatch(tenantA, "r", "evt_a1")
	changed.Events[0].Kind = "thing.changed"
	if _, err := r.AppendEvents(ctx, changed); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a changed evt_a1, pruned after the upgrade: %v, want ErrConflict", err)
	}
	if from >= 12 {
		changed := registrytest.EventBatch(tenantC, "r", "evt_c1")
		changed.Events[0].Kind = "thing.changed"
		if _, err := r.AppendEvents(ctx, changed); !errors.Is(err, registry.ErrConflict) {
			t.Fatalf("a changed evt_c1, pruned by the build of schema %d: %v, want ErrConflict", from, err)
		}
	} else if from >= 9 {
		changed := registrytest.EventBatch(tenantC, "r", "evt_c1")
		changed.Events[0].Kind = "thing.changed"
		if got, err := r.AppendEvents(ctx, changed); err != nil || !got[0].Pruned {
			t.Fatalf("a changed evt_c1, pruned before the upgrade: %+v, %v; want it answered pruned", got, err)
		}
	}
	// Pruned events delivered again are not stored again (evt_a1 is
	// tenant A's, evt_b1 tenant B's, both pruned; neither tenant had the
	// other's); new ones go on after the pruned sequences.
	for tn, want := range map[string][]uint64{tenantA: {5, 0, 6}, tenantB: {4, 5, 0}} {
		b := registrytest.EventBatch(tn, "r", "evt_after", "evt_a1", "evt_b1")
		b.ReceivedAt = registrytest.Epoch.Add(time.Hour)
		stored, err := r.AppendEvents(ctx, b)
		must(t, err)
		for i, seq := range want {
			if stored[i].Sequence != seq || stored[i].Pruned != (seq == 0) {
				t.Errorf("%s's event %s appended after the upgrade and pruning: sequence %d, pruned %t; want sequence %d, pruned %t",
					tn, stored[i].Event.ID, stored[i].Sequence, stored[i].Pruned, seq, seq == 0)
			}
		}
	}

	// Reservations made before the upgrade are handed out again as
	// hand-out 2 and settle, by the older build's assignments too (which
	// carry no hand-out); new routes reserve.
	again := 0
	for i, a := range w.routes {
		if w.settled[i] {
			continue
		}
		if again == 0 {
			b, err := r.Resolve(ctx, registry.RouteRequest{ActionID: a.ActionID, TenantID: a.TenantID, CapabilityID: a.CapabilityID, Claim: "claim-shared"})
			must(t, err)
			if b.HandOut != 2 || !b.Equal(&a) {
				t.Fatalf("a route reserved before the upgrade, handed out again: hand-out %d (equal %t), want 2", b.HandOut, b.Equal(&a))
			}
			// Hand-out 2 shares the reservation hand-out 1 made: its
			// claim releases nothing.
			if released, err := r.ReleaseUnsent(ctx, a.ActionID, "claim-shared"); err != nil || released {
				t.Fatalf("ReleaseUnsent of a hand-out sharing a reservation made before the upgrade: %t, %v; want false", released, err)
			}
			again++
		}
		a.HandOut = 0 // handed out by the older build
		must(t, r.Settle(ctx, a, registry.SettlementCompleted))
		if res, err := r.Reservation(ctx, a.ActionID); err != nil || res.Reserved {
			t.Fatalf("reservation %s after settling it: %+v, %v", a.ActionID, res, err)
		}
	}
	a, err := r.Resolve(ctx, registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: tenantA, CapabilityID: "beta.x_1", Claim: "claim-new"})
	must(t, err)
	if a.InstanceID != "cinst_beta" {
		t.Fatalf("beta.x_1 routed to %s, want cinst_beta", a.InstanceID)
	}
	if released, err := r.ReleaseUnsent(ctx, a.ActionID, "claim-new"); err != nil || !released {
		t.Fatalf("ReleaseUnsent of a new route's claim after the upgrade: %t, %v; want true", released, err)
	}
	l, err := r.Ledger(ctx)
	must(t, err)
	registrytest.CheckLedger(t, l)
}

// addedColumns are the columns an upgrade from version adds, by table:
// 0008's hand-outs, 0010's claims, 0011's scope stripes, 0012's
// pruned-event digests, 0013's offline reasons and 0014's event text.
func addedColumns(from int) map[string][]string {
	var cols []string
	if from < 11 {
		cols = append(cols, "scope_stripes")
	}
	if from < 10 {
		cols = append(cols, "hand_out_claim", "claim_hand_out")
	}
	if from < 8 {
		cols = append(cols, "hand_out", "reserved_hand_out")
	}
	added := map[string][]string{"route_assignments": cols, "events": {"event_text"}}
	if from < 13 {
		added["connector_replicas"] = []string{"offline_reason", "offline_at_ms"}
	}
	if from < 12 {
		added["pruned_events"] = []string{"digest"}
	}
	return added
}

// pruneBeforeUpgrade has the build of schema from (9 to 13), with the
// data and lifecycle roles, append tenantC's event evt_c1 received an hour
// before Epoch and prune it: its ID is remembered without a digest (with
// one by the builds of schema 12 and 13).
func pruneBeforeUpgrade(t *testing.T, dataURL, lifecycleURL string, clock *registrytest.Clock, from int) {
	t.Helper()
	ctx := t.Context()
	data, err := pgregistry.OpenBuild(ctx, pgregistry.Config{DataURL: dataURL, Now: clock.Now}, from)
	must(t, err)
	defer data.Close()
	b := registrytest.EventBatch(tenantC, "r", "evt_c1")
	b.ReceivedAt = registrytest.Epoch.Add(-time.Hour)
	_, err = data.AppendEvents(ctx, b)
	must(t, err)
	lc, err := pgregistry.OpenBuild(ctx, pgregistry.Config{DataURL: lifecycleURL, Now: clock.Now}, from)
	must(t, err)
	defer lc.Close()
	if n, err := lc.PruneEvents(ctx, registrytest.Epoch, 10); err != nil || n != 1 {
		t.Fatalf("the build of schema %d pruning evt_c1: %d, %v; want 1", from, n, err)
	}
}

// downgrades undo each migration from 0006 on, so that olderSchema can
// turn a database this build populated into the one an older build left.
var downgrades = map[int]string{
	14: `ALTER TABLE aip_registry.events DROP COLUMN event_text`,
	13: `DROP TRIGGER connector_replicas_live_clears_offline_reason ON aip_registry.connector_replicas;
DROP FUNCTION aip_registry.clear_offline_reason();
ALTER TABLE aip_registry.connector_replicas
    DROP CONSTRAINT connector_replicas_offline_reason,
    DROP CONSTRAINT connector_replicas_offline_pair,
    DROP COLUMN offline_reason,
    DROP COLUMN offline_at_ms`,
	12: `CREATE OR REPLACE FUNCTION aip_registry.remember_pruned_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO aip_registry.pruned_events (tenant_id, event_id, received_at_ms)
    SELECT tenant_id, event_id, received_at_ms FROM gone
    ON CONFLICT (tenant_id, event_id) DO UPDATE
        SET received_at_ms = GREATEST(aip_registry.pruned_events.received_at_ms, excluded.received_at_ms);
    RETURN NULL;
END
$$;
DROP FUNCTION aip_registry.event_replay_digest(text, text, jsonb);
DROP FUNCTION aip_registry.event_json_normal(jsonb);
ALTER TABLE aip_registry.pruned_events DROP COLUMN digest`,
	11: `ALTER TABLE aip_registry.route_assignments
    DROP CONSTRAINT route_assignments_released_stripes,
    DROP CONSTRAINT route_assignments_counter_stripe,
    DROP COLUMN scope_stripes,
    ADD CONSTRAINT route_assignments_counter_stripe CHECK (counter_stripe >= 0 AND counter_stripe < 8);
DROP FUNCTION aip_registry.scopes_full(text)`,
	10: `ALTER TABLE aip_registry.route_assignments DROP COLUMN hand_out_claim, DROP COLUMN claim_hand_out`,
	9: `DROP TRIGGER events_remember_pruned ON aip_registry.events;
DROP FUNCTION aip_registry.remember_pruned_events();
DROP TABLE aip_registry.pruned_events;
ALTER TABLE aip_registry.route_assignments
    DROP CONSTRAINT route_assignments_last_settlement_check,
    ADD CONSTRAINT route_assignments_last_settlement_check
        CHECK (last_settlement IN ('completed', 'outcome_unknown', 'cancelled', 'lease_expired'))`,
	8: `ALTER TABLE aip_registry.route_assignments DROP COLUMN hand_out, DROP COLUMN reserved_hand_out`,
	7: `DROP INDEX aip_registry.events_by_received`,
	6: `DO $$
DECLARE
    col record;
BEGIN
    FOR col IN
        SELECT c.table_name, c.column_name
        FROM information_schema.columns c
        JOIN information_schema.tables t USING (table_schema, table_name)
        WHERE c.table_schema = 'aip_registry' AND t.table_type = 'BASE TABLE' AND c.data_type = 'text'
        ORDER BY c.table_name, c.ordinal_position
    LOOP
        EXECUTE format('ALTER TABLE aip_registry.%I ALTER COLUMN %I TYPE text COLLATE "default"', col.table_name, col.column_name);
    END LOOP;
END
$$`,
}

// olderSchema undoes the migrations after version on the database at
// superURL (rows kept, the columns undone dropped) and forgets them, then
// checks that the schema is exactly what a fresh install of version has.
func olderSchema(t *testing.T, superURL string, version int) {
	t.Helper()
	ctx := t.Context()
	c := connect(t, superURL)
	for v := pgregistry.SchemaVersion; v > version; v-- {
		sql, ok := downgrades[v]
		if !ok {
			t.Fatalf("no downgrade of migration %d", v)
		}
		if _, err := c.Exec(ctx, sql); err != nil {
			t.Fatalf("undo migration %d: %v", v, err)
		}
	}
	if _, err := c.Exec(ctx, `DELETE FROM aip_registry.schema_migrations WHERE version > $1`, version); err != nil {
		t.Fatal(err)
	}
	fresh := pgtest.NewDatabase(t)
	must(t, pgregistry.MigrateBuild(ctx, fresh, version))
	if diff := cmp.Diff(schemaShape(t, fresh), schemaShape(t, superURL)); diff != "" {
		t.Fatalf("the emulated schema of version %d differs from a fresh install of it (-fresh +emulated):\n%s", version, diff)
	}
}

// schemaShape lists the columns (type, collation, default, nullability),
// indexes and constraints of schema aip_registry.
func schemaShape(t *testing.T, dbURL string) []string {
	t.Helper()
	const q = `
SELECT format('column %s.%s %s collate=%s default=%s null=%s', table_name, column_name, data_type, collation_name, column_default, is_nullable)
FROM information_schema.columns WHERE table_schema = 'aip_registry'
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'aip_registry'
UNION ALL
SELECT format('constraint %s %s', conrelid::regclass, pg_get_constraintdef(oid)) FROM pg_constraint WHERE connamespace = 'aip_registry'::regnamespace`
	rows, err := connect(t, dbURL).Query(t.Context(), q)
	must(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	slices.Sort(out)
	return out
}

// privilegeFailure reports whether err is a registry storage failure for
// lack of a privilege.
func privilegeFailure(err error) bool {
	return errors.Is(err, registry.ErrStorage) && strings.Contains(err.Error(), "permission denied")
}

// rolesTable matches a row of roles.sql's table of grants; columnGrant a
// grant of some columns.
var (
	rolesTable  = regexp.MustCompile(`\('(\w+)',\s+'([^']*)',\s+'([^']*)'\)`)
	columnGrant = regexp.MustCompile(`SELECT \(([^)]*)\)`)
)

// checkRolePrivileges proves, on the database at superURL (roles.sql run
// after its last migration), that the data and lifecycle roles hold
// exactly the privileges roles.sql's table lists, on every table of the
// schema, and that the schema's privileges and owners are those of a
// fresh install of this build.
func checkRolePrivileges(t *testing.T, superURL string) {
	t.Helper()
	ctx := t.Context()
	c := connect(t, superURL)
	rows, err := c.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = 'aip_registry' AND table_type = 'BASE TABLE'`)
	must(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	documented := map[string][2]string{}
	for _, m := range rolesTable.FindAllStringSubmatch(rolesSQL(t), -1) {
		documented[m[1]] = [2]string{m[2], m[3]}
	}
	for _, tbl := range tables {
		doc, ok := documented[tbl]
		if !ok {
			t.Errorf("roles.sql does not list table %s", tbl)
			continue
		}
		for i, role := range []string{"aip_registry_data", "aip_registry_lifecycle"} {
			// "SELECT (a, b)" grants reading those columns only.
			privs, cols := doc[i], []string(nil)
			if m := columnGrant.FindStringSubmatch(privs); m != nil {
				privs = strings.Replace(privs, m[0], "", 1)
				for _, col := range strings.Split(m[1], ",") {
					cols = append(cols, strings.TrimSpace(col))
				}
			}
			want := map[string]bool{}
			for _, p := range strings.Split(privs, ",") {
				if p = strings.TrimSpace(p); p != "" {
					want[p] = true
				}
			}
			for _, p := range []string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"} {
				var has bool
				must(t, c.QueryRow(ctx, `SELECT has_table_privilege($1, 'aip_registry.'||quote_ident($2), $3)`, role, tbl, p).Scan(&has))
				if has != want[p] {
					t.Errorf("%s has %s on %s: %v, roles.sql says %v", role, p, tbl, has, want[p])
				}
			}
			rows, err := c.Query(ctx, `SELECT attname FROM pg_attribute WHERE attrelid = ('aip_registry.'||quote_ident($1))::regclass AND attnum > 0 AND NOT attisdropped`, tbl)
			must(t, err)
			all, err := pgx.CollectRows(rows, pgx.RowTo[string])
			must(t, err)
			for _, col := range all {
				var has bool
				must(t, c.QueryRow(ctx, `SELECT has_column_privilege($1, 'aip_registry.'||quote_ident($2), $3, 'SELECT')`, role, tbl, col).Scan(&has))
				if want := want["SELECT"] || slices.Contains(cols, col); has != want {
					t.Errorf("%s may read %s.%s: %v, roles.sql says %v", role, tbl, col, has, want)
				}
			}
		}
	}

	// The same owners and grants, on every object of the schema, as a
	// fresh install of this build.
	fresh := pgtest.NewDatabase(t)
	sql := rolesSQL(t)
	applyRoles(t, fresh, sql)
	must(t, pgregistry.Migrate(ctx, asRole(t, fresh, "aip_registry_admin")))
	applyRoles(t, fresh, sql)
	if diff := cmp.Diff(schemaACL(t, fresh), schemaACL(t, superURL)); diff != "" {
		t.Errorf("privileges after the upgrade differ from a fresh install (-fresh +upgraded):\n%s", diff)
	}
}

// schemaACL lists the owner and privileges of schema aip_registry and of
// every relation, column and function in it.
func schemaACL(t *testing.T, dbURL string) []string {
	t.Helper()
	const q = `
SELECT format('schema owner=%s acl=%s', pg_get_userbyid(nspowner), array(SELECT x::text FROM unnest(nspacl) x ORDER BY 1))
FROM pg_namespace WHERE nspname = 'aip_registry'
UNION ALL
SELECT format('%s %s owner=%s acl=%s', relkind, relname, pg_get_userbyid(relowner), array(SELECT x::text FROM unnest(relacl) x ORDER BY 1))
FROM pg_class WHERE relnamespace = 'aip_registry'::regnamespace
UNION ALL
SELECT format('column %s.%s acl=%s', c.relname, a.attname, array(SELECT x::text FROM unnest(a.attacl) x ORDER BY 1))
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE c.relnamespace = 'aip_registry'::regnamespace AND a.attacl IS NOT NULL
UNION ALL
SELECT format('function %s owner=%s acl=%s', oid::regprocedure, pg_get_userbyid(proowner), array(SELECT x::text FROM unnest(proacl) x ORDER BY 1))
FROM pg_proc WHERE pronamespace = 'aip_registry'::regnamespace`
	rows, err := connect(t, dbURL).Query(t.Context(), q)
	must(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	must(t, err)
	slices.Sort(out)
	return out
}

// TestMigrateUnderOlderBuildTraffic: the builds of schema versions 7 to
// 13 keep reading and handing out routes, appending and reading events and
// paging the catalog while this build migrates their database (migration
// 0008 adds route_assignments' hand-out columns, 0010 its claim columns,
// 0011 its scope stripes, 0012 pruned_events' digests and the trigger that
// fills them, 0013 connector_replicas' offline reasons and their trigger,
// 0014 events' event_text):
// no call fails, and every tenant's event sequences stay gapless. This
// build routes only on a schema with those columns, so the older build's
// route traffic is its statements (RouteStatementsOfBuild) on a pool of
// its own, prepared and cached per connection as pgx does, on routes made
// before the migration.
func TestMigrateUnderOlderBuildTraffic(t *testing.T) {
	t.Parallel()
	for _, from := range []int{7, 8, 9, 10, 11, 12, 13} {
		t.Run(fmt.Sprintf("FromVersion%d", from), func(t *testing.T) {
			t.Parallel()
			testMigrateUnderTraffic(t, from)
		})
	}
}

func testMigrateUnderTraffic(t *testing.T, from int) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	clock := registrytest.NewClock(registrytest.Epoch)
	cur, err := pgregistry.OpenBuild(ctx, pgregistry.Config{ControlURL: dbURL, Now: clock.Now}, pgregistry.SchemaVersion)
	must(t, err)
	w := populate(t, cur, clock)
	cur.Close()
	olderSchema(t, dbURL, from)
	old, err := pgregistry.OpenBuild(ctx, pgregistry.Config{ControlURL: dbURL, Now: clock.Now}, from)
	must(t, err)
	defer old.Close()
	oldPool, err := pgxpool.New(ctx, dbURL)
	must(t, err)
	defer oldPool.Close()
	readRoute, resolvedAgain := pgregistry.RouteStatementsOfBuild(from)
	var reserved []string
	for i, a := range w.routes {
		if !w.settled[i] {
			reserved = append(reserved, a.ActionID)
		}
	}

	var turn atomic.Int64
	const workers, cyclesAfter = 4, 3
	started := make(chan struct{}, workers)
	var migrated atomic.Bool
	cycle := func() error {
		id := reserved[int(turn.Add(1))%len(reserved)]
		rows, err := oldPool.Query(ctx, readRoute, id)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if rows.Close(); rows.Err() != nil || n != 1 {
			return fmt.Errorf("read route %s: %d rows, %v", id, n, rows.Err())
		}
		args := []any{id, int64(1)}
		if from >= 10 {
			args = append(args, nil) // the build of schema 10 records the hand-out's claim
		}
		if _, err := oldPool.Exec(ctx, resolvedAgain, args...); err != nil {
			return err
		}
		if _, err := old.AppendEvents(ctx, registrytest.EventBatch(tenantA, "r", aip.NewID("evt"), aip.NewID("evt"))); err != nil {
			return err
		}
		if _, err := old.Events(ctx, tenantA, 0, 5); err != nil {
			return err
		}
		_, err = old.QueryCapabilities(ctx, registry.CatalogQuery{Limit: 3}, registry.ForTenant(tenantA))
		return err
	}
	var g errgroup.Group
	for range workers {
		g.Go(func() error {
			signalled := false
			defer func() {
				if !signalled { // failed before its first cycle: do not leave the test waiting
					started <- struct{}{}
				}
			}()
			after := 0
			for n := 0; after < cyclesAfter; n++ {
				done := migrated.Load()
				if err := cycle(); err != nil {
					return fmt.Errorf("the older build during the migration: %w", err)
				}
				if n == 0 {
					started <- struct{}{}
					signalled = true
				}
				if done {
					after++
				}
			}
			return nil
		})
	}
	for range workers {
		<-started
	}
	err = pgregistry.Migrate(ctx, dbURL)
	migrated.Store(true)
	if werr := g.Wait(); werr != nil {
		t.Fatal(werr)
	}
	if err != nil {
		t.Fatalf("migrate under traffic: %v", err)
	}
	evs := tenantEvents(t, old, tenantA)
	for i, e := range evs {
		if e.Sequence != uint64(i)+1 {
			t.Fatalf("event %d of %s has sequence %d, want %d", i, tenantA, e.Sequence, i+1)
		}
	}
}

// TestOlderBuildLifecycleWritesDropOfflineReason: a build of schema 12
// still running after migration 0013 writes lifecycle changes without the
// offline reason. A replica such a build registers (ready) loses the
// reason this build recorded, rather than being refused by the reason's
// constraint or keeping it, so that when such a build takes it offline
// again it shows no reason instead of the stale one.
func TestOlderBuildLifecycleWritesDropOfflineReason(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	must(t, err)
	rep := w.ProvisionedReplica("crepl_old", clock.Now())
	must(t, r.PutReplica(ctx, rep))
	for _, c := range []aip.ControlCommand{
		aip.RegisterCommand(w.Registration(&rep)),
		aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, ConnectorReady: false}),
	} {
		res, err := r.ApplyLifecycle(ctx, []registry.LifecycleCommand{registrytest.LifecycleCommand(clock.Now(), c)})
		must(t, err)
		must(t, res[0].Err)
	}
	if got, err := r.ConnectorReplica(ctx, rep.ID); err != nil || got.OfflineReason != registry.OfflineUnhealthy {
		t.Fatalf("after an unhealthy heartbeat: %+v, %v; want offline for unhealthy", got, err)
	}

	c := connect(t, dbURL)
	oldWrite := pgregistry.LifecycleWriteOfBuild(12)
	nowMS := clock.Now().UnixMilli()
	for i, st := range []aip.ReplicaStatus{aip.ReplicaReady, aip.ReplicaOffline} {
		health := int64(3 + i)
		if _, err := c.Exec(ctx, oldWrite, []string{rep.ID}, []string{string(st)}, []int64{nowMS + 30_000}, []int64{4},
			[]int64{health}, []string{fmt.Sprintf("req-old-%d", i)}, []string{registrytest.Digest(string(st))}, nowMS); err != nil {
			t.Fatalf("the build of schema 12 writes replica %s %s: %v", rep.ID, st, err)
		}
		got, err := r.ConnectorReplica(ctx, rep.ID)
		must(t, err)
		if got.Status != st || got.HealthRevision != uint64(health) || got.OfflineReason != "" || !got.OfflineAt.IsZero() {
			t.Fatalf("after the build of schema 12 wrote it %s: %s at %d, offline for %q at %s; want %s at %d with no offline reason",
				st, got.Status, got.HealthRevision, got.OfflineReason, aip.At(got.OfflineAt), st, health)
		}
	}
}
