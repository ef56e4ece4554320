package dify

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

const (
	pluginsTmpl = "/datasets/{dataset_id}/pipeline/datasource-plugins"
	nodeRunTmpl = "/datasets/{dataset_id}/pipeline/datasource/nodes/{node_id}/run"
	runTmpl     = "/datasets/{dataset_id}/pipeline/run"
	testNode    = "1719288585006"
)

var (
	pluginsPath = "/datasets/" + testDataset + "/pipeline/datasource-plugins"
	nodeRunPath = "/datasets/" + testDataset + "/pipeline/datasource/nodes/" + testNode + "/run"
	runPath     = "/datasets/" + testDataset + "/pipeline/run"
)

// documentedErrors are the error answers the document gives an operation
// (status, example name) and the code each becomes: every 4xx a failed
// result with its provider code and Dify's message.
func documentedErrors(t *testing.T, f *fixture, tmpl, method string, examples map[string]string) map[string]struct {
	body map[string]any
	code string
} {
	t.Helper()
	codes := map[string]string{"400": provider.CodeInvalidRequest, "403": provider.CodeForbidden, "404": provider.CodeNotFound,
		"413": provider.CodeInvalidRequest, "415": provider.CodeInvalidRequest}
	out := map[string]struct {
		body map[string]any
		code string
	}{}
	for name, status := range examples {
		body := docExampleNamed(t, f.mock.doc, tmpl, method, status, name).(map[string]any)
		out[name] = struct {
			body map[string]any
			code string
		}{body, codes[status]}
	}
	return out
}

// TestPipelineDatasourcePlugins: the datasource nodes are read with the
// knowledge base's key, from the published pipeline by default or the
// draft; the document's array answer is the output's datasource_plugins;
// the documented errors are failed results with their provider codes.
func TestPipelineDatasourcePlugins(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineDatasourcePlugins)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, `{"is_published":false}`), &out)
	want := map[string]any{"datasource_plugins": docExample(t, f.mock.doc, pluginsTmpl, "get", "200")}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	f.completed(t, hostsdktest.NewAction(capID, `{}`), &out)
	reqs := f.mock.requests(http.MethodGet, pluginsPath)
	if len(reqs) != 2 || reqs[0].Query.Encode() != "is_published=false" || reqs[1].Query.Encode() != "" ||
		reqs[0].Auth != "Bearer "+testDatasetKey {
		t.Fatalf("requests %+v", reqs)
	}

	for name, e := range documentedErrors(t, f, pluginsTmpl, "get", map[string]string{"invalid_param": "400", "forbidden": "403", "not_found": "404"}) {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("GET "+pluginsPath, func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, int(e.body["status"].(float64)), e.body)
			})
			pe := f.failed(t, hostsdktest.NewAction(capID, `{}`))
			if pe.Code != e.code || !strings.Contains(pe.Message, e.body["message"].(string)) {
				t.Errorf("%s: %s %q, want %s with %q", name, pe.Code, pe.Message, e.code, e.body["message"])
			}
		})
	}
	// A read: a 5xx is a retryable failure, and an answer that is not an
	// array a bad response.
	f.mock.handle("GET "+pluginsPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": 503, "code": "unavailable", "message": "try later"})
	})
	if pe := f.failed(t, hostsdktest.NewAction(capID, `{}`)); pe.Code != provider.CodeUnavailable || !pe.IsRetryable() {
		t.Errorf("503: %+v", pe)
	}
	f.mock.handle("GET "+pluginsPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"data": []any{}})
	})
	if pe := f.failed(t, hostsdktest.NewAction(capID, `{}`)); pe.Code != provider.CodeBadResponse {
		t.Errorf("an object instead of an array: %+v", pe)
	}
}

