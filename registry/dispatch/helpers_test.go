package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Capabilities of the test connector.
const (
	capSay    = "fleet.say"
	capStream = "fleet.stream"
	tenant    = hostsdktest.TenantID
	gatewayID = "service:aipfleet-dispatch"
	issuer    = "test-issuer"
)

// counter is the test connector: it counts one side effect per action ID
// (across every replica that shares it), after an optional cancellable
// delay, then holds for hold_ms.
type counter struct {
	mu      sync.Mutex
	effects map[string][]string // action ID -> replica IDs that ran it
}

func newCounter() *counter { return &counter{effects: map[string][]string{}} }

// runs returns the replicas that ran an action.
func (c *counter) runs(actionID string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.effects[actionID]...)
}

// replicaConnector is one replica's view of the shared counter.
type replicaConnector struct {
	c       *counter
	replica string
}

type testInput struct {
	Text    string `json:"text"`
	DelayMS int64  `json:"delay_ms"`
	HoldMS  int64  `json:"hold_ms"`
	Chunks  int    `json:"chunks"`
	// ChunkPad is the size of a padding string each chunk carries.
	ChunkPad int `json:"chunk_pad"`
}

func testManifest() *aip.Manifest {
	say := registrytest.Capability(capSay, "says text back")
	stream := registrytest.Capability(capStream, "says text back in chunks")
	stream.Contract.Execution.SupportsStreaming = true
	stream.Contract.Execution.ExpectedCompletion = aip.CompletionStreaming
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:dispatch-test", Kind: aip.PrincipalAgent},
		Capabilities:    []aip.Capability{say, stream},
		Profiles:        []string{aip.NativeHTTPProfile},
	}
}

func (rc replicaConnector) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	return testManifest(), nil
}

func (rc replicaConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return rc.run(ctx, call, nil)
}

func (rc replicaConnector) HandleStream(ctx context.Context, call *hostsdk.Call, w *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	return rc.run(ctx, call, w)
}

func (rc replicaConnector) run(ctx context.Context, call *hostsdk.Call, w *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	var in testInput
	if err := json.Unmarshal(call.Action.Input, &in); err != nil {
		return nil, aip.NewProtocolError("test.input", aip.CategoryPermanent, false, 0, err.Error())
	}
	for i := range in.Chunks {
		if w == nil {
			break
		}
		data := map[string]any{"index": i}
		if in.ChunkPad > 0 {
			data["pad"] = strings.Repeat("p", in.ChunkPad)
		}
		if err := w.Send(aip.ChunkProgress, data); err != nil {
			return nil, err
		}
	}
	if in.DelayMS > 0 {
		t := time.NewTimer(time.Duration(in.DelayMS) * time.Millisecond)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	rc.c.mu.Lock()
	rc.c.effects[call.Action.ID] = append(rc.c.effects[call.Action.ID], rc.replica)
	n := len(rc.c.effects[call.Action.ID])
	rc.c.mu.Unlock()
	if in.HoldMS > 0 {
		time.Sleep(time.Duration(in.HoldMS) * time.Millisecond) // a slow provider answer, after the effect
	}
	return call.Complete(map[string]any{"text": in.Text, "side_effects": n, "replica": rc.replica})
}

// world is a fleet in one process: a memregistry with one type, version and
// instance of tenant-test, real hostsdk replicas of the test connector, and
// a dispatcher serving its API on httptest.
type world struct {
	t       testing.TB
	ctx     context.Context
	reg     *memregistry.Registry
	cp      *hostsdktest.ControlPlane
	fake    *hostsdktest.Dispatcher // carries the gateway identity for host configs
	key     *aip.SigningKey
	issuer  *aip.SigningKey
	counter *counter
	tp      trace.TracerProvider

	typeID, versionID, instanceID string
	version                       registry.ConnectorVersion
	hosts                         map[string]*replicaHost

	d   *dispatch.Dispatcher
	srv *httptest.Server
	api *http.Client
}

type replicaHost struct {
	cfg  hostsdk.Config
	host *hostsdk.Host
}

type worldOptions struct {
	tracer trace.TracerProvider
	cfg    func(*dispatch.Config)
	// resolver, when set, wraps the registry as the dispatcher's resolver.
	resolver func(*memregistry.Registry) registry.Resolver
	// orphans, when set, wraps the registry as the dispatcher's
	// Deps.Reservations.
	orphans func(*memregistry.Registry) dispatch.Orphans
	// regNow, when set, is the registry's clock.
	regNow func() time.Time
	// client, when set, is the dispatcher's Deps.Client.
	client *http.Client
	// rerouter, when set, wraps the registry as the dispatcher's
	// Deps.Rerouter.
	rerouter func(*memregistry.Registry) registry.Rerouter
}

func newWorld(t testing.TB, opts worldOptions) *world {
	t.Helper()
	key, _ := aip.GenerateSigningKey()
	iss, _ := aip.GenerateSigningKey()
	w := &world{
		t: t, ctx: t.Context(), key: key, issuer: iss, counter: newCounter(), tp: opts.tracer,
		cp:     hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{LeaseTTL: 5 * time.Minute}),
		typeID: aip.NewID(aip.PrefixType), versionID: aip.NewID(aip.PrefixVersion), instanceID: aip.NewID(aip.PrefixInstance),
		hosts: map[string]*replicaHost{},
	}
	w.fake = hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{PrincipalID: gatewayID, TrustDomain: hostsdktest.TrustDomain, Key: key})
	reg, err := memregistry.New(memregistry.Config{Now: opts.regNow})
	if err != nil {
		t.Fatal(err)
	}
	w.reg = reg
	w.catalog()
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: issuer, DIDs: []string{iss.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := dispatch.Config{SigningKey: key, PrincipalID: gatewayID, TracerProvider: opts.tracer}
	if opts.cfg != nil {
		opts.cfg(&cfg)
	}
	var resolver registry.Resolver = reg
	if opts.resolver != nil {
		resolver = opts.resolver(reg)
	}
	var orphans dispatch.Orphans = reg
	if opts.orphans != nil {
		orphans = opts.orphans(reg)
	}
	var rerouter registry.Rerouter = reg
	if opts.rerouter != nil {
		rerouter = opts.rerouter(reg)
	}
	d, err := dispatch.New(cfg, dispatch.Deps{Resolver: resolver, Catalog: reg, Rerouter: rerouter, Tokens: verifier, Reservations: orphans, Client: opts.client})
	if err != nil {
		t.Fatal(err)
	}
	w.d = d
	w.srv = httptest.NewServer(d.Handler())
	w.api = w.srv.Client()
	t.Cleanup(func() {
		w.srv.Close()
		d.Close()
	})
	return w
}

