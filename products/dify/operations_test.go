package dify

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

const testDocument = "a8e0e5b5-78c6-4130-a5ce-25feb0e0b4ac"

// TestOperations runs every table operation added to the catalogue
// through the host and checks the request Dify got (method, path, query,
// body, key) and the output.
func TestOperations(t *testing.T) {
	f := newFixture(t, nil)
	docs := "/datasets/" + testDataset + "/documents"
	cases := []struct {
		capID, input   string
		method, path   string
		query          string         // encoded, "" for none
		body           map[string]any // nil for none
		auth           string
		output         string // a fragment of the output JSON
		mutation, high bool
	}{
		{AppCapability("support", SuffixInfo), `{}`, "GET", "/info", "", nil, "Bearer app-chat-key", `"author_name":"Dify Team"`, false, false},
		{AppCapability("etl", SuffixInfo), `{}`, "GET", "/info", "", nil, "Bearer app-workflow-key", `"name":"My Chat App"`, false, false},
		{AppCapability("writer", SuffixMeta), `{}`, "GET", "/meta", "", nil, "Bearer app-completion-key", `"tool_icons"`, false, false},
		{AppCapability("flow", SuffixSite), `{}`, "GET", "/site", "", nil, "Bearer app-flow-key", `"chat_color_theme":"#4A90D9"`, false, false},
		{AppCapability("support", SuffixConversationRename), `{"conversation_id":"` + testConv + `","user":"u-1","name":"iPhone Specs Chat"}`,
			"POST", "/conversations/" + testConv + "/name", "", map[string]any{"name": "iPhone Specs Chat", "user": "u-1"},
			"Bearer app-chat-key", `"name":"iPhone Specs Chat"`, true, false},
		{AppCapability("agent", SuffixConversationRename), `{"conversation_id":"` + testConv + `","user":"u-1","auto_generate":true}`,
			"POST", "/conversations/" + testConv + "/name", "", map[string]any{"auto_generate": true, "user": "u-1"},
			"Bearer app-agent-key", `"status":"normal"`, true, false},
		{AppCapability("flow", SuffixConversationDelete), `{"conversation_id":"` + testConv + `","user":"u-1"}`,
			"DELETE", "/conversations/" + testConv, "", map[string]any{"user": "u-1"},
			"Bearer app-flow-key", `{"conversation_id":"` + testConv + `","deleted":true}`, true, true},
		{AppCapability("support", SuffixConversationVariables), `{"conversation_id":"` + testConv + `","user":"u-1","last_id":"v-1","limit":10,"variable_name":"user_preference"}`,
			"GET", "/conversations/" + testConv + "/variables", "last_id=v-1&limit=10&user=u-1&variable_name=user_preference", nil,
			"Bearer app-chat-key", `"value":"dark_mode"`, false, false},
		{AppCapability("agent", SuffixSuggested), `{"message_id":"` + testMessageID + `","user":"u-1"}`,
			"GET", "/messages/" + testMessageID + "/suggested", "user=u-1", nil, "Bearer app-agent-key", `"What is the price range?"`, false, false},
		{AppCapability("writer", SuffixFeedbacks), `{"page":2,"limit":50}`, "GET", "/app/feedbacks", "limit=50&page=2", nil,
			"Bearer app-completion-key", `"rating":"like"`, false, false},
		{AppCapability("writer", SuffixFeedbacks), `{"limit":101}`, "GET", "/app/feedbacks", "limit=101", nil,
			"Bearer app-completion-key", `"rating":"like"`, false, false},
		{AppCapability("etl", SuffixWorkflowRun), `{"workflow_run_id":"` + testRun + `"}`, "GET", "/workflows/run/" + testRun, "", nil,
			"Bearer app-workflow-key", `"total_steps":3`, false, false},
		{AppCapability("flow", SuffixWorkflowLogs), `{"keyword":"french","status":"failed","page":1,"limit":20,"created_at__before":"2026-01-02T00:00:00Z","created_at__after":"2026-01-01T00:00:00Z","created_by_end_user_session_id":"u-1","created_by_account":"ops@example.test"}`,
			"GET", "/workflows/logs", "created_at__after=2026-01-01T00%3A00%3A00Z&created_at__before=2026-01-02T00%3A00%3A00Z&created_by_account=ops%40example.test&created_by_end_user_session_id=u-1&keyword=french&limit=20&page=1&status=failed", nil,
			"Bearer app-flow-key", `"workflow_run"`, false, false},
		{KnowledgeCapability(testDataset, SuffixDocuments), `{"page":1,"limit":100,"keyword":"guide","status":"available"}`,
			"GET", docs, "keyword=guide&limit=100&page=1&status=available", nil, "Bearer " + testDatasetKey, `"id":"` + testDocument + `"`, false, false},
		{KnowledgeCapability(testDataset, SuffixDocument), `{"document_id":"` + testDocument + `","metadata":"without"}`,
			"GET", docs + "/" + testDocument, "metadata=without", nil, "Bearer " + testDatasetKey, `"mime_type":"text/plain"`, false, false},
		{KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"guide.txt","text":"Dify is a platform.","indexing_technique":"high_quality","doc_form":"text_model","doc_language":"English",
			"process_rule":{"mode":"custom","rules":{"pre_processing_rules":[{"id":"remove_extra_spaces","enabled":true}],"segmentation":{"separator":"\n","max_tokens":500,"chunk_overlap":50}}},
			"embedding_model":"text-embedding-3-small","embedding_model_provider":"openai"}`,
			"POST", "/datasets/" + testDataset + "/document/create-by-text", "",
			map[string]any{"name": "guide.txt", "text": "Dify is a platform.", "indexing_technique": "high_quality", "doc_form": "text_model", "doc_language": "English",
				"process_rule": map[string]any{"mode": "custom", "rules": map[string]any{
					"pre_processing_rules": []any{map[string]any{"id": "remove_extra_spaces", "enabled": true}},
					"segmentation":         map[string]any{"separator": "\n", "max_tokens": float64(500), "chunk_overlap": float64(50)}}},
				"embedding_model": "text-embedding-3-small", "embedding_model_provider": "openai"},
			"Bearer " + testDatasetKey, `"batch"`, true, false},
		{KnowledgeCapability(testDataset, SuffixDocumentUpdate), `{"document_id":"` + testDocument + `","name":"guide v2","text":"New text.","process_rule":{"mode":"automatic"}}`,
			"POST", docs + "/" + testDocument + "/update-by-text", "",
			map[string]any{"name": "guide v2", "text": "New text.", "process_rule": map[string]any{"mode": "automatic"}},
			"Bearer " + testDatasetKey, `"document"`, true, true},
		{KnowledgeCapability(testDataset, SuffixDocumentDelete), `{"document_id":"` + testDocument + `"}`,
			"DELETE", docs + "/" + testDocument, "", nil, "Bearer " + testDatasetKey, `{"deleted":true,"document_id":"` + testDocument + `"}`, true, true},
		{KnowledgeCapability(testDataset, SuffixSegments), `{"document_id":"` + testDocument + `","page":3,"limit":5,"status":["completed","error"],"keyword":"dify"}`,
			"GET", docs + "/" + testDocument + "/segments", "keyword=dify&limit=5&page=3&status=completed&status=error", nil,
			"Bearer " + testDatasetKey, `"doc_form"`, false, false},
	}
	m, err := f.conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]aip.Capability{}
	for _, c := range m.Capabilities {
		caps[c.ID] = c
	}
	for _, tc := range cases {
		t.Run(strings.TrimPrefix(tc.capID, "cap:dify:"), func(t *testing.T) {
			before := len(f.mock.requests(tc.method, tc.path))
			var out map[string]any
			f.completed(t, hostsdktest.NewAction(tc.capID, tc.input), &out)
			raw, _ := json.Marshal(out)
			if !strings.Contains(string(raw), tc.output) {
				t.Errorf("output %s does not contain %s", raw, tc.output)
			}
			reqs := f.mock.requests(tc.method, tc.path)
			if len(reqs) != before+1 {
				t.Fatalf("%d requests to %s %s", len(reqs)-before, tc.method, tc.path)
			}
			r := reqs[len(reqs)-1]
			if r.Auth != tc.auth {
				t.Errorf("Authorization %q, want %q", r.Auth, tc.auth)
			}
			if got := r.Query.Encode(); got != tc.query {
				t.Errorf("query %q, want %q", got, tc.query)
			}
			if diff := cmp.Diff(tc.body, r.Body); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			// The contract is honest: reads are retry-safe; mutations need
			// an idempotency key, are not retried, and deletions are high risk.
			c := caps[tc.capID]
			k := c.Contract
			if k == nil {
				t.Fatal("no contract")
			}
			if tc.mutation {
				if k.Idempotency.Requirement != aip.IdempotencyRequired || k.Execution.SupportsRetry || k.Execution.RetrySafety == aip.RetrySafe ||
					k.SideEffects[0] == aip.EffectRead {
					t.Errorf("mutation contract %+v", k)
				}
			} else if k.Execution.RetrySafety != aip.RetrySafe || !k.Execution.SupportsRetry || k.SideEffects[0] != aip.EffectRead {
				t.Errorf("read contract %+v", k)
			}
			if tc.high != (c.Risk == aip.RiskHigh) {
				t.Errorf("risk %s", c.Risk)
			}
			if strings.Contains(c.Description, "%!") {
				t.Errorf("description %q", c.Description)
			}
		})
	}
	if c := caps[KnowledgeCapability(testDataset, SuffixDocumentDelete)]; c.Contract.SideEffects[0] != aip.EffectDelete {
		t.Errorf("document.delete side effects %v", c.Contract.SideEffects)
	}
}

// TestOperationErrors: the new kinds of behaviour fail as their kind
// says: a delete (204) or a document write that gets a 5xx or loses its
// connection is outcome_unknown and never sent twice; a 4xx is failed
// with its provider code; a read's 5xx is a retryable failure; a delete
// answered with older Dify's {"result": "success"} is a deletion too.
func TestOperationErrors(t *testing.T) {
	f := newFixture(t, nil)
	docPath := "/datasets/" + testDataset + "/documents/" + testDocument
	unknown := []struct {
		capID, input, method, path string
		h                          http.HandlerFunc
	}{
		{AppCapability("support", SuffixConversationDelete), `{"conversation_id":"` + testConv + `","user":"u"}`, "DELETE", "/conversations/" + testConv,
			func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, http.StatusInternalServerError, map[string]any{"status": 500, "code": "internal_server_error", "message": "Internal server error."})
			}},
		{KnowledgeCapability(testDataset, SuffixDocumentDelete), `{"document_id":"` + testDocument + `"}`, "DELETE", docPath,
			func(w http.ResponseWriter, r *http.Request) {
				if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
					conn.Close()
				}
			}},
		{KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"n","text":"t"}`, "POST", "/datasets/" + testDataset + "/document/create-by-text",
			func(w http.ResponseWriter, r *http.Request) {
				writeJSON(w, http.StatusBadGateway, map[string]any{"message": "bad gateway"})
			}},
		{AppCapability("flow", SuffixConversationRename), `{"conversation_id":"` + testConv + `","user":"u","name":"x"}`, "POST", "/conversations/" + testConv + "/name",
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.Write([]byte("<html>proxy</html>")) // applied, answer unreadable
			}},
	}
	for _, tc := range unknown {
		t.Run("unknown "+tc.capID, func(t *testing.T) {
			f.mock.handle(tc.method+" "+tc.path, tc.h)
			before := len(f.mock.requests(tc.method, tc.path))
			a := hostsdktest.NewAction(tc.capID, tc.input)
			f.Act(t, a)
			if st := f.state(t, a); st != aip.StateOutcomeUnknown {
				t.Fatalf("state %s, want outcome_unknown", st)
			}
			f.Act(t, a)
			if n := len(f.mock.requests(tc.method, tc.path)) - before; n != 1 {
				t.Errorf("Dify got %d requests for one action", n)
			}
		})
	}

	// A 4xx is failed with the provider code and Dify's message.
	f.mock.handle("DELETE "+docPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusForbidden, map[string]any{"status": 403, "code": "archived_document_immutable", "message": "The archived document is not editable."})
	})
	pe := f.failed(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentDelete), `{"document_id":"`+testDocument+`"}`))
	if pe.Code != provider.CodeForbidden || !strings.Contains(pe.Message, "not editable") {
		t.Errorf("delete 403: %+v", pe)
	}
	f.mock.handle("POST /conversations/"+testConv+"/name", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]any{"status": 404, "code": "not_found", "message": "Conversation Not Exists."})
	})
	pe = f.failed(t, hostsdktest.NewAction(AppCapability("support", SuffixConversationRename), `{"conversation_id":"`+testConv+`","user":"u","name":"x"}`))
	if pe.Code != provider.CodeNotFound {
		t.Errorf("rename 404: %+v", pe)
	}
	f.mock.handle("GET /workflows/run/"+testRun, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "code": "not_workflow_app", "message": "Please check if your app mode matches the right API route."})
	})
	pe = f.failed(t, hostsdktest.NewAction(AppCapability("etl", SuffixWorkflowRun), `{"workflow_run_id":"`+testRun+`"}`))
	if pe.Code != provider.CodeInvalidRequest || !strings.Contains(pe.Message, "app mode") {
		t.Errorf("workflow run 400: %+v", pe)
	}

	// A read's 5xx is a retryable failure.
	f.mock.handle("GET /datasets/"+testDataset+"/documents", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": 503, "code": "unavailable", "message": "try later"})
	})
	pe = f.failed(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocuments), `{}`))
	if pe.Code != provider.CodeUnavailable || pe.Retryable == nil || !*pe.Retryable {
		t.Errorf("documents 503: %+v", pe)
	}

	// Dify before the 204 answer said {"result": "success"}: deleted too.
	f.mock.handle("DELETE /conversations/"+testConv, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"result": "success"})
	})
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(AppCapability("agent", SuffixConversationDelete), `{"conversation_id":"`+testConv+`","user":"u"}`), &out)
	if diff := cmp.Diff(map[string]any{"deleted": true, "conversation_id": testConv}, out); diff != "" {
		t.Errorf("delete output (-want +got):\n%s", diff)
	}
}

