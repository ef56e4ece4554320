// Package provider is the HTTP client every product adapter uses to call
// its product's API, and the mapping of what happened to an AIP result.
//
// The client never follows redirects (a redirect is an error naming the
// location), accepts plain http only for loopback origins unless the
// adapter allows it explicitly, reads at most MaxResponseBytes of a
// response, and sends credentials only through the Auth function it is
// given (Config.Secrets names them, and the others an adapter puts in a
// request, such as a webhook signing secret in a body). Every credential
// it knows of is redacted from the provider text its errors quote.
// Secrets are held as Secret, which never prints; one read with
// ReadSecret follows its file, so that a credential an operator rotates
// is used without a restart, and a request the provider refuses 401 or
// 403 is sent once more when a credential of Config.Secrets changed. It
// never lets net/http resend a request whose method may change the
// provider (see neverResent): net/http would, after a dropped keep-alive
// connection, for any request carrying an Idempotency-Key header.
//
// Client.Stream sends a request the same way and returns the open body of
// a text/event-stream answer, bounded by the caller's context and an idle
// bound rather than Config.Timeout (Client.StreamOrJSON also takes a JSON
// answer, for operations documented to give either); EventReader reads
// its Server-Sent Events within a per-event and a whole-stream byte bound.
//
// Errors are *Error values that record whether the request may have
// reached the provider (Error.MayHaveApplied). Result turns an error into
// the right AIP outcome: a read that failed is a failed result (retryable
// when the provider was unavailable or rate limited); a mutation that may
// have been applied is outcome_unknown (hostsdk.ErrOutcomeUnknown), which
// the host journals and never runs again; a mutation the provider refused
// with a 4xx, or a 501 (it does not offer the operation), is a failed
// result.
//
// Targets keeps the health of the several targets (crews, endpoints) an
// adapter fronts, so that one failing its check refuses its own actions
// rather than taking the whole replica out.
package provider

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Defaults of Config.
const (
	DefaultMaxResponseBytes = 8 << 20
	DefaultTimeout          = 60 * time.Second
	// MaxSecretBytes bounds a credential file.
	MaxSecretBytes = aip.MaxSecretFileBytes
)

