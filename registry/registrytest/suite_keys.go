package registrytest

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/registry"
)

// unstorableKeys are keys no record can have: a NUL character, bytes that
// are not UTF-8, both inside an otherwise well-formed action ID, and a
// megabyte. A database cannot even hold the first two in a text column.
var unstorableKeys = []struct{ name, key string }{
	{"NUL", "act_0190f2a0b1c27d3e8f9a0b1c2d3e4f5\x00"},
	{"NotUTF8", "act_0190f2a0b1c27d3e8f9a0b1c2d3e4f5\xff"},
	{"OnlyNUL", "\x00"},
	{"Huge", "act_" + strings.Repeat("a", 1<<20)},
}

// testUnstorableKeys: a lookup, settlement or reroute that names a key no
// record can have is answered as for any other key that names nothing —
// ErrNotFound, or ErrFenceLost for an assignment that is not the stored
// one — on every backend, never a storage failure a caller would retry.
func testUnstorableKeys(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	pol := registry.ConservativePolicy("quota:c")
	w, r1, _ := twoReplicas(f, &pol)
	_ = w
	a := f.resolve(request("tenant-1", "alpha.read"))
	for _, k := range unstorableKeys {
		what := func(op string) string { return op + " with a " + k.name + " key" }
		f.wantErr(errOf2(f.b.Resolver.Assignment(f.ctx, k.key)), registry.ErrNotFound, what("Assignment"))
		f.wantErr(errOf2(f.b.Resolver.Reservation(f.ctx, k.key)), registry.ErrNotFound, what("Reservation"))
		f.wantErr(errOf2(f.b.Rerouter.RouteHistory(f.ctx, k.key)), registry.ErrNotFound, what("RouteHistory"))
		f.wantErr(errOf2(f.b.Admin.ConnectorReplica(f.ctx, k.key)), registry.ErrNotFound, what("ConnectorReplica"))
		f.wantErr(errOf2(f.b.Admin.ConnectorType(f.ctx, k.key)), registry.ErrNotFound, what("ConnectorType"))
		f.wantErr(errOf2(f.b.Admin.ConnectorVersion(f.ctx, k.key)), registry.ErrNotFound, what("ConnectorVersion"))
		f.wantErr(errOf2(f.b.Admin.ConnectorInstance(f.ctx, k.key)), registry.ErrNotFound, what("ConnectorInstance"))
		f.wantErr(errOf2(f.b.Admin.AdmissionPolicy(f.ctx, k.key)), registry.ErrNotFound, what("AdmissionPolicy"))
		f.wantErr(f.b.Admin.SetConnectorTypeEnabled(f.ctx, k.key, false), registry.ErrNotFound, what("SetConnectorTypeEnabled"))
		f.wantErr(f.b.Admin.SetVersionStatus(f.ctx, k.key, registry.VersionRevoked), registry.ErrNotFound, what("SetVersionStatus"))
		f.wantErr(errOf2(f.b.Admin.CapabilityBinding(f.ctx, registry.BindingKey{TenantID: "tenant-1", CapabilityID: "alpha.read", InstanceID: k.key})),
			registry.ErrNotFound, what("CapabilityBinding"))

		other := a
		other.ActionID = k.key
		f.wantErr(f.b.Resolver.Settle(f.ctx, other, registry.SettlementCompleted), registry.ErrNotFound, what("Settle of an action"))
		f.wantErr(f.b.Orphans.SettleOrphan(f.ctx, other, registry.SettlementCompleted, 1), registry.ErrNotFound, what("SettleOrphan of an action"))
		for _, field := range []struct {
			name string
			set  func(*registry.RouteAssignment)
		}{
			{"fence_token", func(x *registry.RouteAssignment) { x.FenceToken = k.key }},
			{"endpoint", func(x *registry.RouteAssignment) { x.Endpoint = k.key }},
			{"tenant_id", func(x *registry.RouteAssignment) { x.TenantID = k.key }},
			{"admission.policy_ref", func(x *registry.RouteAssignment) { x.Admission.PolicyRef = k.key }},
			{"admission scope key", func(x *registry.RouteAssignment) {
				x.Admission.BaseScopes = append([]registry.AdmissionScope(nil), x.Admission.BaseScopes...)
				x.Admission.BaseScopes[0].Key = k.key
			}},
		} {
			x := a.Clone()
			field.set(&x)
			f.wantErr(f.b.Resolver.Settle(f.ctx, x, registry.SettlementCompleted), registry.ErrFenceLost, what("Settle with "+field.name))
			f.wantErr(f.b.Orphans.SettleOrphan(f.ctx, x, registry.SettlementCompleted, 1), registry.ErrFenceLost, what("SettleOrphan with "+field.name))
		}
		// Evidence that names the same fence token with a NUL (JSON carries
		// it; not bytes that are not UTF-8, nor a megabyte) passes the
		// evidence check; the assignment is still not the stored one.
		if utf8.ValidString(k.key) && len(k.key) < 1024 {
			x := a.Clone()
			x.FenceToken = k.key
			_, err := f.b.Rerouter.Reroute(f.ctx, registry.RerouteRequest{Current: x, Evidence: RefusalEvidence(x, registry.RefusalNotReady)})
			f.wantErr(err, registry.ErrFenceLost, what("Reroute with fence_token"))
		}
	}
	if res := f.reservation(a.ActionID); !res.Reserved {
		t.Fatalf("a settlement naming an unstorable key released the route: %+v", res)
	}
	f.checkLedger(r1.ID)
}

func errOf2[T any](_ T, err error) error { return err }
