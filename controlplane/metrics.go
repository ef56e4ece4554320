package controlplane

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/readbudget"
)

// Metric names of the service.
const (
	MetricRequests        = "aip_connector_control_requests_total"
	MetricRejections      = "aip_connector_control_rejections_total"
	MetricReplays         = "aip_connector_control_replays_total"
	MetricRequestDuration = "aip_connector_control_request_duration_seconds"
	MetricBatchCommands   = "aip_connector_control_batch_commands"
	MetricBatchDuration   = "aip_connector_control_batch_duration_seconds"
	MetricBatchFailures   = "aip_connector_control_batch_failures_total"
	MetricLeasesExpired   = "aip_connector_control_leases_expired_total"
	// MetricStrandedReleased counts reservations maintenance released on
	// replicas offline for longer than registry.StrandedReservationGrace
	// (no dispatcher settled them).
	MetricStrandedReleased  = "aip_connector_control_stranded_reservations_released_total"
	MetricMaintenanceErrors = "aip_connector_control_maintenance_failures_total"
	MetricMaintenanceLast   = "aip_connector_control_maintenance_last_success_timestamp_seconds"
	MetricReplicas          = "aip_connector_control_replicas"
	MetricReadyCapacity     = "aip_connector_control_ready_capacity"
	MetricActiveAssignments = "aip_connector_control_active_assignments"
	MetricRunning           = "aip_connector_control_running"
	// MetricEventsPruned counts events the event retention deleted.
	MetricEventsPruned = "aip_connector_control_events_pruned_total"
	// MetricEventPruneFailures counts event prunings that failed.
	MetricEventPruneFailures = "aip_connector_control_event_prune_failures_total"
	// MetricPrunedEventIDsForgotten counts IDs of pruned events the event
	// log forgot after Config.PrunedEventIDsRetention.
	MetricPrunedEventIDsForgotten = "aip_connector_control_pruned_event_ids_forgotten_total"
	// MetricPrunedEventIDsForgetFailures counts forgettings of pruned
	// event IDs that failed.
	MetricPrunedEventIDsForgetFailures = "aip_connector_control_pruned_event_ids_forget_failures_total"
	// MetricFleetViewRefusals counts fleet view requests refused 401 (not
	// an operator's).
	MetricFleetViewRefusals = "aip_connector_control_fleet_view_refusals_total"
	// MetricReadsWaiting counts the lifecycle requests waiting for the
	// read budget of their bodies (Config.MaxReadBytes), by reason.
	MetricReadsWaiting = "aip_connector_control_reads_waiting"
)

type metrics struct {
	reg               *prometheus.Registry
	requests          *prometheus.CounterVec
	rejections        *prometheus.CounterVec
	replays           *prometheus.CounterVec
	duration          *prometheus.HistogramVec
	batchCommands     prometheus.Histogram
	batchDuration     prometheus.Histogram
	batchFailures     prometheus.Counter
	leasesExpired     prometheus.Counter
	strandedReleased  prometheus.Counter
	maintenanceErrors prometheus.Counter
	maintenanceLast   prometheus.Gauge
	replicas          *prometheus.GaugeVec
	readyCapacity     prometheus.Gauge
	activeAssignments prometheus.Gauge
	eventsPruned      prometheus.Counter
	eventPruneErrors  prometheus.Counter
	idsForgotten      prometheus.Counter
	idForgetErrors    prometheus.Counter
	fleetViewRefusals prometheus.Counter
}

// Replica states of the aip_connector_control_replicas gauge.
var replicaStates = []string{"ready", "draining", "offline", "expired", "retired"}

