package tenanttoken

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

func TestMintAndVerify(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	issuerKey, _ := aip.GenerateSigningKey()
	otherKey, _ := aip.GenerateSigningKey()
	v, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "acme-idp", DIDs: []string{issuerKey.DID()}}}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	base := Claims{Issuer: "acme-idp", Audience: DefaultAudience, TenantID: "tenant-a", Subject: "ops", IssuedAt: now.Add(-time.Minute), Expiry: now.Add(time.Hour)}
	tok, err := Mint(issuerKey, base)
	if err != nil {
		t.Fatal(err)
	}
	got, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if got.TenantID != "tenant-a" || got.Issuer != "acme-idp" || got.Subject != "ops" {
		t.Fatalf("claims = %+v", got)
	}

	mint := func(key *aip.SigningKey, mutate func(*Claims)) string {
		c := base
		mutate(&c)
		s, err := Mint(key, c)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	bad := map[string]struct {
		token, reason string
	}{
		"untrusted key":  {mint(otherKey, func(*Claims) {}), "trusted"},
		"other issuer":   {mint(issuerKey, func(c *Claims) { c.Issuer = "evil" }), "not trusted"},
		"other audience": {mint(issuerKey, func(c *Claims) { c.Audience = "someone-else" }), "audience"},
		"expired":        {mint(issuerKey, func(c *Claims) { c.IssuedAt = now.Add(-2 * time.Hour); c.Expiry = now.Add(-time.Minute) }), "expired"},
		"not yet valid":  {mint(issuerKey, func(c *Claims) { c.IssuedAt = now.Add(10 * time.Minute); c.Expiry = now.Add(time.Hour) }), "future"},
		"tampered":       {tok[:len(tok)-4] + "AAAA", "signed"},
		"garbage":        {"not.a.token", "malformed"},
		// The same signed token in JWS JSON serialization (flattened): a
		// bearer token is the compact form only (RFC 6750, RFC 7519 §7.2).
		"JSON serialization": {jsonSerialized(t, tok), "malformed"},
		"empty":              {"", "missing"},
	}
	for name, tc := range bad {
		_, err := v.Verify(tc.token)
		if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("%s: err = %v, want ErrUnauthorized mentioning %q", name, err, tc.reason)
		}
	}
	// Within the clock skew an expired token still passes.
	skewed := mint(issuerKey, func(c *Claims) { c.Expiry = now.Add(-10 * time.Second) })
	if _, err := v.Verify(skewed); err != nil {
		t.Errorf("token expired 10s ago within 30s skew: %v", err)
	}
}

// jsonSerialized rewrites a compact JWS as its flattened JSON
// serialization, carrying the same signature.
func jsonSerialized(t *testing.T, compact string) string {
	t.Helper()
	p := strings.Split(compact, ".")
	if len(p) != 3 {
		t.Fatalf("not a compact JWS: %q", compact)
	}
	return fmt.Sprintf(`{"payload":%q,"protected":%q,"signature":%q}`, p[1], p[0], p[2])
}

func TestMintRefusesIncompleteClaims(t *testing.T) {
	k, _ := aip.GenerateSigningKey()
	now := time.Now()
	for name, c := range map[string]Claims{
		"no tenant":   {Issuer: "i", Audience: "a", IssuedAt: now, Expiry: now.Add(time.Hour)},
		"no issuer":   {Audience: "a", TenantID: "t", IssuedAt: now, Expiry: now.Add(time.Hour)},
		"no lifetime": {Issuer: "i", Audience: "a", TenantID: "t", IssuedAt: now, Expiry: now},
	} {
		if _, err := Mint(k, c); err == nil {
			t.Errorf("%s: minted", name)
		}
	}
}

func TestFromAuthorization(t *testing.T) {
	if tok, err := FromAuthorization("Bearer abc.def.ghi"); err != nil || tok != "abc.def.ghi" {
		t.Fatalf("got %q, %v", tok, err)
	}
	for _, h := range []string{"", "Basic abc", "Bearer", "Bearer  "} {
		if _, err := FromAuthorization(h); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("%q: err = %v", h, err)
		}
	}
}

