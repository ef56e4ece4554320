// Package realfleet is a sidecartest.Fleet made of the real processes: the
// aipfleet control plane (`aipfleet control-plane`) and dispatcher
// (`aipfleet dispatch`), built once per test run, on a fresh PostgreSQL
// database per test. The test admits the connector version (with the
// manifest `aip-sidecar --print-manifest` describes), installs the tenant's
// instance and bindings through the registry's control pool, and sends
// actions through the dispatcher's HTTP API with a tenant token, as a
// client would. Lifecycle transitions are read from the control plane's
// log. A test changes the registry further as an operator does, with a
// fleet file and `aipfleet registry apply` (ApplyFleetFile), and makes
// replicas of other instances and versions with ReplicaOf.
//
// It lives apart from sidecartest because it depends on the registry and
// PostgreSQL, which the sidecar itself never does.
package realfleet

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// Fleet settings.
const (
	// LeaseTTL is the lease the control plane grants. It outlasts a
	// replica's drain (heartbeats stop while draining, and a lease that
	// expires before the signed offline fails its sequence fence).
	LeaseTTL = 8 * time.Second
	// HeartbeatInterval is the replicas' default heartbeat.
	HeartbeatInterval = time.Second
	// TrustDomain and TenantID of the fleet.
	TrustDomain = "sidecar.aipfleet.invalid"
	TenantID    = "tenant-sidecar"
	// GatewayPrincipalID is the principal `aipfleet dispatch` signs as.
	GatewayPrincipalID = "service:aipfleet-dispatch"
	// AipfleetPackage is the import path of the aipfleet command.
	AipfleetPackage = "github.com/aipfleet/aipfleet/cmd/aipfleet"

	// IssuerName is the token issuer the dispatcher trusts.
	IssuerName = "sidecartest"
	// MaxInFlight is the replicas' default capacity.
	MaxInFlight = 32

	secretRef = "secret://sidecartest"
)

// New returns the real fleet when a test database is configured
// (AIP_TEST_DATABASE_URL, see internal/pgtest; with
// AIP_TEST_REQUIRE_DATABASE=1 a missing one fails the test). Without one it
// logs so and returns sidecartest's fake fleet, so the tests still run on a
// machine without PostgreSQL.
func New(t testing.TB) sidecartest.Fleet {
	t.Helper()
	if os.Getenv(pgtest.EnvDatabaseURL) == "" && !pgtest.Required() {
		t.Logf("realfleet: %s is not set; running against hostsdktest's fake control plane and dispatcher", pgtest.EnvDatabaseURL)
		return sidecartest.NewFakeFleet(t)
	}
	return Start(t)
}

// Options tune StartWith. Zero values mean the defaults.
type Options struct {
	// LeaseTTL is the lease the control plane grants and the replicas'
	// default (default LeaseTTL).
	LeaseTTL time.Duration
	// LogLevel is both processes' log level (default: debug for the
	// control plane, whose "lease renewed" lines Transitions reads, and
	// info for the dispatcher).
	LogLevel string
	// DispatchArgs are appended to `aipfleet dispatch`'s arguments.
	DispatchArgs []string
	// MaxInFlight is each replica's capacity in the registry and its
	// AIP_CONNECTOR_HOST_MAX_IN_FLIGHT (default MaxInFlight).
	MaxInFlight int
	// LogTail, when positive, prints only the last LogTail lines of each
	// process's log when the test failed (default: whole logs).
	LogTail int
	// DatabaseURL, when set, maps the test database's URL to the one a
	// process connects with (process is "control-plane" or "dispatch"),
	// for example through a proxy the test can cut. The registry the test
	// owns (Registry) always connects directly.
	DatabaseURL func(process, url string) string
}

