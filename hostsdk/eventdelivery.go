package hostsdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
)

// Event delivery (Config.EventEndpoint): a loop claims due outbox batches,
// sends each as a signed aip.discovery.v1.event_stream_response envelope to
// the dispatcher's connector-event ingress, acks it once the dispatcher's
// signed answer verifies, and reschedules it with backoff otherwise (but a
// delivery refused only because a heartbeat renewed the lease after it was
// signed is signed again and sent at once, once: sendPart). A batch
// of several events the dispatcher refuses for its content is split in two
// (splitBatch) so one bad event does not hold its batch-mates back; a batch
// of one event refused for its content stays in the outbox, retried every
// eventRefusedRetry. A refusal the clocks explain (clockRefusal: this
// host's clock far from the dispatcher's) is no refusal of the content:
// the batch is retried whole with backoff, and logged once.
const (
	// eventClaimBatch bounds the batches claimed at once.
	eventClaimBatch = 16
	// eventClaimLease is how long a claimed batch is reserved for one
	// delivery attempt.
	eventClaimLease = 30 * time.Second
	// eventPollBase and eventPollJitter: without a publication, the loop
	// looks for due batches every 750 + rand(0..500) ms.
	eventPollBase   = 750 * time.Millisecond
	eventPollJitter = 500 * time.Millisecond
	// eventBackoffBase, eventBackoffMax and eventBackoffJitter: a failed
	// batch is retried after min(1000·2^min(attempts,6), 60000) +
	// rand(0..1000) ms; a permanent refusal of the sender
	// (connector_event.not_authorized) after the maximum.
	eventBackoffBase   = time.Second
	eventBackoffMax    = 60 * time.Second
	eventBackoffJitter = time.Second
	// eventRefusedRetry and eventRefusedJitter: a batch of one event the
	// dispatcher refuses permanently for its content is never dropped (an
	// operator may fix the cause, a dispatcher's limit for example) but is
	// retried only after eventRefusedRetry + rand(0..eventRefusedJitter),
	// each refusal counted in MetricEventsRefused and logged at error level.
	eventRefusedRetry  = time.Hour
	eventRefusedJitter = 5 * time.Minute
	// eventEnvelopeOverhead is reserved for the envelope around the events
	// when a batch is split to fit aip.MaxEventDeliveryBytes.
	eventEnvelopeOverhead = 16 << 10
	// eventClockMargin: an event whose occurred_at is within this of the
	// dispatcher's bound (aip.MaxEnvelopeSkew ahead of the clock its
	// answer was sent at) counts as refused for it, since the dispatcher
	// checked it a moment before it answered (clockRefusal).
	eventClockMargin = 30 * time.Second
)

// Failure codes of event deliveries that did not get a signed AIP error
// (the metric's code label and the batch's last error).
const (
	// CodeEventTransport: no answer (connection refused, timeout) or an
	// answer that is not a signed envelope.
	CodeEventTransport = "connector_host.event_transport"
	// CodeEventAnswerInvalid: the answer is not signed by the pinned
	// gateway DID, not in response to the delivery, or not an event stream.
	CodeEventAnswerInvalid = "connector_host.event_answer_invalid"
	// CodeEventBatchInvalid: the outbox batch cannot be sent (corrupt JSON,
	// or events an envelope cannot carry).
	CodeEventBatchInvalid = "connector_host.event_batch_invalid"
)

// MetricEventsPending is the number of batches in the event outbox (read
// from the journal at each scrape): a number that only grows means events
// are not being delivered (no --event-endpoint, the dispatcher unreachable,
// or batches it refuses); the host refuses new events at 10000.
const MetricEventsPending = "aip_connector_host_events_pending"

// registerPendingMetric adds MetricEventsPending to the host's metrics.
func (h *Host) registerPendingMetric() {
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricEventsPending,
		Help: "Event outbox batches not yet delivered (NaN when the journal cannot be read)."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ControlTimeout)
			defer cancel()
			n, err := h.journal.PendingEvents(ctx)
			if err != nil {
				return math.NaN()
			}
			return float64(n)
		})
	if err := h.m.reg.Register(g); err != nil {
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			h.log.Warn("register the pending-events metric", "error", err)
		}
	}
}

