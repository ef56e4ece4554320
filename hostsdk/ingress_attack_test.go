package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
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

// A message the host refused after authenticating it is claimed in the
// replay registry, so it can never execute later: not when the fence
// token that was ahead of the replica's clock is no longer (a signed
// route_mismatch the dispatcher settled as not run), nor when its sent_at
// that was ahead comes into the window.
func TestRefusedMessageNeverExecutesLater(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		b.awaitFirstBeat(t)
		target := hostsdktest.TargetOf(b.h, b.cfg)
		ctx := context.Background()

		ahead := b.routeNow(action(capEcho, `{"message":"fence ahead"}`))
		ahead.route.FenceToken = fenceAt(time.Now().Add(hostsdk.MaxMessageSkew + time.Second))
		env, err := b.d.Envelope(target, aip.Body{Action: ahead.a}, ahead.route)
		if err != nil {
			t.Fatal(err)
		}
		raw := signedCopy(t, b.d, env)
		resp, err := b.d.Post(ctx, target, raw, env.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)

		early := action(capEcho, `{"message":"sent ahead"}`)
		eenv, err := b.d.Envelope(target, aip.Body{Action: early}, b.routeNow(early).route)
		if err != nil {
			t.Fatal(err)
		}
		eenv.SentAt = aip.At(time.Now().Add(hostsdk.MaxMessageSkew + time.Second))
		eraw := signedCopy(t, b.d, eenv)
		resp, err = b.d.Post(ctx, target, eraw, eenv.MessageID)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, resp, http.StatusConflict, hostsdk.CodeReplay)

		time.Sleep(2 * time.Second)
		for _, m := range []struct {
			raw []byte
			id  string
			a   *aip.Action
		}{{raw, env.MessageID, ahead.a}, {eraw, eenv.MessageID, early}} {
			resp, err := b.d.Post(ctx, target, m.raw, m.id)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status == http.StatusOK || b.conn.runCount(m.a.ID) != 0 {
				t.Fatalf("the refused message %s was delivered again and ran (HTTP %d, %d runs)", m.id, resp.Status, b.conn.runCount(m.a.ID))
			}
			wantCode(t, resp, http.StatusConflict, hostsdk.CodeReplay)
		}
	})
}

// A fence token that is not the registry's (route_ and a UUIDv7 carrying
// the assignment time) is refused, for every message kind: the prune
// horizon and the connector's provider-side idempotency rely on it.
func TestMalformedFenceTokenIsRefused(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	v4 := aip.PrefixRoute + "0123456789ab4def8123456789abcdef"
	for _, fence := range []string{"", "route_", "route_xyz", v4, aip.NewID(aip.PrefixAction), strings.ToUpper(aip.NewID(aip.PrefixRoute))} {
		a := action(capEcho, `{"message":"x"}`)
		for _, body := range []aip.Body{
			{Action: a},
			{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: a.ID}}},
			{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: a.ID}},
		} {
			route := f.d.Route(target, a.ID, a.CapabilityID, "")
			route.FenceToken = fence
			env, err := f.d.Envelope(target, body, route)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := f.d.Send(ctx, target, env)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != http.StatusForbidden {
				t.Fatalf("a %s with fence token %q: HTTP %d %s", body.Tag(), fence, resp.Status, resp.Raw)
			}
			pe := wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
			if !strings.Contains(pe.Message, "fence_token") {
				t.Errorf("the refusal does not say what is wrong: %s", pe.Message)
			}
		}
		if n := conn.runCount(a.ID); n != 0 {
			t.Fatalf("ran %d times", n)
		}
	}
}

