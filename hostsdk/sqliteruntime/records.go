package sqliteruntime

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// ClaimMessage records a native message ID until expiresAt; false means a
// replay of an unexpired ID.
func (j *Journal) ClaimMessage(ctx context.Context, messageID string, expiresAt, now time.Time) (bool, error) {
	if err := j.enter(ctx); err != nil {
		return false, err
	}
	defer j.leave()
	if err := journal.CheckClaim(messageID, expiresAt, now); err != nil {
		return false, err
	}
	var claimed bool
	err := j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.claimMessage.Exec(messageID, micros(expiresAt), micros(now))
		if err != nil {
			return storageErr(err, "claim message %s", messageID)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return storageErr(err, "claim message %s", messageID)
		}
		claimed = n == 1
		return nil
	})
	return claimed, err
}

// PruneMessages deletes up to limit message IDs expired at now.
func (j *Journal) PruneMessages(ctx context.Context, now time.Time, limit int) (int, error) {
	if err := j.enter(ctx); err != nil {
		return 0, err
	}
	defer j.leave()
	if err := journal.CheckLimit(limit); err != nil {
		return 0, err
	}
	var pruned int
	err := j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.pruneMessages.Exec(micros(now), limit)
		if err != nil {
			return storageErr(err, "prune messages")
		}
		n, err := res.RowsAffected()
		if err != nil {
			return storageErr(err, "prune messages")
		}
		pruned = int(n)
		return nil
	})
	return pruned, err
}

// EnqueueEvents adds an outbox batch; an ID already present changes nothing.
func (j *Journal) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := journal.CheckOutboxEntry(e); err != nil {
		return err
	}
	next := e.NextAttempt
	if next.IsZero() {
		next = e.CreatedAt
	}
	return j.w.do(ctx, func(tx *wtx) error {
		if _, err := tx.enqueue.Exec(e.ID, e.ChannelID, []byte(e.Events), e.Attempts, micros(next),
			journal.Text(e.LastError), micros(e.CreatedAt)); err != nil {
			return storageErr(err, "enqueue outbox batch %s", e.ID)
		}
		return nil
	})
}

// ClaimEvents leases up to limit due batches until now+lease.
func (j *Journal) ClaimEvents(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]journal.OutboxEntry, error) {
	if err := j.enter(ctx); err != nil {
		return nil, err
	}
	defer j.leave()
	if err := journal.CheckLimit(limit); err != nil {
		return nil, err
	}
	if lease <= 0 {
		return nil, journal.Invalid("lease %v is not positive", lease)
	}
	type claimed struct {
		seq int64
		e   journal.OutboxEntry
	}
	var out []claimed
	err := j.w.do(ctx, func(tx *wtx) error {
		out = out[:0]
		rows, err := tx.claimEvents.Query(micros(now.Add(lease)), micros(now), limit)
		if err != nil {
			return storageErr(err, "claim outbox batches")
		}
		defer rows.Close()
		for rows.Next() {
			var (
				c             claimed
				events        []byte
				next, created int64
				leaseUntil    sql.NullInt64
			)
			if err := rows.Scan(&c.seq, &c.e.ID, &c.e.ChannelID, &events, &c.e.Attempts, &next,
				&leaseUntil, &c.e.LastError, &created); err != nil {
				return storageErr(err, "claim outbox batches")
			}
			c.e.Events = json.RawMessage(events)
			c.e.NextAttempt, c.e.CreatedAt = fromMicros(next), fromMicros(created)
			c.e.LeaseUntil = fromNullMicros(leaseUntil)
			out = append(out, c)
		}
		if err := rows.Err(); err != nil {
			return storageErr(err, "claim outbox batches")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// RETURNING has no order: due first, then oldest.
	slices.SortFunc(out, func(a, b claimed) int {
		if c := a.e.NextAttempt.Compare(b.e.NextAttempt); c != 0 {
			return c
		}
		return int(a.seq - b.seq)
	})
	entries := make([]journal.OutboxEntry, len(out))
	for i, c := range out {
		entries[i] = c.e
	}
	return entries, nil
}

// AckEvents deletes a delivered batch.
func (j *Journal) AckEvents(ctx context.Context, id string) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := journal.CheckID("outbox batch ID", id); err != nil {
		return err
	}
	return j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.ackEvents.Exec(id)
		if err != nil {
			return storageErr(err, "ack outbox batch %s", id)
		}
		return oneRow(res, "outbox batch", id)
	})
}

