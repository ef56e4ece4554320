package dify

import (
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestInvokeChatApp(t *testing.T) {
	f := newFixture(t, nil)
	a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"What is Dify?","user":"u-1","conversation_id":"`+testConv+`","inputs":{"city":"Paris"},
		"files":[{"type":"image","transfer_method":"remote_url","url":"https://example.test/a.png"}]}`)
	var out InvokeOutput
	f.completed(t, a, &out)
	if out.Answer == nil || *out.Answer != "Hello world" || out.TaskID != testTask || out.ConversationID != testConv ||
		out.MessageID != testMessageID || out.Mode != ModeChat || !strings.Contains(string(out.Metadata), `"total_tokens":1161`) {
		t.Fatalf("output %+v (answer %v) metadata %s", out, out.Answer, out.Metadata)
	}
	reqs := f.mock.requests(http.MethodPost, "/chat-messages")
	if len(reqs) != 1 {
		t.Fatalf("%d chat requests", len(reqs))
	}
	want := map[string]any{"query": "What is Dify?", "user": "u-1", "conversation_id": testConv, "response_mode": "streaming",
		"inputs": map[string]any{"city": "Paris"},
		"files":  []any{map[string]any{"type": "image", "transfer_method": "remote_url", "url": "https://example.test/a.png"}}}
	if diff := cmp.Diff(want, reqs[0].Body); diff != "" {
		t.Errorf("request body (-want +got):\n%s", diff)
	}
	if reqs[0].Auth != "Bearer app-chat-key" {
		t.Errorf("Authorization %q", reqs[0].Auth)
	}
	// The task is recorded for a cancel.
	v, err := f.journal.State(hostsdktest.Context(t), TasksNamespace, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ref taskRef
	json.Unmarshal(v.Value, &ref)
	if ref != (taskRef{AppID: "support", TaskID: testTask, User: "u-1"}) {
		t.Errorf("task record %s", v.Value)
	}
}

func TestInvokeEveryMode(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		app, input, path, auth string
		check                  func(InvokeOutput) bool
		body                   map[string]any
	}{
		{"agent", `{"query":"q","user":"u"}`, "/chat-messages", "Bearer app-agent-key",
			func(o InvokeOutput) bool {
				return o.Answer != nil && *o.Answer == "Hi there" && o.MessageID == testMessageID
			},
			map[string]any{"query": "q", "user": "u", "response_mode": "streaming", "inputs": map[string]any{}}},
		{"flow", `{"query":"q","user":"u"}`, "/chat-messages", "Bearer app-flow-key",
			func(o InvokeOutput) bool {
				return o.Answer != nil && *o.Answer == "Flow answer" && o.WorkflowRunID == testRun && o.Status == "succeeded" &&
					string(o.Outputs) == `{"answer":"Flow answer"}`
			},
			map[string]any{"query": "q", "user": "u", "response_mode": "streaming", "inputs": map[string]any{}}},
		{"writer", `{"inputs":{"topic":"x"},"user":"u"}`, "/completion-messages", "Bearer app-completion-key",
			func(o InvokeOutput) bool { return o.Answer != nil && *o.Answer == "Done." && o.ConversationID == "" },
			map[string]any{"user": "u", "response_mode": "streaming", "inputs": map[string]any{"topic": "x"}}},
		{"etl", `{"inputs":{"n":1},"user":"u"}`, "/workflows/run", "Bearer app-workflow-key",
			func(o InvokeOutput) bool {
				return o.Answer == nil && o.Status == "succeeded" && string(o.Outputs) == `{"result":42}` &&
					o.Text != nil && *o.Text == "part 1, part 2" && o.WorkflowRunID == testRun && *o.TotalSteps == 3 && o.TaskID == testTask
			},
			map[string]any{"user": "u", "response_mode": "streaming", "inputs": map[string]any{"n": float64(1)}}},
	}
	for _, tc := range cases {
		t.Run(tc.app, func(t *testing.T) {
			var out InvokeOutput
			f.completed(t, hostsdktest.NewAction(AppCapability(tc.app, ""), tc.input), &out)
			if !tc.check(out) {
				raw, _ := json.Marshal(out)
				t.Errorf("output %s", raw)
			}
			reqs := f.mock.requests(http.MethodPost, tc.path)
			last := reqs[len(reqs)-1]
			if last.Auth != tc.auth {
				t.Errorf("Authorization %q, want %q", last.Auth, tc.auth)
			}
			if diff := cmp.Diff(tc.body, last.Body); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStreamingForwardsChunks(t *testing.T) {
	f := newFixture(t, nil)
	a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"hi","user":"u"}`)
	a.Mode = aip.ModeStreaming
	var out InvokeOutput
	resp := f.completed(t, a, &out)
	var got []string
	for _, c := range resp.Chunks {
		var d struct{ Answer string }
		json.Unmarshal(c.Data, &d)
		got = append(got, string(c.Kind)+":"+d.Answer)
	}
	if diff := cmp.Diff([]string{"data:Hello", "data: world"}, got); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	if *out.Answer != "Hello world" {
		t.Errorf("answer %q", *out.Answer)
	}

	// A workflow forwards its text and node progress; an agent its thoughts.
	a = hostsdktest.NewAction(AppCapability("etl", ""), `{"user":"u"}`)
	a.Mode = aip.ModeStreaming
	resp = f.completed(t, a, &out)
	if len(resp.Chunks) != 2 || !strings.Contains(string(resp.Chunks[0].Data), "part 1") {
		t.Errorf("workflow chunks %+v", resp.Chunks)
	}
	a = hostsdktest.NewAction(AppCapability("agent", ""), `{"query":"q","user":"u"}`)
	a.Mode = aip.ModeStreaming
	resp = f.completed(t, a, &out)
	if len(resp.Chunks) != 3 || resp.Chunks[0].Kind != aip.ChunkThought || !strings.Contains(string(resp.Chunks[0].Data), `"tool":"search"`) {
		t.Errorf("agent chunks %+v", resp.Chunks)
	}
}

