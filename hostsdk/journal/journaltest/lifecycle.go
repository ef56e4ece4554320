package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func (s *suite) testProbe(t *testing.T) {
	j := s.open(t)
	for range 3 {
		if err := j.Probe(context.Background()); err != nil {
			t.Fatalf("Probe: %v", err)
		}
	}
	// Probing writes nothing a caller can see.
	if got := allReceipts(t, j); len(got) != 0 {
		t.Fatalf("Probe appended %d receipts", len(got))
	}
	if n := pending(t, j); n != 0 {
		t.Fatalf("Probe enqueued %d batches", n)
	}
}

func (s *suite) testCanceledContext(t *testing.T) {
	j := s.open(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()

	a := newAction(at(0))
	_, _, err := j.BeginAction(ctx, a)
	wantErr(t, "BeginAction(canceled)", err, context.Canceled)
	_, err = j.Action(ctx, a.ActionID)
	wantErr(t, "Action(canceled)", err, context.Canceled)
	_, err = j.ClaimMessage(ctx, "msg-canceled", at(time.Hour), at(0))
	wantErr(t, "ClaimMessage(canceled)", err, context.Canceled)
	_, err = j.PutState(ctx, "ns", "k", json.RawMessage(`1`), 0)
	wantErr(t, "PutState(canceled)", err, context.Canceled)

	// Nothing was written.
	if _, err := j.Action(context.Background(), a.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("BeginAction with a canceled context journaled the action (Action err = %v)", err)
	}
	if !claim(t, j, "msg-canceled", at(time.Hour), at(0)) {
		t.Fatal("ClaimMessage with a canceled context recorded the message ID")
	}
	if _, err := j.State(context.Background(), "ns", "k"); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("PutState with a canceled context wrote the value (State err = %v)", err)
	}
}

func (s *suite) testClosed(t *testing.T) {
	j := s.open(t)
	a := newAction(at(0))
	begin(t, j, a)
	if err := j.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := j.Close(); err != nil {
		t.Fatalf("second Close: %v, want nil (Close is idempotent)", err)
	}

	ctx := context.Background()
	calls := map[string]func() error{
		"BeginAction": func() error { _, _, err := j.BeginAction(ctx, newAction(at(0))); return err },
		"StartAction": func() error { return j.StartAction(ctx, a.ActionID, at(time.Second)) },
		"FinishAction": func() error {
			_, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, nil, "", at(time.Second))
			return err
		},
		"Action": func() error { _, err := j.Action(ctx, a.ActionID); return err },
		"ActionsByStatus": func() error {
			_, err := j.ActionsByStatus(ctx, 10, aip.StateReceived)
			return err
		},
		"ClaimMessage": func() error {
			_, err := j.ClaimMessage(ctx, "m", at(time.Hour), at(0))
			return err
		},
		"PruneMessages": func() error { _, err := j.PruneMessages(ctx, at(0), 10); return err },
		"EnqueueEvents": func() error { return j.EnqueueEvents(ctx, newEntry(t, "c", 1, at(0))) },
		"ClaimEvents": func() error {
			_, err := j.ClaimEvents(ctx, at(0), time.Second, 10)
			return err
		},
		"AckEvents":     func() error { return j.AckEvents(ctx, "id") },
		"RetryEvents":   func() error { return j.RetryEvents(ctx, "id", at(time.Second), "x") },
		"PendingEvents": func() error { _, err := j.PendingEvents(ctx); return err },
		"Receipts":      func() error { _, err := j.Receipts(ctx, 0, 10); return err },
		"State":         func() error { _, err := j.State(ctx, "ns", "k"); return err },
		"PutState": func() error {
			_, err := j.PutState(ctx, "ns", "k", json.RawMessage(`1`), 0)
			return err
		},
		"Probe": func() error { return j.Probe(ctx) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, journal.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", name, err)
		}
	}
}

// testCloseWhileBusy: Close during concurrent use neither hangs nor breaks
// calls in progress: every call either completes or fails with ErrClosed,
// and an action that was begun is either journaled or reported closed.
func (s *suite) testCloseWhileBusy(t *testing.T) {
	const workers = 8
	ctx := context.Background()
	j := s.open(t)
	started := make(chan struct{}, workers)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				a := newAction(at(time.Duration(w*1000+i) * time.Millisecond))
				_, _, err := j.BeginAction(ctx, a)
				if err == nil {
					_, err = j.FinishAction(ctx, a.ActionID, aip.StateCompleted, nil, "", a.ReceivedAt.Add(time.Millisecond))
				}
				if i == 0 {
					started <- struct{}{}
				}
				if errors.Is(err, journal.ErrClosed) {
					errs <- nil
					return
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
			}
		})
	}
	for range workers {
		<-started
	}
	if err := j.Close(); err != nil {
		t.Fatalf("Close while busy: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a call racing Close failed with something other than ErrClosed: %v", err)
		}
	}
}