// TestOperationInputRejected: the new schemas refuse what Dify would, or
// what is unbounded, before Dify is called.
func TestOperationInputRejected(t *testing.T) {
	f := newFixture(t, nil)
	doc := `"document_id":"` + testDocument + `"`
	cases := []*aip.Action{
		hostsdktest.NewAction(AppCapability("support", SuffixInfo), `{"user":"u"}`),
		hostsdktest.NewAction(AppCapability("support", SuffixConversationRename), `{"conversation_id":"c","user":"u"}`),                       // neither name nor auto_generate
		hostsdktest.NewAction(AppCapability("support", SuffixConversationRename), `{"conversation_id":"c","user":"u","auto_generate":false}`), // auto_generate false without a name
		hostsdktest.NewAction(AppCapability("support", SuffixConversationRename), `{"conversation_id":"c/../x","user":"u","name":"n"}`),
		hostsdktest.NewAction(AppCapability("support", SuffixConversationDelete), `{"conversation_id":"c"}`), // no user
		hostsdktest.NewAction(AppCapability("support", SuffixConversationVariables), `{"conversation_id":"c","user":"u","limit":0}`),
		hostsdktest.NewAction(AppCapability("support", SuffixSuggested), `{"message_id":"m"}`),
		hostsdktest.NewAction(AppCapability("writer", SuffixFeedbacks), `{"page":0}`),
		hostsdktest.NewAction(AppCapability("writer", SuffixFeedbacks), `{"limit":102}`),
		hostsdktest.NewAction(AppCapability("etl", SuffixWorkflowRun), `{}`),
		hostsdktest.NewAction(AppCapability("etl", SuffixWorkflowLogs), `{"status":"running"}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocuments), `{"limit":101}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocument), `{"document_id":"not-a-uuid"}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocument), `{`+doc+`,"metadata":"some"}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"n"}`), // no text
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"n","text":"t","process_rule":{"rules":{}}}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreate), `{"name":"n","text":"t","retrieval_model":{}}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentUpdate), `{`+doc+`}`),            // nothing to change
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentUpdate), `{`+doc+`,"text":"t"}`), // text without a name
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentDelete), `{}`),
		hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixSegments), `{`+doc+`,"status":[1]}`),
	}
	f.refusedBeforeSending(t, cases)
}

