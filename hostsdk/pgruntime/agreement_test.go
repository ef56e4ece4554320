package pgruntime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// errKind names an error by the journal sentinel it matches; another
// error by its text.
func errKind(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, journal.ErrNotFound):
		return "NotFound"
	case errors.Is(err, journal.ErrConflict):
		return "Conflict"
	case errors.Is(err, journal.ErrInvalid):
		return "Invalid"
	case errors.Is(err, journal.ErrPruned):
		return "Pruned"
	}
	return "other:" + err.Error()
}

func showAction(a journal.Action) string {
	return fmt.Sprintf("%s cap=%q st=%s res=%s det=%q rcv=%s st=%s upd=%s cmp=%s msg=%q", a.ActionID, a.CapabilityID, a.Status, a.Result, a.Detail,
		a.ReceivedAt.Format(time.RFC3339Nano), a.StartedAt.Format(time.RFC3339Nano), a.UpdatedAt.Format(time.RFC3339Nano), a.CompletedAt.Format(time.RFC3339Nano), a.MessageID)
}
func showReceipt(r journal.Receipt) string {
	return fmt.Sprintf("%d %s %s %s %s", r.Seq, r.ActionID, r.Status, r.ResultDigest, r.At.Format(time.RFC3339Nano))
}
func showEntry(e journal.OutboxEntry) string {
	return fmt.Sprintf("%s %s %s att=%d next=%s lease=%s err=%q cr=%s", e.ID, e.ChannelID, e.Events, e.Attempts, e.NextAttempt.Format(time.RFC3339Nano), e.LeaseUntil.Format(time.RFC3339Nano), e.LastError, e.CreatedAt.Format(time.RFC3339Nano))
}

