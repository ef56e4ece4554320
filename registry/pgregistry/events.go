package pgregistry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

var _ registry.EventLog = (*Registry)(nil)

const eventColumns = `sequence, instance_id, replica_id, version_id, channel_id, event, received_at_ms`

// eventDoc is an event's document as stored (migration 0014's event_text),
// or jsonb's writing of it for a row stored without (before 0014, or by a
// build of schema 13), which spells its numbers out in full.
const eventDoc = `coalesce(event_text, event::text)`

// eventRow reads eventColumns from aip_registry.events.
const eventRow = `sequence, instance_id, replica_id, version_id, channel_id, ` + eventDoc + ` AS event, received_at_ms`

// eventsByID reads the tenant's stored events with the given IDs, and
// the ones of those IDs the log pruned (migration 0009's pruned_events,
// with pruned_id set, and the digest of migration 0012, NULL for an ID
// pruned before it), in one statement: one snapshot, in which an event
// being pruned is either still stored or remembered as pruned.
const eventsByID = `
SELECT ` + eventRow + `, NULL::text AS pruned_id, NULL::bytea AS pruned_digest
FROM aip_registry.events
WHERE tenant_id = $1 AND event_id = ANY($2::text[])
UNION ALL
SELECT 0, '', '', '', '', NULL, received_at_ms, event_id, digest
FROM aip_registry.pruned_events
WHERE tenant_id = $1 AND event_id = ANY($2::text[])`

// replayDigests computes migration 0012's event_replay_digest of events
// (their stored form) delivered on channel $1 by instance $2, in order:
// the digests AppendEvents compares with those of pruned events.
const replayDigests = `
SELECT aip_registry.event_replay_digest($1, $2, n.ev::jsonb)
FROM unnest($3::text[]) WITH ORDINALITY AS n (ev, ord)
ORDER BY n.ord`

// lockEventHead locks the tenant's head row for the rest of the
// transaction, creating it on the tenant's first event, and returns the
// last sequence given out.
const lockEventHead = `
INSERT INTO aip_registry.event_log_heads AS h (tenant_id, last_sequence) VALUES ($1, 0)
ON CONFLICT (tenant_id) DO UPDATE SET last_sequence = h.last_sequence
RETURNING last_sequence`

// insertEvents numbers the new events after the head (locked by
// lockEventHead in the same transaction), in the batch's order, each
// document both as jsonb (event, which the digest of a pruned event and
// builds of schema 13 read) and as given (event_text, which reads return).
const insertEvents = `
INSERT INTO aip_registry.events (tenant_id, sequence, event_id, instance_id, replica_id, version_id, channel_id, event, event_text, received_at_ms)
SELECT $1, h.last_sequence + n.ord, n.id, $2, $3, $4, $5, n.ev::jsonb, n.ev, $6
FROM aip_registry.event_log_heads h, unnest($7::text[], $8::text[]) WITH ORDINALITY AS n (id, ev, ord)
WHERE h.tenant_id = $1
ORDER BY n.ord`

const advanceEventHead = `
UPDATE aip_registry.event_log_heads SET last_sequence = last_sequence + $2 WHERE tenant_id = $1`

// eventPage reads up to $3 of the tenant's events after sequence $2, in
// order, then its head row (head set, the last sequence given out in the
// sequence column; none for a tenant without events), in one statement:
// one snapshot, whose head is at least every sequence of the page.
const eventPage = `
SELECT false AS head, ` + eventColumns + `
FROM (SELECT ` + eventRow + `
	FROM aip_registry.events
	WHERE tenant_id = $1 AND sequence > $2
	ORDER BY sequence
	LIMIT $3) page
UNION ALL
SELECT true, last_sequence, '', '', '', '', NULL, 0
FROM aip_registry.event_log_heads
WHERE tenant_id = $1
ORDER BY 1, 2`