// catalog admits the test connector's version (its manifest bound to the
// trust domain, as every host binds it) and the tenant's instance and
// bindings.
func (w *world) catalog() {
	t := w.t
	m := *testManifest()
	m.Agent.TrustDomain = hostsdktest.TrustDomain
	must(t, w.reg.PutConnectorType(w.ctx, registry.ConnectorType{ID: w.typeID, Name: "test", Owner: "owner-test", Enabled: true}))
	w.version = registrytest.Version(w.versionID, w.typeID, "1.0.0", "owner-test", registry.VersionActive, m)
	must(t, w.reg.AdmitVersion(w.ctx, w.version))
	must(t, w.reg.PutInstance(w.ctx, registry.ConnectorInstance{ID: w.instanceID, ConnectorTypeID: w.typeID, VersionID: w.versionID,
		TenantID: tenant, ConfigRevision: 1, SecretProviderRef: "secret://test", Status: registry.InstanceEnabled}))
	for _, c := range []string{capSay, capStream} {
		must(t, w.reg.PutBinding(w.ctx, registry.CapabilityBinding{TenantID: tenant, CapabilityID: c, InstanceID: w.instanceID, PolicyRevision: 1, Enabled: true}))
	}
}

// startHost starts a replica of the test connector and records it ready in
// the registry with capacity regCapacity.
func (w *world) startHost(maxInFlight int, regCapacity uint32) *replicaHost {
	w.t.Helper()
	return w.startHostWith(maxInFlight, regCapacity, nil)
}

// startHostWith is startHost with edit applied to the host's configuration
// (nil: none).
func (w *world) startHostWith(maxInFlight int, regCapacity uint32, edit func(*hostsdk.Config)) *replicaHost {
	t := w.t
	t.Helper()
	cfg := hostsdktest.HostConfig(t, w.cp, w.fake, nil)
	cfg.ConnectorTypeID, cfg.VersionID, cfg.InstanceID = w.typeID, w.versionID, w.instanceID
	cfg.MaxInFlight = maxInFlight
	cfg.DrainTimeout = 30 * time.Second
	cfg.TracerProvider = w.tp
	if edit != nil {
		edit(&cfg)
	}
	w.cp.Provision(hostsdktest.ReplicaSpec{ID: cfg.ReplicaID, DID: cfg.SigningKey.DID(), InstanceID: cfg.InstanceID,
		VersionID: cfg.VersionID, Endpoint: cfg.PublicEndpoint, TenantID: cfg.TenantID, ArtifactDigest: cfg.ArtifactDigest})
	h := hostsdktest.StartHost(t, cfg, replicaConnector{c: w.counter, replica: cfg.ReplicaID})
	if h.ManifestDigest() != w.version.ManifestDigest {
		t.Fatalf("host manifest digest %s, registry %s", h.ManifestDigest(), w.version.ManifestDigest)
	}
	p := h.Principal()
	must(t, w.reg.PutReplica(w.ctx, registry.ConnectorReplica{
		ID: cfg.ReplicaID, InstanceID: w.instanceID, VersionID: w.versionID, Endpoint: cfg.PublicEndpoint,
		PeerPrincipalID: p.ID, PeerPrincipalKind: p.Kind, PeerDID: h.DID(), TrustDomain: hostsdktest.TrustDomain,
		TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
		LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: regCapacity, HealthRevision: 1,
	}))
	rh := &replicaHost{cfg: cfg, host: h}
	w.hosts[cfg.ReplicaID] = rh
	return rh
}

