package provider

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// The values Auth sends never appear in an error, whether the provider
// echoes the header value or the token alone, in a Do or a Stream answer
// or in a redirect's Location.
func TestEchoedCredentialsAreRedacted(t *testing.T) {
	const key = "sk-live-0123456789abcdef"
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/redirect"):
			w.Header().Set("Location", "https://login.example/?key="+key)
			w.WriteHeader(http.StatusFound)
		default:
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprintf(w, `{"message":"header %q refused; key %s unknown"}`, r.Header.Get("Authorization"), key)
		}
	}, func(cfg *Config) {
		cfg.Auth = func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+key) }
	})
	check := func(what string, err error) {
		t.Helper()
		var pe *Error
		if !errors.As(err, &pe) {
			t.Fatalf("%s: %v", what, err)
		}
		if msg := pe.Error() + ProtocolError(pe).Message; strings.Contains(msg, key) || strings.Contains(msg, "0123456789abcdef") {
			t.Errorf("%s: the credential leaked: %s", what, msg)
		} else if !strings.Contains(msg, "[redacted]") {
			t.Errorf("%s: %s; want the echoed credential as [redacted]", what, msg)
		}
	}
	_, err := c.Do(t.Context(), Request{Method: "GET", Path: "/x"})
	check("Do", err)
	_, err = c.Stream(t.Context(), Request{Method: "POST", Path: "/x"}, time.Minute)
	check("Stream", err)
	_, err = c.Do(t.Context(), Request{Method: "GET", Path: "/redirect"})
	check("redirect", err)
}

// credentials lists the longest value first, so that a value holding
// another (a header value and its token) is redacted whole.
func TestCredentialsLongestFirst(t *testing.T) {
	got := credentials(func(r *http.Request) {
		r.Header.Set("X-Api-Key", "k3y!")
		r.URL.RawQuery = "sig=a-longer-signature"
		r.Header.Set("Authorization", "Bearer tok-12345")
	})
	want := []string{"a-longer-signature", "Bearer tok-12345", "tok-12345", "k3y!"}
	if !slices.Equal(got, want) {
		t.Errorf("credentials = %q, want %q", got, want)
	}
}
