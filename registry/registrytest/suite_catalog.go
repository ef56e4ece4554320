package registrytest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

func runCatalog(t *testing.T, nb NewBackend) {
	t.Run("RevisionAdvancesOncePerEffectiveWrite", func(t *testing.T) { testRevisionAdvances(t, nb) })
	t.Run("TenantVisibility", func(t *testing.T) { testTenantVisibility(t, nb) })
	t.Run("NoTenantNoInternalSeesNothing", func(t *testing.T) { testNoContext(t, nb) })
	t.Run("InternalRead", func(t *testing.T) { testInternalRead(t, nb) })
	t.Run("ProfileFilter", func(t *testing.T) { testProfileFilter(t, nb) })
	t.Run("Paging", func(t *testing.T) { testPaging(t, nb) })
	t.Run("PageByteBudget", func(t *testing.T) { testPageBytes(t, nb) })
	t.Run("PagingIsBytewise", func(t *testing.T) { testPagingBytewise(t, nb) })
	t.Run("StaleCursor", func(t *testing.T) { testStaleCursor(t, nb) })
	t.Run("ManifestLimits", func(t *testing.T) { testManifestLimits(t, nb) })
	t.Run("CapabilityContractIsFleetWide", func(t *testing.T) { testContractConflict(t, nb) })
	t.Run("HostileQueries", func(t *testing.T) { testHostileQueries(t, nb) })
}

// ids returns the capability IDs of a page.
func ids(p registry.CapabilityPage) []string {
	out := make([]string, len(p.Capabilities))
	for i, d := range p.Capabilities {
		out[i] = d.Capability.ID
	}
	return out
}

// readAll pages through a query and returns every ID; it fails the test on
// any error or on pages from different revisions.
func (f *fx) readAll(q registry.CatalogQuery, rc registry.ReadContext) ([]string, int) {
	f.t.Helper()
	var all []string
	var rev uint64
	total := -1
	for n := 0; ; n++ {
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
		f.must(err)
		if n == 0 {
			rev, total = p.CatalogRevision, p.Total
		} else if p.CatalogRevision != rev || p.Total != total {
			f.t.Fatalf("page %d: revision %d total %d, first page had revision %d total %d", n, p.CatalogRevision, p.Total, rev, total)
		}
		all = append(all, ids(p)...)
		if p.NextCursor == "" {
			break
		}
		if want := registry.Cursor(rev, all[len(all)-1]); p.NextCursor != want {
			f.t.Fatalf("cursor %q, want %q", p.NextCursor, want)
		}
		q.Cursor = p.NextCursor
		if n > 10_000 {
			f.t.Fatal("paging does not terminate")
		}
	}
	return all, total
}

// visible returns what a read context sees, in one call with a large limit.
func (f *fx) visible(rc registry.ReadContext) []string {
	f.t.Helper()
	all, total := f.readAll(registry.CatalogQuery{Limit: 200}, rc)
	if total != len(all) {
		f.t.Fatalf("total %d, but the pages held %d definitions", total, len(all))
	}
	return all
}

func (f *fx) wantVisible(rc registry.ReadContext, want ...string) {
	f.t.Helper()
	got := f.visible(rc)
	if want == nil {
		want = []string{}
	}
	if got == nil {
		got = []string{}
	}
	if !slices.Equal(got, want) {
		f.t.Fatalf("catalog for %+v = %v, want %v", rc, got, want)
	}
	for _, id := range want {
		r, err := f.b.Catalog.Capability(f.ctx, id, rc)
		f.must(err)
		if r.Definition.Capability.ID != id || r.CatalogRevision != f.revision() {
			f.t.Fatalf("Capability(%s) = %s at revision %d, want revision %d", id, r.Definition.Capability.ID, r.CatalogRevision, f.revision())
		}
	}
}

func (f *fx) wantHidden(rc registry.ReadContext, id string) {
	f.t.Helper()
	_, err := f.b.Catalog.Capability(f.ctx, id, rc)
	f.wantErr(err, registry.ErrNotFound, "Capability("+id+")")
}

