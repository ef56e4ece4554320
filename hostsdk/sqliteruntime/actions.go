package sqliteruntime

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// BeginAction journals a received action, or returns the journaled one.
func (j *Journal) BeginAction(ctx context.Context, a journal.Action) (journal.Action, bool, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Action{}, false, err
	}
	defer j.leave()
	if err := journal.CheckNewAction(a); err != nil {
		return journal.Action{}, false, err
	}
	var (
		out     journal.Action
		created bool
	)
	err := j.w.do(ctx, func(tx *wtx) error {
		if err := tx.checkHorizon(a); err != nil {
			return err
		}
		rec := journal.NewRecord(a, aip.StateReceived)
		res, err := tx.insertAction.Exec(a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey,
			a.InputDigest, a.FenceToken, a.MessageID, micros(rec.ReceivedAt))
		if err != nil {
			return storageErr(err, "begin action %s", a.ActionID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storageErr(err, "begin action %s", a.ActionID)
		} else if n == 1 {
			out, created = rec, true
			return nil
		}
		// Read through the writer: the record may be in this very batch.
		out, err = scanAction(tx.action.QueryRow(a.ActionID))
		if err != nil {
			return storageErr(err, "read journaled action %s", a.ActionID)
		}
		created = false
		return nil
	})
	if err != nil {
		return journal.Action{}, false, err
	}
	return out, created, nil
}

