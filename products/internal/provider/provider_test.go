package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseBaseURL(t *testing.T) {
	for _, tc := range []struct {
		raw              string
		allowPath, loose bool
		want, wantErr    string
	}{
		{raw: "https://app.chatwoot.com/", want: "https://app.chatwoot.com"},
		{raw: "http://127.0.0.1:3000", want: "http://127.0.0.1:3000"},
		{raw: "http://localhost:3000", want: "http://localhost:3000"},
		{raw: "http://[::1]:3000", want: "http://[::1]:3000"},
		{raw: "https://api.dify.ai/v1/", allowPath: true, want: "https://api.dify.ai/v1"},
		{raw: "http://10.0.0.5:3000", loose: true, want: "http://10.0.0.5:3000"},
		{raw: "", wantErr: "no URL given"},
		{raw: "ftp://x", wantErr: "want an http or https URL"},
		{raw: "https://", wantErr: "has no host"},
		{raw: "https://u:p@x.example", wantErr: "user information"},
		{raw: "https://x.example?a=1", wantErr: "query or fragment"},
		{raw: "https://x.example#f", wantErr: "query or fragment"},
		{raw: "https://api.dify.ai/v1", wantErr: "give the origin alone"},
		{raw: "http://chatwoot.example", wantErr: "use https"},
		{raw: "http://10.0.0.5:3000", wantErr: "use https"},
	} {
		u, err := ParseBaseURL("--x-base-url", tc.raw, tc.allowPath, tc.loose)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.HasPrefix(err.Error(), "--x-base-url: ") {
				t.Errorf("ParseBaseURL(%q) = %v, %v; want an error naming the setting and %q", tc.raw, u, err, tc.wantErr)
			}
			continue
		}
		if err != nil || u.String() != tc.want {
			t.Errorf("ParseBaseURL(%q) = %v, %v; want %s", tc.raw, u, err, tc.want)
		}
	}
}

func TestReadSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	s, err := ReadSecret("--token-file", write("ok", "tok-123\n", 0o600), nil)
	if err != nil || s.Reveal() != "tok-123" {
		t.Fatalf("ReadSecret = %q, %v", s.Reveal(), err)
	}
	for _, v := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v %s", s, s, s, s)} {
		if strings.Contains(v, "tok-123") {
			t.Fatalf("a secret printed as %q", v)
		}
	}
	if b, _ := json.Marshal(struct{ S Secret }{s}); strings.Contains(string(b), "tok-123") {
		t.Fatalf("a secret marshalled as %s", b)
	}
	for _, tc := range []struct{ path, want string }{
		{write("open", "tok", 0o644), "chmod 600"},
		{write("inner", "tok en", 0o600), "whitespace or a control character"},
		{filepath.Join(dir, "missing"), "missing does not exist"},
		{"", "no file given"},
	} {
		if _, err := ReadSecret("--token-file", tc.path, nil); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--token-file: ") {
			t.Errorf("ReadSecret(%s) = %v; want an error naming the setting and %q", tc.path, err, tc.want)
		}
	}
}

