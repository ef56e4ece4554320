package pgruntime

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/pgconnerr"
	"github.com/aipfleet/aipfleet/internal/pgsession"
)

// Errors of this package, besides the journal sentinels.
var (
	// ErrSchemaTooNew: the database has migrations this build does not know.
	ErrSchemaTooNew = errors.New("pgruntime: database schema is newer than this build")
	// ErrMigrationChanged: an applied migration differs from this build's
	// file of the same number.
	ErrMigrationChanged = errors.New("pgruntime: applied migration was changed")
	// ErrInvalidURL: Config.DatabaseURL, or the file of OpenURLFile, is
	// not a connection string pgx can parse. The error says what pgx
	// found wrong and the form to write, never the string, which holds
	// the password; it is a setting to fix, not a database to wait for.
	ErrInvalidURL = errors.New("pgruntime: invalid database URL")
)

// MaxNamespace is the longest Config.Namespace accepted, in bytes: the
// longest replica ID (aip.MaxRecordIDBytes), which hosts use.
const MaxNamespace = aip.MaxRecordIDBytes

// Config configures Open. DatabaseURL and Namespace are required; every
// other zero value means the documented default.
type Config struct {
	// DatabaseURL is a PostgreSQL URL or keyword/value string, as
	// pgxpool.ParseConfig accepts. It is a secret: read it from a file.
	DatabaseURL string
	// Namespace separates the journals of replicas sharing one database:
	// every row is keyed by it and no query crosses it. Use the replica ID.
	// At most MaxNamespace bytes.
	Namespace string
	// MaxConns bounds the connection pool. Defaults to 10.
	MaxConns int32
	// ConnectTimeout bounds establishing one connection. Defaults to 10s.
	ConnectTimeout time.Duration
}

// Journal is the PostgreSQL runtime journal of one namespace. It is safe for
// concurrent use; several Journals (in several processes) with different
// namespaces may share one database.
type Journal struct {
	pool *pgxpool.Pool
	ns   string
	lock *nsLock

	// closeMu is held shared by every call and exclusively by Close.
	closeMu   sync.RWMutex
	closed    atomic.Bool
	closeOnce sync.Once

	// afterConflict, set by tests only, runs when BeginAction or
	// AcceptAction found the action journaled already, before they read
	// its record.
	afterConflict func()
}

var _ journal.Journal = (*Journal)(nil)

