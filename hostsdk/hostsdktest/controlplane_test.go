package hostsdktest_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

type client struct {
	t   *testing.T
	cp  *hostsdktest.ControlPlane
	key *aip.SigningKey
}

func (c *client) send(body []byte, requestID string) (int, *aip.ControlResponse) {
	c.t.Helper()
	resp, err := http.Post(c.cp.Endpoint(), "application/json", bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	pub, _ := aip.ParseDIDKey(c.cp.DID())
	cr, err := aip.OpenControlResponse(raw, c.cp.DID(), pub, requestID, time.Now())
	if err != nil {
		c.t.Fatalf("HTTP %d: %v: %s", resp.StatusCode, err, raw)
	}
	return resp.StatusCode, cr
}

func (c *client) seal(cmd aip.ControlCommand) ([]byte, string) {
	c.t.Helper()
	req := aip.NewControlRequest(time.Now(), c.key.DID(), cmd)
	body, err := aip.Seal(c.key, aip.SignedRequestField, req)
	if err != nil {
		c.t.Fatal(err)
	}
	return body, req.RequestID
}

func registration(id, did string) aip.Registration {
	return aip.Registration{Replica: aip.Replica{ID: id, PeerDID: did, Status: aip.ReplicaReady, Capacity: 4,
		PeerPrincipalKind: aip.PrincipalAgent, PeerPrincipalID: "agent:x", TransportProfile: aip.NativeHTTPProfile}}
}

func TestControlPlaneProtocol(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	key, _ := aip.GenerateSigningKey()
	c := &client{t, cp, key}
	id := aip.NewID(aip.PrefixReplica)

	body, rid := c.seal(aip.RegisterCommand(registration(id, key.DID())))
	if status, r := c.send(body, rid); status != http.StatusForbidden || r.Outcome.Status != aip.OutcomeRejected {
		t.Fatalf("unprovisioned replica: %d %+v", status, r.Outcome)
	}
	cp.Provision(hostsdktest.ReplicaSpec{ID: id, DID: key.DID()})

	// A retryable failure does not consume the request ID.
	cp.FailNext(1, hostsdktest.FaultUnavailable)
	body, rid = c.seal(aip.RegisterCommand(registration(id, key.DID())))
	if status, r := c.send(body, rid); status != http.StatusServiceUnavailable || !r.Outcome.Retryable {
		t.Fatalf("injected unavailability: %d %+v", status, r.Outcome)
	}
	_, r := c.send(body, rid)
	if r.Outcome.Status != aip.OutcomeLease || r.Outcome.Lease.Sequence != 1 {
		t.Fatalf("register: %+v", r.Outcome)
	}
	// The committed request replays to the same lease.
	if _, again := c.send(body, rid); again.Outcome.Lease == nil || *again.Outcome.Lease != *r.Outcome.Lease {
		t.Fatalf("replay: %+v", again.Outcome)
	}
	// A second registration while the lease is live is refused.
	b2, rid2 := c.seal(aip.RegisterCommand(registration(id, key.DID())))
	if _, r := c.send(b2, rid2); r.Outcome.Status != aip.OutcomeRejected {
		t.Fatalf("takeover while live: %+v", r.Outcome)
	}

	hb := func(prev uint64) ([]byte, string) {
		return c.seal(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: prev, ConnectorReady: true}))
	}
	body, rid = hb(1)
	if _, r := c.send(body, rid); r.Outcome.Lease == nil || r.Outcome.Lease.Sequence != 2 {
		t.Fatalf("heartbeat: %+v", r.Outcome)
	}
	body, rid = hb(1)
	if _, r := c.send(body, rid); r.Outcome.Status != aip.OutcomeRejected {
		t.Fatalf("stale heartbeat: %+v", r.Outcome)
	}
	// The old registration is no longer the committed request.
	if _, r := c.send(b2, rid2); r.Outcome.Status != aip.OutcomeRejected {
		t.Fatalf("consumed request: %+v", r.Outcome)
	}

	// A wrong signer is refused.
	other, _ := aip.GenerateSigningKey()
	oc := &client{t, cp, other}
	body, rid = oc.seal(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: id, PreviousSequence: 2, ConnectorReady: true}))
	if _, r := c.send(body, rid); r.Outcome.Status != aip.OutcomeRejected {
		t.Fatalf("foreign signer: %+v", r.Outcome)
	}

	body, rid = c.seal(aip.TransitionCommand(aip.OpOffline, aip.Transition{ReplicaID: id, PreviousSequence: 2}))
	if _, r := c.send(body, rid); r.Outcome.Status != aip.OutcomeOffline {
		t.Fatalf("offline: %+v", r.Outcome)
	}
	st, _ := cp.Replica(id)
	if st.Status != aip.ReplicaOffline || st.HealthRevision != 3 {
		t.Errorf("replica %+v", st)
	}
	// After a clean offline the replica may register again.
	body, rid = c.seal(aip.RegisterCommand(registration(id, key.DID())))
	if _, r := c.send(body, rid); r.Outcome.Lease == nil || r.Outcome.Lease.Sequence != 4 {
		t.Fatalf("re-register: %+v", r.Outcome)
	}
	if n := len(cp.Operations()); n != 11 {
		t.Errorf("%d operations recorded", n)
	}
}
