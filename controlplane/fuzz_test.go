package controlplane_test

import (
	"bytes"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// FuzzVerifyControlRequest drives arbitrary bodies through the real
// handler (decoder, window, replica lookup, signer and signature checks,
// registry rules) and checks that every answer is a well-formed signed
// response whose HTTP status matches its outcome, and that nothing
// succeeds unless it is signed by the replica's key.
func FuzzVerifyControlRequest(f *testing.F) {
	clock := registrytest.NewClock(registrytest.Epoch)
	reg, err := memregistry.New(memregistry.Config{Now: clock.Now})
	if err != nil {
		f.Fatal(err)
	}
	ctx := f.Context()
	w, err := registrytest.NewLifecycleWorld(ctx, reg)
	if err != nil {
		f.Fatal(err)
	}
	rep := w.ProvisionedReplica("crepl_a1", clock.Now())
	if err := reg.PutReplica(ctx, rep); err != nil {
		f.Fatal(err)
	}
	svc, err := controlplane.New(controlKey, reg, controlplane.Config{Now: clock.Now, DisableMaintenance: true})
	if err != nil {
		f.Fatal(err)
	}
	runService(f, svc)

	key := registrytest.Key(rep.ID)
	seal := func(cmd aip.ControlCommand) []byte {
		body, err := aip.Seal(key, aip.SignedRequestField, aip.NewControlRequest(clock.Now(), key.DID(), cmd))
		if err != nil {
			f.Fatal(err)
		}
		return body
	}
	register := seal(aip.RegisterCommand(w.Registration(&rep)))
	// Register once so heartbeats at sequence 1 are live.
	if rec := httptestRecorder(svc, register); rec.Code != http.StatusOK {
		f.Fatalf("register: HTTP %d %s", rec.Code, rec.Body)
	}
	f.Add(register)
	f.Add(seal(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 1, InFlight: 1, ConnectorReady: true})))
	f.Add(seal(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: rep.ID, PreviousSequence: 2, InFlight: 9, ConnectorReady: false})))
	f.Add(seal(aip.TransitionCommand(aip.OpDrain, aip.Transition{ReplicaID: rep.ID, PreviousSequence: 2})))
	f.Add(seal(aip.TransitionCommand(aip.OpOffline, aip.Transition{ReplicaID: rep.ID, PreviousSequence: 3})))
	f.Add(bytes.Replace(register, []byte(`"capacity":4`), []byte(`"capacity":5`), 1))
	f.Add([]byte(`{"request":{},"signature":""}`))
	f.Add([]byte(`{"request":{"request_id":"msg_1","issued_at":"2030-01-01T00:00:00Z","expires_at":"2030-01-01T00:00:10Z","signer_did":"did:key:z6Mk","command":{"operation":"heartbeat","payload":{"replica_id":"crepl_a1"}}},"signature":"AAAA"}`))
	f.Add([]byte(`[]`))

	pub := key.PublicKey()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptestRecorder(svc, body)
		s, err := aip.Open(rec.Body.Bytes(), aip.SignedResponseField)
		if err != nil {
			t.Fatalf("HTTP %d: the answer is not a signed response: %v: %s", rec.Code, err, rec.Body)
		}
		if err := s.Verify(controlKey.PublicKey()); err != nil {
			t.Fatalf("the answer's signature does not verify: %v", err)
		}
		var resp aip.ControlResponse
		if err := s.Decode(&resp); err != nil {
			t.Fatal(err)
		}
		if resp.SignerDID != controlKey.DID() || aip.CheckWindow(clock.Now(), resp.IssuedAt.Time, resp.ExpiresAt.Time) != nil {
			t.Fatalf("response envelope %+v", resp)
		}
		o := resp.Outcome
		switch rec.Code {
		case http.StatusOK:
			if o.Status != aip.OutcomeLease && o.Status != aip.OutcomeOffline {
				t.Fatalf("200 with outcome %+v", o)
			}
			recv, err := aip.OpenControlRequest(body)
			if err != nil {
				t.Fatalf("200 for a body that does not decode: %v", err)
			}
			if recv.Request.SignerDID != key.DID() || recv.Signed.Verify(pub) != nil {
				t.Fatalf("200 for a request not signed by the replica")
			}
			if recv.Request.RequestID != resp.RequestID {
				t.Fatalf("answer to %s for request %s", resp.RequestID, recv.Request.RequestID)
			}
		case http.StatusForbidden, http.StatusRequestEntityTooLarge:
			if o.Status != aip.OutcomeRejected || o.Code != aip.CodeControlRejected || o.Retryable || o.Message == "" {
				t.Fatalf("HTTP %d with outcome %+v", rec.Code, o)
			}
		case http.StatusServiceUnavailable:
			if o.Status != aip.OutcomeRejected || o.Code != aip.CodeControlUnavailable || !o.Retryable {
				t.Fatalf("503 with outcome %+v", o)
			}
		default:
			t.Fatalf("unexpected HTTP %d: %s", rec.Code, rec.Body)
		}
		if len(o.Message) > aip.MaxErrorMessageBytes {
			t.Fatalf("message of %d bytes", len(o.Message))
		}
	})
}
