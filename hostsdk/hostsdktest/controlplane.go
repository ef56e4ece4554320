package hostsdktest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Fault is a failure the fake control plane injects into the next requests.
// A fault applies to the next request whatever it is (even a malformed
// one): FaultUnavailable, FaultReject and FaultUnsigned replace its answer
// without deciding it, FaultDropResponse decides it and then drops the
// answer.
type Fault int

// Faults.
const (
	// FaultUnavailable answers a signed retryable rejection (503
	// connector_control.unavailable) without applying the request: the
	// request ID is not consumed and a retry succeeds.
	FaultUnavailable Fault = iota + 1
	// FaultDropResponse applies the request, then drops the connection
	// without answering: the host sees a transport error and must replay the
	// same request to learn the committed outcome.
	FaultDropResponse
	// FaultReject answers a signed definitive rejection (403
	// connector_control.rejected) without applying the request.
	FaultReject
	// FaultUnsigned answers 502 with an unsigned body without applying.
	FaultUnsigned
)

func (f Fault) String() string {
	switch f {
	case FaultUnavailable:
		return "unavailable"
	case FaultDropResponse:
		return "drop_response"
	case FaultReject:
		return "reject"
	case FaultUnsigned:
		return "unsigned"
	}
	return ""
}

// ControlPlaneConfig configures a fake control plane. The zero value is
// usable.
type ControlPlaneConfig struct {
	// LeaseTTL is the lease the control plane grants, in
	// [registry.MinLeaseTTL, registry.MaxLeaseTTL] as for the real one.
	// Defaults to 30s.
	LeaseTTL time.Duration
	// Now is its clock. Defaults to time.Now (which testing/synctest fakes).
	Now func() time.Time
	// Key signs its responses. Defaults to a fresh key.
	Key *aip.SigningKey
	// InMemory skips the loopback HTTP server: hosts reach the control plane
	// through Transport() (for tests inside a testing/synctest bubble).
	InMemory bool
}

// Operation is one lifecycle request the control plane saw, whatever it
// answered.
type Operation struct {
	At               time.Time
	Op               aip.Operation
	RequestID        string
	Digest           string
	ReplicaID        string
	PreviousSequence uint64
	InFlight         uint32
	ConnectorReady   bool
	// Outcome is "lease", "offline" or "rejected" ("" when the response was
	// dropped before it was written).
	Outcome aip.OutcomeStatus
	// Sequence is the granted lease sequence (lease outcomes).
	Sequence uint64
	Code     string
	Message  string
	// Replayed is set when the request was a replay of the committed one.
	Replayed bool
	Fault    Fault
}

// ReplicaSpec pre-provisions a replica. Only ID and DID are required; the
// other claims are compared with the registration when set.
type ReplicaSpec struct {
	ID             string
	DID            string
	InstanceID     string
	VersionID      string
	Endpoint       string
	TenantID       string
	ManifestDigest string
	ArtifactDigest string
	ConfigRevision uint64
	Capacity       uint32
}

// ReplicaState is the registry view of a replica.
type ReplicaState struct {
	Status            aip.ReplicaStatus
	HealthRevision    uint64
	LeaseExpiresAt    time.Time
	LastRequestID     string
	LastRequestDigest string
	Capacity          uint32
	ActiveAssignments uint32
}

type replica struct {
	spec ReplicaSpec
	// rec is the replica as the registry stores it: the lifecycle rules
	// decide on it.
	rec registry.ConnectorReplica
	// state is rec's registry view, refreshed by sync.
	state ReplicaState
}

func (r *replica) sync() {
	r.state = ReplicaState{
		Status: r.rec.Status, HealthRevision: r.rec.HealthRevision, LeaseExpiresAt: r.rec.LeaseExpiresAt,
		LastRequestID: r.rec.LastControlRequestID, LastRequestDigest: r.rec.LastControlRequestDigest,
		Capacity: r.rec.Capacity, ActiveAssignments: r.rec.ActiveAssignments,
	}
}

