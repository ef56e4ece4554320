package dispatch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

func TestRefusalCodesAreTheHostCodes(t *testing.T) {
	if registry.RefusalNotReady != hostsdk.CodeNotReady || registry.RefusalCapacity != hostsdk.CodeCapacity {
		t.Fatalf("registry refusal codes %q/%q differ from the host's %q/%q",
			registry.RefusalNotReady, registry.RefusalCapacity, hostsdk.CodeNotReady, hostsdk.CodeCapacity)
	}
}

func output(t *testing.T, res *aip.ActionResult) map[string]any {
	t.Helper()
	if res == nil {
		t.Fatal("no result")
	}
	var m map[string]any
	must(t, json.Unmarshal(res.Output, &m))
	return m
}

func TestSyncActionCompletesAndSettles(t *testing.T) {
	w := newWorld(t, worldOptions{})
	a := w.startHost(8, 8)
	b := w.startHost(8, 8)
	seen := map[string]int{}
	for i := range 12 {
		status, resp := w.act(dispatch.ActionRequest{CapabilityID: capSay, Input: say("hello", "")})
		if status != http.StatusOK || resp.Error != nil {
			t.Fatalf("action %d: %d %+v", i, status, resp.Error)
		}
		if aip.ValidateID(aip.PrefixAction, resp.ActionID) != nil || resp.Result.ActionID != resp.ActionID {
			t.Fatalf("action ID %q, result for %q", resp.ActionID, resp.Result.ActionID)
		}
		out := output(t, resp.Result)
		if out["text"] != "hello" || out["side_effects"] != 1.0 || out["replica"] != resp.Route.ReplicaID {
			t.Fatalf("output %v, route %+v", out, resp.Route)
		}
		if resp.Settlement != registry.SettlementCompleted || resp.Result.Receipt == nil {
			t.Fatalf("settlement %q, receipt %v", resp.Settlement, resp.Result.Receipt)
		}
		cur, err := w.reg.Assignment(w.ctx, resp.ActionID)
		must(t, err)
		if cur.FenceToken != resp.Route.FenceToken || cur.InstanceID != w.instanceID {
			t.Fatalf("route facts %+v differ from the registry's %+v", resp.Route, cur)
		}
		seen[resp.Route.ReplicaID]++
	}
	if seen[a.cfg.ReplicaID] == 0 || seen[b.cfg.ReplicaID] == 0 {
		t.Fatalf("12 actions did not use both replicas: %v", seen)
	}
	w.idle()
}

func TestSameActionIDReturnsTheSameResult(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	w.startHost(8, 8)
	req := dispatch.ActionRequest{ActionID: aip.NewActionID(), CapabilityID: capSay, Input: say("once", "")}
	_, first := w.act(req)
	for range 3 {
		status, again := w.act(req)
		if again.Result == nil {
			t.Fatalf("retry answered %d %+v", status, again.Error)
		}
		if status != http.StatusOK || again.Route.ReplicaID != first.Route.ReplicaID || again.Route.FenceToken != first.Route.FenceToken {
			t.Fatalf("retry answered %d on %+v, first on %+v", status, again.Route, first.Route)
		}
		if !bytes.Equal(again.Result.Output, first.Result.Output) || again.Result.Status != first.Result.Status {
			t.Fatalf("retry result %s differs from %s", again.Result.Output, first.Result.Output)
		}
	}
	if runs := w.counter.runs(req.ActionID); len(runs) != 1 {
		t.Fatalf("the side effect ran %d times: %v", len(runs), runs)
	}
	// Concurrent duplicates converge too.
	req.ActionID = aip.NewActionID()
	var wg sync.WaitGroup
	results := make([]dispatch.ActionResponse, 8)
	for i := range results {
		wg.Go(func() { _, results[i] = w.act(req) })
	}
	wg.Wait()
	for _, r := range results {
		if r.Route.FenceToken != results[0].Route.FenceToken {
			t.Fatalf("duplicates used two routes: %+v and %+v", r.Route, results[0].Route)
		}
		if r.Result != nil && output(t, r.Result)["side_effects"] != 1.0 {
			t.Fatalf("duplicate answered %s", r.Result.Output)
		}
	}
	if runs := w.counter.runs(req.ActionID); len(runs) != 1 {
		t.Fatalf("concurrent duplicates ran the side effect %d times", len(runs))
	}
	w.idle()
}

