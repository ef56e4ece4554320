package sidecar

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// localReplica starts a fake connector on a unix socket and a sidecar
// attached to it.
func localReplica(t *testing.T, edit func(*Config)) (*replica, *fakeConnector) {
	t.Helper()
	f := newFakeConnector()
	f.token = "s3cret"
	sock, _ := serveFake(t, f)
	r := startReplica(t, func(c *Config) {
		c.Local = LocalConfig{Socket: sock, Token: "s3cret", CancelGrace: 2 * time.Second}
		if edit != nil {
			edit(c)
		}
	})
	return r, f
}

func TestLocalForwardsActionWithIdentity(t *testing.T) {
	r, f := localReplica(t, nil)
	ctx := ctxT(t)
	a := act("echo.say", `{"message":"hello"}`)
	a.IdempotencyKey = "key-1"
	resp := must(r.d.Act(ctx, r.target, a))
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v", resp.Status, err)
	}
	if res.Status != aip.ResultCompleted || string(res.Output) != `{"message":"hello"}` || res.Receipt == nil {
		t.Fatalf("result %+v output %s", res, res.Output)
	}
	got := f.received()
	if len(got) != 1 {
		t.Fatalf("the connector received %d actions", len(got))
	}
	want := localAction{
		ActionID: a.ID, IdempotencyKey: "key-1", CapabilityID: "echo.say", Input: json.RawMessage(`{"message":"hello"}`),
		Mode: "sync", MessageID: got[0].MessageID,
		Tenant: localTenant{TenantID: r.host.TenantID, ConnectorTypeID: r.host.ConnectorTypeID, VersionID: r.host.VersionID,
			InstanceID: r.host.InstanceID, ReplicaID: r.host.ReplicaID, ConfigRevision: 1, TrustDomain: hostsdktest.TrustDomain},
		// The host's identity: the tenant and the dispatcher's principal
		// it verified the message against.
		Identity: &aip.IdentityContext{Tenant: &aip.TenantRef{ID: r.host.TenantID},
			ServiceAccount: &aip.Principal{ID: r.d.PrincipalID(), Kind: aip.PrincipalService, TrustDomain: hostsdktest.TrustDomain, DID: r.d.DID()}},
	}
	if diff := cmp.Diff(want, got[0]); diff != "" {
		t.Errorf("forwarded action (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(got[0].MessageID, aip.PrefixMessage) {
		t.Errorf("message_id %q", got[0].MessageID)
	}
	h := f.receivedHeaders()[0]
	if h.Get(HeaderActionID) != a.ID || h.Get(HeaderIdempotencyKey) != "key-1" || h.Get("Idempotency-Key") != "" {
		t.Errorf("headers %v", h)
	}

	// The same action again is answered from the journal: the connector
	// sees it once.
	if res, err := must(r.d.Act(ctx, r.target, a)).Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("duplicate: %+v %v", res, err)
	}
	if n := len(f.received()); n != 1 {
		t.Errorf("the connector received the action %d times", n)
	}
	// Without an idempotency key the action ID is the key.
	b := act("echo.say", `{"message":"x"}`)
	must(r.d.Act(ctx, r.target, b))
	if got := f.received()[1].IdempotencyKey; got != b.ID {
		t.Errorf("idempotency_key %q, want the action ID", got)
	}
}

// TestLocalForwardsConfiguredIdentity: a host configured with the identity
// settings (--tenant-system, --membership-id, --external-account-*,
// --credential-*) gives a local connector all of them: the identity
// context's members and, in the tenant object, the membership and the
// credential's revision, which no identity member carries.
func TestLocalForwardsConfiguredIdentity(t *testing.T) {
	r, f := localReplica(t, func(c *Config) {
		c.Host.TenantSystem, c.Host.MembershipID = "crm", "mem-7"
		c.Host.ExternalAccountID, c.Host.ExternalAccountSystem = "acct-9", "provider"
		c.Host.CredentialID, c.Host.CredentialIssuer, c.Host.CredentialScopes, c.Host.CredentialRevisionRef = "cred-acme", "vault", []string{"notes:write"}, "v2"
	})
	a := act("echo.say", `{"message":"hello"}`)
	if res, err := must(r.d.Act(ctxT(t), r.target, a)).Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("%+v %v", res, err)
	}
	got := f.received()[0]
	wantTenant := localTenant{TenantID: r.host.TenantID, ConnectorTypeID: r.host.ConnectorTypeID, VersionID: r.host.VersionID,
		InstanceID: r.host.InstanceID, ReplicaID: r.host.ReplicaID, ConfigRevision: 1, TrustDomain: hostsdktest.TrustDomain,
		MembershipID: "mem-7", CredentialRevisionRef: "v2"}
	if diff := cmp.Diff(wantTenant, got.Tenant); diff != "" {
		t.Errorf("tenant (-want +got):\n%s", diff)
	}
	wantIdentity := &aip.IdentityContext{Tenant: &aip.TenantRef{ID: r.host.TenantID, System: "crm"},
		ExternalAccount: &aip.AccountRef{ID: "acct-9", System: "provider"},
		ServiceAccount:  &aip.Principal{ID: r.d.PrincipalID(), Kind: aip.PrincipalService, TrustDomain: hostsdktest.TrustDomain, DID: r.d.DID()},
		CredentialRef:   &aip.CredentialRef{ID: "cred-acme", Issuer: "vault", Scopes: []string{"notes:write"}}}
	if diff := cmp.Diff(wantIdentity, got.Identity); diff != "" {
		t.Errorf("identity (-want +got):\n%s", diff)
	}
	// On the wire the two members are named as the protocol page says.
	raw, err := json.Marshal(got.Tenant)
	if err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{`"membership_id":"mem-7"`, `"credential_revision_ref":"v2"`} {
		if !strings.Contains(string(raw), member) {
			t.Errorf("the action body has no %s: %s", member, raw)
		}
	}
	body, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	validate(t, compileSchemas(t), "action-request", body)
}

