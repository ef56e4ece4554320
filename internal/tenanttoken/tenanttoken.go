// Package tenanttoken mints and verifies the bearer tokens that carry a
// caller's tenant to the dispatcher: EdDSA (Ed25519) JWTs signed by an
// issuer key, with audience, expiry and a tenant_id claim. The dispatcher
// derives the tenant only from a verified token, never from a payload.
package tenanttoken

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/lestrrat-go/jwx/v2/jwa"
	"github.com/lestrrat-go/jwx/v2/jwk"
	"github.com/lestrrat-go/jwx/v2/jws"
	"github.com/lestrrat-go/jwx/v2/jwt"
)

// TenantClaim is the private claim that names the tenant.
const TenantClaim = "tenant_id"

// DefaultAudience is the audience the dispatcher expects by default.
const DefaultAudience = "aipfleet-dispatch"

// MaxTokenBytes bounds an Authorization header's token.
const MaxTokenBytes = 8 << 10

// Claims are what a token asserts.
type Claims struct {
	Issuer   string
	Subject  string
	Audience string
	TenantID string
	IssuedAt time.Time
	Expiry   time.Time
}

// Mint signs a token for claims with the issuer key. The header carries
// kid = the key's did:key and alg EdDSA.
func Mint(key *aip.SigningKey, c Claims) (string, error) {
	if c.TenantID == "" {
		return "", errors.New("tenanttoken: tenant is empty")
	}
	if c.Issuer == "" || c.Audience == "" {
		return "", errors.New("tenanttoken: issuer and audience are required")
	}
	if !c.Expiry.After(c.IssuedAt) {
		return "", errors.New("tenanttoken: expiry must be after issued-at")
	}
	b := jwt.NewBuilder().
		Issuer(c.Issuer).
		Audience([]string{c.Audience}).
		IssuedAt(c.IssuedAt).
		NotBefore(c.IssuedAt).
		Expiration(c.Expiry).
		JwtID(aip.NewID("jti_")).
		Claim(TenantClaim, c.TenantID)
	if c.Subject != "" {
		b = b.Subject(c.Subject)
	}
	tok, err := b.Build()
	if err != nil {
		return "", fmt.Errorf("tenanttoken: build: %w", err)
	}
	priv, err := jwk.FromRaw(ed25519.NewKeyFromSeed(key.Seed()))
	if err != nil {
		return "", fmt.Errorf("tenanttoken: key: %w", err)
	}
	if err := priv.Set(jwk.KeyIDKey, key.DID()); err != nil {
		return "", err
	}
	if err := priv.Set(jwk.AlgorithmKey, jwa.EdDSA); err != nil {
		return "", err
	}
	signed, err := jwt.Sign(tok, jwt.WithKey(jwa.EdDSA, priv))
	if err != nil {
		return "", fmt.Errorf("tenanttoken: sign: %w", err)
	}
	return string(signed), nil
}

// Issuer is a trusted token issuer: its name (the iss claim) and the
// did:key identities of its signing keys.
type Issuer struct {
	Name string
	DIDs []string
}

// VerifierConfig configures a Verifier.
type VerifierConfig struct {
	// Issuers are the trusted issuers. Required.
	Issuers []Issuer
	// Audience the token must name. Defaults to DefaultAudience.
	Audience string
	// ClockSkew tolerated on exp, nbf and iat, at most 5m. Defaults to
	// 30s; negative tolerates none.
	ClockSkew time.Duration
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
}

// Verifier checks bearer tokens.
type Verifier struct {
	keys     jwk.Set
	issuers  map[string]map[string]bool // issuer name -> trusted kids
	audience string
	skew     time.Duration
	now      func() time.Time
}

// ErrUnauthorized is returned (wrapped, with the reason) for every token
// that is missing, malformed, unsigned by a trusted key, for another
// audience, expired or without a tenant.
var ErrUnauthorized = errors.New("unauthorized")

// NewVerifier validates the configuration.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if len(cfg.Issuers) == 0 {
		return nil, errors.New("tenanttoken: at least one trusted issuer is required")
	}
	v := &Verifier{keys: jwk.NewSet(), issuers: map[string]map[string]bool{}, audience: cfg.Audience, skew: cfg.ClockSkew, now: cfg.Now}
	if v.audience == "" {
		v.audience = DefaultAudience
	}
	if v.skew == 0 {
		v.skew = 30 * time.Second
	}
	if v.skew < 0 {
		v.skew = 0
	}
	if v.skew > 5*time.Minute {
		return nil, fmt.Errorf("tenanttoken: clock skew %s is more than 5m", v.skew)
	}
	if v.now == nil {
		v.now = time.Now
	}
	for _, iss := range cfg.Issuers {
		if iss.Name == "" || len(iss.DIDs) == 0 {
			return nil, errors.New("tenanttoken: an issuer needs a name and at least one did:key")
		}
		kids := v.issuers[iss.Name]
		if kids == nil {
			kids = map[string]bool{}
			v.issuers[iss.Name] = kids
		}
		for _, did := range iss.DIDs {
			pub, err := aip.ParseDIDKey(did)
			if err != nil {
				return nil, fmt.Errorf("tenanttoken: issuer %s key: %w", iss.Name, err)
			}
			k, err := jwk.FromRaw(pub)
			if err != nil {
				return nil, err
			}
			_ = k.Set(jwk.KeyIDKey, did)
			_ = k.Set(jwk.AlgorithmKey, jwa.EdDSA)
			if err := v.keys.AddKey(k); err != nil {
				return nil, fmt.Errorf("tenanttoken: issuer %s key %s: %w", iss.Name, did, err)
			}
			kids[did] = true
		}
	}
	return v, nil
}

