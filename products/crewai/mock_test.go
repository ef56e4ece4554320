package crewai

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/products/internal/spectest"
)

// mockAMP is one deployed crew on CrewAI AMP as
// specs/crewai/enterprise-api.en.yaml describes it: bearer
// authentication, GET /inputs, POST /kickoff answering a kickoff_id,
// GET /status/{kickoff_id} answering the ExecutionRunning shape for a
// run's first polls and then ExecutionCompleted or ExecutionError, and
// POST /resume. Error answers use the document's Error and
// ValidationError shapes. It runs behind spectest's checker, so any
// request the document does not describe fails the test.
type mockAMP struct {
	token   string
	srv     *httptest.Server
	checked *spectest.Checked

	mu sync.Mutex
	// Knobs.
	runningPolls int  // "running" answers before a run is terminal
	failRuns     bool // runs end in status "error"
	// stateAnswers makes GET /status answer as deployed crews do, which
	// the document does not describe: {"state": "RUNNING" | "SUCCESS" |
	// "FAILED", "result": the output as a string}, without status (what
	// CrewAI's own client, crewai-tools' InvokeCrewAIAutomationTool,
	// reads).
	stateAnswers bool
	// forgetRuns answers POST /kickoff with a kickoff_id but keeps no run
	// for it, as a crew redeployed (or a kickoff expired) right after:
	// GET /status answers the document's 404 for it, or, with
	// stateAnswers, {"state": "NOT FOUND"}, as deployed crews do.
	forgetRuns bool
	// runError, when set, is the ExecutionError's error message (else
	// the document's example).
	runError      string
	kickoffStatus int  // answer POST /kickoff with this error status
	dropKickoff   bool // close the connection instead of answering POST /kickoff
	// kickoffID, when set, is the JSON value POST /kickoff answers as its
	// kickoff_id (an answer the document does not allow).
	kickoffID   json.RawMessage
	statusFails int // answer this many GET /status with 500 first
	// statusStatus, when set, answers the GET /status that follow the
	// statusFails ones with this error status (401, 404).
	statusStatus int
	inputsStatus int // answer GET /inputs with this error status
	// inputsHang makes GET /inputs answer nothing until the client gives
	// up (a crew whose deployment does not answer).
	inputsHang   bool
	resumeStatus int // answer POST /resume with this error status
	polled       chan string
	// Records.
	kickoffs    []json.RawMessage
	kickoffIDs  []string // the kickoff ids answered
	resumes     []json.RawMessage
	auth        []string
	runs        map[string]*mockRun
	polls       map[string]int
	inputsCalls int
}

type mockRun struct {
	remaining int
	fail      bool
}

func newMockAMP(t *testing.T) *mockAMP {
	t.Helper()
	m := &mockAMP{token: "amp-token-" + newUUID(), runs: map[string]*mockRun{}, polls: map[string]int{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /inputs", m.inputs)
	mux.HandleFunc("POST /kickoff", m.kickoff)
	mux.HandleFunc("GET /status/{kickoff_id}", m.status)
	mux.HandleFunc("POST /resume", m.resume)
	m.checked = spectest.Load(t, "crewai/enterprise-api.en.yaml").Handler(t, m.authenticate(mux))
	m.srv = httptest.NewServer(m.checked)
	t.Cleanup(m.srv.Close)
	return m
}

// URL is the crew's base URL (the document's servers have no path).
func (m *mockAMP) URL() string { return m.srv.URL }

var uuidRegexp = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func newUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func errorBody(status int) map[string]any {
	switch status {
	case http.StatusUnauthorized:
		return map[string]any{"error": "Unauthorized", "message": "Invalid or missing bearer token"}
	case http.StatusNotFound:
		return map[string]any{"error": "Not Found", "message": "The requested resource was not found"}
	case http.StatusUnprocessableEntity:
		return map[string]any{"error": "Validation Error", "message": "Missing required inputs",
			"details": map[string]any{"missing_inputs": []string{"topic"}}}
	case http.StatusBadRequest:
		return map[string]any{"error": "Invalid Request", "message": "Execution is not in pending human input state"}
	}
	return map[string]any{"error": "Internal Server Error", "message": "An unexpected error occurred"}
}

func (m *mockAMP) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.auth = append(m.auth, r.Header.Get("Authorization"))
		token := m.token
		m.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+token {
			writeJSON(w, http.StatusUnauthorized, errorBody(http.StatusUnauthorized))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (m *mockAMP) inputs(w http.ResponseWriter, r *http.Request) {
	m.mu.Lock()
	m.inputsCalls++
	status, hang := m.inputsStatus, m.inputsHang
	m.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}
	if status != 0 {
		writeJSON(w, status, errorBody(status))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"inputs": []string{"topic", "audience"}})
}

func (m *mockAMP) kickoff(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	m.mu.Lock()
	m.kickoffs = append(m.kickoffs, body)
	// The document's 422 invalid_inputs_id.
	var req struct {
		Inputs map[string]any `json:"inputs"`
	}
	json.Unmarshal(body, &req)
	if id, ok := req.Inputs["id"]; ok {
		if s, _ := id.(string); !uuidRegexp.MatchString(s) {
			m.mu.Unlock()
			writeJSON(w, http.StatusUnprocessableEntity, map[string]any{"error": "Validation Error",
				"message": fmt.Sprintf("'inputs.id' must be a valid UUID when provided; got '%v'.", id)})
			return
		}
	}
	status, drop, answer := m.kickoffStatus, m.dropKickoff, m.kickoffID
	id := newUUID()
	if status == 0 && !drop && !m.forgetRuns {
		m.runs[id] = &mockRun{remaining: m.runningPolls, fail: m.failRuns}
	}
	m.mu.Unlock()
	if drop {
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	if status != 0 {
		writeJSON(w, status, errorBody(status))
		return
	}
	if answer != nil {
		writeJSON(w, http.StatusOK, map[string]any{"kickoff_id": answer})
		return
	}
	m.mu.Lock()
	m.kickoffIDs = append(m.kickoffIDs, id)
	m.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"kickoff_id": id})
}

