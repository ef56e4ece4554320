package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// controlPlaneFiles writes a database URL file (of a server that does not
// listen) and a signing key file into dir.
func controlPlaneFiles(t *testing.T, dir string) (db, key string) {
	t.Helper()
	db = writeSecret(t, dir, "db.url", "postgres://127.0.0.1:1/none")
	key = filepath.Join(dir, "control.key")
	k, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := aip.WriteSeedFile(key, k); err != nil {
		t.Fatal(err)
	}
	return db, key
}

func TestControlPlaneFlagErrors(t *testing.T) {
	dir := t.TempDir()
	db, key := controlPlaneFiles(t, dir)
	base := []string{"--database-url-file", db, "--signing-key-file", key}
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--signing-key-file", key, "--allow-insecure-loopback-http"}, want: "--database-url-file is required"},
		{args: []string{"--database-url-file", db, "--allow-insecure-loopback-http"}, want: "--signing-key-file is required"},
		{args: append(base, "--allow-insecure-loopback-http", "--lease-ttl", "500ms"), want: "--lease-ttl 500ms is outside"},
		{args: append(base, "--allow-insecure-loopback-http"), env: map[string]string{"AIP_CONTROL_LEASE_TTL": "301s"}, want: "--lease-ttl 5m1s is outside"},
		{args: append(base, "--allow-insecure-loopback-http", "--lease-ttl", "0s"), want: "--lease-ttl 0 is not allowed"},
		{args: append(base, "--allow-insecure-loopback-http", "--max-batch", "0"), want: "--max-batch 0 is not allowed"},
		// An empty audience was taken for the default.
		{args: append(base, "--allow-insecure-loopback-http", "--operator-audience", ""), want: "--operator-audience is empty"},
		{args: append(base, "--allow-insecure-loopback-http", "--max-batch", "100000"), want: "--max-batch 100000 is outside 1.."},
		{args: append(base, "--allow-insecure-loopback-http", "--batch-workers", "65"), want: "--batch-workers 65 is outside 1..64"},
		{args: append(base, "--allow-insecure-loopback-http", "--batch-workers", "-1"), want: "--batch-workers -1 is outside 1..64"},
		{args: append(base, "--allow-insecure-loopback-http", "--event-retention", "30m"), want: "--event-retention 30m0s is below 1h0m0s; give 0 to keep every event"},
		{args: append(base, "--allow-insecure-loopback-http", "--event-retention", "-1ns"), want: "--event-retention -1ns is below"},
		{args: append(base, "--allow-insecure-loopback-http", "--pruned-event-ids-retention", "30m"), want: "--pruned-event-ids-retention 30m0s is below 1h0m0s; give 0 to keep the IDs of deleted events for ever"},
		{args: append(base, "--allow-insecure-loopback-http", "--pruned-event-ids-retention", "-1ns"), want: "--pruned-event-ids-retention -1ns is below"},
		{args: append(base, "--allow-insecure-loopback-http", "--pruned-event-ids-retention", "24h"), want: "--pruned-event-ids-retention 24h0m0s is below --event-retention 720h0m0s"},
		{args: append(base, "--allow-insecure-loopback-http", "--event-retention", "9000h"), want: "--pruned-event-ids-retention 8760h0m0s is below --event-retention 9000h0m0s"},
		{args: base, want: "--allow-insecure-loopback-http"},
		{args: append(base, "--allow-insecure-loopback-http", "--bind", "0.0.0.0:8090"), want: "not a loopback address, so TLS is required"},
		{args: append(base, "--bind", "10.1.2.3:8090"), want: "TLS is required"},
		{args: append(base, "--tls-cert-file", "x.crt"), want: "go together"},
		{args: append(base, "--allow-insecure-loopback-http", "--log-level", "loud"), want: "--log-level"},
		{args: append(base, "--allow-insecure-loopback-http", "--max-connections", "0"), want: "--max-connections 0"},
		{args: append(base, "--allow-insecure-loopback-http", "--bind", "nohost"), want: "--bind"},
		{args: append(base, "--allow-insecure-loopback-http", "extra"), want: "unexpected argument"},
		{args: append(base, "--allow-insecure-loopback-http", "--operator-issuer", "ops"), want: "--operator-issuer: \"ops\" is not NAME=DID"},
		{args: append(base, "--allow-insecure-loopback-http", "--operator-issuer", "ops=did:key:zNope"), want: "--operator-issuer: issuer ops"},
		{args: append(base, "--allow-insecure-loopback-http", "--operator-issuer", "ops="+registrytest.Key("ops").DID(), "--open-fleet-views"),
			want: "either --operator-issuer"},
	} {
		_, _, err := runCLI(t, c.env, append([]string{"control-plane"}, c.args...)...)
		var u *usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("control-plane %v: err = %v, want a usage error containing %q", c.args, err, c.want)
		}
	}
	// Secret files must be owner-only.
	loose := filepath.Join(dir, "loose.url")
	if err := os.WriteFile(loose, []byte("postgres://x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := runCLI(t, nil, "control-plane", "--database-url-file", loose, "--signing-key-file", key, "--allow-insecure-loopback-http")
	if err == nil || !strings.Contains(err.Error(), "--database-url-file") {
		t.Fatalf("group-readable database URL file: %v", err)
	}
}

func TestIsLoopbackBind(t *testing.T) {
	for bind, want := range map[string]bool{
		"127.0.0.1:8090": true, "127.9.9.9:1": true, "[::1]:8090": true, "localhost:8090": true,
		"0.0.0.0:8090": false, ":8090": false, "10.0.0.1:8090": false, "[::]:8090": false, "example.com:80": false,
	} {
		got, err := isLoopbackBind(bind)
		if err != nil || got != want {
			t.Errorf("isLoopbackBind(%q) = %v, %v; want %v", bind, got, err, want)
		}
	}
}

// controlPlaneFixture prepares a database with the registry schema, the
// lifecycle world and one pre-provisioned replica, and the secret files.
type controlPlaneFixture struct {
	dir, dbFile, keyFile string
	key                  *aip.SigningKey
	world                *registrytest.LifecycleWorld
	replicaID            string
}

func newControlPlaneFixture(t *testing.T) *controlPlaneFixture {
	t.Helper()
	url := pgtest.NewDatabase(t)
	admin, err := pgregistry.Open(t.Context(), pgregistry.Config{ControlURL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	w, err := registrytest.NewLifecycleWorld(t.Context(), admin)
	if err != nil {
		t.Fatal(err)
	}
	rep := w.ProvisionedReplica("crepl_cli", time.Now())
	if err := admin.PutReplica(t.Context(), rep); err != nil {
		t.Fatal(err)
	}
	f := &controlPlaneFixture{dir: t.TempDir(), world: w, replicaID: rep.ID}
	f.dbFile = writeSecret(t, f.dir, "db.url", url+"\n")
	f.keyFile = filepath.Join(f.dir, "control.key")
	if f.key, err = aip.GenerateSigningKey(); err != nil {
		t.Fatal(err)
	}
	if err := aip.WriteSeedFile(f.keyFile, f.key); err != nil {
		t.Fatal(err)
	}
	return f
}

// register sends a signed registration of the fixture's replica to base
// and returns the verified lease.
func (f *controlPlaneFixture) register(t *testing.T, client *http.Client, base string) aip.Lease {
	t.Helper()
	rep := f.world.ProvisionedReplica(f.replicaID, time.Now())
	rk := registrytest.Key(f.replicaID)
	req := aip.NewControlRequest(time.Now(), rk.DID(), aip.RegisterCommand(f.world.Registration(&rep)))
	body, err := aip.Seal(rk, aip.SignedRequestField, req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(base+controlplane.PathControl, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	cr, err := aip.OpenControlResponse(raw, f.key.DID(), f.key.PublicKey(), req.RequestID, time.Now())
	if err != nil {
		t.Fatalf("HTTP %d: %v: %s", resp.StatusCode, err, raw)
	}
	if resp.StatusCode != http.StatusOK || cr.Outcome.Lease == nil || cr.Outcome.Lease.Sequence != 1 {
		t.Fatalf("register: HTTP %d %+v", resp.StatusCode, cr.Outcome)
	}
	return *cr.Outcome.Lease
}

// startupLine reads JSON log lines until the "starting" line and returns
// it; the rest of the log keeps draining into rest.
func startupLine(t *testing.T, r io.Reader, rest *syncBuffer) map[string]any {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		var line map[string]any
		if json.Unmarshal(sc.Bytes(), &line) == nil && line["status"] == "starting" {
			go func() {
				for sc.Scan() {
					rest.WriteLine(sc.Text())
				}
			}()
			return line
		}
		rest.WriteLine(sc.Text())
	}
	t.Fatalf("the control plane exited before its startup line: %s", rest.String())
	return nil
}

// TestControlPlaneProcess builds the binary, starts it as an operator
// would (flags and environment), registers a replica over loopback HTTP,
// and stops it with SIGTERM: it must exit 0 after a graceful shutdown.
func TestControlPlaneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	f := newControlPlaneFixture(t)
	bin := buildCLI(t)
	ops := registrytest.Key("ops")
	cmd := exec.Command(bin, "control-plane", "--bind", "127.0.0.1:0", "--allow-insecure-loopback-http", "--lease-ttl", "20s",
		"--operator-issuer", "ops="+ops.DID())
	cmd.Env = append(os.Environ(), "AIP_CONTROL_DATABASE_URL_FILE="+f.dbFile, "AIP_CONTROL_SIGNING_KEY_FILE="+f.keyFile)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	var rest syncBuffer
	line := startupLine(t, stderr, &rest)
	if line["did"] != f.key.DID() || line["schema_version"] != float64(pgregistry.SchemaVersion) || line["control_pool_max"] != float64(0) ||
		line["fleet_views"] != "operator tokens (--operator-issuer)" {
		t.Fatalf("startup line %v: want the DID, the schema version, no control pool and the fleet views for operators", line)
	}
	base := "http://" + line["bind"].(string)
	client := &http.Client{Timeout: 10 * time.Second}
	// The fleet views answer an operator token of the trusted issuer only.
	opTok, err := tenanttoken.MintOperator(ops, tenanttoken.Claims{Issuer: "ops", Audience: tenanttoken.OperatorAudience,
		IssuedAt: time.Now(), Expiry: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	for tok, want := range map[string]int{"": http.StatusUnauthorized, opTok: http.StatusOK} {
		req, _ := http.NewRequest(http.MethodGet, base+controlplane.PathFleetStatus, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("fleet status with token %q: HTTP %d, want %d", tok, resp.StatusCode, want)
		}
	}
	resp, err := client.Get(base + controlplane.PathReady)
	if err != nil {
		t.Fatal(err)
	}
	var doc controlplane.ReadyDocument
	err = json.NewDecoder(resp.Body).Decode(&doc)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || doc.Backend != "postgres" || doc.Pool == nil || doc.Pool.ControlMax != 0 {
		t.Fatalf("/ready: HTTP %d %+v (%v)", resp.StatusCode, doc, err)
	}
	lease := f.register(t, client, base)
	if d := time.Until(lease.ExpiresAt.Time); d < 15*time.Second || d > 21*time.Second {
		t.Fatalf("lease expires in %s, want about the --lease-ttl of 20s", d)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after SIGTERM the control plane exited with %v; log:\n%s", err, rest.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the control plane did not stop within 30s of SIGTERM; log:\n%s", rest.String())
	}
}

// TestControlPlaneTLS runs the command in process with a TLS certificate
// on loopback and checks that it answers over HTTPS, and stops when its
// context ends.
func TestControlPlaneTLS(t *testing.T) {
	f := newControlPlaneFixture(t)
	certFile, keyFile, pool := selfSignedCert(t, f.dir)
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"control-plane", "--database-url-file", f.dbFile, "--signing-key-file", f.keyFile,
			"--bind", "127.0.0.1:0", "--tls-cert-file", certFile, "--tls-key-file", keyFile},
			func(string) string { return "" }, io.Discard, pw)
		pw.Close()
	}()
	var rest syncBuffer
	line := startupLine(t, pr, &rest)
	if line["scheme"] != "https" {
		t.Fatalf("startup line %v", line)
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://" + line["bind"].(string)
	resp, err := client.Get(base + controlplane.PathHealth)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.TLS == nil {
		t.Fatalf("/health over TLS: HTTP %d", resp.StatusCode)
	}
	f.register(t, client, base)
	// Plain HTTP to the TLS port is refused.
	if resp, err := http.Get("http://" + line["bind"].(string) + controlplane.PathHealth); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP was served on the TLS port")
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after cancel: %v; log:\n%s", err, rest.String())
	}
}

func writeSecret(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// selfSignedCert writes a certificate for 127.0.0.1 and its key (0600) and
// returns a pool trusting it.
func selfSignedCert(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "control-plane.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	certFile = writeSecret(t, dir, "tls.crt", string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})))
	keyFile = writeSecret(t, dir, "tls.key", string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})))
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// syncBuffer collects log lines from another goroutine.
type syncBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *syncBuffer) WriteLine(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, s)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Join(b.lines, "\n")
}

