package pgruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

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
	if err := checkBegin(a); err != nil {
		return journal.Action{}, false, err
	}
	received := micro(a.ReceivedAt)
	tag, err := j.pool.Exec(ctx, `INSERT INTO aip_runtime_actions (journal_ns, action_id, capability_id,
		tenant_id, idempotency_key, input_digest, fence_token, message_id, status, result, detail,
		received_at, started_at, updated_at, completed_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'received', NULL, '', $9, NULL, $9, NULL)
		ON CONFLICT (journal_ns, action_id) DO NOTHING`,
		j.ns, a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey, a.InputDigest, a.FenceToken,
		a.MessageID, received)
	if err != nil {
		return journal.Action{}, false, dbErr(err, "begin action %s", a.ActionID)
	}
	if tag.RowsAffected() == 1 {
		out := a
		out.Status = aip.StateReceived
		out.ReceivedAt, out.UpdatedAt = received, received
		out.StartedAt, out.CompletedAt = time.Time{}, time.Time{}
		out.Result, out.Detail = nil, ""
		return out, true, nil
	}
	// Journaled before (a concurrent insert has committed by now: ON
	// CONFLICT waited for it).
	existing, err := j.action(ctx, a.ActionID)
	if err != nil {
		return journal.Action{}, false, err
	}
	return existing, false, nil
}

// StartAction moves a received action to running.
func (j *Journal) StartAction(ctx context.Context, actionID string, at time.Time) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := checkID("action ID", actionID); err != nil {
		return err
	}
	if err := checkTime("start time", at); err != nil {
		return err
	}
	tag, err := j.pool.Exec(ctx, `UPDATE aip_runtime_actions SET status = 'running', started_at = $3, updated_at = $3
		WHERE journal_ns = $1 AND action_id = $2 AND status = 'received'`, j.ns, actionID, micro(at))
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

// finishSQL moves the action to its terminal status and, only if it did,
// advances the namespace's receipt head, which locks the head row until the
// transaction ends: concurrent finishes in one namespace append in turn, so
// the sequence has no gaps. It returns the previous head.
const finishSQL = `WITH finished AS (
	UPDATE aip_runtime_actions SET status = $3, result = $4, detail = $5, updated_at = $6, completed_at = $6
	WHERE journal_ns = $1 AND action_id = $2 AND status IN ('received', 'running')
	RETURNING 1)
UPDATE aip_runtime_receipt_heads SET seq = seq + 1
WHERE journal_ns = $1 AND EXISTS (SELECT 1 FROM finished)
RETURNING seq - 1, hash`

// FinishAction moves an action to a terminal status and appends its receipt
// in the same transaction.
func (j *Journal) FinishAction(ctx context.Context, actionID string, status aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.leave()
	if err := checkID("action ID", actionID); err != nil {
		return journal.Receipt{}, err
	}
	if err := checkTerminal(actionID, status); err != nil {
		return journal.Receipt{}, err
	}
	if err := checkTime("finish time", at); err != nil {
		return journal.Receipt{}, err
	}
	r := journal.Receipt{ID: aip.NewID(aip.PrefixReceipt), ActionID: actionID, Status: status, At: micro(at)}
	var stored any // NULL when there is no result
	if len(result) > 0 {
		d, err := aip.DigestJSON(result)
		if err != nil {
			return journal.Receipt{}, invalid("result of action %s is not valid JSON: %v", actionID, err)
		}
		r.ResultDigest, stored = d, []byte(result)
	}

	// Two round trips: [BEGIN, finishSQL], then [INSERT receipt, UPDATE
	// head, COMMIT]. The head row is locked from the first batch to the
	// commit, one round trip plus the hash, which bounds how many finishes
	// per second one namespace can take.
	conn, err := j.pool.Acquire(ctx)
	if err != nil {
		return journal.Receipt{}, dbErr(err, "finish action %s", actionID)
	}
	defer conn.Release() // a connection left inside a transaction is destroyed, not reused

	first := &pgx.Batch{}
	first.Queue(`BEGIN`)
	first.Queue(finishSQL, j.ns, actionID, string(status), stored, detail, r.At)
	br := conn.SendBatch(ctx, first)
	_, err = br.Exec()
	var prevSeq int64
	if err == nil {
		err = br.QueryRow().Scan(&prevSeq, &r.PrevHash)
	}
	if closeErr := br.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		if _, rbErr := conn.Exec(ctx, `ROLLBACK`); rbErr != nil {
			return journal.Receipt{}, dbErr(rbErr, "finish action %s: roll back", actionID)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return journal.Receipt{}, j.transitionError(ctx, actionID, status)
		}
		return journal.Receipt{}, dbErr(err, "finish action %s", actionID)
	}
	r.Seq = uint64(prevSeq) + 1
	if r.Hash, err = journal.ReceiptHash(r); err != nil {
		_, _ = conn.Exec(ctx, `ROLLBACK`)
		return journal.Receipt{}, fmt.Errorf("pgruntime: hash receipt of action %s: %w", actionID, err)
	}
	second := &pgx.Batch{}
	second.Queue(`INSERT INTO aip_runtime_receipts (journal_ns, seq, id, action_id, status, result_digest, prev_hash, hash, at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		j.ns, int64(r.Seq), r.ID, r.ActionID, string(r.Status), r.ResultDigest, r.PrevHash, r.Hash, r.At)
	second.Queue(`UPDATE aip_runtime_receipt_heads SET hash = $2 WHERE journal_ns = $1`, j.ns, r.Hash)
	// After a failed statement PostgreSQL answers this COMMIT with a
	// rollback, and Close reports the statement's error.
	second.Queue(`COMMIT`)
	if err := conn.SendBatch(ctx, second).Close(); err != nil {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(ctx, `ROLLBACK`)
		}
		return journal.Receipt{}, dbErr(err, "append receipt of action %s", actionID)
	}
	return r, nil
}

// Action returns one action or ErrNotFound.
func (j *Journal) Action(ctx context.Context, actionID string) (journal.Action, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Action{}, err
	}
	defer j.leave()
	if err := checkID("action ID", actionID); err != nil {
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
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	statuses, err := checkStatuses(statuses)
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
	if err := checkLimit(limit); err != nil {
		return nil, err
	}
	rows, err := j.pool.Query(ctx, `SELECT seq, id, action_id, status, result_digest, prev_hash, hash, at
		FROM aip_runtime_receipts WHERE journal_ns = $1 AND seq > $2 ORDER BY seq LIMIT $3`, j.ns, int64(after), limit)
	if err != nil {
		return nil, dbErr(err, "list receipts")
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (journal.Receipt, error) {
		var (
			r      journal.Receipt
			seq    int64
			status string
		)
		err := row.Scan(&seq, &r.ID, &r.ActionID, &status, &r.ResultDigest, &r.PrevHash, &r.Hash, &r.At)
		r.Seq, r.Status, r.At = uint64(seq), aip.ActionState(status), r.At.UTC()
		return r, err
	})
	if err != nil {
		return nil, dbErr(err, "list receipts")
	}
	return out, nil
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

// micro returns t as stored: microsecond precision, UTC.
func micro(t time.Time) time.Time { return time.UnixMicro(t.UnixMicro()).UTC() }

func fromNull(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.UTC()
}
