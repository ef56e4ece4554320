// Package tenanttoken mints and verifies the bearer tokens of the fleet's
// HTTP services: EdDSA (Ed25519) JWTs signed by an issuer key, with
// audience and expiry.
//
// A tenant token carries a caller's tenant to the dispatcher (claim
// tenant_id, audience aipfleet-dispatch); the dispatcher derives the tenant
// only from a verified token, never from a payload. An operator token
// (claim aip_role = "operator", no tenant, audience aipfleet-control) lets
// an operator read the control plane's fleet views. A verifier accepts one
// kind only: a tenant token is never an operator's, nor the reverse.
package tenanttoken

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
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

// OperatorAudience is the audience the control plane expects of operator
// tokens by default.
const OperatorAudience = "aipfleet-control"

// RoleClaim is the private claim that marks an operator token; its value
// is RoleOperator.
const (
	RoleClaim    = "aip_role"
	RoleOperator = "operator"
)

// MaxTokenBytes bounds an Authorization header's token.
const MaxTokenBytes = 8 << 10

// Claims are what a token asserts.
type Claims struct {
	Issuer   string
	Subject  string
	Audience string
	// TenantID is a tenant token's tenant; empty in an operator token.
	TenantID string
	// Operator is set in an operator token's claims.
	Operator bool
	IssuedAt time.Time
	Expiry   time.Time
}

// Mint signs a tenant token for claims with the issuer key. The header
// carries kid = the key's did:key and alg EdDSA.
func Mint(key *aip.SigningKey, c Claims) (string, error) {
	if c.TenantID == "" {
		return "", errors.New("tenanttoken: tenant is empty")
	}
	if c.Operator {
		return "", errors.New("tenanttoken: a tenant token cannot be an operator token (use MintOperator)")
	}
	return mint(key, c, TenantClaim, c.TenantID)
}

// MintOperator signs an operator token for claims (TenantID must be empty;
// Operator is implied) with the issuer key.
func MintOperator(key *aip.SigningKey, c Claims) (string, error) {
	if c.TenantID != "" {
		return "", errors.New("tenanttoken: an operator token names no tenant")
	}
	return mint(key, c, RoleClaim, RoleOperator)
}

// mint signs the registered claims of c plus one private claim.
func mint(key *aip.SigningKey, c Claims, claim, value string) (string, error) {
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
		Claim(claim, value)
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
	// Operator makes the verifier accept operator tokens (claim aip_role
	// = "operator", no tenant_id) instead of tenant tokens.
	Operator bool
	// Audience the token must name. Defaults to DefaultAudience, or
	// OperatorAudience with Operator.
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
	operator bool
	audience string
	skew     time.Duration
	now      func() time.Time
}

// ErrUnauthorized is returned (wrapped, with the reason) for every token
// that is missing, malformed, unsigned by a trusted key, for another
// audience, expired, or not of the verifier's kind (a tenant token without
// a tenant, an operator token without the operator role, or one with a
// tenant).
var ErrUnauthorized = errors.New("unauthorized")

