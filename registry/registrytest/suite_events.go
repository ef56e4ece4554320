package registrytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// runEvents holds backends to registry.EventLog.
func runEvents(t *testing.T, nb NewBackend) {
	t.Run("SequencesPerTenant", func(t *testing.T) { testEventSequences(t, nb) })
	t.Run("Redelivery", func(t *testing.T) { testEventRedelivery(t, nb) })
	t.Run("Conflict", func(t *testing.T) { testEventConflict(t, nb) })
	t.Run("InvalidBatches", func(t *testing.T) { testEventInvalid(t, nb) })
	t.Run("DataNumbers", func(t *testing.T) { testEventDataNumbers(t, nb) })
	t.Run("DataEscapes", func(t *testing.T) { testEventDataEscapes(t, nb) })
	t.Run("DataAsStored", func(t *testing.T) { testEventDataAsStored(t, nb) })
	t.Run("DataSizeAsStored", func(t *testing.T) { testEventDataSizeAsStored(t, nb) })
	t.Run("Paging", func(t *testing.T) { testEventPaging(t, nb) })
	t.Run("ConcurrentAppends", func(t *testing.T) { testEventConcurrency(t, nb) })
	t.Run("ConcurrentRedelivery", func(t *testing.T) { testEventConcurrentRedelivery(t, nb) })
	t.Run("Prune", func(t *testing.T) { testEventPrune(t, nb) })
	t.Run("ForgetPruned", func(t *testing.T) { testEventForgetPruned(t, nb) })
	t.Run("PrunedConflict", func(t *testing.T) { testEventPrunedConflict(t, nb) })
	t.Run("PrunedForms", func(t *testing.T) { testEventPrunedForms(t, nb) })
	t.Run("FirstConflictNamed", func(t *testing.T) { testEventFirstConflictNamed(t, nb) })
}

// newPrunerFx is a fixture whose backend must prune events.
func newPrunerFx(t *testing.T, nb NewBackend) (*fx, registry.EventPruner) {
	f := newFx(t, nb)
	if f.b.EventPruner == nil {
		t.Fatal("registrytest.Backend.EventPruner is nil: the backend must set every contract of Backend")
	}
	return f, f.b.EventPruner
}

// receivedAt is b received d after Epoch.
func receivedAt(b registry.EventBatch, d time.Duration) registry.EventBatch {
	b.ReceivedAt = Epoch.Add(d)
	return b
}

// refusesBadPruneArgs requires prune (named name) to refuse a limit of 0
// or below and a zero cutoff with ErrInvalid.
func (f *fx) refusesBadPruneArgs(name string, prune func(context.Context, time.Time, int) (int, error)) {
	f.t.Helper()
	for _, lim := range []int{0, -1} {
		if _, err := prune(f.ctx, Epoch.Add(time.Hour), lim); !errors.Is(err, registry.ErrInvalid) {
			f.t.Fatalf("%s(limit %d) = %v, want ErrInvalid", name, lim, err)
		}
	}
	if _, err := prune(f.ctx, time.Time{}, 10); !errors.Is(err, registry.ErrInvalid) {
		f.t.Fatalf("%s(zero cutoff) = %v, want ErrInvalid", name, err)
	}
}

// testEventPrune: PruneEvents deletes the events received before the
// cutoff, oldest first across tenants and at most limit; a tenant's
// sequences go on after them, paging starts at the first event kept, and
// a pruned event ID delivered again is not stored again (Pruned).
func testEventPrune(t *testing.T, nb NewBackend) {
	f, p := newPrunerFx(t, nb)
	f.appendEvents(receivedAt(EventBatch("ta", "r1", "a1", "a2"), time.Minute))
	f.appendEvents(receivedAt(EventBatch("tb", "r2", "b1"), 2*time.Minute))
	f.appendEvents(receivedAt(EventBatch("ta", "r1", "a3"), 3*time.Minute))
	f.appendEvents(receivedAt(EventBatch("tb", "r2", "b2", "b3"), 10*time.Minute))

	f.refusesBadPruneArgs("PruneEvents", p.PruneEvents)
	prune := func(before time.Duration, limit, want int) {
		f.t.Helper()
		n, err := p.PruneEvents(f.ctx, Epoch.Add(before), limit)
		f.must(err)
		if n != want {
			f.t.Fatalf("PruneEvents(Epoch+%s, %d) = %d, want %d", before, limit, n, want)
		}
	}
	kept := func(tenant string, want ...string) {
		f.t.Helper()
		var got []string
		var after uint64
		for {
			pg, err := f.events().Events(f.ctx, tenant, after, 2)
			f.must(err)
			for _, e := range pg.Events {
				got = append(got, e.Event.ID)
				after = e.Sequence
			}
			if !pg.More {
				break
			}
		}
		if !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
			f.t.Fatalf("tenant %s keeps %v, want %v", tenant, got, want)
		}
	}
	// Oldest received first, across tenants: a1 and a2 (1 min), then b1.
	prune(5*time.Minute, 3, 3)
	kept("ta", "a3")
	kept("tb", "b2", "b3")
	prune(5*time.Minute, 10, 1) // a3 (3 min); b2 and b3 are newer
	kept("ta")
	prune(5*time.Minute, 10, 0)
	// Pruning every event of a log keeps its last sequence.
	if pg, err := f.events().Events(f.ctx, "ta", 0, 10); err != nil || len(pg.Events) != 0 || pg.Last != 3 {
		f.t.Fatalf("tenant ta with every event pruned: %+v, %v; want no event and last sequence 3", pg, err)
	}

	// Sequences go on after the pruned events.
	got := f.appendEvents(receivedAt(EventBatch("ta", "r1", "a4"), 20*time.Minute))
	if got[0].Sequence != 4 {
		f.t.Fatalf("the event after three pruned ones has sequence %d, want 4", got[0].Sequence)
	}
	pg, err := f.events().Events(f.ctx, "ta", 0, 10)
	f.must(err)
	if len(pg.Events) != 1 || pg.Events[0].Sequence != 4 || pg.More {
		f.t.Fatalf("tenant ta from the start: %+v", pg)
	}
	// A pruned event delivered again (by another replica, much later) is
	// not stored again: it counts as stored and comes back Pruned, with
	// the time it was first received (PrunedConflict: a different event
	// under a pruned ID is a conflict). The batch's new events are
	// stored.
	b := receivedAt(EventBatch("ta", "r9", "a1", "a5", "a2"), 21*time.Minute)
	again := f.appendEvents(b)
	for i, w := range []struct {
		pruned bool
		seq    uint64
	}{{true, 0}, {false, 5}, {true, 0}} {
		g := again[i]
		if g.Pruned != w.pruned || g.Sequence != w.seq || g.Event.ID != b.Events[i].ID {
			f.t.Fatalf("event %s delivered again after pruning: pruned %t, sequence %d; want pruned %t, sequence %d",
				b.Events[i].ID, g.Pruned, g.Sequence, w.pruned, w.seq)
		}
		if w.pruned && (!g.ReceivedAt.Equal(Epoch.Add(time.Minute)) || g.TenantID != "ta" || g.ChannelID != b.ChannelID) {
			f.t.Fatalf("pruned event %s delivered again: %+v, want received at %s (its first receipt)", g.Event.ID, g, Epoch.Add(time.Minute))
		}
	}
	if again := f.appendEvents(receivedAt(EventBatch("ta", "r1", "a3"), 22*time.Minute)); !again[0].Pruned {
		f.t.Fatalf("pruned event a3 delivered again alone: %+v, want Pruned", again[0])
	}
	kept("ta", "a4", "a5")
	kept("tb", "b2", "b3")

	// By receipt time, not by sequence: a batch received earlier may be
	// appended later (it waited in a dispatcher).
	f.appendEvents(receivedAt(EventBatch("tc", "r3", "c1"), 50*time.Minute))
	f.appendEvents(receivedAt(EventBatch("tc", "r3", "c2"), 40*time.Minute))
	prune(45*time.Minute, 10, 5) // b2, b3 (10 min), a4 (20), a5 (21), c2 (40)
	kept("tc", "c1")
	kept("ta")
	kept("tb")
	// Every ID pruned is remembered, per tenant: the same ID in another
	// tenant's log is that tenant's own event.
	for _, id := range []string{"a1", "a2", "a3", "a4", "a5"} {
		if g := f.appendEvents(receivedAt(EventBatch("ta", "r1", id), time.Hour)); !g[0].Pruned {
			f.t.Fatalf("pruned event %s delivered again: %+v, want Pruned", id, g[0])
		}
	}
	kept("ta")
	if g := f.appendEvents(receivedAt(EventBatch("tc", "r3", "a1", "c2"), time.Hour)); g[0].Pruned || g[0].Sequence != 3 || !g[1].Pruned {
		f.t.Fatalf("tenant tc's own a1 and its pruned c2: %+v, want a1 stored as sequence 3 and c2 pruned", g)
	}
	kept("tc", "c1", "a1")
}

