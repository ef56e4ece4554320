package hermes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
)

// received is one request the mock provider got.
type received struct {
	Method, Path, Query string
	Header              http.Header
	Body                string
}

// mockHermes is a Hermes Agent API server as the "API Server" page
// (products/internal/spectest/specs/hermes-agent/api-server.md) describes
// it; each route names the section it follows. Every route but the
// public liveness probe (§ GET /health: "The public /health route remains
// a cheap liveness probe", also at /v1/health) requires Authorization:
// Bearer <key> (§ Authentication: "API_SERVER_KEY is required for every
// deployment"; 401 otherwise) and unknown paths are 404.
type mockHermes struct {
	t   testing.TB
	key string
	// prefix is the multi-profile route prefix (§ Multi-profile routing,
	// /p/<profile>/...) the server answers under, "" for none.
	prefix string
	srv    *httptest.Server

	mu   sync.Mutex
	reqs []received
	// fail answers "METHOD path" with this status and an OpenAI-style
	// error body.
	fail map[string]int
	// drop closes the connection of "METHOD path" without an answer.
	drop map[string]bool
	// times, when set for "METHOD path", is how many more requests its
	// fail or drop applies to (an outage that ends); then they are
	// answered normally.
	times map[string]int
	// stream is the SSE body of a streaming chat completion.
	stream string
	// chatAnswer, when set, is the 200 body of a non-streaming chat
	// completion (else the page's Response example).
	chatAnswer string
	// runStatus is what GET /v1/runs/{run_id} reports until a stop.
	runStatus string
	// idemKeys are the Idempotency-Keys POST /v1/runs has seen.
	idemKeys map[string]idemEntry
	// runs counts the runs POST /v1/runs started.
	runs int
	// startAnswer, when set, is POST /v1/runs' 202 body.
	startAnswer string
	// polled is signalled on every GET /v1/runs/{run_id}.
	polled chan struct{}
	// runEvents is the SSE body of GET /v1/runs/{run_id}/events.
	runEvents string
	// runEventsOpen keeps the run events stream open after its body,
	// as a live run's is, until the request ends.
	runEventsOpen bool
	// sessionStream is the SSE body of POST /api/sessions/{id}/chat/stream.
	sessionStream string
}

// idemEntry is the run an Idempotency-Key started and the body it came
// with.
type idemEntry struct{ runID, body string }

