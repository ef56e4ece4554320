package pgruntime_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// echoConnector answers every action with its input, or fails with the
// message it is given.
type echoConnector struct{}

func (echoConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:pg-echo", Kind: aip.PrincipalAgent},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{{ID: "echo.say", Name: "Say", Kind: aip.KindTool,
			InputSchema: json.RawMessage(`{"type":"object","properties":{"fail":{"type":"string"}}}`),
			Contract: &aip.CapabilityContract{
				SideEffects: []aip.SideEffect{aip.EffectRead},
				Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
				Execution:   aip.ExecutionContract{SupportsSync: true, ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
				Data:        aip.DataContract{Sensitivity: aip.SensitivityInternal},
			}}},
	}, nil
}

func (echoConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return call.Complete(json.RawMessage(call.Action.Input))
}

// A host on the PostgreSQL journal refuses an action whose idempotency key
// is not text (PostgreSQL cannot store it) with a signed permanent
// input_invalid, as on every journal, rather than blaming its storage with
// a retryable storage_unavailable for ever.
func TestHostRefusesAnIdempotencyKeyThatIsNotText(t *testing.T) {
	dbURL := pgtest.NewDatabase(t)
	var j *pgruntime.Journal
	f := hostsdktest.Start(t, echoConnector{}, func(c *hostsdk.Config) {
		j = open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: c.ReplicaID})
		c.Journal = j
	})
	a := hostsdktest.NewAction("echo.say", `{}`)
	a.IdempotencyKey = "key\x00with a NUL"
	resp := f.Act(t, a)
	pe := resp.ProtocolError()
	if resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid || pe.IsRetryable() {
		t.Fatalf("answer HTTP %d %+v, want a permanent 400 %s", resp.Status, pe, hostsdk.CodeInputInvalid)
	}
	if !f.Host.Ready() {
		t.Error("the host is not ready after refusing the action")
	}
	a.IdempotencyKey = "key"
	if res := f.Result(t, a); res.Status != aip.ResultCompleted {
		t.Errorf("the same action with a text key answered %+v", res)
	}
}
