package dispatch_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// roundTripFunc is an http.RoundTripper of a test's own.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// deadReplica registers a replica whose endpoint refuses connections (a
// replica that crashed before its lease ran out) and returns its ID.
func (w *world) deadReplica(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	must(t, ln.Close())
	key, _ := aip.GenerateSigningKey()
	id := aip.NewID(aip.PrefixReplica)
	must(t, w.reg.PutReplica(w.ctx, registry.ConnectorReplica{
		ID: id, InstanceID: w.instanceID, VersionID: w.versionID, Endpoint: "http://" + addr + aip.MessagesPath,
		PeerPrincipalID: "agent:dispatch-test", PeerPrincipalKind: aip.PrincipalAgent, PeerDID: key.DID(),
		TrustDomain: hostsdktest.TrustDomain, TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(),
		Status: aip.ReplicaReady, LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: 1,
	}))
	return id
}

// TestNeverDeliveredIsRerouted: an action whose new route pins it to a
// replica that refuses connections moves to a healthy replica and
// completes there, once: nothing was ever sent under the first assignment,
// which only this request held. The dead replica's circuit counts the
// failure; the route's history keeps the first assignment; the answer
// names the move. A retry of the action ID afterwards is the healthy
// replica's (its journal answers, nothing runs again).
func TestNeverDeliveredIsRerouted(t *testing.T) {
	w := newWorld(t, worldOptions{})
	healthy := w.startHost(8, 8)
	dead := w.deadReplica(t)
	act := w.actionFavoring(dead, dead, healthy.cfg.ReplicaID)
	req := dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")}
	status, resp := w.act(req)
	if status != http.StatusOK || resp.Result == nil || resp.Settlement != registry.SettlementCompleted {
		t.Fatalf("answer %d %+v %q", status, resp.Error, resp.Settlement)
	}
	if resp.Route.ReplicaID != healthy.cfg.ReplicaID || len(resp.Route.Reroutes) != 1 ||
		resp.Route.Reroutes[0].FromReplicaID != dead || resp.Route.Reroutes[0].RefusalCode != dispatch.CodeReplicaUnreachable {
		t.Fatalf("route %+v", resp.Route)
	}
	if runs := w.counter.runs(act); len(runs) != 1 || runs[0] != healthy.cfg.ReplicaID {
		t.Fatalf("the action ran on %v", runs)
	}
	hist, err := w.reg.RouteHistory(w.ctx, act)
	must(t, err)
	if len(hist) != 1 || hist[0].ReplicaID != dead {
		t.Fatalf("history %+v", hist)
	}
	rep, err := w.reg.ConnectorReplica(w.ctx, dead)
	must(t, err)
	if rep.Circuit.ConsecutiveFailures != 1 || rep.ActiveAssignments != 0 {
		t.Fatalf("dead replica: circuit %+v, %d active", rep.Circuit, rep.ActiveAssignments)
	}
	status, again := w.act(req)
	if status != http.StatusOK || again.Route.FenceToken != resp.Route.FenceToken || len(w.counter.runs(act)) != 1 {
		t.Fatalf("retry: %d %+v on %+v, runs %v", status, again.Error, again.Route, w.counter.runs(act))
	}
	w.idle()
}

