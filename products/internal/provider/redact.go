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

// redact replaces every credential in s with [redacted].
func (c *Client) redact(s string) string {
	for _, cred := range c.creds {
		s = strings.ReplaceAll(s, cred, "[redacted]")
	}
	return s
}
