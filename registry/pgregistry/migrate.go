package pgregistry

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/internal/pgmigrate"
	"github.com/aipfleet/aipfleet/registry"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// embeddedMigrations returns the migrations built into the binary, in
// version order. Versions start at 1 and have no gaps.
func embeddedMigrations() ([]pgmigrate.Migration, error) {
	ms, err := pgmigrate.Load(migrationFiles, "migrations")
	return ms, migrationError(err)
}

// SchemaVersion is the schema version this build installs and expects: the
// number of its last embedded migration.
const SchemaVersion = 14

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

// migrationKinds maps the migration errors onto this package's.
var migrationKinds = map[error]error{
	pgmigrate.ErrChanged:      ErrMigrationChanged,
	pgmigrate.ErrUnknown:      ErrUnknownMigration,
	pgmigrate.ErrRecordGap:    ErrUnknownMigration,
	pgmigrate.ErrNotInstalled: ErrSchemaMismatch,
	pgmigrate.ErrTooOld:       ErrSchemaMismatch,
	pgmigrate.ErrTooNew:       ErrSchemaMismatch,
}

// migrationHints say which command fixes a schema that is missing or old.
var migrationHints = map[error]string{
	pgmigrate.ErrNotInstalled: "; run `aipfleet registry migrate` with the admin role first",
	pgmigrate.ErrTooOld:       " (run `aipfleet registry migrate` with the admin role)",
}

func migrationError(err error) error {
	var e *pgmigrate.Error
	if errors.As(err, &e) {
		if hint, ok := migrationHints[e.Kind]; ok {
			c := *e
			c.Detail += hint
			err = &c
		}
	}
	return pgmigrate.Wrap(err, "pgregistry", migrationKinds)
}

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

// ledger is the registry schema's migrations table: each applied
// migration by name with the hex SHA-256 of its file, stamped with nowMS.
func ledger(nowMS func() int64) pgmigrate.Ledger {
	return pgmigrate.Ledger{
		Table:           "aip_registry.schema_migrations",
		Create:          createMigrationsTable,
		NameColumn:      "name",
		AppliedAtColumn: "applied_at_ms",
		Now:             func() any { return nowMS() },
		Lock:            pgmigrate.Lock32(lockClass, lockMigration),
	}
}

// Migrate installs or upgrades the registry schema at url: it applies every
// embedded migration the database lacks, in one transaction under the
// migration advisory lock, and records each with its checksum. It refuses,
// changing nothing, when an applied migration's checksum differs from the
// embedded one (ErrMigrationChanged) or the database records a migration
// this build does not know (ErrUnknownMigration). The role of url needs
// CREATE on the database or on schema aip_registry (the admin role).
func Migrate(ctx context.Context, url string) error {
	_, err := MigrateSchema(ctx, url)
	return err
}

// MigrateResult is what MigrateSchema did.
type MigrateResult struct {
	// Applied is the number of migrations applied; 0 when the schema was
	// already this build's.
	Applied int
	// CatalogRevision is the catalog revision after the migration.
	CatalogRevision uint64
	// Unnamable lists, by kind and field, the records whose identifiers
	// hold an invisible formatting character, which a build before
	// registry.RuleFormatCharacter stored: capability definitions and
	// instances whose capability or tenant ID holds one, which no route
	// request or write can name (nor their bindings, replicas and
	// routes), so they route nothing; and instances, bindings, admission
	// policies, replicas and versions whose other identifiers (a version's
	// manifest agent ID among them) hold one (UnnamableRecords.Effect says
	// what that does). Empty when there are
	// none. The caller should tell the operator (aipfleet registry
	// migrate warns of each kind and field).
	Unnamable []UnnamableRecords
}