// TestPipelineDatasourceRun: a datasource node run sends the document's
// body to the node's path with the knowledge base's key, reads Dify's
// datasource events (progress forwarded as progress chunks, each result as
// a data chunk) to the end of the stream, and returns the results. It is
// a read: datasource_error, the documented errors, a 5xx and a stream that
// breaks off are failed results, never outcome_unknown.
func TestPipelineDatasourceRun(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineDatasourceRun)
	for _, typ := range []string{"online_document", "website_crawl", "online_drive"} {
		t.Run(typ, func(t *testing.T) {
			before := len(f.mock.requests(http.MethodPost, nodeRunPath))
			a := hostsdktest.NewAction(capID, `{"node_id":"`+testNode+`","inputs":{"url":"https://example.com"},"datasource_type":"`+typ+`","credential_id":"c1d2e3f4-a5b6-7890-abcd-ef1234567890","is_published":true}`)
			a.Mode = aip.ModeStreaming
			var out DatasourceRunOutput
			resp := f.completed(t, a, &out)
			reqs := f.mock.requests(http.MethodPost, nodeRunPath)
			if len(reqs) != before+1 {
				t.Fatalf("%d requests", len(reqs)-before)
			}
			r := reqs[len(reqs)-1]
			wantBody := map[string]any{"inputs": map[string]any{"url": "https://example.com"}, "datasource_type": typ,
				"credential_id": "c1d2e3f4-a5b6-7890-abcd-ef1234567890", "is_published": true}
			if diff := cmp.Diff(wantBody, r.Body); diff != "" || r.Auth != "Bearer "+testDatasetKey {
				t.Errorf("body (-want +got):\n%s auth %q", diff, r.Auth)
			}
			wantData := mustJSON(testPages[typ])
			if len(out.Results) != 1 || !jsonEqual(out.Results[0], wantData) {
				t.Fatalf("results %s, want [%s]", mustJSON(out.Results), wantData)
			}
			if typ == "online_drive" {
				if out.Total != nil || out.Completed != nil {
					t.Errorf("online drive figures %v %v", out.Total, out.Completed)
				}
			} else if out.Total == nil || *out.Total != 1 || out.TimeConsuming == nil || *out.TimeConsuming != 0.52 {
				t.Errorf("figures %+v", out)
			}
			if len(resp.Chunks) != 2 || resp.Chunks[0].Kind != aip.ChunkProgress || resp.Chunks[1].Kind != aip.ChunkData ||
				!strings.Contains(string(resp.Chunks[0].Data), `"event":"datasource_processing"`) ||
				!jsonEqual(resp.Chunks[1].Data, mustJSON(map[string]any{"data": testPages[typ]})) {
				t.Errorf("chunks %+v", resp.Chunks)
			}
		})
	}
	// Without credential_id, or with null (the provider's default).
	for _, cred := range []string{``, `,"credential_id":null`} {
		var out DatasourceRunOutput
		f.completed(t, hostsdktest.NewAction(capID, `{"node_id":"n-1","inputs":{},"datasource_type":"website_crawl","is_published":false`+cred+`}`), &out)
		reqs := f.mock.requests(http.MethodPost, "/datasets/"+testDataset+"/pipeline/datasource/nodes/n-1/run")
		if want := map[string]any{"inputs": map[string]any{}, "datasource_type": "website_crawl", "is_published": false}; cred == "" &&
			!cmp.Equal(want, reqs[len(reqs)-1].Body) {
			t.Errorf("body %v", reqs[len(reqs)-1].Body)
		}
	}

	// A new action each time (one action ID runs once).
	run := func() *aip.Action {
		return hostsdktest.NewAction(capID, `{"node_id":"`+testNode+`","inputs":{},"datasource_type":"local_file","is_published":true}`)
	}
	// A local file source has nothing to browse: Dify says so with
	// datasource_error.
	if pe := f.failed(t, run()); pe.Code != CodeDatasourceFailed || !strings.Contains(pe.Message, "Unsupported datasource provider") || pe.IsRetryable() {
		t.Errorf("datasource_error: %+v", pe)
	}

	for name, e := range documentedErrors(t, f, nodeRunTmpl, "post", map[string]string{"invalid_param": "400", "forbidden": "403", "not_found": "404"}) {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("POST "+nodeRunPath, func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, int(e.body["status"].(float64)), e.body)
			})
			pe := f.failed(t, run())
			if pe.Code != e.code || !strings.Contains(pe.Message, e.body["message"].(string)) {
				t.Errorf("%s: %s %q, want %s with %q", name, pe.Code, pe.Message, e.code, e.body["message"])
			}
		})
	}
	for name, h := range map[string]http.HandlerFunc{
		"500": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"status": 500, "code": "internal_server_error", "message": "Internal server error."})
		},
		"dropped after progress": func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{map[string]any{"event": "datasource_processing", "total": 3, "completed": 1}})
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		},
		"ended without a result": func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{map[string]any{"event": "datasource_processing", "total": 0, "completed": 0}})
		},
	} {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("POST "+nodeRunPath, h)
			pe := f.failed(t, hostsdktest.NewAction(capID, `{"node_id":"`+testNode+`","inputs":{},"datasource_type":"website_crawl","is_published":true}`))
			if pe.Code != provider.CodeUnavailable || !pe.IsRetryable() {
				t.Errorf("%s: %+v, want a retryable %s", name, pe, provider.CodeUnavailable)
			}
		})
	}
}

