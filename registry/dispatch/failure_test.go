package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// fakeAnswer is how a fake replica answers the envelope it received.
type fakeAnswer func(w http.ResponseWriter, r *http.Request, req *aip.Envelope)

// fakeHandler decodes the posted envelope (without verifying it) and lets
// answer reply.
func fakeHandler(answer fakeAnswer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var env aip.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, "bad envelope", http.StatusBadRequest)
			return
		}
		answer(w, r, &env)
	})
}

// signedReply answers with body signed by key, correlated with req.
func signedReply(key *aip.SigningKey, status int, body aip.Body) fakeAnswer {
	return func(w http.ResponseWriter, r *http.Request, req *aip.Envelope) {
		env, err := aip.NewEnvelope(time.Now(), body)
		if err != nil {
			panic(err)
		}
		env.InResponseTo = &aip.MessageReference{Message: req.MessageID}
		env.To = req.From
		env.From = &aip.Principal{ID: "agent:dispatch-test", Kind: aip.PrincipalAgent}
		raw, err := aip.SignEnvelope(key, env)
		if err != nil {
			panic(err)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(raw)
	}
}

// TestUncertainFailuresNeverReroute: every answer that does not prove the
// action did not start settles outcome_unknown and keeps the route pinned,
// although a healthy replica is available.
func TestUncertainFailuresNeverReroute(t *testing.T) {
	replicaKey, _ := aip.GenerateSigningKey()
	otherKey, _ := aip.GenerateSigningKey()
	refusal := aip.Body{Error: &aip.ErrorBody{Error: *aip.NewProtocolError(hostsdk.CodeNotReady, aip.CategoryTemporary, true, 100, "draining")}}
	cases := []struct {
		name   string
		answer fakeAnswer
		status int
		code   string
	}{
		{"timeout", func(w http.ResponseWriter, r *http.Request, _ *aip.Envelope) { <-r.Context().Done() },
			http.StatusGatewayTimeout, dispatch.CodeTimeout},
		{"connection reset after sending", func(w http.ResponseWriter, r *http.Request, _ *aip.Envelope) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
		}, http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
		{"unsigned 503", func(w http.ResponseWriter, r *http.Request, _ *aip.Envelope) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error":{"code":"connector_host.not_ready","message":"draining","category":"temporary","retryable":true}}`))
		}, http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
		{"refusal signed by another key", signedReply(otherKey, http.StatusServiceUnavailable, refusal),
			http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
		{"refusal of another message", func(w http.ResponseWriter, r *http.Request, req *aip.Envelope) {
			other := *req
			other.MessageID = aip.NewMessageID()
			signedReply(replicaKey, http.StatusServiceUnavailable, refusal)(w, r, &other)
		}, http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
		{"result for another action", func(w http.ResponseWriter, r *http.Request, req *aip.Envelope) {
			signedReply(replicaKey, http.StatusOK, aip.Body{ActionResult: &aip.ActionResult{ActionID: aip.NewActionID(), Status: aip.ResultCompleted}})(w, r, req)
		}, http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
		{"signed outcome unknown", signedReply(replicaKey, http.StatusBadGateway, aip.Body{Error: &aip.ErrorBody{
			Error: *aip.NewProtocolError(hostsdk.CodeOutcomeUnknown, aip.CategoryConnector, false, 0, "crashed mid-way")}}),
			http.StatusBadGateway, hostsdk.CodeOutcomeUnknown},
		{"garbage", func(w http.ResponseWriter, r *http.Request, _ *aip.Envelope) {
			w.Write([]byte("<html>proxy error</html>"))
		},
			http.StatusBadGateway, dispatch.CodeOutcomeUnknown},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.HopSlack = time.Millisecond }})
			spare := w.startHost(8, 8)
			fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(c.answer))
			act := w.actionFavoring(fake, fake, spare.cfg.ReplicaID)
			timeout := uint64(300)
			req := dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", ""), TimeoutMS: &timeout}
			status, resp := w.act(req)
			if status != c.status || resp.Error == nil || resp.Error.Code != c.code {
				t.Fatalf("answer %d %+v, want %d %s", status, resp.Error, c.status, c.code)
			}
			if resp.Settlement != registry.SettlementOutcomeUnknown || resp.Route.ReplicaID != fake || len(resp.Route.Reroutes) != 0 {
				t.Fatalf("settlement %q route %+v", resp.Settlement, resp.Route)
			}
			if runs := w.counter.runs(act); len(runs) != 0 {
				t.Fatalf("the action ran on %v", runs)
			}
			res, err := w.reg.Reservation(w.ctx, act)
			must(t, err)
			if res.Reserved || res.LastSettlement != registry.SettlementOutcomeUnknown {
				t.Fatalf("reservation %+v", res)
			}
			hist, err := w.reg.RouteHistory(w.ctx, act)
			must(t, err)
			if len(hist) != 0 {
				t.Fatalf("history %+v", hist)
			}
			// A retry goes back to the same replica, never elsewhere.
			_, again := w.act(req)
			if again.Route.FenceToken != resp.Route.FenceToken || len(w.counter.runs(act)) != 0 {
				t.Fatalf("retry routed to %+v", again.Route)
			}
		})
	}
}

