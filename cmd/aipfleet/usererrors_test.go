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
	"syscall"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
)

// TestEmptyTokenFlagsAreRefused: `--token "$TOKEN"` with TOKEN unset is
// `--token ""`, which fell back in silence to what no --token means
// (aipfleet dev's token, here a working one): the command then ran with
// another identity than the command line named. Every such flag given
// empty is a usage error naming it, and nothing is sent.
func TestEmptyTokenFlagsAreRefused(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	prepared(t, filepath.Join(work, DefaultDevStateDir), 1, 0)
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "{}", http.StatusTeapot)
	}))
	defer srv.Close()
	id := "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"action", "send", "--url", srv.URL, "--capability", "echo.say", "--input", "{}", "--token", ""}, "--token"},
		{[]string{"action", "get", id, "--url", srv.URL, "--token="}, "--token"},
		{[]string{"action", "cancel", id, "--url", srv.URL, "--tenant", ""}, "--tenant"},
		{[]string{"action", "get", id, "--url", srv.URL, "--dev-state-dir", ""}, "--dev-state-dir"},
		{[]string{"action", "get", id, "--url", srv.URL, "--issuer-key", ""}, "--issuer-key"},
		{[]string{"events", "list", "--url", srv.URL, "--token", ""}, "--token"},
		{[]string{"events", "list", "--url", srv.URL, "--dev-state-dir", ""}, "--dev-state-dir"},
		{[]string{"capability", "list", "--url", srv.URL, "--tenant", ""}, "--tenant"},
		{[]string{"capability", "get", "echo.say", "--url", srv.URL, "--issuer-key="}, "--issuer-key"},
		{[]string{"fleet", "status", "--control-url", srv.URL, "--token", ""}, "--token"},
		{[]string{"fleet", "status", "--control-url", srv.URL, "--issuer-key", ""}, "--issuer-key"},
		{[]string{"fleet", "status", "--control-url", srv.URL, "--dev-state-dir="}, "--dev-state-dir"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.flag+" is empty") {
			t.Errorf("%v: err = %v, want a usage error saying %s is empty", c.args, err, c.flag)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests were sent with an empty flag", n)
	}
}

// TestDispatcherRefusalSaysWhatToCheck: a 401 of the dispatcher was only
// its code ("HTTP 401: dispatch.unauthorized: ..."); the error now says
// what to check, by where the token came from: --token, a token minted
// with --issuer-key, or aipfleet dev's (a token of another dev fleet's
// issuer, or a dispatcher that is not dev's).
func TestDispatcherRefusalSaysWhatToCheck(t *testing.T) {
	work := t.TempDir()
	t.Chdir(work)
	prepared(t, filepath.Join(work, DefaultDevStateDir), 1, 0)
	// A dev token this dispatcher does not trust (another dev fleet's).
	if err := os.WriteFile(filepath.Join(work, DefaultDevStateDir, devTokenFile), []byte("not-this-fleets-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	trusted, _ := aip.GenerateSigningKey()
	v, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{trusted.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv, _, _ := fakeDispatcher(t, v)
	other, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(work, "other.key")
	if err := aip.WriteSeedFile(keyFile, other); err != nil {
		t.Fatal(err)
	}
	id := "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"action", "get", id, "--token", "nope"}, []string{"refused the token of --token", "aipfleet dispatch --issuer NAME=DID"}},
		{[]string{"action", "send", "--capability", "echo.say", "--input", "{}", "--tenant", "acme", "--issuer-key", keyFile},
			[]string{"refused the token minted with --issuer-key " + keyFile, "--issuer aipfleet-dev=DID", "aipfleet keygen --did-of " + keyFile}},
		{[]string{"events", "list"}, []string{"refused aipfleet dev's token (" + filepath.Join(DefaultDevStateDir, devTokenFile) + ")", "is --url that dispatcher?"}},
		{[]string{"action", "cancel", id}, []string{"refused aipfleet dev's token"}},
		{[]string{"capability", "list"}, []string{"refused aipfleet dev's token (" + filepath.Join(DefaultDevStateDir, devTokenFile) + ")", "is --url that dispatcher?"}},
		{[]string{"capability", "get", "echo.say", "--token", "nope"}, []string{"refused the token of --token"}},
	} {
		_, _, err := runCLI(t, nil, append(c.args, "--url", srv.URL)...)
		if err == nil || !strings.Contains(err.Error(), "HTTP 401") {
			t.Errorf("%v: err = %v, want the dispatcher's 401", c.args, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: err = %v\nwant it to say %q", c.args, err, w)
			}
		}
	}
}

// TestActionGetNotFoundSaysWhy: the dispatcher's 404 not_found for an
// action ID was "HTTP 404: dispatch.not_found: no such action", naming
// neither the action nor why a known action is not found (it belongs to
// another tenant, or another fleet). A server that is not the dispatcher
// answers a 404 body whose trailing newline was printed as \u000a.
func TestActionGetNotFoundSaysWhy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/aip/v1/actions/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error":{"code":"dispatch.not_found","category":"permanent","retryable":false,"message":"no such action"}}`))
			return
		}
		http.NotFound(w, r)
	}))
	defer srv.Close()
	id := "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	_, _, err := runCLI(t, nil, "action", "get", id, "--url", srv.URL, "--token", "t")
	if err == nil || !strings.Contains(err.Error(), "action "+id+": HTTP 404: dispatch.not_found") ||
		!strings.Contains(err.Error(), "no action with this ID for the token's tenant") {
		t.Fatalf("get of an unknown action: err = %v", err)
	}
	_, _, err = runCLI(t, nil, "action", "send", "--url", srv.URL+"/other", "--token", "t", "--capability", "c", "--input", "{}")
	if err == nil || !strings.Contains(err.Error(), "HTTP 404: 404 page not found") || strings.Contains(err.Error(), `\u000a`) {
		t.Fatalf("send to a server that is not the dispatcher: err = %v", err)
	}
}