// An action ID already journaled is answered from the journal only when
// the delivery is the same action: another capability or another
// idempotency key under the same action ID is a conflict, not the other
// action's result.
func TestActionIDReusedForAnotherActionIsAConflict(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"first"}`)
	a.IdempotencyKey = "key-1"
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Result(); err != nil {
		t.Fatal(err)
	}
	otherCap := *a
	otherCap.CapabilityID = capStream
	otherKey := *a
	otherKey.IdempotencyKey = "key-2"
	for name, b := range map[string]*aip.Action{"capability": &otherCap, "idempotency key": &otherKey} {
		resp, err := f.d.Act(ctx, target, b)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != http.StatusConflict {
			t.Fatalf("the same action ID with another %s: HTTP %d %s", name, resp.Status, resp.Raw)
		}
		wantCode(t, resp, http.StatusConflict, hostsdk.CodeIdempotencyConflict)
	}
	// The same action again is still answered from the journal.
	resp, err = f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("the same action again: %+v, %v", res, err)
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Fatalf("ran %d times", n)
	}
}

// withRouteMember returns env with member set in its security.connector_route.
func withRouteMember(t *testing.T, env *aip.Envelope, member string, value string) *aip.Envelope {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(env.Security[aip.SecurityConnectorRoute], &m); err != nil {
		t.Fatal(err)
	}
	m[member] = json.RawMessage(value)
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	env.Security[aip.SecurityConnectorRoute] = raw
	return env
}

// Approval fields where the reference forbids them, and route members the
// host does not know (a constraint it would silently not enforce), are
// refused with a signed route_mismatch; the action never runs.
func TestRouteApprovalAndUnknownMembersAreRefused(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ctx := ctxT(t)
	approval := `{"approval_id":"appr_0190f0d4a5e17a3b8c4d5e6f708192a3","status":"approved"}`

	cases := []struct {
		name string
		env  func(a *aip.Action) *aip.Envelope
	}{
		{"cancel with approval_authorization", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: a.ID}}}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "approval_authorization", approval)
		}},
		{"status query with approval_authorization", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: a.ID}}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "approval_authorization", approval)
		}},
		{"action approval without the route's authorization", func(a *aip.Action) *aip.Envelope {
			a.Approval = json.RawMessage(approval)
			env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return env
		}},
		{"route authorization without the action's approval", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "approval_authorization", approval)
		}},
		{"unknown route member", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "max_spend", `100`)
		}},
		// encoding/json binds these to tenant_id and fence_token, the
		// reference's serde_json to nothing (aip.ErrCaseVariantMember).
		{"route member that differs from a field only in case", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "Tenant_ID", `"`+f.cfg.TenantID+`"`)
		}},
		{"route member with a KELVIN SIGN for k", func(a *aip.Action) *aip.Envelope {
			env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
			return withRouteMember(t, env, "fence_to\u212aen", `"`+aip.NewID(aip.PrefixRoute)+`"`)
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := action(capEcho, `{"message":"x"}`)
			resp, err := f.d.Send(ctx, target, c.env(a))
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != http.StatusForbidden {
				t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
			}
			wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
			if n := conn.runCount(a.ID); n != 0 {
				t.Fatalf("ran %d times", n)
			}
		})
	}
	t.Run("null approval_authorization is absent", func(t *testing.T) {
		a := action(capEcho, `{"message":"x"}`)
		env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
		resp, err := f.d.Send(ctx, target, withRouteMember(t, env, "approval_authorization", `null`))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("%+v, %v", res, err)
		}
	})
}

// A second delivery of an action this replica is running, or has
// journaled, is never refused with connector_host.capacity or not_ready:
// those signed refusals tell the dispatcher the action did not start here
// (it settles the route as not run, or moves it), and it did. The
// delivery waits for the running action, or is answered from the journal.
func TestDuplicateOfARunningActionIsNotRefusedAsNotStarted(t *testing.T) {
	f := newFleet(t)
	f.cfg.MaxInFlight = 1
	f.cfg.DrainLinger = 3 * time.Second
	spy := &claimSpy{Journal: f.j, claimed: make(chan string, 16)}
	f.cfg.Journal = spy
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capBlock, `{"message":"hold"}`)
	first := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := f.d.Act(ctx, target, a)
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	<-conn.started
	// An unrelated action is refused: the replica is full.
	other, err := f.d.Act(ctx, target, action(capEcho, `{"message":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, other, http.StatusTooManyRequests, hostsdk.CodeCapacity)

	// A new message for the running action (a retry after a lost answer).
	env, err := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
	if err != nil {
		t.Fatal(err)
	}
	raw := signedCopy(t, f.d, env)
	second := make(chan *hostsdktest.Response, 1)
	go func() {
		resp, err := f.d.Post(ctx, target, raw, env.MessageID)
		if err != nil {
			t.Error(err)
		}
		second <- resp
	}()
	for id := range spy.claimed {
		if id == env.MessageID {
			break
		}
	}
	select {
	case resp := <-second:
		t.Fatalf("the second delivery of a running action was answered before it finished: HTTP %d %s", resp.Status, resp.Raw)
	default:
	}
	close(conn.release)
	for _, ch := range []chan *hostsdktest.Response{first, second} {
		resp := <-ch
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("HTTP %d: %+v, %v", resp.Status, res, err)
		}
	}
	if n := conn.runCount(a.ID); n != 1 {
		t.Fatalf("ran %d times", n)
	}

	// Draining: a journaled action is answered from the journal, a new
	// one refused.
	stopped := make(chan error, 1)
	go func() { stopped <- h.Stop(ctx) }()
	if err := f.cp.Await(ctx, hasOp(aip.OpDrain)); err != nil {
		t.Fatal(err)
	}
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("a journaled action delivered during the drain: HTTP %d %s", resp.Status, resp.Raw)
	}
	resp, err = f.d.Act(ctx, target, action(capEcho, `{"message":"new"}`))
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeNotReady)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
}