func newClient(t *testing.T, h http.HandlerFunc, edit func(*Config)) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	u, err := ParseBaseURL("base", srv.URL+"/api", true, false)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Product: "acme", BaseURL: u, UserAgent: "aipfleet-test",
		Auth: func(r *http.Request) { r.Header.Set("Authorization", "Bearer k") }}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestDo(t *testing.T) {
	var got *http.Request
	var gotBody string
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		b := make([]byte, r.ContentLength)
		r.Body.Read(b)
		gotBody = string(b)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":7}`)
	}, nil)
	var out struct{ ID int }
	err := c.JSON(t.Context(), Request{Method: "POST", Path: "/items/" + "a%2Fb",
		Query: map[string][]string{"q": {"x y"}}, Header: http.Header{"Idempotency-Key": {"k1"}},
		JSON: map[string]string{"name": "n"}}, &out)
	if err != nil || out.ID != 7 {
		t.Fatalf("JSON = %+v, %v", out, err)
	}
	if got.URL.EscapedPath() != "/api/items/a%2Fb" || got.URL.Query().Get("q") != "x y" {
		t.Errorf("request went to %s?%s", got.URL.EscapedPath(), got.URL.RawQuery)
	}
	for h, want := range map[string]string{"Authorization": "Bearer k", "Content-Type": "application/json",
		"User-Agent": "aipfleet-test", "Idempotency-Key": "k1", "Accept": "application/json"} {
		if got.Header.Get(h) != want {
			t.Errorf("header %s = %q, want %q", h, got.Header.Get(h), want)
		}
	}
	if gotBody != `{"name":"n"}` {
		t.Errorf("body %s", gotBody)
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		header     map[string]string
		body       string
		may        bool
		code       string
		retryable  bool
		retryAfter uint64
		message    string
	}{
		{"bad request", 400, nil, `{"message":"content is required"}`, false, CodeInvalidRequest, false, 0, "content is required"},
		{"unprocessable", 422, nil, `{"errors":["a","b"]}`, false, CodeInvalidRequest, false, 0, `["a","b"]`},
		// CrewAI AMP's ValidationError: what is missing is in details.
		{"validation details", 422, nil, `{"error":"Validation Error","message":"Missing required inputs","details":{"missing_inputs":["budget", "interests"]}}`,
			false, CodeInvalidRequest, false, 0, `Missing required inputs (details: {"missing_inputs":["budget","interests"]})`},
		{"empty details", 400, nil, `{"message":"bad","details":{}}`, false, CodeInvalidRequest, false, 0, `bad`},
		{"unauthorized", 401, nil, `{"error":"Invalid token"}`, false, CodeUnauthorized, false, 0, "Invalid token"},
		{"messages before the error class", 404, nil, `{"statusCode":404,"error":"NotFoundException","messages":["Object people2 not found"]}`, false, CodeNotFound, false, 0, "Object people2 not found"},
		{"forbidden", 403, nil, `{"error":{"message":"no access"}}`, false, CodeForbidden, false, 0, "no access"},
		{"not found", 404, nil, `not here`, false, CodeNotFound, false, 0, "not here"},
		{"conflict", 409, nil, `{}`, false, CodeConflict, false, 0, ""},
		{"rate limited", 429, map[string]string{"Retry-After": "3"}, ``, false, CodeRateLimited, true, 3000, ""},
		// Seconds that would overflow a time.Duration are capped, not
		// wrapped round to a negative or arbitrary wait.
		{"rate limited for centuries", 429, map[string]string{"Retry-After": "99999999999"}, ``, false, CodeRateLimited, true, 86_400_000, ""},
		{"server error", 502, nil, `{"detail":"upstream"}`, true, CodeUnavailable, true, 0, "upstream"},
		// A 501: the server does not offer what was asked, so it did none
		// of it (Hermes' job routes without cron); permanent.
		{"not implemented", 501, nil, `{"error":"Cron module not available"}`, false, CodeNotImplemented, false, 0, "Cron module not available"},
		// A 302 or 303 to a POST may answer a request the provider acted
		// on; a 301, 307 or 308 moves it elsewhere unprocessed.
		{"redirect after processing", 302, map[string]string{"Location": "https://elsewhere.example/"}, ``, true, CodeInvalidRequest, false, 0, "may have processed"},
		{"see other", 303, map[string]string{"Location": "/conversations/7"}, ``, true, CodeInvalidRequest, false, 0, "may have processed"},
		{"moved permanently", 301, map[string]string{"Location": "https://elsewhere.example/"}, ``, false, CodeInvalidRequest, false, 0, "not followed"},
		{"temporary redirect", 307, map[string]string{"Location": "https://elsewhere.example/"}, ``, false, CodeInvalidRequest, false, 0, "not followed"},
		{"permanent redirect", 308, map[string]string{"Location": "https://elsewhere.example/"}, ``, false, CodeInvalidRequest, false, 0, "not followed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}, nil)
			_, err := c.Do(t.Context(), Request{Method: "POST", Path: "/x"})
			var pe *Error
			if !errors.As(err, &pe) || pe.Status != tc.status || pe.MayHaveApplied != tc.may || !strings.Contains(pe.Message, tc.message) {
				t.Fatalf("Do = %#v", err)
			}
			perr := ProtocolError(pe)
			if perr.Code != tc.code || perr.IsRetryable() != tc.retryable || (tc.retryAfter != 0) != (perr.RetryAfterMS != nil) ||
				perr.RetryAfterMS != nil && *perr.RetryAfterMS != tc.retryAfter {
				t.Fatalf("ProtocolError = %+v", perr)
			}
			if strings.Contains(perr.Message, "Bearer k") {
				t.Fatal("the credential leaked into an error")
			}
		})
	}
}

