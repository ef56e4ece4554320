package dify

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// TestChatflowRecordedForReconcile: a chatflow invocation's task record
// carries its run, conversation and message as soon as the stream names
// them (its first event, workflow_started, names all three), which
// Reconcile reads after a restart. Before, it held the run only, and a
// chatflow's answer could not be found again.
func TestChatflowRecordedForReconcile(t *testing.T) {
	f := newFixture(t, nil)
	a := hostsdktest.NewAction(AppCapability("flow", ""), `{"query":"q","user":"u"}`)
	var out InvokeOutput
	f.completed(t, a, &out)
	v, err := f.journal.State(hostsdktest.Context(t), TasksNamespace, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]string
	if err := json.Unmarshal(v.Value, &rec); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"app_id": "flow", "task_id": testTask, "user": "u", "workflow_run_id": testRun,
		"conversation_id": testConv, "message_id": testMessageID}
	if fmt.Sprint(rec) != fmt.Sprint(want) {
		t.Errorf("task record %s, want %v", v.Value, want)
	}
}

// conversation answers GET /messages as the document describes it, for
// one conversation of n messages (message i created at second i) whose
// pos-th newest is the chatflow's (id msgID, answer, files) when msgID is
// set: the newest limit messages, newest first; first_id pages back to
// the messages older than it; has_more says whether older ones remain.
// Only user u's requests with the chatflow's key find the conversation.
func conversation(n, pos int, msgID, answer string, files []any) http.HandlerFunc {
	type message = map[string]any
	var all []message // oldest first
	for i := range n {
		m := message{"id": fmt.Sprintf("00000000-0000-4000-8000-%012d", i), "conversation_id": testConv,
			"parent_message_id": nil, "inputs": map[string]any{}, "query": "q" + strconv.Itoa(i), "answer": "a" + strconv.Itoa(i),
			"status": "normal", "error": nil, "message_files": []any{}, "feedback": nil, "retriever_resources": []any{},
			"agent_thoughts": []any{}, "created_at": 1705400000 + i, "extra_contents": []any{}}
		if i == n-pos && msgID != "" {
			m["id"], m["answer"], m["message_files"] = msgID, answer, files
		}
		all = append(all, m)
	}
	return func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case r.Header.Get("Authorization") != "Bearer app-flow-key":
			writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
			return
		case q.Get("conversation_id") != testConv || q.Get("user") != "u":
			writeJSON(w, http.StatusNotFound, map[string]any{"status": 404, "code": "not_found", "message": "Conversation Not Exists."})
			return
		}
		end := len(all)
		if first := q.Get("first_id"); first != "" {
			end = -1
			for i, m := range all {
				if m["id"] == first {
					end = i
				}
			}
			if end < 0 {
				writeJSON(w, http.StatusNotFound, map[string]any{"status": 404, "code": "not_found", "message": "First Message Not Exists."})
				return
			}
		}
		limit := 20
		if l := q.Get("limit"); l != "" {
			limit, _ = strconv.Atoi(l)
		}
		start := max(0, end-limit)
		page := []message{}
		for i := end - 1; i >= start; i-- {
			page = append(page, all[i])
		}
		writeJSON(w, http.StatusOK, map[string]any{"limit": limit, "has_more": start > 0, "data": page})
	}
}

