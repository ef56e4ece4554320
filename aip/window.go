package aip

import (
	"errors"
	"fmt"
	"time"
)

// Freshness bounds of signed lifecycle messages (both directions).
const (
	// MaxMessageLifetime bounds expires_at - issued_at.
	MaxMessageLifetime = 30 * time.Second
	// MaxFutureSkew bounds how far issued_at may be ahead of the verifier's clock.
	MaxFutureSkew = 5 * time.Second
)

// Freshness bounds of native envelopes, which a connector host's ingress
// applies: an envelope is accepted until MaxEnvelopeAge after its sent_at,
// and refused when sent_at is more than MaxEnvelopeSkew ahead of the host's
// clock. An envelope that has not arrived MaxEnvelopeAge + MaxEnvelopeSkew
// after it was sent never will be accepted.
const (
	MaxEnvelopeAge  = 5 * time.Minute
	MaxEnvelopeSkew = 5 * time.Minute
)

// Errors of CheckWindow; each is distinct.
var (
	ErrMessageExpired       = errors.New("aip: message expired")
	ErrMessageFromFuture    = errors.New("aip: message issued in the future beyond the accepted clock skew")
	ErrMessageLifetime      = errors.New("aip: message lifetime exceeds the maximum")
	ErrMessageWindowInvalid = errors.New("aip: message expires before it was issued")
)

// CheckWindow checks a signed message's freshness against now (the verifier's
// clock, injected so tests control it): issued_at at most MaxFutureSkew ahead,
// expires_at after issued_at and after now, lifetime at most
// MaxMessageLifetime.
func CheckWindow(now, issuedAt, expiresAt time.Time) error {
	switch {
	case issuedAt.After(now.Add(MaxFutureSkew)):
		return fmt.Errorf("%w: issued_at %s is more than %s after now (%s); check the sender's clock",
			ErrMessageFromFuture, At(issuedAt), MaxFutureSkew, At(now))
	case !expiresAt.After(issuedAt):
		return fmt.Errorf("%w: expires_at %s is not after issued_at %s", ErrMessageWindowInvalid, At(expiresAt), At(issuedAt))
	case expiresAt.Sub(issuedAt) > MaxMessageLifetime:
		return fmt.Errorf("%w: lifetime %s is longer than %s", ErrMessageLifetime, expiresAt.Sub(issuedAt), MaxMessageLifetime)
	case !expiresAt.After(now):
		return fmt.Errorf("%w: expires_at %s is not after now (%s); a sender signs each message just before it sends it, so this is a message held back or sent again too late, or the sender's clock behind the verifier's (check both clocks)",
			ErrMessageExpired, At(expiresAt), At(now))
	}
	return nil
}