// TestNewAgentClosingMessage: a New Agent app's closing message carries the
// whole answer; it replaces the chunks instead of being appended.
func TestNewAgentClosingMessage(t *testing.T) {
	f := newFixture(t, nil)
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{chatEvent("agent_message", "Par"), chatEvent("agent_message", "tial"),
			chatEvent("message", "Partial, complete."), messageEnd()})
	})
	var out InvokeOutput
	f.completed(t, hostsdktest.NewAction(AppCapability("agent", ""), `{"query":"q","user":"u"}`), &out)
	if *out.Answer != "Partial, complete." {
		t.Errorf("answer %q", *out.Answer)
	}
	// In streaming mode the closing message reaches the receiver as a
	// replacement of the chunks so far.
	a := hostsdktest.NewAction(AppCapability("agent", ""), `{"query":"q","user":"u"}`)
	a.Mode = aip.ModeStreaming
	resp := f.completed(t, a, &out)
	var got []string
	for _, c := range resp.Chunks {
		got = append(got, string(c.Kind)+":"+string(c.Data))
	}
	want := []string{`data:{"answer":"Par"}`, `data:{"answer":"tial"}`, `data:{"answer":"Partial, complete.","replace":true}`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
}

// TestCancelStopsTask: a cancel stops the Dify task as the same end user
// with the app's key, and the action ends outcome_unknown.
func TestCancelStopsTask(t *testing.T) {
	cases := []struct{ app, invoke, stop string }{
		{"support", "/chat-messages", "/chat-messages/" + testTask + "/stop"},
		{"writer", "/completion-messages", "/completion-messages/" + testTask + "/stop"},
		{"etl", "/workflows/run", "/workflows/tasks/" + testTask + "/stop"},
	}
	for _, tc := range cases {
		t.Run(tc.app, func(t *testing.T) {
			f := newFixture(t, nil)
			first := chatEvent("message", "partial")
			if tc.app == "etl" {
				first = workflowEvent("workflow_started", map[string]any{"id": testRun})
			}
			f.mock.handle("POST "+tc.invoke, func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, []any{first})
				<-r.Context().Done() // the run goes on until the client leaves
			})
			ctx := hostsdktest.Context(t)
			a := hostsdktest.NewAction(AppCapability(tc.app, ""), `{"query":"long","user":"end-user-7"}`)
			if tc.app == "etl" {
				a.Input = json.RawMessage(`{"user":"end-user-7"}`)
			}
			done := make(chan *hostsdktest.Response, 1)
			go func() {
				resp, _ := f.Dispatcher.Act(ctx, f.Target, a)
				done <- resp
			}()
			// Wait for the task record (a real journal read), then cancel.
			for {
				_, err := f.journal.State(ctx, TasksNamespace, a.ID)
				if err == nil {
					break
				}
				if !errors.Is(err, journal.ErrNotFound) {
					t.Fatal(err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			resp, err := f.Dispatcher.Cancel(ctx, f.Target, a.ID, a.CapabilityID, "user gave up")
			if err != nil {
				t.Fatal(err)
			}
			// The stop may reach Dify after the app finished or acted: the
			// action is outcome_unknown, never cancelled.
			if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" {
				t.Fatalf("cancel answered HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
			}
			if resp := <-done; resp == nil {
				t.Fatal("the action got no answer")
			} else if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, testTask) {
				t.Fatalf("action answered HTTP %d %s, want outcome_unknown naming the task", resp.Status, resp.Raw)
			}
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			stops := f.mock.requests(http.MethodPost, tc.stop)
			if len(stops) != 1 {
				t.Fatalf("%d stop requests", len(stops))
			}
			if diff := cmp.Diff(map[string]any{"user": "end-user-7"}, stops[0].Body); diff != "" {
				t.Errorf("stop body (-want +got):\n%s", diff)
			}
			if want := "Bearer " + keyOf(tc.app); stops[0].Auth != want {
				t.Errorf("stop Authorization %q, want %q", stops[0].Auth, want)
			}
		})
	}
}

func keyOf(app string) string {
	for _, a := range testApps {
		if a.id == app {
			return a.key
		}
	}
	return ""
}

func TestStreamErrors(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		name   string
		path   string
		app    string
		events []any
		code   string
		msg    string
	}{
		{"error event", "/chat-messages", "support",
			[]any{chatEvent("message", "par"), map[string]any{"event": "error", "message_id": testMessageID, "status": 400, "code": "invalid_param", "message": "the model refused"}},
			provider.CodeInvalidRequest, "invalid_param: the model refused"},
		{"workflow failed", "/workflows/run", "etl",
			[]any{workflowEvent("workflow_started", map[string]any{"id": testRun}), workflowFinished("failed", nil, "node llm: timeout")},
			CodeWorkflowFailed, "node llm: timeout"},
		{"workflow stopped", "/workflows/run", "etl",
			[]any{workflowFinished("stopped", nil, nil)},
			CodeWorkflowStopped, "stopped"},
		{"chatflow failed", "/chat-messages", "flow",
			[]any{chatEvent("message", "x"), workflowFinished("failed", nil, "boom"),
				map[string]any{"event": "error", "message_id": testMessageID, "status": 500, "code": "internal_server_error", "message": "boom"}},
			CodeWorkflowFailed, "boom"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+tc.path, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, tc.events) })
			input := `{"query":"q","user":"u"}`
			if tc.app == "etl" || tc.app == "writer" {
				input = `{"user":"u"}`
			}
			pe := f.failed(t, hostsdktest.NewAction(AppCapability(tc.app, ""), input))
			if pe.Code != tc.code || !strings.Contains(pe.Message, tc.msg) {
				t.Errorf("error %s %q, want %s containing %q", pe.Code, pe.Message, tc.code, tc.msg)
			}
		})
	}
}

