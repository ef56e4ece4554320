package main

import (
	"bufio"
	"context"
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

var (
	buildOnce sync.Once
	binary    string
	buildErr  error
)

// echoBinary builds the echo command once per test run.
func echoBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "aipfleet-echo-bin")
		if err != nil {
			buildErr = err
			return
		}
		binary = filepath.Join(dir, "echo")
		out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binary
}

// replicaEnv is the configuration of one echo process, as environment
// variables.
type replicaEnv struct {
	env       []string
	replicaID string
	key       *aip.SigningKey
	endpoint  string
	base      string
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func newReplicaEnv(t testing.TB, cp *hostsdktest.ControlPlane, d *hostsdktest.Dispatcher) *replicaEnv {
	t.Helper()
	dir := t.TempDir()
	key, _ := aip.GenerateSigningKey()
	seed := filepath.Join(dir, "seed")
	if err := aip.WriteSeedFile(seed, key); err != nil {
		t.Fatal(err)
	}
	addr := freePort(t)
	r := &replicaEnv{replicaID: aip.NewID(aip.PrefixReplica), key: key,
		endpoint: "http://" + addr + aip.MessagesPath, base: "http://" + addr}
	instance, version := aip.NewID(aip.PrefixInstance), aip.NewID(aip.PrefixVersion)
	artifact := aip.DigestBytes([]byte("echo"))
	r.env = []string{
		"AIP_CONNECTOR_HOST_BIND=" + addr,
		"AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT=" + r.endpoint,
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=" + cp.Endpoint(),
		"AIP_CONNECTOR_HOST_CONTROL_DID=" + cp.DID(),
		"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=" + seed,
		"AIP_CONNECTOR_HOST_TYPE_ID=" + aip.NewID(aip.PrefixType),
		"AIP_CONNECTOR_HOST_VERSION_ID=" + version,
		"AIP_CONNECTOR_HOST_INSTANCE_ID=" + instance,
		"AIP_CONNECTOR_HOST_REPLICA_ID=" + r.replicaID,
		"AIP_CONNECTOR_HOST_TENANT_ID=" + hostsdktest.TenantID,
		"AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + d.PrincipalID(),
		"AIP_CONNECTOR_HOST_GATEWAY_DID=" + d.DID(),
		"AIP_CONNECTOR_HOST_TRUST_DOMAIN=" + hostsdktest.TrustDomain,
		"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST=" + artifact,
		"AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF=secret://echo",
		"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP=true",
		"AIP_CONNECTOR_HOST_STATE_DIR=" + filepath.Join(dir, "state"),
		"AIP_ECHO_LOG_LEVEL=debug",
	}
	cp.Provision(hostsdktest.ReplicaSpec{ID: r.replicaID, DID: key.DID(), InstanceID: instance, VersionID: version,
		Endpoint: r.endpoint, TenantID: hostsdktest.TenantID, ArtifactDigest: artifact})
	return r
}

// process is a running echo binary whose JSON log lines are read as they
// come.
type process struct {
	cmd   *exec.Cmd
	lines chan map[string]any
	done  chan error
	log   *strings.Builder
	mu    sync.Mutex
}

func startEcho(t testing.TB, r *replicaEnv) *process {
	t.Helper()
	cmd := exec.Command(echoBinary(t))
	cmd.Env = append(os.Environ(), r.env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, lines: make(chan map[string]any, 1024), done: make(chan error, 1), log: &strings.Builder{}}
	go func() {
		sc := bufio.NewScanner(stderr)
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
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("echo log:\n%s", p.log.String())
			p.mu.Unlock()
		}
	})
	return p
}

// await reads log lines until one has msg (and, when set, attr=value).
func (p *process) await(t testing.TB, msg, attr, value string) {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case m, ok := <-p.lines:
			if !ok {
				t.Fatalf("echo exited before logging %q", msg)
			}
			if m["msg"] == msg && (attr == "" || fmt.Sprint(m[attr]) == value) {
				return
			}
		case <-timeout:
			t.Fatalf("echo did not log %q", msg)
		}
	}
}

