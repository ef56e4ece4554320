package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// errDiskFull is what a nearly full volume answers an action's writes.
var errDiskFull = errors.New("sqliteruntime: accept action: database or disk is full (13)")

// nearlyFullJournal is a journal on a nearly full volume while full is
// set: its Probe (one small row, rewritten in place) still passes, while
// every write of an action, a message claim or a state value fails.
type nearlyFullJournal struct {
	*memjournal.Journal
	full atomic.Bool
	// largestPut is the largest state value written.
	largestPut atomic.Int64
}

func (j *nearlyFullJournal) AcceptAction(ctx context.Context, messageID string, exp, now time.Time, a journal.Action) (journal.Accepted, error) {
	if j.full.Load() {
		return journal.Accepted{}, errDiskFull
	}
	return j.Journal.AcceptAction(ctx, messageID, exp, now, a)
}

func (j *nearlyFullJournal) BeginAction(ctx context.Context, a journal.Action) (journal.Action, bool, error) {
	if j.full.Load() {
		return journal.Action{}, false, errDiskFull
	}
	return j.Journal.BeginAction(ctx, a)
}

func (j *nearlyFullJournal) FinishAction(ctx context.Context, actionID string, st aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if j.full.Load() {
		return journal.Receipt{}, errDiskFull
	}
	return j.Journal.FinishAction(ctx, actionID, st, result, detail, at)
}

func (j *nearlyFullJournal) ClaimMessage(ctx context.Context, messageID string, exp, now time.Time) (bool, error) {
	if j.full.Load() {
		return false, errDiskFull
	}
	return j.Journal.ClaimMessage(ctx, messageID, exp, now)
}

func (j *nearlyFullJournal) PutState(ctx context.Context, namespace, key string, value json.RawMessage, rev uint64) (uint64, error) {
	if j.full.Load() {
		return 0, errDiskFull
	}
	if n := int64(len(value)); n > j.largestPut.Load() {
		j.largestPut.Store(n)
	}
	return j.Journal.PutState(ctx, namespace, key, value, rev)
}

// readyDoc reads the host's /ready (from the same machine, so the detail
// is the full text).
func (b *bubbleFleet) readyDoc(t *testing.T) (int, hostsdk.ReadyDocument) {
	t.Helper()
	rec := b.h.ServeReadyFrom("127.0.0.1:50000")
	var doc hostsdk.ReadyDocument
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("/ready answered %d %s: %v", rec.Code, rec.Body, err)
	}
	return rec.Code, doc
}

// lastHeartbeat is the newest heartbeat the control plane received.
func lastHeartbeat(t *testing.T, cp *hostsdktest.ControlPlane) hostsdktest.Operation {
	t.Helper()
	hbs := opsOf(cp, aip.OpHeartbeat)
	if len(hbs) == 0 {
		t.Fatal("no heartbeat")
	}
	return hbs[len(hbs)-1]
}

