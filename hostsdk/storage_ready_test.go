package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	// writeHook, when set, runs first in each state and outbox write; an
	// error it returns is the write's answer.
	writeHook atomic.Pointer[func(ctx context.Context) error]
	// pending, when above 0, is what PendingEvents answers.
	pending atomic.Int64
}

// hooked runs writeHook, if set.
func (j *nearlyFullJournal) hooked(ctx context.Context) error {
	if f := j.writeHook.Load(); f != nil {
		return (*f)(ctx)
	}
	return nil
}

func (j *nearlyFullJournal) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	if err := j.hooked(ctx); err != nil {
		return err
	}
	if j.full.Load() {
		return errDiskFull
	}
	return j.Journal.EnqueueEvents(ctx, e)
}

func (j *nearlyFullJournal) PendingEvents(ctx context.Context) (int, error) {
	if n := j.pending.Load(); n > 0 {
		return int(n), nil
	}
	return j.Journal.PendingEvents(ctx)
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
	if err := j.hooked(ctx); err != nil {
		return 0, err
	}
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

// routeContextConnector keeps the route context the host gives its
// connector: the outbox and state a webhook route writes to.
type routeContextConnector struct {
	*testConnector
	rc *hostsdk.RouteContext
}

func (c *routeContextConnector) Routes(_ context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	c.rc = rc
	return nil, nil
}

// newRouteContextFleet is a bubble fleet on j whose connector kept its
// route context.
func newRouteContextFleet(t *testing.T, j journal.Journal) (*bubbleFleet, *hostsdk.RouteContext) {
	t.Helper()
	var rcc *routeContextConnector
	b := newWrappedBubbleFleet(t, func(c *hostsdk.Config) { c.Journal = j }, func(c *testConnector) hostsdk.Connector {
		rcc = &routeContextConnector{testConnector: c}
		return rcc
	})
	if rcc.rc == nil {
		t.Fatal("the host did not ask the connector for its routes")
	}
	return b, rcc.rc
}

// TestFailedEventOrStateWriteMakesStorageNotReady: on a nearly full
// volume, an event batch the outbox could not store (a provider's webhook,
// answered with an error and delivered again) or a connector's state
// value the journal could not write left the replica ready: /ready said
// 200 and its heartbeats connector_ready=true, so it kept being routed
// webhooks and actions it could not store. Such a write, failed for a
// storage reason, makes storage not ready as an action's write does —
// Ready, /ready and the next heartbeat say so — until a storage check has
// written as much as that write (at least 64 KiB, at most a signed
// message's 4 MiB) once the space is back.
func TestFailedEventOrStateWriteMakesStorageNotReady(t *testing.T) {
	blob := func(n int) string { return strings.Repeat("x", n) }
	for _, tc := range []struct {
		name string
		// write is the connector's write the full volume refuses.
		write func(ctx context.Context, rc *hostsdk.RouteContext) error
		// minCheck and maxCheck bound the storage check's write.
		minCheck, maxCheck int64
	}{
		{"event batch", func(ctx context.Context, rc *hostsdk.RouteContext) error {
			_, err := rc.Events.Publish(ctx, "test.events",
				aip.Event{Kind: "webhook.a", Data: json.RawMessage(`{"blob":"` + blob(120<<10) + `"}`)},
				aip.Event{Kind: "webhook.b", Data: json.RawMessage(`{"blob":"` + blob(120<<10) + `"}`)})
			return err
		}, 240 << 10, aip.MaxMessageBytes},
		{"state put", func(ctx context.Context, rc *hostsdk.RouteContext) error {
			_, err := rc.State.Put(ctx, "test.ledger", "k", blob(100<<10), 0)
			return err
		}, 100 << 10, aip.MaxMessageBytes},
		{"state update", func(ctx context.Context, rc *hostsdk.RouteContext) error {
			_, _, err := rc.State.Update(ctx, "test.ledger", "k", func(json.RawMessage) (json.RawMessage, error) {
				return json.RawMessage(`"` + blob(100<<10) + `"`), nil
			})
			return err
		}, 100 << 10, aip.MaxMessageBytes},
		// A value larger than any action write asks the check for a
		// signed message's bound, not for the value's size.
		{"state put beyond a message", func(ctx context.Context, rc *hostsdk.RouteContext) error {
			_, err := rc.State.Put(ctx, "test.ledger", "k", blob(6<<20), 0)
			return err
		}, aip.MaxMessageBytes - 2, aip.MaxMessageBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				j := &nearlyFullJournal{Journal: memjournal.New()}
				b, rc := newRouteContextFleet(t, j)
				ctx := b.awaitFirstBeat(t)
				const interval = hostsdk.DefaultHeartbeatInterval

				j.full.Store(true)
				if err := tc.write(ctx, rc); !errors.Is(err, errDiskFull) {
					t.Fatalf("write on a full volume = %v, want %v", err, errDiskFull)
				}
				if b.h.Ready() {
					t.Error("Ready right after the write failed for want of storage")
				}
				if got := b.metric(t, hostsdk.MetricStorageReady); got != 0 {
					t.Errorf("%s = %v after the write failed, want 0", hostsdk.MetricStorageReady, got)
				}
				status, doc := b.readyDoc(t)
				if status != http.StatusServiceUnavailable || doc.Runtime.Ready || !strings.Contains(doc.Runtime.Detail, errDiskFull.Error()) {
					t.Errorf("/ready answered %d, runtime %+v; want 503, storage not ready saying why", status, doc.Runtime)
				}
				if _, err := rc.Events.Publish(ctx, "test.events", aip.Event{Kind: "webhook.c"}); !errors.Is(err, hostsdk.ErrNotServing) {
					t.Errorf("Publish while storage is not ready = %v, want ErrNotServing", err)
				}
				n := len(opsOf(b.cp, aip.OpHeartbeat))
				time.Sleep(interval + time.Second) // a heartbeat tick, and its answer
				synctest.Wait()
				if hbs := opsOf(b.cp, aip.OpHeartbeat); len(hbs) == n || hbs[len(hbs)-1].ConnectorReady {
					t.Errorf("heartbeat after the failed write %+v; want one reporting connector_ready=false", hbs[len(hbs)-1])
				}

				j.full.Store(false) // the space is back
				if _, doc := b.readyDoc(t); !doc.Runtime.Ready {
					t.Errorf("/ready runtime %+v once the space is back; want storage ready", doc.Runtime)
				}
				if n := j.largestPut.Load(); n < tc.minCheck || n > tc.maxCheck {
					t.Errorf("the storage check wrote %d bytes at most before storage was ready again, want %d to %d", n, tc.minCheck, tc.maxCheck)
				}
				time.Sleep(2*interval + time.Second) // registers again, then beats
				synctest.Wait()
				if !b.h.Ready() || !lastHeartbeat(t, b.cp).ConnectorReady {
					t.Errorf("ready %v, last heartbeat %+v once the space is back; want ready", b.h.Ready(), lastHeartbeat(t, b.cp))
				}
				if err := tc.write(ctx, rc); err != nil {
					t.Errorf("the write once the space is back: %v", err)
				}
			})
		})
	}
}

