package hostsdk

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// Error codes of the credential revision check (reference §5.5 step 6).
// Neither proves to the dispatcher that the action did not start here in
// the sense of a reroute (registry.IsRefusalCode): every replica of the
// instance reads the same policy, so the dispatcher answers them to its
// client (403 and 503) and settles the route cancelled.
const (
	// CodeCredentialRevisionDenied refuses an action or cancel whose
	// route's credential_revision_ref the policy revokes or does not list
	// (category auth, not retryable).
	CodeCredentialRevisionDenied = "connector_host.credential_revision_denied"
	// CodeCredentialRevisionUnavailable refuses an action or cancel while
	// the policy file cannot be read or is invalid (category temporary,
	// retryable after CredentialPolicyRetryAfter).
	CodeCredentialRevisionUnavailable = "connector_host.credential_revision_unavailable"
)

// CredentialPolicyRetryAfter is the retry hint of
// connector_host.credential_revision_unavailable.
const CredentialPolicyRetryAfter = time.Second

// credentialPolicy is the credential revision policy file
// (Config.CredentialRevisionPolicyFile): the revision that is current, the
// previous ones still accepted and the revoked ones. A member left out is
// null or empty.
type credentialPolicy struct {
	CurrentRevisionRef        *string  `json:"current_revision_ref"`
	AcceptedPreviousRevisions []string `json:"accepted_previous_revisions"`
	RevokedRevisions          []string `json:"revoked_revisions"`
}

// errCredentialDenied is the error of authorize for a revision the policy
// does not allow.
var errCredentialDenied = errors.New("credential revision denied")

// parseCredentialPolicy decodes and checks a policy: one JSON object with
// only the three members (by their exact names, each at most once), every
// revision 1 to MaxCredentialRevisionRefBytes bytes, and no revision in
// two of the three places. A revision listed twice in one list is the
// same revision.
func parseCredentialPolicy(raw []byte) (*credentialPolicy, error) {
	var p credentialPolicy
	if err := aip.DecodeStrict(raw, &p); err != nil {
		return nil, fmt.Errorf("not a credential revision policy (a JSON object with current_revision_ref, accepted_previous_revisions and revoked_revisions, and nothing else): %w", err)
	}
	where := map[string]string{}
	place := func(name, ref string) error {
		if ref == "" || len(ref) > MaxCredentialRevisionRefBytes {
			return fmt.Errorf("%s holds a revision of %d bytes; each must be 1 to %d bytes", name, len(ref), MaxCredentialRevisionRefBytes)
		}
		if prev, ok := where[ref]; ok && prev != name {
			return fmt.Errorf("revision %q is in both %s and %s; keep it in one of them (a revision has one place)", aip.TruncateUTF8(ref, 64), prev, name)
		}
		where[ref] = name
		return nil
	}
	if p.CurrentRevisionRef != nil {
		if err := place("current_revision_ref", *p.CurrentRevisionRef); err != nil {
			return nil, err
		}
	}
	for _, ref := range p.AcceptedPreviousRevisions {
		if err := place("accepted_previous_revisions", ref); err != nil {
			return nil, err
		}
	}
	for _, ref := range p.RevokedRevisions {
		if err := place("revoked_revisions", ref); err != nil {
			return nil, err
		}
	}
	return &p, nil
}

// authorize reports whether the policy allows a route pinned to the
// credential revision ref ("" for a route that pins none): a revoked
// revision is denied; the current one and the accepted previous ones are
// allowed; a route without a revision is allowed only when the policy has
// no current revision and accepts no previous one; any other revision is
// denied. A denial wraps errCredentialDenied.
func (p *credentialPolicy) authorize(ref string) error {
	for _, r := range p.RevokedRevisions {
		if r == ref {
			return fmt.Errorf("%w: revision %q is revoked", errCredentialDenied, aip.TruncateUTF8(ref, 64))
		}
	}
	if ref == "" {
		if p.CurrentRevisionRef == nil && len(p.AcceptedPreviousRevisions) == 0 {
			return nil
		}
		return fmt.Errorf("%w: the route pins no credential revision, and the policy names a current or accepted previous one", errCredentialDenied)
	}
	if p.CurrentRevisionRef != nil && *p.CurrentRevisionRef == ref {
		return nil
	}
	for _, r := range p.AcceptedPreviousRevisions {
		if r == ref {
			return nil
		}
	}
	return fmt.Errorf("%w: revision %q is neither the current one nor an accepted previous one", errCredentialDenied, aip.TruncateUTF8(ref, 64))
}

