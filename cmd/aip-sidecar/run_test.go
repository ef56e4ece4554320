package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/sidecar"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var echoManifest = aip.Manifest{
	ManifestVersion: "aip-manifest/v1",
	Agent:           aip.Principal{ID: "agent:tiny", Kind: aip.PrincipalAgent},
	Profiles:        []string{aip.NativeHTTPProfile},
	Capabilities: []aip.Capability{{ID: "tiny.echo", Name: "Echo", Kind: aip.KindTool, InputSchema: json.RawMessage(`{"type":"object"}`),
		Contract: &aip.CapabilityContract{
			SideEffects: []aip.SideEffect{aip.EffectRead},
			Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
			Execution:   aip.ExecutionContract{SupportsSync: true, ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
			Data:        aip.DataContract{Sensitivity: aip.SensitivityPublic},
		}}},
}

// tinyConnector serves the local contract with one echo capability.
func tinyConnector(t *testing.T) string {
	t.Helper()
	sock := sidecartest.SocketPath(t, "tiny.sock")
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+sidecar.PathLocalManifest, func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(echoManifest) })
	mux.HandleFunc("GET "+sidecar.PathLocalHealth, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"status":"ok"}`)) })
	mux.HandleFunc("POST "+sidecar.PathLocalActions, func(w http.ResponseWriter, r *http.Request) {
		var a struct {
			Input json.RawMessage `json:"input"`
		}
		json.NewDecoder(r.Body).Decode(&a)
		json.NewEncoder(w).Encode(map[string]any{"status": "completed", "output": a.Input})
	})
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

func envOf(lines []string) map[string]string {
	env := map[string]string{}
	for _, kv := range lines {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

func TestRunAttachesServesAndDrains(t *testing.T) {
	attachServeDrain(t, nil)
}

// TestRunLogsText: the sidecar logged JSON only; --log-format text (or
// AIP_SIDECAR_LOG_FORMAT=text) gives one readable line per event.
func TestRunLogsText(t *testing.T) {
	t.Run("flag", func(t *testing.T) { attachServeDrain(t, nil, "--log-format", "text") })
	t.Run("variable", func(t *testing.T) {
		attachServeDrain(t, func(env map[string]string) { env[envPrefix+"LOG_FORMAT"] = "text" })
	})
}

var textLine = regexp.MustCompile(`^time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(DEBUG|INFO|WARN|ERROR) msg=\S`)

// With --database-url-file the sidecar's host journals in PostgreSQL, as
// aip-host's does, in the namespace of its replica ID.
func TestRunWithAPostgreSQLJournal(t *testing.T) {
	url := pgtest.NewDatabase(t)
	file := filepath.Join(t.TempDir(), "journal-db.url")
	if err := os.WriteFile(file, []byte(url), 0o600); err != nil {
		t.Fatal(err)
	}
	replica, action := attachServeDrain(t, func(env map[string]string) { env["AIP_CONNECTOR_HOST_DATABASE_URL_FILE"] = file })
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var status string
	if err := conn.QueryRow(t.Context(), `SELECT status FROM aip_runtime_actions WHERE journal_ns = $1 AND action_id = $2`,
		replica, action).Scan(&status); err != nil || status != string(aip.StateCompleted) {
		t.Fatalf("the action in the PostgreSQL journal: %q, %v", status, err)
	}
}

// attachServeDrain runs the sidecar (its environment edited by edit, when
// given) for a connector serving the local contract, sends it an action,
// stops it, and returns the replica ID and the action ID.
func attachServeDrain(t *testing.T, edit func(env map[string]string), extraArgs ...string) (replicaID, actionID string) {
	t.Helper()
	fleet := sidecartest.NewFakeFleet(t)
	bound := echoManifest
	bound.Agent.TrustDomain = fleet.TrustDomain()
	fleet.Admit(t, &bound)
	r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
	env := envOf(r.Env)
	env["AIP_SIDECAR_LOCAL_SOCKET"] = tinyConnector(t)
	if edit != nil {
		edit(env)
	}
	// The bind address comes as a flag, the rest from the environment.
	args := append([]string{"--bind", env["AIP_CONNECTOR_HOST_BIND"], "--log-level", "info"}, extraArgs...)
	delete(env, "AIP_CONNECTOR_HOST_BIND")
	text := env[envPrefix+"LOG_FORMAT"] == "text" || slices.Contains(extraArgs, "text")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr hostsdktest.LogBuffer
	errc := make(chan error, 1)
	go func() { errc <- run(ctx, args, func(k string) string { return env[k] }, &bytes.Buffer{}, &stderr) }()
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	if err := fleet.ControlPlane.Await(wctx, func(o []hostsdktest.Operation) bool { return len(o) > 0 && o[0].Outcome == aip.OutcomeLease }); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	r.AwaitReady(t)
	actionID = aip.NewActionID()
	res := fleet.Act(t, r, &aip.Action{ID: actionID, CapabilityID: "tiny.echo", Input: json.RawMessage(`{"x":1}`)}).Must(t, aip.ResultCompleted)
	if string(res.Output) != `{"x":1}` {
		t.Fatalf("%+v", res)
	}
	var st sidecar.Status
	sidecartest.GetJSON(t, r.Base+sidecar.PathStatus, &st)
	if st.Mode != "local" || !strings.HasPrefix(st.Target, "unix:") || st.Process != nil {
		t.Errorf("status %+v", st)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	o := fleet.ControlPlane.Operations()
	if o[len(o)-1].Op != aip.OpOffline {
		t.Errorf("last operation %+v", o[len(o)-1])
	}
	if !text && !strings.Contains(stderr.String(), `"component":"aip-sidecar"`) {
		t.Errorf("log:\n%s", stderr.String())
	}
	if text {
		// One readable line per event, the sidecar's own and its host's.
		log := stderr.String()
		if !strings.Contains(log, " component=aip-sidecar") || !strings.Contains(log, " component=aip-connector-host") {
			t.Errorf("the text log lacks the sidecar's or the host's lines:\n%s", log)
		}
		for line := range strings.SplitSeq(strings.TrimSuffix(log, "\n"), "\n") {
			if !textLine.MatchString(line) {
				t.Fatalf("with --log-format text the sidecar logged a line that is not text:\n%s\nlog:\n%s", line, log)
			}
		}
	}
	return env["AIP_CONNECTOR_HOST_REPLICA_ID"], actionID
}

func TestRunPrintManifest(t *testing.T) {
	sock := tinyConnector(t)
	var stdout, stderr bytes.Buffer
	getenv := func(k string) string {
		return map[string]string{"AIP_SIDECAR_LOCAL_SOCKET": sock, "AIP_CONNECTOR_HOST_TRUST_DOMAIN": "example.org"}[k]
	}
	if err := run(context.Background(), []string{"--print-manifest"}, getenv, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var out struct {
		ManifestDigest        string              `json:"manifest_digest"`
		CapabilityCount       int                 `json:"capability_count"`
		ImplementationSupport map[string][]string `json:"implementation_support"`
		Manifest              aip.Manifest        `json:"manifest"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s", err, stdout.String())
	}
	bound := echoManifest
	bound.Agent.TrustDomain = "example.org"
	want, _ := aip.ManifestDigest(&bound)
	if out.ManifestDigest != want || out.CapabilityCount != 1 || out.Manifest.Agent.TrustDomain != "example.org" {
		t.Errorf("printed %+v; want digest %s", out, want)
	}
	// What the fleet file's version entry needs besides, as aip-host and
	// aipfleet host print it (reconciliation is the operator's to claim).
	if got := out.ImplementationSupport["tiny.echo"]; !slices.Equal(got, []string{"invocation"}) {
		t.Errorf("implementation support %v, want tiny.echo: [invocation]", out.ImplementationSupport)
	}
}

