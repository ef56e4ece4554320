package hostsdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// TenantContext is the deployment identity a connector serves: one tenant's
// instance of one connector version, on one replica. Every field comes
// from the host's configuration (the operator's settings), never from a
// message: it is what the host vouches for.
type TenantContext struct {
	TenantID          string
	ConnectorTypeID   string
	VersionID         string
	InstanceID        string
	ReplicaID         string
	ConfigRevision    uint64
	SecretProviderRef string
	TrustDomain       string
	// TenantSystem is the system TenantID belongs to (--tenant-system;
	// empty when not configured).
	TenantSystem string
	// MembershipID is the tenant membership the instance acts under
	// (--membership-id; empty when not configured).
	MembershipID string
	// ExternalAccount is the provider account the instance acts as
	// (--external-account-id and --external-account-system; nil when not
	// configured).
	ExternalAccount *aip.AccountRef
	// Credential references the tenant credential the instance uses
	// (--credential-id, --credential-issuer, --credential-scope; nil when
	// not configured), and CredentialRevisionRef is its revision
	// (--credential-revision-ref). The credential's value is the
	// connector's to obtain, through SecretProviderRef.
	Credential            *aip.CredentialRef
	CredentialRevisionRef string
}

// clone returns a copy of t that shares no memory with it, so a connector
// that changes what it was given changes nothing the host or another call
// sees.
func (t TenantContext) clone() TenantContext {
	if t.ExternalAccount != nil {
		a := *t.ExternalAccount
		t.ExternalAccount = &a
	}
	if t.Credential != nil {
		c := *t.Credential
		c.Scopes = slices.Clone(c.Scopes)
		t.Credential = &c
	}
	return t
}

// identity is the identity of every action the connector is given
// (reference §5.5 step 8): whatever identity the action carried is
// replaced by the host's configuration: the tenant with its system, the
// external account, the dispatcher's principal as the service account,
// and the credential reference. Nothing else of the payload's identity
// (external user, human actor, acted on behalf of, OAuth) reaches the
// connector: the host cannot verify it.
func (t TenantContext) identity(gateway aip.Principal) *aip.IdentityContext {
	t = t.clone()
	return &aip.IdentityContext{
		Tenant:          &aip.TenantRef{ID: t.TenantID, System: t.TenantSystem},
		ExternalAccount: t.ExternalAccount,
		ServiceAccount:  &gateway,
		CredentialRef:   t.Credential,
	}
}

// Connector is what a connector author implements: tenant-scoped discovery
// and the handling of one action. Optional capabilities are detected by type
// assertion: HealthChecker, Canceler, Streamer, Reconciler, RouteProvider,
// EventSource and ActionStateKeeper.
//
// A panic in a method the host calls is caught: in Handle or HandleStream
// it records the action outcome_unknown (a read-only capability's failed
// connector_host.interrupted, retryable: see Interrupted); in Manifest, Routes or Reconcile
// it fails that bootstrap step, in ActionStateNamespaces New, and in
// CheckHealth the probe, each with an error naming the method (a panicking
// CheckHealth's stack is logged once per streak of the same panic); in Cancel
// it is logged and the cancel answered; in RunEvents it stops the event
// source, a failure of the shutdown. A panic on a goroutine the connector
// starts itself ends the process: the journal keeps the actions it was
// running, and the next start settles them (Reconciler, or
// outcome_unknown; a read failed connector_host.interrupted).
type Connector interface {
	// Manifest returns the connector's manifest for the tenant. Its agent is
	// the host's signing principal: the host sets agent.trust_domain to the
	// configured trust domain (an agent with another trust domain, or with
	// a DID other than the replica's own, is refused; leave both empty), and
	// the bound manifest's digest must match the admitted version's. The
	// agent ID is what every replica's peer_principal_id must equal, so it
	// is refused unless it is a registry identifier: 1 to 256 bytes of
	// UTF-8 text without control characters, invisible formatting
	// characters or white space at either end.
	Manifest(ctx context.Context, tenant TenantContext) (*aip.Manifest, error)
	// Handle runs one action and returns its result. The host has already
	// verified the dispatcher, checked the pinned route, validated the input
	// against the capability's input_schema and journaled the action; it
	// journals whatever Handle returns. ctx is cancelled when the action is
	// cancelled, its timeout passes or the host stops (context.Cause(ctx)
	// is then ErrActionCancelled, ErrActionTimeout or ErrHostStopping);
	// Handle must return soon after. One that is still running Config.HandleGrace later is
	// abandoned: the action is journaled and answered outcome_unknown (a
	// read-only capability's failed connector_host.interrupted, retryable:
	// the read changed nothing; so is one whose Handle answered its
	// timeout or the host's shutdown with only the context's error), its
	// late result is dropped, and the call keeps its in-flight slot until
	// it returns. A drain does not wait for an abandoned call, and the host
	// cannot end it: after Stop it runs on until it returns or the process
	// exits, its State calls failing with journal.ErrClosed and its
	// publications with ErrNotServing.
	//
	// Returning an error: an *aip.ProtocolError (possibly wrapped) becomes
	// a failed result carrying it (one that is not valid, without a code or
	// with an unknown category, becomes connector.failed naming the
	// problem); an error wrapping ErrOutcomeUnknown records
	// outcome_unknown (use it when a provider side effect may or may not
	// have happened); any other error becomes a failed result with code
	// connector.failed. A panic is recorded as outcome_unknown (for a
	// read-only capability failed connector_host.interrupted, as
	// Interrupted decides), and so is a
	// result no signed answer can carry: larger than MaxResultBytes, or
	// not I-JSON (a member name twice, a number beyond the double range, a
	// lone surrogate, too deeply nested) — for a capability whose side
	// effects are all reads such a result, or a completed output its
	// output_schema refuses, is a failed result with CodeOutputInvalid
	// instead (a completed output of any other capability that its schema
	// refuses is outcome_unknown: the effect happened).
	Handle(ctx context.Context, call *Call) (*aip.ActionResult, error)
}