// TestSignedAnswersSettle: a replica's definitive signed answers settle
// cancelled (nothing ran for this delivery) and keep their status.
func TestSignedAnswersSettle(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	// The input schema says text is a string.
	status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: json.RawMessage(`{"text":42}`)})
	if status != http.StatusUnprocessableEntity || resp.Error.Code != hostsdk.CodeInputInvalid || resp.Settlement != registry.SettlementCancelled {
		t.Fatalf("invalid input: %d %+v %q", status, resp.Error, resp.Settlement)
	}
	// The same action ID with another input is an idempotency conflict.
	req := dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("a", "")}
	w.act(req)
	req.Input = say("b", "")
	status, resp = w.act(req)
	if status != http.StatusConflict || resp.Error.Code != hostsdk.CodeIdempotencyConflict {
		t.Fatalf("conflicting input: %d %+v", status, resp.Error)
	}
	// A connector timeout of fleet.say, a read, is the host's journaled
	// failed connector_host.interrupted (retryable), settled
	// outcome_unknown (TestInterruptedReadsTripTheCircuit).
	timeout := uint64(100)
	status, resp = w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("slow", `,"delay_ms":5000`), TimeoutMS: &timeout})
	if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultFailed || resp.Result.Error == nil ||
		resp.Result.Error.Code != hostsdk.CodeInterrupted || !resp.Result.Error.IsRetryable() || resp.Settlement != registry.SettlementOutcomeUnknown {
		t.Fatalf("connector timeout: %d %+v %+v %q", status, resp.Result, resp.Error, resp.Settlement)
	}
	w.idle()
}

// TestPrunedActionExpires: once the pinned replica pruned a finished action
// after its retention, a retry of the action ID is answered 410
// connector_host.action_expired (settled pruned, not cancelled: it may have
// finished there) and runs nothing, and GET shows the replica's state
// pruned and the route's last settlement pruned.
func TestPrunedActionExpires(t *testing.T) {
	w := newWorld(t, worldOptions{})
	j, err := sqliteruntime.Open(w.ctx, sqliteruntime.Config{Dir: t.TempDir()})
	must(t, err)
	t.Cleanup(func() { j.Close() })
	w.startHostWith(8, 8, func(c *hostsdk.Config) { c.Journal = j })
	req := dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("once", "")}
	if status, resp := w.act(req); status != http.StatusOK {
		t.Fatalf("first run: %d %+v", status, resp.Error)
	}
	// What the host's retention does, a minute ahead.
	if n, err := j.PruneActions(w.ctx, time.Now().Add(time.Minute), 10, nil); err != nil || n != 1 {
		t.Fatalf("PruneActions = %d, %v", n, err)
	}
	status, resp := w.act(req)
	if status != http.StatusGone || resp.Error == nil || resp.Error.Code != hostsdk.CodeActionExpired || resp.Settlement != registry.SettlementPruned {
		t.Fatalf("retry after pruning: %d %+v %q", status, resp.Error, resp.Settlement)
	}
	if runs := w.counter.runs(req.ActionID); len(runs) != 1 {
		t.Fatalf("the action ran %d times", len(runs))
	}
	code, body, _ := w.call(http.MethodGet, dispatch.PathActions+"/"+req.ActionID, tenant, nil)
	var st dispatch.ActionStatusResponse
	must(t, json.Unmarshal(body, &st))
	if code != http.StatusOK || !st.Replica.Reachable || st.Replica.State != aip.StatePruned || st.Reservation.Reserved ||
		st.Reservation.LastSettlement != registry.SettlementPruned {
		t.Fatalf("status %d: %s", code, body)
	}
	w.idle()
}