// MigrateSchema is Migrate on a single connection, which it then uses to
// verify the schema it left (exactly this build's), to read the catalog
// revision and to look for records whose identifiers hold an invisible
// formatting character (MigrateResult.Unnamable). It opens no other connection, so it works for
// a role, or through a pooler, that allows one.
//
// Only MigrateSchema looks for those records: the look reads the
// capability definitions, instances, bindings, admission policies,
// replicas, versions and version profiles once each, in one query each
// (not the routes, which grow with actions), which an operator's migrate
// can afford, and every upgrade from a build before the rule (schema 13
// or older) needs a migrate, as the services refuse
// an older schema. Open and OpenDataPlane, which every service start and
// apply run, do not: builds since the rule refuse such a record, and the
// builds before it cannot run on schema 14 or newer, so once a migrate
// has taken a database past schema 13 none is added.
func MigrateSchema(ctx context.Context, url string) (MigrateResult, error) {
	cc, err := parseConnConfig(databaseURL, url)
	if err != nil {
		return MigrateResult{}, err
	}
	if _, set := cc.RuntimeParams["application_name"]; !set {
		cc.RuntimeParams["application_name"] = "aipfleet-registry-migrate"
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return MigrateResult{}, connectError(registry.ErrStorage, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	ms, err := embeddedMigrations()
	if err != nil {
		return MigrateResult{}, err
	}
	n, err := migrateConn(ctx, conn, ms, nowMillisFunc(nil))
	if err != nil {
		return MigrateResult{}, err
	}
	// The migrations may have changed the types of columns the ledger's
	// statements, prepared before them, read (0006 sets collations):
	// prepare them again.
	if err := conn.DeallocateAll(ctx); err != nil {
		return MigrateResult{Applied: n}, storageErr("reset prepared statements after the migration", err)
	}
	if err := verifySchema(ctx, conn, ms); err != nil {
		return MigrateResult{Applied: n}, fmt.Errorf("pgregistry: verify the migrated schema: %w", err)
	}
	var rev int64
	if err := conn.QueryRow(ctx, selectRevision).Scan(&rev); err != nil {
		return MigrateResult{Applied: n}, storageErr("read the catalog revision", err)
	}
	unnamable, err := unnamableRecords(ctx, conn)
	if err != nil {
		return MigrateResult{Applied: n, CatalogRevision: uint64(rev)}, err
	}
	return MigrateResult{Applied: n, CatalogRevision: uint64(rev), Unnamable: unnamable}, nil
}

// applyMigrations applies ms on conn in one transaction.
func applyMigrations(ctx context.Context, conn *pgx.Conn, ms []pgmigrate.Migration, nowMS func() int64) error {
	_, err := migrateConn(ctx, conn, ms, nowMS)
	return err
}

// migrationAttempts bounds the runs of the migration transaction that
// PostgreSQL aborts as a deadlock's victim or for a serialization failure.
const migrationAttempts = 5

// migrateConn applies ms on conn in one transaction and returns how many
// it applied. A migration takes its tables' locks in its own order while
// the services (or a build still running during a rolling upgrade) take
// theirs in another, so PostgreSQL may abort it as a deadlock's victim
// (40P01), or for a serialization failure (40001): nothing of it was
// applied, and it runs again, up to migrationAttempts times, after a
// short pause (the other transaction has then finished).
func migrateConn(ctx context.Context, conn *pgx.Conn, ms []pgmigrate.Migration, nowMS func() int64) (int, error) {
	for attempt := 1; ; attempt++ {
		n, err := migrateOnce(ctx, conn, ms, nowMS)
		var pgErr *pgconn.PgError
		if err == nil || attempt == migrationAttempts || !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return n, err
		}
		select {
		case <-ctx.Done():
			return n, err
		case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
		}
	}
}

// migrateOnce is one run of migrateConn's transaction.
func migrateOnce(ctx context.Context, conn *pgx.Conn, ms []pgmigrate.Migration, nowMS func() int64) (int, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("pgregistry: begin migration: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := pgmigrate.Apply(ctx, tx, ledger(nowMS), ms)
	if err != nil {
		return 0, migrationError(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("pgregistry: commit migrations: %w", err)
	}
	return n, nil
}

// verifySchema checks that the database holds exactly the embedded
// migrations (version and checksum), without changing anything.
func verifySchema(ctx context.Context, q querier, ms []pgmigrate.Migration) error {
	return migrationError(pgmigrate.Verify(ctx, q, ledger(nil), ms))
}
