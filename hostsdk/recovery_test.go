package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// leaveRunning journals an action the way a process killed mid-action
// leaves it: received, then running, never finished.
func leaveRunning(t *testing.T, j journal.Journal, a *aip.Action, start bool) {
	t.Helper()
	ctx := context.Background()
	digest, _ := aip.DigestJSON(a.Input)
	now := time.Now()
	if _, created, err := j.BeginAction(ctx, journal.Action{ActionID: a.ID, CapabilityID: a.CapabilityID,
		TenantID: "tenant-test", InputDigest: digest, ReceivedAt: now}); err != nil || !created {
		t.Fatal(created, err)
	}
	if start {
		if err := j.StartAction(ctx, a.ID, now); err != nil {
			t.Fatal(err)
		}
	}
}

func readyDoc(t *testing.T, h *hostsdk.Host) hostsdk.ReadyDocument {
	t.Helper()
	resp, err := http.Get("http://" + h.Addr().String() + "/ready")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var doc hostsdk.ReadyDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("/ready: %v: %s", err, body)
	}
	return doc
}

func TestRecoveryWithoutReconciler(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	running := action(capEcho, `{"message":"crashed"}`)
	received := action(capEcho, `{"message":"never started"}`)
	leaveRunning(t, f.j, running, true)
	leaveRunning(t, f.j, received, false)
	h, target := f.start(t, conn)
	ctx := ctxT(t)

	rec := readyDoc(t, h).Runtime.Recovery
	if rec.OutcomeUnknown != 1 || rec.ReceivedNotStarted != 1 || rec.Reconciled != 0 || len(rec.Errors) != 0 {
		t.Errorf("recovery summary %+v", rec)
	}
	// The same action IDs again: the journaled outcome, never a run.
	resp, _ := f.d.Act(ctx, target, running)
	wantCode(t, resp, http.StatusBadGateway, hostsdk.CodeOutcomeUnknown)
	resp, _ = f.d.Act(ctx, target, received)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultFailed || res.Error.Code != hostsdk.CodeInterrupted {
		t.Errorf("never-started action answered %+v, %v", res, err)
	}
	if conn.runCount(running.ID)+conn.runCount(received.ID) != 0 {
		t.Error("recovered actions ran again")
	}
}

func TestRecoveryWithReconciler(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	done := action(capEcho, `{"message":"effect happened"}`)
	unsure := action(capEcho, `{"message":"cannot tell"}`)
	leaveRunning(t, f.j, done, true)
	leaveRunning(t, f.j, unsure, true)
	conn.reconcile = func(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error) {
		if a.Action.ActionID == unsure.ID {
			return nil, hostsdk.ErrOutcomeUnknown
		}
		return &aip.ActionResult{Status: aip.ResultCompleted, Output: json.RawMessage(`{"reconciled":true}`)}, nil
	}
	h, target := f.start(t, reconcilingConnector{conn})
	ctx := ctxT(t)
	rec := readyDoc(t, h).Runtime.Recovery
	if rec.Reconciled != 1 || rec.OutcomeUnknown != 1 {
		t.Errorf("recovery summary %+v", rec)
	}
	resp, _ := f.d.Act(ctx, target, done)
	if res, err := resp.Result(); err != nil || string(res.Output) != `{"reconciled":true}` {
		t.Errorf("reconciled action answered %+v, %v", res, err)
	}
	if conn.runCount(done.ID) != 0 {
		t.Error("reconciled action ran again")
	}
}

func TestRecoveryErrorsBlockRegistration(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	leaveRunning(t, f.j, action(capEcho, `{"message":"x"}`), true)
	errProvider := errors.New("provider audit log unreachable")
	conn.reconcile = func(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error) {
		return nil, errProvider
	}
	err := startErr(t, f, reconcilingConnector{conn})
	var re *hostsdk.RecoverError
	if !errors.As(err, &re) {
		t.Fatalf("Start: %v, want *RecoverError", err)
	}
	if got := ops(f.cp); len(got) != 0 {
		t.Errorf("control plane saw %v although recovery failed", got)
	}
}

