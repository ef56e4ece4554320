package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
)

func runCLI(t *testing.T, env map[string]string, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, func(k string) string { return env[k] }, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestHelpListsEveryCommandWithExamples(t *testing.T) {
	out, _, err := runCLI(t, nil, "--help")
	if !errors.Is(err, errHelpShown) {
		t.Fatalf("err = %v", err)
	}
	for _, c := range commandList() {
		if !strings.Contains(out, c.name) {
			t.Errorf("main help does not list %s", c.name)
		}
		help, _, err := runCLI(t, nil, c.name, "--help")
		if !errors.Is(err, errHelpShown) {
			t.Errorf("%s --help: err = %v", c.name, err)
		}
		if !strings.Contains(help, "Examples:") || !strings.Contains(help, "aipfleet "+c.name) {
			t.Errorf("%s --help lacks usage or examples:\n%s", c.name, help)
		}
		same, _, _ := runCLI(t, nil, "help", c.name)
		if same != help {
			t.Errorf("`help %s` differs from `%s --help`", c.name, c.name)
		}
	}
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	_, _, err := runCLI(t, nil, "frobnicate")
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "aipfleet --help") {
		t.Fatalf("err = %v, want a usage error pointing at --help", err)
	}
	_, _, err = runCLI(t, nil, "version", "--bogus")
	if !errors.As(err, &u) {
		t.Fatalf("bad flag: err = %v, want usage error", err)
	}
}

func TestKeygenAndTokenRoundTrip(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "issuer.key")
	out, _, err := runCLI(t, nil, "keygen", "--out", keyFile)
	if err != nil {
		t.Fatal(err)
	}
	did := strings.TrimSpace(out)
	if _, err := aip.ParseDIDKey(did); err != nil {
		t.Fatalf("keygen printed %q: %v", out, err)
	}
	if info, _ := os.Stat(keyFile); info.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v", info.Mode().Perm())
	}
	// A file already at --out is never overwritten; it is a setting to
	// fix (exit status 2), which exited 1 with "file exists": the error
	// says to give another file, how to print the existing key's DID, or
	// to remove it first. So is a symlink there, wherever it leads.
	before, _ := os.ReadFile(keyFile)
	link := filepath.Join(dir, "link.key")
	if err := os.Symlink(filepath.Join(dir, "elsewhere.key"), link); err != nil {
		t.Fatal(err)
	}
	var u *usageError
	for _, existing := range []string{keyFile, link} {
		_, _, err := runCLI(t, nil, "keygen", "--out", existing)
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "keygen: --out "+existing+" already exists, and keygen never overwrites a file") ||
			!strings.Contains(err.Error(), "give --out a new file") || !strings.Contains(err.Error(), "aipfleet keygen --did-of "+existing+" prints its did:key") ||
			!strings.Contains(err.Error(), "remove "+existing+" first") {
			t.Fatalf("keygen --out %s, which exists: err = %v, want a usage error saying what to do", existing, err)
		}
	}
	if after, err := os.ReadFile(keyFile); err != nil || string(after) != string(before) {
		t.Fatalf("keygen --out an existing key changed it: %q, %v; was %q", after, err, before)
	}
	if _, err := os.Lstat(filepath.Join(dir, "elsewhere.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keygen --out a dangling symlink wrote where it leads: %v", err)
	}
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	// A directory of --out that does not exist is a setting too, saying
	// which directory, not that a file exists.
	missingDir := filepath.Join(dir, "missing")
	_, _, err = runCLI(t, nil, "keygen", "--out", filepath.Join(missingDir, "x.key"))
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "keygen: --out "+filepath.Join(missingDir, "x.key")+": the directory "+missingDir+" does not exist: create it") ||
		strings.Contains(err.Error(), "already exists") {
		t.Fatalf("keygen into a missing directory: err = %v", err)
	}

	// --did-of prints an existing key's DID, checking the file as every
	// secret file is checked, and creates nothing.
	if out, _, err := runCLI(t, nil, "keygen", "--did-of", keyFile); err != nil || strings.TrimSpace(out) != did {
		t.Fatalf("keygen --did-of: %q, %v; want %s", out, err, did)
	}
	if out, _, err := runCLI(t, nil, "keygen", "--did-of", keyFile, "--json"); err != nil || !strings.Contains(out, `"did": "`+did+`"`) || !strings.Contains(out, keyFile) {
		t.Fatalf("keygen --did-of --json: %q, %v", out, err)
	}
	loose := filepath.Join(dir, "loose.key")
	os.WriteFile(loose, []byte(strings.Repeat("ab", 32)+"\n"), 0o644)
	if _, _, err := runCLI(t, nil, "keygen", "--did-of", loose); err == nil || !strings.Contains(err.Error(), "--did-of") || !strings.Contains(err.Error(), "loose.key") {
		t.Fatalf("keygen --did-of a group-readable key: err = %v", err)
	}
	// A directory (aipfleet dev's keys directory, say) is named as one,
	// with a key file in it.
	if _, _, err := runCLI(t, nil, "keygen", "--did-of", dir); err == nil ||
		!strings.Contains(err.Error(), "--did-of "+dir+" is a directory: --did-of wants the key file itself, such as "+filepath.Join(dir, "issuer.key")+" (the directory holds 2 .key files)") {
		t.Fatalf("keygen --did-of a directory: err = %v", err)
	}
	for _, args := range [][]string{{"--did-of", keyFile, "--out", filepath.Join(dir, "new.key")}, {"--json"}} {
		var u *usageError
		if _, _, err := runCLI(t, nil, append([]string{"keygen"}, args...)...); !errors.As(err, &u) || !strings.Contains(err.Error(), "--did-of") {
			t.Fatalf("keygen %v: err = %v, want a usage error naming --did-of", args, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "new.key")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("keygen with --out and --did-of created a key: %v", err)
	}

	// Flags come from the environment when not given.
	out, _, err = runCLI(t, map[string]string{"AIP_TOKEN_ISSUER_KEY": keyFile, "AIP_TOKEN_TENANT": "tenant-env"}, "token", "--ttl", "10m")
	if err != nil {
		t.Fatal(err)
	}
	v, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "aipfleet-dev", DIDs: []string{did}}}})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := v.Verify(strings.TrimSpace(out))
	if err != nil {
		t.Fatal(err)
	}
	if claims.TenantID != "tenant-env" || claims.Expiry.Sub(claims.IssuedAt) != 10*time.Minute {
		t.Fatalf("claims = %+v", claims)
	}
	// A flag wins over the environment.
	out, _, _ = runCLI(t, map[string]string{"AIP_TOKEN_ISSUER_KEY": keyFile, "AIP_TOKEN_TENANT": "tenant-env"}, "token", "--tenant", "tenant-flag")
	if claims, _ := v.Verify(strings.TrimSpace(out)); claims.TenantID != "tenant-flag" {
		t.Fatalf("flag did not override env: %+v", claims)
	}
	// A bad environment value names the variable.
	_, _, err = runCLI(t, map[string]string{"AIP_TOKEN_TTL": "soon"}, "token")
	if err == nil || !strings.Contains(err.Error(), "AIP_TOKEN_TTL") {
		t.Fatalf("bad env: err = %v", err)
	}
}

