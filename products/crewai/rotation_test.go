package crewai

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestCrewTokenRotationWithoutRestart: the crew's bearer token is
// rotated in AMP (which then accepts only the new one) and in the crews
// file's token_file, renamed over the old file; the next action and
// health check succeed on the same connector, sent with the new token.
func TestCrewTokenRotationWithoutRestart(t *testing.T) {
	m := newMockAMP(t)
	crewsFile := writeCrews(t, m.URL(), m.token)
	conn, err := Product.New(hostsdk.SettingValues{FlagCrewsFile: crewsFile}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := hostsdktest.Start(t, conn, nil)
	inputs := func() {
		t.Helper()
		if res := f.Result(t, hostsdktest.NewAction(capInputs, `{}`)); res.Status != aip.ResultCompleted {
			t.Fatalf("inputs: %s %+v", res.Status, res.Error)
		}
	}
	inputs()

	rotated := "amp-token-rotated-" + newUUID()
	m.set(func(m *mockAMP) { m.token = rotated })
	dir := filepath.Dir(crewsFile)
	tmp := filepath.Join(dir, ".research.token.new")
	if err := os.WriteFile(tmp, []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, "research.token")); err != nil {
		t.Fatal(err)
	}
	inputs()
	if err := conn.(hostsdk.HealthChecker).CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatalf("CheckHealth after the rotation: %v", err)
	}
	m.mu.Lock()
	last := m.auth[len(m.auth)-1]
	m.mu.Unlock()
	if last != "Bearer "+rotated {
		t.Errorf("the last request carried %q, want the rotated token", last)
	}
}
