package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Span names of one action's trace (docs/routing.md): the entry point's
// server span, then admission, resolution, each hop (whose context the
// replica's ingress continues), each reroute and the settlement.
const (
	SpanAction    = "dispatch.action"
	SpanAdmission = "dispatch.admission"
	SpanResolve   = "dispatch.resolve"
	SpanSend      = "dispatch.send"
	SpanReroute   = "dispatch.reroute"
	SpanSettle    = "dispatch.settle"
	SpanCancel    = "dispatch.cancel"
	SpanStatus    = "dispatch.status"
)

// Span attributes.
const (
	AttrTenant     = "aip.tenant_id"
	AttrCapability = "aip.capability_id"
	AttrAction     = "aip.action_id"
	AttrReplica    = "aip.replica_id"
	AttrOutcome    = "aip.outcome"
	AttrErrorCode  = "aip.error_code"
)

// requestOverhead is added to the input's size when the scheduler weighs
// an action.
const requestOverhead = 512

// Execute runs one action for a verified tenant: admission, resolution,
// the signed hop to the pinned replica (with at most MaxReroutes
// provably-not-started reroutes), verification and settlement. It returns
// the answer and its HTTP status. onChunk, when not nil, receives a
// streaming action's verified chunks as they arrive.
//
// Once admitted, the action no longer depends on ctx's cancellation (a
// client that hangs up does not leave a route unsettled); it is bounded by
// its timeout instead.
//
// tenant is the verified tenant the action is for, held to the rule of a
// token's tenant_id claim (ValidTenantID): one that is empty, longer than
// 256 bytes, or holds a control or invisible formatting character is
// answered, before anything is admitted, as a request whose token claims
// it is: 401 with resp.Error's Code CodeUnauthorized (category auth).
func (d *Dispatcher) Execute(ctx context.Context, tenant string, req ActionRequest, onChunk func(*aip.StreamChunk)) (ActionResponse, int) {
	return d.executeAction(ctx, tenant, req, onChunk, false)
}

// executeAction is Execute; validated says the caller already checked req
// with ActionRequest.Validate (the HTTP handler does, to answer an invalid
// request with a plain error body before anything is counted).
func (d *Dispatcher) executeAction(ctx context.Context, tenant string, req ActionRequest, onChunk func(*aip.StreamChunk), validated bool) (ActionResponse, int) {
	if req.ActionID == "" {
		req.ActionID = aip.NewActionID()
	}
	start := d.cfg.Now()
	ctx, span := d.tracer.Start(ctx, SpanAction, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(AttrTenant, tenant), attribute.String(AttrCapability, req.CapabilityID),
			attribute.String(AttrAction, req.ActionID), attribute.String("aip.mode", string(modeOf(&req)))))
	defer span.End()
	resp, status := d.execute(ctx, tenant, &req, onChunk, validated, span)
	outcome := string(resp.Settlement)
	switch {
	case resp.Route == nil:
		outcome = outcomeNotRouted
	case outcome == "":
		outcome = outcomeUnsettled
	case notDelivered(&resp):
		outcome = outcomeNotDelivered
	}
	span.SetAttributes(attribute.String(AttrOutcome, outcome), attribute.Int("http.response.status_code", status))
	if resp.Route != nil {
		span.SetAttributes(attribute.String(AttrReplica, resp.Route.ReplicaID))
	}
	if resp.Error != nil {
		span.SetAttributes(attribute.String(AttrErrorCode, resp.Error.Code))
		span.SetStatus(codes.Error, resp.Error.Code)
	}
	d.m.observe(outcome, resp.Error, d.cfg.Now().Sub(start))
	return resp, status
}

// notDelivered reports whether resp is the answer of an action no
// connection to its replica could be made for (503
// dispatch.replica_unreachable, classify): the registry settles it
// outcome_unknown, so the replica's circuit counts the failure, but
// nothing of this request reached the replica. A replica's own error never
// settles outcome_unknown under a dispatch.* code (hostSettlement), so the
// pair names that answer alone.
func notDelivered(resp *ActionResponse) bool {
	return resp.Settlement == registry.SettlementOutcomeUnknown && resp.Result == nil &&
		resp.Error != nil && resp.Error.Code == CodeReplicaUnreachable
}

func modeOf(req *ActionRequest) aip.ActionMode {
	if req.Mode == "" {
		return aip.ModeSync
	}
	return req.Mode
}

