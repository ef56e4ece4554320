package crewai

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const crewID = "research"

var (
	capRun    = CapabilityPrefix + crewID
	capInputs = capRun + ":" + SuffixInputs
	capStatus = capRun + ":" + SuffixStatus
	capResume = capRun + ":" + SuffixResume
)

// writeCrews writes a token file (0600) and a crews file naming one crew
// at baseURL, and returns the crews file's path.
func writeCrews(t *testing.T, baseURL, token string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "research.token"), []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	crews := []map[string]any{{"id": crewID, "base_url": baseURL, "token_file": "research.token",
		"description": "Researches a topic and writes a report."}}
	raw, _ := json.Marshal(crews)
	path := filepath.Join(dir, "crews.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// newTestConnector builds the connector the way aip-host does, through
// Product.New, with a 1 ms poll interval so that polling tests are fast.
func newTestConnector(t *testing.T, m *mockAMP) *Connector {
	t.Helper()
	conn, err := Product.New(hostsdk.SettingValues{FlagCrewsFile: writeCrews(t, m.URL(), m.token)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := conn.(*Connector)
	c.poll = time.Millisecond
	return c
}

type env struct {
	*hostsdktest.Fixture
	m    *mockAMP
	conn *Connector
}

// start runs the connector in a real host; edit may change the host's
// config (a pre-filled journal).
func start(t *testing.T, m *mockAMP, edit func(*hostsdk.Config)) *env {
	t.Helper()
	conn := newTestConnector(t, m)
	return &env{Fixture: hostsdktest.Start(t, conn, edit), m: m, conn: conn}
}

func (e *env) state(t *testing.T, a *aip.Action) aip.ActionState {
	t.Helper()
	st, _, err := e.Dispatcher.Status(hostsdktest.Context(t), e.Target, a.ID, a.CapabilityID)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

func wantFailed(t *testing.T, res *aip.ActionResult, code string, retryable bool) {
	t.Helper()
	if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != code {
		t.Fatalf("result %+v (error %+v), want failed with %s", res, res.Error, code)
	}
	if got := res.Error.Retryable != nil && *res.Error.Retryable; got != retryable {
		t.Errorf("%s retryable = %v, want %v", code, got, retryable)
	}
}

func wantOutcomeUnknown(t *testing.T, e *env, a *aip.Action) {
	t.Helper()
	resp := e.Act(t, a)
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("HTTP %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
	}
	if got := e.state(t, a); got != aip.StateOutcomeUnknown {
		t.Fatalf("journal state %s, want outcome_unknown", got)
	}
}

func decodeOutput(t *testing.T, res *aip.ActionResult) statusOutput {
	t.Helper()
	var out statusOutput
	if err := json.Unmarshal(res.Output, &out); err != nil {
		t.Fatalf("output %s: %v", res.Output, err)
	}
	return out
}

func TestRunKicksOffAndPollsUntilCompleted(t *testing.T) {
	m := newMockAMP(t)
	m.runningPolls = 3
	j, err := sqliteruntime.Open(hostsdktest.Context(t), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	e := start(t, m, func(cfg *hostsdk.Config) { cfg.Journal = j })
	stateID := newUUID()
	a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"AI agents","audience":"engineers"},"meta":{"requestId":"r-1"},"restore_from_state_id":"`+stateID+`"}`)
	res := e.Result(t, a)
	if res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v %+v", res, res.Error)
	}
	out := decodeOutput(t, res)
	if out.Status != "completed" || out.KickoffID == "" || out.Result == nil ||
		out.Result.Output != "Comprehensive report on "+out.KickoffID || len(out.Result.Tasks) != 2 ||
		out.Result.Tasks[1].Agent != "Writer" || out.ExecutionTime == nil || *out.ExecutionTime != 108.5 {
		t.Fatalf("output %s", res.Output)
	}
	// What AMP received: the document's kickoff body, no webhooks.
	var body map[string]any
	json.Unmarshal(m.kickoffBodies()[0], &body)
	want := map[string]any{"inputs": map[string]any{"topic": "AI agents", "audience": "engineers"},
		"meta": map[string]any{"requestId": "r-1"}, "restoreFromStateId": stateID}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("kickoff body (-want +got):\n%s", diff)
	}
	// The kickoff id was recorded for Reconcile.
	v, err := j.State(hostsdktest.Context(t), KickoffsNamespace, a.ID)
	if err != nil {
		t.Fatalf("kickoff record: %v", err)
	}
	var rec kickoffRecord
	json.Unmarshal(v.Value, &rec)
	if rec != (kickoffRecord{CrewID: crewID, KickoffID: out.KickoffID}) {
		t.Errorf("kickoff record %s", v.Value)
	}
	// Three "running" answers, then "completed".
	if got := m.pollCount(out.KickoffID); got != 4 {
		t.Errorf("%d status reads, want 4", got)
	}
	for _, h := range m.auths() {
		if h != "Bearer "+m.token {
			t.Errorf("Authorization %q", h)
		}
	}
	// The same action again: the journaled result, no second kickoff.
	if again := e.Result(t, a); string(again.Output) != string(res.Output) {
		t.Errorf("second delivery %s", again.Output)
	}
	if n := m.kickoffCount(); n != 1 {
		t.Errorf("%d kickoffs, want 1", n)
	}
	// The host's output schema check passed, and the manifest's run
	// capability is served as a mutation by the journal.
	served := strings.Join(m.checked.Served(), ",")
	for _, op := range []string{"POST /kickoff", "GET /status/{kickoff_id}"} {
		if !strings.Contains(served, op) {
			t.Errorf("served %s, missing %s", served, op)
		}
	}
}

func TestRunWithOnlyInputs(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	if res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{}}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v", res)
	}
	if got := string(m.kickoffBodies()[0]); got != `{"inputs":{}}` {
		t.Errorf("kickoff body %s", got)
	}
}

// TestRunMetaSentAsGiven: meta ("Additional metadata to pass to the
// crew", any JSON) reaches AMP as the caller wrote it: a large integer is
// not rounded through a float (9007199254740993 stayed 9007199254740992),
// nor is a number respelled.
func TestRunMetaSentAsGiven(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	meta := `{"orderId":9007199254740993,"ratio":0.1,"tags":["a"],"nested":{"n":12345678901234567890}}`
	if res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{},"meta":`+meta+`}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v %+v", res, res.Error)
	}
	decode := func(raw string) any {
		d := json.NewDecoder(strings.NewReader(raw))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatalf("%s: %v", raw, err)
		}
		return v
	}
	got, want := string(m.kickoffBodies()[0]), `{"inputs":{},"meta":`+meta+`}`
	if diff := cmp.Diff(decode(want), decode(got)); diff != "" {
		t.Errorf("kickoff body %s (-want +got):\n%s", got, diff)
	}
}

// TestRunWithInputsID: an inputs.id that is a UUID, which AMP accepts,
// is sent as it is (one that is not is refused before it is sent, see
// TestInputSchemaRejections).
func TestRunWithInputsID(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	id := newUUID()
	if res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"id":"`+id+`","topic":"x"}}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v %+v", res, res.Error)
	}
	if got, want := string(m.kickoffBodies()[0]), `{"inputs":{"id":"`+id+`","topic":"x"}}`; got != want {
		t.Errorf("kickoff body %s, want %s", got, want)
	}
}

func TestRunThatFailsOnAMP(t *testing.T) {
	m := newMockAMP(t)
	m.runningPolls, m.failRuns = 1, true
	e := start(t, m, nil)
	res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`))
	wantFailed(t, res, CodeExecutionFailed, false)
	if !strings.Contains(res.Error.Message, "Invalid API key for external service") {
		t.Errorf("message %q", res.Error.Message)
	}
}

// TestExecutionErrorRedacted: the error message of a run AMP reports
// "error" is provider text, and a crew, a tool or a proxy may echo the
// request's Authorization header in it: the failed result quotes it with
// the token redacted, as every other provider message is.
func TestExecutionErrorRedacted(t *testing.T) {
	m := newMockAMP(t)
	m.failRuns = true
	m.runError = "Task execution failed: request with Authorization: Bearer " + m.token + " was refused"
	e := start(t, m, nil)
	res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`))
	wantFailed(t, res, CodeExecutionFailed, false)
	if strings.Contains(res.Error.Message, m.token) || !strings.Contains(res.Error.Message, "Task execution failed") ||
		!strings.Contains(res.Error.Message, "[redacted]") {
		t.Errorf("message %q: want AMP's error with the token redacted", res.Error.Message)
	}
}

// start runs the connector with a short backoff cap and the given outage
// budget.
func startWithBudget(t *testing.T, m *mockAMP, budget time.Duration) *env {
	t.Helper()
	conn := newTestConnector(t, m)
	conn.backoffCap, conn.outageBudget = 2*time.Millisecond, budget
	return &env{Fixture: hostsdktest.Start(t, conn, nil), m: m, conn: conn}
}

// More status reads in a row fail (500) than the five that used to end
// the wait; within the outage budget they are retried and the run's result
// comes back.
func TestRunToleratesTransientStatusFailures(t *testing.T) {
	m := newMockAMP(t)
	m.statusFails = 12
	e := startWithBudget(t, m, time.Minute)
	res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`))
	if res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v %+v", res, res.Error)
	}
	if out := decodeOutput(t, res); out.Status != statusCompleted || m.pollCount(out.KickoffID) != 13 {
		t.Errorf("output %+v after %d reads, want completed after 13", out, m.pollCount(out.KickoffID))
	}
}

