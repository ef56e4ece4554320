package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Error codes of the dispatcher (docs/dispatch-api.md has the table with
// their HTTP statuses).
const (
	// Request and authentication.
	CodeUnauthorized    = "dispatch.unauthorized"
	CodeRequestInvalid  = "dispatch.request_invalid"
	CodeActionInvalid   = "dispatch.action_invalid"
	CodeRequestTooLarge = "dispatch.request_too_large"
	CodeNotFound        = "dispatch.not_found"
	CodeStaleCursor     = "dispatch.stale_cursor"
	CodeShuttingDown    = "dispatch.shutting_down"
	// CodeInternal answers a request the dispatcher failed on (a recovered
	// panic); the details are only in its log.
	CodeInternal = "dispatch.internal"
	// Outcome of the hop to the replica.
	CodeOutcomeUnknown     = "dispatch.outcome_unknown"
	CodeTimeout            = "dispatch.timeout"
	CodeReplicaUnreachable = "dispatch.replica_unreachable"
	// Registry and scheduler (reference §7.1 names).
	CodeAdmissionCapacity   = "connector.admission_capacity"
	CodeSchedulerOverloaded = "connector.scheduler_overloaded"
	CodeRequestRejected     = "connector.request_rejected"
	CodeBindingUnavailable  = "connector.binding_unavailable"
	CodeReplicaUnavailable  = "connector.replica_unavailable"
	CodeRouteConflict       = "connector.route_conflict"
	CodeRegistry            = "connector.registry_unavailable"
)

// Host codes the dispatcher interprets (hostsdk's wire codes).
const (
	hostNotReady            = registry.RefusalNotReady
	hostCapacity            = registry.RefusalCapacity
	hostOutcomeUnknown      = "connector_host.outcome_unknown"
	hostExecution           = "connector_host.execution"
	hostStorageUnavailable  = "connector_host.storage_unavailable"
	hostReplay              = "connector_host.replay"
	hostInputInvalid        = "connector_host.input_invalid"
	hostIdempotencyConflict = "connector_host.idempotency_conflict"
	hostActionInProgress    = "connector_host.action_in_progress"
	hostCapabilityUnknown   = "connector_host.capability_unknown"
	hostActionExpired       = "connector_host.action_expired"
	// hostInterrupted fails an action the replica's connector or process
	// stopped running before it said what it did (hostsdk.CodeInterrupted):
	// a read-only capability's that a panic, a hang, a timeout, a crash of
	// a local connector or a restart cut off, or one journaled but never
	// started before a restart. It is a failed result, but settles
	// outcome_unknown (resultSettlement).
	hostInterrupted = "connector_host.interrupted"
	// The replica's credential revision policy refused the route's
	// revision (denied), or the replica cannot read its policy
	// (unavailable). Both are given before the replica journals or runs
	// anything, but they are not reroute evidence (registry.IsRefusalCode):
	// every replica of the instance reads the same policy, so the refusal
	// is the client's answer, and the route settles cancelled.
	hostCredentialDenied      = "connector_host.credential_revision_denied"
	hostCredentialUnavailable = "connector_host.credential_revision_unavailable"
	// Codes the dispatcher only counts (errorLabel).
	hostAuthentication     = "connector_host.authentication"
	hostRouteMismatch      = "connector_host.route_mismatch"
	hostUnsupportedMessage = "connector_host.unsupported_message"
	hostOutputInvalid      = "connector_host.output_invalid"
	hostResponseSigning    = "connector_host.response_signing"
	hostDecodeInvalid      = "envelope.decode.invalid"
	hostSchemaInvalid      = "schema.envelope.invalid"
	hostTooLarge           = "envelope.too_large"
)

var errorSource = json.RawMessage(`{"component":"aipfleet-dispatch"}`)

// apiError is a protocol error with the HTTP status the API answers it
// with.
type apiError struct {
	status int
	pe     *aip.ProtocolError
}

func (e *apiError) Error() string { return e.pe.Error() }

// Unwrap returns the protocol error, so that an embedder given an
// *apiError (Status, Capabilities) reads its code with errors.As.
func (e *apiError) Unwrap() error { return e.pe }

func newAPIError(status int, code string, category aip.ErrorCategory, retryable bool, retryAfter time.Duration, msg string) *apiError {
	pe := aip.NewProtocolError(code, category, retryable, uint64(retryAfter.Milliseconds()), aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes))
	pe.Source = errorSource
	return &apiError{status: status, pe: pe}
}

func withDetails(e *apiError, details any) *apiError {
	e.pe.Details, _ = json.Marshal(details)
	return e
}