// TestRunRestartUnresponsiveWithAnMCPServer: --restart-unresponsive-after
// is accepted with an MCP server (it re-opens an HTTP session, restarts a
// stdio server), not only with --exec.
func TestRunRestartUnresponsiveWithAnMCPServer(t *testing.T) {
	server := mcp.NewServer(&mcp.Implementation{Name: "tiny-mcp", Version: "1.0"}, nil)
	server.AddTool(&mcp.Tool{Name: "echo", InputSchema: json.RawMessage(`{"type":"object"}`), Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{}, nil
		})
	srv := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil))
	t.Cleanup(func() {
		for s := range server.Sessions() {
			s.Close()
		}
		srv.CloseClientConnections()
		srv.Close()
	})
	var stdout, stderr bytes.Buffer
	env := map[string]string{"AIP_SIDECAR_MCP_URL": srv.URL, "AIP_CONNECTOR_HOST_TRUST_DOMAIN": "example.org", "AIP_SIDECAR_RESTART_UNRESPONSIVE_AFTER": "3"}
	if err := run(context.Background(), []string{"--print-manifest"}, func(k string) string { return env[k] }, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), `"mcp.echo"`) {
		t.Errorf("printed %s", stdout.String())
	}
}

func TestRunRejectsBadConfiguration(t *testing.T) {
	dir := t.TempDir()
	loose := filepath.Join(dir, "token")
	os.WriteFile(loose, []byte("t"), 0o644)
	token := filepath.Join(dir, "token-600")
	os.WriteFile(token, []byte("t"), 0o600)
	empty := filepath.Join(dir, "empty-600")
	os.WriteFile(empty, []byte("\n"), 0o600)
	mcpURL := map[string]string{"AIP_SIDECAR_MCP_URL": "https://mcp.example/mcp"}
	localURL := map[string]string{"AIP_SIDECAR_LOCAL_URL": "http://127.0.0.1:9"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad millis", []string{"--start-timeout-ms", "-5"}, nil, "AIP_SIDECAR_START_TIMEOUT_MS"},
		{"bad policy", nil, map[string]string{"AIP_SIDECAR_ON_MANIFEST_CHANGE": "apply"}, "report or unready"},
		{"exec without a command", []string{"--exec"}, nil, "--exec needs a command"},
		{"exec with only --", []string{"--exec", "--"}, nil, "--exec needs a command"},
		{"exec env not JSON", nil, map[string]string{"AIP_SIDECAR_EXEC": "python3 x.py"}, "JSON array"},
		{"exec and mcp", nil, map[string]string{"AIP_SIDECAR_EXEC": `["a"]`, "AIP_SIDECAR_MCP_COMMAND": `["b"]`}, "both given"},
		{"stray argument", []string{"python3"}, nil, "after --exec"},
		{"token file readable by others", []string{"--local-token-file", loose}, nil, "--local-token-file"},
		{"events token file readable by others", []string{"--events-token-file", loose}, localURL, "--events-token-file"},
		{"empty events token file", []string{"--events-token-file", empty}, localURL, "holds only whitespace"},
		{"events token file for an MCP server", []string{"--events-token-file", token}, mcpURL, "--events-token-file (AIP_SIDECAR_EVENTS_TOKEN_FILE) applies only to a local-contract connector"},
		{"host config", []string{"--max-in-flight", "0"}, nil, "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT"},
		{"no connector", nil, nil, "--local-url"},
		{"non-loopback url", nil, map[string]string{"AIP_SIDECAR_LOCAL_URL": "http://192.0.2.1:80"}, "loopback"},
		{"log level", []string{"--log-level", "loud"}, nil, `--log-level (AIP_SIDECAR_LOG_LEVEL) is "loud"`},
		{"log level from the environment", nil, map[string]string{"AIP_SIDECAR_LOG_LEVEL": "loud"}, `AIP_SIDECAR_LOG_LEVEL (--log-level) is "loud"`},
		// A setting of the other mode would be silently ignored: a token
		// the operator believes protects the MCP server, an allow-list
		// believed to restrict a local connector's capabilities.
		{"token file for an MCP server", []string{"--local-token-file", token}, mcpURL, "--local-token-file (AIP_SIDECAR_LOCAL_TOKEN_FILE) applies only to a local-contract connector"},
		{"cancel grace for an MCP server", []string{"--cancel-grace-ms", "100"}, mcpURL, "--cancel-grace-ms (AIP_SIDECAR_CANCEL_GRACE_MS) applies only to a local-contract connector"},
		{"MCP tools for a local connector", []string{"--mcp-tools", "echo"}, localURL, "--mcp-tools (AIP_SIDECAR_MCP_TOOLS) applies only to an MCP server"},
		{"capability prefix from the environment for a local connector", nil,
			map[string]string{"AIP_SIDECAR_LOCAL_URL": "http://127.0.0.1:9", "AIP_SIDECAR_CAPABILITY_PREFIX": "x."}, "AIP_SIDECAR_CAPABILITY_PREFIX"},
		{"agent ID for a local connector", []string{"--agent-id", "agent:x"}, localURL, "--agent-id (AIP_SIDECAR_AGENT_ID) applies only to an MCP server"},
		{"exec dir without a child", []string{"--exec-dir", dir}, localURL, "--exec-dir (AIP_SIDECAR_EXEC_DIR) applies only to a child the sidecar starts"},
		{"exec dir for an MCP URL", []string{"--exec-dir", dir}, mcpURL, "--exec-dir (AIP_SIDECAR_EXEC_DIR) applies only to a child the sidecar starts"},
		{"negative restart count", []string{"--restart-unresponsive-after", "-1"}, nil, "AIP_SIDECAR_RESTART_UNRESPONSIVE_AFTER"},
		{"restart without exec", []string{"--restart-unresponsive-after", "3"}, map[string]string{"AIP_SIDECAR_LOCAL_URL": "http://127.0.0.1:9"}, "needs --exec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			getenv := func(k string) string { return tc.env[k] }
			err := run(context.Background(), tc.args, getenv, &stderr, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v; want an error mentioning %q", err, tc.want)
			}
		})
	}
	var stderr bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stderr, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("run -h: %v", err)
	}
	for _, want := range []string{"--exec CMD ARGS", "\n  --signing-seed-file string\n", "\n  --mcp-url string\n", "\n  --exec\n", "AIP_SIDECAR_LOCAL_SOCKET", "AIP_SIDECAR_EVENTS_TOKEN_FILE"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("help does not mention %q", want)
		}
	}
	// The flags are written with two dashes, as the messages write them.
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
			t.Errorf("help lists a flag with one dash: %q", line)
		}
	}
}

