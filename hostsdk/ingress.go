package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/readbudget"
)

// Error codes of the native ingress.
const (
	// Unsigned (the request could not be read as an envelope).
	CodeSchemaInvalid   = "schema.envelope.invalid"
	CodeDecodeInvalid   = "envelope.decode.invalid"
	CodeTooLarge        = "envelope.too_large"
	CodeResponseSigning = "connector_host.response_signing"
	// CodeAuthentication is unsigned too: the message is not signed by the
	// pinned dispatcher (see unauthenticated).
	CodeAuthentication = "connector_host.authentication"
	// Signed.
	CodeRouteMismatch       = "connector_host.route_mismatch"
	CodeNotReady            = "connector_host.not_ready"
	CodeCapacity            = "connector_host.capacity"
	CodeReplay              = "connector_host.replay"
	CodeIdempotencyConflict = "connector_host.idempotency_conflict"
	CodeActionInProgress    = "connector_host.action_in_progress"
	CodeExecution           = "connector_host.execution"
	CodeOutcomeUnknown      = "connector_host.outcome_unknown"
	CodeStorageUnavailable  = "connector_host.storage_unavailable"
	CodeInputInvalid        = "connector_host.input_invalid"
	CodeOutputInvalid       = "connector_host.output_invalid"
	CodeCapabilityUnknown   = "connector_host.capability_unknown"
	CodeUnsupportedMessage  = "connector_host.unsupported_message"
	// CodeActionExpired refuses an action (or its cancel) this replica may
	// have run and then pruned from its journal after Config.ActionRetention,
	// or that was routed to it before its journal served it (an earlier
	// journal of the replica ID is gone: origin.go): it is never run
	// again; send a new action ID.
	CodeActionExpired = "connector_host.action_expired"
)

// Freshness of native messages: a message older than MaxMessageAge or sent
// more than MaxMessageSkew in the future is refused as a replay; accepted
// message IDs stay in the replay registry until sent_at + MaxMessageAge +
// MaxMessageSkew.
// They are aip.MaxEnvelopeAge and aip.MaxEnvelopeSkew, which the
// dispatcher's reconciliation relies on.
const (
	MaxMessageAge  = aip.MaxEnvelopeAge
	MaxMessageSkew = aip.MaxEnvelopeSkew
	// MaxResultBytes bounds an action result's JSON: the signed answer
	// that carries it must stay within aip.MaxMessageBytes, which is what
	// a dispatcher reads. A connector's larger result is journaled as
	// outcome_unknown (the action ran; its result cannot be returned).
	MaxResultBytes = aip.MaxMessageBytes - 64<<10
	// CapacityRetryAfter is the retry hint of connector_host.capacity.
	CapacityRetryAfter = 100 * time.Millisecond
)

// ContentTypeNDJSON is the media type of a streaming action's response: one
// signed envelope per line, stream chunks in sequence order, then the final
// action_result (or error) envelope.
const ContentTypeNDJSON = "application/x-ndjson"

// Why an action's context was cancelled: context.Cause of the ctx Handle,
// HandleStream or a read's call gets is one of these once ctx is done
// (errors.Is), so a connector can tell a caller's cancel, for which the
// host also calls its Canceler, from the action's timeout and from the
// host's shutdown, which tells the provider nothing: a connector whose
// provider runs on (a started run, a job) can say so.
var (
	// ErrActionCancelled: an action-scoped cancel arrived for the action.
	ErrActionCancelled = errors.New("hostsdk: action cancelled by an action-scoped cancel")
	// ErrActionTimeout: the action's timeout_ms passed.
	ErrActionTimeout = errors.New("hostsdk: action timed out")
	// ErrHostStopping: the host cancelled every running action, its drain
	// timeout having passed (or the host being closed); no Canceler is
	// called.
	ErrHostStopping = errors.New("hostsdk: action cancelled by the host's shutdown (its drain timeout passed)")
)

var errorSource = json.RawMessage(`{"component":"` + Component + `"}`)

// runningAction is an action being handled in this process.
type runningAction struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	mu     sync.Mutex
	call   *Call
}

func (ra *runningAction) setCall(c *Call) { ra.mu.Lock(); ra.call = c; ra.mu.Unlock() }
func (ra *runningAction) getCall() *Call  { ra.mu.Lock(); defer ra.mu.Unlock(); return ra.call }

// exchange is one native request and its response.
type exchange struct {
	h      *Host
	w      http.ResponseWriter
	r      *http.Request
	ctx    context.Context
	req    *aip.Envelope
	stream bool // answer with NDJSON lines
	// streamStarted is set once the NDJSON 200 header was written.
	streamStarted bool
	span          trace.Span
	// msgExpiry is how long the message ID stays in the replay registry;
	// claimed is set once it is there.
	msgExpiry time.Time
	claimed   bool
	// route is the message's checked security.connector_route; echoRoute
	// makes the response carry it (refusals do: see refuse).
	route     *aip.ConnectorRoute
	echoRoute bool
	// assigned is assignedAt(route), the earliest time the routed action
	// can have arrived here.
	assigned time.Time
	// abandonedCall, set when the connector call was abandoned
	// (invokeBounded), delivers what the call returns; the call keeps the
	// action's in-flight slot until then.
	abandonedCall <-chan invoked
	// abandonedStatus is the state the abandoned call's action was
	// settled to.
	abandonedStatus aip.ActionState
}

// handleMessages serves POST /aip/v1/messages.
func (h *Host) handleMessages() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.m.requests.Inc()
		x := &exchange{h: h, w: w, r: r, ctx: r.Context()}
		if !x.serve() {
			h.m.rejected.Inc()
		}
		if x.span != nil {
			x.span.End()
		}
	})
}

// MaxIngressReadBytes bounds the memory the bodies of native messages take
// while they are read, before their signature is checked: anyone who can
// reach the listener can send them. A message reserves its Content-Length
// (aip.MaxMessageBytes when it sends none) and gives it back once its
// signature is checked; while the budget is spent it waits. One remote
// address (an IPv6 /64) holds at most MaxIngressReadBytesPerPeer of it: a
// message over its sender's share waits for that sender's own reads only,
// so a sender that opens many connections and trickles its bodies cannot
// hold the whole budget, and the dispatcher's messages, from their own
// addresses, keep being read. The dispatcher's messages are read in
// milliseconds, so only slow or hostile senders wait. A message over its
// share is never refused: the refusal could not be signed (the message is
// not read yet), and the dispatcher settles an unsigned answer
// outcome_unknown; a wait costs the dispatcher only the time its own reads
// take.
//
// Once its reservation is granted, a body must arrive at 256 KiB/s after a
// grace of 5 s: a 4 MiB message has 21 s, a small one 5 s, instead of the
// server's 60 s ReadTimeout; a slower one is refused unsigned (400) and
// gives its reservation back.
const (
	MaxIngressReadBytes = 64 << 20
	// MaxIngressReadBytesPerPeer is a quarter of the budget: four of the
	// largest messages at once from one address.
	MaxIngressReadBytesPerPeer = MaxIngressReadBytes / readbudget.DefaultPeerShareDivisor
)

// ingressWaitingHelp is the help of MetricIngressWaiting.
const ingressWaitingHelp = "Native messages waiting to be read, by reason: budget (the bodies being read before their signature is checked hold the whole budget) or peer_share (their sender's other messages hold its share of it)."