// TestPipelineDatasourceRunTimeoutWhileOnlyPinging: a datasource node run
// (a read) whose stream only pings until the action's timeout is a
// failed, retryable result saying what ended it and how long the stream
// had sent only pings, since which event, not that the stream broke off;
// nothing is sent to stop it.
func TestPipelineDatasourceRunTimeoutWhileOnlyPinging(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond })
	f.mock.handle("POST "+nodeRunPath, pingingStream([]any{map[string]any{"event": "datasource_processing", "total": 3, "completed": 1}}))
	a := hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixPipelineDatasourceRun),
		`{"node_id":"`+testNode+`","inputs":{},"datasource_type":"website_crawl","is_published":true}`)
	timeout := uint64(800)
	a.TimeoutMS = &timeout
	pe := f.failed(t, a)
	if pe.Code != provider.CodeUnavailable || !pe.IsRetryable() {
		t.Errorf("%+v, want a retryable %s", pe, provider.CodeUnavailable)
	}
	for _, w := range []string{"the action's timeout passed", "after the datasource node run was sent",
		"only keep-alive pings", "since its last event (datasource_processing)", "nothing was stopped", "with a longer timeout_ms"} {
		if !strings.Contains(pe.Message, w) {
			t.Errorf("message %q\nlacks %q", pe.Message, w)
		}
	}
	if strings.Contains(pe.Message, "broke off") {
		t.Errorf("message %q says the stream broke off", pe.Message)
	}
	f.mock.mu.Lock()
	defer f.mock.mu.Unlock()
	for _, r := range f.mock.reqs {
		if strings.HasSuffix(r.Path, "/stop") {
			t.Errorf("Dify got %s %s", r.Method, r.Path)
		}
	}
}

// TestPipelineRun: a pipeline run always asks for response_mode
// streaming; an event stream (the draft's run) is aggregated like a
// workflow's, with node progress forwarded in streaming mode, and the
// document's JSON answer is the output as it is. Each of the document's
// four request examples (one per datasource_type), without its
// response_mode, is accepted and sent as it is.
func TestPipelineRun(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineRun)
	op := f.mock.doc["paths"].(map[string]any)[runTmpl].(map[string]any)["post"].(map[string]any)
	examples := op["requestBody"].(map[string]any)["content"].(map[string]any)["application/json"].(map[string]any)["examples"].(map[string]any)
	for name, ex := range examples {
		t.Run(name, func(t *testing.T) {
			body := ex.(map[string]any)["value"].(map[string]any)
			input := map[string]any{}
			for k, v := range body {
				if k != "response_mode" {
					input[k] = v
				}
			}
			a := hostsdktest.NewAction(capID, string(mustJSON(input)))
			a.Mode = aip.ModeStreaming
			var out PipelineRunOutput
			resp := f.completed(t, a, &out)
			reqs := f.mock.requests(http.MethodPost, runPath)
			r := reqs[len(reqs)-1]
			input["response_mode"] = "streaming"
			if diff := cmp.Diff(input, r.Body); diff != "" || r.Auth != "Bearer "+testDatasetKey {
				t.Errorf("body (-want +got):\n%s auth %q", diff, r.Auth)
			}
			if out.Status != "succeeded" || out.WorkflowRunID != testRun || out.TaskID != testTask || string(out.Outputs) != `{"documents":1}` ||
				out.TotalSteps == nil || *out.TotalSteps != 3 {
				t.Errorf("output %+v", out)
			}
			var got []string
			for _, c := range resp.Chunks {
				var p struct {
					Event  string `json:"event"`
					NodeID string `json:"node_id"`
				}
				json.Unmarshal(c.Data, &p)
				got = append(got, fmt.Sprintf("%s:%s:%s", c.Kind, p.Event, p.NodeID))
			}
			want := []string{"progress:node_started:" + testNode, "progress:node_finished:" + testNode,
				"progress:node_started:knowledge", "progress:node_finished:knowledge"}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("chunks (-want +got):\n%s", diff)
			}
		})
	}

	// The 200's other documented answer, JSON: the output as it is.
	f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, docExample(t, f.mock.doc, runTmpl, "post", "200"))
	})
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, pipelineInput("local_file", `{"reference":"a1b2c3d4-e5f6-7890-abcd-ef1234567890"}`)), &out)
	if diff := cmp.Diff(docExample(t, f.mock.doc, runTmpl, "post", "200"), any(out)); diff != "" {
		t.Errorf("JSON output (-want +got):\n%s", diff)
	}
}

