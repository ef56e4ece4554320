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
// unavailable. A loopback request that a proxy on this machine passed on
// (it says so in a forwarding header) is no local peer's, and
// HideLocalReadyDetail (behind a proxy that adds no such header every
// caller is loopback) shows the detail to no peer.
func TestReadyDetailOnlyForLocalPeers(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	gateway, _ := aip.GenerateSigningKey()
	issuer, _ := aip.GenerateSigningKey()
	tokens, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "dev", DIDs: []string{issuer.DID()}}}})
	must(t, err)
	var probeErr atomic.Pointer[error]
	newDispatcher := func(hide bool) *dispatch.Dispatcher {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		must(t, err)
		t.Cleanup(func() { ln.Close() })
		d, err := dispatch.New(dispatch.Config{SigningKey: gateway, PrincipalID: "service:aipfleet-dispatch", Listener: ln, HideLocalReadyDetail: hide},
			dispatch.Deps{Resolver: reg, Catalog: reg, Rerouter: reg, Tokens: tokens, Ready: func(ctx context.Context) error {
				if p := probeErr.Load(); p != nil {
					return *p
				}
				return nil
			}})
		must(t, err)
		return d
	}
	shown, hidden := newDispatcher(false), newDispatcher(true)
	ready := func(d *dispatch.Dispatcher, remote, header string) (int, map[string]string) {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/ready", nil)
		req.RemoteAddr = remote
		if header != "" {
			req.Header.Set(header, "203.0.113.7")
		}
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
	if code, checks := ready(shown, "203.0.113.7:5000", ""); code != http.StatusOK || checks["registry"] != "ok" {
		t.Fatalf("healthy: HTTP %d %v", code, checks)
	}
	failure := errors.New("failed to connect to `user=aip_data database=aip`: 10.20.30.40:5432: connection refused")
	probeErr.Store(&failure)
	for _, c := range []struct {
		remote, header string
		hide, want     bool
	}{
		{"203.0.113.7:5000", "", false, false},
		{"10.0.0.9:5000", "", false, false},
		{"127.0.0.1:5000", "", false, true},
		{"[::1]:5000", "", false, true},
		{"127.0.0.1:5000", "X-Forwarded-For", false, false},
		{"127.0.0.1:5000", "Forwarded", false, false},
		{"127.0.0.1:5000", "X-Forwarded-Client-Cert", false, false},
		{"127.0.0.1:5000", "", true, false},
		{"[::1]:5000", "", true, false},
	} {
		d := shown
		if c.hide {
			d = hidden
		}
		code, checks := ready(d, c.remote, c.header)
		if code != http.StatusServiceUnavailable {
			t.Fatalf("%+v: HTTP %d, want 503", c, code)
		}
		if got := strings.Contains(checks["registry"], "10.20.30.40"); got != c.want {
			t.Errorf("%+v: registry check %q (detail shown %v, want %v)", c, checks["registry"], got, c.want)
		}
		if !c.want && !strings.HasPrefix(checks["registry"], "unavailable") {
			t.Errorf("%+v: registry check %q, want it to say unavailable", c, checks["registry"])
		}
	}
}
