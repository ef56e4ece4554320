package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// fleetFileExample returns the complete example of docs/fleet-file.md.
func fleetFileExample(t *testing.T) []byte {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "fleet-file.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := bytes.Cut(doc, []byte("<!-- fleet-file-example"))
	if !ok {
		t.Fatal("docs/fleet-file.md has no fleet-file-example marker")
	}
	_, rest, _ = bytes.Cut(rest, []byte("```yaml\n"))
	block, _, ok := bytes.Cut(rest, []byte("```"))
	if !ok {
		t.Fatal("no closed yaml block after the fleet-file-example marker")
	}
	return block
}

// registryFixture makes a fresh database, its URL file and the example
// fleet file, and returns the registry commands' environment, the
// database's URL and the fleet file's path.
func registryFixture(t *testing.T) (env map[string]string, dbURL, fleet string) {
	t.Helper()
	dir := t.TempDir()
	dbURL = pgtest.NewDatabase(t)
	dbFile := writeSecret(t, dir, "admin.url", dbURL+"\n")
	fleet = filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleet, fleetFileExample(t), 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]string{"AIP_REGISTRY_DATABASE_URL_FILE": dbFile}, dbURL, fleet
}

func TestRegistryCommands(t *testing.T) {
	env, dbURL, fleet := registryFixture(t)
	dir := filepath.Dir(fleet)

	// Before the migration, status says what to run.
	_, _, err := runCLI(t, env, "registry", "status")
	if err == nil || !strings.Contains(err.Error(), "aipfleet registry migrate") {
		t.Fatalf("status before migrate: %v", err)
	}
	out, _, err := runCLI(t, env, "registry", "migrate")
	if err != nil || !strings.Contains(out, fmt.Sprintf("aip_registry is at version %d (catalog revision 0)", pgregistry.SchemaVersion)) ||
		!strings.Contains(out, "next: grant the restricted roles") {
		t.Fatalf("migrate: %v\n%s", err, out)
	}
	// Idempotent; nothing changed, so there is nothing new to grant.
	if out, _, err = runCLI(t, env, "registry", "migrate"); err != nil ||
		!strings.Contains(out, fmt.Sprintf("already at version %d (catalog revision 0); nothing changed", pgregistry.SchemaVersion)) || strings.Contains(out, "next:") {
		t.Fatalf("second migrate: %v\n%s", err, out)
	}

	out, _, err = runCLI(t, env, "registry", "apply", "-f", fleet)
	if err != nil {
		t.Fatal(err)
	}
	// An apply that changed the registry leaves its tables analyzed.
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var unanalyzed []string
	rows, err := conn.Query(t.Context(), `SELECT relname FROM pg_stat_user_tables
WHERE schemaname = 'aip_registry' AND relname <> 'schema_migrations' AND last_analyze IS NULL AND last_autoanalyze IS NULL ORDER BY relname`)
	if err == nil {
		unanalyzed, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil || len(unanalyzed) != 0 {
		t.Fatalf("tables without statistics after the apply: %v %v", unanalyzed, err)
	}
	for _, want := range []string{`created\s+policies\s+quota:acme\n`, `created\s+replicas\s+crepl_globex_echo_a\n`,
		`created\s+bindings\s+acme/echo.say/cinst_acme_echo\n`, `: 12 created, 0 updated, 0 unchanged; catalog revision 0 -> 9\n`} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("apply output does not match %s:\n%s", want, out)
		}
	}
	raw, _, err := runCLI(t, env, "registry", "apply", "--file", fleet, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Created, Unchanged int
		CatalogRevision    uint64 `json:"catalog_revision"`
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil || doc.Created != 0 || doc.Unchanged != 12 || doc.CatalogRevision != 9 {
		t.Fatalf("second apply: %+v %v\n%s", doc, err, raw)
	}

	out, _, err = runCLI(t, env, "registry", "status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{fmt.Sprintf("aip_registry version %[1]d (this build: %[1]d)", pgregistry.SchemaVersion), "revision 9: 1 connector type, 1 active version, 2 enabled instances",
		"replicas  0 live: 0 ready, 0 draining, 0 with an expired lease; 3 offline: 3 never registered, 0 offline within 24h, 0 retired", "check     schema ok"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}

	raw, _, err = runCLI(t, env, "registry", "status", "--json")
	var st registryStatusDoc
	if err != nil || json.Unmarshal([]byte(raw), &st) != nil || st.CatalogRevision != 9 || len(st.Checks) == 0 {
		t.Fatalf("status --json: %v\n%s", err, raw)
	}

	// A broken file is refused before anything is written, naming the line.
	bad := filepath.Join(dir, "bad.yaml")
	badRaw := bytes.Replace(fleetFileExample(t), []byte("capacity: 8"), []byte("capacty: 8"), 1)
	os.WriteFile(bad, badRaw, 0o644)
	_, _, err = runCLI(t, env, "registry", "apply", "-f", bad)
	// One sentence: the file, the entry, its line and the field, without
	// the sentinel's "registry: invalid: " (which the error still
	// matches).
	if err == nil || !errors.Is(err, registry.ErrInvalid) ||
		!strings.HasPrefix(err.Error(), "registry apply: fleet file "+bad+": replicas[2] crepl_globex_echo_a (line "+lineOf(t, badRaw, "    capacty: 8", 1)+"): capacty: unknown field; the fields here are") ||
		strings.Contains(err.Error(), "registry:") {
		t.Fatalf("bad file: %v", err)
	}
	// A change the registry refuses stops at that entry, named with its
	// line, after reporting what was applied before it.
	conflict := filepath.Join(dir, "conflict.yaml")
	conflicting := bytes.Replace(fleetFileExample(t), []byte("secret_provider_ref: vault://acme/echo"), []byte("secret_provider_ref: vault://acme/echo-2"), 1)
	os.WriteFile(conflict, conflicting, 0o644)
	out, _, err = runCLI(t, env, "registry", "apply", "-f", conflict)
	if err == nil || !errors.Is(err, registry.ErrConflict) ||
		err.Error() != "registry apply: fleet file "+conflict+": instances[0] cinst_acme_echo (line "+lineOf(t, conflicting, "  - id: cinst_", 1)+
			"): config_revision 1 is not newer than the stored revision 1; raise it with every change; the entries above were applied, fix the file and apply it again" ||
		!regexp.MustCompile(`unchanged\s+versions\s+cver_echo_1_0_0\n`).MatchString(out) {
		t.Fatalf("conflicting file: %v\n%s", err, out)
	}
	// When the first entry is refused, nothing was applied: the error
	// does not speak of entries above.
	first := filepath.Join(dir, "first.yaml")
	firstRaw := bytes.Replace(fleetFileExample(t), []byte("max_tenant_in_flight: 200"), []byte("max_tenant_in_flight: 201"), 1)
	os.WriteFile(first, firstRaw, 0o644)
	out, _, err = runCLI(t, env, "registry", "apply", "-f", first)
	if err == nil || !strings.HasSuffix(err.Error(), "; nothing was applied, fix the file and apply it again") ||
		!strings.Contains(err.Error(), "policies[0]") || !strings.Contains(out, "0 created, 0 updated, 0 unchanged") {
		t.Fatalf("file whose first entry is refused: %v\n%s", err, out)
	}
}