// ParseBaseURL checks a provider base URL: http or https, a host, no user
// information, query or fragment. With allowPath false only an origin is
// accepted (a trailing slash is dropped). Plain http is accepted for
// loopback hosts (localhost, 127.0.0.0/8, ::1), or anywhere when
// allowInsecure is set. what names the setting in errors.
func ParseBaseURL(what, raw string, allowPath, allowInsecure bool) (*url.URL, error) {
	if raw == "" {
		if allowPath {
			return nil, fmt.Errorf("%s: no URL given; give the base URL of the API", what)
		}
		return nil, fmt.Errorf("%s: no URL given; give the origin of the API (scheme, host and port)", what)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %q is not a URL: %v", what, raw, err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("%s: %q: want an http or https URL", what, raw)
	case u.Host == "":
		return nil, fmt.Errorf("%s: %q has no host", what, raw)
	case u.User != nil:
		return nil, fmt.Errorf("%s: %q carries user information; credentials go in their own file setting", what, raw)
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		return nil, fmt.Errorf("%s: %q has a query or fragment; give the base URL alone", what, raw)
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	u.RawPath = ""
	if !allowPath && u.Path != "" {
		return nil, fmt.Errorf("%s: %q has a path; give the origin alone (scheme, host and port)", what, raw)
	}
	if u.Scheme == "http" && !allowInsecure && !IsLoopback(u.Hostname()) {
		return nil, fmt.Errorf("%s: %q uses plain http to a host that is not loopback; use https", what, raw)
	}
	return u, nil
}

// IsLoopback reports whether host is localhost or a loopback address.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Config configures a Client.
type Config struct {
	// Product names the provider in errors ("chatwoot").
	Product string
	// BaseURL is checked with ParseBaseURL by the adapter; request paths
	// are appended to it.
	BaseURL *url.URL
	// MaxResponseBytes bounds a response body (0: DefaultMaxResponseBytes).
	MaxResponseBytes int64
	// Timeout bounds one request of Do and JSON (0: DefaultTimeout); the
	// action's context bounds it too. It does not apply to Stream.
	Timeout time.Duration
	// UserAgent is sent with every request.
	UserAgent string
	// Auth adds the credentials to a request.
	Auth func(*http.Request)
	// Secrets are the credentials the client may send: those Auth
	// sends, and others (a webhook signing secret in a request body).
	// Like the values Auth sends, they are redacted from every error
	// message (values shorter than 4 bytes are left out), the values
	// they held before a change too. When the provider answers a request
	// 401 or 403, the client reads their files again and, when one of
	// them changed since the request was built, sends the request once
	// more (with its own Timeout): an operator rotated the credential
	// (see ReadSecret) and the provider no longer takes the one sent. So
	// an adapter lists here the Secret its Auth sends.
	Secrets []Secret
	// Transport is the round tripper (nil: a clone of
	// http.DefaultTransport).
	Transport http.RoundTripper
}

// Client calls one provider.
type Client struct {
	cfg  Config
	http *http.Client

	credMu sync.Mutex
	// creds are the values Auth sends and Config.Secrets, now and before
	// a rotation (see knownCredentials), redacted from error messages (a
	// provider or a proxy may echo them in an error body), longest
	// first. The slice is replaced, never changed in place.
	creds []string
}

// New returns a client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.BaseURL == nil {
		return nil, fmt.Errorf("provider %s: no base URL", cfg.Product)
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	rt := cfg.Transport
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &Client{cfg: cfg, creds: credentials(cfg.Auth, cfg.Secrets), http: &http.Client{
		Transport: rt,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}}, nil
}

// Product returns the provider's name.
func (c *Client) Product() string { return c.cfg.Product }

// Request is one call.
type Request struct {
	Method string
	// Path is appended to the base URL's path; it must start with "/".
	// It is an escaped path: escape caller-given segments with
	// url.PathEscape.
	Path   string
	Query  url.Values
	Header http.Header
	// JSON, when not nil, is marshalled as the body
	// (Content-Type: application/json). Body is used otherwise.
	JSON any
	Body []byte
	// ContentType goes with Body.
	ContentType string
}

// Response is a provider's answer with a 2xx status.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// Decode unmarshals the body into v.
func (r *Response) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("provider answered %d with a body that is not the expected JSON: %w", r.Status, err)
	}
	return nil
}

// MaxRetryAfter caps a provider's Retry-After: a longer wait is reported
// as this one.
const MaxRetryAfter = 24 * time.Hour