func TestCancelReachesThePinnedReplica(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	w.startHost(8, 8)
	act := aip.NewActionID()
	done, a := w.actRunning(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("long", `,"delay_ms":60000`)})
	status, body, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+act+"/cancel", tenant, `{"reason":"changed my mind"}`)
	var resp dispatch.ActionResponse
	must(t, json.Unmarshal(body, &resp))
	if status != http.StatusOK || resp.Result == nil || resp.Result.Status != aip.ResultCancelled || resp.Route.ReplicaID != a.ReplicaID {
		t.Fatalf("cancel: %d %s", status, body)
	}
	orig := <-done
	if orig.Result == nil || orig.Result.Status != aip.ResultCancelled {
		t.Fatalf("the cancelled action answered %+v %+v", orig.Result, orig.Error)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("the cancelled action's effect ran on %v", runs)
	}
	w.idle()
	// Unknown and foreign actions are not found.
	if status, _, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+aip.NewActionID()+"/cancel", tenant, nil); status != http.StatusNotFound {
		t.Fatalf("cancel of an unknown action: %d", status)
	}
	if status, _, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+act+"/cancel", "tenant-other", nil); status != http.StatusNotFound {
		t.Fatalf("cancel of a foreign action: %d", status)
	}
}

func TestStatusOfAnUnreachableReplica(t *testing.T) {
	w := newWorld(t, worldOptions{})
	h := w.startHost(8, 8)
	_, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", "")})
	must(t, h.host.Stop(context.Background()))
	status, body, _ := w.call(http.MethodGet, dispatch.PathActions+"/"+resp.ActionID, tenant, nil)
	var st dispatch.ActionStatusResponse
	must(t, json.Unmarshal(body, &st))
	if status != http.StatusOK || st.Replica.Reachable || st.Replica.Error == nil || st.Replica.Error.Code != dispatch.CodeReplicaUnreachable ||
		st.Replica.State != "" || st.Route.FenceToken != resp.Route.FenceToken || st.Reservation.LastSettlement != registry.SettlementCompleted || st.Reservation.HandOut != 1 {
		t.Fatalf("status %d: %s", status, body)
	}
	if status, _, _ := w.call(http.MethodGet, dispatch.PathActions+"/"+resp.ActionID, "tenant-other", nil); status != http.StatusNotFound {
		t.Fatalf("a foreign tenant's status query: %d", status)
	}
	if status, _, _ := w.call(http.MethodGet, dispatch.PathActions+"/not-an-id", tenant, nil); status != http.StatusNotFound {
		t.Fatalf("a malformed ID: %d", status)
	}
}

func TestCapabilitiesArePagedPerTenant(t *testing.T) {
	w := newWorld(t, worldOptions{})
	get := func(tenant, query string) (int, dispatch.CapabilitiesResponse, []byte) {
		status, body, _ := w.call(http.MethodGet, dispatch.PathCapabilities+query, tenant, nil)
		var page dispatch.CapabilitiesResponse
		json.Unmarshal(body, &page)
		return status, page, body
	}
	status, p1, body := get(tenant, "?limit=1")
	if status != http.StatusOK || len(p1.Capabilities) != 1 || p1.Capabilities[0].Capability.ID != capSay || p1.Total != 2 || p1.NextCursor == "" {
		t.Fatalf("page 1: %d %s", status, body)
	}
	status, p2, body := get(tenant, "?limit=1&cursor="+p1.NextCursor)
	if status != http.StatusOK || len(p2.Capabilities) != 1 || p2.Capabilities[0].Capability.ID != capStream || p2.NextCursor != "" {
		t.Fatalf("page 2: %d %s", status, body)
	}
	// A catalog write makes the cursor stale.
	b, err := w.reg.CapabilityBinding(w.ctx, registry.BindingKey{TenantID: tenant, CapabilityID: capStream, InstanceID: w.instanceID})
	must(t, err)
	b.PolicyRevision++
	must(t, w.reg.PutBinding(w.ctx, b))
	status, _, body = get(tenant, "?limit=1&cursor="+p1.NextCursor)
	var e dispatch.ErrorResponse
	must(t, json.Unmarshal(body, &e))
	if status != http.StatusConflict || e.Error.Code != dispatch.CodeStaleCursor {
		t.Fatalf("stale cursor: %d %s", status, body)
	}
	if status, page, body := get("tenant-other", ""); status != http.StatusOK || len(page.Capabilities) != 0 || page.Total != 0 {
		t.Fatalf("another tenant's catalog: %d %s", status, body)
	}
	// An unknown parameter (a misspelt one was ignored: the page had the
	// default size), a parameter given twice (the first was used, while a
	// proxy may read the last) and a malformed query (dropped) are refused.
	for _, q := range []string{"?limit=0", "?limit=x", "?cursor=nonsense", "?limt=1", "?limit=1&limit=2", "?q=say&q=stream",
		"?capability_id=fleet.say&capability_id=fleet.stream", "?limit=%zz"} {
		if status, _, body := get(tenant, q); status != http.StatusBadRequest {
			t.Fatalf("%s: %d %s", q, status, body)
		}
	}
}