func TestResponseBound(t *testing.T) {
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Repeat("x", 100))
	}, func(cfg *Config) { cfg.MaxResponseBytes = 99 })
	_, err := c.Do(t.Context(), Request{Method: "GET", Path: "/x"})
	var pe *Error
	if !errors.As(err, &pe) || !strings.Contains(pe.Message, "larger than the 99 bytes") || !pe.MayHaveApplied {
		t.Fatalf("oversized answer: %v", err)
	}
}

// A 501 did nothing whatever its body: one cut short or over the
// response bound is still the provider saying it does not offer the
// operation, so a mutation answered so is a failed
// provider.not_implemented, not outcome_unknown (as a 501 with a whole
// body is).
func TestNotImplementedWhateverItsBody(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		max     int64
	}{
		{"cut short", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusNotImplemented)
			fmt.Fprint(w, `{"error":"Cron mod`)
			w.(http.Flusher).Flush()
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}, 0},
		{"over the bound", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotImplemented)
			fmt.Fprint(w, strings.Repeat("x", 200))
		}, 99},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, tc.handler, func(cfg *Config) {
				if tc.max > 0 {
					cfg.MaxResponseBytes = tc.max
				}
			})
			_, err := c.Do(t.Context(), Request{Method: "POST", Path: "/x"})
			var pe *Error
			if !errors.As(err, &pe) || pe.MayHaveApplied {
				t.Fatalf("Do = %#v, want an *Error that did not apply", err)
			}
			if res, rerr := Result(call(), err, true); rerr != nil || res.Error.Code != CodeNotImplemented || res.Error.IsRetryable() {
				t.Fatalf("501 mutation: %+v, %v, want failed %s", res, rerr, CodeNotImplemented)
			}
		})
	}
}

func call() *hostsdk.Call {
	return &hostsdk.Call{Action: &aip.Action{ID: "act_1"}}
}

func TestResult(t *testing.T) {
	// A connection refused: nothing was sent, so even a mutation fails
	// (retryable) rather than being unknown.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	u, _ := ParseBaseURL("base", "http://"+addr, false, false)
	c, _ := New(Config{Product: "acme", BaseURL: u})
	_, err = c.Do(t.Context(), Request{Method: "POST", Path: "/x"})
	res, rerr := Result(call(), err, true)
	if rerr != nil || res.Status != aip.ResultFailed || res.Error.Code != CodeUnavailable || !res.Error.IsRetryable() {
		t.Fatalf("refused connection: %+v, %v", res, rerr)
	}

	// A connection dropped after the request was sent.
	dropped := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}, nil)
	_, err = dropped.Do(t.Context(), Request{Method: "POST", Path: "/x"})
	if _, rerr := Result(call(), err, true); !errors.Is(rerr, hostsdk.ErrOutcomeUnknown) {
		t.Fatalf("dropped mutation: %v, want ErrOutcomeUnknown", rerr)
	}
	if res, rerr := Result(call(), err, false); rerr != nil || res.Error.Code != CodeUnavailable || !res.Error.IsRetryable() {
		t.Fatalf("dropped read: %+v, %v", res, rerr)
	}

	// A timeout after sending is unknown for a mutation.
	slow := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}, func(cfg *Config) { cfg.Timeout = 50 * time.Millisecond })
	_, err = slow.Do(context.Background(), Request{Method: "POST", Path: "/x"})
	if _, rerr := Result(call(), err, true); !errors.Is(rerr, hostsdk.ErrOutcomeUnknown) {
		t.Fatalf("timed-out mutation: %v, want ErrOutcomeUnknown", rerr)
	}

	// A 4xx on a mutation is a plain failure; a 5xx is unknown.
	status := 400
	c4 := newClient(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }, nil)
	_, err = c4.Do(t.Context(), Request{Method: "POST", Path: "/x"})
	if res, rerr := Result(call(), err, true); rerr != nil || res.Error.Code != CodeInvalidRequest {
		t.Fatalf("400 mutation: %+v, %v", res, rerr)
	}
	status = 500
	_, err = c4.Do(t.Context(), Request{Method: "POST", Path: "/x"})
	if _, rerr := Result(call(), err, true); !errors.Is(rerr, hostsdk.ErrOutcomeUnknown) {
		t.Fatalf("500 mutation: %v, want ErrOutcomeUnknown", rerr)
	}
	status = 501
	_, err = c4.Do(t.Context(), Request{Method: "POST", Path: "/x"})
	if res, rerr := Result(call(), err, true); rerr != nil || res.Error.Code != CodeNotImplemented || res.Error.IsRetryable() {
		t.Fatalf("501 mutation: %+v, %v, want failed %s", res, rerr, CodeNotImplemented)
	}

	// The adapter's own errors pass through.
	own := errors.New("bad mapping")
	if res, rerr := Result(call(), own, true); res != nil || rerr != own {
		t.Fatalf("own error: %+v, %v", res, rerr)
	}
}

