package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Rejection reasons of the checks made before the registry (the "reason"
// label of aip_connector_control_rejections_total); registry rejections
// use their registry.LifecycleRule.
const (
	reasonTooLarge       = "too_large"
	reasonMalformed      = "malformed"
	reasonWindow         = "window"
	reasonNotProvisioned = "not_provisioned"
	reasonSigner         = "signer"
	reasonSignature      = "signature"
	reasonReplicaBusy    = "replica_busy"
	// Unavailable (503) reasons: the body could not be read, the registry
	// failed, the service is not running, the replica's registry record was
	// held by another transaction (the request was not decided; the others
	// coalesced with it were), the sender closed its connection while the
	// request waited for the registry (nobody reads the answer; it says
	// nothing of the registry).
	reasonRead       = "read"
	reasonStore      = "store"
	reasonNotRunning = "not_running"
	reasonHeld       = "replica_held"
	reasonSenderGone = "sender_gone"
)

// MaxRequestsPerReplica bounds the lifecycle requests of one replica being
// decided at once (queued for a batch or in one). A host sends one request
// at a time, and at most resends it while the first is still queued, so
// only a broken or compromised host reaches the bound; its further
// requests are answered 503 at once (nothing decided, the request ID not
// consumed) instead of queueing, so one replica flooding the service
// cannot push every other replica's heartbeats past their timeouts.
const MaxRequestsPerReplica = 4

// maxQuotedReplicaID bounds what the answer, the log and the trace quote
// of a replica ID that is no replica record ID.
const maxQuotedReplicaID = 80

// maxQuotedDID bounds what the answer and the log quote of a signer DID
// that is not the replica's: anyone can send one, up to a body's worth,
// and an Ed25519 did:key is 56 bytes.
const maxQuotedDID = 100

// Outcomes (the "outcome" label of aip_connector_control_requests_total).
// An unhealthy heartbeat is answered with a lease that ends at once and
// takes the replica offline: it counts as unhealthy, not as a lease.
const (
	outcomeLease       = "lease"
	outcomeOffline     = "offline"
	outcomeUnhealthy   = "unhealthy"
	outcomeRejected    = "rejected"
	outcomeUnavailable = "unavailable"
)

// answer is what the service tells one lifecycle request.
type answer struct {
	status    int
	requestID string
	op        aip.Operation
	replicaID string
	outcome   aip.ControlOutcome
	reason    string // rejection reason or rule; "" on success
	replayed  bool
	// unhealthy is set when the answer is a heartbeat's that took (or, a
	// replay, had taken) the replica offline as unhealthy.
	unhealthy bool
	// decided is set when the registry decided the request (a lease, an
	// offline state or a rejection by its rules): it answers again.
	decided bool
	// authenticated is set once the request's signature verified as the
	// replica's (step 5): only then does its span continue the host's
	// trace.
	authenticated bool
	// signerDID and provisionedDID are set when the signer is not the
	// replica (step 4): the DID the request names, cut short, and the one
	// the registry holds, which only the log shows.
	signerDID, provisionedDID string
	// waited is set on a rejection for the request's window: how long
	// before the control plane read it the request was signed. resend is
	// set when the same request ID was already rejected for its window
	// (the host's retries of a request held up somewhere), which is
	// logged at debug.
	waited time.Duration
	resend bool
	err    error // the underlying error, for logs and spans
}

func (a *answer) label() string {
	if a.op.Valid() {
		return string(a.op)
	}
	return "unknown"
}

func (a *answer) reject(status int, reason string, err error, format string, args ...any) *answer {
	a.status, a.reason, a.err = status, reason, err
	a.outcome = aip.RejectedOutcome(aip.CodeControlRejected, fmt.Sprintf(format, args...), false)
	return a
}

func (a *answer) unavailable(reason string, err error, message string) *answer {
	a.status, a.reason, a.err = http.StatusServiceUnavailable, reason, err
	a.outcome = aip.RejectedOutcome(aip.CodeControlUnavailable, message, true)
	return a
}

// storeFailed answers a registry read or decision that failed with err:
// reasonStore, unless ctx, the request's, ended first — the sender closed
// its connection (a host giving up on a slow answer, or stopping), which
// cut the wait short and says nothing of the registry, so it must not
// start the registry-outage log.
func (a *answer) storeFailed(ctx context.Context, err error, message string) *answer {
	if ctx.Err() != nil {
		return a.unavailable(reasonSenderGone, err, "the sender closed its connection before the request was decided; resend the same request")
	}
	return a.unavailable(reasonStore, err, message)
}

// handleControl answers POST /aip/v1/connector-control.
func (s *Service) handleControl() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		a := s.process(r.Context(), w, r)
		s.respond(w, a)
		s.m.observeRequest(a, time.Since(start))
		// The span, from start, continues the host's trace (its W3C
		// traceparent header) only when the request verified as the
		// replica's: one that did not (anyone can send it) is a root of
		// its own, so nobody can hang failed spans under a trace of
		// their choice. Nothing process calls makes spans of its own.
		parent := r.Context()
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start)}
		if a.authenticated {
			parent = propagation.TraceContext{}.Extract(parent, propagation.HeaderCarrier(r.Header))
		} else {
			opts = append(opts, trace.WithNewRoot())
		}
		_, span := s.tracer.Start(parent, "controlplane.lifecycle", opts...)
		span.SetAttributes(
			attribute.String("aip.control.operation", a.label()),
			attribute.String("aip.control.request_id", a.requestID),
			attribute.String("aip.replica_id", a.replicaID),
			attribute.String("aip.control.outcome", string(a.outcome.Status)),
			attribute.Bool("aip.control.replayed", a.replayed),
		)
		if a.outcome.Status == aip.OutcomeRejected {
			span.SetStatus(codes.Error, a.outcome.Message)
		}
		span.End()
		s.logAnswer(a)
	})
}

