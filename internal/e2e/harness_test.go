package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// leaseTTL is the lease the fleet's control plane grants; hosts heartbeat
// every second. It must outlast a host's drain: hostsdk's graceful HTTP
// shutdown waits up to 5 s for keep-alive connections that never carried
// a request (net/http treats them as active that long), heartbeats stop
// while draining, and a lease that expires before the signed offline makes
// the offline transition fail its sequence fence.
const leaseTTL = 10 * time.Second

// Fleet constants.
const (
	trustDomain   = "e2e.aipfleet.invalid"
	tenantID      = "tenant-e2e"
	issuerName    = "e2e-issuer"
	gatewayID     = "service:aipfleet-dispatch"
	echoPrincipal = "agent:aipfleet-echo"
	capSay        = "echo.say"
	capStream     = "echo.stream"
	// sideEffects is echo's state namespace (examples/echo).
	sideEffects = "echo.side_effects"
)

// binaries are built once per test run by TestMain.
var bins struct {
	aipfleet, echo string
	err            error
}

func buildBinaries(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	for _, b := range []struct {
		out *string
		pkg string
	}{{&bins.aipfleet, "./cmd/aipfleet"}, {&bins.echo, "./examples/echo"}} {
		*b.out = filepath.Join(dir, filepath.Base(b.pkg))
		cmd := exec.Command("go", "build", "-o", *b.out, b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}
	return nil
}

func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// process is a running binary whose stderr is kept.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // the exit error, set before done closes
	mu   sync.Mutex
	log  bytes.Buffer
}

func start(t testing.TB, name, bin string, args, env []string) *process {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = procAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.log.Write(sc.Bytes())
			p.log.WriteByte('\n')
			p.mu.Unlock()
		}
		io.Copy(io.Discard, stderr)
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("--- %s log (last lines):\n%s", name, tail(p.logText(), 30))
		}
	})
	return p
}

func (p *process) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL and waits.
func (p *process) kill() {
	if !p.exited() {
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
}

// term sends SIGTERM and waits up to a minute for the exit.
func (p *process) term(t testing.TB) error {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.err
	case <-time.After(time.Minute):
		t.Fatalf("%s did not exit within a minute of SIGTERM", p.name)
		return nil
	}
}

