package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/netutil"
	"github.com/aipfleet/aipfleet/internal/readbudget"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
)

// routes lists every route of the dispatcher's HTTP API.
func (d *Dispatcher) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(d.observe)
	r.Method(http.MethodGet, PathHealth, d.handleHealth())
	r.Method(http.MethodGet, PathReady, d.handleReady())
	r.Method(http.MethodGet, PathMetrics, promhttp.HandlerFor(d.cfg.Metrics, promhttp.HandlerOpts{}))
	r.Method(http.MethodGet, PathJWKS, d.handleJWKS())
	// Authenticated by the sender's signature and its registry record, not
	// by a bearer token.
	r.Method(http.MethodPost, aip.EventsPath, d.handleConnectorEvents())
	r.Group(func(r chi.Router) {
		r.Use(d.authenticate)
		r.Method(http.MethodPost, PathActions, d.handleAction())
		r.Method(http.MethodGet, PathAction, d.handleStatus())
		r.Method(http.MethodPost, PathActionCancel, d.handleCancel())
		r.Method(http.MethodGet, PathCapabilities, d.handleCapabilities())
		r.Method(http.MethodGet, PathEvents, d.handleEvents())
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, newAPIError(http.StatusNotFound, CodeNotFound, aip.CategoryPermanent, false, 0, "no such route: "+r.Method+" "+r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) {
		allowed := allowedMethods(r, req.URL.Path)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		writeError(w, newAPIError(http.StatusMethodNotAllowed, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
			req.Method+" is not allowed on "+req.URL.Path+"; use "+strings.Join(allowed, " or ")))
	})
	return r
}

// allowedMethods lists the methods routes has for path, for the Allow
// header a 405 must carry (RFC 9110 §15.5.6).
func allowedMethods(routes chi.Routes, path string) []string {
	var out []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		if routes.Match(chi.NewRouteContext(), m, path) {
			out = append(out, m)
		}
	}
	return out
}

type tenantKey struct{}

// tenantOf returns the verified tenant of an authenticated request.
func tenantOf(ctx context.Context) string {
	t, _ := ctx.Value(tenantKey{}).(string)
	return t
}

// authenticate verifies the bearer token and puts its tenant in the
// request context; anything else is a 401 that says why.
//
// What a 401 says: a request without credentials is told how to send them;
// a token that does not parse, is not EdDSA or is not signed by a trusted
// issuer key is told only that; the claim checks (issuer, audience, times,
// tenant) are reported by name, which tells nothing to anyone but a holder
// of a token a trusted issuer signed, and tells that caller what to fix.
func (d *Dispatcher) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var claims tenanttoken.Claims
		// Two Authorization headers are refused (RequestToken): which one
		// counts is anybody's guess (a proxy may read the other).
		tok, err := tenanttoken.RequestToken(r.Header, false)
		if errors.Is(err, tenanttoken.ErrNoCredentials) {
			writeUnauthorized(w, false, unauthorizedReason(err))
			return
		}
		if err == nil {
			claims, err = d.deps.Tokens.Verify(tok)
		}
		if err == nil {
			err = checkTenantClaim(claims.TenantID)
		}
		if err != nil {
			writeUnauthorized(w, true, unauthorizedReason(err))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, claims.TenantID)))
	})
}

// unreadBody is the answer to a request whose body could not be read. The
// read error names the connection's addresses (the dispatcher's own,
// behind a proxy), which no caller is told: it is logged at debug level,
// and the answer says only what happened. inTime says what a body had to
// arrive within (empty: the server's read timeout), nothing what the
// request did not do.
func (d *Dispatcher) unreadBody(r *http.Request, err error, inTime, nothing string) *apiError {
	d.log.Debug("a request body could not be read", "path", r.URL.Path, "remote_addr", r.RemoteAddr, "error", err)
	msg := "the request body could not be read"
	if timedOut(err) {
		msg = "the request body did not arrive in time"
		if inTime != "" {
			msg += " (" + inTime + ")"
		}
	}
	// Retryable: the body was lost on its way, not refused for what it
	// says; the same request may well arrive next time.
	return newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryTransport, true, 0, msg+"; "+nothing+": send it again")
}