// Error is a call that did not end in a 2xx answer.
type Error struct {
	Product string
	Method  string
	Path    string
	// Status is the provider's HTTP status, 0 when there was no answer.
	Status int
	// Message is what the provider said (its error message when the body
	// is JSON with one, else the start of the body), or what went wrong.
	Message string
	// RetryAfter is the provider's Retry-After (seconds, or an HTTP date
	// taken relative to this host's clock), when it sent one, at most
	// MaxRetryAfter.
	RetryAfter time.Duration
	// MayHaveApplied is true when the request may have reached the
	// provider and been acted on: there was no answer after the request
	// began to be sent, or the answer was a 5xx, or a 2xx or 5xx answer
	// could not be read (a redirect or a 4xx is a refusal even when its
	// body is cut short).
	MayHaveApplied bool
	Err            error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s: ", e.Product, e.Method, e.Path)
	if e.Status != 0 {
		fmt.Fprintf(&b, "answered %d", e.Status)
		if e.Message != "" {
			b.WriteString(": ")
		}
	}
	b.WriteString(e.Message)
	if e.Err != nil && e.Status == 0 {
		fmt.Fprintf(&b, ": %v", e.Err)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Do sends req and returns the 2xx answer, or an *Error. A request the
// provider answers 401 or 403 is sent once more when one of
// Config.Secrets changed meanwhile (see Config.Secrets).
func (c *Client) Do(ctx context.Context, req Request) (*Response, error) {
	gen := c.secretsGeneration()
	resp, err := c.do(ctx, req)
	if c.credentialsRotated(err, gen) {
		resp, err = c.do(ctx, req)
	}
	return resp, err
}

// secretsGeneration sums the generations of Config.Secrets: it changes
// when one of them takes a new value.
func (c *Client) secretsGeneration() uint64 {
	var n uint64
	for _, s := range c.cfg.Secrets {
		n += s.generation()
	}
	return n
}

// credentialsRotated reports whether err is the provider refusing a
// request as unauthenticated or forbidden (401, 403) and one of
// Config.Secrets changed since the request was built (their generation
// was gen then), once their files are read again: the provider refused the
// credential an operator has replaced, so the request, refused and so
// not acted on, may be sent once more with the new one.
func (c *Client) credentialsRotated(err error, gen uint64) bool {
	var pe *Error
	if !errors.As(err, &pe) || (pe.Status != http.StatusUnauthorized && pe.Status != http.StatusForbidden) {
		return false
	}
	for _, s := range c.cfg.Secrets {
		s.reread()
	}
	return c.secretsGeneration() != gen
}

func (c *Client) do(ctx context.Context, req Request) (*Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	hr, err := c.newRequest(ctx, req, "application/json")
	if err != nil {
		return nil, err
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, c.fail(req, 0, !notSent(err), "no answer", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.cfg.MaxResponseBytes+1))
	if err != nil {
		if refusal(resp.StatusCode) {
			return nil, c.refused(req, resp, data)
		}
		return nil, c.fail(req, 0, true, fmt.Sprintf("reading the %d answer failed", resp.StatusCode), err)
	}
	if int64(len(data)) > c.cfg.MaxResponseBytes {
		return nil, c.fail(req, resp.StatusCode, resp.StatusCode >= 200 && resp.StatusCode < 300 || mayHaveApplied5xx(resp.StatusCode),
			fmt.Sprintf("answer is larger than the %d bytes allowed (raise the max response bytes setting)", c.cfg.MaxResponseBytes), nil)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
	}
	return nil, c.refused(req, resp, data)
}

// fail builds the *Error of req.
func (c *Client) fail(req Request, status int, may bool, msg string, err error) *Error {
	return &Error{Product: c.cfg.Product, Method: req.Method, Path: req.Path, Status: status,
		Message: redact(c.knownCredentials(), msg), MayHaveApplied: may, Err: err}
}

// newRequest builds the HTTP request of req: the path appended to the
// base URL's, the query, the body, the caller's headers, then
// Content-Type, Accept, User-Agent and the credentials.
func (c *Client) newRequest(ctx context.Context, req Request, accept string) (*http.Request, error) {
	if !strings.HasPrefix(req.Path, "/") {
		return nil, c.fail(req, 0, false, "request path must start with /", nil)
	}
	u := *c.cfg.BaseURL
	escaped := c.cfg.BaseURL.EscapedPath() + req.Path
	unescaped, err := url.PathUnescape(escaped)
	if err != nil {
		return nil, c.fail(req, 0, false, "request path is not a valid escaped path", err)
	}
	u.Path, u.RawPath = unescaped, escaped
	u.RawQuery = req.Query.Encode()
	body, ctype := req.Body, req.ContentType
	if req.JSON != nil {
		b, err := json.Marshal(req.JSON)
		if err != nil {
			return nil, c.fail(req, 0, false, "encode request body", err)
		}
		body, ctype = b, "application/json"
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, u.String(), rd)
	if err != nil {
		return nil, c.fail(req, 0, false, "build request", err)
	}
	for k, vs := range req.Header {
		hr.Header[k] = vs
	}
	if ctype != "" {
		hr.Header.Set("Content-Type", ctype)
	}
	hr.Header.Set("Accept", accept)
	if c.cfg.UserAgent != "" {
		hr.Header.Set("User-Agent", c.cfg.UserAgent)
	}
	if c.cfg.Auth != nil {
		c.cfg.Auth(hr)
	}
	neverResent(hr)
	return hr, nil
}

// neverResent keeps net/http from sending a request that may change the
// provider a second time. http.Transport resends a request on its own when
// a reused keep-alive connection fails before the answer, if the request
// is "idempotent" (GET, HEAD, OPTIONS, TRACE, or any request carrying an
// Idempotency-Key or X-Idempotency-Key header) and has no body or can
// rebuild it (GetBody). The provider may have acted on the first copy, and
// most providers do not deduplicate by that header, so for every other
// method the body cannot be rebuilt, and a bodyless request that carries
// such a header gets an empty body, which makes it not replayable (it is
// sent as an empty chunked body, or none for DELETE). The failure then
// reaches the adapter, and a mutation is recorded outcome_unknown.
func neverResent(hr *http.Request) {
	switch hr.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return
	}
	hr.GetBody = nil
	_, key := hr.Header["Idempotency-Key"]
	_, xkey := hr.Header["X-Idempotency-Key"]
	if (hr.Body == nil || hr.Body == http.NoBody) && (key || xkey) {
		hr.Body = io.NopCloser(strings.NewReader(""))
	}
}

// refused builds the *Error of an answer that is not a 2xx, whose body
// (or its start) is data: a redirect is not followed, and was not applied
// unless it is a 302 or 303 to a mutation (processedRedirect); a 4xx was
// not applied; a 5xx may have been, except a 501 (RFC 9110 §15.6.2: the
// server does not support what the request asks, so it did none of it;
// Hermes answers it to its job routes where cron is not available).
func (c *Client) refused(req Request, resp *http.Response, data []byte) *Error {
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		if processedRedirect(req.Method, resp.StatusCode) {
			return c.fail(req, resp.StatusCode, true,
				fmt.Sprintf("%d redirect to %q after a %s, not followed: the provider may have processed the request (a 302 or 303 is how a web application answers a request it acted on); point the base URL at the API itself",
					resp.StatusCode, resp.Header.Get("Location"), req.Method), nil)
		}
		return c.fail(req, resp.StatusCode, false,
			fmt.Sprintf("redirect to %q not followed; point the base URL at the API itself", resp.Header.Get("Location")), nil)
	}
	e := c.fail(req, resp.StatusCode, mayHaveApplied5xx(resp.StatusCode), c.Redacted(providerMessage(data)), nil)
	if s := resp.Header.Get("Retry-After"); s != "" {
		e.RetryAfter = ParseRetryAfter(s, time.Now())
	}
	return e
}

// ParseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3): delay
// seconds, or an HTTP date, taken relative to now. It returns 0 for a
// value it cannot read or a date not after now, and at most
// MaxRetryAfter.
func ParseRetryAfter(s string, now time.Time) time.Duration {
	s = strings.TrimSpace(s)
	if s != "" && s[0] >= '0' && s[0] <= '9' {
		n := int64(0)
		for _, ch := range s {
			if ch < '0' || ch > '9' {
				return 0
			}
			// Capped in seconds as it is read: a larger wait (or one of
			// more digits than an int64 holds) would overflow.
			n = min(n*10+int64(ch-'0'), int64(MaxRetryAfter/time.Second))
		}
		return time.Duration(n) * time.Second
	}
	at, err := http.ParseTime(s)
	if err != nil || !at.After(now) {
		return 0
	}
	return min(at.Sub(now), MaxRetryAfter)
}

// IdempotencyKeyPrefix starts every provider-side idempotency key
// ScopedIdempotencyKey derives.
const IdempotencyKeyPrefix = "aip1-"

// ScopedIdempotencyKey is the Idempotency-Key header value a provider gets
// for an action of tenantID on capabilityID whose AIP idempotency key is
// key: IdempotencyKeyPrefix and the hex SHA-256 of the JSON array
// [tenantID, capabilityID, key] (69 visible ASCII characters).
//
// The caller's key is never sent as it is. A provider deduplicates by the
// key within its own scope — Hermes Agent per API credential — and one
// provider deployment and credential may serve the hosts of several
// tenants: two tenants that chose the same key would otherwise be answered
// each other's stored result (or a conflict). The tenant and the
// capability (which names the product's endpoint and operation) are part
// of the digest, so keys of different tenants or different operations
// never meet, and the same action sent again — another action ID with the
// same key, on any replica or instance of the tenant — gets the same
// value. The connector instance is deliberately not part of it: the AIP
// key is the tenant's, and a retry may reach another instance. The
// digest also keeps control characters (which net/http refuses to send,
// leaving a mutation that was never sent outcome_unknown) and over-long
// keys out of the header.
func ScopedIdempotencyKey(tenantID, capabilityID, key string) string {
	// A JSON array of strings is an unambiguous encoding of the three.
	raw, _ := json.Marshal([]string{tenantID, capabilityID, key})
	sum := sha256.Sum256(raw)
	return IdempotencyKeyPrefix + hex.EncodeToString(sum[:])
}

