package dispatch_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestHopFailuresNameNoInternals: what a caller is told of a hop that
// failed names the kind of failure, never the replica's endpoint (its
// internal host and port) nor text that came back unsigned from whatever
// answers there (a proxy's error page, a stray service): a tenant learns
// nothing of the fleet's network. Before, the transport error (Post
// "http://10.x.y.z:port/...": dial tcp 10.x.y.z:port: ...) and up to 512
// bytes of an unsigned body were copied into the run's, the cancel's and
// the status read's answers. The detail goes to the dispatcher's log
// ("hop failed").
func TestHopFailuresNameNoInternals(t *testing.T) {
	var logs hostsdktest.LogBuffer
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) {
		c.MaxReroutes = -1
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	const secret = "backend 10.9.8.7:9000 pod aip-chatwoot-7f9 db=postgres://svc:pw@10.1.1.1"
	// leaks reports what an answer body reveals of internals.
	leaks := func(body []byte, endpoint string) []string {
		u, err := url.Parse(endpoint)
		must(t, err)
		var out []string
		for _, s := range []string{u.Host, u.Hostname() + ":" + u.Port(), "10.9.8.7", "aip-chatwoot", "postgres://"} {
			if strings.Contains(string(body), s) {
				out = append(out, s)
			}
		}
		return out
	}
	endpointOf := func(id string) string {
		rep, err := w.reg.ConnectorReplica(w.ctx, id)
		must(t, err)
		return rep.Endpoint
	}
	check := func(what string, body []byte, endpoint, want string) {
		t.Helper()
		if l := leaks(body, endpoint); len(l) > 0 {
			t.Errorf("%s: the answer names %q: %s", what, l, body)
		}
		if !strings.Contains(string(body), want) {
			t.Errorf("%s: the answer does not say %q: %s", what, want, body)
		}
	}

	dead := w.deadReplica(t)
	act := w.actionFavoring(dead, dead)
	status, body, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")})
	if status != http.StatusServiceUnavailable || errorCode(t, body) != dispatch.CodeReplicaUnreachable {
		t.Fatalf("an action pinned to a dead replica: %d %s", status, body)
	}
	check("run on a dead replica", body, endpointOf(dead), "connection refused")
	status, body, _ = w.call(http.MethodGet, dispatch.PathActions+"/"+act, tenant, nil)
	if status != http.StatusOK {
		t.Fatalf("status read: %d %s", status, body)
	}
	check("status read of a dead replica", body, endpointOf(dead), "connection refused")
	status, body, _ = w.call(http.MethodPost, dispatch.PathActions+"/"+act+"/cancel", tenant, nil)
	if status != http.StatusBadGateway {
		t.Fatalf("cancel: %d %s", status, body)
	}
	check("cancel on a dead replica", body, endpointOf(dead), "connection refused")
	if !strings.Contains(logs.String(), "hop failed") || !strings.Contains(logs.String(), endpointOf(dead)) {
		t.Errorf("the log does not have the failed hops with the endpoint:\n%s", logs.String())
	}
	// A caller polling an action pinned to a dead replica does not write
	// a log line per request: one replica's failed hops are logged at most
	// every 10 s.
	for range 20 {
		w.call(http.MethodGet, dispatch.PathActions+"/"+act, tenant, nil)
	}
	if n := strings.Count(logs.String(), "replica_id="+dead); n != 1 {
		t.Errorf("the dead replica's failed hops were logged %d times, want once in 10 s:\n%s", n, logs.String())
	}

	// Whatever answers at the endpoint, unsigned.
	candidates := []string{dead}
	for name, answer := range map[string]string{
		"an unsigned error":   `{"error":"upstream connect error: ` + secret + `"}`,
		"an unsigned code":    `{"error":{"code":"connector_host.authentication","message":"` + secret + `"}}`,
		"not an envelope":     `{"message_type":"` + secret + `"}`,
		"a proxy's HTML page": `<html><body>502 Bad Gateway: ` + secret + `</body></html>`,
	} {
		key, _ := aip.GenerateSigningKey()
		id := w.fakeReplica(aip.NewID(aip.PrefixReplica), key, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Content-Type", "application/json")
			rw.WriteHeader(http.StatusBadGateway)
			rw.Write([]byte(answer))
		}))
		candidates = append(candidates, id)
		act := w.actionFavoring(id, candidates...)
		status, body, _ := w.call(http.MethodPost, dispatch.PathActions, tenant, dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")})
		if status != http.StatusBadGateway || errorCode(t, body) != dispatch.CodeOutcomeUnknown {
			t.Fatalf("%s: %d %s", name, status, body)
		}
		check(name, body, endpointOf(id), "not an envelope signed by replica "+id)
		if name == "an unsigned code" && !strings.Contains(string(body), "an unsigned connector_host.authentication") {
			t.Errorf("%s: the answer does not name the code: %s", name, body)
		}
		if !strings.Contains(logs.String(), "10.9.8.7") {
			t.Errorf("%s: the log does not have the unsigned answer:\n%s", name, logs.String())
		}
		_, body, _ = w.call(http.MethodGet, dispatch.PathActions+"/"+act, tenant, nil)
		var st dispatch.ActionStatusResponse
		must(t, json.Unmarshal(body, &st))
		if st.Replica.Reachable || st.Replica.Error == nil {
			t.Fatalf("%s: status read %s", name, body)
		}
		check(name+", status read", body, endpointOf(id), "not an envelope signed by replica "+id)
	}
}

// TestUnreadBodyNamesNoAddresses: a request whose body does not arrive
// (it stalls past the server's read timeout, or for an action body past
// the read budget's minimum-rate deadline) is answered 400 saying so,
// without the read error, which names the dispatcher's own address and the
// connection's (read tcp <dispatcher>-><caller>: i/o timeout): behind a
// proxy that is an internal address no caller is told. The action and the
// cancel routes both read a body.
func TestUnreadBodyNamesNoAddresses(t *testing.T) {
	w := newWorld(t, worldOptions{})
	srv := httptest.NewUnstartedServer(w.d.Handler())
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	must(t, err)
	for _, path := range []string{dispatch.PathActions, dispatch.PathActions + "/" + aip.NewActionID() + "/cancel"} {
		c, err := net.Dial("tcp", u.Host)
		must(t, err)
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", path, u.Host, w.token(tenant))
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			t.Fatalf("%s: no answer to a stalled body: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.Close()
		if resp.StatusCode != http.StatusBadRequest || errorCode(t, body) != dispatch.CodeRequestInvalid {
			t.Fatalf("%s: a stalled body answered %d %s", path, resp.StatusCode, body)
		}
		if strings.Contains(string(body), u.Host) || strings.Contains(string(body), c.LocalAddr().String()) || !strings.Contains(string(body), "did not arrive in time") {
			t.Errorf("%s: the answer to a stalled body is %s: want it to say the body did not arrive in time, without the connection's addresses", path, body)
		}
	}
}