// timedOut reports whether err is a network timeout (a read deadline
// that passed).
func timedOut(err error) bool {
	ne, ok := errors.AsType[net.Error](err)
	return ok && ne.Timeout()
}

// ValidTenantID reports whether t is a tenant ID a token may name: the
// rule checkTenantClaim holds a verified token's claim to (what
// `aipfleet token --tenant` checks before it mints one).
func ValidTenantID(t string) bool { return checkTenantClaim(t) == nil }

// checkTenantClaim refuses a verified token whose tenant is no tenant ID
// the registry could hold (checkTenantID), before it keys the scheduler's
// queues, the metrics of the tenant's calls or a registry query. (A tenant
// with a formatting character was let through: its actions were admitted
// and refused by the registry as 422 dispatch.action_invalid naming the
// route request, and its catalog and event reads answered empty.)
func checkTenantClaim(t string) error {
	if err := checkTenantID(t, "the token's "+tenanttoken.TenantClaim+" claim", "mint the token for the tenant ID without it"); err != nil {
		return fmt.Errorf("%w: %w", tenanttoken.ErrUnauthorized, err)
	}
	return nil
}

// checkTenantID is the rule of tenant IDs, the registry's identifiers: at
// most 256 bytes (registry.MaxIdentifierBytes) of UTF-8 text without
// control characters, surrounding spaces or invisible formatting
// characters. The error names t as subject ("the token's tenant_id
// claim") and says, for a formatting character, what to do (fix).
func checkTenantID(t, subject, fix string) error {
	switch {
	case len(t) > registry.MaxIdentifierBytes:
		return fmt.Errorf("%s is longer than %d bytes", subject, registry.MaxIdentifierBytes)
	case t == "" || !printableText(t):
		return fmt.Errorf("%s is not a tenant ID (UTF-8 text without control characters or surrounding spaces)", subject)
	}
	if c, ok := registry.FormatCharacter(t); ok {
		return fmt.Errorf("%s is not a tenant ID: it holds the invisible formatting character U+%04X, which no tenant ID may hold (it would print like a tenant ID it is not); %s",
			subject, c, fix)
	}
	return nil
}

// checkTenantArg refuses the tenant argument of Execute, Cancel, Status
// or Capabilities when it is no tenant ID (checkTenantID, the rule a
// token's tenant claim is held to) with what a request whose token claims
// it is answered: 401 dispatch.unauthorized. An embedder passes the tenant
// it verified itself; the API's handlers pass a token's claim, which
// authenticate already checked. (Such a tenant went through: an empty one
// or one too long was queued and looked up, one with a formatting
// character admitted and then refused by the registry.)
func checkTenantArg(t string) *apiError {
	subject := "the tenant " + strconv.Quote(aip.TruncateUTF8(t, 64))
	if t == "" {
		subject = "the tenant (empty: no verified tenant)"
	}
	if err := checkTenantID(t, subject, "pass the tenant ID without it"); err != nil {
		return newAPIError(http.StatusUnauthorized, CodeUnauthorized, aip.CategoryAuth, false, 0, err.Error())
	}
	return nil
}

// writeUnauthorized answers 401 dispatch.unauthorized with msg and a
// WWW-Authenticate challenge (RFC 6750 §3): error="invalid_token" only when
// bearer credentials were sent (not for a header of another scheme,
// tenanttoken.ErrNoCredentials), and an error_description of the
// characters that RFC allows there.
// unauthorizedReason is the message of a 401: why the credentials were
// refused ("malformed token"). The code, dispatch.unauthorized, already
// says that they were, so the "unauthorized: " tenanttoken's errors start
// with is left out: a client printed "dispatch.unauthorized:
// unauthorized: malformed token".
func unauthorizedReason(err error) string {
	return strings.TrimPrefix(err.Error(), tenanttoken.ErrUnauthorized.Error()+": ")
}