// TestFlagGivenTwiceIsAUsageError: the flag package keeps the last of two
// values silently, so `dispatch --issuer a=DID1 --issuer b=DID2` trusted
// only b. Every command refuses a flag given twice, naming it, also across
// the positional arguments of action, and for the host flags of hostsdk;
// a flag given once still wins over its environment variable.
func TestFlagGivenTwiceIsAUsageError(t *testing.T) {
	a, err := aip.GenerateSigningKey()
	noErr(t, err)
	b, err := aip.GenerateSigningKey()
	noErr(t, err)
	var u *usageError
	for _, tc := range []struct {
		args []string
		flag string
		list bool
	}{
		{[]string{"dispatch", "--issuer", "a=" + a.DID(), "--issuer", "b=" + b.DID()}, "--issuer", true},
		{[]string{"control-plane", "--operator-issuer", "a=" + a.DID(), "--operator-issuer=b=" + b.DID()}, "--operator-issuer", true},
		{[]string{"action", "get", "--json", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--json"}, "--json", false},
		{[]string{"action", "send", "--capability", "echo.say", "--capability", "echo.nope", "--input", "{}"}, "--capability", false},
		{[]string{"host", "--connector", "echo", "--replica-id", "crepl_1", "--replica-id", "crepl_2"}, "--replica-id", false},
		{[]string{"token", "--tenant", "a", "--tenant", "b"}, "--tenant", false},
	} {
		_, _, err := runCLI(t, nil, tc.args...)
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.flag+" is given more than once") ||
			strings.Contains(err.Error(), "comma-separated") != tc.list {
			t.Errorf("%q: err = %v, want a usage error naming %s", tc.args, err, tc.flag)
		}
	}
	// Once on the command line and once in the environment is not twice.
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "issuer.key")
	if _, _, err := runCLI(t, nil, "keygen", "--out", keyFile); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, map[string]string{"AIP_TOKEN_TENANT": "tenant-env", "AIP_TOKEN_OPERATOR": "false"},
		"token", "--issuer-key", keyFile, "--tenant", "tenant-flag")
	if err != nil || strings.Count(strings.TrimSpace(out), ".") != 2 {
		t.Fatalf("token: %q, %v", out, err)
	}
}

