// Package pgtest gives each test its own fresh PostgreSQL database.
//
// The server is named by AIP_TEST_DATABASE_URL (a URL with rights to create and
// drop databases, usually the superuser of a throwaway server started by
// scripts/test.sh). Without it the test is skipped with a message saying how to
// run it; when AIP_TEST_REQUIRE_DATABASE=1 is also set (as `make test` does), a
// missing or unreachable server fails the test instead of skipping it.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Environment variables read by this package.
const (
	EnvDatabaseURL     = "AIP_TEST_DATABASE_URL"
	EnvRequireDatabase = "AIP_TEST_REQUIRE_DATABASE"
)

// ServerURL returns the administrative URL of the test server, or skips (or
// fails, when the database is required) the test when none is configured.
func ServerURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(EnvDatabaseURL)
	if u == "" {
		if Required() {
			tb.Fatalf("pgtest: %s is not set but %s=1; run the tests with `make test`, which starts a PostgreSQL server", EnvDatabaseURL, EnvRequireDatabase)
		}
		tb.Skipf("pgtest: %s is not set; skipping PostgreSQL test (run `make test` to start a throwaway server)", EnvDatabaseURL)
	}
	return u
}

// Required reports whether database tests must run rather than skip.
func Required() bool { return os.Getenv(EnvRequireDatabase) == "1" }

// NewDatabase creates a fresh, empty database for the test and returns a URL
// for it. The database is dropped when the test and its subtests finish.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	admin := ServerURL(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("pgtest: connect to %s: %v (is the server from `make test` running?)", redact(admin), err)
	}
	defer conn.Close(ctx)

	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		tb.Fatalf("pgtest: random database name: %v", err)
	}
	name := "aip_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		tb.Fatalf("pgtest: create database %s: %v", name, err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin)
		if err != nil {
			tb.Errorf("pgtest: connect to drop database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})

	u, err := url.Parse(admin)
	if err != nil {
		tb.Fatalf("pgtest: parse %s: %v", EnvDatabaseURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

// NewPool creates a fresh database and returns a pool connected to it. The
// pool is closed before the database is dropped.
func NewPool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	dbURL := NewDatabase(tb)
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		tb.Fatalf("pgtest: open pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "the configured server"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	return u.String()
}