// TestRecordRefusalsOfEventAndStateWritesLeaveStorageReady: a state or
// outbox write refused for the record (a stale revision, an invalid value,
// a full outbox), by a closed journal, or cut short by its caller's
// context says nothing of storage, and leaves the replica ready.
func TestRecordRefusalsOfEventAndStateWritesLeaveStorageReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		j := &nearlyFullJournal{Journal: memjournal.New()}
		b, rc := newRouteContextFleet(t, j)
		ctx := b.awaitFirstBeat(t)
		publish := func(ctx context.Context) error {
			_, err := rc.Events.Publish(ctx, "test.events", aip.Event{Kind: "webhook.received"})
			return err
		}
		put := func(ctx context.Context) error {
			_, err := rc.State.Put(ctx, "test.ledger", "k", "v", 0)
			return err
		}
		update := func(ctx context.Context) error {
			_, _, err := rc.State.Update(ctx, "test.ledger", "k", func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`"w"`), nil })
			return err
		}
		stillReady := func(what string, err error) {
			t.Helper()
			if err == nil {
				t.Errorf("%s: no error", what)
			}
			if !b.h.Ready() || b.metric(t, hostsdk.MetricStorageReady) != 1 {
				t.Errorf("%s (%v) made storage not ready", what, err)
			}
		}

		if err := put(ctx); err != nil {
			t.Fatal(err)
		}
		stillReady("a stale revision", put(ctx))
		_, _, err := rc.State.Update(ctx, "test.ledger", "k", func(json.RawMessage) (json.RawMessage, error) { return json.RawMessage(`{`), nil })
		stillReady("an invalid value", err)

		for _, refusal := range []error{
			fmt.Errorf("memjournal: write: %w: stale revision", journal.ErrConflict),
			fmt.Errorf("memjournal: write: %w: bad value", journal.ErrInvalid),
			fmt.Errorf("memjournal: write: %w", journal.ErrClosed),
		} {
			hook := func(context.Context) error { return refusal }
			j.writeHook.Store(&hook)
			stillReady("publishing, answered "+refusal.Error(), publish(ctx))
			stillReady("putting state, answered "+refusal.Error(), put(ctx))
			stillReady("updating state, answered "+refusal.Error(), update(ctx))
		}

		// The caller's context ends during the write (a webhook's client
		// that went away).
		for what, write := range map[string]func(context.Context) error{"publishing": publish, "putting state": put, "updating state": update} {
			cctx, cancel := context.WithCancel(ctx)
			hook := func(ctx context.Context) error {
				cancel()
				return fmt.Errorf("sqliteruntime: write: %w", ctx.Err())
			}
			j.writeHook.Store(&hook)
			stillReady(what+" cut short by its caller", write(cctx))
		}
		j.writeHook.Store(nil)

		j.pending.Store(10000)
		err = publish(ctx)
		if !errors.Is(err, hostsdk.ErrEventOutboxFull) {
			t.Errorf("Publish with a full outbox = %v, want ErrEventOutboxFull", err)
		}
		stillReady("a full outbox", err)
		j.pending.Store(0)

		time.Sleep(hostsdk.DefaultHeartbeatInterval + time.Second)
		synctest.Wait()
		if !lastHeartbeat(t, b.cp).ConnectorReady {
			t.Errorf("heartbeat %+v after refusals of the record; want connector_ready=true", lastHeartbeat(t, b.cp))
		}
	})
}
