package hermes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	keyMain  = "secret-one"
	keyAlice = "secret-two"
)

// fixture is a host running the connector in front of two mock servers:
// endpoint "Main" (capability prefix cap:hermes_agent:main) and endpoint
// "alice" behind the /p/alice profile prefix with its own key.
type fixture struct {
	main, alice *mockHermes
	conn        *Connector
	*hostsdktest.Fixture
}

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

func endpointsFile(t testing.TB, mainURL, aliceURL string) string {
	t.Helper()
	dir := t.TempDir()
	k1 := writeFile(t, dir, "main.key", keyMain+"\n", 0o600)
	k2 := writeFile(t, dir, "alice.key", keyAlice, 0o600)
	list := []map[string]string{
		{"id": "Main", "base_url": mainURL, "api_key_file": k1, "display_name": "Main Hermes"},
		{"id": "alice", "base_url": aliceURL, "api_key_file": k2},
	}
	raw, _ := json.Marshal(list)
	return writeFile(t, dir, "endpoints.json", string(raw), 0o644)
}

func newFixture(t *testing.T) *fixture { t.Helper(); return newFixtureWith(t, 0) }

// newFixtureWith is newFixture with --hermes-max-response-bytes (0: the
// default).
func newFixtureWith(t *testing.T, maxResponseBytes int64) *fixture {
	t.Helper()
	f := &fixture{main: newMockHermes(t, keyMain, ""), alice: newMockHermes(t, keyAlice, "/p/alice")}
	conn, err := New(Config{EndpointsFile: endpointsFile(t, f.main.srv.URL, f.alice.srv.URL+"/p/alice/"),
		PollInterval: 2 * time.Millisecond, MaxResponseBytes: maxResponseBytes})
	if err != nil {
		t.Fatal(err)
	}
	f.conn = conn
	f.Fixture = hostsdktest.Start(t, conn, nil)
	return f
}

func completed(t *testing.T, resp *hostsdktest.Response) map[string]any {
	t.Helper()
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	if res.Status != aip.ResultCompleted {
		t.Fatalf("result %s: %+v", res.Status, res.Error)
	}
	var out map[string]any
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatalf("output %s: %v", res.Output, err)
	}
	return out
}

func jsonEqual(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: got %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: want %q is not JSON: %v", what, want, err)
	}
	if d := cmp.Diff(w, g); d != "" {
		t.Errorf("%s (-want +got):\n%s", what, d)
	}
}

