// Package pgruntime is the PostgreSQL runtime journal of a connector host: a
// journal.Journal on pgx v5 for replicas whose state must outlive their
// machine.
//
//	j, err := pgruntime.Open(ctx, pgruntime.Config{DatabaseURL: url, Namespace: replicaID})
//	...
//	defer j.Close()
//
// # Schema and migrations
//
// The schema is a set of numbered SQL files embedded in the binary
// (migrations/0001_runtime.sql, ...). Open applies the missing ones in one
// transaction under a PostgreSQL advisory lock, so replicas starting
// together migrate once, and records each with the SHA-256 of its file in
// aip_runtime_schema_migrations. An applied migration whose file changed
// stops start-up with ErrMigrationChanged naming the file; a database with
// migrations this build does not know stops it with ErrSchemaTooNew.
//
// # Namespaces
//
// Several replicas may share one database. Every table is keyed first by
// the journal's namespace (Config.Namespace, the replica ID) and no
// statement crosses it: journals with different namespaces never see each
// other's actions, receipts, messages, outbox batches or state, and each
// namespace has its own receipt chain.
//
// A namespace is one journal's at a time. Open takes a session-level
// advisory lock on it (a key derived from the namespace), held by a
// connection of its own outside the pool for as long as the journal is
// open; a second Open of the namespace, from this process or another,
// fails with a *LockedError (ErrLocked) naming the holding session. Without
// it, two hosts given the same replica ID would both run recovery on the
// namespace and settle each other's running actions. PostgreSQL ends the
// lock with its session, so a host that dies, even by SIGKILL, leaves no
// stale lock. When the host's machine dies or is cut off (power off, a
// partition), nothing closes the connection: the server keeps the session,
// and the lock, until its TCP keepalive finds the peer gone, which
// PostgreSQL's default leaves to the operating system (a first probe after
// 2 hours on Linux; pgx's own keepalives only tell the host about a dead
// server), or, with data sent to the host unacknowledged, to the system's
// retransmissions (about 15 minutes). So the lock session sets
// tcp_keepalives_idle 60, tcp_keepalives_interval 10, tcp_keepalives_count
// 6 and tcp_user_timeout 120000 ms (pgsession.DetectDeadPeer), and the
// server ends it about 2 minutes after the host's last word; each is set
// only where it is 0, so a value of the role, the database, the URL or the
// server's configuration is kept (0 from the role, the database or the URL
// included), and on a Unix socket, which has no TCP, nothing is set. A replacement host is refused until
// then. The lock needs a real session: a pooler in transaction mode
// between the host and the database cannot hold it. Probe (every
// heartbeat) checks that the session still holds the lock; after a
// dropped connection it takes the lock again, and if another journal took
// it meanwhile, Probe and every later call fail with a *LockedError whose
// Lost is set (the host goes not ready): writes between the loss and that
// Probe are the only ones two journals can make to one namespace. Each
// journal therefore uses one connection more than Config.MaxConns.
//
// # Concurrency and durability
//
// Every method is one SQL statement, so one round trip and one implicit
// transaction, except PruneActions (two statements in one transaction: the
// receipt pruning must see the deleted actions) and BeginAction and
// AcceptAction of an action journaled already (see below). BeginAction and
// AcceptAction call the function aip_runtime_create_action (migration
// 0002), which claims the message, inserts the action and only then reads
// the prune horizon with a statement of its own: an insert that waited for
// a concurrent prune deleting the same action ID sees that prune's horizon
// and fails (SQLSTATE AJ001, journal.ErrPruned), rolling the claim back.
// An action found journaled already is read by a statement of its own;
// when a prune deleted it in between, the call is journal.ErrPruned too,
// and the claim its first statement committed is taken back (a third
// statement), so nothing is written, as when the prune came first.
// FinishAction too is one statement: a statement with data-modifying common
// table expressions moves the action to its terminal status, advances the
// namespace's receipt head and inserts the receipt. The head row's lock
// serialises appends, so the sequence has no gaps, and it is held only
// inside the server, never across a round trip to the client; the new hash
// is computed by the database (sha256) over the canonical receipt whose
// parts Go canonicalised, and checked again in Go. Message claims, state
// compare-and-set and outbox leases rely on row locks and ON CONFLICT, so
// concurrent callers, in one process or in several, get exactly one winner;
// outbox publishers skip each other's rows (FOR UPDATE SKIP LOCKED). A
// write is as durable as the server makes a commit, except that the
// journal's sessions never commit asynchronously: where synchronous_commit
// is off (from the server, the role, the database or the URL) a session
// sets it to local (pgsession.AfterConnect, the hook of every aipfleet
// pool, the registry's too), since a server crash loses an asynchronous
// commit that was already acknowledged, and an AcceptAction lost so lets
// its action run twice. fsync (which must stay on) and replication
// (synchronous_commit on, remote_write or remote_apply, kept as set)
// remain the operator's choice. The pool's sessions also get the lock
// session's TCP keepalives (see Namespaces), which free a dead host's
// connection slots within minutes; locks a session holds inside a
// transaction are ended sooner, by its idle_in_transaction_session_timeout.
//
// The pool defaults to 10 connections; size Config.MaxConns to the
// host's concurrency (max_in_flight plus a few for the background loops).
package pgruntime