// --event-retention: 30 days when left out, KeepEventsForever for 0;
// --pruned-event-ids-retention: 365 days when left out,
// KeepPrunedEventIDsForever for 0.
func TestControlPlaneEventRetention(t *testing.T) {
	db, key := controlPlaneFiles(t, t.TempDir())
	for _, c := range []struct {
		args    []string
		want    time.Duration
		wantIDs time.Duration
	}{
		{nil, controlplane.DefaultEventRetention, controlplane.DefaultPrunedEventIDsRetention},
		{[]string{"--event-retention", "0"}, controlplane.KeepEventsForever, controlplane.DefaultPrunedEventIDsRetention},
		{[]string{"--event-retention", "48h"}, 48 * time.Hour, controlplane.DefaultPrunedEventIDsRetention},
		{[]string{"--pruned-event-ids-retention", "0"}, controlplane.DefaultEventRetention, controlplane.KeepPrunedEventIDsForever},
		{[]string{"--event-retention", "48h", "--pruned-event-ids-retention", "48h"}, 48 * time.Hour, 48 * time.Hour},
		{[]string{"--event-retention", "0", "--pruned-event-ids-retention", "1h"}, controlplane.KeepEventsForever, time.Hour},
		{[]string{"--event-retention", "9000h", "--pruned-event-ids-retention", "0"}, 9000 * time.Hour, controlplane.KeepPrunedEventIDsForever},
	} {
		e := &env{getenv: func(string) string { return "" }, stdout: io.Discard, stderr: io.Discard}
		f, err := parseControlPlaneFlags(controlPlaneCommand(), e, append([]string{"--database-url-file", db, "--signing-key-file", key,
			"--allow-insecure-loopback-http"}, c.args...))
		if err != nil {
			t.Fatal(err)
		}
		if got := f.serviceConfig().EventRetention; got != c.want {
			t.Errorf("%v: EventRetention %v, want %v", c.args, got, c.want)
		}
		if got := f.serviceConfig().PrunedEventIDsRetention; got != c.wantIDs {
			t.Errorf("%v: PrunedEventIDsRetention %v, want %v", c.args, got, c.wantIDs)
		}
	}
}

