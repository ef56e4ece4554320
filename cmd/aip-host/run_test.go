package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// products' minimal valid settings, as environment variables, with the
// files they name written into dir.
func productEnv(t *testing.T, dir string) map[string]map[string]string {
	t.Helper()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	token := write("token", "tok-123", 0o600)
	quote := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	return map[string]map[string]string{
		"cal-diy": {"AIP_CAL_DIY_BASE_URL": "https://api.cal.com", "AIP_CAL_DIY_BEARER_TOKEN_FILE": token},
		"chatwoot": {"AIP_CHATWOOT_BASE_URL": "https://chat.example.com", "AIP_CHATWOOT_ACCOUNT_ID": "3",
			"AIP_CHATWOOT_API_TOKEN_FILE": token},
		"crewai": {"AIP_CREWAI_CREWS_FILE": write("crews.json",
			`[{"id":"research","base_url":"https://research.crewai.com","token_file":`+quote(token)+`}]`, 0o644)},
		"dify": {"AIP_DIFY_BASE_URL": "https://api.dify.ai/v1", "AIP_DIFY_APPS_FILE": write("apps.json",
			`[{"id":"support","name":"Support","mode":"chat","api_key_file":`+quote(token)+`}]`, 0o644)},
		"hermes-agent": {"AIP_HERMES_ENDPOINTS_FILE": write("endpoints.json",
			`[{"id":"main","base_url":"https://hermes.example.com","api_key_file":`+quote(token)+`}]`, 0o644)},
		"twenty": {"AIP_TWENTY_BASE_URL": "https://api.twenty.com", "AIP_TWENTY_WORKSPACE_ID": "3b8e6458-5fc1-4e63-8563-008ccddaa6db",
			"AIP_TWENTY_API_TOKEN_FILE": token},
	}
}

func getenv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEveryProductIsRegistered(t *testing.T) {
	want := []string{"cal-diy", "chatwoot", "crewai", "dify", "hermes-agent", "twenty"}
	if got := names(); !slices.Equal(got, want) {
		t.Fatalf("products %v, want %v", got, want)
	}
	for _, n := range want {
		p := catalog[n]
		if p.Summary == "" || p.New == nil || len(p.Settings) == 0 {
			t.Errorf("%s: summary, constructor or settings missing", n)
		}
		prefix := "AIP_" + strings.ToUpper(strings.ReplaceAll(strings.Split(n, "-")[0], "-", "_")) + "_"
		for _, s := range p.Settings {
			if !strings.HasPrefix(s.Env, prefix) {
				t.Errorf("%s: setting %s's variable %s does not start with %s", n, s.Flag, s.Env, prefix)
			}
		}
	}
}