// TestCapabilityLimit: the manifest holds at most hostsdk.MaxCapabilities
// capabilities, counted per app mode (17 for a chatflow, 15 for a chat or
// agent app, 9 for a completion or workflow app) and per knowledge base
// (13); the largest accepted configuration binds (count and manifest
// size).
func TestCapabilityLimit(t *testing.T) {
	dir := t.TempDir()
	key := writeFile(t, dir, "k.key", "app-key", 0o600)
	file := func(name, mode string, n int) string {
		var entries []string
		for i := range n {
			entries = append(entries, fmt.Sprintf(`{"id":"app%d","name":"App %d","description":%q,"mode":%q,"api_key_file":%q}`,
				i, i, strings.Repeat("d", maxDescriptionLen), mode, key))
		}
		return writeFile(t, dir, name, "["+strings.Join(entries, ",")+"]", 0o644)
	}
	knowledge := writeFile(t, dir, "kb.json", `[{"id":"kb","name":"KB","api_key_file":"`+key+`"}]`, 0o644)
	for _, tc := range []struct {
		mode     Mode
		perApp   int
		fits     int // the most apps of this mode alone
		withKB   bool
		tooMany  int
		wantCaps string
	}{
		{ModeAdvancedChat, 17, 30, true, 30, "523 capabilities"},
		{ModeChat, 15, 34, true, 34, "523 capabilities"},
		{ModeAgentChat, 15, 34, false, 35, "525 capabilities"},
		{ModeCompletion, 9, 56, false, 57, "513 capabilities"},
		{ModeWorkflow, 9, 56, true, 56, "517 capabilities"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			if got := tc.mode.capabilities(); got != tc.perApp {
				t.Errorf("%s: %d capabilities per app, want %d", tc.mode, got, tc.perApp)
			}
			c, err := New(Config{BaseURL: "https://api.dify.ai/v1", AppsFile: file(string(tc.mode)+"-fit.json", string(tc.mode), tc.fits)})
			if err != nil {
				t.Fatal(err)
			}
			m, err := c.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Capabilities) != tc.fits*tc.perApp {
				t.Errorf("%d capabilities, want %d", len(m.Capabilities), tc.fits*tc.perApp)
			}
			if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
				t.Fatal(err)
			}
			cfg := Config{BaseURL: "https://api.dify.ai/v1", AppsFile: file(string(tc.mode)+"-many.json", string(tc.mode), tc.tooMany)}
			if tc.withKB {
				cfg.KnowledgeFile = knowledge
			}
			_, err = New(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantCaps) || !strings.Contains(err.Error(), "at most 512") ||
				!strings.Contains(err.Error(), "--dify-apps-file") {
				t.Errorf("%d %s apps: %v", tc.tooMany, tc.mode, err)
			}
		})
	}
	if knowledgeCapabilities != 13 {
		t.Errorf("%d capabilities per knowledge base, want 13", knowledgeCapabilities)
	}

	// Knowledge bases alone: 39 fit (507 capabilities), 40 do not.
	kbFile := func(name string, n int) string {
		var entries []string
		for i := range n {
			entries = append(entries, fmt.Sprintf(`{"id":"kb%d","name":"KB %d","description":%q,"api_key_file":%q}`,
				i, i, strings.Repeat("d", maxDescriptionLen), key))
		}
		return writeFile(t, dir, name, "["+strings.Join(entries, ",")+"]", 0o644)
	}
	c, err := New(Config{BaseURL: "https://api.dify.ai/v1", KnowledgeFile: kbFile("kb-fit.json", 39)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Capabilities) != 39*13 {
		t.Errorf("%d capabilities, want %d", len(m.Capabilities), 39*13)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatal(err)
	}
	_, err = New(Config{BaseURL: "https://api.dify.ai/v1", KnowledgeFile: kbFile("kb-many.json", 40)})
	if err == nil || !strings.Contains(err.Error(), "520 capabilities") || !strings.Contains(err.Error(), "knowledge bases over several hosts") {
		t.Errorf("40 knowledge bases: %v", err)
	}
}

