package provider

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
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

// A secret the client sends other than through Auth (Config.Secrets: a
// webhook signing secret in a request body) is redacted like Auth's
// credentials when the provider or a proxy echoes the request in an error
// body, at the clip too.
func TestConfigSecretsAreRedacted(t *testing.T) {
	const secret = "whsec-0123456789abcdef0123456789abcdef"
	pad := strings.Repeat("x", 500)
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/clip") {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, "%s %s", pad, body)
			return
		}
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, `{"message":"upstream refused the request body %s"}`, body)
	}, func(cfg *Config) {
		cfg.Auth = func(r *http.Request) { r.Header.Set("Authorization", "Bearer sk-other-key") }
		cfg.Secrets = []Secret{NewSecret(secret)}
	})
	for _, path := range []string{"/echo", "/clip"} {
		_, err := c.Do(t.Context(), Request{Method: "POST", Path: path, JSON: map[string]string{"secret": secret}})
		var pe *Error
		if !errors.As(err, &pe) {
			t.Fatalf("%s: %v", path, err)
		}
		if msg := pe.Error() + ProtocolError(pe).Message; strings.Contains(msg, "whsec-0123") {
			t.Errorf("%s: the secret leaked: %s", path, msg)
		} else if path == "/echo" && !strings.Contains(msg, "[redacted]") {
			t.Errorf("%s: %s; want the echoed secret as [redacted]", path, msg)
		}
	}
	if got := c.Redacted("secret " + secret); got != "secret [redacted]" {
		t.Errorf("Redacted = %q", got)
	}
}

// credentials lists the longest value first, so that a value holding
// another (a header value and its token) is redacted whole.
func TestCredentialsLongestFirst(t *testing.T) {
	got := credentials(func(r *http.Request) {
		r.Header.Set("X-Api-Key", "k3y!")
		r.URL.RawQuery = "sig=a-longer-signature"
		r.Header.Set("Authorization", "Bearer tok-12345")
	}, []Secret{NewSecret("whsec-1"), NewSecret("abc")})
	want := []string{"a-longer-signature", "Bearer tok-12345", "tok-12345", "whsec-1", "k3y!"}
	if !slices.Equal(got, want) {
		t.Errorf("credentials = %q, want %q", got, want)
	}
}

// A credential the provider echoes where its error message is clipped
// (past the first 512 bytes, in the message or in a body that is not
// JSON) is redacted before the clip: a clipped copy would not match the
// credential and would leak its start.
func TestCredentialAtTheClipIsRedacted(t *testing.T) {
	const key = "sk-live-0123456789abcdef0123456789abcdef"
	pad := strings.Repeat("x", 500)
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		if strings.HasSuffix(r.URL.Path, "/text") {
			fmt.Fprintf(w, "%s %s", pad, key)
			return
		}
		fmt.Fprintf(w, `{"message":"%s %s"}`, pad, key)
	}, func(cfg *Config) {
		cfg.Auth = func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+key) }
	})
	for _, path := range []string{"/json", "/text"} {
		for what, err := range map[string]error{
			"Do": func() error { _, err := c.Do(t.Context(), Request{Method: "POST", Path: path}); return err }(),
			"Stream": func() error {
				_, err := c.Stream(t.Context(), Request{Method: "POST", Path: path}, time.Minute)
				return err
			}(),
		} {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("%s %s: %v", what, path, err)
			}
			if msg := pe.Error(); strings.Contains(msg, "sk-live-") {
				t.Errorf("%s %s: the start of the credential leaked: …%s", what, path, msg[len(msg)-40:])
			}
		}
	}
}

// Redacted of a long text full of credentials: every copy the clipped
// message shows is redacted, however many redactions pulled text forward.
func TestRedactedLongText(t *testing.T) {
	const key = "sk-live-0123456789abcdef0123456789abcdef"
	c, err := New(Config{Product: "acme", BaseURL: &url.URL{Scheme: "https", Host: "acme.example"},
		Auth: func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+key) }})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{strings.Repeat(key+" ", 1000), strings.Repeat("é", 300) + key + strings.Repeat(key, 500)} {
		got := c.Redacted(s)
		if strings.Contains(got, "sk-live") || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || len(got) > MaxMessageBytes+len("…") {
			t.Errorf("Redacted = %q; want every credential redacted, valid UTF-8 clipped with …", got)
		}
	}
}
