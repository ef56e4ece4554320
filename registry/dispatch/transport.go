package dispatch

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// errUnverified marks an answer that is not a verified envelope from the
// pinned replica answering our message: its content proves nothing.
var errUnverified = errors.New("dispatch: unverified answer")

// errEnvelopeTooLarge marks an envelope larger than a replica reads
// (aip.MaxMessageBytes): it is never sent.
var errEnvelopeTooLarge = errors.New("dispatch: envelope too large")

// hopFailure is a hop's error whose detail — an answer that came back
// unsigned, why it did not verify, the replica's endpoint — is for the
// dispatcher's log only: the caller is told public.
type hopFailure struct {
	public string
	err    error
}

func (e *hopFailure) Error() string { return e.err.Error() }
func (e *hopFailure) Unwrap() error { return e.err }

// public says what failed on the hop in words fit for the caller: the kind
// of failure, never the replica's endpoint, its network addresses or text
// that came back unsigned (they describe the fleet's internal network, or
// are anybody's words). send logs the whole error ("hop failed").
func (h *hop) public() string {
	var hf *hopFailure
	switch {
	case h.err == nil:
		return ""
	case errors.As(h.err, &hf):
		return hf.public
	case h.notSent, errors.Is(h.err, errUnverified):
		return h.err.Error() // the dispatcher's own words
	}
	return transportCause(h.err)
}

// transportCause names the kind of a transport failure.
func transportCause(err error) string {
	var (
		dns *net.DNSError
		cv  *tls.CertificateVerificationError
		rh  tls.RecordHeaderError
		op  *net.OpError
		ne  net.Error
	)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connect: connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		return "the connection was reset"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case errors.As(err, &dns):
		return "the replica's host name did not resolve"
	case errors.As(err, &cv):
		return "TLS: the replica's certificate did not verify"
	case errors.As(err, &op) && op.Op == "remote error":
		return "the replica ended the TLS handshake (" + op.Err.Error() + ")"
	case errors.As(err, &rh):
		return "the TLS handshake failed (the endpoint does not speak TLS)"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "the connection closed before the answer was complete"
	}
	return "a transport failure (the detail is in the dispatcher's log)"
}

// isErrorCode reports whether s has the form of an error code
// ("connector_host.authentication"): at most 64 bytes of lowercase
// letters, digits, dots and underscores, which an answer may repeat
// although it came unsigned.
func isErrorCode(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '.' && c != '_' {
			return false
		}
	}
	return true
}

// hopLogEvery is how often the failed hops to one replica are logged at
// most: every hop to a replica that is down fails, and callers that send
// to it or poll an action pinned there would otherwise write a line each.
const hopLogEvery = 10 * time.Second

// maxHopLogReplicas bounds the replicas hopLogs remembers; when full it
// starts over.
const maxHopLogReplicas = 4096

// hop is one native request to a replica and what came back.
type hop struct {
	// request is the signed envelope as posted; messageID its ID.
	request   []byte
	messageID string
	// status is the HTTP status (0 when no response arrived).
	status int
	// response is the final envelope as received (the JSON body, or the
	// last NDJSON line); env is it verified, or nil.
	response []byte
	env      *aip.Envelope
	// chunks counts the verified stream chunks relayed.
	chunks uint64
	// err is set when no verified final envelope arrived: a transport
	// failure, a timeout, or an answer that did not verify.
	err      error
	timedOut bool
	// notSent is set when the failure happened before the request could
	// leave (no native profile, no signature, no request): nothing reached
	// the replica.
	notSent bool
	// unreachable is set when the request failed before the transport had
	// a connection to the replica (a refused or timed-out dial, a failed
	// TLS handshake, an unresolvable name): net/http writes nothing of a
	// request before its httptrace GotConn, and a resend on a pooled
	// connection that turned out closed (the Idempotency-Key below) comes
	// after a GotConn, so no attempt can have reached the replica. Set
	// only for the dispatcher's own kind of transport (tracesDials), and
	// only when net/http's own connection path took the request (its
	// GetConn fired).
	unreachable bool
	// moveUnconfirmed is set when a reroute off this unreachable replica
	// failed without a definite answer (the registry's answer was lost: it
	// may have committed), so the action may now be routed elsewhere.
	moveUnconfirmed bool
}

// tracesDials reports whether the client's transport is net/http's own,
// whose httptrace GotConn comes before any byte of a request is written:
// an *http.Transport, or none while http.DefaultTransport is one (an
// embedder or a library may have replaced it with any RoundTripper, at
// any time, so it is looked at on every hop).
func (d *Dispatcher) tracesDials() bool {
	switch d.client.Transport.(type) {
	case nil:
		_, ok := http.DefaultTransport.(*http.Transport)
		return ok
	case *http.Transport:
		return true
	}
	return false
}