// testEventForgetPruned: ForgetPrunedEvents forgets the IDs of pruned
// events received before its cutoff, oldest received first across tenants
// and at most limit, and keeps the newer ones; the log's stored events are
// untouched. An event whose ID was forgotten is unknown: delivered again,
// it is stored again as a new event (the documented cost of the second
// horizon), and pruned again, its ID is remembered from its new receipt.
func testEventForgetPruned(t *testing.T, nb NewBackend) {
	f, p := newPrunerFx(t, nb)
	f.appendEvents(receivedAt(EventBatch("ta", "r1", "a1", "a2"), time.Minute))
	f.appendEvents(receivedAt(EventBatch("tb", "r2", "b1"), 2*time.Minute))
	f.appendEvents(receivedAt(EventBatch("ta", "r1", "a3"), 3*time.Minute))
	f.appendEvents(receivedAt(EventBatch("tb", "r2", "b2"), 10*time.Minute))
	if n, err := p.PruneEvents(f.ctx, Epoch.Add(5*time.Minute), 10); err != nil || n != 4 {
		f.t.Fatalf("PruneEvents(Epoch+5m) = %d, %v; want 4 (a1, a2, b1, a3)", n, err)
	}

	f.refusesBadPruneArgs("ForgetPrunedEvents", p.ForgetPrunedEvents)
	forget := func(before time.Duration, limit, want int) {
		f.t.Helper()
		n, err := p.ForgetPrunedEvents(f.ctx, Epoch.Add(before), limit)
		f.must(err)
		if n != want {
			f.t.Fatalf("ForgetPrunedEvents(Epoch+%s, %d) = %d, want %d", before, limit, n, want)
		}
	}
	// remembered reports whether the tenant's log still knows the pruned
	// event id: delivered again, it comes back Pruned. (Only asked of IDs
	// it is known to remember or to have forgotten with nothing to lose:
	// an event forgotten is stored by the asking.)
	remembered := func(tenant, id string, d time.Duration) registry.StoredEvent {
		f.t.Helper()
		return f.appendEvents(receivedAt(EventBatch(tenant, "r9", id), d))[0]
	}

	// Oldest received first, across tenants, at most limit: a1 and a2
	// (1 min) go before b1 (2 min), in either order.
	forget(3*time.Minute, 1, 1)
	if g := remembered("tb", "b1", 30*time.Minute); !g.Pruned {
		f.t.Fatalf("b1 (received at 2 min) after forgetting one ID: %+v, want it still Pruned (a1 and a2 are older)", g)
	}
	forget(3*time.Minute, 1, 1)
	if g := remembered("tb", "b1", 30*time.Minute); !g.Pruned {
		f.t.Fatalf("b1 (received at 2 min) after forgetting two IDs: %+v, want it still Pruned", g)
	}
	// The cutoff is strict: a3, received at 3 min, is newer.
	forget(3*time.Minute, 10, 1) // b1
	forget(3*time.Minute, 10, 0)
	if g := remembered("ta", "a3", 30*time.Minute); !g.Pruned || !g.ReceivedAt.Equal(Epoch.Add(3*time.Minute)) {
		f.t.Fatalf("a3 (received at the cutoff) delivered again: %+v, want Pruned, first received at 3 min", g)
	}
	// The stored events are the log's, not forgotten: b2 is still there.
	if g := remembered("tb", "b2", 30*time.Minute); g.Pruned || g.Sequence != 2 {
		f.t.Fatalf("stored b2 delivered again after forgetting: %+v, want its stored sequence 2", g)
	}

	// A forgotten ID is unknown: the event delivered again is stored
	// again, as a new event with the next sequence.
	late := receivedAt(EventBatch("ta", "r9", "a1", "a3", "a2"), 40*time.Minute)
	got := f.appendEvents(late)
	if got[0].Pruned || got[0].Sequence != 4 || !got[1].Pruned || got[2].Pruned || got[2].Sequence != 5 {
		f.t.Fatalf("a1, a3, a2 delivered again after a1's and a2's IDs were forgotten: %+v; want a1 stored as 4, a3 Pruned, a2 stored as 5", got)
	}
	if pg, err := f.events().Events(f.ctx, "ta", 0, 10); err != nil || !reflect.DeepEqual(eventIDs(pg.Events), []string{"a1", "a2"}) {
		f.t.Fatalf("tenant ta's log after the late redelivery: %+v, %v; want a1 and a2", pg, err)
	}
	f.checkStored(got[0], &late, late.Events[0], 4)
	if g := remembered("tb", "b1", 41*time.Minute); g.Pruned || g.Sequence != 3 {
		f.t.Fatalf("b1 delivered again after its ID was forgotten: %+v, want it stored as sequence 3", g)
	}

	// Pruned again, a1's ID is remembered from its new receipt (40 min):
	// a horizon that passed its first receipt keeps it.
	if n, err := p.PruneEvents(f.ctx, Epoch.Add(45*time.Minute), 10); err != nil || n != 4 {
		f.t.Fatalf("PruneEvents(Epoch+45m) = %d, %v; want 4 (b2, a1, a2, b1)", n, err)
	}
	forget(20*time.Minute, 10, 2) // a3 (3 min) and b2 (10 min)
	if g := remembered("ta", "a1", 50*time.Minute); !g.Pruned || !g.ReceivedAt.Equal(Epoch.Add(40*time.Minute)) {
		f.t.Fatalf("a1 pruned a second time, delivered again: %+v, want Pruned, received at 40 min", g)
	}
	forget(time.Hour, 100, 3) // a1, a2 (40 min) and b1 (41 min)
	forget(time.Hour, 100, 0)
	kept := f.appendEvents(receivedAt(EventBatch("ta", "r1", "a3"), time.Hour))
	if kept[0].Pruned || kept[0].Sequence != 6 {
		f.t.Fatalf("a3 delivered after every ID was forgotten: %+v, want it stored as sequence 6", kept[0])
	}
}

