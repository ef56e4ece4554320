-- 0010_hand_out_claims: a route's last hand-out carries its caller's claim.
--
-- hand_out_claim is the claim (registry.RouteRequest.Claim: a random name
-- the dispatcher draws for each Resolve and Reroute) of hand-out
-- claim_hand_out, NULL when that hand-out named none. Every statement of
-- this build that hands a route out (the route's insert, its reservation
-- again, a Resolve returning it while held, a reroute) writes both, with
-- the hand-out number it writes, in the statement it already sends.
-- ReleaseUnsent releases a reservation only while claim_hand_out is the
-- route's last hand-out (hand_out), that hand-out made the reservation
-- (reserved_hand_out) and it carries the presented claim: a dispatcher
-- whose Resolve failed after it may have committed, and which therefore
-- never sent the action, gives the capacity back at once instead of
-- leaving it to reconciliation. Comparing the number too keeps the check
-- exact while builds of schema 8 or 9, which hand routes out without writing
-- these columns, still run beside this one during an upgrade: their
-- hand-outs raise hand_out past claim_hand_out.
--
-- Both columns are nullable without a default, so PostgreSQL adds them to
-- the catalog without rewriting the table (which keeps every assignment
-- ever made) and without a constraint to validate against every row;
-- routes made before carry no claim. The claim compares byte by byte, as
-- every text column does since 0006. The data role's table-level grants
-- cover the new columns.

ALTER TABLE aip_registry.route_assignments
    ADD COLUMN hand_out_claim text COLLATE "C",
    ADD COLUMN claim_hand_out bigint;