// TestClientsSayWhereTheyLookedForDev: run in a subdirectory of the one
// aipfleet dev runs in, the client commands found no .aipfleet and said
// only "none there now" (or tried the default ports): the error now names
// the directory it looked in and the dev state found in a parent, with
// the --dev-state-dir to give.
func TestClientsSayWhereTheyLookedForDev(t *testing.T) {
	work := t.TempDir()
	prepared(t, filepath.Join(work, DefaultDevStateDir), 1, freePortBase(t, 1))
	sub := filepath.Join(work, "cmd", "aipfleet")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(sub)
	state := filepath.Join(work, DefaultDevStateDir)
	hint := "give --dev-state-dir " + state
	for _, args := range [][]string{
		{"action", "send", "--capability", "echo.say", "--input", "{}"},
		{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"},
		{"events", "list"},
	} {
		_, _, err := runCLI(t, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "a token is needed") || !strings.Contains(err.Error(), filepath.Join(sub, DefaultDevStateDir)) ||
			!strings.Contains(err.Error(), "run the command in "+work) || !strings.Contains(err.Error(), hint) {
			t.Errorf("%v in a subdirectory: err = %v, want %q", args, err, hint)
		}
	}
	// fleet status sends no token without dev's issuer key; the control
	// plane's 401 says why none was sent.
	url, _ := fleetServer(t)
	_, _, err := runCLI(t, nil, "fleet", "status", "--control-url", url)
	if err == nil || !strings.Contains(err.Error(), "HTTP 401") || !strings.Contains(err.Error(), "no token was sent") || !strings.Contains(err.Error(), hint) {
		t.Errorf("fleet status in a subdirectory: err = %v, want %q", err, hint)
	}
	// The same directory given finds it: what the hint says works.
	if _, _, err := runCLI(t, nil, "action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--dev-state-dir", state, "--token", "t"); err == nil ||
		!strings.Contains(err.Error(), "no dispatcher answers") || !strings.Contains(err.Error(), "recorded in "+filepath.Join(state, "dev.json")) {
		t.Errorf("with the hinted --dev-state-dir: err = %v, want dev's recorded address tried", err)
	}
	// Nothing in any parent: the error names where it looked.
	alone := t.TempDir()
	t.Chdir(alone)
	_, _, err = runCLI(t, nil, "events", "list")
	if err == nil || !strings.Contains(err.Error(), "no aipfleet dev fleet's state in "+filepath.Join(alone, DefaultDevStateDir)) || strings.Contains(err.Error(), "--dev-state-dir /") {
		t.Errorf("events list with no dev state anywhere: err = %v", err)
	}
}

// TestSubcommandAfterFlags: `aipfleet fleet --json status` was told to
// "name a subcommand", which it had: the error now says that the
// subcommand comes first. Flags alone still ask for the subcommand.
func TestSubcommandAfterFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fleet", "--json", "status"}, "fleet: the subcommand comes first, then its flags: aipfleet fleet status [flags]"},
		{[]string{"fleet", "--control-url", "http://127.0.0.1:1", "status"}, "aipfleet fleet status [flags]"},
		{[]string{"events", "--limit", "5", "list"}, "events: the subcommand comes first, then its flags: aipfleet events list [flags]"},
		{[]string{"registry", "--database-url-file", "db.url", "status"}, "aipfleet registry status [flags]"},
		{[]string{"action", "--json", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"}, "aipfleet action get [flags]"},
		{[]string{"fleet", "--json"}, "fleet: name a subcommand: status"},
		{[]string{"action", "--json"}, "action: name a subcommand: send, get or cancel"},
		{[]string{"registry", "--json", "frob"}, "registry: name a subcommand: migrate, apply or status"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error saying %q", c.args, err, c.want)
		}
	}
}

// TestDevStateDirThatIsAFile: a --state-dir that is a file (or under one)
// was "create the state directory: mkdir afile: not a directory"; the
// error now names the file in the way and what --state-dir needs. It is a
// setting to fix (exit status 2) starting with the command: it exited 1
// without "dev:".
func TestDevStateDirThatIsAFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, stateDir := range []string{file, filepath.Join(file, "fleet")} {
		_, _, err := runCLI(t, nil, "dev", "--state-dir", stateDir, "--port-base", "1024")
		var u *usageError
		if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: --state-dir "+stateDir+": "+file+" is a file, not a directory: give --state-dir a directory") {
			t.Errorf("dev --state-dir %s: err = %v", stateDir, err)
		}
	}
	// A directory this user may not create (mkdir's EACCES, which a test
	// run as root cannot meet): a setting too, saying what to do.
	denied := filepath.Join(dir, "denied", "state")
	err := stateDirError(denied, &os.PathError{Op: "mkdir", Path: filepath.Dir(denied), Err: syscall.EACCES})
	var u *usageError
	if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: --state-dir: create the state directory "+denied+": ") ||
		!strings.Contains(err.Error(), "give --state-dir a directory this user may create") {
		t.Errorf("state directory this user may not create: err = %v, want a usage error saying what to do", err)
	}
	// A disk that is full is a failure at run time, naming the command.
	err = stateDirError(denied, &os.PathError{Op: "mkdir", Path: denied, Err: syscall.ENOSPC})
	if err == nil || errors.As(err, &u) || !strings.HasPrefix(err.Error(), "dev: create the state directory "+denied) {
		t.Errorf("state directory on a full disk: err = %v, want a run-time error starting with dev:", err)
	}
}

