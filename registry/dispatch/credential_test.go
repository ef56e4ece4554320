package dispatch_test

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestCredentialRevisionRefusalsReachTheClient: a replica whose credential
// revision policy revokes the binding's credential revision refuses the
// action with connector_host.credential_revision_denied, and one that
// cannot read its policy with connector_host.credential_revision_unavailable.
// The dispatcher answered both as 502 (an unknown host code); they are the
// client's answers, 403 and 503, with the route settled cancelled, and
// neither moves the action to another replica (they are not reroute
// evidence: every replica of the instance reads the same policy), which
// here would run it.
func TestCredentialRevisionRefusalsReachTheClient(t *testing.T) {
	w := newWorld(t, worldOptions{})
	must(t, w.reg.PutBinding(w.ctx, registry.CapabilityBinding{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID,
		PolicyRevision: 2, CredentialRevisionRef: "cred-v1", Enabled: true}))
	policy := filepath.Join(t.TempDir(), "credential-policy.json")
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v2","accepted_previous_revisions":[],"revoked_revisions":["cred-v1"]}`), 0o644))
	a := w.startHostWith(8, 8, func(c *hostsdk.Config) {
		c.CredentialID, c.CredentialIssuer, c.CredentialScopes, c.CredentialRevisionRef = "cred-acme", "vault", []string{"notes:write"}, "cred-v2"
		c.CredentialRevisionPolicyFile = policy
	})
	b := w.startHost(8, 8) // no policy: it would run whatever reached it

	act := w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID, b.cfg.ReplicaID)
	status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusForbidden || resp.Error == nil || resp.Error.Code != hostsdk.CodeCredentialRevisionDenied || resp.Error.IsRetryable() {
		t.Fatalf("revoked revision: %d %+v; want 403 %s, not retryable", status, resp.Error, hostsdk.CodeCredentialRevisionDenied)
	}
	if resp.Settlement != registry.SettlementCancelled || resp.Route == nil || resp.Route.ReplicaID != a.cfg.ReplicaID {
		t.Errorf("settlement %q, route %+v; want cancelled on %s", resp.Settlement, resp.Route, a.cfg.ReplicaID)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("the refused action ran on %v", runs)
	}
	w.idle()

	// The policy is read for every action: one that cannot be parsed any
	// more refuses with the temporary error.
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":`), 0o644))
	act = w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID, b.cfg.ReplicaID)
	status, resp = w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != hostsdk.CodeCredentialRevisionUnavailable || !resp.Error.IsRetryable() {
		t.Fatalf("unreadable policy: %d %+v; want 503 %s, retryable", status, resp.Error, hostsdk.CodeCredentialRevisionUnavailable)
	}
	if resp.Settlement != registry.SettlementCancelled {
		t.Errorf("settlement %q, want cancelled", resp.Settlement)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("the refused action ran on %v", runs)
	}
	w.idle()

	// Once the binding pins the current revision, the action runs there.
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v2","revoked_revisions":["cred-v1"]}`), 0o644))
	must(t, w.reg.PutBinding(w.ctx, registry.CapabilityBinding{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID,
		PolicyRevision: 3, CredentialRevisionRef: "cred-v2", Enabled: true}))
	act = w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID, b.cfg.ReplicaID)
	status, resp = w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("hello", "")})
	if status != http.StatusOK || resp.Error != nil {
		t.Fatalf("current revision: %d %+v", status, resp.Error)
	}
	if runs := w.counter.runs(act); len(runs) != 1 || runs[0] != a.cfg.ReplicaID {
		t.Fatalf("ran on %v, want once on %s", runs, a.cfg.ReplicaID)
	}
}