// TestBackendsAgree runs the same random sequences of journal calls on
// the memory, SQLite and PostgreSQL journals, with malformed arguments
// (IDs that are not text, JSON that is not UTF-8, limits out of range,
// zero times) and times that differ below the microsecond, and closes and
// reopens the durable ones between calls; every call must return the same
// result, or an error of the same kind, on all three. Each disagreement it
// found became a conformance test (journaltest): outbox IDs and JSON not
// UTF-8, times within one microsecond.
func TestBackendsAgree(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	seeds := 40
	for seed := 0; seed < seeds; seed++ {
		sdir, pns := t.TempDir(), aip.NewID(aip.PrefixReplica)
		openAll := func() []journal.Journal {
			j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: sdir, Sync: sqliteruntime.SyncNormal})
			if err != nil {
				t.Fatal(err)
			}
			return []journal.Journal{j, open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: pns})}
		}
		mem := memjournal.New() // ephemeral: kept open across the reopens
		js := append(openAll(), mem)
		names := []string{"sqlite", "pg", "mem"}
		r := rand.New(rand.NewSource(int64(seed)))
		base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		tm := func() time.Time {
			d := time.Duration(r.Intn(20)) * time.Second
			if r.Intn(3) == 0 {
				d += time.Duration(r.Intn(3000))
			}
			if r.Intn(4) == 0 {
				d += time.Duration(r.Intn(3)) * time.Microsecond
			}
			return base.Add(d)
		}
		ids := []string{"act_1", "act_2", "act_3", "act_4", "act_1", "act_2", "", "a\x00b", "\xff\xfe", "act_é"}
		msgs := []string{"msg_1", "msg_2", "msg_3", "", "m\x00"}
		id := func() string { return ids[r.Intn(len(ids))] }
		statuses := []aip.ActionState{aip.StateCompleted, aip.StateFailed, aip.StateOutcomeUnknown, aip.StateCancelled, aip.StateRunning, aip.StateReceived, ""}
		var log []string
		for step := 0; step < 40; step++ {
			op := r.Intn(17)
			if op == 16 {
				for _, j := range js[:2] {
					j.Close()
				}
				js = append(openAll(), mem)
				log = append(log, "reopen")
				continue
			}
			// pre-draw all randomness so every backend sees the same call
			a := journal.Action{ActionID: id(), CapabilityID: []string{"c.a", "c.b"}[r.Intn(2)], InputDigest: "sha256:x", MessageID: msgs[r.Intn(5)], ReceivedAt: tm(), TenantID: []string{"", "t1", "t\xff"}[r.Intn(3)], IdempotencyKey: []string{"", "k", "k\x00"}[r.Intn(3)], FenceToken: []string{"", "f"}[r.Intn(2)]}
			if r.Intn(15) == 0 {
				a.ReceivedAt = time.Time{}
			}
			if r.Intn(15) == 0 {
				a.InputDigest = ""
			}
			if r.Intn(4) != 0 {
				a.AssignedAt = tm()
			}
			if r.Intn(10) == 0 {
				a.Status = aip.StateReceived
			}
			mid, exp, now := msgs[r.Intn(5)], tm(), tm()
			if r.Intn(15) == 0 {
				now = time.Time{}
			}
			st := statuses[r.Intn(len(statuses))]
			res := []json.RawMessage{nil, json.RawMessage(`{"a":1}`), json.RawMessage(`{"b": 2}`), json.RawMessage(`{bad`), json.RawMessage(`null`), json.RawMessage(`"s\u0000"`), json.RawMessage("{\"a\":\"\xff\"}")}[r.Intn(7)]
			det := []string{"", "boom", "x\x00y", "\xff"}[r.Intn(4)]
			at := tm()
			limit := r.Intn(4) - 1
			lease := time.Duration(r.Intn(5)) * time.Second
			ns := []string{"ns1", "ns2", "", "n\x00"}[r.Intn(4)]
			key := id()
			rev := uint64(r.Intn(3))
			ch := []string{"ch1", "ch2", ""}[r.Intn(3)]
			eid := []string{"ob_1", "ob_2", "", "o\xff"}[r.Intn(4)]
			nextAt := []time.Time{{}, now}[r.Intn(2)]
			var outs []string
			var desc string
			for _, j := range js {
				var out string
				switch op {
				case 0:
					desc = fmt.Sprintf("BeginAction(%s rcv=%s asg=%s)", a.ActionID, a.ReceivedAt.Format(time.RFC3339Nano), a.AssignedAt.Format(time.RFC3339Nano))
					ex, c, err := j.BeginAction(ctx, a)
					out = fmt.Sprintf("%v %s %s", c, errKind(err), showAction(ex))
				case 1, 2:
					desc = fmt.Sprintf("AcceptAction(%s, %s exp=%s now=%s rcv=%s asg=%s)", mid, a.ActionID, exp.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano), a.ReceivedAt.Format(time.RFC3339Nano), a.AssignedAt.Format(time.RFC3339Nano))
					acc, err := j.AcceptAction(ctx, mid, exp, now, a)
					out = fmt.Sprintf("%v %v %s %s", acc.Claimed, acc.Created, errKind(err), showAction(acc.Existing))
				case 3:
					desc = fmt.Sprintf("StartAction(%s, %s)", a.ActionID, at.Format(time.RFC3339Nano))
					out = errKind(j.StartAction(ctx, a.ActionID, at))
				case 4, 5:
					desc = fmt.Sprintf("FinishAction(%s, %s, %s, %q, %s)", a.ActionID, st, res, det, at.Format(time.RFC3339Nano))
					rc, err := j.FinishAction(ctx, a.ActionID, st, res, det, at)
					out = errKind(err) + " " + showReceipt(rc)
				case 6:
					desc = "Action " + a.ActionID
					x, err := j.Action(ctx, a.ActionID)
					out = errKind(err) + " " + showAction(x)
				case 7:
					desc = fmt.Sprintf("ActionsByStatus(%d, %s)", limit, st)
					xs, err := j.ActionsByStatus(ctx, limit, st)
					out = errKind(err)
					for _, x := range xs {
						out += "\n   " + showAction(x)
					}
				case 8:
					desc = fmt.Sprintf("PruneActions(%s, %d, [ns1])", at.Format(time.RFC3339Nano), limit)
					n, err := j.PruneActions(ctx, at, limit, []string{"ns1", ns})
					h, _ := j.PruneHorizon(ctx)
					out = fmt.Sprintf("%d %s h=%s", n, errKind(err), h.Format(time.RFC3339Nano))
				case 9:
					desc = fmt.Sprintf("ClaimMessage(%s, %s, %s)", mid, exp.Format(time.RFC3339Nano), now.Format(time.RFC3339Nano))
					ok, err := j.ClaimMessage(ctx, mid, exp, now)
					out = fmt.Sprintf("%v %s", ok, errKind(err))
				case 10:
					desc = fmt.Sprintf("PruneMessages(%s, %d)", now.Format(time.RFC3339Nano), limit)
					n, err := j.PruneMessages(ctx, now, limit*10)
					out = fmt.Sprintf("%d %s", n, errKind(err))
				case 11:
					desc = fmt.Sprintf("EnqueueEvents(%s)", eid)
					err := j.EnqueueEvents(ctx, journal.OutboxEntry{ID: eid, ChannelID: ch, Events: json.RawMessage(`[{"e":1}]`), CreatedAt: at, NextAttempt: nextAt})
					out = errKind(err)
				case 12:
					desc = fmt.Sprintf("ClaimEvents(%s, %s, %d)", now.Format(time.RFC3339Nano), lease, limit)
					es, err := j.ClaimEvents(ctx, now, lease, limit*10)
					out = errKind(err)
					var ss []string
					for _, e := range es {
						ss = append(ss, "\n   "+showEntry(e))
					}
					sort.Strings(ss)
					for _, x := range ss {
						out += x
					}
				case 13:
					desc = fmt.Sprintf("RetryEvents(%s, %s) / Ack", eid, at.Format(time.RFC3339Nano))
					if limit%2 == 0 {
						out = errKind(j.RetryEvents(ctx, eid, at, det))
					} else {
						out = errKind(j.AckEvents(ctx, eid))
					}
					n, err := j.PendingEvents(ctx)
					out += fmt.Sprintf(" pending %d %s", n, errKind(err))
				case 14:
					desc = fmt.Sprintf("PutState(%s, %s, %d)", ns, key, rev)
					nr, err := j.PutState(ctx, ns, key, res, rev)
					out = fmt.Sprintf("%d %s", nr, errKind(err))
					v, err := j.State(ctx, ns, key)
					out += fmt.Sprintf(" / %s %d %s", v.Value, v.Revision, errKind(err))
				case 15:
					desc = fmt.Sprintf("Receipts(%d, %d) ReceiptFor(%s)", rev, limit, a.ActionID)
					rs, err := j.Receipts(ctx, rev, limit)
					out = errKind(err)
					for _, x := range rs {
						out += "\n   " + showReceipt(x)
					}
					rc, err := j.ReceiptFor(ctx, a.ActionID)
					out += "\n   for: " + errKind(err) + " " + showReceipt(rc)
				}
				outs = append(outs, out)
			}
			log = append(log, desc)
			for i := 1; i < len(js); i++ {
				if outs[i] != outs[0] {
					t.Errorf("seed %d step %d: %s\n  %s: %s\n  %s: %s\ncalls before: %s", seed, step, desc, names[0], outs[0], names[i], outs[i], strings.Join(log, "; "))
				}
			}
			if t.Failed() {
				break
			}
		}
		for _, j := range js {
			j.Close()
		}
		if t.Failed() {
			return
		}
	}
}
