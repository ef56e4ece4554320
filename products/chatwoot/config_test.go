package chatwoot

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// settings reads the product's settings from an environment, as
// cmd/aip-host does.
func settings(t *testing.T, env map[string]string) (hostsdk.SettingValues, error) {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	load := hostsdk.BindSettings(fs, Product.Settings)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	return load(func(k string) string { return env[k] })
}

func TestNewFromSettings(t *testing.T) {
	token := writeFile(t, "token", testToken+"\n", 0o600)
	secret := writeFile(t, "secret", testSecret, 0o600)
	ops := writeFile(t, "ops.json", `["contact.get","conversation.list"]`, 0o644)
	valid := map[string]string{
		"AIP_CHATWOOT_BASE_URL":            "https://chat.example.com/",
		"AIP_CHATWOOT_ACCOUNT_ID":          "7",
		"AIP_CHATWOOT_API_TOKEN_FILE":      token,
		"AIP_CHATWOOT_WEBHOOK_SECRET_FILE": secret,
		"AIP_CHATWOOT_MAX_RESPONSE_BYTES":  "1048576",
		"AIP_CHATWOOT_OPERATIONS_FILE":     ops,
	}
	v, err := settings(t, valid)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := Product.New(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := conn.(*Connector)
	if c.cfg.BaseURL.String() != "https://chat.example.com" || c.cfg.AccountID != 7 || c.cfg.Token.Reveal() != testToken ||
		c.cfg.WebhookSecret.Reveal() != testSecret || c.cfg.MaxResponseBytes != 1<<20 || len(c.ops) != 2 {
		t.Errorf("config %+v ops %d", c.cfg, len(c.ops))
	}

	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for kk, vv := range valid {
			m[kk] = vv
		}
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
		return m
	}
	cases := []struct {
		name string
		env  map[string]string
		want []string // fragments of the error
	}{
		{"no base URL", with("AIP_CHATWOOT_BASE_URL", ""), []string{"--chatwoot-base-url", "no URL"}},
		{"plain http", with("AIP_CHATWOOT_BASE_URL", "http://chat.example.com"), []string{"--chatwoot-base-url", "use https"}},
		{"base URL with a path", with("AIP_CHATWOOT_BASE_URL", "https://chat.example.com/api/v1"), []string{"--chatwoot-base-url", "origin"}},
		{"no account", with("AIP_CHATWOOT_ACCOUNT_ID", ""), []string{"--chatwoot-account-id", "no account ID"}},
		{"account zero", with("AIP_CHATWOOT_ACCOUNT_ID", "0"), []string{"chatwoot-account-id", "integer from 1"}},
		{"account not a number", with("AIP_CHATWOOT_ACCOUNT_ID", "acme"), []string{"chatwoot-account-id"}},
		{"no token file", with("AIP_CHATWOOT_API_TOKEN_FILE", ""), []string{"--chatwoot-api-token-file", "no file"}},
		{"unreadable token file", with("AIP_CHATWOOT_API_TOKEN_FILE", token+".missing"), []string{"--chatwoot-api-token-file"}},
		{"token file too open", with("AIP_CHATWOOT_API_TOKEN_FILE", writeFile(t, "open-token", testToken, 0o644)), []string{"--chatwoot-api-token-file", "chmod"}},
		{"secret file too open", with("AIP_CHATWOOT_WEBHOOK_SECRET_FILE", writeFile(t, "open-secret", testSecret, 0o640)), []string{"--chatwoot-webhook-secret-file"}},
		{"max response too small", with("AIP_CHATWOOT_MAX_RESPONSE_BYTES", "10"), []string{"chatwoot-max-response-bytes"}},
		{"operations not JSON", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o1.json", `contact.get`, 0o600)), []string{"--chatwoot-operations-file", "JSON array"}},
		{"operations object", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o2.json", `{"operations":["contact.get"]}`, 0o600)), []string{"--chatwoot-operations-file", "JSON array"}},
		{"operations trailing data", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o3.json", `["contact.get"] ["x"]`, 0o600)), []string{"--chatwoot-operations-file", "has data after the JSON value"}},
		{"operations unknown", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o4.json", `["conversation.delete"]`, 0o600)),
			[]string{"--chatwoot-operations-file", `unknown operation "conversation.delete"`, "account.get", "agent.delete", "message.list"}},
		{"operations empty", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o5.json", `[]`, 0o600)), []string{"--chatwoot-operations-file", "lists 0 entries"}},
		{"operations twice", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o6.json", `["contact.get","contact.get"]`, 0o600)), []string{"--chatwoot-operations-file", "twice"}},
		{"operations file writable by others", with("AIP_CHATWOOT_OPERATIONS_FILE", writeFile(t, "o7.json", `["contact.get"]`, 0o666)), []string{"--chatwoot-operations-file"}},
	}
	for _, tc := range cases {
		v, err := settings(t, tc.env)
		if err == nil {
			_, err = Product.New(v, nil)
		}
		if err == nil {
			t.Errorf("%s: accepted", tc.name)
			continue
		}
		if !errors.Is(err, hostsdk.ErrSetting) {
			t.Errorf("%s: error %q does not match hostsdk.ErrSetting (aip-host would exit 1, not 2)", tc.name, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", tc.name, err, w)
			}
		}
		if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), testSecret) {
			t.Errorf("%s: error carries a credential: %v", tc.name, err)
		}
	}

	// Every suffix of the catalogue is accepted in the file, the opt-in
	// agent administration included; without the file those are left out.
	all := `["` + strings.Join(operationSuffixes(), `","`) + `"]`
	for _, tc := range []struct {
		ops  string
		want int
	}{{all, len(catalogue)}, {"", len(catalogue) - 3}} {
		env := with("AIP_CHATWOOT_OPERATIONS_FILE", "")
		if tc.ops != "" {
			env["AIP_CHATWOOT_OPERATIONS_FILE"] = writeFile(t, "all.json", tc.ops, 0o600)
		}
		v, err := settings(t, env)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := Product.New(v, nil)
		if err != nil {
			t.Fatalf("operations %q: %v", tc.ops, err)
		}
		ops := conn.(*Connector).ops
		agents := 0
		for _, op := range ops {
			if strings.HasPrefix(op.Suffix, "agent.") && op.Suffix != "agent.list" {
				agents++
			}
		}
		if len(ops) != tc.want || (tc.ops == "") != (agents == 0) {
			t.Errorf("operations %q: %d admitted (%d agent administration), want %d", tc.ops, len(ops), agents, tc.want)
		}
	}
	if len(catalogue) != 37 {
		t.Errorf("%d catalogue operations, want 37", len(catalogue))
	}

	// Without a webhook secret: an outbound-only connector.
	v, err = settings(t, with("AIP_CHATWOOT_WEBHOOK_SECRET_FILE", ""))
	if err != nil {
		t.Fatal(err)
	}
	conn, err = Product.New(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := conn.(*Connector); c.webhooks() || c.cfg.MaxResponseBytes != 1<<20 {
		t.Errorf("outbound-only config %+v", c.cfg)
	}
}

func TestSettingNames(t *testing.T) {
	want := map[string]string{
		"chatwoot-base-url":                     "AIP_CHATWOOT_BASE_URL",
		"chatwoot-account-id":                   "AIP_CHATWOOT_ACCOUNT_ID",
		"chatwoot-api-token-file":               "AIP_CHATWOOT_API_TOKEN_FILE",
		"chatwoot-webhook-secret-file":          "AIP_CHATWOOT_WEBHOOK_SECRET_FILE",
		"chatwoot-webhook-previous-secret-file": "AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE",
		"chatwoot-max-response-bytes":           "AIP_CHATWOOT_MAX_RESPONSE_BYTES",
		"chatwoot-operations-file":              "AIP_CHATWOOT_OPERATIONS_FILE",
	}
	if len(Product.Settings) != len(want) {
		t.Errorf("%d settings, want %d", len(Product.Settings), len(want))
	}
	for _, s := range Product.Settings {
		if want[s.Flag] != s.Env {
			t.Errorf("setting --%s has variable %s, want %s", s.Flag, s.Env, want[s.Flag])
		}
	}
}

// TestPreviousWebhookSecretSetting: the previous secret is read from its
// owner-only file as the secret is, and refused without a secret or when
// it is the same secret, naming the settings.
func TestPreviousWebhookSecretSetting(t *testing.T) {
	base := map[string]string{
		"AIP_CHATWOOT_BASE_URL":            "https://chat.example.com",
		"AIP_CHATWOOT_ACCOUNT_ID":          "7",
		"AIP_CHATWOOT_API_TOKEN_FILE":      writeFile(t, "token", testToken, 0o600),
		"AIP_CHATWOOT_WEBHOOK_SECRET_FILE": writeFile(t, "secret", testSecret, 0o600),
	}
	load := func(edit map[string]string) (*Connector, error) {
		t.Helper()
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range edit {
			if v == "" {
				delete(env, k)
			} else {
				env[k] = v
			}
		}
		v, err := settings(t, env)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := Product.New(v, nil)
		if err != nil {
			return nil, err
		}
		return conn.(*Connector), nil
	}
	c, err := load(map[string]string{"AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE": writeFile(t, "old", "cw-old-secret", 0o600)})
	if err != nil || c.cfg.PreviousWebhookSecret.Reveal() != "cw-old-secret" {
		t.Fatalf("previous secret: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit map[string]string
		want string
	}{
		{"group-readable", map[string]string{"AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE": writeFile(t, "open", "cw-old-secret", 0o644)},
			"--chatwoot-webhook-previous-secret-file"},
		{"without a secret", map[string]string{"AIP_CHATWOOT_WEBHOOK_SECRET_FILE": "",
			"AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE": writeFile(t, "old", "cw-old-secret", 0o600)},
			"--chatwoot-webhook-previous-secret-file is set without --chatwoot-webhook-secret-file"},
		{"the same secret", map[string]string{"AIP_CHATWOOT_WEBHOOK_PREVIOUS_SECRET_FILE": writeFile(t, "same", testSecret, 0o600)},
			"holds the same secret as --chatwoot-webhook-secret-file"},
	} {
		if _, err := load(tc.edit); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), testSecret) {
			t.Errorf("%s: %v, want an error with %q and no secret", tc.name, err, tc.want)
		}
	}
}