func TestSplitArgv(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		flags []string
		name  string
		argv  []string
	}{
		{args: []string{"--local-url", "u", "--exec", "python3", "c.py", "--exec", "x"}, flags: []string{"--local-url", "u"}, name: "exec", argv: []string{"python3", "c.py", "--exec", "x"}},
		{args: []string{"-mcp-command", "npx", "-y", "pkg"}, flags: []string{}, name: "mcp-command", argv: []string{"npx", "-y", "pkg"}},
		{args: []string{"--local-url", "u"}, flags: []string{"--local-url", "u"}},
		{args: []string{"--", "--exec", "x"}, flags: []string{"--", "--exec", "x"}},
		// "--" after the flag, as docker and kubectl take it, only ends
		// the flags: it is not the program.
		{args: []string{"--local-url", "u", "--exec", "--", "python3", "c.py", "--"}, flags: []string{"--local-url", "u"}, name: "exec", argv: []string{"python3", "c.py", "--"}},
		{args: []string{"--mcp-command", "--", "npx"}, flags: []string{}, name: "mcp-command", argv: []string{"npx"}},
	} {
		flags, name, argv := splitArgv(tc.args)
		if strings.Join(flags, " ") != strings.Join(tc.flags, " ") || name != tc.name || strings.Join(argv, " ") != strings.Join(tc.argv, " ") {
			t.Errorf("splitArgv(%q) = %q %q %q", tc.args, flags, name, argv)
		}
	}
}

