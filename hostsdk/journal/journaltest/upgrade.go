package journaltest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// UpgradeT0 is when the older build received the fixture's first action.
var UpgradeT0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// UpgradeAction returns fixture action id (of tenant-1, capability
// echo.say), received at UpgradeT0 plus received.
func UpgradeAction(id string, received time.Duration) journal.Action {
	return journal.Action{ActionID: id, CapabilityID: "echo.say", TenantID: "tenant-1", IdempotencyKey: "idem-" + id,
		InputDigest: aip.DigestBytes([]byte(id)), FenceToken: "fence-" + id, MessageID: "msg-" + id, ReceivedAt: UpgradeT0.Add(received)}
}

// UpgradeStateKeys are the (namespace, key) pairs of the state UpgradeData
// writes: per-action state in namespace "conn" (the one CheckPruned prunes
// with the actions) and a twice-written value in "other".
var UpgradeStateKeys = [][2]string{{"conn", "act_1"}, {"conn", "act_2"}, {"conn", "act_7"}, {"conn", "act_5"}, {"other", "act_1"}}

// View is everything a journal reads back: its actions in every status,
// its receipts, the state of the keys asked for ("namespace/key"; missing
// keys absent) and the number of pending outbox batches.
type View struct {
	Actions  []journal.Action
	Receipts []journal.Receipt
	State    map[string]journal.StateValue
	Pending  int
}

