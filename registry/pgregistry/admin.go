package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Catalog and admission writes (registry.Administrator) run on the control
// pool. Each takes the exclusive form of the publication lock as its first
// statement, loads what the rules need, applies the registry package's rule
// functions, writes, and — when it changed something — advances the catalog
// revision by one in the same transaction. Replica writes (PutReplica) run
// on the data pool without the publication lock and never advance the
// revision.

const (
	lockCatalogExclusive = `SELECT pg_advisory_xact_lock($1, $2)`
	publishRevision      = `UPDATE aip_registry.catalog_revision SET revision = revision + 1, published_at_ms = $1`

	upsertPolicy = `INSERT INTO aip_registry.admission_policies (` + policyColumns + `, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
ON CONFLICT (policy_ref) DO UPDATE SET revision = excluded.revision, enabled = excluded.enabled,
	max_global_in_flight = excluded.max_global_in_flight, max_tenant_in_flight = excluded.max_tenant_in_flight,
	max_connector_type_in_flight = excluded.max_connector_type_in_flight, max_instance_in_flight = excluded.max_instance_in_flight,
	max_binding_in_flight = excluded.max_binding_in_flight, max_tenant_retry_in_flight = excluded.max_tenant_retry_in_flight,
	circuit_failure_threshold = excluded.circuit_failure_threshold, circuit_open_ms = excluded.circuit_open_ms,
	updated_at_ms = excluded.updated_at_ms`

	insertType     = `INSERT INTO aip_registry.connector_types (type_id, name, owner, enabled, updated_at_ms) VALUES ($1, $2, $3, $4, $5)`
	setTypeEnabled = `UPDATE aip_registry.connector_types SET enabled = $2, updated_at_ms = $3 WHERE type_id = $1`

	// versionConflicts loads what admission checks against: the type and any
	// version already holding the release or the artifact.
	versionConflicts = `SELECT t.type_id, t.name, t.owner, t.enabled,
	(SELECT version_id FROM aip_registry.connector_versions WHERE type_id = $1 AND version = $2),
	(SELECT version_id FROM aip_registry.connector_versions WHERE artifact_digest = $3)
FROM (VALUES (1)) AS one (x)
LEFT JOIN aip_registry.connector_types t ON t.type_id = $1`
	selectDefinitionDigests = `SELECT capability_id, contract_digest FROM aip_registry.capability_definitions WHERE capability_id = ANY($1)`
	insertVersion           = `INSERT INTO aip_registry.connector_versions (` + versionColumns + `, artifact_digest, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $9)`
	insertDefinitions = `INSERT INTO aip_registry.capability_definitions (capability_id, contract_digest, schema_digest, capability, size_bytes, search_text)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::integer[], $6::text[])
ON CONFLICT (capability_id) DO NOTHING`
	insertVersionCapabilities = `INSERT INTO aip_registry.version_capabilities (version_id, capability_id) SELECT $1, unnest($2::text[])`
	insertVersionProfiles     = `INSERT INTO aip_registry.version_profiles (version_id, profile) SELECT DISTINCT $1, unnest($2::text[])`
	setVersionStatus          = `UPDATE aip_registry.connector_versions SET status = $2, updated_at_ms = $3 WHERE version_id = $1`

	// instanceRefs loads the stored instance, whether its type exists and
	// its version's type and status.
	instanceRefs = `SELECT i.type_id, i.version_id, i.tenant_id, i.config_revision, i.secret_provider_ref, i.status,
	t.type_id IS NOT NULL, v.type_id, v.status
FROM (VALUES (1)) AS one (x)
LEFT JOIN aip_registry.connector_instances i ON i.instance_id = $1
LEFT JOIN aip_registry.connector_types t ON t.type_id = $2
LEFT JOIN aip_registry.connector_versions v ON v.version_id = $3`
	// lackingCapabilities lists the enabled bindings of an instance whose
	// capability a version does not implement.
	lackingCapabilities = `SELECT b.capability_id FROM aip_registry.capability_bindings b
WHERE b.instance_id = $1 AND b.enabled
	AND NOT EXISTS (SELECT 1 FROM aip_registry.version_capabilities vc WHERE vc.version_id = $2 AND vc.capability_id = b.capability_id)
ORDER BY b.capability_id`
	upsertInstance = `INSERT INTO aip_registry.connector_instances (` + instanceColumns + `, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
ON CONFLICT (instance_id) DO UPDATE SET version_id = excluded.version_id, config_revision = excluded.config_revision,
	secret_provider_ref = excluded.secret_provider_ref, status = excluded.status, updated_at_ms = excluded.updated_at_ms`

	// bindingRefs loads the stored binding, the instance, whether the
	// instance's version implements the capability and whether the quota
	// policy exists.
	bindingRefs = `SELECT sb.priority, sb.policy_revision, sb.credential_revision_ref, sb.quota_policy_ref, sb.enabled,
	i.instance_id, i.type_id, i.version_id, i.tenant_id, i.config_revision, i.secret_provider_ref, i.status,
	EXISTS (SELECT 1 FROM aip_registry.version_capabilities vc WHERE vc.version_id = i.version_id AND vc.capability_id = $2),
	$4::text IS NULL OR EXISTS (SELECT 1 FROM aip_registry.admission_policies p WHERE p.policy_ref = $4)
FROM (VALUES (1)) AS one (x)
LEFT JOIN aip_registry.capability_bindings sb ON sb.tenant_id = $1 AND sb.capability_id = $2 AND sb.instance_id = $3
LEFT JOIN aip_registry.connector_instances i ON i.instance_id = $3`
	upsertBinding = `INSERT INTO aip_registry.capability_bindings (` + bindingColumns + `, scope_key, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT (tenant_id, capability_id, instance_id) DO UPDATE SET priority = excluded.priority,
	policy_revision = excluded.policy_revision, credential_revision_ref = excluded.credential_revision_ref,
	quota_policy_ref = excluded.quota_policy_ref, enabled = excluded.enabled, updated_at_ms = excluded.updated_at_ms`

	selectReplicaForUpdate = selectReplica + ` FOR UPDATE`
	insertReplica          = `INSERT INTO aip_registry.connector_replicas (` + replicaColumns + `, updated_at_ms)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)`
	updateReplica = `UPDATE aip_registry.connector_replicas SET status = $2, lease_expires_at_ms = $3, capacity = $4,
	health_revision = $5, last_control_request_id = $6, last_control_request_digest = $7, updated_at_ms = $8,
	offline_reason = $9, offline_at_ms = $10
WHERE replica_id = $1`
)