// process runs the checks in the documented order and applies the command.
func (s *Service) process(ctx context.Context, w http.ResponseWriter, r *http.Request) *answer {
	a := &answer{}
	// 1. The body.
	if r.ContentLength > aip.MaxControlBytes {
		return a.reject(http.StatusRequestEntityTooLarge, reasonTooLarge, nil,
			"the request body is %d bytes; a lifecycle request is at most %d", r.ContentLength, aip.MaxControlBytes)
	}
	// Read within the budget of unauthenticated bodies (its peer's share,
	// then the whole), and at its minimum rate.
	reserve := int64(aip.MaxControlBytes)
	if r.ContentLength >= 0 {
		reserve = r.ContentLength
	}
	release, err := s.reads.Acquire(ctx, r.RemoteAddr, reserve)
	if err != nil {
		return a.unavailable(reasonSenderGone, err, "the sender closed its connection while its request waited to be read; resend the same request")
	}
	_ = s.reads.SetReadDeadline(w, r, reserve) // the server's ReadTimeout still bounds a wrapped writer
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, aip.MaxControlBytes))
	release()
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return a.reject(http.StatusRequestEntityTooLarge, reasonTooLarge, err,
				"the request body exceeds %d bytes, the limit of a lifecycle request", aip.MaxControlBytes)
		}
		return a.unavailable(reasonRead, err, "the request body could not be read; resend the same request")
	}
	recv, err := aip.OpenControlRequest(body)
	if err != nil {
		return a.reject(http.StatusForbidden, reasonMalformed, err, "malformed lifecycle request: %v", err)
	}
	req := &recv.Request
	a.requestID, a.op = req.RequestID, req.Command.Operation
	// a.replicaID is what the answer, the log and the trace quote: an ID
	// no replica record can have (anyone can send one, up to a body's
	// worth) is cut short from here on, whichever check refuses it.
	replicaID := req.Command.ReplicaID()
	a.replicaID = replicaID
	if aip.ValidateRecordID(aip.PrefixReplica, replicaID) != nil {
		a.replicaID = aip.TruncateUTF8(replicaID, maxQuotedReplicaID)
	}
	// 2. The freshness window.
	now := s.cfg.Now()
	if err := aip.CheckWindow(now, req.IssuedAt.Time, req.ExpiresAt.Time); err != nil {
		a.waited = now.Sub(req.IssuedAt.Time)
		a.resend = a.requestID != "" && s.windowRejected.seen(a.requestID)
		if errors.Is(err, aip.ErrMessageExpired) {
			if from, to, ok := s.stall.stop(now, req.IssuedAt.Time, req.ExpiresAt.Time); ok {
				// The control plane was the one stopped: the request
				// aged unread in its socket; the clocks are not at fault.
				return a.reject(http.StatusForbidden, reasonWindow, err,
					"%v: the request, signed at %s, waited %s before the control plane read it: the control plane did not run from %s to %s (%s; the process was stopped or starved), so the request's signed window passed unread; "+
						"this is not a clock problem, and the host's next request is read in time",
					aip.ErrMessageExpired, aip.At(req.IssuedAt.Time), a.waited.Round(time.Second),
					aip.At(from), aip.At(to), to.Sub(from).Round(time.Second))
			}
		}
		return a.reject(http.StatusForbidden, reasonWindow, err, "%v", err)
	}
	if a.replicaID == "" {
		return a.reject(http.StatusForbidden, reasonMalformed, nil, "the %s command names no replica", a.op)
	}
	if err := aip.ValidateRecordID(aip.PrefixReplica, replicaID); err != nil {
		// No replica record has such an ID (registry records check it
		// since the first schema): refused without a registry lookup, so
		// that an unauthenticated request cannot make one (a.replicaID,
		// quoted in the log and the trace, is cut short).
		return a.reject(http.StatusForbidden, reasonNotProvisioned, err,
			"%v: it is not a replica ID, so no replica of that ID is pre-provisioned", err)
	}
	// 3. The replica is pre-provisioned.
	key, err := s.keys.get(ctx, a.replicaID)
	switch {
	case errors.Is(err, registry.ErrNotFound):
		return a.reject(http.StatusForbidden, reasonNotProvisioned, err,
			"replica %s"+aip.NotProvisionedPhrase+" (offline, with this host's DID) before the host registers", a.replicaID)
	case err != nil:
		return a.storeFailed(ctx, err, "the registry could not be read; resend the same request")
	}
	// 4. The signer is the replica. The answer, which anyone may get,
	// does not show the DID the registry holds; the log does, for the
	// operator to compare.
	if req.SignerDID != key.did {
		a.signerDID, a.provisionedDID = aip.TruncateUTF8(req.SignerDID, maxQuotedDID), key.did
		return a.reject(http.StatusForbidden, reasonSigner, nil,
			"signer_did %s"+aip.SignerNotProvisionedPhrase+"%s: the registry holds the peer_did of that replica's entry in the fleet file "+
				"(the control plane logs it with this rejection); start the host with the signing key of that DID "+
				"(`aipfleet keygen --did-of FILE` prints a key file's DID), or set that entry's peer_did to %s and apply the fleet file again",
			a.signerDID, a.replicaID, a.signerDID)
	}
	// 5. The signature.
	if err := recv.Signed.Verify(key.pub); err != nil {
		return a.reject(http.StatusForbidden, reasonSignature, err, "%v", err)
	}
	a.authenticated = true
	// 6. The digest.
	digest, err := aip.ControlRequestDigest(req)
	if err != nil {
		return a.reject(http.StatusForbidden, reasonMalformed, err, "malformed lifecycle request: %v", err)
	}
	// 7. Replay and the operation's rules, atomically with the change.
	if !s.running() {
		return a.unavailable(reasonNotRunning, ErrNotRunning, "the lifecycle service is not running; resend the same request")
	}
	if !s.busy.acquire(a.replicaID) {
		return a.unavailable(reasonReplicaBusy, nil, fmt.Sprintf(
			"replica %s already has %d lifecycle requests being decided; wait for their answers, then resend", a.replicaID, MaxRequestsPerReplica))
	}
	defer s.busy.release(a.replicaID)
	res, err := s.batch.submit(ctx, registry.LifecycleCommand{
		RequestID: req.RequestID, Digest: digest, ExpiresAt: req.ExpiresAt.Time,
		Command: req.Command, LeaseTTL: s.cfg.LeaseTTL,
	})
	if err != nil {
		return a.storeFailed(ctx, err, "the registry could not decide the request; resend the same request")
	}
	if errors.Is(res.Err, registry.ErrStorage) {
		// Not decided (the replica was held by another registry
		// transaction): nothing committed or claimed. Not the
		// registry-outage log of reasonStore: the registry answers.
		return a.unavailable(reasonHeld, res.Err, fmt.Sprintf(
			"the registry record of replica %s is held by another transaction, so the request was not decided; resend the same request", a.replicaID))
	}
	a.decided = true
	if res.Err != nil {
		var rej *registry.LifecycleRejection
		if errors.As(res.Err, &rej) {
			return a.reject(http.StatusForbidden, string(rej.Rule), res.Err, "%s: %s", rej.Rule, rej.Reason)
		}
		return a.reject(http.StatusForbidden, reasonMalformed, res.Err, "%v", res.Err)
	}
	a.status, a.outcome, a.replayed = http.StatusOK, res.Outcome, res.Replayed
	a.unhealthy = a.op == aip.OpHeartbeat && res.Replica.Status == aip.ReplicaOffline
	return a
}