func (d *Dispatcher) execute(ctx context.Context, tenant string, req *ActionRequest, onChunk func(*aip.StreamChunk), validated bool, span trace.Span) (ActionResponse, int) {
	resp := ActionResponse{ActionID: req.ActionID}
	fail := func(e *apiError) (ActionResponse, int) {
		resp.Error = e.pe
		return resp, e.status
	}
	if e := checkTenantArg(tenant); e != nil {
		return fail(e)
	}
	if !validated {
		if err := req.Validate(d.cfg.MaxTimeout); err != nil {
			return fail(newAPIError(http.StatusUnprocessableEntity, CodeActionInvalid, aip.CategoryPermanent, false, 0, err.Error()))
		}
	}
	size := int64(len(req.Input)+len(req.CapabilityID)+len(req.IdempotencyKey)) + requestOverhead
	actx, aspan := d.tracer.Start(ctx, SpanAdmission)
	admitStart := time.Now()
	permit, err := d.sched.Acquire(actx, tenant, size)
	d.m.stage("admission", admitStart)
	if err != nil {
		aspan.RecordError(err)
		aspan.SetStatus(codes.Error, err.Error())
		aspan.End()
		return fail(schedulerError(err))
	}
	aspan.SetAttributes(attribute.Int64("aip.queue_wait_us", permit.Waited.Microseconds()))
	aspan.End()
	defer permit.Release()

	// From here on the client's cancellation no longer matters.
	timeout := d.cfg.ActionTimeout
	if req.TimeoutMS != nil {
		timeout = time.Duration(*req.TimeoutMS) * time.Millisecond
	}
	wctx := context.WithoutCancel(ctx)

	a, claim, err := d.resolve(wctx, tenant, req)
	if err != nil {
		return fail(registryError(err))
	}
	resp.Route = factsOf(&a)
	span.SetAttributes(attribute.String(AttrReplica, a.ReplicaID))
	mode := modeOf(req)
	timeoutMS := uint64(timeout.Milliseconds())
	action := &aip.Action{
		ID: req.ActionID, CapabilityID: req.CapabilityID, Input: req.Input, Mode: mode,
		IdempotencyKey: req.IdempotencyKey, TimeoutMS: &timeoutMS,
		Identity: &aip.IdentityContext{Tenant: &aip.TenantRef{ID: tenant}},
	}
	pmode := &mode // the route's original_mode
	var h *hop
	var reroutes []RerouteFact
	// settled is set once the current assignment was settled before its
	// reroute was tried (a hop that never reached the replica), so it is
	// not settled again.
	var settled *registry.RouteSettlement
	for {
		// Each hop waits for the replica's answer the action's timeout plus
		// the slack from when its envelope leaves, the bound the envelope
		// gives the replica: the registry calls before it (resolve,
		// reroute) take none of it.
		hopStart := time.Now()
		hopCtx, cancelHop := context.WithTimeout(wctx, timeout+d.cfg.HopSlack)
		h = d.exchange(hopCtx, &a, aip.Body{Action: action}, pmode, onChunk)
		cancelHop()
		d.m.stage("hop", hopStart)
		pe := h.refusal()
		unsent := pe == nil && h.env == nil && h.unreachable && claim != ""
		if (pe == nil && !unsent) || d.deps.Rerouter == nil || len(reroutes) >= d.cfg.MaxReroutes {
			break
		}
		code := CodeReplicaUnreachable
		if unsent {
			// Nothing was ever sent under this assignment, which only this
			// request holds (its claim): settle it first, so the
			// unreachable replica's circuit counts the failure, then move
			// the action (docs/routing.md, "Never delivered").
			s := registry.SettlementOutcomeUnknown
			if err := d.settle(wctx, &a, s); err != nil {
				d.retrySettle(a, s, err)
				settled = new(registry.RouteSettlement)
				break
			}
			settled = &s
		} else {
			code = pe.Code
		}
		next, nextClaim, err := d.reroute(wctx, &a, h, claim)
		if err != nil {
			d.log.Info("refusal not rerouted", "action_id", a.ActionID, "replica_id", a.ReplicaID, "code", code, "reason", err)
			h.moveUnconfirmed = rerouteResult(err) == "error" // no definite refusal
			break
		}
		d.log.Info("rerouted", "action_id", a.ActionID, "from_replica_id", a.ReplicaID, "to_replica_id", next.ReplicaID, "code", code)
		reroutes = append(reroutes, RerouteFact{FromReplicaID: a.ReplicaID, FromFenceToken: a.FenceToken, RefusalCode: code})
		a, claim, settled = next, nextClaim, nil
		resp.Route = factsOf(&a)
		resp.Route.Reroutes = reroutes
		span.SetAttributes(attribute.String(AttrReplica, a.ReplicaID))
	}
	settlement, status := d.classify(&a, h, &resp)
	if settled != nil {
		// Settled before a reroute that did not happen (its settlement
		// is what classify gives this hop); "" when that settlement was
		// left to the background retries.
		resp.Settlement = *settled
		return resp, status
	}
	if settlement == "" {
		// The replica is running the action for another delivery: the
		// reservation is that delivery's to settle (or, if its dispatcher
		// is gone, reconciliation's), and this one learned nothing about
		// the outcome.
		return resp, status
	}
	if err := d.settle(wctx, &a, settlement); err != nil {
		d.retrySettle(a, settlement, err)
	} else {
		resp.Settlement = settlement
	}
	return resp, status
}

