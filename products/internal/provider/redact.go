package provider

import (
	"cmp"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// credentials returns the values Auth puts in a request (header values
// and, for "<scheme> <token>" values such as "Bearer <key>", the token
// alone) and the other secrets the client sends, longest first, so that
// an answer echoing one of them can be redacted. Values shorter than 4
// bytes are left out: redacting them would garble messages and hide
// nothing.
func credentials(auth func(*http.Request), secrets []Secret) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 4 {
			out = append(out, s)
		}
	}
	for _, s := range secrets {
		add(s.Reveal())
	}
	if auth == nil {
		slices.SortFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
		return out
	}
	r := &http.Request{Header: http.Header{}, URL: &url.URL{}}
	auth(r)
	for _, vs := range r.Header {
		for _, v := range vs {
			add(v)
			if _, token, ok := strings.Cut(v, " "); ok {
				add(strings.TrimSpace(token))
			}
		}
	}
	for _, vs := range r.URL.Query() {
		for _, v := range vs {
			add(v)
		}
	}
	// Longest first: a header value holding a token is replaced whole.
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return out
}

// maxKnownCredentials bounds the credential values a client remembers
// to redact: past it, those of earlier rotations are forgotten.
const maxKnownCredentials = 64

// knownCredentials returns the credentials to redact: the values Auth and
// Config.Secrets give now, and those they gave before (a provider may
// echo the credential it refused after a rotation), longest first.
func (c *Client) knownCredentials() []string {
	now := credentials(c.cfg.Auth, c.cfg.Secrets)
	c.credMu.Lock()
	defer c.credMu.Unlock()
	if containsAll(c.creds, now) {
		return c.creds
	}
	merged := slices.Clone(c.creds)
	if len(merged)+len(now) > maxKnownCredentials {
		merged = nil
	}
	for _, s := range now {
		if !slices.Contains(merged, s) {
			merged = append(merged, s)
		}
	}
	slices.SortFunc(merged, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	c.creds = merged
	return merged
}

func containsAll(have, want []string) bool {
	for _, s := range want {
		if !slices.Contains(have, s) {
			return false
		}
	}
	return true
}

// redact replaces every credential of creds in s with [redacted].
func redact(creds []string, s string) string {
	for _, cred := range creds {
		s = strings.ReplaceAll(s, cred, "[redacted]")
	}
	return s
}