// AppendEvents implements registry.EventLog. It reads the stored events
// with the batch's IDs and the pruned ones among them (no lock), decides
// each event (redelivery, conflict, pruned or new; an event under a pruned
// ID with a digest takes one more round trip, computing its digest with
// the function the pruning used), and appends the new ones in one implicit
// transaction of one round trip: lock the tenant's head row, insert the
// events numbered after it, advance it. An event stored meanwhile by
// another delivery breaks the unique (tenant, event ID) key; the
// transaction rolls back and the whole append runs again, finding it.
func (r *Registry) AppendEvents(ctx context.Context, b registry.EventBatch) ([]registry.StoredEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	received := registry.EventReceivedAt(&b, r.now())
	ids := make([]string, len(b.Events))
	for i := range b.Events {
		ids[i] = b.Events[i].ID
	}
	op := "append events to the log of tenant " + b.TenantID
	var out []registry.StoredEvent
	err := r.inPipe(ctx, r.data, op, func(p *pipe) error {
		rows, err := p.conn.Query(ctx, r.eventsByID, b.TenantID, ids)
		if err != nil {
			return err
		}
		byID := make(map[string]*registry.StoredEvent, len(ids))
		pruned := map[string]prunedEvent{}
		for rows.Next() {
			var prunedID *string
			var digest []byte
			var seq, receivedMS int64
			var doc []byte
			se := &registry.StoredEvent{TenantID: b.TenantID}
			if err := rows.Scan(&seq, &se.InstanceID, &se.ReplicaID, &se.VersionID, &se.ChannelID, &doc, &receivedMS, &prunedID, &digest); err != nil {
				rows.Close()
				return err
			}
			if prunedID != nil {
				pruned[*prunedID] = prunedEvent{received: fromMS(receivedMS), digest: digest}
				continue
			}
			if err := json.Unmarshal(doc, &se.Event); err != nil {
				rows.Close()
				return fmt.Errorf("event %d of tenant %s: stored document: %w", seq, b.TenantID, err)
			}
			se.Sequence, se.ReceivedAt = uint64(seq), fromMS(receivedMS)
			byID[se.Event.ID] = se
		}
		if err := rows.Err(); err != nil {
			return err
		}
		out = make([]registry.StoredEvent, len(b.Events))
		var fresh, checked []int
		var newIDs, docs, checkDocs []string
		// conflict is the batch's first conflict with a stored event: the
		// events after it need no decision, but the pruned ones before it
		// are checked first, so that the batch is refused naming its first
		// conflicting event in order, as memregistry does.
		var conflict error
		for i := range b.Events {
			e := &b.Events[i]
			if s, ok := byID[e.ID]; ok {
				if err := registry.CheckRedelivery(s, &b, e); err != nil {
					conflict = err
					break
				}
				out[i] = *s
				continue
			}
			se := registry.StoredEvent{TenantID: b.TenantID, InstanceID: b.InstanceID, ReplicaID: b.ReplicaID, VersionID: b.VersionID,
				ChannelID: b.ChannelID, Event: registry.StoredForm(*e), ReceivedAt: received}
			doc, err := eventDocument(&se.Event)
			if err != nil {
				return fmt.Errorf("%w: event %s: %v", registry.ErrInvalid, e.ID, err)
			}
			if p, ok := pruned[e.ID]; ok {
				// Stored once and pruned since: not stored again (once
				// its digest, when the pruning kept one, says it is the
				// same event).
				se.Pruned, se.ReceivedAt = true, p.received
				out[i] = se
				if p.digest != nil {
					checked, checkDocs = append(checked, i), append(checkDocs, string(doc))
				}
				continue
			}
			out[i] = se
			fresh = append(fresh, i)
			newIDs, docs = append(newIDs, e.ID), append(docs, string(doc))
		}
		if len(checked) > 0 {
			rows, err := p.conn.Query(ctx, replayDigests, b.ChannelID, b.InstanceID, checkDocs)
			if err != nil {
				return err
			}
			digests, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
			if err != nil {
				return err
			}
			if len(digests) != len(checked) {
				return fmt.Errorf("event digests: %d rows for %d events", len(digests), len(checked))
			}
			for n, i := range checked {
				id := b.Events[i].ID
				if !bytes.Equal(digests[n], pruned[id].digest) {
					return registry.PrunedConflict(id)
				}
			}
		}
		if conflict != nil {
			return conflict
		}
		if len(fresh) == 0 {
			return nil
		}
		var last int64
		batch := &pgx.Batch{}
		batch.Queue(lockEventHead, b.TenantID).QueryRow(func(row pgx.Row) error { return row.Scan(&last) })
		batch.Queue(r.insertEvents, b.TenantID, b.InstanceID, b.ReplicaID, b.VersionID, b.ChannelID, toMS(received), newIDs, docs)
		batch.Queue(advanceEventHead, b.TenantID, len(fresh))
		if err := p.once(ctx, batch); err != nil {
			return err
		}
		for n, i := range fresh {
			out[i].Sequence = uint64(last) + uint64(n) + 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Events implements registry.EventLog.
func (r *Registry) Events(ctx context.Context, tenantID string, after uint64, limit int) (registry.EventPage, error) {
	if err := ctx.Err(); err != nil {
		return registry.EventPage{}, err
	}
	limit = registry.ClampEventPage(limit)
	op := "read the event log of tenant " + tenantID
	rows, err := r.data.Query(ctx, r.eventPage, tenantID, int64(min(after, math.MaxInt64)), limit+1)
	if err != nil {
		return registry.EventPage{}, classify(op, err)
	}
	var last uint64
	events := make([]registry.StoredEvent, 0, limit+1)
	for rows.Next() {
		head, e, err := scanEvent(rows, tenantID)
		if err != nil {
			rows.Close()
			return registry.EventPage{}, classify(op, err)
		}
		if head {
			last = e.Sequence
			continue
		}
		events = append(events, e)
	}
	if err := rows.Err(); err != nil {
		return registry.EventPage{}, classify(op, err)
	}
	page := registry.EventPage{Events: events, Last: last}
	if len(events) > limit {
		page.Events, page.More = events[:limit], true
	}
	if page.Events == nil {
		page.Events = []registry.StoredEvent{}
	}
	return page, nil
}

// eventDocument returns the document an event is stored as: e in JSON,
// its data byte for byte as given (json.Marshal would compact it and
// escape <, > and &), so that it reads back as memregistry returns it.
// e.Data must be a JSON object without surrounding whitespace
// (registry.StoredForm), which decoding the document returns verbatim.
func eventDocument(e *aip.Event) ([]byte, error) {
	data := e.Data
	head := *e
	head.Data = nil
	doc, err := json.Marshal(&head)
	if err != nil {
		return nil, err
	}
	if !json.Valid(data) {
		return nil, errors.New("data is not JSON")
	}
	doc = append(doc[:len(doc)-1], `,"data":`...)
	doc = append(doc, data...)
	return append(doc, '}'), nil
}

// prunedEvent is what pruned_events keeps of an event: when it was
// received, and its digest (nil when it was pruned before migration 0012).
type prunedEvent struct {
	received time.Time
	digest   []byte
}

// scanEvent scans a row of eventPage: an event, or (head set) the
// tenant's head row, whose last sequence is the Sequence returned.
func scanEvent(row pgx.Rows, tenantID string) (head bool, e registry.StoredEvent, err error) {
	e = registry.StoredEvent{TenantID: tenantID}
	var seq, receivedMS int64
	var doc []byte
	if err := row.Scan(&head, &seq, &e.InstanceID, &e.ReplicaID, &e.VersionID, &e.ChannelID, &doc, &receivedMS); err != nil {
		return false, e, err
	}
	e.Sequence = uint64(seq)
	if head {
		return true, e, nil
	}
	if err := json.Unmarshal(doc, &e.Event); err != nil {
		return false, e, fmt.Errorf("event %d of tenant %s: stored document: %w", seq, tenantID, err)
	}
	e.ReceivedAt = fromMS(receivedMS)
	return false, e, nil
}

// pruneEvents deletes the events received before $1, oldest first, at most
// $2, of every tenant.
const pruneEvents = `DELETE FROM aip_registry.events e
	USING (SELECT tenant_id, sequence FROM aip_registry.events
		WHERE received_at_ms < $1 ORDER BY received_at_ms, tenant_id, sequence LIMIT $2) old
	WHERE e.tenant_id = old.tenant_id AND e.sequence = old.sequence`

// PruneEvents implements registry.EventPruner, on the data pool: the
// lifecycle role may delete events (deploy/postgres/roles.sql), the data
// role may not. Migration 0009's trigger on events remembers the IDs it
// deletes in pruned_events, in the same statement (until
// ForgetPrunedEvents).
func (r *Registry) PruneEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := registry.CheckPruneEvents(receivedBefore, limit); err != nil {
		return 0, err
	}
	tag, err := r.data.Exec(ctx, pruneEvents, toMS(receivedBefore), limit)
	if err != nil {
		return 0, classify("prune the event log", err)
	}
	return int(tag.RowsAffected()), nil
}

// forgetPrunedEvents forgets the IDs of the pruned events received before
// $1, oldest first (by pruned_events_by_received), at most $2, of every
// tenant.
const forgetPrunedEvents = `DELETE FROM aip_registry.pruned_events p
	USING (SELECT tenant_id, event_id FROM aip_registry.pruned_events
		WHERE received_at_ms < $1 ORDER BY received_at_ms LIMIT $2) old
	WHERE p.tenant_id = old.tenant_id AND p.event_id = old.event_id`

// ForgetPrunedEvents implements registry.EventPruner, on the data pool:
// the lifecycle role may delete the rows of pruned_events
// (deploy/postgres/roles.sql), the data role may not. An AppendEvents
// running meanwhile reads the ID either still kept (the event is answered
// pruned) or gone (the event is stored again).
func (r *Registry) ForgetPrunedEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := registry.CheckForgetPrunedEvents(receivedBefore, limit); err != nil {
		return 0, err
	}
	tag, err := r.data.Exec(ctx, forgetPrunedEvents, toMS(receivedBefore), limit)
	if err != nil {
		return 0, classify("forget the IDs of pruned events", err)
	}
	return int(tag.RowsAffected()), nil
}