// TestDatabaseConnectFailureNamesTheURLFile: a PostgreSQL that cannot be
// reached was pgx's error chain alone ("open the registry: registry:
// storage failure: verify schema: cannot connect to the database: failed
// to connect to `user=x database=db`: ... connection refused"), which
// names neither the file the URL came from nor what to check.
func TestDatabaseConnectFailureNamesTheURLFile(t *testing.T) {
	dir := t.TempDir()
	dbFile := writeSecret(t, dir, "db.url", "postgres://aip:secret@127.0.0.1:"+strconv.Itoa(freePort(t))+"/registry?connect_timeout=5\n")
	key, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(dir, "control.key")
	if err := aip.WriteSeedFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	want := "the PostgreSQL URL is the one in --database-url-file " + dbFile
	for _, args := range [][]string{
		{"registry", "status", "--database-url-file", dbFile},
		{"registry", "migrate", "--database-url-file", dbFile},
		{"control-plane", "--database-url-file", dbFile, "--signing-key-file", keyFile, "--allow-insecure-loopback-http", "--bind", "127.0.0.1:0"},
	} {
		_, _, err := runCLI(t, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), want) {
			t.Errorf("%v: err = %v, want it to say %q", args[:2], err, want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%v: the error shows the URL's password: %v", args[:2], err)
		}
	}
}

