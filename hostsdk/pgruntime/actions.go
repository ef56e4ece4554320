package pgruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

const actionColumns = `action_id, capability_id, tenant_id, idempotency_key, input_digest, fence_token,
	message_id, status, result, detail, received_at, started_at, updated_at, completed_at`

// BeginAction journals a received action, or returns the journaled one.
func (j *Journal) BeginAction(ctx context.Context, a journal.Action) (journal.Action, bool, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Action{}, false, err
	}
	defer j.leave()
	if err := journal.CheckNewAction(a); err != nil {
		return journal.Action{}, false, err
	}
	rec := journal.NewRecord(a, aip.StateReceived)
	_, created, err := j.createAction(ctx, nil, time.Time{}, time.Time{}, a, aip.StateReceived)
	if err != nil {
		return journal.Action{}, false, err
	}
	if created {
		return rec, true, nil
	}
	// Journaled before (a concurrent insert has committed by now: ON
	// CONFLICT waited for it).
	existing, err := j.existing(ctx, nil, time.Time{}, a.ActionID)
	if err != nil {
		return journal.Action{}, false, err
	}
	return existing, false, nil
}

// existing reads the record of actionID, which the call that claimed
// messageID (nil: none) found journaled. The read is a statement of its
// own, after that call committed, so a prune can have deleted the record
// in between: only a prune deletes one. The action was journaled and is
// gone, as after the prune, so the answer is the one a call after the
// prune gets, journal.ErrPruned with nothing written: the claim that call
// committed is taken back (by its expiry, so a later claim of the same ID
// is kept). Taking it back fails only with the database, and the error
// then says the claim stays.
func (j *Journal) existing(ctx context.Context, messageID *string, messageExpiresAt time.Time, actionID string) (journal.Action, error) {
	if j.afterConflict != nil {
		j.afterConflict()
	}
	a, err := j.action(ctx, actionID)
	if !errors.Is(err, journal.ErrNotFound) {
		return a, err
	}
	if messageID != nil {
		if _, err := j.pool.Exec(context.WithoutCancel(ctx), `DELETE FROM aip_runtime_messages
			WHERE journal_ns = $1 AND message_id = $2 AND expires_at = $3`,
			j.ns, *messageID, journal.Micro(messageExpiresAt)); err != nil {
			return journal.Action{}, dbErr(err, "action %s was pruned while it was journaled again; take back the claim of message %s (it stays claimed)", actionID, *messageID)
		}
	}
	return journal.Action{}, fmt.Errorf("%w: action %s was journaled, and pruned before its record was read", journal.ErrPruned, actionID)
}

// createSQL calls the function of migration 0002 that claims the message
// (when one is given) and journals a new action in one statement, so in
// one transaction and one round trip, and applies the prune horizon.
const createSQL = `SELECT claimed, created FROM aip_runtime_create_action(
	$1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`

// prunedState is the SQLSTATE aip_runtime_create_action raises for an
// action refused by the prune horizon.
const prunedState = "AJ001"

// createAction runs createSQL; messageID nil claims nothing.
func (j *Journal) createAction(ctx context.Context, messageID *string, messageExpiresAt, now time.Time, a journal.Action, status aip.ActionState) (claimed, created bool, err error) {
	var expires, at, assigned *time.Time
	if messageID != nil {
		e, n := journal.Micro(messageExpiresAt), journal.Micro(now)
		expires, at = &e, &n
	}
	if !a.AssignedAt.IsZero() {
		t := a.AssignedAt
		assigned = &t
	}
	err = j.pool.QueryRow(ctx, createSQL, j.ns, messageID, expires, at,
		a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey, a.InputDigest, a.FenceToken,
		a.MessageID, journal.Micro(a.ReceivedAt), string(status), assigned).Scan(&claimed, &created)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == prunedState {
		return false, false, fmt.Errorf("%w: %s", journal.ErrPruned, pe.Message)
	}
	if err != nil {
		return false, false, dbErr(err, "journal action %s", a.ActionID)
	}
	return claimed, created, nil
}