// readCredentialPolicy reads and checks the policy file with the host's
// rules for configuration files (aip.ReadTrustFile: a regular file, a
// symlink followed, not writable by group or others, owned by the host's
// user or root, 1 to MaxCredentialPolicyBytes bytes).
func readCredentialPolicy(path string) (*credentialPolicy, error) {
	raw, err := aip.ReadTrustFile(path, MaxCredentialPolicyBytes)
	if err != nil {
		return nil, err
	}
	p, err := parseCredentialPolicy(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// checkCredentialStartup is the start's check of the policy (bootstrap
// step 1): when Config.CredentialRevisionPolicyFile is set, the file must
// be readable and valid and authorize Config.CredentialRevisionRef (no
// revision when the host has no credential).
func (c *Config) checkCredentialStartup() error {
	if c.CredentialRevisionPolicyFile == "" {
		return nil
	}
	p, err := readCredentialPolicy(c.CredentialRevisionPolicyFile)
	if err != nil {
		return fmt.Errorf("%s: %w", settingName("CredentialRevisionPolicyFile"), err)
	}
	if err := p.authorize(c.CredentialRevisionRef); err != nil {
		what := fmt.Sprintf("the host's credential revision %s", settingName("CredentialRevisionRef"))
		fix := "make it the current_revision_ref or an accepted previous revision"
		if c.CredentialRevisionRef == "" {
			what = "a host without a credential revision (" + settingName("CredentialRevisionRef") + " unset)"
			fix = "give the host its credential, with the other credential settings, at the policy's current_revision_ref or an accepted previous revision; or, for a host without a credential, leave current_revision_ref null and accepted_previous_revisions empty"
		}
		return fmt.Errorf("%s %s does not authorize %s: %w; %s",
			settingName("CredentialRevisionPolicyFile"), c.CredentialRevisionPolicyFile, what, err, fix)
	}
	return nil
}

// checkCredentialRevision checks the route's credential revision against
// the policy file, read again now (reference §5.5 step 6). It returns nil
// when the host has no policy file or the policy allows the revision, else
// the HTTP status and the signed error to refuse the message with.
func (x *exchange) checkCredentialRevision(route *aip.ConnectorRoute) (int, *aip.ProtocolError) {
	h := x.h
	path := h.cfg.CredentialRevisionPolicyFile
	if path == "" {
		return 0, nil
	}
	ref := ""
	if route.CredentialRevisionRef != nil {
		ref = *route.CredentialRevisionRef
	}
	p, err := readCredentialPolicy(path)
	if err != nil {
		h.log.Error("the credential revision policy cannot be read; refusing actions and cancels until it can", "file", path, "error", err,
			"action_id", route.ActionID, "message_id", x.req.MessageID)
		return http.StatusServiceUnavailable, aip.NewProtocolError(CodeCredentialRevisionUnavailable, aip.CategoryTemporary, true,
			uint64(CredentialPolicyRetryAfter.Milliseconds()),
			"the replica's credential revision policy is unavailable; this message will never execute here")
	}
	if err := p.authorize(ref); err != nil {
		h.log.Warn("refused a message whose route's credential revision the policy does not allow", "error", err,
			"action_id", route.ActionID, "message_id", x.req.MessageID)
		return http.StatusForbidden, aip.NewProtocolError(CodeCredentialRevisionDenied, aip.CategoryAuth, false, 0,
			aip.TruncateUTF8("the route's credential revision is not authorized by the replica's credential revision policy ("+err.Error()+"); this message will never execute here", aip.MaxErrorMessageBytes))
	}
	return 0, nil
}
