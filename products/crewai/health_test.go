package crewai

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// twoCrews builds the connector over two crews, "research" on good and
// "triage" on bad, each with its own token, as Product.New does.
func twoCrews(t *testing.T, good, bad *mockAMP) *Connector {
	t.Helper()
	dir := t.TempDir()
	crews := []map[string]any{
		{"id": crewID, "base_url": good.URL(), "token_file": "research.token"},
		{"id": "triage", "base_url": bad.URL(), "token_file": "triage.token"},
	}
	for name, token := range map[string]string{"research.token": good.token, "triage.token": bad.token} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(token), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	raw, _ := json.Marshal(crews)
	path := filepath.Join(dir, "crews.json")
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	conn, err := Product.New(hostsdk.SettingValues{FlagCrewsFile: path}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := conn.(*Connector)
	c.poll = time.Millisecond
	return c
}

// TestOneCrewFailingKeepsTheReplicaReady: a crew whose token AMP no
// longer accepts does not make the replica not ready (which would take
// every crew offline): the host starts and serves the other crew, and
// the bad crew's actions fail at once, naming the crew and its check's
// failure, without a request to its deployment.
func TestOneCrewFailingKeepsTheReplicaReady(t *testing.T) {
	good, bad := newMockAMP(t), newMockAMP(t)
	conn := twoCrews(t, good, bad)
	badToken := bad.token
	bad.set(func(m *mockAMP) { m.token = "rotated" })
	e := &env{Fixture: hostsdktest.Start(t, conn, nil), m: good, conn: conn}
	if !e.Host.Ready() {
		t.Fatal("the replica is not ready with one crew of two failing its check")
	}

	good.set(func(m *mockAMP) { m.runningPolls = 1 })
	if res := e.Result(t, hostsdktest.NewAction(capRun, `{"inputs":{"topic":"x"}}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("the healthy crew's run: %+v %+v", res, res.Error)
	}

	before := len(bad.auths())
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"triage", `{"inputs":{"topic":"x"}}`))
	wantFailed(t, res, "provider.unauthorized", false)
	for _, want := range []string{"crew triage", "not sent", "nothing ran", "401"} {
		if !strings.Contains(res.Error.Message, want) {
			t.Errorf("message %q does not say %q", res.Error.Message, want)
		}
	}
	if strings.Contains(res.Error.Message, badToken) {
		t.Errorf("the message carries a token: %q", res.Error.Message)
	}
	if n := bad.kickoffCount(); n != 0 {
		t.Errorf("%d kickoffs sent to the crew that failed its check", n)
	}
	if after := len(bad.auths()); after != before {
		t.Errorf("%d requests sent to the crew that failed its check", after-before)
	}

	// Fixed, it passes the next check and is served again.
	bad.set(func(m *mockAMP) { m.token = badToken })
	if err := conn.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	if res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"triage:"+SuffixInputs, `{}`)); res.Status != aip.ResultCompleted {
		t.Fatalf("the crew fixed: %+v %+v", res, res.Error)
	}
}

// TestCheckHealthPerCrew: the check fails only when every crew fails,
// naming each; a crew that does not answer fails its own check before
// the probe's deadline, so the others' outcome reaches the host in time;
// a crew failing transiently has its actions fail retryably.
func TestCheckHealthPerCrew(t *testing.T) {
	good, bad := newMockAMP(t), newMockAMP(t)
	conn := twoCrews(t, good, bad)

	bad.set(func(m *mockAMP) { m.inputsHang = true })
	ctx, cancel := context.WithTimeout(hostsdktest.Context(t), 400*time.Millisecond)
	defer cancel()
	var d *hostsdk.DegradedError
	if err := conn.CheckHealth(ctx); !errors.As(err, &d) || !strings.Contains(err.Error(), "crew triage") {
		t.Fatalf("one crew not answering: %v, want degraded naming crew triage", err)
	}
	if ctx.Err() != nil {
		t.Fatal("CheckHealth returned after the probe's deadline, which the host counts as not ready")
	}
	bad.set(func(m *mockAMP) { m.inputsHang = false; m.inputsStatus = http.StatusServiceUnavailable })
	e := &env{Fixture: hostsdktest.Start(t, conn, nil), m: good, conn: conn}
	if err := conn.CheckHealth(hostsdktest.Context(t)); !errors.As(err, &d) || strings.Contains(err.Error(), "crew research") {
		t.Fatalf("crew triage failing: %v, want degraded naming crew triage only", err)
	}
	res := e.Result(t, hostsdktest.NewAction(CapabilityPrefix+"triage:"+SuffixInputs, `{}`))
	wantFailed(t, res, "provider.unavailable", true)
	if !strings.Contains(res.Error.Message, "crew triage failed its last health check") {
		t.Errorf("message %q", res.Error.Message)
	}

	good.set(func(m *mockAMP) { m.inputsStatus = http.StatusInternalServerError })
	err := conn.CheckHealth(hostsdktest.Context(t))
	if err == nil || !strings.Contains(err.Error(), "every crew failed") ||
		!strings.Contains(err.Error(), "crew research") || !strings.Contains(err.Error(), "crew triage") {
		t.Fatalf("every crew failing: %v", err)
	}
}
