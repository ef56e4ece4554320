package dispatch_test

import (
	"net/http"
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
