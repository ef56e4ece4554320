package dify

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
)

// The mock follows the published Service API document
// (specs/dify/openapi_service.json): every request passes spectest's check
// first, JSON answers are the document's own examples, and app
// invocations answer with server-sent events as the document describes
// them ("data: {...}\n\n" frames, "event: ping" keep-alives, message /
// agent_message / message_end / workflow_started / text_chunk /
// workflow_finished / error events with their documented fields).

const specFile = "dify/openapi_service.json"

// Test credentials: one key per app and knowledge base.
var testApps = []struct {
	id   string
	mode Mode
	key  string
}{
	{"support", ModeChat, "app-chat-key"},
	{"flow", ModeAdvancedChat, "app-flow-key"},
	{"agent", ModeAgentChat, "app-agent-key"},
	{"writer", ModeCompletion, "app-completion-key"},
	{"etl", ModeWorkflow, "app-workflow-key"},
}

const (
	testDataset    = "c42e2a6e-40b3-4330-96f8-f1e4d768e8c9"
	testDatasetKey = "dataset-key"
	testMessageID  = "9da23599-e713-473b-982c-4328d4f5c78a"
)

// recorded is a request the mock received.
type recorded struct {
	Method, Path string // Path is after the /v1 server path
	Query        url.Values
	Auth         string
	Body         map[string]any
	// Upload is a POST /files/upload the mock accepted.
	Upload *upload
}

// upload is what a multipart/form-data request carried.
type upload struct {
	Filename, ContentType, User string
	Data                        []byte
	// Settings is the part "data" (document create and update by file).
	Settings string
}

// mockDify is a Dify Service API.
type mockDify struct {
	t    testing.TB
	doc  map[string]any
	mu   sync.Mutex
	reqs []recorded
	// override answers "METHOD /path" itself.
	override map[string]http.HandlerFunc
	// revoked are keys Dify no longer accepts (401 to every request).
	revoked map[string]bool
}

// revoke makes Dify refuse key from now on.
func (m *mockDify) revoke(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.revoked == nil {
		m.revoked = map[string]bool{}
	}
	m.revoked[key] = true
}

func (m *mockDify) handle(key string, h http.HandlerFunc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.override[key] = h
}