// TestRequestTimeoutSaysSo: a dispatcher slower than --request-timeout
// was "stopped waiting for the answer (context deadline exceeded)", which
// named no setting.
func TestRequestTimeoutSaysSo(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	_, _, err := runCLI(t, nil, "action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--url", srv.URL, "--token", "t", "--request-timeout", "50ms")
	if err == nil || !strings.Contains(err.Error(), "no answer within --request-timeout 50ms") {
		t.Errorf("action get slower than --request-timeout: err = %v", err)
	}
	_, _, err = runCLI(t, nil, "events", "list", "--url", srv.URL, "--token", "t", "--request-timeout", "50ms")
	if err == nil || !strings.Contains(err.Error(), "no answer within --request-timeout 50ms") {
		t.Errorf("events list slower than --request-timeout: err = %v", err)
	}
}

// TestBindWithoutHost: a --bind without a host was Go's "missing port in
// address" for a value that has a port and no host.
func TestBindWithoutHost(t *testing.T) {
	issuer, _ := aip.GenerateSigningKey()
	for _, args := range [][]string{
		{"control-plane"},
		{"dispatch", "--issuer", "dev=" + issuer.DID()},
	} {
		cmd := args[0]
		_, _, err := runCLI(t, nil, append(args, "--bind", "8090", "--database-url-file", "db.url", "--signing-key-file", "k", "--allow-insecure-loopback-http")...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "give HOST:PORT, such as 127.0.0.1:8090") {
			t.Errorf("%s --bind 8090: err = %v", cmd, err)
		}
	}
}

// TestBadActionIDNamesTheArgument: `action get foo` said only `"foo"
// must start with "act_"`, not that the action ID was wrong nor what one
// looks like. Every action ID read from the command line is refused with
// a usage error naming the argument, the form and an example, before
// anything is sent.
func TestBadActionIDNamesTheArgument(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "{}", http.StatusTeapot)
	}))
	defer srv.Close()
	const form = `"act_" and a UUIDv7 in 32 lowercase hex digits, like act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d`
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"action", "get", "foo", "--url", srv.URL, "--token", "t"},
			[]string{`action get: action ID "foo" must start with "act_"; give the ID action send printed: ` + form}},
		{[]string{"action", "cancel", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5", "--url", srv.URL, "--token", "t"},
			[]string{`action cancel: action ID "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5" must be "act_" followed by 32 lowercase hex digits; give the ID action send printed: ` + form}},
		{[]string{"action", "send", "--url", srv.URL, "--token", "t", "--capability", "echo.say", "--input", "{}", "--action-id", "42"},
			[]string{`action send: --action-id "42" must start with "act_"; give ` + form, "or leave --action-id out for a new one"}},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: err = %v, want a usage error", c.args, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v:\n got %v\nwant it to contain %s", c.args, err, w)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("%d requests were sent with a bad action ID", n)
	}
}