// HealthChecker reports whether the connector can serve (provider reachable,
// credentials valid). The host probes it before registering, on every
// heartbeat tick and on /ready, each bounded by the health probe timeout; an
// unhealthy connector makes the replica not ready. A check that outlives the
// timeout (one that ignores ctx) counts as not ready, and concurrent probes
// share one run of CheckHealth rather than start another while it is busy.
//
// A connector that can serve, but not all of what it fronts (one of its
// provider endpoints failing while the others pass), returns Degraded(err)
// instead of nil: the replica stays ready, and err's text is what /ready's
// connector detail shows and the host logs (see DegradedError).
type HealthChecker interface {
	CheckHealth(ctx context.Context) error
}

// DegradedError is what CheckHealth returns (through Degraded) for a
// connector that is ready but degraded: it can serve, and Err says what it
// cannot. The host counts such a check as passed — the replica stays
// ready, its heartbeat reports connector_ready=true — and shows
// "connector is ready but degraded: " and Err's text as /ready's connector
// detail (to a peer on the same machine; others see "connector is ready
// but degraded", as they see only a fixed text for a failure). The host
// logs at warn when the connector becomes degraded and at info when it
// no longer is, not at every probe.
//
// Only a DegradedError CheckHealth returns, or wraps with fmt.Errorf's
// single %w, is counted as ready; one joined with other errors
// (errors.Join, several %w) is a failure like any other error.
type DegradedError struct {
	Err error
}

// Degraded returns err as a *DegradedError: the connector is ready, but
// err says what part of it is not. Degraded(nil) is nil (healthy).
func Degraded(err error) error {
	if err == nil {
		return nil
	}
	return &DegradedError{Err: err}
}

func (e *DegradedError) Error() string { return "degraded: " + e.Err.Error() }

// Unwrap returns Err.
func (e *DegradedError) Unwrap() error { return e.Err }

// asDegraded returns the *DegradedError err is, or wraps through single
// Unwraps only (fmt.Errorf with one %w), and nil for any other error: a
// degraded detail joined with a real failure is a failure.
func asDegraded(err error) *DegradedError {
	for err != nil {
		if d, ok := err.(*DegradedError); ok {
			return d
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return nil
		}
		err = u.Unwrap()
	}
	return nil
}

// Canceler is told when an action-scoped cancel arrives for a running
// action, in addition to the cancellation of the running Handle's context.
// Implement it when the provider has its own cancel call.
type Canceler interface {
	Cancel(ctx context.Context, call *Call, reason string) error
}

// Streamer handles actions whose mode is streaming: it sends ordered chunks
// through the ChunkWriter and returns the final result, which is journaled
// like a synchronous one.
//
// The host picks the method by the action's mode, not by the capability's
// contract: HandleStream gets the streaming actions, and Handle every other
// (so also an action sent sync for a capability whose contract supports
// only streaming, and a streaming one when the connector is no Streamer,
// answered with its final result and no chunks).
type Streamer interface {
	HandleStream(ctx context.Context, call *Call, chunks *ChunkWriter) (*aip.ActionResult, error)
}

// Reconciler settles actions a crash left running: before registering, the
// host passes each one to Reconcile. Return the final result (completed,
// failed or cancelled), or an error wrapping ErrOutcomeUnknown when the
// provider cannot tell. Any other error is a recovery error and blocks
// registration. A result no signed answer can carry (see Connector.Handle)
// is journaled outcome_unknown. Without a Reconciler such actions become
// outcome_unknown. A read-only capability's action (ReadOnly) that no
// Reconciler settled — there is none, or it answered ErrOutcomeUnknown —
// fails connector_host.interrupted instead: a read changed nothing.
type Reconciler interface {
	Reconcile(ctx context.Context, action *UncertainAction) (*aip.ActionResult, error)
}