// TestErrorEvent4xxAfterToolsIsOutcomeUnknown: a 4xx error event (a model
// quota running out, a refused request) after an app with tools was at work
// leaves unknown what its tools did: outcome_unknown. The same error as the
// stream's first event, before anything ran, is a failure.
func TestErrorEvent4xxAfterToolsIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t, nil)
	quota := map[string]any{"event": "error", "message_id": testMessageID, "status": 400, "code": "provider_quota_exceeded", "message": "quota exceeded"}
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{chatEvent("agent_message", "Let me book that. "), quota})
	})
	a := hostsdktest.NewAction(AppCapability("agent", ""), `{"query":"book it","user":"u"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("agent app, 400 error event after it was at work: %s, want outcome_unknown", st)
	}
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) { writeEvents(w, []any{quota}) })
	if pe := f.failed(t, hostsdktest.NewAction(AppCapability("agent", ""), `{"query":"book it","user":"u"}`)); !strings.Contains(pe.Message, "quota exceeded") {
		t.Fatalf("agent app, 400 error event first: %+v", pe)
	}
}

// TestErrorEvent5xxIsOutcomeUnknown: an error event with a 5xx status (or
// none) is Dify failing unexpectedly mid-run, after the app may have used
// its tools: outcome_unknown, as after a 5xx answer, not a retryable
// failure; the same action ID never reaches Dify again.
func TestErrorEvent5xxIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		name, path, app, input string
		event                  map[string]any
	}{
		{"status 500", "/chat-messages", "agent", `{"query":"q","user":"u"}`,
			map[string]any{"event": "error", "message_id": testMessageID, "status": 500, "code": "internal_server_error", "message": "tool crashed"}},
		{"no status", "/completion-messages", "writer", `{"user":"u"}`,
			map[string]any{"event": "error", "code": "completion_request_error", "message": "upstream model failed"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+tc.path, func(w http.ResponseWriter, r *http.Request) {
				writeEvents(w, []any{chatEvent("agent_message", "par"), tc.event})
			})
			before := len(f.mock.requests(http.MethodPost, tc.path))
			a := hostsdktest.NewAction(AppCapability(tc.app, ""), tc.input)
			resp := f.Act(t, a)
			if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, tc.event["message"].(string)) {
				t.Fatalf("HTTP %d %s, want outcome_unknown with the event's message", resp.Status, resp.Raw)
			}
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			f.Act(t, a)
			if n := len(f.mock.requests(http.MethodPost, tc.path)) - before; n != 1 {
				t.Errorf("Dify got %d invocations for one action", n)
			}
		})
	}
}

// TestPausedWorkflow: a run waiting for a human input form completes with
// status paused and the pause data.
func TestPausedWorkflow(t *testing.T) {
	f := newFixture(t, nil)
	f.mock.handle("POST /workflows/run", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{workflowEvent("workflow_started", map[string]any{"id": testRun}),
			workflowEvent("workflow_paused", map[string]any{"workflow_run_id": testRun, "paused_nodes": []string{"form"}, "status": "paused"})})
	})
	var out InvokeOutput
	f.completed(t, hostsdktest.NewAction(AppCapability("etl", ""), `{"user":"u"}`), &out)
	if out.Status != "paused" || !strings.Contains(string(out.Paused), `"paused_nodes":["form"]`) {
		t.Errorf("output %+v paused %s", out, out.Paused)
	}
}

// TestInvokeOutcomeUnknown: an invocation whose stream ends before its
// closing event, or that gets a 5xx or a dropped connection, is
// outcome_unknown, and the same action ID never reaches Dify again. A
// stream that named its task has the message name it and say which
// capability reads what the app did.
func TestInvokeOutcomeUnknown(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		name string
		h    http.HandlerFunc
		want []string
	}{
		{"stream ends early", func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{chatEvent("message", "half")})
		}, []string{"the event stream ended before its closing event", "the app runs as Dify task " + testTask,
			"read the conversation's messages with cap:dify:support:messages (conversation_id " + testConv}},
		{"500", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"status": 500, "code": "internal_server_error", "message": "Internal server error."})
		}, nil},
		{"dropped", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}, nil},
		{"not an event stream", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"event": "message", "answer": "blocking"})
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST /chat-messages", tc.h)
			before := len(f.mock.requests(http.MethodPost, "/chat-messages"))
			a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`)
			resp := f.Act(t, a)
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			for _, w := range tc.want {
				if pe := resp.ProtocolError(); pe == nil || !strings.Contains(pe.Message, w) {
					t.Errorf("answer %s\nlacks %q", resp.Raw, w)
				}
			}
			f.Act(t, a)
			if n := len(f.mock.requests(http.MethodPost, "/chat-messages")) - before; n != 1 {
				t.Errorf("Dify got %d invocations for one action", n)
			}
		})
	}
}

func TestIdleStreamIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond })
	f.mock.handle("POST /workflows/run", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{workflowEvent("workflow_started", map[string]any{"id": testRun})})
		<-r.Context().Done()
	})
	a := hostsdktest.NewAction(AppCapability("etl", ""), `{"user":"u"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("state %s", st)
	}
}

func TestInvokeRefused(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		status int
		code   string
	}{
		{http.StatusBadRequest, provider.CodeInvalidRequest},
		{http.StatusUnauthorized, provider.CodeUnauthorized},
		{http.StatusNotFound, provider.CodeNotFound},
		{http.StatusTooManyRequests, provider.CodeRateLimited},
	}
	for _, tc := range cases {
		f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, tc.status, map[string]any{"status": tc.status, "code": "app_unavailable", "message": "App unavailable, please check your app configurations."})
		})
		pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`))
		if pe.Code != tc.code || !strings.Contains(pe.Message, "App unavailable") {
			t.Errorf("%d: %s %q", tc.status, pe.Code, pe.Message)
		}
	}
}