func writeUnauthorized(w http.ResponseWriter, invalidToken bool, msg string) {
	challenge := `Bearer realm="aipfleet-dispatch"`
	if invalidToken {
		desc := strings.Map(func(r rune) rune {
			switch {
			case r == '"' || r == '\\':
				return '\''
			case r < 0x20 || r > 0x7e:
				return '?'
			}
			return r
		}, aip.TruncateUTF8(msg, 200))
		challenge += `, error="invalid_token", error_description="` + desc + `"`
	}
	w.Header().Set("WWW-Authenticate", challenge)
	writeError(w, newAPIError(http.StatusUnauthorized, CodeUnauthorized, aip.CategoryAuth, false, 0, msg))
}

// statusRecorder remembers the status written.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the Flusher.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// observe continues the caller's trace (W3C traceparent headers), counts
// requests by route and status, and recovers a handler's panic: it is
// logged with its stack, and the caller gets 500 dispatch.internal without
// its details (or, when the answer had begun, a cut connection, so that a
// partial answer never looks complete).
func (d *Dispatcher) observe(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w}
		r = r.WithContext(d.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header)))
		defer func() {
			p := recover()
			cut := p == http.ErrAbortHandler //nolint:errorlint // the sentinel is panicked as is
			if p != nil && !cut {
				d.log.Error("handler panicked", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
				if cut = rec.status != 0; !cut {
					writeError(rec, newAPIError(http.StatusInternalServerError, CodeInternal, aip.CategoryPermanent, false, 0,
						"the dispatcher failed on this request; the failure is in its log"))
				}
			}
			route := chi.RouteContext(r.Context()).RoutePattern()
			if route == "" {
				route = "unmatched"
			}
			d.m.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
			if cut {
				panic(http.ErrAbortHandler) // the answer had begun: cut it off (net/http logs nothing for this one)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

func (d *Dispatcher) handleHealth() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "did": d.key.DID()})
	})
}

// handleReady answers GET /ready. The registry's error text (it names
// database hosts and roles) goes only to local peers (loopback, with no
// proxy forwarding header; none with Config.HideLocalReadyDetail) and to
// the log (when it changes); other peers read that the registry is
// unavailable.
func (d *Dispatcher) handleReady() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checks := map[string]string{"dispatcher": "ok", "registry": "ok"}
		ready := true
		if d.stopping.Load() {
			checks["dispatcher"], ready = "shutting down", false
		}
		if d.deps.Ready != nil {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			err := d.deps.Ready(ctx)
			cancel()
			d.logReadiness(err)
			if err != nil {
				ready = false
				checks["registry"] = "unavailable; the detail is in the dispatcher's log"
				if !d.cfg.HideLocalReadyDetail && netutil.IsLocalUnproxied(r) {
					checks["registry"] = err.Error()
				}
			}
		}
		status := http.StatusOK
		if !ready {
			status = http.StatusServiceUnavailable
		}
		writeJSON(w, status, map[string]any{"ready": ready, "checks": checks, "admission": d.sched.Snapshot()})
	})
}

// logReadiness logs a registry readiness failure when its text differs from
// the last one logged, and the return to ready once.
func (d *Dispatcher) logReadiness(err error) {
	now := ""
	if err != nil {
		now = err.Error()
	}
	if !d.notReady.Changed(now) {
		return
	}
	if now == "" {
		d.log.Info("registry ready again")
		return
	}
	d.log.Warn("registry not ready", "error", now)
}

func (d *Dispatcher) handleJWKS() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(d.jwks)
	})
}

