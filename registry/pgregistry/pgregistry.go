package pgregistry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/internal/pgconnerr"
	"github.com/aipfleet/aipfleet/internal/pgmigrate"
	"github.com/aipfleet/aipfleet/internal/pgsession"
	"github.com/aipfleet/aipfleet/registry"
)

// Config configures a Registry. ControlURL and DataURL name the same
// database, usually through two roles with different grants (see
// deploy/postgres/roles.sql).
type Config struct {
	// ControlURL is the connection URL of the control pool, which installs
	// the schema and performs catalog and admission writes. Required by
	// Open; must be empty for OpenDataPlane.
	ControlURL string
	// DataURL is the connection URL of the data pool, which serves catalog
	// reads, route resolution, reservations, settlement, replica lifecycle
	// writes and fleet status. Open defaults it to ControlURL; OpenDataPlane
	// requires it.
	DataURL string
	// ControlMaxConns bounds the control pool. Defaults to 4.
	ControlMaxConns int32
	// DataMaxConns bounds the data pool. Defaults to 32.
	DataMaxConns int32
	// AcquireTimeout bounds the wait for a pooled connection; a call that
	// cannot get one in time fails with registry.ErrStorage. Defaults to 5s;
	// at most 60s. It also bounds each new connection's establishment
	// (TCP, TLS and the startup exchange), but never below
	// MinConnectTimeout, unless the URL sets connect_timeout: a server
	// that accepts but never answers (a hung server, a partition that
	// drops packets, the old address after a failover) would otherwise
	// hold a pool slot and a socket until TCP gives up, many minutes after
	// the database is back. The floor keeps a short AcquireTimeout from
	// cutting every handshake of a slower server short: a call that cannot
	// wait fails, and the connection it asked for is finished in the
	// background for the next.
	AcquireTimeout time.Duration
	// Now is the clock every time-dependent rule uses (lease validity,
	// circuits, assignment and admission times, fleet status); its readings
	// are passed to SQL as parameters, the database clock is never used.
	// Defaults to time.Now.
	Now func() time.Time
	// Limits bounds manifests and catalog pages; zero fields take the
	// registry defaults.
	Limits registry.Limits
	// DisableCatalogCache turns off the per-revision catalog view cache:
	// every page is then filtered, counted and cut by one SQL query. The
	// cache is on by default; see the package documentation.
	DisableCatalogCache bool
	// RouteLockWait bounds how long a new route waits for the best eligible
	// replica when every eligible replica is row-locked by other routing
	// transactions (the first selection skips locked rows; the retry waits
	// for the row and re-checks it). A route still blocked after it fails
	// with registry.ErrReplicaUnavailable. Defaults to 1s; at most 60s.
	RouteLockWait time.Duration
	// TenantRouteConcurrency bounds the routing transactions (resolutions,
	// settlements, reroutes) of one tenant that the registry runs in the
	// database at once; the others wait in the process, at most
	// AcquireTimeout (then registry.ErrStorage). All of a tenant's routing
	// transactions update the same admission counter rows, so in the
	// database they take those rows one at a time anyway, and a transaction
	// waiting there on a row lock costs the server CPU that one waiting here
	// does not. Different tenants do not share the bound; the data pool
	// (DataMaxConns) bounds all transactions together. Defaults to 3; at
	// most 256.
	TenantRouteConcurrency int
	// Service is what the data pool serves. When set, Open and
	// OpenDataPlane check at start, with one catalog query, that the data
	// pool's role holds every privilege that service needs (those
	// deploy/postgres/roles.sql grants its role), and fail with a
	// *RoleError otherwise (see CheckPrivileges). Defaults to AnyService,
	// which checks nothing.
	Service Service
}

// Pool defaults and bounds (reference §3.7).
const (
	DefaultControlMaxConns = 4
	DefaultDataMaxConns    = 32
	DefaultAcquireTimeout  = 5 * time.Second
	MaxAcquireTimeout      = 60 * time.Second
	// MinConnectTimeout is the least time a new connection's establishment
	// gets when the URL sets no connect_timeout (Config.AcquireTimeout),
	// libpq's own minimum for connect_timeout.
	MinConnectTimeout    = 2 * time.Second
	DefaultRouteLockWait = time.Second
	// DefaultTenantRouteConcurrency is the default of
	// Config.TenantRouteConcurrency.
	DefaultTenantRouteConcurrency = 3
	// maxTxAttempts bounds retries of a transaction that hit a
	// serialization failure, a deadlock or a unique-key race.
	maxTxAttempts = 6
)

