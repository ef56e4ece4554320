package sqliteruntime

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"

	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/internal/flock"
)

// File names inside the state directory.
const (
	// DatabaseFile is the SQLite database; SQLite keeps its write-ahead log
	// and shared-memory index beside it (journal.db-wal, journal.db-shm).
	DatabaseFile = "journal.db"
	// LockFile holds the exclusive lock and the pid of its holder.
	LockFile = "journal.lock"
)

// Errors of this package, besides the journal sentinels.
var (
	// ErrLocked: another process (or another Journal in this one) holds the
	// state directory. The error is a *LockedError.
	ErrLocked = errors.New("sqliteruntime: state directory is in use")
	// ErrSchemaTooNew: the database was written by a newer build.
	ErrSchemaTooNew = errors.New("sqliteruntime: database schema is newer than this build")
	// ErrCorrupt: the database file is damaged or not an SQLite database.
	ErrCorrupt = errors.New("sqliteruntime: the journal is corrupt")
)

// LockedError says which directory is locked and, when known, by whom.
type LockedError struct {
	Dir string
	PID int // 0 when the holder did not record itself
}

func (e *LockedError) Error() string {
	if e.PID > 0 {
		return fmt.Sprintf("sqliteruntime: state directory %s is in use by process %d; stop that host or give this one its own state directory", e.Dir, e.PID)
	}
	return fmt.Sprintf("sqliteruntime: state directory %s is in use by another process; stop that host or give this one its own state directory", e.Dir)
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// lockDir takes the state directory's lock (see package flock).
func lockDir(dir string) (*flock.Lock, error) {
	lock, err := flock.Acquire(lockPath(dir))
	var held *flock.HeldError
	switch {
	case errors.As(err, &held):
		return nil, &LockedError{Dir: dir, PID: held.PID}
	case errors.Is(err, flock.ErrUnsupported):
		return nil, fmt.Errorf("sqliteruntime: state directory %s: exclusive locking is not implemented on %s; run the host on Linux or macOS, or use pgruntime", dir, runtime.GOOS)
	case err != nil:
		return nil, fmt.Errorf("sqliteruntime: %w", err)
	}
	return lock, nil
}

// SyncMode says when a commit is forced to stable storage.
type SyncMode string

// Sync modes.
const (
	// SyncFull fsyncs the write-ahead log at every commit (one fsync per
	// group commit): a commit that returned survives a process kill, an OS
	// crash and power loss. The default.
	SyncFull SyncMode = "full"
	// SyncNormal fsyncs only at checkpoints: a commit that returned
	// survives a process kill; an OS crash or power loss may roll back the
	// most recent commits but never corrupts the database.
	SyncNormal SyncMode = "normal"
)

// Config configures Open. Dir is required; every other zero value means the
// documented default.
type Config struct {
	// Dir is the state directory. It is created with mode 0700 when
	// missing; the database file is created with mode 0600.
	Dir string
	// Sync selects the durability of a commit. Defaults to SyncFull.
	Sync SyncMode
	// ReadConns bounds the connections serving reads. Defaults to 4.
	ReadConns int
	// MaxBatch bounds how many concurrent write requests one group commit
	// carries. Defaults to 128.
	MaxBatch int
}

// Journal is the SQLite runtime journal. It is safe for concurrent use.
type Journal struct {
	dir  string
	path string
	lock *flock.Lock

	wdb *sql.DB // one connection, owned by the writer goroutine
	rdb *sql.DB // the read pool
	w   *writer
	rs  readStmts

	// closeMu is held shared by every call and exclusively by Close, so
	// Close waits for calls in progress and the writer outlives them.
	closeMu   sync.RWMutex
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

var _ journal.Journal = (*Journal)(nil)

// Open opens (creating if needed) the journal in cfg.Dir, takes the state
// directory's exclusive lock, checks or installs the schema and starts the
// writer. The caller must Close the journal.
func Open(ctx context.Context, cfg Config) (*Journal, error) {
	if cfg.Dir == "" {
		return nil, errors.New("sqliteruntime: Config.Dir is required: set it to the host's state directory")
	}
	switch cfg.Sync {
	case "":
		cfg.Sync = SyncFull
	case SyncFull, SyncNormal:
	default:
		return nil, fmt.Errorf("sqliteruntime: Config.Sync %q is not %q or %q", cfg.Sync, SyncFull, SyncNormal)
	}
	if cfg.ReadConns < 0 || cfg.MaxBatch < 0 {
		return nil, errors.New("sqliteruntime: Config.ReadConns and Config.MaxBatch must not be negative")
	}
	if cfg.ReadConns == 0 {
		cfg.ReadConns = 4
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = 128
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("sqliteruntime: state directory %s: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sqliteruntime: create state directory: %w", err)
	}
	if err := checkDirMode(dir); err != nil {
		return nil, err
	}

	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	j := &Journal{dir: dir, path: filepath.Join(dir, DatabaseFile), lock: lock}
	if err := j.open(ctx, cfg); err != nil {
		j.release()
		return nil, err
	}
	return j, nil
}

func (j *Journal) open(ctx context.Context, cfg Config) error {
	if err := createDatabase(ctx, j.path); err != nil {
		return err
	}
	var err error
	// mode=rw: the file exists now; SQLite must not create an empty one
	// should it disappear.
	j.wdb, err = sql.Open("sqlite", dsn(j.path,
		"mode=rw",
		"_pragma=busy_timeout(10000)",
		"_pragma=journal_mode(WAL)",
		"_pragma=synchronous("+string(cfg.Sync)+")",
		"_pragma=fullfsync("+fullFsync(cfg.Sync)+")",
		"_txlock=immediate",
	))
	if err != nil {
		return fmt.Errorf("sqliteruntime: open %s: %w", j.path, err)
	}
	j.wdb.SetMaxOpenConns(1)
	j.wdb.SetMaxIdleConns(1)
	j.wdb.SetConnMaxLifetime(0)
	conn, err := j.wdb.Conn(ctx)
	if err != nil {
		return stepError("open", j.path, err)
	}
	var mode string
	if err := conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		conn.Close()
		return stepError("open", j.path, err)
	}
	if mode != "wal" {
		conn.Close()
		return fmt.Errorf("sqliteruntime: %s is in journal mode %q and could not be switched to WAL; check that its directory is on a local file system", j.path, mode)
	}
	if err := checkIntact(ctx, conn, j.path); err != nil {
		conn.Close()
		return err
	}
	if err := installSchema(ctx, conn, j.path, false); err != nil {
		conn.Close()
		return err
	}
	j.w, err = newWriter(ctx, conn, cfg.MaxBatch)
	if err != nil {
		conn.Close()
		return fmt.Errorf("sqliteruntime: open %s: %w", j.path, err)
	}

	j.rdb, err = sql.Open("sqlite", dsn(j.path,
		"mode=rw",
		"_pragma=busy_timeout(10000)",
		"_query_only=1",
	))
	if err != nil {
		return fmt.Errorf("sqliteruntime: open %s: %w", j.path, err)
	}
	j.rdb.SetMaxOpenConns(cfg.ReadConns)
	j.rdb.SetMaxIdleConns(cfg.ReadConns)
	j.rdb.SetConnMaxLifetime(0)
	if err := j.rs.prepare(ctx, j.rdb); err != nil {
		return fmt.Errorf("sqliteruntime: open %s: %w", j.path, err)
	}
	j.w.start()
	return nil
}

// fullFsync is PRAGMA fullfsync for mode: on with SyncFull. On macOS,
// fsync(2) leaves the data in the drive's cache and only F_FULLFSYNC
// flushes it, so without it a commit does not survive a loss of power
// there; other systems ignore the setting.
func fullFsync(mode SyncMode) string {
	if mode == SyncFull {
		return "1"
	}
	return "0"
}

// SQLite's primary result codes for a damaged file.
const (
	sqliteCorrupt = 11 // SQLITE_CORRUPT
	sqliteNotADB  = 26 // SQLITE_NOTADB
)

// isCorrupt reports whether err is SQLite's verdict that the file is
// damaged or not a database.
func isCorrupt(err error) bool {
	var se interface{ Code() int }
	if !errors.As(err, &se) {
		return false
	}
	c := se.Code() & 0xff
	return c == sqliteCorrupt || c == sqliteNotADB
}

// stepError is the error of an opening step (verb) that failed on the
// database at path: ErrCorrupt, saying what to do, when SQLite found the
// file damaged or not a database.
func stepError(verb, path string, err error) error {
	if isCorrupt(err) {
		return corruptError(path, err.Error())
	}
	return fmt.Errorf("sqliteruntime: %s %s: %w", verb, path, err)
}

// corruptError is the ErrCorrupt of the database at path, saying what to do.
func corruptError(path, detail string) error {
	return fmt.Errorf("%w: %s: %s; restore the state directory from a backup taken while its host was stopped, or move it away and start this replica under a new replica ID (the actions this journal recorded cannot be answered any more, and only a new ID keeps them from being routed here and run a second time)",
		ErrCorrupt, path, detail)
}

// checkIntact runs SQLite's quick_check (every page's structure, every
// record's format; not index contents) before anything is read or
// written: a damaged journal is refused at start rather than misread or
// failing action by action. It reads the whole file: about 130 ms for
// 140 MB on the development VM.
func checkIntact(ctx context.Context, conn *sql.Conn, path string) error {
	rows, err := conn.QueryContext(ctx, "PRAGMA quick_check(5)")
	if err != nil {
		return stepError("check", path, err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return stepError("check", path, err)
		}
		if line != "ok" {
			problems = append(problems, line)
		}
	}
	if err := rows.Err(); err != nil {
		return stepError("check", path, err)
	}
	if len(problems) > 0 {
		return corruptError(path, "quick_check found: "+strings.Join(problems, "; "))
	}
	return nil
}

// dsn builds a file: URI for path with the driver parameters.
func dsn(path string, params ...string) string {
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(path)}
	s := u.String()
	for i, p := range params {
		if i == 0 {
			s += "?"
		} else {
			s += "&"
		}
		s += p
	}
	return s
}