// refusal returns the replica's signed refusal, or nil.
func (h *hop) refusal() *aip.ProtocolError {
	if h.env == nil || h.env.Body.Error == nil {
		return nil
	}
	pe := &h.env.Body.Error.Error
	if !registry.IsRefusalCode(pe.Code) {
		return nil
	}
	return pe
}

// envelope builds the unsigned envelope of body for the assignment's
// replica: from the gateway principal in the assignment's trust domain, to
// the replica's peer principal, with the pinned route (send adds the trace
// context).
func (d *Dispatcher) envelope(a *registry.RouteAssignment, body aip.Body, mode *aip.ActionMode) (*aip.Envelope, error) {
	env, err := aip.NewEnvelope(d.cfg.Now(), body)
	if err != nil {
		return nil, err
	}
	from := d.principal
	from.TrustDomain = a.TrustDomain
	env.From = &from
	env.To = &aip.Principal{ID: a.PeerPrincipalID, Kind: a.PeerPrincipalKind}
	env.CorrelationID = aip.NewID(aip.PrefixCorrelation)
	if err := env.SetSecurity(aip.SecurityConnectorRoute, a.Route(mode)); err != nil {
		return nil, err
	}
	return env, nil
}

// send signs env, posts it to the assignment's endpoint and reads the
// answer. Stream chunks (NDJSON answers) are verified one by one and passed
// to onChunk in order; the final envelope ends the answer. The returned
// hop's err is set whenever no verified final envelope arrived.
func (d *Dispatcher) send(ctx context.Context, a *registry.RouteAssignment, env *aip.Envelope, spanName string, onChunk func(*aip.StreamChunk)) *hop {
	ctx, span := d.tracer.Start(ctx, spanName, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("aip.replica_id", a.ReplicaID), attribute.String("aip.action_id", a.ActionID),
			attribute.String("aip.fence_token", a.FenceToken), attribute.String("aip.message_type", string(env.MessageType))))
	defer span.End()
	// The trace context of the hop is this span's.
	carrier := propagation.MapCarrier{}
	d.prop.Inject(ctx, carrier)
	if len(carrier) > 0 {
		env.Trace = carrier
	}
	h := &hop{messageID: env.MessageID}
	defer func() {
		span.SetAttributes(attribute.Int("http.response.status_code", h.status))
		if h.err != nil {
			span.RecordError(h.err)
			span.SetStatus(codes.Error, h.err.Error())
			// The caller is told only h.public(): the whole error is here
			// (at most every hopLogEvery for one replica).
			if suppressed, ok := d.hopLogs.Allow(a.ReplicaID, time.Now()); ok {
				d.log.Warn("hop failed", "action_id", a.ActionID, "replica_id", a.ReplicaID, "endpoint", a.Endpoint,
					"message_type", string(env.MessageType), "status", h.status, "error", h.err.Error(), "not_logged_since", suppressed)
			}
		}
	}()
	if a.TransportProfile != aip.NativeHTTPProfile {
		h.err, h.notSent = fmt.Errorf("dispatch: replica %s speaks %q; this dispatcher speaks only %s", a.ReplicaID, a.TransportProfile, aip.NativeHTTPProfile), true
		return h
	}
	raw, err := aip.SignEnvelope(d.key, env)
	if err != nil {
		h.err, h.notSent = fmt.Errorf("dispatch: sign: %w", err), true
		return h
	}
	if len(raw) > aip.MaxMessageBytes {
		h.err, h.notSent = fmt.Errorf("%w: the signed envelope is %d bytes; a replica reads at most %d", errEnvelopeTooLarge, len(raw), aip.MaxMessageBytes), true
		return h
	}
	h.request = raw
	// asked: net/http's own connection path took the request (an
	// alternate protocol registered on the transport, or a RoundTripper
	// that sends on a context of its own, fires neither hook).
	var asked, connected atomic.Bool
	rctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn: func(string) { asked.Store(true) },
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	})
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, a.Endpoint, bytes.NewReader(raw))
	if err != nil {
		h.err, h.notSent = &hopFailure{public: fmt.Sprintf("dispatch: replica %s: its registered endpoint is not a URL this dispatcher can post to", a.ReplicaID),
			err: fmt.Errorf("dispatch: replica %s endpoint %q: %w", a.ReplicaID, a.Endpoint, err)}, true
		return h
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, "+ContentTypeNDJSON)
	// The header makes the transport resend these exact bytes when a pooled
	// connection turns out closed. That is safe: the replica claims every
	// message ID before acting on it, so a second delivery of the same
	// envelope is answered connector_host.replay and never runs.
	req.Header.Set("Idempotency-Key", env.MessageID)
	resp, err := d.client.Do(req)
	if err != nil {
		h.err, h.timedOut = err, errors.Is(ctx.Err(), context.DeadlineExceeded)
		h.unreachable = d.tracesDials() && asked.Load() && !connected.Load()
		return h
	}
	defer resp.Body.Close()
	h.status = resp.StatusCode
	if strings.HasPrefix(resp.Header.Get("Content-Type"), ContentTypeNDJSON) {
		d.readStream(ctx, resp.Body, a, h, onChunk)
		return h
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, aip.MaxMessageBytes+1))
	if err != nil {
		h.err, h.timedOut = err, errors.Is(ctx.Err(), context.DeadlineExceeded)
		return h
	}
	h.response = body
	if len(body) > aip.MaxMessageBytes {
		h.err = fmt.Errorf("%w: the answer exceeds %d bytes", errUnverified, aip.MaxMessageBytes)
		return h
	}
	h.env, h.err = d.verify(body, a, h.messageID)
	return h
}

