package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/errgroup"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/onchange"
	"github.com/aipfleet/aipfleet/internal/promruntime"
	"github.com/aipfleet/aipfleet/internal/readbudget"
	"github.com/aipfleet/aipfleet/registry"
)

// Component names the service in health, readiness and logs.
const Component = "aipfleet-control-plane"

// Store is the registry view the service needs: lifecycle writes and fleet
// status, on the data pool. A store may also implement
// registry.ReplicaLister (for GET /aip/v1/fleet/replicas) and
// registry.Readiness (for the store checks of GET /ready); the service
// detects both by type assertion.
type Store interface {
	registry.Lifecycle
	registry.FleetStatus
}

// Defaults of Config.
const (
	DefaultMaxBatch              = 256
	DefaultBatchWorkers          = 4
	DefaultStoreTimeout          = 5 * time.Second
	DefaultMaintenanceInterval   = time.Second
	DefaultExpiryBatchSize       = 500
	DefaultExpiryMaxBatches      = 8
	DefaultMaintenanceMaxBackoff = 30 * time.Second
	DefaultReplicaCacheSize      = 100_000
	// DefaultMaxReadBytes is the default read budget of lifecycle request
	// bodies (Config.MaxReadBytes): 256 bodies of the largest size at
	// once, a quarter of them from one address.
	DefaultMaxReadBytes = 256 * aip.MaxControlBytes
	// DefaultEventRetention is how long the event log keeps an event by
	// default (as upstream keeps runtime events).
	DefaultEventRetention = 30 * 24 * time.Hour
	// MinEventRetention is the shortest event retention accepted.
	MinEventRetention = time.Hour
	// KeepEventsForever, as Config.EventRetention, never prunes events.
	KeepEventsForever time.Duration = -1
	// DefaultPrunedEventIDsRetention is how long, by default, the event
	// log remembers the ID of an event it pruned, counted from the event's
	// receipt: a host delivering the event again within it is answered
	// without the event being stored twice.
	DefaultPrunedEventIDsRetention = 365 * 24 * time.Hour
	// KeepPrunedEventIDsForever, as Config.PrunedEventIDsRetention,
	// never forgets the ID of a pruned event.
	KeepPrunedEventIDsForever time.Duration = -1
	// eventPruneEvery is how often, at most, maintenance prunes events
	// and forgets pruned IDs (unless the last pruning stopped at its bound
	// with events or IDs left: then the next cycle goes on), and
	// eventPruneBatch and eventPruneMaxBatches bound one pruning of each.
	eventPruneEvery      = time.Minute
	eventPruneBatch      = 1000
	eventPruneMaxBatches = 10
)