// TestPlainHTTPToAnHTTPSServer: an http:// URL for a dispatcher or a
// control plane that serves TLS got net/http's bare "HTTP 400: Client sent
// an HTTP request to an HTTPS server.", or "connection reset by peer",
// which do not say what to change; the error now names https://.
func TestPlainHTTPToAnHTTPSServer(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("a plain HTTP request reached the TLS handler")
	}))
	defer srv.Close()
	plain := "http://" + strings.TrimPrefix(srv.URL, "https://")
	id := "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d"
	// A request longer than the TLS record header the server reads (a
	// long token) makes it reset the connection, often before its 400
	// arrives: the control plane's fleet views and the dispatcher's API
	// say the same then.
	long := strings.Repeat("t", 4000)
	for _, args := range [][]string{
		{"action", "get", id, "--url", plain, "--token", "t"},
		{"capability", "list", "--url", plain, "--token", "t"},
		{"events", "list", "--url", plain, "--token", "t"},
		{"fleet", "status", "--control-url", plain, "--token", "t"},
		{"action", "get", id, "--url", plain, "--token", long},
		{"action", "send", "--capability", "c", "--input", "{}", "--url", plain, "--token", long},
		{"capability", "list", "--url", plain, "--token", long},
		{"events", "list", "--url", plain, "--token", long},
		{"events", "list", "--follow", "--url", plain, "--token", long},
		{"fleet", "status", "--control-url", plain, "--token", long},
	} {
		_, _, err := runCLI(t, nil, args...)
		if err == nil || !strings.Contains(err.Error(), "the server speaks HTTPS") || !strings.Contains(err.Error(), "https://") {
			t.Errorf("%v: err = %v, want it to say the server speaks HTTPS and to write https://", args, err)
		}
		if err != nil && strings.Contains(err.Error(), "may or may not have run") {
			t.Errorf("%v: err = %v, want no note that the action may have run (the server read no request)", args, err)
		}
	}
}

// TestBadOTLPSettingIsAUsageError: a malformed OTEL_EXPORTER_OTLP_*
// value was dropped by the exporter with a log line of the OpenTelemetry
// SDK's (spans then went to https://localhost:4318), and an http://
// endpoint with a CA file stopped the start with exit status 1 and no
// variable named. The control plane, the dispatcher and aipfleet host
// refuse it before they start, as a usage error (exit status 2) naming
// the variable and the form it accepts.
func TestBadOTLPSettingIsAUsageError(t *testing.T) {
	dir := t.TempDir()
	dbFile := writeSecret(t, dir, "db.url", "postgres://aip:secret@127.0.0.1:"+strconv.Itoa(freePort(t))+"/registry\n")
	key, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(dir, "control.key")
	if err := aip.WriteSeedFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4318"}
	want := `OTEL_EXPORTER_OTLP_ENDPOINT is "otel-collector:4318", which has no http:// or https:// scheme; want an http:// or https:// URL`
	for _, args := range [][]string{
		{"control-plane", "--database-url-file", dbFile, "--signing-key-file", keyFile, "--allow-insecure-loopback-http", "--bind", "127.0.0.1:0"},
		{"dispatch", "--database-url-file", dbFile, "--signing-key-file", keyFile, "--issuer", "dev=" + key.DID(), "--allow-insecure-loopback-http", "--bind", "127.0.0.1:0"},
		{"host", "--connector", "echo"},
	} {
		_, _, err := runCLI(t, env, args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v; want a usage error saying %q", args[0], err, want)
		}
	}
}

