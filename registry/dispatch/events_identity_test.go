package dispatch_test

import (
	"net/http"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// TestConnectorEventIdentityNamesItsTenant: an event's data.identity
// (an AIP identity context) that names a tenant names the delivery's
// (reference §7.4: the central ingress holds data.identity.tenant.id to
// the route's tenant, so whoever reads an event log may trust it). A
// connector's event data is largely a provider's payload — a webhook's
// body that anyone who can post to the provider's webhook shapes — and an
// event stored in one tenant's log claiming another tenant's identity was
// stored as it came.
func TestConnectorEventIdentityNamesItsTenant(t *testing.T) {
	for _, c := range []struct {
		name, data string
		ok         bool
	}{
		{"its own tenant", `{"identity":{"tenant":{"id":"` + tenant + `"}},"n":1}`, true},
		{"no tenant", `{"identity":{"human_actor":{"id":"human:x","kind":"human"}}}`, true},
		{"not an identity context", `{"identity":"someone"}`, true},
		{"another tenant", `{"identity":{"tenant":{"id":"` + otherTenant + `"}}}`, false},
		{"an empty tenant", `{"identity":{"tenant":{"id":""}}}`, false},
		{"a tenant ID not a string", `{"identity":{"tenant":{"id":7}}}`, false},
		{"a case variant of id", `{"identity":{"tenant":{"ID":"` + otherTenant + `"}}}`, false},
		{"a case variant of tenant", `{"identity":{"Tenant":{"id":"` + otherTenant + `"}}}`, false},
		{"a case variant of identity", `{"Identity":{"tenant":{"id":"` + otherTenant + `"}}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newEventWorld(t, eventWorldOptions{})
			status, ans, _ := w.post(w.delivery(event("k", c.data)))
			if c.ok {
				if status != http.StatusOK {
					t.Fatalf("HTTP %d %+v, want it stored", status, ans.Body.Error)
				}
				return
			}
			checkRefusal(t, status, ans, http.StatusBadRequest, aip.CodeEventInvalid)
			if n := len(w.stored(tenant)); n != 0 {
				t.Errorf("the refused event was stored (%d events)", n)
			}
		})
	}
}
