-- 0002_reroute: the provably-not-started reroute (registry.Rerouter).
--
-- resolved_again records that a Resolve returned the action's current
-- assignment after the one that made it: another envelope may then exist
-- under its fence, so it can no longer be rerouted. route_history keeps the
-- assignments an action was moved off, oldest first; each is immutable
-- evidence, stored whole beside the columns an operator looks it up by.

ALTER TABLE aip_registry.route_assignments ADD COLUMN resolved_again boolean NOT NULL DEFAULT false;

CREATE TABLE aip_registry.route_history (
    action_id        text    NOT NULL,
    seq              integer NOT NULL CHECK (seq > 0),
    replica_id       text    NOT NULL,
    fence_token      text    NOT NULL,
    assignment       jsonb   NOT NULL,
    superseded_at_ms bigint  NOT NULL,
    PRIMARY KEY (action_id, seq)
);

-- Live reservations by replica, for lease expiry and the ledger. Keyed by
-- the replica alone, so the planner never scans it for an action ID (those
-- lookups use the primary key).
DROP INDEX aip_registry.route_assignments_reserved_replica;
CREATE INDEX route_assignments_reserved ON aip_registry.route_assignments (replica_id) WHERE reserved;
