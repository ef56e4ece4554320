package sqliteruntime

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

const actionColumns = `action_id, capability_id, tenant_id, idempotency_key, input_digest, fence_token,
	message_id, status, result, detail, received_at, started_at, updated_at, completed_at`

// receiptColumns are the columns scanReceipt reads, in its order.
const receiptColumns = `seq, id, action_id, status, result_digest, prev_hash, hash, at`

const outboxColumns = `id, channel_id, events, attempts, next_attempt, lease_until, last_error, created_at`

// writeStmts are prepared once on the writer connection.
type writeStmts struct {
	begin, commit, rollback *sql.Stmt

	insertAction  *sql.Stmt
	insertRunning *sql.Stmt
	action        *sql.Stmt
	actionStatus  *sql.Stmt
	startAction   *sql.Stmt
	finishAction  *sql.Stmt

	insertReceipt *sql.Stmt
	lastReceipt   *sql.Stmt

	pruneActions  *sql.Stmt
	firstLive     *sql.Stmt
	pruneReceipts *sql.Stmt
	horizon       *sql.Stmt
	raiseHorizon  *sql.Stmt
	messageExpiry *sql.Stmt
	deleteState   *sql.Stmt

	claimMessage  *sql.Stmt
	pruneMessages *sql.Stmt

	enqueue     *sql.Stmt
	claimEvents *sql.Stmt
	ackEvents   *sql.Stmt
	retryEvents *sql.Stmt

	insertState *sql.Stmt
	updateState *sql.Stmt

	probe *sql.Stmt
}

func (s *writeStmts) prepare(ctx context.Context, conn *sql.Conn) error {
	return prepareAll(ctx, conn.PrepareContext, []stmtDef{
		{&s.begin, `BEGIN IMMEDIATE`},
		{&s.commit, `COMMIT`},
		{&s.rollback, `ROLLBACK`},

		{&s.insertAction, `INSERT INTO actions (action_id, capability_id, tenant_id, idempotency_key,
			input_digest, fence_token, message_id, status, result, detail, received_at, started_at,
			updated_at, completed_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'received', NULL, '', ?8, NULL, ?8, NULL)
			ON CONFLICT (action_id) DO NOTHING`},
		{&s.insertRunning, `INSERT INTO actions (action_id, capability_id, tenant_id, idempotency_key,
			input_digest, fence_token, message_id, status, result, detail, received_at, started_at,
			updated_at, completed_at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'running', NULL, '', ?8, ?8, ?8, NULL)
			ON CONFLICT (action_id) DO NOTHING`},
		{&s.action, `SELECT ` + actionColumns + ` FROM actions WHERE action_id = ?1`},
		{&s.actionStatus, `SELECT status FROM actions WHERE action_id = ?1`},
		{&s.startAction, `UPDATE actions SET status = 'running', started_at = ?2, updated_at = ?2
			WHERE action_id = ?1 AND status = 'received'`},
		{&s.finishAction, `UPDATE actions SET status = ?2, result = ?3, detail = ?4, updated_at = ?5,
			completed_at = ?5 WHERE action_id = ?1 AND status IN ('received', 'running')`},

		{&s.insertReceipt, `INSERT INTO receipts (seq, id, action_id, status, result_digest, prev_hash, hash, at)
			VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)`},
		{&s.lastReceipt, `SELECT seq, hash FROM receipts ORDER BY seq DESC LIMIT 1`},

		{&s.pruneActions, `DELETE FROM actions WHERE seq IN (
			SELECT seq FROM actions WHERE completed_at IS NOT NULL AND completed_at < ?1
			ORDER BY completed_at, seq LIMIT ?2)
			RETURNING action_id, max(received_at, completed_at)`},
		// The oldest receipt whose action is still journaled: receipts
		// before it belong to pruned actions.
		{&s.firstLive, `SELECT r.seq FROM receipts r
			WHERE EXISTS (SELECT 1 FROM actions a WHERE a.action_id = r.action_id)
			ORDER BY r.seq LIMIT 1`},
		{&s.pruneReceipts, `DELETE FROM receipts WHERE seq < ?1`},
		{&s.horizon, `SELECT completed_at FROM prune_horizon WHERE id = 1`},
		{&s.raiseHorizon, `INSERT INTO prune_horizon (id, completed_at) VALUES (1, ?1)
			ON CONFLICT (id) DO UPDATE SET completed_at = max(completed_at, excluded.completed_at)`},
		{&s.messageExpiry, `SELECT expires_at FROM messages WHERE message_id = ?1`},
		{&s.deleteState, `DELETE FROM state WHERE namespace = ?1 AND key = ?2`},

		{&s.claimMessage, `INSERT INTO messages (message_id, expires_at) VALUES (?1, ?2)
			ON CONFLICT (message_id) DO UPDATE SET expires_at = excluded.expires_at
			WHERE messages.expires_at <= ?3`},
		{&s.pruneMessages, `DELETE FROM messages WHERE message_id IN (
			SELECT message_id FROM messages WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)`},

		{&s.enqueue, `INSERT INTO outbox (id, channel_id, events, attempts, next_attempt, lease_until,
			last_error, created_at) VALUES (?1, ?2, ?3, ?4, ?5, NULL, ?6, ?7)
			ON CONFLICT (id) DO NOTHING`},
		{&s.claimEvents, `UPDATE outbox SET lease_until = ?1 WHERE seq IN (
			SELECT seq FROM outbox WHERE next_attempt <= ?2 AND (lease_until IS NULL OR lease_until <= ?2)
			ORDER BY next_attempt, seq LIMIT ?3)
			RETURNING seq, ` + outboxColumns},
		{&s.ackEvents, `DELETE FROM outbox WHERE id = ?1`},
		{&s.retryEvents, `UPDATE outbox SET attempts = attempts + 1, next_attempt = ?2, last_error = ?3,
			lease_until = NULL WHERE id = ?1`},

		{&s.insertState, `INSERT INTO state (namespace, key, value, revision, updated_at)
			VALUES (?1, ?2, ?3, 1, ?4) ON CONFLICT (namespace, key) DO NOTHING`},
		{&s.updateState, `UPDATE state SET value = ?3, revision = revision + 1, updated_at = ?4
			WHERE namespace = ?1 AND key = ?2 AND revision = ?5`},

		{&s.probe, `INSERT INTO probe (id, at) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET at = max(at, excluded.at)`},
	})
}

