package hostsdk_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// signedCopy signs env with the fleet's dispatcher and returns the bytes.
func signedCopy(t *testing.T, d *hostsdktest.Dispatcher, env *aip.Envelope) []byte {
	t.Helper()
	raw, err := d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// wantUnsigned checks that the answer is the unsigned error code with the
// HTTP status: no envelope the host signed.
func wantUnsigned(t *testing.T, resp *hostsdktest.Response, err error, status int, code string) {
	t.Helper()
	if resp == nil {
		t.Fatalf("no answer: %v", err)
	}
	if !errors.Is(err, hostsdktest.ErrUnsigned) || resp.Envelope != nil {
		t.Fatalf("HTTP %d: want an unsigned answer, got %v (body %s)", resp.Status, err, resp.Raw)
	}
	if resp.Status != status || !strings.Contains(string(resp.Raw), `"`+code+`"`) {
		t.Fatalf("HTTP %d %s, want %d %s", resp.Status, resp.Raw, status, code)
	}
}

// A request the host cannot authenticate (a signature that does not
// verify, or a valid signature by a key other than the pinned
// dispatcher's) gets no signed answer: a signed error "in response to"
// a message ID chosen by anyone who can reach the listener, addressed to
// the dispatcher, could be put in place of the host's answer to the real
// message and make the dispatcher settle an action that ran as not run.
func TestUnauthenticatedRequestsGetNoSignedAnswer(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"real"}`)
	env, err := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
	if err != nil {
		t.Fatal(err)
	}
	raw := signedCopy(t, f.d, env)

	t.Run("tampered copy of the dispatcher's message", func(t *testing.T) {
		var forged aip.Envelope
		if err := json.Unmarshal(raw, &forged); err != nil {
			t.Fatal(err)
		}
		forged.Body.Action.Input = json.RawMessage(`{"message":"forged"}`)
		bad, err := json.Marshal(&forged)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := f.d.Post(ctx, target, bad, env.MessageID)
		wantUnsigned(t, resp, err, http.StatusUnauthorized, hostsdk.CodeAuthentication)
	})
	t.Run("signed by another key", func(t *testing.T) {
		other := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
		var copyEnv aip.Envelope
		if err := json.Unmarshal(raw, &copyEnv); err != nil {
			t.Fatal(err)
		}
		resp, err := f.d.Post(ctx, target, signedCopy(t, other, &copyEnv), env.MessageID)
		wantUnsigned(t, resp, err, http.StatusUnauthorized, hostsdk.CodeAuthentication)
	})
	t.Run("the real message still runs", func(t *testing.T) {
		// The forgeries claimed nothing in the replay registry.
		resp, err := f.d.Post(ctx, target, raw, env.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("the dispatcher's message answered %+v, %v", res, err)
		}
		if n := conn.runCount(a.ID); n != 1 {
			t.Fatalf("ran %d times", n)
		}
	})
	t.Run("authenticated sender with the wrong principal is signed", func(t *testing.T) {
		b := action(capEcho, `{"message":"x"}`)
		env, _ := f.d.Envelope(target, aip.Body{Action: b}, f.d.Route(target, b.ID, b.CapabilityID, ""))
		env.From.TrustDomain = "other.example"
		resp, _ := f.d.Send(ctx, target, env)
		// The answer is addressed to the principal the message named, so
		// the dispatcher's check refuses it; it must still be signed.
		if _, err := aip.VerifyEnvelope(resp.Raw, target.DID); err != nil || resp.Status != http.StatusUnauthorized {
			t.Fatalf("HTTP %d %s: %v", resp.Status, resp.Raw, err)
		}
	})
}