// classify turns the last hop into the answer and the settlement: a
// verified result for the action is completed (a failed
// connector_host.interrupted outcome_unknown: resultSettlement); a
// verified error settles by
// its code (hostSettlement; none for an action in progress); anything
// unverified is outcome_unknown.
func (d *Dispatcher) classify(a *registry.RouteAssignment, h *hop, resp *ActionResponse) (registry.RouteSettlement, int) {
	unknown := func(status int, code, msg string) (registry.RouteSettlement, int) {
		e := newAPIError(status, code, aip.CategoryTransport, true, 0,
			fmt.Sprintf("the outcome of %s on replica %s is unknown: %s; it stays pinned there: send the same action ID again or GET %s/%s", a.ActionID, a.ReplicaID, msg, PathActions, a.ActionID))
		withDetails(e, map[string]string{"action_id": a.ActionID, "replica_id": a.ReplicaID})
		resp.Error = e.pe
		return registry.SettlementOutcomeUnknown, status
	}
	switch {
	case h.env == nil && h.notSent && errors.Is(h.err, errEnvelopeTooLarge):
		e := newAPIError(http.StatusRequestEntityTooLarge, CodeRequestRejected, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("the action was not sent: %v; send a smaller input", h.err))
		resp.Error = e.pe
		return registry.SettlementCancelled, e.status
	case h.env == nil && h.notSent:
		e := newAPIError(http.StatusBadGateway, CodeReplicaUnreachable, aip.CategoryConnector, false, 0,
			fmt.Sprintf("the action was not sent to replica %s: %s", a.ReplicaID, h.public()))
		resp.Error = e.pe
		return registry.SettlementCancelled, e.status
	case h.env == nil && h.unreachable:
		// Nothing of this request reached the replica, so the client may
		// learn so; the settlement is still outcome_unknown: a replica
		// that cannot be reached is the failure its circuit counts, and a
		// delivery of the same action before this one (an earlier attempt,
		// another dispatcher) may have reached it.
		where := "it stays pinned there: send the same action ID again once the replica is back"
		if h.moveUnconfirmed {
			// The registry may have moved it before its answer was lost:
			// a retry goes wherever the route now points. The registry's
			// error is in the log ("refusal not rerouted"), not the answer.
			where = "it may have been moved to another replica (the registry's answer to the move was lost): send the same action ID again"
		}
		e := newAPIError(http.StatusServiceUnavailable, CodeReplicaUnreachable, aip.CategoryTransport, true, time.Second,
			fmt.Sprintf("the action was not delivered: no connection to replica %s could be made (%s), so nothing of this request reached it; %s, or GET %s/%s",
				a.ReplicaID, h.public(), where, PathActions, a.ActionID))
		withDetails(e, map[string]string{"action_id": a.ActionID, "replica_id": a.ReplicaID})
		resp.Error = e.pe
		return registry.SettlementOutcomeUnknown, e.status
	case h.env == nil && h.timedOut:
		return unknown(http.StatusGatewayTimeout, CodeTimeout, "no answer before the action's timeout")
	case h.env == nil:
		return unknown(http.StatusBadGateway, CodeOutcomeUnknown, h.public())
	case h.env.Body.ActionResult != nil:
		res := h.env.Body.ActionResult
		if res.ActionID != a.ActionID {
			return unknown(http.StatusBadGateway, CodeOutcomeUnknown, "the replica answered for another action ("+res.ActionID+")")
		}
		resp.Result = res
		return resultSettlement(res), http.StatusOK
	case h.env.Body.Error != nil:
		pe := h.env.Body.Error.Error
		resp.Error = &pe
		return hostSettlement(pe.Code), hostStatus(pe.Code)
	}
	return unknown(http.StatusBadGateway, CodeOutcomeUnknown, "the replica answered with a "+string(h.env.MessageType))
}