func TestRegistryFlagErrors(t *testing.T) {
	dbFile := writeSecret(t, t.TempDir(), "db.url", "postgres://127.0.0.1:1/none")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"registry"}, "name a subcommand: migrate, apply or status"},
		{[]string{"registry", "drop"}, `unknown subcommand "drop"`},
		{[]string{"registry", "drop", "--help"}, `unknown subcommand "drop"`},
		{[]string{"registry", "apply", "--database-url-file", dbFile}, "-f FILE is required"},
		{[]string{"registry", "status"}, "--database-url-file is required"},
		{[]string{"registry", "status", "-f", "x.yaml", "--database-url-file", dbFile}, "--file is for apply"},
		{[]string{"registry", "apply", "-f", "a.yaml", "b.yaml", "--database-url-file", dbFile}, "unexpected argument"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	// A database URL the driver cannot parse is reported without its
	// password, whatever its form.
	for _, bad := range []string{
		"postgres://u:SECRETPW@127.0.0.1:1/db?sslmode=bogus",
		"postgres://u@127.0.0.1:1/db?password=SECRETPW&sslmode=bogus",
		"host=127.0.0.1 password=SECRETPW sslmode=bogus",
		"host=127.0.0.1 password = SECRETPW sslmode=bogus",
		"host=127.0.0.1 password= SECRETPW sslmode=bogus",
		"u:SECRETPW@127.0.0.1:x",
	} {
		for _, sub := range []string{"status", "migrate"} {
			_, _, err := runCLI(t, nil, "registry", sub, "--database-url-file", writeSecret(t, t.TempDir(), "db.url", bad))
			if err == nil || strings.Contains(err.Error(), "SECRETPW") {
				t.Errorf("registry %s with database URL %q: err = %v, want an error without the password", sub, bad, err)
			}
		}
	}
	loose := filepath.Join(t.TempDir(), "loose.url")
	os.WriteFile(loose, []byte("postgres://x"), 0o644)
	if _, _, err := runCLI(t, nil, "registry", "migrate", "--database-url-file", loose); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: %v", err)
	}
}

