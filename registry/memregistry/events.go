package memregistry

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// eventLog is one tenant's event log: its events in sequence order (the
// sequences are 1, 2, 3, … without gaps) and their positions by event ID.
type eventLog struct {
	events []registry.StoredEvent
	byID   map[string]int
}

func newEventLog() *eventLog { return &eventLog{byID: make(map[string]int)} }

// last returns the log's last sequence, 0 when it is empty.
func (l *eventLog) last() uint64 {
	if len(l.events) == 0 {
		return 0
	}
	return l.events[len(l.events)-1].Sequence
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
	received := registry.EventReceivedAt(&b, r.now())
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
		out[i] = cloneStoredEvent(s)
	}
	return out, nil
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