// TestUnreachableReplica: a hop that never got a connection to the replica
// (a refused dial: the replica crashed; a dial that hangs: its machine is
// gone) delivered nothing, and the client is told so — 503
// dispatch.replica_unreachable, retryable, not "outcome unknown", when no
// other replica can take the action (TestNeverDeliveredIsRerouted moves
// it). The settlement stays outcome_unknown (the failure counts toward the
// replica's circuit; an earlier delivery may have reached it) and the route
// stays pinned: a retry of the action ID is a second hand-out, which never
// moves. A RoundTripper that is not net/http's own may have sent bytes its
// own way: its failures stay outcome_unknown.
func TestUnreachableReplica(t *testing.T) {
	// net/http goes on dialing after the request gave up (the connection
	// could serve another): the hanging dial ends when the test does.
	dialsEnd := make(chan struct{})
	t.Cleanup(func() { close(dialsEnd) })
	hangingDial := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-dialsEnd:
			return nil, errors.New("the test ended")
		}
	}}}
	foreign := &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return nil, errors.New("the foreign transport lost the connection")
	})}
	cases := []struct {
		name   string
		client *http.Client
		status int
		code   string
	}{
		{"refused dial", nil, http.StatusServiceUnavailable, dispatch.CodeReplicaUnreachable},
		{"dial hangs past the timeout", hangingDial, http.StatusServiceUnavailable, dispatch.CodeReplicaUnreachable},
		{"foreign transport", foreign, http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, worldOptions{client: c.client, cfg: func(c *dispatch.Config) { c.HopSlack = time.Millisecond }})
			id := w.deadReplica(t)
			timeout := uint64(300)
			req := dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", ""), TimeoutMS: &timeout}
			status, resp := w.act(req)
			if status != c.status || resp.Error == nil || resp.Error.Code != c.code || resp.Error.Retryable == nil || !*resp.Error.Retryable {
				t.Fatalf("answer %d %+v, want %d %s (retryable)", status, resp.Error, c.status, c.code)
			}
			if resp.Settlement != registry.SettlementOutcomeUnknown || resp.Route.ReplicaID != id || len(resp.Route.Reroutes) != 0 {
				t.Fatalf("settlement %q route %+v", resp.Settlement, resp.Route)
			}
			rep, err := w.reg.ConnectorReplica(w.ctx, id)
			must(t, err)
			if rep.Circuit.ConsecutiveFailures != 1 {
				t.Fatalf("circuit %+v: the failure did not count", rep.Circuit)
			}
			res, err := w.reg.Reservation(w.ctx, resp.ActionID)
			must(t, err)
			if res.Reserved || res.LastSettlement != registry.SettlementOutcomeUnknown {
				t.Fatalf("reservation %+v", res)
			}
			// The action stays pinned: a retry goes to the same replica
			// under the same fence, even with a healthy one beside it.
			w.startHost(8, 8)
			req.ActionID = resp.ActionID
			_, again := w.act(req)
			if again.Route.FenceToken != resp.Route.FenceToken || again.Error == nil || again.Error.Code != c.code {
				t.Fatalf("retry answered %+v on %+v", again.Error, again.Route)
			}
			if runs := w.counter.runs(resp.ActionID); len(runs) != 0 {
				t.Fatalf("the action ran on %v", runs)
			}
			// Operators alert on outcome="outcome_unknown" for "it may
			// have run": an answer that proves nothing reached the
			// replica is counted apart; the foreign transport's is not
			// such proof.
			series := strings.Join(w.metricSeries("aip_dispatch_actions_total"), "\n")
			want := `aip_dispatch_actions_total{outcome="not_delivered"} 2`
			if c.code != dispatch.CodeReplicaUnreachable {
				want = `aip_dispatch_actions_total{outcome="outcome_unknown"} 2`
			}
			if !strings.Contains(series, want) {
				t.Fatalf("aip_dispatch_actions_total:\n%s\nwant %s", series, want)
			}
		})
	}
}

// detachedForwarder is a RoundTripper that posts the request to the
// replica on a connection of its own, outside the request's context (so
// outside its httptrace), and then loses the answer: the envelope reached
// the replica, yet net/http's GotConn never fired for it. getConn: it
// reports that it looks for a connection to the request's httptrace, as
// net/http does.
func detachedForwarder(t *testing.T, getConn bool) http.RoundTripper {
	own := &http.Transport{}
	t.Cleanup(own.CloseIdleConnections)
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if tr := httptrace.ContextClientTrace(r.Context()); getConn && tr != nil && tr.GetConn != nil {
			tr.GetConn(r.URL.Host)
		}
		resp, err := own.RoundTrip(r.Clone(context.Background()))
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		return nil, errors.New("the forwarder lost the answer")
	})
}

