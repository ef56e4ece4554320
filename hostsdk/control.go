package hostsdk

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
)

// controlClient speaks the signed lifecycle protocol to the pinned control
// plane: every request is sealed with the replica key, every response must
// be signed by the pinned DID, answer the request and be fresh.
type controlClient struct {
	endpoint  string
	http      *http.Client
	key       *aip.SigningKey
	pinnedDID string
	pinnedKey ed25519.PublicKey
	timeout   time.Duration
	now       func() time.Time
	tracer    trace.Tracer
}

// sealedRequest is a lifecycle request and the exact bytes sent for it, kept
// so an ambiguous failure can be retried with the same request.
type sealedRequest struct {
	req  aip.ControlRequest
	body []byte
	// maybeApplied is set once an attempt of the request (in any of its
	// signed forms, see refresh) failed without the control plane's signed
	// word that it applied nothing: a transport error once connected (a
	// refused dial sends nothing), a lost or unverifiable answer. The
	// control plane may then have committed it.
	maybeApplied bool
}

// notAppliedError is an ErrControlUnavailable failure that committed
// nothing of the request: the control plane's signed retryable rejection
// (it decided nothing), or a dial that failed (nothing was sent).
type notAppliedError struct{ error }

func (e notAppliedError) Unwrap() error { return e.error }

func newControlTransport(caPEM []byte) (http.RoundTripper, error) {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 2
	if len(caPEM) > 0 {
		pool, err := x509.SystemCertPool()
		if err != nil || pool == nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("the TLS CA certificate file holds no PEM certificate")
		}
		t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return t, nil
}

// seal builds and signs a fresh request for cmd.
func (c *controlClient) seal(cmd aip.ControlCommand) (*sealedRequest, error) {
	req := aip.NewControlRequest(c.now(), c.key.DID(), cmd)
	return c.sealRequest(*req)
}

func (c *controlClient) sealRequest(req aip.ControlRequest) (*sealedRequest, error) {
	body, err := aip.Seal(c.key, aip.SignedRequestField, &req)
	if err != nil {
		return nil, err
	}
	if len(body) > aip.MaxControlBytes {
		return nil, fmt.Errorf("lifecycle %s request is %d bytes, more than the %d allowed", req.Command.Operation, len(body), aip.MaxControlBytes)
	}
	return &sealedRequest{req: req, body: body}, nil
}

// refresh returns sr itself while its signed window still covers a full
// attempt; otherwise the same request ID and payload re-signed with a fresh
// window. The control plane's replay digest covers only the request ID,
// operation and payload, so both forms are the same request to it.
func (c *controlClient) refresh(sr *sealedRequest) (*sealedRequest, error) {
	now := c.now()
	if sr.req.ExpiresAt.Sub(now) > 2*c.timeout+aip.MaxFutureSkew && !sr.req.IssuedAt.After(now) {
		return sr, nil
	}
	req := sr.req
	req.IssuedAt = aip.At(now)
	req.ExpiresAt = aip.At(now.Add(aip.MaxMessageLifetime))
	fresh, err := c.sealRequest(req)
	if err != nil {
		return nil, err
	}
	fresh.maybeApplied = sr.maybeApplied
	return fresh, nil
}

// do sends sr and returns the verified outcome (lease or offline). After an
// ambiguous failure (ErrControlUnavailable) it resends the request once:
// the byte-identical request while its signed window still covers the
// resend, otherwise the same request re-signed with a fresh window
// (refresh). A first attempt that ran its full ControlTimeout can have
// used up the window (with a timeout above 12.5 s), and the control plane
// refuses an expired request definitively: the host would take that for
// its decision on a request it may have applied. A definitive rejection
// is a *ControlRejectedError. What the attempts leave open is recorded in
// sr (maybeApplied), whichever form was sent.
func (c *controlClient) do(ctx context.Context, sr *sealedRequest) (aip.ControlOutcome, error) {
	op := string(sr.req.Command.Operation)
	ctx, span := c.tracer.Start(ctx, "hostsdk.control."+op, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("aip.control.request_id", sr.req.RequestID)))
	defer span.End()
	out, err := c.attempt(ctx, sr)
	sr.noteFailure(err)
	if errors.Is(err, ErrControlUnavailable) && ctx.Err() == nil {
		span.AddEvent("resend", trace.WithAttributes(attribute.String("error", err.Error())))
		if rs, rerr := c.refresh(sr); rerr == nil {
			out, err = c.attempt(ctx, rs)
			sr.noteFailure(err)
		}
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return out, err
}

