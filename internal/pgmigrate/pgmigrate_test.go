package pgmigrate_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/internal/pgmigrate"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

func files(names ...string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for _, n := range names {
		fsys["m/"+n] = &fstest.MapFile{Data: []byte("CREATE TABLE t_" + strings.TrimSuffix(n, ".sql") + " (id int);")}
	}
	return fsys
}

func TestLoad(t *testing.T) {
	ms, err := pgmigrate.Load(files("0002_b.sql", "0001_a.sql", "0003_c_2.sql"), "m")
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || pgmigrate.Latest(ms) != 3 {
		t.Fatalf("loaded %+v, want versions 1..3", ms)
	}
	for i, want := range []string{"0001_a.sql", "0002_b.sql", "0003_c_2.sql"} {
		m := ms[i]
		if m.Version != i+1 || m.File != want || m.SQL == "" || len(m.Checksum) != 64 {
			t.Errorf("migration %d = %+v, want version %d file %s", i, m, i+1, want)
		}
		if m != pgmigrate.New(m.Version, m.Name, m.SQL) {
			t.Errorf("migration %d differs from New of its parts", i)
		}
	}
	if pgmigrate.New(1, "a", "SELECT 1").Checksum == pgmigrate.New(1, "a", "SELECT 1 ").Checksum {
		t.Error("a changed text kept its checksum")
	}
	if ms, err := pgmigrate.Load(fstest.MapFS{"m": &fstest.MapFile{Mode: 0o755 | 1<<31}}, "m"); err != nil || len(ms) != 0 || pgmigrate.Latest(ms) != 0 {
		t.Errorf("Load of an empty directory = %v, %v; want none", ms, err)
	}

	for name, c := range map[string]struct {
		fsys fstest.MapFS
		kind error
		file string
	}{
		"gap":           {files("0001_a.sql", "0003_c.sql"), pgmigrate.ErrGap, "0003_c.sql"},
		"repeat":        {files("0001_a.sql", "0001_b.sql"), pgmigrate.ErrGap, "0001_b.sql"},
		"no first":      {files("0002_b.sql"), pgmigrate.ErrGap, "0002_b.sql"},
		"zero":          {files("0000_z.sql", "0001_a.sql"), pgmigrate.ErrGap, "0000_z.sql"},
		"three digits":  {files("001_a.sql"), pgmigrate.ErrFileName, "001_a.sql"},
		"upper case":    {files("0001_A.sql"), pgmigrate.ErrFileName, "0001_A.sql"},
		"not sql":       {files("0001_a.txt"), pgmigrate.ErrFileName, "0001_a.txt"},
		"no name":       {files("0001.sql"), pgmigrate.ErrFileName, "0001.sql"},
		"sub-directory": {fstest.MapFS{"m/0001_a.sql/x": &fstest.MapFile{}}, pgmigrate.ErrFileName, "0001_a.sql"},
	} {
		_, err := pgmigrate.Load(c.fsys, "m")
		var e *pgmigrate.Error
		if !errors.Is(err, c.kind) || !errors.As(err, &e) || e.Migration != c.file || !strings.Contains(err.Error(), c.file) {
			t.Errorf("%s: Load = %v, want %v naming %s", name, err, c.kind, c.file)
		}
	}
	if _, err := pgmigrate.Load(fstest.MapFS{}, "missing"); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Load of a missing directory = %v", err)
	}
}

