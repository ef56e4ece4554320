package hostsdktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// Fault is a failure the fake control plane injects into the next requests.
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
	// LeaseTTL is the lease the control plane grants. Defaults to 30s.
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
	spec  ReplicaSpec
	state ReplicaState
}

// ControlPlane is an in-process fake of the lifecycle service that speaks
// the real signed protocol: signed responses with its own key, the
// pre-provisioned replica and DID check, the freshness window, the sequence
// fence, lease TTL, replay of the exact committed request (the replay claim
// commits with the state change, so a request that failed retryably can be
// sent again), rejection of stale sequences and of consumed request IDs, and
// fault injection. It records every operation.
type ControlPlane struct {
	t        testing.TB
	key      *aip.SigningKey
	ttl      time.Duration
	now      func() time.Time
	server   *httptest.Server
	mu       sync.Mutex
	replicas map[string]*replica
	claims   map[string]string // committed request ID -> digest
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
		replicas: map[string]*replica{}, claims: map[string]string{}, changed: make(chan struct{}),
	}
	if cp.ttl == 0 {
		cp.ttl = 30 * time.Second
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
	cp.replicas[spec.ID] = &replica{spec: spec, state: ReplicaState{Status: aip.ReplicaOffline, Capacity: spec.Capacity}}
}

// FailNext injects fault into the next n requests.
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

// ExpireLease expires a replica's lease now, as the maintenance loop would
// (status offline, request identity cleared).
func (cp *ControlPlane) ExpireLease(id string) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if r, ok := cp.replicas[id]; ok {
		r.state.Status, r.state.LeaseExpiresAt = aip.ReplicaOffline, cp.now()
		r.state.LastRequestID, r.state.LastRequestDigest = "", ""
	}
}