func TestManifest(t *testing.T) {
	conn, err := New(Config{EndpointsFile: endpointsFile(t, "http://127.0.0.1:8642", "https://hermes.example.com/p/alice")})
	if err != nil {
		t.Fatal(err)
	}
	m, err := conn.Manifest(context.Background(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Agent.ID != AgentID || m.Agent.Kind != aip.PrincipalAgent {
		t.Errorf("agent %+v", m.Agent)
	}
	if got, want := len(m.Capabilities), 2*len(operations); got != want {
		t.Fatalf("%d capabilities, want %d", got, want)
	}
	naming := regexp.MustCompile(`^cap:hermes_agent:(main|alice):(health|models|chat|responses|response_get|response_delete|run_start|run_status|run_stop|sessions_list|session_create|session_get|session_delete|` +
		`health_detailed|capabilities|skills|toolsets|run_events|session_patch|session_messages|session_fork|session_chat|` +
		`jobs_list|job_get|job_update|job_delete|job_pause|job_resume|job_run)$`)
	for _, c := range m.Capabilities {
		if !naming.MatchString(c.ID) {
			t.Errorf("capability ID %q does not follow cap:hermes_agent:<endpoint>:<operation>", c.ID)
		}
		var schema struct {
			Type                 string          `json:"type"`
			Required             []string        `json:"required"`
			AdditionalProperties *bool           `json:"additionalProperties"`
			Properties           json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(c.InputSchema, &schema); err != nil {
			t.Fatalf("%s: %v", c.ID, err)
		}
		if schema.Type != "object" || schema.Required == nil || schema.AdditionalProperties == nil || *schema.AdditionalProperties || schema.Properties == nil {
			t.Errorf("%s: input schema is not strict: %s", c.ID, c.InputSchema)
		}
		if c.Description == "" || c.Risk == "" || c.Contract == nil || c.RequiresHumanApproval != nil {
			t.Errorf("%s: description %q risk %q contract %v approval %v", c.ID, c.Description, c.Risk, c.Contract, c.RequiresHumanApproval)
		}
		if strings.Contains(string(mustJSON(t, c)), keyMain) {
			t.Errorf("%s carries the API key", c.ID)
		}
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatalf("BindManifest: %v", err)
	}
	c, _ := m.Capability("cap:hermes_agent:main:chat")
	if c == nil || !c.Contract.Execution.SupportsStreaming || c.Name != "Chat completion (Main Hermes)" {
		t.Errorf("chat capability %+v", c)
	}
	for _, tc := range []struct {
		op        string
		risk      aip.Risk
		streaming bool
		mutation  bool
	}{
		{OpRunEvents, aip.RiskLow, true, false},
		{OpSessionChat, aip.RiskHigh, true, true},
		{OpSessionPatch, aip.RiskMedium, false, true},
		{OpJobsList, aip.RiskLow, false, false},
		{OpJobDelete, aip.RiskHigh, false, true},
		{OpSessionDelete, aip.RiskHigh, false, true},
		{OpResponseDelete, aip.RiskHigh, false, true},
		{OpJobRun, aip.RiskHigh, false, true},
		{OpJobPause, aip.RiskMedium, false, true},
	} {
		c, _ := m.Capability(CapabilityID("alice", tc.op))
		if c == nil {
			t.Errorf("%s: no capability", tc.op)
			continue
		}
		ex, idem := c.Contract.Execution, c.Contract.Idempotency.Requirement
		if c.Risk != tc.risk || ex.SupportsStreaming != tc.streaming || (idem == aip.IdempotencyRequired) != tc.mutation ||
			(ex.RetrySafety == aip.RetrySafe) == tc.mutation {
			t.Errorf("%s: risk %s streaming %v idempotency %s retry %s", tc.op, c.Risk, ex.SupportsStreaming, idem, ex.RetrySafety)
		}
	}
}

// TestEndpointLimit: every endpoint has every operation and a manifest
// holds at most hostsdk.MaxCapabilities capabilities, so a host fronts at
// most MaxEndpointsPerHost endpoints (17 with 29 operations, as doc.go
// says): that many make a manifest the host binds, one more is refused.
func TestEndpointLimit(t *testing.T) {
	if got, want := len(operations), 29; got != want {
		t.Fatalf("%d operations; doc.go and this test say %d", got, want)
	}
	if MaxEndpointsPerHost != 17 || MaxEndpointsPerHost*len(operations) > hostsdk.MaxCapabilities ||
		(MaxEndpointsPerHost+1)*len(operations) <= hostsdk.MaxCapabilities {
		t.Fatalf("MaxEndpointsPerHost = %d with %d operations and %d capabilities per manifest", MaxEndpointsPerHost, len(operations), hostsdk.MaxCapabilities)
	}
	list := func(n int) string {
		var eps []string
		for i := range n {
			eps = append(eps, fmt.Sprintf(`{"id":"e%d","base_url":"https://h%d.example.com"}`, i, i))
		}
		return writeFile(t, t.TempDir(), "endpoints.json", "["+strings.Join(eps, ",")+"]", 0o644)
	}
	conn, err := New(Config{EndpointsFile: list(MaxEndpointsPerHost)})
	if err != nil {
		t.Fatalf("%d endpoints: %v", MaxEndpointsPerHost, err)
	}
	m, err := conn.Manifest(context.Background(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Fatalf("BindManifest of %d capabilities: %v", len(m.Capabilities), err)
	}
	_, err = New(Config{EndpointsFile: list(MaxEndpointsPerHost + 1)})
	if err == nil || !strings.Contains(err.Error(), "--hermes-endpoints-file") || !strings.Contains(err.Error(), "at most 17 endpoints") {
		t.Fatalf("%d endpoints: %v", MaxEndpointsPerHost+1, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOperations runs every capability through a real host and checks
// the exact request the mock received and the output.
func TestOperations(t *testing.T) {
	f := newFixture(t)
	// Both framings the adapter reads: a named event, and an unnamed one
	// whose JSON data names it.
	f.main.setRunEvents(sse("message.delta\x00"+`{"delta":"Do"}`, "reasoning.delta\x00"+`{"delta":"hmm"}`,
		`{"event":"run.completed","output":"Done."}`))
	cases := []struct {
		cap, input          string
		method, path, query string
		body                string // "" for no body
		idempotent          bool   // Idempotency-Key sent
		check               func(t *testing.T, out map[string]any)
		mock                func(f *fixture) *mockHermes
		wantAuth            string
		// checkRaw is the whole output, for outputs that are not objects.
		checkRaw string
	}{
		{cap: "main:health", input: `{}`, method: "GET", path: "/health",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "status", "ok") }},
		{cap: "main:models", input: `{}`, method: "GET", path: "/v1/models",
			check: func(t *testing.T, out map[string]any) {
				if d := out["data"].([]any); d[0].(map[string]any)["id"] != "hermes-agent" {
					t.Errorf("models %v", out)
				}
			}},
		{cap: "main:chat", input: `{"messages":[{"role":"system","content":"You are a Python expert."},{"role":"user","content":"Write a fibonacci function"}]}`,
			method: "POST", path: "/v1/chat/completions", idempotent: true,
			body: `{"model":"hermes-agent","messages":[{"role":"system","content":"You are a Python expert."},{"role":"user","content":"Write a fibonacci function"}],"stream":false}`,
			check: func(t *testing.T, out map[string]any) {
				jsonEqual(t, "chat output", string(mustJSON(t, out)), `{"id":"chatcmpl-abc123","model":"hermes-agent",
					"message":{"role":"assistant","content":"Here's a fibonacci function..."},"finish_reason":"stop",
					"usage":{"prompt_tokens":50,"completion_tokens":200,"total_tokens":250}}`)
			}},
		{cap: "main:chat", input: `{"messages":[{"role":"user","content":"Hi"}],"model":"MiniMax-M3","temperature":0.5,"max_tokens":64}`,
			method: "POST", path: "/v1/chat/completions", idempotent: true,
			body: `{"model":"MiniMax-M3","messages":[{"role":"user","content":"Hi"}],"stream":false,"temperature":0.5,"max_tokens":64}`},
		{cap: "main:responses", input: `{"input":"What files are in my project?","instructions":"You are a helpful coding assistant.","store":true}`,
			method: "POST", path: "/v1/responses", idempotent: true,
			body:  `{"model":"hermes-agent","input":"What files are in my project?","instructions":"You are a helpful coding assistant.","store":true}`,
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "id", "resp_abc123") }},
		{cap: "main:responses", input: `{"input":"Now show me the README","previous_response_id":"resp_abc123"}`,
			method: "POST", path: "/v1/responses", idempotent: true,
			body: `{"model":"hermes-agent","input":"Now show me the README","previous_response_id":"resp_abc123"}`},
		{cap: "main:responses", input: `{"input":"Run the tests","conversation":"my-project"}`,
			method: "POST", path: "/v1/responses", idempotent: true,
			body: `{"model":"hermes-agent","input":"Run the tests","conversation":"my-project"}`},
		{cap: "main:response_get", input: `{"response_id":"resp_abc123"}`, method: "GET", path: "/v1/responses/resp_abc123",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "status", "completed") }},
		{cap: "main:response_delete", input: `{"response_id":"resp_abc123"}`, method: "DELETE", path: "/v1/responses/resp_abc123",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "deleted", true) }},
		{cap: "main:run_start", input: `{"input":"Run the tests","session_id":"space-session","instructions":"Be brief.","model":"hermes-agent"}`,
			method: "POST", path: "/v1/runs", idempotent: true,
			body: `{"input":"Run the tests","session_id":"space-session","instructions":"Be brief.","model":"hermes-agent"}`,
			check: func(t *testing.T, out map[string]any) {
				jsonEqual(t, "run_start output", string(mustJSON(t, out)), `{"run_id":"run_abc123","status":"started"}`)
			}},
		{cap: "main:run_status", input: `{"run_id":"run_abc123"}`, method: "GET", path: "/v1/runs/run_abc123",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "object", "hermes.run") }},
		{cap: "main:run_stop", input: `{"run_id":"run_abc123"}`, method: "POST", path: "/v1/runs/run_abc123/stop",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "status", "stopping") }},
		{cap: "main:sessions_list", input: `{"limit":5,"offset":10,"source":"api server","include_children":true}`,
			method: "GET", path: "/api/sessions", query: "include_children=true&limit=5&offset=10&source=api+server",
			check: func(t *testing.T, out map[string]any) {
				if _, ok := out["sessions"]; !ok {
					t.Errorf("sessions_list output %v", out)
				}
			}},
		{cap: "main:sessions_list", input: `{}`, method: "GET", path: "/api/sessions"},
		{cap: "main:session_create", input: `{}`, method: "POST", path: "/api/sessions", body: `{}`,
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "id", "sess_new") }},
		{cap: "main:session_get", input: `{"session_id":"20260101_1200:ab.c"}`, method: "GET", path: "/api/sessions/20260101_1200:ab.c",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "id", "20260101_1200:ab.c") }},
		{cap: "main:session_delete", input: `{"session_id":"space-session"}`, method: "DELETE", path: "/api/sessions/space-session",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "deleted", true) }},
		{cap: "main:health_detailed", input: `{}`, method: "GET", path: "/health/detailed",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "status", "degraded") }},
		{cap: "main:capabilities", input: `{}`, method: "GET", path: "/v1/capabilities",
			check: func(t *testing.T, out map[string]any) {
				jsonEqual(t, "capabilities output", string(mustJSON(t, out)), capabilitiesExample)
			}},
		{cap: "main:skills", input: `{}`, method: "GET", path: "/v1/skills",
			checkRaw: `[{"name":"github-pr-workflow","description":"Open and review PRs","category":"github"}]`},
		{cap: "main:toolsets", input: `{}`, method: "GET", path: "/v1/toolsets",
			checkRaw: `[{"name":"core","label":"Core","description":"File tools","enabled":true,"configured":true,"tools":["read_file","write_file"]}]`},
		{cap: "main:run_events", input: `{"run_id":"run_abc123"}`, method: "GET", path: "/v1/runs/run_abc123/events",
			check: func(t *testing.T, out map[string]any) {
				jsonEqual(t, "run_events output", string(mustJSON(t, out)), `{"run_id":"run_abc123","count":3,"events":[
					{"event":"message.delta","data":{"delta":"Do"}},
					{"event":"reasoning.delta","data":{"delta":"hmm"}},
					{"event":"run.completed","data":{"event":"run.completed","output":"Done."}}]}`)
			}},
		{cap: "main:session_patch", input: `{"session_id":"space-session","title":"Release notes"}`,
			method: "PATCH", path: "/api/sessions/space-session", body: `{"title":"Release notes"}`,
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "title", "Release notes") }},
		{cap: "main:session_patch", input: `{"session_id":"space-session","title":"T","end_reason":"user_ended"}`,
			method: "PATCH", path: "/api/sessions/space-session", body: `{"title":"T","end_reason":"user_ended"}`,
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "end_reason", "user_ended") }},
		{cap: "main:session_messages", input: `{"session_id":"space-session"}`, method: "GET", path: "/api/sessions/space-session/messages",
			check: func(t *testing.T, out map[string]any) {
				if msgs, _ := out["messages"].([]any); len(msgs) != 2 {
					t.Errorf("session_messages output %v", out)
				}
			}},
		{cap: "main:session_fork", input: `{"session_id":"space-session","title":"explore alt path"}`,
			method: "POST", path: "/api/sessions/space-session/fork", body: `{"title":"explore alt path"}`,
			check: func(t *testing.T, out map[string]any) {
				wantField(t, out, "id", "sess_fork")
				wantField(t, out, "parent_session_id", "space-session")
			}},
		{cap: "main:session_fork", input: `{"session_id":"space-session"}`,
			method: "POST", path: "/api/sessions/space-session/fork", body: `{}`},
		{cap: "main:session_chat", input: `{"session_id":"space-session","input":"what files changed in the last hour?"}`,
			method: "POST", path: "/api/sessions/space-session/chat", idempotent: true,
			body:  `{"input":"what files changed in the last hour?"}`,
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "output", "Two files changed.") }},
		{cap: "main:session_chat", input: `{"session_id":"space-session","input":"hi","model":"MiniMax-M3"}`,
			method: "POST", path: "/api/sessions/space-session/chat", idempotent: true, body: `{"input":"hi","model":"MiniMax-M3"}`},
		{cap: "main:jobs_list", input: `{}`, method: "GET", path: "/api/jobs",
			check: func(t *testing.T, out map[string]any) {
				if jobs, _ := out["jobs"].([]any); len(jobs) != 1 {
					t.Errorf("jobs_list output %v", out)
				}
			}},
		{cap: "main:job_get", input: `{"job_id":"job_1"}`, method: "GET", path: "/api/jobs/job_1",
			check: func(t *testing.T, out map[string]any) { wantJob(t, out, "state", "scheduled") }},
		{cap: "main:job_update", input: `{"job_id":"job_1","schedule":"every 2h"}`,
			method: "PATCH", path: "/api/jobs/job_1", body: `{"schedule":"every 2h"}`,
			check: func(t *testing.T, out map[string]any) {
				wantJob(t, out, "schedule", "every 2h")
				wantJob(t, out, "prompt", "Summarise the inbox")
			}},
		{cap: "main:job_update", input: `{"job_id":"job_1","prompt":"Summarise the outbox","schedule":"0 8 * * 1"}`,
			method: "PATCH", path: "/api/jobs/job_1", body: `{"prompt":"Summarise the outbox","schedule":"0 8 * * 1"}`,
			check: func(t *testing.T, out map[string]any) { wantJob(t, out, "prompt", "Summarise the outbox") }},
		{cap: "main:job_delete", input: `{"job_id":"job_1"}`, method: "DELETE", path: "/api/jobs/job_1",
			check: func(t *testing.T, out map[string]any) { wantField(t, out, "ok", true) }},
		{cap: "main:job_pause", input: `{"job_id":"job_1"}`, method: "POST", path: "/api/jobs/job_1/pause",
			check: func(t *testing.T, out map[string]any) { wantJob(t, out, "state", "paused") }},
		{cap: "main:job_resume", input: `{"job_id":"job_1"}`, method: "POST", path: "/api/jobs/job_1/resume",
			check: func(t *testing.T, out map[string]any) { wantJob(t, out, "state", "scheduled") }},
		{cap: "main:job_run", input: `{"job_id":"job_1"}`, method: "POST", path: "/api/jobs/job_1/run",
			check: func(t *testing.T, out map[string]any) { wantJob(t, out, "state", "running") }},
		{cap: "alice:job_run", input: `{"job_id":"job_1"}`, method: "POST", path: "/p/alice/api/jobs/job_1/run",
			mock: func(f *fixture) *mockHermes { return f.alice }, wantAuth: "Bearer " + keyAlice},
		{cap: "alice:models", input: `{}`, method: "GET", path: "/p/alice/v1/models",
			mock: func(f *fixture) *mockHermes { return f.alice }, wantAuth: "Bearer " + keyAlice},
	}
	seen := map[string]bool{}
	for _, tc := range cases {
		t.Run(tc.cap, func(t *testing.T) {
			seen[tc.cap] = true
			m, auth := f.main, "Bearer "+keyMain
			if tc.mock != nil {
				m, auth = tc.mock(f), tc.wantAuth
			}
			a := hostsdktest.NewAction("cap:hermes_agent:"+tc.cap, tc.input)
			resp := f.Act(t, a)
			if tc.checkRaw != "" {
				res, err := resp.Result()
				if err != nil || res.Status != aip.ResultCompleted {
					t.Fatalf("HTTP %d %s: %v", resp.Status, resp.Raw, err)
				}
				jsonEqual(t, "output", string(res.Output), tc.checkRaw)
			} else {
				out := completed(t, resp)
				if tc.check != nil {
					tc.check(t, out)
				}
			}
			reqs := m.of(a.ID)
			if len(reqs) != 1 {
				t.Fatalf("%d provider requests, want 1: %+v", len(reqs), reqs)
			}
			r := reqs[0]
			if r.Method != tc.method || r.Path != tc.path || r.Query != tc.query {
				t.Errorf("request %s %s?%s, want %s %s?%s", r.Method, r.Path, r.Query, tc.method, tc.path, tc.query)
			}
			if tc.body == "" {
				if r.Body != "" {
					t.Errorf("body %q, want none", r.Body)
				}
			} else {
				jsonEqual(t, "request body", r.Body, tc.body)
				if ct := r.Header.Get("Content-Type"); ct != "application/json" {
					t.Errorf("Content-Type %q", ct)
				}
			}
			if got := r.Header.Get("Authorization"); got != auth {
				t.Errorf("Authorization %q, want %q", got, auth)
			}
			if got, want := r.Header.Get("Idempotency-Key"), map[bool]string{true: scopedKey(a, a.ID)}[tc.idempotent]; got != want {
				t.Errorf("Idempotency-Key %q, want %q", got, want)
			}
		})
	}
	for _, op := range operations {
		if !seen["main:"+op.name] {
			t.Errorf("operation %s not exercised", op.name)
		}
	}
}