// CallIdempotencyKey is ScopedIdempotencyKey of call: its tenant, its
// capability and its idempotency key.
func CallIdempotencyKey(call *hostsdk.Call) string {
	return ScopedIdempotencyKey(call.Tenant.TenantID, call.Action.CapabilityID, call.IdempotencyKey)
}

// processedRedirect reports whether a redirect answering a request of
// method may follow its processing: a 302 or 303 to a request that is not
// safe (POST, PUT, PATCH, DELETE) is how a web application answers one it
// acted on ("see other"), so a mutation answered so may have applied. A
// 301, 307 or 308 — a proxy or server moving the whole API elsewhere, the
// usual reason a base URL gets a redirect — sends the request on
// unprocessed.
func processedRedirect(method string, status int) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return status == http.StatusFound || status == http.StatusSeeOther
}

// refusal reports whether status says the request was not acted on (a
// redirect, a 4xx or a 501), whatever its body: an answer whose body is
// cut short is still that refusal.
func refusal(status int) bool {
	return status >= 300 && status < 500 || status == http.StatusNotImplemented
}

// mayHaveApplied5xx reports whether status is a server error after which
// the request may have been acted on: any 5xx but a 501 (RFC 9110
// §15.6.2: the server does not support what the request asks, so it did
// none of it, and asking again gets the same answer).
func mayHaveApplied5xx(status int) bool {
	return status >= 500 && status != http.StatusNotImplemented
}

// JSON sends req and decodes a 2xx answer into out (nil: ignore the body).
func (c *Client) JSON(ctx context.Context, req Request, out any) error {
	resp, err := c.Do(ctx, req)
	if err != nil {
		return err
	}
	if out == nil || len(bytes.TrimSpace(resp.Body)) == 0 {
		return nil
	}
	if err := resp.Decode(out); err != nil {
		return &Error{Product: c.cfg.Product, Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: err.Error(), MayHaveApplied: true, Err: err}
	}
	return nil
}

// notSent reports whether err happened before any byte of the request
// could have reached the provider: the name did not resolve or the
// connection was refused.
func notSent(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// providerMessage extracts a readable message from an error body: the
// first of message, messages (a list, as Twenty sends next to an error
// class name in error), error (a string, or an object with a message),
// errors (a list), description or detail in a JSON object, followed by the
// object's details when it has them (CrewAI AMP's validation error names
// the missing inputs there: {"message": "Missing required inputs",
// "details": {"missing_inputs": [...]}}), else the text. It is not
// clipped: Redacted clips it after redacting, so that a credential the
// clip would cut is still found.
func providerMessage(body []byte) string {
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) != nil {
		return strings.TrimSpace(string(body))
	}
	msg := objectMessage(obj)
	if msg == "" {
		return strings.TrimSpace(string(body))
	}
	if d := bytes.TrimSpace(obj["details"]); len(d) > 0 && (d[0] == '{' || d[0] == '[') && !isEmptyJSON(d) {
		var compact bytes.Buffer
		if json.Compact(&compact, d) == nil {
			msg += " (details: " + compact.String() + ")"
		}
	}
	return msg
}

