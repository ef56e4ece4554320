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
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// lostCommitJournal commits FinishAction and then reports a transport
// error for the first lostAnswers calls, the way a PostgreSQL connection
// that drops after the server committed (but before its answer arrived)
// does: the caller cannot tell whether the write took.
type lostCommitJournal struct {
	*memjournal.Journal
	lostAnswers atomic.Int32
	attempts    atomic.Int32
}

func (j *lostCommitJournal) FinishAction(ctx context.Context, actionID string, state aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	j.attempts.Add(1)
	r, err := j.Journal.FinishAction(ctx, actionID, state, result, detail, at)
	if err == nil && j.lostAnswers.Add(-1) >= 0 {
		return journal.Receipt{}, errors.New("storage: unexpected EOF while waiting for the commit's answer")
	}
	return r, err
}

// TestOutcomeCommitWhoseAnswerWasLost: the outcome write committed but its
// answer was lost, so the retry finds the action finished already. The
// action is answered with the result the journal holds and its receipt (the
// one a retry and a status query give), not with an error saying the
// outcome could not be journaled: a dispatcher would settle a completed
// action as failed.
func TestOutcomeCommitWhoseAnswerWasLost(t *testing.T) {
	f := newFleet(t)
	j := &lostCommitJournal{Journal: f.j}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	j.lostAnswers.Store(1)
	a := action(capEcho, `{"message":"committed, answer lost"}`)
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	r, err := resp.Result()
	if err != nil || r.Status != aip.ResultCompleted || r.Receipt == nil {
		t.Fatalf("answer %+v, %v (body %s); want the completed result with its receipt", r, err, resp.Raw)
	}
	if n := j.attempts.Load(); n != 2 {
		t.Errorf("%d outcome writes, want 2 (one whose answer was lost, one that found it done)", n)
	}
	stored, err := f.j.ReceiptFor(ctx, a.ID)
	if err != nil || stored.ID != r.Receipt.ID || stored.Hash != r.Receipt.Hash {
		t.Fatalf("answered receipt %+v; the journal holds %+v, %v", r.Receipt, stored, err)
	}
	again, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if r2, err := again.Result(); err != nil || r2.Receipt == nil || r2.Receipt.ID != r.Receipt.ID {
		t.Fatalf("retry answered %+v, %v; want the same journaled result", r2, err)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Errorf("connector ran %d times, want 1", n)
	}
}

// TestOutcomeCommitLostAndFinishedOtherwise: when the retry finds the
// action finished with another outcome than the one this process wrote
// (another writer finished it), the host answers what the journal holds,
// as every retry will, not its own outcome.
func TestOutcomeCommitLostAndFinishedOtherwise(t *testing.T) {
	f := newFleet(t)
	j := &otherWriterJournal{Journal: f.j}
	f.cfg.Journal = j
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"finished elsewhere"}`)
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	rec, err := f.j.Action(ctx, a.ID)
	if err != nil || rec.Status != aip.StateOutcomeUnknown {
		t.Fatalf("journal record %+v, %v; want the other writer's outcome_unknown", rec, err)
	}
}

// otherWriterJournal fails the first FinishAction ambiguously after another
// writer finished the action as outcome_unknown.
type otherWriterJournal struct {
	*memjournal.Journal
	done atomic.Bool
}

func (j *otherWriterJournal) FinishAction(ctx context.Context, actionID string, state aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if j.done.CompareAndSwap(false, true) {
		if _, err := j.Journal.FinishAction(ctx, actionID, aip.StateOutcomeUnknown, nil, "another writer", at); err != nil {
			return journal.Receipt{}, err
		}
		return journal.Receipt{}, errors.New("storage: connection reset")
	}
	return j.Journal.FinishAction(ctx, actionID, state, result, detail, at)
}