func TestLocalStreamsChunks(t *testing.T) {
	r, _ := localReplica(t, nil)
	a := act("echo.stream", `{"message":"tick","chunks":4}`)
	a.Mode = aip.ModeStreaming
	resp := must(r.d.Act(ctxT(t), r.target, a))
	if len(resp.Chunks) != 4 {
		t.Fatalf("%d chunks: %s", len(resp.Chunks), resp.Raw)
	}
	for i, c := range resp.Chunks {
		if c.Kind != aip.ChunkProgress || c.Sequence != uint64(i) || string(c.Data) != `{"index":`+string(rune('0'+i))+`}` {
			t.Errorf("chunk %d: %+v %s", i, c, c.Data)
		}
	}
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCompleted || string(res.Output) != `{"chunks":4,"message":"tick"}` {
		t.Fatalf("final %+v %v", res, err)
	}
}

// TestLocalStreamBlankLinesAreBounded: empty lines between a stream's
// lines are skipped, but no more of them than MaxChunks: a connector
// sending only newlines was bounded by the action's deadline alone.
func TestLocalStreamBlankLinesAreBounded(t *testing.T) {
	r, _ := localReplica(t, func(c *Config) { c.Local.MaxChunks = 10 })
	a := act("echo.stream", `{"message":"tick","chunks":2,"blank_lines":10}`)
	a.Mode = aip.ModeStreaming
	resp := must(r.d.Act(ctxT(t), r.target, a))
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted || len(resp.Chunks) != 2 {
		t.Fatalf("10 empty lines: %d chunks, %s", len(resp.Chunks), resp.Raw)
	}
	a = act("echo.stream", `{"message":"tick","chunks":2,"blank_lines":11}`)
	a.Mode = aip.ModeStreaming
	resp = must(r.d.Act(ctxT(t), r.target, a))
	pe := resp.ProtocolError()
	if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "more than 10 empty lines") {
		t.Fatalf("11 empty lines: HTTP %d %s", resp.Status, resp.Raw)
	}
}

func TestLocalCancel(t *testing.T) {
	r, f := localReplica(t, nil)
	ctx := ctxT(t)
	a := act("echo.slow", `{"delay_ms":60000}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
	<-f.started
	res, err := must(r.d.Cancel(ctx, r.target, a.ID, "echo.slow", "the user changed their mind")).Result()
	if err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("cancel answered %+v %v", res, err)
	}
	if res, err := (<-done).Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("the action answered %+v %v", res, err)
	}
	var reasons []string
	for _, c := range f.cancelled() {
		if c.ActionID != a.ID {
			t.Errorf("cancel for %s", c.ActionID)
		}
		reasons = append(reasons, c.Reason)
	}
	if !strings.Contains(strings.Join(reasons, "|"), "the user changed their mind") {
		t.Errorf("the dispatcher's reason did not reach the connector: %q", reasons)
	}
}

func TestLocalCancelIgnoredIsOutcomeUnknown(t *testing.T) {
	r, f := localReplica(t, func(c *Config) { c.Local.CancelGrace = 50 * time.Millisecond })
	ctx := ctxT(t)
	a := act("echo.slow", `{"delay_ms":60000,"ignore_cancel":true}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
	<-f.started
	resp := must(r.d.Cancel(ctx, r.target, a.ID, "echo.slow", "stop"))
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "cancel grace") &&
		!strings.Contains(pe.Message, "did not answer within") {
		t.Fatalf("cancel answered HTTP %d %s", resp.Status, resp.Raw)
	}
	if pe := (<-done).ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
		t.Fatalf("the action did not end outcome_unknown")
	}
}

func TestLocalTimeoutCancelsTheConnector(t *testing.T) {
	r, f := localReplica(t, nil)
	a := act("echo.slow", `{"delay_ms":60000}`)
	ms := uint64(50)
	a.TimeoutMS = &ms
	resp := must(r.d.Act(ctxT(t), r.target, a))
	// The connector answered cancelled within the grace: that is the result.
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
	}
	if c := f.cancelled(); len(c) == 0 || !strings.Contains(c[0].Reason, "timed out") {
		t.Errorf("cancels %+v", c)
	}
}

func TestLocalCrashMidActionIsOutcomeUnknown(t *testing.T) {
	r, _ := localReplica(t, nil)
	resp := must(r.d.Act(ctxT(t), r.target, act("echo.crash", `{}`)))
	pe := resp.ProtocolError()
	if resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "did it crash") {
		t.Fatalf("HTTP %d %s", resp.Status, resp.Raw)
	}
}

func TestLocalUnreachableIsNotDelivered(t *testing.T) {
	f := newFakeConnector()
	sock, stopFake := serveFake(t, f)
	r := startReplica(t, func(c *Config) { c.Local = LocalConfig{Socket: sock} })
	stopFake() // the connector goes away; the host's health is cached until its next probe
	res, err := must(r.d.Act(ctxT(t), r.target, act("echo.say", `{"message":"x"}`))).Result()
	if err != nil || res.Status != aip.ResultFailed || res.Error.Code != CodeConnectorUnavailable || !res.Error.IsRetryable() {
		t.Fatalf("result %+v %v", res, err)
	}
	if !strings.Contains(res.Error.Message, "did not run") {
		t.Errorf("message %q", res.Error.Message)
	}
	code, doc := r.ready(t)
	if code != http.StatusServiceUnavailable || doc.Connector.Ready {
		t.Errorf("/ready %d %+v", code, doc.Connector)
	}
}

