// Package sidecartest runs connectors under the aip-sidecar binary in
// tests, as an operator would: it builds the binary once per test process,
// pre-provisions replicas in a fleet, starts the sidecar with the common
// AIP_CONNECTOR_HOST_* environment, follows its JSON log, and checks
// local-contract messages against the contract's JSON Schemas.
//
// The fleet is hostsdktest's fake control plane and fake dispatcher, which
// speak the real signed wire (lifecycle requests, native envelopes with the
// pinned route) over loopback HTTP. Tests talk to it only through Fleet,
// so moving them to the aipfleet control-plane and dispatch processes
// changes this package, not the tests.
//
// A test:
//
//	func TestMain(m *testing.M) { code := m.Run(); sidecartest.RemoveBuilds(); os.Exit(code) }
//
//	fleet := sidecartest.NewFleet(t)
//	r := fleet.NewReplica(t, sidecartest.ReplicaOptions{})
//	p := sidecartest.Start(t, sidecartest.Sidecar(t), r.Env, "--local-socket", sock, "--exec", "python3", "connector.py")
//	p.Await(t, "serving")
//	resp, err := fleet.Dispatcher.Act(ctx, fleet.Target(t, r), action)
package sidecartest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// SidecarPackage is the import path of the aip-sidecar command.
const SidecarPackage = "github.com/aipfleet/aipfleet/cmd/aip-sidecar"

var (
	buildMu  sync.Mutex
	builds   = map[string]string{}
	buildDir string
)

// Build builds a main package once per test process and returns the
// binary's path. Call RemoveBuilds from TestMain when the tests are done.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := builds[pkg]; ok {
		return bin
	}
	if buildDir == "" {
		dir, err := os.MkdirTemp("", "sidecartest-bin")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = dir
	}
	bin := filepath.Join(buildDir, filepath.Base(pkg))
	out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, out)
	}
	builds[pkg] = bin
	return bin
}

// Sidecar builds (once) and returns the aip-sidecar binary.
func Sidecar(t testing.TB) string { return Build(t, SidecarPackage) }

// RemoveBuilds deletes the binaries Build made.
func RemoveBuilds() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		os.RemoveAll(buildDir)
		buildDir, builds = "", map[string]string{}
	}
}

// Fleet is the central side of the replicas under test.
type Fleet struct {
	ControlPlane *hostsdktest.ControlPlane
	Dispatcher   *hostsdktest.Dispatcher
}

// NewFleet starts a fleet for the test.
func NewFleet(t testing.TB) *Fleet {
	t.Helper()
	return &Fleet{
		ControlPlane: hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{}),
		Dispatcher:   hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain}),
	}
}

// ReplicaOptions tune a replica's lifecycle timing. Zero values mean
// hostsdk's defaults.
type ReplicaOptions struct {
	HeartbeatInterval time.Duration
	LeaseTTL          time.Duration
}

// Replica is one pre-provisioned replica: its identity and the
// AIP_CONNECTOR_HOST_* environment that configures a process as it.
type Replica struct {
	ID         string
	InstanceID string
	VersionID  string
	TenantID   string
	Key        *aip.SigningKey
	// Endpoint is the replica's /aip/v1/messages URL; Base its origin.
	Endpoint string
	Base     string
	// Env is KEY=VALUE lines for the process (state directory included,
	// so a restart with the same Env recovers the same journal).
	Env []string
	// Dir is a directory of the test the replica's files live in.
	Dir string
}

// NewReplica pre-provisions a replica and returns its environment.
func (f *Fleet) NewReplica(t testing.TB, opts ReplicaOptions) *Replica {
	t.Helper()
	dir := t.TempDir()
	key, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	seed := filepath.Join(dir, "seed")
	if err := aip.WriteSeedFile(seed, key); err != nil {
		t.Fatal(err)
	}
	addr := FreeAddr(t)
	r := &Replica{
		ID: aip.NewID(aip.PrefixReplica), InstanceID: aip.NewID(aip.PrefixInstance), VersionID: aip.NewID(aip.PrefixVersion),
		TenantID: hostsdktest.TenantID, Key: key, Endpoint: "http://" + addr + aip.MessagesPath, Base: "http://" + addr, Dir: dir,
	}
	artifact := aip.DigestBytes([]byte("aip-sidecar"))
	r.Env = []string{
		"AIP_CONNECTOR_HOST_BIND=" + addr,
		"AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT=" + r.Endpoint,
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=" + f.ControlPlane.Endpoint(),
		"AIP_CONNECTOR_HOST_CONTROL_DID=" + f.ControlPlane.DID(),
		"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=" + seed,
		"AIP_CONNECTOR_HOST_TYPE_ID=" + aip.NewID(aip.PrefixType),
		"AIP_CONNECTOR_HOST_VERSION_ID=" + r.VersionID,
		"AIP_CONNECTOR_HOST_INSTANCE_ID=" + r.InstanceID,
		"AIP_CONNECTOR_HOST_REPLICA_ID=" + r.ID,
		"AIP_CONNECTOR_HOST_TENANT_ID=" + r.TenantID,
		"AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + f.Dispatcher.PrincipalID(),
		"AIP_CONNECTOR_HOST_GATEWAY_DID=" + f.Dispatcher.DID(),
		"AIP_CONNECTOR_HOST_TRUST_DOMAIN=" + hostsdktest.TrustDomain,
		"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST=" + artifact,
		"AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF=secret://sidecartest",
		"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP=true",
		"AIP_CONNECTOR_HOST_STATE_DIR=" + filepath.Join(dir, "state"),
		"AIP_SIDECAR_LOG_LEVEL=debug",
	}
	if opts.HeartbeatInterval > 0 {
		r.Env = append(r.Env, fmt.Sprintf("AIP_CONNECTOR_HOST_HEARTBEAT_MS=%d", opts.HeartbeatInterval.Milliseconds()))
	}
	if opts.LeaseTTL > 0 {
		r.Env = append(r.Env, fmt.Sprintf("AIP_CONNECTOR_HOST_LEASE_TTL_MS=%d", opts.LeaseTTL.Milliseconds()))
	}
	f.ControlPlane.Provision(hostsdktest.ReplicaSpec{ID: r.ID, DID: key.DID(), InstanceID: r.InstanceID, VersionID: r.VersionID,
		Endpoint: r.Endpoint, TenantID: r.TenantID, ArtifactDigest: artifact})
	return r
}

