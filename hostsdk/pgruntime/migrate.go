package pgruntime

import (
	"context"
	"embed"
	"fmt"

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
// build does not know, stops start-up.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
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
		return migrationError(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgruntime: commit migrations: %w", err)
	}
	return nil
}
