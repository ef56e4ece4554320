// Package pgsession sets up the PostgreSQL sessions of aipfleet's pools.
package pgsession

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// AbandonedTransactionTimeout is the idle_in_transaction_session_timeout
// EndAbandonedTransactions gives a session that has none, the value
// deploy/postgres/roles.sql sets on the registry's roles.
const AbandonedTransactionTimeout = "60s"

// EndAbandonedTransactions is a pgxpool AfterConnect hook. aipfleet's
// transactions are a few statements sent back to back, so a session idle
// inside one for a minute belongs to a process cut off from the server in
// the middle of it (a partition, a frozen connection, a process gone
// without closing its socket). The server keeps such a session, and the
// row locks it holds, until its TCP notices the peer is gone, which by
// default takes hours. When the session has no
// idle_in_transaction_session_timeout (0, from the server's default or its
// configuration file), this sets AbandonedTransactionTimeout for it, so
// PostgreSQL ends it instead; a value the role, the database or the URL
// sets is kept, 0 included (an operator's way to turn it off).
func EndAbandonedTransactions(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, setTimeout(false)); err != nil {
		return fmt.Errorf("set idle_in_transaction_session_timeout on the new session: %w", err)
	}
	return nil
}

// EndAbandonedTransaction does for tx alone what EndAbandonedTransactions
// does for a session, on the same terms: the value lasts until tx ends
// (SET LOCAL). It is for a connection opened without the hook, whose
// transaction holds locks others wait for (a migration's): on a
// connection through a transaction-mode pooler, a session setting would
// stay with the server session for the pooler's next client. Call it first
// in tx.
func EndAbandonedTransaction(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, setTimeout(true)); err != nil {
		return fmt.Errorf("set idle_in_transaction_session_timeout for the transaction: %w", err)
	}
	return nil
}

// setTimeout is the statement that sets AbandonedTransactionTimeout when
// the session has no timeout of its own: for the transaction only when
// local. No arguments: one simple-protocol round trip, nothing prepared.
// pg_settings.source says who set the value: ALTER ROLE is user, ALTER
// DATABASE database, both database user, the URL (a startup parameter)
// client.
func setTimeout(local bool) string {
	return `SELECT set_config(name, '` + AbandonedTransactionTimeout + `', ` + fmt.Sprint(local) + `) FROM pg_settings
		WHERE name = 'idle_in_transaction_session_timeout' AND setting = '0'
		AND source NOT IN ('user', 'database', 'database user', 'client')`
}
