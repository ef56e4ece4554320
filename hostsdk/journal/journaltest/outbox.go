package journaltest

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// newEntry returns an outbox batch whose ID is the content address of its
// channel and events, as the host computes it.
func newEntry(t *testing.T, channel string, n int, created time.Time) journal.OutboxEntry {
	t.Helper()
	events := make([]map[string]any, n)
	for i := range events {
		events[i] = map[string]any{"event_id": aip.NewID(aip.PrefixEvent), "type": "provider.updated", "n": i}
	}
	raw := mustJSON(t, events)
	id, err := aip.Digest(map[string]any{"channel_id": channel, "events": json.RawMessage(raw)})
	if err != nil {
		t.Fatalf("digest: %v", err)
	}
	return journal.OutboxEntry{ID: id, ChannelID: channel, Events: raw, CreatedAt: created}
}

func enqueue(t *testing.T, j journal.Journal, e journal.OutboxEntry) {
	t.Helper()
	if err := j.EnqueueEvents(context.Background(), e); err != nil {
		t.Fatalf("EnqueueEvents(%s): %v", e.ID, err)
	}
}

func claimEvents(t *testing.T, j journal.Journal, now time.Time, lease time.Duration, limit int) []journal.OutboxEntry {
	t.Helper()
	got, err := j.ClaimEvents(context.Background(), now, lease, limit)
	if err != nil {
		t.Fatalf("ClaimEvents(%v): %v", now, err)
	}
	if len(got) > limit {
		t.Fatalf("ClaimEvents(limit %d) returned %d batches", limit, len(got))
	}
	return got
}

func pending(t *testing.T, j journal.Journal) int {
	t.Helper()
	n, err := j.PendingEvents(context.Background())
	if err != nil {
		t.Fatalf("PendingEvents: %v", err)
	}
	return n
}

func entryIDs(es []journal.OutboxEntry) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	slices.Sort(out)
	return out
}

func (s *suite) testOutbox(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	if n := pending(t, j); n != 0 {
		t.Fatalf("PendingEvents on a new journal = %d", n)
	}

	e := newEntry(t, "chan-1", 3, at(0))
	enqueue(t, j, e)
	// Enqueuing the same batch again changes nothing, whatever else it says.
	again := e
	again.Attempts = 9
	again.LastError = "should not be stored"
	again.NextAttempt = at(time.Hour)
	enqueue(t, j, again)
	if n := pending(t, j); n != 1 {
		t.Fatalf("PendingEvents after enqueuing one batch twice = %d, want 1", n)
	}

	got := claimEvents(t, j, at(time.Second), 30*time.Second, 10)
	want := []journal.OutboxEntry{{
		ID: e.ID, ChannelID: "chan-1", Events: e.Events,
		NextAttempt: at(0), // zero NextAttempt means CreatedAt
		LeaseUntil:  at(31 * time.Second),
		CreatedAt:   at(0),
	}}
	if d := cmp.Diff(want, got, cmpOpts...); d != "" {
		t.Fatalf("ClaimEvents (-want +got):\n%s", d)
	}
	if string(got[0].Events) != string(e.Events) {
		t.Fatalf("claimed events = %s, want the exact bytes %s", got[0].Events, e.Events)
	}

	if err := j.AckEvents(ctx, e.ID); err != nil {
		t.Fatalf("AckEvents: %v", err)
	}
	if n := pending(t, j); n != 0 {
		t.Fatalf("PendingEvents after ack = %d, want 0", n)
	}
	wantErr(t, "AckEvents(acked)", j.AckEvents(ctx, e.ID), journal.ErrNotFound)
	wantErr(t, "RetryEvents(acked)", j.RetryEvents(ctx, e.ID, at(time.Minute), "x"), journal.ErrNotFound)
	if got := claimEvents(t, j, at(time.Hour), time.Second, 10); len(got) != 0 {
		t.Fatalf("an acked batch was claimed: %v", entryIDs(got))
	}

	// A batch scheduled for later is not due before its time.
	later := newEntry(t, "chan-2", 1, at(0))
	later.NextAttempt = at(10 * time.Minute)
	enqueue(t, j, later)
	if got := claimEvents(t, j, at(10*time.Minute-time.Millisecond), time.Second, 10); len(got) != 0 {
		t.Fatalf("a batch was claimed before its next attempt: %v", entryIDs(got))
	}
	if got := claimEvents(t, j, at(10*time.Minute), time.Second, 10); len(got) != 1 || got[0].ID != later.ID {
		t.Fatalf("the batch due at its next attempt was not claimed: %v", entryIDs(got))
	}
}