func testRevisionAdvances(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	step := func(what string, want uint64) {
		t.Helper()
		if got := f.revision(); got != want {
			t.Fatalf("after %s: catalog revision %d, want %d", what, got, want)
		}
	}
	step("nothing", 0)
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, registry.FleetPolicy("quota:a")))
	step("policy", 1)
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, registry.FleetPolicy("quota:a")))
	step("identical policy", 1)
	ct := f.typ("alpha")
	step("type", 2)
	f.must(f.b.Admin.PutConnectorType(f.ctx, ct))
	step("identical type", 2)
	v := f.version(ct, "alpha1", registry.VersionActive, "alpha.read")
	step("version", 3)
	f.must(f.b.Admin.AdmitVersion(f.ctx, v))
	step("identical version", 3)
	f.must(f.b.Admin.SetVersionStatus(f.ctx, v.ID, registry.VersionActive))
	step("same status", 3)
	i := f.instance("a", v, "tenant-1")
	step("instance", 4)
	f.must(f.b.Admin.PutInstance(f.ctx, i))
	step("identical instance", 4)
	b := f.bind(i, "alpha.read", 0, "quota:a")
	step("binding", 5)
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	step("identical binding", 5)
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, ct.ID, true))
	step("type already enabled", 5)
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, ct.ID, false))
	step("type disabled", 6)
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, ct.ID, true))
	step("type enabled", 7)

	r := f.replica("a1", i)
	step("replica", 7)
	f.update(r.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Minute) })
	step("heartbeat", 7)
	f.update(r.ID, func(r *registry.ConnectorReplica) { r.Capacity = 9 })
	step("capacity change", 7)
	a := f.resolve(request("tenant-1", "alpha.read"))
	step("resolve", 7)
	if a.CatalogRevision != 7 {
		t.Fatalf("assignment catalog revision %d, want 7", a.CatalogRevision)
	}
	f.settle(a, registry.SettlementCompleted)
	step("settle", 7)
	f.clock.Advance(time.Hour)
	n, err := f.b.Fleet.ExpireStaleReplicas(f.ctx, 10)
	f.must(err)
	if n != 1 {
		t.Fatalf("expired %d replicas, want 1", n)
	}
	step("lease expiry", 7)
}

// visibilityWorld: type alpha, active version with alpha.read and
// alpha.write, an instance for tenant-1 bound to alpha.read.
type visibilityWorld struct {
	ct registry.ConnectorType
	v  registry.ConnectorVersion
	i  registry.ConnectorInstance
	b  registry.CapabilityBinding
}

func newVisibilityWorld(f *fx) visibilityWorld {
	var w visibilityWorld
	w.ct = f.typ("alpha")
	w.v = f.version(w.ct, "alpha1", registry.VersionActive, "alpha.read", "alpha.write")
	w.i = f.instance("a", w.v, "tenant-1")
	w.b = f.bind(w.i, "alpha.read", 0, "")
	return w
}

func testTenantVisibility(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newVisibilityWorld(f)
	t1, t2 := registry.ForTenant("tenant-1"), registry.ForTenant("tenant-2")
	f.wantVisible(t1, "alpha.read")
	f.wantHidden(t1, "alpha.write") // implemented, but not bound
	f.wantVisible(t2)
	f.wantHidden(t2, "alpha.read")

	// 1. the tenant has an enabled binding.
	b := w.b
	b.Enabled, b.PolicyRevision = false, 2
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	f.wantVisible(t1)
	b.Enabled, b.PolicyRevision = true, 3
	f.must(f.b.Admin.PutBinding(f.ctx, b))
	f.wantVisible(t1, "alpha.read")

	// 2. the bound instance is enabled and the tenant's.
	i := w.i
	i.Status, i.ConfigRevision = registry.InstanceDisabled, 2
	f.must(f.b.Admin.PutInstance(f.ctx, i))
	f.wantVisible(t1)
	i.Status, i.ConfigRevision = registry.InstanceEnabled, 3
	f.must(f.b.Admin.PutInstance(f.ctx, i))
	f.wantVisible(t1, "alpha.read")
	foreign := registry.CapabilityBinding{TenantID: "tenant-2", CapabilityID: "alpha.read", InstanceID: w.i.ID, PolicyRevision: 1, Enabled: true}
	f.wantField(f.b.Admin.PutBinding(f.ctx, foreign), registry.ErrInvalid, "instance_id", "binding tenant-2 to tenant-1's instance")
	f.wantVisible(t2)

	// 3. the version is active (and so qualified).
	f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionAdmitted))
	f.wantVisible(t1)
	f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionActive))
	f.wantVisible(t1, "alpha.read")

	// 4. the connector type is enabled.
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, false))
	f.wantVisible(t1)
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, true))
	f.wantVisible(t1, "alpha.read")

	// 5. the version implements the capability: a binding to a capability
	// the version lacks is refused, so it can never become visible.
	missing := registry.CapabilityBinding{TenantID: "tenant-1", CapabilityID: "beta.read", InstanceID: w.i.ID, PolicyRevision: 1, Enabled: true}
	f.wantField(f.b.Admin.PutBinding(f.ctx, missing), registry.ErrInvalid, "capability_id", "binding a capability the version lacks")
	f.wantHidden(t1, "beta.read")
}