// Config configures a Service. The zero value is usable: every zero field
// means its documented default.
type Config struct {
	// LeaseTTL is the lease granted by register, healthy heartbeats and
	// drain, in [registry.MinLeaseTTL, registry.MaxLeaseTTL]. Defaults to
	// 30s.
	LeaseTTL time.Duration
	// Now is the clock of the freshness window and of signed responses.
	// The store keeps its own clock for the lifecycle rules; give both the
	// same clock in tests. Defaults to time.Now.
	Now func() time.Time
	// Logger receives the service's logs. Defaults to a logger that
	// discards.
	Logger *slog.Logger
	// Metrics is the registry the service's collectors are registered on.
	// Defaults to a new registry, served at /metrics.
	Metrics *prometheus.Registry
	// TracerProvider provides the tracer for lifecycle spans. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider

	// MaxBatch bounds the requests coalesced into one ApplyLifecycle call,
	// in [1, registry.MaxLifecycleBatch]. 1 disables coalescing. Defaults
	// to 256.
	MaxBatch int
	// BatchWorkers is the number of ApplyLifecycle calls in flight at once.
	// Defaults to 4: on PostgreSQL each call waits for its commit's WAL
	// flush, so more calls in flight overlap those waits (measured with
	// heartbeat-bench, 64 clients, fsync on: 2 workers 2 100/s, 4 workers
	// 3 300-7 200/s).
	BatchWorkers int
	// StoreTimeout bounds one ApplyLifecycle call, and each store call of
	// a maintenance cycle. A lifecycle call that runs out is answered 503
	// (nothing committed); a maintenance call that runs out fails its
	// cycle. Defaults to 5s.
	StoreTimeout time.Duration
	// ReplicaCacheSize bounds the cached replica keys (a replica's DID is
	// part of its fixed identity, so it never goes stale). Defaults to
	// 100 000.
	ReplicaCacheSize int
	// MaxReadBytes bounds the bytes of the lifecycle request bodies being
	// read at once, before they can be authenticated: each reserves its
	// Content-Length (aip.MaxControlBytes without one) until it is read,
	// one address (an IPv6 /64) at most a quarter of the budget (at least
	// one body), so a sender that trickles its bodies over many
	// connections makes its own requests wait, not every host's. A body
	// must then arrive at 256 KiB/s after a 5 s grace. Defaults to
	// DefaultMaxReadBytes (16 MiB); at least aip.MaxControlBytes.
	MaxReadBytes int64

	// MaintenanceInterval is the pause between maintenance cycles. Defaults
	// to 1s.
	MaintenanceInterval time.Duration
	// ExpiryBatchSize and ExpiryMaxBatches bound the stale replicas one
	// cycle expires: up to ExpiryMaxBatches calls of ExpireStaleReplicas
	// with ExpiryBatchSize. Default to 500 and 8.
	ExpiryBatchSize  int
	ExpiryMaxBatches int
	// MaintenanceMaxBackoff caps the exponential backoff (with jitter)
	// after storage errors. Defaults to 30s.
	MaintenanceMaxBackoff time.Duration
	// DisableMaintenance turns the maintenance loop off (for processes
	// where another component maintains leases).
	DisableMaintenance bool
	// EventRetention is how long the fleet's event log keeps an event
	// after the dispatcher received it: when the store implements
	// registry.EventPruner, maintenance deletes older events, at most once
	// a minute. Defaults to 30 days; at least MinEventRetention;
	// KeepEventsForever keeps them all.
	EventRetention time.Duration
	// PrunedEventIDsRetention is how long the event log remembers the ID
	// of an event it pruned, counted from the event's receipt (so it
	// bounds the storage of those IDs as EventRetention bounds the
	// events'): when the store implements registry.EventPruner,
	// maintenance forgets older IDs, at most once a minute, after pruning
	// events. A host that delivers an event again after its ID was
	// forgotten has it stored a second time. Defaults to 365 days; at
	// least MinEventRetention and EventRetention (a shorter one would
	// forget IDs as soon as their events are pruned);
	// KeepPrunedEventIDsForever keeps them all.
	PrunedEventIDsRetention time.Duration

	// OperatorAuth decides whether a request is an operator's: nil admits
	// it; an error refuses it, and its text is the reason of the 401
	// answer (say what to send). Operators read the fleet views
	// (PathFleetStatus, PathFleetReplicas) and the detail of failing
	// /ready checks. Nil admits no one: the fleet views answer 401, and
	// the detail of /ready goes only to local peers (see
	// HideLocalReadyDetail; every peer still sees which checks fail).
	// AllowEveryone opens both to every peer.
	OperatorAuth func(r *http.Request) error
	// HideLocalReadyDetail keeps the messages of failing /ready checks
	// (storage errors name database hosts and roles) from local peers
	// too, leaving them to operators and the log. By default a request
	// from a loopback peer that carries no proxy forwarding header
	// (netutil.IsLocalUnproxied) reads them; set this behind a proxy on
	// the same machine that adds no such header (an Istio sidecar's
	// inbound listener, for one), where every caller is a loopback peer.
	HideLocalReadyDetail bool
}

// AllowEveryone is an OperatorAuth that admits every request: for a
// control plane reachable only from a trusted network.
func AllowEveryone(*http.Request) error { return nil }

