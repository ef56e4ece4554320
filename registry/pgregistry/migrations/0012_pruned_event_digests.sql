-- 0012_pruned_event_digests: a different event under a pruned ID is a
-- conflict.
--
-- Migration 0009 keeps the ID of every pruned event, so an event a host
-- delivers again after the retention deleted it is answered as stored and
-- not stored a second time. It kept nothing of the event's content, so a
-- different event delivered under a pruned ID was answered as stored too,
-- and lost. pruned_events.digest keeps a SHA-256 digest of the pruned
-- event's replay-equivalent content (event_replay_digest, below), and
-- AppendEvents refuses a delivery under a pruned ID whose digest differs
-- with registry.ErrConflict (the ingress's
-- connector_event.idempotency_conflict), as it does while the event is
-- stored.
--
-- The column is nullable without a default: PostgreSQL adds it without
-- rewriting the table, and the IDs pruned before this migration keep no
-- digest; an event delivered under one of those is answered as stored,
-- as before. The trigger of 0009 is replaced to fill it: every prune from
-- now on, by any build, writes it (an ID pruned a second time keeps the
-- digest of the copy pruned last). Builds of schema 11 and older still
-- running do not read it: a dispatcher of theirs answers a different event
-- under a pruned ID as stored until it is upgraded.
--
-- event_replay_digest(channel_id, instance_id, event) is the digest of
-- what makes two deliveries of an event the same event
-- (registry.CheckRedelivery): channel, instance, kind, occurred_at,
-- session, action, correlation and data, where data's aip_connector
-- member is taken without replica_id, version_id and lease_sequence (a
-- redelivery may come from another replica, version or lease of the
-- instance) and numbers are compared by value (event_json_normal: 100,
-- 1e2 and 100.0 are one number), and occurred_at by its millisecond
-- (older builds wrote "…:05.690Z" where this one writes "…:05.69Z").
-- AppendEvents computes the digest of a delivered event with the same
-- function, so both sides of the comparison are computed alike. The
-- event's actor is not part of it: the ingress refuses events that carry
-- one (a host moves the provider's actor to data.upstream_actor).
-- Neither function can fail on a stored event, so pruning never stops on
-- one. roles.sql lets only the data role call them (the trigger runs as
-- the admin role, which owns them).

ALTER TABLE aip_registry.pruned_events ADD COLUMN digest bytea;

CREATE FUNCTION aip_registry.event_json_normal(doc jsonb) RETURNS jsonb
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
BEGIN
    CASE jsonb_typeof(doc)
    WHEN 'number' THEN
        RETURN to_jsonb(trim_scale(doc::numeric));
    WHEN 'object' THEN
        RETURN (SELECT coalesce(jsonb_object_agg(m.key, aip_registry.event_json_normal(m.value)), '{}'::jsonb)
            FROM jsonb_each(doc) AS m);
    WHEN 'array' THEN
        RETURN (SELECT coalesce(jsonb_agg(aip_registry.event_json_normal(a.value) ORDER BY a.ord), '[]'::jsonb)
            FROM jsonb_array_elements(doc) WITH ORDINALITY AS a (value, ord));
    ELSE
        RETURN doc;
    END CASE;
END
$$;

-- jsonb writes every number in one form but for trailing zeros in its
-- fraction (100.0, 1.50): only a document with such a number is walked.
CREATE FUNCTION aip_registry.event_replay_digest(channel_id text, instance_id text, event jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT sha256(convert_to(jsonb_build_array(
    channel_id,
    instance_id,
    coalesce(event->>'kind', ''),
    CASE WHEN occurred ~ '[.][0-9]+Z$' THEN regexp_replace(regexp_replace(occurred, '0+Z$', 'Z'), '[.]Z$', 'Z') ELSE occurred END,
    coalesce(event->>'session_id', ''),
    coalesce(event->>'action_id', ''),
    coalesce(event->>'correlation_id', ''),
    CASE WHEN data::text ~ '[.][0-9]*0([^0-9]|$)' THEN aip_registry.event_json_normal(data) ELSE data END
)::text, 'UTF8'))
FROM (SELECT
    coalesce(event->>'occurred_at', '') AS occurred,
    CASE WHEN jsonb_typeof(event->'data'->'aip_connector') = 'object'
        THEN jsonb_set(event->'data', '{aip_connector}', (event->'data'->'aip_connector') - '{replica_id,version_id,lease_sequence}'::text[])
        ELSE coalesce(event->'data', '{}'::jsonb)
    END AS data) AS e
$$;

CREATE OR REPLACE FUNCTION aip_registry.remember_pruned_events() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO aip_registry.pruned_events (tenant_id, event_id, received_at_ms, digest)
    SELECT tenant_id, event_id, received_at_ms, aip_registry.event_replay_digest(channel_id, instance_id, event) FROM gone
    ON CONFLICT (tenant_id, event_id) DO UPDATE
        SET received_at_ms = GREATEST(aip_registry.pruned_events.received_at_ms, excluded.received_at_ms),
            digest = excluded.digest;
    RETURN NULL;
END
$$;
