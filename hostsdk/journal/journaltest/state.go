package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

func put(t *testing.T, j journal.Journal, ns, key, value string, expected uint64) uint64 {
	t.Helper()
	rev, err := j.PutState(context.Background(), ns, key, json.RawMessage(value), expected)
	if err != nil {
		t.Fatalf("PutState(%s/%s, expected %d): %v", ns, key, expected, err)
	}
	return rev
}

func getState(t *testing.T, j journal.Journal, ns, key string) journal.StateValue {
	t.Helper()
	v, err := j.State(context.Background(), ns, key)
	if err != nil {
		t.Fatalf("State(%s/%s): %v", ns, key, err)
	}
	return v
}

func (s *suite) testState(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)

	_, err := j.State(ctx, "ledger", "k")
	wantErr(t, "State(absent)", err, journal.ErrNotFound)

	if rev := put(t, j, "ledger", "k", `{"v": 1}`, 0); rev != 1 {
		t.Fatalf("first PutState revision = %d, want 1", rev)
	}
	_, err = j.PutState(ctx, "ledger", "k", json.RawMessage(`{"v":2}`), 0)
	wantErr(t, "PutState(expected absent, present)", err, journal.ErrConflict)
	_, err = j.PutState(ctx, "ledger", "k", json.RawMessage(`{"v":2}`), 2)
	wantErr(t, "PutState(expected ahead)", err, journal.ErrConflict)
	if d := cmp.Diff(journal.StateValue{Value: json.RawMessage(`{"v": 1}`), Revision: 1}, getState(t, j, "ledger", "k")); d != "" {
		t.Fatalf("State after refused writes (-want +got):\n%s", d)
	}

	if rev := put(t, j, "ledger", "k", `[1,2,3]`, 1); rev != 2 {
		t.Fatalf("second PutState revision = %d, want 2", rev)
	}
	_, err = j.PutState(ctx, "ledger", "k", json.RawMessage(`{}`), 1)
	wantErr(t, "PutState(stale revision)", err, journal.ErrConflict)
	if d := cmp.Diff(journal.StateValue{Value: json.RawMessage(`[1,2,3]`), Revision: 2}, getState(t, j, "ledger", "k")); d != "" {
		t.Fatalf("State (-want +got):\n%s", d)
	}

	// Namespaces and keys are independent.
	_, err = j.State(ctx, "other", "k")
	wantErr(t, "State(other namespace)", err, journal.ErrNotFound)
	_, err = j.State(ctx, "ledger", "k2")
	wantErr(t, "State(other key)", err, journal.ErrNotFound)
	if rev := put(t, j, "other", "k", `"x"`, 0); rev != 1 {
		t.Fatalf("PutState in another namespace revision = %d, want 1", rev)
	}
	if got := getState(t, j, "ledger", "k"); got.Revision != 2 {
		t.Fatalf("a write in another namespace changed ledger/k to revision %d", got.Revision)
	}
}

func (s *suite) testStateInvalid(t *testing.T) {
	ctx := context.Background()
	j := s.open(t)
	for name, c := range map[string]struct {
		ns, key, value string
	}{
		"empty namespace": {"", "k", `1`},
		"empty key":       {"ns", "", `1`},
		"empty value":     {"ns", "k", ``},
		"malformed value": {"ns", "k", `{"a"`},
		// encoding/json takes a string that is not UTF-8; PostgreSQL's
		// json type refused it with a storage error while SQLite stored it.
		"value not UTF-8": {"ns", "k", "\"\xff\""},
		// Namespaces and keys are text on every backend (PostgreSQL's text
		// type refuses the others), so a connector tested on one backend
		// behaves the same on the other.
		"namespace not UTF-8": {"ns\xff", "k", `1`},
		"key not UTF-8":       {"ns", "k\xc3", `1`},
		"namespace with NUL":  {"n\x00s", "k", `1`},
		"key with NUL":        {"ns", "k\x00", `1`},
		// Bounded alike on every backend: PostgreSQL's index takes no
		// more, the others would.
		"namespace over its bound": {strings.Repeat("n", journal.MaxStateNamespaceBytes+1), "k", `1`},
		"key over its bound":       {"ns", strings.Repeat("k", journal.MaxStateKeyBytes+1), `1`},
	} {
		_, err := j.PutState(ctx, c.ns, c.key, json.RawMessage(c.value), 0)
		wantErr(t, "PutState("+name+")", err, journal.ErrInvalid)
		if c.value == `1` {
			_, err = j.State(ctx, c.ns, c.key)
			wantErr(t, "State("+name+")", err, journal.ErrInvalid)
		}
	}
}

// testStateConcurrentWriters: writers racing on one revision, round after
// round: exactly one wins each round and the rest are conflicts.
func (s *suite) testStateConcurrentWriters(t *testing.T) {
	const writers, rounds = 12, 6
	ctx := context.Background()
	j := s.open(t)
	for round := range uint64(rounds) {
		var mu sync.Mutex
		var winners []int
		var other []error
		var wg sync.WaitGroup
		for w := range writers {
			wg.Go(func() {
				rev, err := j.PutState(ctx, "cas", "counter", mustJSONNoT(map[string]int{"writer": w}), round)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					if rev != round+1 {
						other = append(other, errorsf("winner got revision %d, want %d", rev, round+1))
					}
					winners = append(winners, w)
				case errors.Is(err, journal.ErrConflict):
				default:
					other = append(other, err)
				}
			})
		}
		wg.Wait()
		if len(winners) != 1 || len(other) > 0 {
			t.Fatalf("round %d: winners %v, errors %v; want exactly one winner", round, winners, other)
		}
		got := getState(t, j, "cas", "counter")
		want := journal.StateValue{Value: mustJSONNoT(map[string]int{"writer": winners[0]}), Revision: round + 1}
		if d := cmp.Diff(want, got); d != "" {
			t.Fatalf("round %d: stored value is not the winner's (-want +got):\n%s", round, d)
		}
	}
}

func mustJSONNoT(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
