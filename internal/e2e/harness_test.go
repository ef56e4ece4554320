package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest/realfleet"
)

// leaseTTL is the lease the fleet's control plane grants; hosts heartbeat
// every second. It must outlast a host's drain: hostsdk's graceful HTTP
// shutdown waits up to 5 s for keep-alive connections that never carried
// a request (net/http treats them as active that long), heartbeats stop
// while draining, and a lease that expires before the signed offline makes
// the offline transition fail its sequence fence.
const leaseTTL = 10 * time.Second

// Fleet constants: the fleet is realfleet's (control plane and dispatcher
// processes on PostgreSQL) with echo hosts as its replicas.
const (
	trustDomain = realfleet.TrustDomain
	tenantID    = realfleet.TenantID
	issuerName  = realfleet.IssuerName
	capSay      = echoconnector.CapSay
	capStream   = echoconnector.CapStream
	// sideEffects is echo's state namespace (examples/echo).
	sideEffects = "echo.side_effects"
	// echoPackage is the echo host's main package, built once per run.
	echoPackage = "github.com/aipfleet/aipfleet/examples/echo"
	// logTail is how many lines of each process's log a failed test shows.
	logTail = 30
)

// process is a running binary (sidecartest's).
type process = sidecartest.Process

// startProcess starts bin as name with env added; it dies with the test
// binary and shows the tail of its log when the test fails.
func startProcess(t testing.TB, name, bin string, env []string, args ...string) *process {
	t.Helper()
	return sidecartest.StartWith(t, bin, sidecartest.StartOptions{Name: name, Env: env, KillWithTest: true, LogTail: logTail}, args...)
}

// waitFor polls cond until it holds, failing if one of procs exits or a
// minute passes.
func waitFor(t testing.TB, what string, procs []*process, cond func() bool) {
	t.Helper()
	sidecartest.WaitUntil(t, what, procs, cond)
}

func httpOK(url string) bool {
	resp, err := http.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// boundEchoManifest is the echo connector's manifest bound to trustDomain
// exactly as its host binds it at bootstrap (hostsdk.BindManifest): what
// the registry admits, and what every echo replica then registers.
func boundEchoManifest(t testing.TB) aip.Manifest {
	t.Helper()
	src, err := echoconnector.Connector{}.Manifest(context.Background(), hostsdk.TenantContext{TenantID: tenantID, TrustDomain: trustDomain})
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := hostsdk.BindManifest(src, trustDomain)
	if err != nil {
		t.Fatal(err)
	}
	return *m
}

// fleetOptions tune a fleet.
type fleetOptions struct {
	replicas     int
	hostInFlight int
	dispatchArgs []string
	logLevel     string
	// databaseURL maps the database URL each central process connects
	// with (realfleet.Options.DatabaseURL).
	databaseURL func(process, url string) string
}

// fleet is a running realfleet (registry owned by the test through the
// control pool, control plane, dispatcher) with echo replicas.
type fleet struct {
	t   testing.TB
	ctx context.Context
	opt fleetOptions
	rf  *realfleet.Fleet

	reg     *pgregistry.Registry
	echoBin string
	// cp is the control plane's current process (startControlPlane
	// replaces it).
	cp, disp *process
	apiURL   string
	client   *http.Client

	mu       sync.Mutex
	replicas []*replica // every replica ever started, in order
}

// replica is one echo host identity.
type replica struct {
	id, addr, stateDir string
	// env configures the host as this replica (same identity and state on
	// every start).
	env  []string
	proc *process
}

func startFleet(t testing.TB, opt fleetOptions) *fleet {
	t.Helper()
	if opt.hostInFlight == 0 {
		opt.hostInFlight = 64
	}
	if opt.logLevel == "" {
		opt.logLevel = "info"
	}
	f := &fleet{t: t, ctx: context.Background(), opt: opt}
	// realfleet skips the test (before building anything) without a test
	// database.
	f.rf = realfleet.StartWith(t, realfleet.Options{LeaseTTL: leaseTTL, LogLevel: opt.logLevel, DispatchArgs: opt.dispatchArgs,
		MaxInFlight: opt.hostInFlight, LogTail: logTail, DatabaseURL: opt.databaseURL})
	f.echoBin = sidecartest.Build(t, echoPackage)
	manifest := boundEchoManifest(t)
	// The connector type, echo's version, the tenant's instance and a
	// binding for echo.say and echo.stream.
	f.rf.Admit(t, &manifest)
	f.reg, f.cp, f.disp, f.apiURL = f.rf.Registry(), f.rf.ControlPlane(), f.rf.Dispatcher(), f.rf.APIURL()
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}}
	t.Cleanup(f.client.CloseIdleConnections)

	for range opt.replicas {
		f.addReplica()
	}
	return f
}