func TestStreamingRelaysVerifiedChunks(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	body, _ := json.Marshal(dispatch.ActionRequest{CapabilityID: capStream, Mode: aip.ModeStreaming, Input: say("flow", `,"chunks":3`)})
	req, _ := http.NewRequestWithContext(w.ctx, http.MethodPost, w.srv.URL+dispatch.PathActions, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+w.token(tenant))
	resp, err := w.api.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != http.StatusOK || ct != dispatch.ContentTypeNDJSON {
		t.Fatalf("status %d content type %q", resp.StatusCode, ct)
	}
	var lines []dispatch.StreamLine
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l dispatch.StreamLine
		must(t, json.Unmarshal(sc.Bytes(), &l))
		lines = append(lines, l)
	}
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 3 chunks and the result", len(lines))
	}
	for i, l := range lines[:3] {
		if l.Chunk == nil || l.Chunk.Sequence != uint64(i) || l.Chunk.Kind != aip.ChunkProgress {
			t.Fatalf("line %d = %+v", i, l)
		}
	}
	last := lines[3]
	if last.ActionResponse == nil || last.Result == nil || last.Result.Status != aip.ResultCompleted || last.Settlement != registry.SettlementCompleted {
		t.Fatalf("last line = %+v", last.ActionResponse)
	}
	w.idle()
}

// TestRefusalReroutes sends actions to a replica that refuses them with its
// signed capacity and not-ready answers; each moves to the other replica and
// runs exactly once, with the refusing assignment kept as history.
func TestRefusalReroutes(t *testing.T) {
	w := newWorld(t, worldOptions{})
	busy := w.startHost(1, 8)
	spare := w.startHost(8, 8)
	ids := []string{busy.cfg.ReplicaID, spare.cfg.ReplicaID}
	// Occupy the busy replica's only slot directly, bypassing the registry
	// (loads stay equal there).
	blockerID := aip.NewActionID()
	var wg sync.WaitGroup
	wg.Go(func() {
		w.fake.Act(w.ctx, w.target(busy), &aip.Action{ID: blockerID, CapabilityID: capSay, Input: say("block", `,"delay_ms":60000`)})
	})
	eventually(t, "the blocker to occupy the slot", func() bool { return w.busy(busy) })

	act := w.actionFavoring(busy.cfg.ReplicaID, ids...)
	status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("moved", "")})
	if status != http.StatusOK || resp.Route.ReplicaID != spare.cfg.ReplicaID {
		t.Fatalf("answer %d on %+v (%+v)", status, resp.Route, resp.Error)
	}
	if len(resp.Route.Reroutes) != 1 || resp.Route.Reroutes[0].FromReplicaID != busy.cfg.ReplicaID || resp.Route.Reroutes[0].RefusalCode != hostsdk.CodeCapacity {
		t.Fatalf("reroutes = %+v", resp.Route.Reroutes)
	}
	if runs := w.counter.runs(act); !slices.Equal(runs, []string{spare.cfg.ReplicaID}) {
		t.Fatalf("ran on %v", runs)
	}
	hist, err := w.reg.RouteHistory(w.ctx, act)
	must(t, err)
	if len(hist) != 1 || hist[0].ReplicaID != busy.cfg.ReplicaID || hist[0].FenceToken != resp.Route.Reroutes[0].FromFenceToken {
		t.Fatalf("history = %+v", hist)
	}
	// The same action ID again stays on the new route.
	if _, again := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("moved", "")}); again.Route.FenceToken != resp.Route.FenceToken || len(w.counter.runs(act)) != 1 {
		t.Fatalf("retry after the reroute: %+v", again.Route)
	}
	// GET shows the route, the history and the replica's journal.
	code, body, _ := w.call(http.MethodGet, dispatch.PathActions+"/"+act, tenant, nil)
	var st dispatch.ActionStatusResponse
	must(t, json.Unmarshal(body, &st))
	if code != http.StatusOK || st.Route.ReplicaID != spare.cfg.ReplicaID || len(st.History) != 1 || !st.Replica.Reachable ||
		st.Replica.State != aip.StateCompleted || st.Replica.Result == nil || st.Reservation.Reserved || st.Reservation.HandedOutAt != nil {
		t.Fatalf("status %d: %s", code, body)
	}

	// Not ready: the busy replica drains (its listener stays open while the
	// blocker runs), the registry has not heard yet.
	stopped := make(chan error, 1)
	go func() { stopped <- busy.host.Stop(context.Background()) }()
	eventually(t, "the busy replica to drain", func() bool { return !busy.host.Ready() })
	act = w.actionFavoring(busy.cfg.ReplicaID, ids...)
	status, resp = w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("drained", "")})
	if status != http.StatusOK || resp.Route.ReplicaID != spare.cfg.ReplicaID || len(resp.Route.Reroutes) != 1 ||
		resp.Route.Reroutes[0].RefusalCode != hostsdk.CodeNotReady {
		t.Fatalf("answer %d on %+v (%+v)", status, resp.Route, resp.Error)
	}
	// Cancel the blocker through its host so the drain completes.
	w.fake.Cancel(w.ctx, w.target(busy), blockerID, capSay, "test over")
	wg.Wait()
	if err := <-stopped; err != nil {
		t.Fatalf("drain: %v", err)
	}
	w.idle()
}