func testNoContext(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	newVisibilityWorld(f)
	none := registry.ReadContext{}
	p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 50}, none)
	f.must(err)
	if len(p.Capabilities) != 0 || p.Total != 0 || p.NextCursor != "" {
		t.Fatalf("read without tenant or internal permission returned %v (total %d)", ids(p), p.Total)
	}
	f.wantHidden(none, "alpha.read")
}

func testInternalRead(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	w := newVisibilityWorld(f)
	// A second type with an admitted (not active) version: never visible.
	ct := f.typ("beta")
	f.version(ct, "beta1", registry.VersionAdmitted, "beta.read")
	in := registry.InternalRead()
	f.wantVisible(in, "alpha.read", "alpha.write")
	f.wantHidden(in, "beta.read")
	// Internal reads ignore a tenant ID.
	f.wantVisible(registry.ReadContext{TenantID: "tenant-9", Internal: true}, "alpha.read", "alpha.write")
	f.must(f.b.Admin.SetVersionStatus(f.ctx, "cver_beta1", registry.VersionActive))
	f.wantVisible(in, "alpha.read", "alpha.write", "beta.read")
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, false))
	f.wantVisible(in, "beta.read")
	f.must(f.b.Admin.SetConnectorTypeEnabled(f.ctx, w.ct.ID, true))
	f.must(f.b.Admin.SetVersionStatus(f.ctx, w.v.ID, registry.VersionRevoked))
	f.wantVisible(in, "beta.read")
	f.wantVisible(registry.ForTenant("tenant-1"))
}

func testProfileFilter(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("gamma")
	caps := []aip.Capability{Capability("gamma.read", "reads"), Capability("shared.ping", "does shared.ping")}
	v := Version("cver_gamma1", ct.ID, "1", ct.Owner, registry.VersionActive, Manifest("service:gamma", caps, "aip.mcp.streamable-http.v1"))
	f.must(f.b.Admin.AdmitVersion(f.ctx, v))
	ct2 := f.typ("delta")
	v2 := f.version(ct2, "delta1", registry.VersionActive, "delta.read", "shared.ping")
	i1 := f.instance("g", v, "tenant-1")
	i2 := f.instance("d", v2, "tenant-1")
	f.bind(i1, "gamma.read", 0, "")
	f.bind(i2, "delta.read", 0, "")
	f.bind(i2, "shared.ping", 0, "")
	rc := registry.ForTenant("tenant-1")
	q := registry.CatalogQuery{Limit: 50, Profile: "aip.mcp.streamable-http.v1"}
	p, err := f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
	f.must(err)
	// shared.ping is bound only through delta, whose version lacks the profile.
	if got := ids(p); !slices.Equal(got, []string{"gamma.read"}) || p.Total != 1 {
		t.Fatalf("profile page = %v total %d, want [gamma.read] total 1", got, p.Total)
	}
	f.bind(i1, "shared.ping", 1, "")
	p, err = f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
	f.must(err)
	if got := ids(p); !slices.Equal(got, []string{"gamma.read", "shared.ping"}) {
		t.Fatalf("profile page = %v, want [gamma.read shared.ping]", got)
	}
	q.Profile = aip.NativeHTTPProfile
	p, err = f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
	f.must(err)
	if got := ids(p); !slices.Equal(got, []string{"delta.read", "gamma.read", "shared.ping"}) {
		t.Fatalf("native profile page = %v", got)
	}
	q.Profile = "aip.unknown.v1"
	p, err = f.b.Catalog.QueryCapabilities(f.ctx, q, registry.InternalRead())
	f.must(err)
	if len(p.Capabilities) != 0 {
		t.Fatalf("unknown profile page = %v, want none", ids(p))
	}
}