// testEventPrunedConflict: an event delivered under the ID of an event
// the log pruned is a conflict when it is no redelivery of the pruned
// event, as it is while the event is stored (the backend keeps a digest
// of the pruned event's content, registry.RedeliveryDigest): ErrConflict
// naming the event, and nothing of the batch is stored. A redelivery —
// from another replica, version and lease, with its data's keys in
// another order and numbers in another form — comes back Pruned.
func testEventPrunedConflict(t *testing.T, nb NewBackend) {
	f, p := newPrunerFx(t, nb)
	f.appendEvents(receivedAt(EventBatch("tenant-1", "a", "evt_1"), time.Minute))
	if n, err := p.PruneEvents(f.ctx, Epoch.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneEvents = %d, %v; want 1", n, err)
	}
	for _, c := range eventChanges {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			b := receivedAt(EventBatch("tenant-1", "b", "evt_new", "evt_1"), 2*time.Hour)
			c.change(&b)
			_, err := f.events().AppendEvents(f.ctx, b)
			f.wantErr(err, registry.ErrConflict, "a pruned event ID reused for a different "+c.name)
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.ID != "evt_1" {
				t.Fatalf("the conflict %v does not name event evt_1", err)
			}
			if n := len(f.eventLog("tenant-1")); n != 0 {
				t.Fatalf("a conflicting batch stored %d events", n)
			}
		})
	}
	f.t = t
	again := receivedAt(EventBatch("tenant-1", "b", "evt_new", "evt_1"), 2*time.Hour)
	again.VersionID, again.LeaseSequence = "cver_2", 99
	again.Events[1].OccurredAt = aip.Timestamp{Time: again.Events[1].OccurredAt.Add(400 * time.Microsecond)}
	again.Events[1].Data = json.RawMessage(`{"tags":["a","b"],"n":15e-1,"id":"evt_1","aip_connector":{"lease_sequence":99,"version_id":"cver_2","replica_id":"crep_b","channel_id":"webhooks","instance_id":"cinst_tenant-1"}}`)
	got := f.appendEvents(again)
	if got[0].Pruned || got[0].Sequence != 2 || !got[1].Pruned || !got[1].ReceivedAt.Equal(Epoch.Add(time.Minute)) {
		t.Fatalf("a new event and a redelivery of a pruned one: %+v; want the new one stored as sequence 2, the other Pruned", got)
	}
	// The pruned event's digest outlives another prune of the tenant's
	// log, and goes with ForgetPrunedEvents: the ID is then unknown and
	// a different event under it is stored.
	if n, err := p.PruneEvents(f.ctx, Epoch.Add(3*time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneEvents = %d, %v; want 1 (evt_new)", n, err)
	}
	changed := receivedAt(EventBatch("tenant-1", "a", "evt_1"), 3*time.Hour)
	changed.Events[0].Kind = "thing.changed"
	if _, err := f.events().AppendEvents(f.ctx, changed); !errors.Is(err, registry.ErrConflict) {
		t.Fatalf("a changed evt_1 after a second prune: %v, want ErrConflict", err)
	}
	if n, err := p.ForgetPrunedEvents(f.ctx, Epoch.Add(30*time.Minute), 10); err != nil || n != 1 {
		t.Fatalf("ForgetPrunedEvents = %d, %v; want 1 (evt_1)", n, err)
	}
	if got := f.appendEvents(changed); got[0].Pruned || got[0].Sequence != 3 {
		t.Fatalf("a changed evt_1 after its ID was forgotten: %+v, want it stored as sequence 3", got[0])
	}
}

// EventBatch returns a valid batch for tenant from instance cinst_<tenant>,
// replica crep_<replica>, version cver_1, channel "webhooks", holding
// events with the given IDs (kind "thing.happened", occurred at Epoch, data
// stamped with the delivery's provenance as the dispatcher does).
func EventBatch(tenant, replica string, ids ...string) registry.EventBatch {
	b := registry.EventBatch{
		TenantID: tenant, InstanceID: "cinst_" + tenant, ReplicaID: "crep_" + replica, VersionID: "cver_1",
		ChannelID: "webhooks", LeaseSequence: 7, ReceivedAt: Epoch,
	}
	for _, id := range ids {
		b.Events = append(b.Events, aip.Event{ID: id, Kind: "thing.happened", OccurredAt: aip.At(Epoch.Add(-time.Minute)),
			Data: eventData(&b, map[string]any{"id": id, "n": 1.5, "tags": []string{"a", "b"}})})
	}
	return b
}

// eventData is fields plus the aip_connector stamp of batch b.
func eventData(b *registry.EventBatch, fields map[string]any) json.RawMessage {
	m := map[string]any{registry.EventProvenance: map[string]any{
		"instance_id": b.InstanceID, "replica_id": b.ReplicaID, "version_id": b.VersionID,
		"channel_id": b.ChannelID, "lease_sequence": b.LeaseSequence,
	}}
	for k, v := range fields {
		m[k] = v
	}
	raw, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return raw
}

func (f *fx) events() registry.EventLog {
	f.t.Helper()
	if f.b.Events == nil {
		f.t.Fatal("registrytest.Backend.Events is nil: the backend must set every contract of Backend")
	}
	return f.b.Events
}

func (f *fx) appendEvents(b registry.EventBatch) []registry.StoredEvent {
	f.t.Helper()
	got, err := f.events().AppendEvents(f.ctx, b)
	f.must(err)
	if len(got) != len(b.Events) {
		f.t.Fatalf("AppendEvents of %d events returned %d", len(b.Events), len(got))
	}
	return got
}

// eventLog reads the tenant's whole log, checking that sequences run 1, 2,
// 3, … and that every event is the tenant's.
func (f *fx) eventLog(tenant string) []registry.StoredEvent {
	f.t.Helper()
	var all []registry.StoredEvent
	var after uint64
	for {
		p, err := f.events().Events(f.ctx, tenant, after, registry.MaxEventPage)
		f.must(err)
		for _, e := range p.Events {
			if e.TenantID != tenant {
				f.t.Fatalf("tenant %s's log holds event %s of tenant %s", tenant, e.Event.ID, e.TenantID)
			}
			if e.Sequence != after+1 {
				f.t.Fatalf("tenant %s's log: sequence %d after %d, want %d", tenant, e.Sequence, after, after+1)
			}
			after = e.Sequence
		}
		all = append(all, p.Events...)
		if !p.More {
			return all
		}
		if len(p.Events) == 0 {
			f.t.Fatalf("tenant %s's log: an empty page after %d says more events follow", tenant, after)
		}
	}
}

func eventIDs(es []registry.StoredEvent) []string {
	ids := make([]string, len(es))
	for i, e := range es {
		ids[i] = e.Event.ID
	}
	return ids
}

func sequences(es []registry.StoredEvent) []uint64 {
	s := make([]uint64, len(es))
	for i, e := range es {
		s[i] = e.Sequence
	}
	return s
}