// TestFailedActionWriteMakesStorageNotReady: a replica whose journal
// refuses an action's writes (a nearly full volume, where the storage
// probe's one small row still fits) was ready all the same: /ready said
// 200 and its heartbeats connector_ready=true, so it kept being routed
// actions and answered each one storage_unavailable. A storage failure of
// an action's write (the accept, or the outcome) makes storage not ready
// at once — Ready, /ready and the next heartbeat say so — and only a
// storage check that writes as much again makes it ready, once the space
// is back; the action whose accept failed is still answered
// storage_unavailable, not started.
func TestFailedActionWriteMakesStorageNotReady(t *testing.T) {
	for _, which := range []string{"accept", "outcome"} {
		t.Run(which, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j := &nearlyFullJournal{Journal: memjournal.New()}
				b := newBubbleFleet(t, func(c *hostsdk.Config) { c.Journal = j })
				ctx := b.awaitFirstBeat(t)
				target := hostsdktest.TargetOf(b.h, b.cfg)
				const interval = hostsdk.DefaultHeartbeatInterval

				if resp, err := b.d.Act(ctx, target, action(capEcho, `{"message":"room"}`)); err != nil || resp.Status != http.StatusOK {
					t.Fatalf("action before the volume filled: %v %+v", err, resp)
				}
				var answered chan *hostsdktest.Response
				a := action(capEcho, `{"message":"no room"}`)
				switch which {
				case "accept":
					j.full.Store(true)
					resp, err := b.d.Act(ctx, target, a)
					if err != nil {
						t.Fatal(err)
					}
					wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeStorageUnavailable)
					if _, err := j.Journal.Action(ctx, a.ID); !errors.Is(err, journal.ErrNotFound) {
						t.Fatalf("the action whose accept failed is in the journal (%v)", err)
					}
					if n := b.conn.runCount(a.ID); n != 0 {
						t.Fatalf("the action whose accept failed ran %d times", n)
					}
				case "outcome":
					a = action(capBlock, `{"message":"no room for its outcome"}`)
					answered = make(chan *hostsdktest.Response, 1)
					go func() {
						resp, _ := b.d.Act(ctx, target, a)
						answered <- resp
					}()
					<-b.conn.started
					j.full.Store(true)
					b.conn.release <- struct{}{}
					synctest.Wait() // its outcome write failed; it is retried
				}

				if b.h.Ready() {
					t.Error("Ready right after an action's journal write failed")
				}
				if got := b.metric(t, hostsdk.MetricStorageReady); got != 0 {
					t.Errorf("%s = %v after an action's journal write failed, want 0", hostsdk.MetricStorageReady, got)
				}
				status, doc := b.readyDoc(t)
				if status != http.StatusServiceUnavailable || doc.Runtime.Ready || !strings.Contains(doc.Runtime.Detail, errDiskFull.Error()) {
					t.Errorf("/ready answered %d, runtime %+v; want 503, storage not ready saying why", status, doc.Runtime)
				}
				n := len(opsOf(b.cp, aip.OpHeartbeat))
				time.Sleep(interval + time.Second) // a heartbeat tick, and its answer
				synctest.Wait()
				if hbs := opsOf(b.cp, aip.OpHeartbeat); len(hbs) == n || hbs[len(hbs)-1].ConnectorReady {
					t.Errorf("heartbeat after the failed write %+v; want one reporting connector_ready=false", hbs[len(hbs)-1])
				}
				if st, _ := b.cp.Replica(b.cfg.ReplicaID); st.Status != aip.ReplicaOffline {
					t.Errorf("replica is %s after its storage failed, want offline", st.Status)
				}
				time.Sleep(interval) // still full: still not ready
				synctest.Wait()
				if b.h.Ready() || lastHeartbeat(t, b.cp).ConnectorReady {
					t.Error("ready again while the volume is still full")
				}

				j.full.Store(false) // the space is back
				if answered != nil {
					resp := <-answered
					if r, err := resp.Result(); err != nil || r.Status != aip.ResultCompleted {
						t.Fatalf("the action whose outcome waited answered %+v, %v (body %s); want completed", r, err, resp.Raw)
					}
				}
				if _, doc := b.readyDoc(t); !doc.Runtime.Ready {
					t.Errorf("/ready runtime %+v once the space is back; want storage ready", doc.Runtime)
				}
				// Not the probe's small row: a write at least as large as
				// an action's told storage was back.
				if n := j.largestPut.Load(); n < 64<<10 {
					t.Errorf("the storage check wrote %d bytes at most before storage was ready again, want at least 64 KiB", n)
				}
				time.Sleep(2*interval + time.Second) // registers again, then beats
				synctest.Wait()
				if !b.h.Ready() || !lastHeartbeat(t, b.cp).ConnectorReady {
					t.Errorf("ready %v, last heartbeat %+v once the space is back; want ready", b.h.Ready(), lastHeartbeat(t, b.cp))
				}
				if resp, err := b.d.Act(ctx, target, action(capEcho, `{"message":"room again"}`)); err != nil || resp.Status != http.StatusOK {
					t.Fatalf("action once the space is back: %v %+v", err, resp)
				}
			})
		})
	}
}