// AcceptAction claims the message and journals the action as running in
// one statement, so in one transaction and one round trip (see
// journal.Journal).
func (j *Journal) AcceptAction(ctx context.Context, messageID string, messageExpiresAt, now time.Time, a journal.Action) (journal.Accepted, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Accepted{}, err
	}
	defer j.leave()
	if err := journal.CheckClaim(messageID, messageExpiresAt, now); err != nil {
		return journal.Accepted{}, err
	}
	if err := journal.CheckNewAction(a); err != nil {
		return journal.Accepted{}, err
	}
	claimed, created, err := j.createAction(ctx, &messageID, messageExpiresAt, now, a, aip.StateRunning)
	if err != nil {
		return journal.Accepted{}, err
	}
	out := journal.Accepted{Claimed: claimed, Created: created}
	if claimed && !created {
		// Journaled before (a concurrent insert has committed by now: ON
		// CONFLICT waited for it).
		if out.Existing, err = j.existing(ctx, &messageID, messageExpiresAt, a.ActionID); err != nil {
			return journal.Accepted{}, err
		}
	}
	return out, nil
}

// pruneSQL deletes the oldest terminal actions completed before $2 (at
// most $3) with their values in the state namespaces $4, and raises the
// namespace's prune horizon to the latest receipt or completion time it
// deleted, in one statement.
const pruneSQL = `WITH victims AS (
	SELECT action_id FROM aip_runtime_actions
	WHERE journal_ns = $1 AND completed_at IS NOT NULL AND completed_at < $2
	ORDER BY completed_at, seq LIMIT $3
), deleted AS (
	DELETE FROM aip_runtime_actions a USING victims v
	WHERE a.journal_ns = $1 AND a.action_id = v.action_id
	RETURNING a.action_id, GREATEST(a.received_at, a.completed_at) AS latest
), state AS (
	DELETE FROM aip_runtime_state s USING deleted d
	WHERE s.journal_ns = $1 AND s.namespace = ANY($4::text[]) AND s.key = d.action_id
), raised AS (
	INSERT INTO aip_runtime_prune_horizons (journal_ns, completed_at)
	SELECT $1, max(latest) FROM deleted HAVING count(*) > 0
	ON CONFLICT (journal_ns) DO UPDATE
	SET completed_at = GREATEST(aip_runtime_prune_horizons.completed_at, EXCLUDED.completed_at)
	RETURNING 1
)
SELECT count(*) FROM deleted`

// pruneReceiptsSQL deletes the receipts before the oldest one whose action
// is still journaled, never the newest (the chain head).
const pruneReceiptsSQL = `DELETE FROM aip_runtime_receipts WHERE journal_ns = $1 AND seq < LEAST(
	(SELECT seq FROM aip_runtime_receipt_heads WHERE journal_ns = $1),
	COALESCE((SELECT r.seq FROM aip_runtime_receipts r
		WHERE r.journal_ns = $1 AND EXISTS (SELECT 1 FROM aip_runtime_actions a
			WHERE a.journal_ns = $1 AND a.action_id = r.action_id)
		ORDER BY r.seq LIMIT 1), 9223372036854775807))`