// objectMessage is the message of an error object (see providerMessage),
// "" when it has none.
func objectMessage(obj map[string]json.RawMessage) string {
	for _, k := range []string{"message", "messages", "error", "errors", "description", "detail"} {
		raw, ok := obj[k]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) == nil && s != "" {
			return s
		}
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(raw, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
		var list []any
		if json.Unmarshal(raw, &list) == nil && len(list) > 0 {
			b, _ := json.Marshal(list)
			return string(b)
		}
	}
	return ""
}

// isEmptyJSON reports whether raw is an empty object or array.
func isEmptyJSON(raw []byte) bool {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return true
	}
	switch v := v.(type) {
	case map[string]any:
		return len(v) == 0
	case []any:
		return len(v) == 0
	}
	return true
}

// MaxMessageBytes bounds the provider text an error message carries.
const MaxMessageBytes = 512

// Redacted makes s, text the provider answered (an error message, a body
// that is not what was expected), fit for an error message or a log:
// every credential the client sends replaced by [redacted], then at most
// MaxMessageBytes bytes, never half a UTF-8 sequence, and "…" when
// clipped. Redaction comes first: a credential the clip cut in two would
// no longer match, and its start would be shown.
func (c *Client) Redacted(s string) string {
	// Only the start of s can reach the clipped message, but redaction
	// shortens a credential to "[redacted]" and pulls later text into the
	// first MaxMessageBytes: with at most MaxMessageBytes/len("[redacted]")
	// redactions there, the text the clip keeps comes from the first
	// MaxMessageBytes + (that many + 1) credential lengths of s.
	creds := c.knownCredentials()
	longest := 0
	for _, cred := range creds {
		longest = max(longest, len(cred))
	}
	n := MaxMessageBytes + (MaxMessageBytes/len("[redacted]")+1)*longest
	if len(s) <= n {
		return clip(redact(creds, s))
	}
	out := clip(redact(creds, s[:n]))
	if !strings.HasSuffix(out, "…") {
		out += "…"
	}
	return out
}

func clip(s string) string {
	if len(s) <= MaxMessageBytes {
		return s
	}
	cut := MaxMessageBytes
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// Error codes of failed results built from provider errors.
const (
	CodeInvalidRequest = "provider.invalid_request"
	CodeUnauthorized   = "provider.unauthorized"
	CodeForbidden      = "provider.forbidden"
	CodeNotFound       = "provider.not_found"
	CodeConflict       = "provider.conflict"
	CodeRateLimited    = "provider.rate_limited"
	CodeUnavailable    = "provider.unavailable"
	CodeBadResponse    = "provider.bad_response"
	// CodeNotImplemented: the provider answered 501, it does not offer
	// the operation (as deployed); nothing was applied, and a retry gets
	// the same answer until its operator enables it.
	CodeNotImplemented = "provider.not_implemented"
)

// Result turns the error of a provider call into the action's outcome.
// mutation says whether the call changes the provider's state. It
// returns, in this order of precedence:
//   - for a mutation that may have been applied, an error wrapping
//     hostsdk.ErrOutcomeUnknown (the host journals outcome_unknown and
//     never runs the action again);
//   - for any other *Error, a failed result with a provider.* code;
//   - for an error that is not an *Error (the adapter's own), the error,
//     which the host records as a failed result (connector.failed).
func Result(call *hostsdk.Call, err error, mutation bool) (*aip.ActionResult, error) {
	var pe *Error
	if !errors.As(err, &pe) {
		return nil, err
	}
	if mutation && pe.MayHaveApplied {
		return nil, fmt.Errorf("%w: %v", hostsdk.ErrOutcomeUnknown, pe)
	}
	return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed, Error: ProtocolError(pe)}, nil
}

