package webhook

import (
	"log/slog"

	"github.com/aipfleet/aipfleet/internal/onchange"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Secrets are a route's signing secrets: Current, the one the product is
// given, and while the product switches to it from another, Previous
// (empty otherwise), so that the deliveries the product signed with the
// previous secret before the switch, or sends during it, are not refused
// (and lost: the products do not deliver a refused delivery again). Both
// verify equally; which is which matters only to the log, which tells the
// operator when Previous may go. Both are revealed for each delivery, so
// that a secret read from a file (provider.ReadSecret) is the one the
// file holds now: a secret rotated in its file verifies deliveries
// without a restart. A Secrets is safe for concurrent use
// and must not be copied after its first Verify.
type Secrets struct {
	// Current is the secret the product is given; Previous is empty
	// when there is no switch.
	Current, Previous provider.Secret
	// PreviousSetting names the setting that holds Previous
	// ("--chatwoot-webhook-previous-secret-file"), for the log lines.
	PreviousSetting string

	// used is "previous" after a delivery only Previous verified, ""
	// after one Current verified: a change is logged.
	used onchange.Text
}

// Verify reports whether match accepts Current or Previous. match
// compares the delivery's signature with the one a secret makes, in
// constant time; it is called for both secrets (when Previous is set)
// whatever the first answers, so the time taken does not say which
// verified. When neither verifies, the files of secrets read from files
// are checked at once (provider.Secret.Refresh: a stat, and a read when a
// file changed) and, if a value changed, both are tried again: a delivery signed with a secret just written to its file
// verifies without waiting for provider.SecretCheckInterval.
//
// A delivery only Previous verifies is logged at info with args when it
// follows one Current verified (or is the first): the product still signs
// with the previous secret. One Current verifies after such deliveries is
// logged at info too: the product has switched, and once no delivery
// needs Previous any more its setting can be removed. So a rotation logs
// a line or two, not one a delivery.
func (s *Secrets) Verify(log *slog.Logger, route string, match func(secret []byte) bool, args ...any) bool {
	current, previous := s.match(match)
	if !current && !previous && s.refresh() {
		// The secrets' files changed since they were last checked: an
		// operator rotated a secret, and the product may sign with the
		// new one already.
		current, previous = s.match(match)
	}
	switch {
	case current:
		if s.used.Changed("") {
			log.Info(route+": a delivery verified with the current webhook secret after some with the previous one: the product has switched; "+
				"once no more deliveries verify with the previous secret, remove "+s.PreviousSetting, args...)
		}
		return true
	case previous:
		if s.used.Changed("previous") {
			log.Info(route+": a delivery verified with the previous webhook secret ("+s.PreviousSetting+"): the product still signs with it; "+
				"keep that setting until the product signs with the current secret", args...)
		}
		return true
	}
	return false
}

// match tries both secrets.
func (s *Secrets) match(match func(secret []byte) bool) (current, previous bool) {
	current = match([]byte(s.Current.Reveal()))
	previous = !s.Previous.Empty() && match([]byte(s.Previous.Reveal()))
	return current, previous
}

// refresh checks the secrets' files and reports whether either value
// changed.
func (s *Secrets) refresh() bool {
	cur, prev := s.Current.Reveal(), s.Previous.Reveal()
	s.Current.Refresh()
	s.Previous.Refresh()
	return s.Current.Reveal() != cur || s.Previous.Reveal() != prev
}
