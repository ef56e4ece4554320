package memregistry

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// eventLog is one tenant's event log: its events in sequence order (the
// sequences are 1, 2, 3, … without gaps, less the pruned ones), their
// positions by event ID, the last sequence given out (which pruning
// never lowers), and the IDs of the pruned events with when each was
// received and the digest of its content (not stored again until
// ForgetPrunedEvents forgets them).
type eventLog struct {
	events  []registry.StoredEvent
	byID    map[string]int
	lastSeq uint64
	pruned  map[string]prunedEvent
}

// prunedEvent is what the log keeps of a pruned event: when it was
// received and its registry.RedeliveryDigest (nil when restored from a
// snapshot written before digests were kept: such an ID is answered
// pruned whatever is delivered under it).
type prunedEvent struct {
	received time.Time
	digest   []byte
}

func newEventLog() *eventLog {
	return &eventLog{byID: make(map[string]int), pruned: make(map[string]prunedEvent)}
}

// last returns the log's last sequence given out, 0 for a new log.
func (l *eventLog) last() uint64 { return l.lastSeq }

// drop deletes the events whose IDs are in ids, remembering their IDs and
// digests.
func (l *eventLog) drop(ids map[string]bool) {
	kept := l.events[:0:0]
	for _, e := range l.events {
		if ids[e.Event.ID] {
			delete(l.byID, e.Event.ID)
			l.pruned[e.Event.ID] = prunedEvent{received: e.ReceivedAt, digest: registry.RedeliveryDigest(e.ChannelID, e.InstanceID, &e.Event)}
			continue
		}
		kept = append(kept, e)
	}
	l.events = kept
	for i, e := range l.events {
		l.byID[e.Event.ID] = i
	}
}

// AppendEvents implements registry.EventLog.
func (r *Registry) AppendEvents(ctx context.Context, b registry.EventBatch) ([]registry.StoredEvent, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := b.Validate(); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.events[b.TenantID]
	// Decide every event before storing any, so the batch is all or
	// nothing.
	out := make([]registry.StoredEvent, len(b.Events))
	fresh := make([]int, 0, len(b.Events))
	received := registry.EventReceivedAt(&b, r.now())
	for i := range b.Events {
		e := &b.Events[i]
		if l != nil {
			if at, ok := l.byID[e.ID]; ok {
				if err := registry.CheckRedelivery(&l.events[at], &b, e); err != nil {
					return nil, err
				}
				out[i] = cloneStoredEvent(l.events[at])
				continue
			}
			if p, ok := l.pruned[e.ID]; ok {
				if p.digest != nil && !bytes.Equal(p.digest, registry.RedeliveryDigest(b.ChannelID, b.InstanceID, e)) {
					return nil, registry.PrunedConflict(e.ID)
				}
				out[i] = cloneStoredEvent(registry.StoredEvent{TenantID: b.TenantID, InstanceID: b.InstanceID, ReplicaID: b.ReplicaID,
					VersionID: b.VersionID, ChannelID: b.ChannelID, Event: registry.StoredForm(*e), ReceivedAt: p.received, Pruned: true})
				continue
			}
		}
		fresh = append(fresh, i)
	}
	if len(fresh) == 0 {
		return out, nil
	}
	if l == nil {
		l = newEventLog()
		r.events[b.TenantID] = l
	}
	seq := l.last()
	for _, i := range fresh {
		seq++
		e := registry.StoredForm(b.Events[i])
		s := cloneStoredEvent(registry.StoredEvent{
			Sequence: seq, TenantID: b.TenantID, InstanceID: b.InstanceID, ReplicaID: b.ReplicaID, VersionID: b.VersionID,
			ChannelID: b.ChannelID, Event: e, ReceivedAt: received,
		})
		l.byID[e.ID] = len(l.events)
		l.events = append(l.events, s)
		l.lastSeq = seq
		out[i] = cloneStoredEvent(s)
	}
	return out, nil
}

// PruneEvents implements registry.EventPruner.
func (r *Registry) PruneEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := registry.CheckPruneEvents(receivedBefore, limit); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var old []receipt
	for tenant, l := range r.events {
		for _, e := range l.events {
			if e.ReceivedAt.Before(receivedBefore) {
				old = append(old, receipt{tenant, e.Event.ID, e.Sequence, e.ReceivedAt})
			}
		}
	}
	old = oldestReceipts(old, limit)
	drop := map[string]map[string]bool{}
	for _, c := range old {
		if drop[c.tenant] == nil {
			drop[c.tenant] = map[string]bool{}
		}
		drop[c.tenant][c.id] = true
	}
	for tenant, ids := range drop {
		r.events[tenant].drop(ids)
	}
	return len(old), nil
}

// ForgetPrunedEvents implements registry.EventPruner.
func (r *Registry) ForgetPrunedEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if err := registry.CheckForgetPrunedEvents(receivedBefore, limit); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var old []receipt
	for tenant, l := range r.events {
		for id, p := range l.pruned {
			if p.received.Before(receivedBefore) {
				old = append(old, receipt{tenant: tenant, id: id, received: p.received})
			}
		}
	}
	old = oldestReceipts(old, limit)
	for _, c := range old {
		// The tenant's log itself stays: its last sequence is never
		// given out again.
		delete(r.events[c.tenant].pruned, c.id)
	}
	return len(old), nil
}

// receipt is a stored event, or a remembered pruned event ID (sequence
// 0), by when the log received it.
type receipt struct {
	tenant   string
	id       string
	seq      uint64
	received time.Time
}

// oldestReceipts sorts rs oldest received first, as PostgreSQL's
// (received, tenant, sequence) order (ties of remembered IDs by ID), and
// returns the first limit.
func oldestReceipts(rs []receipt, limit int) []receipt {
	slices.SortFunc(rs, func(a, b receipt) int {
		if c := a.received.Compare(b.received); c != 0 {
			return c
		}
		if c := cmp.Compare(a.tenant, b.tenant); c != 0 {
			return c
		}
		if c := cmp.Compare(a.seq, b.seq); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	})
	return rs[:min(len(rs), limit)]
}

// Events implements registry.EventLog.
func (r *Registry) Events(ctx context.Context, tenantID string, after uint64, limit int) (registry.EventPage, error) {
	if err := ctx.Err(); err != nil {
		return registry.EventPage{}, err
	}
	limit = registry.ClampEventPage(limit)
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.events[tenantID]
	page := registry.EventPage{Events: []registry.StoredEvent{}}
	if l != nil {
		page.Last = l.last()
	}
	if l == nil || after >= l.last() {
		// No event follows (and after+1 below would wrap at the
		// largest uint64).
		return page, nil
	}
	from, _ := slices.BinarySearchFunc(l.events, after+1, func(e registry.StoredEvent, seq uint64) int {
		return cmp.Compare(e.Sequence, seq)
	})
	to := min(from+limit, len(l.events))
	for _, e := range l.events[from:to] {
		page.Events = append(page.Events, cloneStoredEvent(e))
	}
	page.More = to < len(l.events)
	return page, nil
}

// cloneStoredEvent copies e so the caller and the registry share nothing.
func cloneStoredEvent(e registry.StoredEvent) registry.StoredEvent {
	e.Event.Data = slices.Clone(json.RawMessage(e.Event.Data))
	if e.Event.Actor != nil {
		// A principal holds slices and raw JSON: copy it through its JSON.
		var a aip.Principal
		if raw, err := json.Marshal(e.Event.Actor); err == nil && json.Unmarshal(raw, &a) == nil {
			e.Event.Actor = &a
		}
	}
	return e
}