// Dir returns the absolute path of the state directory.
func (j *Journal) Dir() string { return j.dir }

// Durability reports journal.Durable.
func (j *Journal) Durability() journal.Durability { return journal.Durable }

// Close stops the writer after the calls in progress, closes the database
// and releases the state directory. It is idempotent.
//
// Shutdown order: refuse new calls → wait for calls in progress → stop the
// writer goroutine → close prepared statements and connections (SQLite
// checkpoints the log when the last connection closes) → release the lock.
func (j *Journal) Close() error {
	j.closeOnce.Do(func() {
		j.closed.Store(true)
		j.closeMu.Lock()
		defer j.closeMu.Unlock()
		j.closeErr = j.release()
	})
	return j.closeErr
}

// release frees everything Open acquired; it tolerates a partial Open.
func (j *Journal) release() error {
	var errs []error
	if j.w != nil {
		errs = append(errs, j.w.close())
	}
	errs = append(errs, j.rs.close())
	if j.rdb != nil {
		errs = append(errs, j.rdb.Close())
	}
	if j.wdb != nil {
		errs = append(errs, j.wdb.Close())
	}
	if j.lock != nil {
		errs = append(errs, j.lock.Release())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sqliteruntime: close %s: %w", j.path, err)
	}
	return nil
}