// eventBackoff returns the delay before the next attempt of a batch that
// failed after attempts earlier failures; permanent refusals wait the
// maximum. randN(n) is uniform in [0, n).
func eventBackoff(attempts int, permanent bool, randN func(n int64) int64) time.Duration {
	d := eventBackoffMax
	if !permanent {
		d = min(eventBackoffBase<<min(max(attempts, 0), 6), eventBackoffMax)
	}
	return d + time.Duration(randN(int64(eventBackoffJitter/time.Millisecond)+1))*time.Millisecond
}

// refusedBackoff returns the delay before the next attempt of a batch of
// one event the dispatcher refused permanently.
func refusedBackoff(randN func(n int64) int64) time.Duration {
	return eventRefusedRetry + time.Duration(randN(int64(eventRefusedJitter/time.Millisecond)+1))*time.Millisecond
}

// permanentEventCode reports whether a dispatcher refusal will not go away
// by retrying (an operator must fix the registry or the connector).
func permanentEventCode(code string) bool {
	switch code {
	case aip.CodeEventInvalid, aip.CodeEventNotAuthorized, aip.CodeEventIdempotencyConflict, CodeEventBatchInvalid:
		return true
	}
	return false
}

// metricCode bounds the code label to the codes this version knows.
func metricCode(code string) string {
	switch code {
	case aip.CodeEventInvalid, aip.CodeEventNotAuthorized, aip.CodeEventUnavailable, aip.CodeEventCapacity,
		aip.CodeEventIdempotencyConflict, CodeEventTransport, CodeEventAnswerInvalid, CodeEventBatchInvalid:
		return code
	}
	return "other"
}

// eventDelivery is the delivery loop of one host.
type eventDelivery struct {
	h        *Host
	endpoint string
	client   *http.Client
	notify   chan struct{} // a batch was published
	stop     chan struct{} // closed: one last pass, then return
	cancel   context.CancelFunc
	done     chan struct{}
	// clockOff is set while the dispatcher refuses deliveries for this
	// host's clock (clockRefusal), so that it is logged once.
	clockOff atomic.Bool
}

// deliveryFailure is a failed delivery: its code, whether it is permanent,
// and the category, message and retry hint of the dispatcher's answer.
type deliveryFailure struct {
	code       string
	permanent  bool
	category   aip.ErrorCategory
	message    string
	retryAfter time.Duration
	// staleLease marks a refusal because the delivery's lease_sequence is
	// not the replica's current one (aip.EventReasonStaleLeaseSequence).
	staleLease bool
	// clock, when set, says how the clocks explain the refusal
	// (clockRefusal): this host's clock is far from the dispatcher's, or
	// an event was stamped by a clock ahead of it. Such a failure is not
	// permanent.
	clock string
	err   error
}

func (f *deliveryFailure) Error() string { return f.code + ": " + f.err.Error() }

// refusesContent reports whether the failure is a permanent refusal of
// what a batch holds rather than of its sender: connector_event.invalid,
// connector_event.idempotency_conflict, a batch the host cannot send, or a
// permanent code this version does not know. Such a refusal may concern one
// event only, so a batch of several is split. A refusal of the sender
// (connector_event.not_authorized, or any auth-category error: a disabled
// instance, a retired version) is the same for every part of every batch:
// splitting would only multiply the outbox rows, and fixing the registry
// clears it for all of them at once.
func (f *deliveryFailure) refusesContent() bool {
	return f.permanent && f.code != aip.CodeEventNotAuthorized && f.category != aip.CategoryAuth
}

