-- deploy/postgres/roles.sql — least-privilege roles of the connector registry.
--
-- Run it as a superuser (or a role with CREATEROLE that owns the database)
-- connected to the registry database:
--
--   psql "$SUPERUSER_URL/aipfleet" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql   # 1. roles and schema
--   aipfleet registry migrate --database-url-file admin-url.txt                        # 2. tables (as aip_registry_admin)
--   psql "$SUPERUSER_URL/aipfleet" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql   # 3. table grants
--
-- It is idempotent: run it again after every migration, which may add tables
-- (grants are given only on tables that exist; the notice lists the ones
-- still missing). The roles are created with LOGIN and no password: set one
-- (ALTER ROLE ... PASSWORD) or use certificate or peer authentication.
--
--   aip_registry_admin      owns schema aip_registry: installs and migrates
--                           it, and performs catalog and admission writes
--                           (the control pool of pgregistry.Open).
--   aip_registry_data       the data plane (dispatch): catalog reads, route
--                           resolution and settlement, reservations, replica
--                           writes, lease expiry and fleet status, and the
--                           event log (appending verified event deliveries,
--                           reading a tenant's events and the IDs and
--                           digests of the events pruned, which are not
--                           stored again).
--                           It may not
--                           change catalog or admission records, change or
--                           delete a stored event, nor create, alter or drop
--                           anything.
--   aip_registry_lifecycle  the lifecycle service (aipfleet control-plane):
--                           reads the replicas it serves and the instances
--                           and versions registration checks, updates
--                           replicas and keeps the replay claims; its lease
--                           maintenance takes expired replicas offline and
--                           releases their reservations (updates routes and
--                           admission counters, never creates them); its
--                           fleet status counts types, versions, instances
--                           and replicas; its event retention deletes old
--                           events (it reads only their keys and receipt
--                           times; a trigger running as the admin role
--                           remembers their IDs in pruned_events), and
--                           its second horizon deletes those IDs from
--                           pruned_events (reading their keys and receipt
--                           times). It cannot route, reserve, read
--                           bindings, read an event's content or append
--                           events, or change the catalog.

DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['aip_registry_admin', 'aip_registry_data', 'aip_registry_lifecycle'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL; -- created concurrently by another run
            END;
        END IF;
    END LOOP;
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO aip_registry_admin, aip_registry_data, aip_registry_lifecycle', current_database());
END
$$;

-- A session of the data or lifecycle role is never idle inside a
-- transaction for long (each transaction is a few statements sent at
-- once). One that is was cut off mid-transaction — a dispatcher or control
-- plane that lost its network or froze — and its row locks (admission
-- counters, replicas) would block routing and lease expiry until TCP gives
-- up on it, which can take hours: PostgreSQL ends such a session after a
-- minute, rolling its transaction back.
ALTER ROLE aip_registry_data SET idle_in_transaction_session_timeout = '60s';
ALTER ROLE aip_registry_lifecycle SET idle_in_transaction_session_timeout = '60s';

-- The schema belongs to the admin role; the others may only look up names
-- in it.
CREATE SCHEMA IF NOT EXISTS aip_registry AUTHORIZATION aip_registry_admin;
ALTER SCHEMA aip_registry OWNER TO aip_registry_admin;
REVOKE ALL ON SCHEMA aip_registry FROM PUBLIC;
GRANT USAGE ON SCHEMA aip_registry TO aip_registry_data, aip_registry_lifecycle;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;

-- Table grants. Every table starts from nothing for the two restricted
-- roles, then gets exactly the privileges listed.
DO $$
DECLARE
    g record;
    missing text[] := '{}';
BEGIN
    FOR g IN
        SELECT * FROM (VALUES
            -- table                      data role privileges                lifecycle role privileges
            ('schema_migrations',         'SELECT',                           'SELECT'),
            ('catalog_revision',          'SELECT',                           'SELECT'),
            ('admission_policies',        'SELECT',                           ''),
            ('connector_types',           'SELECT',                           'SELECT'),
            ('connector_versions',        'SELECT',                           'SELECT'),
            ('capability_definitions',    'SELECT',                           ''),
            ('version_capabilities',      'SELECT',                           ''),
            ('version_profiles',          'SELECT',                           ''),
            ('connector_instances',       'SELECT',                           'SELECT'),
            ('capability_bindings',       'SELECT',                           ''),
            ('connector_replicas',        'SELECT, INSERT, UPDATE',           'SELECT, UPDATE'),
            ('route_assignments',         'SELECT, INSERT, UPDATE',           'SELECT, UPDATE'),
            ('route_history',             'SELECT, INSERT',                   ''),
            ('admission_counters',        'SELECT, INSERT, UPDATE',           'SELECT, UPDATE'),
            ('control_replay',            '',                                 'SELECT, INSERT, UPDATE, DELETE'),
            ('event_log_heads',           'SELECT, INSERT, UPDATE',           ''),
            ('events',                    'SELECT, INSERT',                   'SELECT (tenant_id, sequence, received_at_ms), DELETE'),
            ('pruned_events',             'SELECT',                           'SELECT (tenant_id, event_id, received_at_ms), DELETE')
        ) AS t (tbl, data_privs, lifecycle_privs)
    LOOP
        IF to_regclass(format('aip_registry.%I', g.tbl)) IS NULL THEN
            missing := missing || g.tbl;
            CONTINUE;
        END IF;
        EXECUTE format('REVOKE ALL ON aip_registry.%I FROM PUBLIC, aip_registry_data, aip_registry_lifecycle', g.tbl);
        IF g.data_privs <> '' THEN
            EXECUTE format('GRANT %s ON aip_registry.%I TO aip_registry_data', g.data_privs, g.tbl);
        END IF;
        IF g.lifecycle_privs <> '' THEN
            EXECUTE format('GRANT %s ON aip_registry.%I TO aip_registry_lifecycle', g.lifecycle_privs, g.tbl);
        END IF;
    END LOOP;
    -- Only the data plane reserves admission counters.
    IF to_regprocedure('aip_registry.scope_full(integer)') IS NOT NULL THEN
        REVOKE ALL ON FUNCTION aip_registry.scope_full(integer) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aip_registry.scope_full(integer) TO aip_registry_data;
    END IF;
    IF to_regprocedure('aip_registry.scopes_full(text)') IS NOT NULL THEN
        REVOKE ALL ON FUNCTION aip_registry.scopes_full(text) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aip_registry.scopes_full(text) TO aip_registry_data;
    END IF;
    -- Only the data plane takes replicas for new routes.
    IF to_regprocedure('aip_registry.replica_taken()') IS NOT NULL THEN
        REVOKE ALL ON FUNCTION aip_registry.replica_taken() FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aip_registry.replica_taken() TO aip_registry_data;
    END IF;
    -- Only the data plane digests delivered events, to compare them with
    -- the pruned ones (the trigger that digests the pruned events runs as
    -- the admin role, which owns these functions).
    IF to_regprocedure('aip_registry.event_replay_digest(text,text,jsonb)') IS NOT NULL THEN
        REVOKE ALL ON FUNCTION aip_registry.event_replay_digest(text, text, jsonb) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aip_registry.event_replay_digest(text, text, jsonb) TO aip_registry_data;
    END IF;
    IF to_regprocedure('aip_registry.event_json_normal(jsonb)') IS NOT NULL THEN
        REVOKE ALL ON FUNCTION aip_registry.event_json_normal(jsonb) FROM PUBLIC;
        GRANT EXECUTE ON FUNCTION aip_registry.event_json_normal(jsonb) TO aip_registry_data;
    END IF;
    IF cardinality(missing) > 0 THEN
        RAISE NOTICE 'aip_registry tables not installed yet: %; run the registry migration as aip_registry_admin, then this script again', missing;
    END IF;
END
$$;