// serve handles the request and reports whether it succeeded.
func (x *exchange) serve() bool {
	h := x.h
	reserve := int64(aip.MaxMessageBytes)
	if cl := x.r.ContentLength; cl > aip.MaxMessageBytes {
		return x.unsigned(http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the message exceeds %d bytes", aip.MaxMessageBytes))
	} else if cl >= 0 {
		reserve = cl
	}
	release, err := h.ingressBudget.Acquire(x.ctx, x.r.RemoteAddr, reserve)
	if err != nil {
		return false // the client went away while it waited
	}
	defer release()
	// Without a read deadline on the connection (a wrapped writer), the
	// server's ReadTimeout still bounds the read.
	_ = h.ingressBudget.SetReadDeadline(x.w, x.r, reserve)
	body, err := io.ReadAll(http.MaxBytesReader(x.w, x.r.Body, aip.MaxMessageBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return x.unsigned(http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("the message exceeds %d bytes", aip.MaxMessageBytes))
		}
		// The read error names the connection's addresses (the
		// replica's own behind a proxy): the unsigned answer, to anyone,
		// says only what happened.
		h.log.Debug("the body of a native message could not be read", "remote_addr", x.r.RemoteAddr, "error", err)
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			return x.unsigned(http.StatusBadRequest, CodeDecodeInvalid, fmt.Sprintf("the body did not arrive in time (at %d KiB/s at least, after a grace of %s)",
				readbudget.DefaultMinReadRate>>10, readbudget.DefaultReadGrace))
		}
		return x.unsigned(http.StatusBadRequest, CodeDecodeInvalid, "the body could not be read")
	}
	// One pass on the happy path: VerifyEnvelope canonicalizes, checks the
	// signature, decodes and validates. Only a failure re-reads the body to
	// answer the reference's error in its order: schema, decode, signature.
	verified, verr := aip.VerifyEnvelope(body, "")
	release() // verified (a pinned dispatcher's message is bounded by its in-flight limit) or about to be refused
	if verr != nil {
		var env aip.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			return x.unsigned(http.StatusBadRequest, CodeSchemaInvalid, "not an AIP envelope: "+err.Error())
		}
		if env.AIPVersion == "" || env.MessageType == "" || env.MessageID == "" || env.SentAt.IsZero() || env.Body.Tag() == "" {
			return x.unsigned(http.StatusBadRequest, CodeSchemaInvalid, "an envelope needs aip_version, message_type, message_id, sent_at and a body with exactly one member")
		}
		if err := env.Validate(); err != nil {
			return x.unsigned(http.StatusBadRequest, CodeDecodeInvalid, err.Error())
		}
		if errors.Is(verr, aip.ErrMalformedEnvelope) {
			return x.unsigned(http.StatusBadRequest, CodeDecodeInvalid, verr.Error())
		}
		x.begin(&env, false)
		return x.unauthenticated("the message is not signed by the pinned dispatcher: " + verr.Error())
	}
	env := verified.Envelope
	// The dispatcher's signature and identity.
	if verified.SignerDID != h.gatewayDID {
		x.begin(&env, false)
		return x.unauthenticated("the message is signed by " + verified.SignerDID + ", not the pinned dispatcher")
	}
	x.begin(&env, true)
	// The message is the dispatcher's. One too old is refused for good: it
	// is never accepted later, so its ID is not claimed. Every other
	// refusal from here on claims the message ID first (refuse), so the
	// refused envelope can never execute later: not once a fence token or
	// a sent_at ahead of this replica's clock is no longer ahead, after
	// the dispatcher took the signed refusal for "did not run".
	now := h.cfg.Now()
	sent := env.SentAt.Time
	if sent.Before(now.Add(-MaxMessageAge)) {
		return x.fail(http.StatusConflict, outsideWindow(env.SentAt))
	}
	x.msgExpiry = sent.Add(MaxMessageAge + MaxMessageSkew)
	if pe := h.checkSender(&env); pe != nil {
		return x.refuse(http.StatusUnauthorized, pe)
	}
	// The pinned route.
	route, pe := h.checkRoute(&env)
	if pe != nil {
		return x.refuse(http.StatusForbidden, pe)
	}
	x.route, x.assigned = route, assignedAt(route)
	if b := &env.Body; b.Action != nil || b.Cancel != nil {
		if pe := x.checkAssignedAt(now); pe != nil {
			return x.refuse(http.StatusForbidden, pe)
		}
	}
	if sent.After(now.Add(MaxMessageSkew)) {
		return x.refuse(http.StatusConflict, outsideWindow(env.SentAt))
	}
	// Every message ID is claimed in the replay registry before it is
	// answered, refusals included: a refused envelope can never execute
	// later. An action's claim commits with its journal record (see action).
	if env.Body.Action != nil {
		return x.action(env.Body.Action, route)
	}
	if !x.claim() {
		return false
	}
	switch b := &env.Body; {
	case b.Cancel != nil:
		if status, pe := x.checkCredentialRevision(route); pe != nil {
			return x.refuse(status, pe)
		}
		return x.cancel(b.Cancel, route)
	case b.ActionStatusQuery != nil:
		return x.statusQuery(b.ActionStatusQuery.ActionID)
	}
	return x.fail(http.StatusBadGateway, aip.NewProtocolError(CodeUnsupportedMessage, aip.CategoryConnector, false, 0,
		fmt.Sprintf("a connector host does not handle %s messages", env.MessageType)))
}

// outsideWindow refuses a message whose sent_at is outside the accepted
// window.
func outsideWindow(sent aip.Timestamp) *aip.ProtocolError {
	return aip.NewProtocolError(CodeReplay, aip.CategoryPolicy, false, 0,
		fmt.Sprintf("sent_at %s is outside the accepted window (at most %s old, %s ahead)", sent, MaxMessageAge, MaxMessageSkew))
}

// begin records the request envelope and starts its span. The span joins
// the trace (and takes the baggage) the envelope names only when the
// pinned dispatcher signed it (signed); an unauthenticated message's span
// is a root of its own, so whoever can reach the listener cannot hang
// spans under a trace of its choice.
func (x *exchange) begin(env *aip.Envelope, signed bool) {
	x.req = env
	ctx := x.ctx
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("aip.message_type", string(env.MessageType)),
			attribute.String("aip.message_id", env.MessageID))}
	if signed {
		ctx = x.h.prop.Extract(ctx, propagation.MapCarrier(env.Trace))
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	x.ctx, x.span = x.h.tracer.Start(ctx, "hostsdk.message", opts...)
	x.stream = env.Body.Action != nil && env.Body.Action.Mode == aip.ModeStreaming
}

// gatewayPrincipal is the pinned dispatcher's principal: the service
// account of every action the connector is given.
func (h *Host) gatewayPrincipal() aip.Principal {
	return aip.Principal{ID: h.cfg.GatewayPrincipalID, Kind: aip.PrincipalService, TrustDomain: h.cfg.TrustDomain, DID: h.gatewayDID}
}

// checkSender compares the envelope's from with the pinned dispatcher.
func (h *Host) checkSender(env *aip.Envelope) *aip.ProtocolError {
	f := env.From
	mismatch := func(msg string) *aip.ProtocolError {
		return aip.NewProtocolError(CodeRouteMismatch, aip.CategoryAuth, false, 0, msg)
	}
	switch {
	case f == nil:
		return mismatch("the message has no from principal")
	case f.ID != h.cfg.GatewayPrincipalID || f.Kind != aip.PrincipalService:
		return mismatch(fmt.Sprintf("from %s (%s) is not the dispatcher principal %s (service)", f.ID, f.Kind, h.cfg.GatewayPrincipalID))
	case f.TrustDomain != h.cfg.TrustDomain:
		return mismatch(fmt.Sprintf("from trust_domain %q is not %q", f.TrustDomain, h.cfg.TrustDomain))
	case f.DID != "" && f.DID != h.gatewayDID:
		return mismatch("from did is not the pinned dispatcher DID")
	}
	return nil
}

// checkRoute checks the addressee and the pinned security.connector_route
// against this replica.
func (h *Host) checkRoute(env *aip.Envelope) (*aip.ConnectorRoute, *aip.ProtocolError) {
	mismatch := func(format string, args ...any) (*aip.ConnectorRoute, *aip.ProtocolError) {
		return nil, aip.NewProtocolError(CodeRouteMismatch, aip.CategoryAuth, false, 0, fmt.Sprintf(format, args...))
	}
	p := &h.principal
	to := env.To
	if to == nil || to.ID != p.ID || to.Kind != p.Kind || (to.TrustDomain != "" && to.TrustDomain != p.TrustDomain) || (to.DID != "" && to.DID != p.DID) {
		return mismatch("the message is not addressed to this replica's principal %s (%s)", p.ID, p.Kind)
	}
	// Every member of the route is one this host checks or hands on: a
	// member it does not know may be a constraint it would silently not
	// enforce, and one that matches a field only when case is ignored is
	// read differently by the reference (aip.ErrCaseVariantMember).
	var wire struct {
		aip.ConnectorRoute
		// ApprovalAuthorization is the approval record the dispatcher
		// verified for an action that carries an approval (reference
		// §7.3).
		ApprovalAuthorization json.RawMessage `json:"approval_authorization"`
	}
	ok, err := env.SecurityValueStrict(aip.SecurityConnectorRoute, &wire)
	if !ok {
		return mismatch("security.connector_route is missing")
	}
	if err != nil {
		return mismatch("security.connector_route is malformed: %v", err)
	}
	route := wire.ConnectorRoute
	c := &h.cfg
	for _, f := range []struct{ name, got, want string }{
		{"tenant_id", route.TenantID, c.TenantID},
		{"instance_id", route.InstanceID, c.InstanceID},
		{"replica_id", route.ReplicaID, c.ReplicaID},
		{"version_id", route.VersionID, c.VersionID},
		{"manifest_digest", route.ManifestDigest, h.manifestDigest},
	} {
		if f.got != f.want {
			return mismatch("route %s %q does not match this replica (%q)", f.name, f.got, f.want)
		}
	}
	// The fence token is the registry's: route_ and a UUIDv7 carrying the
	// assignment time, which the prune horizon relies on (assignedAt).
	if err := aip.ValidateID(aip.PrefixRoute, route.FenceToken); err != nil {
		return mismatch("route fence_token is not a registry fence token (%s and a UUIDv7): %v", aip.PrefixRoute, err)
	}
	// The routed action is one the dispatcher named with an action ID, as
	// every action this replica journals is (aip.Action.Validate): a
	// cancel or status query for any other string can name no action
	// here, and is refused before the journal is read or written (a
	// cancel would journal a record under it; one the journal cannot
	// hold, with NUL, would read as a storage outage).
	if err := aip.ValidateID(aip.PrefixAction, route.ActionID); err != nil {
		return mismatch("route action_id is not an action ID (%s and a UUIDv7): %v", aip.PrefixAction, err)
	}
	b := &env.Body
	authorized := present(wire.ApprovalAuthorization)
	switch {
	case b.Action != nil && present(b.Action.Approval) != authorized:
		return mismatch("the action's approval and the route's approval_authorization must be present together (approval %t, approval_authorization %t)",
			present(b.Action.Approval), authorized)
	case b.Action == nil && authorized:
		return mismatch("a %s carries no approval_authorization in its route; only an action with an approval does", env.MessageType)
	}
	switch {
	case b.Action != nil:
		a := b.Action
		if route.ActionID != a.ID || route.CapabilityID != a.CapabilityID {
			return mismatch("route pins action %s/%s, the message carries %s/%s", route.ActionID, route.CapabilityID, a.ID, a.CapabilityID)
		}
		routeStreaming := route.OriginalMode != nil && *route.OriginalMode == aip.ModeStreaming
		if routeStreaming != (a.Mode == aip.ModeStreaming) {
			return mismatch("action mode %q does not match the route's original_mode", a.Mode)
		}
		if a.Callback != nil {
			return mismatch("action callbacks are not accepted: a streaming action's chunks are returned in the response as NDJSON")
		}
	case b.Cancel != nil:
		if b.Cancel.Target.Session != "" {
			return mismatch("only action-scoped cancel is accepted")
		}
		if b.Cancel.Target.Action != route.ActionID {
			return mismatch("cancel target %s is not the routed action %s", b.Cancel.Target.Action, route.ActionID)
		}
	case b.ActionStatusQuery != nil:
		if b.ActionStatusQuery.ActionID != route.ActionID {
			return mismatch("status query for %s is not the routed action %s", b.ActionStatusQuery.ActionID, route.ActionID)
		}
	}
	return &route, nil
}

