package pgruntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// ClaimMessage records a native message ID until expiresAt; false means a
// replay of an unexpired ID. Concurrent claims of one ID serialise on its
// row: exactly one inserts (or renews an expired claim), the others see an
// unexpired claim.
func (j *Journal) ClaimMessage(ctx context.Context, messageID string, expiresAt, now time.Time) (bool, error) {
	if err := j.enter(ctx); err != nil {
		return false, err
	}
	defer j.leave()
	if err := journal.CheckClaim(messageID, expiresAt, now); err != nil {
		return false, err
	}
	tag, err := j.pool.Exec(ctx, `INSERT INTO aip_runtime_messages (journal_ns, message_id, expires_at) VALUES ($1, $2, $3)
		ON CONFLICT (journal_ns, message_id) DO UPDATE SET expires_at = EXCLUDED.expires_at
		WHERE aip_runtime_messages.expires_at <= $4`, j.ns, messageID, journal.Micro(expiresAt), journal.Micro(now))
	if err != nil {
		return false, dbErr(err, "claim message %s", messageID)
	}
	return tag.RowsAffected() == 1, nil
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
	tag, err := j.pool.Exec(ctx, `DELETE FROM aip_runtime_messages m USING (
			SELECT message_id FROM aip_runtime_messages
			WHERE journal_ns = $1 AND expires_at <= $2 ORDER BY expires_at LIMIT $3
			FOR UPDATE SKIP LOCKED) d
		WHERE m.journal_ns = $1 AND m.message_id = d.message_id`, j.ns, journal.Micro(now), limit)
	if err != nil {
		return 0, dbErr(err, "prune messages")
	}
	return int(tag.RowsAffected()), nil
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
	_, err := j.pool.Exec(ctx, `INSERT INTO aip_runtime_outbox (journal_ns, id, channel_id, events, attempts,
		next_attempt, lease_until, last_error, created_at) VALUES ($1, $2, $3, $4, $5, $6, NULL, $7, $8)
		ON CONFLICT (journal_ns, id) DO NOTHING`,
		j.ns, e.ID, e.ChannelID, []byte(e.Events), e.Attempts, journal.Micro(next), journal.Text(e.LastError), journal.Micro(e.CreatedAt))
	if err != nil {
		return dbErr(err, "enqueue outbox batch %s", e.ID)
	}
	return nil
}