// pipelineInput is a pipeline run's input with one item.
func pipelineInput(typ, item string) string {
	return `{"inputs":{},"datasource_type":"` + typ + `","datasource_info_list":[` + item + `],"start_node_id":"` + testNode + `","is_published":true}`
}

// TestPipelineRunErrors: the documented 4xx answers are failed results
// with their provider codes; the documented 500 (pipeline_run_error), a
// connection reset after the request was sent, a stream that ends before
// workflow_finished and an error event after the pipeline was at work
// leave the outcome unknown, and the action never reaches Dify again; an
// error event before anything ran, and a failed run, are failures.
func TestPipelineRunErrors(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineRun)
	input := pipelineInput("website_crawl", `{"url":"https://example.com/docs","title":"Docs"}`)
	for name, e := range documentedErrors(t, f, runTmpl, "post", map[string]string{"invalid_param": "400", "forbidden": "403", "not_found": "404"}) {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, int(e.body["status"].(float64)), e.body)
			})
			pe := f.failed(t, hostsdktest.NewAction(capID, input))
			if pe.Code != e.code || !strings.Contains(pe.Message, e.body["message"].(string)) {
				t.Errorf("%s: %s %q, want %s with %q", name, pe.Code, pe.Message, e.code, e.body["message"])
			}
		})
	}

	started := workflowEvent("workflow_started", map[string]any{"id": testRun, "workflow_id": "pipeline-wf"})
	for name, h := range map[string]http.HandlerFunc{
		"pipeline_run_error": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusInternalServerError, docExampleNamed(t, f.mock.doc, runTmpl, "post", "500", "pipeline_run_error"))
		},
		"connection reset after the request was sent": func(w http.ResponseWriter, r *http.Request) {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		},
		"connection reset mid-stream": func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{started})
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		},
		"stream ends before workflow_finished": func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{started, ping})
		},
		"4xx error event after the pipeline was at work": func(w http.ResponseWriter, r *http.Request) {
			writeEvents(w, []any{started, map[string]any{"event": "error", "status": 400, "code": "invalid_param", "message": "node failed"}})
		},
		"an answer that is neither stream nor JSON": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.Write([]byte("<html>proxy</html>"))
		},
		"a JSON answer that is not an object": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, []any{"x"})
		},
	} {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("POST "+runPath, h)
			before := len(f.mock.requests(http.MethodPost, runPath))
			a := hostsdktest.NewAction(capID, input)
			f.Act(t, a)
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			f.Act(t, a)
			if n := len(f.mock.requests(http.MethodPost, runPath)) - before; n != 1 {
				t.Errorf("Dify got %d runs for one action", n)
			}
		})
	}

	f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{map[string]any{"event": "error", "status": 400, "code": "invalid_param", "message": "start node not found"}})
	})
	if pe := f.failed(t, hostsdktest.NewAction(capID, input)); pe.Code != provider.CodeInvalidRequest || !strings.Contains(pe.Message, "start node not found") {
		t.Errorf("error event first: %+v", pe)
	}
	f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{started, workflowFinished("failed", nil, "extractor: unreadable PDF")})
	})
	if pe := f.failed(t, hostsdktest.NewAction(capID, input)); pe.Code != CodeWorkflowFailed || !strings.Contains(pe.Message, "unreadable PDF") {
		t.Errorf("failed run: %+v", pe)
	}
}

