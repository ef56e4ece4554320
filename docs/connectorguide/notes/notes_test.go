package notes_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/docs/connectorguide/notes"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startNotes runs the connector on a real host: a fake control plane it
// registers with, a fake dispatcher that signs actions and verifies the
// answers, the embedded journal in a temporary directory.
func startNotes(t *testing.T) (*hostsdktest.Dispatcher, hostsdktest.Target) {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)
	h := hostsdktest.StartHost(t, cfg, notes.Connector{})
	return d, hostsdktest.TargetOf(h, cfg)
}

func act(t *testing.T, d *hostsdktest.Dispatcher, target hostsdktest.Target, a *aip.Action) *aip.ActionResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	return res
}

func add(text string) *aip.Action {
	in, _ := json.Marshal(map[string]string{"text": text})
	return &aip.Action{ID: aip.NewActionID(), CapabilityID: notes.CapAdd, Input: in}
}

func list(t *testing.T, d *hostsdktest.Dispatcher, target hostsdktest.Target) []notes.Note {
	t.Helper()
	res := act(t, d, target, &aip.Action{ID: aip.NewActionID(), CapabilityID: notes.CapList, Input: json.RawMessage(`{}`)})
	var out struct{ Notes []notes.Note }
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatal(err)
	}
	return out.Notes
}

func TestAddThenList(t *testing.T) {
	d, target := startNotes(t)
	first := act(t, d, target, add("buy milk"))
	act(t, d, target, add("call Ada"))
	var n notes.Note
	if err := json.Unmarshal(first.Output, &n); err != nil || first.Status != aip.ResultCompleted || n.ID != 1 || n.Text != "buy milk" {
		t.Fatalf("first add: %+v %+v %v", first, n, err)
	}
	got := list(t, d, target)
	if len(got) != 2 || got[0].Text != "buy milk" || got[1].ID != 2 {
		t.Fatalf("list = %+v", got)
	}
}

// Delivering the same action again never writes a second note: the host
// answers from its journal, and the connector would find its note anyway.
func TestAddRunsOncePerAction(t *testing.T) {
	d, target := startNotes(t)
	a := add("once")
	for range 3 {
		if res := act(t, d, target, a); res.Status != aip.ResultCompleted {
			t.Fatalf("add: %+v", res)
		}
	}
	if got := list(t, d, target); len(got) != 1 {
		t.Fatalf("%d notes after three deliveries of one action", len(got))
	}
}

// The host checks the input against the capability's input_schema before
// Handle runs.
func TestInputIsValidatedByTheHost(t *testing.T) {
	d, target := startNotes(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := d.Act(ctx, target, &aip.Action{ID: aip.NewActionID(), CapabilityID: notes.CapAdd, Input: json.RawMessage(`{"txt":"typo"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
		t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
	}
	if got := list(t, d, target); len(got) != 0 {
		t.Fatalf("an invalid action wrote %+v", got)
	}
}

// A crash leaves actions running in the journal. Before the next process
// registers, the host hands each to Reconcile: the note an action wrote
// proves it completed; an action without one never wrote and failed.
func TestReconcileAfterACrash(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)

	// What a process killed in the middle of two notes.add left behind.
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	wrote, lost := aip.NewActionID(), aip.NewActionID()
	now := time.Now()
	for _, id := range []string{wrote, lost} {
		if _, _, err := j.BeginAction(ctx, journal.Action{ActionID: id, CapabilityID: notes.CapAdd, TenantID: cfg.TenantID,
			InputDigest: aip.DigestBytes([]byte(id)), ReceivedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := j.StartAction(ctx, id, now); err != nil {
			t.Fatal(err)
		}
	}
	stored, _ := json.Marshal([]notes.Note{{ID: 1, Text: "written before the crash", ActionID: wrote}})
	if _, err := j.PutState(ctx, "notes", cfg.TenantID, stored, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}

	h := hostsdktest.StartHost(t, cfg, notes.Connector{})
	target := hostsdktest.TargetOf(h, cfg)
	for id, want := range map[string]aip.ActionState{wrote: aip.StateCompleted, lost: aip.StateFailed} {
		st, _, err := d.Status(ctx, target, id, notes.CapAdd)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != want {
			t.Errorf("action %s is %s after recovery, want %s", id, st.State, want)
		}
	}
	if got := list(t, d, target); len(got) != 1 {
		t.Fatalf("notes after recovery: %+v", got)
	}
}