func TestReads(t *testing.T) {
	f := newFixture(t, nil)
	var out map[string]any

	f.completed(t, hostsdktest.NewAction(AppCapability("etl", SuffixParameters), `{}`), &out)
	if out["opening_statement"] != "Hello! How can I help you today?" {
		t.Errorf("parameters %v", out)
	}
	if r := f.mock.requests(http.MethodGet, "/parameters"); len(r) != 1 || r[0].Auth != "Bearer app-workflow-key" {
		t.Errorf("parameters requests %+v", r)
	}

	f.completed(t, hostsdktest.NewAction(AppCapability("support", SuffixConversations), `{"user":"u-1","last_id":"c-9","limit":5,"sort_by":"-created_at"}`), &out)
	if out["has_more"] != false || len(out["data"].([]any)) != 1 {
		t.Errorf("conversations %v", out)
	}
	r := f.mock.requests(http.MethodGet, "/conversations")
	if len(r) != 1 || r[0].Query.Encode() != "last_id=c-9&limit=5&sort_by=-created_at&user=u-1" || r[0].Auth != "Bearer app-chat-key" {
		t.Errorf("conversations requests %+v", r)
	}

	f.completed(t, hostsdktest.NewAction(AppCapability("flow", SuffixMessages), `{"conversation_id":"`+testConv+`","user":"u-1","first_id":"m-1","limit":100}`), &out)
	if len(out["data"].([]any)) == 0 {
		t.Errorf("messages %v", out)
	}
	r = f.mock.requests(http.MethodGet, "/messages")
	if len(r) != 1 || r[0].Query.Get("conversation_id") != testConv || r[0].Query.Get("first_id") != "m-1" ||
		r[0].Query.Get("limit") != "100" || r[0].Query.Get("user") != "u-1" || r[0].Auth != "Bearer app-flow-key" {
		t.Errorf("messages requests %+v", r)
	}

	f.completed(t, hostsdktest.NewAction(AppCapability("writer", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u-1","rating":"like","content":"great"}`), &out)
	if out["result"] != "success" {
		t.Errorf("feedback %v", out)
	}
	f.completed(t, hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u-1","rating":null}`), &out)
	r = f.mock.requests(http.MethodPost, "/messages/"+testMessageID+"/feedbacks")
	if len(r) != 2 || r[0].Auth != "Bearer app-completion-key" || r[1].Auth != "Bearer app-chat-key" {
		t.Fatalf("feedback requests %+v", r)
	}
	if diff := cmp.Diff(map[string]any{"user": "u-1", "rating": "like", "content": "great"}, r[0].Body); diff != "" {
		t.Errorf("feedback body (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"user": "u-1", "rating": nil}, r[1].Body); diff != "" {
		t.Errorf("withdrawn feedback body (-want +got):\n%s", diff)
	}

	f.completed(t, hostsdktest.NewAction(RetrieveCapability(testDataset), `{"query":"What is Dify?","retrieval_model":{"search_method":"semantic_search","top_k":3,"score_threshold":0.5}}`), &out)
	if len(out["records"].([]any)) == 0 {
		t.Errorf("retrieve %v", out)
	}
	f.completed(t, hostsdktest.NewAction(RetrieveCapability(testDataset), `{"query":"plain"}`), &out)
	r = f.mock.requests(http.MethodPost, "/datasets/"+testDataset+"/retrieve")
	if len(r) != 2 || r[0].Auth != "Bearer "+testDatasetKey {
		t.Fatalf("retrieve requests %+v", r)
	}
	wantModel := map[string]any{"query": "What is Dify?", "retrieval_model": map[string]any{"search_method": "semantic_search",
		"reranking_enable": false, "top_k": float64(3), "score_threshold_enabled": true, "score_threshold": 0.5}}
	if diff := cmp.Diff(wantModel, r[0].Body); diff != "" {
		t.Errorf("retrieve body (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]any{"query": "plain"}, r[1].Body); diff != "" {
		t.Errorf("retrieve body (-want +got):\n%s", diff)
	}
}

func TestReadErrors(t *testing.T) {
	f := newFixture(t, nil)
	// A read that gets a 5xx is failed and retryable, never outcome_unknown.
	f.mock.handle("POST /datasets/"+testDataset+"/retrieve", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": 503, "code": "unavailable", "message": "try later"})
	})
	pe := f.failed(t, hostsdktest.NewAction(RetrieveCapability(testDataset), `{"query":"q"}`))
	if pe.Code != provider.CodeUnavailable || pe.Retryable == nil || !*pe.Retryable || !strings.Contains(pe.Message, "try later") {
		t.Errorf("retrieve 503: %+v", pe)
	}
	f.mock.handle("GET /messages", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]any{"status": 404, "code": "not_found", "message": "Conversation Not Exists."})
	})
	pe = f.failed(t, hostsdktest.NewAction(AppCapability("support", SuffixMessages), `{"conversation_id":"nope","user":"u"}`))
	if pe.Code != provider.CodeNotFound || (pe.Retryable != nil && *pe.Retryable) || !strings.Contains(pe.Message, "Conversation Not Exists.") {
		t.Errorf("messages 404: %+v", pe)
	}
	// Feedback is a mutation: a 5xx is outcome_unknown and never sent twice.
	f.mock.handle("POST /messages/"+testMessageID+"/feedbacks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusBadGateway, map[string]any{"message": "bad gateway"})
	})
	a := hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u","rating":"dislike"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("feedback 502: state %s", st)
	}
	f.Act(t, a)
	if n := len(f.mock.requests(http.MethodPost, "/messages/"+testMessageID+"/feedbacks")); n != 1 {
		t.Errorf("feedback sent %d times", n)
	}
	// A 4xx on a mutation is failed.
	f.mock.handle("POST /messages/"+testMessageID+"/feedbacks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusForbidden, map[string]any{"status": 403, "code": "forbidden", "message": "not yours"})
	})
	pe = f.failed(t, hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u","rating":"like"}`))
	if pe.Code != provider.CodeForbidden {
		t.Errorf("feedback 403: %+v", pe)
	}
}