// ErrNoControlPool is returned by catalog and admission writes of a
// registry opened with OpenDataPlane, which holds no control pool.
var ErrNoControlPool = errors.New("pgregistry: no control pool")

// Registry is the PostgreSQL registry backend. It implements the five
// registry contracts; see the package documentation for its locking.
type Registry struct {
	recordReads                  // single-record reads on the data pool
	control        *pgxpool.Pool // nil when opened data-plane only
	data           *pgxpool.Pool
	now            func() time.Time
	limits         registry.Limits
	acquireTimeout time.Duration
	routeLockWait  time.Duration
	tenants        *tenantGates
	stripeBase     int // the first counter stripe of lane 0 (stripes.go)
	chains         *routeChains
	implicit       registry.AdmissionPolicy
	migrations     []pgmigrate.Migration
	// eventsByID and insertEvents are AppendEvents' read and insert,
	// eventPage is Events' read (events.go); an older build's in the
	// upgrade tests (export_test.go).
	eventsByID, insertEvents, eventPage string
	views                               *catalogCache // nil when DisableCatalogCache
	closeOnce                           sync.Once
}

// Compile-time guards: Registry is the PostgreSQL implementation of the
// registry contracts.
var (
	_ registry.Catalog       = (*Registry)(nil)
	_ registry.Resolver      = (*Registry)(nil)
	_ registry.Reader        = (*Registry)(nil)
	_ registry.Administrator = (*Registry)(nil)
	_ registry.FleetStatus   = (*Registry)(nil)
)

// Advisory lock keys. Fixed locks use the two-int4 key space, per-action
// locks the bigint key space, so they never collide.
const (
	lockClass     int32 = 0x41495046 // "AIPF"
	lockCatalog   int32 = 1          // catalog publication: exclusive for writers, shared for readers
	lockMigration int32 = 2          // schema migration
	lockApply     int32 = 3          // a fleet file's apply (LockApply), held for the whole apply
)