// wantJob checks a member of the output's "job".
func wantJob(t *testing.T, out map[string]any, k string, v any) {
	t.Helper()
	job, _ := out["job"].(map[string]any)
	if job[k] != v {
		t.Errorf("output job.%s = %v, want %v (output %v)", k, job[k], v, out)
	}
}

func wantField(t *testing.T, out map[string]any, k string, v any) {
	t.Helper()
	if out[k] != v {
		t.Errorf("output %s = %v, want %v (output %v)", k, out[k], v, out)
	}
}

// scopedKey is the Idempotency-Key the fixture's tenant sends for a with
// the AIP idempotency key key.
func scopedKey(a *aip.Action, key string) string {
	return provider.ScopedIdempotencyKey(hostsdktest.TenantID, a.CapabilityID, key)
}

// TestRunStartReplay: the same AIP idempotency key on a new action is sent
// as the same Idempotency-Key (scoped to the tenant and capability);
// Hermes' replay flag reaches the output.
func TestRunStartReplay(t *testing.T) {
	f := newFixture(t)
	a1 := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x"}`)
	a1.IdempotencyKey = "order-42"
	a2 := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x"}`)
	a2.IdempotencyKey = "order-42"
	if out := completed(t, f.Act(t, a1)); out["replayed"] != nil {
		t.Errorf("first start %v", out)
	}
	if out := completed(t, f.Act(t, a2)); out["replayed"] != true || out["run_id"] != "run_abc123" {
		t.Errorf("second start %v", out)
	}
	for _, a := range []*aip.Action{a1, a2} {
		if r := f.main.of(a.ID); len(r) != 1 || r[0].Header.Get("Idempotency-Key") != scopedKey(a, "order-42") {
			t.Errorf("requests %+v", r)
		}
	}
}

func TestRunStartWaitCompletes(t *testing.T) {
	f := newFixture(t)
	f.main.mu.Lock()
	f.main.runStatus = "completed"
	f.main.mu.Unlock()
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x","wait":true}`)
	out := completed(t, f.Act(t, a))
	run, _ := out["run"].(map[string]any)
	if out["status"] != "completed" || run["output"] != "Done." {
		t.Fatalf("output %v", out)
	}
	reqs := f.main.of(a.ID)
	if len(reqs) != 2 || reqs[1].Method != "GET" || reqs[1].Path != "/v1/runs/run_abc123" || reqs[0].Body != `{"input":"x"}` {
		t.Errorf("requests %+v", reqs)
	}
}

// runStartGets counts the status reads of run_abc123 among reqs.
func runStartGets(reqs []received) int {
	n := 0
	for _, r := range reqs {
		if r.Method == "GET" && r.Path == "/v1/runs/run_abc123" {
			n++
		}
	}
	return n
}

