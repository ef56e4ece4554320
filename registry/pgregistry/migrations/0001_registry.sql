-- 0001_registry: the normalized connector registry.
--
-- One table per record kind, with a column (and an index where a query
-- selects on it) for every selection and visibility predicate. Documents
-- that are immutable evidence (a version's manifest, attestation and
-- implementation claims, a capability's definition, a route's admission
-- snapshot) are stored as jsonb beside the indexed columns. No provider
-- credential value is stored anywhere: instances and bindings carry only
-- opaque secret-provider and credential-revision references.
--
-- Times are milliseconds since the Unix epoch (bigint), always passed in by
-- the registry's injected clock, never taken from now(). Unsigned 32-bit
-- counts and limits are bigint.

-- The migration runner creates schema aip_registry before this file runs.

-- The catalog publication: one row whose revision advances by one with every
-- effective catalog write, in the same transaction, under the exclusive form
-- of the publication advisory lock.
CREATE TABLE aip_registry.catalog_revision (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    revision        bigint  NOT NULL CHECK (revision >= 0),
    published_at_ms bigint  NOT NULL
);
INSERT INTO aip_registry.catalog_revision (singleton, revision, published_at_ms) VALUES (true, 0, 0);

CREATE TABLE aip_registry.admission_policies (
    policy_ref                   text    PRIMARY KEY,
    revision                     bigint  NOT NULL CHECK (revision > 0),
    enabled                      boolean NOT NULL,
    max_global_in_flight         bigint  NOT NULL CHECK (max_global_in_flight > 0),
    max_tenant_in_flight         bigint  NOT NULL CHECK (max_tenant_in_flight > 0),
    max_connector_type_in_flight bigint  NOT NULL CHECK (max_connector_type_in_flight > 0),
    max_instance_in_flight       bigint  NOT NULL CHECK (max_instance_in_flight > 0),
    max_binding_in_flight        bigint  NOT NULL CHECK (max_binding_in_flight > 0),
    max_tenant_retry_in_flight   bigint  NOT NULL CHECK (max_tenant_retry_in_flight > 0),
    circuit_failure_threshold    bigint  NOT NULL CHECK (circuit_failure_threshold > 0),
    circuit_open_ms              bigint  NOT NULL CHECK (circuit_open_ms BETWEEN 100 AND 3600000),
    updated_at_ms                bigint  NOT NULL
);

CREATE TABLE aip_registry.connector_types (
    type_id       text    PRIMARY KEY,
    name          text    NOT NULL,
    owner         text    NOT NULL,
    enabled       boolean NOT NULL,
    updated_at_ms bigint  NOT NULL
);

CREATE TABLE aip_registry.connector_versions (
    version_id             text   PRIMARY KEY,
    type_id                text   NOT NULL REFERENCES aip_registry.connector_types (type_id),
    version                text   NOT NULL,
    status                 text   NOT NULL CHECK (status IN ('candidate', 'admitted', 'active', 'revoked')),
    manifest               jsonb  NOT NULL,
    manifest_digest        text   NOT NULL,
    artifact_digest        text   NOT NULL,
    attestation            jsonb  NOT NULL,
    implementation_support jsonb  NOT NULL,
    admitted_at_ms         bigint NOT NULL,
    updated_at_ms          bigint NOT NULL,
    CONSTRAINT connector_versions_release UNIQUE (type_id, version),
    CONSTRAINT connector_versions_artifact UNIQUE (artifact_digest)
);
CREATE INDEX connector_versions_type_status ON aip_registry.connector_versions (type_id, status, version_id);

-- One definition per capability ID, fleet-wide: the first admitted contract
-- wins and a different contract under the same ID is refused. search_text is
-- the lower-cased "id name description" the catalog's text filter matches;
-- size_bytes is the canonical JSON size the page byte budget counts.
CREATE TABLE aip_registry.capability_definitions (
    capability_id   text    PRIMARY KEY,
    contract_digest text    NOT NULL,
    schema_digest   text    NOT NULL,
    capability      jsonb   NOT NULL,
    size_bytes      integer NOT NULL CHECK (size_bytes > 0),
    search_text     text    NOT NULL
);

