package hostrun_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func noEnv(string) string { return "" }

// tables counts the tables in the database at url outside PostgreSQL's own
// schemas: zero until something installed a schema there.
func tables(t *testing.T, url string) int {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_catalog.pg_tables
		WHERE schemaname NOT IN ('pg_catalog', 'information_schema')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRunChecksTheSettingsBeforeTheDatabase: with --database-url-file,
// Run opened the PostgreSQL journal (installing its schema, locking and
// initialising the replica's namespace) before hostsdk.New checked the
// settings and before bootstrap step 1 checked the files, so a bad value
// was refused only after the database had been written, and a missing
// --replica-id was reported as pgruntime's "Config.Namespace is required".
// The journal is now opened at step 2: a bad setting or file leaves the
// database untouched and is reported as the step 1 error naming the flag.
func TestRunChecksTheSettingsBeforeTheDatabase(t *testing.T) {
	url := pgtest.NewDatabase(t)
	dir := t.TempDir()
	urlFile := filepath.Join(dir, "journal-db.url")
	if err := os.WriteFile(urlFile, []byte(url+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	looseSeed := filepath.Join(dir, "loose.seed")
	key, _ := aip.GenerateSigningKey()
	if err := aip.WriteSeedFile(looseSeed, key); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(looseSeed, 0o644); err != nil {
		t.Fatal(err)
	}
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	config := func() hostsdk.Config {
		cfg := hostsdktest.HostConfig(t, cp, d, nil)
		cfg.StateDir, cfg.DatabaseURLFile = "", urlFile
		return cfg
	}

	for _, c := range []struct {
		name string
		edit func(*hostsdk.Config)
		want []string
	}{
		{"an endpoint with a query", func(c *hostsdk.Config) { c.PublicEndpoint += "?x=1" },
			[]string{"--public-endpoint", "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT", "query"}},
		{"no replica ID", func(c *hostsdk.Config) { c.ReplicaID = "" },
			[]string{"--replica-id", "AIP_CONNECTOR_HOST_REPLICA_ID", "is required"}},
		{"a signing key file readable by others", func(c *hostsdk.Config) { c.SigningKey, c.SigningSeedFile = nil, looseSeed },
			[]string{"--signing-seed-file", "chmod 600"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config()
			c.edit(&cfg)
			err := hostrun.Run(t.Context(), cfg, echoconnector.Connector{}, noEnv, "hostrun-test")
			var ve *hostsdk.ValidateError
			if !errors.As(err, &ve) || !errors.Is(err, hostsdk.ErrSetting) {
				t.Fatalf("Run: %v; want a *hostsdk.ValidateError matching hostsdk.ErrSetting (exit status 2: a setting or its file to fix)", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if n := tables(t, url); n != 0 {
				t.Errorf("the database holds %d tables after a refused configuration; want it untouched", n)
			}
		})
	}

	// A good configuration journals in PostgreSQL, and the host releases
	// the journal (its namespace lock) when it stops.
	cfg := config()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- hostrun.Run(ctx, cfg, echoconnector.Connector{}, noEnv, "hostrun-test") }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := cp.Await(wctx, func(o []hostsdktest.Operation) bool { return len(o) > 0 && o[0].Outcome == aip.OutcomeLease }); err != nil {
		t.Fatalf("no registration: %v", err)
	}
	if n := tables(t, url); n == 0 {
		t.Error("a running host with --database-url-file left the database empty")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	j, err := pgruntime.OpenURLFile(t.Context(), urlFile, pgruntime.Config{Namespace: cfg.ReplicaID})
	if err != nil {
		t.Fatalf("the stopped host's journal namespace: %v; want it released", err)
	}
	j.Close()
}

// TestJournalOpenerNamesTheFlagAndVariable: an unusable URL file is
// reported with --database-url-file and its variable, the one BindFlags
// reads for it.
func TestJournalOpenerNamesTheFlagAndVariable(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	hostsdk.BindFlags(fs)
	if u := fs.Lookup("database-url-file").Usage; !strings.Contains(u, "[$"+hostrun.DatabaseURLFileEnv+"]") {
		t.Fatalf("--database-url-file usage %q does not name %s", u, hostrun.DatabaseURLFileEnv)
	}
	if hostrun.JournalOpener(hostsdk.Config{}) != nil {
		t.Error("JournalOpener without --database-url-file is not nil; want nil (the host opens SQLite)")
	}
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte("postgres://u@127.0.0.1:1/db\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	_, err := hostrun.JournalOpener(hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})(t.Context())
	for _, w := range []string{"--database-url-file", hostrun.DatabaseURLFileEnv, "chmod 600"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("group-readable URL file: %v; want it to mention %q", err, w)
		}
	}
	// A file to fix is a setting to fix (exit status 2; it was 1, like an
	// unreachable database, which still is).
	if !errors.Is(err, hostsdk.ErrSetting) || hostrun.ExitCode(err) != 2 {
		t.Errorf("group-readable URL file: %v; want it to match hostsdk.ErrSetting", err)
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = hostrun.JournalOpener(hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})(t.Context())
	if err == nil || errors.Is(err, hostsdk.ErrSetting) || hostrun.ExitCode(err) != 1 {
		t.Errorf("URL file of a database nothing listens for: %v; want an error that does not match hostsdk.ErrSetting", err)
	}
}

// TestMalformedURLFileIsASetting: a readable URL file whose URL does not
// parse exited 1, as a database that cannot be reached, with "database
// URL file F: pgruntime: Config.DatabaseURL is not a valid PostgreSQL
// connection string", which did not say what was wrong. The file must be
// fixed, so it exits 2, and the error names the setting, its variable,
// the file and what is malformed, without the password.
func TestMalformedURLFileIsASetting(t *testing.T) {
	file := filepath.Join(t.TempDir(), "db-url")
	// A / in the password ends the user information: pgx reads "s3" as
	// the port.
	if err := os.WriteFile(file, []byte("postgres://u:s3/cret@127.0.0.1:5432/db\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := hostrun.JournalOpener(hostsdk.Config{DatabaseURLFile: file, ReplicaID: "crepl_x"})(t.Context())
	if !errors.Is(err, hostsdk.ErrSetting) || !errors.Is(err, pgruntime.ErrInvalidURL) || hostrun.ExitCode(err) != 2 {
		t.Errorf("malformed URL file: %v (exit status %d); want pgruntime.ErrInvalidURL matching hostsdk.ErrSetting, exit status 2", err, hostrun.ExitCode(err))
	}
	for _, w := range []string{"--database-url-file", hostrun.DatabaseURLFileEnv, file, "invalid port", "postgres://USER:PASSWORD@HOST:PORT/DATABASE", "%2F"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("malformed URL file: %v; want it to mention %q", err, w)
		}
	}
	if err != nil && strings.Contains(err.Error(), "cret") {
		t.Errorf("malformed URL file: %v; it shows the password", err)
	}
}
