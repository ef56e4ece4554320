package notes_test

import (
	"encoding/json"
	"net/http"
	"testing"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/docs/connectorguide/notes"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startNotes runs the connector on a real host (hostsdktest.Start): a fake
// control plane it registers with, a fake dispatcher that signs actions and
// verifies the answers, the embedded journal in a temporary directory.
func startNotes(t *testing.T) *hostsdktest.Fixture {
	return hostsdktest.Start(t, notes.Connector{}, nil)
}

func add(text string) *aip.Action {
	in, _ := json.Marshal(map[string]string{"text": text})
	return hostsdktest.NewAction(notes.CapAdd, string(in))
}

func list(t *testing.T, f *hostsdktest.Fixture) []notes.Note {
	t.Helper()
	res := f.Result(t, hostsdktest.NewAction(notes.CapList, `{}`))
	var out struct{ Notes []notes.Note }
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatal(err)
	}
	return out.Notes
}

func TestAddThenList(t *testing.T) {
	f := startNotes(t)
	first := f.Result(t, add("buy milk"))
	f.Result(t, add("call Ada"))
	var n notes.Note
	if err := json.Unmarshal(first.Output, &n); err != nil || first.Status != aip.ResultCompleted || n.ID != 1 || n.Text != "buy milk" {
		t.Fatalf("first add: %+v %+v %v", first, n, err)
	}
	got := list(t, f)
	if len(got) != 2 || got[0].Text != "buy milk" || got[1].ID != 2 {
		t.Fatalf("list = %+v", got)
	}
}

// Delivering the same action again never writes a second note: the host
// answers from its journal, and the connector would find its note anyway.
func TestAddRunsOncePerAction(t *testing.T) {
	f := startNotes(t)
	a := add("once")
	for range 3 {
		if res := f.Result(t, a); res.Status != aip.ResultCompleted {
			t.Fatalf("add: %+v", res)
		}
	}
	if got := list(t, f); len(got) != 1 {
		t.Fatalf("%d notes after three deliveries of one action", len(got))
	}
}

// The host checks the input against the capability's input_schema before
// Handle runs: the answer is a signed error, not a result.
func TestInputIsValidatedByTheHost(t *testing.T) {
	f := startNotes(t)
	resp := f.Act(t, hostsdktest.NewAction(notes.CapAdd, `{"txt":"typo"}`))
	if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
		t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
	}
	if got := list(t, f); len(got) != 0 {
		t.Fatalf("an invalid action wrote %+v", got)
	}
}

// A caller's retry under a new action ID with the same idempotency key (what
// the guide tells a caller to do after a failure or an unknown outcome)
// finds the note the first action wrote, as the contract's
// safe_with_idempotency_key promises, instead of writing a second one.
func TestRetryWithTheSameKeyWritesOnce(t *testing.T) {
	f := startNotes(t)
	first, retry := add("pay rent"), add("pay rent")
	first.IdempotencyKey, retry.IdempotencyKey = "rent-2026-12", "rent-2026-12"
	var notesSeen []notes.Note
	for _, a := range []*aip.Action{first, retry} {
		res := f.Result(t, a)
		var n notes.Note
		if err := json.Unmarshal(res.Output, &n); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("add %s: %+v (%v)", a.ID, res, err)
		}
		notesSeen = append(notesSeen, n)
	}
	if notesSeen[0] != notesSeen[1] || notesSeen[0].IdempotencyKey != "rent-2026-12" {
		t.Errorf("the retry answered %+v, the first action %+v", notesSeen[1], notesSeen[0])
	}
	if got := list(t, f); len(got) != 1 {
		t.Fatalf("%d notes after a retry with the same key: %+v", len(got), got)
	}
}

// A crash leaves actions running in the journal. Before the next process
// registers, the host hands each to Reconcile: the note an action wrote
// proves it completed; an action without one never wrote and failed.
// Delivering them again gets what recovery decided.
func TestReconcileAfterACrash(t *testing.T) {
	wrote, lost := add("written before the crash"), add("lost in the crash")
	f := hostsdktest.Start(t, notes.Connector{}, func(cfg *hostsdk.Config) {
		// What a process killed in the middle of two notes.add left
		// behind: both actions running, and the note the first wrote.
		hostsdktest.LeaveRunning(t, cfg, wrote, lost)
		putNotes(t, cfg, notes.Note{ID: 1, Text: "written before the crash", IdempotencyKey: wrote.ID})
	})
	if res := f.Result(t, wrote); res.Status != aip.ResultCompleted {
		t.Errorf("the action that wrote its note: %+v", res)
	}
	if res := f.Result(t, lost); res.Status != aip.ResultFailed {
		t.Errorf("the action that wrote nothing: %+v", res)
	}
	if got := list(t, f); len(got) != 1 {
		t.Fatalf("notes after recovery: %+v", got)
	}
}

// putNotes stores a tenant's notes in the journal of cfg (the embedded one,
// in cfg.StateDir) before its host starts.
func putNotes(t *testing.T, cfg *hostsdk.Config, ns ...notes.Note) {
	t.Helper()
	ctx := hostsdktest.Context(t)
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	raw, _ := json.Marshal(ns)
	if _, err := j.PutState(ctx, "notes", cfg.TenantID, raw, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}