// TestSettingsAroundSpaces: a number with surrounding spaces (as a
// variable often has) is read as that number, for the sidecar's settings
// and the host's alike, not silently replaced by the default; a value
// that is not a number is refused naming the setting.
func TestSettingsAroundSpaces(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	load := hostsdk.BindSettings(fs, newSettings())
	if err := fs.Parse([]string{"--stop-timeout-ms", " 7000"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"AIP_SIDECAR_START_TIMEOUT_MS": "5000 ", "AIP_SIDECAR_PRINT_MANIFEST": "true"}
	val, err := load(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if got := val.Millis("start-timeout-ms"); got != 5*time.Second {
		t.Errorf("AIP_SIDECAR_START_TIMEOUT_MS=\"5000 \" read as %v", got)
	}
	if got := val.Millis("stop-timeout-ms"); got != 7*time.Second {
		t.Errorf("--stop-timeout-ms \" 7000\" read as %v", got)
	}
	if !val.Bool("print-manifest") {
		t.Error("AIP_SIDECAR_PRINT_MANIFEST=true read as false")
	}

	cfg, err := hostsdk.LoadConfig(nil, func(k string) string {
		return map[string]string{"AIP_CONNECTOR_HOST_LEASE_TTL_MS": " 20000 ", "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "7 "}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaseTTL != 20*time.Second || cfg.MaxInFlight != 7 {
		t.Errorf("host settings with spaces read as lease %v, max in flight %d", cfg.LeaseTTL, cfg.MaxInFlight)
	}

	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	load = hostsdk.BindSettings(fs, newSettings())
	_, err = load(func(k string) string { return map[string]string{"AIP_SIDECAR_START_TIMEOUT_MS": "5000 ms"}[k] })
	var se *hostsdk.SettingError
	if !errors.As(err, &se) || se.Flag != "start-timeout-ms" || !strings.Contains(err.Error(), "AIP_SIDECAR_START_TIMEOUT_MS") ||
		!strings.Contains(err.Error(), "want an integer from 1 to 3600000 ms") {
		t.Errorf("AIP_SIDECAR_START_TIMEOUT_MS=\"5000 ms\": %v; want a SettingError naming it and the range", err)
	}
}

// TestRunConfigErrorsNameTheFlags: the sidecar's configuration errors
// name the flag and the variable the operator set, as hostsdk's do, not
// only a Go field (a person running aip-sidecar never wrote Local.URL),
// and every flag they mention exists.
func TestRunConfigErrorsNameTheFlags(t *testing.T) {
	dir := t.TempDir()
	badToken := filepath.Join(dir, "bad-token")
	if err := os.WriteFile(badToken, []byte("two words"), 0o600); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("aip-sidecar", flag.ContinueOnError)
	hostsdk.BindFlags(fs)
	hostsdk.BindSettings(fs, newSettings())
	for _, a := range argvSettings {
		fs.Var(argvFlag{}, a.flag, "")
	}
	goField := regexp.MustCompile(`^(sidecar: )?(Config\.|(Local|MCP|Host)\.[A-Z])`)
	mentioned := regexp.MustCompile(`--([a-z][a-z-]*)`)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no connector", nil, nil, "--local-url (AIP_SIDECAR_LOCAL_URL, Config.Local.URL) is empty"},
		{"url and socket", []string{"--local-url", "http://127.0.0.1:9", "--local-socket", "/tmp/x.sock"}, nil,
			"--local-url (AIP_SIDECAR_LOCAL_URL, Config.Local.URL) and --local-socket (AIP_SIDECAR_LOCAL_SOCKET) are both set"},
		{"non-loopback url", []string{"--local-url", "http://192.0.2.1:80"}, nil, "--local-url (AIP_SIDECAR_LOCAL_URL, Config.Local.URL) is \"http://192.0.2.1:80\""},
		{"socket with an MCP server", []string{"--local-socket", "/tmp/x.sock", "--mcp-url", "https://mcp.example/mcp"}, nil,
			"--local-socket (AIP_SIDECAR_LOCAL_SOCKET, Config.Local.Socket) is set together with an MCP server"},
		{"bad token", []string{"--local-url", "http://127.0.0.1:9", "--local-token-file", badToken}, nil,
			"--local-token-file (AIP_SIDECAR_LOCAL_TOKEN_FILE, Config.Local.Token) has byte"},
		{"plain http MCP URL", nil, map[string]string{"AIP_SIDECAR_MCP_URL": "http://mcp.example/mcp"},
			"--mcp-url (AIP_SIDECAR_MCP_URL, Config.MCP.URL)"},
		{"restart without exec", []string{"--local-url", "http://127.0.0.1:9", "--restart-unresponsive-after", "3"}, nil,
			"--restart-unresponsive-after (AIP_SIDECAR_RESTART_UNRESPONSIVE_AFTER, Config.RestartUnresponsiveAfter)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			env := map[string]string{"AIP_CONNECTOR_HOST_TRUST_DOMAIN": "example.org"}
			maps.Copy(env, tc.env)
			getenv := func(k string) string { return env[k] }
			err := run(context.Background(), append([]string{"--print-manifest"}, tc.args...), getenv, &stderr, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run = %v; want an error containing %q", err, tc.want)
			}
			if goField.MatchString(err.Error()) {
				t.Errorf("the error starts with a Go field: %v", err)
			}
			for _, m := range mentioned.FindAllStringSubmatch(err.Error(), -1) {
				if fs.Lookup(m[1]) == nil {
					t.Errorf("the error names --%s, which aip-sidecar does not have: %v", m[1], err)
				}
			}
		})
	}
}

// TestCommandLineMistakesAreOneLineUsageErrors: a misspelled flag printed
// the whole flag list (over a hundred lines) around the mistake, and every
// mistake of the command line exited 1 like a failed start; it is now one
// line naming the mistake and where the flags are listed, a usage error
// (exit status 2), and nothing else on stderr.
func TestCommandLineMistakesAreOneLineUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "unknown flag --bogus (run `aip-sidecar --help` for the flags)"},
		{[]string{"-bogus"}, "unknown flag --bogus (run `aip-sidecar --help` for the flags)"},
		{[]string{"--local-ulr", "http://127.0.0.1:9"}, "unknown flag --local-ulr; did you mean --local-url? (run `aip-sidecar --help` for the flags)"},
		{[]string{"--AIP_SIDECAR_START_TIMEOUT_MS=5"}, "unknown flag --AIP_SIDECAR_START_TIMEOUT_MS (run `aip-sidecar --help` for the flags)"},
		{[]string{"--local-url"}, "flag needs an argument: --local-url (run `aip-sidecar --help` for the flags)"},
		{[]string{"python3"}, `unexpected argument "python3"`},
		{[]string{"--exec"}, "--exec needs a command"},
		{[]string{"--exec=python3"}, "invalid boolean value \"python3\" for --exec: put the command after the flag, as the last arguments (run `aip-sidecar --help` for the flags)"},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), c.args, func(string) string { return "" }, &stderr, &stderr)
		var u *hostrun.UsageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error saying %q", c.args, err, c.want)
		}
		if stderr.Len() > 0 {
			t.Errorf("%v: stderr has %d bytes besides the error:\n%.300s", c.args, stderr.Len(), stderr.String())
		}
	}
}