// startEventDelivery starts the loop (step 10) when an event endpoint is
// configured and the manifest declares channels; with channels but no
// endpoint it warns once.
func (h *Host) startEventDelivery(ctx context.Context) {
	h.registerPendingMetric()
	if h.cfg.EventEndpoint == "" {
		if len(h.channels) > 0 {
			h.log.Warn("the manifest declares event channels but --event-endpoint is not set: published events only accumulate in the outbox (pending_events in /ready, "+MetricEventsPending+") and are refused once it holds 10000 batches",
				"channels", len(h.channels))
		}
		return
	}
	if len(h.channels) == 0 {
		// Publish refuses every channel the manifest does not declare,
		// so nothing can ever be delivered: no loop polls the outbox.
		h.log.Info("the manifest declares no event channels; event delivery is not started")
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d := &eventDelivery{
		h: h, endpoint: h.cfg.EventEndpoint,
		client: &http.Client{
			Transport:     h.eventTransport,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		notify: make(chan struct{}, 1), stop: make(chan struct{}), cancel: cancel, done: make(chan struct{}),
	}
	h.delivery.Store(d)
	go d.run(ctx)
	h.log.Info("delivering events", "endpoint", d.endpoint)
}

// stopEventDelivery asks the loop for one last pass over due batches
// (bounded by ControlTimeout), waits for it at most wait, then cancels it.
func (h *Host) stopEventDelivery(wait time.Duration) error {
	d := h.delivery.Load()
	if d == nil {
		return nil
	}
	select {
	case <-d.stop:
	default:
		close(d.stop)
	}
	err := waitFor(d.done, wait)
	d.cancel()
	<-d.done
	d.client.CloseIdleConnections()
	return err
}

// notifyEvents wakes the delivery loop after a publication.
func (h *Host) notifyEvents() {
	if d := h.delivery.Load(); d != nil {
		select {
		case d.notify <- struct{}{}:
		default:
		}
	}
}

func (d *eventDelivery) run(ctx context.Context) {
	defer close(d.done)
	poll := func() time.Duration { return eventPollBase + rand.N(eventPollJitter+time.Millisecond) }
	timer := time.NewTimer(poll())
	defer timer.Stop()
	for {
		d.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-d.stop:
			fctx, cancel := context.WithTimeout(ctx, d.h.cfg.ControlTimeout)
			d.pass(fctx)
			cancel()
			return
		case <-d.notify:
		case <-timer.C:
		}
		timer.Reset(poll())
	}
}

// pass delivers every due batch, eventClaimBatch at a time. Nothing is
// claimed while the lease is not valid: the dispatcher would refuse it.
func (d *eventDelivery) pass(ctx context.Context) {
	h := d.h
	for ctx.Err() == nil {
		now := h.cfg.Now()
		if !h.lease.valid(now) {
			return
		}
		batch, err := h.journal.ClaimEvents(ctx, now, eventClaimLease, eventClaimBatch)
		if err != nil {
			if ctx.Err() == nil {
				h.log.Warn("claim outbox batches", "error", err)
			}
			return
		}
		split := false
		for _, e := range batch {
			split = d.deliver(ctx, e) || split
		}
		// The parts of a split batch are due now: deliver them in this
		// pass rather than at the next poll.
		if len(batch) < eventClaimBatch && !split {
			return
		}
	}
}

// deliver sends one batch and records the result in the journal. It
// reports whether it split the batch into parts that are due now.
func (d *eventDelivery) deliver(ctx context.Context, e journal.OutboxEntry) bool {
	h := d.h
	err := d.send(ctx, e)
	jctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.ControlTimeout)
	defer cancel()
	if err == nil {
		if aerr := h.journal.AckEvents(jctx, e.ID); aerr != nil && !errors.Is(aerr, journal.ErrNotFound) {
			// The dispatcher stored the events (idempotently by ID); the
			// batch is sent again when its claim expires.
			h.log.Warn("ack a delivered outbox batch", "batch", e.ID, "error", aerr)
		}
		h.m.eventsDelivered.Inc()
		h.log.Debug("event batch delivered", "batch", e.ID, "channel_id", e.ChannelID)
		d.clockAgrees()
		return false
	}
	var f *deliveryFailure
	if !errors.As(err, &f) {
		f = &deliveryFailure{code: CodeEventTransport, err: err}
	}
	h.m.eventFailures.WithLabelValues(metricCode(f.code)).Inc()
	switch f.code {
	case CodeEventTransport, CodeEventAnswerInvalid, CodeEventBatchInvalid:
		// No answer of the dispatcher's to tell the clocks by.
	default:
		if f.clock == "" {
			d.clockAgrees()
		}
	}
	if f.refusesContent() {
		var events []json.RawMessage
		if json.Unmarshal(e.Events, &events) == nil && len(events) > 1 {
			if d.splitBatch(jctx, e, events, f) {
				return true
			}
		} else {
			d.refused(jctx, e, events, f)
			return false
		}
	}
	delay := max(eventBackoff(e.Attempts, f.permanent, rand.Int64N), min(f.retryAfter, eventBackoffMax))
	next := h.cfg.Now().Add(delay)
	msg := aip.TruncateUTF8(f.Error(), aip.MaxErrorMessageBytes)
	if rerr := h.journal.RetryEvents(jctx, e.ID, next, msg); rerr != nil && !errors.Is(rerr, journal.ErrNotFound) {
		h.log.Warn("reschedule an outbox batch", "batch", e.ID, "error", rerr)
	}
	attrs := []any{"batch", e.ID, "channel_id", e.ChannelID, "code", f.code, "attempts", e.Attempts + 1,
		"next_attempt", aip.At(next).String(), "error", f.err}
	switch {
	case f.clock != "" && !d.clockOff.Swap(true):
		h.log.Error("the dispatcher refuses event deliveries because of this host's clock; check this host's clock (NTP): batches are kept whole and retried with backoff, and delivered once the clocks agree",
			append(attrs, "clock", f.clock)...)
	case f.clock != "":
		h.log.Debug("event delivery refused because of this host's clock; retrying with backoff", append(attrs, "clock", f.clock)...)
	case f.permanent:
		h.log.Error("the dispatcher refused an event batch; it is retried at the maximum backoff until the registry or connector is fixed", attrs...)
	default:
		h.log.Warn("event delivery failed; retrying with backoff", attrs...)
	}
	return false
}