// kickoffOf is the kickoff id of the mock's only run.
func (m *mockAMP) kickoffOf(t *testing.T) string {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.runs) != 1 {
		t.Fatalf("%d runs, want 1", len(m.runs))
	}
	for id := range m.runs {
		return id
	}
	return ""
}

// Status reads that keep failing for longer than the outage budget end the
// wait outcome_unknown, naming the kickoff and the status capability; the
// crew is not kicked off again.
func TestRunWhoseStatusStaysUnreadableIsOutcomeUnknown(t *testing.T) {
	m := newMockAMP(t)
	m.statusFails = 1 << 30
	const budget = 300 * time.Millisecond
	e := startWithBudget(t, m, budget)
	a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`)
	began := time.Now()
	resp := e.Act(t, a)
	took := time.Since(began)
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("HTTP %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
	}
	id := m.kickoffOf(t)
	if !strings.Contains(pe.Message, id) || !strings.Contains(pe.Message, capStatus) {
		t.Errorf("message %q: want the kickoff id %s and %s", pe.Message, id, capStatus)
	}
	if got := e.state(t, a); got != aip.StateOutcomeUnknown {
		t.Fatalf("journal state %s, want outcome_unknown", got)
	}
	if took < budget {
		t.Errorf("the wait ended after %s, within the %s outage budget", took, budget)
	}
	if n := m.pollCount(id); n <= 5 {
		t.Errorf("%d status reads in the outage", n)
	}
	if n := m.kickoffCount(); n != 1 {
		t.Errorf("%d kickoffs, want 1", n)
	}
}

// A failure that is not transient (a 401 answering the status read) ends
// the wait at once as outcome_unknown, even within the outage budget and
// after transient failures. (A 404 says the kickoff is unknown: see
// TestRunKickoffNotFoundFailsAtOnce.)
func TestRunNonTransientStatusFailureEndsTheWait(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			m := newMockAMP(t)
			m.statusFails, m.statusStatus = 3, status
			e := startWithBudget(t, m, time.Hour)
			a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`)
			resp := e.Act(t, a)
			pe := resp.ProtocolError()
			if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Fatalf("HTTP %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
			}
			id := m.kickoffOf(t)
			if !strings.Contains(pe.Message, id) || !strings.Contains(pe.Message, capStatus) || !strings.Contains(pe.Message, strconv.Itoa(status)) {
				t.Errorf("message %q: want the kickoff id, %s and the %d", pe.Message, capStatus, status)
			}
			if n := m.pollCount(id); n != 4 {
				t.Errorf("%d status reads, want 4 (three 500s, then the %d)", n, status)
			}
		})
	}
}

