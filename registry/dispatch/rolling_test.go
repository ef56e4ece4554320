package dispatch_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// lifecycleHost starts a replica that registers, heartbeats, drains and
// goes offline through the real lifecycle service (cpURL, cpDID) against
// the world's registry, which pre-provisions it offline.
func (w *world) lifecycleHost(cpURL, cpDID string) *replicaHost {
	t := w.t
	t.Helper()
	cfg := hostsdktest.HostConfig(t, w.cp, w.fake, nil)
	cfg.ConnectorTypeID, cfg.VersionID, cfg.InstanceID = w.typeID, w.versionID, w.instanceID
	cfg.ControlPlaneEndpoint, cfg.ControlPlaneDID, cfg.ControlPlaneTransport = cpURL+aip.ControlPath, cpDID, nil
	cfg.ArtifactDigest, cfg.SecretProviderRef = w.version.Attestation.ArtifactDigest, "secret://test"
	// The lease outlasts a drain (net/http's graceful shutdown waits up to
	// 5 s for connections that never carried a request).
	cfg.MaxInFlight, cfg.LeaseTTL, cfg.HeartbeatInterval, cfg.DrainTimeout = 16, 10*time.Second, time.Second, 20*time.Second
	must(t, w.reg.PutReplica(w.ctx, registry.ConnectorReplica{
		ID: cfg.ReplicaID, InstanceID: w.instanceID, VersionID: w.versionID, Endpoint: cfg.PublicEndpoint,
		PeerPrincipalID: "agent:dispatch-test", PeerPrincipalKind: aip.PrincipalAgent, PeerDID: cfg.SigningKey.DID(),
		TrustDomain: hostsdktest.TrustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaOffline, Capacity: 16,
	}))
	h, err := hostsdk.New(cfg, replicaConnector{c: w.counter, replica: cfg.ReplicaID})
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	must(t, h.Start(ctx))
	t.Cleanup(func() { h.Stop(context.Background()) })
	rh := &replicaHost{cfg: cfg, host: h}
	w.hosts[cfg.ReplicaID] = rh
	return rh
}

// TestRollingRestartReroutesRefusals replaces every replica in turn while
// clients send actions, with the real lifecycle service keeping the
// registry's view: the actions that reach a draining replica before the
// registry knows are refused with a signed not_ready and rerouted, so none
// fails and none runs twice.
func TestRollingRestartReroutesRefusals(t *testing.T) {
	w := newWorld(t, worldOptions{})
	cpKey, _ := aip.GenerateSigningKey()
	svc, err := controlplane.New(cpKey, w.reg, controlplane.Config{LeaseTTL: 10 * time.Second})
	must(t, err)
	cpSrv := httptest.NewServer(svc.Handler())
	runCtx, stopCP := context.WithCancel(context.Background())
	cpDone := make(chan error, 1)
	go func() { cpDone <- svc.Run(runCtx) }()
	t.Cleanup(func() { stopCP(); <-cpDone; cpSrv.Close() })

	var old []*replicaHost
	for range 3 {
		old = append(old, w.lifecycleHost(cpSrv.URL, svc.DID()))
	}
	type answer struct {
		id     string
		status int
		resp   dispatch.ActionResponse
	}
	var (
		mu      sync.Mutex
		answers []answer
		done    atomic.Int64
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				id := aip.NewActionID()
				status, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("rolling", `,"hold_ms":2`)})
				mu.Lock()
				answers = append(answers, answer{id, status, resp})
				mu.Unlock()
				done.Add(1)
			}
		})
	}
	progress := func(n int64) {
		target := done.Load() + n
		eventually(t, "actions to progress", func() bool { return done.Load() >= target })
	}
	var stopOnce sync.Once
	stopLoad := func() { stopOnce.Do(func() { close(stop); wg.Wait() }) }
	defer stopLoad()
	progress(50)
	for _, o := range old {
		w.lifecycleHost(cpSrv.URL, svc.DID())
		if err := o.host.Stop(context.Background()); err != nil {
			stopLoad()
			t.Fatalf("replica %s did not drain cleanly: %v", o.cfg.ReplicaID, err)
		}
		progress(50)
	}
	stopLoad()

	stopped := map[string]bool{}
	for _, o := range old {
		stopped[o.cfg.ReplicaID] = true
	}
	rerouted, undelivered := 0, 0
	for _, a := range answers {
		// A route resolved just before the registry learned of a drain can
		// reach the host after its listener closed: no signed refusal
		// exists, so the action stays pinned, unexecuted (docs/routing.md,
		// "Linger after drain"; a host change).
		if a.status == http.StatusBadGateway && a.resp.Error != nil && a.resp.Error.Code == dispatch.CodeOutcomeUnknown &&
			stopped[a.resp.Route.ReplicaID] && strings.Contains(a.resp.Error.Message, "connect: connection refused") {
			if runs := w.counter.runs(a.id); len(runs) != 0 {
				t.Fatalf("undelivered action %s ran on %v", a.id, runs)
			}
			undelivered++
			continue
		}
		if a.status != http.StatusOK || a.resp.Result == nil || a.resp.Settlement != registry.SettlementCompleted {
			t.Fatalf("action %s: %d %+v settlement %q", a.id, a.status, a.resp.Error, a.resp.Settlement)
		}
		if runs := w.counter.runs(a.id); len(runs) != 1 || runs[0] != a.resp.Route.ReplicaID {
			t.Fatalf("action %s ran on %v, answered by %s", a.id, runs, a.resp.Route.ReplicaID)
		}
		if len(a.resp.Route.Reroutes) > 0 {
			rerouted++
			if a.resp.Route.Reroutes[0].RefusalCode != hostsdk.CodeNotReady {
				t.Fatalf("action %s rerouted after %+v", a.id, a.resp.Route.Reroutes)
			}
		}
	}
	t.Logf("%d actions, %d rerouted after a signed not_ready, %d dialled a stopped replica (never ran)", len(answers), rerouted, undelivered)
	eventually(t, "every route to settle", func() bool {
		l, err := w.reg.Ledger(w.ctx)
		return err == nil && len(l.Reservations) == 0
	})
}
