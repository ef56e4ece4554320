package dispatch

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/readbudget"
	"github.com/aipfleet/aipfleet/registry"
)

// metrics are the dispatcher's Prometheus collectors, registered on the
// registry in Config.Metrics.
type metrics struct {
	actions        *prometheus.CounterVec
	errors         *prometheus.CounterVec
	duration       prometheus.Histogram
	stages         *prometheus.HistogramVec
	reroutes       *prometheus.CounterVec
	settleFailures prometheus.Counter
	settleRetries  prometheus.Counter
	reconciled     *prometheus.CounterVec
	unsentReleases *prometheus.CounterVec
	requests       *prometheus.CounterVec
	// The connector-event ingress.
	eventDeliveries *prometheus.CounterVec
	eventsStored    prometheus.Counter
}

// newMetrics registers the dispatcher's collectors; bodies is the read
// budget of connector-event deliveries, whose waiting deliveries
// aip_dispatch_event_deliveries_waiting counts by reason, and actionBodies
// that of action requests (aip_dispatch_action_reads_waiting).
func newMetrics(reg *prometheus.Registry, s *Scheduler, bodies, actionBodies *readbudget.Budget) (*metrics, error) {
	m := &metrics{
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_actions_total",
			Help: "Actions handled by the dispatcher, by how their route was settled (not_routed: refused before a route existed; unsettled: answered before the registry confirmed a settlement; not_delivered: settled outcome_unknown, but no connection to the replica could be made, so nothing of the request reached it).",
		}, []string{"outcome"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_action_errors_total",
			Help: "Actions answered with an error, by error code (codes neither the dispatcher nor hostsdk defines count as other).",
		}, []string{"code"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "aip_dispatch_action_duration_seconds",
			Help:    "Time from the entry point to the answer of an action.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "aip_dispatch_stage_duration_seconds",
			Help:    "Time an action spends in each stage: admission, resolve, hop (to the replica and back), reroute, settle.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"stage"}),
		reroutes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_reroutes_total",
			Help: "Provably-not-started reroutes asked of the registry, by result.",
		}, []string{"result"}),
		settleFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aip_dispatch_settle_failures_total",
			Help: "Settlement calls the registry did not confirm (a storage failure or a timeout is retried in the background).",
		}),
		settleRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aip_dispatch_settle_retries_total",
			Help: "Background retries of settlements the registry did not confirm.",
		}),
		reconciled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_reconciled_total",
			Help: "Orphaned reservations looked at by reconciliation, by result: settled, in_progress, unanswered.",
		}, []string{"result"}),
		unsentReleases: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_unsent_releases_total",
			Help: "Releases of reservations a failed resolve or reroute may have made for an action that was never sent, by result: released, unchanged (nothing of this call held), gave_up (left to reconciliation).",
		}, []string{"result"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_http_requests_total",
			Help: "API requests by route and HTTP status.",
		}, []string{"route", "status"}),
		eventDeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aip_dispatch_events_received_total",
			Help: "Connector-event deliveries received, by result: accepted, or the refusal (invalid, not_authorized, unavailable, idempotency_conflict, capacity; peer_capacity: the sender's address held its share of the read budget).",
		}, []string{"result"}),
		eventsStored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aip_dispatch_events_stored_total",
			Help: "Events of accepted connector-event deliveries (a redelivered event counts again, unless the log pruned it and still remembers its ID: that one is not stored again).",
		}),
	}
	waiting := func(reason string, f func(readbudget.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "aip_dispatch_event_deliveries_waiting",
			Help:        "Connector-event deliveries waiting before they are read, by reason: budget (the memory budget of delivery bodies, Config.MaxEventBodyBytes, is spent) or peer_share (their sender's address holds its share of it).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(f(bodies.Stats())) })
	}
	actionsWaiting := func(reason string, f func(readbudget.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "aip_dispatch_action_reads_waiting",
			Help:        "Action requests waiting before their bodies are read, by reason: budget (the memory budget of action bodies being read, Config.MaxActionReadBytes, is spent) or tenant_share (their tenant's other requests hold its share of it).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(f(actionBodies.Stats())) })
	}
	gauge := func(name, help string, f func(SchedulerSnapshot) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(s.Snapshot()) })
	}
	// Every series of a fixed label set exists from the start (at 0), so
	// that rate() and absence alerts see it before its first event.
	for _, o := range []string{string(registry.SettlementCompleted), string(registry.SettlementOutcomeUnknown),
		string(registry.SettlementCancelled), string(registry.SettlementPruned), outcomeNotRouted, outcomeUnsettled, outcomeNotDelivered} {
		m.actions.WithLabelValues(o)
	}
	for c := range metricCodes {
		m.errors.WithLabelValues(c)
	}
	m.errors.WithLabelValues("other")
	for _, st := range []string{"admission", "resolve", "hop", "reroute", "settle"} {
		m.stages.WithLabelValues(st)
	}
	for _, r := range []string{"rerouted", "unsafe", "no_replica", "capacity", "evidence_rejected", "fence_lost", "error"} {
		m.reroutes.WithLabelValues(r)
	}
	for _, r := range []string{"settled", "in_progress", "unanswered"} {
		m.reconciled.WithLabelValues(r)
	}
	for _, r := range []string{unsentReleased, unsentUnchanged, unsentGaveUp} {
		m.unsentReleases.WithLabelValues(r)
	}
	for _, r := range []string{"accepted", "invalid", "not_authorized", "unavailable", "idempotency_conflict", "capacity", "peer_capacity"} {
		m.eventDeliveries.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{
		m.actions, m.errors, m.duration, m.stages, m.reroutes, m.settleFailures, m.settleRetries, m.reconciled, m.unsentReleases, m.requests,
		m.eventDeliveries, m.eventsStored,
		waiting("budget", func(s readbudget.Stats) int { return s.WaitingBudget }),
		waiting("peer_share", func(s readbudget.Stats) int { return s.WaitingShare }),
		actionsWaiting("budget", func(s readbudget.Stats) int { return s.WaitingBudget }),
		actionsWaiting("tenant_share", func(s readbudget.Stats) int { return s.WaitingShare }),
		gauge("aip_dispatch_in_flight", "Actions admitted and not yet answered.", func(s SchedulerSnapshot) float64 { return float64(s.Active) }),
		gauge("aip_dispatch_queued", "Actions waiting for admission.", func(s SchedulerSnapshot) float64 { return float64(s.Queued) }),
		gauge("aip_dispatch_queued_bytes", "Bytes of the actions waiting for admission.", func(s SchedulerSnapshot) float64 { return float64(s.QueuedBytes) }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// The outcomes of aip_dispatch_actions_total that are no settlement: an
// action refused before a route existed, one answered without a
// settlement the registry confirmed (the settlement is retried in the
// background, or the action runs for another delivery, which settles it),
// and one settled outcome_unknown whose request provably never reached
// its replica (no connection could be made: 503
// dispatch.replica_unreachable), which an alert on outcome_unknown ("it
// may have run") must not count. lease_expired is lease maintenance's
// settlement, never an answer's.
const (
	outcomeNotRouted    = "not_routed"
	outcomeUnsettled    = "unsettled"
	outcomeNotDelivered = "not_delivered"
)

func (m *metrics) observe(outcome string, pe *aip.ProtocolError, d time.Duration) {
	m.actions.WithLabelValues(outcome).Inc()
	if pe != nil {
		m.errors.WithLabelValues(errorLabel(pe.Code)).Inc()
	}
	m.duration.Observe(d.Seconds())
}

// metricCodes are the error codes aip_dispatch_action_errors_total names:
// the dispatcher's own and the codes hostsdk's replicas answer with. Any
// other code a replica sends (it may be a connector host of another
// implementation) counts as "other", so a replica that puts an ID in its
// codes does not add a series per action.
var metricCodes = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range []string{
		CodeUnauthorized, CodeRequestInvalid, CodeActionInvalid, CodeRequestTooLarge, CodeNotFound, CodeStaleCursor,
		CodeShuttingDown, CodeOutcomeUnknown, CodeTimeout, CodeReplicaUnreachable, CodeAdmissionCapacity,
		CodeSchedulerOverloaded, CodeRequestRejected, CodeBindingUnavailable, CodeReplicaUnavailable, CodeRouteConflict,
		CodeRegistry,
		hostNotReady, hostCapacity, hostOutcomeUnknown, hostExecution, hostStorageUnavailable, hostReplay,
		hostInputInvalid, hostIdempotencyConflict, hostActionInProgress, hostCapabilityUnknown, hostActionExpired,
		hostCredentialDenied, hostCredentialUnavailable,
		hostAuthentication, hostRouteMismatch, hostUnsupportedMessage, hostOutputInvalid, hostResponseSigning,
		hostDecodeInvalid, hostSchemaInvalid, hostTooLarge,
	} {
		m[c] = true
	}
	return m
}()

// errorLabel bounds the code label of aip_dispatch_action_errors_total.
func errorLabel(code string) string {
	if metricCodes[code] {
		return code
	}
	return "other"
}

// stage observes the wall time of one stage that started at start (defer
// it with time.Now() as the argument).
func (m *metrics) stage(name string, start time.Time) {
	m.stages.WithLabelValues(name).Observe(time.Since(start).Seconds())
}