// PruneActions deletes up to limit terminal actions completed before
// before with their values in stateNamespaces, raises the prune horizon,
// and deletes the receipts at the front of the chain whose actions are
// gone, in one transaction (see journal.Journal).
func (j *Journal) PruneActions(ctx context.Context, before time.Time, limit int, stateNamespaces []string) (int, error) {
	if err := j.enter(ctx); err != nil {
		return 0, err
	}
	defer j.leave()
	if err := journal.CheckPrune(before, limit, stateNamespaces); err != nil {
		return 0, err
	}
	tx, err := j.pool.Begin(ctx)
	if err != nil {
		return 0, dbErr(err, "prune actions")
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // a no-op after Commit
	var n int
	if stateNamespaces == nil {
		stateNamespaces = []string{}
	}
	if err := tx.QueryRow(ctx, pruneSQL, j.ns, journal.Micro(before), limit, stateNamespaces).Scan(&n); err != nil {
		return 0, dbErr(err, "prune actions")
	}
	if n == 0 {
		return 0, nil
	}
	// A statement of its own: it must see the deletions.
	if _, err := tx.Exec(ctx, pruneReceiptsSQL, j.ns); err != nil {
		return 0, dbErr(err, "prune receipts")
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, dbErr(err, "prune actions")
	}
	return n, nil
}

// PruneHorizon returns the prune horizon (zero if nothing was pruned).
func (j *Journal) PruneHorizon(ctx context.Context) (time.Time, error) {
	if err := j.enter(ctx); err != nil {
		return time.Time{}, err
	}
	defer j.leave()
	var h time.Time
	err := j.pool.QueryRow(ctx, `SELECT completed_at FROM aip_runtime_prune_horizons WHERE journal_ns = $1`, j.ns).Scan(&h)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, dbErr(err, "read the prune horizon")
	}
	return h.UTC(), nil
}

// StartAction moves a received action to running.
func (j *Journal) StartAction(ctx context.Context, actionID string, at time.Time) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return err
	}
	if err := journal.CheckTime("start time", at); err != nil {
		return err
	}
	tag, err := j.pool.Exec(ctx, `UPDATE aip_runtime_actions SET status = 'running', started_at = $3, updated_at = $3
		WHERE journal_ns = $1 AND action_id = $2 AND status = 'received'`, j.ns, actionID, journal.Micro(at))
	if err != nil {
		return dbErr(err, "start action %s", actionID)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return j.transitionError(ctx, actionID, aip.StateRunning)
}

// transitionError explains why an update of actionID matched no row.
func (j *Journal) transitionError(ctx context.Context, actionID string, to aip.ActionState) error {
	var status string
	err := j.pool.QueryRow(ctx, `SELECT status FROM aip_runtime_actions WHERE journal_ns = $1 AND action_id = $2`,
		j.ns, actionID).Scan(&status)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: action %s", journal.ErrNotFound, actionID)
	case err != nil:
		return dbErr(err, "read status of action %s", actionID)
	}
	return fmt.Errorf("%w: action %s is %s and cannot become %s", journal.ErrConflict, actionID, status, to)
}

// finishSQL finishes an action in one statement, so the receipt chain's
// head row is locked only inside the server, never across a round trip:
//
//  1. finished: move the action to its terminal status if it is received
//     or running;
//  2. head: only if it moved, advance the namespace's head (this row lock
//     serialises appends; a waiting statement re-reads the head that the
//     one before it committed) and compute the new hash: SHA-256 over the
//     canonical receipt, assembled from the parts Go canonicalised ($8, $9,
//     $10) around the two values only the head knows, the previous hash
//     and the sequence number;
//  3. insert the receipt.
//
// No row comes back when the action was not received or running.
const finishSQL = `WITH finished AS (
	UPDATE aip_runtime_actions SET status = $3, result = $4, detail = $5, updated_at = $6, completed_at = $6
	WHERE journal_ns = $1 AND action_id = $2 AND status IN ('received', 'running')
	RETURNING 1
), head AS (
	UPDATE aip_runtime_receipt_heads SET
		seq = seq + 1,
		prev_hash = hash,
		hash = 'sha256:' || encode(sha256(convert_to(
			$8::text || '"' || hash || '"' || $9::text || (seq + 1)::text || $10::text, 'UTF8')), 'hex')
	WHERE journal_ns = $1 AND EXISTS (SELECT 1 FROM finished)
	RETURNING seq, prev_hash, hash
)
INSERT INTO aip_runtime_receipts (journal_ns, seq, id, action_id, status, result_digest, prev_hash, hash, at)
SELECT $1, seq, $7, $2, $3, $11, prev_hash, hash, $6 FROM head
RETURNING seq, prev_hash, hash`