// TestCommandsWithoutArgumentsRefuseThem: keygen, token and version took
// no positional argument but ignored one, so `token --tenant acme corp`
// minted a token for acme and `keygen --out a.key b.key` wrote only a.key.
func TestCommandsWithoutArgumentsRefuseThem(t *testing.T) {
	dir := t.TempDir()
	keyFile, tokenKey := filepath.Join(dir, "new.key"), filepath.Join(dir, "issuer.key")
	if _, _, err := runCLI(t, nil, "keygen", "--out", tokenKey); err != nil {
		t.Fatal(err)
	}
	var u *usageError
	for _, args := range [][]string{
		{"keygen", "--out", keyFile, filepath.Join(dir, "other.key")},
		{"token", "--issuer-key", tokenKey, "--tenant", "acme", "corp"},
		{"version", "now"},
	} {
		out, _, err := runCLI(t, nil, args...)
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "unexpected argument") || out != "" {
			t.Errorf("%q: out %q, err = %v, want a usage error naming the argument", args, out, err)
		}
	}
	if _, err := os.Stat(keyFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("keygen with a stray argument wrote its key: %v", err)
	}
}

// A malformed number or duration, on the command line or in a variable,
// says what form the value takes rather than the flag package's bare
// "parse error".
func TestMalformedFlagValueSaysTheFormItTakes(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"control-plane", "--lease-ttl", "30"}, `invalid value "30" for flag --lease-ttl: want a duration with its unit, such as 30s`},
		{map[string]string{"AIP_CONTROL_LEASE_TTL": "30"}, []string{"control-plane"}, `AIP_CONTROL_LEASE_TTL="30": want a duration with its unit`},
		{nil, []string{"dev", "--replicas", "three"}, `invalid value "three" for flag --replicas: want a whole number`},
		{nil, []string{"action", "send", "--json=maybe"}, `invalid boolean value "maybe" for --json: want true or false`},
		// The flags are spelled as the help spells them, and an unknown
		// or valueless one is said plainly.
		{nil, []string{"action", "send", "--timeout-ms", "abc"}, `action send: invalid value "abc" for flag --timeout-ms: want a whole number`},
		{nil, []string{"fleet", "status", "--bogus"}, "fleet status: unknown flag --bogus (run `aipfleet fleet --help`)"},
		// The errors of a subcommand's flags name it, as its other errors
		// do; they named the top command alone.
		{nil, []string{"registry", "status", "--timeout", "5"}, "registry status: invalid value \"5\" for flag --timeout: want a duration"},
		{map[string]string{"AIP_CLIENT_REQUEST_TIMEOUT": "soon"}, []string{"events", "list"}, "events list: environment variable AIP_CLIENT_REQUEST_TIMEOUT=\"soon\""},
		{nil, []string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--url", "http://127.0.0.1:1", "--url", "http://127.0.0.1:2"}, "action get: --url is given more than once"},
		{nil, []string{"version", "-bogus"}, "version: unknown flag --bogus"},
		{nil, []string{"token", "--issuer-key"}, "token: --issuer-key needs a value"},
	} {
		_, _, err := runCLI(t, tc.env, tc.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "parse error") {
			t.Errorf("%v %v: err = %v, want a usage error containing %q", tc.env, tc.args, err, tc.want)
		}
	}
}

// A tenant the dispatcher would refuse (TestBadTokenClaims there) is a
// usage error, and no token is printed.
func TestTokenRefusesATenantTheDispatcherWould(t *testing.T) {
	key := filepath.Join(t.TempDir(), "issuer.key")
	if _, _, err := runCLI(t, nil, "keygen", "--out", key); err != nil {
		t.Fatal(err)
	}
	for _, tenant := range []string{" acme", "acme ", "ac\tme", "a\x00b", strings.Repeat("t", 257), "\xff"} {
		out, _, err := runCLI(t, nil, "token", "--issuer-key", key, "--tenant", tenant)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "is not a tenant ID") || out != "" {
			t.Errorf("--tenant %q: out %q, err %v; want a usage error and no token", tenant, out, err)
		}
	}
	if out, _, err := runCLI(t, nil, "token", "--issuer-key", key, "--tenant", strings.Repeat("t", 256)); err != nil || out == "" {
		t.Errorf("a 256-byte tenant: %q, %v", out, err)
	}
}