// TestPipelineRunInputRejected: the input schema takes the document's
// fields with the item shape of the datasource_type given, and nothing
// else (response_mode is the connector's); nothing is sent otherwise.
func TestPipelineRunInputRejected(t *testing.T) {
	f := newFixture(t, nil)
	run := KnowledgeCapability(testDataset, SuffixPipelineRun)
	node := KnowledgeCapability(testDataset, SuffixPipelineDatasourceRun)
	many := strings.TrimSuffix(strings.Repeat(`{"url":"https://example.com"},`, MaxPipelineItems+1), ",")
	cases := []*aip.Action{
		hostsdktest.NewAction(run, pipelineInput("local_file", `{"name":"no reference"}`)),
		hostsdktest.NewAction(run, pipelineInput("local_file", `{"related_id":"a1b2"}`)),
		hostsdktest.NewAction(run, pipelineInput("local_file", `{"url":"https://example.com"}`)), // another type's item
		hostsdktest.NewAction(run, pipelineInput("online_document", `{"workspace_id":"ws","page":{"page_id":"p"}}`)),
		hostsdktest.NewAction(run, pipelineInput("online_document", `{"page":{"page_id":"p","type":"page"}}`)),
		hostsdktest.NewAction(run, pipelineInput("website_crawl", `{"url":"https://example.com","depth":2}`)),
		hostsdktest.NewAction(run, pipelineInput("online_drive", `{"id":"f","type":"directory"}`)),
		hostsdktest.NewAction(run, pipelineInput("s3", `{"id":"f","type":"file"}`)),
		hostsdktest.NewAction(run, pipelineInput("website_crawl", many)),
		hostsdktest.NewAction(run, `{"inputs":{},"datasource_type":"website_crawl","datasource_info_list":[],"is_published":true}`),         // no start_node_id
		hostsdktest.NewAction(run, `{"datasource_type":"website_crawl","datasource_info_list":[],"start_node_id":"n","is_published":true}`), // no inputs
		hostsdktest.NewAction(run, strings.TrimSuffix(pipelineInput("website_crawl", `{"url":"u"}`), "}")+`,"response_mode":"blocking"}`),
		hostsdktest.NewAction(node, `{"node_id":"a/b","inputs":{},"datasource_type":"website_crawl","is_published":true}`),
		hostsdktest.NewAction(node, `{"node_id":"n","inputs":{},"datasource_type":"website_crawl"}`), // no is_published
		hostsdktest.NewAction(node, `{"node_id":"n","inputs":{},"datasource_type":"notion","is_published":true}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixPipelineDatasourcePlugins), `{"is_published":"yes"}`),
	}
	f.refusedBeforeSending(t, cases)
}

// TestPipelineRunTimeoutWhileOnlyPinging: a pipeline run whose stream
// only pings is waited on until the action's timeout, as an app
// invocation is (TestTimeoutWhileOnlyPinging), and ends outcome_unknown
// saying what ended it, how long the stream only pinged and since which
// event, naming the run's task and workflow run, and saying that nothing
// was stopped (Dify's Service API has no stop endpoint for a pipeline
// run: no request is sent to stop it) and what can be read instead. The
// log says how long the stream only pinged.
func TestPipelineRunTimeoutWhileOnlyPinging(t *testing.T) {
	started := workflowEvent("workflow_started", map[string]any{"id": testRun, "workflow_id": "pipeline-wf"})
	node := workflowEvent("node_started", map[string]any{"node_id": testNode, "node_type": "datasource", "title": "Crawl"})
	documents := KnowledgeCapability(testDataset, SuffixDocuments)
	cases := []struct {
		name      string
		published bool
		events    []any
		want      []string
	}{
		{name: "draft, no event", events: nil,
			want: []string{"the action's timeout passed", "after the pipeline run was sent", "only keep-alive pings", "and no event at all",
				"the stream never named the pipeline's task or run", "no stop endpoint for a knowledge pipeline run",
				"may have completed, partly done the work or be running still",
				"the Service API has no read of a pipeline's runs: Dify's console lists them", "a draft run (is_published false) adds no documents"}},
		{name: "draft, started", events: []any{started},
			want: []string{"since its last event (workflow_started)", "the pipeline runs as Dify task " + testTask + ", workflow run " + testRun,
				"nothing was stopped", "a draft run (is_published false) adds no documents"}},
		{name: "published, at a node", published: true, events: []any{started, node},
			want: []string{"since its last event (node_started)", "the pipeline runs as Dify task " + testTask + ", workflow run " + testRun,
				"nothing was stopped", "read the documents the run added, with their indexing_status, with " + documents}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// Pings every 20 ms keep the stream within its 200 ms idle
			// bound until the action's 800 ms timeout.
			f := newFixture(t, func(c *Config) { c.StreamIdleTimeout = 200 * time.Millisecond })
			f.mock.handle("POST "+runPath, pingingStream(tc.events))
			input := `{"inputs":{},"datasource_type":"website_crawl","datasource_info_list":[{"url":"https://example.com/docs"}],"start_node_id":"` + testNode + `","is_published":` + strconv.FormatBool(tc.published) + `}`
			a := hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixPipelineRun), input)
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
			f.mock.mu.Lock()
			for _, r := range f.mock.reqs {
				if strings.HasSuffix(r.Path, "/stop") {
					t.Errorf("Dify got %s %s: the Service API has no stop endpoint for a pipeline run", r.Method, r.Path)
				}
			}
			f.mock.mu.Unlock()
			if logs := f.logs.Take(`msg="dify: the pipeline's event stream sent only keep-alive pings`); len(logs) != 1 ||
				!strings.Contains(logs[0], "pinged_for=") || !strings.Contains(logs[0], "dataset_id="+testDataset) || !strings.Contains(logs[0], "level=WARN") {
				t.Errorf("logs %q, want one warning saying how long the stream only pinged", logs)
			}
		})
	}
}