// TestRefusedSettingsExitAsUsage: a flag's or variable's value the
// settings refuse (--start-timeout-ms=soon, a host setting) exited 1 like
// a failed start, while an unknown flag exited 2; it is a mistake on the
// command line too, exit status 2.
func TestRefusedSettingsExitAsUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{[]string{"--start-timeout-ms=soon"}, nil, 2},
		{[]string{"--drain-timeout-ms=soon"}, nil, 2},
		{nil, map[string]string{"AIP_SIDECAR_ON_MANIFEST_CHANGE": "apply"}, 2},
		{[]string{"--log-format", "xml"}, nil, 2},
		{nil, map[string]string{"AIP_SIDECAR_LOG_FORMAT": "xml"}, 2},
		{[]string{"--bogus"}, nil, 2},
		{[]string{"-h"}, nil, 0},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), c.args, func(k string) string { return c.env[k] }, &stderr, &stderr)
		if got := hostrun.ExitCode(err); got != c.want {
			t.Errorf("%v %v: exit status %d (err %v), want %d", c.args, c.env, got, err, c.want)
		}
	}
	if got := hostrun.ExitCode(errors.New("bootstrap failed")); got != 1 {
		t.Errorf("another error: exit status %d, want 1", got)
	}
}

// TestRefusedSettingsReadAsGiven: a refused value read "aip-sidecar:
// hostsdk: --on-manifest-change (AIP_SIDECAR_ON_MANIFEST_CHANGE) from
// AIP_SIDECAR_ON_MANIFEST_CHANGE is ...", though the setting is the
// sidecar's own. The error, which main prints after "aip-sidecar: ", now
// starts with the setting as it was given (the variable when the value
// came from it) and says what is accepted.
func TestRefusedSettingsReadAsGiven(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, map[string]string{"AIP_SIDECAR_ON_MANIFEST_CHANGE": "apply"},
			`AIP_SIDECAR_ON_MANIFEST_CHANGE (--on-manifest-change) is "apply"; want report or unready`},
		{[]string{"--start-timeout-ms=soon"}, nil,
			`--start-timeout-ms (AIP_SIDECAR_START_TIMEOUT_MS) is "soon"; want an integer from 1 to 3600000 ms`},
		{[]string{"--drain-timeout-ms=soon"}, nil,
			`--drain-timeout-ms (AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS, Config.DrainTimeout) is "soon"; want an integer from 1 to 300000 ms`},
		{[]string{"--log-format", "xml"}, nil,
			`--log-format (AIP_SIDECAR_LOG_FORMAT) is "xml"; want json or text`},
		{nil, map[string]string{"AIP_SIDECAR_LOG_FORMAT": "JSON"},
			`AIP_SIDECAR_LOG_FORMAT (--log-format) is "JSON"; want json or text`},
	} {
		var stderr bytes.Buffer
		err := run(context.Background(), c.args, func(k string) string { return c.env[k] }, &stderr, &stderr)
		if err == nil || err.Error() != c.want {
			t.Errorf("%v %v:\n got %v\nwant %s", c.args, c.env, err, c.want)
		}
	}
}