// sseServer answers a text/event-stream.
func sseHeader(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
}

// TestStream: a 2xx event stream is read as it arrives (the second event
// is only written once the first was read), with Do's request rules.
func TestStream(t *testing.T) {
	var got *http.Request
	var gotBody string
	firstRead := make(chan struct{})
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		got = r
		b := make([]byte, r.ContentLength)
		r.Body.Read(b)
		gotBody = string(b)
		sseHeader(w)
		fmt.Fprint(w, "data: one\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-firstRead:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "event: end\ndata: two\n\n")
	}, nil)
	s, err := c.Stream(t.Context(), Request{Method: "POST", Path: "/runs/" + "a%2Fb",
		Query: map[string][]string{"q": {"x y"}}, Header: http.Header{"Idempotency-Key": {"k1"}},
		JSON: map[string]string{"name": "n"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Status != 200 || !strings.HasPrefix(s.Header.Get("Content-Type"), "text/event-stream") {
		t.Errorf("stream %d %v", s.Status, s.Header)
	}
	if got.URL.EscapedPath() != "/api/runs/a%2Fb" || got.URL.Query().Get("q") != "x y" || gotBody != `{"name":"n"}` {
		t.Errorf("request went to %s?%s with %s", got.URL.EscapedPath(), got.URL.RawQuery, gotBody)
	}
	for h, want := range map[string]string{"Authorization": "Bearer k", "Content-Type": "application/json",
		"User-Agent": "aipfleet-test", "Idempotency-Key": "k1", "Accept": "text/event-stream"} {
		if got.Header.Get(h) != want {
			t.Errorf("header %s = %q, want %q", h, got.Header.Get(h), want)
		}
	}
	er := NewEventReader(s, 1<<10, 1<<20)
	ev, err := er.Next()
	if err != nil || ev.Name != "" || string(ev.Data) != "one" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	close(firstRead)
	ev, err = er.Next()
	if err != nil || ev.Name != "end" || string(ev.Data) != "two" {
		t.Fatalf("second event %+v, %v", ev, err)
	}
	if ev, err = er.Next(); err != io.EOF {
		t.Fatalf("after the end: %+v, %v", ev, err)
	}
}

// TestStreamErrors: an answer that is not a 2xx event stream is an
// *Error, with MayHaveApplied as Do sets it; a redirect is not followed.
func TestStreamErrors(t *testing.T) {
	var redirected int
	for _, tc := range []struct {
		name    string
		status  int
		header  map[string]string
		body    string
		may     bool
		code    string
		message string
	}{
		{"bad request", 400, nil, `{"status":400,"code":"invalid_param","message":"query is required"}`, false, CodeInvalidRequest, "query is required"},
		{"unauthorized", 401, nil, `{"error":{"message":"Invalid API key","type":"invalid_request_error"}}`, false, CodeUnauthorized, "Invalid API key"},
		{"rate limited", 429, map[string]string{"Retry-After": "2"}, ``, false, CodeRateLimited, ""},
		{"server error", 503, nil, `{"message":"try later"}`, true, CodeUnavailable, "try later"},
		{"long error body", 500, nil, strings.Repeat("x", MaxErrorBodyBytes*2), true, CodeUnavailable, "xxx"},
		{"redirect", 307, map[string]string{"Location": "/api/elsewhere"}, ``, false, CodeInvalidRequest, `redirect to "/api/elsewhere" not followed`},
		{"not an event stream", 200, map[string]string{"Content-Type": "application/json"}, `{"answer":"x"}`, true, CodeBadResponse, `answered "application/json" instead of an event stream`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/api/elsewhere" {
					redirected++
					sseHeader(w)
					return
				}
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				fmt.Fprint(w, tc.body)
			}, nil)
			s, err := c.Stream(t.Context(), Request{Method: "POST", Path: "/x"}, time.Minute)
			var pe *Error
			if !errors.As(err, &pe) || s != nil || pe.Status != tc.status || pe.MayHaveApplied != tc.may || !strings.Contains(pe.Message, tc.message) {
				t.Fatalf("Stream = %v, %#v", s, err)
			}
			if perr := ProtocolError(pe); perr.Code != tc.code || strings.Contains(perr.Message, "Bearer k") {
				t.Fatalf("ProtocolError = %+v", perr)
			}
			if tc.header["Retry-After"] != "" && pe.RetryAfter != 2*time.Second {
				t.Errorf("RetryAfter %s", pe.RetryAfter)
			}
		})
	}
	if redirected != 0 {
		t.Errorf("the redirect was followed %d times", redirected)
	}
}