// wantKickoffNotFound checks a run's answer for a kickoff id the crew
// does not know: outcome_unknown (the crew may have run before its record
// was lost), naming the crew and the kickoff id, what CrewAI AMP answered
// and what may have happened.
func wantKickoffNotFound(t *testing.T, resp *hostsdktest.Response, kickoffID, answered string) {
	t.Helper()
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("HTTP %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
	}
	for _, s := range []string{"crew " + crewID, kickoffID, answered, "expired", "redeployed", "base_url or token", "not kicked off again"} {
		if !strings.Contains(pe.Message, s) {
			t.Errorf("message %q does not say %q", pe.Message, s)
		}
	}
}

// A kickoff id the crew no longer knows (the crew was redeployed, the
// kickoff expired) ends the run's wait at once, outcome_unknown saying so
// (never failed: the crew may have run before its record was lost),
// whether CrewAI AMP answers the document's 404 or, as deployed crews do,
// the state NOT FOUND; the crew is not kicked off again. Before, the
// state was polled on as running until the action's timeout, and the
// 404's outcome_unknown did not say what it meant.
func TestRunKickoffNotFoundFailsAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name         string
		stateAnswers bool
		answered     string
	}{
		{"404", false, "answered 404: No execution found with ID"},
		{"state NOT FOUND", true, `answered the state "NOT FOUND"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMockAMP(t)
			m.forgetRuns, m.stateAnswers, m.statusFails = true, tc.stateAnswers, 2
			e := startWithBudget(t, m, time.Hour)
			a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`)
			timeout := uint64(20_000)
			a.TimeoutMS = &timeout
			began := time.Now()
			resp := e.Act(t, a)
			ids := m.answeredKickoffs()
			if len(ids) != 1 {
				t.Fatalf("%d kickoffs, want 1", len(ids))
			}
			wantKickoffNotFound(t, resp, ids[0], tc.answered)
			if n := m.pollCount(ids[0]); n != 3 {
				t.Errorf("%d status reads, want 3 (two 500s, then the answer that the kickoff is unknown)", n)
			}
			if took := time.Since(began); took > 10*time.Second {
				t.Errorf("the run ended after %s, not at once", took)
			}
			if got := e.state(t, a); got != aip.StateOutcomeUnknown {
				t.Errorf("journal state %s, want outcome_unknown", got)
			}
		})
	}
}