// sameJSON reports whether a and b are equal JSON values.
func sameJSON(a, b json.RawMessage) bool {
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// checkStored fails unless got is event e of batch b stored at seq.
func (f *fx) checkStored(got registry.StoredEvent, b *registry.EventBatch, e aip.Event, seq uint64) {
	f.t.Helper()
	want := registry.StoredEvent{Sequence: seq, TenantID: b.TenantID, InstanceID: b.InstanceID, ReplicaID: b.ReplicaID,
		VersionID: b.VersionID, ChannelID: b.ChannelID, Event: e, ReceivedAt: b.ReceivedAt}
	gd, wd := got.Event.Data, registry.EventData(&e)
	got.Event.Data, want.Event.Data = nil, nil
	if !got.ReceivedAt.Equal(want.ReceivedAt) {
		f.t.Fatalf("event %s: received at %s, want %s", e.ID, got.ReceivedAt, want.ReceivedAt)
	}
	got.ReceivedAt = want.ReceivedAt
	if !got.Event.OccurredAt.Equal(want.Event.OccurredAt.Time) {
		f.t.Fatalf("event %s: occurred at %s, want %s", e.ID, got.Event.OccurredAt, want.Event.OccurredAt)
	}
	got.Event.OccurredAt = want.Event.OccurredAt
	if !reflect.DeepEqual(got, want) {
		f.t.Fatalf("stored event:\ngot  %+v\nwant %+v", got, want)
	}
	if !sameJSON(gd, wd) {
		f.t.Fatalf("event %s: data %s, want %s", e.ID, gd, wd)
	}
}

func testEventSequences(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	b1 := EventBatch("tenant-1", "a", "evt_1", "evt_2", "evt_3")
	b1.Events[1].SessionID, b1.Events[1].ActionID, b1.Events[1].CorrelationID = "sess-1", "act-1", "corr-1"
	b1.Events[2].Data = nil // stored as {}
	got := f.appendEvents(b1)
	for i, e := range b1.Events {
		f.checkStored(got[i], &b1, e, uint64(i+1))
	}
	if !sameJSON(got[2].Event.Data, json.RawMessage(`{}`)) {
		t.Fatalf("an event without data is stored with data %s, want {}", got[2].Event.Data)
	}
	// Another tenant's log starts at 1, and may hold the same event IDs.
	f.clock.Advance(time.Second)
	b2 := EventBatch("tenant-2", "b", "evt_1", "evt_9")
	b2.ReceivedAt = time.Time{} // the backend's clock
	got = f.appendEvents(b2)
	if s := sequences(got); !reflect.DeepEqual(s, []uint64{1, 2}) {
		t.Fatalf("tenant-2's first events got sequences %v, want [1 2]", s)
	}
	if !got[0].ReceivedAt.Equal(f.clock.Now()) {
		t.Fatalf("a batch without ReceivedAt is stored as received at %s, want the backend's clock %s", got[0].ReceivedAt, f.clock.Now())
	}
	// tenant-1 continues where it stopped.
	b3 := EventBatch("tenant-1", "a", "evt_4")
	got = f.appendEvents(b3)
	f.checkStored(got[0], &b3, b3.Events[0], 4)

	log1 := f.eventLog("tenant-1")
	if ids := eventIDs(log1); !reflect.DeepEqual(ids, []string{"evt_1", "evt_2", "evt_3", "evt_4"}) {
		t.Fatalf("tenant-1's log holds %v", ids)
	}
	for i, e := range b1.Events {
		f.checkStored(log1[i], &b1, e, uint64(i+1))
	}
	if ids := eventIDs(f.eventLog("tenant-2")); !reflect.DeepEqual(ids, []string{"evt_1", "evt_9"}) {
		t.Fatalf("tenant-2's log holds %v", ids)
	}
	if n := len(f.eventLog("tenant-3")); n != 0 {
		t.Fatalf("a tenant without events has %d", n)
	}
}

func testEventRedelivery(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	first := EventBatch("tenant-1", "a", "evt_1", "evt_2")
	stored := f.appendEvents(first)

	// The same events again, from another replica and version of the same
	// instance under another lease, data keys in another order and numbers
	// in another form, alongside a new event: the known ones are returned as
	// stored, the new one appended.
	f.clock.Advance(time.Minute)
	again := EventBatch("tenant-1", "b", "evt_3", "evt_2", "evt_1")
	again.VersionID, again.LeaseSequence, again.ReceivedAt = "cver_2", 99, f.clock.Now()
	again.Events[1].Data = json.RawMessage(`{"tags":["a","b"],"n":15e-1,"id":"evt_2","aip_connector":{"lease_sequence":99,"version_id":"cver_2","replica_id":"crep_b","channel_id":"webhooks","instance_id":"cinst_tenant-1"}}`)
	again.Events[2].Data = eventData(&again, map[string]any{"id": "evt_1", "n": 1.5, "tags": []string{"a", "b"}})
	got := f.appendEvents(again)
	if s := sequences(got); !reflect.DeepEqual(s, []uint64{3, 2, 1}) {
		t.Fatalf("a batch of one new and two redelivered events got sequences %v, want [3 2 1]", s)
	}
	f.checkStored(got[1], &first, first.Events[1], 2) // first provenance kept
	f.checkStored(got[2], &first, first.Events[0], 1)
	f.checkStored(got[0], &again, again.Events[0], 3)

	// A batch that holds only redeliveries stores nothing.
	got = f.appendEvents(EventBatch("tenant-1", "a", "evt_1"))
	f.checkStored(got[0], &first, first.Events[0], 1)
	log := f.eventLog("tenant-1")
	if ids := eventIDs(log); !reflect.DeepEqual(ids, []string{"evt_1", "evt_2", "evt_3"}) {
		t.Fatalf("after redeliveries the log holds %v, want each event once", ids)
	}
	f.checkStored(log[0], &first, stored[0].Event, 1)
	if next := f.appendEvents(EventBatch("tenant-1", "a", "evt_4")); next[0].Sequence != 4 {
		t.Fatalf("the event after redeliveries got sequence %d, want 4 (redeliveries use no sequence)", next[0].Sequence)
	}
}

// eventChanges change the second event of EventBatch("tenant-1", "b",
// "evt_new", "evt_1") so that it is no redelivery of
// EventBatch("tenant-1", "a", "evt_1")'s event, each in the field named.
var eventChanges = []struct {
	name, field string
	change      func(b *registry.EventBatch)
}{
	{"kind", "kind", func(b *registry.EventBatch) { b.Events[1].Kind = "other.thing" }},
	{"occurred_at", "occurred_at", func(b *registry.EventBatch) { b.Events[1].OccurredAt = aip.At(Epoch) }},
	{"session", "session_id", func(b *registry.EventBatch) { b.Events[1].SessionID = "sess-2" }},
	{"action", "action_id", func(b *registry.EventBatch) { b.Events[1].ActionID = "act-2" }},
	{"correlation", "correlation_id", func(b *registry.EventBatch) { b.Events[1].CorrelationID = "corr-2" }},
	{"data", "data", func(b *registry.EventBatch) {
		b.Events[1].Data = eventData(b, map[string]any{"id": "evt_1", "n": 2, "tags": []string{"a", "b"}})
	}},
	{"data string for number", "data", func(b *registry.EventBatch) {
		b.Events[1].Data = eventData(b, map[string]any{"id": "evt_1", "n": "1.5", "tags": []string{"a", "b"}})
	}},
	{"provenance instance", "data", func(b *registry.EventBatch) {
		b.Events[1].Data = json.RawMessage(strings.Replace(string(b.Events[1].Data), `"instance_id":"cinst_tenant-1"`, `"instance_id":"cinst_x"`, 1))
	}},
	{"channel", "channel_id", func(b *registry.EventBatch) { b.ChannelID = "other" }},
	{"instance", "instance_id", func(b *registry.EventBatch) { b.InstanceID = "cinst_other" }},
}

func testEventConflict(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	base := EventBatch("tenant-1", "a", "evt_1")
	f.appendEvents(base)
	for _, c := range eventChanges {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			// A new event first, then the conflicting one: nothing is stored.
			b := EventBatch("tenant-1", "b", "evt_new", "evt_1")
			c.change(&b)
			_, err := f.events().AppendEvents(f.ctx, b)
			f.wantErr(err, registry.ErrConflict, "an event ID reused for a different "+c.name)
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.ID != "evt_1" || fe.Field != c.field {
				t.Fatalf("the conflict %v does not name event evt_1 and field %s", err, c.field)
			}
			if ids := eventIDs(f.eventLog("tenant-1")); !reflect.DeepEqual(ids, []string{"evt_1"}) {
				t.Fatalf("a conflicting batch stored events: the log holds %v", ids)
			}
		})
	}
	f.t = t
	if got := f.appendEvents(EventBatch("tenant-1", "a", "evt_new")); got[0].Sequence != 2 {
		t.Fatalf("after refused batches the next event got sequence %d, want 2", got[0].Sequence)
	}
}