// handleAction serves POST /aip/v1/actions: a sync action answers one JSON
// ActionResponse; a streaming action answers NDJSON StreamLines (the
// chunks, then the final ActionResponse) once its first chunk arrives, and
// plain JSON when it fails before any chunk.
func (d *Dispatcher) handleAction() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, e := queryOf(r); e != nil {
			writeError(w, e)
			return
		}
		body, e := d.readActionBody(w, r)
		if e != nil {
			writeError(w, e)
			return
		}
		req, err := decodeActionRequest(body, d.cfg.MaxTimeout)
		if err != nil {
			writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0, err.Error()))
			return
		}
		// Validated here, not again in Execute: an invalid request gets a
		// plain error body and is not counted as an action.
		if err := req.Validate(d.cfg.MaxTimeout); err != nil {
			writeError(w, newAPIError(http.StatusUnprocessableEntity, CodeActionInvalid, aip.CategoryPermanent, false, 0, err.Error()))
			return
		}
		if req.Mode != aip.ModeStreaming {
			resp, status := d.executeAction(r.Context(), tenantOf(r.Context()), req, nil, true)
			writeAction(w, status, &resp)
			return
		}
		s := &streamWriter{w: w, timeout: d.cfg.StreamWriteTimeout}
		resp, status := d.executeAction(r.Context(), tenantOf(r.Context()), req, s.chunk, true)
		s.finish(status, &resp)
	})
}

// The read budget of action bodies (Config.MaxActionReadBytes) gives one
// tenant at most actionsTenantShareDivisor-th of it, and never less than
// the largest body. A request over its tenant's share waits for that
// tenant's own reads at most actionsTenantWait, and one waiting for the
// whole budget at most actionsReadWait; then it is refused, retryable,
// with nothing dispatched. A client's bodies are read in milliseconds, so
// a request that waited that long is behind slow or oversized uploads.
const (
	actionsTenantShareDivisor = readbudget.DefaultPeerShareDivisor
	actionsTenantWait         = 2 * time.Second
	actionsReadWait           = 10 * time.Second
)

// newActionBodies returns the read budget of action bodies.
func newActionBodies(total, maxBody int64) (*readbudget.Budget, error) {
	return readbudget.New(readbudget.Config{
		Total:       total,
		PeerShare:   min(max(total/actionsTenantShareDivisor, maxBody), total),
		MaxPeerWait: actionsTenantWait,
	})
}

// readActionBody reads an action request's body within the read budget of
// action bodies: it reserves the body's Content-Length (MaxBodyBytes when
// it names none) under the request's tenant, gives the body the budget's
// minimum transfer rate, and gives the reservation back once the body is
// read. A body its Content-Length says is too large is refused unread.
func (d *Dispatcher) readActionBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	tooLarge := func() *apiError {
		return newAPIError(http.StatusRequestEntityTooLarge, CodeRequestTooLarge, aip.CategoryPermanent, false, 0,
			"the request body exceeds "+strconv.FormatInt(d.cfg.MaxBodyBytes, 10)+" bytes, the largest this dispatcher reads (--max-body-bytes): send a smaller input")
	}
	if r.ContentLength > d.cfg.MaxBodyBytes {
		return nil, tooLarge()
	}
	need := d.cfg.MaxBodyBytes
	if r.ContentLength >= 0 {
		need = r.ContentLength
	}
	ctx, cancel := context.WithTimeout(r.Context(), actionsReadWait)
	release, err := d.actionBodies.AcquireFor(ctx, tenantOf(r.Context()), need)
	cancel()
	switch {
	case errors.Is(err, readbudget.ErrPeerBusy):
		return nil, newAPIError(http.StatusTooManyRequests, CodeSchedulerOverloaded, aip.CategoryTemporary, true, time.Second,
			fmt.Sprintf("the tenant's other requests whose bodies are still being read hold its share (%d bytes) of the dispatcher's memory for request bodies; nothing was dispatched: retry when they have been sent (a request that names its Content-Length reserves only that)",
				d.actionBodies.PeerShare()))
	case err != nil && r.Context().Err() == nil:
		return nil, newAPIError(http.StatusServiceUnavailable, CodeSchedulerOverloaded, aip.CategoryTemporary, true, time.Second,
			fmt.Sprintf("the dispatcher's memory for request bodies being read (%d bytes) stayed full for %s; nothing was dispatched: retry shortly",
				d.cfg.MaxActionReadBytes, actionsReadWait))
	case err != nil:
		return nil, newAPIError(http.StatusServiceUnavailable, CodeSchedulerOverloaded, aip.CategoryTemporary, true, 100*time.Millisecond,
			"the request ended while waiting for its body to be read; nothing was dispatched")
	}
	defer release()
	// Set before the body is read: net/http clears it when the body ends,
	// so it never reaches the action's own time. Without a read deadline
	// on the connection the server's ReadTimeout still bounds the read.
	_ = d.actionBodies.SetReadDeadline(w, r, need)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, d.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge()
		}
		return nil, d.unreadBody(r, err, fmt.Sprintf("at %d KiB/s at least, after a grace of %s",
			d.actionBodies.MinReadRate()>>10, d.actionBodies.ReadGrace()), "nothing was dispatched")
	}
	return body, nil
}

