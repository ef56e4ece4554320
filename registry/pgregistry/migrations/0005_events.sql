-- 0005_events: the fleet's event log (registry.EventLog).
--
-- event_log_heads holds one row per tenant with the last sequence given
-- out. An append locks its tenant's row for the rest of its transaction
-- (an INSERT ... ON CONFLICT DO UPDATE that creates it on the tenant's
-- first event), numbers its new events after last_sequence and advances
-- it, so the appends of one tenant commit one at a time in sequence order:
-- once an event is visible, every event with a lower sequence is too, and
-- a reader paging by sequence never skips one that commits later.
-- Tenants never wait for each other.
--
-- events holds each tenant's events by sequence (the read path) and is
-- unique by (tenant, event ID), which makes a redelivery that races with
-- the first delivery fail and be retried as a redelivery.

CREATE TABLE aip_registry.event_log_heads (
    tenant_id     text   PRIMARY KEY,
    last_sequence bigint NOT NULL CONSTRAINT event_log_heads_last_sequence CHECK (last_sequence >= 0)
);

CREATE TABLE aip_registry.events (
    tenant_id      text   NOT NULL,
    sequence       bigint NOT NULL CONSTRAINT events_sequence CHECK (sequence > 0),
    event_id       text   NOT NULL,
    instance_id    text   NOT NULL,
    replica_id     text   NOT NULL,
    version_id     text   NOT NULL,
    channel_id     text   NOT NULL,
    -- The aip.Event as stored: id, kind, occurred_at (milliseconds),
    -- session, action and correlation IDs, actor, data (an object).
    event          jsonb  NOT NULL,
    received_at_ms bigint NOT NULL,
    PRIMARY KEY (tenant_id, sequence),
    CONSTRAINT events_tenant_event UNIQUE (tenant_id, event_id)
);
