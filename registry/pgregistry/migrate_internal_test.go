package pgregistry

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/pgmigrate"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestUpgradeFromOlderSchema installs only the first migration, as an older
// build did: a data-plane registry refuses the older schema, Open upgrades
// it in place and the data-plane registry then starts.
func TestUpgradeFromOlderSchema(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) < 2 || ms[len(ms)-1].Version != SchemaVersion {
		t.Fatalf("embedded migrations %d..%d, SchemaVersion %d", ms[0].Version, ms[len(ms)-1].Version, SchemaVersion)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := applyMigrations(ctx, conn, ms[:1], func() int64 { return 1 }); err != nil {
		t.Fatalf("install version 1: %v", err)
	}
	// A version-1 fleet has records the upgrade must keep.
	if _, err := conn.Exec(ctx, `INSERT INTO aip_registry.connector_types (type_id, name, owner, enabled, updated_at_ms) VALUES ('ctype_old', 'old', 'o', true, 1)`); err != nil {
		t.Fatal(err)
	}
	_, err = OpenDataPlane(ctx, Config{DataURL: dbURL})
	if !errors.Is(err, ErrSchemaMismatch) || !strings.Contains(err.Error(), "older") {
		t.Fatalf("OpenDataPlane on version 1: %v, want ErrSchemaMismatch (older)", err)
	}
	r, err := Open(ctx, Config{ControlURL: dbURL})
	if err != nil {
		t.Fatalf("Open upgrading version 1: %v", err)
	}
	r.Close()
	dp, err := OpenDataPlane(ctx, Config{DataURL: dbURL})
	if err != nil {
		t.Fatalf("OpenDataPlane after the upgrade: %v", err)
	}
	defer dp.Close()
	if _, err := dp.ConnectorType(ctx, "ctype_old"); err != nil {
		t.Fatalf("the upgrade lost a record: %v", err)
	}
	var versions []int
	rows, err := conn.Query(ctx, `SELECT version FROM aip_registry.schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	if versions, err = pgx.CollectRows(rows, pgx.RowTo[int]); err != nil {
		t.Fatal(err)
	}
	if len(versions) != SchemaVersion || versions[len(versions)-1] != SchemaVersion {
		t.Fatalf("recorded migrations %v, want 1..%d", versions, SchemaVersion)
	}
}

// TestMigrationNamesAndChecksums: embedded migrations are numbered from 1
// without gaps and a changed text changes the checksum; the shared runner's
// errors reach callers as this package's kinds, naming the migration.
func TestMigrationNamesAndChecksums(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.Version != i+1 || m.Name == "" || m.File != fmt.Sprintf("%04d_%s.sql", m.Version, m.Name) || len(m.Checksum) != 64 {
			t.Fatalf("migration %d: %+v", i, m)
		}
	}
	a, b := pgmigrate.New(1, "x", "SELECT 1"), pgmigrate.New(1, "x", "SELECT 1 ")
	if a.Checksum == b.Checksum {
		t.Fatal("a changed migration text kept its checksum")
	}
	for _, c := range []struct {
		kind, want error
		text       string
	}{
		{pgmigrate.ErrChanged, ErrMigrationChanged, "pgregistry: applied migration changed: "},
		{pgmigrate.ErrUnknown, ErrUnknownMigration, "pgregistry: unknown applied migration: "},
		{pgmigrate.ErrRecordGap, ErrUnknownMigration, "pgregistry: unknown applied migration: "},
		{pgmigrate.ErrNotInstalled, ErrSchemaMismatch, "run `aipfleet registry migrate` with the admin role first"},
		{pgmigrate.ErrTooOld, ErrSchemaMismatch, "run `aipfleet registry migrate` with the admin role"},
		{pgmigrate.ErrTooNew, ErrSchemaMismatch, "pgregistry: schema version mismatch: "},
		{nil, nil, "pgregistry: apply migration 0001_registry.sql: "},
	} {
		err := migrationError(&pgmigrate.Error{Kind: c.kind, Migration: ms[0].File, Detail: "apply migration " + ms[0].File, Err: errors.New("cause")})
		if (c.want != nil && !errors.Is(err, c.want)) || (c.kind != nil && !errors.Is(err, c.kind)) ||
			!strings.Contains(err.Error(), c.text) || !strings.Contains(err.Error(), ms[0].File) || !strings.HasSuffix(err.Error(), ": cause") {
			t.Errorf("migrationError(%v) = %q, want %v containing %q and the migration", c.kind, err, c.want, c.text)
		}
	}
}