// TestFlagsAfterExecAreNamed: the dev banner's host command completed
// with "aip-sidecar --exec CMD" as its program put every sidecar flag
// after --exec, where it is the connector's argument; the sidecar then
// said "--public-endpoint ... is required" of a command line that gave
// it. The error now says where the flag went. A flag the error does not
// name (a connector's own --bind) is not mentioned, nor is one given
// before --exec.
func TestFlagsAfterExecAreNamed(t *testing.T) {
	const hint = " came after --exec, so it went to the connector's command line and aip-sidecar did not read it"
	for _, c := range []struct {
		name        string
		args        []string
		want, never []string
	}{
		{"host flag after exec",
			[]string{"--local-url", "http://127.0.0.1:9", "--exec", "connector", "--bind", "127.0.0.1:9452", "--public-endpoint=http://127.0.0.1:9452/aip/v1/messages"},
			[]string{"--public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT", "--public-endpoint" + hint, "put aip-sidecar's own flags before --exec"},
			[]string{"--bind"}},
		{"sidecar flag after exec",
			[]string{"--print-manifest", "--exec", "connector", "-local-socket", "/tmp/c.sock"},
			[]string{"--local-url (AIP_SIDECAR_LOCAL_URL", "--local-socket" + hint}, nil},
		{"flags before exec",
			[]string{"--print-manifest", "--local-socket", "/tmp/c.sock", "--local-url", "http://127.0.0.1:9", "--exec", "connector", "--local-url", "x"},
			[]string{"are both set"}, []string{"came after"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), c.args, func(string) string { return "" }, &stderr, &stderr)
			if err == nil {
				t.Fatal("run succeeded")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v; want %q", err, w)
				}
			}
			for _, n := range c.never {
				if strings.Contains(err.Error(), n) {
					t.Errorf("err = %v; want no %q", err, n)
				}
			}
		})
	}
}