// FreeAddr returns a free loopback TCP address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// SocketPath returns a short unix socket path in a directory removed when
// the test ends (a socket path is at most 107 bytes).
func SocketPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sct")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, name)
}

// Client is an HTTP client that keeps no idle connections (goleak-safe).
var Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}

// GetJSON GETs url and decodes its JSON body into v; it returns the status.
func GetJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := Client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, body)
	}
	return resp.StatusCode
}

// Target returns the dispatch target of a running replica (its manifest
// digest read from GET /aip/v1/manifest).
func (f *Fleet) Target(t testing.TB, r *Replica) hostsdktest.Target {
	t.Helper()
	var m aip.Manifest
	GetJSON(t, r.Base+hostsdk.PathManifest, &m)
	digest, err := aip.ManifestDigest(&m)
	if err != nil {
		t.Fatal(err)
	}
	return hostsdktest.Target{
		Endpoint: r.Endpoint, Principal: aip.Principal{ID: m.Agent.ID, Kind: m.Agent.Kind}, DID: r.Key.DID(),
		TenantID: r.TenantID, InstanceID: r.InstanceID, ReplicaID: r.ID, VersionID: r.VersionID, ManifestDigest: digest,
	}
}

// Ready returns the replica's /ready status code and document.
func (r *Replica) Ready(t testing.TB) (int, hostsdk.ReadyDocument) {
	t.Helper()
	var doc hostsdk.ReadyDocument
	code := GetJSON(t, r.Base+hostsdk.PathReady, &doc)
	return code, doc
}

// AwaitReady polls the replica's /ready until it answers 200 (after a
// registration the control plane recorded, the host applies the lease).
func (r *Replica) AwaitReady(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := Client.Get(r.Base + hostsdk.PathReady)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica %s did not become ready", r.ID)
		}
		time.Sleep(10 * time.Millisecond) // polling a process for readiness
	}
}

// Process is a running binary whose JSON log lines (stderr) are followed.
type Process struct {
	Cmd    *exec.Cmd
	lines  chan map[string]any
	done   chan struct{}
	err    error
	mu     sync.Mutex
	log    strings.Builder
	stdout lockedBuffer
}

// lockedBuffer is a bytes.Buffer safe for the process's writer and the
// test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Stdout returns what the process wrote to its standard output so far.
func (p *Process) Stdout() string { return p.stdout.String() }

// Start runs bin with the inherited environment plus env and args; it is
// killed when the test ends if still running, and its log is printed if
// the test failed.
func Start(t testing.TB, bin string, env []string, args ...string) *Process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &Process{Cmd: cmd, lines: make(chan map[string]any, 4096), done: make(chan struct{})}
	cmd.Stdout = &p.stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				select {
				case p.lines <- m:
				default:
				}
			}
		}
		close(p.lines)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", filepath.Base(bin), p.Log())
		}
	})
	return p
}

// Log returns everything the process wrote to stderr so far.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// Await reads log lines until one has msg and every attr=value pair given
// (as alternating strings), and returns it.
func (p *Process) Await(t testing.TB, msg string, attrs ...string) map[string]any {
	t.Helper()
	timeout := time.NewTimer(2 * time.Minute)
	defer timeout.Stop()
	for {
		select {
		case m, ok := <-p.lines:
			if !ok {
				t.Fatalf("the process exited before logging %q", msg)
			}
			if m["msg"] != msg {
				continue
			}
			match := true
			for i := 0; i+1 < len(attrs); i += 2 {
				if fmt.Sprint(m[attrs[i]]) != attrs[i+1] {
					match = false
				}
			}
			if match {
				return m
			}
		case <-timeout.C:
			t.Fatalf("the process did not log %q", msg)
		}
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// Wait waits for the process to exit and returns cmd.Wait's result.
func (p *Process) Wait(t testing.TB) error {
	t.Helper()
	select {
	case <-p.done:
		return p.err
	case <-time.After(2 * time.Minute):
		t.Fatal("the process did not exit")
		return nil
	}
}

// Exited reports whether a process ID no longer exists.
func Exited(pid int) bool {
	return syscall.Kill(pid, 0) == syscall.ESRCH
}