func (m *mockDify) requests(method, path string) []recorded {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []recorded
	for _, r := range m.reqs {
		if r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	return out
}

func modeOfKey(key string) (Mode, bool) {
	for _, a := range testApps {
		if a.key == key {
			return a.mode, true
		}
	}
	return "", false
}

func (m *mockDify) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimPrefix(r.URL.Path, "/v1")
	rec := recorded{Method: r.Method, Path: path, Query: r.URL.Query(), Auth: r.Header.Get("Authorization")}
	var raw []byte
	if r.Body != nil {
		raw, _ = io.ReadAll(r.Body)
		json.Unmarshal(raw, &rec.Body)
		r.Body = io.NopCloser(bytes.NewReader(raw))
	}
	var uploadErr map[string]any
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt == "multipart/form-data" || path == "/files/upload" || path == pipelineUploadPath {
		rec.Upload, uploadErr = parseUpload(r)
	}
	m.mu.Lock()
	m.reqs = append(m.reqs, rec)
	h := m.override[r.Method+" "+path]
	revoked := m.revoked[strings.TrimPrefix(rec.Auth, "Bearer ")]
	m.mu.Unlock()
	if revoked {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
		return
	}
	if h != nil {
		h(w, r)
		return
	}
	key := strings.TrimPrefix(rec.Auth, "Bearer ")
	mode, isApp := modeOfKey(key)
	if !isApp && key != testDatasetKey {
		writeJSON(w, http.StatusUnauthorized, map[string]any{"status": 401, "code": "unauthorized", "message": "Access token is invalid"})
		return
	}
	wrongApp := func() {
		writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "code": "not_chat_app", "message": "Please check if your app mode matches the right API route."})
	}
	switch {
	case r.Method == http.MethodPost && path == "/chat-messages":
		if !mode.chat() {
			wrongApp()
			return
		}
		writeEvents(w, defaultEvents(mode))
	case r.Method == http.MethodPost && path == "/completion-messages":
		if mode != ModeCompletion {
			wrongApp()
			return
		}
		writeEvents(w, defaultEvents(mode))
	case r.Method == http.MethodPost && path == "/workflows/run":
		if mode != ModeWorkflow {
			wrongApp()
			return
		}
		writeEvents(w, defaultEvents(mode))
	case r.Method == http.MethodPost && path == "/files/upload":
		if !isApp {
			writeJSON(w, http.StatusForbidden, map[string]any{"status": 403, "code": "forbidden", "message": "not an app key"})
			return
		}
		if uploadErr != nil {
			writeJSON(w, http.StatusBadRequest, uploadErr)
			return
		}
		// The document's 201 example, describing the file received.
		ans := docExample(m.t, m.doc, "/files/upload", "post", "201").(map[string]any)
		u := rec.Upload
		ans["name"], ans["size"], ans["mime_type"] = u.Filename, len(u.Data), u.ContentType
		ans["extension"] = strings.TrimPrefix(filepath.Ext(u.Filename), ".")
		writeJSON(w, http.StatusCreated, ans)
	case strings.HasPrefix(path, "/datasets"):
		if key != testDatasetKey {
			writeJSON(w, http.StatusForbidden, map[string]any{"status": 403, "code": "forbidden", "message": "not a knowledge key"})
			return
		}
		if uploadErr != nil {
			writeJSON(w, http.StatusBadRequest, uploadErr)
			return
		}
		if m.pipeline(w, r, &rec) {
			return
		}
		if rm, _ := rec.Body["retrieval_model"].(map[string]any); r.Method == http.MethodPost && strings.HasSuffix(path, "/retrieve") &&
			rm["reranking_enable"] == true && rm["reranking_mode"] == nil {
			// The document's RetrievalModel: reranking_mode is "Required
			// when reranking_enable is true".
			writeJSON(w, http.StatusBadRequest, map[string]any{"status": 400, "code": "invalid_param", "message": "reranking_mode is required when reranking_enable is true"})
			return
		}
		m.example(w, r, path)
	default:
		if !isApp {
			writeJSON(w, http.StatusForbidden, map[string]any{"status": 403, "code": "forbidden", "message": "not an app key"})
			return
		}
		m.example(w, r, path)
	}
}

// pipelineUploadPath is the knowledge pipeline's file upload: its path
// names no knowledge base (the knowledge base's key says whose it is).
const pipelineUploadPath = "/datasets/pipeline/file-upload"

var datasourceNodePath = regexp.MustCompile(`^/datasets/` + testDataset + `/pipeline/datasource/nodes/[^/]+/run$`)

// pipeline answers the knowledge pipeline's operations as the document
// describes them, and reports whether the request was one (the documented
// errors are answered by the tests' overrides, with the document's
// bodies): the file upload answers 201 with the file record (415 for a file part
// without a media type, as Dify refuses it); a datasource node run
// streams datasource events (Dify's datasource_processing,
// datasource_completed and datasource_error, framed as the SSE guide
// says); a pipeline run streams workflow events in streaming mode and
// answers the document's JSON example in blocking mode.
func (m *mockDify) pipeline(w http.ResponseWriter, r *http.Request, rec *recorded) bool {
	path := rec.Path
	if path == pipelineUploadPath && r.Method == http.MethodPost {
		u := rec.Upload
		if u.ContentType == "" {
			writeJSON(w, http.StatusUnsupportedMediaType, docExampleNamed(m.t, m.doc, path, "post", "415", "unsupported_file_type"))
			return true
		}
		ans := docExample(m.t, m.doc, path, "post", "201").(map[string]any)
		ans["name"], ans["size"], ans["mime_type"] = u.Filename, len(u.Data), u.ContentType
		ans["extension"] = strings.TrimPrefix(filepath.Ext(u.Filename), ".")
		writeJSON(w, http.StatusCreated, ans)
		return true
	}
	switch {
	case r.Method == http.MethodPost && datasourceNodePath.MatchString(path):
		typ, _ := rec.Body["datasource_type"].(string)
		writeEvents(w, datasourceEvents(typ))
	case r.Method == http.MethodPost && path == "/datasets/"+testDataset+"/pipeline/run":
		if rec.Body["response_mode"] == "blocking" {
			writeJSON(w, http.StatusOK, docExample(m.t, m.doc, "/datasets/{dataset_id}/pipeline/run", "post", "200"))
			return true
		}
		writeEvents(w, pipelineEvents())
	default:
		return false
	}
	return true
}