// TestBadRequestsChangeNothing: each refused request gets its documented
// error and leaves no route behind.
func TestBadRequestsChangeNothing(t *testing.T) {
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.MaxBodyBytes = 1 << 10 }})
	w.startHost(8, 8)
	expired, err := func() (string, error) {
		past := time.Now().Add(-2 * time.Hour)
		return mintWith(w, tenant, past, past.Add(time.Hour), "")
	}()
	must(t, err)
	wrongAud, err := mintWith(w, tenant, time.Now(), time.Now().Add(time.Hour), "someone-else")
	must(t, err)
	stranger, _ := aip.GenerateSigningKey()
	foreignKey, err := mintKey(stranger, tenant)
	must(t, err)
	id := aip.NewActionID()
	valid := func() map[string]any {
		return map[string]any{"action_id": id, "capability_id": capSay, "input": map[string]any{"text": "x"}}
	}
	big := valid()
	big["input"] = map[string]any{"text": string(make([]byte, 2<<10))}
	cases := []struct {
		name   string
		auth   string
		body   any
		status int
		code   string
		msg    string // part of the message ("": not checked)
	}{
		{"no token", "none", valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"garbage token", "Bearer abc.def.ghi", valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"basic auth", "Basic dXNlcjpwYXNz", valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"expired token", "Bearer " + expired, valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"another audience", "Bearer " + wrongAud, valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"untrusted issuer key", "Bearer " + foreignKey, valid(), http.StatusUnauthorized, dispatch.CodeUnauthorized, ""},
		{"oversized body", "", big, http.StatusRequestEntityTooLarge, dispatch.CodeRequestTooLarge, ""},
		{"not JSON", "", "{action", http.StatusBadRequest, dispatch.CodeRequestInvalid, ""},
		{"unknown field", "", `{"capability_id":"fleet.say","input":{},"tenant_id":"tenant-other"}`, http.StatusBadRequest, dispatch.CodeRequestInvalid, ""},
		{"trailing data", "", `{"capability_id":"fleet.say","input":{}} {}`, http.StatusBadRequest, dispatch.CodeRequestInvalid, ""},
		{"no capability", "", `{"input":{}}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"no input", "", `{"capability_id":"fleet.say"}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"bad action ID", "", `{"action_id":"act_1","capability_id":"fleet.say","input":{}}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"async mode", "", `{"capability_id":"fleet.say","input":{},"mode":"async"}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"zero timeout", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":0}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"timeout too long", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":86400000}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		// Milliseconds that overflow a time.Duration must not wrap round to
		// a small or negative timeout that passes the bound.
		{"timeout overflowing a duration", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":18446744073709551615}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		{"timeout overflowing to negative", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":9223372036854776}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid, ""},
		// The message speaks JSON, not Go ("Go struct field ... of type
		// uint64"), and says what timeout_ms takes, not what its Go type
		// holds ("a whole number from 0 to 18446744073709551615", though 0
		// is refused).
		{"timeout as a string", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":"5"}`, http.StatusBadRequest, dispatch.CodeRequestInvalid,
			`member "timeout_ms": a JSON string where a whole number of milliseconds from 1 to 300000 is expected`},
		{"negative timeout", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":-1}`, http.StatusBadRequest, dispatch.CodeRequestInvalid,
			`member "timeout_ms": the number -1 where a whole number of milliseconds from 1 to 300000 is expected`},
		{"fractional timeout", "", `{"capability_id":"fleet.say","input":{},"timeout_ms":1.5}`, http.StatusBadRequest, dispatch.CodeRequestInvalid,
			`member "timeout_ms": the number 1.5 where a whole number of milliseconds from 1 to 300000 is expected`},
		{"action ID with hyphens", "", `{"action_id":"act_0192a8f0-c1d2-7e3f-8a4b-5c6d7e8f9003","capability_id":"fleet.say","input":{}}`, http.StatusUnprocessableEntity, dispatch.CodeActionInvalid,
			"choose it before the first send and keep it for every retry"},
		{"capability of another tenant", "tenant-other", valid(), http.StatusNotFound, dispatch.CodeBindingUnavailable, ""},
		{"unknown capability", "", map[string]any{"action_id": id, "capability_id": "fleet.nothing", "input": map[string]any{}}, http.StatusNotFound, dispatch.CodeBindingUnavailable, ""},
	}
	for _, c := range cases {
		var raw []byte
		switch b := c.body.(type) {
		case string:
			raw = []byte(b)
		default:
			raw, _ = json.Marshal(b)
		}
		req, _ := http.NewRequestWithContext(w.ctx, http.MethodPost, w.srv.URL+dispatch.PathActions, bytesReader(raw))
		switch {
		case c.auth == "none":
		case c.auth == "":
			req.Header.Set("Authorization", "Bearer "+w.token(tenant))
		case c.auth == "tenant-other":
			req.Header.Set("Authorization", "Bearer "+w.token("tenant-other"))
		default:
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := w.api.Do(req)
		must(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e dispatch.ErrorResponse
		if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
			t.Fatalf("%s: answer %d is not an error body: %s", c.name, resp.StatusCode, body)
		}
		if resp.StatusCode != c.status || e.Error.Code != c.code || e.Error.Message == "" {
			t.Fatalf("%s: %d %s, want %d %s", c.name, resp.StatusCode, body, c.status, c.code)
		}
		if c.msg != "" && !strings.Contains(e.Error.Message, c.msg) {
			t.Fatalf("%s: message %q, want it to say %q", c.name, e.Error.Message, c.msg)
		}
		if c.status == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Fatalf("%s: 401 without WWW-Authenticate", c.name)
		}
		// A request refused before it becomes an action answers a plain
		// error body, not an ActionResponse with a fresh action ID.
		if c.status != http.StatusNotFound && bytes.Contains(body, []byte(`"action_id"`)) {
			t.Fatalf("%s: the refusal names an action: %s", c.name, body)
		}
	}
	if _, err := w.reg.Assignment(w.ctx, id); !errors.Is(err, registry.ErrNotFound) {
		t.Fatalf("a refused request left a route: %v", err)
	}
	w.idle()
	if runs := w.counter.runs(id); len(runs) != 0 {
		t.Fatalf("a refused request ran: %v", runs)
	}
	// An action ID already routed for one capability cannot name another.
	first := dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("x", "")}
	w.act(first)
	first.CapabilityID, first.Mode, first.Input = capStream, aip.ModeStreaming, say("x", `,"chunks":1`)
	status, resp := w.act(first)
	if status != http.StatusConflict || resp.Error.Code != dispatch.CodeRouteConflict {
		t.Fatalf("reused action ID: %d %+v", status, resp.Error)
	}
}

