package dispatch

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/internal/logthrottle"
	"github.com/aipfleet/aipfleet/internal/onchange"
	"github.com/aipfleet/aipfleet/internal/promruntime"
	"github.com/aipfleet/aipfleet/internal/readbudget"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
)

// Defaults of Config.
const (
	DefaultAddr          = "127.0.0.1:8080"
	DefaultActionTimeout = 30 * time.Second
	DefaultMaxTimeout    = 5 * time.Minute
	DefaultMaxReroutes   = 2
	DefaultMaxBodyBytes  = 4 << 20
	// DefaultMaxEventDeliveries is Config.MaxEventDeliveries' default.
	DefaultMaxEventDeliveries = 128
	// DefaultMaxActionReadBytes is Config.MaxActionReadBytes' default.
	DefaultMaxActionReadBytes = 64 << 20
	// DefaultMaxEventBodyBytes is Config.MaxEventBodyBytes' default.
	DefaultMaxEventBodyBytes = 64 << 20
	DefaultRegistryTimeout   = 5 * time.Second
	DefaultStatusTimeout     = 5 * time.Second
	// DefaultStreamWriteTimeout is Config.StreamWriteTimeout's default.
	DefaultStreamWriteTimeout = 10 * time.Second
	// DefaultMaxTenantReplicaCalls is the default of
	// Config.MaxTenantReplicaCalls.
	DefaultMaxTenantReplicaCalls = 32
	DefaultShutdownTimeout       = 30 * time.Second
	// DefaultHopSlack is how much longer the dispatcher waits for the
	// replica than the action's timeout, so the replica's own answer to a
	// connector that overran (outcome unknown, journaled) arrives first.
	DefaultHopSlack = time.Second
)