func TestUsage(t *testing.T) {
	var stderr bytes.Buffer
	err := run(t.Context(), nil, getenv(nil), &bytes.Buffer{}, &stderr)
	if err == nil || !strings.Contains(err.Error(), "name a product: cal-diy, chatwoot, crewai, dify, hermes-agent, twenty") {
		t.Fatalf("no arguments: %v", err)
	}
	for _, n := range names() {
		if !strings.Contains(stderr.String(), "  "+n) {
			t.Errorf("usage does not list %s:\n%s", n, stderr.String())
		}
	}
	if err := run(t.Context(), []string{"zendesk"}, getenv(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unknown product "zendesk"; want one of cal-diy`) {
		t.Fatalf("unknown product: %v", err)
	}
	stderr.Reset()
	if err := run(t.Context(), []string{"chatwoot", "-h"}, getenv(nil), &bytes.Buffer{}, &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, want := range []string{"\n  --chatwoot-base-url string\n", "AIP_CHATWOOT_BASE_URL", "\n  --control-plane-endpoint string\n", "\n  --print-manifest\n"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("chatwoot -h does not mention %q", want)
		}
	}
	// The flags are written with two dashes, as the messages write them.
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "  -") && !strings.HasPrefix(line, "  --") {
			t.Errorf("chatwoot -h lists a flag with one dash: %q", line)
		}
	}
	if err := run(t.Context(), []string{"chatwoot", "extra"}, getenv(nil), &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), `unexpected argument "extra"`) {
		t.Fatalf("extra argument: %v", err)
	}
}

func TestSettingErrorsNameTheSetting(t *testing.T) {
	envs := productEnv(t, t.TempDir())
	env := envs["chatwoot"]
	env["AIP_CHATWOOT_BASE_URL"] = "http://chat.example.com"
	err := run(t.Context(), []string{"chatwoot", "--print-manifest"}, getenv(env), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "chatwoot") || !strings.Contains(err.Error(), "https") {
		t.Fatalf("plain http base URL: %v", err)
	}
	err = run(t.Context(), []string{"chatwoot", "--log-level", "loud"}, getenv(envs["chatwoot"]), &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "--log-level") {
		t.Fatalf("bad log level: %v", err)
	}
}

// TestPrintManifest: every product prints its manifest bound to the
// configured trust domain, with the digest the host would register, and
// the flags win over the variables.
func TestPrintManifest(t *testing.T) {
	for n, env := range productEnv(t, t.TempDir()) {
		t.Run(n, func(t *testing.T) {
			env["AIP_CONNECTOR_HOST_TRUST_DOMAIN"] = "ignored.example"
			env["AIP_CONNECTOR_HOST_TENANT_ID"] = "tenant-a"
			var stdout bytes.Buffer
			if err := run(t.Context(), []string{n, "--print-manifest", "--trust-domain", "fleet.example"}, getenv(env), &stdout, &bytes.Buffer{}); err != nil {
				t.Fatal(err)
			}
			var out struct {
				Digest  string              `json:"manifest_digest"`
				Count   int                 `json:"capability_count"`
				Support map[string][]string `json:"implementation_support"`
				M       aip.Manifest        `json:"manifest"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatalf("output is not the manifest JSON: %v\n%s", err, stdout.String())
			}
			if out.M.Agent.TrustDomain != "fleet.example" || out.Count == 0 || out.Count != len(out.M.Capabilities) {
				t.Fatalf("manifest agent %+v, %d capabilities (count %d)", out.M.Agent, len(out.M.Capabilities), out.Count)
			}
			_, digest, err := hostsdk.BindManifest(&out.M, "fleet.example")
			if err != nil || digest != out.Digest {
				t.Fatalf("printed digest %s, the manifest binds to %s (%v)", out.Digest, digest, err)
			}
			// The claims admit the manifest as a version.
			v := registrytest.Version("cver_"+strings.ReplaceAll(n, "-", "_"), "ctype_x", "1.0.0", "team", registry.VersionActive, out.M)
			v.ImplementationSupport = map[string]aip.ImplementationSupport{}
			for id, features := range out.Support {
				s := aip.ImplementationSupport{}
				for _, f := range features {
					set := map[string]*bool{"invocation": &s.Invocation, "cancellation": &s.Cancellation, "streaming": &s.Streaming,
						"retry": &s.Retry, "transaction": &s.Transaction, "reconciliation": &s.Reconciliation,
						"compensation": &s.Compensation, "approval": &s.Approval, "credentials": &s.Credentials}[f]
					if set == nil {
						t.Fatalf("%s: unknown feature %q", id, f)
					}
					*set = true
				}
				v.ImplementationSupport[id] = s
			}
			if _, err := registry.PrepareVersion(v, registry.DefaultLimits()); err != nil {
				t.Fatalf("the printed manifest and claims are not admissible: %v", err)
			}
			if strings.Contains(stdout.String(), "tok-123") {
				t.Fatal("the credential is in the manifest")
			}
		})
	}
}

