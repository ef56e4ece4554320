package hostsdk

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/promruntime"
	"github.com/aipfleet/aipfleet/internal/readbudget"
)

// Component names the host in logs, health documents and error sources.
const Component = "aip-connector-host"

const tracerName = "github.com/aipfleet/aipfleet/hostsdk"

// Host runs one connector replica: bootstrap, native ingress, heartbeats and
// drain. Create it with New, then call Run (or Start and Stop).
type Host struct {
	cfg    Config
	conn   Connector
	log    *slog.Logger
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	m      *metrics

	phaseMu   sync.Mutex
	phase     phase
	startDone chan struct{}
	startErr  error
	// releaseErr is what releaseAfterFailedStart could not release (nil:
	// everything) after a failed start.
	releaseErr error
	stopDone   chan struct{}
	stopErr    error

	// Set during bootstrap, read-only afterwards.
	key            *aip.SigningKey
	gatewayDID     string
	tenant         TenantContext
	principal      aip.Principal // the bound agent with this replica's DID
	manifest       *aip.Manifest // the bound manifest (agent without DID)
	manifestJSON   []byte
	manifestDigest string
	caps           map[string]*capability
	channels       map[string]bool
	journal        journal.Journal
	ownsJournal    bool
	control        *controlClient
	listener       net.Listener
	server         *http.Server
	conns          connTracker // the server's connections, for shutdown
	jwks           []byte
	state          *State
	events         *EventPublisher
	recovery       journal.RecoverySummary

	// Runtime state.
	draining        atomic.Bool
	storageReady    atomic.Bool
	connectorReady  atomic.Bool
	storageDetail   atomic.Pointer[probeDetail]
	connectorDetail atomic.Pointer[probeDetail]
	// connectorDegraded is whether the last passing connector check said
	// the connector is degraded (DegradedError), for logging its changes.
	connectorDegraded atomic.Bool
	storageCheck      boundedCheck // checkStorage runs
	connectorCheck    boundedCheck // HealthChecker.CheckHealth runs
	// writeFailed is the standing storage failure of a journal write (an
	// action's, an outbox batch's, a state value's; nil: none): storage is
	// not ready while it is set (see storageRecheckMinBytes).
	writeFailed atomic.Pointer[writeFailure]
	// origin is the journal's origin for this replica ID (origin.go):
	// routes below it that the journal does not hold are refused.
	origin atomic.Uint64
	// serving is set at step 10, when the host serves: before it, the
	// native ingress may be served early (early.go), and runs no action.
	serving atomic.Bool
	// earlyIngress is set after recovery when the journal has served this
	// replica ID: the native ingress is answered before the host serves
	// (early.go).
	earlyIngress atomic.Bool
	// startEnded is closed when the start ends (endStart): the requests
	// untilServing holds then go on, or are dropped after a failed start.
	startEnded      chan struct{}
	startEndOnce    sync.Once
	lease           leaseState
	controlMu       sync.Mutex     // serializes lifecycle calls (one sequence fence)
	pendingRegister *sealedRequest // guarded by controlMu
	// pendingHeartbeat is the beat whose outcome is unknown (guarded by
	// controlMu): the next beat replays it while the lease is unchanged.
	pendingHeartbeat *sealedRequest
	// pendingDrain is a drain whose outcome is unknown (guarded by
	// controlMu): the next renewal of the draining lease, or the offline
	// transition, replays it first (replayDrain).
	pendingDrain *sealedRequest
	// drainAccepted is closed when the control plane first accepts a drain
	// of this replica (the shutdown's, a renewal, or a replay of one whose
	// outcome was unknown): the registry then routes nothing new here.
	// drainAcceptedAt is when (set once, before the close, under
	// controlMu). See noteDrainAccepted and holdListener.
	drainAccepted   chan struct{}
	drainAcceptedAt time.Time
	inflight        inflight
	// beforeAcquire, set by tests only (before the first action), runs in an action's
	// request between its readiness check and taking its in-flight slot.
	beforeAcquire func()
	// abandoned counts connector calls the host stopped waiting for
	// (Config.HandleGrace) that have not returned yet.
	abandoned atomic.Int64
	// ingressBudget bounds the bodies of native messages being read
	// before their signature is checked (MaxIngressReadBytes, a share of
	// MaxIngressReadBytesPerPeer per remote address) and counts the
	// messages waiting for it.
	ingressBudget *readbudget.Budget
	// lastActionPrune is when the heartbeat last pruned finished actions
	// (heartbeat goroutine only).
	lastActionPrune time.Time
	// actionStateNS are the connector's ActionStateNamespaces.
	actionStateNS []string
	runMu         sync.Mutex
	running       map[string]*runningAction

	// Goroutines the host owns.
	hardStop   context.CancelFunc // cancels every running action
	actionBase context.Context
	hbCancel   context.CancelFunc
	hbDone     chan struct{}
	evCancel   context.CancelFunc
	evDone     chan struct{}
	evErr      error
	// delivery is the event delivery loop (nil without
	// Config.EventEndpoint); atomic because a connector may publish from
	// its own goroutines while step 10 starts it.
	delivery atomic.Pointer[eventDelivery]
	// eventTransport carries event deliveries (set at step 1).
	eventTransport http.RoundTripper
	serveDone      chan struct{}
	serveErr       error
	fatal          chan error
}

