package pgruntime_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/internal/pgsession"
	"github.com/aipfleet/aipfleet/internal/pgtest"
)

// TestNamespaceIsExclusive: a second journal of a namespace that is open
// is refused with a *LockedError naming the namespace and its holder, so
// two hosts given the same replica ID cannot both run on it (the second
// would recover the first's running actions as its own and settle them
// while they run); other namespaces open, and the namespace opens again
// once its journal is closed.
func TestNamespaceIsExclusive(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	first := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_same"})

	second, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_same"})
	var le *pgruntime.LockedError
	if !errors.As(err, &le) || !errors.Is(err, pgruntime.ErrLocked) {
		if second != nil {
			second.Close()
		}
		t.Fatalf("second Open of an open namespace: %v, want a LockedError", err)
	}
	if le.Namespace != "crepl_same" || le.Lost || !strings.Contains(le.Holder, "pid") ||
		!strings.Contains(err.Error(), "crepl_same") || !strings.Contains(err.Error(), "own namespace") {
		t.Fatalf("LockedError %+v (%q) does not name the namespace, its holder and what to do", le, err)
	}
	open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_other"})

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	again := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_same"})
	if err := again.Probe(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReopenRightAfterClose: Close releases the namespace before it
// returns, so a host that stops and one started right after it (a restart,
// the next build of an upgrade) opens the journal. Closing the lock's
// connection alone left the release to the backend's exit, which comes
// after Close returned: the next Open was refused now and then as if
// another host held the namespace.
func TestReopenRightAfterClose(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	for i := range 40 {
		j, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_restarted", MaxConns: 1})
		if err != nil {
			t.Fatalf("open %d, right after the previous journal closed: %v", i, err)
		}
		if err := j.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// killLockSession terminates the PostgreSQL session holding ns's lock, as a
// dropped connection would end it.
func killLockSession(t *testing.T, dbURL string) {
	t.Helper()
	conn := connect(t, dbURL)
	var n int
	if err := conn.QueryRow(context.Background(), `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("terminated %d lock sessions, want 1", n)
	}
}

// TestLostNamespaceLock: a journal whose lock session dropped takes the
// lock again at its next Probe when it is free; when another journal took
// it meanwhile, the Probe fails (the host is not ready) and so does every
// later call: two journals never go on writing one namespace.
func TestLostNamespaceLock(t *testing.T) {
	ctx := context.Background()
	t.Run("retaken", func(t *testing.T) {
		dbURL := pgtest.NewDatabase(t)
		j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_l"})
		killLockSession(t, dbURL)
		if err := j.Probe(ctx); err != nil {
			t.Fatalf("Probe after the lock session dropped: %v, want the lock taken again", err)
		}
		if other, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_l"}); !errors.Is(err, pgruntime.ErrLocked) {
			if other != nil {
				other.Close()
			}
			t.Fatalf("Open after the lock was taken again: %v, want ErrLocked", err)
		}
	})
	t.Run("taken by another", func(t *testing.T) {
		dbURL := pgtest.NewDatabase(t)
		j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_l"})
		killLockSession(t, dbURL)
		open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_l"})
		err := j.Probe(ctx)
		var le *pgruntime.LockedError
		if !errors.As(err, &le) || !le.Lost || !strings.Contains(err.Error(), "lost") {
			t.Fatalf("Probe after another journal took the namespace: %v, want a LockedError with Lost", err)
		}
		_, _, err = j.BeginAction(ctx, journal.Action{ActionID: aip.NewActionID(), ReceivedAt: time.Now()})
		if !errors.Is(err, pgruntime.ErrLocked) {
			t.Fatalf("BeginAction on a journal that lost its namespace: %v, want ErrLocked", err)
		}
	})
}

// TestLockSessionDetectsDeadHost: the namespace lock lasts as long as its
// session does on the server, and a host whose machine died (power off, a
// partition) left its session to the server's TCP keepalive, which
// PostgreSQL leaves to the operating system (a first probe after 2 hours
// on Linux), or, with data sent to it unacknowledged, to the system's
// retransmissions (about 15 minutes): no replacement host could take the
// namespace until then. The lock session sets pgsession's keepalives and
// tcp_user_timeout (a dead host noticed within 2 minutes) when it has
// none, and again when it is re-taken after a drop; a value the URL sets
// is kept.
func TestLockSessionDetectsDeadHost(t *testing.T) {
	ctx := context.Background()
	dbURL := pgtest.NewDatabase(t)
	want := map[string]string{
		"tcp_keepalives_idle":     strconv.Itoa(pgsession.KeepalivesIdle),
		"tcp_keepalives_interval": strconv.Itoa(pgsession.KeepalivesInterval),
		"tcp_keepalives_count":    strconv.Itoa(pgsession.KeepalivesCount),
		"tcp_user_timeout":        strconv.Itoa(pgsession.UserTimeoutMillis),
	}
	check := func(j *pgruntime.Journal, when string, want map[string]string) {
		t.Helper()
		for name, w := range want {
			v, err := j.LockSessionSetting(ctx, name)
			if err != nil || v != w {
				t.Errorf("%s: the lock session has %s %q (%v), want %s", when, name, v, err, w)
			}
		}
	}
	j := open(t, pgruntime.Config{DatabaseURL: dbURL, Namespace: "crepl_k"})
	check(j, "after Open", want)
	killLockSession(t, dbURL)
	if err := j.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	check(j, "re-taken after a drop", want)

	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("tcp_keepalives_idle", "30")
	u.RawQuery = q.Encode()
	kept := open(t, pgruntime.Config{DatabaseURL: u.String(), Namespace: "crepl_kept"})
	want["tcp_keepalives_idle"] = "30"
	want["tcp_user_timeout"] = "90000" // 30 s + 6 × 10 s: what the keepalives take
	check(kept, "URL with tcp_keepalives_idle=30", want)
}