// Config configures a Dispatcher. SigningKey and PrincipalID are
// required; every other zero field means its documented default.
type Config struct {
	// SigningKey is the dispatcher's key: the gateway DID every host pins
	// (--gateway-did). Required.
	SigningKey *aip.SigningKey
	// PrincipalID is the gateway principal every host pins
	// (--gateway-principal-id), a service principal. Required.
	PrincipalID string
	// Listener is where Run serves. When nil Run listens on Addr.
	Listener net.Listener
	// Addr is the listen address when Listener is nil. Defaults to
	// 127.0.0.1:8080.
	Addr string
	// TLSConfig, when set, makes Run serve HTTPS.
	TLSConfig *tls.Config
	// Admission bounds the fair admission scheduler.
	Admission AdmissionLimits
	// Topology is the deployment's placement preference for new routes.
	Topology registry.RouteTopologyPreference
	// ActionTimeout bounds an action that names no timeout_ms. Defaults to
	// 30s.
	ActionTimeout time.Duration
	// MaxTimeout bounds timeout_ms. Defaults to 5m.
	MaxTimeout time.Duration
	// HopSlack is added to the action timeout for the HTTP hop. Defaults
	// to 1s.
	HopSlack time.Duration
	// MaxReroutes bounds the provably-not-started reroutes of one request.
	// Defaults to 2; negative disables rerouting.
	MaxReroutes int
	// MaxBodyBytes bounds a request body. Defaults to 4 MiB.
	MaxBodyBytes int64
	// MaxActionReadBytes bounds the bytes of action request bodies (POST
	// /aip/v1/actions) being read into memory at once, before admission
	// control counts them: a request reserves its Content-Length (or
	// MaxBodyBytes when it names none) before its body is read and gives
	// it back once the body is read. One tenant holds at most a quarter of
	// it (at least MaxBodyBytes), so a tenant trickling many large bodies
	// neither holds unbounded memory nor delays other tenants' reads; a
	// body must arrive at 256 KiB/s after a 5 s grace. See
	// docs/dispatch-api.md. Defaults to 64 MiB; at least MaxBodyBytes.
	MaxActionReadBytes int64
	// MaxEventDeliveries bounds the connector-event deliveries the
	// dispatcher works on at once (each may hold 4 MiB); one more is
	// refused with a temporary connector_event.capacity, and its host
	// retries. Defaults to 128 (reference §7.4).
	MaxEventDeliveries int
	// MaxEventBodyBytes bounds the bytes of connector-event deliveries
	// read into memory at once: before its body is read (the ingress needs
	// no token), a delivery waits for its share of this budget — its
	// Content-Length, or the largest delivery (aip.MaxEventDeliveryBytes)
	// when it names none — and holds it until answered. One sender address
	// (an IPv6 /64) holds at most a quarter of it (at least the largest
	// delivery), so a sender that trickles many bodies cannot starve the
	// other hosts; see docs/dispatch-api.md. Defaults to 64 MiB; at least
	// aip.MaxEventDeliveryBytes.
	MaxEventBodyBytes int64
	// TokenCacheSize bounds the cache of verified bearer tokens (a token is
	// trusted again without verification until its expiry, at most 5
	// minutes). Defaults to 4096; negative disables the cache.
	TokenCacheSize int
	// RegistryTimeout bounds each registry call made after admission
	// (resolve, reroute, settle). Defaults to 5s.
	RegistryTimeout time.Duration
	// StatusTimeout bounds the status query to a replica. Defaults to 5s.
	StatusTimeout time.Duration
	// StreamWriteTimeout bounds the write of each line of a streaming
	// answer to its client. A client that reads none of a line for this
	// long is taken as gone: the dispatcher stops writing to it and goes
	// on reading the replica's stream, so the action still settles by its
	// own outcome (a client that stops reading would otherwise hold up the
	// replica's stream until the hop's deadline, and a completed action
	// would settle outcome_unknown). Defaults to 10s.
	StreamWriteTimeout time.Duration
	// MaxTenantReplicaCalls bounds a tenant's status reads and cancels in
	// flight at once (each sends a signed message to a replica outside the
	// fair admission of actions, so that a cancel or a status read never
	// waits behind the tenant's running actions); one more is answered 429
	// connector.scheduler_overloaded. Defaults to 32.
	MaxTenantReplicaCalls int
	// ShutdownTimeout bounds Run's wait for in-flight requests and for the
	// pending settlement retries. Defaults to 30s.
	ShutdownTimeout time.Duration
	// SettleRetryTimeout is how long a settlement the registry did not
	// confirm (a storage failure or a timeout) is retried in the
	// background, so its route's reservation is released once the registry
	// is back. It bounds the same way the background release of a
	// reservation a failed Resolve or Reroute may have made for an action
	// that was never sent (unsent.go). Defaults to 2m; negative disables
	// the retries (such a release is then tried once).
	SettleRetryTimeout time.Duration
	// ReconcileInterval is how often Run settles orphaned reservations
	// (Reconcile) when Deps.Reservations is set. Defaults to 1m; negative
	// disables it.
	ReconcileInterval time.Duration
	// HideLocalReadyDetail keeps the registry's error text in /ready
	// (it names database hosts and roles) from local peers too, leaving
	// it to the log. By default a request from a loopback peer that
	// carries no proxy forwarding header (netutil.IsLocalUnproxied)
	// reads it; set this behind a proxy on the same machine that adds no
	// such header (an Istio sidecar's inbound listener, for one), where
	// every caller is a loopback peer.
	HideLocalReadyDetail bool
	// ReconcileAfter is how long after it was last handed out a
	// reservation still held counts as orphaned. It must be longer than an
	// action can be in flight (MaxTimeout + HopSlack + RegistryTimeout).
	// Defaults to 10m, or twice that bound when it is longer. (An action
	// its replica never received is settled only once no envelope sent at
	// the last handout can be accepted any more, aip.MaxEnvelopeAge +
	// aip.MaxEnvelopeSkew after it, whatever this is.)
	ReconcileAfter time.Duration
	// ReconcileBatch bounds the orphaned reservations one pass settles.
	// Defaults to 100.
	ReconcileBatch int
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// Logger defaults to a logger that discards.
	Logger *slog.Logger
	// Metrics is the registry the dispatcher's collectors join; /metrics
	// serves it. Defaults to a registry of its own.
	Metrics *prometheus.Registry
	// TracerProvider defaults to otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.ActionTimeout == 0 {
		c.ActionTimeout = DefaultActionTimeout
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = DefaultMaxTimeout
	}
	if c.HopSlack == 0 {
		c.HopSlack = DefaultHopSlack
	}
	if c.MaxReroutes == 0 {
		c.MaxReroutes = DefaultMaxReroutes
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.MaxActionReadBytes == 0 {
		c.MaxActionReadBytes = max(DefaultMaxActionReadBytes, c.MaxBodyBytes)
	}
	if c.MaxEventDeliveries == 0 {
		c.MaxEventDeliveries = DefaultMaxEventDeliveries
	}
	if c.MaxEventBodyBytes == 0 {
		c.MaxEventBodyBytes = DefaultMaxEventBodyBytes
	}
	if c.TokenCacheSize == 0 {
		c.TokenCacheSize = DefaultTokenCacheSize
	}
	if c.RegistryTimeout == 0 {
		c.RegistryTimeout = DefaultRegistryTimeout
	}
	if c.StatusTimeout == 0 {
		c.StatusTimeout = DefaultStatusTimeout
	}
	if c.StreamWriteTimeout == 0 {
		c.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	if c.MaxTenantReplicaCalls == 0 {
		c.MaxTenantReplicaCalls = DefaultMaxTenantReplicaCalls
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.SettleRetryTimeout == 0 {
		c.SettleRetryTimeout = DefaultSettleRetryTimeout
	}
	if c.ReconcileInterval == 0 {
		c.ReconcileInterval = DefaultReconcileInterval
	}
	if c.ReconcileAfter == 0 {
		c.ReconcileAfter = max(DefaultReconcileAfter, 2*(c.MaxTimeout+c.HopSlack+c.RegistryTimeout))
	}
	if c.ReconcileBatch == 0 {
		c.ReconcileBatch = DefaultReconcileBatch
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
	return c
}

// TokenVerifier verifies a bearer token and returns its claims; the tenant
// of every API request is the verified token's, never the payload's.
// *tenanttoken.Verifier implements it.
type TokenVerifier interface {
	Verify(token string) (tenanttoken.Claims, error)
}

// Deps are the dispatcher's collaborators.
type Deps struct {
	// Resolver creates, reads and settles routes. Required.
	Resolver registry.Resolver
	// Catalog serves the tenant catalog. Required.
	Catalog registry.Catalog
	// Tokens verifies bearer tokens. Required.
	Tokens TokenVerifier
	// Rerouter moves an action off a replica that provably did not start
	// it. Optional: nil never reroutes.
	Rerouter registry.Rerouter
	// Client posts native envelopes to replicas. Optional: defaults to a
	// client of the dispatcher's own with pooled keep-alive connections.
	// Its CheckRedirect is not used: the dispatcher never follows a
	// replica's redirect. When its Transport is an *http.Transport (or
	// nil while http.DefaultTransport is one), a hop that net/http's own
	// connection path took (httptrace GetConn) and that never got a
	// connection (no GotConn) is known not delivered
	// (dispatch.replica_unreachable); any other RoundTripper, or an
	// alternate protocol registered on the transport (RegisterProtocol),
	// may have sent bytes its own way, so its failures stay
	// outcome_unknown. A TLSNextProto entry of the embedder's own must
	// fire GotConn before it writes, as net/http's HTTP/2 does.
	Client *http.Client
	// Ready probes the registry for /ready. Optional.
	Ready func(ctx context.Context) error
	// Reservations lists and settles orphaned reservations for Reconcile.
	// Optional: nil never reconciles.
	Reservations Orphans
	// Events is the fleet's event log: the connector-event ingress
	// (POST aip.EventsPath) appends verified deliveries to it and GET
	// PathEvents reads it. Optional: when nil both routes answer 503
	// connector_event.unavailable.
	Events registry.EventLog
	// Records reads the replica, instance and version an event delivery
	// names. Required with Events.
	Records registry.Reader
}

// ErrConfig is returned (wrapped) by New for an invalid Config or Deps.
var ErrConfig = errors.New("dispatch: invalid configuration")

// Dispatcher is the central side of a route: the action entry point, fair
// admission, resolution, the signed hop to the pinned replica, the
// provably-not-started reroute and settlement.
type Dispatcher struct {
	cfg       Config
	deps      Deps
	key       *aip.SigningKey
	principal aip.Principal // without trust domain: each hop uses the assignment's
	sched     *Scheduler
	client    *http.Client
	ownClient bool
	log       *slog.Logger
	tracer    trace.Tracer
	prop      propagation.TextMapPropagator // W3C trace context only: no caller's baggage is signed into an envelope
	m         *metrics
	jwks      []byte
	handler   http.Handler
	stopping  atomic.Bool
	// notReady is the registry readiness error last logged ("" when
	// ready), so /ready logs a failure when it changes.
	notReady onchange.Text
	retries  *settleRetries
	// unsentPending counts the releases of unsent hand-outs pending in
	// the background, at most maxUnsentPending (unsent.go).
	unsentPending    atomic.Int64
	maxUnsentPending int
	// unsentOverflowed is set while releases beyond maxUnsentPending are
	// being given up, so that the outage that causes them is logged once,
	// not once per failed request (cleared when the pending ones drain).
	unsentOverflowed atomic.Bool
	// eventSlots holds one token per connector-event delivery in work.
	eventSlots chan struct{}
	// eventBodies is the budget of delivery bytes read into memory, with
	// a share per sender address (see receiveEvents).
	eventBodies *readbudget.Budget
	// actionBodies is the budget of action request bytes being read into
	// memory, with a share per tenant (readActionBody).
	actionBodies *readbudget.Budget
	// replicaCalls counts each tenant's status reads and cancels in flight
	// (MaxTenantReplicaCalls), guarded by replicaCallsMu.
	replicaCallsMu sync.Mutex
	replicaCalls   map[string]int
	// hopLogs throttles the log of failed hops by replica.
	hopLogs logthrottle.Throttle
}

// replicaCall takes one of the tenant's MaxTenantReplicaCalls (a status
// read or a cancel sent to a replica) and returns its release, or the 429
// to answer when the tenant has them all in flight.
func (d *Dispatcher) replicaCall(tenant string) (func(), *apiError) {
	d.replicaCallsMu.Lock()
	defer d.replicaCallsMu.Unlock()
	if d.replicaCalls[tenant] >= d.cfg.MaxTenantReplicaCalls {
		return nil, newAPIError(http.StatusTooManyRequests, CodeSchedulerOverloaded, aip.CategoryTemporary, true, time.Second,
			fmt.Sprintf("the tenant has %d status reads and cancels in flight, the most the dispatcher runs at once; retry when one has answered", d.cfg.MaxTenantReplicaCalls))
	}
	d.replicaCalls[tenant]++
	var once sync.Once
	return func() {
		once.Do(func() {
			d.replicaCallsMu.Lock()
			defer d.replicaCallsMu.Unlock()
			if d.replicaCalls[tenant]--; d.replicaCalls[tenant] <= 0 {
				delete(d.replicaCalls, tenant)
			}
		})
	}, nil
}

// New validates the configuration and returns a dispatcher. It does no I/O
// and starts no goroutines.
func New(cfg Config, deps Deps) (*Dispatcher, error) {
	ownMetrics := cfg.Metrics == nil
	cfg = cfg.withDefaults()
	bad := func(format string, args ...any) (*Dispatcher, error) {
		return nil, fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case cfg.SigningKey == nil:
		return bad("SigningKey is required (the gateway key every host pins)")
	case cfg.PrincipalID == "":
		return bad("PrincipalID is required (the gateway principal every host pins)")
	case deps.Resolver == nil || deps.Catalog == nil:
		return bad("Deps.Resolver and Deps.Catalog are required")
	case deps.Events != nil && deps.Records == nil:
		return bad("Deps.Records is required with Deps.Events: the event ingress checks each delivery's replica, instance and version")
	case deps.Tokens == nil:
		return bad("Deps.Tokens is required: requests are authenticated by bearer tokens")
	case cfg.ActionTimeout < 0 || cfg.MaxTimeout < cfg.ActionTimeout:
		return bad("ActionTimeout %s must be positive and at most MaxTimeout %s", cfg.ActionTimeout, cfg.MaxTimeout)
	case cfg.HopSlack < 0:
		return bad("HopSlack %s must not be negative", cfg.HopSlack)
	case cfg.MaxBodyBytes < 1:
		return bad("MaxBodyBytes %d must be positive", cfg.MaxBodyBytes)
	case cfg.MaxActionReadBytes < cfg.MaxBodyBytes:
		return bad("MaxActionReadBytes %d must be at least MaxBodyBytes %d, the largest body", cfg.MaxActionReadBytes, cfg.MaxBodyBytes)
	case cfg.MaxEventDeliveries < 1:
		return bad("MaxEventDeliveries %d must be positive", cfg.MaxEventDeliveries)
	case cfg.MaxTenantReplicaCalls < 1:
		return bad("MaxTenantReplicaCalls %d must be positive", cfg.MaxTenantReplicaCalls)
	case cfg.MaxEventBodyBytes < aip.MaxEventDeliveryBytes:
		return bad("MaxEventBodyBytes %d must be at least %d, the largest delivery", cfg.MaxEventBodyBytes, aip.MaxEventDeliveryBytes)
	case cfg.RegistryTimeout < 0:
		return bad("RegistryTimeout %s must not be negative", cfg.RegistryTimeout)
	case cfg.StatusTimeout < 0:
		return bad("StatusTimeout %s must not be negative", cfg.StatusTimeout)
	case cfg.StreamWriteTimeout < 0:
		return bad("StreamWriteTimeout %s must not be negative", cfg.StreamWriteTimeout)
	case cfg.ShutdownTimeout < 0:
		return bad("ShutdownTimeout %s must not be negative", cfg.ShutdownTimeout)
	case cfg.ReconcileAfter <= cfg.MaxTimeout+cfg.HopSlack+cfg.RegistryTimeout:
		return bad("ReconcileAfter %s must be longer than an action can be in flight (MaxTimeout + HopSlack + RegistryTimeout = %s)",
			cfg.ReconcileAfter, cfg.MaxTimeout+cfg.HopSlack+cfg.RegistryTimeout)
	case cfg.ReconcileBatch < 1:
		return bad("ReconcileBatch %d must be positive", cfg.ReconcileBatch)
	}
	if err := cfg.Topology.Validate(); err != nil {
		return bad("Topology: %v", err)
	}
	sched, err := NewScheduler(cfg.Admission, cfg.Now)
	if err != nil {
		return nil, err
	}
	jwks, err := aip.JWKS(cfg.SigningKey.PublicKey())
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg: cfg, deps: deps, key: cfg.SigningKey, sched: sched, client: deps.Client,
		principal:        aip.Principal{ID: cfg.PrincipalID, Kind: aip.PrincipalService, DID: cfg.SigningKey.DID()},
		log:              cfg.Logger.With("component", "dispatch"),
		tracer:           cfg.TracerProvider.Tracer("github.com/aipfleet/aipfleet/registry/dispatch"),
		prop:             propagation.TraceContext{},
		jwks:             jwks,
		retries:          newSettleRetries(),
		hopLogs:          logthrottle.Throttle{Every: hopLogEvery, MaxKeys: maxHopLogReplicas},
		maxUnsentPending: maxPendingUnsentReleases,
		eventSlots:       make(chan struct{}, cfg.MaxEventDeliveries),
		replicaCalls:     map[string]int{},
	}
	if d.eventBodies, err = newEventBodies(cfg.MaxEventBodyBytes); err != nil {
		return nil, err
	}
	if d.actionBodies, err = newActionBodies(cfg.MaxActionReadBytes, cfg.MaxBodyBytes); err != nil {
		return nil, err
	}
	if d.client == nil {
		d.client, d.ownClient = newClient(), true
	}
	// A hop's answer is the one at the replica's registered endpoint:
	// redirects are never followed, whatever client Deps gave, or any
	// replica could send the dispatcher's requests to any address it can
	// reach. A redirect is an unverified answer (outcome unknown).
	noRedirects := *d.client
	noRedirects.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	d.client = &noRedirects
	if cfg.TokenCacheSize > 0 {
		d.deps.Tokens = newTokenCache(deps.Tokens, cfg.Now, cfg.TokenCacheSize)
	}
	if d.m, err = newMetrics(cfg.Metrics, sched, d.eventBodies, d.actionBodies); err != nil {
		return nil, err
	}
	if ownMetrics {
		if err := promruntime.Register(cfg.Metrics); err != nil {
			return nil, err
		}
	}
	d.handler = d.routes()
	return d, nil
}

// newClient returns the default client for native hops: pooled keep-alive
// connections, bounded dials, no overall timeout (each hop has its own).
func newClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}}
}