// ControlPlane is an in-process fake of the lifecycle service
// (controlplane.Service) that answers as the real one does: the same
// processing order (body size and shape, freshness window, pre-provisioned
// replica, signer DID, signature, digest), the same signed answers (200
// lease or offline, 403 rejected, 413 too large, 503 unavailable; a
// malformed request gets a signed 403 too), and the registry's own
// lifecycle rules (registry.DecideLifecycle): replay of the exact committed
// request only while the replica is still in the state it set, request IDs
// consumed by rejections as well as by changes, the sequence fence, lease
// expiry (a heartbeat or drain on an expired lease is refused), in_flight
// bounded by capacity, an unready heartbeat taking the replica offline with
// its lease ended. What it does not model is the catalog: a registration is
// checked against the ReplicaSpec's claims where set, and whatever the spec
// leaves empty matches. On top of that it injects faults and records every
// operation.
type ControlPlane struct {
	t        testing.TB
	key      *aip.SigningKey
	ttl      time.Duration
	now      func() time.Time
	server   *httptest.Server
	mu       sync.Mutex
	replicas map[string]*replica
	claims   map[string]*registry.ReplayClaim // by request ID
	ops      []Operation
	faults   []Fault
	down     bool
	changed  chan struct{}
}

// NewControlPlane starts a fake control plane (on a loopback HTTP server
// unless cfg.InMemory) and stops it when the test ends.
func NewControlPlane(t testing.TB, cfg ControlPlaneConfig) *ControlPlane {
	t.Helper()
	key := cfg.Key
	if key == nil {
		var err error
		if key, err = aip.GenerateSigningKey(); err != nil {
			t.Fatal(err)
		}
	}
	cp := &ControlPlane{
		t: t, key: key, ttl: cfg.LeaseTTL, now: cfg.Now,
		replicas: map[string]*replica{}, claims: map[string]*registry.ReplayClaim{}, changed: make(chan struct{}),
	}
	if cp.ttl == 0 {
		cp.ttl = registry.DefaultLeaseTTL
	}
	if cp.ttl < registry.MinLeaseTTL || cp.ttl > registry.MaxLeaseTTL {
		t.Fatalf("hostsdktest: ControlPlaneConfig.LeaseTTL %s is outside %s..%s, the bounds of the real control plane", cp.ttl, registry.MinLeaseTTL, registry.MaxLeaseTTL)
	}
	if cp.now == nil {
		cp.now = time.Now
	}
	if !cfg.InMemory {
		cp.server = httptest.NewServer(cp.Handler())
		t.Cleanup(cp.server.Close)
	}
	return cp
}

// DID returns the did:key the control plane signs with (pin it in hosts).
func (cp *ControlPlane) DID() string { return cp.key.DID() }

// Endpoint returns the URL of /aip/v1/connector-control. For an in-memory
// control plane it is a placeholder loopback URL to use with Transport().
func (cp *ControlPlane) Endpoint() string {
	if cp.server == nil {
		return "http://127.0.0.1:9/aip/v1/connector-control"
	}
	return cp.server.URL + aip.ControlPath
}

// Handler returns the HTTP handler of POST /aip/v1/connector-control.
func (cp *ControlPlane) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+aip.ControlPath, cp.serve)
	return mux
}

// Transport returns a RoundTripper that hands requests to the handler in
// process (no network), for Config.ControlPlaneTransport.
func (cp *ControlPlane) Transport() http.RoundTripper { return handlerTransport{cp.Handler()} }

// Provision pre-provisions an offline replica.
func (cp *ControlPlane) Provision(spec ReplicaSpec) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if spec.Capacity == 0 {
		spec.Capacity = 1 << 16
	}
	r := &replica{spec: spec, rec: registry.ConnectorReplica{
		ID: spec.ID, InstanceID: spec.InstanceID, VersionID: spec.VersionID, Endpoint: spec.Endpoint,
		PeerDID: spec.DID, Status: aip.ReplicaOffline, Capacity: spec.Capacity,
	}}
	r.sync()
	cp.replicas[spec.ID] = r
}