// TestPipelineRunIDsRedacted: a pipeline run's task_id and
// workflow_run_id go unchecked (neither goes into a path), so the
// outcome_unknown message and the log quote them redacted of the key: a
// proxy or node that echoed the Authorization header does not put it
// there.
func TestPipelineRunIDsRedacted(t *testing.T) {
	f := newFixture(t, nil)
	echoed := "Bearer " + testDatasetKey
	f.mock.handle("POST "+runPath, func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, []any{map[string]any{"event": "workflow_started", "task_id": echoed, "workflow_run_id": echoed, "data": map[string]any{"id": echoed}}, ping})
	})
	a := hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixPipelineRun), pipelineInput("website_crawl", `{"url":"https://example.com/docs"}`))
	resp := f.Act(t, a)
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != "connector_host.outcome_unknown" {
		t.Fatalf("HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
	}
	if strings.Contains(pe.Message, testDatasetKey) || !strings.Contains(pe.Message, "the pipeline runs as Dify task [redacted], workflow run [redacted]") {
		t.Errorf("message %q, want the IDs redacted", pe.Message)
	}
}

// TestPipelineRunNestedNULRefused: the knowledge pipeline's generator
// cleans U+0000 from its string inputs as an app's does
// (_prepare_user_inputs), not from a string inside an object or array
// input, nor from the datasource_info_list items, which reach the run as
// they are: such a run is refused before anything is sent, naming the
// string's path, as an app invocation's (TestNestedNULRefused).
func TestPipelineRunNestedNULRefused(t *testing.T) {
	f := newFixture(t, nil)
	capID := KnowledgeCapability(testDataset, SuffixPipelineRun)
	run := func(inputs, typ, items string) *aip.Action {
		return hostsdktest.NewAction(capID, `{"inputs":`+inputs+`,"datasource_type":"`+typ+`","datasource_info_list":[`+items+`],"start_node_id":"`+testNode+`","is_published":true}`)
	}
	cases := []struct {
		a    *aip.Action
		path string
	}{
		{run(`{"lang":"en","meta":{"tags":["a","b\u0000"]}}`, "website_crawl", `{"url":"https://example.com/docs"}`), "inputs.meta.tags[1]"},
		{run(`{"meta":{"ta\u0000g":"x"}}`, "website_crawl", `{"url":"https://example.com/docs"}`), `inputs.meta["ta\u0000g"]`},
		{run(`{}`, "website_crawl", `{"url":"https://example.com/docs","title":"Docs\u0000"}`), "datasource_info_list[0].title"},
		{run(`{}`, "online_document", `{"workspace_id":"ws","page":{"page_id":"p1","type":"page"}},{"workspace_id":"ws","page":{"page_id":"p2","type":"page","page_name":"Road\u0000map"}}`),
			"datasource_info_list[1].page.page_name"},
		{run(`{}`, "local_file", `{"reference":"a1b2c3d4-e5f6-7890-abcd-ef1234567890\u0000"}`), "datasource_info_list[0].reference"},
	}
	for _, tc := range cases {
		pe := f.failed(t, tc.a)
		if pe.Code != hostsdk.CodeInputInvalid || (pe.Retryable != nil && *pe.Retryable) ||
			!strings.Contains(pe.Message, tc.path+" holds the character U+0000") || !strings.Contains(pe.Message, "the pipeline could fail after it started; remove the character") {
			t.Errorf("%s: %+v, want %s naming %s", tc.a.Input, pe, hostsdk.CodeInputInvalid, tc.path)
		}
	}
	if reqs := f.mock.requests(http.MethodPost, runPath); len(reqs) != 0 {
		t.Errorf("Dify got %d pipeline runs for refused ones", len(reqs))
	}

	// A string input's NUL Dify removes itself, and a backslash followed
	// by "u0000" is no NUL: both are sent.
	var out PipelineRunOutput
	f.completed(t, run(`{"lang":"e\u0000n","meta":{"tags":["a\\u0000b"]}}`, "website_crawl", `{"url":"https://example.com/docs"}`), &out)
	reqs := f.mock.requests(http.MethodPost, runPath)
	if len(reqs) != 1 || !cmp.Equal(reqs[0].Body["inputs"], any(map[string]any{"lang": "e\x00n", "meta": map[string]any{"tags": []any{`a\u0000b`}}})) {
		t.Errorf("pipeline runs %+v, want the inputs as given", reqs)
	}
}