// ProtocolError classifies a provider error as an AIP error.
func ProtocolError(pe *Error) *aip.ProtocolError {
	msg := pe.Error()
	var retryAfter uint64
	if pe.RetryAfter > 0 {
		retryAfter = uint64(pe.RetryAfter.Milliseconds())
	}
	switch s := pe.Status; {
	case s == 0:
		return aip.NewProtocolError(CodeUnavailable, aip.CategoryTransport, true, 0, msg)
	case s == http.StatusUnauthorized:
		return aip.NewProtocolError(CodeUnauthorized, aip.CategoryAuth, false, 0, msg)
	case s == http.StatusForbidden:
		return aip.NewProtocolError(CodeForbidden, aip.CategoryAuth, false, 0, msg)
	case s == http.StatusNotFound:
		return aip.NewProtocolError(CodeNotFound, aip.CategoryPermanent, false, 0, msg)
	case s == http.StatusConflict:
		return aip.NewProtocolError(CodeConflict, aip.CategoryPermanent, false, 0, msg)
	case s == http.StatusTooManyRequests:
		return aip.NewProtocolError(CodeRateLimited, aip.CategoryTemporary, true, retryAfter, msg)
	case s == http.StatusNotImplemented:
		return aip.NewProtocolError(CodeNotImplemented, aip.CategoryPermanent, false, 0, msg)
	case s >= 500 || s == http.StatusRequestTimeout:
		return aip.NewProtocolError(CodeUnavailable, aip.CategoryTemporary, true, retryAfter, msg)
	case s >= 200 && s < 300:
		return aip.NewProtocolError(CodeBadResponse, aip.CategoryConnector, false, 0, msg)
	default:
		return aip.NewProtocolError(CodeInvalidRequest, aip.CategoryPermanent, false, 0, msg)
	}
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields
// and anything after the value (ErrTrailingData).
func DecodeStrict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ErrTrailingData
	}
	return nil
}

// ErrTrailingData is DecodeStrict's error for data after the JSON value.
var ErrTrailingData = errors.New("data after the JSON value")

// ReadJSONFile reads an adapter's JSON configuration file into v: a file
// the host trusts (aip.ReadTrustFile: a regular file, a symlink followed,
// not writable by group or others, owned by the host's user or root, at most
// maxBytes; it names the provider's address, where the credential goes)
// holding one JSON value, decoded with DecodeStrict. what
// names the setting and shape describes the value ("an array of {id,
// base_url}") in errors.
func ReadJSONFile(what, path string, maxBytes int64, shape string, v any) error {
	if path == "" {
		return fmt.Errorf("%s: no file given; name a file holding %s", what, shape)
	}
	raw, err := aip.ReadTrustFile(path, maxBytes)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := DecodeStrict(raw, v); errors.Is(err, ErrTrailingData) {
		return fmt.Errorf("%s: %s has data after the JSON value; the file must hold %s alone", what, path, shape)
	} else if err != nil {
		return fmt.Errorf("%s: %s is not %s: %v", what, path, shape, err)
	}
	return nil
}

// ReadJSONList reads, with ReadJSONFile, a file holding one array of 1 to
// maxEntries entries; shape describes an entry ("{id, base_url,
// token_file}").
func ReadJSONList[T any](what, path string, maxBytes int64, maxEntries int, shape string) ([]T, error) {
	var list []T
	if err := ReadJSONFile(what, path, maxBytes, "a JSON array of "+shape, &list); err != nil {
		return nil, err
	}
	if len(list) == 0 || len(list) > maxEntries {
		return nil, fmt.Errorf("%s: %s lists %d entries; give 1 to %d", what, path, len(list), maxEntries)
	}
	return list, nil
}