// ActionStateKeeper is implemented by a connector that keeps values keyed
// by action ID in its state store (a provider's run ID to cancel by, a
// side-effect ledger): when the host prunes a finished action's journal
// record after Config.ActionRetention, it deletes the action's value in
// each of these namespaces in the same transaction, so they do not outlive
// the action. A namespace follows the state store's rules (non-empty UTF-8
// text without NUL, not under ReservedStatePrefix); New refuses others.
type ActionStateKeeper interface {
	ActionStateNamespaces() []string
}

// RouteProvider mounts product-owned HTTP routes (webhooks, OAuth callbacks)
// on the host's listener. Patterns use net/http.ServeMux syntax and must not
// overlap the host's own routes.
type RouteProvider interface {
	Routes(ctx context.Context, rc *RouteContext) ([]Route, error)
}

// EventSource runs a provider-event loop (polling, a subscription) for the
// life of the host. It starts after the host begins serving and its context
// is cancelled at the start of drain, when event publication stops.
//
// RunEvents is called once and never again: it should return only once
// ctx is done, and within Config.DrainTimeout of that. A RunEvents that
// returns earlier ends the replica's event source while the replica keeps
// serving actions; when it returned an error (other than
// context.Canceled), the host logs "event source stopped" at error level
// and the drain is not clean (Run's *ShutdownError names the event
// source), and so is one still running DrainTimeout after ctx ended.
// So retry what fails meanwhile yourself: the provider's errors, and
// Publish's ErrNotServing (the replica is not ready for now) and
// ErrEventOutboxFull. Give each event the ID DeriveEventID derives from
// the provider's delivery, so that publishing it again, after a retry or
// a restart that polls from an earlier cursor, stores it once.
//
// Keep the cursor in events.State() (the journal-backed state store Calls
// use, in a namespace of your own): read it when RunEvents starts and
// write it after each batch is published, and a host restarted on the
// same journal resumes from it. Publish before writing the cursor: a
// crash between the two publishes the batch again, which its derived IDs
// store once; the other order would lose it.
type EventSource interface {
	RunEvents(ctx context.Context, events *EventPublisher) error
}

// Route is one product-owned HTTP route.
type Route struct {
	// Pattern is a net/http.ServeMux pattern, for example
	// "POST /webhooks/calendar".
	Pattern string
	Handler http.Handler
}

// RouteContext gives product routes what they share with the host.
type RouteContext struct {
	Tenant TenantContext
	// Events publishes provider events into the journal outbox.
	Events *EventPublisher
	// State is the journal-backed state store.
	State *State
	// Ready reports whether the replica is ready (lease valid, not
	// draining, storage and connector healthy).
	Ready  func() bool
	Logger *slog.Logger
}

// UncertainAction is an action a previous process left running.
type UncertainAction struct {
	Action journal.Action
	Tenant TenantContext
	State  *State
	Logger *slog.Logger
}

// Call is one action handed to a connector.
type Call struct {
	// Action is the verified action; its identity carries the deployment's
	// tenant.
	Action *aip.Action
	// Capability is the manifest capability the action invokes.
	Capability *aip.Capability
	Tenant     TenantContext
	// IdempotencyKey is the action's idempotency key, or the envelope's, or
	// else the action ID. The host already guarantees that one action ID
	// runs at most once on this replica.
	IdempotencyKey string
	// MessageID is the native message that carried the action.
	MessageID string
	// Route is the pinned route the dispatcher resolved.
	Route  aip.ConnectorRoute
	Logger *slog.Logger

	state  *State
	events *EventPublisher
}

// State returns the journal-backed state store for connector bookkeeping.
func (c *Call) State() *State { return c.state }

// Events returns the provider-event publisher.
func (c *Call) Events() *EventPublisher { return c.events }

// Complete returns a completed result for the call with output marshalled
// to JSON.
func (c *Call) Complete(output any) (*aip.ActionResult, error) {
	raw, err := json.Marshal(output)
	if err != nil {
		return nil, fmt.Errorf("hostsdk: marshal output of %s: %w", c.Action.ID, err)
	}
	return &aip.ActionResult{ActionID: c.Action.ID, Status: aip.ResultCompleted, Output: raw}, nil
}

// Fail returns a failed result carrying a protocol error. The host answers
// one whose code is empty or whose category aip does not know as failed
// with CodeConnectorFailed, naming the problem.
func (c *Call) Fail(code string, category aip.ErrorCategory, retryable bool, message string) *aip.ActionResult {
	return &aip.ActionResult{ActionID: c.Action.ID, Status: aip.ResultFailed,
		Error: aip.NewProtocolError(code, category, retryable, 0, message)}
}

// ErrOutcomeUnknown marks an error after which a provider side effect may
// or may not have happened. Wrap it (fmt.Errorf("...: %w", ErrOutcomeUnknown))
// from Handle or Reconcile; the action is journaled as outcome_unknown and
// never re-run.
var ErrOutcomeUnknown = errors.New("hostsdk: outcome unknown")

// ErrNotServing is returned by EventPublisher when the replica may not
// publish (draining, lease invalid or not ready).
var ErrNotServing = errors.New("hostsdk: replica is not serving")

// Connector capability codes used in results the host writes itself.
const (
	CodeConnectorFailed = "connector.failed"
)