// writer applies administrator writes inside one transaction.
type writer struct {
	r   *Registry
	tx  pgx.Tx
	now int64
}

// catalogWrite runs one catalog write on the control pool under the
// exclusive publication lock; the revision advances when fn changed
// something.
func (r *Registry) catalogWrite(ctx context.Context, op string, fn func(ctx context.Context, w *writer) (bool, error)) error {
	pool, err := r.controlPool(op)
	if err != nil {
		return err
	}
	return r.inTx(ctx, pool, op, func(tx pgx.Tx) error {
		w := &writer{r: r, tx: tx, now: r.nowMS()}
		if _, err := tx.Exec(ctx, lockCatalogExclusive, lockClass, lockCatalog); err != nil {
			return err
		}
		changed, err := fn(ctx, w)
		if err != nil || !changed {
			return err
		}
		_, err = tx.Exec(ctx, publishRevision, w.now)
		return err
	})
}

// PutAdmissionPolicy implements registry.Administrator.
func (r *Registry) PutAdmissionPolicy(ctx context.Context, p registry.AdmissionPolicy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return r.catalogWrite(ctx, "put admission policy "+p.PolicyRef, func(ctx context.Context, w *writer) (bool, error) {
		return w.putPolicy(ctx, p)
	})
}

// PutConnectorType implements registry.Administrator.
func (r *Registry) PutConnectorType(ctx context.Context, t registry.ConnectorType) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return r.catalogWrite(ctx, "put connector type "+t.ID, func(ctx context.Context, w *writer) (bool, error) {
		return w.putType(ctx, t)
	})
}

// SetConnectorTypeEnabled implements registry.Administrator.
func (r *Registry) SetConnectorTypeEnabled(ctx context.Context, id string, enabled bool) error {
	return r.catalogWrite(ctx, "set connector type "+id+" enabled", func(ctx context.Context, w *writer) (bool, error) {
		return w.setTypeEnabled(ctx, id, enabled)
	})
}

// AdmitVersion implements registry.Administrator.
func (r *Registry) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	p, err := registry.PrepareVersion(v, r.limits)
	if err != nil {
		return err
	}
	return r.catalogWrite(ctx, "admit connector version "+v.ID, func(ctx context.Context, w *writer) (bool, error) {
		return w.admitVersion(ctx, p)
	})
}

