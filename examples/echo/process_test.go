package main

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/sidecar/sidecartest"
)

// echoPackage is the import path of the echo command, built once per test
// run by sidecartest.Build.
const echoPackage = "github.com/aipfleet/aipfleet/examples/echo"

// newReplica provisions a replica in f and returns it with echo's
// environment (sidecartest's AIP_CONNECTOR_HOST_* plus echo's log level).
func newReplica(t testing.TB, f *sidecartest.FakeFleet) *sidecartest.Replica {
	t.Helper()
	r := f.NewReplica(t, sidecartest.ReplicaOptions{})
	r.Env = append(r.Env, "AIP_ECHO_LOG_LEVEL=debug")
	return r
}

// startEcho runs the echo binary as the replica r.
func startEcho(t testing.TB, r *sidecartest.Replica) *sidecartest.Process {
	t.Helper()
	return sidecartest.Start(t, sidecartest.Build(t, echoPackage), r.Env)
}

// targetOf is the dispatcher's view of the running replica r (its
// manifest read from the process).
func targetOf(t testing.TB, r *sidecartest.Replica) hostsdktest.Target {
	t.Helper()
	var m aip.Manifest
	if code := sidecartest.GetJSON(t, r.Base+hostsdk.PathManifest, &m); code != http.StatusOK {
		t.Fatalf("GET %s: HTTP %d", hostsdk.PathManifest, code)
	}
	digest, err := aip.ManifestDigest(&m)
	if err != nil {
		t.Fatal(err)
	}
	return hostsdktest.Target{
		Endpoint: r.Endpoint, Principal: aip.Principal{ID: m.Agent.ID, Kind: m.Agent.Kind}, DID: r.Key.DID(),
		TenantID: r.TenantID, InstanceID: r.InstanceID, ReplicaID: r.ID, VersionID: r.VersionID, ManifestDigest: digest,
	}
}

// TestCrashRecovery kills an echo process with two actions in flight, one
// before its side effect and one after, restarts it on the same state
// directory, and checks that recovery settles both and that sending the same
// action IDs again never repeats the side effect.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the echo binary")
	}
	f := sidecartest.NewFakeFleet(t)
	cp, d := f.ControlPlane, f.Dispatcher
	r := newReplica(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	p := startEcho(t, r)
	p.Await(t, "serving")
	target := targetOf(t, r)

	before := say("before the effect", `,"delay_ms":600000`)
	after := say("after the effect", `,"hold_ms":600000`)
	for _, a := range []*aip.Action{before, after} {
		go d.Act(ctx, target, a) // the answers are lost with the process
	}
	p.Await(t, "side effect recorded", "action_id", after.ID)
	for {
		st, _, err := d.Status(ctx, target, before.ID, CapSay)
		if err != nil {
			t.Fatal(err)
		}
		if st.State == aip.StateRunning {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling a real process for a state change
	}
	p.Signal(t, syscall.SIGKILL)
	p.Wait(t)

	// The lease expires (as the control plane's maintenance loop would
	// record it); the same replica restarts on the same state.
	cp.ExpireLease(r.ID)
	p = startEcho(t, r)
	p.Await(t, "serving")
	_, ready := r.Ready(t)
	rec := ready.Runtime.Recovery
	if rec.Reconciled != 2 || rec.OutcomeUnknown != 0 || len(rec.Errors) != 0 {
		t.Fatalf("recovery summary %+v", rec)
	}
	for range 2 {
		res, _ := output(t, must(d.Act(ctx, target, before)))
		if res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != "echo.not_executed" {
			t.Errorf("action killed before its effect answered %+v", res)
		}
		res, out := output(t, must(d.Act(ctx, target, after)))
		if res.Status != aip.ResultCompleted || out.SideEffects != 1 || !out.Reconciled {
			t.Errorf("action killed after its effect answered %+v %+v", res, out)
		}
	}

	// A clean shutdown exits 0 with offline last.
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t); err != nil {
		t.Fatalf("echo exited with %v after SIGTERM", err)
	}
	o := cp.Operations()
	if last := o[len(o)-1]; last.Op != aip.OpOffline || last.Outcome != aip.OutcomeOffline {
		t.Errorf("last lifecycle operation %+v", last)
	}
}

// TestExitStatusReflectsFailures: when the control plane refuses the
// offline transition, the process exits non-zero.
func TestExitStatusReflectsFailures(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the echo binary")
	}
	f := sidecartest.NewFakeFleet(t)
	cp := f.ControlPlane
	r := newReplica(t, f)
	p := startEcho(t, r)
	p.Await(t, "serving")
	cp.FailNext(1, 0)
	cp.FailNext(1, hostsdktest.FaultReject) // offline
	p.Signal(t, syscall.SIGTERM)
	err := p.Wait(t)
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
		t.Fatalf("exit %v, want status 1", err)
	}
	if log := p.Log(); !strings.Contains(log, "registry offline transition") {
		t.Errorf("the log does not name the failed step:\n%s", log)
	}
}

// TestHangupDrains: SIGHUP (the terminal that started the process closed)
// stops the replica as SIGTERM does, with a drain and offline last and
// exit status 0, not the default death by the signal.
func TestHangupDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the echo binary")
	}
	hostsdktest.HangupDefault(t) // the suite may run under nohup
	f := sidecartest.NewFakeFleet(t)
	r := newReplica(t, f)
	p := startEcho(t, r)
	p.Await(t, "serving")
	p.Signal(t, syscall.SIGHUP)
	if err := p.Wait(t); err != nil {
		t.Fatalf("echo exited with %v after SIGHUP; log:\n%s", err, p.Log())
	}
	o := f.ControlPlane.Operations()
	var drained bool
	for _, op := range o {
		drained = drained || op.Op == aip.OpDrain
	}
	if last := o[len(o)-1]; !drained || last.Op != aip.OpOffline || last.Outcome != aip.OutcomeOffline {
		t.Errorf("lifecycle operations %+v: want a drain and offline last", o)
	}
}