// claimSpy reports the message IDs claimed in the replay registry.
type claimSpy struct {
	*memjournal.Journal
	claimed chan string
}

func (s *claimSpy) ClaimMessage(ctx context.Context, id string, expires, now time.Time) (bool, error) {
	ok, err := s.Journal.ClaimMessage(ctx, id, expires, now)
	select {
	case s.claimed <- id:
	default:
	}
	return ok, err
}

// A cancel or status query names its action by the route's action_id and
// its own target: one that is not an action ID (act_ and a UUIDv7) can name
// no action this replica ever journaled (an action's ID is checked), and is
// refused as a route mismatch. A cancel journals nothing for it (no
// tombstone row under an arbitrary string), and neither answers a string
// the journal cannot hold (NUL, not UTF-8) as a storage outage.
func TestCancelAndStatusOfAStringThatIsNoActionIDAreRefused(t *testing.T) {
	f := newFleet(t)
	_, target := f.start(t, newTestConnector())
	ctx := ctxT(t)
	for _, id := range []string{
		"not-an-action",
		"act_" + strings.Repeat("0", 32),
		"act_0190f0a0b1c27def8a1b2c3d4e5f6a7\x00",
		"act_" + strings.Repeat("a", 4<<10),
	} {
		name := id
		if len(name) > 40 {
			name = name[:40]
		}
		t.Run("cancel "+name, func(t *testing.T) {
			resp, err := f.d.Cancel(ctx, target, id, capEcho, "")
			if resp == nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
			if _, err := f.j.Action(ctx, id); !errors.Is(err, journal.ErrNotFound) && !errors.Is(err, journal.ErrInvalid) {
				t.Errorf("the journal holds a record for the cancel's target: %v", err)
			}
		})
		t.Run("status "+name, func(t *testing.T) {
			_, resp, err := f.d.Status(ctx, target, id, capEcho)
			if resp == nil {
				t.Fatal(err)
			}
			wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
		})
	}
}

// A signed refusal quotes what it refuses (a route member that does not
// match, a capability ID), and quoting can double a string's size (a
// quote mark is written \" and then escaped again in the answer's JSON):
// the answer's message is bounded (aip.MaxErrorMessageBytes), so the
// answer to a message within aip.MaxMessageBytes stays within what a
// dispatcher reads, and the refusal reaches it signed.
func TestRefusalQuotingAHugeMemberStaysReadable(t *testing.T) {
	f := newFleet(t)
	_, target := f.start(t, newTestConnector())
	ctx := ctxT(t)
	a := action(capEcho, `{"message":"x"}`)
	route := f.d.Route(target, a.ID, a.CapabilityID, "")
	route.TenantID = strings.Repeat(`"`, 1800<<10)
	env, err := f.d.Envelope(target, aip.Body{Action: a}, route)
	if err != nil {
		t.Fatal(err)
	}
	raw := signedCopy(t, f.d, env)
	if len(raw) > aip.MaxMessageBytes {
		t.Fatalf("the request is %d bytes, over %d", len(raw), aip.MaxMessageBytes)
	}
	resp, err := f.d.Post(ctx, target, raw, env.MessageID)
	if err != nil {
		t.Fatalf("the refusal is not a readable signed answer: %v", err)
	}
	pe := wantCode(t, resp, http.StatusForbidden, hostsdk.CodeRouteMismatch)
	if len(pe.Message) > aip.MaxErrorMessageBytes {
		t.Errorf("the refusal's message is %d bytes, over %d", len(pe.Message), aip.MaxErrorMessageBytes)
	}
}