func TestInputRejected(t *testing.T) {
	f := newFixture(t, nil)
	cases := []*aip.Action{
		hostsdktest.NewAction(AppCapability("support", ""), `{"user":"u"}`),                                                       // no query
		hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q"}`),                                                      // no user
		hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u","extra":1}`),                                 // unknown field
		hostsdktest.NewAction(AppCapability("etl", ""), `{"query":"q","user":"u"}`),                                               // workflows take no query
		hostsdktest.NewAction(AppCapability("etl", ""), `{"user":"u","files":[{"type":"image","transfer_method":"local_file"}]}`), // no upload_file_id
		hostsdktest.NewAction(AppCapability("support", SuffixConversations), `{"user":"u","limit":101}`),
		hostsdktest.NewAction(AppCapability("support", SuffixMessages), `{"user":"u"}`),
		hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"m","user":"u","rating":"meh"}`),
		hostsdktest.NewAction(RetrieveCapability(testDataset), `{"query":"`+strings.Repeat("x", 251)+`"}`),
		hostsdktest.NewAction(RetrieveCapability(testDataset), `{"query":"q","retrieval_model":{"top_k":3}}`),
		hostsdktest.NewAction(AppCapability("etl", SuffixParameters), `{"x":1}`),
	}
	f.refusedBeforeSending(t, cases)
}

func TestManifest(t *testing.T) {
	f := newFixture(t, nil)
	m, err := f.conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatal(err)
	}
	naming := regexp.MustCompile(`^cap:dify:(knowledge:[A-Za-z0-9_-]+:(retrieve|documents|document\.(get|create_by_(text|file)|update_by_(text|file)|delete)|segments|` +
		`pipeline\.(datasource_plugins|datasource_node\.run|run|file_upload))|` +
		`[A-Za-z0-9_-]+(:(parameters|info|meta|site|conversations|conversation\.(rename|delete|variables)|messages|messages\.suggested|feedbacks?|workflow\.(run\.get|logs)|files\.upload|audio\.to_text))?)$`)
	var ids []string
	for _, c := range m.Capabilities {
		ids = append(ids, c.ID)
		if !naming.MatchString(c.ID) {
			t.Errorf("capability ID %s does not follow the naming", c.ID)
		}
		var s struct {
			Type       string          `json:"type"`
			Required   []string        `json:"required"`
			Additional *bool           `json:"additionalProperties"`
			Properties json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(c.InputSchema, &s); err != nil {
			t.Fatalf("%s: %v", c.ID, err)
		}
		if s.Type != "object" || s.Additional == nil || *s.Additional || len(s.Properties) == 0 {
			t.Errorf("%s: input schema not strict: %s", c.ID, c.InputSchema)
		}
		if c.Description == "" || c.Risk == "" || c.RequiresHumanApproval != nil {
			t.Errorf("%s: description %q risk %q approval %v", c.ID, c.Description, c.Risk, c.RequiresHumanApproval)
		}
		if strings.Contains(string(mustJSON(c)), "key") && strings.Contains(string(mustJSON(c)), "app-chat-key") {
			t.Errorf("%s carries a credential", c.ID)
		}
	}
	chat := func(id string) []string {
		return []string{"cap:dify:" + id, "cap:dify:" + id + ":parameters", "cap:dify:" + id + ":info", "cap:dify:" + id + ":meta", "cap:dify:" + id + ":site",
			"cap:dify:" + id + ":conversations", "cap:dify:" + id + ":conversation.rename", "cap:dify:" + id + ":conversation.delete",
			"cap:dify:" + id + ":conversation.variables", "cap:dify:" + id + ":messages", "cap:dify:" + id + ":messages.suggested",
			"cap:dify:" + id + ":feedback", "cap:dify:" + id + ":feedbacks"}
	}
	kb := "cap:dify:knowledge:" + testDataset
	var want []string
	want = append(want, chat("support")...)
	want = append(want, "cap:dify:support:files.upload", "cap:dify:support:audio.to_text")
	want = append(want, chat("flow")...)
	want = append(want, "cap:dify:flow:workflow.run.get", "cap:dify:flow:workflow.logs", "cap:dify:flow:files.upload", "cap:dify:flow:audio.to_text")
	want = append(want, chat("agent")...)
	want = append(want, "cap:dify:agent:files.upload", "cap:dify:agent:audio.to_text")
	want = append(want,
		"cap:dify:writer", "cap:dify:writer:parameters", "cap:dify:writer:info", "cap:dify:writer:meta", "cap:dify:writer:site",
		"cap:dify:writer:feedback", "cap:dify:writer:feedbacks", "cap:dify:writer:files.upload", "cap:dify:writer:audio.to_text",
		"cap:dify:etl", "cap:dify:etl:parameters", "cap:dify:etl:info", "cap:dify:etl:meta", "cap:dify:etl:site",
		"cap:dify:etl:workflow.run.get", "cap:dify:etl:workflow.logs", "cap:dify:etl:files.upload", "cap:dify:etl:audio.to_text",
		kb+":retrieve", kb+":documents", kb+":document.get", kb+":document.create_by_text", kb+":document.update_by_text",
		kb+":document.create_by_file", kb+":document.update_by_file", kb+":document.delete", kb+":segments",
		kb+":pipeline.datasource_plugins", kb+":pipeline.datasource_node.run", kb+":pipeline.run", kb+":pipeline.file_upload",
	)
	if diff := cmp.Diff(want, ids); diff != "" {
		t.Errorf("capabilities (-want +got):\n%s", diff)
	}
	raw := mustJSON(m)
	for _, a := range testApps {
		if strings.Contains(string(raw), a.key) {
			t.Errorf("the manifest carries the key of %s", a.id)
		}
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestCheckHealth: every app's and knowledge base's key is checked with
// its cheapest authenticated read; the check fails only when every one
// fails.
func TestCheckHealth(t *testing.T) {
	f := newFixture(t, nil)
	if err := f.conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range f.mock.requests(http.MethodGet, "/info") {
		seen[r.Auth] = true
	}
	for _, a := range testApps {
		if !seen["Bearer "+a.key] {
			t.Errorf("app %s's key was not checked: %v", a.id, seen)
		}
	}
	if r := f.mock.requests(http.MethodGet, "/datasets"); len(r) == 0 || r[0].Auth != "Bearer "+testDatasetKey || r[0].Query.Get("limit") != "1" {
		t.Errorf("health requests %+v", r)
	}
	// Every app refused: the knowledge base still serves.
	f.mock.handle("GET /info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
	})
	var d *hostsdk.DegradedError
	if err := f.conn.CheckHealth(hostsdktest.Context(t)); !errors.As(err, &d) || !strings.Contains(err.Error(), "app support") ||
		strings.Contains(err.Error(), "knowledge base "+testDataset) {
		t.Errorf("every app refused, the knowledge base served: %v, want degraded naming the apps", err)
	}
	f.mock.revoke(testDatasetKey)
	var pe *provider.Error
	err := f.conn.CheckHealth(hostsdktest.Context(t))
	if !errors.As(err, &pe) || pe.Status != http.StatusUnauthorized || strings.Contains(err.Error(), "app-chat-key") ||
		!strings.Contains(err.Error(), "app support") || !strings.Contains(err.Error(), "knowledge base "+testDataset) {
		t.Errorf("health with every key refused: %v", err)
	}

	// Knowledge bases only: the dataset list.
	g := newFixture(t, func(c *Config) { c.AppsFile = "" })
	if err := g.conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if r := g.mock.requests(http.MethodGet, "/datasets"); len(r) == 0 || r[0].Auth != "Bearer "+testDatasetKey || r[0].Query.Get("limit") != "1" {
		t.Errorf("health requests %+v", r)
	}
}

// TestOneAppFailingKeepsTheReplicaReady: an app whose key was revoked
// (the first app, the only one the check read) does not make the replica
// not ready, which would take every app offline: the host starts and
// serves the others, and the app's actions fail at once, naming it,
// without a request to Dify.
func TestOneAppFailingKeepsTheReplicaReady(t *testing.T) {
	f := newFixtureOn(t, nil, func(f *fixture, _ journal.Journal) { f.mock.revoke("app-chat-key") })
	if !f.Host.Ready() {
		t.Fatal("the replica is not ready with one app failing its check")
	}
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(AppCapability("flow", SuffixParameters), `{}`), &out)

	a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`)
	pe := f.failed(t, a)
	if pe.Code != provider.CodeUnauthorized || pe.IsRetryable() {
		t.Errorf("refusal %+v, want %s not retryable", pe, provider.CodeUnauthorized)
	}
	for _, want := range []string{"app support", "not sent", "nothing ran", "401"} {
		if !strings.Contains(pe.Message, want) {
			t.Errorf("message %q does not say %q", pe.Message, want)
		}
	}
	if strings.Contains(pe.Message, "app-chat-key") {
		t.Errorf("the message carries the key: %q", pe.Message)
	}
	if r := f.mock.requests(http.MethodPost, "/chat-messages"); len(r) != 0 {
		t.Errorf("requests sent for the app that failed its check: %+v", r)
	}
}