// present reports whether an optional JSON member is set (not absent or
// null).
func present(raw json.RawMessage) bool {
	return len(raw) > 0 && string(raw) != "null"
}

// checkAssignedAt refuses an action or cancel whose route's assignment
// time, less the allowed skew (x.assigned), is after this replica's clock:
// the registry's clock is ahead of it. The prune horizon relies on every
// journaled action having arrived no earlier than x.assigned; an action
// journaled before that time could, once pruned, be delivered again under
// its route and look newer than the horizon, and run a second time.
func (x *exchange) checkAssignedAt(now time.Time) *aip.ProtocolError {
	if x.assigned.After(now) {
		return aip.NewProtocolError(CodeRouteMismatch, aip.CategoryAuth, false, 0, fmt.Sprintf(
			"the route's fence token was issued at %s, more than %s after this replica's clock (%s): synchronise the registry's and the replica's clocks",
			x.assigned.Add(MaxMessageSkew).UTC().Format(time.RFC3339Nano), MaxMessageSkew, now.UTC().Format(time.RFC3339Nano)))
	}
	return nil
}

// action handles an Action body.
func (x *exchange) action(a *aip.Action, route *aip.ConnectorRoute) bool {
	h := x.h
	x.span.SetAttributes(attribute.String("aip.action_id", a.ID), attribute.String("aip.capability_id", a.CapabilityID))
	cap := h.caps[a.CapabilityID]
	if cap == nil || cap.cap.Kind == aip.KindResource {
		return x.refuse(http.StatusBadRequest, aip.NewProtocolError(CodeCapabilityUnknown, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("capability %s is not an invocable capability of this connector's manifest", a.CapabilityID)))
	}
	if a.Identity != nil && a.Identity.Tenant != nil && a.Identity.Tenant.ID != h.cfg.TenantID {
		return x.refuse(http.StatusForbidden, aip.NewProtocolError(CodeRouteMismatch, aip.CategoryAuth, false, 0,
			"the action's tenant is not this replica's tenant"))
	}
	digest, err := aip.DigestJSON(a.Input)
	if err != nil {
		if !x.claim() {
			return false
		}
		return x.unsigned(http.StatusBadRequest, CodeDecodeInvalid, "action input: "+err.Error())
	}
	// What a delivery of the same action must repeat to be answered from
	// the journal.
	want := &journal.Action{CapabilityID: a.CapabilityID, IdempotencyKey: idempotencyKey(x.req, a), InputDigest: digest}
	ra, earlier := h.register(a.ID)
	if earlier != nil {
		if !x.claim() {
			return false
		}
		// The same action ID is being handled by another request: wait for
		// it, then answer from the journal. The wait is this delivery's
		// timeout_ms at most, so that the sender, which waits a little
		// longer, gets the signed action_in_progress (it then leaves the
		// reservation to the delivery that runs the action) rather than
		// no answer (which it would take for an uncertain outcome).
		var timeout <-chan time.Time
		if d, ok := actionTimeout(a); ok {
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-earlier.done:
		case <-x.ctx.Done():
			return x.fail(http.StatusConflict, aip.NewProtocolError(CodeActionInProgress, aip.CategoryTemporary, true, 1000,
				"action "+a.ID+" is still running"))
		case <-timeout:
			return x.fail(http.StatusConflict, aip.NewProtocolError(CodeActionInProgress, aip.CategoryTemporary, true, 1000,
				"action "+a.ID+" is still running, for an earlier delivery; ask for its status later"))
		}
		return x.journaled(a.ID, want)
	}
	defer h.unregister(a.ID, ra)
	// No other request of this process handles the action now. The signed
	// not_ready and capacity refusals tell the dispatcher that the action
	// did not start here (it settles the route as not run, or moves it
	// elsewhere): they are given only for an action the journal does not
	// hold either (refuseUnstarted). Before the host serves (the native
	// ingress served early, while the registration waits: early.go) no
	// action runs, whatever the lease.
	if !h.serving.Load() {
		return x.refuseUnstarted(a.ID, want, x.notStarted)
	}
	if !h.ready() {
		return x.refuseUnstarted(a.ID, want, x.notReady)
	}
	if h.beforeAcquire != nil {
		h.beforeAcquire()
	}
	ok, closed := h.inflight.acquire()
	if closed {
		return x.refuseUnstarted(a.ID, want, x.notReady)
	}
	if !ok {
		return x.refuseUnstarted(a.ID, want, func() bool {
			return x.refuse(http.StatusTooManyRequests, aip.NewProtocolError(CodeCapacity, aip.CategoryTemporary, true,
				uint64(CapacityRetryAfter.Milliseconds()), fmt.Sprintf("the replica runs its maximum of %d actions", h.cfg.MaxInFlight)))
		})
	}
	defer func() {
		if x.abandonedCall == nil {
			h.inflight.release()
			return
		}
		// The request is over (the action journaled and answered): the
		// slot is the abandoned call's until it returns.
		h.inflight.detach(a.ID)
		go h.awaitAbandoned(a, x.abandonedStatus, x.abandonedCall)
	}()
	// The route's credential revision, against the policy read now
	// (reference §5.5 step 6, after readiness and capacity). Its refusals
	// are given like those: before anything is journaled or run, with the
	// message ID claimed, and only for an action the journal does not
	// hold (one it holds is answered from its record).
	if status, pe := x.checkCredentialRevision(route); pe != nil {
		return x.refuseUnstarted(a.ID, want, func() bool { return x.refuse(status, pe) })
	}

	if err := validateJSON(cap.input, a.Input); err != nil {
		if !x.claim() {
			return false
		}
		if _, jerr := h.journal.Action(x.ctx, a.ID); jerr == nil {
			return x.journaled(a.ID, want)
		}
		return x.fail(http.StatusBadRequest, aip.NewProtocolError(CodeInputInvalid, aip.CategoryPermanent, false, 0,
			"input does not match the input_schema of "+a.CapabilityID+": "+err.Error()))
	}
	// A route older than this journal's service of the replica runs only
	// if the journal holds its action (AcceptAction then answers from the
	// record).
	if berr := h.beforeJournal(route); berr != nil {
		switch _, jerr := h.journal.Action(context.WithoutCancel(x.ctx), a.ID); {
		case errors.Is(jerr, journal.ErrNotFound):
			return x.expired(a.ID, berr)
		case jerr != nil:
			return x.storageUnavailable(jerr)
		}
	}
	// One durable commit claims the message and journals the action as
	// running, before the connector runs.
	jctx, jspan := x.journalSpan("accept", a.ID)
	now := h.cfg.Now()
	record := journal.Action{
		ActionID: a.ID, CapabilityID: a.CapabilityID, TenantID: h.cfg.TenantID,
		IdempotencyKey: want.IdempotencyKey, InputDigest: digest, FenceToken: route.FenceToken,
		MessageID: x.req.MessageID, ReceivedAt: now, AssignedAt: x.assigned,
	}
	acc, err := h.journal.AcceptAction(jctx, x.req.MessageID, x.msgExpiry, now, record)
	endSpan(jspan, err)
	switch {
	case errors.Is(err, journal.ErrPruned):
		return x.expired(a.ID, err)
	case errors.Is(err, journal.ErrInvalid):
		// A string of the action no journal can hold (not UTF-8 text, or
		// with NUL): nothing was written; refuse the message for good.
		if !x.claim() {
			return false
		}
		return x.fail(http.StatusBadRequest, aip.NewProtocolError(CodeInputInvalid, aip.CategoryPermanent, false, 0,
			"the action cannot be journaled: "+err.Error()))
	case err != nil:
		// The write may have committed even so: a connection lost after
		// the server's commit loses only its answer. One that did not (or
		// that the journal cannot tell about) makes storage not ready at
		// once: the storage check alone may pass where an action's write
		// does not (see storageRecheckMinBytes). The action did not start
		// here and is answered so, as before.
		switch rec, ours := x.acceptedByThisMessage(a.ID); {
		case !ours:
			h.writeFailedBy("accepting action "+a.ID, len(x.req.MessageID)+recordBytes(record), err)
			return x.storageUnavailable(err)
		case rec.Status != aip.StateRunning:
			x.claimed = true
			return x.answerJournaled(rec, want)
		}
		h.log.Warn("the journal write accepting the action failed, but it had committed; running the action", "action_id", a.ID, "error", err)
		x.claimed = true
		return x.execute(ra, a, cap, route)
	case !acc.Claimed:
		return x.replayed()
	case !acc.Created:
		x.claimed = true
		return x.answerJournaled(acc.Existing, want)
	}
	x.claimed = true
	return x.execute(ra, a, cap, route)
}

// acceptReadBackAttempts bounds the reads acceptedByThisMessage makes
// (with the backoff of finishAction between them) before it gives up.
const acceptReadBackAttempts = 5

// acceptedByThisMessage learns whether the AcceptAction of the request's
// action, which failed, committed nevertheless: ours is true when the
// journal holds the action as journaled by this very message (rec). The
// caller has registered the action ID, so no other request of this process
// can have journaled or run it meanwhile, and no other process writes to
// this journal; a record written by this message is this request's own,
// and the action it holds has not run. A read that fails is retried a few
// times; when none answers, ours is false, and a record the write may have
// left stays running until the next start's recovery settles it.
func (x *exchange) acceptedByThisMessage(actionID string) (rec journal.Action, ours bool) {
	h := x.h
	ctx := context.WithoutCancel(x.ctx)
	wait := finishBackoffMin
	for attempt := 1; ; attempt++ {
		rec, err := h.journal.Action(ctx, actionID)
		switch {
		case err == nil:
			return rec, rec.MessageID == x.req.MessageID
		case errors.Is(err, journal.ErrNotFound):
			return journal.Action{}, false
		case attempt == acceptReadBackAttempts || errors.Is(err, journal.ErrClosed):
			h.log.Error("the journal write accepting the action failed and the journal cannot tell whether it committed; if it did, the action stays running, without having run, until the next start's recovery settles it",
				"action_id", actionID, "message_id", x.req.MessageID, "attempts", attempt, "error", err)
			return journal.Action{}, false
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-h.actionBase.Done():
			t.Stop()
			attempt = acceptReadBackAttempts - 1 // one last read
		}
		wait = min(2*wait, finishBackoffMax)
	}
}

