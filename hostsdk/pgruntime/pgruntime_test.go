package pgruntime_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func TestMain(m *testing.M) {
	if u := os.Getenv(childURLEnv); u != "" {
		os.Exit(crashWriter(u, os.Getenv(childNSEnv)))
	}
	goleak.VerifyTestMain(m)
}

func open(t testing.TB, cfg pgruntime.Config) *pgruntime.Journal {
	t.Helper()
	j, err := pgruntime.Open(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Open(namespace %s): %v", cfg.Namespace, err)
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// TestConformance runs the suite on one database; every journal the suite
// opens gets a namespace of its own, which is also what keeps them apart.
func TestConformance(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	journaltest.Run(t, journaltest.Factory{
		Open: func(t *testing.T) journal.Journal {
			return open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: aip.NewID(aip.PrefixReplica), MaxConns: 20})
		},
		Reopen: func(t *testing.T, closed journal.Journal) journal.Journal {
			return open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: closed.(*pgruntime.Journal).Namespace(), MaxConns: 20})
		},
	})
}

// TestNamespacesAreIsolated: two journals in one database with different
// namespaces share no record, even under the same IDs.
func TestNamespacesAreIsolated(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	a := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_a"})
	b := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_b"})
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	act := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", ReceivedAt: t0}
	for name, j := range map[string]*pgruntime.Journal{"a": a, "b": b} {
		if _, created, err := j.BeginAction(ctx, act); err != nil || !created {
			t.Fatalf("%s: BeginAction of an ID known only to the other namespace: created %v, err %v", name, created, err)
		}
	}
	if _, err := a.FinishAction(ctx, act.ActionID, aip.StateCompleted, json.RawMessage(`{"in":"a"}`), "", t0.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got, err := b.Action(ctx, act.ActionID); err != nil || got.Status != aip.StateReceived {
		t.Fatalf("b sees its own action as %q (err %v), want received: a's finish leaked", got.Status, err)
	}
	if rs, err := b.Receipts(ctx, 0, 10); err != nil || len(rs) != 0 {
		t.Fatalf("b has %d receipts (err %v), want 0", len(rs), err)
	}
	r, err := b.FinishAction(ctx, act.ActionID, aip.StateFailed, nil, "", t0.Add(time.Second))
	if err != nil || r.Seq != 1 || r.PrevHash != "" {
		t.Fatalf("b's first receipt = %+v (err %v), want seq 1 starting its own chain", r, err)
	}
	if got, err := a.ActionsByStatus(ctx, 10, aip.StateFailed); err != nil || len(got) != 0 {
		t.Fatalf("a lists %d failed actions (err %v), want 0", len(got), err)
	}

	msg := aip.NewMessageID()
	for name, j := range map[string]*pgruntime.Journal{"a": a, "b": b} {
		if ok, err := j.ClaimMessage(ctx, msg, t0.Add(time.Minute), t0); err != nil || !ok {
			t.Fatalf("%s: ClaimMessage of an ID claimed only in the other namespace = %v, %v", name, ok, err)
		}
	}
	if n, err := b.PruneMessages(ctx, t0.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("b pruned %d (err %v), want only its own 1", n, err)
	}
	if ok, err := a.ClaimMessage(ctx, msg, t0.Add(time.Minute), t0.Add(time.Second)); err != nil || ok {
		t.Fatalf("b's prune removed a's message claim (claim = %v, %v)", ok, err)
	}

	if err := a.EnqueueEvents(ctx, journal.OutboxEntry{ID: "batch-1", ChannelID: "c", Events: json.RawMessage(`[{"kind":"k"}]`), CreatedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if n, err := b.PendingEvents(ctx); err != nil || n != 0 {
		t.Fatalf("b has %d pending batches (err %v), want 0", n, err)
	}
	if got, err := b.ClaimEvents(ctx, t0.Add(time.Hour), time.Minute, 10); err != nil || len(got) != 0 {
		t.Fatalf("b claimed %d of a's batches (err %v)", len(got), err)
	}
	if err := b.AckEvents(ctx, "batch-1"); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("b acked a's batch: %v", err)
	}

	if _, err := a.PutState(ctx, "ledger", "k", json.RawMessage(`"a"`), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b.State(ctx, "ledger", "k"); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("b reads a's state: %v", err)
	}
	if rev, err := b.PutState(ctx, "ledger", "k", json.RawMessage(`"b"`), 0); err != nil || rev != 1 {
		t.Fatalf("b's first write of a key a also has = %d, %v", rev, err)
	}
}

// TestConcurrentOpenMigratesOnce: replicas starting together on an empty
// database all start, and the schema is recorded once.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	const replicas = 4
	var wg sync.WaitGroup
	errs := make([]error, replicas)
	for i := range replicas {
		wg.Go(func() {
			j, err := pgruntime.Open(context.Background(), pgruntime.Config{DatabaseURL: dbURL, Namespace: aip.NewID(aip.PrefixReplica), MaxConns: 2})
			if err != nil {
				errs[i] = err
				return
			}
			errs[i] = j.Probe(context.Background())
			j.Close()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	conn := connect(t, dbURL)
	var n, version int
	if err := conn.QueryRow(context.Background(), `SELECT count(*), max(version) FROM aip_runtime_schema_migrations`).Scan(&n, &version); err != nil {
		t.Fatal(err)
	}
	if n != pgruntime.SchemaVersion() || version != pgruntime.SchemaVersion() {
		t.Fatalf("%d migrations recorded up to version %d, want each of 1..%d once", n, version, pgruntime.SchemaVersion())
	}
}

func connect(t *testing.T, dbURL string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestChangedMigrationStopsStartup: an applied migration whose recorded
// checksum no longer matches the embedded file stops Open with an error
// naming the file.
func TestChangedMigrationStopsStartup(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_x"})
	j.Close()

	conn := connect(t, dbURL)
	if _, err := conn.Exec(ctx, `UPDATE aip_runtime_schema_migrations SET checksum = 'sha256:0000' WHERE version = 1`); err != nil {
		t.Fatal(err)
	}
	_, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_x"})
	if !errors.Is(err, pgruntime.ErrMigrationChanged) {
		t.Fatalf("Open after a migration changed = %v, want ErrMigrationChanged", err)
	}
	if !strings.Contains(err.Error(), "0001_runtime.sql") {
		t.Fatalf("error %q does not name the migration file", err)
	}
}

// TestNewerSchemaStopsStartup: a database migrated by a newer build is
// refused.
func TestNewerSchemaStopsStartup(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_x"})
	j.Close()

	conn := connect(t, dbURL)
	if _, err := conn.Exec(ctx, `INSERT INTO aip_runtime_schema_migrations (version, file, checksum) VALUES (999, '0999_future.sql', 'sha256:00')`); err != nil {
		t.Fatal(err)
	}
	_, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_x"})
	if !errors.Is(err, pgruntime.ErrSchemaTooNew) || !strings.Contains(err.Error(), "0999_future.sql") {
		t.Fatalf("Open on a newer schema = %v, want ErrSchemaTooNew naming 0999_future.sql", err)
	}
}

func TestOpenConfigErrors(t *testing.T) {
	ctx := context.Background()
	for name, cfg := range map[string]pgruntime.Config{
		"no URL":         {Namespace: "n"},
		"no namespace":   {DatabaseURL: "postgres://localhost/x"},
		"long namespace": {DatabaseURL: "postgres://localhost/x", Namespace: strings.Repeat("n", pgruntime.MaxNamespace+1)},
		"negative conns": {DatabaseURL: "postgres://localhost/x", Namespace: "n", MaxConns: -1},
		"malformed URL":  {DatabaseURL: "postgres://user:s3cret@host:notaport/x", Namespace: "n"},
	} {
		j, err := pgruntime.Open(ctx, cfg)
		if err == nil {
			j.Close()
			t.Errorf("Open(%s) succeeded, want an error", name)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%s) error leaks the password: %v", name, err)
		}
	}
}

// TestMalformedURLSaysWhatIsWrong: a connection string pgx cannot parse
// was "Config.DatabaseURL is not a valid PostgreSQL connection string",
// the same words for a bad port, a password with a / in it, an unknown
// sslmode or a bad percent escape, and matched nothing a program could
// tell from an unreachable database. It is now an ErrInvalidURL that says
// what pgx found wrong and the form to write (OpenURLFile's names the
// file), never the password, even where pgx's own error quotes it.
func TestMalformedURLSaysWhatIsWrong(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct{ url, want string }{
		{"postgres://u:s3cret@127.0.0.1:notaport/db", "invalid port"},
		// The / ends the user information early: pgx reads "s3" as a port.
		{"postgres://u:s3/cret@127.0.0.1/db", "invalid port"},
		{"postgres://u:s3cret@127.0.0.1/db?sslmode=bogus", "failed to configure TLS (sslmode is invalid)"},
		{"postgres://u:s3%zzcret@127.0.0.1/db", "failed to parse as URL (invalid percent-encoded token in password)"},
		// pgx's error quotes a keyword/value password written with spaces.
		{"host=127.0.0.1 password = s3cret port=x", "invalid port"},
		// A value pgx quotes in its reason is not shown.
		{"postgres://u:pw@127.0.0.1/db?pool_max_conns=s3cret", `cannot parse pool_max_conns (strconv.ParseInt: parsing "(not shown)": invalid syntax)`},
	} {
		j, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: c.url, Namespace: "n"})
		if err == nil {
			j.Close()
			t.Errorf("Open(%q) succeeded, want ErrInvalidURL", c.url)
			continue
		}
		for _, w := range []string{"Config.DatabaseURL", c.want, "postgres://USER:PASSWORD@HOST:PORT/DATABASE", "%2F"} {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Open(%q): %v; want it to say %q", c.url, err, w)
			}
		}
		if !errors.Is(err, pgruntime.ErrInvalidURL) || strings.Contains(err.Error(), "s3") {
			t.Errorf("Open(%q): %v; want ErrInvalidURL without the password", c.url, err)
		}
		file := filepath.Join(t.TempDir(), "db-url")
		if err := os.WriteFile(file, []byte(c.url+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err = pgruntime.OpenURLFile(ctx, file, pgruntime.Config{Namespace: "n"})
		want := "pgruntime: database URL file " + file + " does not hold a valid PostgreSQL connection string: " + c.want
		if !errors.Is(err, pgruntime.ErrInvalidURL) || !strings.HasPrefix(err.Error(), want) || strings.Contains(err.Error(), "s3") {
			t.Errorf("OpenURLFile of %q:\n got %v\nwant ErrInvalidURL starting %q, without the password", c.url, err, want)
		}
	}
}

// TestConnectFailureSaysWhereAndWhatToCheck: a database that could not
// be reached was "pgruntime: connect to the database: failed to connect to
// `user=u database=db`:" and one indented line per attempt (the same
// refusal twice), a host name that does not resolve without the port
// tried, and nothing said what to check. The error now names the host and
// port tried, pgx's or the server's reason once, and what to check, never
// the password; it still wraps pgx's error.
func TestConnectFailureSaysWhereAndWhatToCheck(t *testing.T) {
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	u, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_database_" + strings.ReplaceAll(aip.NewID("x"), "-", "_")
	for _, c := range []struct{ url, want, hint string }{
		{"postgres://u:s3cret@" + closed + "/db?connect_timeout=5",
			"pgruntime: cannot connect to the database at " + closed + ": connection refused; ",
			"check the host and port in the database URL, and that PostgreSQL runs there and accepts connections from this machine"},
		{"postgres://u:s3cret@no-such-host.invalid:5433/db?connect_timeout=5",
			"pgruntime: cannot connect to the database at no-such-host.invalid:5433: host name no-such-host.invalid not found; ",
			"check the host name in the database URL"},
		{u.String(), "does not exist (SQLSTATE 3D000); ", "check the database name in the database URL"},
	} {
		j, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: c.url, Namespace: "n"})
		if err == nil {
			j.Close()
			t.Errorf("Open(%s) succeeded", c.url)
			continue
		}
		var ce *pgconn.ConnectError
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.hint) || !errors.As(err, &ce) {
			t.Errorf("Open(%s):\n got %v\nwant it to say %q and %q, wrapping a *pgconn.ConnectError", c.url, err, c.want, c.hint)
		}
		if strings.Contains(err.Error(), "s3cret") || strings.Count(err.Error(), "\n") > 0 {
			t.Errorf("Open(%s): %q; want one line without the password", c.url, err)
		}
	}
}

