package sidecar

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// The side effects of a read over the network and of a mutation.
var (
	readEffects  = []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}
	writeEffects = []aip.SideEffect{aip.EffectWrite}
)

// wantInterruptedRead checks that a read's action a, which a crash of the
// local connector cut off, is answered (in resp, then to a retry of the
// same action ID) failed connector_host.interrupted, retryable, with a
// message containing why, and that the replica's journal says the same
// to a status query.
func wantInterruptedRead(t *testing.T, r *replica, a *aip.Action, resp *hostsdktest.Response, why string) {
	t.Helper()
	ctx := ctxT(t)
	for _, delivery := range []string{"first", "retry"} {
		if delivery == "retry" {
			resp = must(r.d.Act(ctx, r.target, a))
		}
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInterrupted ||
			!res.Error.IsRetryable() || !strings.Contains(res.Error.Message, why) || !strings.Contains(res.Error.Message, "a read changes nothing") {
			t.Fatalf("%s delivery answered HTTP %d %s (%v); want a failed, retryable %s result saying %q",
				delivery, resp.Status, resp.Raw, err, hostsdk.CodeInterrupted, why)
		}
	}
	st, _, err := r.d.Status(ctx, r.target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateFailed || st.Result == nil || st.Result.Error == nil ||
		st.Result.Error.Code != hostsdk.CodeInterrupted || !st.Result.Error.IsRetryable() {
		t.Fatalf("status %+v (%v); want failed %s, retryable", st, err, hostsdk.CodeInterrupted)
	}
}

// wantUnknownMutation checks that a mutation's action a, which a crash
// cut off, is answered outcome_unknown (in resp, then to a retry) and
// journaled so.
func wantUnknownMutation(t *testing.T, r *replica, a *aip.Action, resp *hostsdktest.Response, why string) {
	t.Helper()
	ctx := ctxT(t)
	for _, delivery := range []string{"first", "retry"} {
		if delivery == "retry" {
			resp = must(r.d.Act(ctx, r.target, a))
		}
		if pe := resp.ProtocolError(); pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown || delivery == "first" && !strings.Contains(pe.Message, why) {
			t.Fatalf("%s delivery answered HTTP %d %s; want %s saying %q", delivery, resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown, why)
		}
	}
	if st, _, err := r.d.Status(ctx, r.target, a.ID, a.CapabilityID); err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v (%v); want outcome_unknown", st, err)
	}
}

// TestLocalStreamWithoutResultOfARead: a local connector whose stream
// ends without its result line (it crashed mid-stream) leaves a
// mutation's outcome unknown, but a read-only capability's action changed
// nothing: it fails connector_host.interrupted, retryable, as the host's
// recovery fails a read a restart cut off. It used to be outcome_unknown.
func TestLocalStreamWithoutResultOfARead(t *testing.T) {
	for _, c := range []struct {
		name    string
		effects []aip.SideEffect
	}{{"read", readEffects}, {"write", writeEffects}} {
		t.Run(c.name, func(t *testing.T) {
			r := localReplicaWithEffects(t, "echo.stream", c.effects, LocalConfig{})
			a := act("echo.stream", `{"message":"tick","chunks":2,"no_result":true}`)
			a.Mode = aip.ModeStreaming
			resp := must(r.d.Act(ctxT(t), r.target, a))
			if len(resp.Chunks) != 2 {
				t.Errorf("the stream carried %d chunks, want 2", len(resp.Chunks))
			}
			if c.name == "read" {
				wantInterruptedRead(t, r, a, resp, "without a result line")
			} else {
				wantUnknownMutation(t, r, a, resp, "without a result line")
			}
		})
	}
}

// TestLocalCrashMidReadIsInterrupted: a local connector that drops the
// connection without answering (it crashed) leaves a mutation's outcome
// unknown, and fails a read-only capability's action
// connector_host.interrupted, retryable.
func TestLocalCrashMidReadIsInterrupted(t *testing.T) {
	for _, c := range []struct {
		name    string
		effects []aip.SideEffect
	}{{"read", readEffects}, {"write", writeEffects}} {
		t.Run(c.name, func(t *testing.T) {
			r := localReplicaWithEffects(t, "echo.crash", c.effects, LocalConfig{})
			a := act("echo.crash", `{}`)
			resp := must(r.d.Act(ctxT(t), r.target, a))
			if c.name == "read" {
				wantInterruptedRead(t, r, a, resp, "did it crash")
			} else {
				if resp.Status != http.StatusBadGateway {
					t.Errorf("HTTP %d, want 502", resp.Status)
				}
				wantUnknownMutation(t, r, a, resp, "did it crash")
			}
		})
	}
}

// TestExecChildCrashMidRead: a supervised child killed while it runs an
// action leaves a mutation's outcome unknown (TestExecCrashRestart), and
// fails a read-only capability's action connector_host.interrupted,
// retryable; the child is restarted either way, and the sidecar then
// stops cleanly.
func TestExecChildCrashMidRead(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
	}{{"read", []string{envChildReadOnly + "=echo.slow"}}, {"write", nil}} {
		t.Run(c.name, func(t *testing.T) {
			r := execReplica(t, c.env, nil)
			ctx := ctxT(t)
			pid := r.status(t).Process.PID
			a := act("echo.slow", `{"delay_ms":60000}`)
			done := make(chan *hostsdktest.Response, 1)
			go func() { done <- must(r.d.Act(ctx, r.target, a)) }()
			awaitRunning(t, r, a.ID, "echo.slow")
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			resp := <-done
			if c.name == "read" {
				wantInterruptedRead(t, r, a, resp, "did it crash")
			} else {
				wantUnknownMutation(t, r, a, resp, "did it crash")
			}
			// Only the restarted child's stop counts: a child found dead
			// at the stop would make it unclean.
			for st := r.status(t); !st.Process.Running || st.Process.PID == pid; st = r.status(t) {
				if ctx.Err() != nil {
					t.Fatalf("the crashed child was not restarted: %+v", st.Process)
				}
				time.Sleep(20 * time.Millisecond) // polling a child process for a restart
			}
			if err := r.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
		})
	}
}