func (s *suite) testOutboxLeases(t *testing.T) {
	j := s.open(t)
	var all []string
	for i := range 5 {
		e := newEntry(t, "chan", i+1, at(time.Duration(i)*time.Millisecond))
		enqueue(t, j, e)
		all = append(all, e.ID)
	}
	slices.Sort(all)
	if n := pending(t, j); n != 5 {
		t.Fatalf("PendingEvents = %d, want 5", n)
	}
	now := at(time.Second)
	first := claimEvents(t, j, now, 30*time.Second, 3)
	if len(first) != 3 {
		t.Fatalf("ClaimEvents(limit 3) returned %d of 5 due batches", len(first))
	}
	for _, e := range first {
		if !e.LeaseUntil.Equal(now.Add(30 * time.Second)) {
			t.Fatalf("claimed batch leased until %v, want %v", e.LeaseUntil, now.Add(30*time.Second))
		}
	}
	second := claimEvents(t, j, now, 30*time.Second, 10)
	if len(second) != 2 {
		t.Fatalf("second claim returned %d batches, want the 2 unleased ones", len(second))
	}
	if both := append(entryIDs(first), entryIDs(second)...); len(both) != 5 || !disjoint(entryIDs(first), entryIDs(second)) {
		t.Fatalf("claims overlap: %v and %v", entryIDs(first), entryIDs(second))
	}
	// Leased batches stay pending and are not claimed again before the lease passes.
	if n := pending(t, j); n != 5 {
		t.Fatalf("PendingEvents with leased batches = %d, want 5", n)
	}
	if got := claimEvents(t, j, now.Add(30*time.Second-time.Millisecond), 30*time.Second, 10); len(got) != 0 {
		t.Fatalf("batches claimed while leased: %v", entryIDs(got))
	}
	// Once the lease passes, they are claimable again (a publisher that died).
	again := claimEvents(t, j, now.Add(30*time.Second), time.Minute, 10)
	if d := cmp.Diff(all, entryIDs(again)); d != "" {
		t.Fatalf("claim after the lease passed (-want +got):\n%s", d)
	}
	for _, e := range again {
		if e.Attempts != 0 {
			t.Fatalf("an expired lease counted as an attempt: attempts %d", e.Attempts)
		}
	}
}

func disjoint(a, b []string) bool {
	for _, x := range a {
		if slices.Contains(b, x) {
			return false
		}
	}
	return true
}

func (s *suite) testOutboxRetry(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	e := newEntry(t, "chan", 2, at(0))
	enqueue(t, j, e)

	claimEvents(t, j, at(time.Second), 30*time.Second, 1)
	if err := j.RetryEvents(ctx, e.ID, at(time.Minute), "central answered 503"); err != nil {
		t.Fatalf("RetryEvents: %v", err)
	}
	// The lease is released, but the batch waits for its next attempt.
	if got := claimEvents(t, j, at(time.Minute-time.Millisecond), 30*time.Second, 10); len(got) != 0 {
		t.Fatal("a retried batch was claimed before its next attempt")
	}
	got := claimEvents(t, j, at(time.Minute), 30*time.Second, 10)
	want := []journal.OutboxEntry{{
		ID: e.ID, ChannelID: e.ChannelID, Events: e.Events,
		Attempts: 1, NextAttempt: at(time.Minute), LeaseUntil: at(time.Minute + 30*time.Second),
		LastError: "central answered 503", CreatedAt: at(0),
	}}
	if d := cmp.Diff(want, got, cmpOpts...); d != "" {
		t.Fatalf("claim after retry (-want +got):\n%s", d)
	}

	// A retry releases the lease even when the next attempt is already due.
	if err := j.RetryEvents(ctx, e.ID, at(time.Minute), "timeout"); err != nil {
		t.Fatalf("RetryEvents: %v", err)
	}
	got = claimEvents(t, j, at(time.Minute), 30*time.Second, 10)
	if len(got) != 1 || got[0].Attempts != 2 || got[0].LastError != "timeout" {
		t.Fatalf("claim after second retry = %+v, want attempts 2 and the last error", got)
	}
	if err := j.AckEvents(ctx, e.ID); err != nil {
		t.Fatalf("AckEvents: %v", err)
	}
	if n := pending(t, j); n != 0 {
		t.Fatalf("PendingEvents after ack = %d", n)
	}
}