// registryError maps a registry failure to the API (reference §7.1).
func registryError(err error) *apiError {
	var ce *registry.CapacityExceededError
	switch {
	case errors.As(err, &ce):
		return withDetails(newAPIError(http.StatusTooManyRequests, CodeAdmissionCapacity, aip.CategoryTemporary, true, ce.RetryAfter,
			"an admission limit of the capability's binding is reached; retry later"), map[string]any{"scope": ce.Scope, "limit": ce.Limit})
	case errors.Is(err, registry.ErrBindingUnavailable):
		return newAPIError(http.StatusNotFound, CodeBindingUnavailable, aip.CategoryPolicy, false, 0,
			"the capability is not available to your tenant (no usable binding); list yours with GET "+PathCapabilities)
	case errors.Is(err, registry.ErrReplicaUnavailable):
		return newAPIError(http.StatusServiceUnavailable, CodeReplicaUnavailable, aip.CategoryTemporary, true, time.Second,
			"no replica can take the action now: "+err.Error())
	case errors.Is(err, registry.ErrConflict):
		return newAPIError(http.StatusConflict, CodeRouteConflict, aip.CategoryPermanent, false, 0,
			"the action ID is already taken by another action (another capability, or another tenant's); use a new action ID")
	case errors.Is(err, registry.ErrInvalid):
		return newAPIError(http.StatusUnprocessableEntity, CodeActionInvalid, aip.CategoryPermanent, false, 0, err.Error())
	case errors.Is(err, registry.ErrNotFound):
		return newAPIError(http.StatusNotFound, CodeNotFound, aip.CategoryPermanent, false, 0, "no such action")
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return newAPIError(http.StatusServiceUnavailable, CodeRegistry, aip.CategoryTemporary, true, time.Second,
			"the registry did not answer in time; nothing was dispatched: retry shortly (an action with the same action ID)")
	}
	return newAPIError(http.StatusServiceUnavailable, CodeRegistry, aip.CategoryTemporary, true, time.Second,
		"the registry is unavailable: retry shortly (an action with the same action ID)")
}

// schedulerError maps an admission failure to the API (reference §7.1).
func schedulerError(err error) *apiError {
	switch {
	case errors.Is(err, ErrRequestTooLarge):
		// A body within MaxBodyBytes may still weigh more than one action
		// may (the scheduler counts the request overhead too): say what
		// was counted, not the scheduler's "dispatch: request too large".
		return newAPIError(http.StatusRequestEntityTooLarge, CodeRequestRejected, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("the action is too large to admit (%s, counting its input, capability ID and idempotency key and %d bytes more); nothing was dispatched: send a smaller input",
				strings.TrimPrefix(err.Error(), ErrRequestTooLarge.Error()+": "), requestOverhead))
	case errors.Is(err, ErrSchedulerStopped):
		return newAPIError(http.StatusServiceUnavailable, CodeShuttingDown, aip.CategoryTemporary, true, time.Second,
			"the dispatcher is shutting down; retry with the same action ID")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return newAPIError(http.StatusServiceUnavailable, CodeSchedulerOverloaded, aip.CategoryTemporary, true, 100*time.Millisecond,
			"the request ended while waiting for admission; nothing was dispatched")
	}
	return newAPIError(http.StatusTooManyRequests, CodeSchedulerOverloaded, aip.CategoryTemporary, true, 100*time.Millisecond,
		"the dispatcher is overloaded ("+err.Error()+"); retry later")
}

// hostStatus is the HTTP status the API answers a replica's signed error
// with.
func hostStatus(code string) int {
	switch code {
	case hostNotReady, hostStorageUnavailable, hostCredentialUnavailable:
		return http.StatusServiceUnavailable
	case hostCredentialDenied:
		return http.StatusForbidden
	case hostCapacity:
		return http.StatusTooManyRequests
	case hostInputInvalid:
		return http.StatusUnprocessableEntity
	case hostIdempotencyConflict, hostActionInProgress:
		return http.StatusConflict
	case hostCapabilityUnknown:
		return http.StatusNotFound
	case hostActionExpired:
		return http.StatusGone
	}
	return http.StatusBadGateway
}

// resultSettlement is how a replica's verified action_result settles the
// route: completed (the replica answered, whatever the result's status),
// except a failed connector_host.interrupted, which settles
// outcome_unknown. That result is what the replica answers, instead of
// connector_host.outcome_unknown, for a read-only capability's action its
// connector crashed, hung or timed out on (or a restart cut off): the
// read changed nothing, so the client is told it failed and may be sent
// again, but the replica failed all the same. Settled completed, it would
// close the replica's circuit, and a replica whose reads keep crashing or
// hanging would never trip it, while the same failure of a mutation
// counts toward it.
func resultSettlement(res *aip.ActionResult) registry.RouteSettlement {
	if res.Status == aip.ResultFailed && res.Error != nil && res.Error.Code == hostInterrupted {
		return registry.SettlementOutcomeUnknown
	}
	return registry.SettlementCompleted
}

// hostSettlement is how a replica's signed error settles the route: codes
// that leave the outcome uncertain count as outcome_unknown; action in
// progress settles nothing (the action runs for another delivery, whose
// dispatcher settles the reservation); action expired settles pruned (the
// replica's journal no longer knows the action, which may have finished
// there: its outcome is unknown, but the replica did nothing wrong, so its
// circuit is left alone); the others are definitive answers given before
// this delivery ran anything.
func hostSettlement(code string) registry.RouteSettlement {
	switch code {
	case hostOutcomeUnknown, hostExecution, hostStorageUnavailable, hostReplay:
		return registry.SettlementOutcomeUnknown
	case hostActionInProgress:
		return "" // running for another delivery, which settles it
	case hostActionExpired:
		return registry.SettlementPruned
	}
	return registry.SettlementCancelled
}
