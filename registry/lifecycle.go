package registry

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aipfleet/aipfleet/aip"
)

// This file is the registry side of the signed lifecycle service
// (controlplane): the Lifecycle contract a backend implements, and the one
// implementation of the lifecycle rules (DecideLifecycle, LifecycleBatch)
// every backend runs inside its atomic unit, so backends cannot diverge on
// them.
//
// # Division of work
//
// The service checks what needs no registry state or only the replica's
// fixed identity: body size, signed wrapper, freshness window, that the
// replica is pre-provisioned (LifecycleReplica), that the signer DID is the
// replica's peer DID, the signature, and the request digest. It then hands
// authenticated commands to ApplyLifecycle, which decides, in this order:
// replay, then the operation's rules.
//
// # Replay
//
// Every authenticated command that the rules decide claims its request ID: a
// ReplayClaim (request ID, digest, replica, kept until the request's
// expires_at plus ReplayClaimGrace) is stored in the same atomic unit as the
// replica change. A request ID that is already claimed, or that is the
// replica's last committed request, is a replay:
//
//   - the exact committed request (same ID, same digest, still the
//     replica's last request, and the replica still in the state it
//     committed: its status and, for heartbeat, drain and offline,
//     previous_sequence + 1) is answered with the identical outcome again:
//     the stored sequence and lease expiry, nothing written;
//   - any other reuse of the ID is rejected (RuleReplay).
//
// A command rejected by a rule also claims (burns) its ID, as the reference
// does: the same bytes resent are answered with the replay rejection, so a
// definitive rejection never turns into an acceptance later (a sender that
// lost the first answer — a control plane whose commit succeeded but whose
// answer was lost answers 503 — learns of the rejection by the replay
// rule's message, not the original rule's). The improvement
// over the reference concerns only failures that are not decisions: when
// ApplyLifecycle fails with a storage error nothing of the call is
// committed, the claims included, so a byte-identical retry of a request that
// failed retryably (HTTP 503) is decided afresh and can succeed.
//
// # Sequence
//
// A replica's health revision is its lease sequence. Every command that
// changes the replica raises it by exactly one and records the request ID
// and digest as the replica's last request. heartbeat, drain and offline
// must carry previous_sequence equal to the current health revision
// (RuleSequence); register is fenced by eligibility instead (RuleLeaseLive).

// Lease TTL bounds of lifecycle commands.
const (
	MinLeaseTTL     = time.Second
	MaxLeaseTTL     = 300 * time.Second
	DefaultLeaseTTL = 30 * time.Second
)

// ReplayClaimGrace is how long a replay claim outlives its request's
// expires_at. The service refuses expired requests, so a claim needs to
// outlive its request only by the clock difference between the service and
// the store; the grace covers that generously.
const ReplayClaimGrace = time.Minute

// MaxLifecycleBatch bounds the commands of one ApplyLifecycle call.
const MaxLifecycleBatch = 1024

// Lifecycle is what the lifecycle service needs from the registry: read the
// replica a request names, and apply authenticated commands. Backends
// implement it on their data pool only (no catalog-admin rights). It is part
// of the registry's backend seam: memregistry and pgregistry implement it
// and registrytest.Run holds both to the same behaviour.
type Lifecycle interface {
	// LifecycleReplica returns a replica for the service's pre-checks
	// (pre-provisioned, signer DID), or ErrNotFound. Its identity fields
	// never change, so the service may cache them.
	LifecycleReplica(ctx context.Context, replicaID string) (ConnectorReplica, error)

	// ApplyLifecycle applies 1..MaxLifecycleBatch commands in order as one
	// atomic unit and returns one result per command, in order.
	//
	// For each command it loads (and, in a database, locks) the replica, for
	// a register also the replica's instance and version, and the live
	// replay claim of its request ID, then calls DecideLifecycle with the
	// backend's clock; LifecycleBatch does exactly that over loaded state.
	// Commands for the same replica, or with the same request ID, see the
	// effects of earlier commands of the call: of two heartbeats with the
	// same previous_sequence exactly one wins. A rule rejection is that
	// command's result (a *LifecycleRejection in LifecycleResult.Err) and
	// does not affect the others.
	//
	// The changed replicas and the new replay claims are written in the same
	// atomic unit. If the unit cannot be completed (storage failure, ctx
	// done) ApplyLifecycle returns an error (ErrStorage, or the context's
	// error) and nil results, and nothing of the call is committed: not the
	// replica changes and not the claims. A database backend locks the
	// replicas in ascending ID order (FOR UPDATE) so concurrent calls cannot
	// deadlock. Commands that fail Validate are rejected with RuleMalformed
	// without being claimed.
	//
	// A database backend bounds its wait for a replica's row lock (when
	// ctx has a deadline): a replica held past it by another session (one
	// stuck mid-transaction) must not fail the commands of every other
	// replica in the call. Such a backend then decides the commands of the
	// replicas it could lock, and gives each command of a held replica an
	// undecided result (LifecycleResult.Err matching ErrStorage): nothing of
	// that command is written or claimed, and its sender resends it.
	ApplyLifecycle(ctx context.Context, cmds []LifecycleCommand) ([]LifecycleResult, error)
}