// TestOperationTables: every field an operation's input schema allows is
// sent (in its path, query or body) and every field it sends is in its
// schema, so the connector never refuses or drops what the host accepted.
func TestOperationTables(t *testing.T) {
	all := append(append([]operation{}, appOperations...), knowledgeOperations...)
	seen := map[string]bool{}
	for _, o := range all {
		key := fmt.Sprint(o.modes == nil, o.suffix)
		if seen[key] {
			t.Errorf("suffix %s declared twice", o.suffix)
		}
		seen[key] = true
		var s struct {
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(o.schema, &s); err != nil {
			t.Fatalf("%s: %v", o.suffix, err)
		}
		var sent []string
		for _, m := range pathField.FindAllStringSubmatch(o.path, -1) {
			if m[1] != "dataset_id" || o.modes != nil {
				sent = append(sent, m[1])
			}
		}
		sent = append(append(append(append(sent, o.query...), o.body...), o.form...), o.data...)
		if o.upload {
			sent = append(sent, uploadFileFields...)
		}
		var allowed []string
		for k := range s.Properties {
			allowed = append(allowed, k)
		}
		slices.Sort(sent)
		slices.Sort(allowed)
		if diff := cmp.Diff(allowed, sent); diff != "" {
			t.Errorf("%s: schema fields (-) vs sent fields (+):\n%s", o.suffix, diff)
		}
		if (o.contract.Idempotency.Requirement == aip.IdempotencyRequired) != o.mutation || (o.deletes && o.risk != aip.RiskHigh) {
			t.Errorf("%s: mutation %v deletes %v, contract %+v risk %s", o.suffix, o.mutation, o.deletes, o.contract.Idempotency, o.risk)
		}
	}
}

// TestFileUpload: files.upload sends the document's multipart/form-data
// body (one "file" part with the filename, media type and bytes, and the
// end user), returns Dify's file record, and is a mutation: a 5xx leaves
// its outcome unknown. Bad input is refused before anything is sent.
func TestFileUpload(t *testing.T) {
	f := newFixture(t, nil)
	capID := AppCapability("support", SuffixFileUpload)
	data := append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)...)
	input := func(filename, content, extra string) string {
		return `{"filename":` + strconv.Quote(filename) + `,"content_base64":"` + content + `"` + extra + `}`
	}
	enc := base64.StdEncoding.EncodeToString(data)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, input("product photo é.png", enc, `,"mime_type":"image/png","user":"u-1"`)), &out)
	reqs := f.mock.requests(http.MethodPost, "/files/upload")
	if len(reqs) != 1 || reqs[0].Upload == nil {
		t.Fatalf("uploads received: %+v", reqs)
	}
	u := reqs[0].Upload
	if u.Filename != "product photo é.png" || u.ContentType != "image/png" || u.User != "u-1" || !bytes.Equal(u.Data, data) || reqs[0].Auth != "Bearer app-chat-key" {
		t.Fatalf("upload received: %q %q %q %d bytes (want %d), auth %q", u.Filename, u.ContentType, u.User, len(u.Data), len(data), reqs[0].Auth)
	}
	if out["id"] == "" || out["name"] != "product photo é.png" || out["size"] != float64(len(data)) || out["extension"] != "png" {
		t.Fatalf("output %v", out)
	}
	// Without mime_type and user: application/octet-stream, no user part.
	f.completed(t, hostsdktest.NewAction(AppCapability("etl", SuffixFileUpload), input("notes.txt", base64.StdEncoding.EncodeToString([]byte("hello")), "")), &out)
	if u := f.mock.requests(http.MethodPost, "/files/upload")[1].Upload; u.ContentType != "application/octet-stream" || u.User != "" {
		t.Fatalf("upload without mime_type and user: %+v", u)
	}

	// Refused before anything is sent, with what to fix.
	for name, tc := range map[string]struct{ input, want string }{
		"a slash in the filename":   {input("a/b.png", enc, ""), "filename"},
		"a quote in the filename":   {input(`a"b.png`, enc, ""), "filename"},
		"a newline in the filename": {input("a\nb.png", enc, ""), "filename"},
		"content not base64":        {input("a.png", "not base64!", ""), "content_base64"},
		"content too large":         {input("a.png", base64.StdEncoding.EncodeToString(make([]byte, MaxUploadBytes+1)), ""), "content_base64"},
		"an unknown field":          {input("a.png", enc, `,"purpose":"x"`), "purpose"},
		"a bad media type":          {input("a.png", enc, `,"mime_type":"png"`), "mime_type"},
	} {
		t.Run(name, func(t *testing.T) {
			before := len(f.mock.requests(http.MethodPost, "/files/upload"))
			// The host's schema check refuses the message; the
			// connector's own checks fail the action.
			resp := f.Act(t, hostsdktest.NewAction(capID, tc.input))
			pe := resp.ProtocolError()
			if res, err := resp.Result(); err == nil {
				pe = res.Error
			}
			if pe == nil || pe.Code != hostsdk.CodeInputInvalid || !strings.Contains(pe.Message, tc.want) {
				t.Fatalf("HTTP %d: %+v, want %s naming %s", resp.Status, pe, hostsdk.CodeInputInvalid, tc.want)
			}
			if n := len(f.mock.requests(http.MethodPost, "/files/upload")); n != before {
				t.Fatalf("%d requests sent for a refused upload", n-before)
			}
		})
	}

	// A 5xx after the body was sent: the file may exist.
	f.mock.handle("POST /files/upload", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"status": 500, "code": "internal_server_error", "message": "boom"})
	})
	a := hostsdktest.NewAction(capID, input("c.png", enc, ""))
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("upload answered 500: %s, want outcome_unknown", st)
	}
}

