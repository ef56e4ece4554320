// Package journaltest is the conformance suite of the runtime journal
// contract (package journal). Every backend runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		journaltest.Run(t, journaltest.Factory{
//			Open:   func(t *testing.T) journal.Journal { ... fresh storage ... },
//			Reopen: func(t *testing.T, closed journal.Journal) journal.Journal { ... same storage ... },
//		})
//	}
//
// The suite covers every method and rule of the contract: action idempotence
// and status transitions, receipts appended with their terminal transition in
// one hash chain without gaps, pruning old actions with their receipts and
// the prune horizon that refuses to journal them again, the message replay registry with expiry, the
// event outbox with leases and retry state, compare-and-set state, Probe,
// ErrClosed after Close, and, for durable backends, that every kind of record
// survives Close and a reopen on the same storage.
//
// A backend's schema-upgrade test shares its fixture and checks: UpgradeData
// writes the records of an older build (through that build's statements
// where they changed), and after the backend has upgraded the storage its
// own way, CheckUnchanged and CheckPruned check that every record reads
// back the same and that pruning and the prune horizon work on the old
// actions:
//
//	f := journaltest.UpgradeData(t, old, journaltest.UpgradeWriter{Begin: ..., Accept: ...})
//	... close old, upgrade the storage, open j on it ...
//	f.CheckUnchanged(t, j)
//	j = f.CheckPruned(t, j, nil)
package journaltest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Factory opens journals for the suite.
type Factory struct {
	// Open returns a journal on new, empty storage that no other journal
	// of the test uses. Required. The suite closes the journal; Open may
	// also register a cleanup that closes it (Close is idempotent).
	Open func(t *testing.T) journal.Journal
	// Reopen returns a new journal on the storage of closed, which the suite
	// has already closed. It must be set for a backend whose Durability is
	// journal.Durable and left nil for an ephemeral one.
	Reopen func(t *testing.T, closed journal.Journal) journal.Journal
}

// Run runs the conformance suite as subtests of t.
func Run(t *testing.T, f Factory) {
	t.Helper()
	if f.Open == nil {
		t.Fatal("journaltest: Factory.Open is required")
	}
	s := &suite{f: f}
	t.Run("Durability", s.testDurability)
	t.Run("BeginAction", s.testBeginAction)
	t.Run("BeginActionInvalid", s.testBeginActionInvalid)
	t.Run("StartAction", s.testStartAction)
	t.Run("AcceptAction", s.testAcceptAction)
	t.Run("AcceptActionInvalid", s.testAcceptActionInvalid)
	t.Run("AcceptActionConcurrent", s.testAcceptActionConcurrent)
	t.Run("ReceiptFor", s.testReceiptFor)
	t.Run("FinishAction", s.testFinishAction)
	t.Run("FinishFromReceived", s.testFinishFromReceived)
	t.Run("FinishInvalid", s.testFinishInvalid)
	t.Run("FreeText", s.testFreeText)
	t.Run("ReceiptChain", s.testReceiptChain)
	t.Run("ActionsByStatus", s.testActionsByStatus)
	t.Run("ConcurrentLifecycles", s.testConcurrentLifecycles)
	t.Run("ConcurrentFinishSameAction", s.testConcurrentFinishSameAction)
	t.Run("ConcurrentBeginSameAction", s.testConcurrentBeginSameAction)
	t.Run("PruneActions", s.testPruneActions)
	t.Run("PruneKeepsTheChainContiguous", s.testPruneKeepsTheChainContiguous)
	t.Run("PruneHorizon", s.testPruneHorizon)
	t.Run("PruneInvalid", s.testPruneInvalid)
	t.Run("PruneActionState", s.testPruneActionState)
	t.Run("PruneHorizonSurvivesReopen", s.testPruneHorizonSurvivesReopen)
	t.Run("PruneHorizonCoversReceipt", s.testPruneHorizonCoversReceipt)
	t.Run("TimesToTheMicrosecond", s.testTimesToTheMicrosecond)
	t.Run("ClaimMessage", s.testClaimMessage)
	t.Run("ClaimMessageConcurrent", s.testClaimMessageConcurrent)
	t.Run("PruneMessages", s.testPruneMessages)
	t.Run("Outbox", s.testOutbox)
	t.Run("OutboxLeases", s.testOutboxLeases)
	t.Run("OutboxRetry", s.testOutboxRetry)
	t.Run("OutboxInvalid", s.testOutboxInvalid)
	t.Run("OutboxConcurrentClaims", s.testOutboxConcurrentClaims)
	t.Run("State", s.testState)
	t.Run("StateInvalid", s.testStateInvalid)
	t.Run("StateConcurrentWriters", s.testStateConcurrentWriters)
	t.Run("Probe", s.testProbe)
	t.Run("CanceledContext", s.testCanceledContext)
	t.Run("Closed", s.testClosed)
	t.Run("CloseWhileBusy", s.testCloseWhileBusy)
	t.Run("Reopen", s.testReopen)
}