// A cancel that arrives before its action journals a record with no input
// (BeginAction) and then finishes it as cancelled. A crash between the two
// commits leaves that record received; recovery must keep the cancel's
// meaning, so the action arriving later is answered cancelled (never run),
// not refused as an idempotency conflict with an input nobody sent.
func TestRecoveryOfInterruptedEarlyCancel(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	a := action(capEcho, `{"message":"cancelled first"}`)
	if _, created, err := f.j.BeginAction(context.Background(), journal.Action{ActionID: a.ID, CapabilityID: a.CapabilityID,
		TenantID: "tenant-test", MessageID: aip.NewID(aip.PrefixMessage), ReceivedAt: time.Now()}); err != nil || !created {
		t.Fatal(created, err)
	}
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	resp, _ := f.d.Act(ctx, target, a)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Errorf("action after an interrupted early cancel answered %+v, %v (body %s)", res, err, resp.Raw)
	}
	resp, _ = f.d.Cancel(ctx, target, a.ID, a.CapabilityID, "")
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Errorf("cancel sent again answered %+v, %v (body %s)", res, err, resp.Raw)
	}
	if conn.runCount(a.ID) != 0 {
		t.Error("the cancelled action ran")
	}
}

// A reconciler's result for another action blocks registration with an
// error that says so.
func TestRecoveryRefusesResultForAnotherAction(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	a := action(capEcho, `{"message":"x"}`)
	leaveRunning(t, f.j, a, true)
	other := aip.NewActionID()
	conn.reconcile = func(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
		return &aip.ActionResult{ActionID: other, Status: aip.ResultCompleted}, nil
	}
	err := startErr(t, f, reconcilingConnector{conn})
	var re *hostsdk.RecoverError
	if !errors.As(err, &re) {
		t.Fatalf("Start: %v, want *RecoverError", err)
	}
	if msg := err.Error(); !strings.Contains(msg, other) || strings.Contains(msg, "<nil>") {
		t.Errorf("recovery error %q does not name the other action", msg)
	}
}

// readOnlyReconciler is readOnlyConnector with a Reconciler.
type readOnlyReconciler struct{ readOnlyConnector }

func (c readOnlyReconciler) Reconcile(ctx context.Context, a *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	return c.reconcile(ctx, a)
}

// TestRecoveryOfInterruptedReads: an action of a read-only capability that
// a crash left running, and that no reconciler settled (there is none, or
// it cannot tell), fails connector_host.interrupted (retryable): the read
// changed nothing, and outcome_unknown would tell the caller never to send
// it again. A reconciler's own result still wins.
func TestRecoveryOfInterruptedReads(t *testing.T) {
	interrupted := func(t *testing.T, f *fleet, target hostsdktest.Target, a *aip.Action) {
		t.Helper()
		resp, _ := f.d.Act(ctxT(t), target, a)
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInterrupted || !res.Error.IsRetryable() {
			t.Fatalf("interrupted read answered %+v, %v", res, err)
		}
	}
	t.Run("no reconciler", func(t *testing.T) {
		f := newFleet(t)
		conn := newTestConnector()
		a := action(capEcho, `{"message":"read cut short"}`)
		leaveRunning(t, f.j, a, true)
		h, target := f.start(t, readOnlyConnector{conn})
		if rec := readyDoc(t, h).Runtime.Recovery; rec.ReadsInterrupted != 1 || rec.OutcomeUnknown != 0 || len(rec.Errors) != 0 {
			t.Errorf("recovery summary %+v", rec)
		}
		interrupted(t, f, target, a)
		if conn.runCount(a.ID) != 0 {
			t.Error("the interrupted read ran again under its action ID")
		}
	})
	t.Run("reconciler", func(t *testing.T) {
		f := newFleet(t)
		conn := newTestConnector()
		unsure := action(capEcho, `{"message":"cannot tell"}`)
		known := action(capEcho, `{"message":"known"}`)
		leaveRunning(t, f.j, unsure, true)
		leaveRunning(t, f.j, known, true)
		conn.reconcile = func(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
			if u.Action.ActionID == unsure.ID {
				return nil, fmt.Errorf("%w: the product is down", hostsdk.ErrOutcomeUnknown)
			}
			return &aip.ActionResult{Status: aip.ResultCompleted, Output: json.RawMessage(`{"message":"known","runs":1}`)}, nil
		}
		h, target := f.start(t, readOnlyReconciler{readOnlyConnector{conn}})
		if rec := readyDoc(t, h).Runtime.Recovery; rec.ReadsInterrupted != 1 || rec.Reconciled != 1 || rec.OutcomeUnknown != 0 {
			t.Errorf("recovery summary %+v", rec)
		}
		interrupted(t, f, target, unsure)
		resp, _ := f.d.Act(ctxT(t), target, known)
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("reconciled read answered %+v, %v", res, err)
		}
	})
}