func TestWrap(t *testing.T) {
	errMine := errors.New("mypkg: edited")
	kinds := map[error]error{pgmigrate.ErrChanged: errMine}
	cause := errors.New("boom")
	e := &pgmigrate.Error{Kind: pgmigrate.ErrChanged, Migration: "0001_a.sql", Detail: "migration 0001_a.sql changed"}
	err := pgmigrate.Wrap(e, "mypkg", kinds)
	var got *pgmigrate.Error
	if err.Error() != "mypkg: edited: migration 0001_a.sql changed" || !errors.Is(err, errMine) || !errors.Is(err, pgmigrate.ErrChanged) || !errors.As(err, &got) || got != e {
		t.Errorf("Wrap of a mapped kind = %q", err)
	}
	err = pgmigrate.Wrap(&pgmigrate.Error{Kind: pgmigrate.ErrUnknown, Detail: "d", Err: cause}, "mypkg", kinds)
	if err.Error() != "mypkg: d: boom" || !errors.Is(err, pgmigrate.ErrUnknown) || !errors.Is(err, cause) || errors.Is(err, errMine) {
		t.Errorf("Wrap of an unmapped kind = %q", err)
	}
	err = pgmigrate.Wrap(&pgmigrate.Error{Detail: "apply migration 0001_a.sql", Err: cause}, "mypkg", kinds)
	if err.Error() != "mypkg: apply migration 0001_a.sql: boom" || !errors.Is(err, cause) {
		t.Errorf("Wrap of a database error = %q", err)
	}
	if pgmigrate.Wrap(nil, "mypkg", kinds) != nil || pgmigrate.Wrap(cause, "mypkg", kinds) != cause {
		t.Error("Wrap changed nil or a foreign error")
	}
	if got := (&pgmigrate.Error{Kind: pgmigrate.ErrGap, Detail: "d"}).Error(); got != pgmigrate.ErrGap.Error()+": d" {
		t.Errorf("Error() = %q", got)
	}
}

// ledgers are the two table shapes the backends use.
var ledgers = map[string]pgmigrate.Ledger{
	"file column": {
		Table:          "test_schema_migrations",
		Create:         `CREATE TABLE IF NOT EXISTS test_schema_migrations (version integer PRIMARY KEY, file text NOT NULL, checksum text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())`,
		NameColumn:     "file",
		ChecksumPrefix: "sha256:",
		Lock:           pgmigrate.Lock64(0x7465737431),
	},
	"name column": {
		Table: "test_ns.schema_migrations",
		Create: `CREATE SCHEMA IF NOT EXISTS test_ns;
			CREATE TABLE IF NOT EXISTS test_ns.schema_migrations (version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL, applied_at_ms bigint NOT NULL)`,
		NameColumn:      "name",
		AppliedAtColumn: "applied_at_ms",
		Now:             func() any { return int64(42) },
		Lock:            pgmigrate.Lock32(0x74657374, 2),
	},
}

func apply(t *testing.T, pool *pgxpool.Pool, l pgmigrate.Ledger, ms []pgmigrate.Migration) (int, error) {
	t.Helper()
	ctx := t.Context()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	n, err := pgmigrate.Apply(ctx, tx, l, ms)
	if err != nil {
		return n, err
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return n, nil
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func wantKind(t *testing.T, what string, err, kind error, names ...string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s = %v, want %v", what, err, kind)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Fatalf("%s = %q, does not name %s", what, err, n)
		}
	}
}