// startDispatcher restarts, on the same address and key, the dispatcher
// the test stopped or killed, and waits until it is ready.
func (f *fleet) startDispatcher() {
	f.t.Helper()
	f.rf.StartDispatcher(f.t)
	f.disp = f.rf.Dispatcher()
}

// startControlPlane restarts, on the same address and key, the control
// plane the test stopped, and waits until it is ready.
func (f *fleet) startControlPlane() {
	f.t.Helper()
	f.rf.StartControlPlane(f.t)
	f.cp = f.rf.ControlPlane()
}

// addReplica pre-provisions a new replica identity, starts its host and
// waits until the registry has it ready.
func (f *fleet) addReplica() *replica {
	t := f.t
	t.Helper()
	r := f.newReplica(f.rf.NewReplica(t, replicaOptions))
	f.startHost(r)
	return r
}

// replicaOptions are every echo host's heartbeat and lease.
var replicaOptions = sidecartest.ReplicaOptions{HeartbeatInterval: time.Second, LeaseTTL: leaseTTL}

// newReplica makes sr, an identity the test provisions, one of the
// fleet's replicas (audit reads its journal) without starting its host.
func (f *fleet) newReplica(sr *sidecartest.Replica) *replica {
	r := &replica{id: sr.ID, addr: strings.TrimPrefix(sr.Base, "http://"), stateDir: filepath.Join(sr.Dir, "state"),
		env: append(append([]string(nil), sr.Env...), "AIP_CONNECTOR_HOST_DRAIN_TIMEOUT_MS=15000", "AIP_ECHO_LOG_LEVEL="+f.opt.logLevel)}
	f.mu.Lock()
	f.replicas = append(f.replicas, r)
	f.mu.Unlock()
	return r
}

// startHost starts (or restarts, on the same identity and state) a
// replica's echo process and waits until the registry has it ready and
// the host serves (its /ready answers 200: the registry commits the
// registration before the host has its answer, and /ready answers 503
// until then).
func (f *fleet) startHost(r *replica) {
	t := f.t
	t.Helper()
	r.proc = startProcess(t, "echo "+r.id, f.echoBin, r.env)
	waitFor(t, "replica "+r.id+" to be ready", []*process{r.proc, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && rep.Status == aip.ReplicaReady && rep.LeaseValid(time.Now()) && hostReady(r)
	})
}

func (f *fleet) replicaList() []*replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*replica(nil), f.replicas...)
}

// runningReplicas returns the replicas whose host process has not exited.
func (f *fleet) runningReplicas() []*replica {
	var out []*replica
	for _, r := range f.replicaList() {
		if !r.proc.Exited() {
			out = append(out, r)
		}
	}
	return out
}

// token mints a bearer token for tenant.
func (f *fleet) token(tenant string) string {
	f.t.Helper()
	return f.rf.Token(f.t, tenant)
}

// post sends raw as POST path with the bearer token (none when "").
func (f *fleet) post(ctx context.Context, path, token string, raw []byte) (int, []byte, error) {
	status, _, body, err := f.postH(ctx, path, token, raw)
	return status, body, err
}

// postH is post that also returns the answer's header.
func (f *fleet) postH(ctx context.Context, path, token string, raw []byte) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, f.apiURL+path, bytes.NewReader(raw))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body, err
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
	status, _, resp, err := f.sendH(ctx, token, actionID, message, extra)
	return status, resp, err
}

// sendH is send that also returns the answer's header.
func (f *fleet) sendH(ctx context.Context, token, actionID, message, extra string) (int, http.Header, dispatch.ActionResponse, error) {
	raw := fmt.Sprintf(`{"capability_id":%q,"input":{"message":%q%s}`, capSay, message, extra)
	if actionID != "" {
		raw += fmt.Sprintf(`,"action_id":%q`, actionID)
	}
	raw += "}"
	status, header, body, err := f.postH(ctx, dispatch.PathActions, token, []byte(raw))
	if err != nil {
		return 0, nil, dispatch.ActionResponse{}, err
	}
	var resp dispatch.ActionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		return status, header, resp, fmt.Errorf("answer %d is not an action response: %s", status, body)
	}
	return status, header, resp, nil
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
		if r.proc != nil && !r.proc.Exited() {
			if err := r.proc.Term(f.t); err != nil {
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
		if r.proc != nil && !r.proc.Exited() {
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