func TestNamesFlag(t *testing.T) {
	for _, c := range []struct {
		msg, name string
		want      bool
	}{
		{"--control-plane-did-file is bad", "control-plane-did", false},
		{"--control-plane-did (AIP_...) is empty", "control-plane-did", true},
		{"give --trust-domain", "trust-domain", true},
		{"--bindx, --bind: taken", "bind", true},
		{"no flags", "bind", false},
	} {
		if got := namesFlag(c.msg, c.name); got != c.want {
			t.Errorf("namesFlag(%q, %q) = %v, want %v", c.msg, c.name, got, c.want)
		}
	}
}

// TestMainNamesTheProgramOnce runs main in a child process (this test
// binary, with AIP_SIDECAR_TEST_MAIN set): an error of package sidecar
// read "aip-sidecar: sidecar: --local-url ...", and a start timeout
// "aip-sidecar: sidecar: the connector did not become healthy ...: last
// health check: sidecar: GET ...". The operator now sees the program's
// name once, and the error still matches (sidecar.ErrStartTimeout).
func TestMainNamesTheProgramOnce(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"aip-sidecar"}, args...)
		main()
		return
	}
	closed := closedURL(t)
	manifest := []string{"--print-manifest", "--trust-domain", "example.org"}
	for _, c := range []struct {
		args   []string
		status int // a setting to fix exits 2 (TestMainExitStatus)
		want   string
	}{
		{manifest, 2, "aip-sidecar: --local-url (AIP_SIDECAR_LOCAL_URL, Config.Local.URL) is empty: give the local connector's loopback URL"},
		{append(manifest, "--local-url", closed, "--start-timeout-ms", "200"), 1,
			"aip-sidecar: the connector did not become healthy within 200ms (--start-timeout-ms) at " + closed + ": last health check: GET /aip/health at " + closed + ": "},
	} {
		status, stderr := hostsdktest.RunMain(t, "TestMainNamesTheProgramOnce", c.args, nil)
		if status != c.status {
			t.Errorf("aip-sidecar %v: exit status %d, want %d", c.args, status, c.status)
		}
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, c.want) || strings.Count(last, "sidecar: ") != 1 {
			t.Errorf("aip-sidecar %v: the error reads\n%s\nwant it to start with %q and name the program once", c.args, last, c.want)
		}
	}
	// The error run returns keeps what matches it.
	err := run(context.Background(), []string{"--print-manifest", "--trust-domain", "example.org", "--local-url", closed, "--start-timeout-ms", "200"},
		func(string) string { return "" }, io.Discard, io.Discard)
	if !errors.Is(err, sidecar.ErrStartTimeout) {
		t.Errorf("run: %v; want it to match sidecar.ErrStartTimeout", err)
	}
	err = run(context.Background(), []string{"--print-manifest", "--trust-domain", "example.org"}, func(string) string { return "" }, io.Discard, io.Discard)
	var ce *sidecar.ConfigError
	if !errors.As(err, &ce) || ce.Flag != "local-url" {
		t.Errorf("run: %v; want a *sidecar.ConfigError for --local-url", err)
	}
}

