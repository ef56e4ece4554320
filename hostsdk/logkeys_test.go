package hostsdk_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestLogLinesHoldEachKeyOnce: the host's logger carries replica_id (and
// the rest of its identity) already, so no line repeats a key: a JSON line
// with a key twice is read differently by different log pipelines. A first
// start logs both that the native ingress waits for registration and the
// journal's origin, the lines that repeated replica_id before.
func TestLogLinesHoldEachKeyOnce(t *testing.T) {
	f := newFleet(t)
	var logs hostsdktest.LogBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := hostsdktest.StartHost(t, f.cfg, newTestConnector())
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"the native ingress is served once the replica has registered", "the journal serves this replica ID from its registration on"} {
		if !strings.Contains(logs.String(), msg) {
			t.Errorf("no line %q:\n%s", msg, logs.String())
		}
	}
	for line := range strings.Lines(logs.String()) {
		if dup := duplicateKey(t, line); dup != "" {
			t.Errorf("key %q twice in %s", dup, line)
		}
	}
}

// duplicateKey returns a key that one object of the JSON line holds twice,
// or "".
func duplicateKey(t *testing.T, line string) string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	var walk func() string
	walk = func() string {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("%v in %s", err, line)
		}
		switch tok {
		case json.Delim('{'):
			seen, dup := map[string]bool{}, ""
			for dec.More() {
				k, err := dec.Token()
				if err != nil {
					t.Fatalf("%v in %s", err, line)
				}
				if seen[k.(string)] && dup == "" {
					dup = k.(string)
				}
				seen[k.(string)] = true
				if d := walk(); d != "" && dup == "" {
					dup = d
				}
			}
			dec.Token()
			return dup
		case json.Delim('['):
			dup := ""
			for dec.More() {
				if d := walk(); d != "" && dup == "" {
					dup = d
				}
			}
			dec.Token()
			return dup
		}
		return ""
	}
	dup := walk()
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("trailing data in %s", line)
	}
	return dup
}
