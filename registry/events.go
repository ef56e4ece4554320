package registry

import (
	"context"
	"time"

	"github.com/aipfleet/aipfleet/aip"
)

// EventBatch is one verified event delivery from a replica (the
// dispatcher's connector-event ingress has checked the sender, its lease,
// its instance, version and channel): the events to append to the tenant's
// event log, with their provenance.
type EventBatch struct {
	TenantID   string
	InstanceID string
	ReplicaID  string
	VersionID  string
	ChannelID  string
	// LeaseSequence is the sender's lease sequence the delivery named.
	LeaseSequence uint64
	// Events are 1 to aip.MaxEventsPerDelivery events, each with an ID
	// (evt_...), a kind and occurred_at, data a JSON object.
	Events     []aip.Event
	ReceivedAt time.Time
}

// StoredEvent is an event in a tenant's event log.
type StoredEvent struct {
	// Sequence is the event's position in its tenant's log: from 1,
	// strictly increasing in the order events were appended, never reused.
	Sequence   uint64
	TenantID   string
	InstanceID string
	// ReplicaID and VersionID are the provenance of the delivery that
	// first stored the event.
	ReplicaID  string
	VersionID  string
	ChannelID  string
	Event      aip.Event
	ReceivedAt time.Time
	// Pruned is set only in AppendEvents' answer, on an event it did not
	// store because the tenant's log held it once and has pruned it
	// (EventPruner): a host delivering again an event delivered long ago.
	// Its Sequence is 0, ReceivedAt is when the log first received it,
	// and Event and the provenance are the redelivery's.
	Pruned bool
}

// EventPage is one page of a tenant's event log.
type EventPage struct {
	Events []StoredEvent
	// More is true when events after the last one returned exist.
	More bool
	// Last is the last sequence the tenant's log had given out when the
	// page was read (0 when it never stored an event; pruning never
	// lowers it). A reader's after beyond it is no sequence this log
	// gave out: a cursor of another log, or kept across a restore of the
	// registry, which would skip the events later stored up to it.
	Last uint64
}

// EventLog is the fleet's durable log of provider events, per tenant.
// memregistry and pgregistry implement it; registrytest holds both to the
// same behaviour.
type EventLog interface {
	// AppendEvents appends a batch to the tenant's log, atomically: all of
	// its new events or none. An event whose ID the tenant's log already
	// holds is not stored again: when its channel, instance, kind,
	// occurred_at, session, action, correlation and data are equal (a
	// redelivery, possibly from another replica or version of the same
	// instance) it counts as stored and the stored event is returned;
	// otherwise the whole batch fails with ErrConflict naming the event.
	// An event whose ID the tenant's log held and has pruned (EventPruner)
	// is not stored again either, until ForgetPrunedEvents forgets the ID:
	// it counts as stored and is returned with Pruned set when it is a
	// redelivery of the pruned event (its content is gone, but its
	// RedeliveryDigest is kept with the ID); otherwise the whole batch
	// fails with ErrConflict naming the event (PrunedConflict). An ID the
	// backend kept without a digest (pruned by a build that kept none) is
	// answered Pruned whatever the event holds. A batch that repeats an
	// event ID within itself is ErrInvalid. A batch with several
	// conflicting events fails naming the first of them in its order. It
	// returns the batch's events as stored, in the batch's order. An
	// event's data is stored, and read back by every method, byte for
	// byte as given (StoredForm: {} when absent, without the whitespace
	// around it), whatever the spelling of its numbers.
	AppendEvents(ctx context.Context, b EventBatch) ([]StoredEvent, error)
	// Events returns up to limit (clamped to 1..1000) of the tenant's events
	// with a sequence greater than after, in sequence order.
	Events(ctx context.Context, tenantID string, after uint64, limit int) (EventPage, error)
}

// EventPruner deletes old events and, later, the IDs it keeps of them: the
// event log's two retentions. The control plane's maintenance runs it (on
// PostgreSQL the lifecycle role may delete events, and read only their
// keys and receipt times, and delete the kept IDs; the data role may
// delete neither).
type EventPruner interface {
	// PruneEvents deletes up to limit events, of every tenant, received
	// before receivedBefore, oldest received first, and returns how many
	// it deleted. limit must be positive (ErrInvalid otherwise). A
	// tenant's sequences go on after its pruned events (a reader paging by
	// sequence goes on from the first event kept). The IDs of the events
	// it deletes are kept, with the RedeliveryDigest of their content,
	// until ForgetPrunedEvents forgets them (a host may deliver an event again
	// however late: its outbox keeps it until a delivery is answered), so
	// the same event delivered again is not stored a second time, and a
	// different one under the same ID is ErrConflict (AppendEvents).
	PruneEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error)
	// ForgetPrunedEvents forgets up to limit of the IDs PruneEvents kept,
	// of every tenant, of events received before receivedBefore, oldest
	// received first, and returns how many it forgot: their storage is
	// bounded by a second horizon, as PruneEvents bounds the events'. An
	// event whose ID was forgotten is unknown to the log: delivered again,
	// it is stored again as a new event (a second copy for readers that
	// read the first). limit must be positive and receivedBefore set
	// (ErrInvalid otherwise).
	ForgetPrunedEvents(ctx context.Context, receivedBefore time.Time, limit int) (int, error)
}

// MaxEventPage bounds EventLog.Events' limit.
const MaxEventPage = 1000