// testPages is what the mock's datasource nodes find, per datasource type.
var testPages = map[string]any{
	"online_document": []any{map[string]any{"workspace_id": "ws-abc123", "workspace_name": "Product", "workspace_icon": "",
		"total": 1, "pages": []any{map[string]any{"page_id": "pg-def456", "page_name": "Product Roadmap", "type": "page",
			"parent_id": "", "last_edited_time": "2025-03-06T12:00:00Z", "page_icon": nil}}}},
	"website_crawl": []any{map[string]any{"source_url": "https://example.com/docs/getting-started", "title": "Getting Started Guide",
		"description": "How to begin", "content": "# Getting started"}},
	"online_drive": []any{map[string]any{"bucket": "my-bucket", "is_truncated": false, "next_page_parameters": nil,
		"files": []any{map[string]any{"id": "file-abc123", "name": "meeting-notes.docx", "size": 2048, "type": "file"}}}},
}

// datasourceEvents are the events of a datasource node run of type typ:
// progress, then the result; a local file source has nothing to browse
// (Dify reports the type unsupported with datasource_error).
func datasourceEvents(typ string) []any {
	data, ok := testPages[typ]
	if !ok {
		return []any{map[string]any{"event": "datasource_error", "error": "Unsupported datasource provider: " + typ}}
	}
	completed := map[string]any{"event": "datasource_completed", "data": data, "total": 1, "completed": 1, "time_consuming": 0.52}
	if typ == "online_drive" {
		completed["total"], completed["completed"] = nil, nil
	}
	return []any{map[string]any{"event": "datasource_processing", "total": 1, "completed": 0}, ping, completed}
}

// pipelineEvents are the events of a pipeline run in streaming mode (the
// document's key events).
func pipelineEvents() []any {
	return []any{
		workflowEvent("workflow_started", map[string]any{"id": testRun, "workflow_id": "pipeline-wf", "created_at": 1741267200}),
		workflowEvent("node_started", map[string]any{"node_id": "1719288585006", "node_type": "datasource", "title": "Notion Documents"}),
		ping,
		workflowEvent("node_finished", map[string]any{"node_id": "1719288585006", "node_type": "datasource", "title": "Notion Documents", "status": "succeeded"}),
		workflowEvent("node_started", map[string]any{"node_id": "knowledge", "node_type": "knowledge-index", "title": "Knowledge Base"}),
		workflowEvent("node_finished", map[string]any{"node_id": "knowledge", "node_type": "knowledge-index", "title": "Knowledge Base", "status": "succeeded"}),
		workflowFinished("succeeded", map[string]any{"documents": 1}, nil),
	}
}

