package hostsdk_test

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestAbandonedReadyProbeLeavesReadinessAlone: a GET /ready whose client
// goes away while the health checks run (a Kubernetes readiness probe
// with its 1 s timeoutSeconds against a connector check that takes
// longer, or any peer that closes its connection at once) cut the checks
// short with its request's context, and the host recorded "connector is
// not ready: context canceled" as the connector's health: the replica,
// whose lease is valid and which the registry routes actions to, refused
// them (connector_host.not_ready) until the next heartbeat probed again.
// A check its caller abandoned says nothing of health and is not recorded.
func TestAbandonedReadyProbeLeavesReadinessAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBubbleFleet(t, nil)
		ctx := b.awaitFirstBeat(t)
		b.conn.probeDelay.Store(int64(2 * time.Second))
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		req, err := http.NewRequestWithContext(rctx, http.MethodGet, "http://127.0.0.1:9/ready", nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := b.client.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("/ready answered %d within a second; the check takes two", resp.StatusCode)
		}
		cancel()
		b.conn.probeDelay.Store(0)
		synctest.Wait() // the handler has seen its client go and returned
		if !b.h.Ready() {
			t.Error("the replica is not ready after a /ready its client abandoned; its lease is valid and its checks pass")
		}
		// An action routed here meanwhile runs.
		resp, err := b.d.Act(ctx, hostsdktest.TargetOf(b.h, b.cfg), action(capEcho, `{"message":"hi"}`))
		if err != nil {
			t.Fatal(err)
		}
		if resp.Status != http.StatusOK {
			t.Errorf("action answered %d %s, want 200", resp.Status, resp.Raw)
		}
		time.Sleep(2 * time.Second) // the check /ready started runs to its end
	})
}
