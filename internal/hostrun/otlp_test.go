package hostrun_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
)

// TestBadOTLPSettingsAreRefused: an OTEL_EXPORTER_OTLP_* value the
// exporter cannot use was dropped with a log line of the OpenTelemetry
// SDK's at most (a malformed endpoint: spans then went to
// https://localhost:4318), and an http:// endpoint with a CA file failed
// the start with "insecure HTTP endpoint cannot use TLS client
// configuration", exit status 1, naming no variable. Each is now refused
// before anything starts, naming the variable and the form it accepts,
// as a setting to fix (exit status 2).
func TestBadOTLPSettingsAreRefused(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	endpoint := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:4318"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range endpoint {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, c := range []struct {
		env  map[string]string
		want []string
	}{
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "otel-collector:4318"},
			[]string{`OTEL_EXPORTER_OTLP_ENDPOINT is "otel-collector:4318", which has no http:// or https:// scheme`, "such as http://otel-collector:4318"}},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel-collector:notaport"},
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "not a URL", "such as http://otel-collector:4318"}},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://otel-collector:99999/v1/traces"},
			[]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "port is not from 1 to 65535", "http://otel-collector:4318/v1/traces"}},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://"},
			[]string{"OTEL_EXPORTER_OTLP_ENDPOINT", "names no host"}},
		{with("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
			[]string{`OTEL_EXPORTER_OTLP_PROTOCOL is "grpc"`, "OTLP/HTTP only", "http/protobuf"}},
		{with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/proto"),
			[]string{`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is "http/proto"; want http/protobuf (the default) or http/json`}},
		{with("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
			[]string{`OTEL_EXPORTER_OTLP_TIMEOUT is "10s"; want a whole number of milliseconds`}},
		{with("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd"),
			[]string{`OTEL_EXPORTER_OTLP_COMPRESSION is "zstd"; want gzip or none`}},
		{with("OTEL_EXPORTER_OTLP_INSECURE", "yes"),
			[]string{`OTEL_EXPORTER_OTLP_INSECURE is "yes"; want true or false`}},
		{with("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3cret,tenant"),
			[]string{`OTEL_EXPORTER_OTLP_HEADERS: pair 2 has no "="`, "KEY=VALUE"}},
		{with("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s3%zzcret"),
			[]string{"OTEL_EXPORTER_OTLP_HEADERS: the value of api-key (pair 1) has a % not followed by two hex digits"}},
		{with("OTEL_EXPORTER_OTLP_CERTIFICATE", notPEM),
			[]string{"OTEL_EXPORTER_OTLP_CERTIFICATE: " + notPEM + " holds no PEM certificate"}},
		{with("OTEL_EXPORTER_OTLP_CERTIFICATE", filepath.Join(dir, "missing.pem")),
			[]string{"OTEL_EXPORTER_OTLP_CERTIFICATE: open " + filepath.Join(dir, "missing.pem")}},
		{with("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", notPEM),
			[]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE is set but OTEL_EXPORTER_OTLP_CLIENT_KEY is not"}},
	} {
		_, _, err := hostrun.TracerProvider(t.Context(), func(k string) string { return c.env[k] }, "test")
		if !errors.Is(err, hostsdk.ErrSetting) || hostrun.ExitCode(err) != 2 {
			t.Errorf("%v: %v (exit status %d); want an error matching hostsdk.ErrSetting, exit status 2", c.env, err, hostrun.ExitCode(err))
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v:\n got %v\nwant it to say %q", c.env, err, w)
			}
		}
		if strings.Contains(err.Error(), "s3") {
			t.Errorf("%v: %v shows a header's value", c.env, err)
		}
	}

	// An http:// endpoint with a CA file: the exporter refused it as it
	// started, naming no variable.
	ca := filepath.Join(dir, "good-ca.pem")
	writeTestCA(t, ca)
	_, _, err := hostrun.TracerProvider(t.Context(), func(k string) string {
		return with("OTEL_EXPORTER_OTLP_CERTIFICATE", ca)[k]
	}, "test")
	if !errors.Is(err, hostsdk.ErrSetting) || !strings.Contains(errText(err), "OTEL_EXPORTER_OTLP_ENDPOINT is an http:// URL") || !strings.Contains(errText(err), "OTEL_EXPORTER_OTLP_CERTIFICATE") {
		t.Errorf("http:// endpoint with a CA file: %v; want a setting error naming both variables", err)
	}

	// Good values are accepted; without an endpoint nothing is checked
	// (nothing is exported).
	for _, env := range []map[string]string{
		with("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf", "OTEL_EXPORTER_OTLP_TIMEOUT", "5000",
			"OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", "OTEL_EXPORTER_OTLP_HEADERS", "api-key=abc%2C1, x-tenant = acme"),
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://otel-collector.example:4318/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": ca},
		{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
	} {
		_, stop, err := hostrun.TracerProvider(t.Context(), func(k string) string { return env[k] }, "test")
		if err != nil {
			t.Errorf("%v: %v; want it accepted", env, err)
			continue
		}
		stop()
	}
}

// errText is err's text, "" for none.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// writeTestCA writes a self-signed CA certificate in PEM to path.
func writeTestCA(t *testing.T, path string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