// TestDetachedTransportIsNotUnreachable: a hop whose transport sent the
// envelope some way net/http's httptrace does not see — a protocol
// registered on the *http.Transport (RegisterProtocol), or a client with
// no Transport while http.DefaultTransport is another RoundTripper — is
// no proof that nothing was sent: its failure stays outcome_unknown and
// the action stays pinned, so it runs on one replica only.
func TestDetachedTransportIsNotUnreachable(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) *http.Client
		// arm runs once the world is up (nil: nothing to do).
		arm func(t *testing.T)
	}{
		{"registered protocol", func(t *testing.T) *http.Client {
			tr := &http.Transport{}
			tr.RegisterProtocol("http", detachedForwarder(t, false))
			return &http.Client{Transport: tr}
		}, nil},
		{"replaced default transport", func(*testing.T) *http.Client { return &http.Client{} }, func(t *testing.T) {
			// Not parallel: no other test runs while it is replaced.
			old := http.DefaultTransport
			http.DefaultTransport = detachedForwarder(t, true)
			t.Cleanup(func() { http.DefaultTransport = old })
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, worldOptions{client: c.client(t)})
			first := w.startHost(8, 8)
			second := w.startHost(8, 8)
			if c.arm != nil {
				c.arm(t)
			}
			act := w.actionFavoring(first.cfg.ReplicaID, first.cfg.ReplicaID, second.cfg.ReplicaID)
			status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")})
			if runs := w.counter.runs(act); len(runs) != 1 || runs[0] != first.cfg.ReplicaID {
				t.Fatalf("the action ran on %v (answer %d %+v, route %+v)", runs, status, resp.Error, resp.Route)
			}
			if status != http.StatusBadGateway || resp.Error == nil || resp.Error.Code != dispatch.CodeOutcomeUnknown ||
				resp.Route.ReplicaID != first.cfg.ReplicaID || len(resp.Route.Reroutes) != 0 {
				t.Fatalf("answer %d %+v, route %+v", status, resp.Error, resp.Route)
			}
			w.idle()
		})
	}
}

// lostRerouteAnswer is a Rerouter whose reroutes commit and whose answers
// are lost on the way back.
type lostRerouteAnswer struct{ registry.Rerouter }

func (l lostRerouteAnswer) Reroute(ctx context.Context, req registry.RerouteRequest) (registry.RouteAssignment, error) {
	if _, err := l.Rerouter.Reroute(ctx, req); err != nil {
		return registry.RouteAssignment{}, err
	}
	return registry.RouteAssignment{}, errors.New("connection reset by peer")
}

// TestLostRerouteAnswer: the reroute of a never-delivered action committed
// but its answer was lost. The client still learns that nothing reached
// the unreachable replica (503 dispatch.replica_unreachable, retryable),
// and is not told the action stays pinned there: the message says it may
// have moved, and the retry of the same action ID completes on the replica
// the registry moved it to, once.
func TestLostRerouteAnswer(t *testing.T) {
	w := newWorld(t, worldOptions{rerouter: func(r *memregistry.Registry) registry.Rerouter { return lostRerouteAnswer{r} }})
	healthy := w.startHost(8, 8)
	dead := w.deadReplica(t)
	act := w.actionFavoring(dead, dead, healthy.cfg.ReplicaID)
	req := dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")}
	status, resp := w.act(req)
	if status != http.StatusServiceUnavailable || resp.Error == nil || resp.Error.Code != dispatch.CodeReplicaUnreachable {
		t.Fatalf("answer %d %+v, want 503 %s", status, resp.Error, dispatch.CodeReplicaUnreachable)
	}
	if msg := resp.Error.Message; strings.Contains(msg, "stays pinned") || !strings.Contains(msg, "may have been moved") ||
		strings.Contains(msg, "connection reset by peer") {
		t.Fatalf("message %q: want it to say the action may have moved, without the registry's error", msg)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("the action ran on %v before the retry", runs)
	}
	status, again := w.act(req)
	if status != http.StatusOK || again.Result == nil || again.Route.ReplicaID != healthy.cfg.ReplicaID {
		t.Fatalf("retry: %d %+v on %+v", status, again.Error, again.Route)
	}
	if runs := w.counter.runs(act); len(runs) != 1 || runs[0] != healthy.cfg.ReplicaID {
		t.Fatalf("the action ran on %v", runs)
	}
	w.idle()
}