// Fleet is a running control plane and dispatcher on their own database.
type Fleet struct {
	opt Options
	reg *pgregistry.Registry
	bin string
	// cps are the control plane's processes, the running one last.
	cps  []*sidecartest.Process
	disp *sidecartest.Process
	// dispArgs restart the dispatcher.
	dispArgs []string
	// cpDBFile, controlAddr and controlKeyFile restart the control plane.
	cpDBFile, controlAddr, controlKeyFile string
	// adminDBFile holds the test database's own URL, for aipfleet
	// registry apply (ApplyFleetFile); dir is the fleet's directory.
	adminDBFile, dir string

	controlKey *aip.SigningKey
	gatewayKey *aip.SigningKey
	issuerKey  *aip.SigningKey
	controlURL string
	apiURL     string
	client     *http.Client

	typeID, instanceID string
	version            *registry.ConnectorVersion
}

// Start starts the control plane and the dispatcher on a fresh database.
func Start(t testing.TB) *Fleet {
	t.Helper()
	return StartWith(t, Options{})
}

// StartWith starts the control plane and the dispatcher on a fresh
// database, tuned by opt.
func StartWith(t testing.TB, opt Options) *Fleet {
	t.Helper()
	if opt.LeaseTTL == 0 {
		opt.LeaseTTL = LeaseTTL
	}
	if opt.MaxInFlight == 0 {
		opt.MaxInFlight = MaxInFlight
	}
	dispatchLevel := "info"
	if opt.LogLevel != "" {
		dispatchLevel = opt.LogLevel
	}
	dbURL := pgtest.NewDatabase(t)
	ctx := context.Background()
	reg, err := pgregistry.Open(ctx, pgregistry.Config{ControlURL: dbURL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	dir := t.TempDir()
	f := &Fleet{opt: opt, reg: reg, typeID: aip.NewID(aip.PrefixType), instanceID: aip.NewID(aip.PrefixInstance)}
	dbFile := func(process string) string {
		u := dbURL
		if opt.DatabaseURL != nil {
			u = opt.DatabaseURL(process, dbURL)
		}
		p := filepath.Join(dir, process+"-db.url")
		if err := os.WriteFile(p, []byte(u), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	f.cpDBFile = dbFile("control-plane")
	f.dir, f.adminDBFile = dir, filepath.Join(dir, "admin-db.url")
	if err := os.WriteFile(f.adminDBFile, []byte(dbURL), 0o600); err != nil {
		t.Fatal(err)
	}
	dispDBFile := dbFile("dispatch")
	var gatewayKeyFile string
	f.controlKey, f.controlKeyFile = WriteKey(t, dir, "control.key")
	f.gatewayKey, gatewayKeyFile = WriteKey(t, dir, "gateway.key")
	f.issuerKey, _ = WriteKey(t, dir, "issuer.key")
	f.bin = sidecartest.Build(t, AipfleetPackage)

	f.controlAddr = sidecartest.FreeAddr(t)
	f.controlURL = "http://" + f.controlAddr
	f.StartControlPlane(t)

	apiAddr := sidecartest.FreeAddr(t)
	f.apiURL = "http://" + apiAddr
	f.dispArgs = append([]string{"dispatch", "--database-url-file", dispDBFile, "--signing-key-file", gatewayKeyFile,
		"--issuer", IssuerName + "=" + f.issuerKey.DID(), "--bind", apiAddr, "--allow-insecure-loopback-http",
		"--log-level", dispatchLevel}, opt.DispatchArgs...)
	f.StartDispatcher(t)
	f.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

// StartControlPlane starts the control plane on the fleet's address, key
// and database, and waits until it is ready. Start calls it; a test that
// stopped the control plane (ControlPlane().Term) calls it again to bring
// it back as the same service.
func (f *Fleet) StartControlPlane(t testing.TB) {
	t.Helper()
	if n := len(f.cps); n > 0 && !f.cps[n-1].Exited() {
		t.Fatal("realfleet: the control plane is still running")
	}
	level := "debug" // the control plane logs renewals too (Transitions)
	if f.opt.LogLevel != "" {
		level = f.opt.LogLevel
	}
	cp := sidecartest.StartWith(t, f.bin, sidecartest.StartOptions{Name: "control-plane", KillWithTest: true, LogTail: f.opt.LogTail},
		"control-plane", "--database-url-file", f.cpDBFile, "--signing-key-file", f.controlKeyFile, "--bind", f.controlAddr,
		"--allow-insecure-loopback-http", "--lease-ttl", f.opt.LeaseTTL.String(), "--log-level", level)
	f.cps = append(f.cps, cp)
	awaitOK(t, cp, f.controlURL+"/ready")
}

// StartDispatcher starts the dispatcher on the fleet's address, key and
// database, and waits until it is ready. StartWith calls it; a test that
// stopped or killed the dispatcher calls it again to bring it back.
func (f *Fleet) StartDispatcher(t testing.TB) {
	t.Helper()
	if f.disp != nil && !f.disp.Exited() {
		t.Fatal("realfleet: the dispatcher is still running")
	}
	f.disp = sidecartest.StartWith(t, f.bin, sidecartest.StartOptions{Name: "dispatch", KillWithTest: true, LogTail: f.opt.LogTail}, f.dispArgs...)
	awaitOK(t, f.disp, f.apiURL+dispatch.PathReady)
}

// ControlPlane returns the control plane's current process.
func (f *Fleet) ControlPlane() *sidecartest.Process { return f.cps[len(f.cps)-1] }

// Dispatcher returns the dispatcher's current process.
func (f *Fleet) Dispatcher() *sidecartest.Process { return f.disp }

// ControlURL is the control plane's origin (http://host:port).
func (f *Fleet) ControlURL() string { return f.controlURL }

// APIURL is the dispatcher's API origin (http://host:port).
func (f *Fleet) APIURL() string { return f.apiURL }

// Token mints a bearer token, valid for an hour, for tenant.
func (f *Fleet) Token(t testing.TB, tenant string) string {
	t.Helper()
	tok, err := f.tokenFor(tenant)
	must(t, err)
	return tok
}

// WriteKey writes a fresh signing key's seed file dir/name and returns the
// key and the file's path.
func WriteKey(t testing.TB, dir, name string) (*aip.SigningKey, string) {
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

// awaitOK polls url until 200, failing if the process exits.
func awaitOK(t testing.TB, p *sidecartest.Process, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := sidecartest.Client.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("%s did not come up:\n%s", url, p.Log())
		}
		time.Sleep(20 * time.Millisecond) // polling a process that is starting
	}
}

// Kind implements sidecartest.Fleet.
func (f *Fleet) Kind() string { return "real" }

// TrustDomain implements sidecartest.Fleet.
func (f *Fleet) TrustDomain() string { return TrustDomain }

// Registry returns the registry (control pool) the test owns.
func (f *Fleet) Registry() *pgregistry.Registry { return f.reg }

// Admit implements sidecartest.Fleet: the connector type, the version with
// m (full implementation claims), the tenant's enabled instance and a
// binding per invocable capability.
func (f *Fleet) Admit(t testing.TB, m *aip.Manifest) {
	t.Helper()
	ctx := context.Background()
	must(t, f.reg.PutConnectorType(ctx, registry.ConnectorType{ID: f.typeID, Name: "sidecar", Owner: "team-sidecar", Enabled: true}))
	v := registrytest.Version(aip.NewID(aip.PrefixVersion), f.typeID, "1.0.0", "team-sidecar", registry.VersionActive, *m)
	must(t, f.reg.AdmitVersion(ctx, v))
	f.version = &v
	must(t, f.reg.PutInstance(ctx, registry.ConnectorInstance{ID: f.instanceID, ConnectorTypeID: f.typeID, VersionID: v.ID,
		TenantID: TenantID, ConfigRevision: 1, SecretProviderRef: secretRef, Status: registry.InstanceEnabled}))
	for _, c := range m.Capabilities {
		if c.Kind == aip.KindResource {
			continue
		}
		must(t, f.reg.PutBinding(ctx, registry.CapabilityBinding{TenantID: TenantID, CapabilityID: c.ID, InstanceID: f.instanceID,
			PolicyRevision: 1, Enabled: true}))
	}
}

// NewReplica implements sidecartest.Fleet.
func (f *Fleet) NewReplica(t testing.TB, opts sidecartest.ReplicaOptions) *sidecartest.Replica {
	t.Helper()
	if f.version == nil {
		t.Fatal("realfleet: Admit the connector version before NewReplica")
	}
	r := f.ReplicaOf(t, f.instanceID, f.version, opts)
	must(t, f.reg.PutReplica(context.Background(), f.ReplicaRecord(r)))
	return r
}

// ReplicaOf returns a new replica identity of instance instanceID at
// version v — its ID, key, endpoint and host environment — without
// provisioning it: NewReplica provisions one of the admitted instance
// through the registry; a test that provisions replicas of another
// instance or version through a fleet file (ApplyFleetFile) puts
// ReplicaRecord of each in the file. The instance is the tenant's, of the
// fleet's connector type and secret reference.
func (f *Fleet) ReplicaOf(t testing.TB, instanceID string, v *registry.ConnectorVersion, opts sidecartest.ReplicaOptions) *sidecartest.Replica {
	t.Helper()
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = HeartbeatInterval
	}
	if opts.LeaseTTL == 0 {
		opts.LeaseTTL = f.opt.LeaseTTL
	}
	r := sidecartest.NewReplicaEnv(t, sidecartest.HostEnv{
		ControlEndpoint: f.controlURL + aip.ControlPath, ControlDID: f.controlKey.DID(),
		GatewayPrincipalID: GatewayPrincipalID, GatewayDID: f.gatewayKey.DID(),
		TypeID: v.ConnectorTypeID, VersionID: v.ID, InstanceID: instanceID, TenantID: TenantID, TrustDomain: TrustDomain,
		ArtifactDigest: v.Attestation.ArtifactDigest, SecretProviderRef: secretRef, MaxInFlight: f.opt.MaxInFlight,
		EventEndpoint: f.apiURL + aip.EventsPath,
	}, opts)
	m := v.Manifest
	r.ManifestDigest, r.AgentID, r.AgentKind = v.ManifestDigest, m.Agent.ID, m.Agent.Kind
	return r
}

// ReplicaRecord is the pre-provisioned registry record of r (offline,
// never registered), as NewReplica puts it and a fleet file declares it.
func (f *Fleet) ReplicaRecord(r *sidecartest.Replica) registry.ConnectorReplica {
	return registry.ConnectorReplica{
		ID: r.ID, InstanceID: r.InstanceID, VersionID: r.VersionID, Endpoint: r.Endpoint,
		PeerPrincipalID: r.AgentID, PeerPrincipalKind: r.AgentKind, PeerDID: r.Key.DID(),
		TrustDomain: TrustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaOffline, Capacity: uint32(f.opt.MaxInFlight),
	}
}

// TypeID is the connector type Admit created.
func (f *Fleet) TypeID() string { return f.typeID }

// InstanceID is the tenant's instance Admit created.
func (f *Fleet) InstanceID() string { return f.instanceID }

// Version returns the version Admit admitted (nil before Admit).
func (f *Fleet) Version() *registry.ConnectorVersion { return f.version }

// SecretProviderRef is the secret reference of the instance Admit
// created, for another instance of the tenant.
func (f *Fleet) SecretProviderRef() string { return secretRef }

// ApplyFleetFile applies ff as an operator does: it writes the file with
// registry.MarshalFleetFile and runs `aipfleet registry apply -f FILE` on
// the fleet's database (connected directly, whatever Options.DatabaseURL
// does), failing the test unless it exits 0. It returns the command's
// report.
func (f *Fleet) ApplyFleetFile(t testing.TB, ff *registry.FleetFile) string {
	t.Helper()
	raw, err := registry.MarshalFleetFile(ff)
	must(t, err)
	file, err := os.CreateTemp(f.dir, "fleet-*.yaml")
	must(t, err)
	_, err = file.Write(raw)
	must(t, errors.Join(err, file.Close()))
	p := sidecartest.StartWith(t, f.bin, sidecartest.StartOptions{Name: "registry apply", LogTail: f.opt.LogTail},
		"registry", "apply", "-f", file.Name(), "--database-url-file", f.adminDBFile)
	if err := p.Wait(t); err != nil {
		t.Fatalf("aipfleet registry apply -f %s: %v\n%s\n%s", file.Name(), err, p.Log(), raw)
	}
	return p.Stdout()
}

// Events implements sidecartest.Fleet: it pages through the tenant's event
// log with the dispatcher's GET /aip/v1/events.
func (f *Fleet) Events(t testing.TB) []aip.Event {
	t.Helper()
	var out []aip.Event
	for after := uint64(0); ; {
		var page dispatch.EventsResponse
		must(t, f.exchange(http.MethodGet, fmt.Sprintf("%s?after=%d", dispatch.PathEvents, after), nil, func(resp *http.Response) error {
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				return fmt.Errorf("GET %s: HTTP %d %s", dispatch.PathEvents, resp.StatusCode, b)
			}
			return json.NewDecoder(resp.Body).Decode(&page)
		}))
		for _, e := range page.Events {
			out = append(out, e.Event)
		}
		if !page.More {
			return out
		}
		after = page.NextAfter
	}
}

func (f *Fleet) token() (string, error) { return f.tokenFor(TenantID) }

func (f *Fleet) tokenFor(tenant string) (string, error) {
	now := time.Now()
	return tenanttoken.Mint(f.issuerKey, tenanttoken.Claims{Issuer: IssuerName, Audience: tenanttoken.DefaultAudience,
		TenantID: tenant, IssuedAt: now, Expiry: now.Add(time.Hour)})
}

// exchange sends one request to the dispatcher's API and reads the answer
// with read. It is safe from any goroutine.
func (f *Fleet) exchange(method, path string, body any, read func(*http.Response) error) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, f.apiURL+path, rd)
	if err != nil {
		return err
	}
	tok, err := f.token()
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := f.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return read(resp)
}