// TestUnsendableActionSettlesCancelled: a replica the dispatcher cannot
// speak to (another transport profile) never receives the action, which
// settles cancelled (not outcome_unknown: nothing left the dispatcher).
func TestUnsendableActionSettlesCancelled(t *testing.T) {
	w := newWorld(t, worldOptions{})
	key, _ := aip.GenerateSigningKey()
	id := aip.NewID(aip.PrefixReplica)
	must(t, w.reg.PutReplica(w.ctx, registry.ConnectorReplica{
		ID: id, InstanceID: w.instanceID, VersionID: w.versionID, Endpoint: "https://replica.invalid/aip/v1/messages",
		PeerPrincipalID: "agent:dispatch-test", PeerPrincipalKind: aip.PrincipalAgent, PeerDID: key.DID(),
		TrustDomain: "test.aipfleet.invalid", TransportProfile: "aip.grpc.v1", Topology: aip.DefaultTopology(),
		Status: aip.ReplicaReady, LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: 1,
	}))
	status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", "")})
	if status != http.StatusBadGateway || resp.Error == nil || resp.Error.Code != dispatch.CodeReplicaUnreachable ||
		resp.Settlement != registry.SettlementCancelled || resp.Route.ReplicaID != id {
		t.Fatalf("answer %d %+v %q", status, resp.Error, resp.Settlement)
	}
	rep, err := w.reg.ConnectorReplica(w.ctx, id)
	must(t, err)
	if rep.Circuit != (registry.CircuitState{}) {
		t.Fatalf("circuit %+v", rep.Circuit)
	}
	w.idle()
}

