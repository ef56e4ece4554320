package dispatch_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestCatalogQueryErrorsNameTheParameter: a catalog query the registry
// refuses (a q too long or with a NUL, a cursor it did not issue) is
// answered 400 naming the query parameter the caller sent and why. It
// was the registry's error as is: "registry: invalid: catalog_query:
// text: is longer than 1024 bytes", naming a field "text" for the
// parameter q.
func TestCatalogQueryErrorsNameTheParameter(t *testing.T) {
	w := newWorld(t, worldOptions{})
	good := "Bearer " + w.token(tenant)
	for query, want := range map[string]string{
		"q=" + strings.Repeat("a", 1025):      "q is longer than 1024 bytes",
		"q=a%00b":                             "q must be UTF-8 without NUL characters",
		"cursor=garbage":                      `cursor "garbage" is not a cursor this registry issued; restart from the first page`,
		"profile=" + url.QueryEscape("a\x00"): "profile must be UTF-8 without NUL characters",
	} {
		s, body, _ := w.getWith(dispatch.PathCapabilities+"?"+query, good)
		var e struct {
			Error *aip.ProtocolError `json:"error"`
		}
		if s != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Code != dispatch.CodeRequestInvalid {
			t.Errorf("%.40s: %d %s, want 400 %s", query, s, body, dispatch.CodeRequestInvalid)
			continue
		}
		if e.Error.Message != want {
			t.Errorf("%.40s: message %q, want %q", query, e.Error.Message, want)
		}
	}
}