// TestLocalAnswers maps the connector's HTTP answers to results.
func TestLocalAnswers(t *testing.T) {
	r, _ := localReplica(t, nil)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		status int
		body   string
		// want: a result status, or an error code of the answer
		result aip.ResultStatus
		code   string
	}{
		{"completed", 200, `{"status":"completed","output":{"a":1}}`, aip.ResultCompleted, ""},
		{"failed with error", 200, `{"status":"failed","error":{"code":"x.y","message":"no","category":"permanent"}}`, aip.ResultFailed, "x.y"},
		{"failed without error", 200, `{"status":"failed","detail":"broke"}`, aip.ResultFailed, "connector.failed"},
		{"cancelled", 200, `{"status":"cancelled"}`, aip.ResultCancelled, ""},
		{"outcome unknown", 200, `{"status":"outcome_unknown","detail":"provider timed out"}`, "", hostsdk.CodeOutcomeUnknown},
		{"unknown field", 200, `{"status":"completed","extra":1}`, "", hostsdk.CodeOutcomeUnknown},
		// encoding/json would read "Status" as status; the local protocol's
		// member names are exact, as on the wire.
		{"case variant member", 200, `{"Status":"completed","output":{"a":1}}`, "", hostsdk.CodeOutcomeUnknown},
		{"case variants of one member", 200, `{"status":"failed","STATUS":"completed"}`, "", hostsdk.CodeOutcomeUnknown},
		{"case variant inside", 200, `{"status":"failed","error":{"code":"x.y","Message":"no","category":"permanent"}}`, "", hostsdk.CodeOutcomeUnknown},
		{"other action", 200, `{"action_id":"act_00000000000000000000000000000000","status":"completed"}`, "", hostsdk.CodeOutcomeUnknown},
		{"bad status", 200, `{"status":"done"}`, "", hostsdk.CodeOutcomeUnknown},
		{"not json", 200, `<html>`, "", hostsdk.CodeOutcomeUnknown},
		{"400 with error", 400, `{"error":{"code":"x.bad","message":"bad input","category":"permanent"}}`, aip.ResultFailed, "x.bad"},
		{"404 without error", 404, `nope`, aip.ResultFailed, CodeConnectorRejected},
		{"503", 503, `{}`, aip.ResultFailed, CodeConnectorRejected},
		{"500", 500, `{"error":{"code":"x.boom","message":"boom","category":"connector"}}`, "", hostsdk.CodeOutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in, _ := json.Marshal(map[string]any{"status": tc.status, "body": json.RawMessage(mustJSONish(tc.body))})
			resp := must(r.d.Act(ctx, r.target, act("echo.status", string(in))))
			if tc.result == "" {
				pe := resp.ProtocolError()
				if pe == nil || pe.Code != tc.code {
					t.Fatalf("HTTP %d %s, want error %s", resp.Status, resp.Raw, tc.code)
				}
				return
			}
			res, err := resp.Result()
			if err != nil {
				t.Fatalf("HTTP %d: %v", resp.Status, err)
			}
			if res.Status != tc.result || (tc.code != "" && (res.Error == nil || res.Error.Code != tc.code)) {
				t.Fatalf("result %+v error %+v", res, res.Error)
			}
		})
	}
}

// mustJSONish quotes a body that is not JSON so it can travel in the
// fake's input; the fake writes body's raw JSON value, so a quoted string
// arrives as a JSON string (still not a result).
func mustJSONish(s string) string {
	if json.Valid([]byte(s)) {
		return s
	}
	q, _ := json.Marshal(s)
	return string(q)
}

func TestLocalReconcile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answers []func() (int, any)
		status  aip.ResultStatus
		code    string
		unknown bool
		// retry: a failure recovery retries (not an outcome).
		retry bool
		// logged: the sidecar logs the action ID and this.
		logged string
	}{
		{name: "completed", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "completed", "output": map[string]bool{"reconciled": true}}
		}}, status: aip.ResultCompleted},
		{name: "not found", answers: []func() (int, any){func() (int, any) { return 200, map[string]any{"status": "not_found"} }},
			status: aip.ResultFailed, code: CodeNotExecuted},
		{name: "running then done", answers: []func() (int, any){
			func() (int, any) { return 200, map[string]any{"status": "running"} },
			func() (int, any) { return 200, map[string]any{"status": "cancelled"} },
		}, status: aip.ResultCancelled},
		{name: "outcome unknown", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "outcome_unknown", "detail": "provider cannot tell"}
		}}, unknown: true},
		{name: "no endpoint", answers: nil, unknown: true},
		// "no record" of another action says nothing about this one: it
		// must not become not_executed (which invites a second run).
		{name: "not found for another action", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "not_found", "action_id": "act_other"}
		}}, unknown: true},
		{name: "running for another action", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "running", "action_id": "act_other"}
		}}, unknown: true},
		{name: "not found with a result's members", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "not_found", "output": map[string]bool{"done": true}}
		}}, unknown: true},
		{name: "not found naming this action", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "not_found", "action_id": "act_01"}
		}}, status: aip.ResultFailed, code: CodeNotExecuted},
		// A 200 whose body is not a reconcile answer would fail every
		// restart's recovery the same way: the action is outcome_unknown.
		{name: "200 that is not an object", answers: []func() (int, any){func() (int, any) { return 200, "done" }},
			unknown: true, logged: "is not a reconcile answer"},
		{name: "200 with an unknown member", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "completed", "result": "done"}
		}}, unknown: true, logged: `unknown member \"result\"`},
		{name: "200 with a case variant member", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"Status": "completed"}
		}}, unknown: true, logged: "member names are case-sensitive"},
		{name: "200 with an invalid result", answers: []func() (int, any){func() (int, any) {
			return 200, map[string]any{"status": "finished"}
		}}, unknown: true},
		// A 5xx may pass: recovery tries again.
		{name: "server error", answers: []func() (int, any){func() (int, any) { return 500, map[string]any{} }}, retry: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeConnector()
			sock, _ := serveFake(t, f)
			i := 0
			if tc.answers != nil {
				f.reconcileAnswer = func(localReconcile) (int, any) {
					a := tc.answers[min(i, len(tc.answers)-1)]
					i++
					return a()
				}
			}
			var logs hostsdktest.LogBuffer
			l, err := NewLocal(LocalConfig{Socket: sock, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			started := time.Now().Add(-time.Second)
			res, err := l.Reconcile(ctxT(t), &hostsdk.UncertainAction{Action: journalAction("act_01", started)})
			if tc.retry {
				var le *LocalError
				if errors.Is(err, hostsdk.ErrOutcomeUnknown) || !errors.As(err, &le) || le.Status != 500 {
					t.Fatalf("got %+v, %v; want a *LocalError with HTTP 500", res, err)
				}
				return
			}
			if tc.unknown {
				if !errors.Is(err, hostsdk.ErrOutcomeUnknown) {
					t.Fatalf("got %+v, %v; want outcome unknown", res, err)
				}
				if tc.logged != "" && (!strings.Contains(logs.String(), `"action_id":"act_01"`) || !strings.Contains(logs.String(), tc.logged)) {
					t.Errorf("log %s; want the action ID and %q", logs.String(), tc.logged)
				}
				return
			}
			if err != nil || res.Status != tc.status || (tc.code != "" && res.Error.Code != tc.code) {
				t.Fatalf("got %+v, %v", res, err)
			}
			f.mu.Lock()
			rc := f.reconcile[0]
			f.mu.Unlock()
			if rc.ActionID != "act_01" || rc.IdempotencyKey != "key-act_01" || rc.CapabilityID != "echo.say" || rc.StartedAt == nil {
				t.Errorf("reconcile request %+v", rc)
			}
		})
	}
}

func TestLocalConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		cfg  LocalConfig
		want string
	}{
		{LocalConfig{}, "--local-url"},
		{LocalConfig{URL: "http://127.0.0.1:1", Socket: "/x"}, "exactly one"},
		{LocalConfig{URL: "http://10.0.0.1:80"}, "loopback"},
		{LocalConfig{URL: "https://127.0.0.1:80"}, "http://"},
		{LocalConfig{URL: "http://127.0.0.1:80/base"}, "only the origin"},
		{LocalConfig{URL: "http://localhost"}, "port"},
		{LocalConfig{Socket: "/" + strings.Repeat("x", 200)}, "at most 107"},
		{LocalConfig{URL: "http://[::1]:8", OnManifestChange: "ignore"}, "report or unready"},
		{LocalConfig{URL: "http://[::1]:8", MaxResultBytes: -1}, "Local.MaxResultBytes"},
		{LocalConfig{URL: "http://[::1]:8", MaxChunkBytes: -1}, "Local.MaxChunkBytes"},
		{LocalConfig{URL: "http://[::1]:8", MaxChunks: -1}, "Local.MaxChunks"},
		{LocalConfig{URL: "http://[::1]:8", Token: "a b"}, "Local.Token"},
		{LocalConfig{URL: "http://[::1]:8", Token: "tok\x00en"}, "Local.Token"},
		{LocalConfig{URL: "http://[::1]:8", Token: "tok\x7fen"}, "Local.Token"},
		{LocalConfig{URL: "http://[::1]:8", Token: "jeton-é"}, "Local.Token"},
	} {
		_, err := NewLocal(tc.cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("NewLocal(%+v) = %v; want a ConfigError mentioning %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := NewLocal(LocalConfig{URL: "http://localhost:8700"}); err != nil {
		t.Errorf("localhost: %v", err)
	}
}

// TestLocalManifestNeedsContracts: a capability declared without a
// contract was admitted and, having no side effects declared, taken for
// one that may write (a read cut off by a crash became outcome_unknown,
// not retryable); start-up (here --print-manifest) now fails, naming the
// capability and what to declare.
func TestLocalManifestNeedsContracts(t *testing.T) {
	f := newFakeConnector()
	sock, _ := serveFake(t, f)
	m := fakeManifest("")
	m.Capabilities[2].Contract = nil
	f.manifest.Store(m)
	_, _, err := Describe(ctxT(t), Config{Host: hostsdk.Config{TrustDomain: "example.org"}, Local: LocalConfig{Socket: sock}})
	for _, want := range []string{"invalid manifest: capability echo.slow has no contract; declare one with side_effects", "idempotency, execution and data"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Describe = %v; want an error saying %q", err, want)
		}
	}
}