// SetVersionStatus implements registry.Administrator.
func (r *Registry) SetVersionStatus(ctx context.Context, id string, status registry.VersionStatus) error {
	return r.catalogWrite(ctx, "set connector version "+id+" status", func(ctx context.Context, w *writer) (bool, error) {
		return w.setVersionStatus(ctx, id, status)
	})
}

// PutInstance implements registry.Administrator.
func (r *Registry) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	if err := i.Validate(); err != nil {
		return err
	}
	return r.catalogWrite(ctx, "put connector instance "+i.ID, func(ctx context.Context, w *writer) (bool, error) {
		return w.putInstance(ctx, i)
	})
}

// PutBinding implements registry.Administrator.
func (r *Registry) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	if err := b.Validate(); err != nil {
		return err
	}
	return r.catalogWrite(ctx, "put capability binding "+b.Key().String(), func(ctx context.Context, w *writer) (bool, error) {
		return w.putBinding(ctx, b)
	})
}

// PutReplica implements registry.Administrator. It runs on the data pool
// (a replica write is lifecycle state, not catalog state), takes no
// publication lock and never advances the catalog revision.
func (r *Registry) PutReplica(ctx context.Context, rep registry.ConnectorReplica) error {
	rep.Normalize()
	if err := rep.Validate(); err != nil {
		return err
	}
	return r.inTx(ctx, r.data, "put connector replica "+rep.ID, func(tx pgx.Tx) error {
		w := &writer{r: r, tx: tx, now: r.nowMS()}
		return w.putReplica(ctx, rep)
	})
}

func (w *writer) putPolicy(ctx context.Context, p registry.AdmissionPolicy) (bool, error) {
	stored, err := scanPolicy(w.tx.QueryRow(ctx, selectPolicy, p.PolicyRef))
	switch {
	case err == nil:
		changed, err := registry.CheckPolicyUpdate(&stored, &p)
		if err != nil || !changed {
			return false, err
		}
	case !errors.Is(err, pgx.ErrNoRows):
		return false, err
	}
	_, err = w.tx.Exec(ctx, upsertPolicy, p.PolicyRef, int64(p.Revision), p.Enabled,
		int64(p.MaxGlobalInFlight), int64(p.MaxTenantInFlight), int64(p.MaxConnectorTypeInFlight),
		int64(p.MaxInstanceInFlight), int64(p.MaxBindingInFlight), int64(p.MaxTenantRetryInFlight),
		int64(p.CircuitFailureThreshold), int64(p.CircuitOpenMS), w.now)
	return err == nil, err
}

func (w *writer) putType(ctx context.Context, t registry.ConnectorType) (bool, error) {
	stored, err := scanType(w.tx.QueryRow(ctx, selectType, t.ID))
	switch {
	case err == nil:
		return false, registry.CheckTypePut(&stored, &t)
	case !errors.Is(err, pgx.ErrNoRows):
		return false, err
	}
	_, err = w.tx.Exec(ctx, insertType, t.ID, t.Name, t.Owner, t.Enabled, w.now)
	return err == nil, err
}