// A failing readiness check makes registry status fail in both forms; the
// JSON form still prints the whole document first.
func TestRegistryStatusFailsOnAFailingCheck(t *testing.T) {
	doc := registryStatusDoc{SchemaVersion: pgregistry.SchemaVersion, BuildSchemaVersion: pgregistry.SchemaVersion, CatalogRevision: 3,
		Checks: []registry.ReadinessCheck{{Name: "schema", OK: true}, {Name: "catalog", Message: "the catalog revision row is missing"}, {Name: "pool", OK: true}}}
	for _, asJSON := range []bool{false, true} {
		var out bytes.Buffer
		err := reportRegistryStatus(&out, doc, asJSON)
		if err == nil || !strings.Contains(err.Error(), "registry check failing: catalog") {
			t.Errorf("json=%v: err = %v, want the failing check named", asJSON, err)
		}
		if !asJSON {
			if !strings.Contains(out.String(), "check     catalog FAILING: the catalog revision row is missing") {
				t.Errorf("text output lacks the failing check:\n%s", out.String())
			}
			continue
		}
		var got registryStatusDoc
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("json output: %v\n%s", err, out.String())
		}
		if diff := cmp.Diff(doc, got); diff != "" {
			t.Errorf("json document (-want +got):\n%s", diff)
		}
	}
	doc.Checks[1] = registry.ReadinessCheck{Name: "catalog", OK: true}
	for _, asJSON := range []bool{false, true} {
		if err := reportRegistryStatus(io.Discard, doc, asJSON); err != nil {
			t.Errorf("json=%v: all checks pass, err = %v", asJSON, err)
		}
	}
}

// TestRegistryApplyWaitsForAnotherApply: while another apply holds the
// registry's apply lock, registry apply says it waits and applies nothing
// until the lock is released.
func TestRegistryApplyWaitsForAnotherApply(t *testing.T) {
	env, dbURL, fleet := registryFixture(t)
	if _, _, err := runCLI(t, env, "registry", "migrate"); err != nil {
		t.Fatal(err)
	}
	unlock, err := pgregistry.LockApply(context.Background(), dbURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(context.Background(), []string{"registry", "apply", "-f", fleet}, func(k string) string { return env[k] }, io.Discard, &stderr)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(stderr.String(), "waiting for another registry apply to finish") {
		if time.Now().After(deadline) {
			t.Fatalf("registry apply did not say it waits: %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the command's output
	}
	reg, err := pgregistry.Open(context.Background(), pgregistry.Config{ControlURL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if rev, err := reg.CatalogRevision(context.Background()); err != nil || rev != 0 {
		t.Fatalf("while waiting, the catalog is at revision %d (%v), want 0: nothing applied", rev, err)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatalf("registry apply after the lock was released: %v", err)
	}
	if rev, err := reg.CatalogRevision(context.Background()); err != nil || rev == 0 {
		t.Fatalf("after the apply, catalog revision %d (%v)", rev, err)
	}
}

// A fleet file given as an argument instead of with -f is named in the
// command to type, not answered with "-f FILE is required".
func TestRegistryApplyFileAsArgumentShowsTheCommand(t *testing.T) {
	_, _, err := runCLI(t, nil, "registry", "apply", "fleet.yaml", "--database-url-file", "admin-db.url")
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "the fleet file goes in -f, before any other argument: aipfleet registry apply -f fleet.yaml") {
		t.Fatalf("err = %v", err)
	}
}

// countingProxy forwards TCP connections to target and counts them; while
// one is open it refuses another (closes it at once), as a server or a
// pooler that allows the role a single connection does.
type countingProxy struct {
	addr     string
	mu       sync.Mutex
	accepted int
	refused  int
	open     bool
}

func newCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			busy := p.open
			if busy {
				p.refused++
			} else {
				p.accepted++
				p.open = true
			}
			p.mu.Unlock()
			if busy {
				c.Close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { p.mu.Lock(); p.open = false; p.mu.Unlock() }()
				defer c.Close()
				s, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer s.Close()
				done := make(chan struct{}, 2)
				pipe := func(dst, src net.Conn) { io.Copy(dst, src); dst.Close(); src.Close(); done <- struct{}{} }
				go pipe(s, c)
				go pipe(c, s)
				<-done
				<-done
			}()
		}
	}()
	return p
}

func (p *countingProxy) counts() (accepted, refused int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, p.refused
}

// TestRegistryMigrateUsesOneConnection: registry migrate checks, migrates
// and verifies the schema on one connection, so a migrate against a role or
// a pooler that allows one connection works (it opened a pool for its
// pre-check and another to verify, three connections in all).
func TestRegistryMigrateUsesOneConnection(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"is at version", "already at version"} {
		p := newCountingProxy(t, u.Host)
		through := *u
		through.Host = p.addr
		env := map[string]string{"AIP_REGISTRY_DATABASE_URL_FILE": writeSecret(t, t.TempDir(), "admin.url", through.String()+"\n")}
		out, _, err := runCLI(t, env, "registry", "migrate")
		if err != nil || !strings.Contains(out, want) {
			t.Fatalf("migrate through a one-connection proxy: %v\n%s", err, out)
		}
		if accepted, refused := p.counts(); accepted != 1 || refused != 0 {
			t.Fatalf("migrate (%s) opened %d connections (and was refused %d), want 1", want, accepted, refused)
		}
	}
}