// A tenant holding an invisible formatting character is a usage error
// naming the flag, the character's code point and the fix, for token and
// for the commands that mint a token from --tenant; nothing is minted or
// sent. token minted it (the dispatcher took the token and the registry
// refused its actions), and action send minted and sent it.
func TestTenantFlagWithFormatCharacterIsAUsageError(t *testing.T) {
	key := filepath.Join(t.TempDir(), "issuer.key")
	if _, _, err := runCLI(t, nil, "keygen", "--out", key); err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	for _, c := range []struct {
		tenant, code string
	}{
		{"acme\u200b", "U+200B"}, {"ac\u00adme", "U+00AD"}, {"\u202eacme", "U+202E"}, {"acme\U000e0041", "U+E0041"},
	} {
		tenant, err := strconv.Unquote(`"` + c.tenant + `"`)
		if err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{
			{"token", "--issuer-key", key, "--tenant", tenant},
			{"action", "send", "--url", srv.URL, "--issuer-key", key, "--tenant", tenant, "--capability", "echo.say", "--input", "{}"},
			{"capability", "list", "--url", srv.URL, "--issuer-key", key, "--tenant", tenant},
		} {
			want := fmt.Sprintf("--tenant %q holds the invisible formatting character %s, which no tenant ID may hold (it would print like a tenant ID it is not): remove it", tenant, c.code)
			out, _, err := runCLI(t, nil, args...)
			var u *usageError
			if !errors.As(err, &u) || !strings.HasPrefix(err.Error(), args[0]) || !strings.Contains(err.Error(), want) || out != "" {
				t.Errorf("%s --tenant %q: out %q, err %v; want a usage error saying %q and no token", args[0], tenant, out, err, want)
			}
		}
	}
	if n := hits.Load(); n != 0 {
		t.Errorf("%d requests were sent with a tenant the dispatcher refuses", n)
	}
	// Non-ASCII text is a tenant ID; a formatting character is what is
	// refused.
	if out, _, err := runCLI(t, nil, "token", "--issuer-key", key, "--tenant", "café-租户"); err != nil || out == "" {
		t.Errorf("tenant café-租户: %q, %v", out, err)
	}
}

// A token whose issuer key cannot be read names the command and the flag.
func TestTokenMissingIssuerKeyNamesTheFlag(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "issuer.key")
	_, _, err := runCLI(t, nil, "token", "--issuer-key", missing, "--tenant", "acme")
	if err == nil || !strings.HasPrefix(err.Error(), "token: --issuer-key: ") || !strings.Contains(err.Error(), missing) {
		t.Fatalf("err = %v, want it to name token, --issuer-key and the file", err)
	}
}

// An empty --issuer or --audience of a token a command mints is a usage
// error naming the flag, not the token library's "issuer and audience are
// required"; nothing is printed or sent.
func TestEmptyIssuerOrAudienceOfAMintedTokenNamesTheFlag(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "issuer.key")
	if _, _, err := runCLI(t, nil, "keygen", "--out", key); err != nil {
		t.Fatal(err)
	}
	client := []string{"--url", "http://127.0.0.1:1", "--dev-state-dir", dir, "--tenant", "acme", "--issuer-key", key}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"token", "--issuer-key", key, "--tenant", "acme", "--issuer", ""}, "token: --issuer is empty"},
		{[]string{"token", "--issuer-key", key, "--operator", "--issuer", ""}, "token: --issuer is empty"},
		{append([]string{"action", "send", "--capability", "echo.say", "--input", "{}", "--issuer", ""}, client...), "action send: --issuer is empty"},
		{append([]string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--audience", ""}, client...), "action get: --audience is empty"},
		{append([]string{"events", "list", "--audience", ""}, client...), "events list: --audience is empty"},
		{[]string{"fleet", "status", "--control-url", "http://127.0.0.1:1", "--dev-state-dir", dir, "--issuer-key", key, "--issuer", ""}, "fleet status: --issuer is empty"},
	} {
		out, _, err := runCLI(t, nil, tc.args...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tc.want) || out != "" {
			t.Errorf("%q: out %q, err %v; want a usage error containing %q", tc.args, out, err, tc.want)
		}
	}
}