// streamWriter relays a streaming action's chunks as NDJSON lines. Each
// line must be written within timeout (Config.StreamWriteTimeout); after a
// failed or timed-out write the client is taken as gone and the rest of
// the stream is read from the replica but not written.
type streamWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	timeout time.Duration
	started bool
	broken  bool
}

func (s *streamWriter) chunk(c *aip.StreamChunk) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.broken {
		return // the client left; the action still runs to its settlement
	}
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", ContentTypeNDJSON)
		s.w.Header().Set("X-Content-Type-Options", "nosniff")
		s.w.Header().Set("Cache-Control", "no-store")
		s.w.WriteHeader(http.StatusOK)
	}
	if err := s.line(StreamLine{Chunk: c}); err != nil {
		s.broken = true
	}
}

// line writes one line within the write timeout.
func (s *streamWriter) line(v any) error {
	// A ResponseWriter that cannot take a deadline (an embedder's) is
	// written without one.
	if err := http.NewResponseController(s.w).SetWriteDeadline(time.Now().Add(s.timeout)); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	return writeLine(s.w, v)
}

func (s *streamWriter) finish(status int, resp *ActionResponse) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started {
		writeAction(s.w, status, resp)
		return
	}
	if !s.broken {
		s.line(StreamLine{ActionResponse: resp})
	}
}

func writeLine(w http.ResponseWriter, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if _, err := w.Write(append(raw, '\n')); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}

func (d *Dispatcher) handleStatus() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, e := queryOf(r); e != nil {
			writeError(w, e)
			return
		}
		out, e := d.Status(r.Context(), tenantOf(r.Context()), chi.URLParam(r, "id"))
		if e != nil {
			writeError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, out)
	})
}

func (d *Dispatcher) handleCancel() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, e := queryOf(r); e != nil {
			writeError(w, e)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				writeError(w, newAPIError(http.StatusRequestEntityTooLarge, CodeRequestTooLarge, aip.CategoryPermanent, false, 0, "a cancel body is at most 64 KiB"))
				return
			}
			writeError(w, d.unreadBody(r, err, "", "nothing was cancelled"))
			return
		}
		var c CancelRequest
		if len(bytes.TrimSpace(body)) > 0 {
			// As strict as an action's body: one I-JSON object, no unknown
			// member, nothing after it.
			if err := aip.DecodeStrict(body, &c); err != nil {
				writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
					`the body must be empty or {"reason": "..."}: `+err.Error()))
				return
			}
		}
		if len(c.Reason) > MaxCancelReasonBytes {
			writeError(w, newAPIError(http.StatusUnprocessableEntity, CodeActionInvalid, aip.CategoryPermanent, false, 0,
				"reason is longer than "+strconv.Itoa(MaxCancelReasonBytes)+" bytes"))
			return
		}
		resp, status := d.Cancel(r.Context(), tenantOf(r.Context()), chi.URLParam(r, "id"), c.Reason)
		writeAction(w, status, &resp)
	})
}

