package hostsdktest_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// parityLeaseTTL is the lease both services grant: shorter than a
// request's lifetime, so a request can be replayed after the lease it got
// expired.
const parityLeaseTTL = 10 * time.Second

// answer is what a host learns from one lifecycle answer.
type answer struct {
	HTTPStatus int
	Outcome    aip.OutcomeStatus
	Code       string
	Message    string
	Retryable  bool
	Sequence   uint64
	LeaseUntil time.Time
}

func (a answer) String() string {
	return fmt.Sprintf("%d %s seq=%d until=%s %s %q", a.HTTPStatus, a.Outcome, a.Sequence, a.LeaseUntil.Format(time.RFC3339Nano), a.Code, a.Message)
}

// parityRig runs the real lifecycle service (controlplane.Service over
// memregistry) and the fake side by side on one clock, with the same
// replica provisioned in both.
type parityRig struct {
	t      *testing.T
	ctx    context.Context
	clock  *registrytest.Clock
	svc    *controlplane.Service
	real   *httptest.Server
	realID string // the real service's DID
	fake   *hostsdktest.ControlPlane
	rep    registry.ConnectorReplica
	key    *aip.SigningKey
	reg    aip.Registration
	// sent are the bodies sent so far by step name, to replay them.
	sent map[string]sentRequest
}

type sentRequest struct {
	body      []byte
	requestID string
}

func newParityRig(t *testing.T) *parityRig {
	t.Helper()
	ctx := t.Context()
	clock := registrytest.NewClock(registrytest.Epoch)
	mem, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w, err := registrytest.NewLifecycleWorld(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	rep := w.ProvisionedReplica("crepl_parity", clock.Now())
	if err := mem.PutReplica(ctx, rep); err != nil {
		t.Fatal(err)
	}
	controlKey := registrytest.Key("control-plane")
	svc, err := controlplane.New(controlKey, mem, controlplane.Config{Now: clock.Now, LeaseTTL: parityLeaseTTL, DisableMaintenance: true})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	<-svc.Started()
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)

	fake := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{Now: clock.Now, Key: controlKey, LeaseTTL: parityLeaseTTL})
	fake.Provision(hostsdktest.ReplicaSpec{
		ID: rep.ID, DID: rep.PeerDID, InstanceID: rep.InstanceID, VersionID: rep.VersionID, Endpoint: rep.Endpoint,
		TenantID: w.Instance.TenantID, ManifestDigest: w.Version.ManifestDigest, ArtifactDigest: w.Version.Attestation.ArtifactDigest,
		ConfigRevision: w.Instance.ConfigRevision, Capacity: rep.Capacity,
	})
	return &parityRig{
		t: t, ctx: ctx, clock: clock, svc: svc, real: srv, realID: controlKey.DID(), fake: fake,
		rep: rep, key: registrytest.Key(rep.ID), reg: w.Registration(&rep), sent: map[string]sentRequest{},
	}
}

// seal signs cmd as signer (with signerDID in the request) issued at
// issued.
func (r *parityRig) seal(key *aip.SigningKey, signerDID string, issued time.Time, cmd aip.ControlCommand) sentRequest {
	r.t.Helper()
	req := aip.NewControlRequest(issued, signerDID, cmd)
	body, err := aip.Seal(key, aip.SignedRequestField, req)
	if err != nil {
		r.t.Fatal(err)
	}
	return sentRequest{body: body, requestID: req.RequestID}
}

// send posts one body to a lifecycle endpoint and opens the signed answer.
func (r *parityRig) send(endpoint string, s sentRequest) answer {
	r.t.Helper()
	resp, err := http.Post(endpoint, "application/json", bytes.NewReader(s.body))
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		r.t.Fatal(err)
	}
	pub, err := aip.ParseDIDKey(r.realID)
	if err != nil {
		r.t.Fatal(err)
	}
	cr, err := aip.OpenControlResponse(raw, r.realID, pub, s.requestID, r.clock.Now())
	if err != nil {
		r.t.Fatalf("%s answered HTTP %d, not a signed answer to %q: %v: %s", endpoint, resp.StatusCode, s.requestID, err, raw)
	}
	a := answer{HTTPStatus: resp.StatusCode, Outcome: cr.Outcome.Status, Code: cr.Outcome.Code, Message: cr.Outcome.Message, Retryable: cr.Outcome.Retryable}
	if l := cr.Outcome.Lease; l != nil {
		a.Sequence, a.LeaseUntil = l.Sequence, l.ExpiresAt.Time
	}
	return a
}