// An error about a flag whose value came from its environment variable
// says which variable set it (the command line has no such flag); the
// value is not repeated, a usage error stays one, and a flag given on the
// command line, or one the error does not name, gets no note.
func TestErrorNamesTheVariableThatSetItsFlag(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		env     map[string]string
		args    []string
		want    string
		usage   bool
		notWant []string
	}{
		{map[string]string{"AIP_CLIENT_URL": "foo"}, []string{"action", "send", "--capability", "c", "--input", "{}"},
			"\n(--url was set by the environment variable AIP_CLIENT_URL)", true, nil},
		{map[string]string{"AIP_FLEET_CONTROL_URL": "bar"}, []string{"fleet", "status"},
			"(--control-url was set by the environment variable AIP_FLEET_CONTROL_URL)", true, nil},
		{map[string]string{"AIP_TOKEN_TTL": "0s"}, []string{"token", "--issuer-key", "k", "--tenant", "t"},
			"--ttl 0s is outside 1s..720h\n(--ttl was set by the environment variable AIP_TOKEN_TTL)", true, nil},
		// hostsdk's error starts from the variable, as it was given: no
		// note repeats it, and "hostsdk: " is not there.
		{map[string]string{"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "0"}, []string{"host", "--connector", "echo"},
			`host: AIP_CONNECTOR_HOST_MAX_IN_FLIGHT (--max-in-flight, Config.MaxInFlight) is "0"; want an integer from 1 to 65536`, true,
			[]string{"environment variable", "hostsdk"}},
		// A file the flag names that cannot be used is a usage error
		// too (settingError), and keeps the note; --issuer, also from
		// a variable, is not the flag named.
		{map[string]string{"AIP_CLIENT_ISSUER_KEY": filepath.Join(dir, "missing.key"), "AIP_CLIENT_ISSUER": "idp"},
			[]string{"action", "send", "--url", "http://127.0.0.1:1", "--tenant", "t", "--capability", "c", "--input", "{}"},
			"does not exist\n(--issuer-key was set by the environment variable AIP_CLIENT_ISSUER_KEY)", true, []string{"--issuer was set", "AIP_CLIENT_ISSUER)"}},
		// The token's variable is not named in the error, and its value
		// never appears; --url came from the command line.
		{map[string]string{"AIP_CLIENT_TOKEN": "s3cret"}, []string{"action", "send", "--url", "http://127.0.0.1:1", "--capability", "c", "--input", "{}"},
			"point --url at it", false, []string{"s3cret", "environment variable"}},
		// Flags after a positional argument are parsed in a second run:
		// --url given there is the command line's, and a variable read
		// in both runs is named once.
		{map[string]string{"AIP_CLIENT_URL": "http://127.0.0.1:1"}, []string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t", "--url", "http://127.0.0.1:2"},
			"no dispatcher answers at http://127.0.0.1:2", false, []string{"environment variable"}},
		{map[string]string{"AIP_CLIENT_URL": "http://127.0.0.1:1"}, []string{"action", "get", "act_0190f2c3d4e57a6b8c9d0e1f2a3b4c5d", "--token", "t"},
			"point --url at it\n(--url was set by the environment variable AIP_CLIENT_URL)", false, []string{"; --url was set"}},
	} {
		_, _, err := runCLI(t, tc.env, tc.args...)
		if err == nil {
			t.Errorf("%v %q: no error", tc.env, tc.args)
			continue
		}
		var u *usageError
		if !strings.Contains(err.Error(), tc.want) || errors.As(err, &u) != tc.usage {
			t.Errorf("%v %q: err = %q (usage error %t), want %q (usage error %t)", tc.env, tc.args, err, errors.As(err, &u), tc.want, tc.usage)
		}
		for _, nw := range tc.notWant {
			if strings.Contains(err.Error(), nw) {
				t.Errorf("%v %q: err = %q contains %q", tc.env, tc.args, err, nw)
			}
		}
	}
}

// keygen --out naming a directory says so, instead of "file exists" and a
// hint to read the directory's did:key with --did-of.
func TestKeygenOutADirectory(t *testing.T) {
	dir := t.TempDir()
	_, _, err := runCLI(t, nil, "keygen", "--out", dir)
	var u *usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "--out "+dir+" is a directory: give the key file to create, such as "+filepath.Join(dir, "signing.key")) ||
		strings.Contains(err.Error(), "--did-of") {
		t.Fatalf("err = %v", err)
	}
}