// FailNext injects fault into the next n requests, in arrival order.
func (cp *ControlPlane) FailNext(n int, fault Fault) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for range n {
		cp.faults = append(cp.faults, fault)
	}
}

// SetUnavailable makes every request fail with FaultUnavailable while on
// (an outage), after any queued FailNext faults.
func (cp *ControlPlane) SetUnavailable(on bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	cp.down = on
}

// Operations returns the operations seen so far.
func (cp *ControlPlane) Operations() []Operation {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]Operation(nil), cp.ops...)
}

// Replica returns a replica's registry state.
func (cp *ControlPlane) Replica(id string) (ReplicaState, bool) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	r, ok := cp.replicas[id]
	if !ok {
		return ReplicaState{}, false
	}
	return r.state, true
}

// ExpireLease expires a live (ready or draining) replica's lease now, as
// the real maintenance loop does once a lease runs out
// (registry.ExpireReplica: status offline, lease ended, health revision
// raised by one, no active assignments, last request cleared). An offline
// replica is left as it is.
func (cp *ControlPlane) ExpireLease(id string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if r, ok := cp.replicas[id]; ok && r.rec.Status != aip.ReplicaOffline {
		registry.ExpireReplica(&r.rec, cp.now())
		r.sync()
	}
}

// Await blocks until pred holds for the recorded operations or ctx ends.
// pred gets a copy of them and runs without the control plane's lock, so
// it may call the control plane's other methods (Replica, Operations).
func (cp *ControlPlane) Await(ctx context.Context, pred func([]Operation) bool) error {
	for {
		cp.mu.Lock()
		ops, ch := append([]Operation(nil), cp.ops...), cp.changed
		cp.mu.Unlock()
		if pred(ops) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("hostsdktest: control plane operations did not reach the expected state: %w", ctx.Err())
		}
	}
}

func (cp *ControlPlane) record(op Operation) {
	cp.ops = append(cp.ops, op)
	close(cp.changed)
	cp.changed = make(chan struct{})
}

// answer is what the fake tells one lifecycle request.
type answer struct {
	status    int
	requestID string
	outcome   aip.ControlOutcome
}

func rejection(status int, format string, args ...any) *answer {
	return &answer{status: status, outcome: aip.RejectedOutcome(aip.CodeControlRejected, fmt.Sprintf(format, args...), false)}
}

func unavailable(message string) *answer {
	return &answer{status: http.StatusServiceUnavailable, outcome: aip.RejectedOutcome(aip.CodeControlUnavailable, message, true)}
}

