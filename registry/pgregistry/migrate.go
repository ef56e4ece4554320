package pgregistry

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/registry"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migration is one embedded schema change.
type migration struct {
	version  int
	name     string
	sql      string
	checksum string
}

// migrationName matches NNNN_name.sql.
var migrationName = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.sql$`)

// embeddedMigrations returns the migrations built into the binary, in
// version order. Versions start at 1 and have no gaps.
func embeddedMigrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("pgregistry: read embedded migrations: %w", err)
	}
	var out []migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("pgregistry: embedded migration file %s is not named NNNN_name.sql", e.Name())
		}
		text, err := fs.ReadFile(migrationFiles, path.Join("migrations", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("pgregistry: read embedded migration %s: %w", e.Name(), err)
		}
		v, _ := strconv.Atoi(m[1])
		out = append(out, newMigration(v, m[2], string(text)))
	}
	slices.SortFunc(out, func(a, b migration) int { return a.version - b.version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("pgregistry: embedded migrations skip from %d to %d", i, m.version)
		}
	}
	return out, nil
}

func newMigration(version int, name, sql string) migration {
	sum := sha256.Sum256([]byte(sql))
	return migration{version: version, name: name, sql: sql, checksum: hex.EncodeToString(sum[:])}
}

// schemaVersion is the number of the last embedded migration.
func schemaVersionOf(ms []migration) int {
	if len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].version
}

// SchemaVersion is the schema version this build installs and expects: the
// number of its last embedded migration.
const SchemaVersion = 3

// Errors of schema installation and verification.
var (
	// ErrSchemaMismatch: the installed schema is older or newer than this
	// build's SchemaVersion, or not installed at all.
	ErrSchemaMismatch = errors.New("pgregistry: schema version mismatch")
	// ErrMigrationChanged: an applied migration's recorded checksum differs
	// from the embedded file of the same version.
	ErrMigrationChanged = errors.New("pgregistry: applied migration changed")
	// ErrUnknownMigration: the database records a migration this build does
	// not know (it was migrated by a newer build).
	ErrUnknownMigration = errors.New("pgregistry: unknown applied migration")
)

// createMigrationsTable creates the schema (only when it is missing: an
// operator may have created it for the admin role, who then needs no CREATE
// right on the database) and the migrations table.
const createMigrationsTable = `
DO $$ BEGIN
	IF to_regnamespace('aip_registry') IS NULL THEN
		CREATE SCHEMA aip_registry;
	END IF;
