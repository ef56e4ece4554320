// Package journal defines the durable runtime journal of a connector host:
// the one seam between the host lifecycle (package hostsdk) and its storage
// backends, sqliteruntime (embedded default) and pgruntime (PostgreSQL).
//
// A journal records every action a replica accepts before the connector runs
// it, the native message replay registry, a provider-event outbox, a hash
// chain of receipts and a small compare-and-set state store for connectors.
// Every backend passes the conformance suite in journal/journaltest.
//
// Rules every backend follows (the suite checks them):
//   - Times are kept to the microsecond and returned in UTC; a zero time.Time
//     means "not set".
//   - Free text (Action.Detail, OutboxEntry.LastError) is stored as Text
//     makes it: bytes that are not UTF-8, and NUL, become U+FFFD. Every
//     other string (identifiers, keys, digests) must be UTF-8 text without
//     NUL, which PostgreSQL's text type requires: ErrInvalid otherwise.
//   - JSON documents (a result, a state value, an outbox batch's events)
//     must be valid JSON in UTF-8, which PostgreSQL's json type requires:
//     ErrInvalid otherwise, also for a string encoding/json would take.
//   - Limits passed to listing and claiming methods must be positive; a
//     malformed argument is ErrInvalid, never a silent default.
//   - A context that is already done fails the call with its error.
//   - Close is idempotent; after it every other method returns ErrClosed.
package journal

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// Errors every backend returns (possibly wrapped) for the same conditions.
var (
	// ErrNotFound: no record with that key.
	ErrNotFound = errors.New("journal: not found")
	// ErrConflict: the write contradicts what is recorded (an action ID
	// reused with a different input, an illegal status transition, a stale
	// state revision).
	ErrConflict = errors.New("journal: conflict")
	// ErrInvalid: the caller passed a malformed record.
	ErrInvalid = errors.New("journal: invalid record")
	// ErrClosed: the journal was closed.
	ErrClosed = errors.New("journal: closed")
	// ErrPruned: a new action's route may be older than actions the
	// journal has pruned (its AssignedAt is not after the prune horizon,
	// or unknown), so the action may have run here already and its record
	// be gone; it is refused rather than risk running it twice.
	ErrPruned = errors.New("journal: action may have been pruned")
)

// Durability says whether a journal survives a process restart.
type Durability string

// Durability values.
const (
	Durable   Durability = "durable"
	Ephemeral Durability = "ephemeral"
)

// Action is the journaled record of one action on this replica.
type Action struct {
	ActionID       string
	CapabilityID   string
	TenantID       string
	IdempotencyKey string
	// InputDigest is aip.Digest of the action input; a later delivery of the
	// same action ID with another digest is a conflict, never a re-run.
	InputDigest string
	// FenceToken is the registry route's fence token the action arrived with.
	FenceToken string
	// MessageID is the native message that carried the action.
	MessageID string
	Status    aip.ActionState
	// Result is the aip.ActionResult JSON once the action is terminal.
	Result json.RawMessage
	// Detail explains a failed or outcome_unknown status.
	Detail      string
	ReceivedAt  time.Time
	StartedAt   time.Time // zero until running
	UpdatedAt   time.Time
	CompletedAt time.Time // zero until terminal

	// AssignedAt is read only when BeginAction or AcceptAction would create
	// the record, and is not stored: the earliest time, on this journal's
	// clock, at which the action can first have been received (the host
	// passes its route's assignment time less the allowed clock skew), or
	// zero when unknown. Once the journal has pruned actions, creating one
	// whose AssignedAt is zero or not after the prune horizon is ErrPruned;
	// like every time, AssignedAt counts to the microsecond, so one within
	// the horizon's microsecond is not after it.
	AssignedAt time.Time
}

// Accepted is the result of AcceptAction.
type Accepted struct {
	// Claimed is false when the message ID was an unexpired replay; then
	// nothing was written.
	Claimed bool
	// Created is true when this call journaled the action (as running).
	Created bool
	// Existing is the record journaled earlier when Claimed && !Created.
	Existing Action
}

// Receipt is one link of the journal's hash chain: every terminal action
// appends one, and each hash covers the previous hash.
type Receipt struct {
	Seq      uint64 // 1, 2, 3, ... without gaps
	ID       string // aip.PrefixReceipt identifier
	ActionID string
	Status   aip.ActionState
	// ResultDigest is aip.DigestJSON of the stored result ("" when none).
	ResultDigest string
	PrevHash     string // "" for the first receipt
	Hash         string // ReceiptHash of this receipt
	At           time.Time
}