// TestCredentialRevisionRetriesOfTheSameAction: an action keeps the route,
// and so the credential_revision_ref, it was first pinned with (the
// registry hands an existing action its pinned assignment back). A refusal
// for a policy the replica could not read is retried under the same action
// ID once the file is fixed, and runs exactly once; a denied one stays
// denied under its action ID after the binding moves to an allowed
// revision (only a new action ID carries the new revision), and runs,
// once, when the policy accepts the revision it was pinned with. The
// operator guide told operators to resend the same action ID once the
// binding and the policy agree, which after a binding change answers the
// same 403 for ever.
func TestCredentialRevisionRetriesOfTheSameAction(t *testing.T) {
	w := newWorld(t, worldOptions{})
	must(t, w.reg.PutBinding(w.ctx, registry.CapabilityBinding{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID,
		PolicyRevision: 2, CredentialRevisionRef: "cred-v1", Enabled: true}))
	policy := filepath.Join(t.TempDir(), "credential-policy.json")
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v1"}`), 0o644))
	a := w.startHostWith(8, 8, func(c *hostsdk.Config) {
		c.CredentialID, c.CredentialIssuer, c.CredentialScopes, c.CredentialRevisionRef = "cred-acme", "vault", []string{"notes:write"}, "cred-v1"
		c.CredentialRevisionPolicyFile = policy
	})
	send := func(act string) (int, dispatch.ActionResponse) {
		t.Helper()
		status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("hello", "")})
		w.idle()
		return status, resp
	}

	// Unreadable, then fixed: the same action ID runs, once.
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":`), 0o644))
	unavailable := w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID)
	if status, resp := send(unavailable); status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != hostsdk.CodeCredentialRevisionUnavailable {
		t.Fatalf("unreadable policy: %d %+v; want 503 %s", status, resp.Error, hostsdk.CodeCredentialRevisionUnavailable)
	}
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v1"}`), 0o644))
	for i := range 2 {
		if status, resp := send(unavailable); status != http.StatusOK || resp.Error != nil {
			t.Fatalf("delivery %d after the policy was fixed: %d %+v; want 200", i+1, status, resp.Error)
		}
	}
	if runs := w.counter.runs(unavailable); len(runs) != 1 {
		t.Fatalf("the action retried after the policy was fixed ran %d times (%v); want once", len(runs), runs)
	}

	// Revoked: the binding moves on, the denied action ID does not.
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v2","revoked_revisions":["cred-v1"]}`), 0o644))
	denied := w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID)
	if status, resp := send(denied); status != http.StatusForbidden || resp.Error == nil || resp.Error.Code != hostsdk.CodeCredentialRevisionDenied {
		t.Fatalf("revoked revision: %d %+v; want 403 %s", status, resp.Error, hostsdk.CodeCredentialRevisionDenied)
	}
	must(t, w.reg.PutBinding(w.ctx, registry.CapabilityBinding{TenantID: tenant, CapabilityID: capSay, InstanceID: w.instanceID,
		PolicyRevision: 3, CredentialRevisionRef: "cred-v2", Enabled: true}))
	status, resp := send(denied)
	if status != http.StatusForbidden || resp.Error == nil || resp.Error.Code != hostsdk.CodeCredentialRevisionDenied {
		t.Fatalf("the denied action ID after the binding moved to cred-v2: %d %+v; want 403 again (it keeps the route pinned with cred-v1)", status, resp.Error)
	}
	fresh := w.actionFavoring(a.cfg.ReplicaID, a.cfg.ReplicaID)
	if status, resp := send(fresh); status != http.StatusOK || resp.Error != nil {
		t.Fatalf("a new action ID after the binding moved to cred-v2: %d %+v; want 200", status, resp.Error)
	}
	// The policy accepting the pinned revision again lets the denied ID run.
	must(t, os.WriteFile(policy, []byte(`{"current_revision_ref":"cred-v2","accepted_previous_revisions":["cred-v1"]}`), 0o644))
	for i := range 2 {
		if status, resp := send(denied); status != http.StatusOK || resp.Error != nil {
			t.Fatalf("delivery %d once the policy accepts cred-v1: %d %+v; want 200", i+1, status, resp.Error)
		}
	}
	if runs := w.counter.runs(denied); len(runs) != 1 || runs[0] != a.cfg.ReplicaID {
		t.Fatalf("the denied action ran on %v once allowed; want once on %s", runs, a.cfg.ReplicaID)
	}
}