type phase int

const (
	phaseNew phase = iota
	phaseStarting
	phaseStarted
	phaseStopped
)

// New validates cfg and returns a host for conn. It does no I/O and starts
// no goroutines. A configuration error is a *ValidateError wrapping a
// *ConfigError that names the field, flag and environment variable.
func New(cfg Config, conn Connector) (*Host, error) {
	if conn == nil {
		return nil, &ValidateError{errors.New("connector is nil")}
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, &ValidateError{err}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", Component, "replica_id", cfg.ReplicaID, "instance_id", cfg.InstanceID)
	tp := cfg.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	h := &Host{
		cfg:           cfg,
		conn:          conn,
		log:           log,
		tracer:        tp.Tracer(tracerName),
		prop:          propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		startDone:     make(chan struct{}),
		stopDone:      make(chan struct{}),
		drainAccepted: make(chan struct{}),
		startEnded:    make(chan struct{}),
		running:       make(map[string]*runningAction),
		fatal:         make(chan error, 1),
		tenant: TenantContext{
			TenantID: cfg.TenantID, ConnectorTypeID: cfg.ConnectorTypeID, VersionID: cfg.VersionID,
			InstanceID: cfg.InstanceID, ReplicaID: cfg.ReplicaID, ConfigRevision: cfg.ConfigRevision,
			SecretProviderRef: cfg.SecretProviderRef, TrustDomain: cfg.TrustDomain,
			TenantSystem: cfg.TenantSystem, MembershipID: cfg.MembershipID,
			CredentialRevisionRef: cfg.CredentialRevisionRef,
		},
	}
	h.connectorCheck.onPanic = func(p *checkPanic) {
		h.log.Error("the connector panicked", "method", "CheckHealth", "panic", p.value, "stack", string(p.stack))
	}
	h.storageCheck.onPanic = func(p *checkPanic) {
		h.log.Error("the journal panicked", "method", "Probe", "panic", p.value, "stack", string(p.stack))
	}
	if cfg.ExternalAccountID != "" {
		h.tenant.ExternalAccount = &aip.AccountRef{ID: cfg.ExternalAccountID, System: cfg.ExternalAccountSystem}
	}
	if cfg.CredentialID != "" {
		h.tenant.Credential = &aip.CredentialRef{ID: cfg.CredentialID, Issuer: cfg.CredentialIssuer, Scopes: slices.Clone(cfg.CredentialScopes)}
	}
	if k, ok := conn.(ActionStateKeeper); ok {
		var namespaces []string
		if err := h.guard("ActionStateNamespaces", func() error { namespaces = k.ActionStateNamespaces(); return nil }); err != nil {
			return nil, &ValidateError{err}
		}
		for _, ns := range namespaces {
			if err := checkActionStateNamespace(ns); err != nil {
				return nil, &ValidateError{fmt.Errorf("ActionStateNamespaces: %w", err)}
			}
			if err := journal.CheckID("state namespace", ns); err != nil {
				return nil, &ValidateError{fmt.Errorf("ActionStateNamespaces: %w", err)}
			}
			h.actionStateNS = append(h.actionStateNS, ns)
		}
	}
	h.inflight.init(cfg.MaxInFlight)
	budget, err := readbudget.New(readbudget.Config{Total: MaxIngressReadBytes, PeerShare: MaxIngressReadBytesPerPeer})
	if err != nil {
		return nil, err
	}
	h.ingressBudget = budget
	h.m = newMetrics(h)
	for i, c := range cfg.Collectors {
		if err := h.m.reg.Register(c); err != nil {
			return nil, &ValidateError{fmt.Errorf("collector %d of Config.Collectors: %w", i, err)}
		}
	}
	// After the connector's own, which may include them already.
	if err := promruntime.Register(h.m.reg); err != nil {
		return nil, &ValidateError{fmt.Errorf("runtime metrics: %w", err)}
	}
	h.storageDetail.Store(&probeDetail{})
	h.connectorDetail.Store(&probeDetail{})
	return h, nil
}

// Run starts the host and serves until ctx is cancelled (SIGTERM, Ctrl-C)
// or the HTTP server fails, then drains and goes offline. It returns nil
// when bootstrap succeeded and the server, heartbeat, drain and offline
// steps were all clean, or when the cancellation of ctx is what stopped
// the bootstrap and the start left nothing behind (no registration, the
// journal closed); otherwise a bootstrap StepError (whose text also says
// what the failed start could not release, such as a registration that
// may stay until its lease expires) or a *ShutdownError joining every
// failure. A step that failed for a reason of its own is a failed start
// even when ctx was cancelled meanwhile (a SIGTERM racing it): the
// operator's supervisor must see that failure.
func (h *Host) Run(ctx context.Context) error {
	if err := h.Start(ctx); err != nil {
		// A shutdown requested while the host was still starting (ctx
		// cancelled, SIGTERM in a main) is a clean stop when the start
		// failed because of it and left nothing behind: nothing was
		// served, so nothing needed a drain, and no registration is
		// left.
		if stoppedByCancel(ctx, err) && h.releaseErr == nil {
			h.log.Info("shutdown requested while starting; stopped cleanly (nothing was served, no registration left)", "cause", context.Cause(ctx))
			return nil
		}
		if h.releaseErr != nil {
			// Say what the failed start left behind (a registration
			// that may stay until its lease expires), not only why it
			// failed: a main prints this one error.
			return fmt.Errorf("%w; and releasing what the start did failed: %v", err, h.releaseErr)
		}
		return err
	}
	var fatal error
	select {
	case <-ctx.Done():
		h.log.Info("shutdown requested", "cause", context.Cause(ctx))
	case fatal = <-h.fatal:
		h.log.Error("HTTP server failed; shutting down", "error", fatal)
	}
	// Stop is bounded by the drain, lifecycle and shutdown timeouts.
	return h.Stop(context.WithoutCancel(ctx))
}

// Start runs the ten bootstrap steps and returns once the host serves. ctx
// bounds the bootstrap only. On failure everything opened is released and
// the error is the failing step's type (see StepError).
func (h *Host) Start(ctx context.Context) error {
	h.phaseMu.Lock()
	if h.phase != phaseNew {
		h.phaseMu.Unlock()
		return ErrAlreadyStarted
	}
	h.phase = phaseStarting
	h.phaseMu.Unlock()

	err := h.bootstrap(ctx)
	h.phaseMu.Lock()
	if err != nil {
		h.phase = phaseStopped
		h.startErr = err
		close(h.stopDone)
	} else {
		h.phase = phaseStarted
	}
	close(h.startDone)
	h.phaseMu.Unlock()
	return err
}

// Stop drains the host and takes it offline (see shutdown for the order).
// It is idempotent and safe before Start (then it does nothing). It waits
// for the shutdown to finish or for ctx; past ctx's deadline it returns
// ctx.Err() while the shutdown goes on, and a later Stop waits again. The
// result is nil only for a clean shutdown.
func (h *Host) Stop(ctx context.Context) error {
	h.phaseMu.Lock()
	switch h.phase {
	case phaseNew:
		h.phase = phaseStopped
		close(h.startDone)
		close(h.stopDone)
		h.phaseMu.Unlock()
		if h.cfg.Listener != nil {
			h.cfg.Listener.Close()
		}
		return nil
	case phaseStarting:
		h.phaseMu.Unlock()
		select {
		case <-h.startDone:
		case <-ctx.Done():
			return ctx.Err()
		}
		return h.Stop(ctx)
	case phaseStarted:
		h.phase = phaseStopped
		go func() {
			h.stopErr = h.shutdown()
			close(h.stopDone)
		}()
	}
	h.phaseMu.Unlock()
	select {
	case <-h.stopDone:
		if h.startErr != nil {
			return nil
		}
		return h.stopErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Addr returns the address the host listens on (nil before step 5).
func (h *Host) Addr() net.Addr {
	if h.listener == nil {
		return nil
	}
	return h.listener.Addr()
}

// DID returns the replica's did:key (empty before step 1 completes).
func (h *Host) DID() string {
	if h.key == nil {
		return ""
	}
	return h.key.DID()
}

// ManifestDigest returns the bound manifest's digest (empty before step 4).
func (h *Host) ManifestDigest() string { return h.manifestDigest }

// Ready reports whether the replica accepts actions: a valid lease, not
// draining, storage and connector healthy.
func (h *Host) Ready() bool { return h.ready() }

func (h *Host) ready() bool {
	return !h.draining.Load() && h.lease.valid(h.cfg.Now()) && h.storageOK() && h.connectorReady.Load()
}

// bootstrap runs the ten steps in order.
func (h *Host) bootstrap(ctx context.Context) (err error) {
	ctx, span := h.tracer.Start(ctx, "hostsdk.bootstrap")
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			h.releaseErr = h.releaseAfterFailedStart()
		}
		span.End()
	}()
	steps := []struct {
		step BootstrapStep
		run  func(context.Context) error
	}{
		{StepValidate, h.stepValidate},
		{StepOpenJournal, h.stepOpenJournal},
		{StepDiscover, h.stepDiscover},
		{StepBindManifest, h.stepBindManifest},
		{StepBuildRoutes, h.stepBuildRoutes},
		{StepRecover, h.stepRecover},
		{StepProbe, h.stepProbe},
		{StepRegister, h.stepRegister},
		{StepApplyLease, h.stepApplyLease},
		{StepServe, h.stepServe},
	}
	for _, s := range steps {
		if err := h.runStep(ctx, s.step, s.run); err != nil {
			return err
		}
		if s.step == StepRecover {
			// The journal is settled: the native ingress can answer
			// what it proves while the registration waits (early.go).
			h.serveEarly()
		}
	}
	return nil
}

func (h *Host) runStep(ctx context.Context, step BootstrapStep, run func(context.Context) error) error {
	ctx, span := h.tracer.Start(ctx, "hostsdk.bootstrap."+step.String(),
		trace.WithAttributes(attribute.Int("aip.bootstrap.step", int(step))))
	defer span.End()
	start := time.Now()
	err := run(ctx)
	if err == nil && step != StepServe {
		// A cancellation during bootstrap fails it. Once step 10 serves,
		// a cancellation is a shutdown request: Run drains and goes offline.
		err = ctx.Err()
	}
	if err != nil {
		err = wrapStep(step, err)
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if stoppedByCancel(ctx, err) {
			h.log.Info("bootstrap stopped: shutdown requested", "step", int(step), "name", step.String(), "error", err)
		} else {
			h.log.Error("bootstrap step failed", "step", int(step), "name", step.String(), "error", err)
		}
		return err
	}
	h.log.Info("bootstrap step", "step", int(step), "name", step.String(), "duration_ms", time.Since(start).Milliseconds())
	return nil
}

// stoppedByCancel reports whether err, a bootstrap step's, is the
// cancellation of ctx (a shutdown requested while starting) rather than a
// failure of the step's own: ctx was cancelled and err wraps
// context.Canceled or ctx's cause. The cause counts because a main's
// signal.NotifyContext cancels with one that does not wrap
// context.Canceled ("terminated signal received"), and the HTTP client
// reports a request cancelled so with that cause.
func stoppedByCancel(ctx context.Context, err error) bool {
	if !errors.Is(ctx.Err(), context.Canceled) {
		return false
	}
	if errors.Is(err, context.Canceled) {
		return true
	}
	cause := context.Cause(ctx)
	return cause != nil && errors.Is(err, cause)
}

// releaseAfterFailedStart undoes what the completed steps opened. A replica
// that already registered is taken offline (best effort, bounded by the
// control timeout) rather than left ready until its lease expires; so is
// one whose registration answers were lost, once a replay of it shows it
// was committed. It returns nil when everything was released: no
// registration is left behind and the journal closed.
func (h *Host) releaseAfterFailedStart() error {
	var errs []error
	// The server serving the native ingress early (early.go) stops first:
	// nothing may answer for the replica once it is released.
	if err := h.stopEarlyServer(); err != nil {
		h.log.Warn("stop the early native ingress after a failed start", "error", err)
	}
	h.endStart()
	if err := h.stopEventDelivery(h.cfg.ControlTimeout); err != nil {
		h.log.Warn("stop event delivery after a failed start", "error", err)
		errs = append(errs, fmt.Errorf("stop event delivery: %w", err))
	}
	if h.hbCancel != nil {
		h.hbCancel()
		<-h.hbDone
	}
	h.controlMu.Lock()
	if h.pendingRegister != nil {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ControlTimeout)
		h.settlePendingRegister(ctx)
		cancel()
		if h.pendingRegister != nil {
			errs = append(errs, errors.New("the outcome of the registration is unknown: the replica may stay registered until its lease expires"))
		}
	}
	if h.lease.registered() {
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.ControlTimeout)
		if err := h.transition(ctx, aip.OpOffline); err != nil {
			h.log.Warn("offline after a failed start", "error", err)
			errs = append(errs, fmt.Errorf("offline: %w", err))
		}
		cancel()
	}
	h.controlMu.Unlock()
	if h.listener != nil {
		h.listener.Close()
	} else if h.cfg.Listener != nil {
		h.cfg.Listener.Close()
	}
	if h.hardStop != nil {
		h.hardStop()
	}
	if h.ownsJournal && h.journal != nil {
		if err := h.journal.Close(); err != nil {
			h.log.Warn("close journal", "error", err)
			errs = append(errs, fmt.Errorf("close the journal: %w", err))
		}
	}
	return errors.Join(errs...)
}