// TestDocsUseRealFlags: every aip-host command in docs/products.md (go run
// ./cmd/aip-host, ./aip-host or aip-host) names a product and flags that
// exist.
func TestDocsUseRealFlags(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "products.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	inSh := false
	for _, line := range strings.Split(strings.ReplaceAll(string(raw), "\\\n", " "), "\n") {
		switch trimmed := strings.TrimSpace(line); {
		case trimmed == "```sh":
			inSh = true
		case trimmed == "```":
			inSh = false
		case inSh:
			// The examples run the product from the source tree or the
			// built binary; both must name real flags.
			for _, prefix := range []string{"go run ./cmd/aip-host ", "./aip-host ", "aip-host "} {
				if strings.HasPrefix(trimmed, prefix) {
					cmds = append(cmds, strings.TrimPrefix(trimmed, prefix))
					break
				}
			}
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("found %d aip-host commands in docs/products.md; the reader expects at least the print and run examples", len(cmds))
	}
	for _, c := range cmds {
		args := strings.Fields(c)
		p, ok := catalog[args[0]]
		if !ok {
			t.Errorf("docs/products.md: unknown product in %q", c)
			continue
		}
		fs := flag.NewFlagSet("docs", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		bindFlags(fs, p)
		if err := fs.Parse(args[1:]); err != nil || fs.NArg() > 0 {
			t.Errorf("docs/products.md: %q: %v (arguments left: %v)", c, err, fs.Args())
		}
	}
}

// TestCommandLineMistakesAreOneLineUsageErrors: a misspelled flag printed
// the product's whole flag list (over a hundred lines) with the mistake
// above it, and every mistake of the command line exited 1 like a failed
// start; it is now one line naming the mistake and where the flags are
// listed, a usage error (exit status 2), and nothing else on stderr.
func TestCommandLineMistakesAreOneLineUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dify", "--bogus"}, "unknown flag --bogus (run `aip-host dify --help` for the flags)"},
		{[]string{"dify", "-bogus"}, "unknown flag --bogus (run `aip-host dify --help` for the flags)"},
		{[]string{"dify", "--max-in-flite", "3"}, "unknown flag --max-in-flite; did you mean --max-in-flight? (run `aip-host dify --help` for the flags)"},
		{[]string{"dify", "--dify-apps"}, "unknown flag --dify-apps; did you mean --dify-apps-file? (run `aip-host dify --help` for the flags)"},
		{[]string{"dify", "--log-level"}, "flag needs an argument: --log-level (run `aip-host dify --help` for the flags)"},
		{[]string{"dify", "extra"}, "unexpected argument \"extra\"; every setting is a flag (run `aip-host dify --help` for the flags)"},
		{[]string{"zendesk"}, `unknown product "zendesk"`},
		{nil, "name a product"},
	} {
		var stderr bytes.Buffer
		err := run(t.Context(), c.args, getenv(nil), &bytes.Buffer{}, &stderr)
		var u *hostrun.UsageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want a usage error saying %q", c.args, err, c.want)
		}
		if len(c.args) > 0 && stderr.Len() > 0 {
			t.Errorf("%v: stderr has %d bytes besides the error:\n%.300s", c.args, stderr.Len(), stderr.String())
		}
	}
}

// TestRefusedSettingsExitAsUsage: a flag's or variable's value the
// settings refuse (--drain-timeout-ms=soon, a product's or aip-host's
// own) exited 1 like a failed start, while an unknown flag exited 2; it
// is a mistake on the command line too, exit status 2.
func TestRefusedSettingsExitAsUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want int
	}{
		{[]string{"dify", "--drain-timeout-ms=soon"}, nil, 2},
		{[]string{"dify"}, map[string]string{"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "0"}, 2},
		{[]string{"dify", "--log-level", "loud"}, nil, 2},
		{[]string{"dify"}, map[string]string{"AIP_DIFY_BASE_URL": ""}, 2},
		{[]string{"dify"}, map[string]string{"AIP_DIFY_APPS_FILE": "/nonexistent/apps.json"}, 2},
		{[]string{"dify", "--bogus"}, nil, 2},
		{[]string{"dify", "-h"}, nil, 0},
	} {
		// The product's settings are complete: the host's are what is wrong.
		env := productEnv(t, t.TempDir())["dify"]
		maps.Copy(env, c.env)
		err := run(t.Context(), c.args, getenv(env), &bytes.Buffer{}, &bytes.Buffer{})
		if got := hostrun.ExitCode(err); got != c.want {
			t.Errorf("%v %v: exit status %d (err %v), want %d", c.args, c.env, got, err, c.want)
		}
	}
	if got := hostrun.ExitCode(errors.New("bootstrap failed")); got != 1 {
		t.Errorf("another error: exit status %d, want 1", got)
	}
}

// TestRefusedSettingsReadAsGiven: a refused value read "aip-host:
// hostsdk: --drain-timeout-ms (...) from --drain-timeout-ms is ...", and
// aip-host's own --log-level was "hostsdk: ..." too. The error, which main
// prints after "aip-host: ", now starts with the setting as it was given
// (the variable when the value came from it) and says what is accepted.
func TestRefusedSettingsReadAsGiven(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"dify", "--drain-timeout-ms=soon"}, nil,
			`--drain-timeout-ms (AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS, Config.DrainTimeout) is "soon"; want an integer from 1 to 300000 ms`},
		{[]string{"dify"}, map[string]string{"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "0"},
			`AIP_CONNECTOR_HOST_MAX_IN_FLIGHT (--max-in-flight, Config.MaxInFlight) is "0"; want an integer from 1 to 65536`},
		{[]string{"dify", "--log-level", "loud"}, nil,
			`--log-level (AIP_HOST_LOG_LEVEL) is "loud"; want debug, info, warn or error`},
	} {
		env := productEnv(t, t.TempDir())["dify"]
		maps.Copy(env, c.env)
		err := run(t.Context(), c.args, getenv(env), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || err.Error() != c.want {
			t.Errorf("%v %v:\n got %v\nwant %s", c.args, c.env, err, c.want)
		}
	}
}

