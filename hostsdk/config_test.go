package hostsdk_test

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

func validArgs(t *testing.T) (args []string, control, gateway *aip.SigningKey) {
	t.Helper()
	control, _ = aip.GenerateSigningKey()
	gateway, _ = aip.GenerateSigningKey()
	return []string{
		"--bind", "127.0.0.1:0",
		"--public-endpoint", "http://127.0.0.1:8081/aip/v1/messages",
		"--control-plane-endpoint", "http://127.0.0.1:8090/aip/v1/connector-control",
		"--control-plane-did", control.DID(),
		"--signing-seed-file", "/nonexistent/seed",
		"--connector-type-id", aip.NewID(aip.PrefixType),
		"--version-id", aip.NewID(aip.PrefixVersion),
		"--instance-id", aip.NewID(aip.PrefixInstance),
		"--replica-id", aip.NewID(aip.PrefixReplica),
		"--tenant-id", "tenant-a",
		"--gateway-principal-id", "service:dispatcher",
		"--gateway-did", gateway.DID(),
		"--trust-domain", "example.test",
		"--artifact-digest", aip.DigestBytes([]byte("artifact")),
		"--secret-provider-ref", "vault://x",
		"--allow-insecure-loopback-http",
	}, control, gateway
}

func TestLoadConfigFlagsAndEnv(t *testing.T) {
	args, _, _ := validArgs(t)
	args = append(args, "--max-in-flight", "8", "--heartbeat-interval-ms", "4000", "--region", "eu")
	env := map[string]string{
		"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT":  "99", // the flag wins
		"AIP_CONNECTOR_HOST_LEASE_TTL_MS":   "15000",
		"AIP_CONNECTOR_HOST_ZONE":           "eu-1",
		"AIP_CONNECTOR_HOST_STATE_DIR":      "/var/lib/host",
		"AIP_CONNECTOR_HOST_EVENT_ENDPOINT": "http://127.0.0.1:8080/aip/v1/connector-events",
	}
	cfg, err := hostsdk.LoadConfig(args, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxInFlight != 8 || cfg.HeartbeatInterval != 4*time.Second || cfg.LeaseTTL != 15*time.Second ||
		cfg.Region != "eu" || cfg.Zone != "eu-1" || cfg.StateDir != "/var/lib/host" || !cfg.AllowInsecureLoopbackHTTP ||
		cfg.EventEndpoint != "http://127.0.0.1:8080/aip/v1/connector-events" {
		t.Errorf("config %+v", cfg)
	}
	if _, err := hostsdk.New(cfg, newTestConnector()); err != nil {
		t.Errorf("New: %v", err)
	}
}

func TestLoadConfigErrorsNameTheSetting(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"max in flight", []string{"--max-in-flight", "0"}, nil,
			[]string{"--max-in-flight", "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT", "1 to 65536"}},
		{"lease from env", nil, map[string]string{"AIP_CONNECTOR_HOST_LEASE_TTL_MS": "500"},
			[]string{"AIP_CONNECTOR_HOST_LEASE_TTL_MS", "--lease-ttl-ms", "1000 to 300000 ms"}},
		{"not a number", []string{"--drain-timeout-ms", "soon"}, nil,
			[]string{"--drain-timeout-ms", "1 to 300000 ms"}},
		{"bool", nil, map[string]string{"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP": "maybe"},
			[]string{"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP", "true or false"}},
		{"config revision", []string{"--config-revision", "0"}, nil,
			[]string{"--config-revision", "AIP_CONNECTOR_HOST_CONFIG_REVISION"}},
		{"unknown flag", []string{"--no-such-flag", "1"}, nil, []string{"no-such-flag"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := hostsdk.LoadConfig(c.args, func(k string) string { return c.env[k] })
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, hostsdk.ErrSetting) {
				t.Errorf("error %q does not match ErrSetting", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestSettingErrorsMatchErrSetting: a value BindFlags or BindSettings
// refuses, a stray argument to LoadConfig, matches ErrSetting, so a
// command can exit with status 2 for it as for a flag it does not know;
// and BindFlags's *ConfigError still unwraps to the *SettingError. A
// configuration New refuses matches it too (it did not, so aip-host and
// aip-sidecar exited 1 for a missing --public-endpoint, unlike aipfleet
// host): the operator must change a setting either way.
func TestSettingErrorsMatchErrSetting(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	loadHost := hostsdk.BindFlags(fs)
	loadOwn := hostsdk.BindSettings(fs, []hostsdk.Setting{{Flag: "start-timeout-ms", Env: "X_START_TIMEOUT_MS", Kind: hostsdk.SettingMillis, Min: 1, Max: 1000}})
	if err := fs.Parse([]string{"--start-timeout-ms=x", "--drain-timeout-ms=x"}); err != nil {
		t.Fatal(err)
	}
	_, err := loadOwn(nil)
	var se *hostsdk.SettingError
	if !errors.Is(err, hostsdk.ErrSetting) || !errors.As(err, &se) || se.Flag != "start-timeout-ms" {
		t.Errorf("BindSettings: %v, want a *SettingError matching ErrSetting", err)
	}
	_, err = loadHost(nil)
	var ce *hostsdk.ConfigError
	if !errors.Is(err, hostsdk.ErrSetting) || !errors.As(err, &ce) || !errors.As(err, &se) || ce.Flag != "drain-timeout-ms" || se.Flag != "drain-timeout-ms" {
		t.Errorf("BindFlags: %v, want a *ConfigError matching ErrSetting and unwrapping to the *SettingError", err)
	}
	if _, err := hostsdk.LoadConfig([]string{"stray"}, nil); !errors.Is(err, hostsdk.ErrSetting) || err.Error() != `unexpected argument "stray"; every setting is a --flag` {
		t.Errorf("LoadConfig with a stray argument: %v, want ErrSetting", err)
	}
	var ve *hostsdk.ValidateError
	if _, err := hostsdk.New(hostsdk.Config{}, newTestConnector()); !errors.Is(err, hostsdk.ErrSetting) || !errors.As(err, &ce) || !errors.As(err, &ve) {
		t.Errorf("New of an empty Config: %v, want a *ValidateError of a *ConfigError, matching ErrSetting", err)
	}
	if (&hostsdk.ValidateError{Err: context.Canceled}).Is(hostsdk.ErrSetting) {
		t.Error("a *ValidateError of a cancelled start matches ErrSetting; want it not to (no setting is at fault)")
	}
}

// TestSettingErrorTexts: a refused setting read "hostsdk: --heartbeat-
// interval-ms (AIP_CONNECTOR_HOST_HEARTBEAT_MS, Config.HeartbeatInterval)
// from AIP_CONNECTOR_HOST_HEARTBEAT_MS is ...", and a program's own
// setting read with BindSettings (aip-sidecar's --on-manifest-change) was
// "hostsdk: ..." too, though hostsdk has no such setting. The texts now
// start with what was set (the variable when the value came from it),
// without a prefix the program's own name ("aip-sidecar: ") already
// gives, and still match ErrSetting.
func TestSettingErrorTexts(t *testing.T) {
	own := []hostsdk.Setting{{Flag: "on-manifest-change", Env: "X_ON_MANIFEST_CHANGE",
		Check: func(string) error { return errors.New("want report or unready") }}}
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"host flag", []string{"--drain-timeout-ms=soon"}, nil,
			`--drain-timeout-ms (AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS, Config.DrainTimeout) is "soon"; want an integer from 1 to 300000 ms`},
		{"host variable", nil, map[string]string{"AIP_CONNECTOR_HOST_MAX_IN_FLIGHT": "0"},
			`AIP_CONNECTOR_HOST_MAX_IN_FLIGHT (--max-in-flight, Config.MaxInFlight) is "0"; want an integer from 1 to 65536`},
		{"own flag", []string{"--on-manifest-change=apply"}, nil,
			`--on-manifest-change (X_ON_MANIFEST_CHANGE) is "apply"; want report or unready`},
		{"own variable", nil, map[string]string{"X_ON_MANIFEST_CHANGE": "apply"},
			`X_ON_MANIFEST_CHANGE (--on-manifest-change) is "apply"; want report or unready`},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("x", flag.ContinueOnError)
			loadHost := hostsdk.BindFlags(fs)
			loadOwn := hostsdk.BindSettings(fs, own)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			getenv := func(k string) string { return c.env[k] }
			_, err := loadOwn(getenv)
			if err == nil {
				_, err = loadHost(getenv)
			}
			if !errors.Is(err, hostsdk.ErrSetting) || err.Error() != c.want {
				t.Errorf("got  %v\nwant %s (matching ErrSetting)", err, c.want)
			}
		})
	}
	// An unknown flag was the flag package's "flag provided but not
	// defined: -max-in-flite": it now says where the flags are listed,
	// and names the flag it most likely meant when one is close.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "unknown flag --no-such-flag (run with --help for the flags)"},
		{[]string{"--max-in-flite", "3"}, "unknown flag --max-in-flite; did you mean --max-in-flight? (run with --help for the flags)"},
		{[]string{"-REPLICA_ID=crepl_1"}, "unknown flag --REPLICA_ID; did you mean --replica-id? (run with --help for the flags)"},
	} {
		_, err := hostsdk.LoadConfig(c.args, nil)
		if !errors.Is(err, hostsdk.ErrSetting) || err == nil || err.Error() != c.want {
			t.Errorf("LoadConfig(%q): %v; want %s (matching ErrSetting)", c.args, err, c.want)
		}
	}
}