func TestKickoffErrors(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	t.Run("422 fails", func(t *testing.T) {
		m.set(func(m *mockAMP) { m.kickoffStatus = http.StatusUnprocessableEntity })
		res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{}}`))
		wantFailed(t, res, "provider.invalid_request", false)
		// The document's ValidationError names the missing inputs in
		// details.missing_inputs: the caller is told which to add.
		if !strings.Contains(res.Error.Message, "Missing required inputs") || !strings.Contains(res.Error.Message, `"missing_inputs":["topic"]`) {
			t.Errorf("message %q", res.Error.Message)
		}
	})
	for _, tc := range []struct {
		name string
		set  func(m *mockAMP)
	}{
		{"500", func(m *mockAMP) { m.kickoffStatus = http.StatusInternalServerError }},
		{"dropped connection", func(m *mockAMP) { m.kickoffStatus, m.dropKickoff = 0, true }},
	} {
		t.Run(tc.name+" is outcome_unknown", func(t *testing.T) {
			m.set(tc.set)
			before := m.kickoffCount()
			a := hostsdktest.NewAction(capRun, `{"inputs":{}}`)
			wantOutcomeUnknown(t, e, a)
			// Sent again under the same action ID: never re-run.
			wantOutcomeUnknown(t, e, a)
			if n := m.kickoffCount() - before; n != 1 {
				t.Errorf("%d kickoffs for one action, want 1", n)
			}
		})
	}
}

func TestInputs(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	res := e.Result(t, hostsdktest.NewAction(capInputs, `{}`))
	if res.Status != aip.ResultCompleted || string(res.Output) != `{"inputs":["topic","audience"]}` {
		t.Fatalf("result %+v output %s", res, res.Output)
	}
	m.set(func(m *mockAMP) { m.inputsStatus = http.StatusInternalServerError })
	wantFailed(t, e.Result(t, hostsdktest.NewAction(capInputs, `{}`)), "provider.unavailable", true)
}

func TestWrongTokenIsUnauthorized(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	good := m.token
	m.set(func(m *mockAMP) { m.token = "rotated" })
	res := e.Result(t, hostsdktest.NewAction(capInputs, `{}`))
	wantFailed(t, res, "provider.unauthorized", false)
	if strings.Contains(res.Error.Message, good) {
		t.Errorf("the error carries the token: %q", res.Error.Message)
	}
	if err := e.conn.CheckHealth(hostsdktest.Context(t)); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("CheckHealth with a refused token: %v", err)
	}
}

func TestStatus(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	running := m.addRun(100, false)
	res := e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+running+`"}`))
	out := decodeOutput(t, res)
	if out.Status != "running" || out.KickoffID != running || out.CurrentTask != "research_task" ||
		out.Progress == nil || *out.Progress.TotalTasks != 3 {
		t.Fatalf("output %s", res.Output)
	}
	failed := m.addRun(0, true)
	if out := decodeOutput(t, e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+failed+`"}`))); out.Status != "error" || out.Error == "" {
		t.Errorf("failed run's status %+v", out)
	}
	unknown := newUUID()
	res = e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+unknown+`"}`))
	wantFailed(t, res, "provider.not_found", false)
	if !strings.Contains(res.Error.Message, unknown) || !strings.Contains(res.Error.Message, "redeployed") {
		t.Errorf("unknown kickoff: message %q", res.Error.Message)
	}
	// A deployed crew's state NOT FOUND is not found too (it used to
	// complete as a running crew).
	m.set(func(m *mockAMP) { m.stateAnswers = true })
	res = e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+unknown+`"}`))
	wantFailed(t, res, "provider.not_found", false)
	if !strings.Contains(res.Error.Message, unknown) || !strings.Contains(res.Error.Message, `"NOT FOUND"`) {
		t.Errorf("state NOT FOUND: message %q", res.Error.Message)
	}
	m.set(func(m *mockAMP) { m.stateAnswers, m.statusFails = false, 1 })
	wantFailed(t, e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+running+`"}`)), "provider.unavailable", true)
}

func TestResume(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	id := m.addRun(100, false)
	res := e.Result(t, hostsdktest.NewAction(capResume, `{"kickoff_id":"`+id+`","task_id":"research_task","human_feedback":"Add sources.","is_approve":false}`))
	if res.Status != aip.ResultCompleted {
		t.Fatalf("result %+v %+v", res, res.Error)
	}
	var out map[string]any
	json.Unmarshal(res.Output, &out)
	if out["status"] != "retrying" || out["kickoff_id"] != id {
		t.Errorf("output %s", res.Output)
	}
	var body map[string]any
	json.Unmarshal(m.resumeBodies()[0], &body)
	want := map[string]any{"execution_id": id, "task_id": "research_task", "human_feedback": "Add sources.", "is_approve": false}
	if diff := cmp.Diff(want, body); diff != "" {
		t.Errorf("resume body (-want +got):\n%s", diff)
	}
	m.set(func(m *mockAMP) { m.resumeStatus = http.StatusBadRequest })
	wantFailed(t, e.Result(t, hostsdktest.NewAction(capResume, `{"kickoff_id":"`+id+`","task_id":"t","human_feedback":"ok","is_approve":true}`)),
		"provider.invalid_request", false)
	m.set(func(m *mockAMP) { m.resumeStatus = http.StatusBadGateway })
	a := hostsdktest.NewAction(capResume, `{"kickoff_id":"`+id+`","task_id":"t","human_feedback":"ok","is_approve":true}`)
	wantOutcomeUnknown(t, e, a)
	n := len(m.resumeBodies())
	wantOutcomeUnknown(t, e, a)
	if len(m.resumeBodies()) != n {
		t.Error("an outcome_unknown resume was sent again")
	}
}

