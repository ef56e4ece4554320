package dispatch_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// countingVerifier accepts "good-<tenant>" tokens that expire at exp.
type countingVerifier struct {
	mu    sync.Mutex
	calls int
	exp   time.Time
}

func (v *countingVerifier) Verify(tok string) (tenanttoken.Claims, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.calls++
	if len(tok) < 5 || tok[:5] != "good-" {
		return tenanttoken.Claims{}, errors.New("unauthorized: bad token")
	}
	return tenanttoken.Claims{TenantID: tok[5:], Expiry: v.exp}, nil
}

func TestVerifiedTokensAreCachedUntilExpiry(t *testing.T) {
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	now := start
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	v := &countingVerifier{exp: start.Add(time.Minute)}
	reg, _ := memregistry.New(memregistry.Config{})
	key, _ := aip.GenerateSigningKey()
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, Now: clock}, dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: v})
	must(t, err)
	defer d.Close()
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	get := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+dispatch.PathCapabilities, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := srv.Client().Do(req)
		must(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for range 3 {
		if s := get("good-a"); s != http.StatusOK {
			t.Fatalf("status %d", s)
		}
	}
	if v.calls != 1 {
		t.Fatalf("the verifier ran %d times for one token, want 1", v.calls)
	}
	get("good-b")
	for range 2 {
		if s := get("bad"); s != http.StatusUnauthorized {
			t.Fatalf("bad token: %d", s)
		}
	}
	if v.calls != 4 {
		t.Fatalf("verifier calls %d, want 4 (a, b, and each bad token: failures are not cached)", v.calls)
	}
	mu.Lock()
	now = start.Add(time.Minute) // the tokens' expiry
	mu.Unlock()
	v.mu.Lock()
	v.exp = now.Add(time.Minute)
	v.mu.Unlock()
	get("good-a")
	if v.calls != 5 {
		t.Fatalf("an expired cached token was not verified again (calls %d)", v.calls)
	}
}

// TestNewNamesTheBadField: a configuration New refuses is ErrConfig naming
// the field and the value that is wrong.
func TestNewNamesTheBadField(t *testing.T) {
	reg, _ := memregistry.New(memregistry.Config{})
	key, _ := aip.GenerateSigningKey()
	deps := dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: &countingVerifier{}}
	for _, c := range []struct {
		edit func(*dispatch.Config)
		want string
	}{
		{func(c *dispatch.Config) { c.HopSlack = -time.Second }, "HopSlack -1s"},
		{func(c *dispatch.Config) { c.MaxBodyBytes = -1 }, "MaxBodyBytes -1"},
		{func(c *dispatch.Config) { c.RegistryTimeout = -time.Second }, "RegistryTimeout -1s"},
		{func(c *dispatch.Config) { c.StatusTimeout = -2 * time.Second }, "StatusTimeout -2s"},
		{func(c *dispatch.Config) { c.ShutdownTimeout = -3 * time.Second }, "ShutdownTimeout -3s"},
		{func(c *dispatch.Config) { c.ReconcileAfter = 5 * time.Minute }, "ReconcileAfter 5m0s must be longer than an action can be in flight"},
		{func(c *dispatch.Config) { c.ReconcileBatch = -1 }, "ReconcileBatch -1"},
		{func(c *dispatch.Config) { c.Topology.Zone = "no spaces" }, "topology.zone"},
		{func(c *dispatch.Config) { c.Topology.ForbidCrossRegion = true }, "topology.forbid_cross_region"},
	} {
		cfg := dispatch.Config{SigningKey: key, PrincipalID: gatewayID}
		c.edit(&cfg)
		d, err := dispatch.New(cfg, deps)
		if err == nil {
			d.Close()
		}
		if !errors.Is(err, dispatch.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New with %s wrong = %v, want ErrConfig naming %q", c.want, err, c.want)
		}
	}
}