// TestMainExitStatus runs main in a child process (this test binary, with
// AIP_SIDECAR_TEST_MAIN set). What the operator must fix in how the
// sidecar is started exits 2, as a value the settings refuse when read
// did; these exited 1 like a failed start: a *sidecar.ConfigError (an
// empty --local-url), the host's *hostsdk.ConfigError (no
// --public-endpoint; aipfleet host exited 2 for it), a file a setting
// names that bootstrap step 1 refuses (a --signing-seed-file others can
// read), and aip-sidecar's own refusals (--log-level, a token file others
// can read, AIP_SIDECAR_EXEC that is not a JSON array, both --exec and
// --mcp-command, a setting of the other mode). A failure at run time (a
// connector that does not become healthy) still exits 1.
func TestMainExitStatus(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"aip-sidecar"}, args...)
		main()
		return
	}
	closed := closedURL(t)
	dir := t.TempDir()
	loose := filepath.Join(dir, "token")
	if err := os.WriteFile(loose, []byte("tok"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o644); err != nil {
		t.Fatal(err)
	}
	fleet := sidecartest.NewFakeFleet(t)
	replica := func(edit func(env map[string]string)) map[string]string {
		r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
		env := envOf(r.Env)
		env["AIP_SIDECAR_LOCAL_URL"] = closed
		env["AIP_SIDECAR_START_TIMEOUT_MS"] = "200"
		if edit != nil {
			edit(env)
		}
		return env
	}
	looseSeed := replica(func(env map[string]string) {
		if err := os.Chmod(env["AIP_CONNECTOR_HOST_SIGNING_SEED_FILE"], 0o644); err != nil {
			t.Fatal(err)
		}
	})
	noEndpoint := replica(func(env map[string]string) { delete(env, "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT") })
	for _, c := range []struct {
		args   []string
		env    map[string]string
		status int
		stderr string
	}{
		{nil, nil, 2, "aip-sidecar: --local-url (AIP_SIDECAR_LOCAL_URL, Config.Local.URL) is empty"},
		{nil, noEndpoint, 2, "aip-sidecar: hostsdk: bootstrap step 1 (validate): --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT, Config.PublicEndpoint) is required"},
		{nil, looseSeed, 2, "aip-sidecar: hostsdk: bootstrap step 1 (validate): --signing-seed-file"},
		{[]string{"--log-level", "loud"}, nil, 2, `aip-sidecar: --log-level (AIP_SIDECAR_LOG_LEVEL) is "loud"; want debug, info, warn or error`},
		// From the variable, the error names the variable (it named
		// --log-level, which the operator had not given).
		{nil, map[string]string{"AIP_SIDECAR_LOG_LEVEL": "loud"}, 2, `aip-sidecar: AIP_SIDECAR_LOG_LEVEL (--log-level) is "loud"; want debug, info, warn or error`},
		{[]string{"--local-url", closed, "--local-token-file", loose}, nil, 2, "aip-sidecar: --local-token-file: "},
		{nil, map[string]string{"AIP_SIDECAR_EXEC": "python3 x.py"}, 2, "aip-sidecar: AIP_SIDECAR_EXEC is \"python3 x.py\"; want a JSON array"},
		{nil, map[string]string{"AIP_SIDECAR_EXEC": `["a"]`, "AIP_SIDECAR_MCP_COMMAND": `["b"]`}, 2, "aip-sidecar: --exec and --mcp-command are both given"},
		{[]string{"--mcp-tools", "echo"}, map[string]string{"AIP_SIDECAR_LOCAL_URL": closed}, 2, "aip-sidecar: --mcp-tools (AIP_SIDECAR_MCP_TOOLS) applies only to an MCP server"},
		// Complete settings; the connector never answers.
		{nil, replica(nil), 1, "aip-sidecar: the connector did not become healthy within 200ms (--start-timeout-ms)"},
	} {
		var env []string
		for k, v := range c.env {
			env = append(env, k+"="+v)
		}
		status, stderr := hostsdktest.RunMain(t, "TestMainExitStatus", c.args, env)
		if status != c.status || !strings.Contains(stderr, c.stderr) {
			t.Errorf("aip-sidecar %v: exit status %d, want %d; stderr:\n%s\nwant it to contain %q", c.args, status, c.status, stderr, c.stderr)
		}
	}
}

// closedURL is the http URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "http://" + ln.Addr().String()
}