// Open connects both pools, installs or upgrades the schema with the
// control pool (see Migrate), and verifies it through the data pool (and,
// with Config.Service set, the data pool's role: CheckPrivileges).
func Open(ctx context.Context, cfg Config) (*Registry, error) {
	if cfg.ControlURL == "" {
		return nil, fmt.Errorf("%w: pgregistry: Config.ControlURL is empty; Open needs the control pool's URL (use OpenDataPlane for a data-plane-only process)", registry.ErrInvalid)
	}
	// Errors name the URL as the caller knows it: one database URL, or
	// the two Config fields when they differ.
	controlWhat, dataWhat := databaseURL, databaseURL
	if cfg.DataURL == "" {
		cfg.DataURL = cfg.ControlURL
	} else if cfg.DataURL != cfg.ControlURL {
		controlWhat, dataWhat = "Config.ControlURL", "Config.DataURL"
	}
	r, err := newRegistry(cfg)
	if err != nil {
		return nil, err
	}
	r.control, err = newPool(ctx, "control", controlWhat, cfg.ControlURL, r.controlMax(cfg), r.acquireTimeout)
	if err != nil {
		return nil, err
	}
	r.data, err = newPool(ctx, "data", dataWhat, cfg.DataURL, r.dataMax(cfg), r.acquireTimeout)
	if err != nil {
		r.control.Close()
		return nil, err
	}
	if err := r.install(ctx); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.CheckPrivileges(ctx, cfg.Service); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// OpenDataPlane connects only the data pool and verifies that the installed
// schema is exactly this build's SchemaVersion; it refuses an older or newer
// schema with ErrSchemaMismatch and never migrates. With Config.Service set
// it then checks the data pool's role (CheckPrivileges). Catalog and admission
// writes of the returned registry fail with ErrNoControlPool.
func OpenDataPlane(ctx context.Context, cfg Config) (*Registry, error) {
	if cfg.ControlURL != "" {
		return nil, fmt.Errorf("%w: pgregistry: Config.ControlURL is set, but a data-plane registry holds no control pool; leave it empty", registry.ErrInvalid)
	}
	if cfg.DataURL == "" {
		return nil, fmt.Errorf("%w: pgregistry: Config.DataURL is empty; OpenDataPlane needs the data pool's URL", registry.ErrInvalid)
	}
	r, err := newRegistry(cfg)
	if err != nil {
		return nil, err
	}
	r.data, err = newPool(ctx, "data", databaseURL, cfg.DataURL, r.dataMax(cfg), r.acquireTimeout)
	if err != nil {
		return nil, err
	}
	if err := r.VerifySchema(ctx); err != nil {
		r.Close()
		return nil, err
	}
	if err := r.CheckPrivileges(ctx, cfg.Service); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func newRegistry(cfg Config) (*Registry, error) {
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.ControlMaxConns < 0, cfg.DataMaxConns < 0:
		return nil, fmt.Errorf("%w: pgregistry: pool sizes must not be negative (0 means the default)", registry.ErrInvalid)
	case cfg.AcquireTimeout < 0 || cfg.AcquireTimeout > MaxAcquireTimeout:
		return nil, fmt.Errorf("%w: pgregistry: AcquireTimeout %s must be between 0 (default %s) and %s", registry.ErrInvalid, cfg.AcquireTimeout, DefaultAcquireTimeout, MaxAcquireTimeout)
	case cfg.RouteLockWait < 0 || cfg.RouteLockWait > time.Minute:
		return nil, fmt.Errorf("%w: pgregistry: RouteLockWait %s must be between 0 (default %s) and 1m", registry.ErrInvalid, cfg.RouteLockWait, DefaultRouteLockWait)
	case cfg.TenantRouteConcurrency < 0 || cfg.TenantRouteConcurrency > 256:
		return nil, fmt.Errorf("%w: pgregistry: TenantRouteConcurrency %d must be between 0 (default %d) and 256", registry.ErrInvalid, cfg.TenantRouteConcurrency, DefaultTenantRouteConcurrency)
	}
	ms, err := embeddedMigrations()
	if err != nil {
		return nil, err
	}
	if pgmigrate.Latest(ms) != SchemaVersion {
		return nil, fmt.Errorf("pgregistry: build error: SchemaVersion is %d but the last embedded migration is %d", SchemaVersion, pgmigrate.Latest(ms))
	}
	r := &Registry{
		now:            cfg.Now,
		limits:         cfg.Limits.WithDefaults(),
		acquireTimeout: cfg.AcquireTimeout,
		routeLockWait:  cfg.RouteLockWait,
		implicit:       registry.ImplicitAdmissionPolicy(),
		migrations:     ms,
		eventsByID:     eventsByID,
		insertEvents:   insertEvents,
		eventPage:      eventPage,
	}
	if r.now == nil {
		r.now = time.Now
	}
	if !cfg.DisableCatalogCache {
		r.views = newCatalogCache()
	}
	if r.acquireTimeout == 0 {
		r.acquireTimeout = DefaultAcquireTimeout
	}
	if r.routeLockWait == 0 {
		r.routeLockWait = DefaultRouteLockWait
	}
	perTenant := cfg.TenantRouteConcurrency
	if perTenant == 0 {
		perTenant = DefaultTenantRouteConcurrency
	}
	r.tenants = newTenantGates(perTenant, r.acquireTimeout)
	r.stripeBase = rand.IntN(counterStripes)
	r.chains = newRouteChains()
	r.recordReads = recordReads{row: r.dataRow}
	return r, nil
}

func (r *Registry) controlMax(cfg Config) int32 {
	if cfg.ControlMaxConns == 0 {
		return DefaultControlMaxConns
	}
	return cfg.ControlMaxConns
}

func (r *Registry) dataMax(cfg Config) int32 {
	if cfg.DataMaxConns == 0 {
		return DefaultDataMaxConns
	}
	return cfg.DataMaxConns
}

// newPool opens the pool called name (its application_name) on rawURL;
// what names the URL in errors.
func newPool(ctx context.Context, name, what, rawURL string, maxConns int32, connectTimeout time.Duration) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, parseError(what, rawURL, err)
	}
	pc.MaxConns = maxConns
	pc.MinConns = 0
	// The pool builds a connection in the background, under no deadline
	// of the caller that asked for it (an acquire that times out leaves
	// it running); without a connect timeout, a server that accepts and
	// never answers holds the pool slot until TCP gives up. Not below
	// MinConnectTimeout: a handshake longer than a short acquire timeout
	// must still finish, for the calls after the one that gave up.
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = max(connectTimeout, MinConnectTimeout)
	}
	pc.ConnConfig.RuntimeParams["application_name"] = "aipfleet-registry-" + name
	// Every registry statement is an index-driven point or range lookup
	// whose generic plan is as good as a custom one; planning the route
	// selection's nine-table join costs milliseconds, so never replan per
	// execution. (Statistics changes still invalidate cached plans.)
	if _, set := pc.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		pc.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	}
	// A session cut off mid-transaction would hold its locks (admission
	// counters, replicas) until the server's TCP notices; without a
	// timeout of the role's, the session gets one. It never commits
	// asynchronously: a route assignment or settlement the dispatcher
	// acted on and a server crash then lost would let a retry of the
	// action be routed to another replica. And the server notices a dead
	// process within minutes, which frees its connection slots
	// (pgsession).
	pc.AfterConnect = pgsession.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("%w: pgregistry: open the %s pool at %s: %w", registry.ErrStorage, name, redact(rawURL), err)
	}
	return pool, nil
}

