package dispatch_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// metricSeries returns the series of the dispatcher's /metrics whose name
// is name (one line each, labels included).
func (w *world) metricSeries(name string) []string {
	w.t.Helper()
	resp, err := w.api.Get(w.srv.URL + dispatch.PathMetrics)
	must(w.t, err)
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			out = append(out, line)
		}
	}
	must(w.t, sc.Err())
	return out
}

// TestErrorMetricCardinalityIsBounded: the code label of
// aip_dispatch_action_errors_total takes the codes the dispatcher knows;
// a replica that answers each action with an error code of its own (a
// connector host of another implementation putting a request ID in its
// codes, say) adds no series per action to a dispatcher that runs for
// months.
func TestErrorMetricCardinalityIsBounded(t *testing.T) {
	w := newWorld(t, worldOptions{})
	replicaKey, _ := aip.GenerateSigningKey()
	n := 0
	fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(func(rw http.ResponseWriter, r *http.Request, req *aip.Envelope) {
		n++
		body := aip.Body{Error: &aip.ErrorBody{Error: *aip.NewProtocolError(fmt.Sprintf("provider.rejected.req_%d", n), aip.CategoryConnector, false, 0, "refused")}}
		signedReply(replicaKey, http.StatusBadGateway, body)(rw, r, req)
	}))
	const actions = 20
	for range actions {
		status, resp := w.act(dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("x", "")})
		if resp.Error == nil || resp.Route == nil || resp.Route.ReplicaID != fake {
			t.Fatalf("answer %d %+v, want the fake replica's error", status, resp)
		}
	}
	// The known codes are series from the start, at 0; the replica's codes
	// add none.
	before := len(newWorld(t, worldOptions{}).metricSeries("aip_dispatch_action_errors_total"))
	series := w.metricSeries("aip_dispatch_action_errors_total")
	var counted []string
	for _, s := range series {
		if !strings.HasSuffix(s, " 0") {
			counted = append(counted, s)
		}
	}
	if len(series) != before || len(counted) != 1 || !strings.Contains(counted[0], `code="other"`) || !strings.HasSuffix(counted[0], fmt.Sprintf(" %d", actions)) {
		t.Fatalf("aip_dispatch_action_errors_total has %d series (%d at start), want the %d errors under code=\"other\":\n%s",
			len(series), before, actions, strings.Join(series, "\n"))
	}
}

// TestReplicaCallsAreBoundedPerTenant: a tenant's status reads and cancels
// each send a signed message to a replica outside the fair admission of
// actions; at most MaxTenantReplicaCalls of them run at once, and one more
// is answered 429 at once (not queued behind the tenant's actions).
func TestReplicaCallsAreBoundedPerTenant(t *testing.T) {
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.MaxTenantReplicaCalls = 2 }})
	replicaKey, _ := aip.GenerateSigningKey()
	held := make(chan struct{}, 8)
	release := make(chan struct{})
	w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(func(rw http.ResponseWriter, r *http.Request, req *aip.Envelope) {
		switch {
		case req.Body.Action != nil:
			signedReply(replicaKey, http.StatusOK, aip.Body{ActionResult: &aip.ActionResult{ActionID: req.Body.Action.ID,
				Status: aip.ResultCompleted, Output: json.RawMessage(`{}`)}})(rw, r, req)
		case req.Body.ActionStatusQuery != nil:
			held <- struct{}{}
			<-release
			signedReply(replicaKey, http.StatusOK, aip.Body{ActionStatus: &aip.ActionStatus{ActionID: req.Body.ActionStatusQuery.ActionID,
				State: aip.StateCompleted}})(rw, r, req)
		default:
			http.Error(rw, "unexpected", http.StatusBadRequest)
		}
	}))
	act := aip.NewActionID()
	if status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")}); status != http.StatusOK {
		t.Fatalf("action: %d %+v", status, resp.Error)
	}
	path := dispatch.PathActions + "/" + act
	codes := make(chan int, 2)
	for range 2 {
		go func() {
			code, _, _ := w.call(http.MethodGet, path, tenant, nil)
			codes <- code
		}()
	}
	released := false
	unblock := func() {
		if !released {
			released = true
			close(release)
		}
	}
	defer unblock() // a failing check below must not leave handlers waiting
	<-held
	<-held // two status queries wait at the replica
	// One more of either is refused at once; if it were sent, it would wait
	// at the replica too: give up on it after a while rather than hang.
	third := func(method, p string, body any) (int, []byte) {
		t.Helper()
		type answer struct {
			code int
			body []byte
		}
		got := make(chan answer, 1)
		go func() {
			code, b, _ := w.call(method, p, tenant, body)
			got <- answer{code, b}
		}()
		select {
		case a := <-got:
			return a.code, a.body
		case <-time.After(30 * time.Second):
			t.Fatalf("%s %s beside two held calls was not answered: it waits at the replica, unbounded", method, p)
		}
		return 0, nil
	}
	if code, body := third(http.MethodGet, path, nil); code != http.StatusTooManyRequests || !strings.Contains(string(body), "connector.scheduler_overloaded") {
		t.Fatalf("a third status read: %d %s; want 429", code, body)
	}
	if code, body := third(http.MethodPost, path+"/cancel", map[string]string{}); code != http.StatusTooManyRequests {
		t.Fatalf("a cancel beside them: %d %s; want 429", code, body)
	}
	unblock()
	for range 2 {
		if code := <-codes; code != http.StatusOK {
			t.Fatalf("a held status read ended %d", code)
		}
	}
	if code, body, _ := w.call(http.MethodGet, path, tenant, nil); code != http.StatusOK {
		t.Fatalf("a status read after they answered: %d %s", code, body)
	}
}

// TestRuntimeMetrics: a dispatcher serving its own registry exposes the
// Go runtime's and the process's metrics beside its own.
func TestRuntimeMetrics(t *testing.T) {
	w := newWorld(t, worldOptions{})
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds"} {
		if len(w.metricSeries(name)) == 0 {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}
