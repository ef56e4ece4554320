package sidecar

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/netutil"
)

// PathEvents is the route on the replica's listener where a local
// connector publishes provider events (docs/sidecar-protocol.md, "Publishing
// events").
const PathEvents = "/sidecar/events"

// Environment variables the sidecar sets for a connector it starts (--exec)
// so that it can publish events.
const (
	// EnvEventsURL is the full URL of POST /sidecar/events on the
	// replica's listener, over loopback when the replica binds a wildcard
	// address.
	EnvEventsURL = "AIP_SIDECAR_EVENTS_URL"
	// EnvEventsToken is the bearer token the route accepts: generated per
	// run, and not the token the sidecar sends to the connector.
	EnvEventsToken = "AIP_SIDECAR_EVENTS_TOKEN"
)

// MaxEventsBodyBytes bounds a POST /sidecar/events body: a batch of
// hostsdk.MaxEventsPerBatch events of hostsdk.MaxEventBytes each, in compact
// JSON, plus 64 KiB for the channel and the JSON around the events. It
// never refuses a compact batch Publish would take.
const MaxEventsBodyBytes = hostsdk.MaxEventsPerBatch*hostsdk.MaxEventBytes + 64<<10

// MaxConcurrentEventRequests bounds the POST /sidecar/events requests
// whose body is being read or whose batch is being stored at once: each
// may hold up to MaxEventsBodyBytes (about 25 MiB) and its decoded events,
// so a local connector flooding the route would otherwise take the
// replica's memory. A request beyond it is answered 503
// sidecar.events_unavailable with Retry-After before its body is read.
const MaxConcurrentEventRequests = 4

// eventsRetryAfter is the Retry-After of a 503 (the host does not take
// events now): about one health check.
const eventsRetryAfter = 1

// Error codes of POST /sidecar/events answers.
const (
	// CodeEventsInvalid (400): the batch is refused for its content; the
	// message says what to fix. A retry gets the same answer.
	CodeEventsInvalid = "sidecar.events_invalid"
	// CodeEventsTooLarge (413): the body exceeds MaxEventsBodyBytes.
	CodeEventsTooLarge = "sidecar.events_too_large"
	// CodeEventsUnavailable (503): the replica does not take events now
	// (not ready, draining, outbox full, journal unavailable, or
	// MaxConcurrentEventRequests requests in progress already); retry
	// after Retry-After with the same batch.
	CodeEventsUnavailable = "sidecar.events_unavailable"
	// CodeUnauthorized (401): no or a wrong bearer token.
	CodeUnauthorized = "sidecar.unauthorized"
	// CodeForbidden (403): the request did not come from this machine.
	CodeForbidden = "sidecar.forbidden"
)

// Metric names of the events route (on the host's /metrics).
const (
	// MetricEventBatchesPublished counts batches POST /sidecar/events
	// stored in the journal's outbox (answered 200).
	MetricEventBatchesPublished = "aip_sidecar_event_batches_published_total"
	// MetricEventBatchesRefused counts POST /sidecar/events requests not
	// stored, by reason: invalid (400), too_large (413), unavailable
	// (503), busy (503: MaxConcurrentEventRequests in progress),
	// unauthorized (401) or not_local (403).
	MetricEventBatchesRefused = "aip_sidecar_event_batches_refused_total"
)

// Reasons of MetricEventBatchesRefused.
var refusedReasons = []string{"invalid", "too_large", "unavailable", "busy", "unauthorized", "not_local"}

// eventsRequest is the body of POST /sidecar/events.
type eventsRequest struct {
	ChannelID string      `json:"channel_id"`
	Events    []aip.Event `json:"events"`
}

// eventsAnswer is the body of a 200 answer.
type eventsAnswer struct {
	BatchID string `json:"batch_id"`
	Events  int    `json:"events"`
}

// eventsMetrics are the route's counters.
type eventsMetrics struct {
	published prometheus.Counter
	refused   *prometheus.CounterVec
}

