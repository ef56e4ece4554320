package journaltest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// testAcceptAction: one call claims the message and journals the action as
// running; a replayed message writes nothing; a new message for a known
// action returns the record and keeps the claim.
func (s *suite) testAcceptAction(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	a := newAction(at(0))
	msg := a.MessageID
	got, err := j.AcceptAction(ctx, msg, at(time.Hour), at(0), a)
	if err != nil {
		t.Fatalf("AcceptAction: %v", err)
	}
	if !got.Claimed || !got.Created {
		t.Fatalf("AcceptAction of a new action = %+v, want claimed and created", got)
	}
	want := stored(a)
	want.Status, want.StartedAt = aip.StateRunning, a.ReceivedAt
	if d := cmp.Diff(want, getAction(t, j, a.ActionID), cmpOpts...); d != "" {
		t.Fatalf("action after AcceptAction (-want +got):\n%s", d)
	}
	// The message is claimed: ClaimMessage sees a replay.
	if ok, err := j.ClaimMessage(ctx, msg, at(time.Hour), at(time.Second)); err != nil || ok {
		t.Fatalf("ClaimMessage of an accepted message = %v, %v; want false", ok, err)
	}
	// It finishes like a started action.
	finish(t, j, a.ActionID, aip.StateCompleted, `{"done":true}`, at(2*time.Second))

	// The same message again: a replay, nothing written.
	other := newAction(at(3 * time.Second))
	got, err = j.AcceptAction(ctx, msg, at(time.Hour), at(3*time.Second), other)
	if err != nil || got.Claimed || got.Created {
		t.Fatalf("AcceptAction of a replayed message = %+v, %v; want not claimed", got, err)
	}
	if _, err := j.Action(ctx, other.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("a replayed message journaled its action: %v", err)
	}

	// A new message for the known action: claimed, not created, the record
	// returned unchanged.
	again := a
	again.MessageID = aip.NewMessageID()
	again.InputDigest = "sha256:" + "f00d" + a.InputDigest[len("sha256:f00d"):]
	got, err = j.AcceptAction(ctx, again.MessageID, at(time.Hour), at(4*time.Second), again)
	if err != nil || !got.Claimed || got.Created {
		t.Fatalf("AcceptAction of a known action = %+v, %v; want claimed, not created", got, err)
	}
	if got.Existing.Status != aip.StateCompleted || got.Existing.InputDigest != a.InputDigest || string(got.Existing.Result) != `{"done":true}` {
		t.Fatalf("Existing = %+v, want the completed original", got.Existing)
	}
	if ok, _ := j.ClaimMessage(ctx, again.MessageID, at(time.Hour), at(5*time.Second)); ok {
		t.Fatal("the claim of a message for a known action did not commit")
	}

	// An expired claim can be accepted again.
	late := newAction(at(2 * time.Hour))
	got, err = j.AcceptAction(ctx, msg, at(3*time.Hour), at(2*time.Hour), late)
	if err != nil || !got.Claimed || !got.Created {
		t.Fatalf("AcceptAction after the claim expired = %+v, %v; want claimed and created", got, err)
	}
}

func (s *suite) testAcceptActionInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	noID := a
	noID.ActionID = ""
	nulKey := a
	nulKey.IdempotencyKey = "key\x00"
	cases := map[string]func() error{
		"idempotency key with NUL": func() error {
			_, err := j.AcceptAction(ctx, a.MessageID, at(time.Hour), at(0), nulKey)
			return err
		},
		"empty message ID": func() error { _, err := j.AcceptAction(ctx, "", at(time.Hour), at(0), a); return err },
		"expiry not after now": func() error {
			_, err := j.AcceptAction(ctx, a.MessageID, at(0), at(0), a)
			return err
		},
		"no action ID": func() error { _, err := j.AcceptAction(ctx, a.MessageID, at(time.Hour), at(0), noID); return err },
	}
	for name, call := range cases {
		if err := call(); !errors.Is(err, journal.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", name, err)
		}
	}
	// Nothing was claimed by the invalid calls.
	if ok, err := j.ClaimMessage(ctx, a.MessageID, at(time.Hour), at(0)); err != nil || !ok {
		t.Fatalf("an invalid AcceptAction claimed the message: %v, %v", ok, err)
	}
}

// testAcceptActionConcurrent: many deliveries of one action, each in its
// own message, race; exactly one creates it.
func (s *suite) testAcceptActionConcurrent(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	const n = 24
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		errs    []error
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := a
			b.MessageID = aip.NewMessageID()
			got, err := j.AcceptAction(ctx, b.MessageID, at(time.Hour), at(time.Duration(i)*time.Millisecond), b)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if !got.Claimed {
				errs = append(errs, errors.New("a fresh message was not claimed"))
			}
			if got.Created {
				created++
			} else if got.Existing.ActionID != a.ActionID {
				errs = append(errs, errors.New("the Existing record is not the action"))
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if created != 1 {
		t.Fatalf("%d deliveries created the action, want exactly 1", created)
	}
}

func (s *suite) testReceiptFor(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	a := newAction(at(0))
	begin(t, j, a)
	if _, err := j.ReceiptFor(ctx, a.ActionID); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("ReceiptFor an unfinished action: err = %v, want ErrNotFound", err)
	}
	r := finish(t, j, a.ActionID, aip.StateFailed, `{"why":"x"}`, at(time.Second))
	got, err := j.ReceiptFor(ctx, a.ActionID)
	if err != nil {
		t.Fatalf("ReceiptFor: %v", err)
	}
	if d := cmp.Diff(r, got, cmpOpts...); d != "" {
		t.Fatalf("ReceiptFor (-FinishAction's receipt +got):\n%s", d)
	}
	if _, err := j.ReceiptFor(ctx, aip.NewActionID()); !errors.Is(err, journal.ErrNotFound) {
		t.Fatalf("ReceiptFor an unknown action: err = %v, want ErrNotFound", err)
	}
	if _, err := j.ReceiptFor(ctx, ""); !errors.Is(err, journal.ErrInvalid) {
		t.Fatalf("ReceiptFor(\"\"): err = %v, want ErrInvalid", err)
	}
}
