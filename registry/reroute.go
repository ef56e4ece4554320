package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// This file is the one exception to "a route never moves": the
// provably-not-started reroute. docs/routing.md gives the safety argument;
// in short, an action may leave its pinned replica only when
//
//   - the replica itself signed a refusal (connector_host.not_ready or
//     connector_host.capacity) of the action envelope that carried the
//     action's current fence token — a host answers so only before it
//     journals or runs anything, after claiming the envelope's message ID in
//     its replay registry, so that envelope can never execute later; and
//   - that envelope is the only one that can exist under the fence: the
//     assignment was handed out exactly once (by the Resolve that created it,
//     or by the Reroute that made it). Every later Resolve of the same
//     assignment (a retry, a concurrent duplicate, a dispatcher that crashed
//     and came back) may have sent another envelope that the refusal says
//     nothing about, so it pins the route for good.
//
// The second ground is an assignment that no envelope ever left under:
// its only hand-out's holder (the dispatcher whose Resolve or Reroute made
// it, proved by that hand-out's claim, RouteRequest.Claim) never got a
// connection to the replica, so nothing under the fence exists anywhere
// to run later (RerouteRequest.Unsent).
//
// Every other failure (a timeout, a connection reset after sending, an
// unsigned answer, an unknown outcome) never reroutes.

// Codes of the signed refusals a connector host sends before it journals or
// runs an action. They are the host's wire codes (hostsdk.CodeNotReady and
// hostsdk.CodeCapacity); the registry cannot import the host, so they are
// repeated here and a test keeps them equal.
const (
	RefusalNotReady = "connector_host.not_ready"
	RefusalCapacity = "connector_host.capacity"
)

// IsRefusalCode reports whether code is a refusal that may move a route.
func IsRefusalCode(code string) bool { return code == RefusalNotReady || code == RefusalCapacity }

// MaxRouteHistory bounds how many times one action may be rerouted: the
// registry refuses a reroute once the action's history holds this many
// superseded assignments.
const MaxRouteHistory = 16

// Errors of the reroute contract.
var (
	// ErrEvidence: the refusal evidence does not prove that the pinned
	// replica refused this action under this fence token (bad or foreign
	// signature, another action, fence or replica, not a refusal code, an
	// answer to another message). Nothing changed.
	ErrEvidence = errors.New("registry: refusal evidence rejected")
	// ErrRerouteUnsafe: the assignment was handed out more than once (a
	// retry or a concurrent resolve of the same action), so another envelope
	// may exist under its fence and the refusal of one proves nothing about
	// the action. The route stays pinned. Nothing changed.
	ErrRerouteUnsafe = errors.New("registry: reroute unsafe")
)

// RefusalEvidence is what a dispatcher presents to move an action off a
// replica that refused it: the exact bytes it posted and the exact bytes the
// replica answered.
type RefusalEvidence struct {
	// Request is the signed native action envelope the dispatcher sent, as
	// posted. It carries security.connector_route with the current fence.
	Request json.RawMessage `json:"request"`
	// Response is the replica's signed error envelope answering it, as
	// received: in_response_to names the request's message ID.
	Response json.RawMessage `json:"response"`
}

// Refusal is what CheckRefusal established.
type Refusal struct {
	// Code is RefusalNotReady or RefusalCapacity.
	Code string `json:"code"`
	// MessageID is the refused request envelope's message ID.
	MessageID string `json:"message_id"`
	// ResponseID is the refusal envelope's message ID.
	ResponseID string `json:"response_id"`
	// RetryAfter is the replica's retry hint (0 when it gave none).
	RetryAfter time.Duration `json:"-"`
}