// answer reads an ActionResponse, or NDJSON stream lines ending in one.
func answer(resp *http.Response, a *sidecartest.Answer) error {
	a.HTTPStatus = resp.StatusCode
	var final dispatch.ActionResponse
	if strings.HasPrefix(resp.Header.Get("Content-Type"), dispatch.ContentTypeNDJSON) {
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 0, 64<<10), aip.MaxMessageBytes)
		var all bytes.Buffer
		for sc.Scan() {
			all.Write(sc.Bytes())
			all.WriteByte('\n')
			var line dispatch.StreamLine
			if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
				return fmt.Errorf("stream line %q: %w", sc.Bytes(), err)
			}
			if line.Chunk != nil {
				a.Chunks = append(a.Chunks, *line.Chunk)
			} else if line.ActionResponse != nil {
				final = *line.ActionResponse
			}
		}
		a.Raw = all.Bytes()
		if err := sc.Err(); err != nil {
			return err
		}
	} else {
		a.Raw, _ = io.ReadAll(resp.Body)
		if err := json.Unmarshal(a.Raw, &final); err != nil {
			return fmt.Errorf("HTTP %d answer is not an action response: %s", resp.StatusCode, a.Raw)
		}
	}
	a.Result, a.Error = final.Result, final.Error
	a.OutcomeUnknown = final.Settlement == registry.SettlementOutcomeUnknown ||
		(a.Error != nil && a.Error.Code == dispatch.CodeOutcomeUnknown)
	return nil
}