func testEventInvalid(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	many := make([]string, aip.MaxEventsPerDelivery+1)
	for i := range many {
		many[i] = fmt.Sprintf("evt_%d", i)
	}
	full := EventBatch("tenant-1", "a", many[:aip.MaxEventsPerDelivery]...)
	if got := f.appendEvents(full); got[len(got)-1].Sequence != aip.MaxEventsPerDelivery {
		t.Fatalf("a full batch ends at sequence %d", got[len(got)-1].Sequence)
	}
	for _, c := range []struct {
		name, field string
		change      func(b *registry.EventBatch)
	}{
		{"no tenant", "tenant_id", func(b *registry.EventBatch) { b.TenantID = "" }},
		{"no instance", "instance_id", func(b *registry.EventBatch) { b.InstanceID = "" }},
		{"no replica", "replica_id", func(b *registry.EventBatch) { b.ReplicaID = "" }},
		{"no channel", "channel_id", func(b *registry.EventBatch) { b.ChannelID = "" }},
		{"long channel", "channel_id", func(b *registry.EventBatch) { b.ChannelID = strings.Repeat("c", registry.MaxIdentifierBytes+1) }},
		{"no events", "events", func(b *registry.EventBatch) { b.Events = nil }},
		{"too many events", "events", func(b *registry.EventBatch) { *b = EventBatch("tenant-1", "a", many...) }},
		{"event without ID", "events[1].id", func(b *registry.EventBatch) { b.Events[1].ID = "" }},
		{"event ID twice", "events[2].id", func(b *registry.EventBatch) { b.Events[2].ID = b.Events[0].ID }},
		{"event ID already stored, twice", "events[2].id", func(b *registry.EventBatch) { b.Events[0].ID, b.Events[2].ID = "evt_0", "evt_0" }},
		{"event without kind", "kind", func(b *registry.EventBatch) { b.Events[1].Kind = "" }},
		{"event with a long kind", "kind", func(b *registry.EventBatch) { b.Events[1].Kind = strings.Repeat("k", registry.MaxEventKindBytes+1) }},
		{"event without occurred_at", "occurred_at", func(b *registry.EventBatch) { b.Events[1].OccurredAt = aip.Timestamp{} }},
		// RFC 3339 has no form for it: PostgreSQL refused it as a bare
		// ErrInvalid and memregistry stored it (and then could not write
		// a snapshot).
		{"occurred_at after year 9999", "occurred_at", func(b *registry.EventBatch) {
			b.Events[1].OccurredAt = aip.At(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))
		}},
		{"occurred_at before year 0", "occurred_at", func(b *registry.EventBatch) {
			b.Events[1].OccurredAt = aip.At(time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC))
		}},
		{"data not an object", "data", func(b *registry.EventBatch) { b.Events[1].Data = json.RawMessage(`[1]`) }},
		{"data not JSON", "data", func(b *registry.EventBatch) { b.Events[1].Data = json.RawMessage(`{"a":`) }},
		{"data null", "data", func(b *registry.EventBatch) { b.Events[1].Data = json.RawMessage(`null`) }},
		{"data with NUL", "data", func(b *registry.EventBatch) { b.Events[1].Data = json.RawMessage(`{"a":{"b":["x\u0000y"]}}`) }},
		{"data not UTF-8", "data", func(b *registry.EventBatch) { b.Events[1].Data = json.RawMessage("{\"a\":\"\xff\"}") }},
		// Deeper than a signed delivery can carry (PostgreSQL's digest of
		// a pruned event walks it recursively; 600 levels exhausted its
		// stack and stopped retention for every tenant).
		{"data nested too deep", "data", func(b *registry.EventBatch) {
			b.Events[1].Data = json.RawMessage(`{"a":` + strings.Repeat("[", registry.MaxEventDataDepth) + `1.0` + strings.Repeat("]", registry.MaxEventDataDepth) + `}`)
		}},
		{"kind with NUL", "kind", func(b *registry.EventBatch) { b.Events[1].Kind = "a\x00b" }},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			b := EventBatch("tenant-1", "a", "evt_x1", "evt_x2", "evt_x3")
			c.change(&b)
			_, err := f.events().AppendEvents(f.ctx, b)
			f.wantField(err, registry.ErrInvalid, c.field, c.name)
			if n := len(f.eventLog("tenant-1")); n != aip.MaxEventsPerDelivery {
				t.Fatalf("an invalid batch changed the log: %d events, want %d", n, aip.MaxEventsPerDelivery)
			}
		})
	}
}

// testEventDataEscapes: a \u escape of a lone UTF-16 surrogate (PostgreSQL's
// jsonb refuses it, Go's decoder reads U+FFFD) is refused by every backend
// before anything is stored; surrogate pairs and a backslash before "u" are
// stored. (memregistry stored {"a":"\ud800"}, pgregistry failed on it with
// ErrStorage.)
func testEventDataEscapes(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	for i, data := range []string{`{"a":"\\ud800","b":"\\\ud83d\ude00"}`, `{"\uD83D\uDE00":"x\ud83d\ude00y","c":"\u00e9\n\\"}`} {
		b := EventBatch("tenant-1", "a", fmt.Sprintf("evt_ok%d", i))
		b.Events[0].Data = json.RawMessage(data)
		if _, err := f.events().AppendEvents(f.ctx, b); err != nil {
			t.Fatalf("data %s: %v", data, err)
		}
	}
	for _, data := range []string{`{"a":"\ud800"}`, `{"a":"x\udc00"}`, `{"\uDBFF":1}`, `{"a":"\ud800\u0041"}`, `{"a":"\ud800\ud800"}`,
		`{"a":"\udc00\ud800"}`, `{"a":["\\\ud800"]}`, `{"a":"\ud83d\ude00\ud83d"}`} {
		t.Run(data, func(t *testing.T) {
			f.t = t
			b := EventBatch("tenant-1", "a", "evt_x1", "evt_x2", "evt_x3")
			b.Events[1].Data = json.RawMessage(data)
			_, err := f.events().AppendEvents(f.ctx, b)
			f.wantField(err, registry.ErrInvalid, "data", "data "+data)
			if n := len(f.eventLog("tenant-1")); n != 2 {
				t.Fatalf("a refused batch changed the log: %d events, want 2", n)
			}
		})
	}
}

// EventDataNumbers are JSON numbers at the edges of what an event's data
// may hold: those PostgreSQL's numeric (jsonb's numbers) holds, which every
// backend stores, and those it refuses ("value overflows numeric format"),
// which every backend refuses (registry.EventBatch.Validate). Written out,
// a number has at most 131072 digits before the decimal point and 16383
// after it (trailing zeros count), and no exponent reaches 1073741823.
var EventDataNumbers = struct{ Fit, Refused []string }{
	Fit: []string{
		"1e131071", "9.99e131071", "-9.99E+131071", "0.1e131072", "0.0001e131075", "1" + strings.Repeat("0", 131071),
		"1" + strings.Repeat("0", 131071) + ".5", "1e-16383", "-1e-16383", "0e-16383", "1." + strings.Repeat("0", 16383),
		"0." + strings.Repeat("0", 16382) + "1", "123.456e-16380", "1.5e-16382", "0e131072", "-0e1073741822", "1e-0000000000000000000001",
	},
	Refused: []string{
		"1e131072", "-1E+131072", "10e131071", "0.0001e131076", "1" + strings.Repeat("0", 131072), "1e1000000", "1e-16384",
		"-1e-16384", "0e-16384", "0.0e-16383", "1." + strings.Repeat("0", 16384), "0." + strings.Repeat("0", 16383) + "1",
		"1.5e-16383", "0e1073741823", "0e99999999999999999999", "1e-99999999999999999999",
	},
}

