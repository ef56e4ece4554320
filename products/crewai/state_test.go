package crewai

import (
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestDeployedCrewStateAnswers: a deployed crew answers GET /status with
// {"state", "result"} and no status — the document says status, but
// CrewAI's own client of this API (crewai-tools'
// InvokeCrewAIAutomationTool) reads state "success" / "failed" and
// result. Such answers follow the run to its end: RUNNING is polled on,
// SUCCESS completes with the result string as the output, FAILED fails
// crewai.execution_failed quoting it; the status capability returns them
// mapped, with the state as answered. Before, the first such answer was
// "the status answer has no status" and every run ended outcome_unknown.
func TestDeployedCrewStateAnswers(t *testing.T) {
	m := newMockAMP(t)
	m.stateAnswers, m.runningPolls = true, 2
	e := start(t, m, nil)

	res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`))
	if res.Status != aip.ResultCompleted {
		t.Fatalf("run: %s %+v", res.Status, res.Error)
	}
	out := decodeOutput(t, res)
	if out.Status != statusCompleted || out.State != "SUCCESS" || out.Result == nil ||
		!strings.HasPrefix(out.Result.Output, "Comprehensive report on "+out.KickoffID) {
		t.Errorf("run output %s", res.Output)
	}
	if n := m.pollCount(out.KickoffID); n != 3 {
		t.Errorf("%d status reads, want 3 (two RUNNING, then SUCCESS)", n)
	}

	m.set(func(m *mockAMP) { m.failRuns = true })
	res = e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"y"}}`))
	wantFailed(t, res, CodeExecutionFailed, false)
	if !strings.Contains(res.Error.Message, "Invalid API key for external service") {
		t.Errorf("failed run message %q", res.Error.Message)
	}

	running := m.addRun(5, false)
	res = e.Result(t, hostsdktest.NewAction(capStatus, `{"kickoff_id":"`+running+`"}`))
	if out := decodeOutput(t, res); res.Status != aip.ResultCompleted || out.Status != statusRunning || out.State != "RUNNING" {
		t.Errorf("status of a running crew: %s %s", res.Status, res.Output)
	}
}