// NewVerifier validates the configuration.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if len(cfg.Issuers) == 0 {
		return nil, errors.New("tenanttoken: at least one trusted issuer is required")
	}
	v := &Verifier{keys: jwk.NewSet(), issuers: map[string]map[string]bool{}, operator: cfg.Operator, audience: cfg.Audience, skew: cfg.ClockSkew, now: cfg.Now}
	if v.audience == "" {
		v.audience = DefaultAudience
		if v.operator {
			v.audience = OperatorAudience
		}
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
	// A bearer token is a compact JWS (RFC 7519 §7.2): the JSON
	// serialization is refused before anything else reads it.
	msg, err := jws.Parse([]byte(token), jws.WithCompact())
	if err != nil || len(msg.Signatures()) != 1 {
		return Claims{}, fmt.Errorf("%w: malformed token", ErrUnauthorized)
	}
	hdr := msg.Signatures()[0].ProtectedHeaders()
	if hdr.Algorithm() != jwa.EdDSA {
		return Claims{}, fmt.Errorf("%w: token algorithm %q is not EdDSA", ErrUnauthorized, hdr.Algorithm())
	}
	// RFC 7515 §4.1.11: a JWS whose crit names an extension the
	// recipient does not understand is invalid, and this verifier
	// understands none (jwx ignores crit).
	if _, ok := hdr.Get(jws.CriticalKey); ok {
		return Claims{}, fmt.Errorf("%w: token header lists critical extensions (crit); none is supported", ErrUnauthorized)
	}
	// The kid selects the issuer key (its did:key); without one jwx's
	// refusal read as "invalid token". Saying so tells nothing about which
	// keys are trusted.
	kid := hdr.KeyID()
	if kid == "" {
		return Claims{}, fmt.Errorf("%w: token header has no kid: it must name the did:key of the issuer key that signed it", ErrUnauthorized)
	}
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
	// jwx validates no exp within the first second of the Unix epoch (it
	// reads an exp of 0 as none): such a token expired in 1970, and would
	// otherwise never expire.
	if tok.Expiration().Unix() <= 0 {
		return Claims{}, fmt.Errorf("%w: token expired: its exp is at or before the Unix epoch (an exp of 0 is expired, not no expiry; have the issuer set one)", ErrUnauthorized)
	}
	if kids := v.issuers[tok.Issuer()]; !kids[kid] {
		return Claims{}, fmt.Errorf("%w: issuer %q is not trusted with key %s", ErrUnauthorized, tok.Issuer(), kid)
	}
	raw, hasTenant := tok.Get(TenantClaim)
	tenant, _ := raw.(string)
	rawRole, _ := tok.Get(RoleClaim)
	role, _ := rawRole.(string)
	if v.operator {
		if role != RoleOperator {
			return Claims{}, fmt.Errorf("%w: not an operator token (claim %s is not %q)", ErrUnauthorized, RoleClaim, RoleOperator)
		}
		if hasTenant {
			return Claims{}, fmt.Errorf("%w: an operator token names no tenant, this one has a %s claim", ErrUnauthorized, TenantClaim)
		}
		tenant = ""
	} else if !hasTenant || strings.TrimSpace(tenant) == "" {
		return Claims{}, fmt.Errorf("%w: token has no %s claim", ErrUnauthorized, TenantClaim)
	}
	c := Claims{Issuer: tok.Issuer(), Subject: tok.Subject(), TenantID: tenant, Operator: v.operator, IssuedAt: tok.IssuedAt(), Expiry: tok.Expiration()}
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
// header value (the scheme is case-insensitive). A value of another
// scheme (Basic, Digest, ...) holds no bearer credentials: its refusal
// wraps ErrNoCredentials too. The Bearer scheme without a token is an
// invalid token.
func FromAuthorization(header string) (string, error) {
	if header == "" {
		return "", errMissingHeader(false)
	}
	scheme, tok, _ := strings.Cut(header, " ")
	switch {
	case !strings.EqualFold(scheme, "Bearer"):
		return "", notBearerError{}
	case strings.TrimSpace(tok) == "":
		return "", fmt.Errorf("%w: %s", ErrUnauthorized, notBearer)
	}
	return strings.TrimSpace(tok), nil
}

// ErrNoCredentials is wrapped, with ErrUnauthorized, by the refusal of a
// request without bearer credentials: without an Authorization header,
// with an empty one, or with one of another scheme (Basic, ...). Such a
// caller a server challenges without an error code (RFC 6750 §3.1: the
// client "was unaware that authentication is necessary or attempted using
// an unsupported authentication method").
var ErrNoCredentials = errors.New("missing Authorization header")

// notBearer says what an Authorization header that holds no bearer token
// lacks.
const notBearer = `Authorization header is not "Bearer <token>"`

// notBearerError refuses an Authorization header of another scheme: it is
// ErrUnauthorized and ErrNoCredentials, and says that the header is not a
// bearer token's (not that it is missing).
type notBearerError struct{}

func (notBearerError) Error() string { return ErrUnauthorized.Error() + ": " + notBearer }

func (notBearerError) Is(target error) bool {
	return target == ErrUnauthorized || target == ErrNoCredentials
}

// errMissingHeader is the refusal of a request without an Authorization
// header, naming the command that mints the token it needs.
func errMissingHeader(operator bool) error {
	mint := "aipfleet token"
	if operator {
		mint = "aipfleet token --operator"
	}
	return fmt.Errorf("%w: %w; send \"Authorization: Bearer <token>\" (mint one with `%s`)", ErrUnauthorized, ErrNoCredentials, mint)
}

// RequestToken returns the bearer token of h's one Authorization header.
// A request with more than one is refused, whichever holds a good token:
// which one counts is anybody's guess (a proxy in front may have read the
// other), so none does. A request without one (ErrNoCredentials) is told
// to mint a tenant token, or with operator an operator token. Every
// failure wraps ErrUnauthorized with a reason fit for a 401 response.
func RequestToken(h http.Header, operator bool) (string, error) {
	values := h.Values("Authorization")
	switch {
	case len(values) > 1:
		return "", fmt.Errorf("%w: %d Authorization headers; send exactly one", ErrUnauthorized, len(values))
	case len(values) == 0 || values[0] == "":
		return "", errMissingHeader(operator)
	}
	return FromAuthorization(values[0])
}

// VerifyRequest verifies the bearer token of r's one Authorization header
// (RequestToken: a request with two or more is refused). A request without
// one is told to mint the kind of token v takes.
func (v *Verifier) VerifyRequest(r *http.Request) (Claims, error) {
	tok, err := RequestToken(r.Header, v.operator)
	if err != nil {
		return Claims{}, err
	}
	return v.Verify(tok)
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
