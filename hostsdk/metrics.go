package hostsdk

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aipfleet/aipfleet/aip"
)

// Metric names, fixed by the lifecycle guide.
const (
	MetricReady                 = "aip_connector_host_ready"
	MetricStorageReady          = "aip_connector_host_storage_ready"
	MetricInFlight              = "aip_connector_host_in_flight"
	MetricRequests              = "aip_connector_host_requests_total"
	MetricRejected              = "aip_connector_host_rejected_total"
	MetricHeartbeatFailures     = "aip_connector_host_heartbeat_failures_total"
	MetricLeaseRecoveryAttempts = "aip_connector_host_lease_recovery_attempts_total"
	MetricLeaseRecoveries       = "aip_connector_host_lease_recoveries_total"
	// MetricEventsDelivered counts outbox batches the dispatcher stored.
	MetricEventsDelivered = "aip_connector_host_events_delivered_total"
	// MetricEventDeliveryFailures counts failed batch deliveries by code.
	MetricEventDeliveryFailures = "aip_connector_host_event_delivery_failures_total"
	// MetricEventsRefused counts deliveries of a single event the
	// dispatcher refused for its content (or of a batch the host cannot
	// send at all). The event stays in the outbox and is tried again
	// hourly, so while one waits there this grows at least once every 65
	// minutes: alert on increase(aip_connector_host_events_refused_total[2h]) > 0
	// and read the host's error log for the event, code and message.
	MetricEventsRefused = "aip_connector_host_events_refused_total"
	// MetricActionsPruned counts finished actions deleted from the journal
	// after Config.ActionRetention.
	MetricActionsPruned = "aip_connector_host_journal_actions_pruned_total"
	// MetricActionsExpired counts deliveries refused because their action
	// may be older than the journal's prune horizon, or was routed before
	// the journal served the replica (connector_host.action_expired).
	MetricActionsExpired = "aip_connector_host_actions_expired_total"
	// MetricIngressWaiting is the number of native messages waiting for
	// the ingress read budget, by reason: budget (MaxIngressReadBytes is
	// spent) or peer_share (their sender holds MaxIngressReadBytesPerPeer).
	MetricIngressWaiting = "aip_connector_host_ingress_reads_waiting"
	// MetricAbandonedCalls is the number of connector calls still running
	// that the host stopped waiting for: they outlived their action's
	// timeout, cancel or the shutdown by Config.HandleGrace, and the
	// action was journaled outcome_unknown (a read-only capability's failed
	// connector_host.interrupted). Each keeps an in-flight slot.
	MetricAbandonedCalls = "aip_connector_host_abandoned_calls"
	// MetricRegisterWait is how long, in seconds, this process's start
	// waited for a control plane that did not answer its registration
	// (registerWait; the longest such wait when the control plane
	// answered in between), 0 when it answered at once. A gauge, not a
	// count of unanswered attempts: the host serves /metrics only once it
	// has registered, so a counter would appear already at its final
	// value and increase() would never see it rise, and the attempts'
	// number depends on the backoff, where the duration compares directly
	// with Config.RegisterWait, whose running out fails the start. Alert
	// when it comes near that bound (above 60 with the default 2 minutes):
	// a control plane outage as long again fails the starts of the
	// replicas. A start that did fail never serves it; its log and exit
	// status say so.
	MetricRegisterWait = "aip_connector_host_register_wait_seconds"
	// MetricDegraded is 1 while the connector's last health check passed
	// but said part of it is degraded (CheckHealth returned Degraded): the
	// replica stays ready and serves, and /ready's connector detail names
	// what fails. AIP's heartbeat carries only whether the connector is
	// ready, so the control plane and the dispatcher do not learn of it:
	// alert on this gauge (max_over_time(...[10m]) > 0).
	MetricDegraded = "aip_connector_host_degraded"
)