// TestStreamOrJSON: StreamOrJSON asks for either answer and returns the
// event stream, or the JSON answer read whole within the response bound;
// another 2xx, or a JSON answer past the bound or cut short, may have
// applied.
func TestStreamOrJSON(t *testing.T) {
	var accept string
	answer := func(w http.ResponseWriter, r *http.Request) {
		accept = r.Header.Get("Accept")
		switch r.URL.Path {
		case "/api/sse":
			sseHeader(w)
			fmt.Fprint(w, "data: one\n\n")
		case "/api/json":
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			fmt.Fprint(w, `{"batch":"b1"}`)
		case "/api/large":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `{"batch":"`+strings.Repeat("x", 2048)+`"}`)
		case "/api/cut":
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Length", "4096")
			fmt.Fprint(w, `{"batch":`)
		case "/api/html":
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprint(w, "<html></html>")
		}
	}
	c := newClient(t, answer, func(cfg *Config) { cfg.MaxResponseBytes = 1024 })
	s, resp, err := c.StreamOrJSON(t.Context(), Request{Method: "POST", Path: "/sse"}, time.Minute)
	if err != nil || resp != nil || s == nil {
		t.Fatalf("event stream: %v %v %v", s, resp, err)
	}
	if ev, err := NewEventReader(s, 1<<10, 1<<20).Next(); err != nil || string(ev.Data) != "one" {
		t.Fatalf("event %+v, %v", ev, err)
	}
	s.Close()
	if accept != "text/event-stream, application/json" {
		t.Errorf("Accept %q", accept)
	}
	s, resp, err = c.StreamOrJSON(t.Context(), Request{Method: "POST", Path: "/json"}, time.Minute)
	if err != nil || s != nil || resp == nil || resp.Status != 200 || string(resp.Body) != `{"batch":"b1"}` {
		t.Fatalf("JSON answer: %v %+v %v", s, resp, err)
	}
	for path, want := range map[string]string{
		"/large": "larger than the 1024 bytes",
		"/cut":   "reading the 200 answer failed",
		"/html":  `answered "text/html" instead of an event stream (text/event-stream) or JSON`,
	} {
		s, resp, err = c.StreamOrJSON(t.Context(), Request{Method: "POST", Path: path}, time.Minute)
		var pe *Error
		if !errors.As(err, &pe) || s != nil || resp != nil || !pe.MayHaveApplied || !strings.Contains(pe.Message, want) {
			t.Errorf("%s: %v %v %#v, want an applied *Error saying %q", path, s, resp, err, want)
		}
	}
	// Stream itself still takes only an event stream.
	if _, err := c.Stream(t.Context(), Request{Method: "POST", Path: "/json"}, time.Minute); err == nil ||
		!strings.Contains(err.Error(), "instead of an event stream") {
		t.Errorf("Stream of a JSON answer: %v", err)
	}
}

// TestStreamNoAnswer: a refused connection sent nothing; a dropped one,
// or an answer that stayed silent past the idle bound, may have applied.
func TestStreamNoAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	u, _ := ParseBaseURL("base", "http://"+addr, false, false)
	refused, _ := New(Config{Product: "acme", BaseURL: u})
	_, err = refused.Stream(t.Context(), Request{Method: "POST", Path: "/x"}, time.Minute)
	var pe *Error
	if !errors.As(err, &pe) || pe.MayHaveApplied || pe.Status != 0 {
		t.Fatalf("refused: %#v", err)
	}
	if res, rerr := Result(call(), err, true); rerr != nil || res.Error.Code != CodeUnavailable {
		t.Fatalf("refused mutation: %+v, %v", res, rerr)
	}

	dropped := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}, nil)
	_, err = dropped.Stream(t.Context(), Request{Method: "POST", Path: "/x"}, time.Minute)
	if !errors.As(err, &pe) || !pe.MayHaveApplied {
		t.Fatalf("dropped: %#v", err)
	}
	if _, rerr := Result(call(), err, true); !errors.Is(rerr, hostsdk.ErrOutcomeUnknown) {
		t.Fatalf("dropped mutation: %v, want ErrOutcomeUnknown", rerr)
	}

	// Silent before the answer: Config.Timeout does not apply, idle does.
	silent := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}, func(cfg *Config) { cfg.Timeout = time.Nanosecond })
	_, err = silent.Stream(t.Context(), Request{Method: "POST", Path: "/x"}, 50*time.Millisecond)
	if !errors.As(err, &pe) || !pe.MayHaveApplied || !errors.Is(err, ErrIdle) || !strings.Contains(err.Error(), "(50ms)") {
		t.Fatalf("silent: %v", err)
	}

	// No idle bound needs a deadline.
	_, err = silent.Stream(context.Background(), Request{Method: "POST", Path: "/x"}, 0)
	if !errors.As(err, &pe) || pe.MayHaveApplied || !strings.Contains(pe.Message, "idle bound or a context deadline") {
		t.Fatalf("unbounded: %v", err)
	}
}

