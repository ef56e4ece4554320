package notes_test

import (
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

// A crash leaves actions running in the journal. Before the next process
// registers, the host hands each to Reconcile: the note an action wrote
// proves it completed; an action without one never wrote and failed.
func TestReconcileAfterACrash(t *testing.T) {
	wrote, lost := aip.NewActionID(), aip.NewActionID()
	f := hostsdktest.Start(t, notes.Connector{}, func(cfg *hostsdk.Config) {
		// What a process killed in the middle of two notes.add left
		// behind in the journal the host is about to open.
		leaveRunning(t, cfg, map[string][]notes.Note{
			wrote: {{ID: 1, Text: "written before the crash", ActionID: wrote}},
			lost:  nil,
		})
	})
	for id, want := range map[string]aip.ActionState{wrote: aip.StateCompleted, lost: aip.StateFailed} {
		st, _, err := f.Dispatcher.Status(hostsdktest.Context(t), f.Target, id, notes.CapAdd)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != want {
			t.Errorf("action %s is %s after recovery, want %s", id, st.State, want)
		}
	}
	if got := list(t, f); len(got) != 1 {
		t.Fatalf("notes after recovery: %+v", got)
	}
}

// leaveRunning writes into cfg's journal (the embedded one, in
// cfg.StateDir) a notes.add action started and never finished for each
// action ID, and the notes they wrote before the crash.
func leaveRunning(t *testing.T, cfg *hostsdk.Config, wrote map[string][]notes.Note) {
	t.Helper()
	ctx := hostsdktest.Context(t)
	j, err := sqliteruntime.Open(ctx, sqliteruntime.Config{Dir: cfg.StateDir})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var stored []notes.Note
	for id, ns := range wrote {
		if _, _, err := j.BeginAction(ctx, journal.Action{ActionID: id, CapabilityID: notes.CapAdd, TenantID: cfg.TenantID,
			InputDigest: aip.DigestBytes([]byte(id)), ReceivedAt: now}); err != nil {
			t.Fatal(err)
		}
		if err := j.StartAction(ctx, id, now); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, ns...)
	}
	raw, _ := json.Marshal(stored)
	if _, err := j.PutState(ctx, "notes", cfg.TenantID, raw, 0); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
}