// TestStreamBound: a stream larger than --dify-max-response-bytes is cut,
// and the invocation, which ran, is outcome_unknown.
func TestStreamBound(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxResponseBytes = 2048 })
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		var evs []any
		for range 40 {
			evs = append(evs, chatEvent("message", strings.Repeat("x", 100)))
		}
		writeEvents(w, append(evs, messageEnd()))
	})
	a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`)
	f.Act(t, a)
	st, _, err := f.Dispatcher.Status(hostsdktest.Context(t), f.Target, a.ID, a.CapabilityID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != aip.StateOutcomeUnknown {
		t.Fatalf("state %s", st.State)
	}
}

// TestUnreadableAnswer: a 2xx feedback answer that is not JSON is
// outcome_unknown (applied, result unknown); the same for a read is failed.
func TestUnreadableAnswer(t *testing.T) {
	f := newFixture(t, nil)
	garbage := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write([]byte("<html>proxy</html>"))
	}
	f.mock.handle("POST /messages/"+testMessageID+"/feedbacks", garbage)
	a := hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u","rating":"like"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Errorf("feedback: state %s", st)
	}
	f.mock.handle("GET /parameters", garbage)
	if pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", SuffixParameters), `{}`)); pe.Code != provider.CodeBadResponse {
		t.Errorf("parameters: %+v", pe)
	}
}

// TestUnusableTaskID: a task_id Dify streams that is not a UUID (the
// document's format) — a path separator, a dot segment, a query mark, a
// control character, too long — is never kept for Cancel nor put into a
// stop path: the invocation ends outcome_unknown (the app runs), saying
// why. An error event carrying one is still classified as an error.
func TestUnusableTaskID(t *testing.T) {
	f := newFixture(t, nil)
	for _, id := range []string{"abc/def", "..", "../../datasets", "x?y=1", "x#y", testTask + "/..", testTask + "\u0001", strings.Repeat("a", 300)} {
		with := func(ev map[string]any) map[string]any { ev["task_id"] = id; return ev }
		f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{with(chatEvent("message", "Hello")), with(messageEnd())})
		})
		a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`)
		resp := f.Act(t, a)
		if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, "task_id") {
			t.Errorf("task_id %q: answered HTTP %d %s, want outcome_unknown naming the task_id", id, resp.Status, resp.Raw)
		}
		if _, err := f.journal.State(hostsdktest.Context(t), TasksNamespace, a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("task_id %q: a task record was kept for Cancel (%v)", id, err)
		}
	}
	// A task_id that echoes the request's Authorization header is quoted
	// with the key redacted.
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		ev := chatEvent("message", "Hello")
		ev["task_id"] = r.Header.Get("Authorization")
		writeEvents(w, []any{ev})
	})
	resp := f.Act(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`))
	if pe := resp.ProtocolError(); pe == nil || strings.Contains(pe.Message, keyOf("support")) || !strings.Contains(pe.Message, "[redacted]") {
		t.Errorf("HTTP %d %s: want outcome_unknown quoting the task_id with the key redacted", resp.Status, resp.Raw)
	}
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{map[string]any{"event": "error", "task_id": "a/b", "status": 400, "code": "invalid_param", "message": "bad query"}})
	})
	if pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`)); pe.Code != provider.CodeInvalidRequest {
		t.Errorf("error event with an unusable task_id: %s %q, want %s", pe.Code, pe.Message, provider.CodeInvalidRequest)
	}
}

