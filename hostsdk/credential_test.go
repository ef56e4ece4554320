package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// writePolicy writes a credential revision policy file with mode 0644.
func writePolicy(t *testing.T, path, policy string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

// withCredential gives the fleet's host a tenant credential at revision rev
// and the policy file path.
func withCredential(f *fleet, rev, path string) {
	f.cfg.CredentialID, f.cfg.CredentialIssuer, f.cfg.CredentialScopes = "cred-acme", "vault", []string{"notes:write"}
	f.cfg.CredentialRevisionRef, f.cfg.CredentialRevisionPolicyFile = rev, path
}

// credentialMessage is a signed message for body whose route pins the
// credential revision ref (nil: none).
func credentialMessage(t *testing.T, d *hostsdktest.Dispatcher, target hostsdktest.Target, body aip.Body, actionID, capID string, ref *string) (raw []byte, messageID string) {
	t.Helper()
	route := d.Route(target, actionID, capID, "")
	route.CredentialRevisionRef = ref
	env, err := d.Envelope(target, body, route)
	if err != nil {
		t.Fatal(err)
	}
	raw, err = d.Sign(env)
	if err != nil {
		t.Fatal(err)
	}
	return raw, env.MessageID
}

// TestCredentialRevisionPolicy: with --credential-revision-policy-file, the
// host reads the policy again before every action and cancel and checks
// the credential_revision_ref of the message's route (reference §5.5 step
// 6): the current and accepted previous revisions run; a revoked, unlisted
// or missing one is refused with the signed 403
// connector_host.credential_revision_denied, and a policy file that cannot
// be read with the signed 503 connector_host.credential_revision_unavailable.
// A refused action is neither journaled nor run, and its message ID is
// claimed, as for the host's other signed refusals: the envelope can never
// execute later. The host had no such check: every revision ran.
func TestCredentialRevisionPolicy(t *testing.T) {
	ctx := ctxT(t)
	f := newFleet(t)
	policy := filepath.Join(t.TempDir(), "credential-policy.json")
	writePolicy(t, policy, `{"current_revision_ref":"v2","accepted_previous_revisions":["v1"],"revoked_revisions":["v0"]}`)
	withCredential(f, "v2", policy)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	ref := func(s string) *string { return &s }

	act := func(r *string) (*aip.Action, []byte, string, *hostsdktest.Response) {
		t.Helper()
		a := action(capEcho, `{"message":"hi"}`)
		raw, id := credentialMessage(t, f.d, target, aip.Body{Action: a}, a.ID, a.CapabilityID, r)
		resp, err := f.d.Post(ctx, target, raw, id)
		if err != nil {
			t.Fatal(err)
		}
		return a, raw, id, resp
	}
	refused := func(name string, r *string, status int, code string) {
		t.Helper()
		a, raw, id, resp := act(r)
		pe := wantCode(t, resp, status, code)
		if pe.RetryAfterMS != nil && code == hostsdk.CodeCredentialRevisionDenied || pe.IsRetryable() != (code == hostsdk.CodeCredentialRevisionUnavailable) {
			t.Errorf("%s: error %+v", name, pe)
		}
		if conn.runCount(a.ID) != 0 {
			t.Errorf("%s: the refused action ran", name)
		}
		if _, err := f.j.Action(ctx, a.ID); !errors.Is(err, journal.ErrNotFound) {
			t.Errorf("%s: the journal holds the refused action: %v", name, err)
		}
		var echoed aip.ConnectorRoute
		if ok, err := resp.Envelope.SecurityValue(aip.SecurityConnectorRoute, &echoed); !ok || err != nil || echoed.ActionID != a.ID {
			t.Errorf("%s: the refusal does not name the refused action's route: %v %v %+v", name, ok, err, echoed)
		}
		// Claimed: the same envelope is a replay, whatever the policy
		// says later.
		again, err := f.d.Post(ctx, target, raw, id)
		if err != nil {
			t.Fatal(err)
		}
		wantCode(t, again, http.StatusConflict, hostsdk.CodeReplay)
	}

	for _, r := range []string{"v2", "v1"} {
		a, _, _, resp := act(ref(r))
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted || conn.runCount(a.ID) != 1 {
			t.Fatalf("revision %s: %d %v %s", r, resp.Status, err, resp.Raw)
		}
	}
	refused("revoked", ref("v0"), http.StatusForbidden, hostsdk.CodeCredentialRevisionDenied)
	refused("unlisted", ref("v9"), http.StatusForbidden, hostsdk.CodeCredentialRevisionDenied)
	refused("no revision while the policy names a current one", nil, http.StatusForbidden, hostsdk.CodeCredentialRevisionDenied)

	// A cancel is checked too; a status query is not.
	blocked := action(capBlock, `{"message":"hold"}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() {
		raw, id := credentialMessage(t, f.d, target, aip.Body{Action: blocked}, blocked.ID, blocked.CapabilityID, ref("v2"))
		resp, err := f.d.Post(ctx, target, raw, id)
		if err != nil {
			t.Error(err)
		}
		done <- resp
	}()
	<-conn.started
	raw, id := credentialMessage(t, f.d, target, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: blocked.ID}}}, blocked.ID, capBlock, ref("v0"))
	resp, err := f.d.Post(ctx, target, raw, id)
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, resp, http.StatusForbidden, hostsdk.CodeCredentialRevisionDenied)
	if n := conn.cancels.Load(); n != 0 {
		t.Errorf("the refused cancel reached the connector (%d cancels)", n)
	}
	if st, _, err := f.d.Status(ctx, target, blocked.ID, capBlock); err != nil || st.State != aip.StateRunning {
		t.Fatalf("status of the blocked action: %+v %v", st, err)
	}
	raw, id = credentialMessage(t, f.d, target, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: blocked.ID}}}, blocked.ID, capBlock, ref("v2"))
	if resp, err = f.d.Post(ctx, target, raw, id); err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCancelled {
		t.Fatalf("allowed cancel: %d %v %s", resp.Status, err, resp.Raw)
	}
	<-done

	// Read again for every message: v1 revoked now.
	writePolicy(t, policy, `{"current_revision_ref":"v2","revoked_revisions":["v0","v1"]}`)
	refused("revoked since the start", ref("v1"), http.StatusForbidden, hostsdk.CodeCredentialRevisionDenied)

	// An action the journal holds is answered from its record, not
	// refused: the refusal would say it did not start here.
	ran, _, _, first := act(ref("v2"))
	if _, err := first.Result(); err != nil {
		t.Fatal(err)
	}
	writePolicy(t, policy, `{"current_revision_ref":"v3","revoked_revisions":["v2"]}`)
	raw, id = credentialMessage(t, f.d, target, aip.Body{Action: ran}, ran.ID, ran.CapabilityID, ref("v2"))
	if resp, err = f.d.Post(ctx, target, raw, id); err != nil {
		t.Fatal(err)
	}
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted || conn.runCount(ran.ID) != 1 {
		t.Fatalf("a journaled action under a since revoked revision: %d %v %s", resp.Status, err, resp.Raw)
	}

	// A policy that cannot be read: the temporary refusal.
	writePolicy(t, policy, `{"current_revision_ref":"v3","revoked_revisions":["v3"]}`)
	refused("overlapping policy", ref("v3"), http.StatusServiceUnavailable, hostsdk.CodeCredentialRevisionUnavailable)
	writePolicy(t, policy, `{"current_revision_ref":"v3"}`)
	if err := os.Chmod(policy, 0o666); err != nil {
		t.Fatal(err)
	}
	refused("world-writable policy", ref("v3"), http.StatusServiceUnavailable, hostsdk.CodeCredentialRevisionUnavailable)
	if err := os.Remove(policy); err != nil {
		t.Fatal(err)
	}
	_, _, _, resp = act(ref("v3"))
	pe := wantCode(t, resp, http.StatusServiceUnavailable, hostsdk.CodeCredentialRevisionUnavailable)
	if pe.Category != aip.CategoryTemporary || pe.RetryAfterMS == nil || *pe.RetryAfterMS != 1000 {
		t.Errorf("unavailable error %+v; want temporary, retry after 1000 ms", pe)
	}
	if strings.Contains(pe.Message, policy) {
		t.Errorf("the refusal names the host's file: %q", pe.Message)
	}
}

// TestNoCredentialPolicyChecksNothing: without a policy file, routes run
// whatever credential revision they pin, as before the setting existed.
func TestNoCredentialPolicyChecksNothing(t *testing.T) {
	ctx := ctxT(t)
	f := newFleet(t)
	conn := newTestConnector()
	_, target := f.start(t, conn)
	for _, r := range []*string{nil, new(string)} {
		if r != nil {
			*r = "any-revision"
		}
		a := action(capEcho, `{"message":"hi"}`)
		raw, id := credentialMessage(t, f.d, target, aip.Body{Action: a}, a.ID, a.CapabilityID, r)
		resp, err := f.d.Post(ctx, target, raw, id)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("%d %v %s", resp.Status, err, resp.Raw)
		}
	}
}

// TestCredentialPolicyMustAuthorizeTheHostRevision: a host does not start
// with a policy file that cannot be read or that does not authorize its own
// credential revision (reference §4.1); the error names the settings.
func TestCredentialPolicyMustAuthorizeTheHostRevision(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name, policy string
		rev          string // "" : no credential
		want         []string
	}{
		{"revoked", `{"current_revision_ref":"v3","revoked_revisions":["v2"]}`, "v2",
			[]string{"--credential-revision-policy-file", "AIP_CONNECTOR_HOST_CREDENTIAL_POLICY_FILE", "--credential-revision-ref", "AIP_CONNECTOR_HOST_CREDENTIAL_REVISION", `"v2" is revoked`}},
		{"unlisted", `{"current_revision_ref":"v3"}`, "v2",
			[]string{"--credential-revision-policy-file", `"v2" is neither the current one nor an accepted previous one`}},
		{"no credential but a current revision", `{"current_revision_ref":"v3"}`, "",
			[]string{"--credential-revision-policy-file", "without a credential revision", "give the host its credential", "leave current_revision_ref null and accepted_previous_revisions empty"}},
		{"invalid", `{"current_revision_ref":"v2","rotation":"weekly"}`, "v2",
			[]string{"--credential-revision-policy-file", "AIP_CONNECTOR_HOST_CREDENTIAL_POLICY_FILE", "rotation"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFleet(t)
			path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			writePolicy(t, path, c.policy)
			f.cfg.CredentialRevisionPolicyFile = path
			if c.rev != "" {
				withCredential(f, c.rev, path)
			}
			err := startErr(t, f, newTestConnector())
			var se hostsdk.StepError
			if !errors.As(err, &se) || se.Step() != hostsdk.StepValidate {
				t.Errorf("error %v; want a step 1 error", err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if c.rev == "" && strings.Contains(err.Error(), "make it") {
				t.Errorf("error %q, for a host without a revision, asks to make its revision current", err)
			}
			if ops(f.cp) != nil {
				t.Errorf("the host talked to the control plane: %v", ops(f.cp))
			}
		})
	}
	// A policy of revocations only authorizes a host without a credential.
	f := newFleet(t)
	path := filepath.Join(dir, "revocations.json")
	writePolicy(t, path, `{"revoked_revisions":["v1"]}`)
	f.cfg.CredentialRevisionPolicyFile = path
	f.start(t, newTestConnector())
}

// identityConnector records the identity and tenant context of the calls
// it handles and of its discovery.
type identityConnector struct {
	*testConnector
	manifestTenant chan hostsdk.TenantContext
	calls          chan *hostsdk.Call
}

func (c identityConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	select {
	case c.manifestTenant <- tenant:
	default:
	}
	return c.testConnector.Manifest(ctx, tenant)
}

func (c identityConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	c.calls <- call
	return c.testConnector.Handle(ctx, call)
}

// TestActionIdentityIsTheHostConfiguration: the identity of the action the
// connector is given is the host's configuration — tenant with its system,
// external account, the dispatcher's principal as service account, the
// credential reference (reference §5.5 step 8) — whatever identity the
// action carried; nothing else of it (external user, human actor, acted on
// behalf of, OAuth, a credential reference of its own) reaches the
// connector as if the host had verified it. The host overwrote only the
// tenant and passed the rest on. The configured identity, membership
// included, is on TenantContext too.
func TestActionIdentityIsTheHostConfiguration(t *testing.T) {
	ctx := ctxT(t)
	f := newFleet(t)
	f.cfg.TenantSystem, f.cfg.MembershipID = "crm", "mem-7"
	f.cfg.ExternalAccountID, f.cfg.ExternalAccountSystem = "acct-9", "provider"
	withCredential(f, "v2", "")
	conn := identityConnector{testConnector: newTestConnector(), manifestTenant: make(chan hostsdk.TenantContext, 1), calls: make(chan *hostsdk.Call, 1)}
	h, target := f.start(t, conn)

	forged := &aip.Principal{ID: "human:mallory", Kind: aip.PrincipalHuman}
	a := action(capEcho, `{"message":"hi"}`)
	a.Identity = &aip.IdentityContext{
		Tenant:          &aip.TenantRef{ID: hostsdktest.TenantID, System: "forged-system"},
		ExternalAccount: &aip.AccountRef{ID: "acct-forged", System: "provider"},
		ExternalUser:    &aip.AccountRef{ID: "user-forged", System: "provider"},
		HumanActor:      forged, ServiceAccount: forged, ActedOnBehalfOf: forged,
		CredentialRef: &aip.CredentialRef{ID: "cred-forged", Issuer: "anyone", Scopes: []string{"admin"}},
		OAuth:         json.RawMessage(`{"access_token":"forged"}`),
	}
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Result(); err != nil {
		t.Fatalf("%v %s", err, resp.Raw)
	}
	call := <-conn.calls
	got, err := json.Marshal(call.Action.Identity)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"tenant":{"id":"` + hostsdktest.TenantID + `","system":"crm"},"external_account":{"id":"acct-9","system":"provider"},` +
		`"service_account":{"id":"` + f.d.PrincipalID() + `","kind":"service","trust_domain":"` + hostsdktest.TrustDomain + `","did":"` + f.d.DID() + `"},` +
		`"credential_ref":{"id":"cred-acme","issuer":"vault","scopes":["notes:write"]}}`
	if string(got) != want {
		t.Errorf("identity the connector saw:\n%s\nwant\n%s", got, want)
	}

	for name, tc := range map[string]hostsdk.TenantContext{"Call.Tenant": call.Tenant, "Manifest": <-conn.manifestTenant, "Host.Tenant": h.Tenant()} {
		if tc.TenantID != hostsdktest.TenantID || tc.TenantSystem != "crm" || tc.MembershipID != "mem-7" ||
			tc.ExternalAccount == nil || *tc.ExternalAccount != (aip.AccountRef{ID: "acct-9", System: "provider"}) ||
			tc.Credential == nil || tc.Credential.ID != "cred-acme" || tc.Credential.Issuer != "vault" ||
			strings.Join(tc.Credential.Scopes, ",") != "notes:write" || tc.CredentialRevisionRef != "v2" {
			t.Errorf("%s: %+v", name, tc)
		}
	}
	// What a connector changes in what it was given is its own copy.
	call.Tenant.Credential.Scopes[0] = "changed"
	call.Action.Identity.CredentialRef.Scopes[0] = "changed"
	if tc := h.Tenant(); tc.Credential.Scopes[0] != "notes:write" {
		t.Errorf("a connector's change reached the host: %+v", tc.Credential)
	}
}

// TestActionIdentityWithoutIdentitySettings: a host without the identity
// settings gives the connector the tenant and the dispatcher's principal
// only.
func TestActionIdentityWithoutIdentitySettings(t *testing.T) {
	ctx := ctxT(t)
	f := newFleet(t)
	conn := identityConnector{testConnector: newTestConnector(), manifestTenant: make(chan hostsdk.TenantContext, 1), calls: make(chan *hostsdk.Call, 1)}
	_, target := f.start(t, conn)
	a := action(capEcho, `{"message":"hi"}`)
	a.Identity = &aip.IdentityContext{ExternalUser: &aip.AccountRef{ID: "user-forged", System: "provider"}}
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Result(); err != nil {
		t.Fatalf("%v %s", err, resp.Raw)
	}
	call := <-conn.calls
	id := call.Action.Identity
	if id.Tenant == nil || *id.Tenant != (aip.TenantRef{ID: hostsdktest.TenantID}) || id.ServiceAccount == nil || id.ServiceAccount.ID != f.d.PrincipalID() ||
		id.ExternalAccount != nil || id.ExternalUser != nil || id.CredentialRef != nil {
		t.Errorf("identity %+v", id)
	}
	if call.Tenant.ExternalAccount != nil || call.Tenant.Credential != nil || call.Tenant.MembershipID != "" {
		t.Errorf("tenant context %+v", call.Tenant)
	}
}