// testReopen proves, for durable journals, that every kind of record
// survives Close and a reopen on the same storage, and that the receipt
// chain continues where it stopped.
func (s *suite) testReopen(t *testing.T) {
	if s.f.Reopen == nil {
		t.Skip("ephemeral journal: nothing survives a restart")
	}
	ctx := context.Background()
	j := s.open(t)

	done := newAction(at(0))
	begin(t, j, done)
	start(t, j, done.ActionID, at(time.Second))
	finish(t, j, done.ActionID, aip.StateCompleted, `{"output":"kept"}`, at(2*time.Second))
	running := newAction(at(time.Second))
	begin(t, j, running)
	start(t, j, running.ActionID, at(3*time.Second))
	received := newAction(at(2 * time.Second))
	begin(t, j, received)

	msg := aip.NewMessageID()
	claim(t, j, msg, at(time.Hour), at(0))
	entry := newEntry(t, "chan", 2, at(0))
	enqueue(t, j, entry)
	claimEvents(t, j, at(time.Second), time.Minute, 10)
	if err := j.RetryEvents(ctx, entry.ID, at(time.Minute), "central unreachable"); err != nil {
		t.Fatalf("RetryEvents: %v", err)
	}
	put(t, j, "ledger", "k", `{"v":1}`, 0)
	put(t, j, "ledger", "k", `{"v":2}`, 1)

	wantActions := map[string]journal.Action{}
	for _, id := range []string{done.ActionID, running.ActionID, received.ActionID} {
		wantActions[id] = getAction(t, j, id)
	}
	wantReceipts := allReceipts(t, j)

	for round := range 2 {
		if err := j.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		j2 := s.f.Reopen(t, j)
		if j2 == nil {
			t.Fatal("Factory.Reopen returned nil")
		}
		t.Cleanup(func() { _ = j2.Close() })
		j = j2

		for id, want := range wantActions {
			if d := cmp.Diff(want, getAction(t, j, id), cmpOpts...); d != "" {
				t.Fatalf("round %d: action %s after reopen (-want +got):\n%s", round, id, d)
			}
		}
		if d := cmp.Diff(wantReceipts, verifyAll(t, j), cmpOpts...); d != "" {
			t.Fatalf("round %d: receipts after reopen (-want +got):\n%s", round, d)
		}
		if claim(t, j, msg, at(2*time.Hour), at(time.Minute)) {
			t.Fatalf("round %d: the message replay registry was lost: a replay was claimed", round)
		}
		if n := pending(t, j); n != 1 {
			t.Fatalf("round %d: PendingEvents after reopen = %d, want 1", round, n)
		}
		if got := getState(t, j, "ledger", "k"); got.Revision != 2 || string(got.Value) != `{"v":2}` {
			t.Fatalf("round %d: state after reopen = %+v", round, got)
		}
	}

	// The outbox kept its retry state.
	got := claimEvents(t, j, at(time.Minute), time.Minute, 10)
	if len(got) != 1 || got[0].Attempts != 1 || got[0].LastError != "central unreachable" || !got[0].NextAttempt.Equal(at(time.Minute)) {
		t.Fatalf("outbox entry after reopen = %+v, want attempts 1 and the last error", got)
	}

	// Recovery as the host does it: the running action becomes outcome_unknown,
	// the received one failed; the chain continues from the last hash.
	runningNow, err := j.ActionsByStatus(ctx, 10, aip.StateRunning)
	if err != nil || len(runningNow) != 1 || runningNow[0].ActionID != running.ActionID {
		t.Fatalf("ActionsByStatus(running) after reopen = %v, err %v", runningNow, err)
	}
	r := finish(t, j, running.ActionID, aip.StateOutcomeUnknown, "", at(time.Hour))
	if r.Seq != 2 || r.PrevHash != wantReceipts[0].Hash {
		t.Fatalf("first receipt after reopen: seq %d prev %q, want seq 2 linked to %q", r.Seq, r.PrevHash, wantReceipts[0].Hash)
	}
	finish(t, j, received.ActionID, aip.StateFailed, `{"error":"host restarted"}`, at(time.Hour))
	if all := verifyAll(t, j); len(all) != 3 {
		t.Fatalf("%d receipts after recovery, want 3", len(all))
	}
}