// ClaimEvents leases up to limit due batches until now+lease. Publishers
// racing over one outbox skip each other's rows (FOR UPDATE SKIP LOCKED).
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
	rows, err := j.pool.Query(ctx, `WITH claimed AS (
			UPDATE aip_runtime_outbox o SET lease_until = $2
			FROM (SELECT id FROM aip_runtime_outbox
				WHERE journal_ns = $1 AND next_attempt <= $3 AND (lease_until IS NULL OR lease_until <= $3)
				ORDER BY next_attempt, seq LIMIT $4
				FOR UPDATE SKIP LOCKED) due
			WHERE o.journal_ns = $1 AND o.id = due.id
			RETURNING o.seq, o.id, o.channel_id, o.events, o.attempts, o.next_attempt, o.lease_until, o.last_error, o.created_at)
		SELECT id, channel_id, events, attempts, next_attempt, lease_until, last_error, created_at
		FROM claimed ORDER BY next_attempt, seq`,
		j.ns, journal.Micro(now.Add(lease)), journal.Micro(now), limit)
	if err != nil {
		return nil, dbErr(err, "claim outbox batches")
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (journal.OutboxEntry, error) {
		var (
			e          journal.OutboxEntry
			events     []byte
			leaseUntil *time.Time
		)
		err := row.Scan(&e.ID, &e.ChannelID, &events, &e.Attempts, &e.NextAttempt, &leaseUntil, &e.LastError, &e.CreatedAt)
		e.Events = json.RawMessage(events)
		e.NextAttempt, e.CreatedAt, e.LeaseUntil = e.NextAttempt.UTC(), e.CreatedAt.UTC(), fromNull(leaseUntil)
		return e, err
	})
	if err != nil {
		return nil, dbErr(err, "claim outbox batches")
	}
	return out, nil
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
	tag, err := j.pool.Exec(ctx, `DELETE FROM aip_runtime_outbox WHERE journal_ns = $1 AND id = $2`, j.ns, id)
	if err != nil {
		return dbErr(err, "ack outbox batch %s", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: outbox batch %s", journal.ErrNotFound, id)
	}
	return nil
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
	tag, err := j.pool.Exec(ctx, `UPDATE aip_runtime_outbox SET attempts = attempts + 1, next_attempt = $3,
		last_error = $4, lease_until = NULL WHERE journal_ns = $1 AND id = $2`, j.ns, id, journal.Micro(next), journal.Text(lastError))
	if err != nil {
		return dbErr(err, "retry outbox batch %s", id)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%w: outbox batch %s", journal.ErrNotFound, id)
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
	if err := j.pool.QueryRow(ctx, `SELECT count(*) FROM aip_runtime_outbox WHERE journal_ns = $1`, j.ns).Scan(&n); err != nil {
		return 0, dbErr(err, "count outbox batches")
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
		raw []byte
		rev int64
	)
	err := j.pool.QueryRow(ctx, `SELECT value, revision FROM aip_runtime_state
		WHERE journal_ns = $1 AND namespace = $2 AND key = $3`, j.ns, namespace, key).Scan(&raw, &rev)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return journal.StateValue{}, fmt.Errorf("%w: state %s/%s", journal.ErrNotFound, namespace, key)
	case err != nil:
		return journal.StateValue{}, dbErr(err, "read state %s/%s", namespace, key)
	}
	return journal.StateValue{Value: json.RawMessage(raw), Revision: uint64(rev)}, nil
}

// PutState writes a value if the stored revision equals expectedRevision
// (0: absent) and returns the new revision; otherwise ErrConflict.
// Concurrent writers of one revision serialise on the row: one wins, the
// others re-check the revision after it commits and find it moved.
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
	var (
		tag interface{ RowsAffected() int64 }
		err error
	)
	if expectedRevision == 0 {
		tag, err = j.pool.Exec(ctx, `INSERT INTO aip_runtime_state (journal_ns, namespace, key, value, revision, updated_at)
			VALUES ($1, $2, $3, $4, 1, now()) ON CONFLICT (journal_ns, namespace, key) DO NOTHING`,
			j.ns, namespace, key, []byte(value))
	} else {
		tag, err = j.pool.Exec(ctx, `UPDATE aip_runtime_state SET value = $4, revision = revision + 1, updated_at = now()
			WHERE journal_ns = $1 AND namespace = $2 AND key = $3 AND revision = $5`,
			j.ns, namespace, key, []byte(value), int64(expectedRevision))
	}
	if err != nil {
		return 0, dbErr(err, "write state %s/%s", namespace, key)
	}
	if tag.RowsAffected() == 0 {
		return 0, fmt.Errorf("%w: state %s/%s is not at revision %d", journal.ErrConflict, namespace, key, expectedRevision)
	}
	return expectedRevision + 1, nil
}

// Probe checks that this journal still holds its namespace (see
// LockedError), then writes the namespace's probe row and reads it back in
// one statement.
func (j *Journal) Probe(ctx context.Context) error {
	if err := j.enter(ctx); err != nil {
		return err
	}
	defer j.leave()
	if err := j.lock.check(ctx); err != nil {
		return err
	}
	var at time.Time
	err := j.pool.QueryRow(ctx, `INSERT INTO aip_runtime_probe (journal_ns, at) VALUES ($1, now())
		ON CONFLICT (journal_ns) DO UPDATE SET at = EXCLUDED.at RETURNING at`, j.ns).Scan(&at)
	if err != nil {
		return dbErr(err, "probe")
	}
	return nil
}
