package dify

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// leaveRunning journals an action the way a process killed while handling
// it leaves it, with the invocation's task record when ref is not nil (a
// taskRef, or the record's JSON as a map).
func leaveRunning(t *testing.T, j journal.Journal, a *aip.Action, ref any) {
	t.Helper()
	ctx := hostsdktest.Context(t)
	digest, _ := aip.DigestJSON(a.Input)
	now := time.Now()
	if _, created, err := j.BeginAction(ctx, journal.Action{ActionID: a.ID, CapabilityID: a.CapabilityID,
		TenantID: hostsdktest.TenantID, IdempotencyKey: a.ID, InputDigest: digest, ReceivedAt: now}); err != nil || !created {
		t.Fatal(created, err)
	}
	if err := j.StartAction(ctx, a.ID, now); err != nil {
		t.Fatal(err)
	}
	if ref != nil {
		raw, _ := json.Marshal(ref)
		if _, err := j.PutState(ctx, TasksNamespace, a.ID, raw, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWorkflowRunRecordedForReconcile: a workflow invocation's task record
// carries the run its stream named, which Reconcile reads after a restart.
func TestWorkflowRunRecordedForReconcile(t *testing.T) {
	f := newFixture(t, nil)
	a := hostsdktest.NewAction(AppCapability("etl", ""), `{"inputs":{"n":1},"user":"u"}`)
	var out InvokeOutput
	f.completed(t, a, &out)
	v, err := f.journal.State(hostsdktest.Context(t), TasksNamespace, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ref taskRef
	json.Unmarshal(v.Value, &ref)
	if want := (taskRef{AppID: "etl", TaskID: testTask, User: "u", WorkflowRunID: testRun}); ref != want {
		t.Errorf("task record %s, want %+v", v.Value, want)
	}
}

// TestReconcileWorkflowAfterRestart starts a host on a journal a process
// killed while workflow apps ran left behind. An invocation whose run was
// recorded is settled from GET /workflows/run/{workflow_run_id}, as the
// document answers it: succeeded completes with the run's outputs, failed
// fails dify.workflow_failed with the run's error; a run still running,
// an invocation without a recorded run, and a chat app's invocation are
// outcome_unknown. Nothing is run again. Before, without a Reconciler,
// every one of them was outcome_unknown, though Dify knew how each ended.
func TestReconcileWorkflowAfterRestart(t *testing.T) {
	const (
		failedRun  = "0d3f1a52-7c1e-4a8e-9b7a-2f9c6a1d4e01"
		runningRun = "5b2e9c14-3a7d-4f60-8e21-9c4b7d2a6f03"
	)
	succeeded := hostsdktest.NewAction(AppCapability("etl", ""), `{"inputs":{"n":1},"user":"u"}`)
	failed := hostsdktest.NewAction(AppCapability("etl", ""), `{"inputs":{"n":2},"user":"u"}`)
	running := hostsdktest.NewAction(AppCapability("etl", ""), `{"inputs":{"n":3},"user":"u"}`)
	unrecorded := hostsdktest.NewAction(AppCapability("etl", ""), `{"inputs":{"n":4},"user":"u"}`)
	chat := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"hi","user":"u"}`)
	read := hostsdktest.NewAction(AppCapability("etl", SuffixInfo), `{}`)
	// The run detail the document gives (WorkflowRunDetailResponse), for
	// each run as it ended.
	detail := func(f *fixture, id, status string, outputs map[string]any, errMsg any) {
		f.mock.handle("GET /workflows/run/"+id, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer app-workflow-key" {
				writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
				return
			}
			ans := docExample(t, f.mock.doc, "/workflows/run/{workflow_run_id}", "get", "200").(map[string]any)
			ans["id"], ans["status"], ans["outputs"], ans["error"] = id, status, outputs, errMsg
			writeJSON(w, http.StatusOK, ans)
		})
	}
	f := newFixtureOn(t, nil, func(f *fixture, j journal.Journal) {
		detail(f, testRun, "succeeded", map[string]any{"result": "Traduisez ceci en francais"}, nil)
		detail(f, failedRun, "failed", map[string]any{}, "node http_request failed: 502")
		detail(f, runningRun, "running", map[string]any{}, nil)
		leaveRunning(t, j, succeeded, &taskRef{AppID: "etl", TaskID: testTask, User: "u", WorkflowRunID: testRun})
		leaveRunning(t, j, failed, &taskRef{AppID: "etl", TaskID: testTask, User: "u", WorkflowRunID: failedRun})
		leaveRunning(t, j, running, &taskRef{AppID: "etl", TaskID: testTask, User: "u", WorkflowRunID: runningRun})
		leaveRunning(t, j, unrecorded, nil)
		leaveRunning(t, j, chat, &taskRef{AppID: "support", TaskID: testTask, User: "u"})
		leaveRunning(t, j, read, nil)
	})

	var out InvokeOutput
	f.completed(t, succeeded, &out)
	if out.Mode != ModeWorkflow || out.Status != "succeeded" || out.WorkflowRunID != testRun || out.TaskID != testTask ||
		string(out.Outputs) != `{"result":"Traduisez ceci en francais"}` || out.TotalSteps == nil || *out.TotalSteps != 3 {
		raw, _ := json.Marshal(out)
		t.Errorf("reconciled output %s", raw)
	}
	if pe := f.failed(t, failed); pe.Code != CodeWorkflowFailed || !strings.Contains(pe.Message, "node http_request failed: 502") {
		t.Errorf("failed run reconciled as %+v", pe)
	}
	for _, a := range []*aip.Action{running, unrecorded, chat} {
		resp := f.Act(t, a)
		if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
			t.Errorf("%s: HTTP %d %s, want outcome_unknown", a.Input, resp.Status, resp.Raw)
		}
	}
	if pe := f.Act(t, running).ProtocolError(); pe == nil || !strings.Contains(pe.Message, runningRun) ||
		!strings.Contains(pe.Message, AppCapability("etl", SuffixWorkflowRun)) {
		t.Errorf("a run still running: %+v, want its run and the capability reading it named", pe)
	}
	if pe := f.failed(t, read); pe.Code != "connector_host.interrupted" {
		t.Errorf("interrupted read: %+v", pe)
	}
	if n := len(f.mock.requests(http.MethodPost, "/workflows/run")) + len(f.mock.requests(http.MethodPost, "/chat-messages")); n != 0 {
		t.Errorf("recovery ran %d apps", n)
	}
}