func TestApplyAndVerify(t *testing.T) {
	ms, err := pgmigrate.Load(files("0001_a.sql", "0002_b.sql", "0003_c.sql"), "m")
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range ledgers {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			pool := pgtest.NewPool(t)
			label := func(m pgmigrate.Migration) string {
				if l.NameColumn == "file" {
					return m.File
				}
				return m.Name
			}

			wantKind(t, "Verify before install", pgmigrate.Verify(ctx, pool, l, ms), pgmigrate.ErrNotInstalled, l.Table)

			// An older build installed the first migration.
			if n, err := apply(t, pool, l, ms[:1]); err != nil || n != 1 {
				t.Fatalf("install version 1: %d, %v", n, err)
			}
			if err := pgmigrate.Verify(ctx, pool, l, ms[:1]); err != nil {
				t.Fatalf("Verify at version 1 by its build: %v", err)
			}
			wantKind(t, "Verify of version 1 by a version 3 build", pgmigrate.Verify(ctx, pool, l, ms), pgmigrate.ErrTooOld, "older", "0002_b.sql")

			// The upgrade applies the rest; re-applying is a no-op.
			if n, err := apply(t, pool, l, ms); err != nil || n != 2 {
				t.Fatalf("upgrade: applied %d, %v; want 2", n, err)
			}
			if n, err := apply(t, pool, l, ms); err != nil || n != 0 {
				t.Fatalf("re-apply: applied %d, %v; want 0", n, err)
			}
			if err := pgmigrate.Verify(ctx, pool, l, ms); err != nil {
				t.Fatalf("Verify after the upgrade: %v", err)
			}
			rows, err := pool.Query(ctx, "SELECT version, "+l.NameColumn+", checksum FROM "+l.Table+" ORDER BY version")
			if err != nil {
				t.Fatal(err)
			}
			recs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
				V    int
				N, C string
			}])
			if err != nil || len(recs) != 3 {
				t.Fatalf("recorded %v, %v", recs, err)
			}
			for i, r := range recs {
				if r.V != i+1 || r.N != label(ms[i]) || r.C != l.ChecksumPrefix+ms[i].Checksum {
					t.Errorf("record %d = %+v, want %d %s %s%s", i, r, i+1, label(ms[i]), l.ChecksumPrefix, ms[i].Checksum)
				}
			}
			for _, tbl := range []string{"t_0001_a", "t_0002_b", "t_0003_c"} {
				exec(t, pool, "SELECT count(*) FROM "+tbl)
			}
			if l.AppliedAtColumn != "" {
				var at int64
				if err := pool.QueryRow(ctx, "SELECT max("+l.AppliedAtColumn+") FROM "+l.Table).Scan(&at); err != nil || at != 42 {
					t.Errorf("applied at %d, %v; want 42 from Now", at, err)
				}
			}

			// A newer build applied a fourth migration.
			future := pgmigrate.New(4, "future", "SELECT 4")
			exec(t, pool, "INSERT INTO "+l.Table+" (version, "+l.NameColumn+", checksum"+map[bool]string{true: ", " + l.AppliedAtColumn}[l.AppliedAtColumn != ""]+") VALUES (4, $1, 'x'"+map[bool]string{true: ", 0"}[l.AppliedAtColumn != ""]+")", label(future))
			_, err = apply(t, pool, l, ms)
			wantKind(t, "Apply on a newer database", err, pgmigrate.ErrUnknown, "0004_future")
			wantKind(t, "Verify of a newer database", pgmigrate.Verify(ctx, pool, l, ms), pgmigrate.ErrTooNew, "newer", "0004_future")
			if _, err := apply(t, pool, l, ms[:2]); !errors.Is(err, pgmigrate.ErrUnknown) || !strings.Contains(err.Error(), "0003_c") {
				t.Fatalf("Apply by a version 2 build = %v, want ErrUnknown naming 0003_c", err)
			}
			exec(t, pool, "DELETE FROM "+l.Table+" WHERE version = 4")

			// An applied migration was edited.
			edited := append([]pgmigrate.Migration(nil), ms...)
			edited[1] = pgmigrate.New(2, "b", ms[1].SQL+" -- edited")
			_, err = apply(t, pool, l, edited)
			wantKind(t, "Apply with an edited migration", err, pgmigrate.ErrChanged, "0002_b.sql", ms[1].Checksum, edited[1].Checksum)
			wantKind(t, "Verify with an edited migration", pgmigrate.Verify(ctx, pool, l, edited), pgmigrate.ErrChanged, "0002_b.sql")

			// The table skips a version this build has.
			exec(t, pool, "DELETE FROM "+l.Table+" WHERE version = 2")
			_, err = apply(t, pool, l, ms)
			wantKind(t, "Apply on a table with a gap", err, pgmigrate.ErrRecordGap, "0003_c")
			wantKind(t, "Verify of a table with a gap", pgmigrate.Verify(ctx, pool, l, ms), pgmigrate.ErrRecordGap, "0003_c")
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+l.Table).Scan(&n); err != nil || n != 2 {
				t.Fatalf("a refused Apply changed the table: %d rows, %v", n, err)
			}

			// A migration that fails is not recorded and nothing of it stays.
			bad := append(append([]pgmigrate.Migration(nil), ms[:1]...), pgmigrate.New(2, "bad", "CREATE TABLE t_bad (id int); SELECT no_such_column FROM t_bad"))
			exec(t, pool, "DELETE FROM "+l.Table+" WHERE version > 1")
			_, err = apply(t, pool, l, bad)
			var e *pgmigrate.Error
			if !errors.As(err, &e) || e.Kind != nil || e.Migration != "0002_bad.sql" || !strings.Contains(err.Error(), "apply migration 0002_bad.sql") {
				t.Fatalf("Apply of a failing migration = %v", err)
			}
			var exists bool
			if err := pool.QueryRow(ctx, `SELECT to_regclass('t_bad') IS NOT NULL`).Scan(&exists); err != nil || exists {
				t.Fatalf("the failed migration left t_bad: %v, %v", exists, err)
			}
		})
	}
}