// install migrates with the control pool, then verifies through the data
// pool that its role sees the same schema.
func (r *Registry) install(ctx context.Context) error {
	conn, err := r.acquire(ctx, r.control, "migrate")
	if err != nil {
		return err
	}
	err = applyMigrations(ctx, conn.Conn(), r.migrations, r.nowMS)
	conn.Release()
	if err != nil {
		return err
	}
	return r.VerifySchema(ctx)
}

// VerifySchema checks, through the data pool, that the installed schema is
// exactly this build's (every migration's version and checksum). A
// readiness probe may call it.
func (r *Registry) VerifySchema(ctx context.Context) error {
	conn, err := r.acquire(ctx, r.data, "verify schema")
	if err != nil {
		return err
	}
	defer conn.Release()
	return verifySchema(ctx, conn, r.migrations)
}

// Close closes the pools. It is idempotent; calls in flight fail.
func (r *Registry) Close() {
	r.closeOnce.Do(func() {
		if r.control != nil {
			r.control.Close()
		}
		if r.data != nil {
			r.data.Close()
		}
	})
}

// DataPlaneOnly reports whether the registry was opened without a control
// pool.
func (r *Registry) DataPlaneOnly() bool { return r.control == nil }

// PoolStats returns the current pool sizes; the control fields are zero
// for a data-plane-only registry.
func (r *Registry) PoolStats() registry.PoolStats {
	var s registry.PoolStats
	if r.control != nil {
		st := r.control.Stat()
		s.ControlSize, s.ControlIdle, s.ControlMax = st.TotalConns(), st.IdleConns(), st.MaxConns()
	}
	st := r.data.Stat()
	s.DataSize, s.DataIdle, s.DataMax = st.TotalConns(), st.IdleConns(), st.MaxConns()
	return s
}

// ---------------------------------------------------------------- time

func (r *Registry) clock() time.Time { return registry.Millis(r.now()) }

func (r *Registry) nowMS() int64 { return toMS(r.clock()) }

func nowMillisFunc(now func() time.Time) func() int64 {
	if now == nil {
		now = time.Now
	}
	return func() int64 { return toMS(registry.Millis(now())) }
}

// toMS stores a time as milliseconds since the Unix epoch; the zero time is
// stored as 0.
func toMS(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// fromMS is the inverse of toMS.
func fromMS(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

// ---------------------------------------------------------------- transactions

// querier is what pgx.Tx, *pgx.Conn, *pgxpool.Conn and *pgxpool.Pool share.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// acquire takes a connection from pool, waiting at most AcquireTimeout.
func (r *Registry) acquire(ctx context.Context, pool *pgxpool.Pool, op string) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, r.acquireTimeout)
	defer cancel()
	conn, err := pool.Acquire(actx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		st := pool.Stat()
		if actx.Err() == nil {
			// The pool failed to open a connection (refused, no such
			// host, authentication): not a wait that ran out.
			return nil, connectError(registry.ErrStorage, err)
		}
		return nil, fmt.Errorf("%w: %s: no database connection within %s (pool of %d, %d in use): %w",
			registry.ErrStorage, op, r.acquireTimeout, st.MaxConns(), st.AcquiredConns(), err)
	}
	return conn, nil
}

// controlPool returns the control pool, or ErrNoControlPool.
func (r *Registry) controlPool(op string) (*pgxpool.Pool, error) {
	if r.control == nil {
		return nil, fmt.Errorf("%w: %s is a catalog or admission write and this registry was opened with OpenDataPlane; send it to the control plane (a registry opened with Open)", ErrNoControlPool, op)
	}
	return r.control, nil
}