// AcceptAction claims the message and journals the action as running in
// one transaction (see journal.Journal).
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
	var out journal.Accepted
	err := j.w.do(ctx, func(tx *wtx) error {
		out = journal.Accepted{}
		if err := tx.checkHorizon(a); err != nil {
			// Refused unless the message is a replay (which writes
			// nothing either).
			var exp int64
			switch rerr := tx.messageExpiry.QueryRow(messageID).Scan(&exp); {
			case rerr == nil && exp > micros(now):
				return nil
			case rerr != nil && !errors.Is(rerr, sql.ErrNoRows):
				return storageErr(rerr, "read message %s", messageID)
			}
			return err
		}
		res, err := tx.claimMessage.Exec(messageID, micros(messageExpiresAt), micros(now))
		if err != nil {
			return storageErr(err, "claim message %s", messageID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storageErr(err, "claim message %s", messageID)
		} else if n == 0 {
			return nil // a replay: nothing written
		}
		out.Claimed = true
		res, err = tx.insertRunning.Exec(a.ActionID, a.CapabilityID, a.TenantID, a.IdempotencyKey,
			a.InputDigest, a.FenceToken, a.MessageID, micros(a.ReceivedAt))
		if err != nil {
			return storageErr(err, "accept action %s", a.ActionID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storageErr(err, "accept action %s", a.ActionID)
		} else if n == 1 {
			out.Created = true
			return nil
		}
		// Read through the writer: the record may be in this very batch.
		if out.Existing, err = scanAction(tx.action.QueryRow(a.ActionID)); err != nil {
			return storageErr(err, "read journaled action %s", a.ActionID)
		}
		return nil
	})
	if err != nil {
		return journal.Accepted{}, err
	}
	return out, nil
}

// checkHorizon applies the prune horizon before a would be created: nil
// when a is journaled already (it is answered from its record) or may be
// created; journal.ErrPruned otherwise. It writes nothing.
func (tx *wtx) checkHorizon(a journal.Action) error {
	err := journal.CheckHorizon(a, tx.horizon)
	if err == nil {
		return nil
	}
	var status string
	switch rerr := tx.actionStatus.QueryRow(a.ActionID).Scan(&status); {
	case rerr == nil:
		return nil
	case !errors.Is(rerr, sql.ErrNoRows):
		return storageErr(rerr, "read status of action %s", a.ActionID)
	}
	return err
}

// PruneActions deletes up to limit terminal actions completed before
// before, the receipts at the front of the chain whose actions are gone and
// the actions' values in stateNamespaces, and raises the prune horizon (see
// journal.Journal).
func (j *Journal) PruneActions(ctx context.Context, before time.Time, limit int, stateNamespaces []string) (int, error) {
	if err := j.enter(ctx); err != nil {
		return 0, err
	}
	defer j.leave()
	if err := journal.CheckPrune(before, limit, stateNamespaces); err != nil {
		return 0, err
	}
	var pruned int
	err := j.w.do(ctx, func(tx *wtx) error {
		pruned = 0
		rows, err := tx.pruneActions.Query(micros(before), limit)
		if err != nil {
			return storageErr(err, "prune actions")
		}
		var (
			latest int64 // the horizon: the latest receipt or completion time deleted
			ids    []string
		)
		for rows.Next() {
			var (
				id string
				at int64 // max(received_at, completed_at)
			)
			if err := rows.Scan(&id, &at); err != nil {
				rows.Close()
				return storageErr(err, "prune actions")
			}
			latest = max(latest, at)
			ids = append(ids, id)
			pruned++
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return storageErr(err, "prune actions")
		}
		if pruned == 0 {
			return nil
		}
		if _, err := tx.raiseHorizon.Exec(latest); err != nil {
			return storageErr(err, "raise the prune horizon")
		}
		if h := fromMicros(latest); h.After(tx.horizon) {
			tx.horizon = h
		}
		keep := int64(tx.head.Seq) // the newest receipt always stays
		var first int64
		switch err := tx.firstLive.QueryRow().Scan(&first); {
		case err == nil:
			keep = min(keep, first)
		case !errors.Is(err, sql.ErrNoRows):
			return storageErr(err, "find the oldest receipt to keep")
		}
		if _, err := tx.pruneReceipts.Exec(keep); err != nil {
			return storageErr(err, "prune receipts")
		}
		for _, ns := range stateNamespaces {
			for _, id := range ids {
				if _, err := tx.deleteState.Exec(ns, id); err != nil {
					return storageErr(err, "delete state %s/%s of a pruned action", ns, id)
				}
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return pruned, nil
}

// PruneHorizon returns the prune horizon (zero if nothing was pruned).
func (j *Journal) PruneHorizon(ctx context.Context) (time.Time, error) {
	if err := j.enter(ctx); err != nil {
		return time.Time{}, err
	}
	defer j.leave()
	var v int64
	switch err := j.rs.horizon.QueryRowContext(ctx).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, j.readErr(ctx, err, "read the prune horizon")
	}
	return fromMicros(v), nil
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
	return j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.startAction.Exec(actionID, micros(at))
		if err != nil {
			return storageErr(err, "start action %s", actionID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storageErr(err, "start action %s", actionID)
		} else if n == 1 {
			return nil
		}
		return tx.transitionError(actionID, aip.StateRunning)
	})
}

// transitionError explains why an update of actionID matched no row.
func (tx *wtx) transitionError(actionID string, to aip.ActionState) error {
	var status string
	err := tx.actionStatus.QueryRow(actionID).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: action %s", journal.ErrNotFound, actionID)
	case err != nil:
		return storageErr(err, "read status of action %s", actionID)
	}
	return fmt.Errorf("%w: action %s is %s and cannot become %s", journal.ErrConflict, actionID, status, to)
}

// FinishAction moves an action to a terminal status and appends its receipt
// in the same transaction.
func (j *Journal) FinishAction(ctx context.Context, actionID string, status aip.ActionState, result json.RawMessage, detail string, at time.Time) (journal.Receipt, error) {
	if err := j.enter(ctx); err != nil {
		return journal.Receipt{}, err
	}
	defer j.leave()
	r, err := journal.NewReceipt(actionID, status, result, at)
	if err != nil {
		return journal.Receipt{}, err
	}
	var stored []byte // NULL when there is no result
	if len(result) > 0 {
		stored = result
	}

	err = j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.finishAction.Exec(actionID, string(status), stored, journal.Text(detail), micros(r.At))
		if err != nil {
			return storageErr(err, "finish action %s", actionID)
		}
		if n, err := res.RowsAffected(); err != nil {
			return storageErr(err, "finish action %s", actionID)
		} else if n != 1 {
			return tx.transitionError(actionID, status)
		}
		r.Seq, r.PrevHash = tx.head.Seq+1, tx.head.Hash
		if r.Hash, err = journal.ReceiptHash(r); err != nil {
			return storageErr(err, "hash receipt of action %s", actionID)
		}
		if _, err := tx.insertReceipt.Exec(int64(r.Seq), r.ID, r.ActionID, string(r.Status),
			r.ResultDigest, r.PrevHash, r.Hash, micros(r.At)); err != nil {
			return storageErr(err, "append receipt of action %s", actionID)
		}
		tx.head = chainHead{Seq: r.Seq, Hash: r.Hash}
		return nil
	})
	if err != nil {
		return journal.Receipt{}, err
	}
	return r, nil
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
	a, err := scanAction(j.rs.action.QueryRowContext(ctx, actionID))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return journal.Action{}, fmt.Errorf("%w: action %s", journal.ErrNotFound, actionID)
	case err != nil:
		return journal.Action{}, j.readErr(ctx, err, "read action %s", actionID)
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
	args := make([]any, 0, len(statuses)+1)
	marks := make([]string, len(statuses))
	for i, s := range statuses {
		args = append(args, string(s))
		marks[i] = "?"
	}
	args = append(args, limit)
	q := `SELECT ` + actionColumns + ` FROM actions WHERE status IN (` + strings.Join(marks, ", ") +
		`) ORDER BY received_at, seq LIMIT ?`
	rows, err := j.rdb.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, j.readErr(ctx, err, "list actions")
	}
	defer rows.Close()
	var out []journal.Action
	for rows.Next() {
		a, err := scanAction(rows)
		if err != nil {
			return nil, j.readErr(ctx, err, "list actions")
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, j.readErr(ctx, err, "list actions")
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
	rows, err := j.rs.receipts.QueryContext(ctx, int64(after), limit)
	if err != nil {
		return nil, j.readErr(ctx, err, "list receipts")
	}
	defer rows.Close()
	var out []journal.Receipt
	for rows.Next() {
		r, err := scanReceipt(rows)
		if err != nil {
			return nil, j.readErr(ctx, err, "list receipts")
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, j.readErr(ctx, err, "list receipts")
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
	r, err := scanReceipt(j.rs.receiptFor.QueryRowContext(ctx, actionID))
	if errors.Is(err, sql.ErrNoRows) {
		return journal.Receipt{}, fmt.Errorf("%w: no receipt for action %s", journal.ErrNotFound, actionID)
	}
	if err != nil {
		return journal.Receipt{}, j.readErr(ctx, err, "read receipt of action %s", actionID)
	}
	return r, nil
}

type scanner interface{ Scan(dest ...any) error }

func scanReceipt(row scanner) (journal.Receipt, error) {
	var (
		r      journal.Receipt
		seq    int64
		status string
		atUS   int64
	)
	if err := row.Scan(&seq, &r.ID, &r.ActionID, &status, &r.ResultDigest, &r.PrevHash, &r.Hash, &atUS); err != nil {
		return journal.Receipt{}, err
	}
	r.Seq, r.Status, r.At = uint64(seq), aip.ActionState(status), fromMicros(atUS)
	return r, nil
}

func scanAction(row scanner) (journal.Action, error) {
	var (
		a                  journal.Action
		status             string
		result             []byte
		received, updated  int64
		started, completed sql.NullInt64
	)
	err := row.Scan(&a.ActionID, &a.CapabilityID, &a.TenantID, &a.IdempotencyKey, &a.InputDigest,
		&a.FenceToken, &a.MessageID, &status, &result, &a.Detail, &received, &started, &updated, &completed)
	if err != nil {
		return journal.Action{}, err
	}
	a.Status = aip.ActionState(status)
	if result != nil {
		a.Result = json.RawMessage(result)
	}
	a.ReceivedAt, a.UpdatedAt = fromMicros(received), fromMicros(updated)
	a.StartedAt, a.CompletedAt = fromNullMicros(started), fromNullMicros(completed)
	return a, nil
}

// readErr reports a failed read: the context's error when it ended the
// read, otherwise the storage error with context.
func (j *Journal) readErr(ctx context.Context, err error, format string, args ...any) error {
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	}
	return fmt.Errorf("sqliteruntime: "+format+": %w", append(args, err)...)
}
