package dispatch_test

import (
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jwt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// mintClaim mints a token of the test issuer, valid in every other way,
// whose tenant_id claim is v (any JSON value).
func mintClaim(t *testing.T, w *world, v any) string {
	t.Helper()
	now := time.Now()
	tok, err := jwt.NewBuilder().Issuer(issuer).Audience([]string{tenanttoken.DefaultAudience}).IssuedAt(now).
		Expiration(now.Add(time.Hour)).Claim(tenanttoken.TenantClaim, v).Build()
	must(t, err)
	priv, err := jwk.FromRaw(ed25519.NewKeyFromSeed(w.issuer.Seed()))
	must(t, err)
	must(t, priv.Set(jwk.KeyIDKey, w.issuer.DID()))
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA, priv))
	must(t, err)
	return string(signed)
}

// getWith sends GET path with the given Authorization header values.
func (w *world) getWith(path string, auth ...string) (int, []byte, http.Header) {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, w.srv.URL+path, nil)
	must(w.t, err)
	for _, a := range auth {
		req.Header.Add("Authorization", a)
	}
	resp, err := w.api.Do(req)
	must(w.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	must(w.t, err)
	return resp.StatusCode, body, resp.Header
}

// TestAuthorizationIsUnambiguous: a request with two Authorization
// headers is refused whichever comes first (the first was used, so a good
// token followed by another was accepted while a proxy could have checked
// the second); a verified token whose tenant_id is no tenant ID (a NUL,
// surrounding spaces, longer than an identifier) is refused, not used as a
// tenant; a request without bearer credentials (none, or another
// scheme's) is challenged without an invalid_token error (RFC 6750 §3.1),
// and a description never carries a quote or a backslash.
func TestAuthorizationIsUnambiguous(t *testing.T) {
	w := newWorld(t, worldOptions{})
	good := "Bearer " + w.token(tenant)
	if s, body, _ := w.getWith(dispatch.PathCapabilities, good); s != http.StatusOK {
		t.Fatalf("a good token: %d %s", s, body)
	}
	for name, auth := range map[string][]string{
		"good then garbage":     {good, "Bearer garbage"},
		"garbage then good":     {"Bearer garbage", good},
		"the same token twice":  {good, good},
		"tenant with a NUL":     {"Bearer " + mintClaim(t, w, tenant+"\x00")},
		"tenant with spaces":    {"Bearer " + mintClaim(t, w, " "+tenant)},
		"tenant with a newline": {"Bearer " + mintClaim(t, w, tenant+"\n")},
		"tenant too long":       {"Bearer " + mintClaim(t, w, strings.Repeat("t", 257))},
		"tenant a number":       {"Bearer " + mintClaim(t, w, 42)},
	} {
		s, body, h := w.getWith(dispatch.PathCapabilities, auth...)
		if s != http.StatusUnauthorized || errorCode(t, body) != dispatch.CodeUnauthorized {
			t.Errorf("%s: %d %s, want 401", name, s, body)
			continue
		}
		c := h.Get("WWW-Authenticate")
		desc, ok := strings.CutPrefix(c, `Bearer realm="aipfleet-dispatch", error="invalid_token", error_description="`)
		if !ok || !strings.HasSuffix(desc, `"`) || strings.ContainsAny(strings.TrimSuffix(desc, `"`), "\"\\") {
			t.Errorf("%s: challenge %q", name, c)
		}
	}
	// No bearer credentials: none, an empty header, or another scheme's
	// (RFC 6750 §3.1: "attempted using an unsupported authentication
	// method"), which was answered error="invalid_token" though no token
	// was sent.
	for name, auth := range map[string][]string{
		"none":         nil,
		"empty header": {""},
		"basic":        {"Basic Zm9vOmJhcg=="},
		"digest":       {`Digest username="a"`},
		"no space":     {"Token"},
	} {
		s, body, h := w.getWith(dispatch.PathCapabilities, auth...)
		if c := h.Get("WWW-Authenticate"); s != http.StatusUnauthorized || c != `Bearer realm="aipfleet-dispatch"` {
			t.Errorf("%s: %d %s, challenge %q", name, s, body, c)
		}
	}
	// The Bearer scheme without a token is an invalid token.
	for _, auth := range []string{"Bearer", "Bearer ", "bearer  "} {
		_, _, h := w.getWith(dispatch.PathCapabilities, auth)
		if c := h.Get("WWW-Authenticate"); !strings.Contains(c, `error="invalid_token"`) {
			t.Errorf("%q: challenge %q, want an invalid_token error", auth, c)
		}
	}
	// The longest tenant ID is one.
	if s, body, _ := w.getWith(dispatch.PathCapabilities, "Bearer "+mintClaim(t, w, strings.Repeat("t", 256))); s != http.StatusOK {
		t.Errorf("a 256-byte tenant: %d %s", s, body)
	}
}

// TestUnauthorizedMessageIsTheReason: a 401's message repeated its code's
// word ("dispatch.unauthorized: unauthorized: malformed token"); it is the
// reason alone, with or without credentials and for a tenant claim the
// dispatcher refuses.
func TestUnauthorizedMessageIsTheReason(t *testing.T) {
	w := newWorld(t, worldOptions{})
	for name, c := range map[string]struct {
		auth []string
		want string
	}{
		"garbage":        {[]string{"Bearer garbage"}, "malformed token"},
		"two headers":    {[]string{"Bearer a", "Bearer b"}, "2 Authorization headers; send exactly one"},
		"not bearer":     {[]string{"Basic x"}, `Authorization header is not "Bearer <token>"`},
		"tenant a NUL":   {[]string{"Bearer " + mintClaim(t, w, tenant+"\x00")}, "the token's " + tenanttoken.TenantClaim + " claim is not a tenant ID"},
		"no credentials": {nil, "missing Authorization header; send"},
	} {
		s, body, _ := w.getWith(dispatch.PathCapabilities, c.auth...)
		var e struct {
			Error *aip.ProtocolError `json:"error"`
		}
		if s != http.StatusUnauthorized || json.Unmarshal(body, &e) != nil || e.Error == nil || e.Error.Code != dispatch.CodeUnauthorized ||
			!strings.HasPrefix(e.Error.Message, c.want) {
			t.Errorf("%s: %d %s, want 401 %s whose message starts %q", name, s, body, dispatch.CodeUnauthorized, c.want)
		}
	}
}
