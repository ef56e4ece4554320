package sqliteruntime_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// fileRows returns every row of every table of the journal file in dir,
// as text, by table.
func fileRows(t *testing.T, dir string) map[string][]string {
	t.Helper()
	db := rawDB(t, dir)
	defer db.Close()
	rows, err := db.Query(`SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, tbl := range tables {
		rows, err := db.Query(`SELECT * FROM "` + tbl + `"`)
		if err != nil {
			t.Fatal(err)
		}
		cols, err := rows.Columns()
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			line := ""
			for i, v := range vals {
				if b, ok := v.([]byte); ok {
					v = string(b)
				}
				line += fmt.Sprintf("%s=%q ", cols[i], fmt.Sprint(v))
			}
			out[tbl] = append(out[tbl], line)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		slices.Sort(out[tbl])
	}
	return out
}

// TestUpgradesSchemaVersion1: a journal of schema version 1 holding actions
// in every status, receipts in an order unlike completion, message claims,
// leased and retried outbox batches and state is upgraded in place when
// opened (two opens at once: one upgrades, the other is refused by the
// directory lock; opening again changes nothing): every row stays, every
// record reads back the same, and pruning works on the old actions — the
// horizon refuses them (also after a restart), the receipt chain verifies
// from its oldest kept receipt and goes on.
func TestUpgradesSchemaVersion1(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	// Version 1's records. Version 2 changed none of the statements that
	// write them, so this build writes them and the file is then made a
	// version 1 file (without what version 2 added).
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir})
	must(err)
	f := journaltest.UpgradeData(t, j, journaltest.UpgradeWriter{})
	must(j.Close())
	db := rawDB(t, dir)
	for _, q := range []string{"DROP INDEX actions_by_completion", "DROP TABLE prune_horizon", "PRAGMA user_version = 1"} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	wantRows := fileRows(t, dir)

	// Two opens at once: one upgrades, the other finds the directory
	// locked; then a restart opens the upgraded file.
	var wg sync.WaitGroup
	opened := make([]*sqliteruntime.Journal, 2)
	errs := make([]error, 2)
	for i := range opened {
		wg.Go(func() { opened[i], errs[i] = sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: dir}) })
	}
	wg.Wait()
	var winners int
	for i, err := range errs {
		switch {
		case err == nil:
			winners++
			must(opened[i].Close())
		case !errors.Is(err, sqliteruntime.ErrLocked):
			t.Fatalf("open %d of the version 1 journal: %v", i, err)
		}
	}
	if winners != 1 {
		t.Fatalf("%d of two simultaneous opens of the version 1 journal succeeded, want 1", winners)
	}
	j = open(t, sqliteruntime.Config{Dir: dir})
	journaltest.CheckRowsKept(t, wantRows, fileRows(t, dir), "prune_horizon")
	f.CheckUnchanged(t, j)

	// Pruning the old actions; the horizon refuses them also after a
	// restart.
	restarted := f.CheckPruned(t, j, func(t *testing.T, _ journal.Journal) journal.Journal {
		return open(t, sqliteruntime.Config{Dir: dir})
	})
	must(restarted.Close())

	db = rawDB(t, dir)
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != sqliteruntime.SchemaVersion {
		t.Fatalf("user_version after the upgrade = %d, %v; want %d", v, err, sqliteruntime.SchemaVersion)
	}
}