// TestNULGoesToDify: unlike Chatwoot, Twenty and Cal.diy, an input holding
// U+0000 is not refused here (but see TestNestedNULRefused and
// TestPipelineRunNestedNULRefused): Dify removes the character from a
// query and from the app's string inputs itself before storing them, and
// answers one that reaches its database elsewhere (psycopg2's ValueError)
// with 400 invalid_param, a failed result that says why.
func TestNULGoesToDify(t *testing.T) {
	f := newFixture(t, nil)
	a := hostsdktest.NewAction(AppCapability("support", ""), `{"query":"What is\u0000 Dify?","user":"u-1","inputs":{"city":"Pa\u0000ris"}}`)
	var out InvokeOutput
	f.completed(t, a, &out)
	reqs := f.mock.requests(http.MethodPost, "/chat-messages")
	if len(reqs) != 1 || reqs[0].Body["query"] != "What is\x00 Dify?" || !cmp.Equal(reqs[0].Body["inputs"], any(map[string]any{"city": "Pa\x00ris"})) {
		t.Fatalf("chat requests %+v, want the query and inputs as given", reqs)
	}
	f.mock.handle("POST /messages/"+testMessageID+"/feedbacks", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "code": "invalid_param", "message": "A string literal cannot contain NUL (0x00) characters."})
	})
	pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", SuffixFeedback), `{"message_id":"`+testMessageID+`","user":"u","rating":"like","content":"fine\u0000"}`))
	if pe.Code != provider.CodeInvalidRequest || (pe.Retryable != nil && *pe.Retryable) || !strings.Contains(pe.Message, "NUL (0x00)") {
		t.Errorf("feedback holding U+0000, answered 400: %+v", pe)
	}
}

