package pgruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

// upT0 is when the version-1 build received its first action.
var upT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func upAction(id string, received time.Duration) journal.Action {
	return journal.Action{ActionID: id, CapabilityID: "echo.say", TenantID: "tenant-1", IdempotencyKey: "idem-" + id,
		InputDigest: aip.DigestBytes([]byte(id)), FenceToken: "fence-" + id, MessageID: "msg-" + id, ReceivedAt: upT0.Add(received)}
}

// journalView is everything a journal reads back.
type journalView struct {
	Actions  []journal.Action
	Receipts []journal.Receipt
	State    map[string]journal.StateValue
	Pending  int
}

var allStatuses = []aip.ActionState{aip.StateReceived, aip.StateRunning, aip.StateCompleted, aip.StateFailed, aip.StateOutcomeUnknown, aip.StateCancelled}

func viewOf(t *testing.T, j *Journal, stateKeys [][2]string) journalView {
	t.Helper()
	ctx := t.Context()
	var v journalView
	var err error
	if v.Actions, err = j.ActionsByStatus(ctx, 1000, allStatuses...); err != nil {
		t.Fatal(err)
	}
	if v.Receipts, err = j.Receipts(ctx, 0, 1000); err != nil {
		t.Fatal(err)
	}
	v.State = map[string]journal.StateValue{}
	for _, k := range stateKeys {
		sv, err := j.State(ctx, k[0], k[1])
		if errors.Is(err, journal.ErrNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		v.State[k[0]+"/"+k[1]] = sv
	}
	if v.Pending, err = j.PendingEvents(ctx); err != nil {
		t.Fatal(err)
	}
	return v
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
	mins := func(n int) time.Duration { return time.Duration(n) * time.Minute }
	var written []journal.Receipt
	finish := func(j *Journal, id string, st aip.ActionState, result string, detail string, at time.Duration) {
		t.Helper()
		var raw json.RawMessage
		if result != "" {
			raw = json.RawMessage(result)
		}
		r, err := j.FinishAction(ctx, id, st, raw, detail, upT0.Add(at))
		must(err)
		if j == old {
			written = append(written, r)
		}
	}
	for i, id := range []string{"act_1", "act_3", "act_4", "act_5", "act_7"} {
		old.v1Begin(t, upAction(id, time.Duration(i)*time.Second))
	}
	old.v1Accept(t, "msg-2", upT0.Add(time.Hour), upT0, upAction("act_2", 10*time.Second))
	old.v1Accept(t, "msg-6", upT0.Add(time.Hour), upT0, upAction("act_6", 11*time.Second))
	must(old.StartAction(ctx, "act_3", upT0.Add(20*time.Second)))
	// Receipt order differs from completion order: act_7 completes last
	// but is the third receipt.
	finish(old, "act_1", aip.StateCompleted, `{"ok": 1,  "text":"é"}`, "", mins(1))
	finish(old, "act_2", aip.StateFailed, "", "provider said \x00no", mins(2))
	finish(old, "act_7", aip.StateCompleted, `{"late":true}`, "", mins(30))
	finish(old, "act_3", aip.StateOutcomeUnknown, "", "timed out", mins(3))
	finish(old, "act_4", aip.StateCancelled, "", "", mins(4))
	if ok, err := old.ClaimMessage(ctx, "msg-extra", upT0.Add(time.Hour), upT0); err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	for i, ev := range []string{`[{"id":"evt_1"}]`, `[ {"id": "evt_2"} ]`} {
		must(old.EnqueueEvents(ctx, journal.OutboxEntry{ID: fmt.Sprintf("obx_%d", i), ChannelID: "webhooks", Events: json.RawMessage(ev), CreatedAt: upT0}))
	}
	claimed, err := old.ClaimEvents(ctx, upT0.Add(time.Minute), time.Minute, 1)
	must(err)
	if len(claimed) != 1 {
		t.Fatalf("claimed %d outbox batches, want 1", len(claimed))
	}
	must(old.RetryEvents(ctx, claimed[0].ID, upT0.Add(mins(5)), "503 from central"))
	stateKeys := [][2]string{{"conn", "act_1"}, {"conn", "act_2"}, {"conn", "act_7"}, {"conn", "act_5"}, {"other", "act_1"}}
	for _, k := range stateKeys {
		rev, err := old.PutState(ctx, k[0], k[1], json.RawMessage(`{"k": "`+k[1]+`"}`), 0)
		must(err)
		if k[0] == "other" {
			_, err = old.PutState(ctx, k[0], k[1], json.RawMessage(`{"again":  true}`), rev)
			must(err)
		}
	}
	other.v1Begin(t, upAction("act_1", 0))
	finish(other, "act_1", aip.StateCompleted, `{}`, "", mins(1))
	other.v1Begin(t, upAction("act_o2", time.Second))

	conn, err := pgx.Connect(ctx, dbURL)
	must(err)
	defer conn.Close(context.Background())
	before := viewOf(t, old, stateKeys)
	beforeOther := viewOf(t, other, nil)
	wantRows := runtimeRows(t, conn)
	oldLedger := ledgerRows(t, conn)
	if diff := cmp.Diff(written, before.Receipts); diff != "" {
		t.Fatalf("version 1 reads back other receipts than it wrote (-written +read):\n%s", diff)
	}
	must(journal.VerifyChain("", before.Receipts))
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
		if err != nil {
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
	gotRows := runtimeRows(t, conn)
	if h := gotRows["aip_runtime_prune_horizons"]; len(h) != 0 {
		t.Fatalf("prune horizons after the upgrade: %v, want none", h)
	}
	delete(gotRows, "aip_runtime_prune_horizons")
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Fatalf("rows changed by the upgrade (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(before, viewOf(t, j, stateKeys)); diff != "" {
		t.Fatalf("records read back differently after the upgrade (-before +after):\n%s", diff)
	}
	if h, err := j.PruneHorizon(ctx); err != nil || !h.IsZero() {
		t.Fatalf("prune horizon after the upgrade: %v, %v; want zero", h, err)
	}

	// Pruning the actions written before the migration: the four terminal
	// ones completed before the cutoff, oldest completed first; act_5
	// (received), act_6 (running) and act_7 (completed after it) stay.
	cutoff := upT0.Add(mins(10))
	if n, err := j.PruneActions(ctx, cutoff, 2, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions(limit 2) = %d, %v; want 2", n, err)
	}
	if h, err := j.PruneHorizon(ctx); err != nil || !h.Equal(upT0.Add(mins(2))) {
		t.Fatalf("prune horizon after pruning act_1 and act_2: %v, %v; want %v", h, err, upT0.Add(mins(2)))
	}
	if n, err := j.PruneActions(ctx, cutoff, 100, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions = %d, %v; want 2 (act_3, act_4)", n, err)
	}
	horizon := upT0.Add(mins(4))
	if h, err := j.PruneHorizon(ctx); err != nil || !h.Equal(horizon) {
		t.Fatalf("prune horizon: %v, %v; want %v", h, err, horizon)
	}
	after := viewOf(t, j, stateKeys)
	var keptIDs []string
	for _, a := range after.Actions {
		keptIDs = append(keptIDs, a.ActionID)
	}
	if want := []string{"act_5", "act_7", "act_6"}; !slices.Equal(keptIDs, want) {
		t.Fatalf("actions kept: %v, want %v", keptIDs, want)
	}
	for _, a := range after.Actions {
		i := slices.IndexFunc(before.Actions, func(b journal.Action) bool { return b.ActionID == a.ActionID })
		if diff := cmp.Diff(before.Actions[i], a); diff != "" {
			t.Fatalf("kept action %s changed (-before +after):\n%s", a.ActionID, diff)
		}
	}
	if _, ok := after.State["conn/act_1"]; ok {
		t.Fatal("the state of pruned action act_1 was kept")
	}
	for _, k := range []string{"conn/act_5", "conn/act_7", "other/act_1"} {
		if !cmp.Equal(after.State[k], before.State[k]) {
			t.Fatalf("state %s: %+v, want %+v", k, after.State[k], before.State[k])
		}
	}
	// The chain keeps act_7's receipt (3) and what follows it.
	if diff := cmp.Diff(written[2:], after.Receipts); diff != "" {
		t.Fatalf("receipts after pruning (-want +got):\n%s", diff)
	}
	must(journal.VerifyChain(written[1].Hash, after.Receipts))

	// The horizon refuses the pruned actions, and rolls the claim back.
	again := upAction("act_1", 0)
	again.AssignedAt = upT0
	if _, _, err := j.BeginAction(ctx, again); !errors.Is(err, journal.ErrPruned) {
		t.Fatalf("BeginAction of pruned act_1: %v, want ErrPruned", err)
	}
	again = upAction("act_2", 0)
	again.AssignedAt = horizon
	if _, err := j.AcceptAction(ctx, "msg-new", upT0.Add(2*time.Hour), upT0.Add(time.Hour), again); !errors.Is(err, journal.ErrPruned) {
		t.Fatalf("AcceptAction of pruned act_2 assigned at the horizon: %v, want ErrPruned", err)
	}
	if ok, err := j.ClaimMessage(ctx, "msg-new", upT0.Add(2*time.Hour), upT0.Add(time.Hour)); err != nil || !ok {
		t.Fatalf("the refused AcceptAction kept its message claim: ClaimMessage = %v, %v", ok, err)
	}
	// Actions journaled before the migration are found, not refused.
	if got, created, err := j.BeginAction(ctx, upAction("act_5", 0)); err != nil || created || got.Status != aip.StateReceived {
		t.Fatalf("BeginAction of act_5 journaled before the upgrade: %+v, created %v, %v", got, created, err)
	}
	// A new action assigned after the horizon is journaled, and the
	// running action from before the upgrade finishes: the chain goes on.
	fresh := upAction("act_8", time.Hour)
	fresh.AssignedAt = horizon.Add(time.Microsecond)
	if _, created, err := j.BeginAction(ctx, fresh); err != nil || !created {
		t.Fatalf("BeginAction of a new action assigned after the horizon: created %v, %v", created, err)
	}
	r, err := j.FinishAction(ctx, "act_6", aip.StateCompleted, json.RawMessage(`{}`), "", upT0.Add(time.Hour))
	must(err)
	if r.Seq != written[len(written)-1].Seq+1 || r.PrevHash != written[len(written)-1].Hash {
		t.Fatalf("receipt after the upgrade: seq %d prev %s; want %d after %s", r.Seq, r.PrevHash, written[len(written)-1].Seq+1, written[len(written)-1].Hash)
	}
	rs, err := j.Receipts(ctx, 0, 100)
	must(err)
	must(journal.VerifyChain(rs[0].PrevHash, rs))

	// The other namespace is untouched, and its replica, still on the
	// older build, goes on writing.
	if diff := cmp.Diff(beforeOther, viewOf(t, other, nil)); diff != "" {
		t.Fatalf("the other namespace changed (-before +after):\n%s", diff)
	}
	other.v1Begin(t, upAction("act_o3", time.Hour))
	finish(other, "act_o3", aip.StateCompleted, `{}`, "", time.Hour)
	ors, err := other.Receipts(ctx, 0, 100)
	must(err)
	if len(ors) != 2 {
		t.Fatalf("the older build's replica has %d receipts, want 2", len(ors))
	}
	must(journal.VerifyChain("", ors))
}