// RerouteRequest asks to move an action off the replica that refused it.
type RerouteRequest struct {
	// Current is the assignment the refused envelope carried; it must be
	// the action's current assignment, exactly (else ErrFenceLost).
	Current RouteAssignment `json:"current"`
	// Evidence proves the refusal (CheckRefusal). Empty when Unsent is
	// given.
	Evidence RefusalEvidence `json:"evidence"`
	// Unsent, instead of Evidence, is the claim (RouteRequest.Claim) of
	// Current's hand-out, presented by the dispatcher that holds it when
	// no attempt to send the action under it ever reached the replica (no
	// connection could be made): no envelope exists under the fence. The
	// registry requires, atomically with the rest, that the action's last
	// hand-out carries this claim and is Current's (ErrEvidence
	// otherwise). The dispatcher settles Current (outcome_unknown, which
	// counts toward the unreachable replica's circuit) before it asks.
	Unsent string `json:"unsent,omitempty"`
	// Topology is the deployment's placement preference, as for a new
	// route.
	Topology RouteTopologyPreference `json:"topology"`
	// Claim names the new assignment's hand-out, as RouteRequest.Claim
	// does (UnsentReleaser); empty names none.
	Claim string `json:"claim,omitempty"`
}

// Rerouter is the contract of the provably-not-started reroute. Both
// backends implement it, and registrytest holds them to the same behaviour.
type Rerouter interface {
	// Reroute checks the grounds with CheckRerouteGrounds, then in one
	// atomic step: requires req.Current to be the action's current assignment
	// (ErrFenceLost otherwise; ErrNotFound for an unknown action) and to
	// have been handed out exactly once (ErrRerouteUnsafe otherwise), and
	// the action's history to hold fewer than MaxRouteHistory assignments
	// (ErrConflict otherwise) and, for req.Unsent, its last hand-out to be
	// Current's and carry that claim (UnsentHolder; ErrEvidence
	// otherwise); releases the current reservation if it is still held (last settlement cancelled, circuit unchanged); selects a
	// replica exactly as a new route does (same filters, CompareCandidates
	// order, req.Topology) but never the refusing replica; reserves the
	// base admission scopes and the replica; and makes the new assignment,
	// with a fresh fence token, the action's current one (its hand-out
	// carrying req.Claim), keeping the old one as history. It returns the new assignment. Selection failures
	// (ErrBindingUnavailable, ErrReplicaUnavailable, *CapacityExceededError)
	// and every other error change nothing: the old assignment stays
	// current with its reservation as it was.
	Reroute(ctx context.Context, req RerouteRequest) (RouteAssignment, error)
	// RouteHistory returns the assignments an action was moved off, oldest
	// first (empty when it was never rerouted); its current assignment is
	// Resolver.Assignment. An unknown action is ErrNotFound.
	RouteHistory(ctx context.Context, actionID string) ([]RouteAssignment, error)
}

// RoutePinner is implemented by both backends: it lets a sender that holds
// no hand-out of the action's current assignment — a cancel, which is sent
// under the current fence after a lookup — forbid every reroute off that
// assignment before it sends. Without it, a cancel the replica journaled
// ("cancelled before the action arrived", answered to the client as the
// action's result) could be followed by a reroute whose holder saw only a
// refusal or no connection, and the action would run on another replica
// after its caller was told it was cancelled.
type RoutePinner interface {
	// PinRoute marks a, which must be the action's current assignment
	// (ErrFenceLost otherwise; ErrNotFound for an unknown action), as
	// possibly delivered outside its hand-outs: from then on Reroute
	// refuses it with ErrRerouteUnsafe, as an assignment handed out twice.
	// It reserves and settles nothing. Idempotent; atomic with Reroute.
	PinRoute(ctx context.Context, a RouteAssignment) error
}

// CheckRerouteGrounds is the check every backend applies before a reroute;
// it holds no state. A request gives exactly one ground: the refusal
// evidence (CheckRefusal) or the Unsent claim, which must be a valid claim
// (the backend then checks it against the stored hand-out with
// UnsentHolder). Every failure matches ErrEvidence.
func CheckRerouteGrounds(req *RerouteRequest) error {
	a := &req.Current
	if req.Unsent == "" {
		_, err := CheckRefusal(a, &req.Evidence)
		return err
	}
	switch {
	case len(req.Evidence.Request) != 0 || len(req.Evidence.Response) != 0:
		return fmt.Errorf("%w: action %s fence %s: give either the refusal evidence or the unsent claim, not both", ErrEvidence, a.ActionID, a.FenceToken)
	case !ValidClaim(req.Unsent):
		return fmt.Errorf("%w: action %s fence %s: the unsent claim %q must be 1 to %d letters, digits, '_' or '-'", ErrEvidence, a.ActionID, a.FenceToken, truncate(req.Unsent), MaxClaimBytes)
	}
	return nil
}

