package pgsession_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/internal/pgsession"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// timeoutOf opens a pool on dbURL with the hook and returns what one of
// its sessions shows for idle_in_transaction_session_timeout.
func timeoutOf(t *testing.T, dbURL string) string {
	t.Helper()
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.AfterConnect = pgsession.EndAbandonedTransactions
	pool, err := pgxpool.NewWithConfig(t.Context(), pc)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var v string
	if err := pool.QueryRow(t.Context(), "SHOW idle_in_transaction_session_timeout").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestEndAbandonedTransactions: a session without a timeout gets one; a
// timeout the URL or the database sets is kept, 0 included (it was taken
// for none and replaced).
func TestEndAbandonedTransactions(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	if v := timeoutOf(t, dbURL); v != "1min" {
		t.Errorf("a session without a timeout of its own shows %q, want 1min", v)
	}

	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("idle_in_transaction_session_timeout", "5s")
	u.RawQuery = q.Encode()
	if v := timeoutOf(t, u.String()); v != "5s" {
		t.Errorf("a session whose URL sets 5s shows %q", v)
	}
	// 0 is a value too: the operator's way to turn the timeout off.
	q.Set("idle_in_transaction_session_timeout", "0")
	u.RawQuery = q.Encode()
	if v := timeoutOf(t, u.String()); v != "0" {
		t.Errorf("a session whose URL sets 0 shows %q", v)
	}

	conn, err := pgx.Connect(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(t.Context(), "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET idle_in_transaction_session_timeout = '7s'"); err != nil {
		t.Fatal(err)
	}
	if v := timeoutOf(t, dbURL); v != "7s" {
		t.Errorf("a session of a database that sets 7s shows %q", v)
	}
	if _, err := conn.Exec(t.Context(), "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET idle_in_transaction_session_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	conn.Close(context.Background())
	if v := timeoutOf(t, dbURL); v != "0" {
		t.Errorf("a session of a database that sets 0 shows %q", v)
	}
}
