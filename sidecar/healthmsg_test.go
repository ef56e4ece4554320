package sidecar

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestHealthAnswerErrorsSayWhatToFix: a health answer that is not
// 200 {"status":"ok"} leaves the connector not ready, and the error (the
// start-up failure, /ready, /sidecar/status) says what the sidecar
// expected, so that a connector author can fix it without reading the
// sidecar's code. A plain "OK" body used to read "HTTP 200: the connector
// is not ready: OK", and a refused token looked like any other not-ready
// answer.
func TestHealthAnswerErrorsSayWhatToFix(t *testing.T) {
	cases := []struct {
		name        string
		status      int
		contentType string
		body        string
		want        []string
		notWant     []string
	}{
		{name: "plain text OK", status: 200, contentType: "text/plain", body: "OK",
			want: []string{`200 {"status":"ok"}`, "this answer was: OK"}},
		{name: "status in the wrong case", status: 200, body: `{"status":"OK"}`,
			want: []string{`200 {"status":"ok"}`, `{"status":"OK"}`}},
		{name: "empty body", status: 200, body: "",
			want: []string{`200 {"status":"ok"}`, "(empty body)"}},
		{name: "not ready with a detail", status: 200, body: `{"status":"unavailable","detail":"the database is down"}`,
			want: []string{"not ready: the database is down"}, notWant: []string{`{"status":"ok"}`}},
		{name: "503 with a detail", status: 503, body: `{"status":"unavailable","detail":"warming up"}`,
			want: []string{"not ready: warming up"}, notWant: []string{`{"status":"ok"}`}},
		{name: "token refused", status: 401, body: `{"error":{"code":"notes.unauthorized","message":"bad token","category":"auth"}}`,
			want: []string{"Authorization: Bearer", EnvLocalToken, "--local-token-file", "notes.unauthorized: bad token"}},
		{name: "token forbidden", status: 403, contentType: "text/html", body: "<h1>Forbidden</h1>",
			want: []string{"Authorization: Bearer", EnvLocalToken, "<h1>Forbidden</h1>"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != PathLocalHealth {
					http.NotFound(w, r)
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				ct := tc.contentType
				if ct == "" {
					ct = "application/json"
				}
				w.Header().Set("Content-Type", ct)
				w.WriteHeader(tc.status)
				_, _ = io.WriteString(w, tc.body)
			}))
			t.Cleanup(srv.Close)
			l, err := NewLocal(LocalConfig{URL: srv.URL, Token: "s3cret"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(l.client.CloseIdleConnections)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			err = l.probe(ctx)
			if err == nil {
				t.Fatal("probe = nil; want a not-ready error")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(msg, w) {
					t.Errorf("error %q contains %q", msg, w)
				}
			}
		})
	}
}
