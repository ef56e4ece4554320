package pgregistry_test

import (
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// executeGrant matches roles.sql's grant of a function.
var executeGrant = regexp.MustCompile(`GRANT EXECUTE ON FUNCTION aip_registry\.(\w+\([^)]*\)) TO (\w+);`)

// TestServiceNeedsAreRolesSQLGrants: what the start-up check requires of
// each service's role is exactly what roles.sql grants that role, so a
// role set up by roles.sql passes and a grant added to one is checked.
func TestServiceNeedsAreRolesSQLGrants(t *testing.T) {
	sql := rolesSQL(t)
	for i, s := range []pgregistry.Service{pgregistry.Dispatcher, pgregistry.LifecycleService} {
		role := []string{"aip_registry_data", "aip_registry_lifecycle"}[i]
		wantTables := map[string]string{}
		for _, m := range rolesTable.FindAllStringSubmatch(sql, -1) {
			if privs := m[2+i]; privs != "" {
				wantTables[m[1]] = privs
			}
		}
		var wantFuncs []string
		for _, m := range executeGrant.FindAllStringSubmatch(sql, -1) {
			if m[2] == role {
				wantFuncs = append(wantFuncs, strings.ReplaceAll(m[1], " ", ""))
			}
		}
		if len(wantTables) < 5 {
			t.Fatalf("found only %d table grants of %s in roles.sql: %v", len(wantTables), role, wantTables)
		}
		tables, funcs := pgregistry.ServiceNeeds(s)
		if diff := cmp.Diff(wantTables, tables); diff != "" {
			t.Errorf("%s: table privileges checked differ from roles.sql's grants to %s (-roles.sql +checked):\n%s", s, role, diff)
		}
		slices.Sort(wantFuncs)
		funcs = slices.Sorted(slices.Values(funcs))
		if diff := cmp.Diff(wantFuncs, funcs, cmpEmpty); diff != "" {
			t.Errorf("%s: functions checked differ from roles.sql's grants to %s (-roles.sql +checked):\n%s", s, role, diff)
		}
	}
}

// cmpEmpty treats a nil and an empty slice alike.
var cmpEmpty = cmp.Comparer(func(a, b []string) bool { return slices.Equal(a, b) })

// TestOpenChecksTheRolesPrivileges: a data pool opened for a service
// with another service's role (the dispatcher's URL given to the control
// plane, or the other way round), or with its own role before roles.sql
// ran again after a migration, fails at start with an error naming the
// role, what it lacks and the fix; the roles roles.sql sets up, the
// schema's owner and a superuser pass.
func TestOpenChecksTheRolesPrivileges(t *testing.T) {
	ctx := t.Context()
	superURL := pgtest.NewDatabase(t)
	sql := rolesSQL(t)
	applyRoles(t, superURL, sql)
	adminURL := asRole(t, superURL, "aip_registry_admin")
	must(t, pgregistry.Migrate(ctx, adminURL))
	applyRoles(t, superURL, sql)
	dataURL := asRole(t, superURL, "aip_registry_data")
	lifecycleURL := asRole(t, superURL, "aip_registry_lifecycle")

	open := func(s pgregistry.Service, dbURL string) error {
		t.Helper()
		r, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{DataURL: dbURL, DataMaxConns: 1, Service: s})
		if err == nil {
			r.Close()
		}
		return err
	}
	for _, tc := range []struct {
		s     pgregistry.Service
		dbURL string
	}{
		{pgregistry.Dispatcher, dataURL},
		{pgregistry.LifecycleService, lifecycleURL},
		{pgregistry.Dispatcher, adminURL},
		{pgregistry.LifecycleService, adminURL},
		{pgregistry.Dispatcher, superURL},
		{pgregistry.LifecycleService, superURL},
		{pgregistry.AnyService, lifecycleURL},
	} {
		if err := open(tc.s, tc.dbURL); err != nil {
			t.Errorf("%s with %s: %v, want it to open", tc.s, tc.dbURL, err)
		}
	}
	// Open checks the data pool as OpenDataPlane does.
	full, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: adminURL, DataURL: dataURL, Service: pgregistry.Dispatcher})
	must(t, err)
	full.Close()
	if full, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: adminURL, DataURL: dataURL, Service: pgregistry.LifecycleService}); err == nil {
		full.Close()
		t.Error("Open for the lifecycle service with the data role's URL opened")
	}

	// The dispatcher's role given to the control plane.
	err = open(pgregistry.LifecycleService, dataURL)
	want := "pgregistry: role aip_registry_data cannot serve the lifecycle service (control plane): it lacks " +
		"SELECT, INSERT, UPDATE, DELETE on aip_registry.control_replay; DELETE on aip_registry.events; DELETE on aip_registry.pruned_events. " +
		"aip_registry_data is another service's role: use the URL of role aip_registry_lifecycle (deploy/postgres/roles.sql)"
	var re *pgregistry.RoleError
	if !errors.As(err, &re) || err.Error() != want {
		t.Errorf("lifecycle service with the data role:\n got %v\nwant %s", err, want)
	}

	// The control plane's role given to the dispatcher: the first few
	// named, the rest counted.
	err = open(pgregistry.Dispatcher, lifecycleURL)
	for _, part := range []string{
		"pgregistry: role aip_registry_lifecycle cannot serve the dispatcher: it lacks INSERT on aip_registry.route_assignments; SELECT, INSERT on aip_registry.route_history; INSERT on aip_registry.admission_counters; ",
		" more). aip_registry_lifecycle is another service's role: use the URL of role aip_registry_data (deploy/postgres/roles.sql)",
	} {
		if err == nil || !strings.Contains(err.Error(), part) {
			t.Errorf("dispatcher with the lifecycle role: %v, want it to contain %q", err, part)
		}
	}
	if !errors.As(err, &re) || !slices.Contains(re.Missing, "EXECUTE on aip_registry.scope_full(integer)") {
		t.Errorf("dispatcher with the lifecycle role: %#v, want scope_full among the missing", re)
	}

	// The right role before roles.sql ran again: a grant a migration
	// needs is missing.
	su := connect(t, superURL)
	_, err = su.Exec(ctx, `REVOKE DELETE ON aip_registry.events FROM aip_registry_lifecycle; REVOKE SELECT ON aip_registry.events FROM aip_registry_lifecycle`)
	must(t, err)
	err = open(pgregistry.LifecycleService, lifecycleURL)
	want = "pgregistry: role aip_registry_lifecycle cannot serve the lifecycle service (control plane): it lacks " +
		"SELECT (tenant_id, sequence, received_at_ms), DELETE on aip_registry.events. " +
		"Run deploy/postgres/roles.sql again as a superuser: it grants aip_registry_lifecycle these (run it after every registry migrate)"
	if err == nil || err.Error() != want {
		t.Errorf("lifecycle role without its event grants:\n got %v\nwant %s", err, want)
	}
	applyRoles(t, superURL, sql)
	if err := open(pgregistry.LifecycleService, lifecycleURL); err != nil {
		t.Errorf("lifecycle role after roles.sql ran again: %v", err)
	}

	// A role of the operator's own, with too little.
	_, err = su.Exec(ctx, `DO $$ BEGIN
		IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'aip_test_reader') THEN CREATE ROLE aip_test_reader LOGIN; END IF;
	EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; END $$;
	GRANT USAGE ON SCHEMA aip_registry TO aip_test_reader; GRANT SELECT ON ALL TABLES IN SCHEMA aip_registry TO aip_test_reader`)
	must(t, err)
	err = open(pgregistry.LifecycleService, asRole(t, superURL, "aip_test_reader"))
	if err == nil || !strings.HasSuffix(err.Error(), "Use the URL of role aip_registry_lifecycle of deploy/postgres/roles.sql, or grant aip_test_reader what roles.sql grants aip_registry_lifecycle") {
		t.Errorf("lifecycle service with a reader role: %v", err)
	}
}
