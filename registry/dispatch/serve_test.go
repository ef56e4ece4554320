package dispatch_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestRunAnswersAnActionThatQueued: Run's server gives an answer time for
// the admission queue as well as the hop: the write deadline left the
// queue out (and allowed 10s for it), so an action admitted after a long
// wait ran and settled but its client got a cut connection.
func TestRunAnswersAnActionThatQueued(t *testing.T) {
	if testing.Short() {
		t.Skip("waits 12s in the admission queue")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) {
		c.Listener = ln
		c.ActionTimeout, c.MaxTimeout, c.HopSlack, c.RegistryTimeout = time.Second, time.Second, time.Millisecond, 100*time.Millisecond
		c.Admission = dispatch.AdmissionLimits{MaxInFlight: 1, MaxQueueAge: time.Minute}
	}})
	w.startHost(8, 8)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.d.Run(ctx) }()
	defer func() {
		cancel()
		must(t, <-ran)
	}()
	// Another action holds the only admission slot for longer than the
	// old write deadline's slack.
	p, err := w.d.Scheduler().Acquire(w.ctx, tenant, 1)
	must(t, err)
	time.AfterFunc(12*time.Second, p.Release)

	id := aip.NewActionID()
	raw, err := json.Marshal(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("hello", "")})
	must(t, err)
	req, err := http.NewRequestWithContext(w.ctx, http.MethodPost, "http://"+ln.Addr().String()+dispatch.PathActions, strings.NewReader(string(raw)))
	must(t, err)
	req.Header.Set("Authorization", "Bearer "+w.token(tenant))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the queued action got no answer: %v", err)
	}
	defer resp.Body.Close()
	var out dispatch.ActionResponse
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK || out.Settlement != registry.SettlementCompleted {
		t.Fatalf("answer %d %+v: %v", resp.StatusCode, out, err)
	}
}
