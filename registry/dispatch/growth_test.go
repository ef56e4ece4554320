package dispatch_test

import (
	"bufio"
	"fmt"
	"net/http"
	"strings"
	"testing"

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
	series := w.metricSeries("aip_dispatch_action_errors_total")
	if len(series) != 1 || !strings.Contains(series[0], `code="other"`) || !strings.HasSuffix(series[0], fmt.Sprintf(" %d", actions)) {
		t.Fatalf("aip_dispatch_action_errors_total has %d series, want the %d errors under code=\"other\":\n%s",
			len(series), actions, strings.Join(series, "\n"))
	}
}
