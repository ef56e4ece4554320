package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func (s *suite) testDurability(t *testing.T) {
	j := s.open(t)
	switch d := j.Durability(); d {
	case journal.Durable:
		if s.f.Reopen == nil {
			t.Fatal("a durable journal needs Factory.Reopen so the suite can prove its records survive a restart")
		}
	case journal.Ephemeral:
		if s.f.Reopen != nil {
			t.Fatal("Factory.Reopen is set but the journal reports ephemeral durability")
		}
	default:
		t.Fatalf("Durability() = %q, want %q or %q", d, journal.Durable, journal.Ephemeral)
	}
}

func (s *suite) testBeginAction(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	a := newAction(at(0))
	a.UpdatedAt = at(time.Hour) // ignored: a new record has UpdatedAt = ReceivedAt
	got, created, err := j.BeginAction(ctx, a)
	if err != nil {
		t.Fatalf("BeginAction: %v", err)
	}
	if !created {
		t.Fatal("BeginAction: created = false for a new action")
	}
	want := stored(a)
	if d := cmp.Diff(want, got, cmpOpts...); d != "" {
		t.Fatalf("BeginAction returned (-want +got):\n%s", d)
	}
	if d := cmp.Diff(want, getAction(t, j, a.ActionID), cmpOpts...); d != "" {
		t.Fatalf("Action after BeginAction (-want +got):\n%s", d)
	}

	// A redelivery with another input returns the original and writes nothing.
	again := a
	again.InputDigest = "sha256:" + strings.Repeat("0", 64)
	again.CapabilityID = "other.capability"
	again.FenceToken = "fence-8"
	again.ReceivedAt = at(time.Minute)
	got, created, err = j.BeginAction(ctx, again)
	if err != nil {
		t.Fatalf("BeginAction (redelivery): %v", err)
	}
	if created {
		t.Fatal("BeginAction (redelivery): created = true for a journaled action ID")
	}
	if d := cmp.Diff(want, got, cmpOpts...); d != "" {
		t.Fatalf("BeginAction (redelivery) returned (-want +got):\n%s", d)
	}

	// The same holds once the action is terminal: the result is returned.
	start(t, j, a.ActionID, at(time.Second))
	finish(t, j, a.ActionID, aip.StateCompleted, `{"ok":true}`, at(2*time.Second))
	got, created, err = j.BeginAction(ctx, again)
	if err != nil || created {
		t.Fatalf("BeginAction (after finish) = created %v, err %v; want existing record", created, err)
	}
	if got.Status != aip.StateCompleted || string(got.Result) != `{"ok":true}` {
		t.Fatalf("BeginAction (after finish) returned status %q result %s, want completed {\"ok\":true}", got.Status, got.Result)
	}
	if got.InputDigest != a.InputDigest {
		t.Fatalf("BeginAction (after finish) overwrote the input digest: %s", got.InputDigest)
	}

	// An empty status means received.
	b := newAction(at(3 * time.Second))
	b.Status = ""
	got = begin(t, j, b)
	if got.Status != aip.StateReceived {
		t.Fatalf("BeginAction with empty status stored %q, want received", got.Status)
	}

	_, err = j.Action(ctx, aip.NewActionID())
	wantErr(t, "Action(unknown)", err, journal.ErrNotFound)
	_, err = j.Action(ctx, "")
	wantErr(t, "Action(empty ID)", err, journal.ErrInvalid)
}