// enter starts a call: it fails with ErrClosed after Close and with the
// context's error when ctx is done. The caller must call j.leave.
func (j *Journal) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	j.closeMu.RLock()
	if j.closed.Load() {
		j.closeMu.RUnlock()
		return journal.ErrClosed
	}
	return nil
}

func (j *Journal) leave() { j.closeMu.RUnlock() }

func lockPath(dir string) string { return filepath.Join(dir, LockFile) }

// checkDirMode refuses a state directory that users other than its owner
// may write to (a shared directory such as /tmp, or one made group
// writable), or that another user than this process's or root owns (whose
// owner may write to it whatever its mode): one of them
// could plant a symbolic link or a file of their own under the journal's
// name before the host creates it, or replace it.
func checkDirMode(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("sqliteruntime: state directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("sqliteruntime: state directory %s is not a directory", dir)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("sqliteruntime: state directory %s is writable by its group or by others (mode %04o): another user could replace the journal; use a directory of the replica's own (the host creates a missing one 0700) or run chmod go-w on it",
			dir, aip.OctalMode(fi.Mode()))
	}
	if uid, ok := aip.FileOwnerOK(fi); !ok {
		euid := os.Geteuid()
		return fmt.Errorf("sqliteruntime: state directory %s is owned by uid %d, not by this process's user (uid %d): that user could replace the journal; use a directory of the replica's own (the host creates a missing one 0700) or chown it to uid %d",
			dir, uid, euid, euid)
	}
	return nil
}