// TestStreamIdle: a stream that stays silent past the idle bound fails
// its read with ErrIdle; time the caller spends between reads does not
// count; ctx bounds the whole stream.
func TestStreamIdle(t *testing.T) {
	next := make(chan string)
	c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
		sseHeader(w)
		for {
			select {
			case s := <-next:
				fmt.Fprint(w, s)
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
		}
	}, nil)
	s, err := c.Stream(t.Context(), Request{Method: "GET", Path: "/x"}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	er := NewEventReader(s, 1<<10, 1<<20)
	next <- "data: a\n\n"
	if ev, err := er.Next(); err != nil || string(ev.Data) != "a" {
		t.Fatalf("first event %+v, %v", ev, err)
	}
	// The caller is busy for longer than the idle bound: the stream stays
	// open.
	time.Sleep(200 * time.Millisecond)
	next <- "data: b\n\n"
	if ev, err := er.Next(); err != nil || string(ev.Data) != "b" {
		t.Fatalf("after a busy caller %+v, %v", ev, err)
	}
	if ev, err := er.Next(); !errors.Is(err, ErrIdle) {
		t.Fatalf("silent stream: %+v, %v", ev, err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	s2, err := c.Stream(ctx, Request{Method: "GET", Path: "/x"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if _, err := NewEventReader(s2, 1<<10, 1<<20).Next(); err == nil || errors.Is(err, ErrIdle) || ctx.Err() == nil {
		t.Fatalf("deadline: %v", err)
	}
}

func TestEventReader(t *testing.T) {
	read := func(body string, maxEvent, maxTotal int64) ([]string, error) {
		er := NewEventReader(strings.NewReader(body), maxEvent, maxTotal)
		var got []string
		for {
			ev, err := er.Next()
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				return got, err
			}
			got = append(got, ev.Name+"|"+string(ev.Data))
		}
	}
	got, err := read(": ping\n\n:\r\nid: 7\nretry: 10\nevent: a\r\ndata: x\r\ndata:y\ndata\ndata:  z\nunknown: u\n\n"+
		"event: only-a-name\n\n"+
		"data: {\"b\":1}\n\n"+
		"data: cut", 1<<10, 1<<20)
	want := []string{"a|x\ny\n\n z", `|{"b":1}`}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("events %q, %v; want %q", got, err, want)
	}

	// One event, over several lines, is bounded; so is the whole stream.
	ev := "data: 0123456789\n" // 17 bytes
	if got, err := read(ev+"\n"+ev+ev+ev+"\n", 40, 1<<20); !errors.As(err, new(*BoundError)) ||
		!strings.Contains(err.Error(), "an event is larger than the 40 bytes allowed") || len(got) != 1 {
		t.Errorf("oversized event: %q, %v", got, err)
	}
	if _, err := read("data: "+strings.Repeat("x", 200<<10)+"\n\n", 100<<10, 1<<20); err == nil || !strings.Contains(err.Error(), "an event is larger") {
		t.Errorf("oversized line: %v", err)
	}
	var be *BoundError
	if got, err := read(strings.Repeat(ev+"\n", 10), 1<<10, 100); !errors.As(err, &be) || !be.Total ||
		!strings.Contains(err.Error(), "the event stream is larger than the 100 bytes allowed") || len(got) != 5 {
		t.Errorf("oversized stream: %q, %v", got, err)
	}
	// Exactly at the bounds is accepted.
	if got, err := read(ev+"\n", 18, 18); err != nil || len(got) != 1 {
		t.Errorf("at the bounds: %q, %v", got, err)
	}
	// Lines may end with a lone "\r" (the format allows it), mixed with
	// the other endings; an event framed so is exactly as bounded.
	if got, err := read("event: a\rdata: x\rdata: y\r\rdata: z\r\n\r\n: ping\r\rdata: w\n\r", 1<<10, 1<<20); err != nil ||
		strings.Join(got, ",") != "a|x\ny,|z,|w" {
		t.Errorf("lone CR endings: %q, %v", got, err)
	}
	if got, err := read("data: 0123456789\r\n\r\ndata: 0123456789\r\n\r\n", 20, 1<<20); err != nil || len(got) != 2 {
		t.Errorf("CRLF events at the bound: %q, %v", got, err)
	}
	// An event whose blank line is a lone "\r" is returned without
	// waiting for the next byte (a "\n" might follow, or nothing for a
	// long time).
	pr, pw := io.Pipe()
	defer pw.Close()
	first := make(chan string, 1)
	go func() {
		ev, err := NewEventReader(pr, 1<<10, 1<<20).Next()
		first <- string(ev.Data) + fmt.Sprint(err)
	}()
	if _, err := pw.Write([]byte("data: now\r\r")); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-first:
		if g != "now<nil>" {
			t.Errorf("event %q", g)
		}
	case <-time.After(10 * time.Second):
		t.Error("the event waited for the stream's next byte")
	}

	// Keep-alives: blocks without data (an event with only a name,
	// comment lines), counted; blank lines alone are not.
	ka := NewEventReader(strings.NewReader("event: ping\n\n\n\n: ping\r\n\r\ndata: x\n\nevent: ping\r\r:\n\ndata: y\n\n"), 1<<10, 1<<20)
	for i, want := range []int64{2, 4} {
		if ev, err := ka.Next(); err != nil || ka.KeepAlives() != want {
			t.Errorf("event %d %q, %v: %d keep-alives, want %d", i, ev.Data, err, ka.KeepAlives(), want)
		}
	}

	// Errors stick.
	er := NewEventReader(strings.NewReader(strings.Repeat("x", 50)+"\n\ndata: a\n\n"), 10, 1<<10)
	if _, err := er.Next(); err == nil {
		t.Fatal("oversized first event accepted")
	}
	if _, err := er.Next(); err == nil {
		t.Fatal("read on after an error")
	}
}

// TestMutationsAreNeverResent: when a reused keep-alive connection dies
// after a request was sent, net/http resends "idempotent" requests on its
// own, including any carrying an Idempotency-Key header. The client must
// never let it resend a mutation: the provider may have applied it.
func TestMutationsAreNeverResent(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		json   any
		header http.Header
		resent bool
	}{
		{"POST with a body and Idempotency-Key", "POST", map[string]int{"n": 1}, http.Header{"Idempotency-Key": {"k"}}, false},
		{"POST without a body with Idempotency-Key", "POST", nil, http.Header{"Idempotency-Key": {"k"}}, false},
		{"DELETE with X-Idempotency-Key", "DELETE", nil, http.Header{"X-Idempotency-Key": {"k"}}, false},
		{"PATCH with a body", "PATCH", map[string]int{"n": 1}, nil, false},
		{"GET (a read may be resent)", "GET", nil, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			arrivals := 0
			c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				mu.Lock()
				arrivals++
				n := arrivals
				mu.Unlock()
				if n == 2 { // the second request dies with its connection
					conn, _, _ := w.(http.Hijacker).Hijack()
					conn.Close()
					return
				}
				fmt.Fprint(w, `{}`)
			}, nil)
			// The first request leaves a keep-alive connection to reuse.
			if _, err := c.Do(t.Context(), Request{Method: "GET", Path: "/warm"}); err != nil {
				t.Fatal(err)
			}
			_, err := c.Do(t.Context(), Request{Method: tc.method, Path: "/x", JSON: tc.json, Header: tc.header})
			mu.Lock()
			got := arrivals
			mu.Unlock()
			if tc.resent {
				if got != 3 || err != nil {
					t.Fatalf("a read: %d arrivals, %v; want it resent once and answered", got, err)
				}
				return
			}
			var pe *Error
			if got != 2 || !errors.As(err, &pe) || !pe.MayHaveApplied {
				t.Fatalf("%d arrivals (want 2: never resent), error %v (want one that may have applied)", got, err)
			}
		})
	}
}