// TestBootstrapErrorsSayHostsdkOnce: a step's error around a hostsdk
// error read "hostsdk: bootstrap step 1 (validate): hostsdk: --public-
// endpoint ...".
func TestBootstrapErrorsSayHostsdkOnce(t *testing.T) {
	_, err := hostsdk.New(hostsdk.Config{}, newTestConnector())
	const want = "hostsdk: bootstrap step 1 (validate): --public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT, Config.PublicEndpoint) is required: an absolute https URL whose path is exactly /aip/v1/messages"
	var ve *hostsdk.ValidateError
	if !errors.As(err, &ve) || err.Error() != want {
		t.Fatalf("New of an empty Config:\n got %v\nwant %s", err, want)
	}
}

// TestRegisterWaitSetting: --register-wait-ms (its variable) sets
// Config.RegisterWait; 0 is NoRegisterWait (the start fails at the first
// failed registration), not the default, which unset gives.
func TestRegisterWaitSetting(t *testing.T) {
	args, _, _ := validArgs(t)
	for _, c := range []struct {
		env  string
		want time.Duration
	}{{"", hostsdk.DefaultRegisterWait}, {"0", hostsdk.NoRegisterWait}, {"45000", 45 * time.Second}, {"3600000", hostsdk.MaxRegisterWait}} {
		cfg, err := hostsdk.LoadConfig(args, func(k string) string {
			if k == "AIP_CONNECTOR_HOST_REGISTER_WAIT_MS" {
				return c.env
			}
			return ""
		})
		if err != nil {
			t.Fatalf("AIP_CONNECTOR_HOST_REGISTER_WAIT_MS=%q: %v", c.env, err)
		}
		if c.env == "" {
			if cfg.RegisterWait != 0 {
				t.Errorf("unset: RegisterWait %s, want 0 (the default)", cfg.RegisterWait)
			}
			cfg.RegisterWait = c.want
		}
		if cfg.RegisterWait != c.want {
			t.Errorf("AIP_CONNECTOR_HOST_REGISTER_WAIT_MS=%q: RegisterWait %s, want %s", c.env, cfg.RegisterWait, c.want)
		}
		if _, err := hostsdk.New(cfg, newTestConnector()); err != nil {
			t.Errorf("AIP_CONNECTOR_HOST_REGISTER_WAIT_MS=%q: New: %v", c.env, err)
		}
	}
	for _, bad := range []string{"-1", "3600001", "2m"} {
		_, err := hostsdk.LoadConfig(args, func(k string) string {
			if k == "AIP_CONNECTOR_HOST_REGISTER_WAIT_MS" {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), "--register-wait-ms") || !strings.Contains(err.Error(), "0 to 3600000 ms") {
			t.Errorf("AIP_CONNECTOR_HOST_REGISTER_WAIT_MS=%s: %v; want it refused naming the setting and the range", bad, err)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	args, _, _ := validArgs(t)
	base, err := hostsdk.LoadConfig(args, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(*hostsdk.Config)
		want []string
	}{
		{"endpoint path", func(c *hostsdk.Config) { c.PublicEndpoint = "http://127.0.0.1:8081/messages" },
			[]string{"--public-endpoint", "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT", "/aip/v1/messages"}},
		{"plain http without loopback", func(c *hostsdk.Config) {
			c.AllowInsecureLoopbackHTTP = false
			c.PublicEndpoint = "https://replica.example/aip/v1/messages"
			c.ControlPlaneEndpoint = "http://control.example/aip/v1/connector-control"
		}, []string{"--control-plane-endpoint", "https"}},
		{"event endpoint path", func(c *hostsdk.Config) { c.EventEndpoint = "http://127.0.0.1:8080/aip/v1/events" },
			[]string{"--event-endpoint", "AIP_CONNECTOR_HOST_EVENT_ENDPOINT", "/aip/v1/connector-events"}},
		{"event endpoint plain http off loopback", func(c *hostsdk.Config) {
			c.EventEndpoint = "http://dispatcher.example/aip/v1/connector-events"
		}, []string{"--event-endpoint", "https"}},
		{"loopback exception needs a loopback bind", func(c *hostsdk.Config) { c.Bind = "0.0.0.0:8081" },
			[]string{"--allow-insecure-loopback-http", "loopback"}},
		{"heartbeat above half the lease", func(c *hostsdk.Config) { c.LeaseTTL = 10 * time.Second; c.HeartbeatInterval = 6 * time.Second },
			[]string{"--heartbeat-interval-ms", "AIP_CONNECTOR_HOST_HEARTBEAT_MS", "5000"}},
		{"both DID forms", func(c *hostsdk.Config) { c.ControlPlaneDIDFile = "/x" },
			[]string{"--control-plane-did", "--control-plane-did-file", "exactly one"}},
		{"bad DID", func(c *hostsdk.Config) { c.GatewayDID = "did:web:example.com" },
			[]string{"--gateway-did", "did:key"}},
		{"replica ID", func(c *hostsdk.Config) { c.ReplicaID = "replica-1" },
			[]string{"--replica-id", "crepl_"}},
		{"replica ID with a slash", func(c *hostsdk.Config) { c.ReplicaID = "crepl_a/b" },
			[]string{"--replica-id", "crepl_", "letters, digits"}},
		{"label", func(c *hostsdk.Config) { c.Zone = "eu west" }, []string{"--zone", "[A-Za-z0-9._-]"}},
		{"artifact digest", func(c *hostsdk.Config) { c.ArtifactDigest = "md5:abc" }, []string{"--artifact-digest", "sha256:"}},
		{"missing tenant", func(c *hostsdk.Config) { c.TenantID = "" }, []string{"--tenant-id", "1 to 256 bytes"}},
		// A tenant of 257 to 512 bytes, which no registry instance holds,
		// was taken: the control plane then rejected the registration as
		// another tenant's.
		{"tenant over the registry's limit", func(c *hostsdk.Config) { c.TenantID = strings.Repeat("t", aip.MaxTenantIDBytes+1) },
			[]string{"--tenant-id", "AIP_CONNECTOR_HOST_TENANT_ID", "is 257 bytes", "1 to 256 bytes"}},
		// A tenant or trust domain holding an invisible formatting
		// character, which no registry identifier holds, was taken: the
		// control plane then rejected the registration as another
		// tenant's or trust domain's.
		{"tenant with a zero-width space", func(c *hostsdk.Config) { c.TenantID = "tenant-a\u200b" },
			[]string{"--tenant-id", "AIP_CONNECTOR_HOST_TENANT_ID", `"tenant-a\u200b"`, "invisible formatting character U+200B", "remove it"}},
		{"tenant with a bidi override", func(c *hostsdk.Config) { c.TenantID = "\u202etenant-a" },
			[]string{"--tenant-id", "U+202E"}},
		{"tenant with a tag character", func(c *hostsdk.Config) { c.TenantID = "tenant-a\U000E0041" },
			[]string{"--tenant-id", "U+E0041"}},
		{"trust domain with a soft hyphen", func(c *hostsdk.Config) { c.TrustDomain = "exam\u00adple.test" },
			[]string{"--trust-domain", "AIP_CONNECTOR_HOST_TRUST_DOMAIN", "U+00AD", "remove it"}},
		// A secret-provider reference of 257 to 2048 bytes, or one holding
		// an invisible formatting character, which no registry instance
		// holds, was taken: the control plane then rejected the
		// registration as another instance's reference.
		{"secret provider reference over the registry's limit", func(c *hostsdk.Config) { c.SecretProviderRef = strings.Repeat("s", aip.MaxSecretProviderRefBytes+1) },
			[]string{"--secret-provider-ref", "AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF", "is 257 bytes", "1 to 256 bytes"}},
		{"secret provider reference with a zero-width joiner", func(c *hostsdk.Config) { c.SecretProviderRef = "vault://acme/\u200dnotes" },
			[]string{"--secret-provider-ref", "U+200D", "secret_provider_ref", "remove it"}},
		{"credential revision with a byte order mark", func(c *hostsdk.Config) {
			c.CredentialID, c.CredentialIssuer, c.CredentialScopes, c.CredentialRevisionRef = "cred-1", "https://issuer.test", []string{"notes.read"}, "\ufeffrev-1"
		}, []string{"--credential-revision-ref", "U+FEFF", "credential_revision_ref", "remove it"}},
		{"database URL without a journal", func(c *hostsdk.Config) { c.DatabaseURLFile = "/run/secrets/db" },
			[]string{"--database-url-file", "pgruntime"}},
		{"probe timeout", func(c *hostsdk.Config) { c.HealthProbeTimeout = time.Minute },
			[]string{"--health-probe-timeout-ms", "1 to 30000 ms"}},
		{"register wait too long", func(c *hostsdk.Config) { c.RegisterWait = 2 * time.Hour },
			[]string{"--register-wait-ms", "AIP_CONNECTOR_HOST_REGISTER_WAIT_MS", "1 to 3600000 ms", "NoRegisterWait"}},
		{"register wait negative", func(c *hostsdk.Config) { c.RegisterWait = -2 * time.Second },
			[]string{"--register-wait-ms", "1 to 3600000 ms"}},
		{"register wait below a millisecond", func(c *hostsdk.Config) { c.RegisterWait = time.Microsecond },
			[]string{"--register-wait-ms", "whole number of milliseconds"}},
		// A bind port out of range, missing or named was accepted, and the
		// listener refused it only at step 5, after the journal was opened
		// and its owner recorded.
		{"bind port out of range", func(c *hostsdk.Config) { c.Listener, c.Bind = nil, "127.0.0.1:99999" },
			[]string{"--bind", "AIP_CONNECTOR_HOST_BIND", "0 to 65535"}},
		{"bind without a port", func(c *hostsdk.Config) { c.Listener, c.Bind = nil, "127.0.0.1:" },
			[]string{"--bind", "AIP_CONNECTOR_HOST_BIND", "0 to 65535"}},
		{"bind with a service name", func(c *hostsdk.Config) { c.Listener, c.Bind = nil, "localhost:http" },
			[]string{"--bind", "port number"}},
		// An endpoint the registry would store and the dispatcher dial as
		// given: a port out of range, or a path whose escaped form is not
		// exactly the path (the reference compares the escaped path).
		{"endpoint port out of range", func(c *hostsdk.Config) { c.PublicEndpoint = "http://127.0.0.1:99999/aip/v1/messages" },
			[]string{"--public-endpoint", "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT", "1 to 65535"}},
		{"endpoint port zero", func(c *hostsdk.Config) { c.ControlPlaneEndpoint = "https://control.example:0/aip/v1/connector-control" },
			[]string{"--control-plane-endpoint", "1 to 65535"}},
		{"escaped endpoint path", func(c *hostsdk.Config) { c.PublicEndpoint = "http://127.0.0.1:8081/aip/v1/%6Dessages" },
			[]string{"--public-endpoint", "/aip/v1/messages"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			c.edit(&cfg)
			_, err := hostsdk.New(cfg, newTestConnector())
			var ve *hostsdk.ValidateError
			var ce *hostsdk.ConfigError
			if !errors.As(err, &ve) || !errors.As(err, &ce) {
				t.Fatalf("New: %v, want *ValidateError wrapping *ConfigError", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestSecretFilesAreChecked(t *testing.T) {
	f := newFleet(t)
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed")
	key, _ := aip.GenerateSigningKey()
	if err := aip.WriteSeedFile(seed, key); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(seed, 0o644); err != nil {
		t.Fatal(err)
	}
	f.cfg.SigningKey, f.cfg.SigningSeedFile = nil, seed
	err := startErr(t, f, newTestConnector())
	var ve *hostsdk.ValidateError
	if !errors.As(err, &ve) || !errors.Is(err, aip.ErrUnsafeFile) || !strings.Contains(err.Error(), "chmod 600") || !strings.Contains(err.Error(), "--signing-seed-file") {
		t.Fatalf("Start: %v", err)
	}

	// A DID file is read at step 1 and must hold a did:key.
	f2 := newFleet(t)
	didFile := filepath.Join(dir, "control.did")
	os.WriteFile(didFile, []byte("did:web:nope\n"), 0o644)
	f2.cfg.ControlPlaneDID, f2.cfg.ControlPlaneDIDFile = "", didFile
	err = startErr(t, f2, newTestConnector())
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "--control-plane-did-file") {
		t.Fatalf("Start: %v", err)
	}
}

// TestReadableRecordIDs: the registry takes readable record IDs
// ("cinst_acme-notes"), and so does the host: it refused every ID but a
// prefix and a UUIDv7, so a fleet file with readable IDs applied cleanly
// and then no replica of it could start.
func TestReadableRecordIDs(t *testing.T) {
	f := newFleet(t)
	f.cfg.ConnectorTypeID, f.cfg.VersionID = "ctype_notes", "cver_notes.1"
	f.cfg.InstanceID, f.cfg.ReplicaID = "cinst_acme-notes", "crepl_acme-notes_1"
	f.startAndEcho(t)
}

// startAndEcho provisions the replica f.cfg names, starts its host and
// checks that an echo action completes on it.
func (f *fleet) startAndEcho(t *testing.T) {
	t.Helper()
	f.cp.Provision(hostsdktest.ReplicaSpec{
		ID: f.cfg.ReplicaID, DID: f.cfg.SigningKey.DID(), InstanceID: f.cfg.InstanceID, VersionID: f.cfg.VersionID,
		Endpoint: f.cfg.PublicEndpoint, TenantID: f.cfg.TenantID, ArtifactDigest: f.cfg.ArtifactDigest,
	})
	_, target := f.start(t, newTestConnector())
	resp, err := f.d.Act(ctxT(t), target, action(capEcho, `{"message":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := resp.Result(); err != nil || r.Status != aip.ResultCompleted {
		t.Fatalf("answer %+v, %v (body %s); want completed", r, err, resp.Raw)
	}
}

// TestLongestRecordIDs: record IDs as long as the registry takes them
// (aip.MaxRecordIDBytes) start a host on its default embedded journal,
// .aipfleet/host-<replica ID>, which must stay within a file system's
// 255-byte names: "host-" and a 256-byte ID were refused by the file
// system at step 2.
func TestLongestRecordIDs(t *testing.T) {
	t.Chdir(t.TempDir())
	longest := func(prefix string) string {
		return prefix + strings.Repeat("x", aip.MaxRecordIDBytes-len(prefix)-1) + "1"
	}
	f := newFleet(t)
	f.cfg.Journal, f.cfg.StateDir = nil, ""
	f.cfg.ConnectorTypeID, f.cfg.VersionID = longest(aip.PrefixType), longest(aip.PrefixVersion)
	f.cfg.InstanceID, f.cfg.ReplicaID = longest(aip.PrefixInstance), longest(aip.PrefixReplica)
	f.startAndEcho(t)
	// A shorter ID's directory is still host-<ID>; two long IDs that
	// differ only at their end get directories of their own.
	short := newFleet(t).cfg
	short.Journal, short.StateDir = nil, ""
	other := f.cfg
	other.ReplicaID = other.ReplicaID[:len(other.ReplicaID)-1] + "2"
	dirs := map[string]bool{}
	for _, c := range []hostsdk.Config{short, f.cfg, other} {
		h, err := hostsdk.New(c, newTestConnector())
		if err != nil {
			t.Fatal(err)
		}
		dir := h.StateDir()
		if base := filepath.Base(dir); len(base) > 255 || filepath.Dir(dir) != hostsdk.DefaultStateDirRoot {
			t.Errorf("replica %.40s...: state dir %s", c.ReplicaID, dir)
		}
		dirs[dir] = true
	}
	if want := filepath.Join(hostsdk.DefaultStateDirRoot, "host-"+short.ReplicaID); !dirs[want] {
		t.Errorf("state dirs %v, want %s among them", dirs, want)
	}
	if len(dirs) != 3 {
		t.Errorf("state dirs %v, want 3", dirs)
	}
}

// TestBindManifestRefusesTrustDomainWithFormatCharacter: binding a
// manifest (aip-sidecar describe: what an operator admits as a version) to
// a trust domain holding an invisible formatting character is refused,
// naming the flag and the character. It was bound, and no replica of the
// version could then start with that trust domain (New refuses it).
func TestBindManifestRefusesTrustDomainWithFormatCharacter(t *testing.T) {
	m, err := newTestConnector().Manifest(t.Context(), hostsdk.TenantContext{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = hostsdk.BindManifest(m, "example\u200b.test")
	if err == nil || !strings.Contains(err.Error(), `"example\u200b.test"`) || !strings.Contains(err.Error(), "U+200B") || !strings.Contains(err.Error(), "--trust-domain") {
		t.Errorf("BindManifest: %v, want an error naming the trust domain, U+200B and --trust-domain", err)
	}
	if _, _, err := hostsdk.BindManifest(m, "example.test"); err != nil {
		t.Errorf("BindManifest to example.test: %v", err)
	}
}