// actionTimeout is the action's timeout_ms as a Duration, false when it
// names none. It is capped in milliseconds: a larger value would overflow
// the Duration into a deadline already past.
func actionTimeout(a *aip.Action) (time.Duration, bool) {
	if a.TimeoutMS == nil || *a.TimeoutMS == 0 {
		return 0, false
	}
	return time.Duration(min(*a.TimeoutMS, uint64(math.MaxInt64/int64(time.Millisecond)))) * time.Millisecond, true
}

// refuseUnstarted answers with refusal (a signed not_ready or capacity)
// only when the journal holds no record of the action; the caller has
// registered the action ID, so no request of this process can start it
// meanwhile. An action the journal holds (it ran, or runs, here: a
// dispatcher's retry after a lost answer) is answered from its record, as
// any other delivery of it, and when the journal cannot tell, the answer is
// storage_unavailable: a refusal would say the action did not start here
// when it may have. So would one of an action the journal may have pruned
// (its route is not newer than the prune horizon): it is refused with
// action_expired, as when the replica is ready.
func (x *exchange) refuseUnstarted(actionID string, want *journal.Action, refusal func() bool) bool {
	ctx := context.WithoutCancel(x.ctx)
	a, err := x.h.journal.Action(ctx, actionID)
	switch {
	case errors.Is(err, journal.ErrNotFound):
		gone, herr := x.mayBeGone(ctx, actionID)
		switch {
		case herr != nil:
			return x.storageUnavailable(herr)
		case gone != nil:
			return x.expired(actionID, gone)
		}
		return refusal()
	case err != nil:
		return x.storageUnavailable(err)
	}
	if !x.claim() {
		return false
	}
	return x.answerJournaled(a, want)
}

func idempotencyKey(env *aip.Envelope, a *aip.Action) string {
	switch {
	case a.IdempotencyKey != "":
		return a.IdempotencyKey
	case env.IdempotencyKey != "":
		return env.IdempotencyKey
	}
	return a.ID
}

// register records that this request handles actionID; when another
// request already does, it returns that one instead.
func (h *Host) register(actionID string) (ra, earlier *runningAction) {
	h.runMu.Lock()
	defer h.runMu.Unlock()
	if ra := h.running[actionID]; ra != nil {
		return nil, ra
	}
	ctx, cancel := context.WithCancelCause(h.actionBase)
	ra = &runningAction{ctx: ctx, cancel: cancel, done: make(chan struct{})}
	h.running[actionID] = ra
	return ra, nil
}

func (h *Host) unregister(actionID string, ra *runningAction) {
	h.runMu.Lock()
	delete(h.running, actionID)
	h.runMu.Unlock()
	ra.cancel(context.Canceled)
	close(ra.done)
}

func (h *Host) lookupRunning(actionID string) *runningAction {
	h.runMu.Lock()
	defer h.runMu.Unlock()
	return h.running[actionID]
}

// execute runs a freshly journaled action and journals its outcome.
func (x *exchange) execute(ra *runningAction, a *aip.Action, cap *capability, route *aip.ConnectorRoute) bool {
	h := x.h
	projected := *a
	projected.Identity = h.tenant.identity(h.gatewayPrincipal())
	call := &Call{
		Action: &projected, Capability: cap.cap, Tenant: h.tenant.clone(),
		IdempotencyKey: idempotencyKey(x.req, a), MessageID: x.req.MessageID, Route: *route,
		Logger: h.log.With("action_id", a.ID, "capability_id", a.CapabilityID),
		state:  h.state, events: h.events,
	}
	ra.setCall(call)

	var (
		res      *aip.ActionResult
		err      error
		panicked any
		// abandonCause is what ended the context of an abandoned call.
		abandonCause error
	)
	if context.Cause(ra.ctx) == ErrActionCancelled {
		err = context.Canceled // cancelled before it started: never run
	} else {
		ctx := trace.ContextWithSpan(ra.ctx, x.span)
		if d, ok := actionTimeout(a); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeoutCause(ctx, d, ErrActionTimeout)
			defer cancel()
		}
		ctx, span := h.tracer.Start(ctx, "hostsdk.action "+a.CapabilityID,
			trace.WithAttributes(attribute.String("aip.action_id", a.ID), attribute.String("aip.capability_id", a.CapabilityID)))
		res, panicked, x.abandonedCall, err = x.invokeBounded(ctx, call, a)
		if x.abandonedCall != nil {
			abandonCause = context.Cause(ctx)
			err = fmt.Errorf("%w: %w", errAbandoned, abandonCause)
		}
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	status, result, detail := h.settle(ra.ctx, a, cap, res, err, panicked)
	if x.abandonedCall != nil {
		x.abandonedStatus = status
		if status == aip.StateOutcomeUnknown {
			h.log.Error("the connector did not return within the handle grace after the action's context ended; the action is journaled outcome_unknown and the call keeps its slot until it returns",
				"action_id", a.ID, "capability_id", a.CapabilityID, "cause", abandonCause, "handle_grace", h.cfg.HandleGrace)
		} else {
			h.log.Error("the connector did not return within the handle grace after the action's context ended; the read is journaled failed "+CodeInterrupted+" and the call keeps its slot until it returns",
				"action_id", a.ID, "capability_id", a.CapabilityID, "cause", abandonCause, "handle_grace", h.cfg.HandleGrace)
		}
	}
	var raw json.RawMessage
	if result != nil {
		switch raw, err = json.Marshal(result); {
		case err != nil:
			status, result, detail, raw = aip.StateOutcomeUnknown, nil, "the connector's result cannot be encoded: "+err.Error(), nil
		default:
			if err := carriable(raw); err != nil {
				// No answer could carry it (nor a retry's, nor a status
				// query's): the caller cannot learn what the action did,
				// and the journal would refuse one it cannot digest,
				// leaving the action running until a restart.
				status, result, detail = h.settle(ra.ctx, a, cap, nil,
					UnusableResult(cap.cap, "the connector's result "+err.Error()), nil)
				raw = nil
				if result != nil {
					raw, _ = json.Marshal(result)
				}
			}
		}
	}
	fctx, fspan := x.journalSpan("finish", a.ID)
	receipt, err := h.finishAction(fctx, a.ID, status, raw, detail, h.cfg.Now())
	endSpan(fspan, err)
	if errors.Is(err, journal.ErrConflict) {
		// The action is finished already: an earlier attempt whose answer
		// was lost committed (a connection that dropped after the
		// server's commit), or another writer finished it. Answer what the
		// journal holds, as every retry and status query will.
		h.log.Warn("the action's outcome was journaled already; answering the journaled one", "action_id", a.ID, "status", status, "error", err)
		return x.journaled(a.ID, nil)
	}
	if err != nil {
		return x.fail(http.StatusBadGateway, aip.NewProtocolError(CodeExecution, aip.CategoryConnector, false, 0,
			"the action ran but its outcome could not be journaled; it will be reconciled when the replica restarts"))
	}
	if status == aip.StateOutcomeUnknown {
		h.log.Warn("action outcome unknown", "action_id", a.ID, "detail", detail)
		return x.outcomeUnknown(a.ID, detail)
	}
	if result.Error != nil && result.Error.Code == CodeInterrupted {
		h.log.Warn("read interrupted; journaled failed "+CodeInterrupted, "action_id", a.ID, "detail", detail)
	}
	if result.Error != nil && result.Error.Code == CodeOutputInvalid {
		// The connector's answer was unusable (not a result, an output its
		// output_schema refuses, too large): a bug of the connector's that
		// the caller alone would see, as a write's outcome_unknown is logged.
		h.log.Warn("the connector's result of a read cannot be used; journaled failed "+CodeOutputInvalid, "action_id", a.ID, "detail", detail)
	}
	result.Receipt = &aip.Receipt{ID: receipt.ID, Hash: receipt.Hash}
	return x.result(result)
}

// Retries of an outcome the journal did not take: finishBackoffMin doubling
// to finishBackoffMax.
const (
	finishBackoffMin = 50 * time.Millisecond
	finishBackoffMax = 2 * time.Second
)