func newMetrics(reg *prometheus.Registry, s *Service) (*metrics, error) {
	m := &metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRequests,
			Help: "Lifecycle requests answered, by operation (register, heartbeat, drain, offline, unknown) and outcome (lease, offline, unhealthy: a heartbeat with connector_ready false that took the replica offline, rejected, unavailable)."},
			[]string{"operation", "outcome"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricRejections,
			Help: "Rejected and unavailable lifecycle requests by reason: a check before the registry or the lifecycle rule."},
			[]string{"reason"}),
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{Name: MetricReplays,
			Help: "Exact committed lifecycle requests received again and answered with the committed outcome."},
			[]string{"operation"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: MetricRequestDuration,
			Help:    "Time to answer a lifecycle request, by operation.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2, 5}},
			[]string{"operation"}),
		batchCommands: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricBatchCommands,
			Help:    "Lifecycle commands coalesced into one registry call.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: MetricBatchDuration,
			Help:    "Duration of one registry lifecycle call.",
			Buckets: []float64{.0001, .0005, .001, .002, .005, .01, .02, .05, .1, .5, 1, 5}}),
		batchFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricBatchFailures,
			Help: "Registry lifecycle calls that failed as a whole (every command answered unavailable, nothing committed)."}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricLeasesExpired,
			Help: "Replicas whose stale lease the maintenance loop expired (reservations released)."}),
		strandedReleased: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricStrandedReleased,
			Help: "Reservations the maintenance loop released on replicas offline past the stranded-reservation grace (their dispatcher never settled them)."}),
		maintenanceErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricMaintenanceErrors,
			Help: "Maintenance cycles that failed."}),
		maintenanceLast: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricMaintenanceLast,
			Help: "Unix time of the last successful maintenance cycle."}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricReplicas,
			Help: "Replicas by state at the last maintenance cycle: ready and draining with a live lease, expired (ready or draining past their lease), offline."},
			[]string{"state"}),
		readyCapacity: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricReadyCapacity,
			Help: "Summed capacity of ready replicas with a live lease at the last maintenance cycle."}),
		activeAssignments: prometheus.NewGauge(prometheus.GaugeOpts{Name: MetricActiveAssignments,
			Help: "Summed active assignments of all replicas at the last maintenance cycle."}),
		eventsPruned: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricEventsPruned,
			Help: "Events of the fleet's event log deleted after the event retention."}),
		eventPruneErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricEventPruneFailures,
			Help: "Event log prunings that failed (the lease maintenance goes on)."}),
		idsForgotten: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricPrunedEventIDsForgotten,
			Help: "IDs of pruned events the event log forgot after the pruned-event-ID retention (delivered again, such an event is stored again)."}),
		idForgetErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricPrunedEventIDsForgetFailures,
			Help: "Forgettings of pruned event IDs that failed (the lease maintenance goes on)."}),
		fleetViewRefusals: prometheus.NewCounter(prometheus.CounterOpts{Name: MetricFleetViewRefusals,
			Help: "Fleet view requests refused 401 because they were not an operator's (Config.OperatorAuth)."}),
	}
	running := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricRunning,
		Help: "1 while the service's batch workers run."}, func() float64 {
		if s.running() {
			return 1
		}
		return 0
	})
	readsWaiting := func(reason string, f func(readbudget.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: MetricReadsWaiting,
			Help:        "Lifecycle requests waiting before their bodies are read, by reason: budget (the bodies being read before they are authenticated hold the whole read budget) or peer_share (their sender's other requests hold its share of it).",
			ConstLabels: prometheus.Labels{"reason": reason}}, func() float64 { return float64(f(s.reads.Stats())) })
	}
	// Every series of a fixed label set exists from the start (at 0), so
	// that rate() and absence alerts see it before its first event.
	for _, st := range replicaStates {
		m.replicas.WithLabelValues(st)
	}
	for _, op := range []string{string(aip.OpRegister), string(aip.OpHeartbeat), string(aip.OpDrain), string(aip.OpOffline), "unknown"} {
		for _, o := range []string{outcomeLease, outcomeOffline, outcomeRejected, outcomeUnavailable} {
			m.requests.WithLabelValues(op, o)
		}
		m.replays.WithLabelValues(op)
		m.duration.WithLabelValues(op)
	}
	m.requests.WithLabelValues(string(aip.OpHeartbeat), outcomeUnhealthy)
	for _, r := range []string{reasonTooLarge, reasonMalformed, reasonWindow, reasonNotProvisioned, reasonSigner, reasonSignature,
		reasonReplicaBusy, reasonRead, reasonStore, reasonNotRunning, reasonHeld, reasonSenderGone} {
		m.rejections.WithLabelValues(r)
	}
	for _, c := range []prometheus.Collector{
		m.requests, m.rejections, m.replays, m.duration, m.batchCommands, m.batchDuration, m.batchFailures,
		m.leasesExpired, m.strandedReleased, m.maintenanceErrors, m.maintenanceLast, m.replicas, m.readyCapacity, m.activeAssignments, running,
		m.eventsPruned, m.eventPruneErrors, m.idsForgotten, m.idForgetErrors, m.fleetViewRefusals,
		readsWaiting("budget", func(st readbudget.Stats) int { return st.WaitingBudget }),
		readsWaiting("peer_share", func(st readbudget.Stats) int { return st.WaitingShare }),
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

func (m *metrics) observeRequest(a *answer, d time.Duration) {
	op := a.label()
	outcome := outcomeLease
	switch {
	case a.outcome.Status == aip.OutcomeOffline:
		outcome = outcomeOffline
	case a.outcome.Status == aip.OutcomeLease && a.unhealthy:
		outcome = outcomeUnhealthy
	case a.outcome.Status == aip.OutcomeRejected && a.outcome.Retryable:
		outcome = outcomeUnavailable
	case a.outcome.Status == aip.OutcomeRejected:
		outcome = outcomeRejected
	}
	m.requests.WithLabelValues(op, outcome).Inc()
	if a.reason != "" {
		m.rejections.WithLabelValues(a.reason).Inc()
	}
	if a.replayed {
		m.replays.WithLabelValues(op).Inc()
	}
	m.duration.WithLabelValues(op).Observe(d.Seconds())
}

func (m *metrics) observeBatch(n int, d time.Duration, err error) {
	m.batchCommands.Observe(float64(n))
	m.batchDuration.Observe(d.Seconds())
	if err != nil {
		m.batchFailures.Inc()
	}
}