func (s *suite) testBeginActionInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	cases := map[string]func(a *journal.Action){
		"empty ID":          func(a *journal.Action) { a.ActionID = "" },
		"zero ReceivedAt":   func(a *journal.Action) { a.ReceivedAt = time.Time{} },
		"status running":    func(a *journal.Action) { a.Status = aip.StateRunning },
		"status completed":  func(a *journal.Action) { a.Status = aip.StateCompleted },
		"status unknown":    func(a *journal.Action) { a.Status = "exploded" },
		"status not_found":  func(a *journal.Action) { a.Status = aip.StateNotFound },
		"result on receipt": func(a *journal.Action) { a.Result = json.RawMessage(`{}`) },
		// Strings are text on every backend (PostgreSQL's text type refuses
		// the others).
		"idempotency key with NUL":  func(a *journal.Action) { a.IdempotencyKey = "k\x00" },
		"idempotency key not UTF-8": func(a *journal.Action) { a.IdempotencyKey = "k\xff" },
		"capability not UTF-8":      func(a *journal.Action) { a.CapabilityID = "echo\xc3" },
		"fence token with NUL":      func(a *journal.Action) { a.FenceToken = "\x00" },
		"action ID with NUL":        func(a *journal.Action) { a.ActionID += "\x00" },
	}
	for name, mutate := range cases {
		a := newAction(at(0))
		mutate(&a)
		_, created, err := j.BeginAction(ctx, a)
		if !errors.Is(err, journal.ErrInvalid) || created {
			t.Errorf("BeginAction(%s) = created %v, err %v; want ErrInvalid", name, created, err)
		}
		if a.ActionID != "" {
			// ErrInvalid for an ID that could not be journaled at all.
			if _, err := j.Action(ctx, a.ActionID); !errors.Is(err, journal.ErrNotFound) && !errors.Is(err, journal.ErrInvalid) {
				t.Errorf("BeginAction(%s) journaled the invalid action (Action err = %v)", name, err)
			}
		}
	}
}

func (s *suite) testStartAction(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	a := newAction(at(0))
	begin(t, j, a)
	start(t, j, a.ActionID, at(time.Second))
	want := stored(a)
	want.Status = aip.StateRunning
	want.StartedAt = at(time.Second)
	want.UpdatedAt = at(time.Second)
	if d := cmp.Diff(want, getAction(t, j, a.ActionID), cmpOpts...); d != "" {
		t.Fatalf("Action after StartAction (-want +got):\n%s", d)
	}

	wantErr(t, "StartAction(running)", j.StartAction(ctx, a.ActionID, at(2*time.Second)), journal.ErrConflict)
	wantErr(t, "StartAction(unknown)", j.StartAction(ctx, aip.NewActionID(), at(time.Second)), journal.ErrNotFound)
	wantErr(t, "StartAction(empty ID)", j.StartAction(ctx, "", at(time.Second)), journal.ErrInvalid)
	wantErr(t, "StartAction(zero time)", j.StartAction(ctx, a.ActionID, time.Time{}), journal.ErrInvalid)

	finish(t, j, a.ActionID, aip.StateCompleted, `{}`, at(3*time.Second))
	wantErr(t, "StartAction(terminal)", j.StartAction(ctx, a.ActionID, at(4*time.Second)), journal.ErrConflict)
	if got := getAction(t, j, a.ActionID); got.Status != aip.StateCompleted || !got.StartedAt.Equal(at(time.Second)) {
		t.Fatalf("a refused StartAction changed the record: status %q started %v", got.Status, got.StartedAt)
	}
}