func (c Config) withDefaults() Config {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = registry.DefaultLeaseTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Metrics == nil {
		c.Metrics = prometheus.NewRegistry()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = DefaultMaxBatch
	}
	if c.BatchWorkers == 0 {
		c.BatchWorkers = DefaultBatchWorkers
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = DefaultStoreTimeout
	}
	if c.ReplicaCacheSize == 0 {
		c.ReplicaCacheSize = DefaultReplicaCacheSize
	}
	if c.MaxReadBytes == 0 {
		c.MaxReadBytes = DefaultMaxReadBytes
	}
	if c.MaintenanceInterval == 0 {
		c.MaintenanceInterval = DefaultMaintenanceInterval
	}
	if c.ExpiryBatchSize == 0 {
		c.ExpiryBatchSize = DefaultExpiryBatchSize
	}
	if c.ExpiryMaxBatches == 0 {
		c.ExpiryMaxBatches = DefaultExpiryMaxBatches
	}
	if c.MaintenanceMaxBackoff == 0 {
		c.MaintenanceMaxBackoff = DefaultMaintenanceMaxBackoff
	}
	if c.EventRetention == 0 {
		c.EventRetention = DefaultEventRetention
	}
	if c.PrunedEventIDsRetention == 0 {
		c.PrunedEventIDsRetention = DefaultPrunedEventIDsRetention
	}
	return c
}

// MaxBatchWorkers bounds Config.BatchWorkers.
const MaxBatchWorkers = 64

// ConfigError reports a Config field whose value New refuses.
type ConfigError struct {
	// Field names the Config field, e.g. "LeaseTTL".
	Field string
	// Value is the refused value, formatted.
	Value string
	// Problem says what is wrong with it, e.g. "is outside 1s..5m0s".
	Problem string
}

func (e *ConfigError) Error() string {
	return "controlplane: Config." + e.Field + " " + e.Value + " " + e.Problem
}

// Validate reports whether New accepts c, once its zero fields take their
// defaults. Its errors are *ConfigError.
func (c Config) Validate() error {
	c = c.withDefaults()
	return c.validate()
}

// validate checks a Config whose defaults are applied.
func (c *Config) validate() error {
	bad := func(field string, value any, format string, args ...any) error {
		return &ConfigError{Field: field, Value: fmt.Sprint(value), Problem: fmt.Sprintf(format, args...)}
	}
	switch {
	case c.LeaseTTL < registry.MinLeaseTTL || c.LeaseTTL > registry.MaxLeaseTTL:
		return bad("LeaseTTL", c.LeaseTTL, "is outside %s..%s", registry.MinLeaseTTL, registry.MaxLeaseTTL)
	case c.MaxBatch < 1 || c.MaxBatch > registry.MaxLifecycleBatch:
		return bad("MaxBatch", c.MaxBatch, "is outside 1..%d", registry.MaxLifecycleBatch)
	case c.BatchWorkers < 1 || c.BatchWorkers > MaxBatchWorkers:
		return bad("BatchWorkers", c.BatchWorkers, "is outside 1..%d", MaxBatchWorkers)
	case c.StoreTimeout < 0:
		return bad("StoreTimeout", c.StoreTimeout, "is negative")
	case c.ReplicaCacheSize < 1:
		return bad("ReplicaCacheSize", c.ReplicaCacheSize, "must be positive")
	case c.MaxReadBytes < aip.MaxControlBytes:
		return bad("MaxReadBytes", c.MaxReadBytes, "is below %d, the largest lifecycle request", aip.MaxControlBytes)
	case c.MaintenanceInterval < time.Millisecond:
		return bad("MaintenanceInterval", c.MaintenanceInterval, "is below 1ms")
	case c.ExpiryBatchSize < 1:
		return bad("ExpiryBatchSize", c.ExpiryBatchSize, "must be positive")
	case c.ExpiryMaxBatches < 1:
		return bad("ExpiryMaxBatches", c.ExpiryMaxBatches, "must be positive")
	case c.MaintenanceMaxBackoff < c.MaintenanceInterval:
		return bad("MaintenanceMaxBackoff", c.MaintenanceMaxBackoff, "is below MaintenanceInterval %s", c.MaintenanceInterval)
	case c.EventRetention != KeepEventsForever && c.EventRetention < MinEventRetention:
		return bad("EventRetention", c.EventRetention, "is below %s (KeepEventsForever keeps every event)", MinEventRetention)
	case c.PrunedEventIDsRetention != KeepPrunedEventIDsForever && c.PrunedEventIDsRetention < MinEventRetention:
		return bad("PrunedEventIDsRetention", c.PrunedEventIDsRetention, "is below %s (KeepPrunedEventIDsForever keeps the IDs of pruned events)", MinEventRetention)
	case c.PrunedEventIDsRetention != KeepPrunedEventIDsForever && c.EventRetention != KeepEventsForever && c.PrunedEventIDsRetention < c.EventRetention:
		return bad("PrunedEventIDsRetention", c.PrunedEventIDsRetention,
			"is below EventRetention %s: the ID of a pruned event would be forgotten with it, and a host delivering it again would have it stored twice; give at least EventRetention", c.EventRetention)
	}
	return nil
}