type suite struct {
	f Factory
}

// open returns a journal on fresh storage and closes it when the test ends.
func (s *suite) open(t *testing.T) journal.Journal {
	t.Helper()
	j := s.f.Open(t)
	if j == nil {
		t.Fatal("journaltest: Factory.Open returned nil")
	}
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// t0 is the suite's reference time: millisecond precision, as AIP uses.
var t0 = time.Date(2026, time.March, 1, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// cmpOpts compare records: times by Equal (cmp uses the Equal method), nil
// and empty results alike.
var cmpOpts = []cmp.Option{cmpopts.EquateEmpty()}

// newAction returns a new received action with every field set.
func newAction(received time.Time) journal.Action {
	id := aip.NewActionID()
	return journal.Action{
		ActionID:       id,
		CapabilityID:   "echo.say",
		TenantID:       "tenant-a",
		IdempotencyKey: "idem-" + id,
		InputDigest:    aip.DigestBytes([]byte(`{"input":"` + id + `"}`)),
		FenceToken:     "fence-7",
		MessageID:      aip.NewMessageID(),
		Status:         aip.StateReceived,
		ReceivedAt:     received,
	}
}

// stored is what BeginAction records for a.
func stored(a journal.Action) journal.Action {
	a.Status = aip.StateReceived
	a.UpdatedAt = a.ReceivedAt
	return a
}

func begin(t *testing.T, j journal.Journal, a journal.Action) journal.Action {
	t.Helper()
	got, created, err := j.BeginAction(context.Background(), a)
	if err != nil {
		t.Fatalf("BeginAction(%s): %v", a.ActionID, err)
	}
	if !created {
		t.Fatalf("BeginAction(%s): created = false for a new action", a.ActionID)
	}
	return got
}

func start(t *testing.T, j journal.Journal, id string, when time.Time) {
	t.Helper()
	if err := j.StartAction(context.Background(), id, when); err != nil {
		t.Fatalf("StartAction(%s): %v", id, err)
	}
}

func finish(t *testing.T, j journal.Journal, id string, st aip.ActionState, result string, when time.Time) journal.Receipt {
	t.Helper()
	r, err := j.FinishAction(context.Background(), id, st, rawOrNil(result), "", when)
	if err != nil {
		t.Fatalf("FinishAction(%s, %s): %v", id, st, err)
	}
	return r
}

func rawOrNil(s string) json.RawMessage {
	if s == "" {
		return nil
	}
	return json.RawMessage(s)
}

func getAction(t *testing.T, j journal.Journal, id string) journal.Action {
	t.Helper()
	a, err := j.Action(context.Background(), id)
	if err != nil {
		t.Fatalf("Action(%s): %v", id, err)
	}
	return a
}

// allReceipts pages through every receipt with a small page size so paging
// is exercised too.
func allReceipts(t *testing.T, j journal.Journal) []journal.Receipt {
	t.Helper()
	var all []journal.Receipt
	var after uint64
	for {
		page, err := j.Receipts(context.Background(), after, 7)
		if err != nil {
			t.Fatalf("Receipts(after %d): %v", after, err)
		}
		if len(page) > 7 {
			t.Fatalf("Receipts(after %d, limit 7) returned %d receipts", after, len(page))
		}
		if len(page) == 0 {
			return all
		}
		if page[0].Seq != after+1 {
			t.Fatalf("Receipts(after %d) starts at seq %d, want %d", after, page[0].Seq, after+1)
		}
		all = append(all, page...)
		after = page[len(page)-1].Seq
	}
}

func verifyAll(t *testing.T, j journal.Journal) []journal.Receipt {
	t.Helper()
	all := allReceipts(t, j)
	if len(all) > 0 && all[0].Seq != 1 {
		t.Fatalf("first receipt has seq %d, want 1", all[0].Seq)
	}
	if err := journal.VerifyChain("", all); err != nil {
		t.Fatalf("VerifyChain over %d receipts: %v", len(all), err)
	}
	return all
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

func mustJSON(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	return b
}

func resultDigest(t *testing.T, result string) string {
	t.Helper()
	if result == "" {
		return ""
	}
	d, err := aip.DigestJSON([]byte(result))
	if err != nil {
		t.Fatalf("DigestJSON: %v", err)
	}
	return d
}

func errorsf(format string, args ...any) error { return fmt.Errorf(format, args...) }