// metrics are the host's collectors, on a registry the host owns (no
// process or Go runtime collectors).
type metrics struct {
	reg               *prometheus.Registry
	requests          prometheus.Counter
	rejected          prometheus.Counter
	heartbeatFailures prometheus.Counter
	recoveryAttempts  prometheus.Counter
	recoveries        prometheus.Counter
	eventsDelivered   prometheus.Counter
	eventFailures     *prometheus.CounterVec
	eventsRefused     prometheus.Counter
	actionsPruned     prometheus.Counter
	actionsExpired    prometheus.Counter
	registerWait      prometheus.Gauge
}

func newMetrics(h *Host) *metrics {
	b2f := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRequests,
			Help: "Native requests observed by the host."}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricRejected,
			Help: "Native requests refused before successful handling."}),
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricHeartbeatFailures,
			Help: "Failed lease renewal or recovery attempts: each failed heartbeat, retry of a heartbeat, or lease recovery."}),
		recoveryAttempts: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricLeaseRecoveryAttempts,
			Help: "Expired-lease registration attempts."}),
		recoveries: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricLeaseRecoveries,
			Help: "Successful expired-lease recoveries."}),
		eventsDelivered: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricEventsDelivered,
			Help: "Event outbox batches delivered to the dispatcher and acknowledged."}),
		eventFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricEventDeliveryFailures,
			Help: "Failed event outbox batch deliveries, by the dispatcher's error code or the host's failure code."}, []string{"code"}),
		eventsRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricEventsRefused,
			Help: "Deliveries of a single outbox event the dispatcher refused for its content; the event stays in the outbox and is retried hourly."}),
		actionsPruned: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricActionsPruned,
			Help: "Finished actions deleted from the runtime journal after the action retention."}),
		actionsExpired: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricActionsExpired,
			Help: "Action and cancel deliveries refused because the action may be older than the journal's prune horizon, or was routed before the journal served the replica."}),
		registerWait: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricRegisterWait,
			Help: "Seconds this process's start waited for a control plane that did not answer its registration (the longest such wait), 0 when it answered at once; the start fails when a wait reaches the register wait setting."}),
	}
	// Every code is a series from the start (at 0), so that rate() and
	// absence alerts see it before its first failure.
	for _, c := range []string{aip.CodeEventInvalid, aip.CodeEventNotAuthorized, aip.CodeEventUnavailable, aip.CodeEventCapacity,
		aip.CodeEventIdempotencyConflict, CodeEventTransport, CodeEventAnswerInvalid, CodeEventBatchInvalid, "other"} {
		m.eventFailures.WithLabelValues(metricCode(c))
	}
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricReady,
			Help: "1 when the lease is valid, the host is not draining, and storage and connector are ready."},
			func() float64 { return b2f(h.ready()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricStorageReady,
			Help: "1 when the last durable runtime storage probe succeeded and no journal write (an action's, an event batch's, a state value's) has failed for a storage reason since."},
			func() float64 { return b2f(h.storageOK()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricIngressWaiting, Help: ingressWaitingHelp,
			ConstLabels: prometheus.Labels{"reason": "budget"}},
			func() float64 { return float64(h.ingressBudget.Stats().WaitingBudget) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricIngressWaiting, Help: ingressWaitingHelp,
			ConstLabels: prometheus.Labels{"reason": "peer_share"}},
			func() float64 { return float64(h.ingressBudget.Stats().WaitingShare) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricAbandonedCalls,
			Help: "Connector calls still running after the host stopped waiting for them (handle grace passed); each keeps an in-flight slot."},
			func() float64 { return float64(h.abandoned.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricDegraded,
			Help: "1 while the connector's last health check passed but said part of it is degraded (the replica serves; /ready's connector detail names what fails)."},
			func() float64 { return b2f(h.connectorReady.Load() && h.connectorDegraded.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricInFlight,
			Help: "Actions currently executing in this process."},
			func() float64 { return float64(h.inflight.count()) }),
		m.requests, m.rejected, m.heartbeatFailures, m.recoveryAttempts, m.recoveries,
		m.eventsDelivered, m.eventFailures, m.eventsRefused, m.actionsPruned, m.actionsExpired, m.registerWait,
	)
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}