// UnsentHolder is the stored-state check of a reroute on the Unsent
// ground: nil when the action's last hand-out (number last, its claim
// lastClaim, the claim's hand-out number claimHandOut) is the presented
// assignment's and carries the presented claim, else an ErrEvidence. A
// backend calls it under the lock that orders the reroute with every
// Resolve of the action, after the hand-out-once check.
func UnsentHolder(req *RerouteRequest, lastClaim string, claimHandOut, last uint64) error {
	a := &req.Current
	if req.Unsent == "" {
		return nil
	}
	if lastClaim != req.Unsent || claimHandOut != last || last != a.HandOut {
		return fmt.Errorf("%w: action %s fence %s: the unsent claim is not that of the assignment's hand-out, so the caller cannot vouch that nothing was sent under it; it stays pinned",
			ErrEvidence, a.ActionID, a.FenceToken)
	}
	return nil
}

// CheckRefusal is the evidence check of a reroute on a replica's signed
// refusal; it holds no state. It verifies that:
//
//   - the response is a native envelope signed by the assignment's peer DID,
//     from the assignment's peer principal, with an error body whose code is
//     a refusal (IsRefusalCode);
//   - the request is a signed native envelope (the replica authenticated
//     its signer as the dispatcher before refusing) whose message ID the
//     response's in_response_to names;
//   - the request is an action envelope addressed to the assignment's peer
//     principal, carrying the assignment's action and capability, and its
//     security.connector_route pins exactly the assignment's coordinates:
//     action, capability, tenant, instance, replica, version, manifest
//     digest and fence token;
//   - when the response itself carries a security.connector_route, it names
//     the same action and fence token.
//
// Every failure matches ErrEvidence.
func CheckRefusal(a *RouteAssignment, ev *RefusalEvidence) (*Refusal, error) {
	bad := func(format string, args ...any) (*Refusal, error) {
		return nil, fmt.Errorf("%w: action %s fence %s: %s", ErrEvidence, a.ActionID, a.FenceToken, fmt.Sprintf(format, args...))
	}
	switch {
	case len(ev.Request) == 0 || len(ev.Response) == 0:
		return bad("the evidence needs both the request envelope and the replica's response")
	case len(ev.Request) > aip.MaxMessageBytes || len(ev.Response) > aip.MaxMessageBytes:
		return bad("an evidence envelope exceeds %d bytes", aip.MaxMessageBytes)
	case a.PeerDID == "":
		return bad("the assignment names no peer DID")
	}
	resp, err := aip.VerifyEnvelope(ev.Response, a.PeerDID)
	if err != nil {
		return bad("the response is not an envelope signed by replica %s (%s): %v", a.ReplicaID, a.PeerDID, err)
	}
	r := &resp.Envelope
	if r.Body.Error == nil {
		return bad("the response is a %s, not an error", r.MessageType)
	}
	pe := &r.Body.Error.Error
	if !IsRefusalCode(pe.Code) {
		return bad("the response's error %s is not a refusal (%s or %s)", pe.Code, RefusalNotReady, RefusalCapacity)
	}
	if r.From == nil || r.From.ID != a.PeerPrincipalID {
		return bad("the response is not from the replica's principal %s", a.PeerPrincipalID)
	}
	req, err := aip.VerifyEnvelope(ev.Request, "")
	if err != nil {
		return bad("the request is not a signed envelope: %v", err)
	}
	q := &req.Envelope
	if r.InResponseTo == nil || r.InResponseTo.Message != q.MessageID {
		return bad("the response does not answer request %s", q.MessageID)
	}
	act := q.Body.Action
	if act == nil {
		return bad("the request is a %s, not an action", q.MessageType)
	}
	if act.ID != a.ActionID || act.CapabilityID != a.CapabilityID {
		return bad("the request carries action %s (%s), not %s (%s)", act.ID, act.CapabilityID, a.ActionID, a.CapabilityID)
	}
	if q.To == nil || q.To.ID != a.PeerPrincipalID {
		return bad("the request is not addressed to the replica's principal %s", a.PeerPrincipalID)
	}
	var route aip.ConnectorRoute
	if ok, err := q.SecurityValue(aip.SecurityConnectorRoute, &route); !ok || err != nil {
		return bad("the request carries no readable security.%s", aip.SecurityConnectorRoute)
	}
	if field := routeMismatch(a, &route); field != "" {
		return bad("the request's route %s does not match the assignment", field)
	}
	var echoed aip.ConnectorRoute
	if ok, err := r.SecurityValue(aip.SecurityConnectorRoute, &echoed); ok {
		if err != nil || echoed.ActionID != a.ActionID || echoed.FenceToken != a.FenceToken {
			return bad("the response's security.%s names another action or fence", aip.SecurityConnectorRoute)
		}
	}
	return &Refusal{Code: pe.Code, MessageID: q.MessageID, ResponseID: r.MessageID, RetryAfter: pe.RetryAfter()}, nil
}