// RetryEvents records a failed delivery and releases the lease.
func (j *Journal) RetryEvents(ctx context.Context, id string, next time.Time, lastError string) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := journal.CheckID("outbox batch ID", id); err != nil {
		return err
	}
	if err := journal.CheckTime("next attempt", next); err != nil {
		return err
	}
	return j.w.do(ctx, func(tx *wtx) error {
		res, err := tx.retryEvents.Exec(id, micros(next), journal.Text(lastError))
		if err != nil {
			return storageErr(err, "retry outbox batch %s", id)
		}
		return oneRow(res, "outbox batch", id)
	})
}

func oneRow(res sql.Result, what, id string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return storageErr(err, "%s %s", what, id)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s %s", journal.ErrNotFound, what, id)
	}
	return nil
}

// PendingEvents counts batches in the outbox.
func (j *Journal) PendingEvents(ctx context.Context) (int, error) {
	if err := j.enter(ctx); err != nil {
		return 0, err
	}
	defer j.leave()
	var n int
	if err := j.rs.pendingEvents.QueryRowContext(ctx).Scan(&n); err != nil {
		return 0, j.readErr(ctx, err, "count outbox batches")
	}
	return n, nil
}

// State returns a connector-owned value or ErrNotFound.
func (j *Journal) State(ctx context.Context, namespace, key string) (journal.StateValue, error) {
	if err := j.enter(ctx); err != nil {
		return journal.StateValue{}, err
	}
	defer j.leave()
	if err := journal.CheckStateKey(namespace, key); err != nil {
		return journal.StateValue{}, err
	}
	var (
		v   journal.StateValue
		raw []byte
		rev int64
	)
	err := j.rs.state.QueryRowContext(ctx, namespace, key).Scan(&raw, &rev)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return journal.StateValue{}, fmt.Errorf("%w: state %s/%s", journal.ErrNotFound, namespace, key)
	case err != nil:
		return journal.StateValue{}, j.readErr(ctx, err, "read state %s/%s", namespace, key)
	}
	v.Value, v.Revision = json.RawMessage(raw), uint64(rev)
	return v, nil
}

// PutState writes a value if the stored revision equals expectedRevision
// (0: absent) and returns the new revision; otherwise ErrConflict.
func (j *Journal) PutState(ctx context.Context, namespace, key string, value json.RawMessage, expectedRevision uint64) (uint64, error) {
	if err := j.enter(ctx); err != nil {
		return 0, err
	}
	defer j.leave()
	if err := journal.CheckStateKey(namespace, key); err != nil {
		return 0, err
	}
	if err := journal.CheckJSON("state value", value); err != nil {
		return 0, err
	}
	now := micros(time.Now())
	err := j.w.do(ctx, func(tx *wtx) error {
		var (
			res sql.Result
			err error
		)
		if expectedRevision == 0 {
			res, err = tx.insertState.Exec(namespace, key, []byte(value), now)
		} else {
			res, err = tx.updateState.Exec(namespace, key, []byte(value), now, int64(expectedRevision))
		}
		if err != nil {
			return storageErr(err, "write state %s/%s", namespace, key)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return storageErr(err, "write state %s/%s", namespace, key)
		}
		if n == 0 {
			return fmt.Errorf("%w: state %s/%s is not at revision %d", journal.ErrConflict, namespace, key, expectedRevision)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return expectedRevision + 1, nil
}

// Probe writes through the writer (one group commit) and reads back
// through the read pool.
func (j *Journal) Probe(ctx context.Context) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	at := micros(time.Now())
	err := j.w.do(ctx, func(tx *wtx) error {
		if _, err := tx.probe.Exec(at); err != nil {
			return storageErr(err, "probe write")
		}
		return nil
	})
	if err != nil {
		return err
	}
	var got int64
	if err := j.rs.probe.QueryRowContext(ctx).Scan(&got); err != nil {
		return j.readErr(ctx, err, "probe read")
	}
	// A concurrent probe may have written a later time; never an earlier one.
	if got < at {
		return fmt.Errorf("sqliteruntime: probe read back %d, older than the %d just written", got, at)
	}
	return nil
}