// respond writes the signed answer, or the unsigned 500 when signing fails.
func (s *Service) respond(w http.ResponseWriter, a *answer) {
	now := s.cfg.Now()
	resp := aip.ControlResponse{
		RequestID: a.requestID, IssuedAt: aip.At(now), ExpiresAt: aip.At(now.Add(aip.MaxMessageLifetime)),
		SignerDID: s.key.DID(), Outcome: a.outcome,
	}
	raw, err := s.seal(s.key, aip.SignedResponseField, &resp)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if err != nil {
		s.log.Error("sign lifecycle response", "request_id", a.requestID, "error", err)
		a.status = http.StatusInternalServerError
		w.WriteHeader(http.StatusInternalServerError)
		writeBody(w, errorBody(aip.NewProtocolError(aip.CodeControlResponseSigning, aip.CategoryPermanent, false, 0, "the control plane could not sign its response")))
		return
	}
	w.WriteHeader(a.status)
	writeBody(w, raw)
}

// logAnswer logs one answer: unavailable (warn; a registry failure only
// when it starts, then debug until the registry decides a request again —
// a lease, an offline state or a rejection by its rules — which is logged
// at info), rejected (info; a resent copy of a request already rejected
// for its window at debug), a heartbeat that took its replica offline as
// unhealthy (a transition at warn, outcome=unhealthy), a lease renewed by a heartbeat
// (debug: the hot path, so nothing is built unless debug is on) or any
// other transition (info).
func (s *Service) logAnswer(a *answer) {
	const (
		unavailable = iota
		rejected
		renewed
		transition
	)
	kind, level, msg := transition, slog.LevelInfo, "lifecycle transition"
	switch {
	case a.outcome.Status == aip.OutcomeRejected && a.outcome.Retryable:
		kind, level, msg = unavailable, slog.LevelWarn, "lifecycle request unavailable"
	case a.outcome.Status == aip.OutcomeRejected:
		kind, level, msg = rejected, slog.LevelInfo, "lifecycle request rejected"
	case a.unhealthy:
		// The message stays "lifecycle transition" (what log searches and
		// the test fleets look for); the level and outcome say it.
		level = slog.LevelWarn
	case a.op == aip.OpHeartbeat && a.outcome.Lease != nil && a.outcome.Lease.ExpiresAt.After(s.cfg.Now()):
		kind, level, msg = renewed, slog.LevelDebug, "lease renewed"
	}
	ctx := context.Background()
	switch {
	case kind == unavailable && a.reason == reasonSenderGone:
		level = slog.LevelDebug // nobody reads it; not the registry's doing
	case kind == rejected && a.resend:
		// A copy of a request already rejected (and logged) for its
		// window: the host's retries of one request held up somewhere.
		level = slog.LevelDebug
	case kind == unavailable && a.reason == reasonStore:
		// The registry failing fails every replica's heartbeat: a line
		// per request would be the fleet's heartbeat rate for as long as
		// the database is away. The first failure is logged (warn) and
		// the others at debug, until a request is decided again.
		if s.storeDown.CompareAndSwap(false, true) {
			s.log.LogAttrs(ctx, slog.LevelWarn, "lifecycle requests unavailable: the registry failed; hosts resend, and later failures are logged at debug until it answers again",
				slog.String("operation", a.label()), slog.String("replica_id", a.replicaID), slog.String("error", errString(a.err)))
			return
		}
		level = slog.LevelDebug
	case a.decided && s.storeDown.Load():
		if s.storeDown.CompareAndSwap(true, false) {
			s.log.LogAttrs(ctx, slog.LevelInfo, "lifecycle requests decided again: the registry answers",
				slog.String("operation", a.label()), slog.String("replica_id", a.replicaID))
		}
	}
	if !s.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 9)
	attrs = append(attrs, slog.String("operation", a.label()), slog.String("replica_id", a.replicaID),
		slog.String("request_id", a.requestID), slog.Int("status", a.status))
	switch kind {
	case unavailable:
		attrs = append(attrs, slog.String("reason", a.reason), slog.String("error", errString(a.err)))
	case rejected:
		attrs = append(attrs, slog.String("reason", a.reason), slog.String("message", a.outcome.Message))
		if a.provisionedDID != "" {
			attrs = append(attrs, slog.String("signer_did", a.signerDID), slog.String("provisioned_did", a.provisionedDID))
		}
		if a.reason == reasonWindow {
			attrs = append(attrs, slog.String("waited", a.waited.Round(time.Millisecond).String()), slog.Bool("resend", a.resend))
		}
	case renewed:
		attrs = append(attrs, slog.Uint64("sequence", a.outcome.Lease.Sequence), slog.Bool("replayed", a.replayed))
	default:
		if a.outcome.Lease != nil {
			attrs = append(attrs, slog.Uint64("sequence", a.outcome.Lease.Sequence), slog.String("lease_expires_at", a.outcome.Lease.ExpiresAt.String()))
		}
		outcome := string(a.outcome.Status)
		if a.unhealthy {
			outcome = outcomeUnhealthy
			attrs = append(attrs, slog.String("detail", "the heartbeat said the connector is not ready: the replica is offline until it reports ready again; read its /ready"))
		}
		attrs = append(attrs, slog.String("outcome", outcome), slog.Bool("replayed", a.replayed))
	}
	s.log.LogAttrs(ctx, level, msg, attrs...)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// replicaSlots counts each replica's requests being decided, up to
// MaxRequestsPerReplica.
type replicaSlots struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *replicaSlots) acquire(replicaID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[replicaID] >= MaxRequestsPerReplica {
		return false
	}
	if r.n == nil {
		r.n = make(map[string]int)
	}
	r.n[replicaID]++
	return true
}

func (r *replicaSlots) release(replicaID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n[replicaID]--; r.n[replicaID] <= 0 {
		delete(r.n, replicaID)
	}
}
