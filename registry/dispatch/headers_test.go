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
