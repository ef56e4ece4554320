package dispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// TestReadyDetailOnlyForLocalPeers: /ready is 503 while the registry
// probe fails; its error text (database hosts, roles) goes to peers on this
// machine, never to a remote peer, which reads that the registry is
// unavailable.
func TestReadyDetailOnlyForLocalPeers(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	gateway, _ := aip.GenerateSigningKey()
	issuer, _ := aip.GenerateSigningKey()
	tokens, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "dev", DIDs: []string{issuer.DID()}}}})
	must(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	defer ln.Close()
	var probeErr atomic.Pointer[error]
	d, err := dispatch.New(dispatch.Config{SigningKey: gateway, PrincipalID: "service:aipfleet-dispatch", Listener: ln},
		dispatch.Deps{Resolver: reg, Catalog: reg, Rerouter: reg, Tokens: tokens, Ready: func(ctx context.Context) error {
			if p := probeErr.Load(); p != nil {
				return *p
			}
			return nil
		}})
	must(t, err)
	ready := func(remote string) (int, map[string]string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/ready", nil)
		req.RemoteAddr = remote
		d.Handler().ServeHTTP(rec, req)
		var doc struct {
			Ready  bool              `json:"ready"`
			Checks map[string]string `json:"checks"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Fatalf("%v: %s", err, rec.Body)
		}
		return rec.Code, doc.Checks
	}
	if code, checks := ready("203.0.113.7:5000"); code != http.StatusOK || checks["registry"] != "ok" {
		t.Fatalf("healthy: HTTP %d %v", code, checks)
	}
	failure := errors.New("failed to connect to `user=aip_data database=aip`: 10.20.30.40:5432: connection refused")
	probeErr.Store(&failure)
	for remote, wantDetail := range map[string]bool{"203.0.113.7:5000": false, "10.0.0.9:5000": false, "127.0.0.1:5000": true, "[::1]:5000": true} {
		code, checks := ready(remote)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("from %s: HTTP %d, want 503", remote, code)
		}
		if shown := strings.Contains(checks["registry"], "10.20.30.40"); shown != wantDetail {
			t.Errorf("from %s: registry check %q (detail shown %v, want %v)", remote, checks["registry"], shown, wantDetail)
		}
		if !wantDetail && !strings.HasPrefix(checks["registry"], "unavailable") {
			t.Errorf("from %s: registry check %q, want it to say unavailable", remote, checks["registry"])
		}
	}
}
