-- The runtime journal of connector hosts. Several replicas may share one
-- database: every table is keyed first by journal_ns, the replica's
-- namespace (pgruntime.Config.Namespace), and no query crosses namespaces.
-- JSON documents are stored in json columns, which keep the exact text
-- received (jsonb would reorder keys and drop whitespace).

CREATE TABLE aip_runtime_actions (
	journal_ns      text        NOT NULL,
	action_id       text        NOT NULL,
	seq             bigint      GENERATED ALWAYS AS IDENTITY,
	capability_id   text        NOT NULL,
	tenant_id       text        NOT NULL,
	idempotency_key text        NOT NULL,
	input_digest    text        NOT NULL,
	fence_token     text        NOT NULL,
	message_id      text        NOT NULL,
	status          text        NOT NULL CHECK (status IN ('received', 'running', 'completed', 'failed', 'outcome_unknown', 'cancelled')),
	result          json,
	detail          text        NOT NULL,
	received_at     timestamptz NOT NULL,
	started_at      timestamptz,
	updated_at      timestamptz NOT NULL,
	completed_at    timestamptz,
	PRIMARY KEY (journal_ns, action_id)
);
CREATE INDEX aip_runtime_actions_by_status ON aip_runtime_actions (journal_ns, status, received_at, seq);

-- The receipt hash chain, one per namespace. The head row holds the last
-- receipt's seq and hash (and the hash before it); FinishAction advances it
-- in the statement that appends the receipt, so appends serialise on its
-- row lock and the sequence has no gaps.
CREATE TABLE aip_runtime_receipts (
	journal_ns    text        NOT NULL,
	seq           bigint      NOT NULL CHECK (seq > 0),
	id            text        NOT NULL,
	action_id     text        NOT NULL,
	status        text        NOT NULL,
	result_digest text        NOT NULL,
	prev_hash     text        NOT NULL,
	hash          text        NOT NULL,
	at            timestamptz NOT NULL,
	PRIMARY KEY (journal_ns, seq),
	UNIQUE (journal_ns, action_id)
);
CREATE TABLE aip_runtime_receipt_heads (
	journal_ns text   PRIMARY KEY,
	seq        bigint NOT NULL CHECK (seq >= 0),
	hash       text   NOT NULL,
	prev_hash  text   NOT NULL
);

-- The native message replay registry.
CREATE TABLE aip_runtime_messages (
	journal_ns text        NOT NULL,
	message_id text        NOT NULL,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (journal_ns, message_id)
);
CREATE INDEX aip_runtime_messages_by_expiry ON aip_runtime_messages (journal_ns, expires_at);

-- Provider-event batches waiting for central delivery.
CREATE TABLE aip_runtime_outbox (
	journal_ns   text        NOT NULL,
	id           text        NOT NULL,
	seq          bigint      GENERATED ALWAYS AS IDENTITY,
	channel_id   text        NOT NULL,
	events       json        NOT NULL,
	attempts     integer     NOT NULL CHECK (attempts >= 0),
	next_attempt timestamptz NOT NULL,
	lease_until  timestamptz,
	last_error   text        NOT NULL,
	created_at   timestamptz NOT NULL,
	PRIMARY KEY (journal_ns, id)
);
CREATE INDEX aip_runtime_outbox_by_due ON aip_runtime_outbox (journal_ns, next_attempt, seq);

-- Connector-owned compare-and-set values.
CREATE TABLE aip_runtime_state (
	journal_ns text        NOT NULL,
	namespace  text        NOT NULL,
	key        text        NOT NULL,
	value      json        NOT NULL,
	revision   bigint      NOT NULL CHECK (revision > 0),
	updated_at timestamptz NOT NULL,
	PRIMARY KEY (journal_ns, namespace, key)
);

-- Written by Probe to prove the database accepts writes.
CREATE TABLE aip_runtime_probe (
	journal_ns text        PRIMARY KEY,
	at         timestamptz NOT NULL
);