// leaseState is the last lease the control plane granted.
type leaseState struct {
	mu        sync.Mutex
	sequence  uint64
	expiresAt time.Time
	granted   bool
}

func (l *leaseState) valid(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.granted && l.expiresAt.After(now)
}

// registered reports whether the control plane ever granted a lease.
func (l *leaseState) registered() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.granted
}

func (l *leaseState) get() (seq uint64, expiresAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sequence, l.expiresAt
}

func (l *leaseState) apply(lease *aip.Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sequence, l.expiresAt, l.granted = lease.Sequence, lease.ExpiresAt.Time, true
}

// end ends at now the lease valid at sequence, which the control plane
// said is gone, and reports whether it did: false when the lease was
// already over, or is at another sequence (a renewal applied since).
func (l *leaseState) end(now time.Time, sequence uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.granted || l.sequence != sequence || !l.expiresAt.After(now) {
		return false
	}
	l.expiresAt = now
	return true
}

// expire records that the lease ended (offline) at now.
func (l *leaseState) expire(now time.Time, sequence uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sequence, l.expiresAt = sequence, now
}

// inflight counts actions in progress, bounded by max.
type inflight struct {
	mu     sync.Mutex
	n, max int
	// detached holds the action IDs of the abandoned connector calls whose
	// request has finished (detach), one entry per slot they hold: no
	// answer waits for them, and neither does the drain.
	detached map[string]int
	ndetach  int
	closed   bool
	changed  chan struct{}
}

