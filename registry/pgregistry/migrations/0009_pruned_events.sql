-- 0009_pruned_events: an event the log pruned is never stored again, and a
-- route its replica's journal pruned settles "pruned".
--
-- pruned_events keeps one compact row (tenant, event ID, when the event was
-- received) for every event deleted from the log. A host's outbox sends an
-- event again for as long as it holds it (it was offline, or the answer to
-- its delivery was lost), however long that is; AppendEvents finds the ID
-- here and answers the delivery as delivered without storing the event a
-- second time. The rows are kept until the control plane's maintenance
-- forgets them, a second horizon after the events' receipt
-- (registry.EventPruner.ForgetPrunedEvents), the latest receipt when an
-- ID was pruned twice (stored again by an AppendEvents that read before
-- the first prune committed); pruned_events_by_received
-- finds the oldest without reading the table.
--
-- The rows are written by a statement-level trigger on events, so every
-- delete leaves them, the control plane's retention included, and the
-- lifecycle role that prunes needs no privilege beyond deleting events:
-- the trigger function runs as its owner (the admin role). The data role
-- reads the table, the lifecycle role deletes the rows past the second
-- horizon (deploy/postgres/roles.sql).
--
-- route_assignments.last_settlement accepts 'pruned'
-- (registry.SettlementPruned). The constraint is added NOT VALID: every
-- stored value is one of the old ones, which the new list includes, so
-- there is nothing to check in a table that keeps every assignment ever
-- made; new writes are checked.

CREATE TABLE aip_registry.pruned_events (
    tenant_id      text   COLLATE "C" NOT NULL,
    event_id       text   COLLATE "C" NOT NULL,
    received_at_ms bigint NOT NULL,
    PRIMARY KEY (tenant_id, event_id)
);

CREATE INDEX pruned_events_by_received ON aip_registry.pruned_events (received_at_ms);

CREATE FUNCTION aip_registry.remember_pruned_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO aip_registry.pruned_events (tenant_id, event_id, received_at_ms)
    SELECT tenant_id, event_id, received_at_ms FROM gone
    ON CONFLICT (tenant_id, event_id) DO UPDATE
        SET received_at_ms = GREATEST(aip_registry.pruned_events.received_at_ms, excluded.received_at_ms);
    RETURN NULL;
END
$$;

REVOKE ALL ON FUNCTION aip_registry.remember_pruned_events() FROM PUBLIC;

CREATE TRIGGER events_remember_pruned
    AFTER DELETE ON aip_registry.events
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION aip_registry.remember_pruned_events();

ALTER TABLE aip_registry.route_assignments
    DROP CONSTRAINT route_assignments_last_settlement_check,
    ADD CONSTRAINT route_assignments_last_settlement_check
        CHECK (last_settlement IN ('completed', 'outcome_unknown', 'cancelled', 'lease_expired', 'pruned')) NOT VALID;