// TestLocalManifestVersion: any non-empty manifest_version was admitted
// (a typo became part of the digest); a local connector's manifest now
// has one of the forms AIP writes, and another fails start-up naming the
// member and the accepted values.
func TestLocalManifestVersion(t *testing.T) {
	f := newFakeConnector()
	sock, _ := serveFake(t, f)
	for version, want := range map[string]string{
		"aip-manifest/v1": "",
		"1.0":             "",
		"aip-manifest/v2": `invalid manifest: manifest_version is "aip-manifest/v2"; want "aip-manifest/v1" (the form AIP connectors write; "1.0", the form of its registry examples, is accepted too)`,
		"v1":              `manifest_version is "v1"; want "aip-manifest/v1"`,
	} {
		m := fakeManifest("")
		m.ManifestVersion = version
		f.manifest.Store(m)
		_, _, err := Describe(ctxT(t), Config{Host: hostsdk.Config{TrustDomain: "example.org"}, Local: LocalConfig{Socket: sock}})
		switch {
		case want == "" && err != nil:
			t.Errorf("manifest_version %q: Describe = %v; want it accepted", version, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("manifest_version %q: Describe = %v; want an error saying %q", version, err, want)
		}
	}
}

// TestDescribeBindsLikeTheHost: --print-manifest binds the connector's
// manifest with the host's checks, so what it prints is what a host with
// that trust domain registers, and what a host refuses it refuses too.
func TestDescribeBindsLikeTheHost(t *testing.T) {
	f := newFakeConnector()
	sock, _ := serveFake(t, f)
	describe := func(trustDomain string) (*aip.Manifest, string, error) {
		return Describe(ctxT(t), Config{Host: hostsdk.Config{TrustDomain: trustDomain}, Local: LocalConfig{Socket: sock}})
	}
	m, digest, err := describe("example.org")
	if err != nil {
		t.Fatal(err)
	}
	want := fakeManifest("")
	want.Agent.TrustDomain = "example.org"
	if wantDigest := must(aip.ManifestDigest(want)); digest != wantDigest || m.Agent.TrustDomain != "example.org" || m.Agent.DID != "" {
		t.Errorf("Describe = %+v, %s; want digest %s", m.Agent, digest, wantDigest)
	}
	for _, tc := range []struct {
		name        string
		edit        func(*aip.Manifest)
		trustDomain string
		want        string
	}{
		{"another trust domain", func(m *aip.Manifest) { m.Agent.TrustDomain = "other.org" }, "example.org", `differs from --trust-domain "example.org"`},
		{"no trust domain", func(*aip.Manifest) {}, "", "--trust-domain"},
		{"no native profile", func(m *aip.Manifest) { m.Profiles = []string{"aip-mcp/v1"} }, "example.org", aip.NativeHTTPProfile},
		{"schema with a remote $ref", func(m *aip.Manifest) {
			m.Capabilities[0].InputSchema = json.RawMessage(`{"$ref":"https://example.com/schema.json"}`)
		}, "example.org", "echo.say input_schema"},
	} {
		m := fakeManifest("")
		tc.edit(m)
		f.manifest.Store(m)
		_, _, err := describe(tc.trustDomain)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Describe = %v; want an error mentioning %q", tc.name, err, tc.want)
		}
	}
}

// TestLocalTrailingDataIsRefused: results and the manifest are decoded
// strictly, and data after the JSON value — including a stray closing
// brace or bracket — makes the answer invalid.
func TestLocalTrailingDataIsRefused(t *testing.T) {
	r, _ := localReplica(t, nil)
	ctx := ctxT(t)
	for _, raw := range []string{
		`{"status":"completed","output":{"a":1}}}`,
		`{"status":"completed","output":{"a":1}}]`,
		`{"status":"completed","output":{"a":1}} {}`,
	} {
		in, _ := json.Marshal(map[string]any{"status": 200, "raw": raw})
		resp := must(r.d.Act(ctx, r.target, act("echo.status", string(in))))
		if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
			t.Errorf("answer %s: HTTP %d %s; want outcome_unknown", raw, resp.Status, resp.Raw)
		}
	}

	// The manifest: start-up (here --print-manifest) fails.
	sock := socketPath(t)
	serveAt(t, http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == PathLocalManifest {
			raw, _ := json.Marshal(fakeManifest(""))
			w.Write(append(raw, '}'))
			return
		}
		w.Write([]byte(`{"status":"ok"}`))
	}), sock)
	if _, _, err := Describe(ctx, Config{Host: hostsdk.Config{TrustDomain: "example.org"}, Local: LocalConfig{Socket: sock}}); err == nil ||
		!strings.Contains(err.Error(), "not an AIP manifest") {
		t.Errorf("Describe = %v; want the manifest refused for its trailing data", err)
	}
}

// TestLocalZeroTimeoutIsBoundedByMaxActionDuration: timeout_ms 0 sets no
// deadline in the host, so the action is bounded by MaxActionDuration
// like one without timeout_ms.
func TestLocalZeroTimeoutIsBoundedByMaxActionDuration(t *testing.T) {
	r, f := localReplica(t, func(c *Config) { c.Local.MaxActionDuration = 50 * time.Millisecond })
	a := act("echo.slow", `{"delay_ms":20000}`)
	zero := uint64(0)
	a.TimeoutMS = &zero
	resp := must(r.d.Act(ctxT(t), r.target, a))
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("HTTP %d %s; want the action cancelled at MaxActionDuration", resp.Status, resp.Raw)
	}
	if c := f.cancelled(); len(c) == 0 || c[0].ActionID != a.ID {
		t.Errorf("cancels %+v", c)
	}
}

// TestLocalCancelGraceRunsWhileTheCancelIsUnanswered: a connector that
// answers neither the action nor its cancel (a wedged single-threaded
// server) has CancelGrace from the cancellation, not from the cancel's
// answer, before the action is recorded outcome_unknown.
func TestLocalCancelGraceRunsWhileTheCancelIsUnanswered(t *testing.T) {
	f := newFakeConnector()
	release := make(chan struct{})
	sock := socketPath(t)
	serveAt(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == PathLocalActions, strings.HasSuffix(r.URL.Path, "/cancel"):
			<-release // never answers while the test runs
		default:
			f.ServeHTTP(w, r)
		}
	}), sock)
	defer close(release) // before the replica stops
	r := startReplica(t, func(c *Config) {
		// A cancel request may take as long as it likes; the grace is short.
		c.Local = LocalConfig{Socket: sock, CancelGrace: 50 * time.Millisecond, RequestTimeout: time.Hour}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // fail-safe only
	defer cancel()
	a := act("echo.slow", `{}`)
	ms := uint64(50)
	a.TimeoutMS = &ms
	resp, err := r.d.Act(ctx, r.target, a)
	if err != nil {
		t.Fatalf("no answer while the cancel was unanswered: %v", err)
	}
	if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "cancel") {
		t.Fatalf("HTTP %d %s; want outcome_unknown after the cancel grace", resp.Status, resp.Raw)
	}
}

