package pgruntime

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/internal/pgsession"
)

// ErrLocked: another journal, in this process or another, holds the
// namespace. The error is a *LockedError.
var ErrLocked = errors.New("pgruntime: journal namespace is in use")

// LockedError says which namespace is held and, when PostgreSQL shows it,
// by which session.
type LockedError struct {
	Namespace string
	// Holder describes the holding session (its backend pid, application
	// name and client address), "" when it could not be read.
	Holder string
	// Lost is true when this journal held the namespace, lost its session
	// (a dropped connection ends a PostgreSQL session lock) and another
	// journal took it meanwhile: this journal refuses every call from then on.
	Lost bool
}

func (e *LockedError) Error() string {
	by := "another host"
	if e.Holder != "" {
		by = "another host (" + e.Holder + ")"
	}
	if e.Lost {
		return fmt.Sprintf("pgruntime: this journal lost its lock on namespace %s and %s took it; this journal refuses every call: stop this host, and give each replica its own namespace (its replica ID)", e.Namespace, by)
	}
	return fmt.Sprintf("pgruntime: journal namespace %s is in use by %s; stop that host or give this one its own namespace (its replica ID)", e.Namespace, by)
}

// Unwrap returns ErrLocked.
func (e *LockedError) Unwrap() error { return ErrLocked }

// nsLock is a journal's exclusive hold on its namespace: a session-level
// advisory lock held by a connection of its own, outside the pool, for the
// journal's life. PostgreSQL releases it when that session ends, so a host
// that dies, even by SIGKILL, never leaves a stale lock. A nil *nsLock
// (a Journal built without Open, as tests of older builds do) holds
// nothing and never fails.
type nsLock struct {
	cfg *pgx.ConnConfig
	ns  string
	key int64

	mu   sync.Mutex
	conn *pgx.Conn // nil after a connection loss, until re-taken
	// lost is set once another session took the lock.
	lost atomic.Pointer[LockedError]
}

// lockKey is the advisory lock key of a namespace: the first 8 bytes of
// SHA-256 over a fixed prefix and the namespace.
func lockKey(ns string) int64 {
	sum := sha256.Sum256([]byte("aipfleet runtime journal namespace\x00" + ns))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}

// lockNamespace takes the namespace's lock or fails with a *LockedError.
func lockNamespace(ctx context.Context, cfg *pgx.ConnConfig, ns string) (*nsLock, error) {
	l := &nsLock{cfg: cfg, ns: ns, key: lockKey(ns)}
	if err := l.take(ctx); err != nil {
		return nil, err
	}
	return l, nil
}

// take connects and takes the lock; l.mu is held or l is not shared yet.
func (l *nsLock) take(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, l.cfg.Copy())
	if err != nil {
		return connectErr(err, "pgruntime: lock namespace "+l.ns+": ", "pgruntime: connect to lock namespace "+l.ns)
	}
	// The lock lasts as long as the session does on the server: should
	// this host's machine die, the server must notice within minutes, not
	// hours, for a replacement to take the namespace.
	if err := pgsession.DetectDeadPeer(ctx, conn); err != nil {
		conn.Close(context.Background())
		return fmt.Errorf("pgruntime: lock namespace %s: %w", l.ns, err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&ok); err != nil {
		conn.Close(context.Background())
		return fmt.Errorf("pgruntime: lock namespace %s: %w", l.ns, err)
	}
	if !ok {
		holder := l.holder(ctx, conn)
		conn.Close(context.Background())
		return &LockedError{Namespace: l.ns, Holder: holder}
	}
	l.conn = conn
	return nil
}

// holder describes the session holding the lock, "" when unknown (the
// role may not see other sessions).
func (l *nsLock) holder(ctx context.Context, conn *pgx.Conn) string {
	var (
		pid       int32
		app, addr string
	)
	err := conn.QueryRow(ctx, `SELECT a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local')
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
		AND l.classid = (($1::bigint >> 32) & 4294967295)::oid AND l.objid = ($1::bigint & 4294967295)::oid
		LIMIT 1`, l.key).Scan(&pid, &app, &addr)
	if err != nil {
		return ""
	}
	s := fmt.Sprintf("PostgreSQL backend pid %d, client %s", pid, addr)
	if app != "" {
		s += ", application " + app
	}
	return s
}

// check fails once the lock was lost to another session. A connection
// that is gone (and the lock with it) is reconnected and the lock taken
// again; if another session holds it by then, the journal is lost for good.
func (l *nsLock) check(ctx context.Context) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if le := l.lost.Load(); le != nil {
		return le
	}
	if l.conn != nil {
		var held bool
		// The session is alive and still holds the lock (pg_locks lists
		// this session's own locks).
		err := l.conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND pid = pg_backend_pid()
			AND classid = (($1::bigint >> 32) & 4294967295)::oid AND objid = ($1::bigint & 4294967295)::oid)`, l.key).Scan(&held)
		if err == nil && held {
			return nil
		}
		if err != nil && !l.conn.IsClosed() && ctx.Err() != nil {
			return fmt.Errorf("pgruntime: check the lock on namespace %s: %w", l.ns, err)
		}
		l.conn.Close(context.Background())
		l.conn = nil
	}
	err := l.take(ctx)
	var le *LockedError
	if errors.As(err, &le) {
		le.Lost = true
		l.lost.Store(le)
	}
	return err
}

// lostErr returns the error every call fails with once the lock was lost,
// nil while it was not.
func (l *nsLock) lostErr() error {
	if l == nil {
		return nil
	}
	if le := l.lost.Load(); le != nil {
		return le
	}
	return nil
}

// releaseTimeout bounds the unlock at release.
const releaseTimeout = 5 * time.Second

// release unlocks the namespace and ends the lock's session. The unlock
// is a round trip, so the namespace is free when release returns: ending
// the session alone releases the lock only when its backend exits, after
// the connection closed, and a journal opened right after (a restarted
// host) could find it still held. Should the unlock fail, ending the
// session releases the lock all the same.
func (l *nsLock) release() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		var unlocked bool
		_ = l.conn.QueryRow(ctx, `SELECT pg_advisory_unlock($1)`, l.key).Scan(&unlocked)
		cancel()
		l.conn.Close(context.Background())
		l.conn = nil
	}
}
