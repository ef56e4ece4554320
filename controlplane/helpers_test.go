package controlplane_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// backend is one registry backend under the service: the contracts tests
// use to provision and inspect, and the store the service runs on.
type backend struct {
	registrytest.Backend
	Store controlplane.Store
	// reopen returns a new store over the same state (a control-plane
	// restart); nil when the backend cannot.
	reopen func(t *testing.T) controlplane.Store
	// dbURL is the PostgreSQL database of a pgregistry backend ("" for
	// the in-memory one).
	dbURL string
}

// newBackendFunc builds a fresh backend on clock.
type newBackendFunc func(t *testing.T, clock *registrytest.Clock) backend

// backends lists the registry backends every scenario runs against.
var backends = []struct {
	name string
	new  newBackendFunc
}{
	{"memregistry", newMemBackend},
	{"pgregistry", newPGBackend},
}

// forEachBackend runs scenario once per backend.
func forEachBackend(t *testing.T, scenario func(t *testing.T, nb newBackendFunc)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) { scenario(t, b.new) })
	}
}

func newMemBackend(t *testing.T, clock *registrytest.Clock) backend {
	t.Helper()
	r, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return backend{
		Backend: registrytest.Backend{Catalog: r, Resolver: r, Admin: r, Fleet: r, Lifecycle: r},
		Store:   r,
		// The in-memory registry is the process's state: a restarted
		// service gets the same registry again.
		reopen: func(*testing.T) controlplane.Store { return r },
	}
}

// env is one scenario's world: a backend, the lifecycle world's records,
// and a running service on a loopback HTTP server.
type env struct {
	t       *testing.T
	ctx     context.Context
	clock   *registrytest.Clock
	b       backend
	w       *registrytest.LifecycleWorld
	key     *aip.SigningKey
	svc     *controlplane.Service
	srv     *httptest.Server
	stopSvc func()
}

// controlKey is the service's signing key in every test.
var controlKey = registrytest.Key("control-plane")

func newEnv(t *testing.T, nb newBackendFunc, mods ...func(*controlplane.Config)) *env {
	t.Helper()
	return newWrappedEnv(t, nb, nil, mods...)
}

// newWrappedEnv is newEnv whose service uses wrap(the backend's store) (a
// test double around it) when wrap is not nil.
func newWrappedEnv(t *testing.T, nb newBackendFunc, wrap func(controlplane.Store) controlplane.Store, mods ...func(*controlplane.Config)) *env {
	t.Helper()
	clock := registrytest.NewClock(registrytest.Epoch)
	e := &env{t: t, ctx: t.Context(), clock: clock, b: nb(t, clock), key: controlKey}
	if wrap != nil {
		e.b.Store = wrap(e.b.Store)
	}
	w, err := registrytest.NewLifecycleWorld(e.ctx, e.b.Admin)
	if err != nil {
		t.Fatal(err)
	}
	e.w = w
	e.start(e.b.Store, mods...)
	return e
}

// runService runs svc.Run and returns once it has started. The returned
// stop cancels Run, waits for it and reports its error on tb; it is
// idempotent and also runs when the test ends.
func runService(tb testing.TB, svc *controlplane.Service) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("Run: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	<-svc.Started()
	return stop
}

// with returns the environment bound to a subtest: same service and
// registry, failures reported to t.
func (e *env) with(t *testing.T) *env {
	c := *e
	c.t = t
	return &c
}

// start runs a service on store behind a loopback server.
func (e *env) start(store controlplane.Store, mods ...func(*controlplane.Config)) {
	e.t.Helper()
	cfg := controlplane.Config{Now: e.clock.Now, DisableMaintenance: true}
	for _, m := range mods {
		m(&cfg)
	}
	svc, err := controlplane.New(e.key, store, cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	stopRun := runService(e.t, svc)
	srv := httptest.NewServer(svc.Handler())
	var once sync.Once
	e.svc, e.srv = svc, srv
	e.stopSvc = func() {
		once.Do(func() {
			srv.Close()
			stopRun()
		})
	}
	e.t.Cleanup(e.stopSvc)
}

// restart stops the service and starts a new one with the same key on a
// reopened store (a control-plane restart between request and retry).
func (e *env) restart() {
	e.t.Helper()
	if e.b.reopen == nil {
		e.t.Fatal("the backend cannot be reopened")
	}
	e.stopSvc()
	e.start(e.b.reopen(e.t))
}

// provision pre-provisions crepl_<name> (offline, capacity 4, DID of
// registrytest.Key(id)) and returns its host.
func (e *env) provision(name string, mods ...func(*registry.ConnectorReplica)) *host {
	e.t.Helper()
	r := e.w.ProvisionedReplica("crepl_"+name, e.clock.Now())
	for _, m := range mods {
		m(&r)
	}
	if err := e.b.Admin.PutReplica(e.ctx, r); err != nil {
		e.t.Fatal(err)
	}
	return &host{e: e, rep: r, key: registrytest.Key(r.ID)}
}

func (e *env) replica(id string) registry.ConnectorReplica {
	e.t.Helper()
	r, err := e.b.Admin.ConnectorReplica(e.ctx, id)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// host is a test host of one replica: it builds, signs and sends lifecycle
// requests with the replica's key and verifies answers against the pinned
// control-plane DID.
type host struct {
	e   *env
	rep registry.ConnectorReplica
	key *aip.SigningKey
}

func (h *host) registration(mods ...func(*aip.Registration)) aip.ControlCommand {
	reg := h.e.w.Registration(&h.rep)
	for _, m := range mods {
		m(&reg)
	}
	return aip.RegisterCommand(reg)
}

func (h *host) heartbeat(prev uint64, inFlight uint32, ready bool) aip.ControlCommand {
	return aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: h.rep.ID, PreviousSequence: prev, InFlight: inFlight, ConnectorReady: ready})
}

