package pgregistry

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
	if len(ms) < 2 || ms[len(ms)-1].version != SchemaVersion {
		t.Fatalf("embedded migrations %d..%d, SchemaVersion %d", ms[0].version, ms[len(ms)-1].version, SchemaVersion)
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
// without gaps and a changed text changes the checksum.
func TestMigrationNamesAndChecksums(t *testing.T) {
	ms, err := embeddedMigrations()
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range ms {
		if m.version != i+1 || m.name == "" || len(m.checksum) != 64 {
			t.Fatalf("migration %d: %+v", i, m)
		}
	}
	a, b := newMigration(1, "x", "SELECT 1"), newMigration(1, "x", "SELECT 1 ")
	if a.checksum == b.checksum {
		t.Fatal("a changed migration text kept its checksum")
	}
	applied := []appliedMigration{{version: 1, name: ms[0].name, checksum: "other"}}
	if err := checkApplied(applied, ms); !errors.Is(err, ErrMigrationChanged) {
		t.Fatalf("checkApplied with a changed checksum: %v", err)
	}
	applied = []appliedMigration{{version: 7, name: "elsewhere", checksum: ms[0].checksum}}
	if err := checkApplied(applied, ms); !errors.Is(err, ErrUnknownMigration) {
		t.Fatalf("checkApplied with an unknown version: %v", err)
	}
}
