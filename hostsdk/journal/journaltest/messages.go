package journaltest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func claim(t *testing.T, j journal.Journal, id string, expires, now time.Time) bool {
	t.Helper()
	ok, err := j.ClaimMessage(context.Background(), id, expires, now)
	if err != nil {
		t.Fatalf("ClaimMessage(%s): %v", id, err)
	}
	return ok
}

func (s *suite) testClaimMessage(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	id := aip.NewMessageID()

	if !claim(t, j, id, at(time.Minute), at(0)) {
		t.Fatal("first claim of a message ID = false, want true")
	}
	if claim(t, j, id, at(2*time.Minute), at(time.Second)) {
		t.Fatal("replayed message ID before its expiry was claimed again")
	}
	// The refused replay did not extend the expiry: the ID is free at 1m.
	if claim(t, j, id, at(2*time.Minute), at(time.Minute-time.Millisecond)) {
		t.Fatal("message ID claimed again one millisecond before its expiry")
	}
	if !claim(t, j, id, at(3*time.Minute), at(time.Minute)) {
		t.Fatal("message ID at its expiry could not be claimed again")
	}
	// The new claim holds until its own expiry.
	if claim(t, j, id, at(4*time.Minute), at(2*time.Minute)) {
		t.Fatal("message ID claimed again under the renewed claim")
	}
	if !claim(t, j, aip.NewMessageID(), at(time.Minute), at(30*time.Second)) {
		t.Fatal("another message ID was refused")
	}

	_, err := j.ClaimMessage(ctx, "", at(time.Minute), at(0))
	wantErr(t, "ClaimMessage(empty ID)", err, journal.ErrInvalid)
	_, err = j.ClaimMessage(ctx, aip.NewMessageID(), at(0), at(0))
	wantErr(t, "ClaimMessage(expiry = now)", err, journal.ErrInvalid)
	_, err = j.ClaimMessage(ctx, aip.NewMessageID(), at(0), at(time.Second))
	wantErr(t, "ClaimMessage(expiry before now)", err, journal.ErrInvalid)
}

// testClaimMessageConcurrent: of many goroutines claiming one message ID,
// exactly one wins, round after round.
func (s *suite) testClaimMessageConcurrent(t *testing.T) {
	const racers = 32
	ctx := context.Background()
	j := s.open(t)
	for round := range 5 {
		id := aip.NewMessageID()
		var wins atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, racers)
		for range racers {
			wg.Go(func() {
				ok, err := j.ClaimMessage(ctx, id, at(time.Hour), at(0))
				if err != nil {
					errs <- err
					return
				}
				if ok {
					wins.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: ClaimMessage: %v", round, err)
		}
		if n := wins.Load(); n != 1 {
			t.Fatalf("round %d: %d of %d concurrent claims of one message ID won, want exactly 1", round, n, racers)
		}
	}
}

func (s *suite) testPruneMessages(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	var expired, live []string
	for i := range 5 {
		id := aip.NewMessageID()
		claim(t, j, id, at(time.Duration(i+1)*time.Second), at(0))
		expired = append(expired, id)
	}
	for range 3 {
		id := aip.NewMessageID()
		claim(t, j, id, at(time.Hour), at(0))
		live = append(live, id)
	}
	now := at(5 * time.Second) // the last expired one expires exactly now

	prune := func(limit int) int {
		t.Helper()
		n, err := j.PruneMessages(ctx, now, limit)
		if err != nil {
			t.Fatalf("PruneMessages(limit %d): %v", limit, err)
		}
		return n
	}
	if n := prune(2); n != 2 {
		t.Fatalf("PruneMessages(limit 2) = %d, want 2", n)
	}
	if n := prune(10); n != 3 {
		t.Fatalf("PruneMessages(limit 10) = %d, want the 3 remaining expired IDs", n)
	}
	if n := prune(10); n != 0 {
		t.Fatalf("PruneMessages on a pruned registry = %d, want 0", n)
	}
	for _, id := range live {
		if claim(t, j, id, at(2*time.Hour), now) {
			t.Fatalf("live message ID %s was pruned", id)
		}
	}
	for _, id := range expired {
		if !claim(t, j, id, at(2*time.Hour), now) {
			t.Fatalf("pruned message ID %s cannot be claimed", id)
		}
	}
	for _, limit := range []int{0, -3} {
		_, err := j.PruneMessages(ctx, now, limit)
		wantErr(t, "PruneMessages(limit <= 0)", err, journal.ErrInvalid)
	}
}

// testTimesToTheMicrosecond: the times a call compares with what is
// stored count to the microsecond, as every time is kept, so backends
// agree on a comparison within one microsecond: a message claimed until
// T+999ns is expired at T+500ns (its expiry is kept as T), and an action
// completed at T+999ns (kept as T) was not completed before T+500ns. The
// memory journal compared the nanoseconds and disagreed with SQLite and
// PostgreSQL on both.
func (s *suite) testTimesToTheMicrosecond(t *testing.T) {
	j := s.open(t)
	const in, later = 999 * time.Nanosecond, 500 * time.Nanosecond
	id := aip.NewMessageID()
	if !claim(t, j, id, at(time.Second+in), at(0)) {
		t.Fatal("first claim of a message ID = false, want true")
	}
	if !claim(t, j, id, at(time.Hour), at(time.Second+later)) {
		t.Fatal("a message ID claimed until T+999ns could not be claimed again at T+500ns (its expiry is kept as T)")
	}

	a := newAction(at(0))
	begin(t, j, a)
	finish(t, j, a.ActionID, aip.StateCompleted, `{}`, at(time.Minute+in))
	prune(t, j, at(time.Minute+later), 10, 0)
	prune(t, j, at(time.Minute+time.Microsecond), 10, 1)
}