// TestDocumentByFile: a knowledge base's documents are created and replaced
// from a file: the multipart body carries the file and, in the part "data",
// the JSON of the settings given (none when none is).
func TestDocumentByFile(t *testing.T) {
	f := newFixture(t, nil)
	pdf := []byte("%PDF-1.7\n" + strings.Repeat("x", 3000))
	enc := base64.StdEncoding.EncodeToString(pdf)
	create := "/datasets/" + testDataset + "/document/create-by-file"
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentCreateByFile),
		`{"filename":"guide.pdf","mime_type":"application/pdf","content_base64":"`+enc+`","indexing_technique":"high_quality","doc_form":"text_model","process_rule":{"mode":"automatic"}}`), &out)
	reqs := f.mock.requests(http.MethodPost, create)
	if len(reqs) != 1 || reqs[0].Upload == nil || reqs[0].Auth != "Bearer "+testDatasetKey {
		t.Fatalf("requests: %+v", reqs)
	}
	u := reqs[0].Upload
	var settings map[string]any
	if err := json.Unmarshal([]byte(u.Settings), &settings); err != nil {
		t.Fatalf("data part %q: %v", u.Settings, err)
	}
	want := map[string]any{"indexing_technique": "high_quality", "doc_form": "text_model", "process_rule": map[string]any{"mode": "automatic"}}
	if u.Filename != "guide.pdf" || u.ContentType != "application/pdf" || !bytes.Equal(u.Data, pdf) || !cmp.Equal(settings, want) {
		t.Fatalf("upload %q %q %d bytes, data %s", u.Filename, u.ContentType, len(u.Data), u.Settings)
	}
	if _, ok := out["document"]; !ok {
		t.Fatalf("output %v", out)
	}

	update := "/datasets/" + testDataset + "/documents/" + testDocument
	f.completed(t, hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentUpdateByFile),
		`{"document_id":"`+testDocument+`","filename":"guide-v2.pdf","content_base64":"`+enc+`"}`), &out)
	reqs = f.mock.requests(http.MethodPatch, update)
	if len(reqs) != 1 || reqs[0].Upload == nil || reqs[0].Upload.Filename != "guide-v2.pdf" || reqs[0].Upload.Settings != "" {
		t.Fatalf("update requests: %+v", reqs)
	}
	// Replacing a document is a high-risk mutation; a lost answer leaves it unknown.
	f.mock.handle("PATCH "+update, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusBadGateway, map[string]any{"status": 502, "code": "bad_gateway", "message": "upstream"})
	})
	a := hostsdktest.NewAction(KnowledgeCapability(testDataset, SuffixDocumentUpdateByFile),
		`{"document_id":"`+testDocument+`","filename":"guide-v3.pdf","content_base64":"`+enc+`"}`)
	f.Act(t, a)
	if st := f.state(t, a); st != aip.StateOutcomeUnknown {
		t.Fatalf("update answered 502: %s, want outcome_unknown", st)
	}
}

