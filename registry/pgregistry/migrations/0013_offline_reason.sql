-- 0013_offline_reason: a replica records why it last went offline, and when.
--
-- offline_reason is registry.OfflineReason: 'shutdown' (the replica's own
-- signed offline transition), 'unhealthy' (a heartbeat with
-- connector_ready false), 'lease_expired' (lease maintenance took it
-- offline: its host crashed, hung or lost the control plane) or
-- 'administrator' (an administrator's PutReplica wrote it offline);
-- offline_at_ms is when. Both are NULL while the replica is ready or
-- draining (a registration clears them), for a pre-provisioned replica
-- that never registered, and for replicas that went offline before this
-- migration. The fleet views (GET /aip/v1/fleet/replicas, aipfleet fleet
-- status) show them.
--
-- Both columns are nullable without a default, so PostgreSQL adds them
-- without rewriting the table (which keeps every replica ever
-- provisioned), and the constraints on them are added NOT VALID: every
-- existing row holds NULLs, which pass, so there is nothing to scan for.
-- The reason compares byte by byte, as every text column does since 0006.
-- The data and lifecycle roles' table-level grants cover the new columns.
--
-- Builds of schema 12 still running during the upgrade do not write the
-- columns: a replica such a build registers or renews would keep the
-- reason of its previous offline, and show it when that build takes it
-- offline again. The trigger clears the reason whenever a write leaves a
-- replica ready or draining with one (only such a build's writes do: this
-- build clears it in the same statement), so a replica an older build
-- takes offline shows no reason rather than a stale one. Its WHEN clause
-- is evaluated without calling the function, so this build's lifecycle
-- writes (the heartbeat path) do not run it.

ALTER TABLE aip_registry.connector_replicas
    ADD COLUMN offline_reason text COLLATE "C",
    ADD COLUMN offline_at_ms bigint,
    ADD CONSTRAINT connector_replicas_offline_reason
        CHECK (offline_reason IN ('shutdown', 'unhealthy', 'lease_expired', 'administrator')) NOT VALID,
    ADD CONSTRAINT connector_replicas_offline_pair
        CHECK ((offline_reason IS NULL) = (offline_at_ms IS NULL) AND (offline_reason IS NULL OR status = 'offline')) NOT VALID;

CREATE FUNCTION aip_registry.clear_offline_reason() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.offline_reason := NULL;
    NEW.offline_at_ms := NULL;
    RETURN NEW;
END
$$;

CREATE TRIGGER connector_replicas_live_clears_offline_reason
    BEFORE UPDATE ON aip_registry.connector_replicas
    FOR EACH ROW WHEN (NEW.status <> 'offline' AND NEW.offline_reason IS NOT NULL)
    EXECUTE FUNCTION aip_registry.clear_offline_reason();