// noteFailure records in sr that an attempt failed in a way that leaves
// open whether the control plane applied it.
func (sr *sealedRequest) noteFailure(err error) {
	var notApplied notAppliedError
	if err != nil && !errors.As(err, &notApplied) {
		var rej *ControlRejectedError
		if !errors.As(err, &rej) {
			sr.maybeApplied = true
		}
	}
}

// localLease returns lease with its expiry on this host's clock: the time
// the request was sent here plus what was left of the lease when the
// control plane signed its answer (lease expiry less the answer's
// issued_at, both on the control plane's clock). The lease is then
// independent of the two clocks' offset and ends here no later than the
// control plane ends it — the request was sent before the answer was
// issued — so a host whose clock is behind does not take actions after
// lease maintenance released its reservations. (Comparing the control
// plane's absolute expiry with this host's clock would, with the 5 s of
// skew the window allows.)
func localLease(lease aip.Lease, issuedAt, sent time.Time) aip.Lease {
	lease.ExpiresAt = aip.At(sent.Add(lease.ExpiresAt.Sub(issuedAt)))
	return lease
}

func (c *controlClient) attempt(ctx context.Context, sr *sealedRequest) (aip.ControlOutcome, error) {
	op := string(sr.req.Command.Operation)
	unavailable := func(format string, args ...any) (aip.ControlOutcome, error) {
		return aip.ControlOutcome{}, fmt.Errorf("%w: %s: %s", ErrControlUnavailable, op, fmt.Sprintf(format, args...))
	}
	if ctx.Err() != nil {
		// Nothing is sent: the caller's time ran out first (a shutdown
		// step's budget spent on replays). The request is known not
		// applied, as after a refused dial.
		return aip.ControlOutcome{}, notAppliedError{fmt.Errorf("%w: %s not sent: %w", ErrControlUnavailable, op, context.Cause(ctx))}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(sr.body))
	if err != nil {
		return aip.ControlOutcome{}, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	// The control plane's span joins this one's trace (W3C traceparent).
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(hreq.Header))
	sent := c.now()
	resp, err := c.http.Do(hreq)
	if err != nil {
		// The transport's error is wrapped, not only quoted: when ctx was
		// cancelled it carries the cancellation's cause (a SIGTERM's), by
		// which Run tells a shutdown requested while starting from a
		// failed start.
		out, uerr := aip.ControlOutcome{}, fmt.Errorf("%w: %s: %w", ErrControlUnavailable, op, err)
		if opErr := (*net.OpError)(nil); errors.As(err, &opErr) && opErr.Op == "dial" {
			// No connection: the request never left this host.
			return out, notAppliedError{uerr}
		}
		return out, uerr
	}
	defer resp.Body.Close()
	if resp.ContentLength > aip.MaxControlBytes {
		return unavailable("response of %d bytes exceeds %d", resp.ContentLength, aip.MaxControlBytes)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, aip.MaxControlBytes+1))
	if err != nil {
		return aip.ControlOutcome{}, fmt.Errorf("%w: %s: read response: %w", ErrControlUnavailable, op, err)
	}
	if len(body) > aip.MaxControlBytes {
		return unavailable("response exceeds %d bytes", aip.MaxControlBytes)
	}
	cr, err := aip.OpenControlResponse(body, c.pinnedDID, c.pinnedKey, sr.req.RequestID, c.now())
	if err != nil {
		return unavailable("HTTP %d with no verifiable signed answer: %v", resp.StatusCode, err)
	}
	o := cr.Outcome
	switch o.Status {
	case aip.OutcomeRejected:
		if o.Retryable {
			out, err := unavailable("retryable rejection %s: %s", o.Code, o.Message)
			return out, notAppliedError{err}
		}
		return aip.ControlOutcome{}, &ControlRejectedError{Operation: op, Code: o.Code, Message: o.Message}
	case aip.OutcomeLease:
		if sr.req.Command.Operation == aip.OpOffline {
			return unavailable("answered offline with a lease")
		}
		if o.Lease != nil {
			l := localLease(*o.Lease, cr.IssuedAt.Time, sent)
			o.Lease = &l
		}
	case aip.OutcomeOffline:
		if sr.req.Command.Operation != aip.OpOffline {
			return unavailable("answered %s with an offline outcome", op)
		}
	}
	return o, nil
}