// TestReconcileChatflowAfterRestart starts a host on a journal a process
// killed while a chatflow app ran left behind. An invocation whose run,
// conversation and message were recorded is settled from Dify, as the
// document answers: its run (GET /workflows/run/{workflow_run_id})
// succeeded, it completes with the answer of its message, found in its
// conversation (GET /messages, paged back with first_id), and the run's
// status and outputs; failed, it fails dify.workflow_failed with the
// run's error. A run still running, a message the conversation does not
// hold, and a record without the conversation and message are
// outcome_unknown, naming what to read. The query is never sent again.
// Before, every chatflow invocation was outcome_unknown.
func TestReconcileChatflowAfterRestart(t *testing.T) {
	const (
		failedRun  = "0d3f1a52-7c1e-4a8e-9b7a-2f9c6a1d4e01"
		runningRun = "5b2e9c14-3a7d-4f60-8e21-9c4b7d2a6f03"
		lostMsg    = "7e1c3b2a-9d4f-4e6a-8b1c-2d3e4f5a6b7c"
	)
	input := `{"query":"q","user":"u"}`
	succeeded := hostsdktest.NewAction(AppCapability("flow", ""), input)
	failed := hostsdktest.NewAction(AppCapability("flow", ""), input)
	running := hostsdktest.NewAction(AppCapability("flow", ""), input)
	lost := hostsdktest.NewAction(AppCapability("flow", ""), input)
	runOnly := hostsdktest.NewAction(AppCapability("flow", ""), input)
	record := func(run, msg string) map[string]string {
		return map[string]string{"app_id": "flow", "task_id": testTask, "user": "u", "workflow_run_id": run,
			"conversation_id": testConv, "message_id": msg}
	}
	assistantFile := map[string]any{"id": "3f1b2c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d", "filename": "chart.png", "type": "image",
		"url": "https://files.example/chart.png", "mime_type": "image/png", "size": 2048, "transfer_method": "tool_file",
		"belongs_to": "assistant", "upload_file_id": nil}
	userFile := map[string]any{"id": "4a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5e", "filename": "question.pdf", "type": "document",
		"url": nil, "mime_type": "application/pdf", "size": 4096, "transfer_method": "local_file",
		"belongs_to": "user", "upload_file_id": "4a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5e"}
	detail := func(f *fixture, id, status string, outputs map[string]any, errMsg any) {
		f.mock.handle("GET /workflows/run/"+id, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer app-flow-key" {
				writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
				return
			}
			ans := docExample(t, f.mock.doc, "/workflows/run/{workflow_run_id}", "get", "200").(map[string]any)
			ans["id"], ans["status"], ans["outputs"], ans["error"] = id, status, outputs, errMsg
			writeJSON(w, http.StatusOK, ans)
		})
	}
	f := newFixtureOn(t, nil, func(f *fixture, j journal.Journal) {
		detail(f, testRun, "succeeded", map[string]any{"answer": "Flow answer"}, nil)
		detail(f, failedRun, "failed", map[string]any{}, "node http_request failed: 502")
		detail(f, runningRun, "running", map[string]any{}, nil)
		// The conversation went on after the crash: 130 newer messages
		// put the chatflow's on the second page.
		f.mock.handle("GET /messages", conversation(200, 131, testMessageID, "Flow answer", []any{userFile, assistantFile}))
		leaveRunning(t, j, succeeded, record(testRun, testMessageID))
		leaveRunning(t, j, failed, record(failedRun, testMessageID))
		leaveRunning(t, j, running, record(runningRun, testMessageID))
		leaveRunning(t, j, lost, record(testRun, lostMsg))
		leaveRunning(t, j, runOnly, map[string]string{"app_id": "flow", "task_id": testTask, "user": "u", "workflow_run_id": testRun})
	})

	var out InvokeOutput
	f.completed(t, succeeded, &out)
	if out.Mode != ModeAdvancedChat || out.Answer == nil || *out.Answer != "Flow answer" || out.ConversationID != testConv ||
		out.MessageID != testMessageID || out.WorkflowRunID != testRun || out.TaskID != testTask || out.Status != "succeeded" ||
		string(out.Outputs) != `{"answer":"Flow answer"}` {
		raw, _ := json.Marshal(out)
		t.Errorf("reconciled output %s", raw)
	}
	if len(out.Files) != 1 || !strings.Contains(string(out.Files[0]), "chart.png") {
		t.Errorf("files %s, want the assistant's file only", out.Files)
	}
	if pe := f.failed(t, failed); pe.Code != CodeWorkflowFailed || !strings.Contains(pe.Message, "node http_request failed: 502") {
		t.Errorf("failed run reconciled as %+v", pe)
	}
	for _, tc := range []struct {
		a    *aip.Action
		want []string
	}{
		{running, []string{runningRun, AppCapability("flow", SuffixWorkflowRun)}},
		{lost, []string{testRun, lostMsg, testConv, AppCapability("flow", SuffixMessages)}},
		{runOnly, []string{testRun}},
	} {
		resp := f.Act(t, tc.a)
		pe := resp.ProtocolError()
		if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
			t.Errorf("HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(pe.Message, s) {
				t.Errorf("message %q does not name %s", pe.Message, s)
			}
		}
	}
	// The succeeded run's message was on the second page, asked for with
	// the first page's oldest message as first_id; the lost one's search
	// read both pages too, and stopped where the conversation began.
	pages := map[string]int{}
	for _, r := range f.mock.requests(http.MethodGet, "/messages") {
		if r.Query.Get("user") != "u" || r.Query.Get("conversation_id") != testConv || r.Query.Get("limit") != "100" {
			t.Errorf("GET /messages?%s", r.Query.Encode())
		}
		pages[r.Query.Get("first_id")]++
	}
	if want := map[string]int{"": 2, "00000000-0000-4000-8000-000000000100": 2}; fmt.Sprint(pages) != fmt.Sprint(want) {
		t.Errorf("reads by first_id %v, want %v: the first page, then back from its oldest message", pages, want)
	}
	if n := len(f.mock.requests(http.MethodPost, "/chat-messages")); n != 0 {
		t.Errorf("recovery sent %d queries again", n)
	}
}