func newMockHermes(t testing.TB, key, prefix string) *mockHermes {
	m := &mockHermes{t: t, key: key, prefix: prefix, fail: map[string]int{}, drop: map[string]bool{}, times: map[string]int{},
		runStatus: "running", idemKeys: map[string]idemEntry{}, polled: make(chan struct{}, 1000)}
	mux := http.NewServeMux()
	// § GET /health: {"status": "ok"}, also at GET /v1/health; public.
	health := func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"status":"ok"}`)
	}
	mux.HandleFunc("GET /health", health)
	mux.HandleFunc("GET /v1/health", health)
	// § GET /v1/models: the agent as the one model (OpenAI list format).
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"object":"list","data":[{"id":"hermes-agent","object":"model","created":1710000000,"owned_by":"hermes"}]}`)
	})
	// § POST /v1/chat/completions: the Response example; with
	// "stream": true, SSE chat.completion.chunk events (§ Streaming).
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Stream bool `json:"stream"`
		}
		raw, _ := io.ReadAll(r.Body)
		if json.Unmarshal(raw, &body) != nil {
			writeJSON(w, 400, `{"error":{"message":"invalid JSON","type":"invalid_request_error"}}`)
			return
		}
		if !bodyFields(w, raw, "messages", "model", "messages", "stream", "temperature", "max_tokens", "provider", "model_options") {
			return
		}
		if body.Stream {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			m.mu.Lock()
			s := m.stream
			m.mu.Unlock()
			io.WriteString(w, s)
			return
		}
		m.mu.Lock()
		answer := m.chatAnswer
		m.mu.Unlock()
		if answer != "" {
			writeJSON(w, 200, answer)
			return
		}
		writeJSON(w, 200, `{"id":"chatcmpl-abc123","object":"chat.completion","created":1710000000,"model":"hermes-agent",
			"choices":[{"index":0,"message":{"role":"assistant","content":"Here's a fibonacci function..."},"finish_reason":"stop"}],
			"usage":{"prompt_tokens":50,"completion_tokens":200,"total_tokens":250}}`)
	})
	// § POST /v1/responses: the Response example. A named conversation is
	// used "instead of" previous_response_id (§ Named conversations): both
	// together are refused.
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		if !bodyFields(w, raw, "input", "model", "input", "instructions", "previous_response_id", "conversation", "store", "provider", "model_options") {
			return
		}
		var body struct {
			Conversation       string `json:"conversation"`
			PreviousResponseID string `json:"previous_response_id"`
		}
		if json.Unmarshal(raw, &body) == nil && body.Conversation != "" && body.PreviousResponseID != "" {
			writeJSON(w, 400, `{"error":{"message":"Cannot use both 'conversation' and 'previous_response_id'","type":"invalid_request_error"}}`)
			return
		}
		writeJSON(w, 200, respExample)
	})
	// § GET /v1/responses/{id}: a stored response; others are unknown.
	mux.HandleFunc("GET /v1/responses/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "resp_abc123" {
			writeJSON(w, 404, `{"error":{"message":"Response not found","type":"invalid_request_error"}}`)
			return
		}
		writeJSON(w, 200, respExample)
	})
	// § DELETE /v1/responses/{id} (OpenAI's deletion object).
	mux.HandleFunc("DELETE /v1/responses/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"id":"`+r.PathValue("id")+`","object":"response","deleted":true}`)
	})
	// § POST /v1/runs: {"run_id", "status": "started"}. An
	// Idempotency-Key (1–255 visible ASCII characters, else 400) already
	// seen with the same body returns the original run with 202 and
	// Idempotency-Replayed: true; with another body, 409
	// idempotency_key_conflict. Keys are isolated per credential, and the
	// mock has one. The first run is run_abc123, the next run_2, run_3...
	mux.HandleFunc("POST /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		k := r.Header.Get("Idempotency-Key")
		raw, _ := io.ReadAll(r.Body)
		for i := 0; i < len(k); i++ {
			if len(k) > 255 || k[i] <= 0x20 || k[i] >= 0x7f {
				writeJSON(w, 400, `{"error":{"message":"Idempotency-Key must be 1-255 visible ASCII characters","type":"invalid_request_error"}}`)
				return
			}
		}
		// § POST /v1/runs: "a simple input string and optional session_id,
		// instructions, conversation_history, or previous_response_id"
		// (and § Per-request model selection's model, provider and
		// model_options).
		if !bodyFields(w, raw, "input", "input", "session_id", "instructions", "conversation_history", "previous_response_id", "model", "provider", "model_options") {
			return
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.startAnswer != "" {
			writeJSON(w, 202, m.startAnswer)
			return
		}
		if k != "" {
			if prev, ok := m.idemKeys[k]; ok {
				if prev.body != string(raw) {
					writeJSON(w, 409, `{"error":{"message":"Idempotency-Key reused with a different payload","type":"invalid_request_error","code":"idempotency_key_conflict"}}`)
					return
				}
				w.Header().Set("Idempotency-Replayed", "true")
				writeJSON(w, 202, `{"run_id":"`+prev.runID+`","status":"started"}`)
				return
			}
		}
		m.runs++
		id := "run_abc123"
		if m.runs > 1 {
			id = fmt.Sprintf("run_%d", m.runs)
		}
		if k != "" {
			m.idemKeys[k] = idemEntry{runID: id, body: string(raw)}
		}
		writeJSON(w, 202, `{"run_id":"`+id+`","status":"started"}`)
	})
	// § GET /v1/runs/{run_id}: the hermes.run object.
	mux.HandleFunc("GET /v1/runs/{id}", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		st := m.runStatus
		m.mu.Unlock()
		m.polled <- struct{}{}
		writeJSON(w, 200, `{"object":"hermes.run","run_id":"`+r.PathValue("id")+`","status":"`+st+`","session_id":"space-session","model":"hermes-agent","output":"Done.","usage":{"input_tokens":50,"output_tokens":200,"total_tokens":250}}`)
	})
	// § POST /v1/runs/{run_id}/stop: {"status": "stopping"}; the run then
	// settles as cancelled.
	mux.HandleFunc("POST /v1/runs/{id}/stop", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.runStatus = "cancelled"
		m.mu.Unlock()
		writeJSON(w, 200, `{"status":"stopping"}`)
	})
	// § Sessions API table. The page gives paths, not bodies: the mock
	// answers plain JSON objects.
	mux.HandleFunc("GET /api/sessions", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"sessions":[{"id":"space-session","title":"t"}],"limit":20,"offset":0}`)
	})
	mux.HandleFunc("POST /api/sessions", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 201, `{"id":"sess_new","title":null}`)
	})
	mux.HandleFunc("GET /api/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"id":"`+r.PathValue("id")+`","title":"t"}`)
	})
	mux.HandleFunc("DELETE /api/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"deleted":true}`)
	})
	m.extendedRoutes(mux)
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.mu.Lock()
		m.reqs = append(m.reqs, received{Method: r.Method, Path: r.URL.EscapedPath(), Query: r.URL.RawQuery, Header: r.Header.Clone(), Body: string(body)})
		k := r.Method + " " + r.URL.EscapedPath()
		status, drop := m.fail[k], m.drop[k]
		if n, ok := m.times[k]; ok && (status != 0 || drop) {
			if n <= 1 {
				delete(m.times, k)
				delete(m.fail, k)
				delete(m.drop, k)
			} else {
				m.times[k] = n - 1
			}
		}
		key := m.key
		m.mu.Unlock()
		public := r.Method == http.MethodGet && (r.URL.Path == m.prefix+"/health" || r.URL.Path == m.prefix+"/v1/health")
		if !public && r.Header.Get("Authorization") != "Bearer "+key {
			w.Header().Set("WWW-Authenticate", "Bearer")
			writeJSON(w, 401, `{"error":{"message":"Invalid API key","type":"invalid_request_error","code":"invalid_api_key"}}`)
			return
		}
		if drop {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		if status != 0 {
			writeJSON(w, status, `{"error":{"message":"injected failure","type":"server_error"}}`)
			return
		}
		rest, ok := strings.CutPrefix(r.URL.Path, m.prefix)
		if !ok {
			http.NotFound(w, r)
			return
		}
		r.URL.Path, r.URL.RawPath = rest, ""
		r.Body = io.NopCloser(bytes.NewReader(body))
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

const respExample = `{"id":"resp_abc123","object":"response","status":"completed","model":"hermes-agent",
  "output":[{"type":"function_call","status":"completed","name":"terminal","arguments":"{\"command\": \"ls\"}","call_id":"call_1"},
    {"type":"function_call_output","status":"completed","call_id":"call_1","output":"README.md src/ tests/"},
    {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Your project has..."}]}],
  "usage":{"input_tokens":50,"output_tokens":200,"total_tokens":250}}`

func writeJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, body)
}

