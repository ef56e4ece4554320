-- 0011_scope_stripes: each admission scope of a route has its own counter
-- stripe.
--
-- Migration 0004 reserved every scope of a route in one stripe
-- (route_assignments.counter_stripe). With scopes of different limits the
-- stripes' shares do not line up (a tenant limit of 6 has a share in
-- stripes 0 to 5, a binding limit of 5 in stripes 0 to 4), so a route
-- could be refused that every scope had room for. A route now reserves
-- each scope in a stripe of its own choosing, and its settlement, reroute,
-- lease expiry or stranded release releases each scope in that stripe.
--
-- How a route records its stripes:
--   counter_stripe 0..7: every scope is in that stripe, scope_stripes is
--     not read (all routes made before this migration, and most routes
--     after it: a route's scopes share a stripe unless a stripe was full);
--   counter_stripe -1: a reserved route whose scopes are in different
--     stripes, scope_stripes[i] being the stripe of the i-th scope of its
--     reservation (its base scopes, then the retry scope of a retry);
--   counter_stripe -2: such a route, released.
-- The new column is nullable with no default and the constraints are added
-- NOT VALID, so nothing rewrites or scans route_assignments (which keeps
-- every assignment ever made); every stored row has counter_stripe 0..7,
-- which the new constraint allows. New writes are checked.
--
-- Builds of schema version 10 and older still running while the schema is
-- upgraded know only counter_stripe. They handle the routes whose scopes
-- share a stripe as before. A route with counter_stripe -1 they cannot
-- release correctly, so they cannot release it at all:
-- route_assignments_released_stripes refuses a released row with -1 (this
-- build's releases write -2), and their settlement's counter upsert would
-- write stripe -1, which admission_counters_stripe refuses. The statement
-- fails and nothing changes; this build settles or expires the route.
-- Their reroute of a -1 route would release its counters in stripe -1
-- (none: the reservation leaks) and write the new route's stripe to
-- counter_stripe, leaving scope_stripes as it was, so
-- route_assignments_reroute_stripes refuses a route with a stripe of its
-- own (0..7) that keeps scope_stripes unless it is a retry (this build
-- writes scope_stripes NULL with such a route; their retry of a released
-- -2 route, which reserves every scope in its new stripe, leaves
-- scope_stripes unread, and a retried route is never rerouted).
--
-- scopes_full aborts a reservation with SQLSTATE AIP01, as scope_full does,
-- naming in its detail every scope of the reservation that could not be
-- reserved (its index in the reservation, with '*' when the scope's
-- stripes together hold its limit: the scope is full, not only its
-- stripe), so the registry moves each of those scopes to another stripe at
-- once.

ALTER TABLE aip_registry.route_assignments
    ADD COLUMN scope_stripes smallint[],
    DROP CONSTRAINT route_assignments_counter_stripe,
    ADD CONSTRAINT route_assignments_counter_stripe CHECK (
        (counter_stripe >= 0 AND counter_stripe < 8)
        OR (counter_stripe IN (-1, -2) AND scope_stripes IS NOT NULL
            AND 0 <= ALL (scope_stripes) AND 8 > ALL (scope_stripes))) NOT VALID,
    ADD CONSTRAINT route_assignments_released_stripes CHECK (reserved OR counter_stripe <> -1) NOT VALID,
    ADD CONSTRAINT route_assignments_reroute_stripes CHECK (counter_stripe < 0 OR scope_stripes IS NULL OR retry) NOT VALID;

CREATE FUNCTION aip_registry.scopes_full(scopes text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'admission scopes % of the reservation could not be reserved in their stripes', scopes
        USING ERRCODE = 'AIP01', DETAIL = scopes;
END
$$;