// Act implements sidecartest.Fleet: POST /aip/v1/actions.
func (f *Fleet) Act(t testing.TB, r *sidecartest.Replica, a *aip.Action) *sidecartest.Answer {
	out := &sidecartest.Answer{}
	out.Err = f.exchange(http.MethodPost, dispatch.PathActions, dispatch.ActionRequest{
		ActionID: a.ID, CapabilityID: a.CapabilityID, Input: a.Input, Mode: a.Mode, IdempotencyKey: a.IdempotencyKey, TimeoutMS: a.TimeoutMS,
	}, func(resp *http.Response) error { return answer(resp, out) })
	return out
}

// Cancel implements sidecartest.Fleet: POST /aip/v1/actions/{id}/cancel.
func (f *Fleet) Cancel(t testing.TB, r *sidecartest.Replica, actionID, capabilityID, reason string) *sidecartest.Answer {
	out := &sidecartest.Answer{}
	out.Err = f.exchange(http.MethodPost, dispatch.PathActions+"/"+actionID+"/cancel", dispatch.CancelRequest{Reason: reason},
		func(resp *http.Response) error { return answer(resp, out) })
	return out
}

// State implements sidecartest.Fleet: GET /aip/v1/actions/{id}, which asks
// the pinned replica.
func (f *Fleet) State(t testing.TB, r *sidecartest.Replica, actionID, capabilityID string) aip.ActionState {
	t.Helper()
	state := aip.StateNotFound
	err := f.exchange(http.MethodGet, dispatch.PathActions+"/"+actionID, nil, func(resp *http.Response) error {
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusNotFound {
			return nil // not routed yet
		}
		var st dispatch.ActionStatusResponse
		if err := json.Unmarshal(raw, &st); err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("action status: HTTP %d %s", resp.StatusCode, raw)
		}
		if st.Replica.Reachable {
			state = st.Replica.State
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// Transitions implements sidecartest.Fleet from the control plane's log:
// "lifecycle transition" lines (register, drain, offline, and heartbeats
// that did not renew — the replica reported not ready) and "lease renewed"
// (healthy heartbeats).
func (f *Fleet) Transitions(t testing.TB) []sidecartest.Transition {
	var out []sidecartest.Transition
	var records []map[string]any
	for _, cp := range f.cps {
		records = append(records, cp.Records()...)
	}
	for _, rec := range records {
		msg, _ := rec["msg"].(string)
		if msg != "lifecycle transition" && msg != "lease renewed" {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(rec["time"]))
		if err != nil {
			t.Fatalf("control plane log time %v: %v", rec["time"], err)
		}
		op := aip.Operation(fmt.Sprint(rec["operation"]))
		out = append(out, sidecartest.Transition{At: at, Op: op, ReplicaID: fmt.Sprint(rec["replica_id"]),
			ConnectorReady: op != aip.OpHeartbeat || msg == "lease renewed"})
	}
	return out
}

// AwaitRestartable implements sidecartest.Fleet: lease maintenance takes a
// killed replica offline once its lease expires.
func (f *Fleet) AwaitRestartable(t testing.TB, r *sidecartest.Replica) {
	t.Helper()
	deadline := time.Now().Add(f.opt.LeaseTTL + time.Minute)
	for {
		rep, err := f.reg.ConnectorReplica(context.Background(), r.ID)
		if err == nil && rep.Status == aip.ReplicaOffline && !rep.LeaseValid(time.Now()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s is still %s with a lease until %s", r.ID, rep.Status, rep.LeaseExpiresAt)
		}
		time.Sleep(50 * time.Millisecond) // polling lease maintenance
	}
}

// ReplicaStatus returns the registry's view of a replica.
func (f *Fleet) ReplicaStatus(t testing.TB, id string) registry.ConnectorReplica {
	t.Helper()
	rep, err := f.reg.ConnectorReplica(context.Background(), id)
	must(t, err)
	return rep
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

var _ sidecartest.Fleet = (*Fleet)(nil)
