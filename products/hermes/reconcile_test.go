package hermes

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

// leaveRunning journals an action the way a process killed while handling
// it leaves it, with run_start's run record when runID is not empty.
func leaveRunning(t *testing.T, j journal.Journal, a *aip.Action, runID string) {
	t.Helper()
	ctx := hostsdktest.Context(t)
	digest, _ := aip.DigestJSON(a.Input)
	key := a.IdempotencyKey
	if key == "" {
		key = a.ID
	}
	now := time.Now()
	if _, created, err := j.BeginAction(ctx, journal.Action{ActionID: a.ID, CapabilityID: a.CapabilityID,
		TenantID: hostsdktest.TenantID, IdempotencyKey: key, InputDigest: digest, ReceivedAt: now}); err != nil || !created {
		t.Fatal(created, err)
	}
	if err := j.StartAction(ctx, a.ID, now); err != nil {
		t.Fatal(err)
	}
	if runID != "" {
		raw, _ := json.Marshal(runRecord{Endpoint: "main", RunID: runID})
		if _, err := j.PutState(ctx, RunsNamespace, a.ID, raw, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReconcileRunStartAfterRestart starts a host on a journal a process
// killed while run_start waited for its run left behind. The run it
// recorded did start: the action completes with the run ID and the run's
// status, read once, and nothing is started again. Before, without a
// Reconciler, such an action became outcome_unknown and the caller never
// learned the run ID, so it could neither follow nor stop the run. A
// run_start killed before its run was recorded is outcome_unknown, naming
// the idempotency key under which Hermes replays the start.
func TestReconcileRunStartAfterRestart(t *testing.T) {
	main, alice := newMockHermes(t, keyMain, ""), newMockHermes(t, keyAlice, "/p/alice")
	main.mu.Lock()
	main.runStatus = "completed"
	main.mu.Unlock()
	conn, err := New(Config{EndpointsFile: endpointsFile(t, main.srv.URL, alice.srv.URL+"/p/alice/"), PollInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	j, err := sqliteruntime.Open(hostsdktest.Context(t), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	recorded := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"long job","wait":true}`)
	unrecorded := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"other job"}`)
	unrecorded.IdempotencyKey = "order-42"
	leaveRunning(t, j, recorded, "run_abc123")
	leaveRunning(t, j, unrecorded, "")
	// A record that does not decode (written by another build): the run
	// may have started, and the answer says the record is unreadable
	// rather than that the replica restarted before recording it.
	garbled := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"third job"}`)
	leaveRunning(t, j, garbled, "")
	if _, err := j.PutState(hostsdktest.Context(t), RunsNamespace, garbled.ID, []byte(`"run_abc123"`), 0); err != nil {
		t.Fatal(err)
	}
	f := hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) { cfg.Journal = j })

	out := completed(t, f.Act(t, recorded))
	run, _ := out["run"].(map[string]any)
	if out["run_id"] != "run_abc123" || out["status"] != "completed" || run["output"] != "Done." {
		t.Errorf("reconciled run_start output %v", out)
	}
	resp := f.Act(t, unrecorded)
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, `"order-42"`) {
		t.Fatalf("unrecorded run_start: HTTP %d %s, want outcome_unknown naming the idempotency key", resp.Status, resp.Raw)
	}
	resp = f.Act(t, garbled)
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "the run record of "+garbled.ID+": record is unreadable") {
		t.Errorf("run_start with an unreadable run record: HTTP %d %s, want outcome_unknown saying the record is unreadable", resp.Status, resp.Raw)
	}
	main.mu.Lock()
	started := main.runs
	main.mu.Unlock()
	if started != 0 {
		t.Errorf("recovery started %d runs", started)
	}
	if reqs := main.of(recorded.ID); len(reqs) != 1 || reqs[0].Method != "GET" || reqs[0].Path != "/v1/runs/run_abc123" ||
		reqs[0].Header.Get("Authorization") != "Bearer "+keyMain {
		t.Errorf("requests of the recorded run_start %+v, want one status read", reqs)
	}
}