// registry migrate and apply run with a restricted role's URL (the
// dispatcher's, the control plane's: the three roles of
// deploy/postgres/roles.sql sit side by side) say that they need the admin
// role's, not only PostgreSQL's "permission denied".
func TestRegistryWritesWithARestrictedRoleNameTheAdminRole(t *testing.T) {
	env, dbURL, fleet := registryFixture(t)
	as := func(role string) map[string]string {
		return map[string]string{"AIP_REGISTRY_DATABASE_URL_FILE": roleURLFile(t, dbURL, role)}
	}
	applyRolesSQL(t, dbURL)
	if _, _, err := runCLI(t, as("aip_registry_admin"), "registry", "migrate"); err != nil {
		t.Fatal(err)
	}
	applyRolesSQL(t, dbURL)
	for _, role := range []string{"aip_registry_data", "aip_registry_lifecycle"} {
		for _, args := range [][]string{{"registry", "migrate"}, {"registry", "apply", "-f", fleet}} {
			_, _, err := runCLI(t, as(role), args...)
			if err == nil || !strings.Contains(err.Error(), "SQLSTATE 42501") ||
				!strings.Contains(err.Error(), "only the admin role aip_registry_admin of deploy/postgres/roles.sql may: point --database-url-file at that role's URL") {
				t.Errorf("%s as %s: %v", strings.Join(args, " "), role, err)
			}
		}
	}
	// The admin role's URL (the fixture's superuser works too) applies it.
	if _, _, err := runCLI(t, env, "registry", "apply", "-f", fleet); err != nil {
		t.Fatal(err)
	}
}