// serve answers one lifecycle request as controlplane.Service does (its
// process order, the registry's lifecycle rules, its signed answers), with
// the next queued fault applied.
func (cp *ControlPlane) serve(w http.ResponseWriter, r *http.Request) {
	var body []byte
	var readErr error
	if r.ContentLength <= aip.MaxControlBytes {
		body, readErr = io.ReadAll(http.MaxBytesReader(w, r.Body, aip.MaxControlBytes))
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	now := cp.now()
	op := Operation{At: now}
	var fault Fault
	if len(cp.faults) > 0 {
		fault, cp.faults = cp.faults[0], cp.faults[1:]
	} else if cp.down {
		fault = FaultUnavailable
	}
	op.Fault = fault
	// 1. The body.
	var a *answer
	var recv *aip.ReceivedControlRequest
	switch {
	case r.ContentLength > aip.MaxControlBytes:
		a = rejection(http.StatusRequestEntityTooLarge, "the request body is %d bytes; a lifecycle request is at most %d", r.ContentLength, aip.MaxControlBytes)
	case readErr != nil:
		if tooLarge := (*http.MaxBytesError)(nil); errors.As(readErr, &tooLarge) {
			a = rejection(http.StatusRequestEntityTooLarge, "the request body exceeds %d bytes, the limit of a lifecycle request", aip.MaxControlBytes)
		} else {
			a = unavailable("the request body could not be read; resend the same request")
		}
	default:
		var err error
		if recv, err = aip.OpenControlRequest(body); err != nil {
			a = rejection(http.StatusForbidden, "malformed lifecycle request: %v", err)
		}
	}
	if recv != nil {
		req := &recv.Request
		op.Op, op.RequestID, op.ReplicaID = req.Command.Operation, req.RequestID, req.Command.ReplicaID()
		if hb := req.Command.Heartbeat; hb != nil {
			op.PreviousSequence, op.InFlight, op.ConnectorReady = hb.PreviousSequence, hb.InFlight, hb.ConnectorReady
		}
		if tr := req.Command.Transition; tr != nil {
			op.PreviousSequence = tr.PreviousSequence
		}
		op.Digest, _ = aip.ControlRequestDigest(req)
	}
	switch fault {
	case FaultUnavailable:
		a = unavailable("injected: the lifecycle service is unavailable")
	case FaultReject:
		a = rejection(http.StatusForbidden, "injected: the request is rejected")
	case FaultUnsigned:
		cp.record(op)
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return
	default:
		if a == nil {
			a = cp.decide(recv, &op, now)
		}
	}
	a.requestID = op.RequestID
	if fault == FaultDropResponse {
		cp.record(op)
		panic(http.ErrAbortHandler)
	}
	op.Outcome, op.Code, op.Message = a.outcome.Status, a.outcome.Code, a.outcome.Message
	if a.outcome.Lease != nil {
		op.Sequence = a.outcome.Lease.Sequence
	}
	cp.record(op)
	resp := aip.ControlResponse{
		RequestID: a.requestID, IssuedAt: aip.At(now), ExpiresAt: aip.At(now.Add(aip.MaxMessageLifetime)),
		SignerDID: cp.key.DID(), Outcome: a.outcome,
	}
	raw, err := aip.Seal(cp.key, aip.SignedResponseField, &resp)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		raw, _ = json.Marshal(aip.ErrorBody{Error: *aip.NewProtocolError(aip.CodeControlResponseSigning, aip.CategoryPermanent, false, 0, "the control plane could not sign its response")})
		w.Write(raw)
		return
	}
	w.WriteHeader(a.status)
	w.Write(raw)
}

// decide runs the checks after the body, in controlplane.Service's order
// (window, replica named, pre-provisioned, signer, signature, digest), then
// decides the command with registry.DecideLifecycle, the rules every
// registry backend applies, and commits its change and replay claim.
// Callers hold cp.mu.
func (cp *ControlPlane) decide(recv *aip.ReceivedControlRequest, op *Operation, now time.Time) *answer {
	req := &recv.Request
	// 2. The freshness window.
	if err := aip.CheckWindow(now, req.IssuedAt.Time, req.ExpiresAt.Time); err != nil {
		return rejection(http.StatusForbidden, "%v", err)
	}
	if op.ReplicaID == "" {
		return rejection(http.StatusForbidden, "the %s command names no replica", op.Op)
	}
	// 3. The replica is pre-provisioned.
	rp, ok := cp.replicas[op.ReplicaID]
	if !ok {
		return rejection(http.StatusForbidden,
			"replica %s"+aip.NotProvisionedPhrase+" (offline, with this host's DID) before the host registers", op.ReplicaID)
	}
	// 4. The signer is the replica (the words of controlplane's answer,
	// which never shows the replica's DID; the DID sent cut to 100 bytes).
	if req.SignerDID != rp.spec.DID {
		signer := aip.TruncateUTF8(req.SignerDID, 100)
		return rejection(http.StatusForbidden,
			"signer_did %s"+aip.SignerNotProvisionedPhrase+"%s: the registry holds the peer_did of that replica's entry in the fleet file "+
				"(the control plane logs it with this rejection); start the host with the signing key of that DID "+
				"(`aipfleet keygen --did-of FILE` prints a key file's DID), or set that entry's peer_did to %s and apply the fleet file again",
			signer, op.ReplicaID, signer)
	}
	// 5. The signature.
	pub, err := aip.ParseDIDKey(rp.spec.DID)
	if err != nil {
		return rejection(http.StatusForbidden, "replica %s is provisioned with DID %s: %v", op.ReplicaID, rp.spec.DID, err)
	}
	if err := recv.Signed.Verify(pub); err != nil {
		return rejection(http.StatusForbidden, "%v", err)
	}
	// 6. The digest.
	digest, err := aip.ControlRequestDigest(req)
	if err != nil {
		return rejection(http.StatusForbidden, "malformed lifecycle request: %v", err)
	}
	// 7. Replay and the operation's rules.
	cmd := registry.LifecycleCommand{
		RequestID: req.RequestID, Digest: digest, ExpiresAt: req.ExpiresAt.Time,
		Command: req.Command, LeaseTTL: cp.ttl,
	}
	stored := rp.rec
	in := registry.LifecycleInput{Now: now, Replica: &stored, Claim: cp.claims[req.RequestID]}
	if reg := req.Command.Register; req.Command.Operation == aip.OpRegister && reg != nil {
		in.Instance, in.Version = rp.admitted(&stored, reg)
	}
	dec := registry.DecideLifecycle(&cmd, in)
	if dec.Write {
		rp.rec = dec.Result.Replica
		rp.sync()
	}
	if dec.Claim != nil {
		claim := *dec.Claim
		cp.claims[claim.RequestID] = &claim
	}
	if err := dec.Result.Err; err != nil {
		var rej *registry.LifecycleRejection
		if errors.As(err, &rej) {
			return rejection(http.StatusForbidden, "%s: %s", rej.Rule, rej.Reason)
		}
		return rejection(http.StatusForbidden, "%v", err)
	}
	op.Replayed = dec.Result.Replayed
	return &answer{status: http.StatusOK, outcome: dec.Result.Outcome}
}

