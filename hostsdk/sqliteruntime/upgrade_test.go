package sqliteruntime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

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

var upStateKeys = [][2]string{{"conn", "act_1"}, {"conn", "act_2"}, {"conn", "act_7"}, {"conn", "act_5"}, {"other", "act_1"}}

func viewOf(t *testing.T, j journal.Journal) journalView {
	t.Helper()
	ctx := t.Context()
	var v journalView
	var err error
	all := []aip.ActionState{aip.StateReceived, aip.StateRunning, aip.StateCompleted, aip.StateFailed, aip.StateOutcomeUnknown, aip.StateCancelled}
	if v.Actions, err = j.ActionsByStatus(ctx, 1000, all...); err != nil {
		t.Fatal(err)
	}
	if v.Receipts, err = j.Receipts(ctx, 0, 1000); err != nil {
		t.Fatal(err)
	}
	v.State = map[string]journal.StateValue{}
	for _, k := range upStateKeys {
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
	mins := func(n int) time.Duration { return time.Duration(n) * time.Minute }
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
	for i, id := range []string{"act_1", "act_3", "act_4", "act_5", "act_7"} {
		if _, created, err := j.BeginAction(ctx, upAction(id, time.Duration(i)*time.Second)); err != nil || !created {
			t.Fatalf("BeginAction(%s): %v, %v", id, created, err)
		}
	}
	for _, id := range []string{"act_2", "act_6"} {
		if acc, err := j.AcceptAction(ctx, "msg-"+id, upT0.Add(time.Hour), upT0, upAction(id, 10*time.Second)); err != nil || !acc.Created {
			t.Fatalf("AcceptAction(%s): %+v, %v", id, acc, err)
		}
	}
	must(j.StartAction(ctx, "act_3", upT0.Add(20*time.Second)))
	var written []journal.Receipt
	finish := func(j journal.Journal, id string, st aip.ActionState, result, detail string, at time.Duration) journal.Receipt {
		t.Helper()
		var raw json.RawMessage
		if result != "" {
			raw = json.RawMessage(result)
		}
		r, err := j.FinishAction(ctx, id, st, raw, detail, upT0.Add(at))
		must(err)
		return r
	}
	written = append(written,
		finish(j, "act_1", aip.StateCompleted, `{"ok": 1,  "text":"é"}`, "", mins(1)),
		finish(j, "act_2", aip.StateFailed, "", "provider said \x00no", mins(2)),
		finish(j, "act_7", aip.StateCompleted, `{"late":true}`, "", mins(30)),
		finish(j, "act_3", aip.StateOutcomeUnknown, "", "timed out", mins(3)),
		finish(j, "act_4", aip.StateCancelled, "", "", mins(4)))
	if ok, err := j.ClaimMessage(ctx, "msg-extra", upT0.Add(time.Hour), upT0); err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	for i, ev := range []string{`[{"id":"evt_1"}]`, `[ {"id": "evt_2"} ]`} {
		must(j.EnqueueEvents(ctx, journal.OutboxEntry{ID: fmt.Sprintf("obx_%d", i), ChannelID: "webhooks", Events: json.RawMessage(ev), CreatedAt: upT0}))
	}
	claimed, err := j.ClaimEvents(ctx, upT0.Add(time.Minute), time.Minute, 1)
	must(err)
	if len(claimed) != 1 {
		t.Fatalf("claimed %d outbox batches, want 1", len(claimed))
	}
	must(j.RetryEvents(ctx, claimed[0].ID, upT0.Add(mins(5)), "503 from central"))
	for _, k := range upStateKeys {
		rev, err := j.PutState(ctx, k[0], k[1], json.RawMessage(`{"k": "`+k[1]+`"}`), 0)
		must(err)
		if k[0] == "other" {
			_, err = j.PutState(ctx, k[0], k[1], json.RawMessage(`{"again":  true}`), rev)
			must(err)
		}
	}
	before := viewOf(t, j)
	if diff := cmp.Diff(written, before.Receipts); diff != "" {
		t.Fatalf("receipts read back (-written +read):\n%s", diff)
	}
	must(journal.VerifyChain("", before.Receipts))
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
	gotRows := fileRows(t, dir)
	if h := gotRows["prune_horizon"]; len(h) != 0 {
		t.Fatalf("prune horizon rows after the upgrade: %v", h)
	}
	delete(gotRows, "prune_horizon")
	if diff := cmp.Diff(wantRows, gotRows); diff != "" {
		t.Fatalf("rows changed by the upgrade (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(before, viewOf(t, j)); diff != "" {
		t.Fatalf("records read back differently after the upgrade (-before +after):\n%s", diff)
	}

	// Pruning the old actions: act_1 and act_2, then act_3 and act_4;
	// act_5 (received), act_6 (running) and act_7 (completed after the
	// cutoff) stay, with their state.
	cutoff := upT0.Add(mins(10))
	if n, err := j.PruneActions(ctx, cutoff, 2, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions(limit 2) = %d, %v; want 2", n, err)
	}
	if n, err := j.PruneActions(ctx, cutoff, 100, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions = %d, %v; want 2", n, err)
	}
	horizon := upT0.Add(mins(4))
	if h, err := j.PruneHorizon(ctx); err != nil || !h.Equal(horizon) {
		t.Fatalf("prune horizon: %v, %v; want %v", h, err, horizon)
	}
	after := viewOf(t, j)
	var kept []string
	for _, a := range after.Actions {
		kept = append(kept, a.ActionID)
		i := slices.IndexFunc(before.Actions, func(b journal.Action) bool { return b.ActionID == a.ActionID })
		if diff := cmp.Diff(before.Actions[i], a); diff != "" {
			t.Fatalf("kept action %s changed (-before +after):\n%s", a.ActionID, diff)
		}
	}
	if want := []string{"act_5", "act_7", "act_6"}; !slices.Equal(kept, want) {
		t.Fatalf("actions kept: %v, want %v", kept, want)
	}
	wantState := map[string]journal.StateValue{}
	for k, v := range before.State {
		if k != "conn/act_1" && k != "conn/act_2" {
			wantState[k] = v
		}
	}
	if diff := cmp.Diff(wantState, after.State); diff != "" {
		t.Fatalf("state after pruning (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(written[2:], after.Receipts); diff != "" {
		t.Fatalf("receipts after pruning (-want +got):\n%s", diff)
	}
	must(journal.VerifyChain(written[1].Hash, after.Receipts))

	// The horizon refuses pruned actions, also after a restart, and
	// rolls the claim back; actions from before are found; later ones
	// are journaled and the chain goes on.
	must(j.Close())
	j = open(t, sqliteruntime.Config{Dir: dir})
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
	if got, created, err := j.BeginAction(ctx, upAction("act_5", 0)); err != nil || created || got.Status != aip.StateReceived {
		t.Fatalf("BeginAction of act_5 journaled before the upgrade: %+v, created %v, %v", got, created, err)
	}
	fresh := upAction("act_8", time.Hour)
	fresh.AssignedAt = horizon.Add(time.Microsecond)
	if _, created, err := j.BeginAction(ctx, fresh); err != nil || !created {
		t.Fatalf("BeginAction of a new action assigned after the horizon: created %v, %v", created, err)
	}
	r := finish(j, "act_6", aip.StateCompleted, `{}`, "", time.Hour)
	if last := written[len(written)-1]; r.Seq != last.Seq+1 || r.PrevHash != last.Hash {
		t.Fatalf("receipt after the upgrade: seq %d prev %s; want %d after %s", r.Seq, r.PrevHash, last.Seq+1, last.Hash)
	}
	rs, err := j.Receipts(ctx, 0, 100)
	must(err)
	must(journal.VerifyChain(rs[0].PrevHash, rs))
	must(j.Close())

	db = rawDB(t, dir)
	var v int
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != sqliteruntime.SchemaVersion {
		t.Fatalf("user_version after the upgrade = %d, %v; want %d", v, err, sqliteruntime.SchemaVersion)
	}
}
