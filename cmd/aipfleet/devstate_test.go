package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// TestClientsFindTheDevFleetOnItsPortBase: without --url or --control-url
// (or their variables), action, events and fleet talk to the dev fleet
// whose state is in ./.aipfleet, at the ports it recorded in dev.json, not
// at 8080 and 8090. When nothing answers there (a dev fleet that no longer
// runs), the error says the address came from that dev.json and which flag
// to give (else the user is left wondering why the commands tried that
// port); the same dead address given explicitly gets the plain error. A
// URL given explicitly wins, and a dev.json that cannot be read is an
// error naming the flag to give instead.
func TestClientsFindTheDevFleetOnItsPortBase(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	// Free ports that nothing listens on: the commands must try these,
	// and nothing answers there.
	base := freePortBase(t, 1)
	prepared(t, filepath.Join(work, DefaultDevStateDir), 1, base)
	state := filepath.Join(DefaultDevStateDir, "dev.json")
	dispatchURL := "http://127.0.0.1:" + strconv.Itoa(base)
	controlURL := "http://127.0.0.1:" + strconv.Itoa(base+controlPortOffset)
	for _, c := range []struct {
		args       []string
		want, flag string
	}{
		{[]string{"action", "send", "--capability", "echo.say", "--input", `{"message":"hi"}`, "--token", "t"}, "no dispatcher answers at " + dispatchURL, "--url"},
		{[]string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t"}, "no dispatcher answers at " + dispatchURL, "--url"},
		{[]string{"events", "list", "--token", "t"}, "no dispatcher answers at " + dispatchURL, "--url"},
		{[]string{"fleet", "status", "--token", "t"}, "no control plane answers at " + controlURL, "--control-url"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "recorded in "+state) || !strings.Contains(err.Error(), "give "+c.flag) {
			t.Errorf("%v: err = %v, want %q, naming %s and %s", c.args, err, c.want, state, c.flag)
		}
	}
	// The same dead addresses given explicitly: no word of dev.json.
	for _, args := range [][]string{
		{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t", "--url", dispatchURL},
		{"fleet", "status", "--token", "t", "--control-url", controlURL},
	} {
		_, _, err := runCLI(t, nil, args...)
		if err == nil || strings.Contains(err.Error(), "dev.json") || !strings.Contains(err.Error(), "answers at") {
			t.Errorf("%v: err = %v, want nothing answers there, without dev.json", args, err)
		}
	}

	// An explicit URL wins, as a flag or as its variable.
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, `{"error":{"code":"test.refused","category":"validation","retryable":false,"message":"no"}}`, http.StatusBadRequest)
	}))
	defer srv.Close()
	for _, c := range []struct {
		env  map[string]string
		args []string
	}{
		{nil, []string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t", "--url", srv.URL}},
		{map[string]string{"AIP_CLIENT_URL": srv.URL}, []string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t"}},
		{map[string]string{"AIP_CLIENT_URL": srv.URL}, []string{"events", "list", "--token", "t"}},
		{nil, []string{"fleet", "status", "--token", "t", "--control-url", srv.URL}},
		{map[string]string{"AIP_FLEET_CONTROL_URL": srv.URL}, []string{"fleet", "status", "--token", "t"}},
	} {
		before := hits.Load()
		_, _, err := runCLI(t, c.env, c.args...)
		if hits.Load() != before+1 {
			t.Errorf("%v %v: the given URL got no request (err %v)", c.env, c.args, err)
		}
	}

	// A state file that is not dev's: say so, and which flag to give.
	if err := os.WriteFile(filepath.Join(work, DefaultDevStateDir, "dev.json"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The error starts with the command as typed: "fleet status:", not
	// "fleet:".
	for _, c := range []struct {
		args         []string
		prefix, want string
	}{
		{[]string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t"}, "action get: ", "give --url"},
		{[]string{"events", "list", "--token", "t"}, "events list: ", "give --url"},
		{[]string{"fleet", "status", "--token", "t"}, "fleet status: ", "give --control-url"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), c.prefix) || !strings.Contains(err.Error(), "dev.json is not a dev state file") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v with a broken dev.json: err = %v, want a usage error starting %q and saying %q", c.args, err, c.prefix, c.want)
		}
	}
}