func (w *writer) setTypeEnabled(ctx context.Context, id string, enabled bool) (bool, error) {
	if !storable(id) {
		return false, fmt.Errorf("connector type %s: %w", id, registry.ErrNotFound)
	}
	stored, err := scanType(w.tx.QueryRow(ctx, selectType, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("connector type %s: %w", id, registry.ErrNotFound)
	}
	if err != nil || stored.Enabled == enabled {
		return false, err
	}
	_, err = w.tx.Exec(ctx, setTypeEnabled, id, enabled, w.now)
	return err == nil, err
}

func (w *writer) admitVersion(ctx context.Context, p registry.PreparedVersion) (bool, error) {
	v := p.Version
	stored, err := scanVersion(w.tx.QueryRow(ctx, selectVersion, v.ID))
	switch {
	case err == nil:
		return false, registry.CheckVersionReadmission(&stored, &v)
	case !errors.Is(err, pgx.ErrNoRows):
		return false, err
	}
	var (
		typeID, name, owner    *string
		enabled                *bool
		otherRelease, otherArt *string
	)
	if err := w.tx.QueryRow(ctx, versionConflicts, v.ConnectorTypeID, v.Version, v.Attestation.ArtifactDigest).
		Scan(&typeID, &name, &owner, &enabled, &otherRelease, &otherArt); err != nil {
		return false, err
	}
	if typeID == nil {
		return false, registry.MissingReference(registry.RecordConnectorVersion, v.ID, "connector_type_id", "connector type", v.ConnectorTypeID)
	}
	t := registry.ConnectorType{ID: *typeID, Name: *name, Owner: *owner, Enabled: *enabled}
	if err := registry.CheckVersionAdmission(&t, &v); err != nil {
		return false, err
	}
	if otherRelease != nil {
		return false, registry.DuplicateRelease(&v, *otherRelease)
	}
	if otherArt != nil {
		return false, registry.DuplicateArtifact(&v, *otherArt)
	}
	n := len(p.Definitions)
	ids := make([]string, n)
	for i, d := range p.Definitions {
		ids[i] = d.Capability.ID
	}
	rows, err := w.tx.Query(ctx, selectDefinitionDigests, ids)
	if err != nil {
		return false, err
	}
	published := map[string]string{}
	var id, digest string
	if _, err := pgx.ForEachRow(rows, []any{&id, &digest}, func() error { published[id] = digest; return nil }); err != nil {
		return false, err
	}
	contracts, schemas, docs, searches := make([]string, n), make([]string, n), make([][]byte, n), make([]string, n)
	sizes := make([]int32, n)
	for i, d := range p.Definitions {
		if stored, ok := published[d.Capability.ID]; ok {
			if err := registry.CheckDefinition(v.ID, i, &registry.CapabilityDefinition{ContractDigest: stored}, &d); err != nil {
				return false, err
			}
		}
		doc, err := json.Marshal(d.Capability)
		if err != nil {
			return false, fmt.Errorf("%w: encode capability %s: %v", registry.ErrInvalid, d.Capability.ID, err)
		}
		contracts[i], schemas[i], docs[i], searches[i] = d.ContractDigest, d.SchemaDigest, doc, registry.SearchText(&d)
		sizes[i] = int32(p.Sizes[i])
	}
	v.AdmittedAt = w.r.clock()
	manifest, err := json.Marshal(v.Manifest)
	if err != nil {
		return false, fmt.Errorf("%w: encode the manifest of %s: %v", registry.ErrInvalid, v.ID, err)
	}
	attest, err := json.Marshal(v.Attestation)
	if err != nil {
		return false, fmt.Errorf("%w: encode the attestation of %s: %v", registry.ErrInvalid, v.ID, err)
	}
	support, err := json.Marshal(v.ImplementationSupport)
	if err != nil {
		return false, fmt.Errorf("%w: encode the implementation support of %s: %v", registry.ErrInvalid, v.ID, err)
	}
	b := &pgx.Batch{}
	b.Queue(insertVersion, v.ID, v.ConnectorTypeID, v.Version, string(v.Status), manifest, v.ManifestDigest, attest, support,
		toMS(v.AdmittedAt), v.Attestation.ArtifactDigest)
	b.Queue(insertDefinitions, ids, contracts, schemas, docs, sizes, searches)
	b.Queue(insertVersionCapabilities, v.ID, ids)
	profiles := v.Manifest.Profiles
	if profiles == nil {
		profiles = []string{}
	}
	b.Queue(insertVersionProfiles, v.ID, profiles)
	if err := w.tx.SendBatch(ctx, b).Close(); err != nil {
		return false, err
	}
	return true, nil
}

func (w *writer) setVersionStatus(ctx context.Context, id string, status registry.VersionStatus) (bool, error) {
	if !storable(id) {
		return false, fmt.Errorf("connector version %s: %w", id, registry.ErrNotFound)
	}
	v, err := scanVersion(w.tx.QueryRow(ctx, selectVersion, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("connector version %s: %w", id, registry.ErrNotFound)
	}
	if err != nil {
		return false, err
	}
	if err := registry.CheckVersionTransition(id, v.Status, status); err != nil || v.Status == status {
		return false, err
	}
	if status == registry.VersionActive {
		if err := v.Attestation.Qualify(id, &v.Manifest); err != nil {
			return false, err
		}
	}
	_, err = w.tx.Exec(ctx, setVersionStatus, id, string(status), w.now)
	return err == nil, err
}

func (w *writer) putInstance(ctx context.Context, i registry.ConnectorInstance) (bool, error) {
	const rec = registry.RecordConnectorInstance
	var (
		sType, sVersion, sTenant, sSecret, sStatus *string
		sRev                                       *int64
		typeExists                                 bool
		vType, vStatus                             *string
	)
	if err := w.tx.QueryRow(ctx, instanceRefs, i.ID, i.ConnectorTypeID, i.VersionID).
		Scan(&sType, &sVersion, &sTenant, &sRev, &sSecret, &sStatus, &typeExists, &vType, &vStatus); err != nil {
		return false, err
	}
	exists := sType != nil
	var stored registry.ConnectorInstance
	if exists {
		stored = registry.ConnectorInstance{ID: i.ID, ConnectorTypeID: *sType, VersionID: *sVersion, TenantID: *sTenant,
			ConfigRevision: uint64(*sRev), SecretProviderRef: *sSecret, Status: registry.InstanceStatus(*sStatus)}
		changed, err := registry.CheckInstanceUpdate(&stored, &i)
		if err != nil || !changed {
			return false, err
		}
	} else if !typeExists {
		return false, registry.MissingReference(rec, i.ID, "connector_type_id", "connector type", i.ConnectorTypeID)
	}
	if vType == nil {
		return false, registry.MissingReference(rec, i.ID, "version_id", "connector version", i.VersionID)
	}
	switched := exists && stored.VersionID != i.VersionID
	if !exists || switched {
		v := registry.ConnectorVersion{ID: i.VersionID, ConnectorTypeID: *vType, Status: registry.VersionStatus(*vStatus)}
		if err := registry.CheckInstanceVersion(&i, &v); err != nil {
			return false, err
		}
	}
	if switched {
		rows, err := w.tx.Query(ctx, lackingCapabilities, i.ID, i.VersionID)
		if err != nil {
			return false, err
		}
		caps, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return false, err
		}
		if len(caps) > 0 {
			return false, registry.VersionLacksBoundCapability(&i, caps)
		}
	}
	_, err := w.tx.Exec(ctx, upsertInstance, i.ID, i.ConnectorTypeID, i.VersionID, i.TenantID, int64(i.ConfigRevision),
		i.SecretProviderRef, string(i.Status), w.now)
	return err == nil, err
}

func (w *writer) putBinding(ctx context.Context, b registry.CapabilityBinding) (bool, error) {
	const rec = registry.RecordCapabilityBinding
	var (
		sPrio, sRev                   *int64
		sCred, sQuota                 *string
		sEnabled                      *bool
		iID, iType, iVersion, iTenant *string
		iSecret, iStatus              *string
		iRev                          *int64
		implements, policyExists      bool
	)
	if err := w.tx.QueryRow(ctx, bindingRefs, b.TenantID, b.CapabilityID, b.InstanceID, nullable(b.QuotaPolicyRef)).
		Scan(&sPrio, &sRev, &sCred, &sQuota, &sEnabled, &iID, &iType, &iVersion, &iTenant, &iRev, &iSecret, &iStatus,
			&implements, &policyExists); err != nil {
		return false, err
	}
	exists := sPrio != nil
	if exists {
		stored := registry.CapabilityBinding{TenantID: b.TenantID, CapabilityID: b.CapabilityID, InstanceID: b.InstanceID,
			Priority: uint32(*sPrio), PolicyRevision: uint64(*sRev), CredentialRevisionRef: deref(sCred),
			QuotaPolicyRef: deref(sQuota), Enabled: *sEnabled}
		changed, err := registry.CheckBindingUpdate(&stored, &b)
		if err != nil || !changed {
			return false, err
		}
	}
	if iID == nil {
		return false, registry.MissingReference(rec, b.Key().String(), "instance_id", "connector instance", b.InstanceID)
	}
	inst := registry.ConnectorInstance{ID: *iID, ConnectorTypeID: *iType, VersionID: *iVersion, TenantID: *iTenant,
		ConfigRevision: uint64(*iRev), SecretProviderRef: *iSecret, Status: registry.InstanceStatus(*iStatus)}
	// The rule needs only whether the instance's version implements the
	// capability; the query answered that from the normalized tables.
	v := registry.ConnectorVersion{ID: inst.VersionID}
	if implements {
		v.Manifest.Capabilities = []aip.Capability{{ID: b.CapabilityID}}
	}
	if err := registry.CheckBindingTarget(&b, &inst, &v, !exists); err != nil {
		return false, err
	}
	if !policyExists {
		return false, registry.MissingReference(rec, b.Key().String(), "quota_policy_ref", "admission policy", b.QuotaPolicyRef)
	}
	_, err := w.tx.Exec(ctx, upsertBinding, b.TenantID, b.CapabilityID, b.InstanceID, int64(b.Priority), int64(b.PolicyRevision),
		nullable(b.CredentialRevisionRef), nullable(b.QuotaPolicyRef), b.Enabled, registry.BindingScopeKey(b.Key()), w.now)
	return err == nil, err
}

func (w *writer) putReplica(ctx context.Context, rep registry.ConnectorReplica) error {
	stored, err := scanReplica(w.tx.QueryRow(ctx, selectReplicaForUpdate, rep.ID))
	switch {
	case err == nil:
		registry.AdminOffline(&stored, &rep, fromMS(w.now))
		changed, err := registry.CheckReplicaUpdate(&stored, &rep)
		if err != nil || !changed {
			return err
		}
		reason, at := offlineColumns(&rep)
		_, err = w.tx.Exec(ctx, updateReplica, rep.ID, string(rep.Status), toMS(rep.LeaseExpiresAt), int64(rep.Capacity),
			int64(rep.HealthRevision), nullable(rep.LastControlRequestID), nullable(rep.LastControlRequestDigest), w.now, reason, at)
		return err
	case !errors.Is(err, pgx.ErrNoRows):
		return err
	}
	inst, err := scanInstance(w.tx.QueryRow(ctx, selectInstance, rep.InstanceID))
	if errors.Is(err, pgx.ErrNoRows) {
		return registry.MissingReference(registry.RecordConnectorReplica, rep.ID, "instance_id", "connector instance", rep.InstanceID)
	}
	if err != nil {
		return err
	}
	if err := registry.CheckNewReplica(&rep, &inst); err != nil {
		return err
	}
	registry.AdminOffline(nil, &rep, fromMS(w.now))
	reason, at := offlineColumns(&rep)
	_, err = w.tx.Exec(ctx, insertReplica, rep.ID, rep.InstanceID, rep.VersionID, rep.Endpoint, rep.PeerPrincipalID,
		string(rep.PeerPrincipalKind), rep.PeerDID, rep.TrustDomain, rep.TransportProfile, rep.Topology.Region,
		rep.Topology.Zone, rep.Topology.CapacityClass, string(rep.Status), toMS(rep.LeaseExpiresAt), int64(rep.Capacity),
		int64(rep.ActiveAssignments), int64(rep.HealthRevision), nullable(rep.LastControlRequestID),
		nullable(rep.LastControlRequestDigest), int64(rep.Circuit.ConsecutiveFailures), toMS(rep.Circuit.OpenUntil), reason, at, w.now)
	return err
}

// offlineColumns returns a replica's offline_reason and offline_at_ms
// (both NULL when it has no offline reason).
func offlineColumns(rep *registry.ConnectorReplica) (reason *string, at *int64) {
	if rep.OfflineReason == "" {
		return nil, nil
	}
	ms := toMS(rep.OfflineAt)
	return nullable(string(rep.OfflineReason)), &ms
}

// ---------------------------------------------------------------- batches

// Batch applies fn's administrator writes in one control-pool transaction
// under one hold of the exclusive publication lock, with exactly the rules
// of the single writes: each write sees the ones before it, a write refused
// by a rule returns its error and changes nothing, and the catalog revision
// advances by one at commit when any write changed the catalog (one
// publication). Replica writes in a batch run in the same transaction. If
// fn returns an error, or a write failed in the database, nothing commits.
// The Administrator passed to fn is valid only until fn returns and is not
// safe for concurrent use. Bulk loads (cmd/registry-bench seeds the scale
// profile with registrytest.SeedScale through it) use Batch to avoid one
// commit per record. Catalog readers and new routes wait for the
// publication lock until the batch commits: keep batches short in a live
// fleet. fn must not wait between its writes: a session idle inside a
// transaction for a minute is ended by the server (the pools set
// idle_in_transaction_session_timeout; see internal/pgsession), and the
// batch then fails and commits nothing.
func (r *Registry) Batch(ctx context.Context, fn func(admin registry.Administrator) error) error {
	pool, err := r.controlPool("batch")
	if err != nil {
		return err
	}
	return r.inTx(ctx, pool, "batch", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, lockCatalogExclusive, lockClass, lockCatalog); err != nil {
			return err
		}
		b := &batchAdmin{r: r, tx: tx}
		b.recordReads = recordReads{row: b.txRow}
		err := fn(b)
		b.mu.Lock()
		defer b.mu.Unlock()
		b.done = true
		if b.failed != nil {
			return b.failed
		}
		if err != nil {
			return err
		}
		if b.changed {
			_, err = tx.Exec(ctx, publishRevision, r.nowMS())
		}
		return err
	})
}

