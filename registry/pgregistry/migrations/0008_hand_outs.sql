-- 0008_hand_outs: every hand-out of a route has a number (registry.RouteAssignment.HandOut).
--
-- hand_out is the number of the route's last hand-out: 1 when the route is
-- made, and one more for every Resolve that hands it out again (returns it
-- while it is held, or reserves it again after a settlement) and for a
-- reroute's new assignment. reserved_hand_out is the hand-out that made the
-- current reservation: a settlement presenting an earlier hand-out (a
-- dispatcher whose reservation lease expiry released while it was still
-- sending, settling after a retry reserved the route again) releases
-- nothing; an orphan settlement releases only when hand_out is still the
-- one its caller read.
--
-- Routes made before this migration count as handed out once (the
-- defaults). Assignments handed out by an older build carry no hand-out
-- (zero) and settle whatever the route holds, as they did. The constant
-- defaults make the new columns a catalog change, not a rewrite of the
-- table (which keeps every assignment ever made); for the same reason there
-- is no CHECK constraint to validate against every row. The data role's
-- table-level grants cover the new columns.

ALTER TABLE aip_registry.route_assignments
    ADD COLUMN hand_out bigint NOT NULL DEFAULT 1,
    ADD COLUMN reserved_hand_out bigint NOT NULL DEFAULT 1;