// --ready-detail: local (loopback peers without a forwarding header) when
// left out, none hides the detail of /ready from every peer (only
// operators and the log have it), and any other value is refused naming
// the two.
func TestControlPlaneReadyDetail(t *testing.T) {
	db, key := controlPlaneFiles(t, t.TempDir())
	for _, c := range []struct {
		args    []string
		env     string // AIP_CONTROL_READY_DETAIL
		want    bool
		wantErr string
	}{
		{args: nil, want: false},
		{args: []string{"--ready-detail", "local"}, want: false},
		{args: []string{"--ready-detail", "none"}, want: true},
		{env: "none", want: true},
		{args: []string{"--ready-detail", "loopback"}, wantErr: `--ready-detail "loopback" is neither local nor none`},
	} {
		e := &env{getenv: func(k string) string {
			if k == "AIP_CONTROL_READY_DETAIL" {
				return c.env
			}
			return ""
		}, stdout: io.Discard, stderr: io.Discard}
		f, err := parseControlPlaneFlags(controlPlaneCommand(), e, append([]string{"--database-url-file", db, "--signing-key-file", key,
			"--allow-insecure-loopback-http"}, c.args...))
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%v: error %v, want %q", c.args, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := f.serviceConfig().HideLocalReadyDetail; got != c.want {
			t.Errorf("%v env %q: HideLocalReadyDetail %v, want %v", c.args, c.env, got, c.want)
		}
	}
}

// TestStoppedLogLine: a clean stop of the control plane or the dispatcher
// logs "stopped" without an error field (not "error":""); a stop that
// failed logs the error.
func TestStoppedLogLine(t *testing.T) {
	var b bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&b, nil))
	logStopped(logger, "aipfleet-dispatch", nil)
	var clean map[string]any
	if err := json.Unmarshal(b.Bytes(), &clean); err != nil {
		t.Fatal(err)
	}
	if _, ok := clean["error"]; ok || clean["msg"] != "stopped" {
		t.Errorf("clean stop logged %s", b.String())
	}
	b.Reset()
	logStopped(logger, "aipfleet-dispatch", errors.New("drain timed out"))
	if !strings.Contains(b.String(), `"error":"drain timed out"`) {
		t.Errorf("failed stop logged %s", b.String())
	}
}