// Await blocks until pred holds for the recorded operations or ctx ends.
func (cp *ControlPlane) Await(ctx context.Context, pred func([]Operation) bool) error {
	for {
		cp.mu.Lock()
		ok, ch := pred(cp.ops), cp.changed
		cp.mu.Unlock()
		if ok {
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

func (cp *ControlPlane) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, aip.MaxControlBytes))
	if err != nil {
		http.Error(w, `{"error":{"code":"connector_control.too_large"}}`, http.StatusRequestEntityTooLarge)
		return
	}
	recv, err := aip.OpenControlRequest(body)
	if err != nil {
		http.Error(w, `{"error":{"code":"connector_control.malformed","message":"`+escape(err.Error())+`"}}`, http.StatusBadRequest)
		return
	}
	req := &recv.Request
	now := cp.now()
	op := Operation{At: now, Op: req.Command.Operation, RequestID: req.RequestID, ReplicaID: req.Command.ReplicaID()}
	if hb := req.Command.Heartbeat; hb != nil {
		op.PreviousSequence, op.InFlight, op.ConnectorReady = hb.PreviousSequence, hb.InFlight, hb.ConnectorReady
	}
	if tr := req.Command.Transition; tr != nil {
		op.PreviousSequence = tr.PreviousSequence
	}
	op.Digest, _ = aip.ControlRequestDigest(req)

	cp.mu.Lock()
	defer cp.mu.Unlock()
	var fault Fault
	if len(cp.faults) > 0 {
		fault, cp.faults = cp.faults[0], cp.faults[1:]
	} else if cp.down {
		fault = FaultUnavailable
	}
	op.Fault = fault
	outcome, apply := cp.decide(recv, &op, now, fault)
	switch fault {
	case FaultUnavailable:
		outcome, apply = aip.RejectedOutcome(aip.CodeControlUnavailable, "injected: the lifecycle service is unavailable", true), nil
	case FaultReject:
		outcome, apply = aip.RejectedOutcome(aip.CodeControlRejected, "injected: the request is rejected", false), nil
	case FaultUnsigned:
		cp.record(op)
		http.Error(w, "bad gateway", http.StatusBadGateway)
		return
	}
	if apply != nil {
		apply()
	}
	if fault == FaultDropResponse {
		cp.record(op)
		panic(http.ErrAbortHandler)
	}
	op.Outcome, op.Code, op.Message = outcome.Status, outcome.Code, outcome.Message
	if outcome.Lease != nil {
		op.Sequence = outcome.Lease.Sequence
	}
	cp.record(op)
	resp := aip.ControlResponse{
		RequestID: req.RequestID, IssuedAt: aip.At(now), ExpiresAt: aip.At(now.Add(aip.MaxMessageLifetime)),
		SignerDID: cp.key.DID(), Outcome: outcome,
	}
	raw, err := aip.Seal(cp.key, aip.SignedResponseField, &resp)
	if err != nil {
		http.Error(w, `{"error":{"code":"connector_control.response_signing"}}`, http.StatusInternalServerError)
		return
	}
	status := http.StatusOK
	if outcome.Status == aip.OutcomeRejected {
		status = http.StatusForbidden
		if outcome.Retryable {
			status = http.StatusServiceUnavailable
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(raw)
}

// decide checks a request and returns its outcome and the state change to
// apply (nil for rejections and replays). Callers hold cp.mu.
func (cp *ControlPlane) decide(recv *aip.ReceivedControlRequest, op *Operation, now time.Time, fault Fault) (aip.ControlOutcome, func()) {
	req := &recv.Request
	reject := func(format string, args ...any) (aip.ControlOutcome, func()) {
		return aip.RejectedOutcome(aip.CodeControlRejected, fmt.Sprintf(format, args...), false), nil
	}
	if err := aip.CheckWindow(now, req.IssuedAt.Time, req.ExpiresAt.Time); err != nil {
		return reject("%v", err)
	}
	r, ok := cp.replicas[op.ReplicaID]
	if !ok {
		return reject("replica %s is not pre-provisioned", op.ReplicaID)
	}
	if err := recv.VerifyFrom(r.spec.DID); err != nil {
		return reject("signature: %v", err)
	}
	st := &r.state
	if committed, seen := cp.claims[req.RequestID]; seen {
		if st.LastRequestID == req.RequestID && st.LastRequestDigest == op.Digest && committed == op.Digest {
			op.Replayed = true
			if req.Command.Operation == aip.OpOffline {
				return aip.OfflineOutcome(), nil
			}
			return aip.LeaseOutcome(aip.Lease{Sequence: st.HealthRevision, ExpiresAt: aip.At(st.LeaseExpiresAt)}), nil
		}
		return reject("request %s was already consumed by another lifecycle state", req.RequestID)
	}
	if fault == FaultUnavailable || fault == FaultReject || fault == FaultUnsigned {
		return aip.ControlOutcome{}, nil
	}
	commit := func(status aip.ReplicaStatus, leaseUntil time.Time) func() {
		return func() {
			st.Status, st.LeaseExpiresAt = status, aip.At(leaseUntil).Time
			st.HealthRevision++
			st.LastRequestID, st.LastRequestDigest = req.RequestID, op.Digest
			cp.claims[req.RequestID] = op.Digest
		}
	}
	leaseUntil := now.Add(cp.ttl)
	switch c := &req.Command; c.Operation {
	case aip.OpRegister:
		reg := c.Register
		rp := &reg.Replica
		if rp.Status != aip.ReplicaReady || rp.ActiveAssignments != 0 || rp.HealthRevision != 0 || rp.LastControlRequestID != "" {
			return reject("a registration must propose status ready, zero assignments, health revision zero and no previous request")
		}
		if rp.PeerDID != r.spec.DID {
			return reject("peer_did %s is not the provisioned DID", rp.PeerDID)
		}
		for _, f := range []struct{ name, got, want string }{
			{"instance_id", rp.InstanceID, r.spec.InstanceID},
			{"version_id", rp.VersionID, r.spec.VersionID},
			{"endpoint", rp.Endpoint, r.spec.Endpoint},
			{"tenant_id", reg.TenantID, r.spec.TenantID},
			{"manifest_digest", reg.ManifestDigest, r.spec.ManifestDigest},
			{"artifact_digest", reg.ArtifactDigest, r.spec.ArtifactDigest},
		} {
			if f.want != "" && f.got != f.want {
				return reject("registration %s %q does not match the registry (%q)", f.name, f.got, f.want)
			}
		}
		if r.spec.ConfigRevision != 0 && reg.ConfigRevision != r.spec.ConfigRevision {
			return reject("config_revision %d does not match the registry (%d)", reg.ConfigRevision, r.spec.ConfigRevision)
		}
		leaseLive := st.Status != aip.ReplicaOffline && st.LeaseExpiresAt.After(now)
		if leaseLive || (st.Status == aip.ReplicaOffline && st.ActiveAssignments > 0 && st.LeaseExpiresAt.After(now)) {
			return reject("replica %s may re-register only after a clean offline transition or lease expiry", r.spec.ID)
		}
		if st.ActiveAssignments > rp.Capacity {
			return reject("capacity %d is below the %d retained assignments", rp.Capacity, st.ActiveAssignments)
		}
		st.Capacity = rp.Capacity
		return aip.LeaseOutcome(aip.Lease{Sequence: st.HealthRevision + 1, ExpiresAt: aip.At(leaseUntil)}), commit(aip.ReplicaReady, leaseUntil)
	case aip.OpHeartbeat:
		hb := c.Heartbeat
		if hb.InFlight > st.Capacity {
			return reject("in_flight %d exceeds the capacity %d", hb.InFlight, st.Capacity)
		}
		if st.Status == aip.ReplicaOffline {
			return reject("replica %s is offline; register again", r.spec.ID)
		}
		if hb.PreviousSequence != st.HealthRevision {
			return reject("replica %s lost its lease-sequence fence (previous_sequence %d, registry %d)", r.spec.ID, hb.PreviousSequence, st.HealthRevision)
		}
		if !hb.ConnectorReady {
			return aip.LeaseOutcome(aip.Lease{Sequence: st.HealthRevision + 1, ExpiresAt: aip.At(now)}), commit(aip.ReplicaOffline, now)
		}
		return aip.LeaseOutcome(aip.Lease{Sequence: st.HealthRevision + 1, ExpiresAt: aip.At(leaseUntil)}), commit(aip.ReplicaReady, leaseUntil)
	case aip.OpDrain, aip.OpOffline:
		tr := c.Transition
		if tr.PreviousSequence != st.HealthRevision {
			return reject("replica %s lost its lease-sequence fence (previous_sequence %d, registry %d)", r.spec.ID, tr.PreviousSequence, st.HealthRevision)
		}
		if c.Operation == aip.OpOffline {
			return aip.OfflineOutcome(), commit(aip.ReplicaOffline, now)
		}
		if st.Status == aip.ReplicaOffline {
			return reject("replica %s is offline", r.spec.ID)
		}
		return aip.LeaseOutcome(aip.Lease{Sequence: st.HealthRevision + 1, ExpiresAt: aip.At(leaseUntil)}), commit(aip.ReplicaDraining, leaseUntil)
	}
	return reject("unknown operation %q", req.Command.Operation)
}

func escape(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		if r == '"' || r == '\\' || r < 0x20 {
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

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