// clockAgrees notes a delivery the dispatcher answered without refusing
// it for this host's clock.
func (d *eventDelivery) clockAgrees() {
	if d.clockOff.Swap(false) {
		d.h.log.Info("the dispatcher no longer refuses event deliveries because of this host's clock")
	}
}

// clockRefusal returns how the clocks explain a refusal as
// connector_event.invalid of a delivery carrying events, sent at sent by
// this host's clock and answered at answered by the dispatcher's (its
// answer's sent_at), which this host received at received by its own; ""
// when they do not. The dispatcher refuses a delivery sent more than
// aip.MaxEventDeliveryAge before its clock or more than aip.MaxEnvelopeSkew
// after it, and an event whose occurred_at is more than
// aip.MaxEnvelopeSkew after it; it checks them before the events' content,
// and before it answers. Such a refusal is the same for every part of the
// batch and goes away once the clocks agree (or, for an event stamped by a
// clock ahead, once the dispatcher's clock gets there): it is no refusal
// of the content, to split the batch for and retry hourly — but for an
// event more than eventRefusedRetry past the dispatcher's bound, which
// is.
func clockRefusal(code string, sent, answered, received time.Time, events []aip.Event) string {
	if code != aip.CodeEventInvalid || answered.IsZero() {
		return ""
	}
	// The dispatcher's clock less this host's, to a round trip.
	offset := answered.Sub(received).Round(time.Second)
	host := "this host's clock agrees with the dispatcher's"
	switch {
	case offset > 0:
		host = fmt.Sprintf("this host's clock is about %s behind the dispatcher's", offset)
	case offset < 0:
		host = fmt.Sprintf("this host's clock is about %s ahead of the dispatcher's", -offset)
	}
	switch {
	case sent.Before(answered.Add(-aip.MaxEventDeliveryAge)):
		return fmt.Sprintf("%s: the delivery's sent_at %s is more than %s before the dispatcher's clock (%s)",
			host, aip.At(sent), aip.MaxEventDeliveryAge, aip.At(answered))
	case sent.After(answered.Add(aip.MaxEnvelopeSkew)):
		return fmt.Sprintf("%s: the delivery's sent_at %s is more than %s after the dispatcher's clock (%s)",
			host, aip.At(sent), aip.MaxEnvelopeSkew, aip.At(answered))
	}
	// An event ahead is waited for only as long as a lone refused event
	// would wait for its retry: one further ahead (an occurred_at of the
	// provider's far in the future) is the event's own problem, and its
	// batch is split so that it does not hold the others back.
	var ahead *aip.Event
	for i := range events {
		e := &events[i]
		if e.OccurredAt.After(answered.Add(aip.MaxEnvelopeSkew + eventRefusedRetry)) {
			return ""
		}
		if ahead == nil && e.OccurredAt.After(answered.Add(aip.MaxEnvelopeSkew-eventClockMargin)) {
			ahead = e
		}
	}
	if ahead != nil {
		return fmt.Sprintf("event %s's occurred_at %s is more than %s after the dispatcher's clock (%s): stamped by a clock ahead of it, it is taken once the dispatcher's clock gets there (%s)",
			ahead.ID, ahead.OccurredAt, aip.MaxEnvelopeSkew, aip.At(answered), host)
	}
	return ""
}

