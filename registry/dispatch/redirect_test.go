package dispatch_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// TestReplicaRedirectsAreNotFollowed: a replica (compromised, or a proxy in
// front of it) that answers a native hop with a redirect does not make the
// dispatcher send anything to the address it names: the hop's answer is
// the redirect itself, which proves nothing, so the action's outcome is
// unknown and stays pinned. Following it would let any replica make the
// dispatcher post signed envelopes (307/308) or GET (301/302/303) any
// address the dispatcher can reach, and reflect what answers into the
// tenant's error message.
func TestReplicaRedirectsAreNotFollowed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		code   int
		client *http.Client // Deps.Client; nil for the dispatcher's own
	}{
		{"301", http.StatusMovedPermanently, nil},
		{"302", http.StatusFound, nil},
		{"303", http.StatusSeeOther, nil},
		{"307", http.StatusTemporaryRedirect, nil},
		{"308", http.StatusPermanentRedirect, nil},
		{"307 with a caller's client", http.StatusTemporaryRedirect, &http.Client{}},
	} {
		code := tc.code
		t.Run(tc.name, func(t *testing.T) {
			var hits atomic.Int64
			internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Write([]byte(`{"error":"internal-only secret 0xC0FFEE"}`))
			}))
			t.Cleanup(internal.Close)
			w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.HopSlack = time.Millisecond }, client: tc.client})
			replicaKey, _ := aip.GenerateSigningKey()
			fake := w.fakeReplica(aip.NewID(aip.PrefixReplica), replicaKey, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
				http.Redirect(rw, r, internal.URL+"/latest/meta-data", code)
			}))
			timeout := uint64(2000)
			status, body, _ := w.call(http.MethodPost, dispatch.PathActions, tenant,
				dispatch.ActionRequest{CapabilityID: capSay, Input: say("x", ""), TimeoutMS: &timeout})
			if n := hits.Load(); n != 0 {
				t.Fatalf("the dispatcher followed the replica's %d redirect: the internal address got %d requests", code, n)
			}
			if strings.Contains(string(body), "0xC0FFEE") {
				t.Fatalf("the answer reflects the redirect target's body: %s", body)
			}
			if status != http.StatusBadGateway || !strings.Contains(string(body), dispatch.CodeOutcomeUnknown) {
				t.Fatalf("answer %d %s, want 502 %s", status, body, dispatch.CodeOutcomeUnknown)
			}
			if !strings.Contains(string(body), fake) || !strings.Contains(string(body), string(registry.SettlementOutcomeUnknown)) {
				t.Fatalf("answer %s does not settle outcome_unknown on replica %s", body, fake)
			}
		})
	}
}