// FinishAction moves an action to a terminal status and appends its receipt
// in the same statement (one transaction, one round trip).
func (j *Journal) FinishAction(ctx context.Context, actionID string, status aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.leave()
	r, err := journal.NewReceipt(actionID, status, result, at)
	if err != nil {
		return journal.Receipt{}, err
	}
	var stored any // NULL when there is no result
	if len(result) > 0 {
		stored = []byte(result)
	}
	head, mid, tail, err := receiptParts(r)
	if err != nil {
		return journal.Receipt{}, journal.Invalid("receipt of action %s: %v", actionID, err)
	}

	var seq int64
	err = j.pool.QueryRow(ctx, finishSQL, j.ns, actionID, string(status), stored, journal.Text(detail), r.At,
		r.ID, head, mid, tail, r.ResultDigest).Scan(&seq, &r.PrevHash, &r.Hash)
	if errors.Is(err, pgx.ErrNoRows) {
		return journal.Receipt{}, j.transitionError(ctx, actionID, status)
	}
	if err != nil {
		return journal.Receipt{}, dbErr(err, "finish action %s", actionID)
	}
	r.Seq = uint64(seq)
	// A tripwire: the hash the database computed is the contract's hash.
	if want, err := journal.ReceiptHash(r); err != nil || want != r.Hash {
		return journal.Receipt{}, fmt.Errorf("pgruntime: receipt %d of action %s was stored with hash %s but its content hashes to %s (%v); the receipt chain of namespace %s needs repair",
			r.Seq, actionID, r.Hash, want, err, j.ns)
	}
	return r, nil
}

// receiptParts returns journal.CanonicalReceipt of r with an empty prev_hash
// and a zero seq, cut around those two values: head ends with `"prev_hash":`,
// mid runs from after that string to `"seq":`, tail from after the number
// to the end. Digests are plain ASCII, so the database can write the
// previous hash between quotes and the sequence number as digits.
func receiptParts(r journal.Receipt) (head, mid, tail string, err error) {
	r.Seq, r.PrevHash, r.Hash = 0, "", ""
	doc, err := journal.CanonicalReceipt(r)
	if err != nil {
		return "", "", "", err
	}
	s := string(doc)
	// Keys are sorted: action_id, at, id, prev_hash, result_digest, seq,
	// status. A quote inside a string value is escaped, so the unescaped
	// patterns below match only the keys themselves.
	const prevKey, seqKey = `,"prev_hash":`, `,"seq":`
	i := strings.Index(s, prevKey+`""`)
	if i < 0 {
		return "", "", "", fmt.Errorf("canonical receipt %s has no empty prev_hash", s)
	}
	head, rest := s[:i+len(prevKey)], s[i+len(prevKey)+2:]
	k := strings.Index(rest, seqKey+"0")
	if k < 0 {
		return "", "", "", fmt.Errorf("canonical receipt %s has no zero seq", s)
	}
	return head, rest[:k+len(seqKey)], rest[k+len(seqKey)+1:], nil
}

// Action returns one action or ErrNotFound.
func (j *Journal) Action(ctx context.Context, actionID string) (journal.Action, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Action{}, err
	}
	defer j.leave()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return journal.Action{}, err
	}
	return j.action(ctx, actionID)
}

func (j *Journal) action(ctx context.Context, actionID string) (journal.Action, error) {
	a, err := scanAction(j.pool.QueryRow(ctx, `SELECT `+actionColumns+` FROM aip_runtime_actions
		WHERE journal_ns = $1 AND action_id = $2`, j.ns, actionID))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return journal.Action{}, fmt.Errorf("%w: action %s", journal.ErrNotFound, actionID)
	case err != nil:
		return journal.Action{}, dbErr(err, "read action %s", actionID)
	}
	return a, nil
}