// parseUpload reads an upload as the document describes it: a
// multipart/form-data body with exactly one part "file" that has a
// filename without / or \, and the optional field "user" (file upload)
// or "data" (documents by file). A body the document refuses gets its
// documented 400 answer.
func parseUpload(r *http.Request) (*upload, map[string]any) {
	refuse := func(code, msg string) (*upload, map[string]any) {
		return nil, map[string]any{"status": 400, "code": code, "message": msg}
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" {
		return refuse("no_file_uploaded", "Please upload your file.")
	}
	mr := multipart.NewReader(r.Body, params["boundary"])
	u := &upload{}
	files := 0
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return refuse("invalid_param", "malformed multipart body: "+err.Error())
		}
		data, _ := io.ReadAll(p)
		switch p.FormName() {
		case "file":
			files++
			// The raw parameter: Part.FileName would strip a directory.
			_, disp, _ := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
			name := disp["filename"]
			if name == "" {
				return refuse("filename_not_exists_error", "The specified filename does not exist.")
			}
			if strings.ContainsAny(name, `/\`) {
				return refuse("invalid_param", "invalid filename")
			}
			u.Filename, u.ContentType, u.Data = name, p.Header.Get("Content-Type"), data
		case "user":
			u.User = string(data)
		case "data":
			u.Settings = string(data)
		}
	}
	switch {
	case files == 0:
		return refuse("no_file_uploaded", "Please upload your file.")
	case files > 1:
		return refuse("too_many_files", "Only one file is allowed.")
	}
	return u, nil
}

// example answers with the first example of the operation's 200 answer in
// the document, or 204 without a body when that is the document's answer.
func (m *mockDify) example(w http.ResponseWriter, r *http.Request, path string) {
	tmpl := ""
	for p := range m.doc["paths"].(map[string]any) {
		re := "^" + regexp.MustCompile(`\\\{[^}]+\}`).ReplaceAllString(regexp.QuoteMeta(p), "[^/]+") + "$"
		if regexp.MustCompile(re).MatchString(path) && (tmpl == "" || strings.Count(p, "{") < strings.Count(tmpl, "{")) {
			tmpl = p
		}
	}
	op, _ := m.doc["paths"].(map[string]any)[tmpl].(map[string]any)[strings.ToLower(r.Method)].(map[string]any)
	responses, _ := op["responses"].(map[string]any)
	if _, ok := responses["200"]; !ok && responses["204"] != nil {
		w.WriteHeader(http.StatusNoContent) // the document's answer has no body
		return
	}
	writeJSON(w, http.StatusOK, docExample(m.t, m.doc, tmpl, strings.ToLower(r.Method), "200"))
}

// docExample returns the first example of an operation's answer.
func docExample(t testing.TB, doc map[string]any, path, method, status string) any {
	t.Helper()
	op, _ := doc["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)
	resp, _ := op["responses"].(map[string]any)[status].(map[string]any)
	if ref, ok := resp["$ref"].(string); ok {
		resp = doc["components"].(map[string]any)["responses"].(map[string]any)[ref[strings.LastIndex(ref, "/")+1:]].(map[string]any)
	}
	media, _ := resp["content"].(map[string]any)["application/json"].(map[string]any)
	for _, ex := range media["examples"].(map[string]any) {
		return ex.(map[string]any)["value"]
	}
	t.Fatalf("the document has no example for %s %s %s", method, path, status)
	return nil
}

// docExampleNamed returns the example of that name of an operation's
// answer (an error's examples are named by its code).
func docExampleNamed(t testing.TB, doc map[string]any, path, method, status, name string) any {
	t.Helper()
	op, _ := doc["paths"].(map[string]any)[path].(map[string]any)[method].(map[string]any)
	resp, _ := op["responses"].(map[string]any)[status].(map[string]any)
	media, _ := resp["content"].(map[string]any)["application/json"].(map[string]any)
	ex, ok := media["examples"].(map[string]any)[name].(map[string]any)
	if !ok {
		t.Fatalf("the document has no example %q for %s %s %s", name, method, path, status)
	}
	return ex["value"]
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// ping is the keep-alive Dify sends between events.
const ping = "ping"

// writeEvents streams events: a map as "data: {json}\n\n", ping as
// "event: ping\n\n", flushing after each.
func writeEvents(w http.ResponseWriter, events []any) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for _, ev := range events {
		writeEvent(w, ev)
	}
}

// pingingStream answers with events (a ping when there are none), then
// only pings, every 20 ms, until the client goes away: a run at work that
// says nothing.
func pingingStream(events []any) http.HandlerFunc {
	if len(events) == 0 {
		events = []any{ping}
	}
	return func(w http.ResponseWriter, r *http.Request) {
		writeEvents(w, events)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				w.Write([]byte("event: ping\n\n"))
				w.(http.Flusher).Flush()
			}
		}
	}
}

func writeEvent(w http.ResponseWriter, ev any) {
	if ev == ping {
		w.Write([]byte("event: ping\n\n"))
	} else {
		b, _ := json.Marshal(ev)
		w.Write([]byte("data: " + string(b) + "\n\n"))
	}
	w.(http.Flusher).Flush()
}

const (
	testTask = "c3800678-a077-43df-a102-53f23ed20b88"
	testConv = "45701982-8118-4bc5-8e9b-64562b4555f2"
	testRun  = "fb47b2e6-5a9c-4fb4-9d4b-1b0c4c1e0a11"
)

func chatEvent(event, answer string) map[string]any {
	return map[string]any{"event": event, "task_id": testTask, "id": testMessageID, "message_id": testMessageID,
		"conversation_id": testConv, "answer": answer, "created_at": 1705395332}
}

func messageEnd() map[string]any {
	return map[string]any{"event": "message_end", "task_id": testTask, "id": testMessageID, "message_id": testMessageID,
		"conversation_id": testConv, "metadata": map[string]any{"usage": map[string]any{"prompt_tokens": 1033, "completion_tokens": 128, "total_tokens": 1161}}}
}

func workflowEvent(event string, data map[string]any) map[string]any {
	return map[string]any{"event": event, "task_id": testTask, "workflow_run_id": testRun, "data": data}
}

func workflowFinished(status string, outputs map[string]any, errMsg any) map[string]any {
	return workflowEvent("workflow_finished", map[string]any{"id": testRun, "workflow_id": "wf-1", "status": status,
		"outputs": outputs, "error": errMsg, "elapsed_time": 0.5, "total_tokens": 42, "total_steps": 3,
		"created_at": 1705395332, "finished_at": 1705395333})
}

// chatflow gives a workflow or node event the fields every chatflow event
// carries (the document's common fields: conversation_id, message_id,
// created_at).
func chatflow(ev map[string]any) map[string]any {
	ev["conversation_id"], ev["message_id"], ev["created_at"] = testConv, testMessageID, 1705395332
	return ev
}

func defaultEvents(mode Mode) []any {
	switch mode {
	case ModeChat:
		return []any{chatEvent("message", "Hello"), ping, chatEvent("message", " world"), messageEnd()}
	case ModeAgentChat:
		return []any{
			map[string]any{"event": "agent_thought", "task_id": testTask, "id": "th-1", "message_id": testMessageID,
				"conversation_id": testConv, "position": 1, "thought": "look it up", "tool": "search", "tool_input": `{"q":"x"}`, "observation": "found"},
			chatEvent("agent_message", "Hi"), chatEvent("agent_message", " there"), messageEnd()}
	case ModeAdvancedChat:
		return []any{
			chatflow(workflowEvent("workflow_started", map[string]any{"id": testRun, "workflow_id": "wf-1", "created_at": 1705395332})),
			chatflow(workflowEvent("node_started", map[string]any{"node_id": "llm", "node_type": "llm", "title": "LLM"})),
			chatEvent("message", "Flow "), chatEvent("message", "answer"),
			chatflow(workflowEvent("node_finished", map[string]any{"node_id": "llm", "node_type": "llm", "title": "LLM", "status": "succeeded"})),
			messageEnd(), chatflow(workflowFinished("succeeded", map[string]any{"answer": "Flow answer"}, nil))}
	case ModeCompletion:
		return []any{chatEvent("message", "Done"), chatEvent("message", "."), messageEnd()}
	}
	return []any{
		workflowEvent("workflow_started", map[string]any{"id": testRun, "workflow_id": "wf-1", "created_at": 1705395332}),
		ping,
		workflowEvent("text_chunk", map[string]any{"text": "part 1, "}),
		workflowEvent("text_chunk", map[string]any{"text": "part 2"}),
		workflowFinished("succeeded", map[string]any{"result": 42}, nil)}
}

// fixture is a connector on a real host, in front of the mock.
type fixture struct {
	mock    *mockDify
	checked *spectest.Checked
	srv     *httptest.Server
	cfg     Config
	conn    *Connector
	journal journal.Journal
	// logs holds the host's logs (the actions' call.Logger), from info on.
	logs *hostsdktest.LogBuffer
	*hostsdktest.Fixture
}

// writeFile writes a file with the given mode in dir.
func writeFile(t testing.TB, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// testFiles writes the apps and knowledge files and the keys.
func testFiles(t testing.TB) (appsFile, knowledgeFile string) {
	t.Helper()
	dir := t.TempDir()
	var apps []map[string]any
	for _, a := range testApps {
		apps = append(apps, map[string]any{"id": a.id, "name": "App " + a.id, "mode": a.mode,
			"api_key_file": writeFile(t, dir, a.id+".key", a.key+"\n", 0o600)})
	}
	b, _ := json.Marshal(apps)
	appsFile = writeFile(t, dir, "apps.json", string(b), 0o644)
	b, _ = json.Marshal([]map[string]any{{"id": testDataset, "name": "Docs", "description": "product docs",
		"api_key_file": writeFile(t, dir, "dataset.key", testDatasetKey, 0o600)}})
	knowledgeFile = writeFile(t, dir, "knowledge.json", string(b), 0o644)
	return appsFile, knowledgeFile
}

// refusedBeforeSending checks that each action is refused 400
// input_invalid and that nothing reached Dify but the host's health
// probes (GET /info, GET /datasets?page=1&limit=1).
func (f *fixture) refusedBeforeSending(t *testing.T, cases []*aip.Action) {
	t.Helper()
	for _, a := range cases {
		resp := f.Act(t, a)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s", a.CapabilityID, a.Input, resp.Status, resp.Raw)
		}
	}
	f.mock.mu.Lock()
	defer f.mock.mu.Unlock()
	for _, r := range f.mock.reqs {
		probe := r.Method == http.MethodGet && (r.Path == "/info" ||
			r.Path == "/datasets" && r.Query.Encode() == "limit=1&page=1")
		if !probe {
			t.Errorf("Dify was called: %s %s?%s", r.Method, r.Path, r.Query.Encode())
		}
	}
}

func newFixture(t *testing.T, edit func(*Config)) *fixture {
	t.Helper()
	return newFixtureOn(t, edit, nil)
}

// newFixtureOn is newFixture whose journal prefill writes, and whose
// mock it prepares, before the host starts (the actions a crashed process
// left running, and the answers its recovery reads).
func newFixtureOn(t *testing.T, edit func(*Config), prefill func(*fixture, journal.Journal)) *fixture {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "internal", "spectest", "specs", "dify", "openapi_service.json"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{mock: &mockDify{t: t, override: map[string]http.HandlerFunc{}}}
	if err := json.Unmarshal(raw, &f.mock.doc); err != nil {
		t.Fatal(err)
	}
	spec := spectest.Load(t, specFile)
	f.checked = spec.Handler(t, f.mock)
	f.srv = httptest.NewServer(f.checked)
	t.Cleanup(f.srv.Close)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	appsFile, knowledgeFile := testFiles(t)
	f.cfg = Config{BaseURL: f.srv.URL + spec.Prefix, AppsFile: appsFile, KnowledgeFile: knowledgeFile, Transport: tr}
	if edit != nil {
		edit(&f.cfg)
	}
	f.conn, err = New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	j, err := sqliteruntime.Open(hostsdktest.Context(t), sqliteruntime.Config{Dir: t.TempDir(), Sync: sqliteruntime.SyncNormal})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	f.journal = j
	if prefill != nil {
		prefill(f, j)
	}
	f.logs = &hostsdktest.LogBuffer{}
	f.Fixture = hostsdktest.Start(t, f.conn, func(hc *hostsdk.Config) {
		hc.Journal = j
		hc.StateDir = ""
		hc.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	return f
}

// completed runs an action that must complete and decodes its output.
func (f *fixture) completed(t *testing.T, a *aip.Action, out any) *hostsdktest.Response {
	t.Helper()
	resp := f.Act(t, a)
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("%s: HTTP %d: %v", a.CapabilityID, resp.Status, err)
	}
	if res.Status != aip.ResultCompleted {
		t.Fatalf("%s: %s: %+v", a.CapabilityID, res.Status, res.Error)
	}
	if err := json.Unmarshal(res.Output, out); err != nil {
		t.Fatal(err)
	}
	return resp
}

// failed runs an action that must fail and returns its error.
func (f *fixture) failed(t *testing.T, a *aip.Action) *aip.ProtocolError {
	t.Helper()
	res := f.Result(t, a)
	if res.Status != aip.ResultFailed || res.Error == nil {
		t.Fatalf("%s: %s, want failed: %s", a.CapabilityID, res.Status, res.Output)
	}
	return res.Error
}

// state returns the journal state of an action.
func (f *fixture) state(t *testing.T, a *aip.Action) aip.ActionState {
	t.Helper()
	st, _, err := f.Dispatcher.Status(hostsdktest.Context(t), f.Target, a.ID, a.CapabilityID)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}