// finishAction journals an action's outcome. A write that fails for a
// reason other than the record itself (the journal's storage is down, a
// PostgreSQL failover) is retried with backoff until it is stored or the
// host stops running actions (after the drain timeout): the action stays
// registered as in progress meanwhile, so a retry of it waits for, or is
// told to come back for, the journaled outcome. Each failure makes storage
// not ready (writeFailedBy) until a storage check writes as much as the
// outcome (see storageRecheckMinBytes); the retry's own success does not.
// Given up, the record stays running and recovery reconciles it at the
// next start. A
// write that finds the action finished already (ErrConflict: typically a
// retry after an attempt that committed but whose answer was lost) is
// returned at once; the caller answers what the journal holds.
func (h *Host) finishAction(ctx context.Context, actionID string, status aip.ActionState, raw json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	wait := finishBackoffMin
	for attempt := 1; ; attempt++ {
		receipt, err := h.journal.FinishAction(ctx, actionID, status, raw, detail, at)
		if err == nil {
			if attempt > 1 {
				h.log.Info("journaled the action outcome after a retry", "action_id", actionID, "status", status, "attempts", attempt)
			}
			return receipt, nil
		}
		if errors.Is(err, journal.ErrConflict) {
			// The action is finished already (see execute).
			return receipt, err
		}
		h.writeFailedBy("journaling the outcome of action "+actionID, len(raw)+len(detail), err)
		permanent := errors.Is(err, journal.ErrInvalid) ||
			errors.Is(err, journal.ErrNotFound) || errors.Is(err, journal.ErrClosed)
		if permanent || h.actionBase.Err() != nil {
			h.log.Error("journal the action outcome", "action_id", actionID, "status", status, "attempts", attempt, "error", err)
			return receipt, err
		}
		if attempt == 1 {
			h.log.Warn("journal the action outcome; retrying until it is stored", "action_id", actionID, "status", status, "error", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-h.actionBase.Done():
			t.Stop()
		}
		wait = min(2*wait, finishBackoffMax)
	}
}

// invalidProtocolError is the message of a connector's failure with the
// protocol error pe, which is not valid (verr); text is how the connector's
// error reads: pe's own text, or an error's that wraps it.
func invalidProtocolError(verr error, pe *aip.ProtocolError, text string) string {
	if pe.Code != "" {
		return fmt.Sprintf("the connector failed with an invalid protocol error (%v): %s", verr, text)
	}
	// pe reads "CODE: MESSAGE", so without a code ": MESSAGE".
	msg := "the connector failed with an invalid protocol error: its code is empty (the connector must give every protocol error a code)"
	if text = strings.Replace(text, pe.Error(), pe.Message, 1); text != "" {
		msg += ": " + text
	}
	return msg
}

// carriable reports why no signed answer could carry a result's JSON (the
// error completes "the result ..."; nil: one can, and it is kept): more
// than MaxResultBytes, or not canonical I-JSON as a signed envelope is (a
// duplicate member name, a number outside the double range, a lone
// surrogate, more than aip's nesting depth). The result sits deepest in a
// status query's answer (body.action_status.result), one level below an
// action's (body.action_result), as it does here: a result that fits only
// the action's answer would leave every status query of it unsigned.
func carriable(raw json.RawMessage) error {
	if len(raw) > MaxResultBytes {
		return fmt.Errorf("is %d bytes of JSON, more than the %d an answer can carry; it is not kept", len(raw), MaxResultBytes)
	}
	const head, tail = `{"body":{"action_status":{"result":`, `}}}`
	wrapped := make([]byte, 0, len(head)+len(raw)+len(tail))
	wrapped = append(append(append(wrapped, head...), raw...), tail...)
	if _, err := aip.Canonicalize(wrapped); err != nil {
		return fmt.Errorf("cannot be carried in a signed answer: %w", err)
	}
	return nil
}

// errAbandoned is the error of a connector call the host stopped waiting
// for (Config.HandleGrace).
var errAbandoned = errors.New("the connector did not return within the handle grace after the action's context ended; its effect may still happen")

// invoked is what a connector call returned.
type invoked struct {
	res      *aip.ActionResult
	panicked any
	err      error
}

// invokeBounded calls the connector on a goroutine of its own and waits
// for it to return, or, once ctx has ended (the action's timeout, a
// cancel, the host's shutdown), for Config.HandleGrace more. A call still
// running then is abandoned: abandoned is not nil and delivers what the
// call returns. Its chunk writer is closed, so it can no longer write to
// the response (a Send already writing is let finish first: one blocked
// on a receiver that stopped reading fails at its write deadline), and it
// keeps the action's in-flight slot until it returns (the caller
// hands the slot over: see action).
func (x *exchange) invokeBounded(ctx context.Context, call *Call, a *aip.Action) (res *aip.ActionResult, panicked any, abandoned <-chan invoked, err error) {
	var cw *ChunkWriter
	if _, ok := x.h.conn.(Streamer); ok && x.stream {
		cw = newChunkWriter(x, a.ID)
	}
	done := make(chan invoked, 1)
	go func() {
		var r invoked
		r.res, r.panicked, r.err = x.invoke(ctx, call, cw)
		done <- r
	}()
	select {
	case r := <-done:
		return r.res, r.panicked, nil, r.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(x.h.cfg.HandleGrace)
	defer grace.Stop()
	select {
	case r := <-done:
		return r.res, r.panicked, nil, r.err
	case <-grace.C:
	}
	if cw != nil {
		cw.abandon()
	}
	x.h.abandoned.Add(1)
	return nil, nil, done, nil
}

// awaitAbandoned gives an abandoned call's in-flight slot back when the
// call returns; what it returned is dropped (its action was journaled
// status: outcome_unknown, or failed connector_host.interrupted for a
// read). The host cannot end the call: neither the drain nor Stop waits
// for it, and after Stop it may still run (until the process exits), when
// its State writes fail with journal.ErrClosed and its publications with
// ErrNotServing.
func (h *Host) awaitAbandoned(a *aip.Action, status aip.ActionState, done <-chan invoked) {
	r := <-done
	h.abandoned.Add(-1)
	h.inflight.releaseDetached(a.ID)
	msg := "an abandoned connector call returned; its result is not kept (the action was journaled outcome_unknown)"
	if status != aip.StateOutcomeUnknown {
		msg = "an abandoned connector call returned; its result is not kept (the read was journaled failed " + CodeInterrupted + ")"
	}
	h.log.Warn(msg, "action_id", a.ID, "capability_id", a.CapabilityID, "error", r.err, "panicked", r.panicked != nil)
}

// invoke calls the connector, turning a panic into a value, which it logs
// with the stack; cw, when not nil, is the stream's chunk writer (the call
// is HandleStream's). The panic's value stays in the host's log: the
// answer says only that the connector panicked, as the dispatcher's
// answers to its own panics do, since the value may quote the input or
// the connector's internals.
func (x *exchange) invoke(ctx context.Context, call *Call, cw *ChunkWriter) (res *aip.ActionResult, panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
			x.h.log.Error("the connector panicked", "action_id", call.Action.ID, "capability_id", call.Action.CapabilityID,
				"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		}
	}()
	if cw != nil {
		defer cw.close()
		res, err = x.h.conn.(Streamer).HandleStream(ctx, call, cw)
		return res, nil, err
	}
	res, err = x.h.conn.Handle(ctx, call)
	return res, nil, err
}

// settle turns what the connector returned into the journal state, the
// result to store and a detail.
func (h *Host) settle(actx context.Context, a *aip.Action, cap *capability, res *aip.ActionResult, err error, panicked any) (aip.ActionState, *aip.ActionResult, string) {
	failed := func(code string, category aip.ErrorCategory, msg string) (aip.ActionState, *aip.ActionResult, string) {
		msg = aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes)
		return aip.StateFailed, &aip.ActionResult{ActionID: a.ID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(code, category, false, 0, msg)}, msg
	}
	if panicked != nil {
		return h.interrupted(actx, a, cap, "the connector panicked (its host logged the panic and its stack with this action ID)")
	}
	cause := context.Cause(actx)
	if err != nil {
		var pe *aip.ProtocolError
		switch {
		case errors.Is(err, errAbandoned):
			return h.interrupted(actx, a, cap, err.Error())
		case errors.Is(err, ErrOutcomeUnknown) && ReadOnly(cap.cap):
			// A read changed nothing, whatever the connector could not
			// tell: it fails interrupted, retryable, as recovery fails a
			// read whose Reconcile answered ErrOutcomeUnknown. (Interrupted
			// and UnusableResult never wrap ErrOutcomeUnknown for a read:
			// this is the connector's own.)
			return h.interrupted(actx, a, cap, "the connector could not tell what the read did ("+err.Error()+")")
		case errors.Is(err, ErrOutcomeUnknown):
			return aip.StateOutcomeUnknown, nil, err.Error()
		case errors.As(err, &pe):
			p := *pe
			if verr := p.Validate(); verr != nil {
				// Carried as it is, it would make the answer (and every
				// retry's) a malformed envelope the dispatcher refuses.
				return failed(CodeConnectorFailed, aip.CategoryConnector, invalidProtocolError(verr, &p, err.Error()))
			}
			return aip.StateFailed, &aip.ActionResult{ActionID: a.ID, Status: aip.ResultFailed, Error: &p}, p.Error()
		case cause == ErrActionCancelled && errors.Is(err, context.Canceled):
			return aip.StateCancelled, &aip.ActionResult{ActionID: a.ID, Status: aip.ResultCancelled}, "cancelled by request"
		case h.actionBase.Err() != nil:
			return h.interrupted(actx, a, cap, "the action was interrupted by the host's shutdown: "+err.Error())
		case errors.Is(err, context.DeadlineExceeded):
			if ReadOnly(cap.cap) {
				return h.interrupted(actx, a, cap, "the read timed out before the connector answered ("+err.Error()+"); if its timeout_ms was too short, give the new action a larger one")
			}
			return h.interrupted(actx, a, cap, "the action timed out; the connector did not say whether its effect happened: "+err.Error())
		case errors.Is(err, ErrStreamClosed):
			// The receiver went away mid-stream and the connector gave
			// up with the ChunkWriter's error: its effect may have
			// happened (a connector that knows it did not returns a
			// *aip.ProtocolError); a read's changed nothing.
			return h.interrupted(actx, a, cap, "the stream's receiver went away and the connector stopped; it did not say whether its effect happened: "+err.Error())
		}
		return failed(CodeConnectorFailed, aip.CategoryConnector, err.Error())
	}
	if res == nil {
		return failed(CodeConnectorFailed, aip.CategoryConnector, "the connector returned neither a result nor an error")
	}
	r := *res
	if r.ActionID == "" {
		r.ActionID = a.ID
	}
	if r.ActionID != a.ID {
		return aip.StateOutcomeUnknown, nil, "the connector returned a result for another action (" + r.ActionID + ")"
	}
	if r.Status == aip.ResultFailed && r.Error != nil {
		if verr := r.Error.Validate(); verr != nil {
			// The connector says the action failed (call.Fail with an
			// empty code or an unknown category): its failure stands, as
			// for an invalid *aip.ProtocolError returned as its error,
			// with the problem named; outcome_unknown would tell the
			// caller that its effect may have happened.
			return failed(CodeConnectorFailed, aip.CategoryConnector, invalidProtocolError(verr, r.Error, r.Error.Error()))
		}
	}
	if err := r.Validate(); err != nil {
		return aip.StateOutcomeUnknown, nil, "the connector returned an invalid result: " + err.Error()
	}
	r.Receipt = nil
	if r.Status == aip.ResultCompleted && cap.output != nil && len(r.Output) > 0 {
		if err := validateJSON(cap.output, r.Output); err != nil {
			// The connector says the action completed: for anything but a
			// read its effect happened, so a failed result (which invites
			// a resend) would be wrong, and a completed one would break
			// the schema the caller relies on.
			// The advice to check the effect is a write's: a read's
			// failure says the read changed nothing (UnusableResult).
			problem := "the connector reported the action completed, but its output does not match the output_schema of " +
				a.CapabilityID + ": " + err.Error() + "; the output is not kept"
			if !ReadOnly(cap.cap) {
				problem += ": check the effect before sending the action again"
			}
			return h.settle(actx, a, cap, nil, UnusableResult(cap.cap, problem), nil)
		}
	}
	return stateOf(r.Status), &r, ""
}

// interrupted settles an action cut off before the connector said what
// it did (a panic, a call abandoned after the handle grace, a timeout or
// the shutdown answered only with the context's error, a stream whose
// receiver went away) by Interrupted's
// decision: a read-only capability's fails connector_host.interrupted,
// retryable; any other's is outcome_unknown, detail being its journal
// note.
func (h *Host) interrupted(actx context.Context, a *aip.Action, cap *capability, detail string) (aip.ActionState, *aip.ActionResult, string) {
	err := Interrupted(cap.cap, detail)
	if errors.Is(err, ErrOutcomeUnknown) {
		return aip.StateOutcomeUnknown, nil, detail
	}
	return h.settle(actx, a, cap, nil, err, nil)
}

// UnusableResult is the error a connector returns (and the host records)
// when what the connector produced for an action cannot be used: a result
// no answer can carry, a broken stream, a completed output its
// output_schema refuses. problem says what is wrong. For a read-only
// capability (ReadOnly) it is a *aip.ProtocolError CodeOutputInvalid, a
// failed result, since the read changed nothing; for any other an error
// wrapping ErrOutcomeUnknown, since the effect may have happened.
func UnusableResult(c *aip.Capability, problem string) error {
	return failReadElseUnknown(c, problem, func(problem string) *aip.ProtocolError {
		return aip.NewProtocolError(CodeOutputInvalid, aip.CategoryConnector, false, 0,
			withAdvice(problem, "; the read changed nothing: ask for less (a smaller page, fewer fields) if it was too much, else send it again"))
	})
}

// withAdvice is problem, cut short if need be, followed by advice, in at
// most aip.MaxErrorMessageBytes: a long problem must not cut off what the
// caller should do.
func withAdvice(problem, advice string) string {
	return aip.TruncateUTF8(problem, max(aip.MaxErrorMessageBytes-len(advice), 0)) + advice
}

// Interrupted is the error a connector returns (and the host records)
// when an action was cut off before the connector said what it did: the
// connector panicked, hung past the handle grace, or answered its
// timeout, a cancel or the shutdown with nothing but the context's error;
// a local connector crashed or went away mid-call (package sidecar).
// what says how. For a read-only capability (ReadOnly) it is a
// *aip.ProtocolError CodeInterrupted, retryable: a failed result, since
// the read changed nothing, the one recovery journals for a read a
// restart cut off; for any other an error wrapping ErrOutcomeUnknown,
// since the effect may have happened.
func Interrupted(c *aip.Capability, what string) error {
	return failReadElseUnknown(c, what, func(what string) *aip.ProtocolError {
		return interruptedError(true, withAdvice(what, "; a read changes nothing: send it again under a new action ID"))
	})
}

// failReadElseUnknown is the one decision of UnusableResult and
// Interrupted: for a read-only capability the failure readErr builds
// from problem, for any other problem as an error wrapping
// ErrOutcomeUnknown.
func failReadElseUnknown(c *aip.Capability, problem string, readErr func(problem string) *aip.ProtocolError) error {
	if ReadOnly(c) {
		return readErr(problem)
	}
	return fmt.Errorf("%w: %s", ErrOutcomeUnknown, problem)
}

// ReadOnly reports whether a capability's contract declares no side
// effect but reads: running it again changes nothing. A read over the
// network declares read and external_network (every product adapter's
// reads do); external_network alone says nothing of what the call does, so
// it is not read-only, and neither is a capability without a contract or
// with no side effect listed (a connector that left its effects out may
// write, and a failed result would invite a resend). UnusableResult
// decides with it.
func ReadOnly(c *aip.Capability) bool {
	if c == nil || c.Contract == nil {
		return false
	}
	read := false
	for _, e := range c.Contract.SideEffects {
		switch e {
		case aip.EffectRead:
			read = true
		case aip.EffectExternalNetwork:
		default:
			return false
		}
	}
	return read
}

// journaled answers from the journal record of actionID.
func (x *exchange) journaled(actionID string, want *journal.Action) bool {
	a, err := x.h.journal.Action(context.WithoutCancel(x.ctx), actionID)
	if err != nil {
		if errors.Is(err, journal.ErrNotFound) {
			return x.fail(http.StatusConflict, aip.NewProtocolError(CodeActionInProgress, aip.CategoryTemporary, true, 1000,
				"action "+actionID+" was being handled by another request that did not journal it; send it again"))
		}
		return x.storageUnavailable(err)
	}
	return x.answerJournaled(a, want)
}

// answerJournaled answers a delivery of an action the journal already holds:
// the journaled result, never a second run. want holds what the delivery
// carries (capability, idempotency key, input digest); nil skips the
// comparison (cancel and status paths, a result journaled meanwhile). A
// delivery that differs in any of them is another action under the same ID:
// a conflict, never the other action's result.
func (x *exchange) answerJournaled(a journal.Action, want *journal.Action) bool {
	// A record without an input digest is a cancel's that arrived before its
	// action (see cancel): there is nothing to compare; while the cancel is
	// being journaled it is in progress, then cancelled.
	tombstone := a.InputDigest == ""
	if want != nil && !tombstone {
		for _, f := range []struct{ name, got, journaled string }{
			{"capability", want.CapabilityID, a.CapabilityID},
			{"idempotency key", want.IdempotencyKey, a.IdempotencyKey},
			{"input", want.InputDigest, a.InputDigest},
		} {
			// The host journals all three (the idempotency key defaults
			// to the action ID); one a record lacks (written by another
			// tool) is not compared.
			if f.journaled != "" && f.got != f.journaled {
				return x.fail(http.StatusConflict, aip.NewProtocolError(CodeIdempotencyConflict, aip.CategoryPolicy, false, 0,
					"action "+a.ActionID+" was already received with a different "+f.name+"; use a new action ID"))
			}
		}
	}
	if tombstone && a.Status == aip.StateReceived {
		return x.finishTombstone(a.ActionID)
	}
	switch {
	case a.Status == aip.StateOutcomeUnknown:
		return x.outcomeUnknown(a.ActionID, a.Detail)
	case a.Status.Terminal():
		var res aip.ActionResult
		if err := json.Unmarshal(a.Result, &res); err != nil {
			return x.fail(http.StatusBadGateway, aip.NewProtocolError(CodeExecution, aip.CategoryConnector, false, 0,
				"the journaled result of "+a.ActionID+" cannot be read"))
		}
		// The journaled result never carries its receipt (it is appended
		// with it); every terminal action has one, so ErrNotFound here is
		// either a prune that deleted the action and its receipt since
		// the record was read (the action is gone now: it is refused as
		// pruned, as a delivery after the prune is) or a broken journal.
		r, err := x.h.journal.ReceiptFor(context.WithoutCancel(x.ctx), a.ActionID)
		if errors.Is(err, journal.ErrNotFound) && x.prunedSinceRead(a.ActionID) {
			return x.expired(a.ActionID, fmt.Errorf("%w: action %s was pruned while its journaled result was read", journal.ErrPruned, a.ActionID))
		}
		if err != nil {
			return x.storageUnavailable(fmt.Errorf("receipt of terminal action %s: %w", a.ActionID, err))
		}
		res.Receipt = &aip.Receipt{ID: r.ID, Hash: r.Hash}
		return x.result(&res)
	}
	return x.fail(http.StatusConflict, aip.NewProtocolError(CodeActionInProgress, aip.CategoryTemporary, true, 1000,
		"action "+a.ActionID+" is "+string(a.Status)))
}

// prunedSinceRead reports whether the record of actionID, read a moment
// ago, is gone from the journal now: only pruning deletes a record, so a
// prune racing this request deleted it.
func (x *exchange) prunedSinceRead(actionID string) bool {
	_, err := x.h.journal.Action(context.WithoutCancel(x.ctx), actionID)
	return errors.Is(err, journal.ErrNotFound)
}

// detailCancelledBeforeArrival is the journal detail of an action whose
// cancel arrived first.
const detailCancelledBeforeArrival = "cancelled before the action arrived"

// cancelledBeforeArrival is the result journaled for an action whose cancel
// arrived first, and its JSON.
func cancelledBeforeArrival(actionID string) (*aip.ActionResult, json.RawMessage) {
	res := &aip.ActionResult{ActionID: actionID, Status: aip.ResultCancelled}
	raw, _ := json.Marshal(res)
	return res, raw
}

// finishTombstone finishes, as cancelled, the record a cancel journaled
// before its action arrived and left received: the cancel's second write
// failed, or the cancel is between its two writes now. The action never
// runs either way; finished, the record answers every later delivery, the
// cancel's retry and status queries, instead of action_in_progress until
// a restart's recovery finished it. A cancel that is between its writes
// finds the record finished (ErrConflict) and answers it too.
func (x *exchange) finishTombstone(actionID string) bool {
	_, raw := cancelledBeforeArrival(actionID)
	_, err := x.h.journal.FinishAction(context.WithoutCancel(x.ctx), actionID, aip.StateCancelled, raw, detailCancelledBeforeArrival, x.h.cfg.Now())
	if err != nil && !errors.Is(err, journal.ErrConflict) {
		x.h.writeFailedBy("journaling the cancel of action "+actionID, len(raw)+len(detailCancelledBeforeArrival), err)
		return x.storageUnavailable(err)
	}
	return x.journaled(actionID, nil)
}

// cancel handles an action-scoped Cancel: a running action's context is
// cancelled (and the connector's Canceler told); the answer is the action's
// journaled result once it settles. A cancel for an action this replica has
// not seen journals a cancelled record, so the action never runs if it
// arrives later.
func (x *exchange) cancel(c *aip.Cancel, route *aip.ConnectorRoute) bool {
	h := x.h
	id := c.Target.Action
	jctx := context.WithoutCancel(x.ctx)
	for range 2 {
		if ra := h.lookupRunning(id); ra != nil {
			ra.cancel(ErrActionCancelled)
			if cn, ok := h.conn.(Canceler); ok {
				if call := ra.getCall(); call != nil {
					cctx, cancel := context.WithTimeout(x.ctx, h.cfg.HealthProbeTimeout)
					if err := h.guard("Cancel", func() error { return cn.Cancel(cctx, call, c.Reason) }); err != nil {
						h.log.Warn("connector cancel", "action_id", id, "error", err)
					}
					cancel()
				}
			}
			select {
			case <-ra.done:
			case <-x.ctx.Done():
				return false
			}
		}
		a, err := h.journal.Action(jctx, id)
		if err == nil {
			if !a.Status.Terminal() && h.lookupRunning(id) != nil {
				continue
			}
			return x.answerJournaled(a, nil)
		}
		if !errors.Is(err, journal.ErrNotFound) {
			return x.storageUnavailable(err)
		}
		if h.lookupRunning(id) != nil {
			continue
		}
		if err := h.beforeJournal(route); err != nil {
			return x.expired(id, err)
		}
		now := h.cfg.Now()
		record := journal.Action{
			ActionID: id, CapabilityID: route.CapabilityID, TenantID: h.cfg.TenantID,
			FenceToken: route.FenceToken, MessageID: x.req.MessageID, ReceivedAt: now,
			AssignedAt: x.assigned,
		}
		_, created, err := h.journal.BeginAction(jctx, record)
		if errors.Is(err, journal.ErrPruned) {
			return x.expired(id, err)
		}
		if err != nil {
			h.writeFailedBy("journaling the cancel of action "+id, recordBytes(record), err)
			return x.storageUnavailable(err)
		}
		if !created {
			continue
		}
		res, raw := cancelledBeforeArrival(id)
		receipt, err := h.journal.FinishAction(jctx, id, aip.StateCancelled, raw, detailCancelledBeforeArrival, now)
		if errors.Is(err, journal.ErrConflict) {
			// Another request finished the record meanwhile (see
			// finishTombstone): answer what it journaled.
			return x.journaled(id, nil)
		}
		if err != nil {
			h.writeFailedBy("journaling the cancel of action "+id, len(raw)+len(detailCancelledBeforeArrival), err)
			return x.storageUnavailable(err)
		}
		res.Receipt = &aip.Receipt{ID: receipt.ID, Hash: receipt.Hash}
		return x.result(res)
	}
	return x.fail(http.StatusConflict, aip.NewProtocolError(CodeActionInProgress, aip.CategoryTemporary, true, 1000,
		"action "+id+" changed while the cancel was handled; send the cancel again"))
}

// statusQuery answers what the journal holds for an action: not_found for
// an action it has no record of, pruned when that action may be older than
// what the journal pruned. A finished action's result carries its receipt,
// as the action's answer and a resend of it do.
func (x *exchange) statusQuery(actionID string) bool {
	jctx := context.WithoutCancel(x.ctx)
	a, err := x.h.journal.Action(jctx, actionID)
	st := &aip.ActionStatus{ActionID: actionID, State: aip.StateNotFound}
	switch {
	case errors.Is(err, journal.ErrNotFound):
		gone, herr := x.mayBeGone(jctx, actionID)
		if herr != nil {
			return x.storageUnavailable(herr)
		}
		if gone != nil {
			st.State = aip.StatePruned
		}
	case err != nil:
		return x.storageUnavailable(err)
	default:
		st.State, st.UpdatedAt = a.Status, aip.At(a.UpdatedAt)
		if a.Status.Terminal() && len(a.Result) > 0 {
			var res aip.ActionResult
			if json.Unmarshal(a.Result, &res) == nil {
				st.Result = &res
			}
		}
		if st.Result != nil {
			// The journaled result never carries its receipt (see
			// answerJournaled): a prune since the record was read took both,
			// and the action is pruned now.
			r, err := x.h.journal.ReceiptFor(jctx, actionID)
			switch {
			case errors.Is(err, journal.ErrNotFound) && x.prunedSinceRead(actionID):
				st = &aip.ActionStatus{ActionID: actionID, State: aip.StatePruned}
			case err != nil:
				return x.storageUnavailable(fmt.Errorf("receipt of terminal action %s: %w", actionID, err))
			default:
				st.Result.Receipt = &aip.Receipt{ID: r.ID, Hash: r.Hash}
			}
		}
	}
	x.stream = false
	return x.reply(http.StatusOK, aip.Body{ActionStatus: st})
}

// assignedAt is the earliest time, on this host's clock, at which the
// routed action can first have arrived here: its route's assignment time,
// which the registry's fence token (a UUIDv7) carries, less the clock skew
// the host allows a dispatcher. Zero when the fence token carries no time.
func assignedAt(route *aip.ConnectorRoute) time.Time {
	if route == nil {
		return time.Time{}
	}
	t, err := aip.IDTime(aip.PrefixRoute, route.FenceToken)
	if err != nil {
		return time.Time{}
	}
	return t.Add(-MaxMessageSkew)
}

// mayBeGone reports, for the routed action the journal holds no record of,
// why that record may be gone (gone, nil when none): the action may be
// older than the prune horizon (journal.ErrPruned), or its route older
// than the journal's service of the replica (errBeforeJournal). err is the
// journal's failure to read its horizon.
func (x *exchange) mayBeGone(ctx context.Context, actionID string) (gone, err error) {
	horizon, err := x.h.journal.PruneHorizon(ctx)
	if err != nil {
		return nil, err
	}
	if perr := journal.CheckHorizon(journal.Action{ActionID: actionID, AssignedAt: x.assigned}, horizon); perr != nil {
		return perr, nil
	}
	return x.h.beforeJournal(x.route), nil
}

// expired refuses an action (or its cancel) the journal may have pruned:
// it may have run here already, and its record is gone, so it never runs.
// The message is claimed, so the envelope cannot be replayed either.
func (x *exchange) expired(actionID string, err error) bool {
	x.h.m.actionsExpired.Inc()
	if errors.Is(err, errBeforeJournal) {
		x.h.log.Warn("refused an action routed to this replica before its journal served it (an earlier journal of this replica ID is gone)", "action_id", actionID, "error", err)
		if !x.claim() {
			return false
		}
		return x.fail(http.StatusGone, aip.NewProtocolError(CodeActionExpired, aip.CategoryPermanent, false, 0,
			aip.TruncateUTF8(fmt.Sprintf("action %s was routed to this replica before its current journal served it, and that journal holds no record of it: the journal that did is gone, so the action may have run already, and it is not run here; send a new action ID once you know it did not run (%v)",
				actionID, err), aip.MaxErrorMessageBytes)))
	}
	x.h.log.Warn("refused an action older than the journal's prune horizon", "action_id", actionID, "error", err)
	if !x.claim() {
		return false
	}
	return x.fail(http.StatusGone, aip.NewProtocolError(CodeActionExpired, aip.CategoryPermanent, false, 0,
		aip.TruncateUTF8(fmt.Sprintf("action %s was routed before this replica's journal retention (%s) and may have run here already; its record has been pruned, so it is not run again: send a new action ID (%v)",
			actionID, retentionText(x.h.cfg.ActionRetention), err), aip.MaxErrorMessageBytes)))
}

func retentionText(d time.Duration) string {
	if d == KeepActionsForever {
		return "now unlimited, but records were pruned under an earlier setting"
	}
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%d days", d/(24*time.Hour))
	}
	return d.String()
}