// Bounds of the limit query parameter of GET /aip/v1/capabilities: a page
// holds DefaultPageLimit definitions unless limit says otherwise, at most
// MaxPageLimit (the registry clamps it further, to 200 by default).
const (
	DefaultPageLimit = 50
	MaxPageLimit     = 1000
)

// queryOf returns r's query parameters when each is one of names and
// given at most once, or the 400 that says which is not: a misspelt
// parameter would otherwise be ignored without a word, and one given twice
// read as its first value here and perhaps its last by a proxy. Routes
// that take no parameter call it with no names, so that, say,
// POST /aip/v1/actions?mode=streaming is refused rather than run in sync
// mode without a word.
func queryOf(r *http.Request, names ...string) (url.Values, *apiError) {
	bad := func(msg string) (url.Values, *apiError) {
		return nil, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0, msg)
	}
	v, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return bad("the query is malformed: " + err.Error())
	}
	for name, values := range v {
		switch {
		case len(names) == 0:
			return bad(fmt.Sprintf("unknown query parameter %q; %s takes no query parameters", aip.TruncateUTF8(name, 64), r.URL.Path))
		case !slices.Contains(names, name):
			return bad(fmt.Sprintf("unknown query parameter %q; %s takes %s", aip.TruncateUTF8(name, 64), r.URL.Path, strings.Join(names, ", ")))
		case len(values) > 1:
			return bad(fmt.Sprintf("query parameter %q is given %d times; give it once", name, len(values)))
		}
	}
	return v, nil
}

func (d *Dispatcher) handleCapabilities() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, e := queryOf(r, "limit", "cursor", "q", "profile", "capability_id")
		if e != nil {
			writeError(w, e)
			return
		}
		q := registry.CatalogQuery{CapabilityID: v.Get("capability_id"), Text: v.Get("q"), Profile: v.Get("profile"), Cursor: v.Get("cursor"), Limit: DefaultPageLimit}
		if s := v.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 || n > MaxPageLimit {
				writeError(w, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0,
					"limit must be an integer from 1 to "+strconv.Itoa(MaxPageLimit)))
				return
			}
			q.Limit = n
		}
		page, e := d.Capabilities(r.Context(), tenantOf(r.Context()), q)
		if e != nil {
			writeError(w, e)
			return
		}
		writeJSON(w, http.StatusOK, page)
	})
}

func writeAction(w http.ResponseWriter, status int, resp *ActionResponse) {
	setRetryAfter(w, resp.Error)
	writeJSON(w, status, resp)
}

func writeError(w http.ResponseWriter, e *apiError) {
	setRetryAfter(w, e.pe)
	writeJSON(w, e.status, ErrorResponse{Error: e.pe})
}

func setRetryAfter(w http.ResponseWriter, pe *aip.ProtocolError) {
	if pe != nil && pe.RetryAfterMS != nil {
		w.Header().Set("Retry-After", strconv.FormatUint(pe.RetryAfterSeconds(), 10))
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	// Without HTML escaping: an answer is JSON, never HTML, and escaping
	// writes each <, > and & as six bytes, so a page of event data bounded
	// in bytes (MaxEventPageBytes) could be six times that on the wire.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString(`{"error":{"code":"dispatch.encoding","message":"the answer could not be encoded","category":"permanent"}}` + "\n")
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Answers are per caller (a tenant's actions, catalog and events) or
	// of the moment (health, readiness): no cache may keep or reuse them.
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}
