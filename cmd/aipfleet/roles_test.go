package main

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// applyRolesSQL runs deploy/postgres/roles.sql on the database at dbURL
// as its superuser. Roles are cluster-wide: another test run applying the
// script at the same time makes a catalog update fail "concurrently",
// which is retried.
func applyRolesSQL(t *testing.T, dbURL string) {
	t.Helper()
	roles, err := os.ReadFile(filepath.Join("..", "..", "deploy", "postgres", "roles.sql"))
	if err != nil {
		t.Fatal(err)
	}
	for attempt := 0; ; attempt++ {
		c, err := pgx.Connect(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Exec(t.Context(), string(roles))
		c.Close(t.Context())
		if err == nil {
			return
		}
		if attempt >= 5 || !strings.Contains(err.Error(), "concurrently") {
			t.Fatalf("roles.sql: %v", err)
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond)
	}
}

// roleURLFile writes dbURL with its user replaced by role (the test
// server trusts local connections) to a 0600 file and returns its path.
func roleURLFile(t *testing.T, dbURL, role string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	return writeSecret(t, t.TempDir(), role+".url", u.String()+"\n")
}

// startedWriter collects a server's log and closes started at its
// "starting" line.
type startedWriter struct {
	mu      sync.Mutex
	buf     strings.Builder
	started chan struct{}
	once    sync.Once
}

func (w *startedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), `"status":"starting"`) {
		w.once.Do(func() { close(w.started) })
	}
	return len(p), nil
}

func (w *startedWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runServer runs a server command until it logs its "starting" line,
// then stops it; it returns whether it started and the command's error.
func runServer(t *testing.T, args ...string) (started bool, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &startedWriter{started: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(string) string { return "" }, &strings.Builder{}, w) }()
	select {
	case err := <-done:
		return false, err
	case <-w.started:
		cancel()
	case <-time.After(30 * time.Second):
		cancel()
		t.Errorf("%s neither started nor failed in 30s; log:\n%s", args[0], w.String())
	}
	return true, <-done
}

// TestServersCheckTheirDatabaseRole: the control plane started with the
// dispatcher's database role, or the dispatcher with the control plane's,
// fails at start with an error naming the role, what it lacks and which
// URL to use; each started with its own role (deploy/postgres/roles.sql)
// starts. Both used to start and report ready, and failed only later,
// request by request or in the event retention's warnings.
func TestServersCheckTheirDatabaseRole(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	applyRolesSQL(t, dbURL)
	if _, _, err := runCLI(t, map[string]string{"AIP_REGISTRY_DATABASE_URL_FILE": roleURLFile(t, dbURL, "aip_registry_admin")}, "registry", "migrate"); err != nil {
		t.Fatal(err)
	}
	applyRolesSQL(t, dbURL)
	dataFile, lifecycleFile := roleURLFile(t, dbURL, "aip_registry_data"), roleURLFile(t, dbURL, "aip_registry_lifecycle")
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(t.TempDir(), "server.key")
	if err := aip.WriteSeedFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	controlPlane := func(dbFile string) []string {
		return []string{"control-plane", "--database-url-file", dbFile, "--signing-key-file", keyFile,
			"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http"}
	}
	dispatcher := func(dbFile string) []string {
		return []string{"dispatch", "--database-url-file", dbFile, "--signing-key-file", keyFile, "--issuer", "dev=" + key.DID(),
			"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http"}
	}

	for _, c := range []struct {
		args []string
		want []string
	}{
		{controlPlane(dataFile), []string{
			"open the registry (data pool) with the URL in --database-url-file " + dataFile + ": pgregistry: role aip_registry_data cannot serve the lifecycle service (control plane): it lacks SELECT, INSERT, UPDATE, DELETE on aip_registry.control_replay;",
			"aip_registry_data is another service's role: use the URL of role aip_registry_lifecycle (deploy/postgres/roles.sql)",
		}},
		{dispatcher(lifecycleFile), []string{
			"open the registry (data pool) with the URL in --database-url-file " + lifecycleFile + ": pgregistry: role aip_registry_lifecycle cannot serve the dispatcher: it lacks INSERT on aip_registry.route_assignments;",
			"aip_registry_lifecycle is another service's role: use the URL of role aip_registry_data (deploy/postgres/roles.sql)",
		}},
	} {
		started, err := runServer(t, c.args...)
		if started {
			t.Errorf("%s with %s started (then stopped: %v), want it to refuse the role", c.args[0], c.args[2], err)
			continue
		}
		for _, part := range c.want {
			if err == nil || !strings.Contains(err.Error(), part) {
				t.Errorf("%s with %s: %v\nwant it to contain %q", c.args[0], c.args[2], err, part)
			}
		}
	}

	for _, args := range [][]string{controlPlane(lifecycleFile), dispatcher(dataFile)} {
		if started, err := runServer(t, args...); !started || err != nil {
			t.Errorf("%s with %s: started %v, %v; want it to start and stop cleanly", args[0], args[2], started, err)
		}
	}
}

// TestTooManyConnectionsSaysSo: a registry command refused by PostgreSQL
// for want of connections (SQLSTATE 53300: the role's CONNECTION LIMIT,
// the database's, or the server's max_connections) said to check that
// PostgreSQL runs and that the URL's user, password and database are
// right, none of which was wrong. The operator guide suggests an admin
// role with CONNECTION LIMIT 1 for migrate; apply needs three.
func TestTooManyConnectionsSaysSo(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	c, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	// Roles are cluster-wide: name it after the test's own database.
	name := strings.TrimPrefix(u.Path, "/") + "_connlimit"
	role := pgx.Identifier{name}.Sanitize()
	if _, err := c.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN CONNECTION LIMIT 0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP ROLE IF EXISTS "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	file := roleURLFile(t, dbURL, name)
	for _, sub := range []string{"status", "migrate"} {
		_, _, err := runCLI(t, nil, "registry", sub, "--database-url-file", file)
		if err == nil {
			t.Fatalf("registry %s as a role with CONNECTION LIMIT 0: no error", sub)
		}
		msg := err.Error()
		for _, want := range []string{"too many connections", "allows no more connections", "registry apply holds 3", "CONNECTION LIMIT", file} {
			if !strings.Contains(msg, want) {
				t.Errorf("registry %s: err = %v\nwant it to say %q", sub, err, want)
			}
		}
		if strings.Contains(msg, "password") {
			t.Errorf("registry %s: err = %v\nblames the URL's password, which is right", sub, err)
		}
	}
}