// ActionsByStatus returns up to limit actions in the given statuses, oldest
// received first.
func (j *Journal) ActionsByStatus(ctx context.Context, limit int, statuses ...aip.ActionState) ([]journal.Action, error) {
	if err := j.enter(ctx); err != nil {
		return nil, err
	}
	defer j.leave()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	statuses, err := journal.CheckStatuses(statuses)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(statuses))
	for i, s := range statuses {
		names[i] = string(s)
	}
	rows, err := j.pool.Query(ctx, `SELECT `+actionColumns+` FROM aip_runtime_actions
		WHERE journal_ns = $1 AND status = ANY($2) ORDER BY received_at, seq LIMIT $3`, j.ns, names, limit)
	if err != nil {
		return nil, dbErr(err, "list actions")
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (journal.Action, error) { return scanAction(row) })
	if err != nil {
		return nil, dbErr(err, "list actions")
	}
	return out, nil
}

// Receipts returns up to limit receipts with Seq > after, in order.
func (j *Journal) Receipts(ctx context.Context, after uint64, limit int) ([]journal.Receipt, error) {
	if err := j.enter(ctx); err != nil {
		return nil, err
	}
	defer j.leave()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	rows, err := j.pool.Query(ctx, `SELECT `+receiptColumns+` FROM aip_runtime_receipts
		WHERE journal_ns = $1 AND seq > $2 ORDER BY seq LIMIT $3`, j.ns, int64(after), limit)
	if err != nil {
		return nil, dbErr(err, "list receipts")
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (journal.Receipt, error) { return scanReceipt(row) })
	if err != nil {
		return nil, dbErr(err, "list receipts")
	}
	return out, nil
}

// ReceiptFor returns the receipt of a terminal action, or ErrNotFound.
func (j *Journal) ReceiptFor(ctx context.Context, actionID string) (journal.Receipt, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.leave()
	if err := journal.CheckID("action ID", actionID); err != nil {
		return journal.Receipt{}, err
	}
	r, err := scanReceipt(j.pool.QueryRow(ctx, `SELECT `+receiptColumns+` FROM aip_runtime_receipts
		WHERE journal_ns = $1 AND action_id = $2`, j.ns, actionID))
	if errors.Is(err, pgx.ErrNoRows) {
		return journal.Receipt{}, fmt.Errorf("%w: no receipt for action %s", journal.ErrNotFound, actionID)
	}
	if err != nil {
		return journal.Receipt{}, dbErr(err, "read receipt of action %s", actionID)
	}
	return r, nil
}

// receiptColumns are the columns scanReceipt reads, in its order.
const receiptColumns = `seq, id, action_id, status, result_digest, prev_hash, hash, at`

func scanReceipt(row pgx.Row) (journal.Receipt, error) {
	var (
		r      journal.Receipt
		seq    int64
		status string
	)
	if err := row.Scan(&seq, &r.ID, &r.ActionID, &status, &r.ResultDigest, &r.PrevHash, &r.Hash, &r.At); err != nil {
		return journal.Receipt{}, err
	}
	r.Seq, r.Status, r.At = uint64(seq), aip.ActionState(status), r.At.UTC()
	return r, nil
}

func scanAction(row pgx.Row) (journal.Action, error) {
	var (
		a                  journal.Action
		status             string
		result             []byte
		started, completed *time.Time
	)
	err := row.Scan(&a.ActionID, &a.CapabilityID, &a.TenantID, &a.IdempotencyKey, &a.InputDigest,
		&a.FenceToken, &a.MessageID, &status, &result, &a.Detail, &a.ReceivedAt, &started, &a.UpdatedAt, &completed)
	if err != nil {
		return journal.Action{}, err
	}
	a.Status = aip.ActionState(status)
	if result != nil {
		a.Result = json.RawMessage(result)
	}
	a.ReceivedAt, a.UpdatedAt = a.ReceivedAt.UTC(), a.UpdatedAt.UTC()
	a.StartedAt, a.CompletedAt = fromNull(started), fromNull(completed)
	return a, nil
}

func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
