package pgruntime_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// waitForLockWaiters returns once n sessions of the database wait for a
// lock, or fails the test after a minute.
func waitForLockWaiters(t *testing.T, conn *pgx.Conn, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting int
		err := conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions wait for a lock after a minute, want %d", waiting, n)
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, not waiting for time to pass
	}
}

// An AcceptAction of an action ID that a concurrent PruneActions is
// deleting waits for the prune (the deleted row's lock), then sees the
// horizon that commits with the deletion: ErrPruned, nothing written. The
// interleaving is made deterministic by a transaction of the test that
// holds the lock of a receipt the prune deletes in its second statement,
// after the actions are deleted and the horizon raised.
func TestAcceptWaitingForAConcurrentPruneIsRefused(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_race", MaxConns: 4})
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	old := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", FenceToken: "route_x",
		MessageID: aip.NewMessageID(), ReceivedAt: t0}
	kept := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", MessageID: aip.NewMessageID(), ReceivedAt: t0}
	for _, a := range []journal.Action{old, kept} {
		if _, _, err := j.BeginAction(ctx, a); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := j.FinishAction(ctx, old.ActionID, aip.StateCompleted, json.RawMessage(`{}`), "", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := j.FinishAction(ctx, kept.ActionID, aip.StateCompleted, json.RawMessage(`{}`), "", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}

	locker, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	watcher, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(ctx)
	tx, err := locker.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once rolled back
	var seq int64
	if err := tx.QueryRow(ctx, `SELECT seq FROM aip_runtime_receipts WHERE journal_ns = $1 AND action_id = $2 FOR UPDATE`,
		j.Namespace(), old.ActionID).Scan(&seq); err != nil || seq != 1 {
		t.Fatalf("lock the receipt of the action to prune: seq %d, %v", seq, err)
	}

	type pruned struct {
		n   int
		err error
	}
	pruneDone := make(chan pruned, 1)
	go func() {
		n, err := j.PruneActions(ctx, t0.Add(30*time.Minute), 10, nil)
		pruneDone <- pruned{n, err}
	}()
	waitForLockWaiters(t, watcher, 1) // the prune deleted the action and waits on the receipt

	again := old
	again.MessageID = aip.NewMessageID()
	again.ReceivedAt = t0.Add(2 * time.Hour)
	again.AssignedAt = t0.Add(-time.Minute) // its route is older than the pruned record
	type accepted struct {
		acc journal.Accepted
		err error
	}
	acceptDone := make(chan accepted, 1)
	go func() {
		acc, err := j.AcceptAction(ctx, again.MessageID, t0.Add(3*time.Hour), t0.Add(2*time.Hour), again)
		acceptDone <- accepted{acc, err}
	}()
	waitForLockWaiters(t, watcher, 2) // the insert waits for the prune's deletion

	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if p := <-pruneDone; p.err != nil || p.n != 1 {
		t.Fatalf("PruneActions = %d, %v; want 1", p.n, p.err)
	}
	a := <-acceptDone
	if !errors.Is(a.err, journal.ErrPruned) || a.acc.Created {
		t.Fatalf("AcceptAction racing the prune of its action = %+v, %v; want journal.ErrPruned", a.acc, a.err)
	}
	if _, err := j.Action(ctx, old.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("the pruned action is journaled again (%v)", err)
	}
	if ok, err := j.ClaimMessage(ctx, again.MessageID, t0.Add(3*time.Hour), t0.Add(2*time.Hour)); err != nil || !ok {
		t.Fatalf("the refused delivery's message claim was kept (ClaimMessage = %v, %v)", ok, err)
	}
}

// An AcceptAction (or BeginAction) of an action journaled earlier finds
// it in one statement and reads its record in another; a prune deleting
// the record in between made it fail with journal.ErrNotFound after the
// message's claim had committed, which the host answered with a retryable
// storage_unavailable (and a retry of the same message with replay).
// Now it is journal.ErrPruned with nothing written, as after the prune:
// the claim is taken back, so the host claims the message with its
// action_expired refusal.
func TestAcceptOfAnActionPrunedBeforeItsRecordIsReadIsRefused(t *testing.T) {
	ctx := context.Background()
	j := open(t, pgruntime.Config{DatabaseURL: pgtest.NewDatabase(t), Namespace: "crepl_vanish", MaxConns: 4})
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var olds []journal.Action
	for i := range 3 {
		a := journal.Action{ActionID: aip.NewActionID(), CapabilityID: "echo.say", FenceToken: "route_x",
			MessageID: aip.NewMessageID(), ReceivedAt: t0.Add(time.Duration(i) * time.Minute)}
		if _, _, err := j.BeginAction(ctx, a); err != nil {
			t.Fatal(err)
		}
		if _, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, json.RawMessage(`{}`), "", a.ReceivedAt.Add(time.Second)); err != nil {
			t.Fatal(err)
		}
		olds = append(olds, a)
	}
	// The prune runs between the two statements, deleting the actions
	// finished up to the one delivered again.
	pruneUpTo := func(a journal.Action) {
		j.SetAfterConflict(func() {
			j.SetAfterConflict(nil)
			if n, err := j.PruneActions(ctx, a.ReceivedAt.Add(2*time.Second), 10, nil); err != nil || n == 0 {
				t.Errorf("PruneActions = %d, %v", n, err)
			}
		})
	}

	again := olds[0]
	again.MessageID = aip.NewMessageID()
	again.AssignedAt = t0.Add(-time.Minute) // its route is older than the pruned record
	pruneUpTo(olds[0])
	now := t0.Add(time.Hour)
	acc, err := j.AcceptAction(ctx, again.MessageID, now.Add(time.Hour), now, again)
	if !errors.Is(err, journal.ErrPruned) || acc.Claimed {
		t.Fatalf("AcceptAction of an action pruned before its record was read = %+v, %v; want journal.ErrPruned", acc, err)
	}
	if ok, err := j.ClaimMessage(ctx, again.MessageID, now.Add(time.Hour), now); err != nil || !ok {
		t.Fatalf("the refused delivery's message claim was kept (ClaimMessage = %v, %v)", ok, err)
	}
	if _, err := j.Action(ctx, again.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("the pruned action is journaled again (%v)", err)
	}

	// BeginAction (a cancel's record) likewise.
	cancelled := olds[1]
	cancelled.MessageID = aip.NewMessageID()
	cancelled.AssignedAt = t0.Add(-time.Minute)
	pruneUpTo(olds[1])
	if _, created, err := j.BeginAction(ctx, cancelled); !errors.Is(err, journal.ErrPruned) || created {
		t.Fatalf("BeginAction of an action pruned before its record was read = %v, %v; want journal.ErrPruned", created, err)
	}
	if _, err := j.Action(ctx, cancelled.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("the pruned action is journaled again (%v)", err)
	}
}