// TestConcurrentApply: appliers of the same ledger serialise on its lock
// and each migration is applied once.
func TestConcurrentApply(t *testing.T) {
	ms, err := pgmigrate.Load(files("0001_a.sql", "0002_b.sql"), "m")
	if err != nil {
		t.Fatal(err)
	}
	l := ledgers["file column"]
	pool := pgtest.NewPool(t)
	type result struct {
		n   int
		err error
	}
	results := make(chan result, 4)
	for range 4 {
		go func() {
			ctx := context.Background()
			tx, err := pool.Begin(ctx)
			if err != nil {
				results <- result{err: err}
				return
			}
			defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
			n, err := pgmigrate.Apply(ctx, tx, l, ms)
			if err == nil {
				err = tx.Commit(ctx)
			}
			results <- result{n, err}
		}()
	}
	total := 0
	for range 4 {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		total += r.n
	}
	if total != len(ms) {
		t.Fatalf("applied %d migrations in all, want %d", total, len(ms))
	}
}

func TestInvalidLedger(t *testing.T) {
	pool := pgtest.NewPool(t)
	good := ledgers["name column"]
	for name, mod := range map[string]func(*pgmigrate.Ledger){
		"no table":        func(l *pgmigrate.Ledger) { l.Table = "" },
		"bad name column": func(l *pgmigrate.Ledger) { l.NameColumn = "label" },
		"now without col": func(l *pgmigrate.Ledger) { l.AppliedAtColumn = "" },
		"no lock":         func(l *pgmigrate.Ledger) { l.Lock = pgmigrate.Lock{} },
	} {
		l := good
		mod(&l)
		if _, err := apply(t, pool, l, nil); err == nil || !strings.Contains(err.Error(), "Ledger") {
			t.Errorf("%s: Apply = %v, want an error naming the Ledger field", name, err)
		}
		if err := pgmigrate.Verify(t.Context(), pool, l, nil); err == nil || !strings.Contains(err.Error(), "Ledger") {
			t.Errorf("%s: Verify = %v, want an error naming the Ledger field", name, err)
		}
	}
}

// TestApplyEndsAnAbandonedMigration: a migration's transaction, which
// holds the lock and its tables' exclusive locks, gets the idle timeout of
// pgsession when its session has none, for the transaction only (a
// pooler's next client of the server session gets none of it); a value
// the database sets is kept. Before, a migrator cut off mid-way held them
// until the server's TCP noticed.
func TestApplyEndsAnAbandonedMigration(t *testing.T) {
	ms, err := pgmigrate.Load(files("0001_a.sql"), "m")
	if err != nil {
		t.Fatal(err)
	}
	pool := pgtest.NewPool(t)
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { conn.Release() }()
	show := func(q pgmigrate.Querier) string {
		t.Helper()
		var v string
		if err := q.QueryRow(ctx, "SHOW idle_in_transaction_session_timeout").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	// A migration commits durably whatever the session's
	// synchronous_commit, and leaves the session's own value as it was.
	if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
		t.Fatal(err)
	}
	commits := func(q pgmigrate.Querier) string {
		t.Helper()
		var v string
		if err := q.QueryRow(ctx, "SHOW synchronous_commit").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	migrate := func() (during string) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
		if _, err := pgmigrate.Apply(ctx, tx, ledgers["file column"], ms); err != nil {
			t.Fatal(err)
		}
		during = show(tx)
		if v := commits(tx); v != "local" {
			t.Errorf("the migration's transaction shows synchronous_commit %q, want local", v)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return during
	}
	if v := migrate(); v != "1min" {
		t.Errorf("the migration's transaction shows idle_in_transaction_session_timeout %q, want 1min", v)
	}
	if v := show(conn); v != "0" {
		t.Errorf("after the migration the session shows %q, want 0 (its own)", v)
	}
	if v := commits(conn); v != "off" {
		t.Errorf("after the migration the session shows synchronous_commit %q, want off (its own)", v)
	}
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET idle_in_transaction_session_timeout = '7s'")
	pool.Reset() // new sessions read the database's setting
	conn.Release()
	if conn, err = pool.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if v := migrate(); v != "7s" {
		t.Errorf("the migration's transaction, in a database that sets 7s, shows %q", v)
	}
}
