package tenanttoken

import (
	"errors"
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
		"empty":          {"", "missing"},
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