// TestRegistryApplyInterrupted: an apply interrupted midway (Ctrl-C, or its
// --timeout) reports the entries it applied and the catalog revision it
// left, not 0, and says it was interrupted rather than that the file is
// wrong; the type the file disables is disabled.
func TestRegistryApplyInterrupted(t *testing.T) {
	env, dbURL, fleet := registryFixture(t)
	withDisabled := bytes.Replace(fleetFileExample(t), []byte("    owner: team-echo\n\nversions:"), []byte("    owner: team-echo\n    enabled: false\n\nversions:"), 1)
	if err := os.WriteFile(fleet, withDisabled, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := runCLI(t, env, "registry", "migrate"); err != nil {
		t.Fatal(err)
	}
	// Hold the bindings table, so the apply stops at its first binding
	// with everything before it applied.
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `LOCK TABLE aip_registry.capability_bindings IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	ctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	var stdout, stderr lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"registry", "apply", "-f", fleet}, func(k string) string { return env[k] }, &stdout, &stderr)
	}()
	watch, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	deadline := time.Now().Add(30 * time.Second)
	for {
		var waiting bool
		if err := watch.QueryRow(t.Context(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%capability_bindings%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry apply did not reach the bindings; output:\n%s%s", stdout.String(), stderr.String())
		}
		time.Sleep(10 * time.Millisecond) // polling the database
	}
	interrupt()
	err = <-done
	tx.Rollback(context.Background())
	var rev uint64
	if err := watch.QueryRow(t.Context(), `SELECT revision FROM aip_registry.catalog_revision`).Scan(&rev); err != nil {
		t.Fatal(err)
	}
	out := stdout.String()
	if err == nil || !strings.Contains(err.Error(), "interrupted") || strings.Contains(err.Error(), "fix the file") {
		t.Errorf("interrupted apply: %v, want it to say it was interrupted", err)
	}
	if want := fmt.Sprintf("catalog revision 0 -> %d\n", rev); rev == 0 || !strings.Contains(out, want) {
		t.Errorf("interrupted apply output lacks %q:\n%s", want, out)
	}
	if !regexp.MustCompile(`created\s+replicas\s+crepl_globex_echo_a\n`).MatchString(out) {
		t.Errorf("interrupted apply output does not list what it applied:\n%s", out)
	}
	var enabled bool
	if err := watch.QueryRow(t.Context(), `SELECT enabled FROM aip_registry.connector_types WHERE type_id = 'ctype_echo'`).Scan(&enabled); err != nil || enabled {
		t.Errorf("after the interrupted apply the type the file disables is enabled=%t (%v)", enabled, err)
	}
}

// TestRegistryMigrateWarnsOfUnnamableRecords: registry migrate warns of
// the instances a build before the formatting-character rule stored with
// such a tenant ID (written here in SQL), naming them and what to do,
// and lists them in --json; without them it warns of nothing.
func TestRegistryMigrateWarnsOfUnnamableRecords(t *testing.T) {
	env, dbURL, fleet := registryFixture(t)
	if _, _, err := runCLI(t, env, "registry", "apply", "-f", fleet); err != nil {
		t.Fatal(err)
	}
	if _, errOut, err := runCLI(t, env, "registry", "migrate"); err != nil || strings.Contains(errOut, "warning") {
		t.Fatalf("migrate without them: %v\n%s", err, errOut)
	}
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var id, tenant string
	if err := conn.QueryRow(t.Context(), `UPDATE aip_registry.connector_instances SET tenant_id = tenant_id || U&'\200B'
		WHERE instance_id = (SELECT min(instance_id) FROM aip_registry.connector_instances) RETURNING instance_id, tenant_id`).Scan(&id, &tenant); err != nil {
		t.Fatal(err)
	}
	_, errOut, err := runCLI(t, env, "registry", "migrate")
	want := fmt.Sprintf(`warning: connector instances whose tenant_id holds an invisible formatting character (1, stored by a build before the rule) are kept as stored, but no route request can name them, so they route nothing: instance %q of tenant %q (tenant_id U+200B)`, id, tenant)
	if err != nil || !strings.Contains(errOut, want) || !strings.Contains(errOut, "\n  fix: create an instance for the tenant ID without the character") {
		t.Fatalf("migrate: %v\n%s\nwant:\n%s", err, errOut, want)
	}
	out, _, err := runCLI(t, env, "registry", "migrate", "--json")
	var doc struct{ Unnamable []pgregistry.UnnamableRecords }
	if err != nil || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Unnamable) != 1 || doc.Unnamable[0].Count != 1 || doc.Unnamable[0].Field != "tenant_id" {
		t.Fatalf("migrate --json: %v\n%s", err, out)
	}

	// An instance whose secret provider reference holds one still routes:
	// the warning says what the character does instead (it said that no
	// route request can name it).
	var ref string
	if err := conn.QueryRow(t.Context(), `UPDATE aip_registry.connector_instances SET secret_provider_ref = secret_provider_ref || U&'\00AD'
		WHERE instance_id = $1 RETURNING secret_provider_ref`, id).Scan(&ref); err != nil {
		t.Fatal(err)
	}
	_, errOut, err = runCLI(t, env, "registry", "migrate")
	want = fmt.Sprintf(`warning: connector instances whose secret_provider_ref holds an invisible formatting character (1, stored by a build before the rule) are kept as stored, but the reference prints like one it is not, and a write of the instance as stored is refused: instance %q with secret_provider_ref %q (secret_provider_ref U+00AD)`, id, ref)
	if err != nil || !strings.Contains(errOut, want) || !strings.Contains(errOut, "\n  fix: apply the instance with secret_provider_ref without the character") {
		t.Fatalf("migrate: %v\n%s\nwant:\n%s", err, errOut, want)
	}
}
