package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// The tests of this file run the host on both durable journals, the
// embedded SQLite one and PostgreSQL, and lose the answer of one journal
// write the way a PostgreSQL connection that drops after the server
// committed (or before it did) loses it: the host cannot tell whether the
// write took.

// openDurable opens a fresh journal of rt (durableJournals, one each of
// the embedded SQLite and the PostgreSQL runtime), closed when the test
// ends.
func openDurable(t *testing.T, rt durableJournal) journal.Journal {
	t.Helper()
	j := rt.storage(t)(t)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// errLostAnswer is what a journal call returns when its answer was lost.
var errLostAnswer = errors.New("storage: unexpected EOF while reading the answer")

// lossyJournal loses the answer of chosen writes of a real journal: a
// write "lost after commit" is made and then reported as failed; one "lost
// before commit" is not made at all.
type lossyJournal struct {
	journal.Journal
	// acceptAfterCommit, acceptBeforeCommit: how many AcceptAction calls
	// that would create their action lose their answer.
	acceptAfterCommit, acceptBeforeCommit atomic.Int32
	// finishBeforeCommit: how many FinishAction calls fail unmade.
	finishBeforeCommit atomic.Int32
}

func (j *lossyJournal) AcceptAction(ctx context.Context, messageID string, expires, now time.Time, a journal.Action) (journal.Accepted, error) {
	if j.acceptBeforeCommit.Add(-1) >= 0 {
		return journal.Accepted{}, errLostAnswer
	}
	acc, err := j.Journal.AcceptAction(ctx, messageID, expires, now, a)
	if err == nil && acc.Created && j.acceptAfterCommit.Add(-1) >= 0 {
		return journal.Accepted{}, errLostAnswer
	}
	return acc, err
}

func (j *lossyJournal) FinishAction(ctx context.Context, actionID string, st aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if j.finishBeforeCommit.Add(-1) >= 0 {
		return journal.Receipt{}, errLostAnswer
	}
	return j.Journal.FinishAction(ctx, actionID, st, result, detail, at)
}

// TestAcceptCommittedWhoseAnswerWasLost: the write that journals a new
// action as running committed, but its answer was lost. The action was
// journaled by this very message and this request holds its action ID, so
// the host runs it and answers its result, once. It used to answer
// storage_unavailable and leave the record running with nothing to finish
// it: every retry was told action_in_progress, and every status query
// running, until a restart settled an action that never ran as
// outcome_unknown.
// lossyHost starts a host on runtime rt's journal wrapped in a
// lossyJournal, with a test connector.
func lossyHost(t *testing.T, rt durableJournal) (*fleet, *lossyJournal, *testConnector, hostsdktest.Target) {
	t.Helper()
	f := newFleet(t)
	j := &lossyJournal{Journal: openDurable(t, rt)}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	return f, j, conn, target
}

func TestAcceptCommittedWhoseAnswerWasLost(t *testing.T) {
	for _, rt := range durableJournals {
		t.Run(rt.name, func(t *testing.T) {
			f, j, conn, target := lossyHost(t, rt)
			ctx := ctxT(t)

			j.acceptAfterCommit.Store(1)
			a := action(capEcho, `{"message":"accepted, answer lost"}`)
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			r, err := resp.Result()
			if err != nil || r.Status != aip.ResultCompleted || r.Receipt == nil {
				t.Fatalf("answer HTTP %d %+v, %v (body %s); want the completed result with its receipt", resp.Status, r, err, resp.Raw)
			}
			rec, err := j.Action(ctx, a.ID)
			if err != nil || rec.Status != aip.StateCompleted {
				t.Fatalf("journal record %+v, %v; want completed", rec, err)
			}
			again, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			if r2, err := again.Result(); err != nil || r2.Receipt == nil || r2.Receipt.ID != r.Receipt.ID {
				t.Fatalf("retry answered HTTP %d %+v, %v; want the same journaled result", again.Status, r2, err)
			}
			if n := conn.runCount(a.ID); n != 1 {
				t.Errorf("connector ran %d times, want 1", n)
			}
		})
	}
}

// TestAcceptNotCommitted: a write that journals nothing is answered
// storage_unavailable and makes storage not ready until a storage check
// passes (here the /ready that follows: the connection is back); a retry
// then runs the action, once.
func TestAcceptNotCommitted(t *testing.T) {
	for _, rt := range durableJournals {
		t.Run(rt.name, func(t *testing.T) {
			f := newFleet(t)
			j := &lossyJournal{Journal: openDurable(t, rt)}
			f.cfg.Journal = j
			conn := newTestConnector()
			h, target := f.start(t, conn)
			ctx := ctxT(t)

			j.acceptBeforeCommit.Store(1)
			a := action(capEcho, `{"message":"not accepted"}`)
			resp, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeStorageUnavailable)
			if _, err := j.Action(ctx, a.ID); !errors.Is(err, journal.ErrNotFound) {
				t.Fatalf("journal holds the action after a write that failed: %v", err)
			}
			if n := conn.runCount(a.ID); n != 0 {
				t.Fatalf("connector ran %d times before a write that failed, want 0", n)
			}
			if h.Ready() {
				t.Fatal("ready right after the journal write accepting an action failed")
			}
			if rec := h.ServeReadyFrom("127.0.0.1:50000"); rec.Code != http.StatusOK || !h.Ready() {
				t.Fatalf("/ready answered %d %s once the journal writes again; want 200", rec.Code, rec.Body)
			}
			again, err := f.d.Act(ctx, target, a)
			if err != nil {
				t.Fatal(err)
			}
			if r, err := again.Result(); err != nil || r.Status != aip.ResultCompleted {
				t.Fatalf("retry answered HTTP %d %+v, %v; want completed", again.Status, r, err)
			}
			if n := conn.runCount(a.ID); n != 1 {
				t.Errorf("connector ran %d times, want 1", n)
			}
		})
	}
}

