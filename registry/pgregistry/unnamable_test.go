package pgregistry_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestMigrateNamesUnnamableRecords: instances and capability definitions
// a build before the formatting-character rule stored (written here in
// SQL) are kept, and MigrateSchema names them by kind, the first ten in ID
// order with the field and the character, counting all. Identifiers with
// other non-ASCII characters, between the formatting characters' code
// points, are not named.
func TestMigrateNamesUnnamableRecords(t *testing.T) {
	ctx := t.Context()
	r, dbURL, _ := openClock(t, pgregistry.Config{})
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	must(t, err)
	put := func(id, tenant string) {
		in := w.Instance
		in.ID, in.TenantID = id, tenant
		must(t, r.PutInstance(ctx, in))
	}
	// Printable non-ASCII tenants: é (U+00E9, between U+00AD and U+0600),
	// ‐ (U+2010, between U+200F and U+202A), ‿ (U+203F), ﻼ (U+FEFC).
	for i, tenant := range []string{"tenant-\u00e9", "tenant\u2010x", "tenant\u203fx", "tenant\ufefc"} {
		put(fmt.Sprintf("cinst_e%d", i), tenant)
	}
	for i := range 12 {
		put(fmt.Sprintf("cinst_z%02d", i), fmt.Sprintf("zw-%02d", i))
	}
	super := connect(t, dbURL)
	for _, sql := range []string{
		// As a build before the rule stored them: a zero-width space, a
		// soft hyphen and a tag character (beyond U+FFFF).
		`UPDATE aip_registry.connector_instances SET tenant_id = replace(tenant_id, 'zw-', 'zw' || (ARRAY[U&'\200B', U&'\00AD', U&'\+0E0041'])[1 + right(tenant_id, 2)::int % 3] || '-') WHERE tenant_id LIKE 'zw-%'`,
		`INSERT INTO aip_registry.capability_definitions (capability_id, contract_digest, schema_digest, capability, size_bytes, search_text)
		 VALUES ('alpha.bidi' || U&'\202E', 'sha256:c', 'sha256:s', '{}', 2, 'alpha.bidi')`,
	} {
		if _, err := super.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	res, err := pgregistry.MigrateSchema(ctx, dbURL)
	must(t, err)
	if len(res.Unnamable) != 2 {
		t.Fatalf("Unnamable = %+v, want definitions and instances", res.Unnamable)
	}
	defs, insts := res.Unnamable[0], res.Unnamable[1]
	if defs.Kind != "capability definitions" || defs.Count != 1 || len(defs.Records) != 1 ||
		defs.Records[0] != `capability "alpha.bidi\u202e" (capability.id U+202E)` || defs.Fix == "" {
		t.Errorf("definitions: %+v", defs)
	}
	if insts.Kind != "connector instances" || insts.Count != 12 || len(insts.Records) != pgregistry.MaxNamedRecords || insts.Fix == "" {
		t.Errorf("instances: %+v, want 12 counted, %d named", insts, pgregistry.MaxNamedRecords)
	}
	for i, want := range []string{
		`instance "cinst_z00" of tenant "zw\u200b-00" (tenant_id U+200B)`,
		`instance "cinst_z01" of tenant "zw\u00ad-01" (tenant_id U+00AD)`,
		`instance "cinst_z02" of tenant "zw\U000e0041-02" (tenant_id U+E0041)`,
	} {
		if i >= len(insts.Records) || insts.Records[i] != want {
			t.Errorf("instance %d named %q, want %q", i, insts.Records[min(i, len(insts.Records)-1)], want)
		}
	}
	if got := strings.Join(insts.Records, "\n"); strings.Contains(got, "cinst_e") || strings.Contains(got, "cinst_z10") {
		t.Errorf("instances named:\n%s\nwant cinst_z00 to cinst_z09 only", got)
	}

	// Kept as stored, and no route request names them.
	in, err := r.ConnectorInstance(ctx, "cinst_z00")
	if err != nil || in.TenantID != "zw\u200b-00" {
		t.Errorf("ConnectorInstance(cinst_z00) = %+v, %v", in, err)
	}
	q := registry.RouteRequest{ActionID: aip.NewActionID(), TenantID: in.TenantID, CapabilityID: "alpha.read"}
	if _, err := r.Resolve(ctx, q); !errors.Is(err, registry.ErrInvalid) || !strings.Contains(err.Error(), "tenant_id") {
		t.Errorf("Resolve for tenant %+q = %v, want ErrInvalid naming tenant_id", q.TenantID, err)
	}

	// A database without them answers none.
	clean, cleanURL, _ := openClock(t, pgregistry.Config{})
	_, err = registrytest.NewLifecycleWorld(ctx, clean)
	must(t, err)
	if res, err := pgregistry.MigrateSchema(ctx, cleanURL); err != nil || len(res.Unnamable) != 0 {
		t.Errorf("MigrateSchema of a database without them: %+v, %v", res, err)
	}
}