// splitBatch replaces a batch of several events that the dispatcher
// refused for its content with its two halves, so the events it accepts
// get through and the refused ones end up alone (refused). Bisection finds
// one bad event among n in 2·⌈log2(n)⌉ further deliveries (14 for a batch
// of 100), adding at most one outbox row per level meanwhile, where a batch
// per event would take n deliveries and n rows at once; k bad events take
// about 2·k·log2(n/k).
//
// The parts' IDs are the batch's ID with ".0" and ".1" appended, and their
// content is the batch's events as stored, so a split that is repeated (the
// host stopped after enqueuing the parts and before removing the batch,
// which is then delivered, refused and split again) enqueues the same parts
// again, which EnqueueEvents ignores, or enqueues a part that was delivered
// meanwhile again, which the dispatcher stores once (its event log is
// idempotent on event IDs). The parts are enqueued before the batch is
// removed, so no crash loses an event. It reports false, having changed
// nothing the retry below does not repair, when a part could not be
// enqueued: the caller reschedules the batch and it is split again then.
func (d *eventDelivery) splitBatch(ctx context.Context, e journal.OutboxEntry, events []json.RawMessage, f *deliveryFailure) bool {
	h := d.h
	now := h.cfg.Now()
	half := len(events) / 2
	parts := [2][]json.RawMessage{events[:half], events[half:]}
	ids := [2]string{e.ID + ".0", e.ID + ".1"}
	note := aip.TruncateUTF8("split from "+e.ID+" after "+f.Error(), aip.MaxErrorMessageBytes)
	for i, part := range parts {
		raw, err := json.Marshal(part)
		if err == nil {
			err = h.journal.EnqueueEvents(ctx, journal.OutboxEntry{ID: ids[i], ChannelID: e.ChannelID, Events: raw,
				NextAttempt: now, LastError: note, CreatedAt: e.CreatedAt})
		}
		if err != nil {
			h.log.Warn("split a refused outbox batch: enqueue a part; the batch is split again at its next attempt",
				"batch", e.ID, "part", ids[i], "error", err)
			return false
		}
	}
	if err := h.journal.AckEvents(ctx, e.ID); err != nil && !errors.Is(err, journal.ErrNotFound) {
		// The batch is claimed again when its claim expires, refused
		// and split into the same parts again.
		h.log.Warn("split a refused outbox batch: remove the batch; it is split again when its claim expires",
			"batch", e.ID, "error", err)
	}
	h.log.Warn("the dispatcher refused an event batch for its content; split in two to deliver the events it accepts",
		"batch", e.ID, "channel_id", e.ChannelID, "events", len(events), "parts", ids[0]+" "+ids[1],
		"code", f.code, "error", f.err)
	return true
}