// TestLocalManifestChangeEndsWithoutAnOutage: under ManifestChangeUnready
// the replica stays unready only until the connector describes the
// admitted manifest again, also when the connector is rolled back without
// a health check seeing it down.
func TestLocalManifestChangeEndsWithoutAnOutage(t *testing.T) {
	r, f := localReplica(t, func(c *Config) { c.Local.OnManifestChange = ManifestChangeUnready })
	hc := r.s.Connector().(hostsdk.HealthChecker)
	ctx := ctxT(t)
	f.healthy.Store(false)
	if err := hc.CheckHealth(ctx); err == nil {
		t.Fatal("CheckHealth = nil for an unhealthy connector")
	}
	f.manifest.Store(fakeManifest(" v2"))
	f.healthy.Store(true)
	if err := hc.CheckHealth(ctx); !errors.Is(err, ErrManifestChanged) {
		t.Fatalf("CheckHealth = %v; want ErrManifestChanged", err)
	}
	f.manifest.Store(fakeManifest("")) // rolled back between two health checks
	if err := hc.CheckHealth(ctx); err != nil {
		t.Fatalf("CheckHealth = %v after the admitted manifest is back", err)
	}
	if st := r.status(t); st.ManifestChange != nil || !st.Healthy {
		t.Errorf("status %+v", st)
	}
}

// TestLocalManifestChangeReportsEveryPart: a change of capabilities and of
// fields outside them reports both.
func TestLocalManifestChangeReportsEveryPart(t *testing.T) {
	r, f := localReplica(t, nil)
	hc := r.s.Connector().(hostsdk.HealthChecker)
	ctx := ctxT(t)
	f.healthy.Store(false)
	hc.CheckHealth(ctx)
	m := fakeManifest(" v2")
	m.Agent.DisplayName = "Renamed"
	f.manifest.Store(m)
	f.healthy.Store(true)
	if err := hc.CheckHealth(ctx); err != nil {
		t.Fatalf("CheckHealth = %v under ManifestChangeReport", err)
	}
	c := r.status(t).ManifestChange
	if n := len(fakeManifest("").Capabilities); c == nil || len(c.Changed) != n || !c.Other {
		t.Fatalf("change %+v; want %d changed capabilities and other fields", c, n)
	}
	if s := c.String(); !strings.Contains(s, "changed echo.crash") || !strings.Contains(s, "outside the capabilities") {
		t.Errorf("change %q", s)
	}
}

// TestLocalLargeErrorBodyIsQuoted: an error body beyond 64 KiB is read up
// to 64 KiB; its start is quoted, not reported as empty.
func TestLocalLargeErrorBodyIsQuoted(t *testing.T) {
	r, _ := localReplica(t, nil)
	body := "proxy error: upstream refused " + strings.Repeat("x", 70<<10)
	in, _ := json.Marshal(map[string]any{"status": 400, "raw": body})
	res, err := must(r.d.Act(ctxT(t), r.target, act("echo.status", string(in)))).Result()
	if err != nil || res.Status != aip.ResultFailed || res.Error.Code != CodeConnectorRejected {
		t.Fatalf("result %+v %v", res, err)
	}
	if !strings.Contains(res.Error.Message, "proxy error: upstream refused") {
		t.Errorf("message %q; want the body's start", res.Error.Message)
	}
}

// TestLocalResultTooLargeOfARead: a local connector's result over the
// sidecar's limit is a failed result (output_invalid, saying to ask for
// less) for a read-only capability, whose read changed nothing, as the
// host answers a Go connector's result too large to carry; for a
// capability with effects it stays outcome_unknown.
func TestLocalResultTooLargeOfARead(t *testing.T) {
	for _, c := range []struct {
		name    string
		effects []aip.SideEffect
	}{{"read", []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}}, {"write", []aip.SideEffect{aip.EffectWrite}}} {
		t.Run(c.name, func(t *testing.T) {
			r := localReplicaWithEffects(t, "echo.say", c.effects, LocalConfig{MaxResultBytes: 1024})
			a := act("echo.say", `{"message":"`+strings.Repeat("x", 2000)+`"}`)
			resp := must(r.d.Act(ctxT(t), r.target, a))
			if c.name == "write" {
				if pe := resp.ProtocolError(); resp.Status != http.StatusBadGateway || pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
					t.Fatalf("HTTP %d %s; want 502 outcome_unknown", resp.Status, resp.Raw)
				}
				return
			}
			res, err := resp.Result()
			if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeOutputInvalid ||
				!strings.Contains(res.Error.Message, "1024 bytes") || !strings.Contains(res.Error.Message, "ask for less") {
				t.Fatalf("HTTP %d %s (%v); want a failed result output_invalid saying to ask for less", resp.Status, resp.Raw, err)
			}
		})
	}
}

// TestLocalBrokenStreamOfARead: a local connector's stream that breaks the
// protocol (here more chunks than MaxChunks) leaves a write's outcome
// unknown, but a read-only capability's action fails with output_invalid:
// the read changed nothing, so the caller may ask again, and the
// dispatcher does not count it against the replica as an unknown outcome.
func TestLocalBrokenStreamOfARead(t *testing.T) {
	for _, c := range []struct {
		name    string
		effects []aip.SideEffect
	}{{"read", []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}}, {"write", []aip.SideEffect{aip.EffectWrite}}} {
		t.Run(c.name, func(t *testing.T) {
			r := localReplicaWithEffects(t, "echo.stream", c.effects, LocalConfig{MaxChunks: 2})
			a := act("echo.stream", `{"message":"tick","chunks":4}`)
			a.Mode = aip.ModeStreaming
			resp := must(r.d.Act(ctxT(t), r.target, a))
			if c.name == "write" {
				if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
					t.Fatalf("HTTP %d %s; want outcome_unknown", resp.Status, resp.Raw)
				}
				return
			}
			res, err := resp.Result()
			if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeOutputInvalid ||
				!strings.Contains(res.Error.Message, "more than 2 chunks") || !strings.Contains(res.Error.Message, "changed nothing") {
				t.Fatalf("HTTP %d %s (%v); want a failed result output_invalid naming the broken stream", resp.Status, resp.Raw, err)
			}
		})
	}
}