// OutboxEntry is a batch of provider events waiting for central delivery.
type OutboxEntry struct {
	ID          string // content address of (channel, events): identical batches dedupe
	ChannelID   string
	Events      json.RawMessage // JSON array of aip.Event
	Attempts    int
	NextAttempt time.Time
	LeaseUntil  time.Time // claimed by a publisher until then
	LastError   string
	CreatedAt   time.Time
}

// StateValue is a connector-owned value with its compare-and-set revision.
type StateValue struct {
	Value    json.RawMessage
	Revision uint64 // 1 for the first write; 0 means "absent" in PutState
}

// RecoverySummary reports what recovery before registration did.
type RecoverySummary struct {
	RecoveredAt time.Time
	// Reconciled counts running actions the connector's reconciler settled.
	Reconciled int
	// OutcomeUnknown counts running actions marked outcome_unknown.
	OutcomeUnknown int
	// ReadsInterrupted counts running actions of read-only capabilities
	// that no reconciler settled, marked failed (a read changed nothing).
	ReadsInterrupted int
	// Received counts actions journaled but never started (marked failed,
	// since the caller got no result and will retry under the same ID; a
	// record a cancel journaled before its action arrived is marked
	// cancelled instead).
	Received int
	// PendingEvents counts outbox batches still to deliver.
	PendingEvents int
	// Errors lists recovery errors; any error blocks registration.
	Errors []string
}

// Journal is the durable runtime journal. Implementations are safe for
// concurrent use.
type Journal interface {
	// Durability reports whether the journal survives restarts.
	Durability() Durability

	// BeginAction journals a newly received action with status received. If
	// the action ID is already journaled it returns the existing record and
	// created=false without writing; the caller compares InputDigest.
	// ActionID and ReceivedAt are required and Status must be empty or
	// received (ErrInvalid otherwise); the stored record has UpdatedAt =
	// ReceivedAt and no result. Creating the record is ErrPruned (nothing
	// written) when a.AssignedAt is not after the prune horizon (see
	// Action.AssignedAt).
	BeginAction(ctx context.Context, a Action) (existing Action, created bool, err error)
	// AcceptAction is the host's hot path for a new action message: in one
	// transaction it claims messageID until messageExpiresAt (as
	// ClaimMessage) and journals a directly as running, with StartedAt =
	// ReceivedAt — two durable commits fewer than ClaimMessage, BeginAction
	// and StartAction. A crash right after it leaves a running action, which
	// recovery treats as uncertain: the conservative reading.
	//
	// If the message ID is an unexpired replay, nothing is written and
	// Claimed is false. If the action ID is already journaled, the claim
	// commits and Existing holds the record (Created is false). a follows
	// BeginAction's rules; when creating it is ErrPruned, nothing is
	// written (not even the claim). So is a record that a concurrent
	// PruneActions deletes before it could be read (no claim kept).
	AcceptAction(ctx context.Context, messageID string, messageExpiresAt, now time.Time, a Action) (Accepted, error)
	// StartAction moves a received action to running.
	StartAction(ctx context.Context, actionID string, at time.Time) error
	// FinishAction moves a received or running action to a terminal status
	// (completed, failed, outcome_unknown, cancelled) with its result, and
	// appends the receipt in the same transaction. Finishing an action that
	// is already terminal is ErrConflict.
	FinishAction(ctx context.Context, actionID string, status aip.ActionState, result json.RawMessage, detail string, at time.Time) (Receipt, error)
	// Action returns one action or ErrNotFound.
	Action(ctx context.Context, actionID string) (Action, error)
	// ActionsByStatus returns up to limit actions in the given statuses,
	// oldest received first.
	ActionsByStatus(ctx context.Context, limit int, statuses ...aip.ActionState) ([]Action, error)
	// PruneActions deletes up to limit terminal actions completed before
	// before, oldest completed first, and returns how many it deleted. An
	// action that is not terminal is never deleted. In the same
	// transaction it raises the prune horizon to the latest ReceivedAt or
	// CompletedAt it deleted (a record completes before it was received
	// when the clock went back meanwhile; the horizon never goes down), and
	// deletes the receipts at
	// the front of the chain whose actions are gone: the chain stays
	// contiguous from its oldest kept receipt (whose PrevHash anchors it),
	// and the newest receipt is always kept so the chain goes on. It also
	// deletes the state value keyed by each deleted action's ID in each of
	// stateNamespaces (a connector's per-action records).
	PruneActions(ctx context.Context, before time.Time, limit int, stateNamespaces []string) (int, error)
	// PruneHorizon returns the latest ReceivedAt or CompletedAt of any
	// action pruned so far, zero if none was: every action received before
	// it may be gone, and none received after it is.
	PruneHorizon(ctx context.Context) (time.Time, error)

	// ClaimMessage records a native message ID until expiresAt. It reports
	// false when the ID is already recorded and unexpired (a replay). An ID
	// whose expiry is <= now may be claimed again. expiresAt must be after
	// now.
	ClaimMessage(ctx context.Context, messageID string, expiresAt, now time.Time) (bool, error)
	// PruneMessages deletes up to limit message IDs expired at now.
	PruneMessages(ctx context.Context, now time.Time, limit int) (int, error)

	// EnqueueEvents adds an outbox batch (idempotent on its ID: enqueuing an
	// ID already present changes nothing). ID, ChannelID, Events (a
	// non-empty JSON array) and CreatedAt are required; a zero NextAttempt
	// means CreatedAt.
	EnqueueEvents(ctx context.Context, e OutboxEntry) error
	// ClaimEvents leases up to limit due batches (NextAttempt <= now, lease
	// expired) until now+lease.
	ClaimEvents(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]OutboxEntry, error)
	// AckEvents deletes a delivered batch (ErrNotFound when it is gone).
	AckEvents(ctx context.Context, id string) error
	// RetryEvents records a failed delivery: attempts+1, next attempt time,
	// error text, lease released (ErrNotFound when the batch is gone).
	RetryEvents(ctx context.Context, id string, next time.Time, lastError string) error
	// PendingEvents counts batches in the outbox.
	PendingEvents(ctx context.Context) (int, error)

	// ReceiptFor returns the receipt of a terminal action, or ErrNotFound.
	ReceiptFor(ctx context.Context, actionID string) (Receipt, error)
	// Receipts returns up to limit receipts with Seq > after, in order.
	Receipts(ctx context.Context, after uint64, limit int) ([]Receipt, error)

	// State returns a connector-owned value or ErrNotFound. Namespace and
	// key are non-empty UTF-8 text without NUL (ErrInvalid otherwise), in
	// PutState too.
	State(ctx context.Context, namespace, key string) (StateValue, error)
	// PutState writes a value if the stored revision equals
	// expectedRevision (0 = must be absent) and returns the new revision;
	// otherwise ErrConflict.
	PutState(ctx context.Context, namespace, key string, value json.RawMessage, expectedRevision uint64) (uint64, error)

	// Probe checks that storage is readable and writable.
	Probe(ctx context.Context) error
	// Close releases the journal.
	Close() error
}