// errBatchDone is returned by a batch's Administrator after Batch returned.
var errBatchDone = errors.New("pgregistry: the batch is finished; its Administrator is no longer usable")

// batchAdmin is the Administrator of one Batch.
type batchAdmin struct {
	recordReads
	r       *Registry
	tx      pgx.Tx
	mu      sync.Mutex
	changed bool
	done    bool
	failed  error // a database failure: the transaction is aborted
}

// write runs one write of the batch. Rule errors leave the transaction
// usable (every write checks before it changes anything); any other error
// aborts the batch.
func (b *batchAdmin) write(ctx context.Context, fn func(w *writer) (bool, error)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return errBatchDone
	}
	if b.failed != nil {
		return b.failed
	}
	changed, err := fn(&writer{r: b.r, tx: b.tx, now: b.r.nowMS()})
	if err != nil {
		if !isRegistryError(err) {
			b.failed = storageErr("batch", err)
			return b.failed
		}
		return err
	}
	b.changed = b.changed || changed
	return nil
}

// txRow runs one read of the batch in its transaction (recordReads for
// the batch).
func (b *batchAdmin) txRow(ctx context.Context, what string, scan func(pgx.Row) error, sql string, args ...any) error {
	return b.write(ctx, func(w *writer) (bool, error) {
		err := scan(w.tx.QueryRow(ctx, sql, args...))
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("%s: %w", what, registry.ErrNotFound)
		}
		return false, err
	})
}