// TestMainExitStatus runs main in a child process (this test binary, with
// AIP_HOST_TEST_MAIN set): a setting the product adapter refuses (no base
// URL, a token file others can read) exited 1 like a failed start, though
// a value the settings refuse when read exits 2; it is a mistake in how
// the replica was started, exit status 2 too, with one line naming the
// setting. So does a configuration hostsdk refuses (hostsdk.New's
// *ConfigError, bootstrap step 1's *ValidateError about a file a setting
// names), which exited 1 too (hostrun.ExitCode has the rule).
func TestMainExitStatus(t *testing.T) {
	if args, ok := hostsdktest.MainArgs(); ok {
		os.Args = append([]string{"aip-host"}, args...)
		main()
		return
	}
	dir := t.TempDir()
	open := filepath.Join(dir, "open-token")
	if err := os.WriteFile(open, []byte("tok-123"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o644); err != nil {
		t.Fatal(err)
	}
	good := productEnv(t, dir)["chatwoot"]
	with := func(k, v string) map[string]string {
		m := maps.Clone(good)
		m[k] = v
		return m
	}
	fleet := sidecartest.NewFakeFleet(t)
	complete := func() map[string]string {
		env := maps.Clone(good)
		for _, kv := range fleet.NewReplica(t, sidecartest.ReplicaOptions{}).Env {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
		return env
	}
	looseSeed := complete()
	if err := os.Chmod(looseSeed["AIP_CONNECTOR_HOST_SIGNING_SEED_FILE"], 0o644); err != nil {
		t.Fatal(err)
	}
	looseURLFile := complete()
	looseURLFile["AIP_CONNECTOR_HOST_DATABASE_URL_FILE"] = open
	calDiy := maps.Clone(productEnv(t, dir)["cal-diy"])
	calDiy["AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES"] = "http://aip.example.com/hooks/"
	for _, c := range []struct {
		args   []string
		env    map[string]string
		status int
		stderr string
	}{
		{[]string{"chatwoot"}, with("AIP_CHATWOOT_BASE_URL", ""), 2,
			"aip-host: chatwoot: --chatwoot-base-url (AIP_CHATWOOT_BASE_URL): no URL given; give the origin of the API (scheme, host and port)\n"},
		{[]string{"chatwoot", "--chatwoot-api-token-file", open}, good, 2,
			"aip-host: chatwoot: --chatwoot-api-token-file (AIP_CHATWOOT_API_TOKEN_FILE): "},
		{[]string{"twenty"}, nil, 2, "aip-host: twenty: --twenty-base-url"},
		{[]string{"chatwoot"}, with("AIP_CHATWOOT_ACCOUNT_ID", "acme"), 2, `aip-host: AIP_CHATWOOT_ACCOUNT_ID (--chatwoot-account-id) is "acme"`},
		// An error of the adapter's package-level New (calcom.New) is
		// printed after the product's name, once: it read "aip-host:
		// cal-diy: calcom: --cal-diy-...".
		{[]string{"cal-diy"}, calDiy, 2,
			"aip-host: cal-diy: --cal-diy-webhook-subscriber-prefixes (AIP_CAL_DIY_WEBHOOK_SUBSCRIBER_PREFIXES): prefix \"http://aip.example.com/hooks/\" must be an https URL\n"},
		// The product's settings are complete; the host's are missing:
		// hostsdk.New's *ConfigError, which exited 1 (2 in aipfleet host).
		{[]string{"chatwoot"}, good, 2, "aip-host: hostsdk: bootstrap step 1 (validate): --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT, Config.PublicEndpoint) is required: "},
		// Complete settings, but bootstrap step 1 refuses a file a
		// setting names; it exited 1.
		{[]string{"chatwoot"}, looseSeed, 2, "aip-host: hostsdk: bootstrap step 1 (validate): --signing-seed-file"},
		{[]string{"chatwoot"}, looseURLFile, 2, "aip-host: hostsdk: bootstrap step 2 (open_journal): --database-url-file (AIP_CONNECTOR_HOST_DATABASE_URL_FILE): "},
		{[]string{"chatwoot", "-h"}, nil, 0, "\n  --chatwoot-base-url string\n"},
	} {
		var env []string
		for k, v := range c.env {
			env = append(env, k+"="+v)
		}
		status, stderr := hostsdktest.RunMain(t, "TestMainExitStatus", c.args, env)
		if status != c.status || !strings.Contains(stderr, c.stderr) {
			t.Errorf("aip-host %v: exit status %d, want %d; stderr:\n%s\nwant it to contain %q", c.args, status, c.status, stderr, c.stderr)
		}
	}
}