func (s *suite) testOutboxInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	cases := map[string]func(e *journal.OutboxEntry){
		"empty ID":          func(e *journal.OutboxEntry) { e.ID = "" },
		"empty channel":     func(e *journal.OutboxEntry) { e.ChannelID = "" },
		"no events":         func(e *journal.OutboxEntry) { e.Events = nil },
		"events not JSON":   func(e *journal.OutboxEntry) { e.Events = json.RawMessage(`[{"a":`) },
		"events not array":  func(e *journal.OutboxEntry) { e.Events = json.RawMessage(`{"a":1}`) },
		"events null":       func(e *journal.OutboxEntry) { e.Events = json.RawMessage(`null`) },
		"events empty":      func(e *journal.OutboxEntry) { e.Events = json.RawMessage(`[]`) },
		"zero CreatedAt":    func(e *journal.OutboxEntry) { e.CreatedAt = time.Time{} },
		"negative attempts": func(e *journal.OutboxEntry) { e.Attempts = -1 },
		// PostgreSQL's json type refused it with a storage error while
		// SQLite stored it.
		"events not UTF-8": func(e *journal.OutboxEntry) { e.Events = json.RawMessage("[{\"a\":\"\xff\"}]") },
		// Identifiers are text on every backend, as the contract says: SQLite
		// and memjournal stored these.
		"ID not UTF-8":      func(e *journal.OutboxEntry) { e.ID = "batch\xff" },
		"ID with NUL":       func(e *journal.OutboxEntry) { e.ID = "batch\x00" },
		"channel not UTF-8": func(e *journal.OutboxEntry) { e.ChannelID = "chan\xff" },
		"channel with NUL":  func(e *journal.OutboxEntry) { e.ChannelID = "chan\x00" },
	}
	for name, mutate := range cases {
		e := newEntry(t, "chan", 1, at(0))
		mutate(&e)
		wantErr(t, "EnqueueEvents("+name+")", j.EnqueueEvents(ctx, e), journal.ErrInvalid)
	}
	if n := pending(t, j); n != 0 {
		t.Fatalf("invalid batches were enqueued: PendingEvents = %d", n)
	}
	_, err := j.ClaimEvents(ctx, at(0), 0, 10)
	wantErr(t, "ClaimEvents(lease 0)", err, journal.ErrInvalid)
	_, err = j.ClaimEvents(ctx, at(0), time.Second, 0)
	wantErr(t, "ClaimEvents(limit 0)", err, journal.ErrInvalid)
	wantErr(t, "AckEvents(empty)", j.AckEvents(ctx, ""), journal.ErrInvalid)
	wantErr(t, "RetryEvents(empty)", j.RetryEvents(ctx, "", at(0), "x"), journal.ErrInvalid)
	wantErr(t, "RetryEvents(zero next)", j.RetryEvents(ctx, "some-id", time.Time{}, "x"), journal.ErrInvalid)
}

// testOutboxConcurrentClaims: publishers racing over one outbox never lease
// the same batch twice.
func (s *suite) testOutboxConcurrentClaims(t *testing.T) {
	const batches, publishers = 40, 8
	ctx := context.Background()
	j := s.open(t)
	for i := range batches {
		enqueue(t, j, newEntry(t, "chan", 1, at(time.Duration(i)*time.Millisecond)))
	}
	var mu sync.Mutex
	claimed := make(map[string]int)
	var errs []error
	var wg sync.WaitGroup
	for range publishers {
		wg.Go(func() {
			// Bounded: a journal that hands out leased batches again must
			// fail the test, not loop forever.
			for range batches + 1 {
				got, err := j.ClaimEvents(ctx, at(time.Second), time.Minute, 3)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				for _, e := range got {
					claimed[e.ID]++
				}
				mu.Unlock()
				if len(got) == 0 {
					return
				}
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("ClaimEvents: %v", errs)
	}
	if len(claimed) != batches {
		t.Fatalf("%d distinct batches claimed, want %d", len(claimed), batches)
	}
	for id, n := range claimed {
		if n != 1 {
			t.Fatalf("batch %s was leased %d times under one lease", id, n)
		}
	}
}