// Verify checks a token and returns its claims. Every failure wraps
// ErrUnauthorized with a reason fit for a 401 response.
func (v *Verifier) Verify(token string) (Claims, error) {
	if token == "" {
		return Claims{}, fmt.Errorf("%w: missing bearer token", ErrUnauthorized)
	}
	if len(token) > MaxTokenBytes {
		return Claims{}, fmt.Errorf("%w: token longer than %d bytes", ErrUnauthorized, MaxTokenBytes)
	}
	msg, err := jws.Parse([]byte(token))
	if err != nil || len(msg.Signatures()) != 1 {
		return Claims{}, fmt.Errorf("%w: malformed token", ErrUnauthorized)
	}
	hdr := msg.Signatures()[0].ProtectedHeaders()
	if hdr.Algorithm() != jwa.EdDSA {
		return Claims{}, fmt.Errorf("%w: token algorithm %q is not EdDSA", ErrUnauthorized, hdr.Algorithm())
	}
	kid := hdr.KeyID()
	tok, err := jwt.Parse([]byte(token),
		jwt.WithKeySet(v.keys, jws.WithRequireKid(true)),
		jwt.WithValidate(true),
		jwt.WithAudience(v.audience),
		jwt.WithAcceptableSkew(v.skew),
		jwt.WithClock(jwt.ClockFunc(v.now)),
		jwt.WithRequiredClaim(jwt.ExpirationKey),
		jwt.WithRequiredClaim(jwt.IssuerKey),
	)
	if err != nil {
		return Claims{}, fmt.Errorf("%w: %s", ErrUnauthorized, reason(err))
	}
	if kids := v.issuers[tok.Issuer()]; !kids[kid] {
		return Claims{}, fmt.Errorf("%w: issuer %q is not trusted with key %s", ErrUnauthorized, tok.Issuer(), kid)
	}
	raw, ok := tok.Get(TenantClaim)
	tenant, _ := raw.(string)
	if !ok || strings.TrimSpace(tenant) == "" {
		return Claims{}, fmt.Errorf("%w: token has no %s claim", ErrUnauthorized, TenantClaim)
	}
	c := Claims{Issuer: tok.Issuer(), Subject: tok.Subject(), TenantID: tenant, IssuedAt: tok.IssuedAt(), Expiry: tok.Expiration()}
	if aud := tok.Audience(); len(aud) > 0 {
		c.Audience = aud[0]
	}
	return c, nil
}

func reason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenExpired()):
		return "token expired"
	case errors.Is(err, jwt.ErrTokenNotYetValid()):
		return "token not valid yet"
	case errors.Is(err, jwt.ErrInvalidAudience()):
		return "token is for another audience"
	case errors.Is(err, jwt.ErrInvalidIssuedAt()):
		return "token issued in the future"
	case errors.Is(err, jwt.ErrRequiredClaim()):
		return "token lacks a required claim (iss and exp are required)"
	}
	msg := err.Error()
	if strings.Contains(msg, "failed to find key") || strings.Contains(msg, "could not verify") || strings.Contains(msg, "verify") {
		return "token is not signed by a trusted issuer key"
	}
	return "invalid token"
}

// FromAuthorization extracts the token of an "Authorization: Bearer <t>"
// header value.
func FromAuthorization(header string) (string, error) {
	if header == "" {
		return "", fmt.Errorf("%w: missing Authorization header; send \"Authorization: Bearer <token>\" (mint one with `aipfleet token`)", ErrUnauthorized)
	}
	scheme, tok, ok := strings.Cut(header, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(tok) == "" {
		return "", fmt.Errorf("%w: Authorization header is not \"Bearer <token>\"", ErrUnauthorized)
	}
	return strings.TrimSpace(tok), nil
}

// UnverifiedExpiry returns the expiry a token claims, without verifying
// anything (ok is false when it is not a JWT or names no expiry). For a
// client deciding whether a token it holds is worth sending, never for
// trusting one.
func UnverifiedExpiry(token string) (exp time.Time, ok bool) {
	t, err := jwt.ParseInsecure([]byte(token))
	if err != nil || t.Expiration().IsZero() {
		return time.Time{}, false
	}
	return t.Expiration(), true
}
