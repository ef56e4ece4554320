package pgtest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestSmoke proves the harness reaches a real server and hands out a database
// of its own.
func TestSmoke(t *testing.T) {
	pool := pgtest.NewPool(t)
	ctx := context.Background()

	var version, db string
	if err := pool.QueryRow(ctx, "SELECT version(), current_database()").Scan(&version, &db); err != nil {
		t.Fatalf("query: %v", err)
	}
	if !strings.HasPrefix(version, "PostgreSQL") {
		t.Fatalf("version() = %q, want a PostgreSQL server", version)
	}
	if !strings.HasPrefix(db, "aip_test_") {
		t.Fatalf("current_database() = %q, want a fresh aip_test_ database", db)
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE smoke (id int PRIMARY KEY)"); err != nil {
		t.Fatalf("create table: %v", err)
	}
	t.Logf("PostgreSQL smoke test ran against %s (%s)", db, version)
}

func TestDatabasesAreIsolated(t *testing.T) {
	a := pgtest.NewDatabase(t)
	b := pgtest.NewDatabase(t)
	if a == b {
		t.Fatalf("two calls returned the same database %s", a)
	}
}
