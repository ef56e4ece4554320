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