CREATE TABLE aip_registry.version_capabilities (
    version_id    text NOT NULL REFERENCES aip_registry.connector_versions (version_id),
    capability_id text NOT NULL REFERENCES aip_registry.capability_definitions (capability_id),
    PRIMARY KEY (version_id, capability_id)
);
CREATE INDEX version_capabilities_capability ON aip_registry.version_capabilities (capability_id, version_id);

CREATE TABLE aip_registry.version_profiles (
    version_id text NOT NULL REFERENCES aip_registry.connector_versions (version_id),
    profile    text NOT NULL,
    PRIMARY KEY (version_id, profile)
);
CREATE INDEX version_profiles_profile ON aip_registry.version_profiles (profile, version_id);

CREATE TABLE aip_registry.connector_instances (
    instance_id         text   PRIMARY KEY,
    type_id             text   NOT NULL REFERENCES aip_registry.connector_types (type_id),
    version_id          text   NOT NULL REFERENCES aip_registry.connector_versions (version_id),
    tenant_id           text   NOT NULL,
    config_revision     bigint NOT NULL CHECK (config_revision >= 0),
    secret_provider_ref text   NOT NULL,
    status              text   NOT NULL CHECK (status IN ('enabled', 'disabled')),
    updated_at_ms       bigint NOT NULL
);
CREATE INDEX connector_instances_tenant ON aip_registry.connector_instances (tenant_id, status, instance_id);
CREATE INDEX connector_instances_version ON aip_registry.connector_instances (version_id, instance_id);
CREATE INDEX connector_instances_type ON aip_registry.connector_instances (type_id, instance_id);

-- The primary key (tenant, capability, instance) is the routing lookup; the
-- partial index serves tenant catalog reads and routing over enabled
-- bindings in (capability, priority, instance) order without the heap.
CREATE TABLE aip_registry.capability_bindings (
    tenant_id               text    NOT NULL,
    capability_id           text    NOT NULL REFERENCES aip_registry.capability_definitions (capability_id),
    instance_id             text    NOT NULL REFERENCES aip_registry.connector_instances (instance_id),
    priority                bigint  NOT NULL CHECK (priority >= 0),
    policy_revision         bigint  NOT NULL CHECK (policy_revision >= 0),
    credential_revision_ref text,
    quota_policy_ref        text    REFERENCES aip_registry.admission_policies (policy_ref),
    enabled                 boolean NOT NULL,
    scope_key               text    NOT NULL,
    updated_at_ms           bigint  NOT NULL,
    PRIMARY KEY (tenant_id, capability_id, instance_id)
);
CREATE INDEX capability_bindings_enabled ON aip_registry.capability_bindings (tenant_id, capability_id, priority, instance_id) WHERE enabled;
CREATE INDEX capability_bindings_instance ON aip_registry.capability_bindings (instance_id, capability_id);