// shortenWaits gives the fixture's connector a short backoff cap and the
// given outage budget.
func shortenWaits(f *fixture, budget time.Duration) {
	f.conn.backoffCap, f.conn.outageBudget = 4*time.Millisecond, budget
}

// TestRunStartWaitRidesOutAnOutage: status reads that fail transiently (a
// 500, or no answer) for a while are read again with backoff, and the
// run's real result comes back. Before, the first failed read ended the
// wait, returning the run as "started" although it went on and completed.
func TestRunStartWaitRidesOutAnOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
	}{{"500", http.StatusInternalServerError}, {"no answer", 0}, {"429", http.StatusTooManyRequests}} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			shortenWaits(f, time.Minute)
			f.main.mu.Lock()
			f.main.runStatus = "completed"
			f.main.mu.Unlock()
			f.main.setFailTimes("GET", "/v1/runs/run_abc123", tc.status, 6)
			a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x","wait":true}`)
			out := completed(t, f.Act(t, a))
			run, _ := out["run"].(map[string]any)
			if out["status"] != "completed" || run["output"] != "Done." {
				t.Fatalf("output %v, want the completed run", out)
			}
			if n := runStartGets(f.main.of(a.ID)); n != 7 {
				t.Errorf("%d status reads, want 7 (six failed)", n)
			}
		})
	}
}

// TestRunStartWaitStatusUnreadable: a run_start whose status reads keep
// failing for longer than the outage budget after the run started
// completes with the run as last seen, naming it; a failed result would
// invite a second start.
func TestRunStartWaitStatusUnreadable(t *testing.T) {
	f := newFixture(t)
	const budget = 200 * time.Millisecond
	shortenWaits(f, budget)
	f.main.setFail("GET", "/v1/runs/run_abc123", http.StatusInternalServerError)
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x","wait":true}`)
	began := time.Now()
	out := completed(t, f.Act(t, a))
	if out["run_id"] != "run_abc123" || out["status"] != "started" {
		t.Fatalf("output %v", out)
	}
	if took := time.Since(began); took < budget {
		t.Errorf("the wait ended after %s, within the %s outage budget", took, budget)
	}
	reqs := f.main.of(a.ID)
	if reqs[0].Method != "POST" || runStartGets(reqs) < 3 || runStartGets(reqs) != len(reqs)-1 {
		t.Errorf("requests %+v", reqs)
	}
}

// TestRunStartWaitNonTransientFailure: a status read refused with a 4xx
// (here 404, the page's answer for another profile's run) ends the wait at
// once, after transient failures too, with the run as last seen.
func TestRunStartWaitNonTransientFailure(t *testing.T) {
	f := newFixture(t)
	shortenWaits(f, time.Hour)
	f.main.setFailTimes("GET", "/v1/runs/run_abc123", http.StatusInternalServerError, 2)
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x","wait":true}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := f.Dispatcher.Act(hostsdktest.Context(t), f.Target, a)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	// After the two 500s, the run is read once (running), then refused.
	ctx := hostsdktest.Context(t)
	select {
	case <-f.main.polled:
	case resp := <-done:
		t.Fatalf("run_start ended before its run was read: %+v", resp)
	case <-ctx.Done():
		t.Fatal("the run was never read")
	}
	f.main.setFail("GET", "/v1/runs/run_abc123", http.StatusNotFound)
	out := completed(t, <-done)
	if out["run_id"] != "run_abc123" || out["status"] != "running" {
		t.Fatalf("output %v, want the run as last seen (running)", out)
	}
	// Every read answered is signalled; of the others, two were the 500s
	// and one only the 404.
	answered := 1
	for len(f.main.polled) > 0 {
		<-f.main.polled
		answered++
	}
	if n := runStartGets(f.main.of(a.ID)); n != answered+2+1 {
		t.Errorf("%d status reads, %d answered: the 404 was read %d times, want once", n, answered, n-answered-2)
	}
}

// TestRunStartCancelStopsRun: cancelling a run_start that waits for its
// run stops the run through the Canceler, and the action is
// outcome_unknown.
func TestRunStartCancelStopsRun(t *testing.T) {
	f := newFixture(t)
	ctx := hostsdktest.Context(t)
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"long job","wait":true}`)
	done := actUntilPolled(t, ctx, f.Fixture, a, f.main)
	resp, err := f.Dispatcher.Cancel(ctx, f.Target, a.ID, a.CapabilityID, "operator")
	if err != nil {
		t.Fatal(err)
	}
	// The run stops "at the next safe interruption point": it may have
	// completed or acted first, so the action is outcome_unknown.
	if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" {
		t.Fatalf("cancel answered HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
	}
	if r := <-done; r == nil {
		t.Fatal("the action got no answer")
	} else if pe := r.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, "run_abc123") ||
		!strings.Contains(pe.Message, "sends Hermes a stop") {
		t.Fatalf("action answered HTTP %d %s, want outcome_unknown naming the run and the stop", r.Status, r.Raw)
	}
	if st, _, err := f.Dispatcher.Status(ctx, f.Target, a.ID, a.CapabilityID); err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v", st, err)
	}
	var stops []received
	for _, r := range f.main.of(a.ID) {
		if r.Method == "POST" && r.Path == "/v1/runs/run_abc123/stop" {
			stops = append(stops, r)
		}
	}
	if len(stops) != 1 || stops[0].Header.Get("Authorization") != "Bearer "+keyMain {
		t.Fatalf("stop requests %+v", stops)
	}
}

// TestRunStartDrainSendsNoStop: a run_start whose wait the host's drain
// cuts ends outcome_unknown with a message that is true: the host sent
// no stop, so the run goes on, and the message names the run ID to
// follow with run_status or stop with run_stop (it said "before a stop
// reached it", and no stop was ever sent).
func TestRunStartDrainSendsNoStop(t *testing.T) {
	main, alice := newMockHermes(t, keyMain, ""), newMockHermes(t, keyAlice, "/p/alice")
	conn, err := New(Config{EndpointsFile: endpointsFile(t, main.srv.URL, alice.srv.URL+"/p/alice/"),
		PollInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := hostsdktest.Start(t, conn, func(c *hostsdk.Config) {
		c.DrainTimeout, c.DrainLinger = 200*time.Millisecond, 10*time.Millisecond
	})
	ctx := hostsdktest.Context(t)
	a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"long job","wait":true}`)
	done := actUntilPolled(t, ctx, f, a, main)
	stopped := make(chan error, 1)
	go func() { stopped <- f.Host.Stop(ctx) }()
	r := <-done
	if r == nil {
		t.Fatal("the action got no answer")
	}
	pe := r.ProtocolError()
	if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("action answered HTTP %d %s, want outcome_unknown", r.Status, r.Raw)
	}
	for _, want := range []string{"run_abc123", "goes on", "shutting down", "no stop", "run_status", "run_stop"} {
		if !strings.Contains(pe.Message, want) {
			t.Errorf("message %q does not say %q", pe.Message, want)
		}
	}
	if strings.Contains(pe.Message, "stop reached") {
		t.Errorf("message %q claims a stop that was never sent", pe.Message)
	}
	<-stopped
	for _, req := range main.of(a.ID) {
		if req.Method == "POST" && strings.HasSuffix(req.Path, "/stop") {
			t.Fatalf("the drain sent a stop: %+v", req)
		}
	}
}

const chatCompletionChunk = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1710000000,"model":"hermes-agent","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}`

func chunkOf(delta, finish string) string { return fmt.Sprintf(chatCompletionChunk, delta, finish) }

