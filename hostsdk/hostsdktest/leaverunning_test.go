package hostsdktest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// crashConnector has a write and a read; its Reconcile settles the write
// by its idempotency key and cannot tell for the read.
type crashConnector struct{ handled atomic.Int32 }

func (*crashConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	contract := func(effect aip.SideEffect) *aip.CapabilityContract {
		return &aip.CapabilityContract{
			SideEffects: []aip.SideEffect{effect},
			Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
			Execution:   aip.ExecutionContract{SupportsSync: true, ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafeWithIdempotencyKey},
			Data:        aip.DataContract{Sensitivity: aip.SensitivityInternal},
		}
	}
	schema := json.RawMessage(`{"type":"object"}`)
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: "agent:crash", Kind: aip.PrincipalAgent},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities: []aip.Capability{
			{ID: "crash.write", Name: "Write", Kind: aip.KindTool, InputSchema: schema, Contract: contract(aip.EffectWrite)},
			{ID: "crash.read", Name: "Read", Kind: aip.KindTool, InputSchema: schema, Contract: contract(aip.EffectRead)},
		},
	}, nil
}

func (c *crashConnector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	c.handled.Add(1)
	return call.Complete(map[string]string{"ran": "handle"})
}

func (*crashConnector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	if u.Action.CapabilityID != "crash.write" {
		return nil, hostsdk.ErrOutcomeUnknown
	}
	out, _ := json.Marshal(map[string]string{"ran": "reconcile", "key": u.Action.IdempotencyKey, "tenant": u.Action.TenantID})
	return &aip.ActionResult{ActionID: u.Action.ActionID, Status: aip.ResultCompleted, Output: out}, nil
}

// TestLeaveRunning: actions LeaveRunning leaves in the journal are what a
// crash leaves: recovery hands the write to Reconcile with its idempotency
// key and tenant, fails the unsettled read interrupted, and a delivery of
// either is answered from the journal without calling Handle.
func TestLeaveRunning(t *testing.T) {
	write := hostsdktest.NewAction("crash.write", `{"n":1}`)
	write.IdempotencyKey = "key-1"
	read := hostsdktest.NewAction("crash.read", `{}`)
	conn := &crashConnector{}
	f := hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) { hostsdktest.LeaveRunning(t, cfg, write, read) })

	res := f.Result(t, write)
	var out map[string]string
	if err := json.Unmarshal(res.Output, &out); err != nil || res.Status != aip.ResultCompleted ||
		out["ran"] != "reconcile" || out["key"] != "key-1" || out["tenant"] != f.Config.TenantID {
		t.Fatalf("the write after the crash: %+v %s", res, res.Output)
	}
	if res := f.Result(t, read); res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInterrupted {
		t.Fatalf("the read after the crash: %+v", res)
	}
	if n := conn.handled.Load(); n != 0 {
		t.Fatalf("Handle ran %d times for actions recovery settled", n)
	}
}

// fatalTB records the message of a Fatal and ends the goroutine, as
// testing.T does, without failing the test.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestLeaveRunningAfterTheHostStarted: LeaveRunning called once the host
// runs on the journal (after Start, not in its edit) fails saying to call
// it before the host starts, not only that another process holds the
// state directory.
func TestLeaveRunningAfterTheHostStarted(t *testing.T) {
	f := hostsdktest.Start(t, &crashConnector{}, nil)
	cfg := f.Config
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		hostsdktest.LeaveRunning(tb, &cfg, hostsdktest.NewAction("crash.write", `{}`))
	}()
	<-done
	if want := "call LeaveRunning before the host starts, in Start's edit"; !strings.Contains(tb.msg, want) {
		t.Errorf("LeaveRunning after the host started: %q, want it to say %q", tb.msg, want)
	}
}
