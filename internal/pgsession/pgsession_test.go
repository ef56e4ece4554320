package pgsession_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/internal/pgsession"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// settingOf opens a pool on dbURL with the hook and returns what one of
// its sessions shows for the setting name.
func settingOf(t *testing.T, dbURL, name string) string {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = pgsession.AfterConnect
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var v string
	if err := pool.QueryRow(t.Context(), "SELECT current_setting($1)", name).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// withParam returns dbURL with the startup parameter name=value (a
// setting of the URL, pg_settings.source client).
func withParam(t *testing.T, dbURL, name, value string) string {
	t.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set(name, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// alterDatabase runs ALTER DATABASE <dbURL's database> SET <set>.
func alterDatabase(t *testing.T, dbURL, set string) {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var db string
	if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET "+set); err != nil {
		t.Fatal(err)
	}
}

// TestEndAbandonedTransactions: a session without a timeout gets one; a
// timeout the URL or the database sets is kept, 0 included (it was taken
// for none and replaced).
func TestEndAbandonedTransactions(t *testing.T) {
	const name = "idle_in_transaction_session_timeout"
	dbURL := pgtest.NewDatabase(t)
	if v := settingOf(t, dbURL, name); v != "1min" {
		t.Errorf("a session without a timeout of its own shows %q, want 1min", v)
	}
	if v := settingOf(t, withParam(t, dbURL, name, "5s"), name); v != "5s" {
		t.Errorf("a session whose URL sets 5s shows %q", v)
	}
	// 0 is a value too: the operator's way to turn the timeout off.
	if v := settingOf(t, withParam(t, dbURL, name, "0"), name); v != "0" {
		t.Errorf("a session whose URL sets 0 shows %q", v)
	}
	alterDatabase(t, dbURL, name+" = '7s'")
	if v := settingOf(t, dbURL, name); v != "7s" {
		t.Errorf("a session of a database that sets 7s shows %q", v)
	}
	alterDatabase(t, dbURL, name+" = 0")
	if v := settingOf(t, dbURL, name); v != "0" {
		t.Errorf("a session of a database that sets 0 shows %q", v)
	}
}

// TestCommitsDurably: a session never commits asynchronously. With
// synchronous_commit off, whether the server, the role, the database or
// the URL sets it, the session gets local; a stronger value is kept.
func TestCommitsDurably(t *testing.T) {
	const name = "synchronous_commit"
	dbURL := pgtest.NewDatabase(t)
	for set, want := range map[string]string{"off": "local", "local": "local", "remote_write": "remote_write", "remote_apply": "remote_apply", "on": "on"} {
		if v := settingOf(t, withParam(t, dbURL, name, set), name); v != want {
			t.Errorf("a session whose URL sets synchronous_commit %s shows %q, want %q", set, v, want)
		}
	}

	// A role of its own (roles are the server's, so dropped at the end),
	// allowed to connect to the test's database.
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	role := "aip_test_role_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(t.Context(), "CREATE ROLE "+role+" LOGIN; ALTER ROLE "+role+" SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dbURL)
		if err != nil {
			t.Errorf("connect to drop role %s: %v", role, err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP ROLE "+role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(role)
	if v := settingOf(t, u.String(), name); v != "local" {
		t.Errorf("a session of a role that sets synchronous_commit off shows %q, want local", v)
	}

	alterDatabase(t, dbURL, name+" = off")
	if v := settingOf(t, dbURL, name); v != "local" {
		t.Errorf("a session of a database that sets synchronous_commit off shows %q, want local", v)
	}
	alterDatabase(t, dbURL, name+" = remote_apply")
	if v := settingOf(t, dbURL, name); v != "remote_apply" {
		t.Errorf("a session of a database that sets synchronous_commit remote_apply shows %q, want it kept", v)
	}

}