// waitFor polls cond until it holds, the process exits or a deadline passes.
func waitFor(t testing.TB, what string, procs []*process, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		for _, p := range procs {
			if p.exited() {
				t.Fatalf("%s exited while waiting for %s: %v\n%s", p.name, what, p.err, p.logText())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// writeKey writes a fresh seed file and returns the key and its path.
func writeKey(t testing.TB, dir, name string) (*aip.SigningKey, string) {
	t.Helper()
	k, err := aip.GenerateSigningKey()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := aip.WriteSeedFile(p, k); err != nil {
		t.Fatal(err)
	}
	return k, p
}

func writeSecret(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// echoManifest is the echo connector's manifest bound to trustDomain, read
// once from a running echo binary (against an in-process fake control
// plane), so the registry admits exactly what the hosts serve.
var echoManifest struct {
	once sync.Once
	m    aip.Manifest
	err  error
}

func boundEchoManifest(t testing.TB) aip.Manifest {
	t.Helper()
	echoManifest.once.Do(func() {
		cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
		d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: trustDomain})
		dir := t.TempDir()
		key, seed := writeKey(t, dir, "seed")
		addr := freeAddr(t)
		id, inst, ver := aip.NewID(aip.PrefixReplica), aip.NewID(aip.PrefixInstance), aip.NewID(aip.PrefixVersion)
		artifact := aip.DigestBytes([]byte("manifest probe"))
		cp.Provision(hostsdktest.ReplicaSpec{ID: id, DID: key.DID()})
		p := start(t, "echo manifest probe", bins.echo, nil, []string{
			"AIP_CONNECTOR_HOST_BIND=" + addr, "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT=http://" + addr + aip.MessagesPath,
			"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=" + cp.Endpoint(), "AIP_CONNECTOR_HOST_CONTROL_DID=" + cp.DID(),
			"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=" + seed, "AIP_CONNECTOR_HOST_TYPE_ID=" + aip.NewID(aip.PrefixType),
			"AIP_CONNECTOR_HOST_VERSION_ID=" + ver, "AIP_CONNECTOR_HOST_INSTANCE_ID=" + inst, "AIP_CONNECTOR_HOST_REPLICA_ID=" + id,
			"AIP_CONNECTOR_HOST_TENANT_ID=" + tenantID, "AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + d.PrincipalID(),
			"AIP_CONNECTOR_HOST_GATEWAY_DID=" + d.DID(), "AIP_CONNECTOR_HOST_TRUST_DOMAIN=" + trustDomain,
			"AIP_CONNECTOR_HOST_ARTIFACT_DIGEST=" + artifact, "AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF=secret://probe",
			"AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP=true", "AIP_CONNECTOR_HOST_STATE_DIR=" + filepath.Join(dir, "state"),
		})
		url := "http://" + addr + "/aip/v1/manifest"
		waitFor(t, "the echo manifest", []*process{p}, func() bool { return httpOK(url) })
		resp, err := http.Get(url)
		if err != nil {
			echoManifest.err = err
			return
		}
		defer resp.Body.Close()
		echoManifest.err = json.NewDecoder(resp.Body).Decode(&echoManifest.m)
		echoManifest.m.Agent.DID = ""
		if err := p.term(t); err != nil {
			echoManifest.err = fmt.Errorf("the manifest probe did not stop cleanly: %w", err)
		}
	})
	if echoManifest.err != nil {
		t.Fatal(echoManifest.err)
	}
	return echoManifest.m
}

// fleetOptions tune a fleet.
type fleetOptions struct {
	replicas     int
	hostInFlight int
	dispatchArgs []string
	logLevel     string
}

// fleet is a running fleet: registry (owned by the test through the control
// pool), control plane, dispatcher and echo replicas.
type fleet struct {
	t   testing.TB
	ctx context.Context
	dir string
	opt fleetOptions

	reg        *pgregistry.Registry
	dbFile     string
	controlKey *aip.SigningKey
	controlURL string
	// controlAddr and controlKeyFile restart the control plane identically.
	controlAddr, controlKeyFile string
	gatewayKey                  *aip.SigningKey
	issuerKey                   *aip.SigningKey
	cp, disp                    *process
	apiURL                      string
	client                      *http.Client

	typeID, instanceID string
	version            registry.ConnectorVersion
	mu                 sync.Mutex
	replicas           []*replica // every replica ever started, in order
}

// replica is one echo host identity.
type replica struct {
	id, addr, stateDir string
	seedFile           string
	key                *aip.SigningKey
	proc               *process
}

func (r *replica) endpoint() string { return "http://" + r.addr + aip.MessagesPath }

func startFleet(t testing.TB, opt fleetOptions) *fleet {
	t.Helper()
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	if opt.hostInFlight == 0 {
		opt.hostInFlight = 64
	}
	if opt.logLevel == "" {
		opt.logLevel = "info"
	}
	dbURL := pgtest.NewDatabase(t)
	manifest := boundEchoManifest(t)
	f := &fleet{t: t, ctx: context.Background(), dir: t.TempDir(), opt: opt}
	var err error
	f.reg, err = pgregistry.Open(f.ctx, pgregistry.Config{ControlURL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.reg.Close)
	f.dbFile = writeSecret(t, f.dir, "db.url", dbURL)
	f.catalog(manifest)

	// The control plane.
	var controlKeyFile, gatewayKeyFile string
	f.controlKey, controlKeyFile = writeKey(t, f.dir, "control.key")
	f.gatewayKey, gatewayKeyFile = writeKey(t, f.dir, "gateway.key")
	f.issuerKey, _ = writeKey(t, f.dir, "issuer.key")
	f.controlAddr, f.controlKeyFile = freeAddr(t), controlKeyFile
	f.controlURL = "http://" + f.controlAddr
	f.startControlPlane()

	// The dispatcher.
	apiAddr := freeAddr(t)
	f.apiURL = "http://" + apiAddr
	args := append([]string{"dispatch", "--database-url-file", f.dbFile, "--signing-key-file", gatewayKeyFile,
		"--issuer", issuerName + "=" + f.issuerKey.DID(), "--bind", apiAddr, "--allow-insecure-loopback-http",
		"--log-level", opt.logLevel}, opt.dispatchArgs...)
	f.disp = start(t, "dispatch", bins.aipfleet, args, nil)
	waitFor(t, "the dispatcher", []*process{f.disp}, func() bool { return httpOK(f.apiURL + dispatch.PathReady) })
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	t.Cleanup(f.client.CloseIdleConnections)

	for range opt.replicas {
		f.addReplica()
	}
	return f
}

// startControlPlane starts (or restarts, on the same address and key) the
// control plane process and waits until it is ready.
func (f *fleet) startControlPlane() {
	t := f.t
	t.Helper()
	f.cp = start(t, "control-plane", bins.aipfleet, []string{"control-plane",
		"--database-url-file", f.dbFile, "--signing-key-file", f.controlKeyFile, "--bind", f.controlAddr,
		"--allow-insecure-loopback-http", "--lease-ttl", leaseTTL.String(), "--log-level", f.opt.logLevel}, nil)
	waitFor(t, "the control plane", []*process{f.cp}, func() bool { return httpOK(f.controlURL + "/ready") })
}

// catalog admits echo's version and installs the tenant's instance and
// bindings through the control pool.
func (f *fleet) catalog(m aip.Manifest) {
	t, ctx := f.t, f.ctx
	t.Helper()
	f.typeID, f.instanceID = aip.NewID(aip.PrefixType), aip.NewID(aip.PrefixInstance)
	must(t, f.reg.PutConnectorType(ctx, registry.ConnectorType{ID: f.typeID, Name: "echo", Owner: "team-echo", Enabled: true}))
	f.version = registrytest.Version(aip.NewID(aip.PrefixVersion), f.typeID, "1.0.0", "team-echo", registry.VersionActive, m)
	must(t, f.reg.AdmitVersion(ctx, f.version))
	must(t, f.reg.PutInstance(ctx, registry.ConnectorInstance{ID: f.instanceID, ConnectorTypeID: f.typeID, VersionID: f.version.ID,
		TenantID: tenantID, ConfigRevision: 1, SecretProviderRef: "secret://echo", Status: registry.InstanceEnabled}))
	for _, c := range []string{capSay, capStream} {
		must(t, f.reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: tenantID, CapabilityID: c, InstanceID: f.instanceID,
			PolicyRevision: 1, Enabled: true}))
	}
}

// addReplica pre-provisions a new replica identity, starts its host and
// waits until the registry has it ready.
func (f *fleet) addReplica() *replica {
	t := f.t
	t.Helper()
	r := &replica{id: aip.NewID(aip.PrefixReplica), addr: freeAddr(t)}
	dir := filepath.Join(f.dir, r.id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	r.stateDir = filepath.Join(dir, "state")
	r.key, r.seedFile = writeKey(t, dir, "seed")
	must(t, f.reg.PutReplica(f.ctx, registry.ConnectorReplica{
		ID: r.id, InstanceID: f.instanceID, VersionID: f.version.ID, Endpoint: r.endpoint(),
		PeerPrincipalID: echoPrincipal, PeerPrincipalKind: aip.PrincipalAgent, PeerDID: r.key.DID(),
		TrustDomain: trustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaOffline, Capacity: uint32(f.opt.hostInFlight),
	}))
	f.mu.Lock()
	f.replicas = append(f.replicas, r)
	f.mu.Unlock()
	f.startHost(r)
	return r
}

// startHost starts (or restarts, on the same identity and state) a
// replica's echo process and waits until the registry has it ready.
func (f *fleet) startHost(r *replica) {
	t := f.t
	t.Helper()
	r.proc = start(t, "echo "+r.id, bins.echo, nil, []string{
		"AIP_CONNECTOR_HOST_BIND=" + r.addr, "AIP_CONNECTOR_HOST_PUBLIC_ENDPOINT=" + r.endpoint(),
		"AIP_CONNECTOR_HOST_CONTROL_ENDPOINT=" + f.controlURL + aip.ControlPath, "AIP_CONNECTOR_HOST_CONTROL_DID=" + f.controlKey.DID(),
		"AIP_CONNECTOR_HOST_SIGNING_SEED_FILE=" + r.seedFile, "AIP_CONNECTOR_HOST_TYPE_ID=" + f.typeID,
		"AIP_CONNECTOR_HOST_VERSION_ID=" + f.version.ID, "AIP_CONNECTOR_HOST_INSTANCE_ID=" + f.instanceID,
		"AIP_CONNECTOR_HOST_REPLICA_ID=" + r.id, "AIP_CONNECTOR_HOST_TENANT_ID=" + tenantID,
		"AIP_CONNECTOR_HOST_GATEWAY_PRINCIPAL_ID=" + gatewayID, "AIP_CONNECTOR_HOST_GATEWAY_DID=" + f.gatewayKey.DID(),
		"AIP_CONNECTOR_HOST_TRUST_DOMAIN=" + trustDomain, "AIP_CONNECTOR_HOST_ARTIFACT_DIGEST=" + f.version.Attestation.ArtifactDigest,
		"AIP_CONNECTOR_HOST_SECRET_PROVIDER_REF=secret://echo", "AIP_CONNECTOR_HOST_ALLOW_LOOPBACK_HTTP=true",
		"AIP_CONNECTOR_HOST_STATE_DIR=" + r.stateDir, "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT=" + strconv.Itoa(f.opt.hostInFlight),
		"AIP_CONNECTOR_HOST_LEASE_TTL_MS=" + strconv.FormatInt(leaseTTL.Milliseconds(), 10), "AIP_CONNECTOR_HOST_HEARTBEAT_MS=1000", "AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS=15000",
		"AIP_ECHO_LOG_LEVEL=" + f.opt.logLevel,
	})
	waitFor(t, "replica "+r.id+" to be ready", []*process{r.proc, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now())
	})
}

func (f *fleet) replicaList() []*replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*replica(nil), f.replicas...)
}