func (p *process) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-p.done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("echo did not exit")
		return nil
	}
}

func targetOf(t testing.TB, r *replicaEnv) hostsdktest.Target {
	t.Helper()
	resp, err := http.Get(r.base + hostsdk.PathManifest)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m aip.Manifest
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	digest, _ := aip.ManifestDigest(&m)
	env := map[string]string{}
	for _, kv := range r.env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return hostsdktest.Target{
		Endpoint: r.endpoint, Principal: aip.Principal{ID: m.Agent.ID, Kind: m.Agent.Kind}, DID: r.key.DID(),
		TenantID: env["AIP_CONNECTOR_HOST_TENANT_ID"], InstanceID: env["AIP_CONNECTOR_HOST_INSTANCE_ID"],
		ReplicaID: r.replicaID, VersionID: env["AIP_CONNECTOR_HOST_VERSION_ID"], ManifestDigest: digest,
	}
}

func readyOf(t testing.TB, r *replicaEnv) hostsdk.ReadyDocument {
	t.Helper()
	resp, err := http.Get(r.base + hostsdk.PathReady)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var doc hostsdk.ReadyDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("/ready: %s", body)
	}
	return doc
}

// TestCrashRecovery kills an echo process with two actions in flight, one
// before its side effect and one after, restarts it on the same state
// directory, and checks that recovery settles both and that sending the same
// action IDs again never repeats the side effect.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the echo binary")
	}
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	r := newReplicaEnv(t, cp, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := startEcho(t, r)
	p.await(t, "serving", "", "")
	target := targetOf(t, r)

	before := say("before the effect", `,"delay_ms":600000`)
	after := say("after the effect", `,"hold_ms":600000`)
	for _, a := range []*aip.Action{before, after} {
		go d.Act(ctx, target, a) // the answers are lost with the process
	}
	p.await(t, "side effect recorded", "action_id", after.ID)
	for {
		st, _, err := d.Status(ctx, target, before.ID, CapSay)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == aip.StateRunning {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling a real process for a state change
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	p.wait(t)

	// The lease expires (as the control plane's maintenance loop would
	// record it); the same replica restarts on the same state.
	cp.ExpireLease(r.replicaID)
	p = startEcho(t, r)
	p.await(t, "serving", "", "")
	rec := readyOf(t, r).Runtime.Recovery
	if rec.Reconciled != 2 || rec.OutcomeUnknown != 0 || len(rec.Errors) != 0 {
		t.Fatalf("recovery summary %+v", rec)
	}
	for range 2 {
		res, _ := output(t, must(d.Act(ctx, target, before)))
		if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "echo.not_executed" {
			t.Errorf("action killed before its effect answered %+v", res)
		}
		res, out := output(t, must(d.Act(ctx, target, after)))
		if res.Status != aip.ResultCompleted || out.SideEffects != 1 || !out.Reconciled {
			t.Errorf("action killed after its effect answered %+v %+v", res, out)
		}
	}

	// A clean shutdown exits 0 with offline last.
	p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.wait(t); err != nil {
		t.Fatalf("echo exited with %v after SIGTERM", err)
	}
	o := cp.Operations()
	if last := o[len(o)-1]; last.Op != aip.OpOffline || last.Outcome != aip.OutcomeOffline {
		t.Errorf("last lifecycle operation %+v", last)
	}
}

// TestExitStatusReflectsFailures: when the control plane refuses the
// offline transition, the process exits non-zero.
func TestExitStatusReflectsFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the echo binary")
	}
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	r := newReplicaEnv(t, cp, d)
	p := startEcho(t, r)
	p.await(t, "serving", "", "")
	cp.FailNext(1, 0)
	cp.FailNext(1, hostsdktest.FaultReject) // offline
	p.cmd.Process.Signal(syscall.SIGTERM)
	err := p.wait(t)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !strings.Contains(p.log.String(), "registry offline transition") {
		t.Errorf("the log does not name the failed step:\n%s", p.log.String())
	}
}
