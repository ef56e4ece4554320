// Package pgsession sets up the PostgreSQL sessions of aipfleet's pools
// and of the sessions they hold locks on outside a pool.
//
// Every pool (the registry's control and data pools, a host's journal
// pool) installs AfterConnect, which gives each new session three rules in
// one round trip:
//
//   - a transaction left idle for a minute is ended (AbandonedTransactionTimeout),
//     unless the role, the database or the URL says otherwise;
//   - a commit is never acknowledged before it is on the server's disk:
//     synchronous_commit off becomes local, whoever set it;
//   - the server's end of the connection notices a dead client within about
//     two minutes (TCP keepalives and tcp_user_timeout), unless the role, the
//     database, the URL or the server's configuration says otherwise.
//
// A session that holds a session-level advisory lock outside a pool (a
// journal's namespace lock, the registry's apply lock) calls
// DetectDeadPeer alone.
package pgsession

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// AbandonedTransactionTimeout is the idle_in_transaction_session_timeout
// AfterConnect gives a session that has none, the value
// deploy/postgres/roles.sql sets on the registry's roles.
const AbandonedTransactionTimeout = "60s"

// The server-side TCP keepalives DetectDeadPeer and AfterConnect give a
// session that has none: the server probes a connection idle for
// KeepalivesIdle seconds every KeepalivesInterval seconds and ends the
// session after KeepalivesCount unanswered probes, so a client that is gone
// is noticed KeepalivesIdle + KeepalivesCount × KeepalivesInterval seconds
// (2 minutes) after the last traffic. PostgreSQL's own default (0) leaves
// it to the operating system, 2 hours and 11 minutes on Linux.
const (
	KeepalivesIdle     = 60
	KeepalivesInterval = 10
	KeepalivesCount    = 6
)

// UserTimeoutMillis is the tcp_user_timeout (milliseconds) DetectDeadPeer
// and AfterConnect give a session that has none and whose keepalives are
// pgsession's: KeepalivesIdle + KeepalivesCount × KeepalivesInterval
// seconds, the time the keepalives take to give up on an idle connection.
// The keepalives only probe a connection with nothing to send; while the
// server has data its client has not acknowledged (an answer, a
// notification), the operating system retransmits it instead, for about
// 15 minutes on Linux before the session ends, and a dead host's
// session-level advisory lock stays held that long. tcp_user_timeout
// bounds how long sent data may stay unacknowledged, so the session ends
// within the same 2 minutes either way. A session whose keepalives an
// operator set gets their idle + count × interval instead (Linux lets
// tcp_user_timeout, when set, decide when unanswered keepalive probes end
// a connection: so it never ends an idle one sooner than they would).
const UserTimeoutMillis = (KeepalivesIdle + KeepalivesCount*KeepalivesInterval) * 1000

// AfterConnect is the pgxpool AfterConnect hook of every aipfleet pool. In
// one round trip it sets, on the new session:
//
// idle_in_transaction_session_timeout. aipfleet's transactions are a few
// statements sent back to back, so a session idle inside one for a minute
// belongs to a process cut off from the server in the middle of it (a
// partition, a frozen connection, a process gone without closing its
// socket). The server keeps such a session, and the row locks it holds,
// until its TCP notices the peer is gone. When the session has no timeout
// (0, from the server's default or its configuration file), this sets
// AbandonedTransactionTimeout for it, so PostgreSQL ends it instead; a
// value the role, the database or the URL sets is kept, 0 included (an
// operator's way to turn it off).
//
// synchronous_commit, from off to local. With synchronous_commit off
// (from the server's configuration, the role, the database or the URL),
// PostgreSQL answers a commit before its WAL is flushed, and a server
// crash up to three wal_writer_delay later loses it: a journal's
// AcceptAction that returned (so the host ran the action), or a route
// assignment or settlement the dispatcher acted on (so a retry of the
// action could be routed to another replica), would be gone. Local keeps
// the commit on the server's own disk before the answer; any other value
// (on, remote_write, remote_apply: waiting for standbys as well, the
// operator's to configure) is kept.
//
// TCP keepalives and tcp_user_timeout (see DetectDeadPeer), so the
// connection slot of a process whose machine died comes back within
// minutes.
func AfterConnect(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, afterConnectSQL); err != nil {
		return fmt.Errorf("set up the new session (idle_in_transaction_session_timeout, synchronous_commit, TCP keepalives): %w", err)
	}
	return nil
}

// afterConnectSQL is AfterConnect's statements, sent as one simple
// query.
var afterConnectSQL = setTimeout(false) + ";\n" + durableCommitsSQL + ";\n" + keepalivesSQL