// testEventDataNumbers: a number in an event's data is stored by every
// backend exactly when PostgreSQL's numeric holds it; a batch with one it
// does not hold is refused before anything is stored, naming the event
// and the number's path. (memregistry stored 1e131072 or 1e-16384, and
// pgregistry failed on them with ErrStorage, which the dispatcher answers
// as unavailable: the host delivered the batch again forever.)
func testEventDataNumbers(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	data := func(n string) json.RawMessage { return json.RawMessage(`{"s":"1e999999","a":{"b":[1,` + n + `]}}`) }
	stored := 0
	for i, n := range append(EventDataNumbers.Fit, `1,"\"1e1000000\\",{"k\"1e-16384":0e-16383}`) {
		b := EventBatch("tenant-1", "a", fmt.Sprintf("evt_fit%d", i))
		b.Events[0].Data = data(n)
		got, err := f.events().AppendEvents(f.ctx, b)
		if err != nil {
			t.Fatalf("data %.80s (%d characters): %v; PostgreSQL's numeric holds its numbers", b.Events[0].Data, len(b.Events[0].Data), err)
		}
		stored++
		// Delivered again, it is the same event, however the backend
		// writes the number back.
		if again, err := f.events().AppendEvents(f.ctx, b); err != nil || again[0].Sequence != got[0].Sequence {
			t.Fatalf("data %.80s delivered again: %v, %v; want the event stored at %d", b.Events[0].Data, again, err, got[0].Sequence)
		}
	}
	for _, c := range []struct {
		name, data, field string
	}{
		{"nested", `{"a":{"b":[1,%s]}}`, "data.a.b[1]"},
		{"odd member names", `{"x y":[{"é":{"":[[%s]]}}],"n":1e999999}`, `data["x y"][0]["é"][""][0][0]`},
		{"after other members", `{"s":"1e1000000","n":1,"o":{"p":[{},[],null,true,"x",2]},"aip":%s}`, "data.aip"},
	} {
		for _, n := range EventDataNumbers.Refused {
			t.Run(fmt.Sprintf("%s/%.24s", c.name, n), func(t *testing.T) {
				f.t = t
				b := EventBatch("tenant-1", "a", "evt_x1", "evt_x2", "evt_x3")
				b.Events[1].Data = json.RawMessage(strings.Replace(c.data, "%s", n, 1))
				_, err := f.events().AppendEvents(f.ctx, b)
				f.wantField(err, registry.ErrInvalid, c.field, "data with "+n[:min(len(n), 40)])
				var fe *registry.FieldError
				if errors.As(err, &fe); fe.Record != registry.RecordEvent || fe.ID != "evt_x2" || !strings.Contains(fe.Reason, "send it as a string") {
					t.Fatalf("the refusal %v does not name event evt_x2 and what to do", err)
				}
				if n := len(f.eventLog("tenant-1")); n != stored {
					t.Fatalf("a refused batch changed the log: %d events, want %d", n, stored)
				}
			})
		}
	}
	f.t = t
	if got := f.eventLog("tenant-1"); len(got) != stored {
		t.Fatalf("the log holds %d events, want the %d that fit", len(got), stored)
	}
}

// testEventDataAsStored: an event's data reads back byte for byte as it
// was stored (the first delivery's answer, a redelivery's, a page of the
// log), whatever its numbers, member order, spacing and characters; only
// the JSON whitespace around it is dropped. The dispatcher stores data in
// canonical AIP JSON, whose numbers are doubles (1e308, 1.5e-300) or
// integers as sent. (pgregistry returned its jsonb's writing: 1e308 as 309
// digits, 1e131071 as 131072, members reordered, spaces added.)
func testEventDataAsStored(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	cases := []struct{ data, want string }{
		{`{"n":1e308}`, ""},
		{`{"a":[1e308,-1.7976931348623157e308,1.5e-300,5e-324,123456789012345678,18446744073709551615,-9223372036854775808],"b":1e16,"c":100.0,"d":0.1}`, ""},
		{`{"zz":1.5e-7,"a":{"yy":1E+2,"b":15e-1,"c":1.50},"m":"<&>\u00e9é"}`, ""},
		{`{"n":1e131071,"m":1e-16383,"k":0.` + strings.Repeat("0", 300) + `1}`, ""},
		{`{ "a" : [ 1e308 , 2 ] ,"b":{}}`, ""},
		{" \n\t{\"a\":1e308}\r\n ", `{"a":1e308}`},
	}
	b := EventBatch("tenant-1", "a")
	for i, c := range cases {
		b.Events = append(b.Events, aip.Event{ID: fmt.Sprintf("evt_n%d", i), Kind: "thing.happened", OccurredAt: aip.At(Epoch), Data: json.RawMessage(c.data)})
		if c.want == "" {
			cases[i].want = c.data
		}
	}
	check := func(what string, got []registry.StoredEvent) {
		t.Helper()
		if len(got) != len(cases) {
			t.Fatalf("%s: %d events, want %d", what, len(got), len(cases))
		}
		for i, e := range got {
			if string(e.Event.Data) != cases[i].want {
				t.Fatalf("%s: event %s has data %.200s (%d bytes), want %s as stored", what, e.Event.ID, e.Event.Data, len(e.Event.Data), cases[i].want)
			}
		}
	}
	check("AppendEvents", f.appendEvents(b))
	check("AppendEvents delivering them again", f.appendEvents(b))
	check("Events", f.eventLog("tenant-1"))
}

// testEventDataSizeAsStored: events as large as a delivery may hold
// (aip.MaxEventBytes each), their data full of numbers, read back no
// larger, so a page of n of them holds at most n × aip.MaxEventBytes: the
// dispatcher's GET /aip/v1/events stops a page before its data pass its
// byte bound and so passes it by one event at most, and a delivery's
// answer lists the events as stored. (pgregistry read such an event back
// some fifty times larger: 1e308 as 309 digits.)
func testEventDataSizeAsStored(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	const n = 4
	b := EventBatch("tenant-1", "a")
	for i := range n {
		e := aip.Event{ID: fmt.Sprintf("evt_big%d", i), Kind: "thing.happened", OccurredAt: aip.At(Epoch)}
		nums := []string{"1e308", "1.5e-300", "123456789012345678"}
		var data strings.Builder
		data.WriteString(`{"n":[`)
		for j := 0; ; j++ {
			if j > 0 {
				data.WriteByte(',')
			}
			data.WriteString(nums[j%len(nums)])
			if data.Len() > aip.MaxEventBytes-512 {
				break
			}
		}
		data.WriteString(`]}`)
		e.Data = json.RawMessage(data.String())
		if raw, _ := json.Marshal(e); len(raw) > aip.MaxEventBytes {
			t.Fatalf("the test's event is %d bytes, more than aip.MaxEventBytes", len(raw))
		}
		b.Events = append(b.Events, e)
	}
	stored := 0
	for _, e := range b.Events {
		stored += len(e.Data)
	}
	check := func(what string, got []registry.StoredEvent) {
		t.Helper()
		read := 0
		for _, e := range got {
			raw, err := json.Marshal(e.Event)
			f.must(err)
			if len(raw) > aip.MaxEventBytes {
				t.Fatalf("%s: event %s reads back as %d bytes, more than aip.MaxEventBytes (%d) it was stored within", what, e.Event.ID, len(raw), aip.MaxEventBytes)
			}
			read += len(e.Event.Data)
		}
		if len(got) != n || read != stored {
			t.Fatalf("%s: %d events with %d bytes of data, want %d with the %d bytes stored", what, len(got), read, n, stored)
		}
	}
	check("AppendEvents", f.appendEvents(b))
	check("AppendEvents delivering them again", f.appendEvents(b))
	p, err := f.events().Events(f.ctx, "tenant-1", 0, n)
	f.must(err)
	check("Events", p.Events)
}

