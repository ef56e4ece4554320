package webhook

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stateConn is a connector that hands its route context's state store to
// the test.
type stateConn struct{ got chan *hostsdk.State }

func (c stateConn) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	return &aip.Manifest{ManifestVersion: "aip-manifest/v1", Agent: aip.Principal{ID: "agent:webhooktest", Kind: aip.PrincipalAgent},
		Profiles: []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{{ID: "cap:webhooktest:noop", Name: "noop", Kind: aip.KindTool,
			InputSchema: []byte(`{"type":"object"}`), Contract: &aip.CapabilityContract{
				SideEffects: []aip.SideEffect{aip.EffectRead},
				Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
				Execution:   aip.ExecutionContract{SupportsSync: true, ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
				Data:        aip.DataContract{Sensitivity: aip.SensitivityInternal}}}}}, nil
}

func (c stateConn) Handle(_ context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return call.Complete(map[string]any{})
}

func (c stateConn) Routes(_ context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	c.got <- rc.State
	return nil, nil
}

func hostState(t *testing.T) *hostsdk.State {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	c := stateConn{got: make(chan *hostsdk.State, 1)}
	hostsdktest.StartHost(t, hostsdktest.HostConfig(t, cp, d, nil), c)
	return <-c.got
}

func TestFence(t *testing.T) {
	st := hostState(t)
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	f := &Fence{Namespace: "aip.connector.test.webhook_replay.v1", Key: "instance:i1", Window: 5 * time.Minute, Capacity: 3}
	if seen, err := f.Seen(ctx, st, "d1", now); seen || err != nil {
		t.Fatalf("empty fence: Seen = %v, %v", seen, err)
	}
	for _, id := range []string{"d1", "d2"} {
		if dup, err := f.Record(ctx, st, id, now); dup || err != nil {
			t.Fatalf("Record(%s) = %v, %v", id, dup, err)
		}
	}
	if seen, _ := f.Seen(ctx, st, "d1", now.Add(time.Minute)); !seen {
		t.Fatal("d1 not seen a minute later")
	}
	if dup, err := f.Record(ctx, st, "d1", now.Add(time.Minute)); !dup || err != nil {
		t.Fatalf("Record(d1) again = %v, %v; want a duplicate", dup, err)
	}
	if seen, _ := f.Seen(ctx, st, "d1", now.Add(6*time.Minute)); seen {
		t.Fatal("d1 still seen after the window")
	}
	// Full: d3 fills it, d4 is refused without eviction.
	if _, err := f.Record(ctx, st, "d3", now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Record(ctx, st, "d4", now.Add(2*time.Minute)); !errors.Is(err, ErrFenceFull) {
		t.Fatalf("full fence: %v, want ErrFenceFull", err)
	}
	// With eviction the oldest (d1, d2 at now) goes.
	f.EvictOldest = true
	if _, err := f.Record(ctx, st, "d4", now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	at := now.Add(2 * time.Minute)
	held := 0
	for _, id := range []string{"d1", "d2", "d3", "d4"} {
		if seen, _ := f.Seen(ctx, st, id, at); seen {
			held++
		} else if id == "d3" || id == "d4" {
			t.Fatalf("after eviction %s is forgotten; only the oldest (d1 or d2) may be", id)
		}
	}
	if held != 3 {
		t.Fatalf("after eviction the fence holds %d deliveries, want its capacity 3", held)
	}
	// Past the window everything earlier is dropped on the next record.
	if dup, err := f.Record(ctx, st, "d9", now.Add(time.Hour)); dup || err != nil {
		t.Fatalf("Record after the window = %v, %v", dup, err)
	}
}

func TestHMACAndAnswers(t *testing.T) {
	mac := HMACSHA256([]byte("secret"), []byte("1700000000"), []byte("."), []byte(`{"a":1}`))
	if !EqualHex(mac, hex.EncodeToString(mac)) || !EqualHex(mac, strings.ToUpper(hex.EncodeToString(mac))) {
		t.Fatal("the signature's own hex does not verify")
	}
	bad := HMACSHA256([]byte("other"), []byte("1700000000"), []byte("."), []byte(`{"a":1}`))
	if EqualHex(mac, hex.EncodeToString(bad)) || EqualHex(mac, "zz") || EqualHex(mac, "") {
		t.Fatal("a wrong signature verifies")
	}
	w := httptest.NewRecorder()
	Fail(w, http.StatusUnauthorized, CodeAuthenticationFailed, "signature mismatch")
	if w.Code != 401 || !strings.Contains(w.Body.String(), `"code":"webhook.authentication_failed"`) {
		t.Fatalf("Fail wrote %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/webhooks/x", strings.NewReader(strings.Repeat("a", MaxBody+1)))
	if _, ok := ReadBody(w, r); ok || w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: ok, status %d", w.Code)
	}
}

// TestFenceClaim: a key claimed for an owner is held against every other
// owner (and Record) within the window, claimed again by its owner, and
// free after the window.
func TestFenceClaim(t *testing.T) {
	st := hostState(t)
	ctx := t.Context()
	now := time.Unix(1_800_000_000, 0)
	f := &Fence{Namespace: "aip.connector.test.webhook_replay.v1", Key: "instance:i1", Window: 5 * time.Minute, Capacity: 10}
	if held, err := f.Claim(ctx, st, "sig:aa", "d1", now); held || err != nil {
		t.Fatalf("Claim(sig:aa, d1) = %v, %v", held, err)
	}
	if held, err := f.Claim(ctx, st, "sig:aa", "d2", now.Add(time.Minute)); !held || err != nil {
		t.Fatalf("Claim(sig:aa, d2) = %v, %v; want held by d1", held, err)
	}
	if dup, err := f.Record(ctx, st, "sig:aa", now.Add(time.Minute)); !dup || err != nil {
		t.Fatalf("Record(sig:aa) = %v, %v; want a duplicate", dup, err)
	}
	if held, err := f.Claim(ctx, st, "sig:aa", "d1", now.Add(2*time.Minute)); held || err != nil {
		t.Fatalf("Claim(sig:aa, d1) again = %v, %v; want claimed again", held, err)
	}
	// Renewed at +2m: still held at +6m.
	if held, _ := f.Claim(ctx, st, "sig:aa", "d2", now.Add(6*time.Minute)); !held {
		t.Fatal("a claim renewed at +2m is free at +6m")
	}
	if held, err := f.Claim(ctx, st, "sig:aa", "d2", now.Add(8*time.Minute)); held || err != nil {
		t.Fatalf("Claim(sig:aa, d2) after the window = %v, %v", held, err)
	}
	// A key recorded without an owner is held against every owner.
	if _, err := f.Record(ctx, st, "sig:bb", now.Add(8*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if held, _ := f.Claim(ctx, st, "sig:bb", "d1", now.Add(8*time.Minute)); !held {
		t.Fatal("a key Record recorded is free to Claim")
	}
}

var publishFailures = []struct {
	name   string
	err    error
	status int
	level  string
}{
	{"event ahead", fmt.Errorf("%w: 6m0s ahead", hostsdk.ErrEventAhead), http.StatusServiceUnavailable, "WARN"},
	{"not serving", fmt.Errorf("%w: draining", hostsdk.ErrNotServing), http.StatusServiceUnavailable, "WARN"},
	{"invalid events", fmt.Errorf("%w: a NUL character", hostsdk.ErrInvalidEvents), http.StatusBadRequest, "WARN"},
	{"outbox full", fmt.Errorf("%w: 10000 batches", hostsdk.ErrEventOutboxFull), http.StatusServiceUnavailable, "WARN"},
	{"storage", errors.New("disk I/O error"), http.StatusServiceUnavailable, "ERROR"},
}

// TestRefusalsPublishFailed: Refusals.PublishFailed answers each kind of
// refusal with its status and logs it with the route, args and the error
// (a refusal answered without a log line lost its event without a trace:
// the products that deliver never resend a refused delivery), but at most
// a line a minute of each kind, the next carrying the count of those not
// logged. The PublishFailed function it replaced logged every refusal, so
// a delivery resent while the host keeps refusing it (a full outbox, a
// clock behind) wrote a line each time.
func TestRefusalsPublishFailed(t *testing.T) {
	var buf bytes.Buffer
	r := &Refusals{Log: slog.New(slog.NewTextHandler(&buf, nil)), Route: "test webhook"}
	lines := func() []string { return takeLines(&buf) }
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range publishFailures {
		for i := range 3 {
			rec := httptest.NewRecorder()
			r.PublishFailed(rec, now.Add(time.Duration(i)*time.Second), tc.err, "delivery", fmt.Sprintf("dlv-%d", i))
			if rec.Code != tc.status {
				t.Errorf("%s: answered %d, want %d", tc.name, rec.Code, tc.status)
			}
		}
		if got := lines(); len(got) != 1 || !strings.Contains(got[0], "level="+tc.level) || !strings.Contains(got[0], "test webhook") ||
			!strings.Contains(got[0], "delivery=dlv-0") || !strings.Contains(got[0], tc.err.Error()) || strings.Contains(got[0], "not_logged_since") {
			t.Errorf("%s: three refusals within a minute logged %q, want one %s line with the route, the first delivery and the error", tc.name, got, tc.level)
		}
	}
	later := now.Add(RefusalLogEvery)
	for _, tc := range publishFailures {
		r.PublishFailed(httptest.NewRecorder(), later, tc.err, "delivery", "dlv-later")
		if got := lines(); len(got) != 1 || !strings.Contains(got[0], "delivery=dlv-later") || !strings.Contains(got[0], "not_logged_since=2") {
			t.Errorf("%s: the refusal a minute later logged %q, want one line counting the 2 not logged", tc.name, got)
		}
	}
}

// TestRefusalsResendStatus: Refusals.ResendStatus is the status of every
// PublishFailed answer asking for the delivery again (the 503s of
// publishFailures), so that a product resending only some statuses
// (Chatwoot's agent bots: 429 and 500) does; a refusal for the events'
// content keeps its 400.
func TestRefusalsResendStatus(t *testing.T) {
	r := &Refusals{Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Route: "test webhook", ResendStatus: http.StatusInternalServerError}
	for _, tc := range publishFailures {
		want := tc.status
		if want == http.StatusServiceUnavailable {
			want = http.StatusInternalServerError
		}
		rec := httptest.NewRecorder()
		r.PublishFailed(rec, time.Unix(1_800_000_000, 0), tc.err, "delivery", "dlv-1")
		if rec.Code != want {
			t.Errorf("%s: answered %d, want %d", tc.name, rec.Code, want)
		}
	}
}
