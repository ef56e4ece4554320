package journaltest

import (
	"context"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func prune(t *testing.T, j journal.Journal, before time.Time, limit, want int) {
	t.Helper()
	n, err := j.PruneActions(context.Background(), before, limit, nil)
	if err != nil {
		t.Fatalf("PruneActions(%s, %d): %v", before, limit, err)
	}
	if n != want {
		t.Fatalf("PruneActions(%s, %d) = %d, want %d", before, limit, n, want)
	}
}

func horizon(t *testing.T, j journal.Journal) time.Time {
	t.Helper()
	h, err := j.PruneHorizon(context.Background())
	if err != nil {
		t.Fatalf("PruneHorizon: %v", err)
	}
	return h
}

func wantHorizon(t *testing.T, j journal.Journal, want time.Time) {
	t.Helper()
	if h := horizon(t, j); !h.Equal(want) {
		t.Fatalf("PruneHorizon = %s, want %s", h, want)
	}
}

func wantGone(t *testing.T, j journal.Journal, ids ...string) {
	t.Helper()
	for _, id := range ids {
		_, err := j.Action(context.Background(), id)
		wantErr(t, "Action(pruned "+id+")", err, journal.ErrNotFound)
	}
}

// verifyKept checks the receipts left after pruning: contiguous from the
// oldest kept one, which anchors the chain with its PrevHash, and ending at
// the head.
func verifyKept(t *testing.T, j journal.Journal, headSeq uint64) []journal.Receipt {
	t.Helper()
	var all []journal.Receipt
	var after uint64
	for {
		page, err := j.Receipts(context.Background(), after, 5)
		if err != nil {
			t.Fatalf("Receipts(after %d): %v", after, err)
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
	if len(all) == 0 {
		t.Fatal("every receipt was pruned; the chain head must stay")
	}
	if err := journal.VerifyChain(all[0].PrevHash, all); err != nil {
		t.Fatalf("VerifyChain over the %d kept receipts: %v", len(all), err)
	}
	if last := all[len(all)-1].Seq; last != headSeq {
		t.Fatalf("the newest kept receipt has seq %d, want the head %d", last, headSeq)
	}
	return all
}

func (s *suite) testPruneActions(t *testing.T) {
	j := s.open(t)
	wantHorizon(t, j, time.Time{})
	prune(t, j, at(time.Hour), 10, 0) // nothing to prune
	wantHorizon(t, j, time.Time{})

	terminal := func(st aip.ActionState, done time.Duration) journal.Action {
		a := newAction(at(0))
		begin(t, j, a)
		start(t, j, a.ActionID, at(time.Second))
		finish(t, j, a.ActionID, st, `{"status":"x"}`, at(done))
		return a
	}
	a1 := terminal(aip.StateCompleted, time.Minute)
	a2 := terminal(aip.StateFailed, 2*time.Minute)
	running := newAction(at(0))
	begin(t, j, running)
	start(t, j, running.ActionID, at(time.Second))
	received := newAction(at(0))
	begin(t, j, received)
	a6 := terminal(aip.StateCancelled, 3*time.Minute)
	a5 := terminal(aip.StateOutcomeUnknown, 10*time.Minute)

	// Oldest completed first, at most limit.
	prune(t, j, at(5*time.Minute), 2, 2)
	wantGone(t, j, a1.ActionID, a2.ActionID)
	wantHorizon(t, j, at(2*time.Minute))
	verifyKept(t, j, 4)
	prune(t, j, at(5*time.Minute), 10, 1)
	wantGone(t, j, a6.ActionID)
	wantHorizon(t, j, at(3*time.Minute))
	if got := verifyKept(t, j, 4); len(got) != 1 || got[0].ActionID != a5.ActionID {
		t.Fatalf("kept receipts %+v, want only a5's", got)
	}
	prune(t, j, at(5*time.Minute), 10, 0)
	prune(t, j, at(time.Minute), 10, 0) // an earlier cutoff: the horizon stays
	wantHorizon(t, j, at(3*time.Minute))

	// Actions that are not terminal are never pruned, however old.
	prune(t, j, at(24*time.Hour), 10, 1)
	wantGone(t, j, a5.ActionID)
	wantHorizon(t, j, at(10*time.Minute))
	for _, id := range []string{running.ActionID, received.ActionID} {
		getAction(t, j, id)
	}
	// The head receipt stays although its action is gone, and the chain
	// goes on from it.
	kept := verifyKept(t, j, 4)
	if kept[0].ActionID != a5.ActionID {
		t.Fatalf("the kept head receipt is %s's, want a5's", kept[0].ActionID)
	}
	r := finish(t, j, running.ActionID, aip.StateCompleted, `{"status":"ok"}`, at(11*time.Minute))
	if r.Seq != 5 || r.PrevHash != kept[0].Hash {
		t.Fatalf("receipt after pruning: seq %d prev %s, want seq 5 linked to %s", r.Seq, r.PrevHash, kept[0].Hash)
	}
	if got := verifyKept(t, j, 5); len(got) != 2 {
		t.Fatalf("kept %d receipts, want 2", len(got))
	}
	if _, err := j.ReceiptFor(context.Background(), r.ActionID); err != nil {
		t.Fatalf("ReceiptFor after pruning: %v", err)
	}
}

func (s *suite) testPruneKeepsTheChainContiguous(t *testing.T) {
	j := s.open(t)
	// Receipts in sequence order need not be in completion order.
	late, early, last := newAction(at(0)), newAction(at(0)), newAction(at(0))
	for _, a := range []journal.Action{late, early, last} {
		begin(t, j, a)
	}
	finish(t, j, late.ActionID, aip.StateCompleted, "", at(2*time.Minute)) // seq 1
	finish(t, j, early.ActionID, aip.StateCompleted, "", at(time.Minute))  // seq 2
	finish(t, j, last.ActionID, aip.StateCompleted, "", at(3*time.Minute)) // seq 3
	prune(t, j, at(90*time.Second), 10, 1)
	wantGone(t, j, early.ActionID)
	// seq 1's action is still journaled, so seq 2 stays too: no gap.
	if got := verifyKept(t, j, 3); len(got) != 3 {
		t.Fatalf("kept %d receipts, want all 3 (a gap would break the chain)", len(got))
	}
	prune(t, j, at(150*time.Second), 10, 1)
	if got := verifyKept(t, j, 3); len(got) != 1 || got[0].Seq != 3 {
		t.Fatalf("kept receipts %+v, want only seq 3", got)
	}
}

func (s *suite) testPruneHorizon(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	// Before anything was pruned, an action without an assignment time is
	// journaled as usual.
	first := newAction(at(0))
	begin(t, j, first)
	finish(t, j, first.ActionID, aip.StateCompleted, `{"n":1}`, at(time.Minute))
	running := newAction(at(0))
	begin(t, j, running)
	start(t, j, running.ActionID, at(time.Second))
	prune(t, j, at(time.Hour), 10, 1)
	h := horizon(t, j)
	if !h.Equal(at(time.Minute)) {
		t.Fatalf("PruneHorizon = %s, want %s", h, at(time.Minute))
	}

	// The pruned action itself, delivered again: refused, nothing written.
	again := first
	again.MessageID = aip.NewMessageID()
	again.ReceivedAt = at(2 * time.Hour)
	again.AssignedAt = at(-time.Minute)
	_, _, err := j.BeginAction(ctx, again)
	wantErr(t, "BeginAction(pruned action)", err, journal.ErrPruned)
	acc, err := j.AcceptAction(ctx, again.MessageID, at(3*time.Hour), at(2*time.Hour), again)
	wantErr(t, "AcceptAction(pruned action)", err, journal.ErrPruned)
	if acc.Claimed || acc.Created {
		t.Fatalf("AcceptAction(pruned action) = %+v, want nothing", acc)
	}
	wantGone(t, j, first.ActionID)
	// The refused claim was not written: the message can still be claimed.
	if !claim(t, j, again.MessageID, at(3*time.Hour), at(2*time.Hour)) {
		t.Fatal("the message of a refused action was claimed")
	}

	for name, assigned := range map[string]time.Time{
		"unknown assignment time": {},
		"assigned at the horizon": h,
		// Times count to the microsecond, and a pruned action stored as
		// received at h may have been received up to 999 ns later: the
		// SQLite and memory journals compared the nanoseconds and created
		// this action, PostgreSQL refused it.
		"assigned within the horizon's microsecond": h.Add(999 * time.Nanosecond),
		"assigned before it":                        at(-time.Hour),
	} {
		a := newAction(at(2 * time.Hour))
		a.AssignedAt = assigned
		_, _, err := j.BeginAction(ctx, a)
		wantErr(t, "BeginAction("+name+")", err, journal.ErrPruned)
		_, err = j.AcceptAction(ctx, a.MessageID, at(3*time.Hour), at(2*time.Hour), a)
		wantErr(t, "AcceptAction("+name+")", err, journal.ErrPruned)
		wantGone(t, j, a.ActionID)
	}

	// Assigned after the horizon: journaled.
	fresh := newAction(at(2 * time.Hour))
	fresh.AssignedAt = h.Add(time.Microsecond)
	begin(t, j, fresh)
	fresh2 := newAction(at(2 * time.Hour))
	fresh2.AssignedAt = at(2 * time.Hour)
	acc, err = j.AcceptAction(ctx, fresh2.MessageID, at(3*time.Hour), at(2*time.Hour), fresh2)
	if err != nil || !acc.Claimed || !acc.Created {
		t.Fatalf("AcceptAction(assigned after the horizon) = %+v, %v; want claimed and created", acc, err)
	}

	// An old action still journaled is answered from its record, whatever
	// its assignment time.
	dup := running
	dup.MessageID = aip.NewMessageID()
	dup.ReceivedAt = at(2 * time.Hour)
	dup.AssignedAt = time.Time{}
	acc, err = j.AcceptAction(ctx, dup.MessageID, at(3*time.Hour), at(2*time.Hour), dup)
	if err != nil || !acc.Claimed || acc.Created || acc.Existing.ActionID != running.ActionID {
		t.Fatalf("AcceptAction(journaled old action) = %+v, %v; want its existing record", acc, err)
	}
	got, created, err := j.BeginAction(ctx, dup)
	if err != nil || created || got.Status != aip.StateRunning {
		t.Fatalf("BeginAction(journaled old action) = %+v, %v, %v; want its running record", got, created, err)
	}

	// A replayed message is a replay, not a refusal.
	replayed := newAction(at(2 * time.Hour))
	if !claim(t, j, replayed.MessageID, at(3*time.Hour), at(2*time.Hour)) {
		t.Fatal("ClaimMessage(new message) = false")
	}
	acc, err = j.AcceptAction(ctx, replayed.MessageID, at(3*time.Hour), at(2*time.Hour), replayed)
	if err != nil || acc.Claimed || acc.Created {
		t.Fatalf("AcceptAction(replayed message, pruned-era action) = %+v, %v; want a replay", acc, err)
	}
}

func (s *suite) testPruneInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	_, err := j.PruneActions(ctx, time.Time{}, 10, nil)
	wantErr(t, "PruneActions(zero cutoff)", err, journal.ErrInvalid)
	for _, limit := range []int{0, -1} {
		_, err := j.PruneActions(ctx, at(time.Hour), limit, nil)
		wantErr(t, "PruneActions(limit)", err, journal.ErrInvalid)
	}
	for _, ns := range []string{"", "bad\x00ns", "\xff"} {
		_, err := j.PruneActions(ctx, at(time.Hour), 10, []string{"ok", ns})
		wantErr(t, "PruneActions(state namespace "+ns+")", err, journal.ErrInvalid)
	}
}

func (s *suite) testPruneHorizonSurvivesReopen(t *testing.T) {
	if s.f.Reopen == nil {
		t.Skip("ephemeral journal: nothing survives a restart")
	}
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	begin(t, j, a)
	finish(t, j, a.ActionID, aip.StateCompleted, `{"n":1}`, at(time.Minute))
	prune(t, j, at(time.Hour), 10, 1)
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	j2 := s.f.Reopen(t, j)
	t.Cleanup(func() { _ = j2.Close() })
	wantHorizon(t, j2, at(time.Minute))
	a.MessageID = aip.NewMessageID()
	a.AssignedAt = at(30 * time.Second)
	_, err := j2.AcceptAction(ctx, a.MessageID, at(3*time.Hour), at(2*time.Hour), a)
	wantErr(t, "AcceptAction(pruned action after reopen)", err, journal.ErrPruned)
	verifyKept(t, j2, 1)
}

func (s *suite) testPruneActionState(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	old, live := newAction(at(0)), newAction(at(0))
	begin(t, j, old)
	begin(t, j, live)
	finish(t, j, old.ActionID, aip.StateCompleted, "", at(time.Minute))
	for _, k := range [][2]string{
		{"runs", old.ActionID}, {"tasks", old.ActionID}, {"runs", live.ActionID},
		{"ledger", old.ActionID}, {"runs", "cursor"},
	} {
		put(t, j, k[0], k[1], `{"v":1}`, 0)
	}
	n, err := j.PruneActions(ctx, at(time.Hour), 10, []string{"runs", "tasks", "absent"})
	if err != nil || n != 1 {
		t.Fatalf("PruneActions = %d, %v; want 1", n, err)
	}
	for _, k := range [][2]string{{"runs", old.ActionID}, {"tasks", old.ActionID}} {
		_, err := j.State(ctx, k[0], k[1])
		wantErr(t, "State("+k[0]+"/pruned action)", err, journal.ErrNotFound)
	}
	// Other actions' values, other namespaces and other keys stay.
	for _, k := range [][2]string{{"runs", live.ActionID}, {"ledger", old.ActionID}, {"runs", "cursor"}} {
		if _, err := j.State(ctx, k[0], k[1]); err != nil {
			t.Fatalf("State(%s/%s) after pruning another action: %v", k[0], k[1], err)
		}
	}
}

// A record can complete at an earlier time than it was received (the host's
// clock was stepped back while it ran, or a host restarted with a clock
// behind recovers it): the horizon must still cover its receipt time, since
// a delivery of it can have been assigned up to that time.
func (s *suite) testPruneHorizonCoversReceipt(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(10 * time.Minute))
	a.AssignedAt = at(9 * time.Minute)
	begin(t, j, a)
	finish(t, j, a.ActionID, aip.StateCompleted, `{"n":1}`, at(time.Minute)) // the clock went back
	prune(t, j, at(time.Hour), 10, 1)
	wantHorizon(t, j, at(10*time.Minute))

	// The same delivery again, under the same route: refused.
	again := a
	again.MessageID = aip.NewMessageID()
	again.ReceivedAt = at(2 * time.Hour)
	acc, err := j.AcceptAction(ctx, again.MessageID, at(3*time.Hour), at(2*time.Hour), again)
	wantErr(t, "AcceptAction(pruned action received after it completed)", err, journal.ErrPruned)
	if acc.Created {
		t.Fatalf("the pruned action was journaled again (%+v): it would run a second time", acc)
	}
	_, _, err = j.BeginAction(ctx, again)
	wantErr(t, "BeginAction(pruned action received after it completed)", err, journal.ErrPruned)
}