func TestChatStream(t *testing.T) {
	f := newFixture(t)
	f.main.setStream(sse(
		chunkOf(`{"role":"assistant"}`, "null"),
		chunkOf(`{"reasoning_content":"thinking"}`, "null"),
		"hermes.tool.progress\x00"+`{"tool":"terminal","status":"started"}`,
		chunkOf(`{"content":"Hel"}`, "null"),
		chunkOf(`{"content":"lo"}`, "null"),
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"hermes-agent","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"total_tokens":7}}`,
		"[DONE]",
	))
	a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hello!"}]}`)
	a.Mode = aip.ModeStreaming
	resp := f.Act(t, a)
	type chunk struct {
		Kind aip.ChunkKind
		Data string
	}
	var got []chunk
	for _, c := range resp.Chunks {
		got = append(got, chunk{c.Kind, string(c.Data)})
	}
	want := []chunk{
		{aip.ChunkThought, `{"delta":"thinking"}`},
		{aip.ChunkTool, `{"status":"started","tool":"terminal"}`},
		{aip.ChunkData, `{"delta":"Hel"}`},
		{aip.ChunkData, `{"delta":"lo"}`},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("chunks (-want +got):\n%s", d)
	}
	out := completed(t, resp)
	jsonEqual(t, "stream output", string(mustJSON(t, out)),
		`{"id":"chatcmpl-1","model":"hermes-agent","message":{"role":"assistant","content":"Hello"},"finish_reason":"stop","usage":{"total_tokens":7}}`)
	reqs := f.main.of(a.ID)
	if len(reqs) != 1 {
		t.Fatalf("requests %+v", reqs)
	}
	jsonEqual(t, "stream request", reqs[0].Body, `{"model":"hermes-agent","messages":[{"role":"user","content":"Hello!"}],"stream":true}`)
	if h := reqs[0].Header; h.Get("Accept") != "text/event-stream" || h.Get("Authorization") != "Bearer "+keyMain || h.Get("Idempotency-Key") != scopedKey(a, a.ID) {
		t.Errorf("stream request headers %v", h)
	}
}

// outcomeUnknown checks that a is journaled outcome_unknown and that
// sending it again does not reach the provider.
func (f *fixture) outcomeUnknown(t *testing.T, resp *hostsdktest.Response, a *aip.Action, m *mockHermes) {
	t.Helper()
	if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" {
		t.Fatalf("HTTP %d %s, want outcome_unknown", resp.Status, resp.Raw)
	}
	st, _, err := f.Dispatcher.Status(hostsdktest.Context(t), f.Target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v", st, err)
	}
	before := len(m.of(a.ID))
	again := f.Act(t, a)
	if pe := again.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" {
		t.Fatalf("again: HTTP %d %s", again.Status, again.Raw)
	}
	if after := len(m.of(a.ID)); after != before {
		t.Fatalf("the same action reached the provider again (%d requests, then %d)", before, after)
	}
}

func TestChatStreamCutIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	f.main.setStream(sse(chunkOf(`{"content":"Hel"}`, "null")) + "data: " + chunkOf(`{"content":"lo"}`, "null")[:20])
	a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hello!"}]}`)
	a.Mode = aip.ModeStreaming
	f.outcomeUnknown(t, f.Act(t, a), a, f.main)
}

func failedWith(t *testing.T, resp *hostsdktest.Response, code string, retryable bool) {
	t.Helper()
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != code || (res.Error.Retryable != nil && *res.Error.Retryable) != retryable {
		t.Fatalf("result %s %+v, want failed %s retryable %v", res.Status, res.Error, code, retryable)
	}
	if strings.Contains(res.Error.Message, keyMain) {
		t.Fatalf("error message carries the key: %s", res.Error.Message)
	}
}