// TestNestedNULRefused: Dify removes U+0000 from a string input, not from
// a string inside an object or array input or a file, which its database
// cannot store once the app runs: such an invocation is refused before
// anything is sent, naming the string's path and what to do.
func TestNestedNULRefused(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct{ capID, input, path string }{
		{AppCapability("support", ""), `{"query":"q","user":"u","inputs":{"city":"Paris","customer":{"name":"Ann","notes":["a","b","c\u0000"]}}}`, "inputs.customer.notes[2]"},
		{AppCapability("support", ""), `{"query":"q","user":"u","inputs":{"customer":{"na\u0000me":"Ann"}}}`, `inputs.customer["na\u0000me"]`},
		{AppCapability("writer", ""), `{"user":"u","inputs":{"tags":["x","y\u0000"]}}`, "inputs.tags[1]"},
		{AppCapability("etl", ""), `{"user":"u","inputs":{"my var":[{"a":[[1,"\u0000"]]}]}}`, `inputs["my var"][0].a[0][1]`},
		{AppCapability("etl", ""), `{"user":"u","inputs":{"b":{"x":"\u0000"},"a":{"y":"\u0000"}}}`, "inputs.a.y"},
		{AppCapability("support", ""), `{"query":"q","user":"u","files":[{"type":"image","transfer_method":"local_file","upload_file_id":"f-1"},{"type":"image","transfer_method":"remote_url","url":"https://example.com/a\u0000.png"}]}`, "files[1].url"},
	}
	for _, tc := range cases {
		pe := f.failed(t, hostsdktest.NewAction(tc.capID, tc.input))
		if pe.Code != hostsdk.CodeInputInvalid || (pe.Retryable != nil && *pe.Retryable) ||
			!strings.Contains(pe.Message, tc.path+" holds the character U+0000") || !strings.Contains(pe.Message, "remove the character") {
			t.Errorf("%s: %+v, want %s naming %s", tc.input, pe, hostsdk.CodeInputInvalid, tc.path)
		}
	}
	for _, path := range []string{"/chat-messages", "/completion-messages", "/workflows/run"} {
		if reqs := f.mock.requests(http.MethodPost, path); len(reqs) != 0 {
			t.Errorf("Dify got %d POST %s for refused invocations", len(reqs), path)
		}
	}

	// A backslash followed by "u0000" is no NUL, and a string input's NUL
	// Dify removes itself (TestNULGoesToDify): both are sent.
	var out InvokeOutput
	f.completed(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u","inputs":{"city":"Pa\u0000ris","customer":{"notes":["a\\u0000b"]}}}`), &out)
	reqs := f.mock.requests(http.MethodPost, "/chat-messages")
	if len(reqs) != 1 || !cmp.Equal(reqs[0].Body["inputs"], any(map[string]any{"city": "Pa\x00ris", "customer": map[string]any{"notes": []any{`a\u0000b`}}})) {
		t.Errorf("chat requests %+v, want the inputs as given", reqs)
	}
}

// TestTimeoutWhileOnlyPinging: Dify's keep-alive pings keep a stream
// within its idle bound, so an app that only pings is waited on until the
// action's timeout. The action then ends outcome_unknown saying the stream
// only pinged, and since when; a task the stream named is stopped (the
// host calls no Canceler at a timeout, and nothing could stop the task
// once the action ended), and the message says how to read what the app
// did. A stream that never named its task had nothing to stop: the
// message says where to look for the app's run. The log says how long the
// stream only pinged.
func TestTimeoutWhileOnlyPinging(t *testing.T) {
	cases := []struct {
		name, app, invoke, input string
		first                    map[string]any // nil: pings from the start
		stop                     string         // "": no stop request
		stopStatus               int
		want                     []string
	}{
		{name: "chat, no task", app: "support", invoke: "/chat-messages", input: `{"query":"q","user":"end-user-7"}`,
			want: []string{"the action's timeout passed", "only keep-alive pings", "and no event at all",
				"never named the app's task, so nothing could be stopped",
				`look for its conversation with cap:dify:support:conversations (user "end-user-7")`}},
		{name: "chat continuing a conversation, no task", app: "support", invoke: "/chat-messages",
			input: `{"query":"q","user":"end-user-7","conversation_id":"` + testConv + `"}`,
			want: []string{"and no event at all", "never named the app's task",
				"cap:dify:support:messages (conversation_id " + testConv + `, user "end-user-7")`}},
		{name: "workflow, no task", app: "etl", invoke: "/workflows/run", input: `{"user":"end-user-7"}`,
			want: []string{"and no event at all", "never named the app's task",
				`cap:dify:etl:workflow.logs (created_by_end_user_session_id "end-user-7")`}},
		{name: "workflow", app: "etl", invoke: "/workflows/run", input: `{"user":"end-user-7"}`,
			first: workflowEvent("workflow_started", map[string]any{"id": testRun}),
			stop:  "/workflows/tasks/" + testTask + "/stop",
			want: []string{"since its last event (workflow_started)", "the app runs as Dify task " + testTask + " (workflow run " + testRun + ")",
				"the connector asked Dify to stop the task (POST /workflows/tasks/" + testTask + "/stop)",
				"the app may have completed or partly done the work first", "cap:dify:etl:workflow.run.get (workflow_run_id " + testRun + ")"}},
		{name: "chat", app: "support", invoke: "/chat-messages", input: `{"query":"q","user":"end-user-7"}`,
			first: chatEvent("message", "Hel"),
			stop:  "/chat-messages/" + testTask + "/stop",
			want: []string{"since its last event (message)", "the app runs as Dify task " + testTask,
				"asked Dify to stop the task", "cap:dify:support:messages (conversation_id " + testConv}},
		{name: "completion, stop refused", app: "writer", invoke: "/completion-messages", input: `{"user":"end-user-7"}`,
			first: chatEvent("message", "Hel"),
			stop:  "/completion-messages/" + testTask + "/stop", stopStatus: http.StatusBadRequest,
			want: []string{"the app runs as Dify task " + testTask, "the connector could not stop the task",
				"stop it with POST /completion-messages/" + testTask + `/stop and {"user": "end-user-7"}`,
				"may have completed, partly done the work or be running still"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Pings every 20 ms keep the stream within its 200 ms idle
			// bound until the action's 800 ms timeout.
			f := newFixture(t, func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond })
			var first []any
			if tc.first != nil {
				first = []any{tc.first}
			}
			f.mock.handle("POST "+tc.invoke, pingingStream(first))
			if tc.stopStatus != 0 {
				f.mock.handle("POST "+tc.stop, func(w http.ResponseWriter, r *http.Request) {
					writeJSON(w, tc.stopStatus, map[string]any{"status": tc.stopStatus, "code": "invalid_param", "message": "no such task"})
				})
			}
			a := hostsdktest.NewAction(AppCapability(tc.app, ""), tc.input)
			timeout := uint64(800)
			a.TimeoutMS = &timeout
			start := time.Now()
			resp := f.Act(t, a)
			if took := time.Since(start); took < 800*time.Millisecond {
				t.Errorf("answered after %s, before the action's timeout: the pings did not keep the stream open", took)
			}
			pe := resp.ProtocolError()
			if pe == nil || pe.Code != "connector_host.outcome_unknown" {
				t.Fatalf("HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
			}
			for _, w := range tc.want {
				if !strings.Contains(pe.Message, w) {
					t.Errorf("message %q\nlacks %q", pe.Message, w)
				}
			}
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Errorf("state %s, want outcome_unknown", st)
			}
			var stops []recorded
			for _, p := range []string{"/chat-messages/" + testTask + "/stop", "/completion-messages/" + testTask + "/stop", "/workflows/tasks/" + testTask + "/stop"} {
				stops = append(stops, f.mock.requests(http.MethodPost, p)...)
			}
			switch {
			case tc.stop == "" && len(stops) != 0:
				t.Errorf("stop requests %+v for a task never named", stops)
			case tc.stop != "" && (len(stops) != 1 || stops[0].Path != tc.stop || !cmp.Equal(stops[0].Body, map[string]any{"user": "end-user-7"}) ||
				stops[0].Auth != "Bearer "+keyOf(tc.app)):
				t.Errorf("stop requests %+v, want one POST %s as end-user-7", stops, tc.stop)
			}
			if logs := f.logs.Take(`msg="dify: the app's event stream sent only keep-alive pings`); len(logs) != 1 || !strings.Contains(logs[0], "pinged_for=") || !strings.Contains(logs[0], "level=WARN") {
				t.Errorf("logs %q, want one warning saying how long the stream only pinged", logs)
			}
		})
	}
}