func TestReadJSONList(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	type entry struct {
		ID string `json:"id"`
	}
	got, err := ReadJSONList[entry]("--x-file", write("ok.json", `[{"id":"a"},{"id":"b"}]`, 0o644), 1<<20, 5, "{id}")
	if err != nil || len(got) != 2 || got[1].ID != "b" {
		t.Fatalf("ReadJSONList = %+v, %v", got, err)
	}
	cases := []struct{ path, want string }{
		{"", "no file given; name a file holding a JSON array of {id}"},
		{write("unknown.json", `[{"id":"a","extra":1}]`, 0o644), `is not a JSON array of {id}: json: unknown field "extra"`},
		{write("object.json", `{"id":"a"}`, 0o644), "is not a JSON array of {id}"},
		{write("trailing.json", `[{"id":"a"}] []`, 0o644), "has data after the JSON value; the file must hold a JSON array of {id} alone"},
		{write("empty.json", `[]`, 0o644), "lists 0 entries; give 1 to 5"},
		{write("many.json", `[{},{},{},{},{},{}]`, 0o644), "lists 6 entries; give 1 to 5"},
		{write("writable.json", `[{"id":"a"}]`, 0o666), "chmod go-w"},
		{write("large.json", `[{"id":"`+strings.Repeat("a", 64)+`"}]`, 0o644), "more than the"},
	}
	if os.Geteuid() == 0 {
		// The file names where the credential goes: its owner could send
		// it elsewhere, whatever the file's mode.
		p := write("others.json", `[{"id":"a"}]`, 0o644)
		if err := os.Chown(p, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct{ path, want string }{p, "owned by uid 4242"})
	}
	for _, tc := range cases {
		max := int64(1 << 20)
		if strings.HasSuffix(tc.path, "large.json") {
			max = 32
		}
		if strings.HasSuffix(tc.path, "writable.json") {
			os.Chmod(tc.path, 0o666) // past the umask
		}
		if _, err := ReadJSONList[entry]("--x-file", tc.path, max, 5, "{id}"); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "--x-file: ") {
			t.Errorf("%s: %v; want an error naming the setting and %q", tc.path, err, tc.want)
		}
	}
}