// exchange builds the envelope of body for the assignment's replica (mode
// is the route's original_mode, nil outside an action) and sends it. An
// envelope that cannot be built never leaves: its hop carries the error and
// is marked not sent, like every other failure before the request leaves.
func (d *Dispatcher) exchange(ctx context.Context, a *registry.RouteAssignment, body aip.Body, mode *aip.ActionMode, onChunk func(*aip.StreamChunk)) *hop {
	env, err := d.envelope(a, body, mode)
	if err != nil {
		return &hop{err: err, notSent: true}
	}
	return d.send(ctx, a, env, SpanSend, onChunk)
}

// resolve returns the action's route and the claim its hand-out carries
// ("" when the registry takes none).
func (d *Dispatcher) resolve(ctx context.Context, tenant string, req *ActionRequest) (registry.RouteAssignment, string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	ctx, span := d.tracer.Start(ctx, SpanResolve)
	defer span.End()
	defer d.m.stage("resolve", time.Now())
	claim := d.claimFor()
	a, err := d.deps.Resolver.Resolve(ctx, registry.RouteRequest{
		ActionID: req.ActionID, CapabilityID: req.CapabilityID, TenantID: tenant, Topology: d.cfg.Topology, Claim: claim,
	})
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		// Nothing is sent; a hand-out that committed unseen is released
		// (unsent.go).
		d.releaseUnsent("resolve", req.ActionID, claim, err)
		return a, "", err
	}
	span.SetAttributes(attribute.String(AttrReplica, a.ReplicaID), attribute.String("aip.fence_token", a.FenceToken))
	return a, claim, nil
}

// reroute moves the action off a's replica: on the replica's signed
// refusal in h, or, when h never reached the replica, on a's hand-out
// claim (held, which only this request has). It returns the new
// assignment and its hand-out's claim.
func (d *Dispatcher) reroute(ctx context.Context, a *registry.RouteAssignment, h *hop, held string) (registry.RouteAssignment, string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	rr := registry.RerouteRequest{Current: *a, Topology: d.cfg.Topology, Claim: d.claimFor()}
	code := CodeReplicaUnreachable
	if pe := h.refusal(); pe != nil {
		code = pe.Code
		rr.Evidence = registry.RefusalEvidence{Request: h.request, Response: h.response}
	} else {
		rr.Unsent = held
	}
	ctx, span := d.tracer.Start(ctx, SpanReroute, trace.WithAttributes(attribute.String("aip.from_replica_id", a.ReplicaID),
		attribute.String(AttrErrorCode, code)))
	defer span.End()
	defer d.m.stage("reroute", time.Now())
	claim := rr.Claim
	next, err := d.deps.Rerouter.Reroute(ctx, rr)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		d.m.reroutes.WithLabelValues(rerouteResult(err)).Inc()
		// Nothing is sent to the new replica; a reroute that committed
		// unseen has its new reservation released (unsent.go).
		d.releaseUnsent("reroute", a.ActionID, claim, err)
		return next, "", err
	}
	span.SetAttributes(attribute.String(AttrReplica, next.ReplicaID))
	d.m.reroutes.WithLabelValues("rerouted").Inc()
	return next, claim, nil
}

func rerouteResult(err error) string {
	switch {
	case errors.Is(err, registry.ErrRerouteUnsafe):
		return "unsafe"
	case errors.Is(err, registry.ErrReplicaUnavailable), errors.Is(err, registry.ErrBindingUnavailable):
		return "no_replica"
	case errors.Is(err, registry.ErrCapacityExceeded):
		return "capacity"
	case errors.Is(err, registry.ErrEvidence):
		return "evidence_rejected"
	case errors.Is(err, registry.ErrFenceLost):
		return "fence_lost"
	}
	return "error"
}

