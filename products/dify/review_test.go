package dify

import (
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// An invocation Dify refuses with a 4xx whose body is cut short was not
// run: a failed result with the status's code, not outcome_unknown.
func TestInvokeRefusedWithCutBody(t *testing.T) {
	f := newFixture(t, nil)
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "4096")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"status":429,"code":"too_many_requests","message":"Too many`))
	})
	pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`))
	if pe.Code != provider.CodeRateLimited || !pe.IsRetryable() || strings.Contains(pe.Message, "outcome") {
		t.Errorf("cut 429: %s %q", pe.Code, pe.Message)
	}
}

// TestStreamMessagesRedacted: what Dify says inside an event stream (an
// error event's message, a failed run's error, datasource_error) reaches
// the action's error as an HTTP error body's message does: with the
// credential the request carried redacted, whether the result is a
// failure or outcome_unknown. A proxy or a node that echoes the
// Authorization header must not put the key into the journal.
func TestStreamMessagesRedacted(t *testing.T) {
	f := newFixture(t, nil)
	const chatKey = "app-chat-key"
	echo := func(key string) string { return "upstream said: Authorization: Bearer " + key + " is not allowed here" }
	errEvent := func(status int, key string) map[string]any {
		return map[string]any{"event": "error", "message_id": testMessageID, "status": status, "code": "invalid_param", "message": echo(key)}
	}
	cases := []struct {
		name, path, capID, input, key string
		events                        []any
		unknown                       bool
	}{
		{"chat error event", "/chat-messages", AppCapability("support", ""), `{"query":"q","user":"u"}`, chatKey,
			[]any{errEvent(400, chatKey)}, false},
		{"chat error event mid-run", "/chat-messages", AppCapability("agent", ""), `{"query":"q","user":"u"}`, keyOf("agent"),
			[]any{chatEvent("agent_message", "par"), errEvent(500, keyOf("agent"))}, true},
		{"workflow failed", "/workflows/run", AppCapability("etl", ""), `{"user":"u"}`, keyOf("etl"),
			[]any{workflowFinished("failed", nil, echo(keyOf("etl")))}, false},
		{"datasource_error", nodeRunPath, KnowledgeCapability(testDataset, SuffixPipelineDatasourceRun),
			`{"node_id":"` + testNode + `","inputs":{},"datasource_type":"website_crawl","is_published":true}`, testDatasetKey,
			[]any{map[string]any{"event": "datasource_error", "error": echo(testDatasetKey)}}, false},
		{"datasource error event", nodeRunPath, KnowledgeCapability(testDataset, SuffixPipelineDatasourceRun),
			`{"node_id":"` + testNode + `","inputs":{},"datasource_type":"website_crawl","is_published":true}`, testDatasetKey,
			[]any{errEvent(400, testDatasetKey)}, false},
		{"pipeline error event", runPath, KnowledgeCapability(testDataset, SuffixPipelineRun),
			pipelineInput("website_crawl", `{"url":"https://example.com"}`), testDatasetKey,
			[]any{errEvent(400, testDatasetKey)}, false},
		{"pipeline error event mid-run", runPath, KnowledgeCapability(testDataset, SuffixPipelineRun),
			pipelineInput("website_crawl", `{"url":"https://example.com"}`), testDatasetKey,
			[]any{workflowEvent("workflow_started", map[string]any{"id": testRun}), errEvent(500, testDatasetKey)}, true},
		{"pipeline failed", runPath, KnowledgeCapability(testDataset, SuffixPipelineRun),
			pipelineInput("website_crawl", `{"url":"https://example.com"}`), testDatasetKey,
			[]any{workflowFinished("failed", nil, echo(testDatasetKey))}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f.mock.handle("POST "+tc.path, func(w http.ResponseWriter, r *http.Request) { writeEvents(w, tc.events) })
			a := hostsdktest.NewAction(tc.capID, tc.input)
			var msg string
			if tc.unknown {
				resp := f.Act(t, a)
				pe := resp.ProtocolError()
				if pe == nil || pe.Code != "connector_host.outcome_unknown" {
					t.Fatalf("HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
				}
				msg = pe.Message
			} else {
				msg = f.failed(t, a).Message
			}
			if strings.Contains(msg, tc.key) || !strings.Contains(msg, "[redacted]") || !strings.Contains(msg, "is not allowed here") {
				t.Errorf("message %q: want Dify's message with the key redacted", msg)
			}
		})
	}
}

// TestPipelineRunJSONFailed: the document's JSON answer to a pipeline run
// (its blocking form: task_id, workflow_run_id and data with the run's
// status) saying the run failed or was stopped is a failed result, as the
// same run's workflow_finished is in an event stream, not a completed
// action.
func TestPipelineRunJSONFailed(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineRun)
	for status, code := range map[string]string{"failed": CodeWorkflowFailed, "stopped": CodeWorkflowStopped} {
		t.Run(status, func(t *testing.T) {
			f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
				ans := docExample(t, f.mock.doc, runTmpl, "post", "200").(map[string]any)
				data := ans["data"].(map[string]any)
				data["status"], data["error"] = status, "extractor: unreadable PDF"
				writeJSON(w, http.StatusOK, ans)
			})
			pe := f.failed(t, hostsdktest.NewAction(capID, pipelineInput("local_file", `{"reference":"a1b2c3d4-e5f6-7890-abcd-ef1234567890"}`)))
			if pe.Code != code || (status == "failed" && !strings.Contains(pe.Message, "unreadable PDF")) {
				t.Errorf("JSON answer with status %s: %s %q, want %s", status, pe.Code, pe.Message, code)
			}
		})
	}
}

// TestRetrieveReranking: reranking_enable true needs the rerank model
// (the document's RetrievalModel: reranking_mode is required when
// reranking_enable is true, and reranking by a model names it in
// reranking_model); the request carries reranking_mode reranking_model and
// the model. reranking_enable true without a model, or a model without
// reranking_enable true, is refused before anything is sent.
func TestRetrieveReranking(t *testing.T) {
	f := newFixture(t, nil)
	capID := RetrieveCapability(testDataset)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, `{"query":"q","retrieval_model":{"search_method":"hybrid_search","top_k":4,"reranking_enable":true,
		"reranking_model":{"reranking_provider_name":"langgenius/cohere/cohere","reranking_model_name":"rerank-english-v3.0"}}}`), &out)
	r := f.mock.requests(http.MethodPost, "/datasets/"+testDataset+"/retrieve")
	want := map[string]any{"query": "q", "retrieval_model": map[string]any{"search_method": "hybrid_search", "top_k": float64(4),
		"score_threshold_enabled": false, "reranking_enable": true, "reranking_mode": "reranking_model",
		"reranking_model": map[string]any{"reranking_provider_name": "langgenius/cohere/cohere", "reranking_model_name": "rerank-english-v3.0"}}}
	if len(r) != 1 {
		t.Fatalf("%d retrieve requests", len(r))
	}
	if diff := cmp.Diff(want, r[0].Body); diff != "" {
		t.Errorf("retrieve body (-want +got):\n%s", diff)
	}

	g := newFixture(t, nil)
	g.refusedBeforeSending(t, []*aip.Action{
		hostsdktest.NewAction(capID, `{"query":"q","retrieval_model":{"search_method":"semantic_search","top_k":3,"reranking_enable":true}}`),
		hostsdktest.NewAction(capID, `{"query":"q","retrieval_model":{"search_method":"semantic_search","top_k":3,
			"reranking_model":{"reranking_provider_name":"cohere","reranking_model_name":"rerank"}}}`),
		hostsdktest.NewAction(capID, `{"query":"q","retrieval_model":{"search_method":"semantic_search","top_k":3,"reranking_enable":true,
			"reranking_model":{"reranking_provider_name":"cohere"}}}`),
	})
}

// TestUnreadableWorkflowFinished: a workflow_finished event whose data
// does not say how the run ended (not an object, or no status) leaves the
// run's outcome unknown, for an app invocation and a pipeline run alike:
// outcome_unknown, never completed. A member of another type than the
// document's does not hide the status the event does carry.
func TestUnreadableWorkflowFinished(t *testing.T) {
	f := newFixture(t, nil)
	finished := func(data any) map[string]any {
		return map[string]any{"event": "workflow_finished", "task_id": testTask, "workflow_run_id": testRun, "data": data}
	}
	started := workflowEvent("workflow_started", map[string]any{"id": testRun})
	for name, data := range map[string]any{
		"data not an object": "finished",
		"no status":          map[string]any{"id": testRun, "outputs": map[string]any{}},
	} {
		for _, tc := range []struct{ path, capID, input string }{
			{"/workflows/run", AppCapability("etl", ""), `{"user":"u"}`},
			{runPath, KnowledgeCapability(testDataset, SuffixPipelineRun), pipelineInput("website_crawl", `{"url":"https://example.com"}`)},
		} {
			t.Run(name+" "+tc.path, func(t *testing.T) {
				f.mock.handle("POST "+tc.path, func(w http.ResponseWriter, r *http.Request) {
					writeEvents(w, []any{started, finished(data)})
				})
				a := hostsdktest.NewAction(tc.capID, tc.input)
				resp := f.Act(t, a)
				if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, "workflow_finished") {
					t.Fatalf("HTTP %d %s, want outcome_unknown naming workflow_finished", resp.Status, resp.Raw)
				}
				if st := f.state(t, a); st != aip.StateOutcomeUnknown {
					t.Fatalf("state %s", st)
				}
			})
		}
	}
	// A failed run whose error is not the document's string is still a
	// failed run.
	f.mock.handle("POST /workflows/run", func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{started, finished(map[string]any{"id": testRun, "status": "failed", "error": map[string]any{"message": "boom"}})})
	})
	if pe := f.failed(t, hostsdktest.NewAction(AppCapability("etl", ""), `{"user":"u"}`)); pe.Code != CodeWorkflowFailed {
		t.Errorf("failed run with an odd error member: %+v", pe)
	}
}
