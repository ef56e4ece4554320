package pgruntime

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationLockKey is the advisory lock that serialises migrations of the
// runtime schema ("aiprunt1").
const migrationLockKey int64 = 0x61697072756e7431

type migration struct {
	Version  int
	File     string // e.g. 0001_runtime.sql
	SQL      string
	Checksum string // sha256: + hex of the file
}

// migrations returns the embedded migrations in version order.
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		name := e.Name()
		num, _, ok := strings.Cut(name, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 || !strings.HasSuffix(name, ".sql") {
			return nil, fmt.Errorf("pgruntime: migration file %s is not named NNNN_name.sql", name)
		}
		b, err := migrationFiles.ReadFile(path.Join("migrations", name))
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		out = append(out, migration{Version: v, File: name, SQL: string(b), Checksum: "sha256:" + hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := range out {
		if out[i].Version != i+1 {
			return nil, fmt.Errorf("pgruntime: migrations are not numbered 1, 2, 3, ...: %s", out[i].File)
		}
	}
	return out, nil
}

// SchemaVersion is the number of the newest migration of this build.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
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
		return fmt.Errorf("pgruntime: connect to the database: %w", err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	if err := migrateTx(ctx, tx, ms); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgruntime: commit migrations: %w", err)
	}
	return nil
}

func migrateTx(ctx context.Context, tx pgx.Tx, ms []migration) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrationLockKey); err != nil {
		return fmt.Errorf("pgruntime: take the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS aip_runtime_schema_migrations (
		version    integer     PRIMARY KEY,
		file       text        NOT NULL,
		checksum   text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("pgruntime: create the migrations table: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT version, file, checksum FROM aip_runtime_schema_migrations ORDER BY version`)
	if err != nil {
		return fmt.Errorf("pgruntime: read applied migrations: %w", err)
	}
	applied, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Version  int
		File     string
		Checksum string
	}])
	if err != nil {
		return fmt.Errorf("pgruntime: read applied migrations: %w", err)
	}
	done := make(map[int]bool, len(applied))
	for _, a := range applied {
		if a.Version < 1 {
			return fmt.Errorf("pgruntime: aip_runtime_schema_migrations records version %d (%s), which no build writes; remove that row", a.Version, a.File)
		}
		if a.Version > len(ms) {
			return fmt.Errorf("%w: the database has migration %s (version %d) but this build knows migrations up to %d; run a newer aipfleet build against this database",
				ErrSchemaTooNew, a.File, a.Version, len(ms))
		}
		m := ms[a.Version-1]
		if a.Checksum != m.Checksum {
			return fmt.Errorf("%w: migration %s was applied with checksum %s but this build's file has %s; applied migrations are immutable: restore the original file and add a new migration instead",
				ErrMigrationChanged, m.File, a.Checksum, m.Checksum)
		}
		done[a.Version] = true
	}
	for _, m := range ms {
		if done[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("pgruntime: apply migration %s: %w", m.File, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO aip_runtime_schema_migrations (version, file, checksum) VALUES ($1, $2, $3)`,
			m.Version, m.File, m.Checksum); err != nil {
			return fmt.Errorf("pgruntime: record migration %s: %w", m.File, err)
		}
	}
	return nil
}