func (s *writeStmts) close() error {
	return closeAll(s.begin, s.commit, s.rollback, s.insertAction, s.action, s.actionStatus,
		s.insertRunning, s.startAction, s.finishAction, s.insertReceipt, s.lastReceipt,
		s.pruneActions, s.firstLive, s.pruneReceipts, s.horizon, s.raiseHorizon, s.messageExpiry, s.deleteState, s.claimMessage,
		s.pruneMessages, s.enqueue, s.claimEvents, s.ackEvents, s.retryEvents, s.insertState,
		s.updateState, s.probe)
}

// readStmts are prepared on the read pool (database/sql prepares them on
// each connection as it is first used).
type readStmts struct {
	action        *sql.Stmt
	receipts      *sql.Stmt
	receiptFor    *sql.Stmt
	state         *sql.Stmt
	pendingEvents *sql.Stmt
	horizon       *sql.Stmt
	probe         *sql.Stmt
}

func (s *readStmts) prepare(ctx context.Context, db *sql.DB) error {
	return prepareAll(ctx, db.PrepareContext, []stmtDef{
		{&s.action, `SELECT ` + actionColumns + ` FROM actions WHERE action_id = ?1`},
		{&s.receipts, `SELECT ` + receiptColumns + ` FROM receipts WHERE seq > ?1 ORDER BY seq LIMIT ?2`},
		{&s.receiptFor, `SELECT ` + receiptColumns + ` FROM receipts WHERE action_id = ?1`},
		{&s.state, `SELECT value, revision FROM state WHERE namespace = ?1 AND key = ?2`},
		{&s.pendingEvents, `SELECT count(*) FROM outbox`},
		{&s.horizon, `SELECT completed_at FROM prune_horizon WHERE id = 1`},
		{&s.probe, `SELECT at FROM probe WHERE id = 1`},
	})
}

func (s *readStmts) close() error {
	return closeAll(s.action, s.receipts, s.receiptFor, s.state, s.pendingEvents, s.horizon, s.probe)
}

type stmtDef struct {
	dst   **sql.Stmt
	query string
}

func prepareAll(ctx context.Context, prepare func(context.Context, string) (*sql.Stmt, error), defs []stmtDef) error {
	for _, d := range defs {
		st, err := prepare(ctx, d.query)
		if err != nil {
			return fmt.Errorf("prepare %q: %w", d.query, err)
		}
		*d.dst = st
	}
	return nil
}

func closeAll(stmts ...*sql.Stmt) error {
	var errs []error
	for _, st := range stmts {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}

// Times are stored as unix microseconds; NULL is the zero time.

func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(v int64) time.Time { return time.UnixMicro(v).UTC() }

func fromNullMicros(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return fromMicros(v.Int64)
}
