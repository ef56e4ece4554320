package main

import (
	"context"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// textLine is a line of --log-format text: the time, the level, the
// message and its attributes, not a JSON object.
var textLine = regexp.MustCompile(`^time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(DEBUG|INFO|WARN|ERROR) msg=\S`)

// checkTextLog fails t unless every line of log is a text line.
func checkTextLog(t *testing.T, what, log string) {
	t.Helper()
	lines := strings.Split(strings.TrimSuffix(log, "\n"), "\n")
	if log == "" {
		t.Fatalf("%s logged nothing", what)
	}
	for _, l := range lines {
		if !textLine.MatchString(l) {
			t.Errorf("%s with --log-format text logged a line that is not text:\n%s\nlog:\n%s", what, l, log)
			return
		}
	}
}

// logWatch collects a log and closes seen when it holds want.
type logWatch struct {
	mu   sync.Mutex
	buf  strings.Builder
	want string
	seen chan struct{}
	once sync.Once
}

func (w *logWatch) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *logWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// runUntilLogged runs the command args with env until its log holds want,
// then stops it, and returns the log.
func runUntilLogged(t *testing.T, env map[string]string, want string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &logWatch{want: want, seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- run(ctx, args, func(k string) string { return env[k] }, &strings.Builder{}, w) }()
	select {
	case err := <-done:
		t.Fatalf("%s exited before logging %q: %v; log:\n%s", args[0], want, err, w.String())
	case <-w.seen:
		cancel()
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("%s did not log %q in 30s; log:\n%s", args[0], want, w.String())
	}
	if err := <-done; err != nil {
		t.Errorf("%s after cancel: %v; log:\n%s", args[0], err, w.String())
	}
	return w.String()
}

// TestServersLogText: the control plane and the dispatcher logged JSON
// only, whatever the operator's supervisor expects; --log-format text (or
// its variable) gives one readable line per event, the startup line too.
func TestServersLogText(t *testing.T) {
	f := newControlPlaneFixture(t)
	cp := runUntilLogged(t, nil, "status=starting", "control-plane", "--database-url-file", f.dbFile, "--signing-key-file", f.keyFile,
		"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http", "--log-format", "text")
	checkTextLog(t, "control-plane", cp)
	if !strings.Contains(cp, " level=INFO msg=starting ") || !strings.Contains(cp, " did="+f.key.DID()) {
		t.Errorf("control-plane's text startup line lacks its message or DID:\n%s", cp)
	}
	d := runUntilLogged(t, map[string]string{"AIP_DISPATCH_LOG_FORMAT": "text"}, "status=starting",
		"dispatch", "--database-url-file", f.dbFile, "--signing-key-file", f.keyFile, "--issuer", "dev="+f.key.DID(),
		"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http")
	checkTextLog(t, "dispatch", d)
}

// TestHostLogsText: aipfleet host logged JSON only; with --log-format text
// (or AIP_CONNECTOR_HOST_LOG_FORMAT=text) its bootstrap lines are text.
func TestHostLogsText(t *testing.T) {
	control, _ := aip.GenerateSigningKey()
	gateway, _ := aip.GenerateSigningKey()
	seed := filepath.Join(t.TempDir(), "seed")
	replica, _ := aip.GenerateSigningKey()
	if err := aip.WriteSeedFile(seed, replica); err != nil {
		t.Fatal(err)
	}
	args := []string{"host", "--connector", "echo",
		"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http",
		"--public-endpoint", "http://127.0.0.1:8081/aip/v1/messages",
		// Nothing listens there: the replica logs its bootstrap until
		// it is stopped.
		"--control-plane-endpoint", "http://127.0.0.1:1/aip/v1/connector-control",
		"--control-plane-did", control.DID(), "--gateway-did", gateway.DID(),
		"--signing-seed-file", seed,
		"--connector-type-id", aip.NewID(aip.PrefixType), "--version-id", aip.NewID(aip.PrefixVersion),
		"--instance-id", aip.NewID(aip.PrefixInstance), "--replica-id", aip.NewID(aip.PrefixReplica),
		"--tenant-id", "acme", "--trust-domain", "example.test", "--artifact-digest", aip.DigestBytes([]byte("a")),
		"--secret-provider-ref", "vault://acme/echo", "--state-dir", t.TempDir(), "--log-level", "debug",
	}
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
	}{
		{"flag", []string{"--log-format", "text"}, nil},
		{"variable", nil, map[string]string{"AIP_CONNECTOR_HOST_LOG_FORMAT": "text"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			log := runUntilLogged(t, c.env, "bootstrap step", append(args, c.args...)...)
			checkTextLog(t, "host", log)
		})
	}
}

// TestLogFormatRefused: a --log-format other than json or text, given or
// from the command's variable, is a usage error (exit 2) that names the
// flag, its variable and the accepted values. Dev's said "want text or
// json" without the variable.
func TestLogFormatRefused(t *testing.T) {
	dir := t.TempDir()
	db, key := controlPlaneFiles(t, dir)
	k, _ := aip.GenerateSigningKey()
	server := []string{"--database-url-file", db, "--signing-key-file", key, "--allow-insecure-loopback-http"}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"host", "--connector", "echo", "--log-format", "xml"}, nil,
			`host: --log-format (AIP_CONNECTOR_HOST_LOG_FORMAT) is "xml"; want json or text`},
		{[]string{"host", "--connector", "echo"}, map[string]string{"AIP_CONNECTOR_HOST_LOG_FORMAT": "logfmt"},
			`host: AIP_CONNECTOR_HOST_LOG_FORMAT (--log-format) is "logfmt"; want json or text`},
		{append([]string{"control-plane", "--log-format", "JSON"}, server...), nil,
			`control-plane: --log-format (AIP_CONTROL_LOG_FORMAT) is "JSON"; want json or text`},
		{append([]string{"control-plane"}, server...), map[string]string{"AIP_CONTROL_LOG_FORMAT": "xml"},
			`control-plane: AIP_CONTROL_LOG_FORMAT (--log-format) is "xml"; want json or text`},
		{append([]string{"dispatch", "--issuer", "dev=" + k.DID(), "--log-format", "xml"}, server...), nil,
			`dispatch: --log-format (AIP_DISPATCH_LOG_FORMAT) is "xml"; want json or text`},
		{append([]string{"dispatch", "--issuer", "dev=" + k.DID()}, server...), map[string]string{"AIP_DISPATCH_LOG_FORMAT": "xml"},
			`dispatch: AIP_DISPATCH_LOG_FORMAT (--log-format) is "xml"; want json or text`},
		{[]string{"dev", "--log-format", "xml", "--state-dir", t.TempDir()}, nil,
			`dev: --log-format (AIP_DEV_LOG_FORMAT) is "xml"; want json or text`},
	} {
		_, _, err := runCLI(t, c.env, c.args...)
		var u *usageError
		if !errors.As(err, &u) || err.Error() != c.want {
			t.Errorf("%v %v:\n got %v\nwant a usage error (exit 2): %s", c.args, c.env, err, c.want)
		}
	}
}