// ErrNotRunning is returned (wrapped) for requests that arrive while the
// service's Run is not running; they are answered 503.
var ErrNotRunning = errors.New("controlplane: the lifecycle service is not running")

// Service is the lifecycle service. Create it with New, start its workers
// with Run (or everything with Serve) and serve Handler.
type Service struct {
	cfg     Config
	key     *aip.SigningKey
	store   Store
	lister  registry.ReplicaLister
	probe   registry.Readiness
	log     *slog.Logger
	tracer  trace.Tracer
	m       *metrics
	keys    *replicaKeys
	batch   *batcher
	busy    replicaSlots       // each replica's requests being decided
	reads   *readbudget.Budget // lifecycle request bodies being read (Config.MaxReadBytes)
	jwks    []byte
	handler http.Handler
	// seal signs answers; tests replace it to exercise the unsigned 500.
	seal func(key *aip.SigningKey, field string, inner any) ([]byte, error)

	state   atomic.Int32  // stateNew, stateRunning, stateStopped
	started chan struct{} // closed when Run has started
	maint   maintenanceState
	// pruner is the store's event retention (nil: none, or both
	// retentions keep for ever); lastEventPrune is when maintenance last
	// ran it, zero when that run stopped at its batch bound with events or
	// IDs left (guarded by pruneMu).
	pruner         registry.EventPruner
	pruneMu        sync.Mutex
	lastEventPrune time.Time
	// notReady is the detail of the failing /ready checks last logged
	// ("" while ready), so a failure is logged when it changes, not at
	// every probe.
	notReady onchange.Text
	// storeDown is set from the first lifecycle request answered
	// unavailable because the registry failed until one is decided
	// again, so an outage is logged when it starts and ends (logAnswer).
	storeDown atomic.Bool
	// stall notices the service's own stops; windowRejected holds the
	// request IDs recently rejected for their window (stall.go).
	stall          stallWatch
	windowRejected recentRejections
}

const (
	stateNew int32 = iota
	stateRunning
	stateStopped
)