// ReplicaLister pages through replicas for operators (the service's
// read-only fleet endpoint). It is optional for backends: the service
// detects it by type assertion.
type ReplicaLister interface {
	// ListReplicas returns up to limit replicas (limit clamped to
	// [1, MaxReplicaPage]) whose IDs sort after after ("" for the first
	// page), in ascending ID byte order.
	ListReplicas(ctx context.Context, after string, limit int) ([]ConnectorReplica, error)
}

// MaxReplicaPage bounds one ListReplicas page.
const MaxReplicaPage = 1000

// ClampReplicaPage clamps a ListReplicas limit to [1, MaxReplicaPage].
func ClampReplicaPage(limit int) int { return min(max(limit, 1), MaxReplicaPage) }

// Readiness reports whether a backend can serve the lifecycle service. It is
// optional for backends: the service detects it by type assertion and
// reports it at /ready.
type Readiness interface {
	// Readiness runs the backend's checks. It returns an error only when the
	// report itself cannot be produced; failed checks are in the report.
	Readiness(ctx context.Context) (StoreReadiness, error)
}

// StoreReadiness is a backend's readiness report.
type StoreReadiness struct {
	// Backend names the backend: "memory" or "postgres".
	Backend string `json:"backend"`
	// SchemaVersion is the installed registry schema version (0 for the
	// in-memory backend, which has none).
	SchemaVersion int `json:"schema_version"`
	// CatalogRevision is the current catalog revision.
	CatalogRevision uint64 `json:"catalog_revision"`
	// Pool is the connection pool state (nil when the backend has none).
	Pool *PoolStats `json:"pool,omitempty"`
	// Checks are the individual checks, e.g. "schema", "catalog", "pool".
	Checks []ReadinessCheck `json:"checks"`
}

// Ready reports whether every check passed.
func (s *StoreReadiness) Ready() bool {
	for _, c := range s.Checks {
		if !c.OK {
			return false
		}
	}
	return true
}

// ReadinessCheck is one named readiness check.
type ReadinessCheck struct {
	Name    string `json:"name"`
	OK      bool   `json:"ok"`
	Message string `json:"message,omitempty"`
}

// PoolStats is a database backend's pool state. A data-plane process has no
// control pool: ControlMax is 0.
type PoolStats struct {
	ControlSize int32 `json:"control_size"`
	ControlIdle int32 `json:"control_idle"`
	ControlMax  int32 `json:"control_max"`
	DataSize    int32 `json:"data_size"`
	DataIdle    int32 `json:"data_idle"`
	DataMax     int32 `json:"data_max"`
}

// LifecycleCommand is one authenticated lifecycle request to apply.
type LifecycleCommand struct {
	// RequestID is the request's request_id (1..aip.MaxRequestIDBytes).
	RequestID string
	// Digest is aip.ControlRequestDigest of the request.
	Digest string
	// ExpiresAt is the request's expires_at; its replay claim is kept until
	// ExpiresAt + ReplayClaimGrace.
	ExpiresAt time.Time
	// Command is the operation and its decoded payload.
	Command aip.ControlCommand
	// LeaseTTL is the lease a successful register, healthy heartbeat or
	// drain grants, in [MinLeaseTTL, MaxLeaseTTL].
	LeaseTTL time.Duration
}

// ReplicaID returns the replica the command is about.
func (c *LifecycleCommand) ReplicaID() string { return c.Command.ReplicaID() }

// Validate checks the command's shape: request ID, digest, lease TTL, an
// operation with its payload, and a replica ID; the request and replica
// IDs must be UTF-8 without NUL characters (what a database can store).
func (c *LifecycleCommand) Validate() error {
	switch {
	case c.RequestID == "" || len(c.RequestID) > aip.MaxRequestIDBytes:
		return fmt.Errorf("%w: lifecycle request_id must be 1 to %d bytes", ErrInvalid, aip.MaxRequestIDBytes)
	case !storableText(c.RequestID):
		return fmt.Errorf("%w: lifecycle request_id %q must be UTF-8 without NUL characters", ErrInvalid, truncate(c.RequestID))
	case aip.ValidateDigest(c.Digest) != nil:
		return fmt.Errorf("%w: lifecycle request %s: digest %q is not a sha256 digest", ErrInvalid, c.RequestID, truncate(c.Digest))
	case c.ExpiresAt.IsZero():
		return fmt.Errorf("%w: lifecycle request %s has no expires_at", ErrInvalid, c.RequestID)
	case c.LeaseTTL < MinLeaseTTL || c.LeaseTTL > MaxLeaseTTL:
		return fmt.Errorf("%w: lifecycle request %s: lease TTL %s is outside %s..%s", ErrInvalid, c.RequestID, c.LeaseTTL, MinLeaseTTL, MaxLeaseTTL)
	}
	cmd := &c.Command
	ok := false
	switch cmd.Operation {
	case aip.OpRegister:
		ok = cmd.Register != nil
	case aip.OpHeartbeat:
		ok = cmd.Heartbeat != nil
	case aip.OpDrain, aip.OpOffline:
		ok = cmd.Transition != nil
	default:
		return fmt.Errorf("%w: lifecycle request %s: unknown operation %q", ErrInvalid, c.RequestID, cmd.Operation)
	}
	if !ok {
		return fmt.Errorf("%w: lifecycle request %s: %s command without its payload", ErrInvalid, c.RequestID, cmd.Operation)
	}
	if c.ReplicaID() == "" {
		return fmt.Errorf("%w: lifecycle request %s names no replica", ErrInvalid, c.RequestID)
	}
	if !storableText(c.ReplicaID()) {
		return fmt.Errorf("%w: lifecycle request %s: replica ID %q must be UTF-8 without NUL characters", ErrInvalid, c.RequestID, truncate(c.ReplicaID()))
	}
	return nil
}