// DID returns the dispatcher's did:key (the hosts' --gateway-did).
func (d *Dispatcher) DID() string { return d.key.DID() }

// PrincipalID returns the gateway principal (the hosts'
// --gateway-principal-id).
func (d *Dispatcher) PrincipalID() string { return d.principal.ID }

// Handler returns the HTTP API (routes.go), for embedding and tests; Run
// serves it.
func (d *Dispatcher) Handler() http.Handler { return d.handler }

// Scheduler returns the admission scheduler, for observation.
func (d *Dispatcher) Scheduler() *Scheduler { return d.sched }

// Run serves the API until ctx is done, reconciling orphaned reservations
// every ReconcileInterval while it serves (when Deps.Reservations is set),
// then shuts down in this order:
//
//  1. /ready answers 503 and the scheduler stops: queued and new actions
//     are refused with dispatch.shutting_down (nothing was dispatched);
//  2. the HTTP server stops accepting and waits, up to ShutdownTimeout, for
//     the requests in flight (each finishes its hop and settles its route)
//     and then for the pending settlement retries;
//  3. reconciliation stops and idle connections to replicas are closed.
//
// It returns nil after a clean shutdown, or the serve or shutdown error.
func (d *Dispatcher) Run(ctx context.Context) error {
	ln := d.cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", d.cfg.Addr); err != nil {
			return fmt.Errorf("dispatch: listen on %s: %w", d.cfg.Addr, err)
		}
	}
	srv := &http.Server{
		Handler:           d.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		WriteTimeout:      d.longestAction() + 10*time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	}
	if d.cfg.TLSConfig != nil {
		ln = tls.NewListener(ln, d.cfg.TLSConfig.Clone())
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	rctx, stopReconcile := context.WithCancel(context.WithoutCancel(ctx))
	reconciled := make(chan struct{})
	if d.deps.Reservations != nil && d.cfg.ReconcileInterval > 0 {
		go func() { defer close(reconciled); d.reconcileLoop(rctx) }()
	} else {
		close(reconciled)
	}
	defer func() { stopReconcile(); <-reconciled }()
	d.log.Info("serving", "addr", ln.Addr().String(), "did", d.key.DID(), "principal", d.principal.ID)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	d.stopping.Store(true)
	d.sched.Stop()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
	defer cancel()
	shutErr := srv.Shutdown(sctx)
	d.waitRetries(sctx)
	if serveErr == nil {
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			serveErr = err
		}
	} else if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	if d.ownClient {
		d.client.CloseIdleConnections()
	}
	if shutErr != nil {
		return fmt.Errorf("dispatch: shutdown: %w", shutErr)
	}
	if serveErr != nil {
		return fmt.Errorf("dispatch: serve: %w", serveErr)
	}
	d.log.Info("stopped")
	return nil
}