// CanonicalReceipt returns the canonical JSON of a receipt's hashed content:
// the object {"action_id","at","id","prev_hash","result_digest","seq",
// "status"} (Hash itself is not part of it).
func CanonicalReceipt(r Receipt) ([]byte, error) {
	return aip.CanonicalJSON(struct {
		Seq          uint64          `json:"seq"`
		ID           string          `json:"id"`
		ActionID     string          `json:"action_id"`
		Status       aip.ActionState `json:"status"`
		ResultDigest string          `json:"result_digest"`
		PrevHash     string          `json:"prev_hash"`
		At           aip.Timestamp   `json:"at"`
	}{r.Seq, r.ID, r.ActionID, r.Status, r.ResultDigest, r.PrevHash, aip.At(r.At)})
}

// ReceiptHash returns the hash of a receipt: aip.DigestBytes of
// CanonicalReceipt.
func ReceiptHash(r Receipt) (string, error) {
	doc, err := CanonicalReceipt(r)
	if err != nil {
		return "", err
	}
	return aip.DigestBytes(doc), nil
}

// VerifyChain checks a contiguous run of receipts: sequence without gaps,
// each PrevHash equal to the previous Hash, each Hash recomputed. prevHash is
// the Hash of the receipt before the first one ("" at the start).
func VerifyChain(prevHash string, receipts []Receipt) error {
	for i, r := range receipts {
		if i > 0 && r.Seq != receipts[i-1].Seq+1 {
			return errors.New("journal: receipt chain has a gap")
		}
		if r.PrevHash != prevHash {
			return errors.New("journal: receipt chain is broken: prev_hash does not match")
		}
		h, err := ReceiptHash(r)
		if err != nil {
			return err
		}
		if h != r.Hash {
			return errors.New("journal: receipt hash does not match its content")
		}
		prevHash = r.Hash
	}
	return nil
}