// readStream reads an NDJSON answer: chunks in sequence, then one final
// envelope, each line verified before it is passed on.
func (d *Dispatcher) readStream(ctx context.Context, body io.Reader, a *registry.RouteAssignment, h *hop, onChunk func(*aip.StreamChunk)) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 0, 64<<10), aip.MaxMessageBytes)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if h.env != nil {
			h.env, h.err = nil, fmt.Errorf("%w: a line follows the final envelope of the stream", errUnverified)
			return
		}
		env, err := d.verify(line, a, h.messageID)
		if err != nil {
			h.response, h.err = bytes.Clone(line), err
			return
		}
		if c := env.Body.StreamChunk; c != nil {
			if c.ActionID != a.ActionID || c.Sequence != h.chunks {
				h.err = fmt.Errorf("%w: chunk %d of action %s, want chunk %d of %s", errUnverified, c.Sequence, c.ActionID, h.chunks, a.ActionID)
				return
			}
			h.chunks++
			if onChunk != nil {
				onChunk(c)
			}
			continue
		}
		h.response, h.env = bytes.Clone(line), env
	}
	if err := sc.Err(); err != nil {
		h.env, h.err, h.timedOut = nil, &hopFailure{public: "dispatch: the stream broke: " + transportCause(err),
			err: fmt.Errorf("dispatch: the stream broke: %w", err)}, errors.Is(ctx.Err(), context.DeadlineExceeded)
		return
	}
	if h.env == nil {
		h.err = fmt.Errorf("%w: the stream ended without a final envelope", errUnverified)
	}
}

// verify checks one answer envelope: signed by the assignment's peer DID,
// from its peer principal, to the gateway principal, in response to our
// message.
func (d *Dispatcher) verify(raw []byte, a *registry.RouteAssignment, messageID string) (*aip.Envelope, error) {
	v, err := aip.VerifyEnvelope(raw, a.PeerDID)
	if err != nil {
		var probe struct {
			Error json.RawMessage `json:"error"`
		}
		// What came back unsigned may be anybody's words (a proxy's error
		// page names hosts): only the log has it.
		public := fmt.Sprintf("%v: not an envelope signed by replica %s", errUnverified, a.ReplicaID)
		if json.Unmarshal(raw, &probe) == nil && len(probe.Error) > 0 {
			what := "an unsigned error"
			var pe struct {
				Code string `json:"code"`
			}
			if json.Unmarshal(probe.Error, &pe) == nil && isErrorCode(pe.Code) {
				what = "an unsigned " + pe.Code
			}
			return nil, &hopFailure{public: public + " (" + what + "; the dispatcher's log has it)",
				err: fmt.Errorf("%w: unsigned error from replica %s: %s", errUnverified, a.ReplicaID, aip.TruncateUTF8(string(probe.Error), 512))}
		}
		return nil, &hopFailure{public: public,
			err: fmt.Errorf("%w: not an envelope signed by replica %s: %v (it begins %q)", errUnverified, a.ReplicaID, err, aip.TruncateUTF8(string(raw), 256))}
	}
	env := &v.Envelope
	switch {
	case env.InResponseTo == nil || env.InResponseTo.Message != messageID:
		return nil, fmt.Errorf("%w: the answer does not answer message %s", errUnverified, messageID)
	case env.From == nil || env.From.ID != a.PeerPrincipalID:
		return nil, fmt.Errorf("%w: the answer is not from the replica's principal %s", errUnverified, a.PeerPrincipalID)
	case env.To == nil || env.To.ID != d.principal.ID:
		return nil, fmt.Errorf("%w: the answer is not addressed to %s", errUnverified, d.principal.ID)
	}
	return env, nil
}