// TestNegativeMaxReroutesKeepsRefusalsPinned: with rerouting disabled a
// signed refusal is the answer and the action stays on its replica; with
// the default bound the same refusal moves it to the spare.
func TestNegativeMaxReroutesKeepsRefusalsPinned(t *testing.T) {
	replicaKey, _ := aip.GenerateSigningKey()
	refusal := aip.Body{Error: &aip.ErrorBody{Error: *aip.NewProtocolError(hostsdk.CodeNotReady, aip.CategoryTemporary, true, 100, "draining")}}
	for _, c := range []struct {
		maxReroutes int
		rerouted    bool
	}{{-1, false}, {0, true}} {
		t.Run(fmt.Sprint(c.maxReroutes), func(t *testing.T) {
			w := newWorld(t, worldOptions{cfg: func(cfg *dispatch.Config) { cfg.MaxReroutes = c.maxReroutes }})
			spare := w.startHost(8, 8)
			fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, fakeHandler(signedReply(replicaKey, http.StatusServiceUnavailable, refusal)))
			act := w.actionFavoring(fake, fake, spare.cfg.ReplicaID)
			status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("x", "")})
			if c.rerouted {
				if status != http.StatusOK || resp.Route.ReplicaID != spare.cfg.ReplicaID || len(resp.Route.Reroutes) != 1 {
					t.Fatalf("answer %d on %+v (%+v), want a reroute to %s", status, resp.Route, resp.Error, spare.cfg.ReplicaID)
				}
				w.idle()
				return
			}
			if resp.Error == nil || resp.Error.Code != hostsdk.CodeNotReady || resp.Route.ReplicaID != fake || len(resp.Route.Reroutes) != 0 {
				t.Fatalf("answer %d on %+v (%+v), want the refusal on %s", status, resp.Route, resp.Error, fake)
			}
			if runs := w.counter.runs(act); len(runs) != 0 {
				t.Fatalf("the action ran on %v", runs)
			}
			hist, err := w.reg.RouteHistory(w.ctx, act)
			must(t, err)
			if len(hist) != 0 {
				t.Fatalf("history %+v", hist)
			}
			w.idle()
		})
	}
}

// busy reports whether a host runs an action now (its in-flight gauge).
func (w *world) busy(rh *replicaHost) bool {
	resp, err := http.Get("http://" + rh.host.Addr().String() + hostsdk.PathMetrics)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "aip_connector_host_in_flight ") {
			return strings.TrimPrefix(sc.Text(), "aip_connector_host_in_flight ") != "0"
		}
	}
	return false
}

// TestRefusalOfARetriedRouteStaysPinned: a route handed out twice (here a
// duplicate resolve) may have another envelope in flight, so the refusal is
// returned to the caller and the action is never moved.
func TestRefusalOfARetriedRouteStaysPinned(t *testing.T) {
	w := newWorld(t, worldOptions{})
	busy := w.startHost(1, 8)
	spare := w.startHost(8, 8)
	blockerID := aip.NewActionID()
	var wg sync.WaitGroup
	wg.Go(func() {
		w.fake.Act(w.ctx, w.target(busy), &aip.Action{ID: blockerID, CapabilityID: capSay, Input: say("block", `,"delay_ms":60000`)})
	})
	defer wg.Wait()
	defer w.fake.Cancel(context.Background(), w.target(busy), blockerID, capSay, "test over")
	eventually(t, "the blocker to occupy the slot", func() bool { return w.busy(busy) })
	act := w.actionFavoring(busy.cfg.ReplicaID, busy.cfg.ReplicaID, spare.cfg.ReplicaID)
	first, err := w.reg.Resolve(w.ctx, registry.RouteRequest{ActionID: act, CapabilityID: capSay, TenantID: tenant})
	must(t, err)
	status, resp := w.act(dispatch.ActionRequest{ActionID: act, CapabilityID: capSay, Input: say("pinned", "")})
	if status != http.StatusTooManyRequests || resp.Error == nil || resp.Error.Code != hostsdk.CodeCapacity || !resp.Error.IsRetryable() {
		t.Fatalf("answer %d %+v", status, resp.Error)
	}
	if resp.Route.FenceToken != first.FenceToken || len(resp.Route.Reroutes) != 0 || resp.Settlement != registry.SettlementCancelled {
		t.Fatalf("route %+v settlement %q", resp.Route, resp.Settlement)
	}
	if runs := w.counter.runs(act); len(runs) != 0 {
		t.Fatalf("ran on %v", runs)
	}
	if hist, err := w.reg.RouteHistory(w.ctx, act); err != nil || len(hist) != 0 {
		t.Fatalf("history %v %v", hist, err)
	}
}