// TestVerifyRequestRefusesTwoHeaders: a request with two Authorization
// headers is refused whichever holds the good token (only the first was
// read, so a good token followed by another was accepted while a proxy in
// front could have read the other); one without a header, or with an
// empty one, is told to mint the verifier's kind of token
// (ErrNoCredentials), and so is one with another scheme's credentials
// (Basic: no bearer credentials either), while the Bearer scheme without
// a token is not; one good header verifies.
func TestVerifyRequestRefusesTwoHeaders(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	key, _ := aip.GenerateSigningKey()
	ops, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "ops-idp", DIDs: []string{key.DID()}}}, Operator: true,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := MintOperator(key, Claims{Issuer: "ops-idp", Audience: OperatorAudience, IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	good := "Bearer " + tok
	request := func(auth ...string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/aip/v1/fleet/status", nil)
		for _, a := range auth {
			r.Header.Add("Authorization", a)
		}
		return r
	}
	if c, err := ops.VerifyRequest(request(good)); err != nil || !c.Operator {
		t.Fatalf("one good header: %+v, %v", c, err)
	}
	for name, c := range map[string]struct {
		auth          []string
		want          string
		noCredentials bool
	}{
		"good then garbage": {[]string{good, "Bearer x.y.z"}, "unauthorized: 2 Authorization headers; send exactly one", false},
		"garbage then good": {[]string{"Bearer x.y.z", good}, "unauthorized: 2 Authorization headers; send exactly one", false},
		"good three times":  {[]string{good, good, good}, "unauthorized: 3 Authorization headers; send exactly one", false},
		"empty then good":   {[]string{"", good}, "unauthorized: 2 Authorization headers; send exactly one", false},
		"none":              {nil, "unauthorized: missing Authorization header; send \"Authorization: Bearer <token>\" (mint one with `aipfleet token --operator`)", true},
		"empty":             {[]string{""}, "unauthorized: missing Authorization header; send", true},
		"basic":             {[]string{"Basic Zm9vOmJhcg=="}, "unauthorized: Authorization header is not \"Bearer <token>\"", true},
		"bearer, no token":  {[]string{"Bearer "}, "unauthorized: Authorization header is not \"Bearer <token>\"", false},
	} {
		_, err := ops.VerifyRequest(request(c.auth...))
		if !errors.Is(err, ErrUnauthorized) || !strings.HasPrefix(err.Error(), c.want) || errors.Is(err, ErrNoCredentials) != c.noCredentials {
			t.Errorf("%s: err = %v; want ErrUnauthorized starting %q (ErrNoCredentials %v)", name, err, c.want, c.noCredentials)
		}
	}
	// A tenant verifier names the tenant token's command.
	tenants, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "ops-idp", DIDs: []string{key.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tenants.VerifyRequest(request()); err == nil || !strings.HasSuffix(err.Error(), "(mint one with `aipfleet token`)") {
		t.Errorf("tenant verifier without a header: %v", err)
	}
}

// TestNegativeClockSkewToleratesNone: a negative ClockSkew is no skew (zero
// is the 30s default): a token expired a second ago is refused.
func TestNegativeClockSkewToleratesNone(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	key, _ := aip.GenerateSigningKey()
	v, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "idp", DIDs: []string{key.DID()}}}, ClockSkew: -1,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := Mint(key, Claims{Issuer: "idp", Audience: DefaultAudience, TenantID: "t", IssuedAt: now.Add(-time.Hour), Expiry: now.Add(-time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("token expired 1s ago without skew: err = %v", err)
	}
}

// TestOperatorTokens: an operator verifier accepts operator tokens of its
// issuers for the control plane's audience, and no tenant token; a tenant
// verifier accepts no operator token.
func TestOperatorTokens(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	key, _ := aip.GenerateSigningKey()
	issuers := []Issuer{{Name: "ops-idp", DIDs: []string{key.DID()}}}
	ops, err := NewVerifier(VerifierConfig{Issuers: issuers, Operator: true, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	// A tenant verifier for the same audience: only the claims tell the kinds apart.
	tenants, err := NewVerifier(VerifierConfig{Issuers: issuers, Audience: OperatorAudience, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	base := Claims{Issuer: "ops-idp", Audience: OperatorAudience, Subject: "alice", IssuedAt: now.Add(-time.Minute), Expiry: now.Add(time.Hour)}
	tok, err := MintOperator(key, base)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ops.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Operator || got.TenantID != "" || got.Subject != "alice" || got.Audience != OperatorAudience {
		t.Fatalf("claims = %+v", got)
	}
	if _, err := tenants.Verify(tok); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "tenant_id") {
		t.Errorf("tenant verifier took an operator token: %v", err)
	}
	tenantTok, err := Mint(key, Claims{Issuer: "ops-idp", Audience: OperatorAudience, TenantID: "acme", IssuedAt: now, Expiry: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ops.Verify(tenantTok); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "not an operator token") {
		t.Errorf("operator verifier took a tenant token: %v", err)
	}
	dispatchAud := base
	dispatchAud.Audience = DefaultAudience
	if other, err := MintOperator(key, dispatchAud); err != nil {
		t.Fatal(err)
	} else if _, err := ops.Verify(other); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "audience") {
		t.Errorf("operator token for the dispatcher's audience: %v", err)
	}
	if _, err := MintOperator(key, Claims{Issuer: "i", Audience: "a", TenantID: "t", IssuedAt: now, Expiry: now.Add(time.Hour)}); err == nil {
		t.Error("MintOperator minted a token with a tenant")
	}
	if _, err := Mint(key, Claims{Issuer: "i", Audience: "a", TenantID: "t", Operator: true, IssuedAt: now, Expiry: now.Add(time.Hour)}); err == nil {
		t.Error("Mint minted an operator token")
	}
}

// TestEpochExpiryIsExpired: a token whose exp is 0 (or rounds to 0, the
// Unix epoch) expired in 1970. jwx's validation takes an exp of 0 for no
// expiry, so such a token (an issuer's unset field, say) verified and never
// expired; it is refused as expired, for a tenant and an operator verifier
// alike.
func TestEpochExpiryIsExpired(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	key, _ := aip.GenerateSigningKey()
	issuers := []Issuer{{Name: "idp", DIDs: []string{key.DID()}}}
	for _, operator := range []bool{false, true} {
		v, err := NewVerifier(VerifierConfig{Issuers: issuers, Operator: operator, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		for _, exp := range []any{0, 0.5, "0"} {
			claims := map[string]any{"iss": "idp", "aud": v.audience, "iat": now.Unix(), "exp": exp}
			if operator {
				claims[RoleClaim] = RoleOperator
			} else {
				claims[TenantClaim] = "tenant-a"
			}
			tok := signClaims(t, key, claims)
			// The reason names the exp at the epoch: "token expired" alone
			// sends whoever reads it to the clocks, while the issuer wrote
			// 0 meaning no expiry.
			if c, err := v.Verify(tok); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "expired") || !strings.Contains(err.Error(), "exp of 0") {
				t.Errorf("operator %v, exp %#v: claims %+v, err = %v, want expired, naming the exp of 0", operator, exp, c, err)
			}
		}
	}
}

// signClaims signs a claims set, as given, with key (header alg EdDSA and
// kid the key's did:key, as Mint writes them).
func signClaims(t *testing.T, key *aip.SigningKey, claims map[string]any) string {
	t.Helper()
	return signWithHeader(t, key, map[string]any{"alg": "EdDSA", "kid": key.DID()}, claims)
}

// signWithHeader signs a claims set with key under the protected header
// given, as given.
func signWithHeader(t *testing.T, key *aip.SigningKey, header, claims map[string]any) string {
	t.Helper()
	hdr, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	payload, err := json.Marshal(claims)
	if err != nil {
		t.Fatal(err)
	}
	in := base64.RawURLEncoding.EncodeToString(hdr) + "." + base64.RawURLEncoding.EncodeToString(payload)
	return in + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(ed25519.NewKeyFromSeed(key.Seed()), []byte(in)))
}

// TestCriticalHeaderIsRefused: a token whose header lists critical
// extensions (crit) is refused, signed by a trusted key or not: the
// verifier understands none, and RFC 7515 §4.1.11 makes such a JWS
// invalid for a recipient that does not (jwx ignores crit, so the
// extension's rule — a restriction its issuer meant to impose — was
// silently dropped).
func TestCriticalHeaderIsRefused(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	key, _ := aip.GenerateSigningKey()
	v, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "idp", DIDs: []string{key.DID()}}}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{"iss": "idp", "aud": DefaultAudience, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), TenantClaim: "tenant-a"}
	if _, err := v.Verify(signWithHeader(t, key, map[string]any{"alg": "EdDSA", "kid": key.DID()}, claims)); err != nil {
		t.Fatalf("without crit: %v", err)
	}
	for name, hdr := range map[string]map[string]any{
		"an extension": {"alg": "EdDSA", "kid": key.DID(), "crit": []string{"tenant_scope"}, "tenant_scope": "read-only"},
		"empty list":   {"alg": "EdDSA", "kid": key.DID(), "crit": []string{}},
	} {
		if c, err := v.Verify(signWithHeader(t, key, hdr, claims)); !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "crit") {
			t.Errorf("%s: claims %+v, err = %v, want a refusal naming crit", name, c, err)
		}
	}
}

// TestMissingKeyIDIsNamed: a token without a kid header, even one signed
// by a trusted issuer key, is refused saying that the header must name
// the signing key's did:key in kid; it was "invalid token", which left an
// issuer's integrator nothing to fix. A kid the verifier does not trust
// still says only that the token is not signed by a trusted key.
func TestMissingKeyIDIsNamed(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	key, _ := aip.GenerateSigningKey()
	other, _ := aip.GenerateSigningKey()
	v, err := NewVerifier(VerifierConfig{Issuers: []Issuer{{Name: "idp", DIDs: []string{key.DID()}}}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]any{"iss": "idp", "aud": DefaultAudience, "iat": now.Unix(), "exp": now.Add(time.Hour).Unix(), TenantClaim: "tenant-a"}
	for name, hdr := range map[string]map[string]any{
		"no kid":    {"alg": "EdDSA"},
		"empty kid": {"alg": "EdDSA", "kid": ""},
	} {
		_, err := v.Verify(signWithHeader(t, key, hdr, claims))
		if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "kid") || !strings.Contains(err.Error(), "did:key") {
			t.Errorf("%s: err = %v, want a refusal saying kid must name the did:key", name, err)
		}
	}
	_, err = v.Verify(signWithHeader(t, other, map[string]any{"alg": "EdDSA", "kid": other.DID()}, claims))
	if err == nil || err.Error() != "unauthorized: token is not signed by a trusted issuer key" {
		t.Errorf("an untrusted kid: %v", err)
	}
}