END $$;
CREATE TABLE IF NOT EXISTS aip_registry.schema_migrations (
    version       integer PRIMARY KEY,
    name          text    NOT NULL,
    checksum      text    NOT NULL,
    applied_at_ms bigint  NOT NULL
);`

const selectAppliedMigrations = `SELECT version, name, checksum FROM aip_registry.schema_migrations ORDER BY version`

const insertAppliedMigration = `INSERT INTO aip_registry.schema_migrations (version, name, checksum, applied_at_ms) VALUES ($1, $2, $3, $4)`

type appliedMigration struct {
	version  int
	name     string
	checksum string
}

// Migrate installs or upgrades the registry schema at url: it applies every
// embedded migration the database lacks, in one transaction under the
// migration advisory lock, and records each with its checksum. It refuses,
// changing nothing, when an applied migration's checksum differs from the
// embedded one (ErrMigrationChanged) or the database records a migration
// this build does not know (ErrUnknownMigration). The role of url needs
// CREATE on the database or on schema aip_registry (the admin role).
func Migrate(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("%w: migrate: connect to %s: %w", registry.ErrStorage, redact(url), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ms, err := embeddedMigrations()
	if err != nil {
		return err
	}
	return applyMigrations(ctx, conn, ms, nowMillisFunc(nil))
}

// applyMigrations applies ms on conn in one transaction.
func applyMigrations(ctx context.Context, conn *pgx.Conn, ms []migration, nowMS func() int64) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("pgregistry: begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, lockClass, lockMigration); err != nil {
		return fmt.Errorf("pgregistry: take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, createMigrationsTable); err != nil {
		return fmt.Errorf("pgregistry: create the migrations table: %w", err)
	}
	applied, err := readApplied(ctx, tx)
	if err != nil {
		return err
	}
	if err := checkApplied(applied, ms); err != nil {
		return err
	}
	if len(applied) > len(ms) {
		a := applied[len(ms)]
		return fmt.Errorf("%w: the database records migration %04d_%s, which this build (schema version %d) does not have; migrate with a build of schema version %d or newer",
			ErrUnknownMigration, a.version, a.name, schemaVersionOf(ms), applied[len(applied)-1].version)
	}
	for _, m := range ms[len(applied):] {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("pgregistry: apply migration %04d_%s: %w", m.version, m.name, err)
		}
		if _, err := tx.Exec(ctx, insertAppliedMigration, m.version, m.name, m.checksum, nowMS()); err != nil {
			return fmt.Errorf("pgregistry: record migration %04d_%s: %w", m.version, m.name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgregistry: commit migrations: %w", err)
	}
	return nil
}

func readApplied(ctx context.Context, q querier) ([]appliedMigration, error) {
	rows, err := q.Query(ctx, selectAppliedMigrations)
	if err != nil {
		return nil, fmt.Errorf("pgregistry: read applied migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (appliedMigration, error) {
		var a appliedMigration
		err := r.Scan(&a.version, &a.name, &a.checksum)
		return a, err
	})
	if err != nil {
		return nil, fmt.Errorf("pgregistry: read applied migrations: %w", err)
	}
	return applied, nil
}

// checkApplied compares the recorded migrations with the embedded ones
// they overlap: each must be embedded under the same version with the same
// checksum. Recorded migrations past the embedded ones are the caller's to
// judge.
func checkApplied(applied []appliedMigration, ms []migration) error {
	for i, a := range applied {
		if i >= len(ms) {
			break
		}
		if a.version != ms[i].version {
			return fmt.Errorf("%w: the database records migration %04d_%s, which this build (schema version %d) does not have; run a build of schema version %d or newer",
				ErrUnknownMigration, a.version, a.name, schemaVersionOf(ms), a.version)
		}
		if a.checksum != ms[i].checksum {
			return fmt.Errorf("%w: migration %04d_%s was applied with checksum %s, but this build embeds checksum %s; applied migrations must never be edited: add a new migration instead",
				ErrMigrationChanged, a.version, a.name, a.checksum, ms[i].checksum)
		}
	}
	return nil
}

// verifySchema checks that the database holds exactly the embedded
// migrations (version and checksum), without changing anything.
func verifySchema(ctx context.Context, q querier, ms []migration) error {
	var exists bool
	if err := q.QueryRow(ctx, `SELECT to_regclass('aip_registry.schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("pgregistry: look for the registry schema: %w", err)
	}
	if !exists {
		return fmt.Errorf("%w: the registry schema is not installed (want version %d); run `aipfleet registry migrate` with the admin role first",
			ErrSchemaMismatch, schemaVersionOf(ms))
	}
	applied, err := readApplied(ctx, q)
	if err != nil {
		return err
	}
	if err := checkApplied(applied, ms); err != nil {
		return err
	}
	installed := 0
	if len(applied) > 0 {
		installed = applied[len(applied)-1].version
	}
	switch {
	case len(applied) < len(ms):
		return fmt.Errorf("%w: the installed schema is version %d, older than version %d this build needs; run `aipfleet registry migrate` with the admin role",
			ErrSchemaMismatch, installed, schemaVersionOf(ms))
	case len(applied) > len(ms):
		return fmt.Errorf("%w: the installed schema is version %d, newer than version %d this build knows; run a build of schema version %d",
			ErrSchemaMismatch, installed, schemaVersionOf(ms), installed)
	}
	return nil
}
