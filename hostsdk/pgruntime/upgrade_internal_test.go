package pgruntime

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/journal/journaltest"
	"github.com/aipfleet/aipfleet/internal/pgmigrate"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// openBuild1 opens the journal of ns as the build of schema version 1 did:
// it applies migration 0001 only (through the same ledger) and initialises
// the namespace as Open does. Actions are created with v1Begin and
// v1Accept; every other method is unchanged since that build.
func openBuild1(t *testing.T, dbURL, ns string) *Journal {
	t.Helper()
	ctx := t.Context()
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgmigrate.Apply(ctx, tx, ledger, ms[:1]); err != nil {
		t.Fatalf("install schema version 1: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO aip_runtime_receipt_heads (journal_ns, seq, hash, prev_hash) VALUES ($1, 0, '', '')
		ON CONFLICT (journal_ns) DO NOTHING`, ns); err != nil {
		t.Fatal(err)
	}
	j := &Journal{pool: pool, ns: ns}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// v1Begin is BeginAction's insert in the build of schema version 1.
func (j *Journal) v1Begin(t *testing.T, a journal.Action) {
	t.Helper()
	tag, err := j.pool.Exec(t.Context(), `INSERT INTO aip_runtime_actions (journal_ns, action_id, capability_id,
		tenant_id, idempotency_key, input_digest, fence_token, message_id, status, result, detail,
		received_at, started_at, updated_at, completed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'received', NULL, '', $9, NULL, $9, NULL)
		ON CONFLICT (journal_ns, action_id) DO NOTHING`,
		j.ns, a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey, a.InputDigest, a.FenceToken,
		a.MessageID, journal.Micro(a.ReceivedAt))
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("begin action %s as version 1: %v, %d rows", a.ActionID, err, tag.RowsAffected())
	}
}

// v1Accept is AcceptAction's statement in the build of schema version 1.
func (j *Journal) v1Accept(t *testing.T, messageID string, expires, now time.Time, a journal.Action) {
	t.Helper()
	var claimed, created bool
	err := j.pool.QueryRow(t.Context(), `WITH claim AS (
			INSERT INTO aip_runtime_messages (journal_ns, message_id, expires_at) VALUES ($1, $2, $3)
			ON CONFLICT (journal_ns, message_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
			WHERE aip_runtime_messages.expires_at <= $4
			RETURNING 1
		), ins AS (
			INSERT INTO aip_runtime_actions (journal_ns, action_id, capability_id, tenant_id,
				idempotency_key, input_digest, fence_token, message_id, status, result, detail,
				received_at, started_at, updated_at, completed_at)
			SELECT $1, $5, $6, $7, $8, $9, $10, $11, 'running', NULL, '', $12, $12, $12, NULL
			WHERE EXISTS (SELECT 1 FROM claim)
			ON CONFLICT (journal_ns, action_id) DO NOTHING
			RETURNING 1
		)
		SELECT EXISTS (SELECT 1 FROM claim), EXISTS (SELECT 1 FROM ins)`,
		j.ns, messageID, journal.Micro(expires), journal.Micro(now),
		a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey, a.InputDigest, a.FenceToken,
		a.MessageID, journal.Micro(a.ReceivedAt)).Scan(&claimed, &created)
	if err != nil || !claimed || !created {
		t.Fatalf("accept action %s as version 1: claimed %v, created %v, %v", a.ActionID, claimed, created, err)
	}
}

// runtimeRows returns every row of the journal's tables but the
// migrations table, as JSON text (json columns verbatim), sorted.
func runtimeRows(t *testing.T, conn *pgx.Conn) map[string][]string {
	t.Helper()
	ctx := t.Context()
	rows, err := conn.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_name LIKE 'aip\_runtime\_%' AND table_name <> 'aip_runtime_schema_migrations'`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, tbl := range tables {
		rows, err := conn.Query(ctx, `SELECT row_to_json(t)::text FROM `+pgx.Identifier{tbl}.Sanitize()+` t`)
		if err != nil {
			t.Fatal(err)
		}
		if out[tbl], err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		slices.Sort(out[tbl])
	}
	return out
}

func ledgerRows(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(t.Context(), `SELECT format('%s %s %s %s', version, file, checksum, applied_at) FROM aip_runtime_schema_migrations ORDER BY version`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestUpgradeFromVersion1KeepsData: a database the build of schema version
// 1 populated (two replicas' namespaces: actions in every status with
// their receipts, message claims, outbox batches, state) is opened by this
// build by two replicas at once and then once more: migration 0002 is
// applied once, no row changes and every record reads back as written.
// Pruning then works on the actions written before the migration: it
// deletes the old terminal ones with their per-action state, keeps the
// others, raises the horizon, which refuses the pruned actions (rolling
// back their message claim) and accepts new ones; the receipt chain
// verifies from its oldest kept receipt and goes on. A replica still
// running the older build keeps working on the migrated schema.
func TestUpgradeFromVersion1KeepsData(t *testing.T) {
	ctx := t.Context()
	dbURL := pgtest.NewDatabase(t)
	const ns, otherNS = "crepl_upgraded", "crepl_still_old"
	old := openBuild1(t, dbURL, ns)
	other := openBuild1(t, dbURL, otherNS)

	// Version 1 writes.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	f := journaltest.UpgradeData(t, old, journaltest.UpgradeWriter{Begin: old.v1Begin, Accept: old.v1Accept})
	finishOther := func(id string, at time.Duration) journal.Receipt {
		t.Helper()
		r, err := other.FinishAction(ctx, id, aip.StateCompleted, json.RawMessage(`{}`), "", journaltest.UpgradeT0.Add(at))
		must(err)
		return r
	}
	other.v1Begin(t, journaltest.UpgradeAction("act_1", 0))
	finishOther("act_1", time.Minute)
	other.v1Begin(t, journaltest.UpgradeAction("act_o2", time.Second))

	conn, err := pgx.Connect(ctx, dbURL)
	must(err)
	defer conn.Close(context.Background())
	beforeOther := journaltest.ReadView(t, other, nil)
	wantRows := runtimeRows(t, conn)
	oldLedger := ledgerRows(t, conn)
	must(old.Close())

	// The upgrade: two replicas of this build start at once, then one
	// restarts; the other namespace's replica still runs the older build.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() {
			j, err := Open(ctx, Config{DatabaseURL: dbURL, Namespace: ns, MaxConns: 2})
			if err == nil {
				err = j.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		// Both migrate; the namespace is one journal's at a time, so the
		// one that finds the other holding it is refused (ErrLocked).
		if err != nil && !(errors.Is(err, ErrLocked) && errs[1-i] == nil) {
			t.Fatalf("replica %d opening the version-1 database: %v", i, err)
		}
	}
	j, err := Open(ctx, Config{DatabaseURL: dbURL, Namespace: ns})
	must(err)
	defer j.Close()
	gotLedger := ledgerRows(t, conn)
	if len(gotLedger) != SchemaVersion() || gotLedger[0] != oldLedger[0] {
		t.Fatalf("migrations recorded after the upgrade:\n%s\nwant version 1 unchanged (%s) and each later one once", strings.Join(gotLedger, "\n"), oldLedger[0])
	}
	journaltest.CheckRowsKept(t, wantRows, runtimeRows(t, conn), "aip_runtime_prune_horizons")
	f.CheckUnchanged(t, j)

	// Pruning the actions written before the migration, and the horizon
	// and receipt chain after it.
	f.CheckPruned(t, j, nil)

	// The other namespace is untouched, and its replica, still on the
	// older build, goes on writing.
	if diff := cmp.Diff(beforeOther, journaltest.ReadView(t, other, nil)); diff != "" {
		t.Fatalf("the other namespace changed (-before +after):\n%s", diff)
	}
	other.v1Begin(t, journaltest.UpgradeAction("act_o3", time.Hour))
	finishOther("act_o3", time.Hour)
	ors, err := other.Receipts(ctx, 0, 100)
	must(err)
	if len(ors) != 2 {
		t.Fatalf("the older build's replica has %d receipts, want 2", len(ors))
	}
	must(journal.VerifyChain("", ors))
}