// token mints a bearer token for tenant.
func (f *fleet) token(tenant string) string {
	f.t.Helper()
	now := time.Now()
	tok, err := tenanttoken.Mint(f.issuerKey, tenanttoken.Claims{Issuer: issuerName, Audience: tenanttoken.DefaultAudience,
		TenantID: tenant, IssuedAt: now, Expiry: now.Add(time.Hour)})
	must(f.t, err)
	return tok
}

// post sends raw as POST path with the bearer token (none when "").
func (f *fleet) post(ctx context.Context, path, token string, raw []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.apiURL+path, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, body, err
}

func (f *fleet) get(path, token string) (int, []byte) {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.apiURL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := f.client.Do(req)
	must(f.t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// send runs one echo.say action.
func (f *fleet) send(ctx context.Context, token, actionID, message, extra string) (int, dispatch.ActionResponse, error) {
	raw := fmt.Sprintf(`{"capability_id":%q,"input":{"message":%q%s}`, capSay, message, extra)
	if actionID != "" {
		raw += fmt.Sprintf(`,"action_id":%q`, actionID)
	}
	raw += "}"
	status, body, err := f.post(ctx, dispatch.PathActions, token, []byte(raw))
	if err != nil {
		return 0, dispatch.ActionResponse{}, err
	}
	var resp dispatch.ActionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return status, resp, fmt.Errorf("answer %d is not an action response: %s", status, body)
	}
	return status, resp, nil
}

// outputOf decodes echo's output from an action response.
func outputOf(r *dispatch.ActionResponse) (echoconnector.Output, error) {
	var o echoconnector.Output
	if r.Result == nil {
		return o, errors.New("no result")
	}
	err := json.Unmarshal(r.Result.Output, &o)
	return o, err
}

// stopAll stops every running host with SIGTERM and checks each exits 0.
func (f *fleet) stopAll() {
	f.t.Helper()
	for _, r := range f.replicaList() {
		if r.proc != nil && !r.proc.exited() {
			if err := r.proc.term(f.t); err != nil {
				f.t.Errorf("replica %s did not stop cleanly: %v", r.id, err)
			}
		}
	}
}

// audit opens every replica's journal (all hosts must be stopped) and
// returns, per action ID, the replicas whose echo recorded its side effect
// and the summed effect count.
func (f *fleet) audit(actionIDs []string) (ran map[string][]string, effects map[string]int) {
	t := f.t
	t.Helper()
	ran, effects = map[string][]string{}, map[string]int{}
	for _, r := range f.replicaList() {
		if r.proc != nil && !r.proc.exited() {
			t.Fatalf("audit with replica %s still running", r.id)
		}
		j, err := sqliteruntime.Open(f.ctx, sqliteruntime.Config{Dir: r.stateDir})
		if err != nil {
			t.Fatalf("open the journal of %s: %v", r.id, err)
		}
		for _, id := range actionIDs {
			v, err := j.State(f.ctx, sideEffects, id)
			if errors.Is(err, journal.ErrNotFound) {
				continue // no effect recorded there
			}
			if err != nil {
				t.Fatalf("read the side effect of %s on %s: %v", id, r.id, err)
			}
			n, err := strconv.Atoi(strings.TrimSpace(string(v.Value)))
			if err != nil {
				t.Fatalf("side-effect record of %s on %s: %q", id, r.id, v.Value)
			}
			ran[id] = append(ran[id], r.id)
			effects[id] += n
		}
		j.Close()
	}
	return ran, effects
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// mintWith mints a token naming the fleet's issuer but signed by key.
func mintWith(key *aip.SigningKey, tenant string, now time.Time) (string, error) {
	return tenanttoken.Mint(key, tenanttoken.Claims{Issuer: issuerName, Audience: tenanttoken.DefaultAudience,
		TenantID: tenant, IssuedAt: now, Expiry: now.Add(time.Hour)})
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