// A 302 or 303 to a read is a refusal like any redirect: a read changes
// nothing, whatever the provider did with it.
func TestRedirectOfAReadIsNotApplied(t *testing.T) {
	for _, status := range []int{http.StatusFound, http.StatusSeeOther} {
		c := newClient(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Location", "/login")
			w.WriteHeader(status)
		}, nil)
		_, err := c.Do(t.Context(), Request{Method: "GET", Path: "/x"})
		var pe *Error
		if !errors.As(err, &pe) || pe.MayHaveApplied || !strings.Contains(pe.Message, "not followed") {
			t.Fatalf("GET answered %d: %#v", status, err)
		}
	}
}

// ScopedIdempotencyKey keeps the keys of different tenants and of
// different capabilities apart, gives the same key again for the same
// action, and is always a header value every provider accepts.
func TestScopedIdempotencyKey(t *testing.T) {
	base := ScopedIdempotencyKey("tenant-a", "cap:x:run", "order-42")
	if again := ScopedIdempotencyKey("tenant-a", "cap:x:run", "order-42"); again != base {
		t.Errorf("the same action's key changed: %q, then %q", base, again)
	}
	for _, other := range [][3]string{
		{"tenant-b", "cap:x:run", "order-42"},
		{"tenant-a", "cap:x:chat", "order-42"},
		{"tenant-a", "cap:x:run", "order-43"},
		// The parts are not simply joined: moving a boundary changes it.
		{"tenant-", "acap:x:run", "order-42"},
		{"tenant-a", "cap:x:runo", "rder-42"},
	} {
		if k := ScopedIdempotencyKey(other[0], other[1], other[2]); k == base {
			t.Errorf("%q gives the key of (tenant-a, cap:x:run, order-42)", other)
		}
	}
	for _, key := range []string{"order-42", "line\nbreak", "", strings.Repeat("é", 300)} {
		k := ScopedIdempotencyKey("tenant-a", "cap:x:run", key)
		if !strings.HasPrefix(k, IdempotencyKeyPrefix) || len(k) != len(IdempotencyKeyPrefix)+64 {
			t.Errorf("key %q: %q is not the prefix and 64 hex digits", key, k)
		}
		for i := 0; i < len(k); i++ {
			if k[i] <= 0x20 || k[i] >= 0x7f {
				t.Fatalf("key %q: %q holds a character that is not visible ASCII", key, k)
			}
		}
		if strings.Contains(k, key) && key != "" {
			t.Errorf("key %q is sent as it is in %q", key, k)
		}
	}
}