// refused keeps a batch the dispatcher refused for its content that
// cannot be split (one event, or not a JSON array) in the outbox, to be
// retried after refusedBackoff, counts it in MetricEventsRefused and logs
// it with the event and the dispatcher's code and message.
func (d *eventDelivery) refused(ctx context.Context, e journal.OutboxEntry, events []json.RawMessage, f *deliveryFailure) {
	h := d.h
	h.m.eventsRefused.Inc()
	next := h.cfg.Now().Add(refusedBackoff(rand.Int64N))
	msg := aip.TruncateUTF8(f.Error(), aip.MaxErrorMessageBytes)
	if err := h.journal.RetryEvents(ctx, e.ID, next, msg); err != nil && !errors.Is(err, journal.ErrNotFound) {
		h.log.Warn("reschedule a refused outbox batch", "batch", e.ID, "error", err)
	}
	var ev struct {
		ID string `json:"id"`
	}
	if len(events) == 1 {
		_ = json.Unmarshal(events[0], &ev)
	}
	message := f.message
	if message == "" {
		message = f.err.Error()
	}
	h.log.Error("the dispatcher refused an event; it stays in the outbox and is retried hourly until the cause is fixed",
		"batch", e.ID, "event_id", ev.ID, "channel_id", e.ChannelID, "code", f.code, "message", message,
		"attempts", e.Attempts+1, "next_attempt", aip.At(next).String())
}

// send delivers a batch, split into envelopes that fit
// aip.MaxEventDeliveryBytes (the dispatcher stores events idempotently by
// ID, so a part sent again on a retry is harmless).
func (d *eventDelivery) send(ctx context.Context, e journal.OutboxEntry) error {
	var events []aip.Event
	if err := json.Unmarshal(e.Events, &events); err != nil || len(events) == 0 {
		return &deliveryFailure{code: CodeEventBatchInvalid, permanent: true, err: fmt.Errorf("the outbox batch is not a JSON array of events: %v", err)}
	}
	var part []aip.Event
	size := 0
	for _, ev := range events {
		raw, err := json.Marshal(ev)
		if err != nil {
			return &deliveryFailure{code: CodeEventBatchInvalid, permanent: true, err: err}
		}
		if len(part) > 0 && (len(part) == aip.MaxEventsPerDelivery || size+len(raw)+1 > aip.MaxEventDeliveryBytes-eventEnvelopeOverhead) {
			if err := d.sendPart(ctx, e.ChannelID, part); err != nil {
				return err
			}
			part, size = nil, 0
		}
		part = append(part, ev)
		size += len(raw) + 1
	}
	return d.sendPart(ctx, e.ChannelID, part)
}

// sendPart posts one delivery signed with the host's lease sequence. A
// heartbeat may renew the lease between the signing and the dispatcher's
// check, which must find the sequence current: when the dispatcher refuses
// the delivery for a stale sequence (aip.EventReasonStaleLeaseSequence)
// and the host holds a newer valid lease by then, the delivery is signed
// again with it and sent at once, once; otherwise (or if that is refused
// too) the refusal goes to deliver, which retries the batch with backoff.
func (d *eventDelivery) sendPart(ctx context.Context, channelID string, events []aip.Event) error {
	h := d.h
	seq, _ := h.lease.get()
	err := d.post(ctx, channelID, events, seq)
	var f *deliveryFailure
	if !errors.As(err, &f) || !f.staleLease {
		return err
	}
	current, _ := h.lease.get()
	if current == seq || !h.lease.valid(h.cfg.Now()) {
		return err
	}
	h.log.Debug("the dispatcher refused an event delivery for a lease sequence renewed since it was signed; sending it again with the current one",
		"channel_id", channelID, "signed_sequence", seq, "sequence", current)
	return d.post(ctx, channelID, events, current)
}