// of returns the requests made for an action (by X-AIP-Correlation-Id).
func (m *mockHermes) of(actionID string) []received {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []received
	for _, r := range m.reqs {
		if r.Header.Get(CorrelationHeader) == actionID {
			out = append(out, r)
		}
	}
	return out
}

func (m *mockHermes) setFail(method, path string, status int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail[method+" "+path] = status
}

// setFailTimes answers the next n requests "METHOD path" with status (0:
// closes their connections without an answer), then normally.
func (m *mockHermes) setFailTimes(method, path string, status, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if status == 0 {
		m.drop[method+" "+path] = true
	} else {
		m.fail[method+" "+path] = status
	}
	m.times[method+" "+path] = n
}

func (m *mockHermes) setDrop(method, path string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.drop[method+" "+path] = true
}

func (m *mockHermes) setStream(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.stream = s
}

// sse formats SSE events (each a data line, optionally named).
func sse(events ...string) string {
	var b strings.Builder
	for _, e := range events {
		if name, data, ok := strings.Cut(e, "\x00"); ok {
			b.WriteString("event: " + name + "\n")
			e = data
		}
		b.WriteString("data: " + e + "\n\n")
	}
	return b.String()
}

func (m *mockHermes) setRunEvents(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runEvents = s
}

func (m *mockHermes) setRunEventsOpen(open bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.runEventsOpen = open
}