func (d *Dispatcher) settle(ctx context.Context, a *registry.RouteAssignment, s registry.RouteSettlement) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	ctx, span := d.tracer.Start(ctx, SpanSettle, trace.WithAttributes(attribute.String(AttrOutcome, string(s)),
		attribute.String(AttrReplica, a.ReplicaID)))
	defer span.End()
	defer d.m.stage("settle", time.Now())
	if err := d.deps.Resolver.Settle(ctx, *a, s); err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		d.m.settleFailures.Inc()
		return err
	}
	return nil
}

// lookup returns the action's current assignment when it belongs to
// tenant; another tenant's action is not found, like an unknown one.
func (d *Dispatcher) lookup(ctx context.Context, tenant, actionID string) (registry.RouteAssignment, *apiError) {
	if err := aip.ValidateID(aip.PrefixAction, actionID); err != nil {
		return registry.RouteAssignment{}, newAPIError(http.StatusNotFound, CodeNotFound, aip.CategoryPermanent, false, 0, "no such action: "+err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	a, err := d.deps.Resolver.Assignment(ctx, actionID)
	if err != nil {
		return a, registryError(err)
	}
	if a.TenantID != tenant {
		return registry.RouteAssignment{}, registryError(registry.ErrNotFound)
	}
	return a, nil
}

// Cancel sends an action-scoped cancel to the action's pinned replica and
// settles the route cancelled. The answer is the replica's journaled
// result of the action (cancelled, or the result it reached first). If the
// action was rerouted while the cancel was in flight, the cancel follows
// it to the new replica. Before each send the route is pinned
// (registry.RoutePinner): no reroute moves the action off an assignment a
// cancel was sent under. The settlement presents the hand-out the cancel
// looked up before sending (the route's last then): it releases the
// reservation in use when the cancel was sent, whose hop the replica's
// answer ends, but never one a Resolve made after the lookup, which its
// holder settles (docs/routing.md, "Hand-outs"). A settlement the registry
// did not confirm is retried in the background, as an action's is.
//
// tenant is held to the rule Execute holds it to: one that is no tenant
// ID is answered 401 CodeUnauthorized, and nothing is looked up or sent.
func (d *Dispatcher) Cancel(ctx context.Context, tenant, actionID, reason string) (ActionResponse, int) {
	ctx, span := d.tracer.Start(ctx, SpanCancel, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(AttrTenant, tenant), attribute.String(AttrAction, actionID)))
	defer span.End()
	resp := ActionResponse{ActionID: actionID}
	e := checkTenantArg(tenant)
	var a registry.RouteAssignment
	if e == nil {
		a, e = d.lookup(ctx, tenant, actionID)
	}
	if e != nil {
		resp.Error = e.pe
		span.SetStatus(codes.Error, e.pe.Code)
		return resp, e.status
	}
	if reason == "" {
		reason = "cancelled by the caller through the aipfleet dispatcher"
	}
	release, e := d.replicaCall(tenant)
	if e != nil {
		resp.Error = e.pe
		span.SetStatus(codes.Error, e.pe.Code)
		return resp, e.status
	}
	defer release()
	wctx := context.WithoutCancel(ctx)
	for attempt := 0; ; attempt++ {
		resp.Route = factsOf(&a)
		span.SetAttributes(attribute.String(AttrReplica, a.ReplicaID))
		if err := d.pin(wctx, &a); err != nil {
			// The action moved since the lookup: the cancel goes to
			// where it is now.
			if errors.Is(err, registry.ErrFenceLost) && attempt <= d.cfg.MaxReroutes {
				if cur, e := d.lookup(wctx, tenant, actionID); e == nil {
					a = cur
					continue
				}
			}
			e := registryError(err)
			resp.Error = e.pe
			span.SetStatus(codes.Error, e.pe.Code)
			return resp, e.status
		}
		hctx, cancel := context.WithTimeout(wctx, d.cfg.ActionTimeout)
		h := d.exchange(hctx, &a, aip.Body{Cancel: &aip.Cancel{Target: aip.CancelTarget{Action: actionID}, Reason: reason}}, nil, nil)
		cancel()
		switch {
		case h.env == nil:
			e := newAPIError(http.StatusBadGateway, CodeReplicaUnreachable, aip.CategoryTransport, true, time.Second,
				fmt.Sprintf("the cancel did not reach replica %s verifiably (%s); send it again", a.ReplicaID, h.public()))
			resp.Error = e.pe
			return resp, e.status
		case h.env.Body.Error != nil:
			pe := h.env.Body.Error.Error
			resp.Error = &pe
			return resp, hostStatus(pe.Code)
		case h.env.Body.ActionResult == nil || h.env.Body.ActionResult.ActionID != actionID:
			e := newAPIError(http.StatusBadGateway, CodeOutcomeUnknown, aip.CategoryTransport, true, 0,
				"the replica answered the cancel with something other than the action's result")
			resp.Error = e.pe
			return resp, e.status
		}
		resp.Result = h.env.Body.ActionResult
		// The action may have moved while the cancel was in flight: follow
		// it, so the cancel reaches every replica it was sent to.
		cur, e := d.lookup(wctx, tenant, actionID)
		if e == nil && cur.FenceToken != a.FenceToken && attempt <= d.cfg.MaxReroutes {
			a = cur
			continue
		}
		// A cancel of an action that finished before it (its own
		// settlement released the route) settles nothing, and says so by
		// leaving Settlement out; a reservation still held — the action
		// running, or orphaned by a dispatcher that died — is released.
		rctx, cancelRead := context.WithTimeout(wctx, d.cfg.RegistryTimeout)
		res, err := d.deps.Resolver.Reservation(rctx, actionID)
		cancelRead()
		if err == nil && !res.Reserved {
			return resp, http.StatusOK
		}
		if err := d.settle(wctx, &a, registry.SettlementCancelled); err != nil {
			d.retrySettle(a, registry.SettlementCancelled, err)
		} else {
			resp.Settlement = registry.SettlementCancelled
		}
		return resp, http.StatusOK
	}
}

// pin forbids every reroute off a before a cancel is sent under it
// (registry.RoutePinner), when the registry can: the replica journals a
// cancel that arrives before its action as the action's cancelled result,
// so the action must never run elsewhere after that.
func (d *Dispatcher) pin(ctx context.Context, a *registry.RouteAssignment) error {
	p, ok := d.deps.Rerouter.(registry.RoutePinner)
	if !ok {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	return p.PinRoute(ctx, *a)
}

// Status returns the action's route, its history and reservation, and the
// journaled state its pinned replica reports to a signed status query.
//
// tenant is held to the rule Execute holds it to: one that is no tenant
// ID is refused with the error a request whose token claims it gets (its
// *aip.ProtocolError, which errors.As finds, has Code CodeUnauthorized),
// and nothing is looked up.
func (d *Dispatcher) Status(ctx context.Context, tenant, actionID string) (ActionStatusResponse, *apiError) {
	ctx, span := d.tracer.Start(ctx, SpanStatus, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String(AttrTenant, tenant), attribute.String(AttrAction, actionID)))
	defer span.End()
	e := checkTenantArg(tenant)
	var a registry.RouteAssignment
	if e == nil {
		a, e = d.lookup(ctx, tenant, actionID)
	}
	if e != nil {
		span.SetStatus(codes.Error, e.pe.Code)
		return ActionStatusResponse{}, e
	}
	out := ActionStatusResponse{ActionID: actionID, CapabilityID: a.CapabilityID, Route: factsOf(&a)}
	rctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	res, err := d.deps.Resolver.Reservation(rctx, actionID)
	if err != nil {
		return ActionStatusResponse{}, registryError(err)
	}
	out.Reservation = ReservationFacts{Reserved: res.Reserved, Retry: res.Retry, HandOut: res.HandOut, LastSettlement: res.LastSettlement}
	if res.Reserved {
		out.Reservation.HandedOutAt = &res.HandedOutAt
	}
	if d.deps.Rerouter != nil {
		hist, err := d.deps.Rerouter.RouteHistory(rctx, actionID)
		if err != nil {
			return ActionStatusResponse{}, registryError(err)
		}
		for i := range hist {
			out.History = append(out.History, *factsOf(&hist[i]))
		}
	}
	release, e := d.replicaCall(tenant)
	if e != nil {
		return ActionStatusResponse{}, e
	}
	defer release()
	st, pe := d.queryStatus(ctx, &a)
	if pe != nil {
		out.Replica.Error = pe
		return out, nil
	}
	out.Replica = ReplicaFacts{Reachable: true, State: st.State, Result: st.Result}
	if !st.UpdatedAt.IsZero() {
		out.Replica.UpdatedAt = &st.UpdatedAt
	}
	return out, nil
}

// queryStatus asks a's pinned replica, with a signed status query, for the
// state its journal holds for the action: the verified answer, or the
// error that stands for it.
func (d *Dispatcher) queryStatus(ctx context.Context, a *registry.RouteAssignment) (*aip.ActionStatus, *aip.ProtocolError) {
	hctx, hcancel := context.WithTimeout(ctx, d.cfg.StatusTimeout)
	defer hcancel()
	h := d.exchange(hctx, a, aip.Body{ActionStatusQuery: &aip.ActionStatusQuery{ActionID: a.ActionID}}, nil, nil)
	switch {
	case h.env == nil:
		return nil, newAPIError(http.StatusBadGateway, CodeReplicaUnreachable, aip.CategoryTransport, true, time.Second,
			fmt.Sprintf("replica %s did not answer the status query verifiably: %s", a.ReplicaID, h.public())).pe
	case h.env.Body.Error != nil:
		pe := h.env.Body.Error.Error
		return nil, &pe
	case h.env.Body.ActionStatus == nil || h.env.Body.ActionStatus.ActionID != a.ActionID:
		return nil, newAPIError(http.StatusBadGateway, CodeReplicaUnreachable, aip.CategoryTransport, true, 0,
			"the replica answered the status query with something else").pe
	}
	return h.env.Body.ActionStatus, nil
}

// Capabilities returns one page of the tenant's catalog. A cursor from an
// older catalog revision is dispatch.stale_cursor (409): restart from the
// first page. A capability ID or profile filter holding an invisible
// formatting character, which no capability ID or profile a version
// declares may hold (registry.RuleFormatCharacter), is 400
// dispatch.request_invalid naming the parameter (it was answered an empty
// page, as if the capability or profile were not the tenant's).
//
// tenant is held to the rule Execute holds it to: one that is no tenant
// ID is refused with the error a request whose token claims it gets (its
// *aip.ProtocolError, which errors.As finds, has Code CodeUnauthorized),
// before the query is looked at.
func (d *Dispatcher) Capabilities(ctx context.Context, tenant string, q registry.CatalogQuery) (CapabilitiesResponse, *apiError) {
	if e := checkTenantArg(tenant); e != nil {
		return CapabilitiesResponse{}, e
	}
	for _, f := range []struct{ field, v, what string }{
		{"capability_id", q.CapabilityID, "capability ID"},
		{"profile", q.Profile, "profile"},
	} {
		if err := checkFormatCharacter(f.field, f.v, f.what); err != nil {
			return CapabilitiesResponse{}, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0, err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, d.cfg.RegistryTimeout)
	defer cancel()
	page, err := d.deps.Catalog.QueryCapabilities(ctx, q, registry.ForTenant(tenant))
	switch {
	case errors.Is(err, registry.ErrStaleCursor):
		return CapabilitiesResponse{}, newAPIError(http.StatusConflict, CodeStaleCursor, aip.CategoryPermanent, false, 0,
			"the catalog changed since this cursor was issued; restart from the first page (omit cursor)")
	case errors.Is(err, registry.ErrInvalid):
		return CapabilitiesResponse{}, newAPIError(http.StatusBadRequest, CodeRequestInvalid, aip.CategoryPermanent, false, 0, catalogQueryError(err))
	case err != nil:
		return CapabilitiesResponse{}, registryError(err)
	}
	return CapabilitiesResponse{CatalogRevision: page.CatalogRevision, Capabilities: page.Capabilities,
		NextCursor: page.NextCursor, Total: page.Total}, nil
}

// catalogQueryParams maps the fields of registry.CatalogQuery the
// registry's errors name to the query parameters of GET
// /aip/v1/capabilities that set them.
var catalogQueryParams = map[string]string{"capability_id": "capability_id", "text": "q", "profile": "profile", "cursor": "cursor"}

// catalogQueryError is the message of a catalog query the registry
// refused: the query parameter the caller sent and why ("q is longer than
// 1024 bytes"), not the registry's record and field ("registry: invalid:
// catalog_query: text: ...").
func catalogQueryError(err error) string {
	fe, ok := errors.AsType[*registry.FieldError](err)
	if !ok || fe.Record != registry.RecordCatalogQuery {
		return err.Error()
	}
	param, ok := catalogQueryParams[fe.Field]
	if !ok {
		return err.Error()
	}
	return param + " " + fe.Reason
}