// fakeReplica records a replica whose endpoint is handler, signing with
// key, ready in the registry.
func (w *world) fakeReplica(id string, key *aip.SigningKey, handler http.Handler) string {
	t := w.t
	t.Helper()
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	must(t, w.reg.PutReplica(w.ctx, registry.ConnectorReplica{
		ID: id, InstanceID: w.instanceID, VersionID: w.versionID, Endpoint: srv.URL + aip.MessagesPath,
		PeerPrincipalID: "agent:dispatch-test", PeerPrincipalKind: aip.PrincipalAgent, PeerDID: key.DID(),
		TrustDomain: hostsdktest.TrustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaReady, LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 64, HealthRevision: 1,
	}))
	return id
}

// actionFavoring returns a fresh action ID whose new route prefers replica
// id among the equally loaded candidates.
func (w *world) actionFavoring(id string, candidates ...string) string {
	w.t.Helper()
	for range 1000 {
		act := aip.NewActionID()
		best := ""
		for _, c := range candidates {
			if best == "" || registry.RouteHash(act, c) < registry.RouteHash(act, best) {
				best = c
			}
		}
		if best == id {
			return act
		}
	}
	w.t.Fatal("no action ID favours " + id)
	return ""
}

// target is the hostsdktest target of a started host, to talk to it
// directly (bypassing the registry).
func (w *world) target(rh *replicaHost) hostsdktest.Target {
	return hostsdktest.TargetOf(rh.host, rh.cfg)
}

// token mints a token of the test issuer for tenant t.
func (w *world) token(t string) string {
	w.t.Helper()
	now := time.Now()
	tok, err := tenanttoken.Mint(w.issuer, tenanttoken.Claims{Issuer: issuer, Audience: tenanttoken.DefaultAudience, TenantID: t,
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	must(w.t, err)
	return tok
}

// call sends an API request as tenant (no token when tenant is "") and
// returns the status and body.
func (w *world) call(method, path, tenant string, body any) (int, []byte, http.Header) {
	w.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	case string:
		rd = strings.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		must(w.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(w.ctx, method, w.srv.URL+path, rd)
	must(w.t, err)
	if tenant != "" {
		req.Header.Set("Authorization", "Bearer "+w.token(tenant))
	}
	resp, err := w.api.Do(req)
	must(w.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	must(w.t, err)
	return resp.StatusCode, out, resp.Header
}

// act posts an action and decodes the answer.
func (w *world) act(req dispatch.ActionRequest) (int, dispatch.ActionResponse) {
	w.t.Helper()
	status, body, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, req)
	var resp dispatch.ActionResponse
	if err := json.Unmarshal(body, &resp); err != nil {
		w.t.Fatalf("answer %d is not an action response: %s", status, body)
	}
	return status, resp
}

func say(text string, extra string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"text":%q%s}`, text, extra))
}

// ledger checks that the registry holds no reservation and no counter.
func (w *world) idle() {
	w.t.Helper()
	l, err := w.reg.Ledger(w.ctx)
	must(w.t, err)
	registrytest.CheckLedger(w.t, l)
	if len(l.Reservations) != 0 {
		w.t.Fatalf("reservations left: %+v", l.Reservations)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// eventually polls cond until it holds or a deadline passes.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// mintWith mints a token of the test issuer with explicit times and
// audience ("" for the default).
func mintWith(w *world, t string, iat, exp time.Time, audience string) (string, error) {
	if audience == "" {
		audience = tenanttoken.DefaultAudience
	}
	return tenanttoken.Mint(w.issuer, tenanttoken.Claims{Issuer: issuer, Audience: audience, TenantID: t, IssuedAt: iat, Expiry: exp})
}

// mintKey mints a token that names the test issuer but is signed by key.
func mintKey(key *aip.SigningKey, t string) (string, error) {
	now := time.Now()
	return tenanttoken.Mint(key, tenanttoken.Claims{Issuer: issuer, Audience: tenanttoken.DefaultAudience, TenantID: t, IssuedAt: now, Expiry: now.Add(time.Hour)})
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }
