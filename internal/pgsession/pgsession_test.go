package pgsession_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"
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

// keepalive is what a session shows for one keepalive setting.
type keepalive struct{ setting, source string }

// keepalives returns what conn shows for the three keepalive settings and
// tcp_user_timeout.
func keepalives(t *testing.T, conn *pgx.Conn) map[string]keepalive {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT name, setting, source FROM pg_settings WHERE name LIKE 'tcp_keepalives_%' OR name = 'tcp_user_timeout'`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]keepalive{}
	for rows.Next() {
		var name string
		var k keepalive
		if err := rows.Scan(&name, &k.setting, &k.source); err != nil {
			t.Fatal(err)
		}
		got[name] = k
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("the session shows %d of the four TCP settings: %+v", len(got), got)
	}
	return got
}

// userTimeoutOf is the tcp_user_timeout pgsession gives a session showing
// the keepalive settings got: idle + count × interval, in milliseconds.
func userTimeoutOf(t *testing.T, got map[string]keepalive) string {
	t.Helper()
	n := map[string]int{}
	for _, name := range []string{"tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count"} {
		v, err := strconv.Atoi(got[name].setting)
		if err != nil {
			t.Fatalf("%s %+v: %v", name, got[name], err)
		}
		n[name] = v
	}
	return strconv.Itoa(1000 * (n["tcp_keepalives_idle"] + n["tcp_keepalives_count"]*n["tcp_keepalives_interval"]))
}

// detect connects to dbURL, runs DetectDeadPeer and returns the session's
// keepalive settings.
func detect(t *testing.T, dbURL string) map[string]keepalive {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := pgsession.DetectDeadPeer(t.Context(), conn); err != nil {
		t.Fatalf("DetectDeadPeer: %v", err)
	}
	return keepalives(t, conn)
}

// TestDetectDeadPeer: a TCP session without keepalives of its own gets
// pgsession's, and a tcp_user_timeout as long as they take to give up (so
// data sent to a dead client is not retransmitted for 15 minutes), so the
// server ends it within minutes of its client's machine dying instead of
// hours; a value the URL or the database sets is kept, 0 included, and
// tcp_user_timeout follows the keepalives an operator set; a Unix-socket
// session is left as it is.
func TestDetectDeadPeer(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	ours := map[string]keepalive{
		"tcp_keepalives_idle":     {strconv.Itoa(pgsession.KeepalivesIdle), "session"},
		"tcp_keepalives_interval": {strconv.Itoa(pgsession.KeepalivesInterval), "session"},
		"tcp_keepalives_count":    {strconv.Itoa(pgsession.KeepalivesCount), "session"},
		"tcp_user_timeout":        {strconv.Itoa(pgsession.UserTimeoutMillis), "session"},
	}
	if pgsession.UserTimeoutMillis != 120000 {
		t.Errorf("UserTimeoutMillis = %d, want 120000 (60 s idle + 6 probes 10 s apart)", pgsession.UserTimeoutMillis)
	}
	got := detect(t, dbURL)
	for name, want := range ours {
		if got[name] != want {
			t.Errorf("a session without keepalives of its own: %s %+v, want %+v", name, got[name], want)
		}
	}
	// The pools' hook sets them too.
	for _, name := range []string{"tcp_keepalives_idle", "tcp_user_timeout"} {
		if v := settingOf(t, dbURL, name); v != ours[name].setting {
			t.Errorf("a pool session shows %s %q, want %s", name, v, ours[name].setting)
		}
	}

	got = detect(t, withParam(t, dbURL, "tcp_keepalives_idle", "30"))
	if k := got["tcp_keepalives_idle"]; k != (keepalive{"30", "client"}) {
		t.Errorf("a session whose URL sets tcp_keepalives_idle 30 shows %+v", k)
	}
	if k := got["tcp_keepalives_count"]; k != ours["tcp_keepalives_count"] {
		t.Errorf("a session whose URL sets only tcp_keepalives_idle: tcp_keepalives_count %+v, want %+v", k, ours["tcp_keepalives_count"])
	}
	if k := got["tcp_user_timeout"]; k != (keepalive{"90000", "session"}) {
		t.Errorf("a session whose URL sets tcp_keepalives_idle 30: tcp_user_timeout %+v, want 90000 (30 s + 6 × 10 s)", k)
	}

	// The operator's tcp_user_timeout is kept, 0 included, whatever the
	// keepalives.
	for _, v := range []string{"5000", "0"} {
		got = detect(t, withParam(t, dbURL, "tcp_user_timeout", v))
		if k := got["tcp_user_timeout"]; k != (keepalive{v, "client"}) {
			t.Errorf("a session whose URL sets tcp_user_timeout %s shows %+v", v, k)
		}
		if k := got["tcp_keepalives_idle"]; k != ours["tcp_keepalives_idle"] {
			t.Errorf("a session whose URL sets only tcp_user_timeout: tcp_keepalives_idle %+v, want %+v", k, ours["tcp_keepalives_idle"])
		}
	}

	// 0 from the database is the operator's choice of the system's
	// default: kept (the setting then shows the system's value).
	alterDatabase(t, dbURL, "tcp_keepalives_count = 0")
	got = detect(t, dbURL)
	if k := got["tcp_keepalives_count"]; k.source != "database" {
		t.Errorf("a session of a database that sets tcp_keepalives_count 0 shows %+v, want the database's value kept", k)
	}
	if k := got["tcp_keepalives_idle"]; k != ours["tcp_keepalives_idle"] {
		t.Errorf("a session of a database that sets only tcp_keepalives_count: tcp_keepalives_idle %+v, want %+v", k, ours["tcp_keepalives_idle"])
	}
	// With the system's probe count (9 on Linux), the keepalives give up
	// later, and so does tcp_user_timeout.
	if k, want := got["tcp_user_timeout"], (keepalive{userTimeoutOf(t, got), "session"}); k != want {
		t.Errorf("a session of a database that sets tcp_keepalives_count 0: tcp_user_timeout %+v, want %+v (idle + count × interval of %+v)", k, want, got)
	}
	alterDatabase(t, dbURL, "tcp_user_timeout = 0")
	got = detect(t, dbURL)
	if k := got["tcp_user_timeout"]; k != (keepalive{"0", "database"}) {
		t.Errorf("a session of a database that sets tcp_user_timeout 0 shows %+v, want it kept", k)
	}
}

// TestDetectDeadPeerUnixSocket: on a Unix-socket session, which has no
// TCP, DetectDeadPeer succeeds and sets nothing; PostgreSQL takes a
// tcp_user_timeout for one without an error, and ignores it.
func TestDetectDeadPeerUnixSocket(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var dirs string
	err = conn.QueryRow(t.Context(), "SHOW unix_socket_directories").Scan(&dirs)
	conn.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dir, _, _ := strings.Cut(dirs, ",")
	q := u.Query()
	q.Set("host", dir)
	u.RawQuery = q.Encode()
	sock, err := pgx.Connect(t.Context(), u.String())
	if err != nil {
		// make test's server (scripts/pg.sh) has its socket where this
		// process reaches it: there the test must run, not skip.
		if pgtest.Required() {
			t.Fatalf("the test server's Unix socket in %q is not reachable from this process (%s=1): %v", dir, pgtest.EnvRequireDatabase, err)
		}
		t.Skipf("the test server's Unix socket in %q is not reachable from this process: %v", dir, err)
	}
	defer sock.Close(context.Background())
	if err := pgsession.DetectDeadPeer(t.Context(), sock); err != nil {
		t.Fatalf("DetectDeadPeer on a Unix socket: %v", err)
	}
	for name, k := range keepalives(t, sock) {
		if k != (keepalive{"0", "default"}) {
			t.Errorf("a Unix-socket session shows %s %+v, want it left at 0", name, k)
		}
	}
	if _, err := sock.Exec(t.Context(), "SET tcp_user_timeout = 5000"); err != nil {
		t.Fatalf("SET tcp_user_timeout on a Unix-socket session: %v", err)
	}
	if k := keepalives(t, sock)["tcp_user_timeout"]; k.setting != "0" {
		t.Errorf("a Unix-socket session shows tcp_user_timeout %+v after SET, want 0 (ignored)", k)
	}
}