func newEventsMetrics() *eventsMetrics {
	m := &eventsMetrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricEventBatchesPublished,
			Help: "Event batches the local connector published through POST /sidecar/events, stored in the journal's outbox."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEventBatchesRefused,
			Help: "POST /sidecar/events requests not stored, by reason (invalid, too_large, unavailable, busy, unauthorized, not_local)."}, []string{"reason"}),
	}
	for _, r := range refusedReasons {
		m.refused.WithLabelValues(r) // present at 0 from the start
	}
	return m
}

func (m *eventsMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.published, m.refused}
}

// eventsRoute is POST /sidecar/events of a Local: its token and counters.
type eventsRoute struct {
	token string
	m     *eventsMetrics
}

// eventsHandler serves POST /sidecar/events: it authenticates the local
// connector (a peer on this machine with the events token), decodes the
// batch strictly, requires each event's id and occurred_at (a retry must
// be the same batch), and answers once Publish stored it in the journal.
// At most MaxConcurrentEventRequests authenticated requests are read and
// stored at once; one beyond is refused (503, busy) without reading its
// body.
func eventsHandler(token string, publish func(ctx context.Context, channelID string, events ...aip.Event) (string, error), m *eventsMetrics, log *slog.Logger) http.Handler {
	want := []byte("Bearer " + token)
	slots := make(chan struct{}, MaxConcurrentEventRequests)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse := func(status int, reason, code string, category aip.ErrorCategory, retryable bool, msg string) {
			m.refused.WithLabelValues(reason).Inc()
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="aip-sidecar events"`)
			}
			retryMS := uint64(0)
			if status == http.StatusServiceUnavailable {
				w.Header().Set("Retry-After", strconv.Itoa(eventsRetryAfter))
				retryMS = eventsRetryAfter * 1000
			}
			writeError(w, status, aip.NewProtocolError(code, category, retryable, retryMS, aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes)))
		}
		if !localPeer(r) {
			log.Warn("refused an events request from another machine", "remote_addr", r.RemoteAddr)
			refuse(http.StatusForbidden, "not_local", CodeForbidden, aip.CategoryAuth, false,
				"POST "+PathEvents+" takes requests from this machine only (a loopback peer)")
			return
		}
		// Two Authorization headers are refused whichever holds the token:
		// which one counts is anybody's guess (a proxy in front may have
		// read the other).
		if n := len(r.Header.Values("Authorization")); n > 1 {
			refuse(http.StatusUnauthorized, "unauthorized", CodeUnauthorized, aip.CategoryAuth, false,
				fmt.Sprintf("%d Authorization headers; send exactly one: Authorization: Bearer <the token in %s or --events-token-file>", n, EnvEventsToken))
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			refuse(http.StatusUnauthorized, "unauthorized", CodeUnauthorized, aip.CategoryAuth, false,
				"send Authorization: Bearer <the token in "+EnvEventsToken+" or --events-token-file>")
			return
		}
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			log.Warn("refused an events request: too many in progress", "max_concurrent", MaxConcurrentEventRequests)
			refuse(http.StatusServiceUnavailable, "busy", CodeEventsUnavailable, aip.CategoryTemporary, true,
				fmt.Sprintf("%d events requests are being read or stored already (at most %d at once); send the same batch again after Retry-After, and send batches one after another rather than all at once",
					MaxConcurrentEventRequests, MaxConcurrentEventRequests))
			return
		}
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxEventsBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				refuse(http.StatusRequestEntityTooLarge, "too_large", CodeEventsTooLarge, aip.CategoryPermanent, false,
					fmt.Sprintf("the body exceeds %d bytes; send at most %d events of at most %d bytes each, or split the batch", MaxEventsBodyBytes, hostsdk.MaxEventsPerBatch, hostsdk.MaxEventBytes))
				return
			}
			refuse(http.StatusBadRequest, "invalid", CodeEventsInvalid, aip.CategoryPermanent, false, "reading the body: "+err.Error())
			return
		}
		var req eventsRequest
		if err := aip.DecodeStrict(raw, &req); err != nil {
			refuse(http.StatusBadRequest, "invalid", CodeEventsInvalid, aip.CategoryPermanent, false,
				`the body is not {"channel_id": "...", "events": [event, ...]} with events of id, kind, occurred_at and optional session_id, action_id, correlation_id, actor, data: `+err.Error())
			return
		}
		if msg := checkRetrySafe(req.Events); msg != "" {
			refuse(http.StatusBadRequest, "invalid", CodeEventsInvalid, aip.CategoryPermanent, false, msg)
			return
		}
		id, err := publish(r.Context(), req.ChannelID, req.Events...)
		switch {
		case err == nil:
		case errors.Is(err, hostsdk.ErrInvalidEvents):
			refuse(http.StatusBadRequest, "invalid", CodeEventsInvalid, aip.CategoryPermanent, false, err.Error())
			return
		default:
			// Not serving, outbox full, journal unavailable: not now.
			log.Warn("events not accepted now", "channel_id", req.ChannelID, "error", err)
			refuse(http.StatusServiceUnavailable, "unavailable", CodeEventsUnavailable, aip.CategoryTemporary, true,
				"the replica does not take events now; send the same batch again after Retry-After: "+err.Error())
			return
		}
		m.published.Inc()
		log.Debug("events published", "channel_id", req.ChannelID, "batch_id", id, "events", len(req.Events))
		out, _ := json.Marshal(eventsAnswer{BatchID: id, Events: len(req.Events)})
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	})
}

// checkRetrySafe requires what makes a retried batch the same batch: each
// event's id (the dispatcher's event log stores an ID once) and its
// occurred_at (Publish would stamp a missing one with the current time, and
// the same ID with another occurred_at is a conflict the log refuses).
func checkRetrySafe(events []aip.Event) string {
	for i, e := range events {
		if e.ID == "" {
			return fmt.Sprintf("event %d has no id; give every event a stable evt_ ID (a UUIDv7-shaped evt_ followed by 32 hex digits, derived from the provider's own event or delivery ID) so that a retry is stored once", i)
		}
		if e.OccurredAt.IsZero() {
			return fmt.Sprintf("event %d (%s) has no occurred_at; give the time the provider reports (RFC 3339), the same on every retry", i, e.ID)
		}
	}
	return ""
}

// localPeer reports whether a request came from this machine: a loopback
// peer, or a peer whose address is the address it connected to (a process
// here dialling the replica's own non-loopback bind address).
func localPeer(r *http.Request) bool {
	if netutil.IsLoopbackPeer(r.RemoteAddr) {
		return true
	}
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok {
		return false
	}
	local, err := netip.ParseAddrPort(la.String())
	return err == nil && local.Addr().Unmap() == peer.Addr().Unmap()
}

// writeError writes the local contract's error answer.
func writeError(w http.ResponseWriter, status int, pe *aip.ProtocolError) {
	raw, _ := json.Marshal(localError{Error: pe})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(raw)
}

// errEventsPortUnknown: the replica binds port 0, known only once its
// listener is bound, after the child was given its environment.
var errEventsPortUnknown = errors.New("the replica's listen address has no fixed port")

// eventsURL is the URL a child on this machine reaches PathEvents at, for
// the replica's listen address: loopback for a wildcard address, else the
// address itself. A port of 0 cannot be named before the listener is
// bound.
func eventsURLFor(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("is %q; want host:port", listen)
	}
	if port == "0" || port == "" {
		return "", fmt.Errorf("%w: %q", errEventsPortUnknown, listen)
	}
	switch ip, err := netip.ParseAddr(host); {
	case host == "":
		host = "127.0.0.1"
	case err == nil && ip.IsUnspecified() && ip.Is4():
		host = "127.0.0.1"
	case err == nil && ip.IsUnspecified():
		host = "::1"
	}
	return "http://" + net.JoinHostPort(host, port) + PathEvents, nil
}