func testEventPaging(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	const total = registry.MaxEventPage + 50
	for start := 0; start < total; start += aip.MaxEventsPerDelivery {
		ids := make([]string, 0, aip.MaxEventsPerDelivery)
		for i := start; i < min(start+aip.MaxEventsPerDelivery, total); i++ {
			ids = append(ids, fmt.Sprintf("evt_%04d", i))
		}
		f.appendEvents(EventBatch("tenant-1", "a", ids...))
	}
	f.appendEvents(EventBatch("tenant-2", "a", "evt_other"))
	page := func(tenant string, after uint64, limit int) registry.EventPage {
		t.Helper()
		p, err := f.events().Events(f.ctx, tenant, after, limit)
		f.must(err)
		return p
	}
	for _, c := range []struct {
		after      uint64
		limit      int
		first, n   int
		more       bool
		tenantName string
	}{
		{0, 10, 1, 10, true, "tenant-1"},
		{10, 10, 11, 10, true, "tenant-1"},
		{total - 5, 10, total - 4, 5, false, "tenant-1"},
		{total - 5, 5, total - 4, 5, false, "tenant-1"},
		{total - 6, 5, total - 5, 5, true, "tenant-1"},
		{total, 10, 0, 0, false, "tenant-1"},
		{total + 100, 10, 0, 0, false, "tenant-1"},
		{math.MaxInt64, 10, 0, 0, false, "tenant-1"},
		{math.MaxInt64 + 1, 10, 0, 0, false, "tenant-1"},
		{math.MaxUint64, 10, 0, 0, false, "tenant-1"},
		{0, 0, 1, 1, true, "tenant-1"},
		{3, -7, 4, 1, true, "tenant-1"},
		{0, registry.MaxEventPage * 10, 1, registry.MaxEventPage, true, "tenant-1"},
		{0, 10, 1, 1, false, "tenant-2"},
		{1, 10, 0, 0, false, "tenant-2"},
		{0, 10, 0, 0, false, "tenant-3"},
	} {
		p := page(c.tenantName, c.after, c.limit)
		if want := map[string]uint64{"tenant-1": total, "tenant-2": 1}[c.tenantName]; p.Last != want {
			t.Fatalf("Events(%s, after %d, limit %d): last %d, want the log's last sequence %d", c.tenantName, c.after, c.limit, p.Last, want)
		}
		if len(p.Events) != c.n || p.More != c.more {
			t.Fatalf("Events(%s, after %d, limit %d): %d events, more %v; want %d, more %v", c.tenantName, c.after, c.limit, len(p.Events), p.More, c.n, c.more)
		}
		for i, e := range p.Events {
			if e.Sequence != uint64(c.first+i) || e.TenantID != c.tenantName {
				t.Fatalf("Events(%s, after %d, limit %d)[%d]: sequence %d of %s, want %d of %s", c.tenantName, c.after, c.limit, i, e.Sequence, e.TenantID, c.first+i, c.tenantName)
			}
		}
	}
	if got := page("tenant-1", 41, 1); got.Events[0].Event.ID != "evt_0041" {
		t.Fatalf("sequence 42 holds %s, want evt_0041 (append order)", got.Events[0].Event.ID)
	}
}

// testEventConcurrency: writers appending to one tenant at once get
// distinct sequences without gaps and lose no event, and a reader paging
// by sequence meanwhile sees every event exactly once, in order: no event
// commits behind a position the reader has passed.
func testEventConcurrency(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	const writers, batches, per = 6, 8, 5
	const total = writers * batches * per
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	results := make([][]registry.StoredEvent, writers)
	// The reader reads each time a writer has appended a batch (while the
	// others may be appending), and once more after all have finished.
	appended := make(chan struct{}, writers*batches)
	done := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for n := range batches {
				ids := make([]string, per)
				for i := range ids {
					ids[i] = fmt.Sprintf("evt_w%d_b%d_%d", w, n, i)
				}
				got, err := f.events().AppendEvents(f.ctx, EventBatch("tenant-1", fmt.Sprint(w), ids...))
				if err != nil {
					errs <- fmt.Errorf("writer %d: %w", w, err)
					return
				}
				results[w] = append(results[w], got...)
				appended <- struct{}{}
			}
		})
	}
	var reader sync.WaitGroup
	reader.Go(func() {
		var after uint64
		finished := false
		for after < total {
			if !finished {
				select {
				case <-appended:
				case <-done:
					finished = true
				}
			}
			for {
				p, err := f.events().Events(f.ctx, "tenant-1", after, 7)
				if err != nil {
					errs <- fmt.Errorf("reader: %w", err)
					return
				}
				for _, e := range p.Events {
					if e.Sequence != after+1 {
						errs <- fmt.Errorf("reader: sequence %d after %d: an event it passed committed later, or a gap", e.Sequence, after)
						return
					}
					after = e.Sequence
				}
				if !p.More {
					break
				}
			}
			if finished && after < total {
				errs <- fmt.Errorf("reader: saw %d of %d events after every writer finished", after, total)
				return
			}
		}
	})
	wg.Wait()
	close(done)
	reader.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[uint64]string{}
	for _, rs := range results {
		for _, e := range rs {
			if other, dup := seen[e.Sequence]; dup {
				t.Fatalf("sequence %d given to %s and %s", e.Sequence, other, e.Event.ID)
			}
			seen[e.Sequence] = e.Event.ID
		}
	}
	log := f.eventLog("tenant-1")
	if len(log) != total || len(seen) != total {
		t.Fatalf("%d events appended concurrently: the log holds %d, the writers were given %d sequences", total, len(log), len(seen))
	}
	for _, e := range log {
		if seen[e.Sequence] != e.Event.ID {
			t.Fatalf("sequence %d holds %s, but its writer was told %s", e.Sequence, e.Event.ID, seen[e.Sequence])
		}
	}
}

// testEventConcurrentRedelivery: two replicas delivering the same batch at
// once store it once and both learn the same sequences.
func testEventConcurrentRedelivery(t *testing.T, nb NewBackend) {
	f := newFx(t, nb)
	const rounds = 10
	for n := range rounds {
		ids := []string{fmt.Sprintf("evt_%d_a", n), fmt.Sprintf("evt_%d_b", n)}
		var wg sync.WaitGroup
		got := make([][]registry.StoredEvent, 2)
		errs := make([]error, 2)
		for r := range 2 {
			wg.Go(func() {
				got[r], errs[r] = f.events().AppendEvents(f.ctx, EventBatch("tenant-1", fmt.Sprint(r), ids...))
			})
		}
		wg.Wait()
		f.must(errors.Join(errs...))
		if a, b := sequences(got[0]), sequences(got[1]); !reflect.DeepEqual(a, b) {
			t.Fatalf("round %d: concurrent deliveries of one batch got sequences %v and %v", n, a, b)
		}
	}
	if n := len(f.eventLog("tenant-1")); n != 2*rounds {
		t.Fatalf("the log holds %d events, want %d (each once)", n, 2*rounds)
	}
}