// addRun makes a run known to the mock, as if kicked off earlier.
func (m *mockAMP) addRun(running int, fail bool) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := newUUID()
	m.runs[id] = &mockRun{remaining: running, fail: fail}
	return id
}

func (m *mockAMP) status(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("kickoff_id")
	m.mu.Lock()
	m.polls[id]++
	polled := m.polled
	run := m.runs[id]
	fail := m.statusFails > 0
	if fail {
		m.statusFails--
	}
	refuse := 0
	if !fail {
		refuse = m.statusStatus
	}
	var body map[string]any
	switch {
	case fail || refuse != 0:
	case run == nil && m.stateAnswers:
		// A state the document does not list; Microsoft Semantic
		// Kernel's client of this API (CrewAIEnterpriseKickoffState)
		// stops waiting on it.
		body = map[string]any{"state": "NOT FOUND", "result": nil}
	case run == nil:
	case m.stateAnswers && run.remaining > 0:
		run.remaining--
		body = map[string]any{"state": "RUNNING", "result": nil}
	case m.stateAnswers && run.fail:
		body = map[string]any{"state": "FAILED", "result": "Task execution failed: Invalid API key for external service"}
	case m.stateAnswers:
		body = map[string]any{"state": "SUCCESS", "result": "Comprehensive report on " + id}
	case run.remaining > 0:
		run.remaining--
		body = map[string]any{"status": "running", "current_task": "research_task",
			"progress": map[string]any{"completed_tasks": 1, "total_tasks": 3}}
	case run.fail:
		msg := m.runError
		if msg == "" {
			msg = "Task execution failed: Invalid API key for external service"
		}
		body = map[string]any{"status": "error", "error": msg, "execution_time": 23.1}
	default:
		body = map[string]any{"status": "completed", "execution_time": 108.5, "result": map[string]any{
			"output": "Comprehensive report on " + id,
			"tasks": []map[string]any{
				{"task_id": "research_task", "output": "Research findings", "agent": "Researcher", "execution_time": 45.2},
				{"task_id": "writing_task", "output": "The report", "agent": "Writer", "execution_time": 62.8},
			}}}
	}
	m.mu.Unlock()
	if polled != nil {
		select {
		case polled <- id:
		default:
		}
	}
	switch {
	case fail:
		writeJSON(w, http.StatusInternalServerError, errorBody(http.StatusInternalServerError))
	case refuse != 0:
		writeJSON(w, refuse, errorBody(refuse))
	case body == nil:
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "Execution not found", "message": "No execution found with ID: " + id})
	default:
		writeJSON(w, http.StatusOK, body)
	}
}

func (m *mockAMP) resume(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		ExecutionID string `json:"execution_id"`
		IsApprove   bool   `json:"is_approve"`
	}
	json.Unmarshal(body, &req)
	m.mu.Lock()
	m.resumes = append(m.resumes, body)
	status := m.resumeStatus
	_, known := m.runs[req.ExecutionID]
	m.mu.Unlock()
	switch {
	case status != 0:
		writeJSON(w, status, errorBody(status))
	case !known:
		writeJSON(w, http.StatusNotFound, map[string]any{"error": "Not Found", "message": "Execution ID not found"})
	case req.IsApprove:
		writeJSON(w, http.StatusOK, map[string]any{"status": "resumed", "message": "Execution resumed successfully"})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": "retrying", "message": "Task will be retried with your feedback"})
	}
}

func (m *mockAMP) set(f func(m *mockAMP)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(m)
}

func (m *mockAMP) kickoffCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.kickoffs)
}

func (m *mockAMP) pollCount(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.polls[id]
}

func (m *mockAMP) kickoffBodies() []json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]json.RawMessage(nil), m.kickoffs...)
}

func (m *mockAMP) resumeBodies() []json.RawMessage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]json.RawMessage(nil), m.resumes...)
}

func (m *mockAMP) auths() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.auth...)
}

func (m *mockAMP) answeredKickoffs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.kickoffIDs...)
}
