package main

import (
	"bytes"
	"context"
	"maps"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/hostrun"
)

// hostEnv is a complete common host configuration whose control plane
// does not answer: the replica logs its bootstrap until it is stopped.
func hostEnv(t *testing.T) map[string]string {
	t.Helper()
	seed := filepath.Join(t.TempDir(), "seed")
	k, _ := aip.GenerateSigningKey()
	if err := aip.WriteSeedFile(seed, k); err != nil {
		t.Fatal(err)
	}
	other, _ := aip.GenerateSigningKey()
	return map[string]string{
		"AIP_CONNECTOR_HOST_BIND": "127.0.0.1:0", "AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP": "true",
		"AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT":     "http://127.0.0.1:8081/aip/v1/messages",
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT":    "http://127.0.0.1:1/aip/v1/connector-control",
		"AIP_CONNECTOR_HOST_CONTROL_DID":         other.DID(),
		"AIP_CONNECTOR_HOST_GATEWAY_DID":         other.DID(),
		"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE":   seed,
		"AIP_CONNECTOR_HOST_TYPE_ID":             aip.NewID(aip.PrefixType),
		"AIP_CONNECTOR_HOST_VERSION_ID":          aip.NewID(aip.PrefixVersion),
		"AIP_CONNECTOR_HOST_INSTANCE_ID":         aip.NewID(aip.PrefixInstance),
		"AIP_CONNECTOR_HOST_REPLICA_ID":          aip.NewID(aip.PrefixReplica),
		"AIP_CONNECTOR_HOST_TENANT_ID":           "acme",
		"AIP_CONNECTOR_HOST_TRUST_DOMAIN":        "example.test",
		"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST":     aip.DigestBytes([]byte("a")),
		"AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF": "vault://acme/dify",
		"AIP_CONNECTOR_HOST_STATE_DIR":           t.TempDir(),
	}
}

var textLine = regexp.MustCompile(`^time=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=(DEBUG|INFO|WARN|ERROR) msg=\S`)

// TestLogFormatText: aip-host logged JSON only; --log-format text (or
// AIP_HOST_LOG_FORMAT=text) gives one readable line per event, with the
// product as an attribute; json, the default, is unchanged.
func TestLogFormatText(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		text bool
	}{
		{"flag", []string{"--log-format", "text"}, nil, true},
		{"variable", nil, map[string]string{"AIP_HOST_LOG_FORMAT": "text"}, true},
		{"default", nil, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := hostEnv(t)
			maps.Copy(env, productEnv(t, t.TempDir())["dify"])
			maps.Copy(env, c.env)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var log hostsdktest.LogBuffer
			done := make(chan error, 1)
			go func() { done <- run(ctx, append([]string{"dify"}, c.args...), getenv(env), &bytes.Buffer{}, &log) }()
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(log.String(), "bootstrap step") {
				select {
				case err := <-done:
					t.Fatalf("run ended before its bootstrap was logged: %v\n%s", err, log.String())
				case <-time.After(10 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatalf("no bootstrap line in 30s:\n%s", log.String())
				}
			}
			cancel()
			<-done
			for line := range strings.SplitSeq(strings.TrimSuffix(log.String(), "\n"), "\n") {
				isText := textLine.MatchString(line)
				if isText != c.text || (c.text && !strings.Contains(line, " product=dify")) {
					t.Fatalf("a line of the log (text %v) is not what was asked:\n%s\nlog:\n%s", c.text, line, log.String())
				}
			}
		})
	}
}

// TestLogFormatRefused: a --log-format other than json or text is a
// setting to change (exit 2) named with its variable and what is
// accepted.
func TestLogFormatRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"dify", "--log-format", "xml"}, nil, `--log-format (AIP_HOST_LOG_FORMAT) is "xml"; want json or text`},
		{[]string{"dify"}, map[string]string{"AIP_HOST_LOG_FORMAT": "Text"}, `AIP_HOST_LOG_FORMAT (--log-format) is "Text"; want json or text`},
	} {
		env := productEnv(t, t.TempDir())["dify"]
		maps.Copy(env, c.env)
		err := run(t.Context(), c.args, getenv(env), &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || err.Error() != c.want || hostrun.ExitCode(err) != 2 {
			t.Errorf("%v %v:\n got %v (exit status %d)\nwant %s (exit status 2)", c.args, c.env, err, hostrun.ExitCode(err), c.want)
		}
	}
}
