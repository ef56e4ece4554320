package dispatch_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// trickleAction starts, as tenant (a countingVerifier token), an action
// request announcing a body of n bytes (see trickle).
func trickleAction(t *testing.T, srv *httptest.Server, tenant string, n int64) (net.Conn, <-chan rawAnswer) {
	t.Helper()
	return trickle(t, srv.URL, "", dispatch.PathActions, "Authorization: Bearer good-"+tenant+"\r\n", n)
}

// TestActionBodiesReadWithinTheTenantShare: action bodies are read into
// memory before admission control counts them, so their reading has a
// budget of its own (Config.MaxActionReadBytes) with a share per tenant.
// A tenant that opens more requests announcing the largest body than its
// share holds, and trickles them, has only its share read; the requests
// over it wait for its own reads, then are refused 429
// connector.scheduler_overloaded, retryable, with nothing dispatched. Another
// tenant's request is read meanwhile; a body announced over the limit is
// refused unread; once the trickling requests end, the budget keeps no
// entry for the tenant. Before the budget, every body was read at once,
// however many a tenant sent.
func TestActionBodiesReadWithinTheTenantShare(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	key, _ := aip.GenerateSigningKey()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: &countingVerifier{}})
	must(t, err)
	defer d.Close()
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()

	body := int64(dispatch.DefaultMaxBodyBytes)
	share := int(dispatch.DefaultMaxActionReadBytes / 4 / body)
	var conns []net.Conn
	var answers []<-chan rawAnswer
	for range share + 2 {
		c, ch := trickleAction(t, srv, "acme", body)
		conns, answers = append(conns, c), append(answers, ch)
	}
	// The requests over the share wait (the gauge shows them), then give up.
	waiting := func() string {
		resp, err := srv.Client().Get(srv.URL + dispatch.PathMetrics)
		must(t, err)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, `aip_dispatch_action_reads_waiting{reason="tenant_share"} `); ok {
				return v
			}
		}
		t.Fatal("/metrics lacks aip_dispatch_action_reads_waiting")
		return ""
	}
	for deadline := time.Now().Add(10 * time.Second); waiting() != "2"; {
		if time.Now().After(deadline) {
			t.Fatalf("requests waiting for the tenant's share: %s, want 2", waiting())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Another tenant's body is read (and found malformed) meanwhile.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+dispatch.PathActions, strings.NewReader(`{"capability_id":`))
	req.Header.Set("Authorization", "Bearer good-globex")
	resp, err := srv.Client().Do(req)
	must(t, err)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, raw) != dispatch.CodeRequestInvalid {
		t.Fatalf("another tenant's request while acme holds its share: %d %s, want 400 %s", resp.StatusCode, raw, dispatch.CodeRequestInvalid)
	}

	continued := readAnswers(t, answers, func(a rawAnswer) {
		if a.resp.StatusCode != http.StatusTooManyRequests || errorCode(t, a.body) != dispatch.CodeSchedulerOverloaded ||
			a.resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(a.body), "share") {
			t.Fatalf("a request over its tenant's share: %d %s (Retry-After %q), want 429 %s, retry after 1 s",
				a.resp.StatusCode, a.body, a.resp.Header.Get("Retry-After"), dispatch.CodeSchedulerOverloaded)
		}
	})
	if continued != share {
		t.Fatalf("%d of %d trickled requests of one tenant were read, want its share (%d)", continued, share+2, share)
	}

	// Announced over the limit: refused without reading.
	c, ch := trickleAction(t, srv, "initech", body+1)
	a := <-ch
	if a.err != nil || a.continued || a.resp.StatusCode != http.StatusRequestEntityTooLarge || errorCode(t, a.body) != dispatch.CodeRequestTooLarge {
		t.Fatalf("a body announced over the limit: %+v %s, want 413 %s unread", a, a.body, dispatch.CodeRequestTooLarge)
	}
	c.Close()

	for _, c := range conns {
		c.Close()
	}
	for deadline := time.Now().Add(30 * time.Second); dispatch.ActionBodyTenants(d) != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("the read budget keeps %d tenants after their requests ended", dispatch.ActionBodyTenants(d))
		}
		time.Sleep(10 * time.Millisecond) // polling: nothing to wait on from outside the handler
	}
}

// TestStalledActionBodyIsCutOffAtTheMinimumRate: once its reservation is
// granted, an action body must arrive at the read budget's minimum rate
// (after its grace), not within the server's read timeout, which this
// server does not even set; the refusal says what rate it missed and that
// nothing was dispatched, so the caller knows to send it again (it said
// only that the body did not arrive in time).
func TestStalledActionBodyIsCutOffAtTheMinimumRate(t *testing.T) {
	w := newWorld(t, worldOptions{}) // httptest: no ReadTimeout
	u, err := url.Parse(w.srv.URL)
	must(t, err)
	c, err := net.Dial("tcp", u.Host)
	must(t, err)
	defer c.Close()
	start := time.Now()
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{",
		dispatch.PathActions, u.Host, w.token(tenant))
	must(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled action body: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != dispatch.CodeRequestInvalid {
		t.Fatalf("a stalled action body: %d %s, want 400 %s", resp.StatusCode, body, dispatch.CodeRequestInvalid)
	}
	if took > 15*time.Second {
		t.Errorf("a stalled 100-byte body was refused after %s, want about the 5 s grace", took)
	}
	for _, want := range []string{"did not arrive in time", "256 KiB/s", "grace of 5s", "nothing was dispatched", "send it again", `"retryable":true`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("the refusal of a stalled action body lacks %q: %s", want, body)
		}
	}
}