func TestProviderErrors(t *testing.T) {
	f := newFixture(t)
	t.Run("read 404", func(t *testing.T) {
		a := hostsdktest.NewAction("cap:hermes_agent:main:response_get", `{"response_id":"resp_missing"}`)
		failedWith(t, f.Act(t, a), provider.CodeNotFound, false)
	})
	t.Run("mutation 400", func(t *testing.T) {
		f.main.setFail("POST", "/api/sessions", 400)
		failedWith(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:session_create", `{}`)), provider.CodeInvalidRequest, false)
	})
	t.Run("run_start 429", func(t *testing.T) {
		f.alice.setFail("POST", "/p/alice/v1/runs", 429)
		failedWith(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:alice:run_start", `{"input":"x"}`)), provider.CodeRateLimited, true)
	})
	t.Run("read 5xx", func(t *testing.T) {
		f.main.setFail("GET", "/v1/runs/run_x", 503)
		failedWith(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:run_status", `{"run_id":"run_x"}`)), provider.CodeUnavailable, true)
	})
	t.Run("mutation 5xx", func(t *testing.T) {
		f.main.setFail("DELETE", "/v1/responses/resp_gone", 500)
		a := hostsdktest.NewAction("cap:hermes_agent:main:response_delete", `{"response_id":"resp_gone"}`)
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("chat dropped connection", func(t *testing.T) {
		f.main.setDrop("POST", "/v1/chat/completions")
		a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hi"}]}`)
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("stream 5xx", func(t *testing.T) {
		f.alice.setFail("POST", "/p/alice/v1/chat/completions", 502)
		a := hostsdktest.NewAction("cap:hermes_agent:alice:chat", `{"messages":[{"role":"user","content":"Hi"}]}`)
		a.Mode = aip.ModeStreaming
		f.outcomeUnknown(t, f.Act(t, a), a, f.alice)
	})
	t.Run("job read 404", func(t *testing.T) {
		failedWith(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:job_get", `{"job_id":"job_missing"}`)), provider.CodeNotFound, false)
	})
	t.Run("job_delete 5xx", func(t *testing.T) {
		f.main.setFail("DELETE", "/api/jobs/job_1", 500)
		a := hostsdktest.NewAction("cap:hermes_agent:main:job_delete", `{"job_id":"job_1"}`)
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("job_run dropped connection", func(t *testing.T) {
		f.alice.setDrop("POST", "/p/alice/api/jobs/job_1/run")
		a := hostsdktest.NewAction("cap:hermes_agent:alice:job_run", `{"job_id":"job_1"}`)
		f.outcomeUnknown(t, f.Act(t, a), a, f.alice)
	})
	t.Run("session_chat 5xx", func(t *testing.T) {
		f.main.setFail("POST", "/api/sessions/s5/chat", 503)
		a := hostsdktest.NewAction("cap:hermes_agent:main:session_chat", `{"session_id":"s5","input":"x"}`)
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
	t.Run("session_patch 400", func(t *testing.T) {
		f.main.setFail("PATCH", "/api/sessions/s6", 400)
		a := hostsdktest.NewAction("cap:hermes_agent:main:session_patch", `{"session_id":"s6","end_reason":"done"}`)
		failedWith(t, f.Act(t, a), provider.CodeInvalidRequest, false)
	})
	t.Run("skills 5xx", func(t *testing.T) {
		f.main.setFail("GET", "/v1/skills", 502)
		failedWith(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:skills", `{}`)), provider.CodeUnavailable, true)
	})
	t.Run("read 401", func(t *testing.T) {
		f.alice.setFail("GET", "/p/alice/api/sessions/s", 401)
		a := hostsdktest.NewAction("cap:hermes_agent:alice:session_get", `{"session_id":"s"}`)
		failedWith(t, f.Act(t, a), provider.CodeUnauthorized, false)
	})
}

func TestInputRejected(t *testing.T) {
	f := newFixture(t)
	many := strings.Repeat(`{"role":"user","content":"x"},`, 201)
	cases := []struct{ cap, input string }{
		{"main:chat", `{}`},
		{"main:chat", `{"messages":[]}`},
		{"main:chat", `{"messages":[` + many[:len(many)-1] + `]}`},
		{"main:chat", `{"messages":[{"role":"tool","content":"x"}]}`},
		{"main:chat", `{"messages":[{"role":"user"}]}`},
		{"main:chat", `{"messages":[{"role":"user","content":"x"}],"temperature":3}`},
		{"main:chat", `{"messages":[{"role":"user","content":"x"}],"stream":true}`},
		{"main:responses", `{"input":""}`},
		// § Named conversations: conversation is used "instead of"
		// previous_response_id; Hermes refuses both together (400).
		{"main:responses", `{"input":"x","conversation":"my-project","previous_response_id":"resp_abc123"}`},
		{"main:response_get", `{"response_id":".."}`},
		{"main:response_get", `{"response_id":"a/b"}`},
		{"main:run_start", `{"session_id":"s"}`},
		{"main:run_stop", `{}`},
		{"main:sessions_list", `{"limit":0}`},
		{"main:session_create", `{"title":"x"}`},
		{"main:health", `{"verbose":true}`},
		{"main:health_detailed", `{"x":1}`},
		{"main:run_events", `{}`},
		{"main:run_events", `{"run_id":"run_abc123","max_events":0}`},
		{"main:run_events", `{"run_id":"run_abc123","max_events":100001}`},
		{"main:session_patch", `{"session_id":"s"}`},
		{"main:session_patch", `{"session_id":"s","title":""}`},
		{"main:session_patch", `{"session_id":"s","title":"a\nb"}`},
		{"main:session_patch", `{"session_id":"s","title":"t","archived":true}`},
		{"main:session_messages", `{"session_id":"."}`},
		{"main:session_fork", `{"session_id":"s","parent":"x"}`},
		{"main:session_chat", `{"session_id":"s"}`},
		{"main:session_chat", `{"input":"x"}`},
		{"main:session_chat", `{"session_id":"s","input":""}`},
		{"main:job_get", `{"job_id":".."}`},
		{"main:job_update", `{"job_id":"job_1"}`},
		{"main:job_update", `{"job_id":"job_1","name":"x"}`},
		{"main:job_delete", `{}`},
		{"main:job_run", `{"job_id":"job_1","now":true}`},
		{"main:jobs_list", `{"include_disabled":true}`},
	}
	for _, tc := range cases {
		a := hostsdktest.NewAction("cap:hermes_agent:"+tc.cap, tc.input)
		resp := f.Act(t, a)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != "connector_host.input_invalid" {
			t.Errorf("%s %s: HTTP %d %s", tc.cap, tc.input, resp.Status, resp.Raw)
		}
		if n := len(f.main.of(a.ID)); n != 0 {
			t.Errorf("%s %s reached the provider", tc.cap, tc.input)
		}
	}
}

// TestCheckHealth: the probe reads an authenticated route, so a key the
// server no longer accepts (the page's public GET /health would still
// answer 200) fails the endpoint's check. The replica stays ready while
// another endpoint passes; only every endpoint failing fails the check,
// naming each.
func TestCheckHealth(t *testing.T) {
	main, alice := newMockHermes(t, keyMain, ""), newMockHermes(t, keyAlice, "")
	conn, err := New(Config{EndpointsFile: endpointsFile(t, main.srv.URL, alice.srv.URL)})
	if err != nil {
		t.Fatal(err)
	}
	if err := conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	alice.mu.Lock()
	alice.key = "rotated"
	alice.mu.Unlock()
	var d *hostsdk.DegradedError
	if err := conn.CheckHealth(hostsdktest.Context(t)); !errors.As(err, &d) || !strings.Contains(err.Error(), "endpoint alice") ||
		strings.Contains(err.Error(), "endpoint main") {
		t.Fatalf("one endpoint of two failing: %v, want degraded naming alice", err)
	}
	main.mu.Lock()
	main.key = "rotated"
	main.mu.Unlock()
	err = conn.CheckHealth(hostsdktest.Context(t))
	if err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "endpoint alice") ||
		!strings.Contains(err.Error(), "endpoint main") || strings.Contains(err.Error(), keyAlice) {
		t.Fatalf("every key wrong: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := conn.CheckHealth(ctx); err == nil {
		t.Fatal("a cancelled probe succeeded")
	}
}

// TestOneEndpointFailingKeepsTheReplicaReady: an endpoint whose key was
// rotated does not make the replica not ready (which would take every
// endpoint offline): the host starts and serves the other endpoint, and
// the failing endpoint's actions — streaming ones too — fail at once,
// naming it and its check's failure, without a request to it.
func TestOneEndpointFailingKeepsTheReplicaReady(t *testing.T) {
	main, alice := newMockHermes(t, keyMain, ""), newMockHermes(t, keyAlice, "/p/alice")
	alice.mu.Lock()
	alice.key = "rotated"
	alice.mu.Unlock()
	conn, err := New(Config{EndpointsFile: endpointsFile(t, main.srv.URL, alice.srv.URL+"/p/alice/")})
	if err != nil {
		t.Fatal(err)
	}
	f := hostsdktest.Start(t, conn, nil)
	if !f.Host.Ready() {
		t.Fatal("the replica is not ready with one endpoint of two failing its check")
	}
	// /ready (to a peer on this machine) names the failing endpoint.
	doc := readReady(t, f)
	if doc.Status != "ready" || !doc.Connector.Ready ||
		!strings.HasPrefix(doc.Connector.Detail, "connector is ready but degraded: endpoint health check failed for 1 of 2: endpoint alice: ") ||
		strings.Contains(doc.Connector.Detail, keyAlice) {
		t.Errorf("/ready with one endpoint of two failing: %+v", doc)
	}
	completed(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x"}`)))

	stream := hostsdktest.NewAction("cap:hermes_agent:alice:chat", `{"messages":[{"role":"user","content":"Hi"}]}`)
	stream.Mode = aip.ModeStreaming
	for _, a := range []*aip.Action{hostsdktest.NewAction("cap:hermes_agent:alice:run_start", `{"input":"x"}`), stream} {
		resp := f.Act(t, a)
		failedWith(t, resp, provider.CodeUnauthorized, false)
		res, _ := resp.Result()
		for _, want := range []string{"endpoint alice", "not sent", "nothing ran", "401"} {
			if !strings.Contains(res.Error.Message, want) {
				t.Errorf("%s: message %q does not say %q", a.CapabilityID, res.Error.Message, want)
			}
		}
		if strings.Contains(res.Error.Message, keyAlice) {
			t.Errorf("the message carries the key: %q", res.Error.Message)
		}
		if got := alice.of(a.ID); len(got) != 0 {
			t.Errorf("%s: requests sent to the endpoint that failed its check: %+v", a.CapabilityID, got)
		}
	}

	alice.mu.Lock()
	alice.key = keyAlice
	alice.mu.Unlock()
	if err := conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	completed(t, f.Act(t, hostsdktest.NewAction("cap:hermes_agent:alice:run_start", `{"input":"x"}`)))
}

func TestNewErrors(t *testing.T) {
	dir := t.TempDir()
	key := writeFile(t, dir, "k", "secret", 0o600)
	open := writeFile(t, dir, "open", "secret", 0o644)
	file := func(content string) string {
		return writeFile(t, t.TempDir(), "endpoints.json", content, 0o644)
	}
	cases := []struct {
		name, path, want string
	}{
		{"missing setting", "", "no file given"},
		{"missing file", filepath.Join(dir, "nope.json"), "nope.json"},
		{"group writable", writeFile(t, t.TempDir(), "e.json", `[{"id":"a","base_url":"https://h.example.com"}]`, 0o666), "writable"},
		{"not JSON", file(`{`), "not a JSON array"},
		{"unknown field", file(`[{"id":"a","base_url":"https://h.example.com","tenant":"t"}]`), `unknown field "tenant"`},
		{"trailing data", file(`[{"id":"a","base_url":"https://h.example.com"}] []`), "data after"},
		{"empty", file(`[]`), "lists 0 entries"},
		{"bad id", file(`[{"id":"a b","base_url":"https://h.example.com"}]`), `id "a b"`},
		{"duplicate id", file(`[{"id":"Main","base_url":"https://h.example.com"},{"id":"main","base_url":"https://g.example.com"}]`), "listed twice"},
		{"no base_url", file(`[{"id":"a"}]`), "no URL given"},
		{"insecure base_url", file(`[{"id":"a","base_url":"http://hermes.example.com"}]`), "use https"},
		{"base_url with query", file(`[{"id":"a","base_url":"https://h.example.com/?x=1"}]`), "query"},
		{"key file too open", file(`[{"id":"a","base_url":"https://h.example.com","api_key_file":"` + open + `"}]`), "api_key_file"},
		{"key file missing", file(`[{"id":"a","base_url":"https://h.example.com","api_key_file":"` + filepath.Join(dir, "none") + `"}]`), "api_key_file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Product.New(hostsdk.SettingValues{FlagEndpointsFile: tc.path}, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, hostsdk.ErrSetting) {
				t.Errorf("error %q does not match hostsdk.ErrSetting (aip-host would exit 1, not 2)", err)
			}
			if !strings.Contains(err.Error(), "--hermes-endpoints-file") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to name --hermes-endpoints-file and say %q", err, tc.want)
			}
		})
	}
	good := file(`[{"id":"a","base_url":"https://h.example.com","api_key_file":"` + key + `"}]`)
	if _, err := New(Config{EndpointsFile: good, DefaultModel: "bad\nmodel"}); err == nil || !strings.Contains(err.Error(), "--hermes-default-model") {
		t.Errorf("bad default model: %v", err)
	}
	if _, err := New(Config{EndpointsFile: good, MaxResponseBytes: 10}); err == nil || !strings.Contains(err.Error(), "--hermes-max-response-bytes") {
		t.Errorf("small max response bytes: %v", err)
	}
	conn, err := Product.New(hostsdk.SettingValues{FlagEndpointsFile: good, FlagDefaultModel: "my-hermes"}, nil)
	if err != nil {
		t.Fatalf("Product.New: %v", err)
	}
	if c := conn.(*Connector); len(c.endpoints) != 1 || c.endpoints[0].defaultModel != "my-hermes" {
		t.Errorf("connector %+v", c)
	}
	bad := file(`[{"id":"a","base_url":"https://h.example.com","api_key_file":"` + key + `","default_model":" padded"}]`)
	if _, err := New(Config{EndpointsFile: bad}); err == nil || !strings.Contains(err.Error(), `endpoint "a": default_model`) {
		t.Errorf("bad endpoint default_model: %v", err)
	}
}

// TestEndpointDefaultModel: an endpoint's default_model is the model of
// its chat and responses when the action names none (a profile served
// under its own model name); the other endpoints keep
// --hermes-default-model, and a model the action names wins.
func TestEndpointDefaultModel(t *testing.T) {
	main, alice := newMockHermes(t, keyMain, ""), newMockHermes(t, keyAlice, "/p/alice")
	dir := t.TempDir()
	list, _ := json.Marshal([]map[string]string{
		{"id": "main", "base_url": main.srv.URL, "api_key_file": writeFile(t, dir, "main.key", keyMain, 0o600)},
		{"id": "alice", "base_url": alice.srv.URL + "/p/alice/", "api_key_file": writeFile(t, dir, "alice.key", keyAlice, 0o600),
			"default_model": "alice-profile"},
	})
	conn, err := New(Config{EndpointsFile: writeFile(t, dir, "endpoints.json", string(list), 0o644), DefaultModel: "fleet-model"})
	if err != nil {
		t.Fatal(err)
	}
	f := hostsdktest.Start(t, conn, nil)
	for _, tc := range []struct {
		mock        *mockHermes
		cap, input  string
		model, path string
	}{
		{alice, "cap:hermes_agent:alice:chat", `{"messages":[{"role":"user","content":"Hi"}]}`, "alice-profile", "/p/alice/v1/chat/completions"},
		{alice, "cap:hermes_agent:alice:responses", `{"input":"Hi"}`, "alice-profile", "/p/alice/v1/responses"},
		{alice, "cap:hermes_agent:alice:chat", `{"model":"named","messages":[{"role":"user","content":"Hi"}]}`, "named", "/p/alice/v1/chat/completions"},
		{main, "cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hi"}]}`, "fleet-model", "/v1/chat/completions"},
	} {
		a := hostsdktest.NewAction(tc.cap, tc.input)
		completed(t, f.Act(t, a))
		reqs := tc.mock.of(a.ID)
		var body struct{ Model string }
		if len(reqs) != 1 || reqs[0].Path != tc.path || json.Unmarshal([]byte(reqs[0].Body), &body) != nil || body.Model != tc.model {
			t.Errorf("%s %s: requests %+v, want model %q at %s", tc.cap, tc.input, reqs, tc.model, tc.path)
		}
	}
}

// TestStreamEvents: the SSE reader dispatches complete events only and
// enforces the stream and frame bounds.
func TestStreamEvents(t *testing.T) {
	maxBytes := int64(1 << 10)
	read := func(body string) ([]string, error) {
		var got []string
		err := events(strings.NewReader(body), maxBytes, func(event string, data []byte) (bool, error) {
			got = append(got, event+"|"+string(data))
			return string(data) == "[DONE]", nil
		})
		return got, err
	}
	got, err := read(": comment\r\nevent: hermes.tool.progress\r\ndata: {\"a\":1}\r\n\r\ndata: x\ndata: y\n\ndata: [DONE]\n\ndata: after\n\n")
	if err != nil || !cmp.Equal(got, []string{`hermes.tool.progress|{"a":1}`, "|x\ny", "|[DONE]"}) {
		t.Errorf("events %q, %v", got, err)
	}
	if got, err := read("data: one\n\ndata: cut"); err != nil || !cmp.Equal(got, []string{"|one"}) {
		t.Errorf("cut stream: %q, %v", got, err)
	}
	if _, err := read(strings.Repeat("data: 0123456789\n\n", 100)); err == nil || !strings.Contains(err.Error(), "--hermes-max-response-bytes") {
		t.Errorf("oversized stream: %v", err)
	}
	maxBytes = 4 << 20
	if _, err := read("data: " + strings.Repeat("x", MaxFrameBytes+1) + "\n\n"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized frame: %v", err)
	}
}

func TestChatStreamErrorIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	f.main.setStream(sse(chunkOf(`{"content":"Hel"}`, "null"), `{"error":{"message":"agent crashed"}}`, "[DONE]"))
	a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hello!"}]}`)
	a.Mode = aip.ModeStreaming
	f.outcomeUnknown(t, f.Act(t, a), a, f.main)
}

// TestChatFinishReasonErrorIsOutcomeUnknown: Hermes ends a chat turn the
// agent failed with finish_reason "error" (gateway/platforms/api_server.py:
// a 200 with the partial text when the run failed after writing some, and
// in a stream whose agent crashed, a last chunk with finish_reason "error"
// before data: [DONE]). The agent ran and may have acted, so the action is
// outcome_unknown, never a completed turn whose answer is the partial text.
func TestChatFinishReasonErrorIsOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	t.Run("sync", func(t *testing.T) {
		f.main.mu.Lock()
		f.main.chatAnswer = `{"id":"chatcmpl-err","object":"chat.completion","created":1710000000,"model":"hermes-agent",
			"choices":[{"index":0,"message":{"role":"assistant","content":"I started deleting the"},"finish_reason":"error"}],
			"usage":{"prompt_tokens":50,"completion_tokens":5,"total_tokens":55}}`
		f.main.mu.Unlock()
		a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Clean up"}]}`)
		resp := f.Act(t, a)
		f.outcomeUnknown(t, resp, a, f.main)
		if pe := resp.ProtocolError(); !strings.Contains(pe.Message, "finish_reason") {
			t.Errorf("message %q does not say why", pe.Message)
		}
	})
	t.Run("stream", func(t *testing.T) {
		f.main.setStream(sse(
			chunkOf(`{"role":"assistant"}`, "null"),
			chunkOf(`{"content":"I started deleting the"}`, "null"),
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","model":"hermes-agent","choices":[{"index":0,"delta":{},"finish_reason":"error"}]}`,
			"[DONE]",
		))
		a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Clean up"}]}`)
		a.Mode = aip.ModeStreaming
		f.outcomeUnknown(t, f.Act(t, a), a, f.main)
	})
}

// TestMockRefuses: the mock refuses what Hermes refuses, so the adapter's
// passing requests are meaningful.
func TestMockRefuses(t *testing.T) {
	m := newMockHermes(t, keyMain, "")
	for _, tc := range []struct {
		auth, path string
		want       int
	}{
		{"", "/v1/models", http.StatusUnauthorized},
		{"Bearer wrong", "/v1/models", http.StatusUnauthorized},
		{"Bearer " + keyMain, "/v1/unknown", http.StatusNotFound},
		{"Bearer " + keyMain, "/v1/models", http.StatusOK},
	} {
		req, _ := http.NewRequestWithContext(hostsdktest.Context(t), "GET", m.srv.URL+tc.path, nil)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := m.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%q %s: %d, want %d", tc.auth, tc.path, resp.StatusCode, tc.want)
		}
	}
	// Bodies without the route's required field, or with a field the
	// page does not name, are refused.
	for _, tc := range []struct{ path, body string }{
		{"/v1/runs", `{}`},
		{"/v1/runs", `{"input":""}`},
		{"/v1/runs", `{"input":"x","wait":true}`},
		{"/v1/responses", `{"model":"hermes-agent"}`},
		{"/v1/responses", `{"input":"x","stream_mode":"sse"}`},
		{"/v1/chat/completions", `{"model":"hermes-agent","messages":[]}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"wait":true}`},
	} {
		req, _ := http.NewRequestWithContext(hostsdktest.Context(t), "POST", m.srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Authorization", "Bearer "+keyMain)
		req.Header.Set("Content-Type", "application/json")
		resp, err := m.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST %s %s: %d, want 400", tc.path, tc.body, resp.StatusCode)
		}
	}
}

// TestIdempotencyKeyScopedPerTenant: two tenants whose hosts share one
// Hermes server and API key (Hermes isolates keys per credential only) and
// choose the same idempotency key each start their own run: neither is
// answered the other's run (nor a 409 for a different body), and each
// tenant's own retry is still answered its original run.
func TestIdempotencyKeyScopedPerTenant(t *testing.T) {
	f := newFixture(t)
	other, err := New(Config{EndpointsFile: endpointsFile(t, f.main.srv.URL, f.alice.srv.URL+"/p/alice/"), PollInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	g := startTenant(t, other, "tenant-other")
	start := func(h *hostsdktest.Fixture, input string) map[string]any {
		a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", input)
		a.IdempotencyKey = "order-42"
		return completed(t, h.Act(t, a))
	}
	mine := start(f.Fixture, `{"input":"x"}`)
	theirs := start(g, `{"input":"x"}`)
	if mine["run_id"] != "run_abc123" || theirs["run_id"] == mine["run_id"] || theirs["replayed"] != nil {
		t.Errorf("tenant-other was answered %v after %s started %v with the same key; want a run of its own", theirs, hostsdktest.TenantID, mine)
	}
	// Another body under the same key in a third tenant: not a conflict.
	third, err := New(Config{EndpointsFile: endpointsFile(t, f.main.srv.URL, f.alice.srv.URL+"/p/alice/"), PollInterval: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h3 := startTenant(t, third, "tenant-third")
	if out := start(h3, `{"input":"y"}`); out["run_id"] == mine["run_id"] || out["run_id"] == theirs["run_id"] {
		t.Errorf("tenant-third was answered %v", out)
	}
	if again := start(g, `{"input":"x"}`); again["run_id"] != theirs["run_id"] || again["replayed"] != true {
		t.Errorf("tenant-other's retry was answered %v; want its own run %v replayed", again, theirs["run_id"])
	}
}

// startTenant is hostsdktest.Start for a host of tenant.
func startTenant(t *testing.T, conn hostsdk.Connector, tenant string) *hostsdktest.Fixture {
	t.Helper()
	f := &hostsdktest.Fixture{ControlPlane: hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})}
	f.Dispatcher = hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	f.Config = hostsdktest.HostConfig(t, f.ControlPlane, f.Dispatcher, nil)
	f.Config.TenantID = tenant
	f.ControlPlane.Provision(hostsdktest.ReplicaSpec{ID: f.Config.ReplicaID, DID: f.Config.SigningKey.DID(),
		InstanceID: f.Config.InstanceID, VersionID: f.Config.VersionID, Endpoint: f.Config.PublicEndpoint,
		TenantID: tenant, ArtifactDigest: f.Config.ArtifactDigest})
	f.Host = hostsdktest.StartHost(t, f.Config, conn)
	f.Target = hostsdktest.TargetOf(f.Host, f.Config)
	return f
}

// TestRunStartUnusableRunID: a run_id Hermes answers that is not a run ID
// (empty, a path separator, a dot segment, a query or fragment mark, a
// control character, too long, not a string) is never put into a path:
// run_start with wait sends nothing after the POST (no status poll) and
// ends outcome_unknown (Hermes accepted the run, which may be
// running), saying why.
func TestRunStartUnusableRunID(t *testing.T) {
	f := newFixture(t)
	f.main.mu.Lock()
	f.main.runStatus = "completed" // a poll, were one sent, would end the wait
	f.main.mu.Unlock()
	for _, id := range []string{`""`, `"run/abc"`, `".."`, `"../admin"`, `".hidden"`, `"run?x=1"`, `"run#x"`,
		`"run%2Fabc"`, `"run\u0001"`, `"run abc"`, `"` + strings.Repeat("r", 257) + `"`, `42`, `null`} {
		f.main.mu.Lock()
		f.main.startAnswer = `{"run_id":` + id + `,"status":"started"}`
		f.main.mu.Unlock()
		a := hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x","wait":true}`)
		resp := f.Act(t, a)
		if pe := resp.ProtocolError(); pe == nil || pe.Code != "connector_host.outcome_unknown" || !strings.Contains(pe.Message, "run_id") {
			t.Errorf("run_id %s: answered HTTP %d %s, want outcome_unknown naming the run_id", id, resp.Status, resp.Raw)
		}
		if reqs := f.main.of(a.ID); len(reqs) != 1 || reqs[0].Path != "/v1/runs" {
			t.Errorf("run_id %s: requests %+v; want the POST alone", id, reqs)
		}
	}
}

// TestEchoedKeyNotInOutcomeUnknown: provider text the adapter quotes in an
// outcome_unknown message itself (a run_start answer without a run_id, a
// chat stream's error object) goes through the same redaction as the
// provider errors: a server or proxy echoing the Authorization header
// does not put the key into the journaled error.
func TestEchoedKeyNotInOutcomeUnknown(t *testing.T) {
	f := newFixture(t)
	check := func(what string, resp *hostsdktest.Response) {
		t.Helper()
		pe := resp.ProtocolError()
		if pe == nil || pe.Code != "connector_host.outcome_unknown" {
			t.Fatalf("%s: HTTP %d %s, want outcome_unknown", what, resp.Status, resp.Raw)
		}
		if strings.Contains(pe.Message, keyMain) || !strings.Contains(pe.Message, "[redacted]") {
			t.Errorf("%s: message %q; want the echoed key as [redacted]", what, pe.Message)
		}
	}
	f.main.mu.Lock()
	f.main.startAnswer = `{"status":"started","auth":"Bearer ` + keyMain + `"}`
	f.main.mu.Unlock()
	check("run_start", f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"x"}`)))
	// A run_id that is the echoed header: not a run ID, quoted redacted.
	f.main.mu.Lock()
	f.main.startAnswer = `{"status":"started","run_id":"Bearer ` + keyMain + `"}`
	f.main.mu.Unlock()
	check("run_start with the key as run_id", f.Act(t, hostsdktest.NewAction("cap:hermes_agent:main:run_start", `{"input":"y"}`)))

	f.main.setStream(sse(`{"error":{"message":"upstream refused Bearer `+keyMain+`"}}`, "[DONE]"))
	a := hostsdktest.NewAction("cap:hermes_agent:main:chat", `{"messages":[{"role":"user","content":"Hello!"}]}`)
	a.Mode = aip.ModeStreaming
	check("chat stream", f.Act(t, a))
}

// readReady reads the host's /ready over loopback, as a peer on the
// same machine (which sees the connector's detail).
func readReady(t *testing.T, f *hostsdktest.Fixture) hostsdk.ReadyDocument {
	t.Helper()
	req, err := http.NewRequestWithContext(hostsdktest.Context(t), http.MethodGet, "http://"+f.Host.Addr().String()+hostsdk.PathReady, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc hostsdk.ReadyDocument
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatalf("/ready: HTTP %d: %v", resp.StatusCode, err)
	}
	return doc
}

// actUntilPolled sends a (a run_start that waits for its run) to f's host
// and returns once the host follows the run it started on mock (its first
// status poll); the answer arrives on the channel returned.
func actUntilPolled(t *testing.T, ctx context.Context, f *hostsdktest.Fixture, a *aip.Action, mock *mockHermes) <-chan *hostsdktest.Response {
	t.Helper()
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := f.Dispatcher.Act(ctx, f.Target, a)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	select {
	case <-mock.polled:
	case <-ctx.Done():
		t.Fatal("run_start never polled its run")
	}
	return done
}