// admitted completes a registering replica's stored identity and returns
// the instance and version the registry would hold for it: what the spec
// sets is fixed, what it leaves empty is taken from the registration (so it
// always matches). The registry's rules then compare the registration with
// them.
func (r *replica) admitted(stored *registry.ConnectorReplica, reg *aip.Registration) (*registry.ConnectorInstance, *registry.LifecycleVersion) {
	p := &reg.Replica
	or := func(set, proposed string) string {
		if set != "" {
			return set
		}
		return proposed
	}
	stored.InstanceID = or(r.spec.InstanceID, p.InstanceID)
	stored.VersionID = or(r.spec.VersionID, p.VersionID)
	stored.Endpoint = or(r.spec.Endpoint, p.Endpoint)
	stored.PeerPrincipalID, stored.PeerPrincipalKind = p.PeerPrincipalID, p.PeerPrincipalKind
	stored.TrustDomain, stored.TransportProfile, stored.Topology = p.TrustDomain, p.TransportProfile, p.Topology
	configRevision := reg.ConfigRevision
	if r.spec.ConfigRevision != 0 {
		configRevision = r.spec.ConfigRevision
	}
	inst := &registry.ConnectorInstance{
		ID: stored.InstanceID, ConnectorTypeID: fakeConnectorType, VersionID: stored.VersionID,
		TenantID: or(r.spec.TenantID, reg.TenantID), ConfigRevision: configRevision,
		SecretProviderRef: reg.SecretProviderRef, Status: registry.InstanceEnabled,
	}
	v := &registry.LifecycleVersion{
		ID: stored.VersionID, ConnectorTypeID: fakeConnectorType, Status: registry.VersionActive, Qualified: true,
		ManifestDigest: or(r.spec.ManifestDigest, reg.ManifestDigest), ArtifactDigest: or(r.spec.ArtifactDigest, reg.ArtifactDigest),
		CapabilityCount: int(reg.CapabilityCount), AgentID: p.PeerPrincipalID, AgentKind: p.PeerPrincipalKind,
	}
	return inst, v
}

// fakeConnectorType is the connector type of the instance and version the
// fake admits for a registration.
const fakeConnectorType = "ctype_hostsdktest"

// handlerTransport serves requests with an http.Handler in process.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	rec := httptest.NewRecorder()
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				resp, err = nil, errors.New("hostsdktest: connection closed without a response")
				return
			}
			panic(p)
		}
	}()
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}
