package pgregistry_test

import (
	"errors"
	"fmt"
	"slices"
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

// TestMigrateNamesOtherIdentifiersWithFormatCharacters: records whose
// other identifiers a build before the formatting-character rule stored
// with such a character (written here in SQL) — an instance's secret
// provider reference, a binding's credential revision and quota policy
// references, a policy's reference, replicas' peer principal, trust domain
// and transport profile, a version's version string, manifest agent ID
// and profiles — are named by kind and field, each field's first ten in
// ID order whatever the other fields' rows, counting all, with what it
// does and what to do. Only tenant and capability IDs were looked at:
// these were not named (a version's agent ID, until it was held to a
// replica's peer_principal_id rule, was not looked at either).
func TestMigrateNamesOtherIdentifiersWithFormatCharacters(t *testing.T) {
	ctx := t.Context()
	r, dbURL, clock := openClock(t, pgregistry.Config{})
	w, err := registrytest.NewLifecycleWorld(ctx, r)
	must(t, err)
	pol := registry.ConservativePolicy("quota:t1")
	must(t, r.PutAdmissionPolicy(ctx, pol))
	b := w.Binding
	b.PolicyRevision, b.QuotaPolicyRef, b.CredentialRevisionRef = 2, pol.PolicyRef, "cred-v1"
	must(t, r.PutBinding(ctx, b))
	// crepl_p0 sorts before the twelve crepl_t.., crepl_x0 after them.
	for _, id := range []string{"crepl_p0", "crepl_x0", "crepl_ok"} {
		must(t, r.PutReplica(ctx, w.ProvisionedReplica(id, clock.Now())))
	}
	for i := range 12 {
		must(t, r.PutReplica(ctx, w.ProvisionedReplica(fmt.Sprintf("crepl_t%02d", i), clock.Now())))
	}
	super := connect(t, dbURL)
	for _, sql := range []string{
		`UPDATE aip_registry.connector_instances SET secret_provider_ref = secret_provider_ref || U&'\200B' WHERE instance_id = 'cinst_a'`,
		`INSERT INTO aip_registry.admission_policies SELECT 'quota:t1' || U&'\2060', revision, enabled, max_global_in_flight, max_tenant_in_flight,
		   max_connector_type_in_flight, max_instance_in_flight, max_binding_in_flight, max_tenant_retry_in_flight, circuit_failure_threshold,
		   circuit_open_ms, updated_at_ms FROM aip_registry.admission_policies WHERE policy_ref = 'quota:t1'`,
		`UPDATE aip_registry.capability_bindings SET quota_policy_ref = 'quota:t1' || U&'\2060', credential_revision_ref = 'cred' || U&'\00AD' || '-v1'
		 WHERE instance_id = 'cinst_a' AND capability_id = 'alpha.read'`,
		`UPDATE aip_registry.connector_replicas SET peer_principal_id = peer_principal_id || U&'\200D' WHERE replica_id = 'crepl_p0'`,
		`UPDATE aip_registry.connector_replicas SET trust_domain = 'fleet' || U&'\+0E0041' || '.test' WHERE replica_id LIKE 'crepl_t%'`,
		`UPDATE aip_registry.connector_replicas SET transport_profile = transport_profile || U&'\FEFF' WHERE replica_id = 'crepl_x0'`,
		`UPDATE aip_registry.connector_versions SET version = version || U&'\202E' WHERE version_id = 'cver_alpha1'`,
		`UPDATE aip_registry.connector_versions SET manifest = jsonb_set(manifest, '{agent,id}', to_jsonb((manifest->'agent'->>'id') || U&'\2063')) WHERE version_id = 'cver_alpha1'`,
		`UPDATE aip_registry.version_profiles SET profile = profile || U&'\FEFF' WHERE version_id = 'cver_alpha1'`,
		`INSERT INTO aip_registry.version_profiles (version_id, profile) VALUES ('cver_alpha1', 'a.profile' || U&'\200B')`,
	} {
		if _, err := super.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	res, err := pgregistry.MigrateSchema(ctx, dbURL)
	must(t, err)
	type want struct {
		kind, field string
		count       int
		records     []string
		fix         string
	}
	trust := make([]string, 10)
	for i := range trust {
		trust[i] = fmt.Sprintf(`replica "crepl_t%02d" with trust_domain "fleet\U000e0041.test" (trust_domain U+E0041)`, i)
	}
	wants := []want{
		{"connector instances", "secret_provider_ref", 1,
			[]string{`instance "cinst_a" with secret_provider_ref "secret://alpha/a\u200b" (secret_provider_ref U+200B)`}, "greater config_revision"},
		{"capability bindings", "credential_revision_ref", 1,
			[]string{`binding "tenant-1/alpha.read/cinst_a" with credential_revision_ref "cred\u00ad-v1" (credential_revision_ref U+00AD)`}, "greater policy_revision"},
		{"capability bindings", "quota_policy_ref", 1,
			[]string{`binding "tenant-1/alpha.read/cinst_a" with quota_policy_ref "quota:t1\u2060" (quota_policy_ref U+2060)`}, "admission policy under a reference"},
		{"admission policies", "policy_ref", 1, []string{`policy "quota:t1\u2060" with policy_ref "quota:t1\u2060" (policy_ref U+2060)`}, "move the bindings"},
		{"connector replicas", "peer_principal_id", 1,
			[]string{`replica "crepl_p0" with peer_principal_id "service:alpha\u200d" (peer_principal_id U+200D)`}, "new replica ID"},
		{"connector replicas", "trust_domain", 12, trust, "--trust-domain"},
		{"connector replicas", "transport_profile", 1,
			[]string{`replica "crepl_x0" with transport_profile "aip.native.http.v1\ufeff" (transport_profile U+FEFF)`}, "new replica ID"},
		{"connector versions", "version", 1, []string{`version "cver_alpha1" with version "1.0.0\u202e" (version U+202E)`}, "revoke this one"},
		{"connector versions", "manifest.agent.id", 1,
			[]string{`version "cver_alpha1" with manifest.agent.id "service:alpha\u2063" (manifest.agent.id U+2063)`}, "new version ID"},
		{"connector versions", "manifest.profiles", 1,
			[]string{`version "cver_alpha1" with manifest.profiles "a.profile\u200b" (manifest.profiles U+200B)`}, "revoke this one"},
	}
	if len(res.Unnamable) != len(wants) {
		t.Errorf("Unnamable has %d kinds and fields, want %d: %+v", len(res.Unnamable), len(wants), res.Unnamable)
	}
	for i, want := range wants {
		if i >= len(res.Unnamable) {
			break
		}
		u := res.Unnamable[i]
		if u.Kind != want.kind || u.Field != want.field || u.Count != want.count || !slices.Equal(u.Records, want.records) ||
			!strings.Contains(u.Fix, want.fix) || u.Effect == "" || strings.Contains(u.Effect, "route nothing") {
			t.Errorf("Unnamable[%d] = %+v\nwant %s' %s, %d: %q, a fix with %q and an effect", i, u, want.kind, want.field, want.count, want.records, want.fix)
		}
	}
}