// TestLocalUnusableAnswerOfARead: a local connector's 200 whose body is
// not a result leaves a write's outcome unknown, but a read-only
// capability's action fails with output_invalid, as a result too large or
// a broken stream does (it was outcome_unknown); a 5xx of a read fails
// connector_host.interrupted, retryable: the read changed nothing.
func TestLocalUnusableAnswerOfARead(t *testing.T) {
	for _, c := range []struct {
		name    string
		effects []aip.SideEffect
	}{{"read", []aip.SideEffect{aip.EffectRead}}, {"write", []aip.SideEffect{aip.EffectWrite}}} {
		t.Run(c.name, func(t *testing.T) {
			r := localReplicaWithEffects(t, "echo.status", c.effects, LocalConfig{})
			for _, a := range []struct {
				status int
				body   string
				code   string // of a read's failed result
			}{{200, `{"status":"done"}`, hostsdk.CodeOutputInvalid}, {500, `{}`, hostsdk.CodeInterrupted}} {
				in, _ := json.Marshal(map[string]any{"status": a.status, "body": json.RawMessage(a.body)})
				resp := must(r.d.Act(ctxT(t), r.target, act("echo.status", string(in))))
				if c.name == "write" {
					if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
						t.Fatalf("HTTP %d answered %d %s; want outcome_unknown", a.status, resp.Status, resp.Raw)
					}
					continue
				}
				res, err := resp.Result()
				if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != a.code {
					t.Fatalf("HTTP %d answered %d %s (%v); want a failed result %s", a.status, resp.Status, resp.Raw, err, a.code)
				}
				if a.code == hostsdk.CodeInterrupted && !res.Error.IsRetryable() {
					t.Errorf("a read the connector answered %d is not retryable: %s", a.status, resp.Raw)
				}
			}
		})
	}
}

// localReplicaWithEffects starts a fake connector whose capability capID
// declares effects, and a sidecar attached to it with lc's limits.
func localReplicaWithEffects(t *testing.T, capID string, effects []aip.SideEffect, lc LocalConfig) *replica {
	t.Helper()
	f := newFakeConnector()
	f.token = "s3cret"
	m := fakeManifest("")
	found := false
	for i := range m.Capabilities {
		if m.Capabilities[i].ID == capID {
			m.Capabilities[i].Contract.SideEffects, found = effects, true
		}
	}
	if !found {
		t.Fatalf("the fake manifest has no %s", capID)
	}
	f.manifest.Store(m)
	sock, _ := serveFake(t, f)
	lc.Socket, lc.Token = sock, "s3cret"
	return startReplica(t, func(cfg *Config) { cfg.Local = lc })
}

// TestLocalRefusalSaysWhetherToRetry: a refusal without an error object is
// failed sidecar.connector_rejected (the action did not run), retryable
// exactly when the HTTP status says "not now" — 408, 425, 429 and 503, as
// the host's own 429 and 503 are — with Retry-After's seconds as
// retry_after_ms.
func TestLocalRefusalSaysWhetherToRetry(t *testing.T) {
	r, _ := localReplica(t, nil)
	ctx := ctxT(t)
	for _, tc := range []struct {
		status     int
		retryAfter string
		retryable  bool
		afterMS    uint64
	}{
		{400, "", false, 0},
		{404, "", false, 0},
		{409, "", false, 0},
		{408, "", true, 0},
		{425, "", true, 0},
		{429, "", true, 0},
		{429, "3", true, 3000},
		{503, "", true, 0},
		{503, "2", true, 2000},
		{503, "soon", true, 0},
		{400, "5", false, 0},
	} {
		t.Run(fmt.Sprintf("%d_%s", tc.status, tc.retryAfter), func(t *testing.T) {
			in := map[string]any{"status": tc.status, "body": "busy"}
			if tc.retryAfter != "" {
				in["header"] = map[string]string{"Retry-After": tc.retryAfter}
			}
			raw, _ := json.Marshal(in)
			resp := must(r.d.Act(ctx, r.target, act("echo.status", string(raw))))
			res, err := resp.Result()
			if err != nil {
				t.Fatalf("HTTP %d: %v", resp.Status, err)
			}
			e := res.Error
			if res.Status != aip.ResultFailed || e == nil || e.Code != CodeConnectorRejected || e.Retryable == nil {
				t.Fatalf("result %+v error %+v", res, e)
			}
			var after uint64
			if e.RetryAfterMS != nil {
				after = *e.RetryAfterMS
			}
			if *e.Retryable != tc.retryable || after != tc.afterMS {
				t.Errorf("HTTP %d Retry-After %q: retryable %v retry_after_ms %d, want %v %d (%s)",
					tc.status, tc.retryAfter, *e.Retryable, after, tc.retryable, tc.afterMS, e.Message)
			}
		})
	}
}

// TestLocalOtherSuccessStatusSaysToAnswer200: a result answered with a
// success status other than 200 (201 for a create, as web frameworks
// suggest) is not read, and the action's outcome is unknown; the message
// says that a result comes with 200, rather than only quoting the status.
func TestLocalOtherSuccessStatusSaysToAnswer200(t *testing.T) {
	r, _ := localReplica(t, nil)
	for _, status := range []int{201, 202} {
		in, _ := json.Marshal(map[string]any{"status": status, "body": json.RawMessage(`{"status":"completed","output":{"a":1}}`)})
		resp := must(r.d.Act(ctxT(t), r.target, act("echo.status", string(in))))
		pe := resp.ProtocolError()
		if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || !strings.Contains(pe.Message, "with HTTP 200") {
			t.Fatalf("HTTP %d answered %d %s; want outcome_unknown saying to answer with HTTP 200", status, resp.Status, resp.Raw)
		}
	}
}