func (h *host) transition(op aip.Operation, prev uint64) aip.ControlCommand {
	return aip.TransitionCommand(op, aip.Transition{ReplicaID: h.rep.ID, PreviousSequence: prev})
}

// request returns a fresh request for cmd issued now by this host.
func (h *host) request(cmd aip.ControlCommand) *aip.ControlRequest {
	return aip.NewControlRequest(h.e.clock.Now(), h.key.DID(), cmd)
}

// seal signs req with the host key.
func (h *host) seal(req *aip.ControlRequest) []byte {
	h.e.t.Helper()
	return sealWith(h.e.t, h.key, req)
}

func sealWith(t testing.TB, key *aip.SigningKey, req *aip.ControlRequest) []byte {
	t.Helper()
	body, err := aip.Seal(key, aip.SignedRequestField, req)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// reply is a verified answer.
type reply struct {
	status  int
	outcome aip.ControlOutcome
	resp    *aip.ControlResponse
}

// send seals and posts a fresh request for cmd.
func (h *host) send(cmd aip.ControlCommand) (reply, []byte) {
	h.e.t.Helper()
	req := h.request(cmd)
	body := h.seal(req)
	return h.e.post(body, req.RequestID), body
}

// post sends a raw body and verifies the signed answer to requestID.
func (e *env) post(body []byte, requestID string) reply {
	e.t.Helper()
	r, err := e.tryPost(body, requestID)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

func (e *env) tryPost(body []byte, requestID string) (reply, error) {
	resp, err := http.Post(e.srv.URL+controlplane.PathControl, "application/json", bytes.NewReader(body))
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, aip.MaxControlBytes+1))
	if err != nil {
		return reply{}, err
	}
	cr, err := aip.OpenControlResponse(raw, e.key.DID(), e.key.PublicKey(), requestID, e.clock.Now())
	if err != nil {
		return reply{}, errors.Join(err, errors.New("body: "+string(raw)))
	}
	return reply{status: resp.StatusCode, outcome: cr.Outcome, resp: cr}, nil
}

// lease requires a 200 lease answer and returns it.
func (r reply) lease(t *testing.T) aip.Lease {
	t.Helper()
	if r.status != http.StatusOK || r.outcome.Status != aip.OutcomeLease || r.outcome.Lease == nil {
		t.Fatalf("HTTP %d %+v, want 200 with a lease", r.status, r.outcome)
	}
	return *r.outcome.Lease
}

// wantLease requires a 200 lease with the sequence, expiring ttl after now.
func (r reply) wantLease(t *testing.T, seq uint64, expires time.Time) aip.Lease {
	t.Helper()
	l := r.lease(t)
	if l.Sequence != seq || !l.ExpiresAt.Equal(aip.At(expires).Time) {
		t.Fatalf("lease %d until %s, want %d until %s", l.Sequence, l.ExpiresAt, seq, aip.At(expires))
	}
	return l
}

// rejected requires a signed rejection with the HTTP status, code,
// retryability and a message containing want.
func (r reply) rejected(t *testing.T, status int, want string) {
	t.Helper()
	o := r.outcome
	code, retryable := aip.CodeControlRejected, false
	if status == http.StatusServiceUnavailable {
		code, retryable = aip.CodeControlUnavailable, true
	}
	if r.status != status || o.Status != aip.OutcomeRejected || o.Code != code || o.Retryable != retryable {
		t.Fatalf("HTTP %d %+v, want %d %s retryable=%v", r.status, o, status, code, retryable)
	}
	if !strings.Contains(o.Message, want) {
		t.Fatalf("rejection message %q does not contain %q", o.Message, want)
	}
}

// faultyStore wraps a store and fails the next n ApplyLifecycle calls with
// a storage error, without calling the store.
type faultyStore struct {
	controlplane.Store
	mu    sync.Mutex
	fails int
	calls int
	// hold, when set, makes ApplyLifecycle signal entered and wait for
	// hold to close before it applies.
	hold, entered chan struct{}
}

func (f *faultyStore) failNext(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fails = n
}

func (f *faultyStore) ApplyLifecycle(ctx context.Context, cmds []registry.LifecycleCommand) ([]registry.LifecycleResult, error) {
	f.mu.Lock()
	f.calls++
	fail := f.fails > 0
	if fail {
		f.fails--
	}
	hold, entered := f.hold, f.entered
	f.mu.Unlock()
	if hold != nil {
		entered <- struct{}{}
		<-hold
	}
	if fail {
		return nil, errors.Join(registry.ErrStorage, errors.New("injected: connection reset"))
	}
	return f.Store.ApplyLifecycle(ctx, cmds)
}

// get fetches a path of the service and returns status and body.
func (e *env) get(path string) (int, string) {
	e.t.Helper()
	resp, err := http.Get(e.srv.URL + path)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