func (s *suite) testFinishAction(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	var prev string
	for i, st := range []aip.ActionState{aip.StateCompleted, aip.StateFailed, aip.StateOutcomeUnknown, aip.StateCancelled} {
		a := newAction(at(time.Duration(i) * time.Minute))
		begin(t, j, a)
		start(t, j, a.ActionID, a.ReceivedAt.Add(time.Second))
		// Whitespace and key order are kept: the journal returns the bytes it was given.
		result := `{"status": "` + string(st) + `", "b": [1, 2.5, "x"], "a": null}`
		done := a.ReceivedAt.Add(2 * time.Second)
		r, err := j.FinishAction(ctx, a.ActionID, st, json.RawMessage(result), "detail "+string(st), done)
		if err != nil {
			t.Fatalf("FinishAction(%s): %v", st, err)
		}
		if r.Seq != uint64(i+1) {
			t.Errorf("receipt %d has seq %d", i+1, r.Seq)
		}
		if err := aip.ValidateID(aip.PrefixReceipt, r.ID); err != nil {
			t.Errorf("receipt ID %q: %v", r.ID, err)
		}
		if r.ActionID != a.ActionID || r.Status != st || !r.At.Equal(done) {
			t.Errorf("receipt = %+v, want action %s status %s at %v", r, a.ActionID, st, done)
		}
		if want := resultDigest(t, result); r.ResultDigest != want {
			t.Errorf("receipt result digest = %q, want %q", r.ResultDigest, want)
		}
		if r.PrevHash != prev {
			t.Errorf("receipt %d prev hash = %q, want %q", r.Seq, r.PrevHash, prev)
		}
		if h, err := journal.ReceiptHash(r); err != nil || h != r.Hash {
			t.Errorf("receipt %d hash = %q, recomputed %q (err %v)", r.Seq, r.Hash, h, err)
		}
		prev = r.Hash

		want := stored(a)
		want.Status = st
		want.StartedAt = a.ReceivedAt.Add(time.Second)
		want.UpdatedAt = done
		want.CompletedAt = done
		want.Result = json.RawMessage(result)
		want.Detail = "detail " + string(st)
		got := getAction(t, j, a.ActionID)
		if d := cmp.Diff(want, got, cmpOpts...); d != "" {
			t.Errorf("Action after FinishAction(%s) (-want +got):\n%s", st, d)
		}
		if string(got.Result) != result {
			t.Errorf("stored result = %s, want the exact bytes %s", got.Result, result)
		}

		// Finishing again is a conflict and changes nothing.
		_, err = j.FinishAction(ctx, a.ActionID, aip.StateFailed, json.RawMessage(`{"again":true}`), "again", done.Add(time.Second))
		wantErr(t, "FinishAction(terminal)", err, journal.ErrConflict)
		if d := cmp.Diff(want, getAction(t, j, a.ActionID), cmpOpts...); d != "" {
			t.Errorf("a refused FinishAction changed the record (-want +got):\n%s", d)
		}
	}
	if got := verifyAll(t, j); len(got) != 4 {
		t.Fatalf("%d receipts after 4 finishes and 4 refused ones, want 4", len(got))
	}

	// A terminal status without a result has an empty result digest.
	a := newAction(at(time.Hour))
	begin(t, j, a)
	r := finish(t, j, a.ActionID, aip.StateCancelled, "", at(time.Hour+time.Second))
	if r.ResultDigest != "" {
		t.Fatalf("receipt without result has digest %q, want empty", r.ResultDigest)
	}
	if got := getAction(t, j, a.ActionID); len(got.Result) != 0 {
		t.Fatalf("action finished without result has result %s", got.Result)
	}
}

func (s *suite) testFinishFromReceived(t *testing.T) {
	j := s.open(t)
	a := newAction(at(0))
	begin(t, j, a)
	finish(t, j, a.ActionID, aip.StateFailed, `{"error":"never started"}`, at(time.Second))
	got := getAction(t, j, a.ActionID)
	if got.Status != aip.StateFailed || !got.StartedAt.IsZero() || !got.CompletedAt.Equal(at(time.Second)) {
		t.Fatalf("received → failed stored status %q started %v completed %v", got.Status, got.StartedAt, got.CompletedAt)
	}
}

func (s *suite) testFinishInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	begin(t, j, a)

	for _, st := range []aip.ActionState{aip.StateReceived, aip.StateRunning, aip.StateNotFound, "", "exploded"} {
		_, err := j.FinishAction(ctx, a.ActionID, st, json.RawMessage(`{}`), "", at(time.Second))
		wantErr(t, "FinishAction(status "+string(st)+")", err, journal.ErrInvalid)
	}
	_, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, json.RawMessage(`{"truncated":`), "", at(time.Second))
	wantErr(t, "FinishAction(malformed result)", err, journal.ErrInvalid)
	_, err = j.FinishAction(ctx, a.ActionID, aip.StateCompleted, nil, "", time.Time{})
	wantErr(t, "FinishAction(zero time)", err, journal.ErrInvalid)
	_, err = j.FinishAction(ctx, "", aip.StateCompleted, nil, "", at(time.Second))
	wantErr(t, "FinishAction(empty ID)", err, journal.ErrInvalid)
	_, err = j.FinishAction(ctx, aip.NewActionID(), aip.StateCompleted, nil, "", at(time.Second))
	wantErr(t, "FinishAction(unknown)", err, journal.ErrNotFound)

	if got := getAction(t, j, a.ActionID); got.Status != aip.StateReceived {
		t.Fatalf("refused finishes changed the status to %q", got.Status)
	}
	if got := allReceipts(t, j); len(got) != 0 {
		t.Fatalf("refused finishes appended %d receipts", len(got))
	}
}

func (s *suite) testReceiptChain(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	if got := allReceipts(t, j); len(got) != 0 {
		t.Fatalf("a new journal has %d receipts", len(got))
	}
	ids := make([]string, 20)
	for i := range ids {
		a := newAction(at(time.Duration(i) * time.Second))
		begin(t, j, a)
		finish(t, j, a.ActionID, aip.StateCompleted, `{"i":`+string(rune('0'+i%10))+`}`, a.ReceivedAt.Add(time.Millisecond))
		ids[i] = a.ActionID
	}
	all := verifyAll(t, j)
	if len(all) != 20 {
		t.Fatalf("%d receipts, want 20", len(all))
	}
	for i, r := range all {
		if r.ActionID != ids[i] {
			t.Fatalf("receipt %d is for %s, want %s", r.Seq, r.ActionID, ids[i])
		}
	}
	// A tail read verifies from the hash of the receipt before it.
	tail, err := j.Receipts(ctx, 15, 100)
	if err != nil {
		t.Fatalf("Receipts(after 15): %v", err)
	}
	if len(tail) != 5 {
		t.Fatalf("Receipts(after 15) returned %d, want 5", len(tail))
	}
	if err := journal.VerifyChain(all[14].Hash, tail); err != nil {
		t.Fatalf("VerifyChain(tail): %v", err)
	}
	if got, err := j.Receipts(ctx, 20, 10); err != nil || len(got) != 0 {
		t.Fatalf("Receipts(after last) = %d receipts, err %v; want none", len(got), err)
	}
	for _, limit := range []int{0, -1} {
		_, err := j.Receipts(ctx, 0, limit)
		wantErr(t, "Receipts(limit <= 0)", err, journal.ErrInvalid)
	}
	// A tampered receipt fails verification (the check the suite relies on works).
	bad := append([]journal.Receipt(nil), all...)
	bad[3].Status = aip.StateFailed
	if err := journal.VerifyChain("", bad); err == nil {
		t.Fatal("VerifyChain accepted a tampered receipt")
	}
}

func (s *suite) testActionsByStatus(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	// Begin in an order unlike the received order.
	offsets := []int{5, 1, 9, 3, 7, 0, 8, 2, 6, 4}
	byOffset := make(map[int]journal.Action)
	for _, o := range offsets {
		a := newAction(at(time.Duration(o) * time.Second))
		begin(t, j, a)
		byOffset[o] = a
	}
	// Even offsets run; 0 and 4 then complete, 6 fails.
	for o := 0; o < 10; o += 2 {
		start(t, j, byOffset[o].ActionID, at(time.Minute))
	}
	finish(t, j, byOffset[0].ActionID, aip.StateCompleted, `{}`, at(2*time.Minute))
	finish(t, j, byOffset[4].ActionID, aip.StateCompleted, `{}`, at(2*time.Minute))
	finish(t, j, byOffset[6].ActionID, aip.StateFailed, `{}`, at(2*time.Minute))

	ids := func(offs ...int) []string {
		out := make([]string, len(offs))
		for i, o := range offs {
			out[i] = byOffset[o].ActionID
		}
		return out
	}
	list := func(limit int, st ...aip.ActionState) []string {
		t.Helper()
		got, err := j.ActionsByStatus(ctx, limit, st...)
		if err != nil {
			t.Fatalf("ActionsByStatus(%d, %v): %v", limit, st, err)
		}
		out := make([]string, len(got))
		for i, a := range got {
			if !containsState(st, a.Status) {
				t.Fatalf("ActionsByStatus(%v) returned an action in status %q", st, a.Status)
			}
			out[i] = a.ActionID
		}
		return out
	}
	check := func(name string, got, want []string) {
		t.Helper()
		if d := cmp.Diff(want, got, cmpOpts...); d != "" {
			t.Errorf("%s (-want +got):\n%s", name, d)
		}
	}
	check("received", list(100, aip.StateReceived), ids(1, 3, 5, 7, 9))
	check("received limit 2", list(2, aip.StateReceived), ids(1, 3))
	check("running", list(100, aip.StateRunning), ids(2, 8))
	check("completed+failed", list(100, aip.StateCompleted, aip.StateFailed), ids(0, 4, 6))
	check("received+running limit 4", list(4, aip.StateRunning, aip.StateReceived), ids(1, 2, 3, 5))
	check("cancelled", list(100, aip.StateCancelled), nil)

	// Full records come back, not just IDs.
	got, err := j.ActionsByStatus(ctx, 1, aip.StateRunning)
	if err != nil || len(got) != 1 {
		t.Fatalf("ActionsByStatus(running, 1) = %d actions, err %v", len(got), err)
	}
	want := stored(byOffset[2])
	want.Status = aip.StateRunning
	want.StartedAt = at(time.Minute)
	want.UpdatedAt = at(time.Minute)
	if d := cmp.Diff(want, got[0], cmpOpts...); d != "" {
		t.Errorf("ActionsByStatus record (-want +got):\n%s", d)
	}

	_, err = j.ActionsByStatus(ctx, 10)
	wantErr(t, "ActionsByStatus(no statuses)", err, journal.ErrInvalid)
	_, err = j.ActionsByStatus(ctx, 0, aip.StateRunning)
	wantErr(t, "ActionsByStatus(limit 0)", err, journal.ErrInvalid)
	_, err = j.ActionsByStatus(ctx, 10, "exploded")
	wantErr(t, "ActionsByStatus(unknown status)", err, journal.ErrInvalid)
}

func containsState(list []aip.ActionState, s aip.ActionState) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// testConcurrentLifecycles runs many goroutines through begin/start/finish on
// distinct actions: every action ends terminal with exactly one receipt, and
// the receipt sequence has no gaps and verifies.
func (s *suite) testConcurrentLifecycles(t *testing.T) {
	const workers, perWorker = 16, 25
	ctx := context.Background()
	j := s.open(t)

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	ids := make([][]string, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range perWorker {
				a := newAction(at(time.Duration(w*perWorker+i) * time.Millisecond))
				if _, created, err := j.BeginAction(ctx, a); err != nil || !created {
					errs <- errorsf("worker %d: BeginAction: created %v, err %v", w, created, err)
					return
				}
				// Half of the actions go straight from received to terminal.
				if rng.IntN(2) == 0 {
					if err := j.StartAction(ctx, a.ActionID, a.ReceivedAt.Add(time.Millisecond)); err != nil {
						errs <- errorsf("worker %d: StartAction: %v", w, err)
						return
					}
				}
				if _, err := j.FinishAction(ctx, a.ActionID, aip.StateCompleted, json.RawMessage(`{"w":1}`), "", a.ReceivedAt.Add(2*time.Millisecond)); err != nil {
					errs <- errorsf("worker %d: FinishAction: %v", w, err)
					return
				}
				ids[w] = append(ids[w], a.ActionID)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	all := verifyAll(t, j)
	if len(all) != workers*perWorker {
		t.Fatalf("%d receipts, want %d", len(all), workers*perWorker)
	}
	if last := all[len(all)-1].Seq; last != uint64(workers*perWorker) {
		t.Fatalf("last receipt seq %d, want %d (a gap or a duplicate)", last, workers*perWorker)
	}
	seen := make(map[string]int)
	for _, r := range all {
		seen[r.ActionID]++
	}
	for _, list := range ids {
		for _, id := range list {
			if seen[id] != 1 {
				t.Fatalf("action %s has %d receipts, want 1", id, seen[id])
			}
		}
	}
	done, err := j.ActionsByStatus(ctx, 2*workers*perWorker, aip.StateCompleted)
	if err != nil || len(done) != workers*perWorker {
		t.Fatalf("ActionsByStatus(completed) = %d, err %v; want %d", len(done), err, workers*perWorker)
	}
}

// testConcurrentFinishSameAction: of many concurrent finishes of one action
// exactly one wins; the others are conflicts and append nothing.
func (s *suite) testConcurrentFinishSameAction(t *testing.T) {
	const racers = 16
	ctx := context.Background()
	j := s.open(t)
	for round := range 5 {
		a := newAction(at(time.Duration(round) * time.Second))
		begin(t, j, a)
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins, conflicts := 0, 0
		var other []error
		for i := range racers {
			wg.Go(func() {
				st := []aip.ActionState{aip.StateCompleted, aip.StateFailed, aip.StateCancelled}[i%3]
				_, err := j.FinishAction(ctx, a.ActionID, st, json.RawMessage(`{}`), "", a.ReceivedAt.Add(time.Second))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case errors.Is(err, journal.ErrConflict):
					conflicts++
				default:
					other = append(other, err)
				}
			})
		}
		wg.Wait()
		if wins != 1 || conflicts != racers-1 || len(other) > 0 {
			t.Fatalf("round %d: %d wins, %d conflicts, other errors %v; want 1 win", round, wins, conflicts, other)
		}
	}
	if all := verifyAll(t, j); len(all) != 5 {
		t.Fatalf("%d receipts after 5 contested actions, want 5", len(all))
	}
}

// testConcurrentBeginSameAction: of many concurrent begins of one action ID
// exactly one creates it; the others get the same record back.
func (s *suite) testConcurrentBeginSameAction(t *testing.T) {
	const racers = 16
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	var errs []error
	for i := range racers {
		wg.Go(func() {
			b := a
			b.FenceToken = "fence-" + string(rune('a'+i))
			got, c, err := j.BeginAction(ctx, b)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if c {
				created++
			}
			if got.ActionID != a.ActionID || got.Status != aip.StateReceived {
				errs = append(errs, errorsf("BeginAction returned %+v", got))
			}
		})
	}
	wg.Wait()
	if created != 1 || len(errs) > 0 {
		t.Fatalf("%d of %d concurrent begins created the action (errors %v); want exactly 1", created, racers, errs)
	}
}

// Free text (an action's Detail, an outbox batch's LastError) often quotes
// a provider's or connector's message verbatim. It is stored as text: bytes
// that are not UTF-8, and NUL, become U+FFFD on every backend, so a message
// PostgreSQL's text type would refuse never fails the write that records an
// outcome.
func (s *suite) testFreeText(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	const raw, want = "provider said \xff\xfe, then \x00 and \xe2\x82", "provider said \uFFFD, then \uFFFD and \uFFFD"

	a := newAction(at(0))
	begin(t, j, a)
	if _, err := j.FinishAction(ctx, a.ActionID, aip.StateFailed, json.RawMessage(`{}`), raw, at(time.Second)); err != nil {
		t.Fatalf("FinishAction with a detail that is not UTF-8 text: %v", err)
	}
	if got := getAction(t, j, a.ActionID).Detail; got != want {
		t.Errorf("stored detail %q, want %q", got, want)
	}
	if got := verifyAll(t, j); len(got) != 1 {
		t.Fatalf("%d receipts, want 1", len(got))
	}

	e := newEntry(t, "chan", 1, at(0))
	e.LastError = raw
	enqueue(t, j, e)
	got := claimEvents(t, j, at(time.Second), 30*time.Second, 1)
	if len(got) != 1 || got[0].LastError != want {
		t.Fatalf("enqueued batch claimed as %+v, want last error %q", got, want)
	}
	if err := j.RetryEvents(ctx, e.ID, at(time.Minute), raw+"!"); err != nil {
		t.Fatalf("RetryEvents with an error text that is not UTF-8: %v", err)
	}
	got = claimEvents(t, j, at(time.Minute), 30*time.Second, 1)
	if len(got) != 1 || got[0].LastError != want+"!" {
		t.Fatalf("retried batch claimed as %+v, want last error %q", got, want+"!")
	}
}