func (m *mockHermes) setSessionStream(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.sessionStream = s
}

// jsonBody decodes r's body as a JSON object whose members are all in
// allowed, each of which must be a non-empty string; it answers 400 (and
// returns nil) otherwise. The page names these bodies' fields without a
// schema; Hermes refuses what it does not accept with 400.
func jsonBody(w http.ResponseWriter, r *http.Request, allowed ...string) map[string]any {
	var body map[string]any
	if r.Header.Get("Content-Type") != "application/json" || json.NewDecoder(r.Body).Decode(&body) != nil || body == nil {
		writeJSON(w, 400, `{"error":"body must be a JSON object"}`)
		return nil
	}
	for k, v := range body {
		if s, ok := v.(string); !ok || s == "" || !slices.Contains(allowed, k) {
			writeJSON(w, 400, `{"error":"invalid field `+k+`"}`)
			return nil
		}
	}
	return body
}

// bodyFields answers 400 (and returns false) unless raw is a JSON object
// whose members are all among allowed and whose member required is
// present and not empty: the fields the page (and the OpenAI format it
// follows) names for the route, as Hermes refuses a request without its
// required field.
func bodyFields(w http.ResponseWriter, raw []byte, required string, allowed ...string) bool {
	var body map[string]json.RawMessage
	if json.Unmarshal(raw, &body) != nil || body == nil {
		writeJSON(w, 400, `{"error":{"message":"body must be a JSON object","type":"invalid_request_error"}}`)
		return false
	}
	for k := range body {
		if !slices.Contains(allowed, k) {
			writeJSON(w, 400, `{"error":{"message":"unknown field `+k+`","type":"invalid_request_error"}}`)
			return false
		}
	}
	if v := strings.TrimSpace(string(body[required])); v == "" || v == "null" || v == `""` || v == "[]" {
		writeJSON(w, 400, `{"error":{"message":"`+required+` is required","type":"invalid_request_error"}}`)
		return false
	}
	return true
}

// noBody answers 400 when r carries a body: the page gives none for the
// jobs' pause, resume and run.
func noBody(w http.ResponseWriter, r *http.Request) bool {
	if b, _ := io.ReadAll(r.Body); len(b) != 0 {
		writeJSON(w, 400, `{"error":"unexpected body"}`)
		return false
	}
	return true
}

func sseAnswer(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	io.WriteString(w, body)
}

