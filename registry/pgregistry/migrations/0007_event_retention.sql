-- 0007_event_retention: the event log's retention (registry.EventPruner).
--
-- The control plane's maintenance deletes the events received before the
-- retention, oldest first, across tenants: this index finds them without
-- reading the log. A tenant's event_log_heads row is kept, so its
-- sequences go on after the pruned events. deploy/postgres/roles.sql lets
-- the lifecycle role delete events and read only their keys and receipt
-- times (not their content); the data role still may not delete them.

CREATE INDEX events_by_received ON aip_registry.events (received_at_ms, tenant_id, sequence);