// Open connects to the database, applies the embedded migrations (once,
// under an advisory lock), takes the namespace's exclusive lock (a
// *LockedError when another journal holds it) and returns the journal of
// cfg.Namespace. The caller must Close it. A DatabaseURL pgx cannot parse
// is an ErrInvalidURL, refused before anything is dialled.
func Open(ctx context.Context, cfg Config) (*Journal, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("pgruntime: Config.DatabaseURL is required")
	}
	if cfg.Namespace == "" {
		return nil, errors.New("pgruntime: Config.Namespace is required: set it to the replica ID so replicas sharing the database keep separate journals")
	}
	if len(cfg.Namespace) > MaxNamespace {
		return nil, fmt.Errorf("pgruntime: Config.Namespace is %d bytes; the limit is %d", len(cfg.Namespace), MaxNamespace)
	}
	if cfg.MaxConns < 0 || cfg.ConnectTimeout < 0 {
		return nil, errors.New("pgruntime: Config.MaxConns and Config.ConnectTimeout must not be negative")
	}
	if cfg.MaxConns == 0 {
		cfg.MaxConns = 10
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 10 * time.Second
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		// Not err itself: it quotes the URL, password included.
		return nil, &urlError{reason: pgconnerr.ParseReason(err)}
	}
	pc.MaxConns = cfg.MaxConns
	pc.ConnConfig.ConnectTimeout = cfg.ConnectTimeout
	// A session cut off mid-transaction would hold its row locks until
	// the server's TCP notices; without a timeout of the role's, the
	// session gets one. It never commits asynchronously: an AcceptAction
	// lost in a server crash after it returned lets its action run twice.
	// And the server notices a dead host within minutes (pgsession).
	pc.AfterConnect = pgsession.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgruntime: connect: %w", err)
	}
	if err := migrate(ctx, pool, pc.ConnConfig.User); err != nil {
		pool.Close()
		return nil, err
	}
	// The namespace is this journal's alone, before anything is written
	// to it: a second host would recover (and settle) this one's running
	// actions as its own.
	lock, err := lockNamespace(ctx, pc.ConnConfig, cfg.Namespace)
	if err != nil {
		pool.Close()
		return nil, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO aip_runtime_receipt_heads (journal_ns, seq, hash, prev_hash) VALUES ($1, 0, '', '')
		ON CONFLICT (journal_ns) DO NOTHING`, cfg.Namespace); err != nil {
		pool.Close()
		lock.release()
		return nil, fmt.Errorf("pgruntime: initialise namespace %s: %w", cfg.Namespace, err)
	}
	return &Journal{pool: pool, ns: cfg.Namespace, lock: lock}, nil
}

// urlError is ErrInvalidURL with what pgx found wrong in the string;
// file, when set, is the file of OpenURLFile the string came from.
type urlError struct{ reason, file string }

func (e *urlError) Error() string {
	what := "Config.DatabaseURL is not"
	if e.file != "" {
		what = "database URL file " + e.file + " does not hold"
	}
	return "pgruntime: " + what + " a valid PostgreSQL connection string: " + e.reason + "; " + pgconnerr.URLHint
}

func (e *urlError) Unwrap() error { return ErrInvalidURL }

// MaxURLFileBytes bounds the file OpenURLFile reads.
const MaxURLFileBytes = 16 << 10

// OpenURLFile opens the journal whose DatabaseURL is kept in the secret file
// at path: the file is read with aip.ReadSecretFile (a regular,
// owner-only file of 1 to MaxURLFileBytes bytes; surrounding whitespace
// removed), the bytes read are cleared once Open has parsed them, and
// every error names path (an ErrInvalidURL, "database URL file PATH does
// not hold a valid PostgreSQL connection string: REASON; ..."; the
// others, Open's error after "database URL file PATH: ").
// cfg.DatabaseURL must be empty; the other fields are Open's.
func OpenURLFile(ctx context.Context, path string, cfg Config) (*Journal, error) {
	if cfg.DatabaseURL != "" {
		return nil, errors.New("pgruntime: OpenURLFile reads Config.DatabaseURL from its file; leave it empty")
	}
	raw, err := aip.ReadSecretFile(path, MaxURLFileBytes)
	if err != nil {
		return nil, fmt.Errorf("pgruntime: database URL: %w", err)
	}
	defer clear(raw)
	cfg.DatabaseURL = string(raw)
	j, err := Open(ctx, cfg)
	var ue *urlError
	if errors.As(err, &ue) {
		return nil, &urlError{reason: ue.reason, file: path}
	}
	if err != nil {
		return nil, fmt.Errorf("database URL file %s: %w", path, err)
	}
	return j, nil
}

// Namespace returns the journal's namespace.
func (j *Journal) Namespace() string { return j.ns }

// Durability reports journal.Durable.
func (j *Journal) Durability() journal.Durability { return journal.Durable }

// Close waits for calls in progress, closes the pool, then releases the
// namespace. It is idempotent.
func (j *Journal) Close() error {
	j.closeOnce.Do(func() {
		j.closed.Store(true)
		j.closeMu.Lock()
		defer j.closeMu.Unlock()
		j.pool.Close()
		j.lock.release()
	})
	return nil
}

// enter starts a call; the caller must call leave.
func (j *Journal) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.closeMu.RLock()
	if j.closed.Load() {
		j.closeMu.RUnlock()
		return journal.ErrClosed
	}
	if err := j.lock.lostErr(); err != nil {
		j.closeMu.RUnlock()
		return err
	}
	return nil
}

func (j *Journal) leave() { j.closeMu.RUnlock() }

// connectError is a connection to the database that could not be made,
// worded by pgconnerr: "cannot connect to the database at HOST:PORT:
// REASON; check ...", the address pgx tried and what to check, instead of
// pgx's "failed to connect to `user=u database=d`:" and one indented line
// per attempt, which left out the port of a host name that does not
// resolve and said nothing of what to check. It wraps the pgx error.
type connectError struct {
	prefix string
	err    error
}

func (e *connectError) Error() string {
	return e.prefix + "cannot connect to the database" + pgconnerr.ConnectFailure(e.err) + "; " + pgconnerr.ConnectHint(e.err, "the database URL")
}

func (e *connectError) Unwrap() error { return e.err }

// connectErr is err, an error of a connection attempt, as a
// *connectError after prefix ("pgruntime: "); an error that is not pgx's
// failure to connect (a cancelled start) is fallback's wrapping of it.
func connectErr(err error, prefix, fallback string) error {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &connectError{prefix: prefix, err: err}
	}
	return fmt.Errorf("%s: %w", fallback, err)
}

// dbErr wraps a database error with context.
func dbErr(err error, format string, args ...any) error {
	return fmt.Errorf("pgruntime: "+format+": %w", append(args, err)...)
}