func (x *exchange) notReady() bool {
	ms := uint64(x.h.cfg.HeartbeatInterval.Milliseconds())
	return x.refuse(http.StatusServiceUnavailable, aip.NewProtocolError(CodeNotReady, aip.CategoryTemporary, true, ms,
		"the replica is not accepting actions (draining, no valid lease, or not ready); this message will never execute here"))
}

// notStarted is the not_ready refusal of an action that arrives before the
// host serves (early.go).
func (x *exchange) notStarted() bool {
	ms := uint64(x.h.cfg.HeartbeatInterval.Milliseconds())
	return x.refuse(http.StatusServiceUnavailable, aip.NewProtocolError(CodeNotReady, aip.CategoryTemporary, true, ms,
		"the replica is starting and does not run actions before it has registered (its previous lease may still be live in the registry, or the control plane does not answer); this message will never execute here"))
}

func (x *exchange) storageUnavailable(err error) bool {
	attrs := []any{"error", err}
	if x.req != nil {
		attrs = append(attrs, "message_id", x.req.MessageID)
	}
	if senderWentAway(x.ctx, err) {
		// Nothing is wrong with the journal, and nobody reads this
		// answer.
		x.h.log.Info("the sender went away while the runtime journal was read", attrs...)
	} else {
		x.h.log.Error("runtime journal", attrs...)
	}
	return x.fail(http.StatusServiceUnavailable, aip.NewProtocolError(CodeStorageUnavailable, aip.CategoryTemporary, true, 1000,
		"the runtime journal is unavailable"))
}