// pagingWorld offers cap.00 .. cap.(n-1) to tenant-1 through one instance.
func pagingWorld(f *fx, n int) []string {
	ct := f.typ("page")
	names := make([]string, n)
	caps := make([]aip.Capability, n)
	for i := range n {
		names[i] = fmt.Sprintf("cap.%02d", i)
		desc := "plain"
		if i%3 == 0 {
			desc = "Contains the NEEDLE word"
		}
		caps[i] = Capability(names[i], desc)
	}
	v := Version("cver_page1", ct.ID, "1", ct.Owner, registry.VersionActive, Manifest("service:page", caps))
	f.must(f.b.Admin.AdmitVersion(f.ctx, v))
	inst := f.instance("p", v, "tenant-1")
	// Bind in reverse order: paging must still be ordered by ID.
	for i := n - 1; i >= 0; i-- {
		f.bind(inst, names[i], 0, "")
	}
	return names
}

func testPaging(t *testing.T, nb NewBackend) {
	f := newFxLimits(t, nb, registry.Limits{MaxPageSize: 5})
	names := pagingWorld(f, 7)
	rc := registry.ForTenant("tenant-1")

	got, total := f.readAll(registry.CatalogQuery{Limit: 3}, rc)
	if !slices.Equal(got, names) || total != 7 {
		t.Fatalf("paged read = %v total %d, want %v total 7", got, total, names)
	}
	p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 3}, rc)
	f.must(err)
	if !slices.Equal(ids(p), names[:3]) || p.NextCursor != registry.Cursor(p.CatalogRevision, "cap.02") {
		t.Fatalf("first page %v cursor %q", ids(p), p.NextCursor)
	}
	for _, c := range []struct {
		limit, want int
	}{{0, 1}, {-4, 1}, {1, 1}, {5, 5}, {500, 5}} {
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: c.limit}, rc)
		f.must(err)
		if len(p.Capabilities) != c.want || p.Total != 7 {
			t.Fatalf("limit %d: %d items total %d, want %d items total 7", c.limit, len(p.Capabilities), p.Total, c.want)
		}
	}
	// Text: case-insensitive over "id name description", evaluated before paging.
	got, total = f.readAll(registry.CatalogQuery{Text: "  needle ", Limit: 2}, rc)
	if want := []string{"cap.00", "cap.03", "cap.06"}; !slices.Equal(got, want) || total != 3 {
		t.Fatalf("text read = %v total %d, want %v total 3", got, total, want)
	}
	got, total = f.readAll(registry.CatalogQuery{Text: "CAP.0", Limit: 5}, rc)
	if !slices.Equal(got, names) || total != 7 {
		t.Fatalf("id text read = %v total %d", got, total)
	}
	got, total = f.readAll(registry.CatalogQuery{Text: "   ", Limit: 5}, rc)
	if len(got) != 7 || total != 7 {
		t.Fatalf("blank text read %d items total %d, want 7", len(got), total)
	}
	// Exact capability.
	got, total = f.readAll(registry.CatalogQuery{CapabilityID: "cap.04", Limit: 5}, rc)
	if !slices.Equal(got, []string{"cap.04"}) || total != 1 {
		t.Fatalf("exact read = %v total %d", got, total)
	}
	got, _ = f.readAll(registry.CatalogQuery{CapabilityID: "cap.99", Limit: 5}, rc)
	if len(got) != 0 {
		t.Fatalf("exact read of an unknown capability = %v", got)
	}
	got, _ = f.readAll(registry.CatalogQuery{CapabilityID: "cap.03", Text: "plain", Limit: 5}, rc)
	if len(got) != 0 {
		t.Fatalf("exact read with a non-matching text = %v", got)
	}
	// Malformed cursors.
	for _, c := range []string{"x", "12", "abc:cap.01", "7:", ":cap.01", "-1:cap.01"} {
		_, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Cursor: c, Limit: 2}, rc)
		f.wantErr(err, registry.ErrInvalid, "cursor "+c)
	}
	// Oversized filters.
	_, err = f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Text: strings.Repeat("x", registry.MaxSearchTextBytes+1)}, rc)
	f.wantErr(err, registry.ErrInvalid, "oversized text")
}