// prunedForms are pairs of an event's data as first delivered and as
// delivered again, in forms a sender, a store or a proxy may write the
// same JSON value in, or a different value close to it. same is what
// registry.CheckRedelivery decides (checked against it too).
var prunedForms = []struct {
	name        string
	first, next string
	same        bool
}{
	{"integer and fraction", `{"n":1}`, `{"n":1.0}`, true},
	{"integer and exponent", `{"n":1}`, `{"n":1e0}`, true},
	{"exponent with sign", `{"n":100}`, `{"n":1E+2}`, true},
	{"fraction and exponent", `{"n":0.1}`, `{"n":1e-1}`, true},
	{"trailing zeros", `{"n":1.10}`, `{"n":1.1000}`, true},
	{"negative zero", `{"n":0}`, `{"n":-0}`, true},
	{"negative zero fraction", `{"n":0.0}`, `{"n":-0.0}`, true},
	{"big integer and fraction", `{"n":123456789012345678901234567890}`, `{"n":123456789012345678901234567890.000}`, true},
	{"big integers one apart", `{"n":9007199254740993}`, `{"n":9007199254740992}`, false},
	{"huge exponent", `{"n":1e400}`, `{"n":10E+399}`, true},
	{"tiny fractions apart", `{"n":1e-30}`, `{"n":1.0000000000000000000000000001e-30}`, false},
	{"number and string", `{"n":1.50}`, `{"n":"1.50"}`, false},
	{"string with a fraction", `{"s":"1.50"}`, `{"s":"1.5"}`, false},
	{"escape and character", `{"s":"é😀<&/"}`, `{"s":"\u00e9\ud83d\ude00\u003c\u0026\/"}`, true},
	{"escaped key", `{"a":1}`, `{"\u0061":1}`, true},
	{"key order", `{"a":1,"b":{"c":[1,2],"d":null}}`, `{"b":{"d":null,"c":[1,2]},"a":1}`, true},
	{"nested arrays", `{"a":[[1,[2.0,[]]],{"x":[3e0]}]}`, `{"a":[[1.0,[2,[]]],{"x":[3]}]}`, true},
	{"nested array order", `{"a":[[1,2]]}`, `{"a":[[2,1]]}`, false},
	{"empty array and object", `{"a":[]}`, `{"a":{}}`, false},
	{"null and absent", `{"a":null}`, `{}`, false},
	{"duplicate keys", `{"a":1,"a":2}`, `{"a":2}`, true},
	{"provenance not an object", `{"aip_connector":"x"}`, `{"aip_connector":"x"}`, true},
	{"provenance channel", `{"aip_connector":{"channel_id":"a","replica_id":"r1"}}`, `{"aip_connector":{"channel_id":"b","replica_id":"r2"}}`, false},
	// As deep as a delivery through the dispatcher can nest data (aip.Canonicalize
	// bounds the envelope to 256 levels).
	{"deep nesting", `{"a":` + strings.Repeat("[", registry.MaxEventDataDepth-1) + `1.0` + strings.Repeat("]", registry.MaxEventDataDepth-1) + `}`,
		`{"a":` + strings.Repeat("[", registry.MaxEventDataDepth-1) + `1` + strings.Repeat("]", registry.MaxEventDataDepth-1) + `}`, true},
	{"provenance replica only", `{"aip_connector":{"channel_id":"a","replica_id":"r1","lease_sequence":1.0}}`, `{"aip_connector":{"channel_id":"a","replica_id":"r2","lease_sequence":2}}`, true},
}

// testEventPrunedForms: for each of prunedForms, an event delivered again
// under a pruned ID is answered as the backend answers it while the event
// is stored, and as CheckRedelivery decides: Pruned when it is the same
// event, ErrConflict when it is not, whatever form its JSON is written in
// (the backend's digest of the pruned event and of the delivery agree
// exactly with CheckRedelivery).
func testEventPrunedForms(t *testing.T, nb NewBackend) {
	f, p := newPrunerFx(t, nb)
	batch := func(tenant, data string) registry.EventBatch {
		b := receivedAt(EventBatch(tenant, "a", "evt_1"), time.Minute)
		b.Events[0].Data = json.RawMessage(data)
		return b
	}
	for i, c := range prunedForms {
		first, next := batch(fmt.Sprintf("tf-%d", i), c.first), batch(fmt.Sprintf("tf-%d", i), c.next)
		stored := registry.StoredEvent{InstanceID: first.InstanceID, ChannelID: first.ChannelID, Event: registry.StoredForm(first.Events[0])}
		if got := registry.CheckRedelivery(&stored, &next, &next.Events[0]) == nil; got != c.same {
			t.Fatalf("%s: CheckRedelivery finds a redelivery %v, the table says %v", c.name, got, c.same)
		}
		f.appendEvents(first)
	}
	if _, err := p.PruneEvents(f.ctx, Epoch.Add(time.Hour), 1000); err != nil {
		t.Fatalf("PruneEvents: %v", err)
	}
	for i, c := range prunedForms {
		t.Run(c.name, func(t *testing.T) {
			next := batch(fmt.Sprintf("tf-%d", i), c.next)
			next.ReceivedAt = Epoch.Add(2 * time.Hour)
			got, err := f.events().AppendEvents(f.ctx, next)
			switch {
			case c.same && (err != nil || !got[0].Pruned):
				t.Fatalf("%s then %s under the pruned ID: %+v, %v; want it answered Pruned", c.first, c.next, got, err)
			case !c.same && !errors.Is(err, registry.ErrConflict):
				t.Fatalf("%s then %s under the pruned ID: %+v, %v; want ErrConflict", c.first, c.next, got, err)
			}
		})
	}
}

// testEventFirstConflictNamed: a batch with several conflicting events is
// refused naming the first of them in the batch's order, whether it
// conflicts with a stored event or a pruned one. (pgregistry checked the
// pruned events' digests only after every stored event, so it named a
// later stored conflict where memregistry named the earlier pruned one.)
func testEventFirstConflictNamed(t *testing.T, nb NewBackend) {
	f, p := newPrunerFx(t, nb)
	f.appendEvents(receivedAt(EventBatch("tenant-1", "a", "evt_pruned"), time.Minute))
	if n, err := p.PruneEvents(f.ctx, Epoch.Add(time.Hour), 10); err != nil || n != 1 {
		t.Fatalf("PruneEvents = %d, %v; want 1", n, err)
	}
	f.appendEvents(receivedAt(EventBatch("tenant-1", "a", "evt_stored"), 2*time.Hour))
	for _, c := range []struct {
		name  string
		ids   []string
		first string
	}{
		{"pruned first", []string{"evt_new", "evt_pruned", "evt_stored"}, "evt_pruned"},
		{"stored first", []string{"evt_new", "evt_stored", "evt_pruned"}, "evt_stored"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.t = t
			b := receivedAt(EventBatch("tenant-1", "b", c.ids...), 3*time.Hour)
			for i := range b.Events {
				b.Events[i].Kind = "thing.changed"
			}
			_, err := f.events().AppendEvents(f.ctx, b)
			f.wantErr(err, registry.ErrConflict, "a batch of a new event and two conflicting ones")
			var fe *registry.FieldError
			if !errors.As(err, &fe) || fe.ID != c.first {
				t.Fatalf("the batch %v is refused with %v; want the conflict of its first conflicting event, %s", c.ids, err, c.first)
			}
			page, err := f.events().Events(f.ctx, "tenant-1", 0, 10)
			f.must(err)
			if len(page.Events) != 1 || page.Events[0].Event.ID != "evt_stored" {
				t.Fatalf("a conflicting batch changed the log: it holds %v, want [evt_stored]", eventIDs(page.Events))
			}
		})
	}
}