// TestPipelineFileUpload: the pipeline's upload sends the document's
// multipart body (one part "file") to a path that names no knowledge base,
// with the key of the knowledge base whose capability it is, and returns
// the 201 file record; the documented errors are failed results; a
// connection reset after the body was sent leaves the file's existence
// unknown.
func TestPipelineFileUpload(t *testing.T) {
	// A second knowledge base with its own key: each one's upload goes
	// with its own.
	const otherDataset, otherKey = "5b6a2f1c-9d8e-4f7a-b3c2-1e0d9c8b7a6f", "dataset-key-2"
	f := newFixtureOn(t, func(c *Config) {
		dir := t.TempDir()
		b, _ := json.Marshal([]map[string]any{
			{"id": testDataset, "name": "Docs", "api_key_file": writeFile(t, dir, "k1.key", testDatasetKey, 0o600)},
			{"id": otherDataset, "name": "Other", "api_key_file": writeFile(t, dir, "k2.key", otherKey, 0o600)},
		})
		c.KnowledgeFile = writeFile(t, dir, "knowledge.json", string(b), 0o644)
	}, func(f *fixture, _ journal.Journal) {
		// The mock serves only the test key; the other key's health
		// probe is answered as a valid key's, so its actions are sent.
		f.mock.handle("GET /datasets", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, docExample(t, f.mock.doc, "/datasets", "get", "200"))
		})
	})
	pdf := []byte("%PDF-1.7\n" + strings.Repeat("y", 5000))
	enc := base64.StdEncoding.EncodeToString(pdf)
	capID := KnowledgeCapability(testDataset, SuffixPipelineFileUpload)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, `{"filename":"quarterly-report.pdf","mime_type":"application/pdf","content_base64":"`+enc+`"}`), &out)
	reqs := f.mock.requests(http.MethodPost, pipelineUploadPath)
	if len(reqs) != 1 || reqs[0].Upload == nil || reqs[0].Auth != "Bearer "+testDatasetKey {
		t.Fatalf("requests %+v", reqs)
	}
	if u := reqs[0].Upload; u.Filename != "quarterly-report.pdf" || u.ContentType != "application/pdf" || !bytes.Equal(u.Data, pdf) || u.User != "" || u.Settings != "" {
		t.Fatalf("upload %q %q %d bytes user %q data %q", u.Filename, u.ContentType, len(u.Data), u.User, u.Settings)
	}
	if out["id"] != "a1b2c3d4-e5f6-7890-abcd-ef1234567890" || out["name"] != "quarterly-report.pdf" || out["size"] != float64(len(pdf)) || out["extension"] != "pdf" {
		t.Fatalf("output %v", out)
	}
	// The other knowledge base's upload carries its key (the mock refuses
	// it as not the test key: what matters is what was sent).
	f.Act(t, hostsdktest.NewAction(KnowledgeCapability(otherDataset, SuffixPipelineFileUpload), `{"filename":"a.txt","content_base64":"aGVsbG8="}`))
	if reqs := f.mock.requests(http.MethodPost, pipelineUploadPath); len(reqs) != 2 || reqs[1].Auth != "Bearer "+otherKey {
		t.Fatalf("other knowledge base's upload: %+v", reqs)
	}

	for name, e := range documentedErrors(t, f, pipelineUploadPath, "post", map[string]string{
		"no_file_uploaded": "400", "filename_not_exists_error": "400", "too_many_files": "400", "file_too_large": "413", "unsupported_file_type": "415"}) {
		t.Run(name, func(t *testing.T) {
			f.mock.handle("POST "+pipelineUploadPath, func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, int(e.body["status"].(float64)), e.body)
			})
			a := hostsdktest.NewAction(capID, `{"filename":"a.pdf","content_base64":"`+enc+`"}`)
			pe := f.failed(t, a)
			if pe.Code != e.code || !strings.Contains(pe.Message, e.body["message"].(string)) {
				t.Errorf("%s: %s %q, want %s with %q", name, pe.Code, pe.Message, e.code, e.body["message"])
			}
		})
	}

	f.mock.handle("POST "+pipelineUploadPath, func(w http.ResponseWriter, r *http.Request) {
		if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
			conn.Close()
		}
	})
	before := len(f.mock.requests(http.MethodPost, pipelineUploadPath))
	a := hostsdktest.NewAction(capID, `{"filename":"b.pdf","content_base64":"`+enc+`"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("connection reset: %s, want outcome_unknown", st)
	}
	f.Act(t, a)
	if n := len(f.mock.requests(http.MethodPost, pipelineUploadPath)) - before; n != 1 {
		t.Errorf("Dify got %d uploads for one action", n)
	}
}

// TestPipelineContracts: the pipeline's capabilities declare what they
// are: the node listing and the datasource node run are retry-safe reads
// (the run streams), the run and the upload are creations (an idempotency
// key required, never retried, risk medium, no approval required), the run
// streams; none is cancellable.
func TestPipelineContracts(t *testing.T) {
	f := newFixture(t, nil)
	m, err := f.conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]aip.Capability{}
	for _, c := range m.Capabilities {
		caps[c.ID] = c
	}
	for suffix, want := range map[string]struct {
		mutation, streaming bool
		risk                aip.Risk
	}{
		SuffixPipelineDatasourcePlugins: {false, false, aip.RiskLow},
		SuffixPipelineDatasourceRun:     {false, true, aip.RiskLow},
		SuffixPipelineRun:               {true, true, aip.RiskMedium},
		SuffixPipelineFileUpload:        {true, false, aip.RiskMedium},
	} {
		c, ok := caps[KnowledgeCapability(testDataset, suffix)]
		if !ok {
			t.Fatalf("no %s", suffix)
		}
		k := c.Contract
		if want.mutation {
			if k.Idempotency.Requirement != aip.IdempotencyRequired || k.Execution.SupportsRetry || k.Execution.RetrySafety != aip.RetryUnsafe ||
				k.SideEffects[0] != aip.EffectWrite {
				t.Errorf("%s: mutation contract %+v", suffix, k)
			}
		} else if k.Execution.RetrySafety != aip.RetrySafe || !k.Execution.SupportsRetry || k.SideEffects[0] != aip.EffectRead {
			t.Errorf("%s: read contract %+v", suffix, k)
		}
		if k.Execution.SupportsStreaming != want.streaming || k.Execution.SupportsCancel || c.Risk != want.risk || c.RequiresHumanApproval != nil {
			t.Errorf("%s: streaming %v cancel %v risk %s approval %v", suffix, k.Execution.SupportsStreaming, k.Execution.SupportsCancel, c.Risk, c.RequiresHumanApproval)
		}
	}
}

// jsonEqual reports whether two JSON documents hold the same value.
func jsonEqual(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && cmp.Equal(x, y)
}
