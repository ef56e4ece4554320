package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
)

func TestHostFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{want: "--connector is required: one of echo"},
		{args: []string{"--connector", "cal-diy"}, want: `"cal-diy" is not a built-in connector; choose one of echo`},
		{args: []string{"--connector", "echo", "--log-level", "chatty"}, want: "--log-level"},
		{args: []string{"--connector", "echo", "extra"}, want: "unexpected argument"},
		// The common host settings are checked by hostsdk, which names the
		// flag and its variable.
		{args: []string{"--connector", "echo", "--max-in-flight", "0"}, want: "--max-in-flight (AIP_CONNECTOR_HOST_MAX_IN_FLIGHT"},
		{env: map[string]string{"AIP_CONNECTOR_HOST_CONNECTOR": "echo", "AIP_CONNECTOR_HOST_LEASE_TTL_MS": "5"}, want: "AIP_CONNECTOR_HOST_LEASE_TTL_MS"},
		{args: []string{"--connector", "echo"}, want: "--public-endpoint (AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT"},
		{args: []string{"--connector", "echo", "--ready-detail", "loopback"},
			want: `host: --ready-detail (AIP_CONNECTOR_HOST_READY_DETAIL, Config.HideLocalReadyDetail) is "loopback"; want local or none`},
		// A misspelt flag names the one it most likely meant, and where
		// the flags are listed.
		{args: []string{"--connector", "echo", "--max-in-flite", "3"},
			want: "host: unknown flag --max-in-flite; did you mean --max-in-flight? (run `aipfleet host --help`)"},
		{args: []string{"--conector", "echo"}, want: "host: unknown flag --conector; did you mean --connector? (run `aipfleet host --help`)"},
		{args: []string{"--connector", "echo", "--bogus"}, want: "host: unknown flag --bogus (run `aipfleet host --help`)"},
	} {
		_, _, err := runCLI(t, c.env, append([]string{"host"}, c.args...)...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("host %v %v: err = %v, want a usage error containing %q", c.args, c.env, err, c.want)
		}
	}
}

func TestHostHelpListsTheCommonHostFlags(t *testing.T) {
	out, _, err := runCLI(t, nil, "host", "--help")
	if !errors.Is(err, errHelpShown) {
		t.Fatal(err)
	}
	for _, want := range []string{
		"--connector", "$AIP_CONNECTOR_HOST_CONNECTOR",
		"--signing-seed-file", "$AIP_CONNECTOR_HOST_SIGNING_SEED_FILE",
		"--allow-insecure-loopback-http", "$AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP",
		"--heartbeat-interval-ms", "$AIP_CONNECTOR_HOST_HEARTBEAT_MS",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("host --help lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[$") {
		t.Errorf("host --help repeats variable names in the usage text:\n%s", out)
	}
}

// TestHostPrintManifest: --print-manifest prints what a fleet file's
// version entry of the echo connector needs, the same as the version
// aipfleet dev admits for it: the manifest bound to --trust-domain, its
// digest and the implementation support of every capability.
func TestHostPrintManifest(t *testing.T) {
	f := prepared(t, filepath.Join(t.TempDir(), "state"), 1, 0)
	fleet, err := f.fleet()
	if err != nil {
		t.Fatal(err)
	}
	want := fleet.Versions[0]
	out, _, err := runCLI(t, map[string]string{"AIP_CONNECTOR_HOST_CONNECTOR": "echo"},
		"host", "--trust-domain", devTrustDomain, "--print-manifest")
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Digest  string              `json:"manifest_digest"`
		Count   int                 `json:"capability_count"`
		Support map[string][]string `json:"implementation_support"`
		M       aip.Manifest        `json:"manifest"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("the output is not the manifest JSON: %v\n%s", err, out)
	}
	if got.Digest != want.ManifestDigest || got.Count != len(want.Manifest.Capabilities) {
		t.Errorf("digest %s, %d capabilities; dev admits %s, %d", got.Digest, got.Count, want.ManifestDigest, len(want.Manifest.Capabilities))
	}
	if d, err := aip.ManifestDigest(&got.M); err != nil || d != want.ManifestDigest {
		t.Errorf("the printed manifest's digest is %s (%v); dev admits %s", d, err, want.ManifestDigest)
	}
	wantSupport := map[string][]string{}
	for id, s := range want.ImplementationSupport {
		wantSupport[id] = registry.SupportFeatureNames(s)
	}
	if diff := cmp.Diff(wantSupport, got.Support); diff != "" {
		t.Errorf("implementation support (-dev +printed):\n%s", diff)
	}

	// A usage error (exit 2), as every missing flag is.
	var u *usageError
	if _, _, err := runCLI(t, nil, "host", "--connector", "echo", "--print-manifest"); !errors.As(err, &u) || !strings.Contains(err.Error(), "--trust-domain") {
		t.Errorf("without a trust domain: %v, want a usage error naming --trust-domain", err)
	}
}

// TestHostGatewayPrincipalDefaultsToTheDispatchers: a host given no
// --gateway-principal-id starts (pinning hostsdk.DefaultGatewayPrincipalID,
// which DefaultGatewayPrincipal, the dispatcher's default --principal-id,
// is by definition), and its help says where the value comes from.
func TestHostGatewayPrincipalDefaultsToTheDispatchers(t *testing.T) {
	control, _ := aip.GenerateSigningKey()
	gateway, _ := aip.GenerateSigningKey()
	args := []string{
		"--bind", "127.0.0.1:0", "--allow-insecure-loopback-http",
		"--public-endpoint", "http://127.0.0.1:8081/aip/v1/messages",
		"--control-plane-endpoint", "http://127.0.0.1:8090/aip/v1/connector-control",
		"--control-plane-did", control.DID(), "--gateway-did", gateway.DID(),
		"--signing-seed-file", filepath.Join(t.TempDir(), "seed"),
		"--connector-type-id", aip.NewID(aip.PrefixType), "--version-id", aip.NewID(aip.PrefixVersion),
		"--instance-id", aip.NewID(aip.PrefixInstance), "--replica-id", aip.NewID(aip.PrefixReplica),
		"--tenant-id", "acme", "--trust-domain", "example.test", "--artifact-digest", aip.DigestBytes([]byte("a")),
		"--secret-provider-ref", "vault://acme/echo", "--state-dir", t.TempDir(),
	}
	cfg, err := hostsdk.LoadConfig(args, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hostsdk.New(cfg, builtinConnectors["echo"]()); err != nil {
		t.Fatalf("a host without --gateway-principal-id: %v", err)
	}
	out, _, err := runCLI(t, nil, "host", "--help")
	if !errors.Is(err, errHelpShown) {
		t.Fatal(err)
	}
	_, usage, _ := strings.Cut(out, "--gateway-principal-id")
	usage, _, _ = strings.Cut(usage, "\n  -")
	if !strings.Contains(usage, "--principal-id") || !strings.Contains(usage, "default "+DefaultGatewayPrincipal) {
		t.Errorf("host --help does not say where --gateway-principal-id comes from:%s", usage)
	}
}