// TestReceiptHashOfAwkwardActionIDs: the hash computed inside the database
// matches journal.ReceiptHash for action IDs that need JSON escaping.
func TestReceiptHashOfAwkwardActionIDs(t *testing.T) {
	ctx := context.Background()
	j := open(t, pgruntime.Config{DatabaseURL: pgtest.NewDatabase(t), Namespace: "crepl_awkward"})
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ids := []string{
		`act_"quoted"`, `act_back\slash`, "act_ctl\x01\x1f\n\t\b\f\r",
		"act_ünïcødé_🚀_\u2028\u2029_\x7f", `act_,"prev_hash":"","seq":0,"status":"x"}`, `act_<html>&amp;`,
	}
	for i, id := range ids {
		if _, _, err := j.BeginAction(ctx, journal.Action{ActionID: id, ReceivedAt: t0}); err != nil {
			t.Fatalf("BeginAction(%q): %v", id, err)
		}
		if _, err := j.FinishAction(ctx, id, aip.StateCompleted, json.RawMessage(`{"i":`+string(rune('0'+i))+`}`), "", t0.Add(time.Duration(i)*time.Microsecond+time.Nanosecond)); err != nil {
			t.Fatalf("FinishAction(%q): %v", id, err)
		}
	}
	rs, err := j.Receipts(ctx, 0, 100)
	if err != nil || len(rs) != len(ids) {
		t.Fatalf("Receipts = %d, %v", len(rs), err)
	}
	if err := journal.VerifyChain("", rs); err != nil {
		t.Fatal(err)
	}
}