// testPagingBytewise pages over capability IDs whose byte order differs
// from a linguistic collation's (upper before lower case, digits before
// '_', '-' before digits): the order is the bytes', whatever the
// database's default collation.
func testPagingBytewise(t *testing.T, nb NewBackend) {
	f := newFxLimits(t, nb, registry.Limits{MaxPageSize: 5})
	names := []string{"cap.x_1", "cap.a", "cap.X", "cap.x1", "cap.B", "cap.x-1", "cap.x.1", "cap.A_b", "cap.Ab"}
	v := f.version(f.typ("order"), "order1", registry.VersionActive, names...)
	inst := f.instance("o", v, "tenant-1")
	for _, n := range names {
		f.bind(inst, n, 0, "")
	}
	want := slices.Clone(names)
	slices.Sort(want)
	rc := registry.ForTenant("tenant-1")
	for _, limit := range []int{2, 5} {
		got, total := f.readAll(registry.CatalogQuery{Limit: limit}, rc)
		if !slices.Equal(got, want) || total != len(names) {
			t.Fatalf("paged read (limit %d) = %v total %d, want byte order %v", limit, got, total, want)
		}
	}
	for _, n := range names {
		if _, err := f.b.Catalog.Capability(f.ctx, n, rc); err != nil {
			t.Fatalf("Capability(%s): %v", n, err)
		}
	}
}

func testPageBytes(t *testing.T, nb NewBackend) {
	// Measure the fixture's definitions to choose a byte budget of about
	// two and a half definitions.
	var sizes []int
	names := make([]string, 6)
	for i := range names {
		names[i] = fmt.Sprintf("cap.%02d", i)
		desc := "plain"
		if i%3 == 0 {
			desc = "Contains the NEEDLE word"
		}
		d, err := registry.NewCapabilityDefinition(Capability(names[i], desc))
		if err != nil {
			t.Fatal(err)
		}
		n, err := registry.DefinitionSize(&d)
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, n)
	}
	budget := sizes[0] + sizes[1] + sizes[2]/2
	f := newFxLimits(t, nb, registry.Limits{MaxCapabilityBytes: budget, MaxPageBytes: budget})
	pagingWorld(f, 6)
	rc := registry.ForTenant("tenant-1")
	var want [][]string
	var cur []string
	used := 0
	for i, n := range sizes {
		if used+n > budget {
			want = append(want, cur)
			cur, used = nil, 0
		}
		cur, used = append(cur, names[i]), used+n
	}
	want = append(want, cur)
	q := registry.CatalogQuery{Limit: 50}
	for n := 0; ; n++ {
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, q, rc)
		f.must(err)
		if n >= len(want) || !slices.Equal(ids(p), want[n]) {
			t.Fatalf("page %d = %v, want pages %v", n, ids(p), want)
		}
		bytes := 0
		for _, d := range p.Capabilities {
			s, err := registry.DefinitionSize(&d)
			f.must(err)
			bytes += s
		}
		if bytes > budget {
			t.Fatalf("page %d holds %d bytes, over the budget of %d", n, bytes, budget)
		}
		if p.NextCursor == "" {
			if n != len(want)-1 {
				t.Fatalf("paging stopped after %d pages, want %d", n+1, len(want))
			}
			break
		}
		q.Cursor = p.NextCursor
	}
}

