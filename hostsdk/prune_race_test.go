package hostsdk_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// pruneBeforeReceipt is a real journal on which the action retention's
// prune runs at the worst moment: between the host's read of a finished
// action's record and the read of its receipt (once per armed action ID),
// deleting the finished actions up to that one, as the heartbeat's prune
// does once they are past the retention.
type pruneBeforeReceipt struct {
	journal.Journal
	mu    sync.Mutex
	armed map[string]bool
}

func (j *pruneBeforeReceipt) arm(actionID string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.armed[actionID] = true
}

func (j *pruneBeforeReceipt) ReceiptFor(ctx context.Context, actionID string) (journal.Receipt, error) {
	j.mu.Lock()
	armed := j.armed[actionID]
	delete(j.armed, actionID)
	j.mu.Unlock()
	if armed {
		a, err := j.Journal.Action(ctx, actionID)
		if err != nil {
			return journal.Receipt{}, err
		}
		if n, err := j.Journal.PruneActions(ctx, a.CompletedAt.Add(time.Microsecond), 500, nil); err != nil || n == 0 {
			return journal.Receipt{}, fmt.Errorf("test: prune up to %s: %d pruned, %v", actionID, n, err)
		}
	}
	return j.Journal.ReceiptFor(ctx, actionID)
}

// TestPruneRacingTheReadOfAFinishedActionExpiresIt: a delivery (or a
// cancel) of a finished action is answered from its journal record and
// receipt; when the prune deletes both between the two reads, the action
// is refused with action_expired, as a delivery after the prune is — the
// record is gone for good. It was answered storage_unavailable (retryable)
// once, taking the missing receipt for a broken journal. On both durable
// journals.
func TestPruneRacingTheReadOfAFinishedActionExpiresIt(t *testing.T) {
	for _, rt := range durableJournals {
		t.Run(rt.name, func(t *testing.T) {
			f := newFleet(t)
			j := &pruneBeforeReceipt{Journal: openDurable(t, rt), armed: map[string]bool{}}
			f.cfg.Journal = j
			conn := newTestConnector()
			_, target := f.start(t, conn)
			ctx := ctxT(t)

			finish := func() *aip.Action {
				t.Helper()
				a := action(capEcho, `{"message":"finished"}`)
				resp, err := f.d.Act(ctx, target, a)
				if err != nil {
					t.Fatal(err)
				}
				if r, err := resp.Result(); err != nil || r.Status != aip.ResultCompleted {
					t.Fatalf("first delivery: HTTP %d %+v, %v", resp.Status, r, err)
				}
				return a
			}

			// Oldest first: each prune deletes the actions finished up to
			// the armed one, and the newest receipt (the chain head) is
			// never deleted.
			again, cancelled := finish(), finish()
			finish()

			// A delivery again (the dispatcher's retry after a lost answer).
			j.arm(again.ID)
			resp, err := f.d.Act(ctx, target, again)
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusGone, hostsdk.CodeActionExpired)
			if n := conn.runCount(again.ID); n != 1 {
				t.Errorf("the pruned action ran %d times, want 1", n)
			}
			if st, _, err := f.d.Status(ctx, target, again.ID, capEcho); err != nil || st.State != aip.StatePruned {
				t.Errorf("status of the pruned action: %+v, %v; want %s", st, err, aip.StatePruned)
			}

			// A cancel of a finished action.
			j.arm(cancelled.ID)
			resp, err = f.d.Cancel(ctx, target, cancelled.ID, capEcho, "too late")
			if err != nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusGone, hostsdk.CodeActionExpired)
			if _, err := j.Action(ctx, cancelled.ID); !errors.Is(err, journal.ErrNotFound) {
				t.Errorf("the cancel of the pruned action journaled a record (%v)", err)
			}
		})
	}
}
