package dispatch_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestWrongMethodsNameTheAllowedOnes: a 405 carries the Allow header RFC
// 9110 requires (it had none), and its message names the methods to use.
func TestWrongMethodsNameTheAllowedOnes(t *testing.T) {
	w := newWorld(t, worldOptions{})
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, dispatch.PathActions, "POST"},
		{http.MethodOptions, dispatch.PathActions, "POST"},
		{http.MethodGet, dispatch.PathActions, "POST"},
		{http.MethodHead, dispatch.PathCapabilities, "GET"},
		{http.MethodDelete, dispatch.PathActions + "/" + aip.NewActionID(), "GET"},
		{http.MethodGet, dispatch.PathActions + "/" + aip.NewActionID() + "/cancel", "POST"},
		{http.MethodPost, dispatch.PathHealth, "GET"},
	} {
		s, body, h := w.call(c.method, c.path, tenant, nil)
		if s != http.StatusMethodNotAllowed || h.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d, Allow %q, want 405 with Allow %q", c.method, c.path, s, h.Get("Allow"), c.allow)
		}
		if c.method != http.MethodHead && errorCode(t, body) != dispatch.CodeRequestInvalid {
			t.Errorf("%s %s: %s", c.method, c.path, body)
		}
	}
}

// TestAnswersAreNotCacheable: every API answer — a tenant's action,
// stream, status, catalog, an error, health — says Cache-Control:
// no-store, so no shared cache between a caller and the dispatcher keeps a
// tenant's data or serves it to another request. They said nothing.
func TestAnswersAreNotCacheable(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	id := aip.NewActionID()
	for _, c := range []struct {
		method, path string
		body         any
		status       int
	}{
		{http.MethodPost, dispatch.PathActions, dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("x", "")}, http.StatusOK},
		{http.MethodPost, dispatch.PathActions, dispatch.ActionRequest{CapabilityID: capStream, Input: say("x", `,"chunks":2`), Mode: aip.ModeStreaming}, http.StatusOK},
		{http.MethodGet, dispatch.PathActions + "/" + id, nil, http.StatusOK},
		{http.MethodGet, dispatch.PathCapabilities, nil, http.StatusOK},
		{http.MethodGet, dispatch.PathActions + "/" + aip.NewActionID(), nil, http.StatusNotFound},
		{http.MethodGet, dispatch.PathHealth, nil, http.StatusOK},
	} {
		s, body, h := w.call(c.method, c.path, tenant, c.body)
		if s != c.status || h.Get("Cache-Control") != "no-store" {
			t.Errorf("%s %s: %d, Cache-Control %q: %.200s", c.method, c.path, s, h.Get("Cache-Control"), body)
		}
	}
	s, _, h := w.call(http.MethodGet, dispatch.PathCapabilities, "", nil)
	if s != http.StatusUnauthorized || h.Get("Cache-Control") != "no-store" {
		t.Errorf("401: Cache-Control %q", h.Get("Cache-Control"))
	}
}

// TestActionRoutesRefuseQueryParameters: the action routes take no query
// parameter, and used to ignore any: POST /aip/v1/actions?mode=streaming
// ran the action in sync mode, and ?reason= on a cancel was dropped,
// without a word. Like the catalog and the event log, they now refuse an
// unknown parameter with a 400 that names it, before anything is routed,
// sent or cancelled.
func TestActionRoutesRefuseQueryParameters(t *testing.T) {
	w := newWorld(t, worldOptions{})
	w.startHost(8, 8)
	unsent := aip.NewActionID()
	s, body, _ := w.call(http.MethodPost, dispatch.PathActions+"?mode=streaming", tenant,
		dispatch.ActionRequest{ActionID: unsent, CapabilityID: capStream, Input: say("x", `,"chunks":2`)})
	if s != http.StatusBadRequest || errorCode(t, body) != dispatch.CodeRequestInvalid ||
		!strings.Contains(string(body), `unknown query parameter \"mode\"`) || !strings.Contains(string(body), "takes no query parameters") {
		t.Errorf("POST %s?mode=streaming: %d %s, want 400 %s naming mode", dispatch.PathActions, s, body, dispatch.CodeRequestInvalid)
	}
	if runs := w.counter.runs(unsent); len(runs) != 0 {
		t.Errorf("the refused action ran on %v", runs)
	}
	if s, body, _ := w.call(http.MethodGet, dispatch.PathActions+"/"+unsent, tenant, nil); s != http.StatusNotFound {
		t.Errorf("the refused action was routed: GET answers %d %s", s, body)
	}

	id := aip.NewActionID()
	if s, resp := w.act(dispatch.ActionRequest{ActionID: id, CapabilityID: capSay, Input: say("x", "")}); s != http.StatusOK || resp.Result == nil {
		t.Fatalf("send: %d %+v", s, resp)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, dispatch.PathActions + "/" + id + "?verbose=1"},
		{http.MethodPost, dispatch.PathActions + "/" + id + "/cancel?reason=wrong+recipient"},
		{http.MethodPost, dispatch.PathActions + "?"},
	} {
		s, body, _ := w.call(c.method, c.path, tenant, nil)
		if c.path == dispatch.PathActions+"?" {
			// An empty query is no parameter: the request goes on (and
			// its empty body is refused as such).
			if strings.Contains(string(body), "query parameter") {
				t.Errorf("%s %s: %d %s, an empty query names no parameter", c.method, c.path, s, body)
			}
			continue
		}
		if s != http.StatusBadRequest || errorCode(t, body) != dispatch.CodeRequestInvalid || !strings.Contains(string(body), "unknown query parameter") {
			t.Errorf("%s %s: %d %s, want 400 %s", c.method, c.path, s, body, dispatch.CodeRequestInvalid)
		}
	}
	if runs := w.counter.runs(id); len(runs) != 1 {
		t.Errorf("the action ran on %v, want once", runs)
	}
}