// TestCancelSaysWhatItSettled: a cancel settles the reservation it finds
// held — here one a dispatcher made and never sent — and says so; a cancel
// of an action that finished before it settles nothing (the action's own
// settlement released the route) and its answer has no settlement, the
// route's last settlement staying the action's own.
func TestCancelSaysWhatItSettled(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	cancel := func(id string) dispatch.ActionResponse {
		t.Helper()
		status, body, _ := w.call(http.MethodPost, dispatch.PathActions+"/"+id+"/cancel", tenant, nil)
		var resp dispatch.ActionResponse
		must(t, json.Unmarshal(body, &resp))
		if status != http.StatusOK || resp.Result == nil {
			t.Fatalf("cancel of %s: %d %s", id, status, body)
		}
		return resp
	}

	_, done := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("finished", "")})
	if resp := cancel(done.ActionID); resp.Result.Status != aip.ResultCompleted || resp.Settlement != "" {
		t.Fatalf("cancel of a finished action: result %s, settlement %q; want its completed result and no settlement", resp.Result.Status, resp.Settlement)
	}
	if res, err := w.reg.Reservation(w.ctx, done.ActionID); err != nil || res.Reserved || res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("after a cancel of a finished action: %+v %v; want its own settlement kept", res, err)
	}

	held := aip.NewActionID()
	_, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: held, CapabilityID: capSay, TenantID: tenant})
	must(t, err)
	if resp := cancel(held); resp.Result.Status != aip.ResultCancelled || resp.Settlement != registry.SettlementCancelled {
		t.Fatalf("cancel of a held, unsent action: result %s, settlement %q; want cancelled, settled cancelled", resp.Result.Status, resp.Settlement)
	}
	w.idle()
}

// TestRetryWhileTheActionRunsLeavesItsReservation: a retry of an action
// that is still running on its replica (the first request's answer is
// awaited elsewhere) gets the replica's signed action_in_progress once its
// own timeout passes, and settles nothing: the reservation stays held for
// the delivery that runs the action, which settles it completed. Settling
// the retry released that reservation while the action ran.
func TestRetryWhileTheActionRunsLeavesItsReservation(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	act := aip.NewActionID()
	first, _ := w.actRunning(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("slow", `,"delay_ms":3000`)})
	status, retry := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("slow", `,"delay_ms":3000`), TimeoutMS: new(uint64(300))})
	if status != http.StatusConflict || retry.Error == nil || retry.Error.Code != hostsdk.CodeActionInProgress || retry.Settlement != "" {
		t.Fatalf("retry while the action runs: %d %+v settlement %q; want 409 action_in_progress and no settlement", status, retry.Error, retry.Settlement)
	}
	if res, err := w.reg.Reservation(w.ctx, act); err != nil || !res.Reserved {
		t.Fatalf("after the retry: %+v %v; want the running action's reservation held", res, err)
	}
	resp := <-first
	if resp.Result == nil || resp.Result.Status != aip.ResultCompleted || resp.Settlement != registry.SettlementCompleted {
		t.Fatalf("the first delivery: %+v %+v settlement %q", resp.Result, resp.Error, resp.Settlement)
	}
	if runs := w.counter.runs(act); len(runs) != 1 {
		t.Fatalf("ran %d times", len(runs))
	}
	w.idle()
}

// actRunning sends req in the background and returns once its action runs
// on its replica: the channel of its answer, and its route.
func (w *world) actRunning(req dispatch.ActionRequest) (<-chan dispatch.ActionResponse, registry.RouteAssignment) {
	w.t.Helper()
	done := make(chan dispatch.ActionResponse, 1)
	go func() {
		_, resp := w.act(req)
		done <- resp
	}()
	var a registry.RouteAssignment
	eventually(w.t, "action "+req.ActionID+" to be routed and running", func() bool {
		var err error
		a, err = w.reg.Assignment(w.ctx, req.ActionID)
		return err == nil && w.busy(w.hosts[a.ReplicaID])
	})
	return done, a
}