// TestCancelTombstoneLeftReceived: a cancel that arrives before its action
// journals a record of it (received), then finishes it cancelled; when the
// second write fails, the record is left received. The action arriving
// next, and the cancel sent again, finish it cancelled, as recovery would:
// they used to answer action_in_progress, and every status query
// received, until a restart.
func TestCancelTombstoneLeftReceived(t *testing.T) {
	for _, rt := range durableJournals {
		t.Run(rt.name, func(t *testing.T) {
			for _, next := range []string{"action", "cancel"} {
				t.Run(next, func(t *testing.T) {
					f, j, conn, target := lossyHost(t, rt)
					ctx := ctxT(t)

					a := action(capEcho, `{"message":"cancelled first"}`)
					j.finishBeforeCommit.Store(1)
					resp, err := f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "")
					if err != nil {
						t.Fatal(err)
					}
					wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeStorageUnavailable)
					if rec, err := j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateReceived {
						t.Fatalf("journal record %+v, %v; want the cancel's record left received", rec, err)
					}

					switch next {
					case "action":
						resp, err = f.d.Act(ctx, target, a)
					case "cancel":
						resp, err = f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "")
					}
					if err != nil {
						t.Fatal(err)
					}
					r, err := resp.Result()
					if err != nil || r.Status != aip.ResultCancelled || r.Receipt == nil {
						t.Fatalf("the %s answered HTTP %d %+v, %v (body %s); want cancelled with a receipt", next, resp.Status, r, err, resp.Raw)
					}
					if rec, err := j.Action(ctx, a.ID); err != nil || rec.Status != aip.StateCancelled {
						t.Fatalf("journal record %+v, %v; want cancelled", rec, err)
					}
					if n := conn.runCount(a.ID); n != 0 {
						t.Errorf("connector ran %d times, want 0", n)
					}
				})
			}
		})
	}
}