// TestUnusableFilesOfFlagsExitTwo: a file a flag names that cannot be used
// (missing, readable by others, not a key, not a valid fleet file) is a
// setting to fix, as aipfleet host reports it (exit status 2, the
// operator guide's section 10): a supervisor that restarts the control
// plane or the dispatcher cannot help until the file is fixed. Every such
// error of the other commands exited 1, the status of a failure at run
// time; a database that cannot be reached still does. Each error starts
// with the command, then the flag: those of token, keygen --did-of,
// action, events and capability --issuer-key, --input-file, --ca-file,
// fleet status, registry apply -f, dev --fleet-file and dispatch
// --replica-ca-file named the flag alone, and keygen --did-of of a
// directory exited 1.
func TestUnusableFilesOfFlagsExitTwo(t *testing.T) {
	dir := t.TempDir()
	key, _ := aip.GenerateSigningKey()
	keyFile := filepath.Join(dir, "signing.key")
	if err := aip.WriteSeedFile(keyFile, key); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	// A database nothing listens at: a failure at run time.
	dbURL := writeSecret(t, dir, "db.url", "postgres://aipfleet@127.0.0.1:1/none?connect_timeout=2")
	loose := filepath.Join(dir, "loose.url")
	if err := os.WriteFile(loose, []byte("postgres://aipfleet@127.0.0.1:1/none"), 0o644); err != nil {
		t.Fatal(err)
	}
	notAKey := writeSecret(t, dir, "not-a.key", "zz")
	writable := filepath.Join(dir, "writable.yaml")
	if err := os.WriteFile(writable, []byte("format: aipfleet.fleet/v1\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(writable, 0o666); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.json")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A dev state directory whose issuer key is not a key.
	badDev := filepath.Join(dir, "baddev")
	if err := os.MkdirAll(filepath.Join(badDev, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeSecret(t, filepath.Join(badDev, "keys"), "issuer.key", "zz")
	badFleet := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(badFleet, []byte("format: aipfleet.fleet/v1\ntypes:\n  - id: bad\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A state directory for aipfleet dev under a directory others may
	// write to: its key files cannot be trusted.
	shared := filepath.Join(dir, "shared")
	if err := os.Mkdir(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(shared, 0o777); err != nil {
		t.Fatal(err)
	}
	iss := "dev=" + key.DID()
	loop := []string{"--allow-insecure-loopback-http", "--bind", "127.0.0.1:0"}
	id := aip.NewActionID()
	for _, c := range []struct {
		args []string
		want string
	}{
		{append([]string{"control-plane", "--database-url-file", missing, "--signing-key-file", keyFile}, loop...), "control-plane: --database-url-file: secret file " + missing + " does not exist"},
		{append([]string{"control-plane", "--database-url-file", loose, "--signing-key-file", keyFile}, loop...), "control-plane: --database-url-file: secret file " + loose + " is accessible by group or others"},
		{append([]string{"control-plane", "--database-url-file", dbURL, "--signing-key-file", notAKey}, loop...), "control-plane: --signing-key-file: "},
		{[]string{"control-plane", "--database-url-file", dbURL, "--signing-key-file", keyFile, "--bind", "127.0.0.1:0", "--tls-cert-file", missing, "--tls-key-file", keyFile}, "control-plane: --tls-cert-file: "},
		{append([]string{"dispatch", "--database-url-file", dbURL, "--signing-key-file", missing, "--issuer", iss}, loop...), "dispatch: --signing-key-file: secret file " + missing + " does not exist"},
		{append([]string{"dispatch", "--database-url-file", dbURL, "--signing-key-file", keyFile, "--issuer", iss, "--replica-ca-file", missing}, loop...), "dispatch: --replica-ca-file: file " + missing + " does not exist"},
		{append([]string{"dispatch", "--database-url-file", dbURL, "--signing-key-file", keyFile, "--issuer", iss, "--replica-ca-file", badFleet}, loop...), "dispatch: --replica-ca-file " + badFleet + " holds no PEM certificate; want the PEM file of the CA certificates"},
		{[]string{"registry", "status", "--database-url-file", missing}, "registry status: --database-url-file: secret file " + missing + " does not exist"},
		{[]string{"registry", "apply", "-f", missing, "--database-url-file", dbURL}, "registry apply: -f: file " + missing + " does not exist"},
		{[]string{"registry", "apply", "-f", empty, "--database-url-file", dbURL}, "registry apply: -f: file " + empty + " is empty (0 bytes)"},
		{[]string{"registry", "apply", "-f", badFleet, "--database-url-file", dbURL}, "registry apply: fleet file " + badFleet + ": types[0] bad (line 3)"},
		{[]string{"dev", "--fleet-file", badFleet, "--state-dir", filepath.Join(dir, "dev")}, "dev: fleet file " + badFleet + ": types[0] bad (line 3)"},
		{[]string{"dev", "--fleet-file", missing, "--state-dir", filepath.Join(dir, "dev")}, "dev: --fleet-file: file " + missing + " does not exist"},
		{[]string{"dev", "--fleet-file", writable, "--state-dir", filepath.Join(dir, "dev")}, "dev: --fleet-file: file " + writable + " is writable by group or others"},
		{[]string{"dev", "--state-dir", filepath.Join(shared, "dev"), "--port-base", "47300"}, "dev: --state-dir " + filepath.Join(shared, "dev") + ": "},
		{[]string{"dev", "--state-dir", filepath.Join(shared, "dev"), "--port-base", "47300"}, "chmod go-w " + shared},
		{[]string{"token", "--issuer-key", missing, "--tenant", "acme"}, "token: --issuer-key: secret file " + missing + " does not exist"},
		{[]string{"token", "--issuer-key", notAKey, "--tenant", "acme"}, "token: --issuer-key: signing key file " + notAKey + ": invalid signing key"},
		{[]string{"keygen", "--did-of", notAKey}, "keygen: --did-of: signing key file " + notAKey + ": invalid signing key"},
		{[]string{"keygen", "--did-of", missing}, "keygen: --did-of: secret file " + missing + " does not exist"},
		{[]string{"keygen", "--did-of", shared}, "keygen: --did-of " + shared + " is a directory: --did-of wants the key file itself"},
		{[]string{"action", "get", id, "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", missing}, "action get: --issuer-key: secret file " + missing + " does not exist"},
		{[]string{"action", "send", "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", notAKey, "--capability", "echo.say", "--input", "{}"}, "action send: --issuer-key: signing key file " + notAKey + ": invalid signing key"},
		{[]string{"events", "list", "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", loose}, "events list: --issuer-key: secret file " + loose + " is accessible by group or others"},
		{[]string{"capability", "list", "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", missing}, "capability list: --issuer-key: secret file " + missing + " does not exist"},
		{[]string{"action", "send", "--url", "http://127.0.0.1:1", "--token", "t", "--capability", "echo.say", "--input-file", missing}, "action send: --input-file: file " + missing + " does not exist"},
		{[]string{"action", "send", "--url", "http://127.0.0.1:1", "--token", "t", "--capability", "echo.say", "--input-file", empty}, "action send: --input-file: file " + empty + " is empty (0 bytes)"},
		{[]string{"action", "get", id, "--url", "https://127.0.0.1:1", "--token", "t", "--ca-file", missing}, "action get: --ca-file: file " + missing + " does not exist"},
		{[]string{"action", "get", id, "--url", "https://127.0.0.1:1", "--token", "t", "--ca-file", badFleet}, "action get: --ca-file " + badFleet + " holds no PEM certificate"},
		{[]string{"events", "list", "--url", "https://127.0.0.1:1", "--token", "t", "--ca-file", badFleet}, "events list: --ca-file " + badFleet + " holds no PEM certificate"},
		{[]string{"action", "cancel", id, "--url", "https://127.0.0.1:1", "--token", "t", "--ca-file", missing}, "action cancel: --ca-file: file " + missing + " does not exist"},
		{[]string{"action", "send", "--url", "https://127.0.0.1:1", "--token", "t", "--capability", "echo.say", "--input", "{}", "--ca-file", missing}, "action send: --ca-file: file " + missing + " does not exist"},
		{[]string{"capability", "get", "echo.say", "--url", "https://127.0.0.1:1", "--token", "t", "--ca-file", missing}, "capability get: --ca-file: file " + missing + " does not exist"},
		{[]string{"capability", "get", "echo.say", "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", notAKey}, "capability get: --issuer-key: signing key file " + notAKey + ": invalid signing key"},
		{[]string{"action", "cancel", id, "--url", "http://127.0.0.1:1", "--tenant", "acme", "--issuer-key", loose}, "action cancel: --issuer-key: secret file " + loose + " is accessible by group or others"},
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:1", "--issuer-key", missing}, "fleet status: --issuer-key: secret file " + missing + " does not exist"},
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:1", "--issuer-key", notAKey}, "fleet status: --issuer-key: signing key file " + notAKey + ": invalid signing key"},
		{[]string{"fleet", "status", "--control-url", "https://127.0.0.1:1", "--token", "t", "--ca-file", missing}, "fleet status: --ca-file: file " + missing + " does not exist"},
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:1", "--dev-state-dir", badDev}, "fleet status: aipfleet dev's issuer key (in --dev-state-dir " + badDev + "): signing key file " + filepath.Join(badDev, "keys", "issuer.key") + ": invalid signing key"},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error (exit status 2) containing %q", c.args, err, c.want)
		}
	}
	// Files that can be used, and a database that does not answer: a
	// failure at run time, exit status 1.
	for _, args := range [][]string{
		append([]string{"control-plane", "--database-url-file", dbURL, "--signing-key-file", keyFile, "--acquire-timeout", "200ms"}, loop...),
		{"registry", "status", "--database-url-file", dbURL, "--timeout", "2s"},
	} {
		_, _, err := runCLI(t, nil, args...)
		var u *usageError
		if err == nil || errors.As(err, &u) {
			t.Errorf("%v: err = %v, want a run-time error (exit status 1)", args, err)
		}
	}
}

// TestDevKeyAndTokenErrorsSayWhatToDo: a key file in aipfleet dev's state
// directory that is not a key, or that others may read, was "key file F:
// signing key file F: invalid signing key: ..." with no command, no flag
// and nothing to do; the dev token the client commands read, when others
// may read it or it is empty, was "the dev token: ..." with exit status 1
// although asking again cannot help. Both are settings to fix (exit status
// 2) naming the command, --state-dir or --dev-state-dir, and the fix.
func TestDevKeyAndTokenErrorsSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	devWith := func(name, content string, mode os.FileMode) string {
		state := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Join(state, "keys"), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, "keys", "control-plane.key"), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(state, "keys", "control-plane.key"), mode); err != nil {
			t.Fatal(err)
		}
		return state
	}
	tokenIn := func(name, content string, mode os.FileMode) string {
		state := filepath.Join(dir, name)
		if err := os.MkdirAll(state, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(state, devTokenFile), []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(state, devTokenFile), mode); err != nil {
			t.Fatal(err)
		}
		return state
	}
	notAKey := devWith("notakey", "zz", 0o600)
	emptyKey := devWith("emptykey", "", 0o600)
	looseKey := devWith("loosekey", strings.Repeat("ab", 32), 0o644)
	looseTok := tokenIn("loosetoken", "tok", 0o644)
	emptyTok := tokenIn("emptytoken", "", 0o600)
	id := aip.NewActionID()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"dev", "--state-dir", notAKey, "--port-base", "47400"}, []string{
			"dev: --state-dir " + notAKey + ": signing key file " + filepath.Join(notAKey, "keys", "control-plane.key") + ": invalid signing key",
			"it is not the key aipfleet dev wrote there; put that key back, or pass --reset to start from scratch"}},
		{[]string{"dev", "--state-dir", emptyKey, "--port-base", "47400"}, []string{
			"dev: --state-dir " + emptyKey + ": secret file " + filepath.Join(emptyKey, "keys", "control-plane.key") + " is empty (0 bytes)",
			"pass --reset to start from scratch"}},
		{[]string{"dev", "--state-dir", looseKey, "--port-base", "47400"}, []string{
			"dev: --state-dir " + looseKey + ": secret file " + filepath.Join(looseKey, "keys", "control-plane.key") + " is accessible by group or others (mode 0644); chmod 600 it"}},
		{[]string{"action", "get", id, "--url", "http://127.0.0.1:1", "--dev-state-dir", looseTok}, []string{
			"action get: aipfleet dev's token (in --dev-state-dir " + looseTok + "): secret file " + filepath.Join(looseTok, devTokenFile) + " is accessible by group or others (mode 0644); chmod 600 it",
			"restart it; or give --token TOKEN, or --tenant T with --issuer-key FILE"}},
		{[]string{"events", "list", "--url", "http://127.0.0.1:1", "--dev-state-dir", emptyTok}, []string{
			"events list: aipfleet dev's token (in --dev-state-dir " + emptyTok + "): secret file " + filepath.Join(emptyTok, devTokenFile) + " is empty (0 bytes)",
			"restart it"}},
	} {
		_, _, err := runCLI(t, nil, c.args...)
		var u *usageError
		if !errors.As(err, &u) {
			t.Errorf("%v: err = %v, want a usage error (exit status 2)", c.args, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), c.args[0]) {
			t.Errorf("%v: err = %v, want it to start with the command", c.args, err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v:\n got %v\nwant it to contain %q", c.args, err, w)
			}
		}
	}
	// dev refused the keys before it wrote any: the one that is not a
	// key is still there, unchanged.
	if raw, err := os.ReadFile(filepath.Join(notAKey, "keys", "control-plane.key")); err != nil || string(raw) != "zz" {
		t.Errorf("the key that is not a key: %q, %v; want it left as it was", raw, err)
	}
}
