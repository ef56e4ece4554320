package e2e

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// stateWatch records every distinct status the registry shows for a
// replica, in order, while it runs.
type stateWatch struct {
	mu     sync.Mutex
	seen   []aip.ReplicaStatus
	stop   chan struct{}
	done   chan struct{}
	failed error
}

func watchStates(f *fleet, replicaID string) *stateWatch {
	w := &stateWatch{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			rep, err := f.reg.ConnectorReplica(f.ctx, replicaID)
			w.mu.Lock()
			switch {
			case err != nil:
				w.failed = err
			case len(w.seen) == 0 || w.seen[len(w.seen)-1] != rep.Status:
				w.seen = append(w.seen, rep.Status)
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

// end stops the watch after one last reading, so a change committed just
// before end is called is seen.
func (w *stateWatch) end(t *testing.T, f *fleet, replicaID string) []aip.ReplicaStatus {
	t.Helper()
	close(w.stop)
	<-w.done
	if w.failed != nil {
		t.Fatalf("reading the replica: %v", w.failed)
	}
	rep, err := f.reg.ConnectorReplica(f.ctx, replicaID)
	must(t, err)
	if len(w.seen) == 0 || w.seen[len(w.seen)-1] != rep.Status {
		w.seen = append(w.seen, rep.Status)
	}
	return w.seen
}

// hostReady reports whether a replica's host answers 200 on /ready.
func hostReady(r *replica) bool { return httpOK("http://" + r.addr + "/ready") }

// hostMetric returns the value of a metric line of the host's /metrics.
func hostMetric(t *testing.T, r *replica, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + r.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no %s in the host's metrics:\n%s", name, body)
	return ""
}

// sendOK sends one echo action and requires it to complete on replica r.
func sendOK(t *testing.T, f *fleet, tok string, r *replica) {
	t.Helper()
	status, resp, err := f.send(context.Background(), tok, aip.NewActionID(), "lifecycle", "")
	if err != nil || status != http.StatusOK || resp.Settlement != "completed" || resp.Route == nil || resp.Route.ReplicaID != r.id {
		t.Fatalf("action: status %d err %v settlement %q route %+v error %+v", status, err, resp.Settlement, resp.Route, resp.Error)
	}
}

// TestHostLifecycleOnTheRealControlPlane: the echo binary, pre-provisioned
// in the registry, registers with the real `aipfleet control-plane`,
// becomes ready in all three views (host /ready, registry, routing), serves
// actions, and on SIGTERM the registry sees it go ready → draining →
// offline while the process exits 0.
func TestHostLifecycleOnTheRealControlPlane(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 1})
	r := f.replicaList()[0]
	if !hostReady(r) {
		t.Fatal("the registered host does not report ready on /ready")
	}
	tok := f.token(tenantID)
	for range 3 {
		sendOK(t, f, tok, r)
	}

	w := watchStates(f, r.id)
	waitFor(t, "the watch to see the replica", nil, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.seen) > 0
	})
	if err := r.proc.Term(t); err != nil {
		t.Fatalf("the host did not exit 0 after SIGTERM: %v\n%s", err, r.proc.Log())
	}
	seen := w.end(t, f, r.id)
	if want := []aip.ReplicaStatus{aip.ReplicaReady, aip.ReplicaDraining, aip.ReplicaOffline}; !slices.Equal(seen, want) {
		t.Fatalf("the registry saw %v, want %v", seen, want)
	}
	rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
	must(t, err)
	if rep.LeaseValid(time.Now()) || rep.ActiveAssignments != 0 {
		t.Fatalf("after the drain the replica has lease until %v and %d active assignments", rep.LeaseExpiresAt, rep.ActiveAssignments)
	}
}

// TestControlPlaneOutage: an outage of the control plane shorter than the
// lease leaves the replica ready and routable (its last lease holds); a
// longer one makes it unready and unroutable once the lease expires, and it
// registers again by itself when the control plane comes back.
func TestControlPlaneOutage(t *testing.T) {
	f := newFleet(t, fleetOptions{replicas: 1})
	r := f.replicaList()[0]
	tok := f.token(tenantID)
	sendOK(t, f, tok, r)
	before, err := f.reg.ConnectorReplica(f.ctx, r.id)
	must(t, err)

	// A short outage: three heartbeats (1 s apart) fail, the lease (10 s)
	// holds.
	if err := f.cp.Term(t); err != nil {
		t.Fatalf("control plane exit: %v", err)
	}
	time.Sleep(3 * time.Second) // the outage itself
	if !hostReady(r) {
		t.Fatal("the host is not ready during an outage shorter than its lease")
	}
	sendOK(t, f, tok, r)
	if failures := hostMetric(t, r, "aip_connector_host_heartbeat_failures_total"); failures == "0" {
		t.Fatal("no heartbeat failed during the outage")
	}
	f.startControlPlane()
	waitFor(t, "heartbeats to renew the lease again", []*process{r.proc, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && rep.Status == "ready" && rep.HealthRevision > before.HealthRevision+1 && rep.LeaseValid(time.Now())
	})
	if n := hostMetric(t, r, "aip_connector_host_lease_recoveries_total"); n != "0" {
		t.Fatalf("the host re-registered (%s recoveries) after an outage shorter than its lease", n)
	}

	// A long outage: the lease expires, the host stops being ready and the
	// replica is no longer routable.
	if err := f.cp.Term(t); err != nil {
		t.Fatalf("control plane exit: %v", err)
	}
	// The registry's lease can outlast the host's by a heartbeat: one the
	// control plane committed as it stopped, whose answer the host never
	// got. In between the dispatcher still routes to the replica, which
	// refuses (a signed not_ready: safe, but not what this step checks).
	waitFor(t, "the host and the registry to lose the lease", []*process{r.proc}, func() bool {
		if hostReady(r) {
			return false
		}
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && !rep.LeaseValid(time.Now())
	})
	status, resp, err := f.send(context.Background(), tok, aip.NewActionID(), "nowhere", "")
	if err != nil || status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != dispatch.CodeReplicaUnavailable {
		t.Fatalf("an action with the only lease expired: status %d err %v error %+v; want 503 %s", status, err, resp.Error, dispatch.CodeReplicaUnavailable)
	}

	// The control plane returns: the host registers again by itself.
	f.startControlPlane()
	waitFor(t, "the host to register again", []*process{r.proc, f.cp}, func() bool {
		rep, err := f.reg.ConnectorReplica(f.ctx, r.id)
		return err == nil && rep.Status == "ready" && rep.LeaseValid(time.Now()) && hostReady(r)
	})
	if n := hostMetric(t, r, "aip_connector_host_lease_recoveries_total"); n == "0" {
		t.Fatal("the host is ready again without a lease recovery")
	}
	sendOK(t, f, tok, r)
}