// ReadView reads everything j holds, with the state of stateKeys.
func ReadView(t *testing.T, j journal.Journal, stateKeys [][2]string) View {
	t.Helper()
	ctx := t.Context()
	var v View
	var err error
	all := []aip.ActionState{aip.StateReceived, aip.StateRunning, aip.StateCompleted, aip.StateFailed, aip.StateOutcomeUnknown, aip.StateCancelled}
	if v.Actions, err = j.ActionsByStatus(ctx, 1000, all...); err != nil {
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

// UpgradeWriter journals new actions as the older build did. A nil field
// uses the journal's own method (and fails the test unless it creates the
// action); a backend whose statements for it changed since sets the older
// build's.
type UpgradeWriter struct {
	// Begin journals received action a (BeginAction).
	Begin func(t *testing.T, a journal.Action)
	// Accept claims messageID until expires and journals running action a
	// in one step (AcceptAction).
	Accept func(t *testing.T, messageID string, expires, now time.Time, a journal.Action)
}

// UpgradeFixture is what UpgradeData wrote and read back.
type UpgradeFixture struct {
	// Written are the receipts FinishAction returned, in the order written.
	Written []journal.Receipt
	// Before is what the journal read back after writing (ReadView with
	// UpgradeStateKeys).
	Before View
}

// UpgradeData writes the fixture to j, an empty journal, through w:
// actions in every status (act_1..act_7: act_5 received, act_6 running,
// the others terminal; receipts in an order unlike completion, act_7
// completing last but third), a message claim, an outbox batch leased and
// retried and one pending, and the state of UpgradeStateKeys. It checks
// that j reads back the receipts it returned, in one chain from the start.
func UpgradeData(t *testing.T, j journal.Journal, w UpgradeWriter) *UpgradeFixture {
	t.Helper()
	ctx := t.Context()
	if w.Begin == nil {
		w.Begin = func(t *testing.T, a journal.Action) {
			t.Helper()
			if _, created, err := j.BeginAction(t.Context(), a); err != nil || !created {
				t.Fatalf("BeginAction(%s): %v, %v", a.ActionID, created, err)
			}
		}
	}
	if w.Accept == nil {
		w.Accept = func(t *testing.T, messageID string, expires, now time.Time, a journal.Action) {
			t.Helper()
			if acc, err := j.AcceptAction(t.Context(), messageID, expires, now, a); err != nil || !acc.Created {
				t.Fatalf("AcceptAction(%s): %+v, %v", a.ActionID, acc, err)
			}
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range []string{"act_1", "act_3", "act_4", "act_5", "act_7"} {
		w.Begin(t, UpgradeAction(id, time.Duration(i)*time.Second))
	}
	w.Accept(t, "msg-act_2", UpgradeT0.Add(time.Hour), UpgradeT0, UpgradeAction("act_2", 10*time.Second))
	w.Accept(t, "msg-act_6", UpgradeT0.Add(time.Hour), UpgradeT0, UpgradeAction("act_6", 11*time.Second))
	must(j.StartAction(ctx, "act_3", UpgradeT0.Add(20*time.Second)))
	f := &UpgradeFixture{}
	for _, fin := range []struct {
		id             string
		st             aip.ActionState
		result, detail string
		at             time.Duration
	}{
		{"act_1", aip.StateCompleted, `{"ok": 1,  "text":"é"}`, "", time.Minute},
		{"act_2", aip.StateFailed, "", "provider said \x00no", 2 * time.Minute},
		{"act_7", aip.StateCompleted, `{"late":true}`, "", 30 * time.Minute},
		{"act_3", aip.StateOutcomeUnknown, "", "timed out", 3 * time.Minute},
		{"act_4", aip.StateCancelled, "", "", 4 * time.Minute},
	} {
		r, err := j.FinishAction(ctx, fin.id, fin.st, rawOrNil(fin.result), fin.detail, UpgradeT0.Add(fin.at))
		must(err)
		f.Written = append(f.Written, r)
	}
	if ok, err := j.ClaimMessage(ctx, "msg-extra", UpgradeT0.Add(time.Hour), UpgradeT0); err != nil || !ok {
		t.Fatalf("claim: %v, %v", ok, err)
	}
	for i, ev := range []string{`[{"id":"evt_1"}]`, `[ {"id": "evt_2"} ]`} {
		must(j.EnqueueEvents(ctx, journal.OutboxEntry{ID: fmt.Sprintf("obx_%d", i), ChannelID: "webhooks", Events: json.RawMessage(ev), CreatedAt: UpgradeT0}))
	}
	claimed, err := j.ClaimEvents(ctx, UpgradeT0.Add(time.Minute), time.Minute, 1)
	must(err)
	if len(claimed) != 1 {
		t.Fatalf("claimed %d outbox batches, want 1", len(claimed))
	}
	must(j.RetryEvents(ctx, claimed[0].ID, UpgradeT0.Add(5*time.Minute), "503 from central"))
	for _, k := range UpgradeStateKeys {
		rev, err := j.PutState(ctx, k[0], k[1], json.RawMessage(`{"k": "`+k[1]+`"}`), 0)
		must(err)
		if k[0] == "other" {
			_, err = j.PutState(ctx, k[0], k[1], json.RawMessage(`{"again":  true}`), rev)
			must(err)
		}
	}
	f.Before = ReadView(t, j, UpgradeStateKeys)
	if diff := cmp.Diff(f.Written, f.Before.Receipts); diff != "" {
		t.Fatalf("the older build reads back other receipts than it wrote (-written +read):\n%s", diff)
	}
	must(journal.VerifyChain("", f.Before.Receipts))
	return f
}

// CheckRowsKept checks the backend's own rows across the upgrade: before
// and after are every row of every table, by table (as the backend lists
// them); added is the table the upgrade created, which must be empty; every
// other table must hold the rows it held before.
func CheckRowsKept(t *testing.T, before, after map[string][]string, added string) {
	t.Helper()
	if rows := after[added]; len(rows) != 0 {
		t.Fatalf("%s after the upgrade: %v, want no rows", added, rows)
	}
	after = maps.Clone(after)
	delete(after, added)
	if diff := cmp.Diff(before, after); diff != "" {
		t.Fatalf("rows changed by the upgrade (-before +after):\n%s", diff)
	}
}

// CheckUnchanged checks that j, the upgraded journal, reads back every
// record as before the upgrade, and that nothing has been pruned yet.
func (f *UpgradeFixture) CheckUnchanged(t *testing.T, j journal.Journal) {
	t.Helper()
	if diff := cmp.Diff(f.Before, ReadView(t, j, UpgradeStateKeys)); diff != "" {
		t.Fatalf("records read back differently after the upgrade (-before +after):\n%s", diff)
	}
	if h, err := j.PruneHorizon(t.Context()); err != nil || !h.IsZero() {
		t.Fatalf("prune horizon after the upgrade: %v, %v; want zero", h, err)
	}
}

// CheckPruned prunes the fixture's actions on j, the upgraded journal,
// and checks what follows: the four terminal actions completed before the
// cutoff go, oldest completed first, with their state in namespace "conn";
// act_5, act_6 and act_7 stay unchanged; the horizon rises and refuses
// the pruned actions (rolling their message claim back) while the actions
// journaled before it are found and new ones after it are journaled; the
// receipt chain verifies from its oldest kept receipt and goes on.
//
// If reopen is not nil, j is closed after pruning and the checks of the
// horizon run on reopen(t, j), a journal on the same storage: the horizon
// must survive a restart. CheckPruned returns the journal it ended with.
func (f *UpgradeFixture) CheckPruned(t *testing.T, j journal.Journal, reopen func(t *testing.T, closed journal.Journal) journal.Journal) journal.Journal {
	t.Helper()
	ctx := t.Context()
	cutoff := UpgradeT0.Add(10 * time.Minute)
	if n, err := j.PruneActions(ctx, cutoff, 2, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions(limit 2) = %d, %v; want 2", n, err)
	}
	if h, err := j.PruneHorizon(ctx); err != nil || !h.Equal(UpgradeT0.Add(2*time.Minute)) {
		t.Fatalf("prune horizon after pruning act_1 and act_2: %v, %v; want %v", h, err, UpgradeT0.Add(2*time.Minute))
	}
	if n, err := j.PruneActions(ctx, cutoff, 100, []string{"conn"}); err != nil || n != 2 {
		t.Fatalf("PruneActions = %d, %v; want 2 (act_3, act_4)", n, err)
	}
	horizon := UpgradeT0.Add(4 * time.Minute)
	if h, err := j.PruneHorizon(ctx); err != nil || !h.Equal(horizon) {
		t.Fatalf("prune horizon: %v, %v; want %v", h, err, horizon)
	}
	after := ReadView(t, j, UpgradeStateKeys)
	var kept []string
	for _, a := range after.Actions {
		kept = append(kept, a.ActionID)
		i := slices.IndexFunc(f.Before.Actions, func(b journal.Action) bool { return b.ActionID == a.ActionID })
		if i < 0 {
			continue // reported below
		}
		if diff := cmp.Diff(f.Before.Actions[i], a); diff != "" {
			t.Fatalf("kept action %s changed (-before +after):\n%s", a.ActionID, diff)
		}
	}
	if want := []string{"act_5", "act_7", "act_6"}; !slices.Equal(kept, want) {
		t.Fatalf("actions kept: %v, want %v", kept, want)
	}
	wantState := map[string]journal.StateValue{}
	for k, v := range f.Before.State {
		if k != "conn/act_1" && k != "conn/act_2" {
			wantState[k] = v
		}
	}
	if diff := cmp.Diff(wantState, after.State); diff != "" {
		t.Fatalf("state after pruning (-want +got):\n%s", diff)
	}
	// The chain keeps act_7's receipt (the third) and what follows it.
	if diff := cmp.Diff(f.Written[2:], after.Receipts); diff != "" {
		t.Fatalf("receipts after pruning (-want +got):\n%s", diff)
	}
	if err := journal.VerifyChain(f.Written[1].Hash, after.Receipts); err != nil {
		t.Fatal(err)
	}

	if reopen != nil {
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
		j = reopen(t, j)
	}
	// The horizon refuses the pruned actions, and rolls the claim back.
	again := UpgradeAction("act_1", 0)
	again.AssignedAt = UpgradeT0
	if _, _, err := j.BeginAction(ctx, again); !errors.Is(err, journal.ErrPruned) {
		t.Fatalf("BeginAction of pruned act_1: %v, want ErrPruned", err)
	}
	again = UpgradeAction("act_2", 0)
	again.AssignedAt = horizon
	if _, err := j.AcceptAction(ctx, "msg-new", UpgradeT0.Add(2*time.Hour), UpgradeT0.Add(time.Hour), again); !errors.Is(err, journal.ErrPruned) {
		t.Fatalf("AcceptAction of pruned act_2 assigned at the horizon: %v, want ErrPruned", err)
	}
	if ok, err := j.ClaimMessage(ctx, "msg-new", UpgradeT0.Add(2*time.Hour), UpgradeT0.Add(time.Hour)); err != nil || !ok {
		t.Fatalf("the refused AcceptAction kept its message claim: ClaimMessage = %v, %v", ok, err)
	}
	// Actions journaled before the upgrade are found, not refused.
	if got, created, err := j.BeginAction(ctx, UpgradeAction("act_5", 0)); err != nil || created || got.Status != aip.StateReceived {
		t.Fatalf("BeginAction of act_5 journaled before the upgrade: %+v, created %v, %v", got, created, err)
	}
	// A new action assigned after the horizon is journaled, and the
	// running action from before the upgrade finishes: the chain goes on.
	fresh := UpgradeAction("act_8", time.Hour)
	fresh.AssignedAt = horizon.Add(time.Microsecond)
	if _, created, err := j.BeginAction(ctx, fresh); err != nil || !created {
		t.Fatalf("BeginAction of a new action assigned after the horizon: created %v, %v", created, err)
	}
	r, err := j.FinishAction(ctx, "act_6", aip.StateCompleted, json.RawMessage(`{}`), "", UpgradeT0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if last := f.Written[len(f.Written)-1]; r.Seq != last.Seq+1 || r.PrevHash != last.Hash {
		t.Fatalf("receipt after the upgrade: seq %d prev %s; want %d after %s", r.Seq, r.PrevHash, last.Seq+1, last.Hash)
	}
	rs, err := j.Receipts(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if err := journal.VerifyChain(rs[0].PrevHash, rs); err != nil {
		t.Fatal(err)
	}
	return j
}
