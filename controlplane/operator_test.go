package controlplane_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestFleetViewsNeedAnOperator: the fleet views answer only requests with
// a valid operator token (401 with the reason otherwise), and no one when
// the service trusts no operator — a fleet map is not for anyone who
// reaches the port.
func TestFleetViewsNeedAnOperator(t *testing.T) {
	issuer, _ := aip.GenerateSigningKey()
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Operator: true,
		Issuers: []tenanttoken.Issuer{{Name: "ops", DIDs: []string{issuer.DID()}}}, Now: registrytest.NewClock(registrytest.Epoch).Now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.OperatorAuth = func(r *http.Request) error { _, err := verifier.VerifyRequest(r); return err }
	})
	now := registrytest.Epoch
	operator, err := tenanttoken.MintOperator(issuer, tenanttoken.Claims{Issuer: "ops", Audience: tenanttoken.OperatorAudience,
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := tenanttoken.Mint(issuer, tenanttoken.Claims{Issuer: "ops", Audience: tenanttoken.OperatorAudience, TenantID: "acme",
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path, token string) (int, http.Header, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header, string(b)
	}
	for _, path := range []string{controlplane.PathFleetStatus, controlplane.PathFleetReplicas} {
		for name, c := range map[string]struct{ token, reason string }{
			// The message is the reason: the code already says
			// "unauthorized" (the message said it again).
			"no token":     {"", "missing Authorization header"},
			"tenant token": {tenant, "not an operator token"},
			"garbage":      {"x.y.z", "malformed"},
		} {
			status, hdr, body := get(path, c.token)
			var eb aip.ErrorBody
			if status != http.StatusUnauthorized || json.Unmarshal([]byte(body), &eb) != nil || eb.Error.Code != "unauthorized" ||
				eb.Error.Category != aip.CategoryAuth || !strings.HasPrefix(eb.Error.Message, c.reason) {
				t.Errorf("GET %s with %s: HTTP %d %s; want 401 unauthorized (auth) saying %q", path, name, status, body, c.reason)
			}
			if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("GET %s with %s: WWW-Authenticate %q", path, name, hdr.Get("WWW-Authenticate"))
			}
			if strings.Contains(body, "crepl_") || strings.Contains(body, "ready_capacity") {
				t.Errorf("GET %s with %s leaked the fleet: %s", path, name, body)
			}
		}
		if status, _, body := get(path, operator); status != http.StatusOK {
			t.Errorf("GET %s with an operator token: HTTP %d %s", path, status, body)
		}
	}
	if got := metricValue(t, e, controlplane.MetricFleetViewRefusals, ""); got != 6 {
		t.Errorf("%s = %v, want 6", controlplane.MetricFleetViewRefusals, got)
	}

	// A service that trusts no operator serves the views to no one, and
	// says how to configure one.
	closed := newEnv(t, newMemBackend)
	status, body := closed.get(controlplane.PathFleetStatus)
	if status != http.StatusUnauthorized || !strings.Contains(body, "--operator-issuer") || !strings.Contains(body, "--open-fleet-views") {
		t.Errorf("fleet status without operators: HTTP %d %s", status, body)
	}
}

// TestFleetViewsRefuseTwoAuthorizationHeaders: a fleet view request with
// two Authorization headers is refused 401 with the reason even when one
// holds a valid operator token, first or second (the verifier read the
// first only: a proxy in front that checked the other would let a second,
// valid token through without having seen it).
func TestFleetViewsRefuseTwoAuthorizationHeaders(t *testing.T) {
	issuer, _ := aip.GenerateSigningKey()
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Operator: true,
		Issuers: []tenanttoken.Issuer{{Name: "ops", DIDs: []string{issuer.DID()}}}, Now: registrytest.NewClock(registrytest.Epoch).Now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.OperatorAuth = func(r *http.Request) error { _, err := verifier.VerifyRequest(r); return err }
	})
	now := registrytest.Epoch
	operator, err := tenanttoken.MintOperator(issuer, tenanttoken.Claims{Issuer: "ops", Audience: tenanttoken.OperatorAudience,
		IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	good := "Bearer " + operator
	refusals := 0
	for _, path := range []string{controlplane.PathFleetStatus, controlplane.PathFleetReplicas} {
		for name, auth := range map[string][]string{
			"garbage then valid": {"Bearer x.y.z", good},
			"valid then garbage": {good, "Bearer x.y.z"},
			"valid twice":        {good, good},
		} {
			req, _ := http.NewRequest(http.MethodGet, e.srv.URL+path, nil)
			for _, a := range auth {
				req.Header.Add("Authorization", a)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			refusals++
			var eb aip.ErrorBody
			const reason = "2 Authorization headers; send exactly one"
			if resp.StatusCode != http.StatusUnauthorized || json.Unmarshal(body, &eb) != nil || eb.Error.Code != "unauthorized" ||
				eb.Error.Category != aip.CategoryAuth || eb.Error.Message != reason {
				t.Errorf("GET %s with %s: HTTP %d %s; want 401 unauthorized (auth) saying %q", path, name, resp.StatusCode, body, reason)
			}
			if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("GET %s with %s: WWW-Authenticate %q", path, name, resp.Header.Get("WWW-Authenticate"))
			}
			if strings.Contains(string(body), "crepl_") || strings.Contains(string(body), "ready_capacity") {
				t.Errorf("GET %s with %s leaked the fleet: %s", path, name, body)
			}
		}
	}
	if got := metricValue(t, e, controlplane.MetricFleetViewRefusals, ""); got != float64(refusals) {
		t.Errorf("%s = %v, want %d", controlplane.MetricFleetViewRefusals, got, refusals)
	}
}

// TestReadyDetailOnlyForOperatorsAndLocalPeers: a failing /ready check's
// message (storage errors name hosts, roles, databases) goes only to an
// operator or a peer on this machine; every other peer sees which checks
// fail and a fixed text. A loopback request a proxy on this machine passed
// on (a forwarding header says so) is no local peer's, and
// HideLocalReadyDetail (behind a proxy that adds no such header) leaves
// the detail to operators.
func TestReadyDetailOnlyForOperatorsAndLocalPeers(t *testing.T) {
	const detail = "installed schema 6, this build needs 7"
	clock := registrytest.NewClock(registrytest.Epoch)
	b := newMemBackend(t, clock)
	notOperator := func(*http.Request) error { return io.EOF }
	for name, c := range map[string]struct {
		auth       func(*http.Request) error
		remote     string
		header     string // a forwarding header the request carries
		hide       bool   // HideLocalReadyDetail
		wantDetail bool
	}{
		"remote peer":                     {nil, "203.0.113.9:4000", "", false, false},
		"remote peer, not operator":       {notOperator, "203.0.113.9:4000", "", false, false},
		"remote operator":                 {controlplane.AllowEveryone, "203.0.113.9:4000", "", false, true},
		"loopback peer":                   {nil, "127.0.0.1:4000", "", false, true},
		"IPv6 loopback peer":              {nil, "[::1]:4000", "", false, true},
		"IPv4-mapped loopback peer":       {nil, "[::ffff:127.0.0.1]:4000", "", false, true},
		"private-network remote":          {nil, "10.1.2.3:4000", "", false, false},
		"remote peer, 'localhost' ?":      {nil, "localhost:4000", "", false, false},
		"loopback via proxy, XFF":         {notOperator, "127.0.0.1:4000", "X-Forwarded-For", false, false},
		"loopback via proxy, Forwarded":   {nil, "127.0.0.1:4000", "Forwarded", false, false},
		"loopback via Envoy":              {nil, "127.0.0.6:4000", "X-Envoy-External-Address", false, false},
		"loopback, detail hidden":         {nil, "127.0.0.1:4000", "", true, false},
		"loopback operator, hidden":       {controlplane.AllowEveryone, "127.0.0.1:4000", "", true, true},
		"operator via proxy, XFF":         {controlplane.AllowEveryone, "127.0.0.1:4000", "X-Forwarded-For", false, true},
		"loopback not operator, hidden":   {notOperator, "[::1]:4000", "", true, false},
		"remote with a forwarding header": {nil, "203.0.113.9:4000", "X-Forwarded-For", false, false},
	} {
		t.Run(name, func(t *testing.T) {
			svc, err := controlplane.New(controlKey, failingProbe{b.Store}, controlplane.Config{Now: clock.Now, DisableMaintenance: true, OperatorAuth: c.auth, HideLocalReadyDetail: c.hide})
			if err != nil {
				t.Fatal(err)
			}
			runService(t, svc)
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, controlplane.PathReady, nil)
			req.RemoteAddr = c.remote
			if c.header != "" {
				req.Header.Set(c.header, "203.0.113.9")
			}
			svc.Handler().ServeHTTP(rec, req)
			var doc controlplane.ReadyDocument
			if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
			}
			if !contains(doc.Failing, "store.schema") {
				t.Fatalf("failing %v: the failing check is named to everyone", doc.Failing)
			}
			if got := strings.Contains(rec.Body.String(), detail); got != c.wantDetail {
				t.Fatalf("detail shown = %v, want %v: %s", got, c.wantDetail, rec.Body)
			}
		})
	}
}

// TestReadyFailureIsLogged: the detail a remote peer does not see is in the
// log — once per change, not at every probe.
func TestReadyFailureIsLogged(t *testing.T) {
	clock := registrytest.NewClock(registrytest.Epoch)
	b := newMemBackend(t, clock)
	var logs hostsdktest.LogBuffer
	svc, err := controlplane.New(controlKey, failingProbe{b.Store}, controlplane.Config{Now: clock.Now, DisableMaintenance: true,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	runService(t, svc)
	for range 3 {
		httptestGet(svc, controlplane.PathReady)
	}
	if n := strings.Count(logs.String(), "installed schema 6, this build needs 7"); n != 1 {
		t.Fatalf("the failing check was logged %d times, want once:\n%s", n, logs.String())
	}
}