// inTx runs fn in one READ COMMITTED transaction on pool and commits it.
// Serialization failures, deadlocks and unique-key races roll back and run
// fn again, a bounded number of times. Registry errors from fn roll back and
// are returned as they are; every other failure is registry.ErrStorage.
func (r *Registry) inTx(ctx context.Context, pool *pgxpool.Pool, op string, fn func(tx pgx.Tx) error) error {
	return r.inTxOpts(ctx, pool, op, pgx.TxOptions{}, fn)
}

// inTxOpts is inTx with transaction options.
func (r *Registry) inTxOpts(ctx context.Context, pool *pgxpool.Pool, op string, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var last error
	for attempt := range maxTxAttempts {
		if attempt > 0 {
			if err := sleep(ctx, retryDelay(attempt)); err != nil {
				return storageErr(op, err)
			}
		}
		err := r.runTx(ctx, pool, op, opts, fn)
		if err == nil || !retryable(err) {
			return err
		}
		last = err
	}
	return storageErr(op, fmt.Errorf("gave up after %d attempts: %w", maxTxAttempts, last))
}

// txRetry marks an error inside runTx as retryable.
type txRetry struct{ err error }

func (e *txRetry) Error() string { return e.err.Error() }
func (e *txRetry) Unwrap() error { return e.err }

func retryable(err error) bool {
	var t *txRetry
	return errors.As(err, &t)
}

func (r *Registry) runTx(ctx context.Context, pool *pgxpool.Pool, op string, opts pgx.TxOptions, fn func(tx pgx.Tx) error) error {
	conn, err := r.acquire(ctx, pool, op)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return classify(op, err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return classify(op, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return classify(op, err)
	}
	return nil
}

// pipe is one transaction whose statements go out as pipelined batches:
// the first batch also begins the transaction and the last may also commit
// it, so a transaction of n batches costs n round trips.
type pipe struct {
	conn      *pgxpool.Conn
	begun     bool
	committed bool
}

// send runs b in the transaction.
func (p *pipe) send(ctx context.Context, b *pgx.Batch) error { return p.run(ctx, b, false) }

// commit runs b and commits the transaction in the same round trip. If any
// statement of b fails, the server skips the rest of the batch, COMMIT
// included, and nothing commits.
func (p *pipe) commit(ctx context.Context, b *pgx.Batch) error { return p.run(ctx, b, true) }

// once runs b as the whole transaction, in one round trip and without
// BEGIN and COMMIT: the statements of a pipelined batch, up to the Sync
// that ends it, run as one implicit transaction, which the server commits
// at the Sync if every statement succeeded and rolls back otherwise. It
// must be the transaction's only batch.
func (p *pipe) once(ctx context.Context, b *pgx.Batch) error {
	if p.begun {
		return errors.New("pgregistry: once on a begun transaction")
	}
	p.begun = true
	err := p.conn.SendBatch(ctx, b).Close()
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		p.committed = true
	case errors.As(err, &pgErr):
		// A statement failed: the server rolled the batch back.
	case !p.conn.Conn().IsClosed() && p.conn.Conn().PgConn().TxStatus() == 'I':
		// Every statement may have run and committed while a result
		// could not be processed.
		return fmt.Errorf("%w: the transaction may have committed but its results could not be read: %w", errUnknownCommit, err)
	}
	return err
}

func (p *pipe) run(ctx context.Context, b *pgx.Batch, commit bool) error {
	if !p.begun {
		b.QueuedQueries = append([]*pgx.QueuedQuery{{SQL: "BEGIN"}}, b.QueuedQueries...)
		p.begun = true
	}
	if commit {
		b.Queue("COMMIT")
	}
	err := p.conn.SendBatch(ctx, b).Close()
	if commit {
		switch {
		case err == nil:
			p.committed = true
		case p.conn.Conn().PgConn().TxStatus() == 'I' && !p.conn.Conn().IsClosed():
			// The server ran the COMMIT but a result could not be
			// processed: it committed, yet the caller saw an error.
			return fmt.Errorf("%w: the transaction committed but its results could not be read: %w", errUnknownCommit, err)
		}
	}
	return err
}

// errUnknownCommit marks failures after which a commit may have happened.
var errUnknownCommit = errors.New("commit outcome unknown")