func (f *inflight) init(max int) {
	f.max, f.changed, f.detached = max, make(chan struct{}), make(map[string]int)
}

// acquire takes a slot. It reports closed when the host no longer accepts
// actions and full when max slots are taken.
func (f *inflight) acquire() (ok, closed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false, true
	}
	if f.n >= f.max {
		return false, false
	}
	f.n++
	return true, false
}

func (f *inflight) release() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	f.notify()
}

// detach hands a slot whose request has finished over to the abandoned
// connector call of actionID still running in it; releaseDetached gives it
// back when the call returns.
func (f *inflight) detach(actionID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.detached[actionID]++
	f.ndetach++
	f.notify()
}

func (f *inflight) releaseDetached(actionID string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	f.ndetach--
	if f.detached[actionID]--; f.detached[actionID] <= 0 {
		delete(f.detached, actionID)
	}
	f.notify()
}

// notify wakes the waiters; callers hold mu.
func (f *inflight) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// close refuses further acquisitions.
func (f *inflight) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// waitHandled blocks until no request is handling an action (slots held
// only by abandoned calls remain) or ctx is done. It is the drain's
// condition: an abandoned call's action was journaled and answered, and
// nothing it still returns is kept.
func (f *inflight) waitHandled(ctx context.Context) error {
	for {
		f.mu.Lock()
		n, ch := f.n-f.ndetach, f.changed
		f.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%s still being handled: %w", counted(n, "action"), ctx.Err())
		}
	}
}

// handled reports how many slots requests are handling (not counting
// abandoned calls).
func (f *inflight) handled() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n - f.ndetach
}

// abandonedRunning returns the action IDs of the abandoned calls that
// still hold a slot, sorted, and how many calls they are.
func (f *inflight) abandonedRunning() (ids []string, calls int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id := range f.detached {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, f.ndetach
}

func pinnedKey(did string) (ed25519.PublicKey, error) { return aip.ParseDIDKey(did) }

// Principal returns the replica's signing principal: the bound manifest
// agent with this replica's DID (zero before step 4).
func (h *Host) Principal() aip.Principal { return h.principal }

// Tenant returns the deployment identity the connector serves.
func (h *Host) Tenant() TenantContext { return h.tenant.clone() }