// storableText reports whether every backend can store and look up s: a
// database text column holds neither NUL nor invalid UTF-8, and a key it
// cannot hold must be a rejection of its command, not a failure of the
// whole call (which would answer every command batched with it 503).
func storableText(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// LifecycleResult is the result of one command.
type LifecycleResult struct {
	// Outcome is a lease (register, heartbeat, drain) or offline (offline)
	// when Err is nil.
	Outcome aip.ControlOutcome
	// Replayed is set when the command was the exact committed request
	// again: Outcome repeats the committed one and nothing was written.
	Replayed bool
	// Replica is the replica after the command (unchanged for a replay or a
	// rejection; zero when the replica is not provisioned).
	Replica ConnectorReplica
	// Err is nil, a *LifecycleRejection, or an error matching ErrStorage
	// when the command was not decided (its replica was held by another
	// transaction past the backend's bounded lock wait): nothing of it was
	// committed or claimed, and the same request may be sent again.
	Err error
}

// LifecycleRule names the rule that rejected a lifecycle command.
type LifecycleRule string

// Lifecycle rules, with the sentinel each rejection matches.
const (
	// RuleMalformed: the command failed Validate (ErrInvalid).
	RuleMalformed LifecycleRule = "malformed"
	// RuleNotProvisioned: no such replica (ErrNotFound).
	RuleNotProvisioned LifecycleRule = "not_provisioned"
	// RuleReplay: the request ID was already consumed by another lifecycle
	// decision (ErrConflict).
	RuleReplay LifecycleRule = aip.ControlRuleReplay
	// RuleProposal: the registration's replica proposal is not ready, zero
	// assignments, health revision zero and no previous request, or has no
	// capacity (ErrInvalid).
	RuleProposal LifecycleRule = "proposal"
	// RuleIdentity: the proposal's fixed identity (instance, version,
	// endpoint, peer principal, DID, trust domain, transport profile,
	// topology) differs from the pre-provisioned replica, or the peer
	// principal is not the manifest's agent (ErrConflict).
	RuleIdentity LifecycleRule = "identity"
	// RuleVersion: the replica's version is not the instance's, or is not
	// active and supply-chain qualified (ErrAdmission).
	RuleVersion LifecycleRule = "version"
	// RuleDigest: the manifest or artifact digest is not the version's
	// (ErrAdmission).
	RuleDigest LifecycleRule = "digest"
	// RuleInstance: the instance is missing or disabled, or its tenant,
	// configuration revision or secret reference differ (ErrAdmission).
	RuleInstance LifecycleRule = "instance"
	// RuleCapabilityCount: the capability count is not the admitted
	// manifest's (ErrAdmission).
	RuleCapabilityCount LifecycleRule = "capability_count"
	// RuleLeaseLive: re-registration before a clean offline with zero active
	// assignments or lease expiry: a competing takeover (ErrConflict).
	RuleLeaseLive LifecycleRule = aip.ControlRuleLeaseLive
	// RuleCapacity: a heartbeat's in_flight above the replica's capacity,
	// or a registration's capacity below the retained active assignments
	// (ErrAdmission).
	RuleCapacity LifecycleRule = "capacity"
	// RuleSequence: previous_sequence is not the current health revision
	// (ErrConflict).
	RuleSequence LifecycleRule = aip.ControlRuleSequence
	// RuleState: heartbeat or drain of a replica that is offline or whose
	// lease expired; it must register again (ErrConflict).
	RuleState LifecycleRule = aip.ControlRuleState
)

// LifecycleRejection is a lifecycle command a rule refused. Every rejection
// is definitive (HTTP 403, not retryable); failures that are not decisions
// are errors of ApplyLifecycle itself. It matches its sentinel with
// errors.Is.
type LifecycleRejection struct {
	Rule      LifecycleRule
	Operation aip.Operation
	ReplicaID string
	RequestID string
	// Reason says what is wrong and, where it helps, what to do.
	Reason string
	// Err is the sentinel: ErrInvalid, ErrNotFound, ErrConflict or
	// ErrAdmission.
	Err error
}

// Error implements error.
func (e *LifecycleRejection) Error() string {
	return fmt.Sprintf("registry: lifecycle %s of replica %s rejected (%s): %s", e.Operation, e.ReplicaID, e.Rule, e.Reason)
}

// Unwrap returns the sentinel.
func (e *LifecycleRejection) Unwrap() error { return e.Err }

var ruleSentinels = map[LifecycleRule]error{
	RuleMalformed:       ErrInvalid,
	RuleNotProvisioned:  ErrNotFound,
	RuleReplay:          ErrConflict,
	RuleProposal:        ErrInvalid,
	RuleIdentity:        ErrConflict,
	RuleVersion:         ErrAdmission,
	RuleDigest:          ErrAdmission,
	RuleInstance:        ErrAdmission,
	RuleCapabilityCount: ErrAdmission,
	RuleLeaseLive:       ErrConflict,
	RuleCapacity:        ErrAdmission,
	RuleSequence:        ErrConflict,
	RuleState:           ErrConflict,
}

// ReplayClaim records that a request ID was decided. It is stored in the
// same atomic unit as the decision and kept until ExpiresAt.
type ReplayClaim struct {
	RequestID string
	Digest    string
	ReplicaID string
	// ExpiresAt is the request's expires_at plus ReplayClaimGrace; after it
	// the claim may be pruned.
	ExpiresAt time.Time
}

// Live reports whether the claim still holds at now.
func (c *ReplayClaim) Live(now time.Time) bool { return c.ExpiresAt.After(now) }

// LifecycleVersion is what registration checks read of a connector version.
type LifecycleVersion struct {
	ID              string
	ConnectorTypeID string
	Status          VersionStatus
	// Qualified is whether the attestation qualifies the manifest
	// (ArtifactAttestation.Qualify); QualifyError says why not.
	Qualified      bool
	QualifyError   string
	ManifestDigest string
	ArtifactDigest string
	// CapabilityCount is the number of capabilities of the manifest.
	CapabilityCount int
	// AgentID and AgentKind are the manifest's agent: every replica of the
	// version signs as it.
	AgentID   string
	AgentKind aip.PrincipalKind
}

// NewLifecycleVersion summarizes a version for registration checks,
// qualifying its attestation.
func NewLifecycleVersion(v *ConnectorVersion) LifecycleVersion {
	lv := LifecycleVersion{
		ID: v.ID, ConnectorTypeID: v.ConnectorTypeID, Status: v.Status,
		ManifestDigest: v.ManifestDigest, ArtifactDigest: v.Attestation.ArtifactDigest,
		CapabilityCount: len(v.Manifest.Capabilities),
		AgentID:         v.Manifest.Agent.ID, AgentKind: v.Manifest.Agent.Kind,
	}
	if err := v.Attestation.Qualify(v.ID, &v.Manifest); err != nil {
		lv.QualifyError = err.Error()
	} else {
		lv.Qualified = true
	}
	return lv
}

// LifecycleInput is the stored state one command is decided against.
type LifecycleInput struct {
	// Replica is the current (locked) replica, nil when not provisioned.
	Replica *ConnectorReplica
	// Instance and Version are the replica's instance and version; needed
	// for register only (nil when missing or not loaded).
	Instance *ConnectorInstance
	Version  *LifecycleVersion
	// Claim is the stored claim of the command's request ID, nil when there
	// is none; an expired claim counts as none.
	Claim *ReplayClaim
	// Now is the backend's clock.
	Now time.Time
}

// LifecycleDecision is what DecideLifecycle computed for one command.
type LifecycleDecision struct {
	// Result is the command's result.
	Result LifecycleResult
	// Write is set when the replica must be written as Result.Replica.
	Write bool
	// Claim is the replay claim to store, nil when nothing is claimed (the
	// ID was already claimed, or the command is malformed).
	Claim *ReplayClaim
}

// DecideLifecycle decides one command against stored state: replay first,
// then the operation's rules. It does not modify in. The decision is
// deterministic in its inputs; backends call it inside their atomic unit
// after loading and locking the rows, then write the replica (when Write)
// and the claim (when non-nil) in that unit.
func DecideLifecycle(cmd *LifecycleCommand, in LifecycleInput) LifecycleDecision {
	now := Millis(in.Now)
	d := decider{cmd: cmd, op: cmd.Command.Operation, replicaID: cmd.ReplicaID()}
	if err := cmd.Validate(); err != nil {
		return d.reject(RuleMalformed, "%v", err)
	}
	claim := &ReplayClaim{RequestID: cmd.RequestID, Digest: cmd.Digest, ReplicaID: d.replicaID, ExpiresAt: Millis(cmd.ExpiresAt).Add(ReplayClaimGrace)}
	if in.Replica == nil {
		if in.Claim != nil && in.Claim.Live(now) {
			return d.reject(RuleReplay, "request %s was already consumed by another lifecycle decision; send a new request ID", cmd.RequestID)
		}
		dec := d.reject(RuleNotProvisioned, "replica %s"+aip.NotProvisionedPhrase+" (offline, with this host's DID) before the host registers", d.replicaID)
		dec.Claim = claim
		return dec
	}
	rep := *in.Replica
	d.rep = &rep
	// Replay: the replica's last committed request, or an ID already claimed.
	if rep.LastControlRequestID == cmd.RequestID {
		if rep.LastControlRequestDigest != cmd.Digest {
			return d.reject(RuleReplay, "request %s was committed with digest %s, not %s; the same request ID with another payload is refused, send a new request ID",
				cmd.RequestID, rep.LastControlRequestDigest, cmd.Digest)
		}
		if !d.stillCommitted() {
			return d.reject(RuleReplay, "request %s was committed, but replica %s has changed since (now %s at health revision %d); send a new request ID",
				cmd.RequestID, rep.ID, rep.Status, rep.HealthRevision)
		}
		d.dec.Result.Replayed = true
		if d.op == aip.OpOffline {
			return d.done(aip.OfflineOutcome())
		}
		return d.done(aip.LeaseOutcome(aip.Lease{Sequence: rep.HealthRevision, ExpiresAt: aip.At(rep.LeaseExpiresAt)}))
	}
	if in.Claim != nil && in.Claim.Live(now) {
		return d.reject(RuleReplay, "request %s was already consumed by another lifecycle decision; send a new request ID", cmd.RequestID)
	}
	d.claim = claim
	leaseUntil := now.Add(cmd.LeaseTTL)
	switch c := &cmd.Command; d.op {
	case aip.OpRegister:
		return d.register(c.Register, in.Instance, in.Version, now, leaseUntil)
	case aip.OpHeartbeat:
		hb := c.Heartbeat
		if dec, ok := d.fence(hb.PreviousSequence, now, true); !ok {
			return dec
		}
		if hb.InFlight > rep.Capacity {
			return d.reject(RuleCapacity, "in_flight %d exceeds the replica's admitted capacity %d", hb.InFlight, rep.Capacity)
		}
		if !hb.ConnectorReady {
			// Unhealthy: offline, lease ended now, out of routing.
			return d.commit(aip.ReplicaOffline, minTime(rep.LeaseExpiresAt, now), now)
		}
		return d.commit(aip.ReplicaReady, leaseUntil, now)
	case aip.OpDrain:
		if dec, ok := d.fence(c.Transition.PreviousSequence, now, true); !ok {
			return dec
		}
		return d.commit(aip.ReplicaDraining, leaseUntil, now)
	default: // aip.OpOffline; Validate admits nothing else
		if dec, ok := d.fence(c.Transition.PreviousSequence, now, false); !ok {
			return dec
		}
		return d.commit(aip.ReplicaOffline, minTime(rep.LeaseExpiresAt, now), now)
	}
}

type decider struct {
	cmd       *LifecycleCommand
	op        aip.Operation
	replicaID string
	rep       *ConnectorReplica // working copy of the stored replica
	claim     *ReplayClaim      // claim to store with the decision
	dec       LifecycleDecision
}

func (d *decider) result() LifecycleDecision {
	if d.rep != nil {
		d.dec.Result.Replica = *d.rep
	}
	return d.dec
}

func (d *decider) done(o aip.ControlOutcome) LifecycleDecision {
	d.dec.Result.Outcome = o
	return d.result()
}

// reject returns a rejection; the ID is claimed (burned) when d.claim is set.
func (d *decider) reject(rule LifecycleRule, format string, args ...any) LifecycleDecision {
	d.dec.Result.Err = &LifecycleRejection{
		Rule: rule, Operation: d.op, ReplicaID: d.replicaID, RequestID: d.cmd.RequestID,
		Reason: fmt.Sprintf(format, args...), Err: ruleSentinels[rule],
	}
	d.dec.Claim = d.claim
	return d.result()
}

// stillCommitted reports whether the replica is still in the state its
// last request committed, so a replay of that request may answer the
// stored lease as its outcome: the status the operation set and, for
// heartbeat, drain and offline, the sequence one above previous_sequence
// (the reference's replay rule). Lease expiry clears the last request;
// this also catches any other write that moved the replica on without
// clearing it.
func (d *decider) stillCommitted() bool {
	rep, c := d.rep, &d.cmd.Command
	switch d.op {
	case aip.OpRegister:
		return rep.Status == aip.ReplicaReady
	case aip.OpHeartbeat:
		want := aip.ReplicaReady
		if !c.Heartbeat.ConnectorReady {
			want = aip.ReplicaOffline
		}
		return rep.Status == want && rep.HealthRevision == c.Heartbeat.PreviousSequence+1
	case aip.OpDrain:
		return rep.Status == aip.ReplicaDraining && rep.HealthRevision == c.Transition.PreviousSequence+1
	default: // aip.OpOffline
		return rep.Status == aip.ReplicaOffline && rep.HealthRevision == c.Transition.PreviousSequence+1
	}
}

// fence checks that the replica may take a heartbeat or drain (live) or an
// offline (any state) at previous_sequence.
func (d *decider) fence(previous uint64, now time.Time, live bool) (LifecycleDecision, bool) {
	rep := d.rep
	if live {
		if rep.Status == aip.ReplicaOffline {
			return d.reject(RuleState, "replica %s is offline; register again", rep.ID), false
		}
	}
	if previous != rep.HealthRevision {
		if rep.Status == aip.ReplicaOffline && rep.OfflineReason == OfflineLeaseExpired && previous+1 == rep.HealthRevision {
			// Maintenance expired the replica after the request this one
			// follows: the one lifecycle write between them was its own.
			return d.reject(RuleSequence, "replica %s is already offline: its lease ran out and lease maintenance took it offline at %s (health revision %d), after the request this previous_sequence %d follows; nothing is left to take offline, and its reservations were released then (aipfleet fleet status shows it offline (lease_expired)); a host that should serve registers again",
				rep.ID, aip.At(rep.OfflineAt), rep.HealthRevision, previous), false
		}
		return d.reject(RuleSequence, "replica %s lost its lease-sequence fence: previous_sequence %d, but the registry is at %d; a newer lifecycle request won, re-read the lease or register again",
			rep.ID, previous, rep.HealthRevision), false
	}
	if live && !rep.LeaseValid(now) {
		return d.reject(RuleState, "the lease of replica %s expired at %s; register again", rep.ID, aip.At(rep.LeaseExpiresAt)), false
	}
	return LifecycleDecision{}, true
}

// commit moves the replica to status with a lease until leaseUntil and
// raises its health revision by one. Going offline records why (its own
// offline transition, or an unhealthy heartbeat) and when; an offline
// replica's offline keeps why and when it went; going ready or draining
// clears them.
func (d *decider) commit(status aip.ReplicaStatus, leaseUntil, now time.Time) LifecycleDecision {
	rep := d.rep
	switch {
	case status != aip.ReplicaOffline:
		rep.ClearOffline()
	case rep.Status == aip.ReplicaOffline:
		// Already offline (a fenced offline again): nothing went offline.
	case d.op == aip.OpHeartbeat:
		rep.SetOffline(OfflineUnhealthy, now)
	default:
		rep.SetOffline(OfflineShutdown, now)
	}
	rep.Status = status
	rep.LeaseExpiresAt = leaseUntil
	rep.HealthRevision++
	rep.LastControlRequestID, rep.LastControlRequestDigest = d.cmd.RequestID, d.cmd.Digest
	d.dec.Write = true
	d.dec.Claim = d.claim
	if d.op == aip.OpOffline {
		return d.done(aip.OfflineOutcome())
	}
	return d.done(aip.LeaseOutcome(aip.Lease{Sequence: rep.HealthRevision, ExpiresAt: aip.At(leaseUntil)}))
}

func (d *decider) register(reg *aip.Registration, inst *ConnectorInstance, v *LifecycleVersion, now, leaseUntil time.Time) LifecycleDecision {
	rep := d.rep
	p := &reg.Replica
	if p.Status != aip.ReplicaReady || p.ActiveAssignments != 0 || p.HealthRevision != 0 || p.LastControlRequestID != "" || p.LastControlRequestDigest != "" {
		return d.reject(RuleProposal, "the replica proposal must be status ready with 0 active assignments, health revision 0 and no previous request (got %s, %d, %d); the registry assigns the committed state",
			p.Status, p.ActiveAssignments, p.HealthRevision)
	}
	if p.Capacity == 0 {
		return d.reject(RuleProposal, "the replica proposal has capacity 0; set max in-flight to at least 1")
	}
	if field, stored, got, ok := identityMismatch(rep, p); !ok {
		if note := formatCharacterNote(got, "the host's setting for "+field); note != "" {
			return d.reject(RuleIdentity, "%s %q is not the pre-provisioned %q: %s", field, truncate(got), truncate(stored), note)
		}
		return d.reject(RuleIdentity, "%s %q is not the pre-provisioned %q; the replica's identity is fixed, pre-provision a new replica for a different one", field, truncate(got), truncate(stored))
	}
	if inst == nil {
		return d.reject(RuleInstance, "instance %s of replica %s does not exist", rep.InstanceID, rep.ID)
	}
	if v == nil {
		return d.reject(RuleVersion, "version %s of replica %s does not exist", rep.VersionID, rep.ID)
	}
	if inst.VersionID != rep.VersionID {
		return d.reject(RuleVersion, "instance %s now runs version %s, not the replica's %s; pre-provision a replica of the current version", inst.ID, inst.VersionID, rep.VersionID)
	}
	if v.Status != VersionActive {
		return d.reject(RuleVersion, "version %s is %s; only an active version registers replicas", v.ID, v.Status)
	}
	if !v.Qualified {
		return d.reject(RuleVersion, "version %s is not supply-chain qualified: %s", v.ID, v.QualifyError)
	}
	if reg.ManifestDigest != v.ManifestDigest {
		return d.reject(RuleDigest, "manifest_digest %s is not version %s's admitted %s; the running connector's manifest differs from the admitted one: "+
			"run the host with --print-manifest (and its --trust-domain) to print the connector's manifest and its digest, and compare them with version %s's manifest and manifest_digest %s in the fleet file; "+
			"a version's manifest never changes, so run the connector version %s was admitted with, or admit this manifest as a new version (a new version ID in the fleet file's versions), apply the fleet file and pre-provision replicas of that version",
			truncate(reg.ManifestDigest), v.ID, v.ManifestDigest, v.ID, v.ManifestDigest, v.ID)
	}
	if reg.ArtifactDigest != v.ArtifactDigest {
		return d.reject(RuleDigest, "artifact_digest %s is not version %s's attested %s; run the admitted artifact", truncate(reg.ArtifactDigest), v.ID, v.ArtifactDigest)
	}
	if inst.Status != InstanceEnabled {
		return d.reject(RuleInstance, "instance %s is %s", inst.ID, inst.Status)
	}
	if inst.ConnectorTypeID != v.ConnectorTypeID {
		return d.reject(RuleInstance, "instance %s is of connector type %s, version %s of %s", inst.ID, inst.ConnectorTypeID, v.ID, v.ConnectorTypeID)
	}
	if reg.TenantID != inst.TenantID {
		if note := formatCharacterNote(reg.TenantID, "the host's tenant ID setting"); note != "" {
			return d.reject(RuleInstance, "tenant_id %q is not instance %s's tenant %q: %s", truncate(reg.TenantID), inst.ID, inst.TenantID, note)
		}
		return d.reject(RuleInstance, "tenant_id %q is not instance %s's tenant %q", truncate(reg.TenantID), inst.ID, inst.TenantID)
	}
	if reg.ConfigRevision != inst.ConfigRevision {
		return d.reject(RuleInstance, "config_revision %d is not instance %s's %d; deploy the current configuration", reg.ConfigRevision, inst.ID, inst.ConfigRevision)
	}
	if reg.SecretProviderRef != inst.SecretProviderRef {
		return d.reject(RuleInstance, "secret_provider_ref %q is not instance %s's %q", truncate(reg.SecretProviderRef), inst.ID, inst.SecretProviderRef)
	}
	if int64(reg.CapabilityCount) != int64(v.CapabilityCount) {
		return d.reject(RuleCapabilityCount, "capability_count %d is not the %d capabilities of version %s's admitted manifest", reg.CapabilityCount, v.CapabilityCount, v.ID)
	}
	if p.PeerPrincipalID != v.AgentID || p.PeerPrincipalKind != v.AgentKind {
		return d.reject(RuleIdentity, "peer principal %s %q is not version %s's manifest agent %s %q", p.PeerPrincipalKind, truncate(p.PeerPrincipalID), v.ID, v.AgentKind, v.AgentID)
	}
	cleanOffline := rep.Status == aip.ReplicaOffline && rep.ActiveAssignments == 0
	if !cleanOffline && rep.LeaseValid(now) {
		return d.reject(RuleLeaseLive, "replica %s is %s"+aip.LeaseUntilPhrase+"%s and %d active assignments; it may re-register only after a clean offline with zero active assignments or after its lease expires",
			rep.ID, rep.Status, aip.At(rep.LeaseExpiresAt), rep.ActiveAssignments)
	}
	if p.Capacity < rep.ActiveAssignments {
		return d.reject(RuleCapacity, "capacity %d is below the %d active assignments the registry retains for replica %s; recover with at least that capacity", p.Capacity, rep.ActiveAssignments, rep.ID)
	}
	rep.Capacity = p.Capacity
	return d.commit(aip.ReplicaReady, leaseUntil, now)
}

// formatCharacterNote says, for a registration's value v that differs
// from its registry record's, that v holds an invisible formatting
// character no registry identifier holds (RuleFormatCharacter), and to
// remove it from setting; "" when it holds none. The mismatch alone
// showed the character only as an escape in the quoted value ("acme\u200b"
// is not "acme").
func formatCharacterNote(v, setting string) string {
	if r, ok := FormatCharacter(v); ok {
		return fmt.Sprintf("it holds the invisible formatting character U+%04X, which no registry identifier holds; remove it from %s", r, setting)
	}
	return ""
}

// identityMismatch compares a registration's proposal with the stored
// replica's fixed identity.
func identityMismatch(stored *ConnectorReplica, p *aip.Replica) (field, storedV, got string, ok bool) {
	fixed := []struct{ field, stored, got string }{
		{"replica.instance_id", stored.InstanceID, p.InstanceID},
		{"replica.version_id", stored.VersionID, p.VersionID},
		{"replica.endpoint", stored.Endpoint, p.Endpoint},
		{"replica.peer_principal_id", stored.PeerPrincipalID, p.PeerPrincipalID},
		{"replica.peer_principal_kind", string(stored.PeerPrincipalKind), string(p.PeerPrincipalKind)},
		{"replica.peer_did", stored.PeerDID, p.PeerDID},
		{"replica.trust_domain", stored.TrustDomain, p.TrustDomain},
		{"replica.transport_profile", stored.TransportProfile, p.TransportProfile},
		{"replica.topology.region", stored.Topology.Region, p.Topology.Region},
		{"replica.topology.zone", stored.Topology.Zone, p.Topology.Zone},
		{"replica.topology.capacity_class", stored.Topology.CapacityClass, p.Topology.CapacityClass},
	}
	for _, f := range fixed {
		if f.stored != f.got {
			return f.field, f.stored, f.got, false
		}
	}
	return "", "", "", true
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// LifecycleKeys returns what a backend must load for a call: the distinct
// replica IDs (ascending, the lock order), the distinct request IDs, and the
// IDs of replicas that register (whose instance and version are needed).
// Malformed commands contribute nothing.
func LifecycleKeys(cmds []LifecycleCommand) (replicaIDs, requestIDs, registering []string) {
	for i := range cmds {
		c := &cmds[i]
		if c.Validate() != nil {
			continue
		}
		replicaIDs = append(replicaIDs, c.ReplicaID())
		requestIDs = append(requestIDs, c.RequestID)
		if c.Command.Operation == aip.OpRegister {
			registering = append(registering, c.ReplicaID())
		}
	}
	for _, s := range []*[]string{&replicaIDs, &requestIDs, &registering} {
		slices.Sort(*s)
		*s = slices.Compact(*s)
	}
	return replicaIDs, requestIDs, registering
}

// CheckLifecycleBatch checks the size of an ApplyLifecycle call.
func CheckLifecycleBatch(cmds []LifecycleCommand) error {
	if len(cmds) == 0 || len(cmds) > MaxLifecycleBatch {
		return fmt.Errorf("%w: a lifecycle call applies 1 to %d commands, not %d", ErrInvalid, MaxLifecycleBatch, len(cmds))
	}
	return nil
}

// LifecycleBatch applies one ApplyLifecycle call's commands in order over
// state a backend loaded (and locked) in its atomic unit, so that every
// backend has the same batch semantics. Fill the maps with what
// LifecycleKeys names (missing entries mean the record does not exist or
// the ID has no live claim), call Apply, then persist ChangedReplicas and
// NewClaims in the same unit.
type LifecycleBatch struct {
	// Now is the backend's clock for the whole call.
	Now time.Time
	// Replicas are the loaded replicas by ID; Apply updates them in place.
	Replicas map[string]*ConnectorReplica
	// Instances and Versions are the loaded instances and versions of the
	// registering replicas, by ID.
	Instances map[string]*ConnectorInstance
	Versions  map[string]*LifecycleVersion
	// Claims are the stored claims of the commands' request IDs; Apply adds
	// the new ones.
	Claims map[string]*ReplayClaim
	// Held names the replicas that exist but that the backend could not
	// lock (another transaction held them past its bounded wait): their
	// commands are not decided (an ErrStorage result, nothing written or
	// claimed).
	Held map[string]bool

	changed   map[string]bool
	newClaims []ReplayClaim
}

// Apply decides cmds in order; each command sees the effects of the earlier
// ones.
func (b *LifecycleBatch) Apply(cmds []LifecycleCommand) []LifecycleResult {
	if b.changed == nil {
		b.changed = make(map[string]bool)
	}
	if b.Claims == nil {
		b.Claims = make(map[string]*ReplayClaim)
	}
	out := make([]LifecycleResult, len(cmds))
	for i := range cmds {
		c := &cmds[i]
		if b.Held[c.ReplicaID()] && c.Validate() == nil {
			out[i] = LifecycleResult{Err: fmt.Errorf("%w: replica %s is held by another registry transaction; its lifecycle request %s was not decided, send it again",
				ErrStorage, c.ReplicaID(), c.RequestID)}
			continue
		}
		in := LifecycleInput{Now: b.Now, Claim: b.Claims[c.RequestID]}
		if rep := b.Replicas[c.ReplicaID()]; rep != nil {
			in.Replica = rep
			if c.Command.Operation == aip.OpRegister {
				in.Instance = b.Instances[rep.InstanceID]
				in.Version = b.Versions[rep.VersionID]
			}
		}
		dec := DecideLifecycle(c, in)
		if dec.Write {
			*in.Replica = dec.Result.Replica
			b.changed[in.Replica.ID] = true
		}
		if dec.Claim != nil {
			cl := *dec.Claim
			b.Claims[cl.RequestID] = &cl
			b.newClaims = append(b.newClaims, cl)
		}
		out[i] = dec.Result
	}
	return out
}

// ChangedReplicas returns the final state of every replica Apply changed,
// in ascending ID order.
func (b *LifecycleBatch) ChangedReplicas() []ConnectorReplica {
	out := make([]ConnectorReplica, 0, len(b.changed))
	for id := range b.changed {
		out = append(out, *b.Replicas[id])
	}
	slices.SortFunc(out, func(x, y ConnectorReplica) int { return strings.Compare(x.ID, y.ID) })
	return out
}

// NewClaims returns the claims Apply made, in command order. Request IDs
// are distinct: a claimed ID is never claimed again in the same call.
func (b *LifecycleBatch) NewClaims() []ReplayClaim { return b.newClaims }
