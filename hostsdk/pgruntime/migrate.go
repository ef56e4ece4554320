package pgruntime

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/internal/pgmigrate"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey is the advisory lock that serialises migrations of the
// runtime schema ("aiprunt1").
const migrationLockKey int64 = 0x61697072756e7431

// ledger is the runtime schema's migrations table: each applied file by
// name with "sha256:" and the hex SHA-256 of its text.
var ledger = pgmigrate.Ledger{
	Table: "aip_runtime_schema_migrations",
	Create: `CREATE TABLE IF NOT EXISTS aip_runtime_schema_migrations (
		version    integer     PRIMARY KEY,
		file       text        NOT NULL,
		checksum   text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`,
	NameColumn:     "file",
	ChecksumPrefix: "sha256:",
	Lock:           pgmigrate.Lock64(migrationLockKey),
}

// migrationKinds maps the migration errors onto this package's.
var migrationKinds = map[error]error{
	pgmigrate.ErrChanged: ErrMigrationChanged,
	pgmigrate.ErrUnknown: ErrSchemaTooNew,
}

func migrationError(err error) error { return pgmigrate.Wrap(err, "pgruntime", migrationKinds) }

// migrations returns the embedded migrations in version order.
func migrations() ([]pgmigrate.Migration, error) {
	ms, err := pgmigrate.Load(migrationFiles, "migrations")
	return ms, migrationError(err)
}

// SchemaVersion is the number of the newest migration of this build.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		return 0
	}
	return pgmigrate.Latest(ms)
}

// migrate applies the missing migrations in one transaction under an
// advisory lock, so replicas starting together migrate once. An applied
// migration whose checksum differs from the embedded file, or one this
// build does not know, stops start-up. A role that may create tables in
// no schema of its search_path (role is its name) is told how to get one.
func migrate(ctx context.Context, pool *pgxpool.Pool, role string) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return connectErr(err, "pgruntime: ", "pgruntime: connect to the database")
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	if _, err := pgmigrate.Apply(ctx, tx, ledger, ms); err != nil {
		return schemaHint(migrationError(err), role)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgruntime: commit migrations: %w", err)
	}
	return nil
}

// bareIdentifier is a role name SQL takes unquoted.
var bareIdentifier = regexp.MustCompile(`^[a-z_][a-z0-9_$]*$`)

// schemaHint adds what to do to a migration error that says the role may
// create in no schema of its search_path: PostgreSQL 15 and later grant
// no CREATE on public, and its bare "permission denied for schema public"
// does not say where the host creates its tables.
func schemaHint(err error, role string) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	denied := pe.Code == "42501" && strings.HasPrefix(pe.Message, "permission denied for schema")
	if !denied && pe.Code != "3F000" { // invalid_schema_name: no schema of the search_path exists
		return err
	}
	ident := role
	if !bareIdentifier.MatchString(role) {
		ident = pgx.Identifier{role}.Sanitize()
	}
	return fmt.Errorf("%w; role %s may not create the journal's tables: the host creates them in the first schema of its search_path that exists, so give the role a schema named after it (CREATE SCHEMA AUTHORIZATION %s), which the default search_path puts first, or grant it CREATE on that schema (see the operator guide, section 7, Connector hosts)", err, role, ident)
}