// inPipe runs fn in one pipelined transaction on pool, with the retries and
// error translation of inTx. fn must finish with p.commit; if it returns
// without committing, the transaction rolls back.
func (r *Registry) inPipe(ctx context.Context, pool *pgxpool.Pool, op string, fn func(p *pipe) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var last error
	for attempt := range maxTxAttempts {
		if attempt > 0 {
			if err := sleep(ctx, retryDelay(attempt)); err != nil {
				return storageErr(op, err)
			}
		}
		err := r.runPipe(ctx, pool, op, fn)
		if err == nil || !retryable(err) {
			return err
		}
		last = err
	}
	return storageErr(op, fmt.Errorf("gave up after %d attempts: %w", maxTxAttempts, last))
}

func (r *Registry) runPipe(ctx context.Context, pool *pgxpool.Pool, op string, fn func(p *pipe) error) error {
	conn, err := r.acquire(ctx, pool, op)
	if err != nil {
		return err
	}
	defer conn.Release()
	p := &pipe{conn: conn}
	err = fn(p)
	if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
			conn.Conn().Close(context.WithoutCancel(ctx)) // the pool drops a closed connection
		}
	}
	if err != nil {
		if errors.Is(err, errUnknownCommit) {
			return storageErr(op, err)
		}
		return classify(op, err)
	}
	return nil
}

// classify returns registry errors unchanged, marks transient PostgreSQL
// errors for retry, and turns every other error into registry.ErrStorage.
func classify(op string, err error) error {
	if isRegistryError(err) {
		return err
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "40001", "40P01", "23505":
			return &txRetry{err: storageErr(op, err)}
		case "42501":
			return fmt.Errorf("%w: %s: the database role lacks a privilege this operation needs (check deploy/postgres/roles.sql): %w", registry.ErrStorage, op, err)
		}
	}
	return storageErr(op, err)
}

func storageErr(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", registry.ErrStorage, op, err)
}

func isRegistryError(err error) bool {
	return registry.IsContractError(err) || errors.Is(err, ErrNoControlPool)
}

func retryDelay(attempt int) time.Duration {
	base := time.Duration(attempt) * time.Millisecond
	return base + rand.N(base+time.Millisecond)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// databaseURL names the one URL a registry, migration or apply lock was
// given, in errors.
const databaseURL = "the database URL"

// userError is an error a person reads as it is: its text says what is
// wrong ("cannot connect to the database at 127.0.0.1:5432: connection
// refused"), without the "registry: storage failure: pgregistry: ..."
// chain of the sentinel and the layers it passed, and it still matches
// the sentinel and its cause with errors.Is and errors.As.
type userError struct {
	sentinel error // a registry sentinel, or nil
	text     string
	cause    error // nil when the cause must not be reachable (it quotes a password)
}

// Error implements error.
func (e *userError) Error() string { return e.text }

// Unwrap returns the sentinel and the cause.
func (e *userError) Unwrap() []error {
	var out []error
	for _, err := range []error{e.sentinel, e.cause} {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// connectError is the error for a connection to the database that could
// not be made: "cannot connect to the database at ADDRESS: REASON", each
// address pgx tried once, with the reason it gave, instead of pgx's
// "failed to connect to `user=u database=d`:" and one indented line per
// attempt (the same refusal twice when sslmode=prefer tries TLS first):
// pgconnerr.ConnectFailure. It matches sentinel (when not nil) and err.
func connectError(sentinel, err error) error {
	return &userError{sentinel: sentinel, text: "cannot connect to the database" + pgconnerr.ConnectFailure(err), cause: err}
}

// parseError is the error for a connection string pgx cannot parse: what
// pgx found wrong (pgconnerr.ParseReason), without the string itself,
// which may hold the password in clear. The error matches
// registry.ErrInvalid; what names the URL ("the database URL").
func parseError(what, raw string, err error) error {
	reason := pgconnerr.ParseReason(err)
	if reason == "" {
		reason = "it is not a valid PostgreSQL connection string"
	}
	return &userError{sentinel: registry.ErrInvalid,
		text: fmt.Sprintf("%s %s does not parse: %s; write it as %s", what, redact(raw), reason, pgconnerr.URLForm)}
}

// parseConnConfig parses a connection string for a single connection;
// its error hides the string's password (parseError).
func parseConnConfig(what, raw string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(raw)
	if err != nil {
		return nil, parseError(what, raw, err)
	}
	return cc, nil
}

// redact hides a URL's password, in its user information or its query.
// Anything that is not a postgres:// or postgresql:// URL (a keyword/value
// string, a URL without its scheme) may carry a password anywhere and is
// not shown.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Opaque != "" {
		return "(not a postgres:// URL; not shown)"
	}
	if u.User != nil {
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
	}
	if q := u.Query(); q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.String()
}