func TestOpenURLFile(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	file := filepath.Join(t.TempDir(), "db-url")
	if err := os.WriteFile(file, []byte(dbURL+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := pgruntime.Config{Namespace: aip.NewID(aip.PrefixReplica)}
	j, err := pgruntime.OpenURLFile(ctx, file, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.Durability() != journal.Durable || j.Namespace() != cfg.Namespace {
		t.Fatalf("journal %v namespace %s, want a durable journal of %s", j.Durability(), j.Namespace(), cfg.Namespace)
	}
	if err := j.Probe(ctx); err != nil {
		t.Fatalf("Probe: %v", err)
	}

	// The URL file is a secret: a group-readable file is refused, by name.
	if err := os.Chmod(file, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := pgruntime.OpenURLFile(ctx, file, cfg); !errors.Is(err, aip.ErrUnsafeFile) ||
		!strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("group-readable URL file: err = %v", err)
	}
	if err := os.Chmod(file, 0o600); err != nil {
		t.Fatal(err)
	}
	// The URL comes from the file only.
	withURL := cfg
	withURL.DatabaseURL = dbURL
	if _, err := pgruntime.OpenURLFile(ctx, file, withURL); err == nil || !strings.Contains(err.Error(), "leave it empty") {
		t.Fatalf("Config.DatabaseURL set: err = %v", err)
	}
	// A file that is not a connection string is refused naming the file,
	// without quoting its content.
	bad := filepath.Join(t.TempDir(), "bad-url")
	if err := os.WriteFile(bad, []byte("postgres://u:s3cret@[::1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := pgruntime.OpenURLFile(ctx, bad, cfg); err == nil || !strings.Contains(err.Error(), bad) || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("malformed URL file: err = %v", err)
	}
	if _, err := pgruntime.OpenURLFile(ctx, filepath.Join(t.TempDir(), "missing"), cfg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing URL file: err = %v", err)
	}
}

// TestSessionsCommitDurably: the journal's sessions never commit
// asynchronously. With synchronous_commit off (as the server, the role,
// the database or the URL may set it) PostgreSQL acknowledged an
// AcceptAction before it was durable: against a server run with
// synchronous_commit=off, five actions whose AcceptAction had returned were
// gone after the server was killed and restarted, so the host would run
// them again. A session where it is off gets local; a stronger value is
// kept.
func TestSessionsCommitDurably(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	with := func(value string) string {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		if u.RawQuery != "" {
			u.RawQuery += "&"
		}
		u.RawQuery += "options=-c%20synchronous_commit%3D" + value
		return u.String()
	}
	for set, want := range map[string]string{"off": "local", "remote_apply": "remote_apply", "on": "on"} {
		j := open(t, pgruntime.Config{DatabaseURL: with(set), Namespace: "crepl_" + set})
		v, err := j.SessionSetting(t.Context(), "synchronous_commit")
		if err != nil || v != want {
			t.Errorf("synchronous_commit=%s in the URL: the journal's session has %q (%v), want %q", set, v, err, want)
		}
	}
	// The database's setting (as the role's) is overridden too.
	conn := connect(t, dbURL)
	if _, err := conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{conn.Config().Database}.Sanitize()+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_db_off"})
	if v, err := j.SessionSetting(t.Context(), "synchronous_commit"); err != nil || v != "local" {
		t.Errorf("synchronous_commit=off for the database: the journal's session has %q (%v), want local", v, err)
	}
}

// TestSessionsEndAbandonedTransactions: the journal's sessions carry an
// idle_in_transaction_session_timeout, so one a host was cut off from
// mid-transaction does not hold its row locks until TCP notices.
func TestSessionsEndAbandonedTransactions(t *testing.T) {
	j := open(t, pgruntime.Config{DatabaseURL: pgtest.NewDatabase(t), Namespace: "crepl_a"})
	v, err := j.SessionSetting(t.Context(), "idle_in_transaction_session_timeout")
	if err != nil {
		t.Fatal(err)
	}
	if v != "1min" {
		t.Errorf("the journal's sessions show idle_in_transaction_session_timeout %q, want 1min", v)
	}
}