// senderWentAway reports whether err, a journal call's, ended because the
// request's own context did (the sender disconnected): err wraps exactly
// that context's error. A deadline of the journal's own (a PostgreSQL
// connect timeout during an outage) is a journal failure even when the
// sender has gone too.
func senderWentAway(ctx context.Context, err error) bool {
	cerr := ctx.Err()
	return cerr != nil && errors.Is(err, cerr)
}

func (x *exchange) outcomeUnknown(actionID, detail string) bool {
	pe := aip.NewProtocolError(CodeOutcomeUnknown, aip.CategoryConnector, false, 0,
		aip.TruncateUTF8("the outcome of "+actionID+" is unknown: "+detail, aip.MaxErrorMessageBytes))
	pe.Details, _ = json.Marshal(map[string]string{"action_id": actionID, "state": string(aip.StateOutcomeUnknown)})
	return x.fail(http.StatusBadGateway, pe)
}

func (x *exchange) result(res *aip.ActionResult) bool {
	return x.reply(http.StatusOK, aip.Body{ActionResult: res})
}

// journalSpan starts the span of a journal write for the action; the write
// itself is never cancelled by the request.
func (x *exchange) journalSpan(op, actionID string) (context.Context, trace.Span) {
	return x.h.tracer.Start(context.WithoutCancel(x.ctx), "hostsdk.journal."+op,
		trace.WithAttributes(attribute.String("aip.action_id", actionID)))
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// claim records the request's message ID in the replay registry, once. It
// answers and returns false when the ID is a replay or the journal fails.
func (x *exchange) claim() bool {
	if x.claimed {
		return true
	}
	ok, err := x.h.journal.ClaimMessage(x.ctx, x.req.MessageID, x.msgExpiry, x.h.cfg.Now())
	if err != nil {
		if !senderWentAway(x.ctx, err) {
			x.h.writeFailedBy("claiming message "+x.req.MessageID, len(x.req.MessageID), err)
		}
		return x.storageUnavailable(err)
	}
	if !ok {
		return x.replayed()
	}
	x.claimed = true
	return true
}

func (x *exchange) replayed() bool {
	return x.fail(http.StatusConflict, aip.NewProtocolError(CodeReplay, aip.CategoryPolicy, false, 0,
		"message "+x.req.MessageID+" was already received"))
}

// refuse claims the message ID first, so the refused envelope can never
// execute later (a dispatcher may present the signed refusal as evidence
// that the action did not start here), then answers with the error. The
// answer echoes the request's security.connector_route, so the signed
// refusal names the action and fence it refuses on its own.
func (x *exchange) refuse(status int, pe *aip.ProtocolError) bool {
	if !x.claim() {
		return false
	}
	x.echoRoute = true
	return x.fail(status, pe)
}

// fail answers with a signed error envelope and reports a rejection. The
// message is cut to aip.MaxErrorMessageBytes: a refusal quotes what it
// refuses (a route member, a capability or action ID), and a quote of a
// member as large as the request allows would make the answer larger than
// a dispatcher reads (aip.MaxMessageBytes), and so no signed refusal.
func (x *exchange) fail(status int, pe *aip.ProtocolError) bool {
	pe.Source = errorSource
	pe.Message = aip.TruncateUTF8(pe.Message, aip.MaxErrorMessageBytes)
	if x.span != nil {
		x.span.SetStatus(codes.Error, pe.Code)
	}
	x.reply(status, aip.Body{Error: &aip.ErrorBody{Error: *pe}})
	return false
}

// envelope builds a signed response envelope correlated with the request.
func (x *exchange) envelope(body aip.Body) ([]byte, error) {
	h := x.h
	env, err := aip.NewEnvelope(h.cfg.Now(), body)
	if err != nil {
		return nil, err
	}
	req := x.req
	env.InResponseTo = &aip.MessageReference{Message: req.MessageID}
	env.SessionID, env.CorrelationID = req.SessionID, req.CorrelationID
	env.To = req.From
	from := h.principal
	env.From = &from
	if x.echoRoute && x.route != nil {
		if err := env.SetSecurity(aip.SecurityConnectorRoute, x.route); err != nil {
			return nil, err
		}
	}
	return aip.SignEnvelope(h.key, env)
}

// reply writes a signed envelope: a JSON response, or the final NDJSON line
// of a streaming response. It reports success for 2xx statuses. An answer
// the receiver does not take within its write deadline (answerWriteTimeout)
// is logged as undelivered; what the journal holds stays for a retry or a
// status query.
func (x *exchange) reply(status int, body aip.Body) bool {
	raw, err := x.envelope(body)
	if err != nil {
		x.h.log.Error("sign response", "error", err)
		if x.streamStarted {
			return false
		}
		return x.unsigned(http.StatusInternalServerError, CodeResponseSigning, "the response could not be signed")
	}
	if x.stream && status == http.StatusOK || x.streamStarted {
		x.startStream()
		if err := x.write(append(raw, '\n')); err != nil {
			x.undelivered(status, body, err)
		}
		return status < 300
	}
	if err := x.writeJSON(status, raw); err != nil {
		x.undelivered(status, body, err)
	}
	return status < 300
}

// answerWriteRate is the slowest rate, in bytes per second, at which a
// receiver must take an answer: the rate the host asks of the bodies it
// reads (MaxIngressReadBytes).
const answerWriteRate = readbudget.DefaultMinReadRate

// answerWriteTimeout bounds the write of an answer of n bytes (a whole
// JSON answer, or one NDJSON line of a stream): HandleGrace, at least
// minAnswerWriteGrace, plus n bytes at answerWriteRate (4 MiB: 16 s more).
// A receiver that takes longer has stopped reading: without a deadline the
// write would hold the request, and with it the action's in-flight slot
// and a drain, for ever (the server has no write timeout, since a stream
// lasts as long as its action).
func (h *Host) answerWriteTimeout(n int) time.Duration {
	return max(h.cfg.HandleGrace, minAnswerWriteGrace) + time.Duration(int64(n)*int64(time.Second)/answerWriteRate)
}

// minAnswerWriteGrace is the least time an answer's receiver gets beyond
// the transfer itself, whatever HandleGrace says (it may be set to a
// second or less, to abandon stuck calls sooner): a dispatcher relaying a
// stream stops reading while it writes to a slow client, for up to its own
// stream write timeout (dispatch.DefaultStreamWriteTimeout, 10 s), and
// that pause must not cut a legitimate stream off.
const minAnswerWriteGrace = 10 * time.Second

// write writes p to the response and flushes it, within
// answerWriteTimeout(len(p)). The deadline stays on the connection for
// what the server writes after the handler returns (it clears it before
// the connection's next request). Without deadline support (a wrapped
// writer that does not unwrap), the write is not bounded.
func (x *exchange) write(p []byte) error {
	rc := http.NewResponseController(x.w)
	_ = rc.SetWriteDeadline(time.Now().Add(x.h.answerWriteTimeout(len(p))))
	if _, err := x.w.Write(p); err != nil {
		return err
	}
	return rc.Flush()
}

// writeJSON writes a whole JSON answer (see write).
func (x *exchange) writeJSON(status int, raw []byte) error {
	x.w.Header().Set("Content-Type", "application/json")
	x.w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	x.w.WriteHeader(status)
	return x.write(raw)
}

// undelivered logs an answer that could not be written: the receiver did
// not take it within its write deadline, or went away. Nothing is undone:
// an action's outcome is journaled before it is answered, so a retry of
// the action or a status query gets it. Answers to messages the dispatcher
// signed are logged at warning level, the unsigned ones at debug level
// (anyone can send a malformed message and not read the answer).
func (x *exchange) undelivered(status int, body aip.Body, err error) {
	level := slog.LevelDebug
	attrs := []any{"status", status, "answer", body.Tag(), "error", err}
	if x.route != nil {
		level = slog.LevelWarn
		attrs = append(attrs, "message_id", x.req.MessageID, "action_id", x.route.ActionID)
	}
	x.h.log.Log(context.WithoutCancel(x.ctx), level,
		"the answer could not be delivered (the receiver did not take it within its write deadline, or went away); a journaled outcome stays for a retry or a status query", attrs...)
}

func (x *exchange) startStream() {
	if x.streamStarted {
		return
	}
	x.streamStarted = true
	x.w.Header().Set("Content-Type", ContentTypeNDJSON)
	x.w.Header().Set("X-Content-Type-Options", "nosniff")
	x.w.WriteHeader(http.StatusOK)
}

// unauthenticated refuses a message that is not signed by the pinned
// dispatcher with an unsigned 401. The answer is deliberately not signed:
// a signed error in response to a message nobody authenticated would let
// anyone who can reach the listener obtain, for any message ID (say the
// dispatcher's own, copied from the wire with its signature broken), an
// envelope signed by this replica, addressed to the dispatcher, saying that
// message was refused, and put it in place of the real answer; the
// dispatcher settles a signed refusal as "did not run". Nothing is claimed
// in the replay registry either, so such a copy cannot spend the message
// ID of the real one.
func (x *exchange) unauthenticated(msg string) bool {
	if x.span != nil {
		x.span.SetStatus(codes.Error, CodeAuthentication)
	}
	return x.unsigned(http.StatusUnauthorized, CodeAuthentication, msg)
}

// unsigned writes an unsigned error (the request is not a usable envelope,
// or signing failed).
func (x *exchange) unsigned(status int, code, msg string) bool {
	no := false
	pe := aip.ProtocolError{Code: code, Message: aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes), Category: aip.CategoryPermanent, Retryable: &no}
	raw, err := json.Marshal(map[string]any{"error": pe})
	if err != nil {
		http.Error(x.w, `{"error":"encode"}`, http.StatusInternalServerError)
		return false
	}
	if err := x.writeJSON(status, raw); err != nil {
		x.undelivered(status, aip.Body{Error: &aip.ErrorBody{Error: pe}}, err)
	}
	return false
}