// DetectDeadPeer gives conn's server side TCP keepalives (KeepalivesIdle,
// KeepalivesInterval, KeepalivesCount) where it has none. A session whose
// client's machine dies (power off, a partition) stays on the server, with
// its session-level advisory locks, until the server's TCP notices the
// client is gone; an idle connection is noticed only by keepalive probes,
// and PostgreSQL's default (0) leaves them to the operating system: the
// first probe after 2 hours on Linux. The client's own keepalives (pgx's
// dialer: Go's 15 s) tell the client about a dead server, never the server
// about a dead client. Each of the three settings is set only when it is 0
// (the server's default, or 0 in its configuration file); a value the
// server's configuration, the role, the database or the URL sets is kept,
// 0 from the role, the database or the URL included.
//
// It also sets tcp_user_timeout (PostgreSQL 12 and later), on the same
// terms: where it is 0 and no operator set it, to the keepalives' idle +
// count × interval, in milliseconds (UserTimeoutMillis with pgsession's
// keepalives). The keepalives cover an idle connection; tcp_user_timeout
// covers one on which the server sent data the dead client never
// acknowledged, which the operating system would otherwise retransmit for
// about 15 minutes. A server older than 12 has no such setting, and none
// is set.
//
// On a Unix-socket connection there is no TCP and nothing is set
// (PostgreSQL ignores the four settings there and shows them as 0).
// AfterConnect includes it.
func DetectDeadPeer(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, keepalivesSQL); err != nil {
		return fmt.Errorf("set TCP keepalives on the new session: %w", err)
	}
	return nil
}

// Transaction does for tx alone what AfterConnect does for a session's
// idle_in_transaction_session_timeout and synchronous_commit, on the same
// terms: the values last until tx ends (SET LOCAL). It is for a connection
// opened without the hook, whose transaction holds locks others wait for
// and whose commit must not be lost (a migration's: acknowledged, then lost
// in a server crash, it would leave services refusing the schema after the
// migrator said it was done): on a connection through a transaction-mode
// pooler, a session setting would stay with the server session for the
// pooler's next client. Call it first in tx.
func Transaction(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, setTimeout(true)+";\n"+durableCommits(true)); err != nil {
		return fmt.Errorf("set idle_in_transaction_session_timeout and synchronous_commit for the transaction: %w", err)
	}
	return nil
}

// operatorSources are the pg_settings.source values of a setting an
// operator made for these sessions: ALTER ROLE is user, ALTER DATABASE
// database, both database user, the URL (a startup parameter) client.
const operatorSources = `('user', 'database', 'database user', 'client')`

// setTimeout is the statement that sets AbandonedTransactionTimeout when
// the session has no timeout of its own: for the transaction only when
// local. No arguments: one simple-protocol round trip, nothing prepared.
func setTimeout(local bool) string {
	return `SELECT set_config(name, '` + AbandonedTransactionTimeout + `', ` + fmt.Sprint(local) + `) FROM pg_settings
		WHERE name = 'idle_in_transaction_session_timeout' AND setting = '0'
		AND source NOT IN ` + operatorSources
}

// durableCommitsSQL sets synchronous_commit to local for a session in
// which it is off, whoever set it, and keeps any other value.
var durableCommitsSQL = durableCommits(false)

// durableCommits is durableCommitsSQL, for the transaction only when
// local.
func durableCommits(local bool) string {
	return `SELECT set_config('synchronous_commit', 'local', ` + fmt.Sprint(local) + `)
	WHERE current_setting('synchronous_commit') = 'off'`
}

// keepalivesSQL sets each of the three keepalive settings the session has
// as 0 and no operator set, then tcp_user_timeout likewise, from the
// keepalive settings the first statement left. Their setting column shows
// the socket's value (the operating system's default where PostgreSQL's
// is 0, and 0 on a Unix socket); reset_val is the session's own value,
// unchanged since no statement SET it yet. inet_server_addr() is NULL on a
// Unix socket. tcp_user_timeout is an int of milliseconds: the sum is
// capped at its largest value (least ignores a NULL: a server without one
// of the keepalive settings gets none).
var keepalivesSQL = `SELECT set_config(name, CASE name
		WHEN 'tcp_keepalives_idle' THEN '` + strconv.Itoa(KeepalivesIdle) + `'
		WHEN 'tcp_keepalives_interval' THEN '` + strconv.Itoa(KeepalivesInterval) + `'
		ELSE '` + strconv.Itoa(KeepalivesCount) + `' END, false) FROM pg_settings
	WHERE name IN ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count')
	AND reset_val = '0' AND source NOT IN ` + operatorSources + `
	AND inet_server_addr() IS NOT NULL;
SELECT set_config('tcp_user_timeout', least(1000 * (k.idle_s + k.probes * k.interval_s), 2147483647)::text, false)
	FROM pg_settings, (SELECT
		sum(setting::bigint) FILTER (WHERE name = 'tcp_keepalives_idle') AS idle_s,
		sum(setting::bigint) FILTER (WHERE name = 'tcp_keepalives_interval') AS interval_s,
		sum(setting::bigint) FILTER (WHERE name = 'tcp_keepalives_count') AS probes
		FROM pg_settings) k
	WHERE name = 'tcp_user_timeout'
	AND reset_val = '0' AND source NOT IN ` + operatorSources + `
	AND inet_server_addr() IS NOT NULL AND k.idle_s + k.probes * k.interval_s IS NOT NULL`
