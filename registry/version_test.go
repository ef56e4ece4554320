package registry_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func TestRequiredSupport(t *testing.T) {
	plain := registrytest.Capability("x.plain", "no contract")
	plain.Contract = nil
	basic := registrytest.Capability("x.basic", "cancel only")
	rich := registrytest.Capability("x.rich", "every promise")
	rich.Contract.Execution.SupportsStreaming, rich.Contract.Execution.SupportsRetry = true, true
	rich.Contract.Approval = json.RawMessage(`{"mode":"human"}`)
	rich.Contract.Credentials = &aip.CredentialsContract{Required: true}
	rich.Contract.Compensation = &aip.CompensationContract{Mode: aip.CompensationBestEffort}
	rich.Contract.Transaction = &aip.TransactionContract{SupportedModes: []aip.TransactionMode{aip.TxExecute, aip.TxReconcile, aip.TxCommit}}
	human := registrytest.Capability("x.human", "human approval, no contract")
	human.Contract = nil
	yes := true
	human.RequiresHumanApproval = &yes
	reconcile := registrytest.Capability("x.reconcile", "reconcile mode only")
	reconcile.Contract.Execution.SupportsCancel = false
	reconcile.Contract.Transaction = &aip.TransactionContract{SupportedModes: []aip.TransactionMode{aip.TxExecute, aip.TxRollbackUnsupported, aip.TxReconcile}}
	want := map[string]aip.ImplementationSupport{
		"x.plain":     {Invocation: true},
		"x.basic":     {Invocation: true, Cancellation: true},
		"x.rich":      {Invocation: true, Cancellation: true, Streaming: true, Retry: true, Approval: true, Credentials: true, Compensation: true, Transaction: true, Reconciliation: true},
		"x.human":     {Invocation: true, Approval: true},
		"x.reconcile": {Invocation: true, Reconciliation: true},
	}
	caps := []aip.Capability{plain, basic, rich, human, reconcile}
	claims := map[string]aip.ImplementationSupport{}
	for _, c := range caps {
		got := registry.RequiredSupport(&c)
		if diff := cmp.Diff(want[c.ID], got); diff != "" {
			t.Errorf("RequiredSupport(%s) (-want +got):\n%s", c.ID, diff)
		}
		claims[c.ID] = got
	}
	// The registry admits exactly these claims, and refuses each of them
	// without any one of its features.
	m := registrytest.Manifest("service:x", caps)
	v := registrytest.Version("cver_x", "ctype_x", "1", "o", registry.VersionActive, m)
	v.ImplementationSupport = claims
	if _, err := registry.PrepareVersion(v, registry.Limits{}); err != nil {
		t.Fatalf("the required claims are refused: %v", err)
	}
	for _, c := range caps {
		need := reflect.ValueOf(claims[c.ID])
		for i := range need.NumField() {
			if !need.Field(i).Bool() {
				continue
			}
			w := v.Clone()
			s := w.ImplementationSupport[c.ID]
			reflect.ValueOf(&s).Elem().Field(i).SetBool(false)
			w.ImplementationSupport[c.ID] = s
			_, err := registry.PrepareVersion(w, registry.Limits{})
			var fe *registry.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) || fe.Field != "implementation_support."+c.ID {
				t.Errorf("%s without %s: %v", c.ID, need.Type().Field(i).Name, err)
			}
		}
	}
}

// TestPrepareVersionRefusesAnAgentIDNoReplicaCanSignAs: every replica of a
// version signs as its manifest's agent, and its peer_principal_id, which
// must equal the agent ID, is held to the registry's identifier rule. A
// version whose agent ID breaks that rule is refused at admission, naming
// the version, the field, the character and the fix, instead of being
// admitted with no replica ever provisionable; and the rule is exactly the
// replica's: an agent ID admission takes is a peer_principal_id a replica
// takes, and the other way round.
func TestPrepareVersionRefusesAnAgentIDNoReplicaCanSignAs(t *testing.T) {
	const rule = ": every replica of the version signs as its manifest's agent, and a replica's peer_principal_id, which must equal the agent ID, " +
		"is 1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end, " +
		"so no replica of this version could ever be provisioned; fix the agent ID in the connector's manifest and admit that manifest"
	const prefix = "registry: invalid: connector_version cver_x: manifest.agent.id: "
	long := strings.Repeat("a", 257)
	cases := []struct {
		name, agentID, want string
	}{
		{"normal", "service:x", ""},
		{"inner space and a Persian name's letters", "agent:نامه x", ""},
		{"the longest", strings.Repeat("a", 256), ""},
		{"control character", "service:x\x01y", prefix + `"service:x\x01y" holds the control character '\x01' (U+0001) at byte 9` + rule},
		{"line feed", "service:x\n", prefix + `"service:x\n" ends with the white space '\n' (U+000A) at byte 9` + rule},
		{"zero-width space", "service:x\u200b", prefix + `"service:x\u200b" holds the invisible formatting character '\u200b' (U+200B) at byte 9` + rule},
		{"bidirectional control", "svc:\u202eabc", prefix + `"svc:\u202eabc" holds the invisible formatting character '\u202e' (U+202E) at byte 4` + rule},
		{"leading space", " service:x", prefix + `" service:x" starts with the white space ' ' (U+0020) at byte 0` + rule},
		{"trailing no-break space", "service:x\u00a0", prefix + `"service:x\u00a0" ends with the white space '\u00a0' (U+00A0) at byte 9` + rule},
		{"too long", long, prefix + `"` + long[:80] + `"... is 257 bytes, over 256` + rule},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := registrytest.Manifest(c.agentID, []aip.Capability{registrytest.Capability("x.do", "does x")})
			v := registrytest.Version("cver_x", "ctype_x", "1", "o", registry.VersionActive, m)
			_, err := registry.PrepareVersion(v, registry.Limits{})
			rep := registrytest.Replica("crepl_x", "cinst_x", "cver_x", registrytest.Epoch)
			rep.PeerPrincipalID = c.agentID
			repErr := rep.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatalf("agent ID %q is refused: %v", c.agentID, err)
				}
				if repErr != nil {
					t.Fatalf("admitted, but a replica cannot sign as the agent: %v", repErr)
				}
				return
			}
			var fe *registry.FieldError
			if !errors.As(err, &fe) || !errors.Is(err, registry.ErrInvalid) || fe.ID != "cver_x" || fe.Field != "manifest.agent.id" {
				t.Fatalf("PrepareVersion: %v, want a *FieldError of cver_x's manifest.agent.id matching ErrInvalid", err)
			}
			if got := err.Error(); got != c.want {
				t.Fatalf("error:\n got %s\nwant %s", got, c.want)
			}
			if !errors.As(repErr, &fe) || fe.Field != "peer_principal_id" {
				t.Fatalf("refused, but a replica may sign as the agent (Validate: %v): admission's rule is not the replica's", repErr)
			}
		})
	}
}
