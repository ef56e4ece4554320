-- 0004_counter_stripes: striped admission counters.
--
-- Every route and settlement of a tenant updates the same counter rows
-- (global, tenant, connector type, instance, binding), and a row lock is
-- held until the transaction's commit has flushed the WAL: one counter row
-- per scope made a busy tenant's routing transactions take turns, one WAL
-- flush at a time. Each scope is now kept in eight stripes (rows keyed by
-- scope and stripe). A route reserves every scope of its reservation in one
-- stripe, recorded in route_assignments.counter_stripe, and its settlement
-- or lease expiry releases that stripe. Stripe s of a scope with limit L
-- admits at most L / 8 + (s < L % 8 ? 1 : 0), so the stripes of a scope
-- never admit more than L together. Concurrent routes use different
-- stripes, so their transactions no longer wait for each other's commit on
-- the counters and their WAL flushes can be shared.
--
-- Existing counters become stripe 0, and existing routes counter_stripe 0.
-- That keeps the limit only if no existing counter holds more than stripe
-- 0's share of its scope; otherwise the migration stops and names the
-- scope (let the reserved actions settle first).

DO $$
DECLARE
    over record;
BEGIN
    SELECT scope_kind, scope_key, active, reserve_limit INTO over
    FROM aip_registry.admission_counters
    WHERE active > reserve_limit / 8 + (reserve_limit % 8 > 0)::int
    ORDER BY scope_kind, scope_key LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'admission scope % % has % reservations in flight, more than the % its first counter stripe may hold (limit %): stop the dispatchers gracefully so in-flight actions settle (or let their replicas'' leases expire), then migrate again',
            over.scope_kind, over.scope_key, over.active, over.reserve_limit / 8 + (over.reserve_limit % 8 > 0)::int, over.reserve_limit;
    END IF;
END
$$;

ALTER TABLE aip_registry.admission_counters
    ADD COLUMN stripe smallint NOT NULL DEFAULT 0 CONSTRAINT admission_counters_stripe CHECK (stripe >= 0 AND stripe < 8);
ALTER TABLE aip_registry.admission_counters DROP CONSTRAINT admission_counters_pkey;
ALTER TABLE aip_registry.admission_counters ADD PRIMARY KEY (scope_kind, scope_key, stripe);

ALTER TABLE aip_registry.route_assignments
    ADD COLUMN counter_stripe smallint NOT NULL DEFAULT 0 CONSTRAINT route_assignments_counter_stripe CHECK (counter_stripe >= 0 AND counter_stripe < 8);