// TestAudioToText: audio.to_text sends the audio as the document's
// multipart body and returns the transcript; a media type Dify refuses is
// refused before anything is sent, and a failure is a plain failure (it
// changes nothing in Dify).
func TestAudioToText(t *testing.T) {
	f := newFixture(t, nil)
	capID := AppCapability("writer", SuffixAudioToText)
	wav := append([]byte("RIFF\x24\x00\x00\x00WAVEfmt "), make([]byte, 2048)...)
	enc := base64.StdEncoding.EncodeToString(wav)
	var out map[string]any
	f.completed(t, hostsdktest.NewAction(capID, `{"filename":"question.wav","mime_type":"audio/wav","content_base64":"`+enc+`","user":"u-9"}`), &out)
	reqs := f.mock.requests(http.MethodPost, "/audio-to-text")
	if len(reqs) != 1 || reqs[0].Upload == nil {
		t.Fatalf("requests: %+v", reqs)
	}
	if u := reqs[0].Upload; u.Filename != "question.wav" || u.ContentType != "audio/wav" || u.User != "u-9" || !bytes.Equal(u.Data, wav) {
		t.Fatalf("upload %q %q %q %d bytes", u.Filename, u.ContentType, u.User, len(u.Data))
	}
	if _, ok := out["text"].(string); !ok {
		t.Fatalf("output %v", out)
	}
	resp := f.Act(t, hostsdktest.NewAction(capID, `{"filename":"q.mp3","mime_type":"audio/mpeg","content_base64":"`+enc+`"}`))
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeInputInvalid || !strings.Contains(pe.Message, "mime_type") {
		t.Fatalf("audio/mpeg: HTTP %d %s", resp.Status, resp.Raw)
	}
	if n := len(f.mock.requests(http.MethodPost, "/audio-to-text")); n != 1 {
		t.Fatalf("%d requests, want 1", n)
	}
	f.mock.handle("POST /audio-to-text", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"status": 500, "code": "internal_server_error", "message": "stt down"})
	})
	a := hostsdktest.NewAction(capID, `{"filename":"q.wav","mime_type":"audio/wav","content_base64":"`+enc+`"}`)
	if pe := f.failed(t, a); pe.Code == hostsdk.CodeOutcomeUnknown {
		t.Fatalf("a failed transcription is %s", pe.Code)
	}
}