func TestInputSchemaRejections(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	long := strings.Repeat("x", 257)
	for _, tc := range []struct{ capID, input string }{
		{capRun, `{}`},
		{capRun, `{"inputs":{"topic":1}}`},
		{capRun, `{"inputs":{},"taskWebhookUrl":"https://example.com"}`},
		{capRun, `{"inputs":{},"restore_from_state_id":"not-a-uuid"}`},
		// The document's 422: "'inputs.id' must be a valid UUID when provided".
		{capRun, `{"inputs":{"id":"test 1"}}`},
		{capRun, `{"inputs":{"` + long + `":"x"}}`},
		{capInputs, `{"x":1}`},
		{capStatus, `{}`},
		{capStatus, `{"kickoff_id":"../inputs"}`},
		{capResume, `{"kickoff_id":"` + newUUID() + `","task_id":"t","human_feedback":"ok"}`},
		{capResume, `{"kickoff_id":"` + newUUID() + `","task_id":"","human_feedback":"ok","is_approve":true}`},
	} {
		resp := e.Act(t, hostsdktest.NewAction(tc.capID, tc.input))
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s, want 400 %s", tc.capID, tc.input, resp.Status, resp.Raw, hostsdk.CodeInputInvalid)
		}
	}
	if n := m.kickoffCount(); n != 0 || len(m.resumeBodies()) != 0 {
		t.Errorf("rejected inputs reached AMP: %d kickoffs, %d resumes", n, len(m.resumeBodies()))
	}
}

// TestCancelStopsPolling cancels a run while it polls: the crew keeps
// running on AMP (it has no cancel), so the action is outcome_unknown
// naming the kickoff id, not cancelled; once the cancel is answered (the
// host waits for Handle to return) no status read of that run follows.
func TestCancelStopsPolling(t *testing.T) {
	m := newMockAMP(t)
	m.runningPolls = 1 << 30
	m.polled = make(chan string, 1)
	e := start(t, m, nil)
	ctx := hostsdktest.Context(t)
	a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"long"}}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := e.Dispatcher.Act(ctx, e.Target, a)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	var kickoffID string
	for range 3 {
		select {
		case kickoffID = <-m.polled:
		case <-ctx.Done():
			t.Fatal("no status reads")
		}
	}
	resp, err := e.Dispatcher.Cancel(ctx, e.Target, a.ID, capRun, "test")
	if err != nil {
		t.Fatal(err)
	}
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, kickoffID) {
		t.Fatalf("cancel answered HTTP %d %s, want %s naming kickoff %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown, kickoffID)
	}
	if resp := <-done; resp == nil {
		t.Fatal("no answer to the action")
	} else if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("the action answered HTTP %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
	}
	if got := e.state(t, a); got != aip.StateOutcomeUnknown {
		t.Fatalf("journal state %s, want outcome_unknown", got)
	}
	polls := m.pollCount(kickoffID)
	// Another run polls several times meanwhile; the cancelled one is not
	// read again.
	m.set(func(m *mockAMP) { m.runningPolls, m.polled = 5, nil })
	if res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{}}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("second run %+v", res)
	}
	if got := m.pollCount(kickoffID); got != polls {
		t.Errorf("the cancelled run was read %d more times", got-polls)
	}
}

func TestHealth(t *testing.T) {
	m := newMockAMP(t)
	conn := newTestConnector(t, m)
	if err := conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	var calls int
	m.set(func(m *mockAMP) { calls = m.inputsCalls })
	if calls != 1 {
		t.Errorf("%d GET /inputs, want 1", calls)
	}
	m.set(func(m *mockAMP) { m.inputsStatus = http.StatusInternalServerError })
	if err := conn.CheckHealth(hostsdktest.Context(t)); err == nil || !strings.Contains(err.Error(), "crew research") {
		t.Errorf("CheckHealth with AMP failing: %v", err)
	}
}

