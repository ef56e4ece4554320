package controlplane_test

import (
	"bufio"
	"fmt"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
)

// TestUnauthenticatedReadsShareABudget: lifecycle request bodies are read
// before they can be authenticated, so they share a read budget
// (Config.MaxReadBytes), one address at most its share: a sender that
// declares a large body and trickles it holds that share, and its next
// request waits (aip_connector_control_reads_waiting{reason="peer_share"})
// until the first gives it back, instead of every connection reading its
// own 64 KiB. (Before, there was no budget: the second request was read at
// once.)
func TestUnauthenticatedReadsShareABudget(t *testing.T) {
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.MaxReadBytes = aip.MaxControlBytes })
	h := e.provision("a1")
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	// The whole share declared; the server asks for the body (100
	// Continue) once the handler reads it, its reservation granted; one
	// byte of it is sent.
	fmt.Fprintf(slow, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
		controlplane.PathControl, u.Host, aip.MaxControlBytes)
	line, err := bufio.NewReader(slow).ReadString('\n')
	if err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("the server answered %q (%v), want 100 Continue", line, err)
	}
	fmt.Fprint(slow, "{")

	answered := make(chan reply, 1)
	req := h.request(h.registration())
	body := h.seal(req)
	go func() {
		r, err := e.tryPost(body, req.RequestID)
		if err != nil {
			r.status = -1
			r.outcome.Message = err.Error()
		}
		answered <- r
	}()
	deadline := time.Now().Add(5 * time.Second)
	for metricValue(t, e, controlplane.MetricReadsWaiting, `reason="peer_share"`) != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the second request is not waiting for its peer's share of the read budget")
		}
		select {
		case r := <-answered:
			t.Fatalf("the second request was read while the first held the read budget: HTTP %d %+v", r.status, r.outcome)
		case <-time.After(10 * time.Millisecond):
		}
	}
	// The slow sender gives up: its reservation is given back, and the
	// waiting request is read and decided.
	slow.Close()
	select {
	case r := <-answered:
		r.lease(t)
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting request was not answered after the budget was given back")
	}
	if n := metricValue(t, e, controlplane.MetricReadsWaiting, ""); n != 0 {
		t.Fatalf("%v requests still waiting", n)
	}
}