// routeMismatch returns the first route field that differs from the
// assignment, or "".
func routeMismatch(a *RouteAssignment, r *aip.ConnectorRoute) string {
	for _, f := range []struct{ name, got, want string }{
		{"action_id", r.ActionID, a.ActionID},
		{"capability_id", r.CapabilityID, a.CapabilityID},
		{"tenant_id", r.TenantID, a.TenantID},
		{"instance_id", r.InstanceID, a.InstanceID},
		{"replica_id", r.ReplicaID, a.ReplicaID},
		{"version_id", r.VersionID, a.VersionID},
		{"manifest_digest", r.ManifestDigest, a.ManifestDigest},
		{"fence_token", r.FenceToken, a.FenceToken},
	} {
		if f.got != f.want {
			return f.name
		}
	}
	return ""
}

// RerouteRouteRequest returns the route request a reroute selects with: the
// current assignment's work identity and the given topology preference
// and claim.
func RerouteRouteRequest(req *RerouteRequest) RouteRequest {
	c := &req.Current
	return RouteRequest{ActionID: c.ActionID, CapabilityID: c.CapabilityID, TenantID: c.TenantID, Topology: req.Topology, Claim: req.Claim}
}

// RerouteHistoryFull rejects a reroute of an action whose history already
// holds MaxRouteHistory assignments.
func RerouteHistoryFull(actionID string) error {
	return fmt.Errorf("%w: action %s was already rerouted %d times; it stays on its current route", ErrConflict, actionID, MaxRouteHistory)
}

// RerouteUnsafe rejects a reroute of an assignment that was handed out more
// than once.
func RerouteUnsafe(a *RouteAssignment) error {
	return fmt.Errorf("%w: action %s was resolved again under fence %s (a retry or a concurrent request) or a cancel was sent under it, so another envelope may have reached replica %s; it stays pinned there",
		ErrRerouteUnsafe, a.ActionID, a.FenceToken, a.ReplicaID)
}

// SettleFenceLost rejects a settlement whose presented assignment is not
// the one the registry holds for the action.
func SettleFenceLost(a *RouteAssignment) error {
	return fmt.Errorf("%w: the assignment presented for action %s is not the stored one (fence %s)", ErrFenceLost, a.ActionID, a.FenceToken)
}

// RerouteFenceLost rejects a reroute whose presented assignment is not the
// action's current one.
func RerouteFenceLost(a *RouteAssignment) error {
	return fmt.Errorf("%w: the assignment presented for action %s (fence %s) is not its current one", ErrFenceLost, a.ActionID, a.FenceToken)
}