// TestLocalStreamWithoutItsContentTypeIsNamed: stream lines answered with
// another Content-Type than application/x-ndjson (a Python connector
// writing application/jsonl, or none) were read as one result and refused
// as "not a result: trailing data", which did not say what to fix; the
// error now says the body holds stream lines and names both content
// types. A body that is no stream gets no such hint.
func TestLocalStreamWithoutItsContentTypeIsNamed(t *testing.T) {
	r := localReplicaWithEffects(t, "echo.status", []aip.SideEffect{aip.EffectRead}, LocalConfig{})
	stream := `{"chunk":{"kind":"progress","data":{"n":1}}}` + "\n" + `{"result":{"status":"completed","output":{"a":1}}}` + "\n"
	for _, c := range []struct {
		contentType, raw string
		hint             bool
	}{
		{"application/jsonl", stream, true},
		{"application/json", "\n" + `{"result":{"status":"completed"}}`, true},
		{"application/json", `{"status":"done"}`, false},
		{"application/json", `{"status":"completed"} {"status":"completed"}`, false},
	} {
		in, _ := json.Marshal(map[string]any{"status": 200, "raw": c.raw, "header": map[string]string{"Content-Type": c.contentType}})
		a := act("echo.status", string(in))
		a.Mode = aip.ModeStreaming
		resp := must(r.d.Act(ctxT(t), r.target, a))
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeOutputInvalid {
			t.Fatalf("%s %q answered %d %s (%v); want failed output_invalid", c.contentType, c.raw, resp.Status, resp.Raw, err)
		}
		hint := fmt.Sprintf("it holds stream lines, which are read only with Content-Type: application/x-ndjson (this answer's: %q)", c.contentType)
		if strings.Contains(res.Error.Message, hint) != c.hint {
			t.Errorf("%s %q: message %q; want the stream hint %v", c.contentType, c.raw, res.Error.Message, c.hint)
		}
	}
}

// TestLocalMalformedJSONIsNamed: an answer that is not valid JSON was
// refused with the advice for any unusable answer of a read ("ask for
// less (a smaller page, fewer fields) if it was too much, else send it
// again"), which sends the caller after the wrong fix; it now says the
// answer is not valid JSON, where (the offset) and what is there (a short
// excerpt), and that the connector must be fixed. A write's outcome stays
// unknown, with the same description.
func TestLocalMalformedJSONIsNamed(t *testing.T) {
	for _, c := range []struct {
		name, contentType, raw string
		want                   []string
	}{
		{"cut off", "application/json", `{"status":"completed",`, []string{
			`the connector answered 200 with a body that is not valid JSON: expected a member name at offset 22 (the answer from byte 0: "{\"status\":\"completed\",")`}},
		{"an HTML page", "application/json", "<html><body>Internal Server Error: the upstream API timed out</body></html>", []string{
			`not valid JSON: unexpected character '<' at offset 0 (the answer from byte 0: "<html><body>Internal Ser…")`}},
		{"far into the body", "application/json", `{"status":"completed","output":{"notes":["a","b","c","d"], oops}}`, []string{
			`not valid JSON: expected a member name at offset 59 (the answer from byte 35: "…tes\":[\"a\",\"b\",\"c\",\"d\"], oops}}")`}},
		{"empty", "application/json", "", []string{"a body that is not valid JSON: it is empty"}},
		{"a stream line", hostsdk.ContentTypeNDJSON, `{"chunk":{"kind":"progress","data":{"n":1}}}` + "\n" + `{"result":{"status":"completed",}}` + "\n", []string{
			`the connector's stream line 2 is not valid JSON: expected a member name at offset 32 (the line from byte 8: "…\":{\"status\":\"completed\",}}")`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, effects := range [][]aip.SideEffect{{aip.EffectRead}, {aip.EffectWrite}} {
				r := localReplicaWithEffects(t, "echo.status", effects, LocalConfig{})
				in, _ := json.Marshal(map[string]any{"status": 200, "raw": c.raw, "header": map[string]string{"Content-Type": c.contentType}})
				a := act("echo.status", string(in))
				if c.contentType == hostsdk.ContentTypeNDJSON {
					a.Mode = aip.ModeStreaming
				}
				resp := must(r.d.Act(ctxT(t), r.target, a))
				var msg string
				if effects[0] == aip.EffectWrite {
					pe := resp.ProtocolError()
					if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
						t.Fatalf("a write's answer %q: HTTP %d %s; want outcome_unknown", c.raw, resp.Status, resp.Raw)
					}
					msg = pe.Message
				} else {
					res, err := resp.Result()
					if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeOutputInvalid || res.Error.IsRetryable() {
						t.Fatalf("a read's answer %q: HTTP %d %s (%v); want failed output_invalid, not retryable", c.raw, resp.Status, resp.Raw, err)
					}
					msg = res.Error.Message
					if want := "the read changed nothing; the connector must answer valid JSON"; !strings.Contains(msg, want) {
						t.Errorf("a read's answer %q: message %q; want it to say %q", c.raw, msg, want)
					}
					if strings.Contains(msg, "ask for less") {
						t.Errorf("a read's answer %q: message %q gives the advice for a result too large", c.raw, msg)
					}
				}
				for _, w := range c.want {
					if !strings.Contains(msg, w) {
						t.Errorf("%v answer %q: message %q; want it to say %q", effects, c.raw, msg, w)
					}
				}
			}
		})
	}
}