func testStaleCursor(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pagingWorld(f, 5)
	rc := registry.ForTenant("tenant-1")
	p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 2}, rc)
	f.must(err)
	// Replica churn does not move the catalog: the cursor stays good.
	r := f.replica("p1", registry.ConnectorInstance{ID: "cinst_p", VersionID: "cver_page1"})
	f.update(r.ID, func(r *registry.ConnectorReplica) { r.LeaseExpiresAt = f.clock.Now().Add(time.Hour) })
	p2, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 2, Cursor: p.NextCursor}, rc)
	f.must(err)
	if !slices.Equal(ids(p2), []string{"cap.02", "cap.03"}) {
		t.Fatalf("second page %v", ids(p2))
	}
	// A catalog write makes the cursor stale.
	f.must(f.b.Admin.PutAdmissionPolicy(f.ctx, registry.FleetPolicy("quota:other")))
	_, err = f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Limit: 2, Cursor: p2.NextCursor}, rc)
	f.wantErr(err, registry.ErrStaleCursor, "cursor after a catalog write")
	// Restarting from the first page works.
	got, _ := f.readAll(registry.CatalogQuery{Limit: 2}, rc)
	if len(got) != 5 {
		t.Fatalf("restarted read returned %v", got)
	}
}

func testManifestLimits(t *testing.T, nb NewBackend) {
	f := newFxLimits(t, nb, registry.Limits{MaxCapabilitiesPerVersion: 3, MaxCapabilityBytes: 2048, MaxManifestBytes: 6000, MaxPageBytes: 8192})
	ct := f.typ("lim")
	mk := func(id string, caps ...aip.Capability) registry.ConnectorVersion {
		return Version(id, ct.ID, id, ct.Owner, registry.VersionActive, Manifest("service:lim", caps))
	}
	c := func(id string) aip.Capability { return Capability(id, "small") }
	f.must(f.b.Admin.AdmitVersion(f.ctx, mk("cver_ok", c("a"), c("b"), c("c"))))
	err := f.b.Admin.AdmitVersion(f.ctx, mk("cver_many", c("a"), c("b"), c("c"), c("d")))
	f.wantField(err, registry.ErrInvalid, "manifest.capabilities", "four capabilities over a limit of three")
	big := Capability("big", strings.Repeat("long text ", 250))
	err = f.b.Admin.AdmitVersion(f.ctx, mk("cver_big", big))
	f.wantField(err, registry.ErrInvalid, "manifest.capabilities[0]", "capability over MaxCapabilityBytes")
	mid := func(id string) aip.Capability { return Capability(id, strings.Repeat("words ", 240)) }
	err = f.b.Admin.AdmitVersion(f.ctx, mk("cver_fat", mid("m1"), mid("m2"), mid("m3")))
	f.wantField(err, registry.ErrInvalid, "manifest", "manifest over MaxManifestBytes")
	for _, id := range []string{"cver_many", "cver_big", "cver_fat"} {
		_, err := f.b.Admin.ConnectorVersion(f.ctx, id)
		f.wantErr(err, registry.ErrNotFound, "refused version "+id)
	}
}

func testContractConflict(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	ct := f.typ("one")
	f.version(ct, "one1", registry.VersionActive, "shared.op")
	rev := f.revision()
	ct2 := f.typ("two")
	changed := Capability("shared.op", "a different contract")
	v := Version("cver_two1", ct2.ID, "1", ct2.Owner, registry.VersionActive, Manifest("service:two", []aip.Capability{changed}))
	f.wantField(f.b.Admin.AdmitVersion(f.ctx, v), registry.ErrConflict, "manifest.capabilities[0]", "conflicting contract")
	if got := f.revision(); got != rev+1 {
		t.Fatalf("a refused version moved the revision to %d (want %d)", got, rev+1)
	}
	// The same contract is shared.
	f.version(ct2, "two2", registry.VersionActive, "shared.op")
	r, err := f.b.Catalog.Capability(f.ctx, "shared.op", registry.InternalRead())
	f.must(err)
	want, _ := registry.NewCapabilityDefinition(Capability("shared.op", "does shared.op"))
	if r.Definition.ContractDigest != want.ContractDigest || r.Definition.SchemaDigest != want.SchemaDigest {
		t.Fatalf("definition digests %s %s, want %s %s", r.Definition.ContractDigest, r.Definition.SchemaDigest, want.ContractDigest, want.SchemaDigest)
	}
}