// New returns a service that signs with key and keeps state in store. It
// validates cfg and registers its metrics; it starts nothing.
func New(key *aip.SigningKey, store Store, cfg Config) (*Service, error) {
	if key == nil {
		return nil, errors.New("controlplane: no signing key")
	}
	if store == nil {
		return nil, errors.New("controlplane: no store")
	}
	ownMetrics := cfg.Metrics == nil
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	jwks, err := aip.JWKS(key.PublicKey())
	if err != nil {
		return nil, err
	}
	s := &Service{
		cfg:     cfg,
		key:     key,
		store:   store,
		log:     cfg.Logger.With("component", Component, "did", key.DID()),
		tracer:  cfg.TracerProvider.Tracer("github.com/aipfleet/aipfleet/controlplane"),
		keys:    newReplicaKeys(store, cfg.ReplicaCacheSize),
		jwks:    jwks,
		started: make(chan struct{}),
		seal:    aip.Seal,
	}
	share := max(cfg.MaxReadBytes/readbudget.DefaultPeerShareDivisor, aip.MaxControlBytes)
	if s.reads, err = readbudget.New(readbudget.Config{Total: cfg.MaxReadBytes, PeerShare: share}); err != nil {
		return nil, err
	}
	s.lister, _ = store.(registry.ReplicaLister)
	s.probe, _ = store.(registry.Readiness)
	if cfg.EventRetention != KeepEventsForever || cfg.PrunedEventIDsRetention != KeepPrunedEventIDsForever {
		s.pruner, _ = store.(registry.EventPruner)
	}
	if s.m, err = newMetrics(cfg.Metrics, s); err != nil {
		return nil, err
	}
	if ownMetrics {
		if err := promruntime.Register(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	s.batch = newBatcher(store, cfg.MaxBatch, cfg.BatchWorkers, cfg.StoreTimeout, s.m)
	s.handler = s.routes()
	return s, nil
}

// DID returns the did:key the service signs with; hosts pin it.
func (s *Service) DID() string { return s.key.DID() }

// Handler returns the service's HTTP handler (every route in routes.go).
// Lifecycle requests are answered 503 unless Run is running.
func (s *Service) Handler() http.Handler { return s.handler }

// Run runs the batch workers and the maintenance loop until ctx is done,
// then waits for them: a batch already handed to the store completes (its
// requests are answered); requests still queued are answered 503 without
// being applied. Run may be called once; it returns nil after ctx ends.
func (s *Service) Run(ctx context.Context) error {
	if !s.state.CompareAndSwap(stateNew, stateRunning) {
		return errors.New("controlplane: Run called twice")
	}
	s.stall.tick(s.cfg.Now()) // running from here (before any request is applied)
	close(s.started)
	defer s.state.Store(stateStopped)
	s.log.Info("lifecycle service running", "lease_ttl", s.cfg.LeaseTTL.String(), "max_batch", s.cfg.MaxBatch, "batch_workers", s.cfg.BatchWorkers)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { s.batch.run(gctx); return nil })
	g.Go(func() error { s.watchStalls(gctx); return nil })
	if !s.cfg.DisableMaintenance {
		g.Go(func() error { s.runMaintenance(gctx); return nil })
	}
	return g.Wait()
}

func (s *Service) running() bool { return s.state.Load() == stateRunning }

// Started returns a channel that is closed once Run has started: from then
// on lifecycle requests are applied (until Run returns).
func (s *Service) Started() <-chan struct{} { return s.started }

// ServeConfig configures Serve.
type ServeConfig struct {
	// TLSConfig, when set, makes Serve speak HTTPS with it.
	TLSConfig *tls.Config
	// ShutdownTimeout bounds the graceful HTTP shutdown. Defaults to 10s.
	ShutdownTimeout time.Duration
}

// NewHTTPServer returns the http.Server the service is served with: explicit
// header, read, write and idle timeouts and a bounded header size (bodies
// are bounded by the handlers).
func NewHTTPServer(h http.Handler, tlsConfig *tls.Config, logger *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           h,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
}

// Serve runs the service and serves it on ln until ctx is done. It starts
// answering HTTP only once Run is running, so no request that reaches a
// freshly started control plane is refused as "not running" (connections
// made before then wait in ln's backlog). It shuts down in this order:
//
//  1. the HTTP server stops accepting and waits (up to ShutdownTimeout) for
//     the requests in flight, which wait for their batches;
//  2. the batch workers and the maintenance loop are stopped and awaited
//     (Run returns);
//  3. Serve returns; the caller closes the store afterwards.
//
// It returns the first error of the server or of Run.
func (s *Service) Serve(ctx context.Context, ln net.Listener, sc ServeConfig) error {
	if sc.ShutdownTimeout == 0 {
		sc.ShutdownTimeout = 10 * time.Second
	}
	srv := NewHTTPServer(s.Handler(), sc.TLSConfig, s.log)
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(runCtx) }()
	select {
	case <-s.started:
	case err := <-runDone:
		ln.Close()
		return err
	}
	serveDone := make(chan error, 1)
	go func() {
		var err error
		if sc.TLSConfig != nil {
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		serveDone <- err
	}()
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-serveDone:
		serveDone = nil
	case err := <-runDone:
		// Run ended on its own (it only does so on error).
		srv.Close()
		if serveDone != nil {
			<-serveDone
		}
		return err
	}
	// 1.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sc.ShutdownTimeout)
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
		serveErr = errors.Join(serveErr, fmt.Errorf("graceful HTTP shutdown: %w", err))
	}
	cancel()
	if serveDone != nil {
		serveErr = errors.Join(serveErr, <-serveDone)
	}
	// 2.
	stopRun()
	return errors.Join(serveErr, <-runDone)
}
