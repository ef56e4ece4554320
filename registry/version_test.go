package registry_test

import (
	"encoding/json"
	"errors"
	"reflect"
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