// post posts one delivery signed with lease sequence seq and verifies the
// dispatcher's answer.
func (d *eventDelivery) post(ctx context.Context, channelID string, events []aip.Event, seq uint64) error {
	h := d.h
	c := &h.cfg
	env, err := aip.NewEnvelope(c.Now(), aip.Body{EventStream: &aip.EventStream{Events: events}})
	if err != nil {
		return err
	}
	from := h.principal
	env.From = &from
	env.To = &aip.Principal{ID: c.GatewayPrincipalID, Kind: aip.PrincipalService, TrustDomain: c.TrustDomain, DID: h.gatewayDID}
	if err := env.SetSecurity(aip.SecurityConnectorEvent, aip.ConnectorEvent{
		TenantID: c.TenantID, InstanceID: c.InstanceID, ReplicaID: c.ReplicaID, VersionID: c.VersionID,
		ManifestDigest: h.manifestDigest, LeaseSequence: seq, ChannelID: channelID,
	}); err != nil {
		return err
	}
	body, err := aip.SignEnvelope(h.key, env)
	if errors.Is(err, aip.ErrInvalidJSON) {
		// An event the envelope cannot carry (data nesting deeper than
		// MaxEventDataDepth, in a batch Publish did not check): a refusal
		// of the batch's content, so it is split and the others delivered.
		return &deliveryFailure{code: CodeEventBatchInvalid, permanent: true,
			err: fmt.Errorf("the events cannot be signed into a delivery: %w", err)}
	}
	if err != nil {
		return err
	}
	if len(body) > aip.MaxEventDeliveryBytes {
		return &deliveryFailure{code: CodeEventBatchInvalid, permanent: true,
			err: fmt.Errorf("the delivery is %d bytes, more than the %d allowed", len(body), aip.MaxEventDeliveryBytes)}
	}
	transport := func(format string, args ...any) error {
		return &deliveryFailure{code: CodeEventTransport, err: fmt.Errorf(format, args...)}
	}
	rctx, cancel := context.WithTimeout(ctx, c.ControlTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, d.endpoint, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.client.Do(req)
	if err != nil {
		return transport("POST %s: %v", d.endpoint, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, aip.MaxEventAnswerBytes+1))
	if err != nil {
		return transport("read the answer: %v", err)
	}
	received := c.Now()
	if len(answer) > aip.MaxEventAnswerBytes {
		return transport("HTTP %d: the answer exceeds %d bytes", resp.StatusCode, aip.MaxEventAnswerBytes)
	}
	var probe struct {
		Security map[string]json.RawMessage `json:"security"`
	}
	if json.Unmarshal(answer, &probe) != nil || probe.Security == nil {
		return transport("HTTP %d without a signed envelope: %s", resp.StatusCode, aip.TruncateUTF8(string(answer), 256))
	}
	invalid := func(format string, args ...any) error {
		return &deliveryFailure{code: CodeEventAnswerInvalid, err: fmt.Errorf("HTTP %d: "+format, append([]any{resp.StatusCode}, args...)...)}
	}
	v, err := aip.VerifyEnvelope(answer, h.gatewayDID)
	if err != nil {
		return invalid("the answer is not signed by the pinned gateway DID %s: %v", h.gatewayDID, err)
	}
	ans := &v.Envelope
	if ans.InResponseTo == nil || ans.InResponseTo.Message != env.MessageID {
		return invalid("the answer is not in response to delivery %s", env.MessageID)
	}
	if pe := ans.Body.Error; pe != nil {
		f := &deliveryFailure{code: pe.Error.Code, category: pe.Error.Category, message: pe.Error.Message,
			err: fmt.Errorf("HTTP %d: %s", resp.StatusCode, pe.Error.Message)}
		f.permanent = permanentEventCode(pe.Error.Code) || (pe.Error.Retryable != nil && !*pe.Error.Retryable && pe.Error.Category != aip.CategoryTemporary)
		if f.clock = clockRefusal(pe.Error.Code, env.SentAt.Time, ans.SentAt.Time, received, events); f.clock != "" {
			f.permanent = false
		}
		f.retryAfter = pe.Error.RetryAfter()
		var details aip.EventRefusalDetails
		if pe.Error.Code == aip.CodeEventUnavailable && len(pe.Error.Details) > 0 && json.Unmarshal(pe.Error.Details, &details) == nil {
			f.staleLease = details.Reason == aip.EventReasonStaleLeaseSequence
		}
		return f
	}
	if resp.StatusCode != http.StatusOK || ans.Body.EventStream == nil {
		return invalid("the answer is a %s body, want event_stream", ans.Body.Tag())
	}
	return nil
}