// testHostileQueries sends the filters and read contexts an adversarial
// tenant can put in a URL: bytes no database text column holds (NUL,
// invalid UTF-8) are the caller's error (ErrInvalid, naming the field), in
// a filter or a cursor, never a storage failure the caller would retry; a
// Capability lookup of such an ID and a tenant no record can name find
// nothing. LIKE metacharacters are plain text.
func testHostileQueries(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	names := []string{"cap.100%", "cap.a_b", `cap.back\slash`, "cap.axb", "cap.plain"}
	v := f.version(f.typ("hostile"), "hostile1", registry.VersionActive, names...)
	inst := f.instance("h", v, "tenant-1")
	for _, n := range names {
		f.bind(inst, n, 0, "")
	}
	rc := registry.ForTenant("tenant-1")
	rev := f.revision()
	for _, c := range []struct {
		field string
		q     registry.CatalogQuery
	}{
		{"text", registry.CatalogQuery{Text: "cap\x00"}},
		{"text", registry.CatalogQuery{Text: "cap\xff"}},
		{"profile", registry.CatalogQuery{Profile: "aip.core\x00"}},
		{"profile", registry.CatalogQuery{Profile: "aip.core\xc3"}},
		{"capability_id", registry.CatalogQuery{CapabilityID: "cap.plain\x00"}},
		{"capability_id", registry.CatalogQuery{CapabilityID: "cap.\xff"}},
		{"cursor", registry.CatalogQuery{Cursor: registry.Cursor(rev, "cap.a\x00")}},
		{"cursor", registry.CatalogQuery{Cursor: registry.Cursor(rev, "cap.a\xff")}},
	} {
		for _, rc := range []registry.ReadContext{rc, registry.InternalRead(), {}} {
			_, err := f.b.Catalog.QueryCapabilities(f.ctx, c.q, rc)
			f.wantField(err, registry.ErrInvalid, c.field, fmt.Sprintf("query %#v as %+v", c.q, rc))
		}
	}
	for _, id := range []string{"cap.plain\x00", "cap.\xff", strings.Repeat("c", registry.MaxIdentifierBytes+1)} {
		for _, rc := range []registry.ReadContext{rc, registry.InternalRead()} {
			_, err := f.b.Catalog.Capability(f.ctx, id, rc)
			f.wantErr(err, registry.ErrNotFound, fmt.Sprintf("Capability(%+q) as %+v", id, rc))
		}
	}
	// A tenant no record can name sees nothing; its cursors are still
	// checked against the revision.
	for _, tenant := range []string{"tenant-1\x00", "tenant-\xff", strings.Repeat("t", registry.MaxIdentifierBytes+1)} {
		rc := registry.ForTenant(tenant)
		p, err := f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{}, rc)
		f.must(err)
		if len(p.Capabilities) != 0 || p.Total != 0 || p.CatalogRevision != rev {
			t.Fatalf("tenant %+q: page %v total %d at revision %d, want nothing at revision %d", tenant, ids(p), p.Total, p.CatalogRevision, rev)
		}
		_, err = f.b.Catalog.QueryCapabilities(f.ctx, registry.CatalogQuery{Cursor: registry.Cursor(rev+1, "cap.a")}, rc)
		f.wantErr(err, registry.ErrStaleCursor, fmt.Sprintf("tenant %+q with a cursor of another revision", tenant))
		_, err = f.b.Catalog.Capability(f.ctx, "cap.plain", rc)
		f.wantErr(err, registry.ErrNotFound, fmt.Sprintf("tenant %+q: Capability", tenant))
	}
	// LIKE metacharacters match themselves only.
	for _, c := range []struct {
		text string
		want []string
	}{
		{"%", []string{"cap.100%"}},
		{"_", []string{"cap.a_b"}},
		{`\`, []string{`cap.back\slash`}},
		{"a_b", []string{"cap.a_b"}},
		{"CAP.A", []string{"cap.a_b", "cap.axb"}},
	} {
		got, total := f.readAll(registry.CatalogQuery{Text: c.text, Limit: 1}, rc)
		if !slices.Equal(got, c.want) || total != len(c.want) {
			t.Fatalf("text %q: %v total %d, want %v", c.text, got, total, c.want)
		}
	}
}