// longestAction bounds how long an action request can take before its
// answer: the wait for admission, the resolve, every hop (the first and
// MaxReroutes more, each with its reroute) and the settlement.
func (d *Dispatcher) longestAction() time.Duration {
	hops := 1 + max(d.cfg.MaxReroutes, 0)
	return d.sched.l.MaxQueueAge + time.Duration(hops)*(d.cfg.MaxTimeout+d.cfg.HopSlack) + time.Duration(hops+1)*d.cfg.RegistryTimeout
}

// Close gives up on the pending settlement retries and releases the
// dispatcher's own HTTP client connections (for embedders that use Handler
// without Run).
func (d *Dispatcher) Close() {
	d.stopping.Store(true)
	d.sched.Stop()
	d.waitRetries(canceledContext())
	if d.ownClient {
		d.client.CloseIdleConnections()
	}
}

// ReadinessProbe turns a registry backend's readiness report into
// Deps.Ready: an error naming every failed check.
func ReadinessProbe(r registry.Readiness) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		rep, err := r.Readiness(ctx)
		if err != nil {
			return err
		}
		var failed []string
		for _, c := range rep.Checks {
			if !c.OK {
				failed = append(failed, c.Name+": "+c.Message)
			}
		}
		if len(failed) > 0 {
			return fmt.Errorf("registry not ready: %s", strings.Join(failed, "; "))
		}
		return nil
	}
}

// canceledContext returns a context that is already done.
func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