// extendedRoutes are the routes of the detailed health, capabilities,
// skills and toolsets discovery, run events, the Sessions API's patch,
// messages, fork and chat, and the Jobs API. The page gives paths and,
// for some, request fields; where it gives no answer shape the mock
// answers a plain JSON object.
func (m *mockHermes) extendedRoutes(mux *http.ServeMux) {
	// § GET /health/detailed: top-level status and readiness.checks; a
	// degraded result is still 200.
	mux.HandleFunc("GET /health/detailed", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"status":"degraded","readiness":{"checks":{"state_db":{"status":"ok"},"disk":{"status":"degraded"}}}}`)
	})
	// § GET /v1/capabilities: the example.
	mux.HandleFunc("GET /v1/capabilities", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, capabilitiesExample)
	})
	// § Skills and toolsets discovery: the examples' arrays.
	mux.HandleFunc("GET /v1/skills", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `[{"name":"github-pr-workflow","description":"Open and review PRs","category":"github"}]`)
	})
	mux.HandleFunc("GET /v1/toolsets", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `[{"name":"core","label":"Core","description":"File tools","enabled":true,"configured":true,"tools":["read_file","write_file"]}]`)
	})
	// § GET /v1/runs/{run_id}/events: an SSE stream; another profile's or
	// an unknown run is 404.
	mux.HandleFunc("GET /v1/runs/{id}/events", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "run_abc123" {
			writeJSON(w, 404, `{"error":{"message":"Run not found","type":"invalid_request_error"}}`)
			return
		}
		m.mu.Lock()
		s, open := m.runEvents, m.runEventsOpen
		m.mu.Unlock()
		sseAnswer(w, s)
		if open {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}
	})
	// § Sessions API: PATCH updates title or end_reason.
	mux.HandleFunc("PATCH /api/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		body := jsonBody(w, r, "title", "end_reason")
		if body == nil {
			return
		}
		if len(body) == 0 {
			writeJSON(w, 400, `{"error":"nothing to update"}`)
			return
		}
		out, _ := json.Marshal(map[string]any{"id": r.PathValue("id"), "title": body["title"], "end_reason": body["end_reason"]})
		writeJSON(w, 200, string(out))
	})
	mux.HandleFunc("GET /api/sessions/{id}/messages", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"session_id":"`+r.PathValue("id")+`","messages":[{"role":"user","content":"Hello"},{"role":"assistant","content":"Hi"}]}`)
	})
	// § fork: the example's body {"title": ...}.
	mux.HandleFunc("POST /api/sessions/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		body := jsonBody(w, r, "title")
		if body == nil {
			return
		}
		out, _ := json.Marshal(map[string]any{"id": "sess_fork", "parent_session_id": r.PathValue("id"), "title": body["title"]})
		writeJSON(w, 201, string(out))
	})
	// § chat and chat/stream: the example's body {"input": ...}, with
	// the per-request model (§ Per-request model selection).
	chatBody := func(w http.ResponseWriter, r *http.Request) bool {
		body := jsonBody(w, r, "input", "model")
		if body != nil && body["input"] == nil {
			writeJSON(w, 400, `{"error":"input is required"}`)
			return false
		}
		return body != nil
	}
	mux.HandleFunc("POST /api/sessions/{id}/chat", func(w http.ResponseWriter, r *http.Request) {
		if chatBody(w, r) {
			writeJSON(w, 200, `{"session_id":"`+r.PathValue("id")+`","output":"Two files changed."}`)
		}
	})
	mux.HandleFunc("POST /api/sessions/{id}/chat/stream", func(w http.ResponseWriter, r *http.Request) {
		if chatBody(w, r) {
			m.mu.Lock()
			s := m.sessionStream
			m.mu.Unlock()
			sseAnswer(w, s)
		}
	})
	// § Jobs API.
	job := func(id, state string) string {
		return `{"id":"` + id + `","prompt":"Summarise the inbox","schedule":"0 9 * * *","state":"` + state + `"}`
	}
	known := func(w http.ResponseWriter, r *http.Request) bool {
		if r.PathValue("id") != "job_1" {
			writeJSON(w, 404, `{"error":"Job not found"}`)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /api/jobs", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, `{"jobs":[`+job("job_1", "scheduled")+`]}`)
	})
	mux.HandleFunc("GET /api/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if known(w, r) {
			writeJSON(w, 200, `{"job":`+job("job_1", "scheduled")+`}`)
		}
	})
	// PATCH: "prompt, schedule, etc."; partial updates are merged.
	mux.HandleFunc("PATCH /api/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !known(w, r) {
			return
		}
		body := jsonBody(w, r, "prompt", "schedule")
		if body == nil {
			return
		}
		j := map[string]any{"id": "job_1", "prompt": "Summarise the inbox", "schedule": "0 9 * * *"}
		maps.Copy(j, body)
		out, _ := json.Marshal(map[string]any{"job": j})
		writeJSON(w, 200, string(out))
	})
	mux.HandleFunc("DELETE /api/jobs/{id}", func(w http.ResponseWriter, r *http.Request) {
		if known(w, r) {
			writeJSON(w, 200, `{"ok":true}`)
		}
	})
	for action, state := range map[string]string{"pause": "paused", "resume": "scheduled", "run": "running"} {
		mux.HandleFunc("POST /api/jobs/{id}/"+action, func(w http.ResponseWriter, r *http.Request) {
			if known(w, r) && noBody(w, r) {
				writeJSON(w, 200, `{"job":`+job("job_1", state)+`}`)
			}
		})
	}
}

const capabilitiesExample = `{"object":"hermes.api_server.capabilities","platform":"hermes-agent","model":"hermes-agent",
  "auth":{"type":"bearer","required":true},
  "features":{"chat_completions":true,"chat_completions_streaming":true,"responses_api":true,"responses_streaming":true,
    "reasoning_streaming":false,"run_submission":true,"run_status":true,"run_events_sse":true,"run_stop":true}}`