// both sends the same bytes to the real service and to the fake and
// requires the same answer, which it returns.
func (r *parityRig) both(name string, s sentRequest) answer {
	r.t.Helper()
	r.sent[name] = s
	real := r.send(r.real.URL+aip.ControlPath, s)
	fake := r.send(r.fake.Endpoint(), s)
	if diff := cmp.Diff(real, fake); diff != "" {
		r.t.Errorf("%s: the fake answers differently from controlplane.Service (-real +fake):\n%s", name, diff)
	}
	return real
}

// TestControlPlaneParity runs one scripted sequence of lifecycle requests
// against the real lifecycle service (controlplane.Service over
// memregistry) and against the fake, and requires the same answers:
// status, code, message, sequence and lease. It covers every check of the
// service's processing order and every lifecycle rule a host can meet, so
// the fake cannot drift from the real service unnoticed.
func TestControlPlaneParity(t *testing.T) {
	r := newParityRig(t)
	id, did := r.rep.ID, r.rep.PeerDID
	now := r.clock.Now
	cmd := func(c aip.ControlCommand) sentRequest { return r.seal(r.key, did, now(), c) }
	register := func(mods ...func(*aip.Registration)) sentRequest {
		reg := r.reg
		for _, m := range mods {
			m(&reg)
		}
		return cmd(aip.RegisterCommand(reg))
	}
	heartbeat := func(prev uint64, inFlight uint32, ready bool) sentRequest {
		return cmd(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: prev, InFlight: inFlight, ConnectorReady: ready}))
	}
	transition := func(op aip.Operation, prev uint64) sentRequest {
		return cmd(aip.TransitionCommand(op, aip.Transition{ReplicaID: id, PreviousSequence: prev}))
	}
	type want struct {
		status   int
		outcome  aip.OutcomeStatus
		sequence uint64
		message  string // a substring of the rejection's message
	}
	check := func(name string, s sentRequest, w want) answer {
		t.Helper()
		got := r.both(name, s)
		if got.HTTPStatus != w.status || got.Outcome != w.outcome || got.Sequence != w.sequence || !strings.Contains(got.Message, w.message) {
			t.Errorf("%s: real service answered %v, want %d %s seq=%d %q", name, got, w.status, w.outcome, w.sequence, w.message)
		}
		return got
	}
	replay := func(name, of string, w want) answer {
		t.Helper()
		return check(name, r.sent[of], w)
	}
	rejected := func(status int, message string) want {
		return want{status: status, outcome: aip.OutcomeRejected, message: message}
	}
	lease := func(seq uint64) want { return want{status: http.StatusOK, outcome: aip.OutcomeLease, sequence: seq} }
	offline := want{status: http.StatusOK, outcome: aip.OutcomeOffline}

	// The checks before the registry, in the service's order.
	check("malformed", sentRequest{body: []byte(`{"request":{"request_id":"x"}}`)}, rejected(http.StatusForbidden, "malformed lifecycle request"))
	check("too large", sentRequest{body: bytes.Repeat([]byte(" "), aip.MaxControlBytes+1)}, rejected(http.StatusRequestEntityTooLarge, "at most"))
	check("stale", r.seal(r.key, did, now().Add(-10*time.Minute), aip.RegisterCommand(r.reg)), rejected(http.StatusForbidden, ""))
	stranger := registrytest.Key("stranger")
	unknown := r.reg
	unknown.Replica.ID = "crepl_unknown"
	check("not provisioned", r.seal(stranger, stranger.DID(), now(), aip.RegisterCommand(unknown)), rejected(http.StatusForbidden, "not pre-provisioned"))
	check("foreign signer", r.seal(stranger, stranger.DID(), now(), aip.RegisterCommand(r.reg)), rejected(http.StatusForbidden, "is not the DID pre-provisioned"))
	check("bad signature", r.seal(stranger, did, now(), aip.RegisterCommand(r.reg)), rejected(http.StatusForbidden, "signature"))

	// Registration rules.
	check("capacity 0", register(func(g *aip.Registration) { g.Replica.Capacity = 0 }), rejected(http.StatusForbidden, "proposal: "))
	check("wrong tenant", register(func(g *aip.Registration) { g.TenantID = "tenant-other" }), rejected(http.StatusForbidden, "instance: "))
	check("wrong endpoint", register(func(g *aip.Registration) { g.Replica.Endpoint = "https://elsewhere.test" }), rejected(http.StatusForbidden, "identity: "))
	check("register", register(), lease(1))
	replay("register replayed", "register", lease(1))
	check("takeover", register(), rejected(http.StatusForbidden, "lease_live: "))
	replay("rejected ID resent", "takeover", rejected(http.StatusForbidden, "replay: "))

	// Heartbeats: capacity, fence, renewal, replay while still committed.
	check("in_flight above capacity", heartbeat(1, r.rep.Capacity+1, true), rejected(http.StatusForbidden, "capacity: "))
	check("stale sequence", heartbeat(0, 0, true), rejected(http.StatusForbidden, "sequence: "))
	check("heartbeat", heartbeat(1, 1, true), lease(2))
	replay("heartbeat replayed", "heartbeat", lease(2))
	replay("superseded register replayed", "register", rejected(http.StatusForbidden, "replay: "))
	check("drain", transition(aip.OpDrain, 2), lease(3))
	replay("superseded heartbeat replayed", "heartbeat", rejected(http.StatusForbidden, "replay: "))

	// An expired lease takes no heartbeat or drain; offline still works.
	r.clock.Advance(parityLeaseTTL + time.Second)
	check("drain on expired lease", transition(aip.OpDrain, 3), rejected(http.StatusForbidden, "state: "))
	check("heartbeat on expired lease", heartbeat(3, 0, true), rejected(http.StatusForbidden, "state: "))
	replay("drain replayed after its lease expired", "drain", lease(3))
	check("offline", transition(aip.OpOffline, 3), offline)
	replay("offline replayed", "offline", offline)
	check("heartbeat when offline", heartbeat(4, 0, true), rejected(http.StatusForbidden, "state: "))

	// An unready heartbeat takes the replica offline with its lease ended.
	check("register again", register(), lease(5))
	unready := check("unready heartbeat", heartbeat(5, 0, false), lease(6))
	if !unready.LeaseUntil.Equal(registry.Millis(now())) {
		t.Errorf("unready heartbeat: lease until %s, want now (%s)", unready.LeaseUntil, now())
	}
	replay("unready heartbeat replayed", "unready heartbeat", lease(6))
	check("heartbeat after unready", heartbeat(6, 0, true), rejected(http.StatusForbidden, "state: "))
	check("register after unready", register(), lease(7))
	replay("unready heartbeat replayed after register", "unready heartbeat", rejected(http.StatusForbidden, "replay: "))

	// Lease expiry by the maintenance loop raises the sequence and ends
	// replay of the last request.
	check("heartbeat before expiry", heartbeat(7, 0, true), lease(8))
	r.clock.Advance(parityLeaseTTL + time.Second)
	if n, err := r.svc.Maintain(r.ctx); err != nil || n != 1 {
		t.Fatalf("Maintain: %d replicas expired, %v", n, err)
	}
	r.fake.ExpireLease(id)
	replay("heartbeat replayed after expiry", "heartbeat before expiry", rejected(http.StatusForbidden, "replay: "))
	check("heartbeat after expiry", heartbeat(9, 0, true), rejected(http.StatusForbidden, "state: "))
	check("register after expiry", register(), lease(10))
	check("drain again", transition(aip.OpDrain, 10), lease(11))
	check("offline after drain", transition(aip.OpOffline, 11), offline)
	replay("drain replayed after offline", "drain again", rejected(http.StatusForbidden, "replay: "))

	st, ok := r.fake.Replica(id)
	if !ok || st.Status != aip.ReplicaOffline || st.HealthRevision != 12 {
		t.Errorf("fake replica after the script: %+v", st)
	}
}
