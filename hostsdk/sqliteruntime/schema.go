package sqliteruntime

import (
	"context"
	"database/sql"
	"fmt"
)

// SchemaVersion is the schema version this build installs and reads. It is
// kept in the database header (PRAGMA user_version); a database with a newer
// version is refused rather than misread.
const SchemaVersion = 2

// applicationID marks the file as an aipfleet runtime journal (PRAGMA
// application_id, "AIPJ").
const applicationID = 0x4149504A

// schemaV1 is the whole schema of version 1. Times are INTEGER unix
// microseconds (NULL when unset); JSON documents are stored as the exact
// bytes received.
const schemaV1 = `
CREATE TABLE actions (
	seq             INTEGER PRIMARY KEY,
	action_id       TEXT    NOT NULL UNIQUE,
	capability_id   TEXT    NOT NULL,
	tenant_id       TEXT    NOT NULL,
	idempotency_key TEXT    NOT NULL,
	input_digest    TEXT    NOT NULL,
	fence_token     TEXT    NOT NULL,
	message_id      TEXT    NOT NULL,
	status          TEXT    NOT NULL,
	result          BLOB,
	detail          TEXT    NOT NULL,
	received_at     INTEGER NOT NULL,
	started_at      INTEGER,
	updated_at      INTEGER NOT NULL,
	completed_at    INTEGER
);
CREATE INDEX actions_by_status ON actions (status, received_at, seq);

CREATE TABLE receipts (
	seq           INTEGER PRIMARY KEY,
	id            TEXT    NOT NULL UNIQUE,
	action_id     TEXT    NOT NULL UNIQUE,
	status        TEXT    NOT NULL,
	result_digest TEXT    NOT NULL,
	prev_hash     TEXT    NOT NULL,
	hash          TEXT    NOT NULL,
	at            INTEGER NOT NULL
);

CREATE TABLE messages (
	message_id TEXT    PRIMARY KEY,
	expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX messages_by_expiry ON messages (expires_at);

CREATE TABLE outbox (
	seq          INTEGER PRIMARY KEY,
	id           TEXT    NOT NULL UNIQUE,
	channel_id   TEXT    NOT NULL,
	events       BLOB    NOT NULL,
	attempts     INTEGER NOT NULL,
	next_attempt INTEGER NOT NULL,
	lease_until  INTEGER,
	last_error   TEXT    NOT NULL,
	created_at   INTEGER NOT NULL
);
CREATE INDEX outbox_by_due ON outbox (next_attempt, seq);

CREATE TABLE state (
	namespace  TEXT    NOT NULL,
	key        TEXT    NOT NULL,
	value      BLOB    NOT NULL,
	revision   INTEGER NOT NULL CHECK (revision > 0),
	updated_at INTEGER NOT NULL,
	PRIMARY KEY (namespace, key)
) WITHOUT ROWID;

CREATE TABLE probe (
	id INTEGER PRIMARY KEY CHECK (id = 1),
	at INTEGER NOT NULL
);
`

// schemaV2 adds what pruning old actions needs: an index of terminal
// actions by completion and the prune horizon (journal.Journal.PruneHorizon).
const schemaV2 = `
CREATE INDEX actions_by_completion ON actions (completed_at, seq) WHERE completed_at IS NOT NULL;

CREATE TABLE prune_horizon (
	id           INTEGER PRIMARY KEY CHECK (id = 1),
	completed_at INTEGER NOT NULL
);
`

// upgrades[v] takes a database from schema version v to v+1.
var upgrades = []string{schemaV1, schemaV2}

// installSchema checks the file's identity and schema version, and
// upgrades an older one in one transaction. With fresh (a file
// createDatabase has just made) it installs the schema into the empty
// database; otherwise an empty database is refused with ErrCorrupt: the
// journal file was emptied or truncated.
func installSchema(ctx context.Context, conn *sql.Conn, path string, fresh bool) error {
	var appID, version int64
	if err := conn.QueryRowContext(ctx, "PRAGMA application_id").Scan(&appID); err != nil {
		return fmt.Errorf("sqliteruntime: read header of %s: %w", path, err)
	}
	if err := conn.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("sqliteruntime: read schema version of %s: %w", path, err)
	}
	if appID != 0 && appID != applicationID {
		return fmt.Errorf("sqliteruntime: %s is an SQLite database of another application (application_id %#x); give the host its own state directory", path, appID)
	}
	if version > SchemaVersion {
		return fmt.Errorf("%w: %s has schema version %d but this build supports up to %d; run a newer aipfleet build on this state directory", ErrSchemaTooNew, path, version, SchemaVersion)
	}
	if version > 0 && appID != applicationID {
		return fmt.Errorf("sqliteruntime: %s is not an aipfleet runtime journal (application_id %#x); give the host its own state directory", path, appID)
	}
	if version == SchemaVersion {
		return nil
	}
	if version == 0 {
		// The file must be empty.
		var tables int
		if err := conn.QueryRowContext(ctx, "SELECT count(*) FROM sqlite_schema").Scan(&tables); err != nil {
			return fmt.Errorf("sqliteruntime: inspect %s: %w", path, err)
		}
		if tables != 0 {
			return fmt.Errorf("sqliteruntime: %s already holds %d schema objects but no aipfleet schema version; it is not a runtime journal: give the host its own state directory", path, tables)
		}
		if !fresh {
			return corruptError(path, "the file holds no journal (it is empty: it was emptied or truncated after the host created it), so the record of the actions this replica ran is gone")
		}
	}
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("sqliteruntime: install schema in %s: %w", path, err)
	}
	var install string
	for _, u := range upgrades[version:] {
		install += u
	}
	install += fmt.Sprintf("PRAGMA application_id = %d;\nPRAGMA user_version = %d;\n", applicationID, SchemaVersion)
	if _, err := conn.ExecContext(ctx, install); err != nil {
		_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		return fmt.Errorf("sqliteruntime: install schema version %d in %s (it has %d): %w", SchemaVersion, path, version, err)
	}
	if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
		_, _ = conn.ExecContext(context.Background(), "ROLLBACK")
		return fmt.Errorf("sqliteruntime: install schema in %s: %w", path, err)
	}
	return nil
}