-- Replicas: identity columns are fixed; status, lease, capacity and the
-- lifecycle request fields change with a newer health revision; active
-- assignments and the circuit are registry-owned. The columns a route or a
-- settlement updates on every call (active_assignments, the circuit) are in
-- no index, so those updates stay heap-only.
CREATE TABLE aip_registry.connector_replicas (
    replica_id                  text   PRIMARY KEY,
    instance_id                 text   NOT NULL REFERENCES aip_registry.connector_instances (instance_id),
    version_id                  text   NOT NULL REFERENCES aip_registry.connector_versions (version_id),
    endpoint                    text   NOT NULL,
    peer_principal_id           text   NOT NULL,
    peer_principal_kind         text   NOT NULL,
    peer_did                    text   NOT NULL,
    trust_domain                text   NOT NULL,
    transport_profile           text   NOT NULL,
    region                      text   NOT NULL,
    zone                        text   NOT NULL,
    capacity_class              text   NOT NULL,
    status                      text   NOT NULL CHECK (status IN ('ready', 'draining', 'offline')),
    lease_expires_at_ms         bigint NOT NULL,
    capacity                    bigint NOT NULL CHECK (capacity > 0),
    active_assignments          bigint NOT NULL DEFAULT 0 CHECK (active_assignments >= 0),
    health_revision             bigint NOT NULL CHECK (health_revision >= 0),
    last_control_request_id     text,
    last_control_request_digest text,
    consecutive_failures        bigint NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    circuit_open_until_ms       bigint NOT NULL DEFAULT 0,
    updated_at_ms               bigint NOT NULL,
    CONSTRAINT connector_replicas_active_within_capacity CHECK (active_assignments <= capacity),
    CONSTRAINT connector_replicas_request_pair CHECK ((last_control_request_id IS NULL) = (last_control_request_digest IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX connector_replicas_instance ON aip_registry.connector_replicas (instance_id, version_id, replica_id);
CREATE INDEX connector_replicas_live_lease ON aip_registry.connector_replicas (lease_expires_at_ms, replica_id) WHERE status <> 'offline';

-- Route assignments: the evidence columns never change after the insert;
-- reserved, retry and last_settlement are the reservation bookkeeping. The
-- evidence is copied from rows the routing transaction validated, so only
-- the replica (locked by that transaction anyway) is a foreign key: keys to
-- the instance and version would share-lock those rows on every route.
CREATE TABLE aip_registry.route_assignments (
    action_id               text    PRIMARY KEY,
    capability_id           text    NOT NULL,
    tenant_id               text    NOT NULL,
    instance_id             text    NOT NULL,
    version_id              text    NOT NULL,
    manifest_digest         text    NOT NULL,
    replica_id              text    NOT NULL REFERENCES aip_registry.connector_replicas (replica_id),
    endpoint                text    NOT NULL,
    peer_principal_id       text    NOT NULL,
    peer_principal_kind     text    NOT NULL,
    peer_did                text    NOT NULL,
    trust_domain            text    NOT NULL,
    transport_profile       text    NOT NULL,
    region                  text    NOT NULL,
    zone                    text    NOT NULL,
    capacity_class          text    NOT NULL,
    catalog_revision        bigint  NOT NULL,
    binding_policy_revision bigint  NOT NULL,
    credential_revision_ref text,
    quota_policy_ref        text,
    replica_health_revision bigint  NOT NULL,
    fence_token             text    NOT NULL,
    admission               jsonb   NOT NULL,
    assigned_at_ms          bigint  NOT NULL,
    reserved                boolean NOT NULL,
    retry                   boolean NOT NULL DEFAULT false,
    last_settlement         text    CHECK (last_settlement IN ('completed', 'outcome_unknown', 'cancelled', 'lease_expired')),
    updated_at_ms           bigint  NOT NULL,
    CONSTRAINT route_assignments_fence UNIQUE (fence_token)
) WITH (fillfactor = 80);
-- Live reservations by replica: lease expiry releases them, the ledger
-- lists them.
CREATE INDEX route_assignments_reserved_replica ON aip_registry.route_assignments (replica_id, action_id) WHERE reserved;

-- Admission counters: reserved with a guarded update (active < limit) and
-- released with active > 0; a row at zero is kept for the next reservation.
-- A reservation that finds its scope full calls scope_full, which aborts the
-- transaction with SQLSTATE AIP01 naming the scope's index in the
-- reservation, so a pipelined COMMIT behind it cannot commit a partial
-- reservation.
CREATE TABLE aip_registry.admission_counters (
    scope_kind    text   NOT NULL CHECK (scope_kind IN ('global', 'tenant', 'connector_type', 'instance', 'binding', 'tenant_retry')),
    scope_key     text   NOT NULL,
    active        bigint NOT NULL CHECK (active >= 0),
    -- the limit the latest reservation of this counter was checked against
    reserve_limit bigint NOT NULL CHECK (reserve_limit > 0),
    PRIMARY KEY (scope_kind, scope_key)
) WITH (fillfactor = 70);

CREATE FUNCTION aip_registry.scope_full(scope_index integer) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'admission scope % of the reservation is at its limit', scope_index
        USING ERRCODE = 'AIP01', DETAIL = scope_index::text;
END
$$;

-- Replay claims of signed lifecycle requests: one row per decided request
-- ID with the request's digest and replica, kept until it expires (the
-- request's expires_at plus a grace) and then pruned in bounded batches.
CREATE TABLE aip_registry.control_replay (
    request_id    text   PRIMARY KEY,
    digest        text   NOT NULL,
    replica_id    text   NOT NULL,
    claimed_at_ms bigint NOT NULL,
    expires_at_ms bigint NOT NULL
);
CREATE INDEX control_replay_expiry ON aip_registry.control_replay (expires_at_ms, request_id);
