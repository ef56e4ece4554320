// Package pgsession sets up the PostgreSQL sessions of aipfleet's pools.
//
// Every pool (the registry's control and data pools, a host's journal
// pool) installs AfterConnect, which gives each new session two rules in
// one round trip:
//
//   - a transaction left idle for a minute is ended (AbandonedTransactionTimeout),
//     unless the role, the database or the URL says otherwise;
//   - a commit is never acknowledged before it is on the server's disk:
//     synchronous_commit off becomes local, whoever set it.
package pgsession

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AbandonedTransactionTimeout is the idle_in_transaction_session_timeout
// AfterConnect gives a session that has none, the value
// deploy/postgres/roles.sql sets on the registry's roles.
const AbandonedTransactionTimeout = "60s"

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
func AfterConnect(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, afterConnectSQL); err != nil {
		return fmt.Errorf("set up the new session (idle_in_transaction_session_timeout, synchronous_commit): %w", err)
	}
	return nil
}

// afterConnectSQL is AfterConnect's two statements, sent as one simple
// query.
var afterConnectSQL = setTimeout(false) + ";\n" + durableCommitsSQL

// EndAbandonedTransaction does for tx alone what AfterConnect does for
// idle_in_transaction_session_timeout, on the same terms: the value lasts
// until tx ends (SET LOCAL). It is for a connection opened without the
// hook, whose transaction holds locks others wait for (a migration's): on
// a connection through a transaction-mode pooler, a session setting would
// stay with the server session for the pooler's next client. Call it first
// in tx.
func EndAbandonedTransaction(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, setTimeout(true)); err != nil {
		return fmt.Errorf("set idle_in_transaction_session_timeout for the transaction: %w", err)
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
const durableCommitsSQL = `SELECT set_config('synchronous_commit', 'local', false)
	WHERE current_setting('synchronous_commit') = 'off'`