func (b *batchAdmin) PutAdmissionPolicy(ctx context.Context, p registry.AdmissionPolicy) error {
	if err := p.Validate(); err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return w.putPolicy(ctx, p) })
}

func (b *batchAdmin) PutConnectorType(ctx context.Context, t registry.ConnectorType) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return w.putType(ctx, t) })
}

func (b *batchAdmin) SetConnectorTypeEnabled(ctx context.Context, id string, enabled bool) error {
	return b.write(ctx, func(w *writer) (bool, error) { return w.setTypeEnabled(ctx, id, enabled) })
}

func (b *batchAdmin) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	p, err := registry.PrepareVersion(v, b.r.limits)
	if err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return w.admitVersion(ctx, p) })
}

func (b *batchAdmin) SetVersionStatus(ctx context.Context, id string, status registry.VersionStatus) error {
	return b.write(ctx, func(w *writer) (bool, error) { return w.setVersionStatus(ctx, id, status) })
}

func (b *batchAdmin) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	if err := i.Validate(); err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return w.putInstance(ctx, i) })
}

func (b *batchAdmin) PutBinding(ctx context.Context, bd registry.CapabilityBinding) error {
	if err := bd.Validate(); err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return w.putBinding(ctx, bd) })
}

func (b *batchAdmin) PutReplica(ctx context.Context, rep registry.ConnectorReplica) error {
	rep.Normalize()
	if err := rep.Validate(); err != nil {
		return err
	}
	return b.write(ctx, func(w *writer) (bool, error) { return false, w.putReplica(ctx, rep) })
}

var _ registry.Administrator = (*batchAdmin)(nil)

// Analyze refreshes the planner statistics of the registry's tables (with
// the control pool, whose role owns them). Run it after loading many
// records at once: until autovacuum gets to them, the planner may keep
// plans made for empty tables, and ANALYZE also makes every connection
// plan its statements again.
func (r *Registry) Analyze(ctx context.Context) error {
	pool, err := r.controlPool("analyze the registry's tables")
	if err != nil {
		return err
	}
	rows, err := pool.Query(ctx, `SELECT format('%I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = 'aip_registry' ORDER BY tablename`)
	if err != nil {
		return storageErr("list the registry's tables", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return storageErr("list the registry's tables", err)
	}
	if len(names) == 0 {
		return nil
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+strings.Join(names, ", ")); err != nil {
		return storageErr("analyze the registry's tables", err)
	}
	return nil
}