// leaveRunning journals an action the way a process killed mid-run
// leaves it, and records kickoffID for it when not empty.
func leaveRunning(t *testing.T, j journal.Journal, a *aip.Action, kickoffID string) {
	t.Helper()
	ctx := hostsdktest.Context(t)
	digest, _ := aip.DigestJSON(a.Input)
	now := time.Now()
	if _, created, err := j.BeginAction(ctx, journal.Action{ActionID: a.ID, CapabilityID: a.CapabilityID,
		TenantID: hostsdktest.TenantID, InputDigest: digest, ReceivedAt: now}); err != nil || !created {
		t.Fatal(created, err)
	}
	if err := j.StartAction(ctx, a.ID, now); err != nil {
		t.Fatal(err)
	}
	if kickoffID != "" {
		raw, _ := json.Marshal(kickoffRecord{CrewID: crewID, KickoffID: kickoffID})
		if _, err := j.PutState(ctx, KickoffsNamespace, a.ID, raw, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReconcileAfterRestart starts a host on a journal a crashed process
// left with runs in flight: with a recorded kickoff id the run is settled
// from AMP's status; without one, or still running, it is
// outcome_unknown; an interrupted read fails retryably.
func TestReconcileAfterRestart(t *testing.T) {
	m := newMockAMP(t)
	j, err := sqliteruntime.Open(hostsdktest.Context(t), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	completed := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"a"}}`)
	failed := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"b"}}`)
	stillRunning := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"c"}}`)
	unrecorded := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"d"}}`)
	garbled := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"e"}}`)
	read := hostsdktest.NewAction(capInputs, `{}`)
	leaveRunning(t, j, completed, m.addRun(0, false))
	leaveRunning(t, j, failed, m.addRun(0, true))
	leaveRunning(t, j, stillRunning, m.addRun(100, false))
	leaveRunning(t, j, unrecorded, "")
	leaveRunning(t, j, read, "")
	// A kickoff record that cannot be read back does not stop the host
	// from starting: its run is outcome_unknown.
	leaveRunning(t, j, garbled, "")
	if _, err := j.PutState(hostsdktest.Context(t), KickoffsNamespace, garbled.ID, json.RawMessage(`"not a record"`), 0); err != nil {
		t.Fatal(err)
	}
	e := start(t, m, func(cfg *hostsdk.Config) { cfg.Journal = j })

	res := e.Result(t, completed)
	if out := decodeOutput(t, res); res.Status != aip.ResultCompleted || out.Status != "completed" || out.Result == nil {
		t.Errorf("completed run reconciled as %+v %s", res, res.Output)
	}
	wantFailed(t, e.Result(t, failed), CodeExecutionFailed, false)
	wantFailed(t, e.Result(t, read), CodeInterrupted, true)
	for _, a := range []*aip.Action{stillRunning, unrecorded, garbled} {
		if got := e.state(t, a); got != aip.StateOutcomeUnknown {
			t.Errorf("journal state %s, want outcome_unknown", got)
		}
	}
	if n := m.kickoffCount(); n != 0 {
		t.Errorf("recovery kicked off %d runs", n)
	}
}

// TestReconcileDirect calls Reconcile with a state store whose kickoff
// record is set or not, through the journal a host hands it.
// A run a restart interrupted whose recorded kickoff the crew no longer
// knows is settled outcome_unknown saying so, from the document's 404 or a
// deployed crew's state NOT FOUND, and the crew is not kicked off again.
// Before, the state read as still running.
func TestReconcileKickoffNotFound(t *testing.T) {
	for _, tc := range []struct {
		name         string
		stateAnswers bool
		answered     string
	}{
		{"404", false, "answered 404: No execution found with ID"},
		{"state NOT FOUND", true, `answered the state "NOT FOUND"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMockAMP(t)
			m.stateAnswers = tc.stateAnswers
			j, err := sqliteruntime.Open(hostsdktest.Context(t), sqliteruntime.Config{Dir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { j.Close() })
			lost := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"a"}}`)
			kickoffID := newUUID() // unknown to the mock
			leaveRunning(t, j, lost, kickoffID)
			e := start(t, m, func(cfg *hostsdk.Config) { cfg.Journal = j })

			wantKickoffNotFound(t, e.Act(t, lost), kickoffID, tc.answered)
			if got := e.state(t, lost); got != aip.StateOutcomeUnknown {
				t.Errorf("journal state %s, want outcome_unknown", got)
			}
			if n := m.pollCount(kickoffID); n != 1 {
				t.Errorf("%d status reads, want 1", n)
			}
			if n := m.kickoffCount(); n != 0 {
				t.Errorf("recovery kicked off %d runs", n)
			}
		})
	}
}

func TestReconcileDirect(t *testing.T) {
	m := newMockAMP(t)
	conn := newTestConnector(t, m)
	ctx := hostsdktest.Context(t)
	u := &hostsdk.UncertainAction{Action: journal.Action{ActionID: aip.NewActionID(), CapabilityID: capRun}}
	// No state at all: the kickoff may have happened.
	if _, err := conn.Reconcile(ctx, u); !errorsIsOutcomeUnknown(err) {
		t.Errorf("without a record: %v, want outcome unknown", err)
	}
	// A resume in flight: outcome unknown.
	u.Action.CapabilityID = capResume
	if _, err := conn.Reconcile(ctx, u); !errorsIsOutcomeUnknown(err) {
		t.Errorf("resume: %v, want outcome unknown", err)
	}
}

func errorsIsOutcomeUnknown(err error) bool { return errors.Is(err, hostsdk.ErrOutcomeUnknown) }

func TestManifest(t *testing.T) {
	m := newMockAMP(t)
	conn := newTestConnector(t, m)
	man, err := conn.Manifest(context.Background(), hostsdk.TenantContext{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if man.Agent.ID != "agent:crewai:acme" || man.Agent.Kind != aip.PrincipalAgent {
		t.Errorf("agent %+v", man.Agent)
	}
	if !strings.Contains(strings.Join(man.Profiles, ","), Profile) {
		t.Errorf("profiles %v", man.Profiles)
	}
	want := map[string]struct {
		kind aip.CapabilityKind
		risk aip.Risk
		mut  bool
	}{
		capRun:    {aip.KindAgent, aip.RiskMedium, true},
		capInputs: {aip.KindTool, aip.RiskLow, false},
		capStatus: {aip.KindTool, aip.RiskLow, false},
		capResume: {aip.KindTool, aip.RiskMedium, true},
	}
	if len(man.Capabilities) != len(want) {
		t.Fatalf("%d capabilities", len(man.Capabilities))
	}
	for _, c := range man.Capabilities {
		w, ok := want[c.ID]
		if !ok {
			t.Errorf("unexpected capability %s", c.ID)
			continue
		}
		mut := c.Contract.Idempotency.Requirement == aip.IdempotencyRequired
		if c.Kind != w.kind || c.Risk != w.risk || mut != w.mut || c.RequiresHumanApproval != nil || c.Description == "" {
			t.Errorf("%s: kind %s risk %s mutation %v approval %v", c.ID, c.Kind, c.Risk, mut, c.RequiresHumanApproval)
		}
		var schema map[string]any
		if err := json.Unmarshal(c.InputSchema, &schema); err != nil {
			t.Fatal(err)
		}
		if schema["type"] != "object" || schema["additionalProperties"] != false || schema["required"] == nil {
			t.Errorf("%s input schema is not strict: %s", c.ID, c.InputSchema)
		}
	}
	bound, _, err := hostsdk.BindManifest(man, "example.test")
	if err != nil {
		t.Fatal(err)
	}
	if bound.Agent.TrustDomain != "example.test" {
		t.Errorf("bound agent %+v", bound.Agent)
	}
	raw, _ := json.Marshal(man)
	if strings.Contains(string(raw), m.token) {
		t.Error("the manifest carries the token")
	}
	// No tenant: the default namespace.
	man, _ = conn.Manifest(context.Background(), hostsdk.TenantContext{})
	if man.Agent.ID != "agent:crewai:"+DefaultNamespace {
		t.Errorf("agent without a tenant: %s", man.Agent.ID)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	write("ok.token", "secret-token", 0o600)
	write("open.token", "secret-token", 0o644)
	crews := func(name, body string) string { return write(name, body, 0o644) }
	many := make([]map[string]string, 129)
	for i := range many {
		many[i] = map[string]string{"id": "c" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), "base_url": "https://x.crewai.com", "token_file": "ok.token"}
	}
	manyRaw, _ := json.Marshal(many)
	for _, tc := range []struct {
		name, file, want string
	}{
		{"no file", "", "--crewai-crews-file"},
		{"missing file", filepath.Join(dir, "nope.json"), "--crewai-crews-file"},
		{"writable by others", write("open.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"ok.token"}]`, 0o666), "chmod go-w"},
		{"not JSON", crews("bad.json", `{`), "not a JSON array"},
		{"trailing data", crews("trail.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"ok.token"}] []`), "data after"},
		{"empty", crews("empty.json", `[]`), "lists 0 entries"},
		{"unknown field", crews("unknown.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"ok.token","name":"x"}]`), `unknown field "name"`},
		{"bad id", crews("id.json", `[{"id":"a b","base_url":"https://a.crewai.com","token_file":"ok.token"}]`), "letters, digits"},
		{"duplicate id", crews("dup.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"ok.token"},{"id":"a","base_url":"https://b.crewai.com","token_file":"ok.token"}]`), "listed twice"},
		{"no base URL", crews("nobase.json", `[{"id":"a","token_file":"ok.token"}]`), `crew "a" base_url: no URL`},
		{"insecure base URL", crews("http.json", `[{"id":"a","base_url":"http://a.crewai.com","token_file":"ok.token"}]`), "use https"},
		{"base URL with a path", crews("path.json", `[{"id":"a","base_url":"https://a.crewai.com/kickoff","token_file":"ok.token"}]`), "has a path"},
		{"no token file", crews("notoken.json", `[{"id":"a","base_url":"https://a.crewai.com"}]`), `crew "a" token_file: no file given`},
		{"missing token file", crews("missingtoken.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"gone.token"}]`), `crew "a" token_file`},
		{"token readable by others", crews("opentoken.json", `[{"id":"a","base_url":"https://a.crewai.com","token_file":"open.token"}]`), "chmod 600"},
		{"too many crews for one manifest", crews("many.json", string(manyRaw)), "at most 128 crews"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Product.New(hostsdk.SettingValues{FlagCrewsFile: tc.file}, nil)
			if err == nil {
				t.Fatal("New accepted it")
			}
			if !errors.Is(err, hostsdk.ErrSetting) {
				t.Errorf("error %q does not match hostsdk.ErrSetting (aip-host would exit 1, not 2)", err)
			}
			if !strings.Contains(err.Error(), "--crewai-crews-file") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to name --crewai-crews-file and say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "secret-token") {
				t.Errorf("error carries the token: %q", err)
			}
		})
	}
	// The numeric settings are bounded by the setting itself.
	for _, s := range Product.Settings {
		if s.Flag == FlagPollInterval && (s.Min != 50 || s.Kind != hostsdk.SettingMillis) {
			t.Errorf("poll interval setting %+v", s)
		}
	}
	// A good file, loopback http, with defaults.
	good := crews("good.json", `[{"id":"a","base_url":"http://127.0.0.1:9","token_file":"ok.token","description":"d"}]`)
	conn, err := Product.New(hostsdk.SettingValues{FlagCrewsFile: good}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := conn.(*Connector); c.poll != DefaultPollInterval {
		t.Errorf("poll %v", c.poll)
	}
}

// TestKickoffUnusableID: a kickoff_id AMP answers that is not a UUID (the
// document's format) — a path separator, a dot segment, a query mark, a
// control character, too long, not a string — is never put into a status
// path: the run ends outcome_unknown (AMP accepted the kickoff; the crew
// may be running) without a status read, and is not kicked off again.
func TestKickoffUnusableID(t *testing.T) {
	m := newMockAMP(t)
	e := start(t, m, nil)
	for _, id := range []string{`"abc/def"`, `".."`, `"../inputs"`, `"x?y=1"`, `"6b1f0c2e-6d43-4c0e-9a51-2f1d3b7e8a90/.."`,
		`"6b1f0c2e-6d43-4c0e-9a51-2f1d3b7e8a9\u0001"`, `"` + strings.Repeat("a", 300) + `"`, `42`, `{"id":"x"}`} {
		m.set(func(m *mockAMP) { m.kickoffID = json.RawMessage(id) })
		before := m.kickoffCount()
		a := hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`)
		wantOutcomeUnknown(t, e, a)
		m.mu.Lock()
		polls := len(m.polls)
		m.mu.Unlock()
		if polls != 0 || m.kickoffCount()-before != 1 {
			t.Errorf("kickoff_id %s: %d status paths read, %d kickoffs; want none and 1", id, polls, m.kickoffCount()-before)
		}
	}
	// A kickoff_id that echoes the request's Authorization header is
	// quoted with the token redacted.
	m.set(func(m *mockAMP) { m.kickoffID = json.RawMessage(`"Bearer ` + m.token + `"`) })
	resp := e.Act(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"y"}}`))
	if pe := resp.ProtocolError(); pe == nil || strings.Contains(pe.Message, m.token) || !strings.Contains(pe.Message, "[redacted]") {
		t.Errorf("HTTP %d %s: want outcome_unknown quoting the kickoff_id with the token redacted", resp.Status, resp.Raw)
	}
}

// --crewai-outage-budget-ms sets how long status reads may keep failing;
// without it the budget is DefaultOutageBudget, and a value out of its
// bounds is refused.
func TestOutageBudgetSetting(t *testing.T) {
	m := newMockAMP(t)
	file := writeCrews(t, m.URL(), m.token)
	for _, tc := range []struct {
		args []string
		want time.Duration
		err  string
	}{
		{nil, DefaultOutageBudget, ""},
		{[]string{"--" + FlagOutageBudget + "=90000"}, 90 * time.Second, ""},
		{[]string{"--" + FlagOutageBudget + "=500"}, 0, FlagOutageBudget},
		{[]string{"--" + FlagOutageBudget + "=86400001"}, 0, FlagOutageBudget},
	} {
		fs := flag.NewFlagSet("crewai", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		read := hostsdk.BindSettings(fs, Product.Settings)
		if err := fs.Parse(append([]string{"--" + FlagCrewsFile + "=" + file}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		values, err := read(nil)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%v: error %v, want one naming %s", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		conn, err := Product.New(values, nil)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := conn.(*Connector).outageBudget; got != tc.want {
			t.Errorf("%v: outage budget %s, want %s", tc.args, got, tc.want)
		}
	}
}
