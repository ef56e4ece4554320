package dispatch

import (
	"crypto/sha256"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/internal/tenanttoken"
)

// DefaultTokenCacheSize bounds the verified-token cache.
const DefaultTokenCacheSize = 4096

// maxTokenCacheAge bounds how long a verified token is trusted without
// verifying it again, whatever its expiry.
const maxTokenCacheAge = 5 * time.Minute

// tokenCache remembers tokens that verified, keyed by their SHA-256, until
// their expiry (at most maxTokenCacheAge): clients send the same token with
// every request, and an EdDSA verification costs more than the rest of the
// dispatcher's own work on an action. Failures are never cached. When the
// cache is full it starts over.
type tokenCache struct {
	verifier TokenVerifier
	now      func() time.Time
	max      int

	mu      sync.Mutex
	entries map[[sha256.Size]byte]cachedToken
}

type cachedToken struct {
	claims tenanttoken.Claims
	until  time.Time
}

func newTokenCache(v TokenVerifier, now func() time.Time, max int) *tokenCache {
	return &tokenCache{verifier: v, now: now, max: max, entries: make(map[[sha256.Size]byte]cachedToken)}
}

// Verify implements TokenVerifier.
func (c *tokenCache) Verify(token string) (tenanttoken.Claims, error) {
	key := sha256.Sum256([]byte(token))
	now := c.now()
	c.mu.Lock()
	e, ok := c.entries[key]
	c.mu.Unlock()
	if ok && now.Before(e.until) {
		return e.claims, nil
	}
	claims, err := c.verifier.Verify(token)
	if err != nil {
		return claims, err
	}
	until := now.Add(maxTokenCacheAge)
	if !claims.Expiry.IsZero() && claims.Expiry.Before(until) {
		until = claims.Expiry
	}
	c.mu.Lock()
	if len(c.entries) >= c.max {
		clear(c.entries)
	}
	c.entries[key] = cachedToken{claims: claims, until: until}
	c.mu.Unlock()
	return claims, nil
}
