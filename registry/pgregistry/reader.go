package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// The record reads (registry.Reader) run on the data pool, one statement
// each. Scanners turn rows into registry records.

const (
	selectType = `SELECT type_id, name, owner, enabled FROM aip_registry.connector_types WHERE type_id = $1`

	versionColumns = `version_id, type_id, version, status, manifest, manifest_digest, attestation, implementation_support, admitted_at_ms`
	selectVersion  = `SELECT ` + versionColumns + ` FROM aip_registry.connector_versions WHERE version_id = $1`

	instanceColumns = `instance_id, type_id, version_id, tenant_id, config_revision, secret_provider_ref, status`
	selectInstance  = `SELECT ` + instanceColumns + ` FROM aip_registry.connector_instances WHERE instance_id = $1`

	replicaColumns = `replica_id, instance_id, version_id, endpoint, peer_principal_id, peer_principal_kind, peer_did,
	trust_domain, transport_profile, region, zone, capacity_class, status, lease_expires_at_ms, capacity,
	active_assignments, health_revision, last_control_request_id, last_control_request_digest,
	consecutive_failures, circuit_open_until_ms, offline_reason, offline_at_ms`
	selectReplica = `SELECT ` + replicaColumns + ` FROM aip_registry.connector_replicas WHERE replica_id = $1`

	bindingColumns = `tenant_id, capability_id, instance_id, priority, policy_revision, credential_revision_ref, quota_policy_ref, enabled`
	selectBinding  = `SELECT ` + bindingColumns + ` FROM aip_registry.capability_bindings WHERE tenant_id = $1 AND capability_id = $2 AND instance_id = $3`

	policyColumns = `policy_ref, revision, enabled, max_global_in_flight, max_tenant_in_flight, max_connector_type_in_flight,
	max_instance_in_flight, max_binding_in_flight, max_tenant_retry_in_flight, circuit_failure_threshold, circuit_open_ms`
	selectPolicy = `SELECT ` + policyColumns + ` FROM aip_registry.admission_policies WHERE policy_ref = $1`

	selectRevision = `SELECT revision FROM aip_registry.catalog_revision`
)

func scanType(row pgx.Row) (registry.ConnectorType, error) {
	var t registry.ConnectorType
	err := row.Scan(&t.ID, &t.Name, &t.Owner, &t.Enabled)
	return t, err
}

func scanVersion(row pgx.Row) (registry.ConnectorVersion, error) { return scanVersionRow(row, nil) }

// scanVersionRow scans lead columns, then the version columns.
func scanVersionRow(row pgx.Row, lead []any) (registry.ConnectorVersion, error) {
	var (
		v                         registry.ConnectorVersion
		status                    string
		manifest, attest, support []byte
		admittedMS                int64
	)
	dest := append(lead[:len(lead):len(lead)], &v.ID, &v.ConnectorTypeID, &v.Version, &status, &manifest, &v.ManifestDigest, &attest, &support, &admittedMS)
	if err := row.Scan(dest...); err != nil {
		return v, err
	}
	v.Status = registry.VersionStatus(status)
	v.AdmittedAt = fromMS(admittedMS)
	if err := json.Unmarshal(manifest, &v.Manifest); err != nil {
		return v, fmt.Errorf("decode the stored manifest of %s: %w", v.ID, err)
	}
	if err := json.Unmarshal(attest, &v.Attestation); err != nil {
		return v, fmt.Errorf("decode the stored attestation of %s: %w", v.ID, err)
	}
	if err := json.Unmarshal(support, &v.ImplementationSupport); err != nil {
		return v, fmt.Errorf("decode the stored implementation support of %s: %w", v.ID, err)
	}
	return v, nil
}

func scanInstance(row pgx.Row) (registry.ConnectorInstance, error) {
	var (
		i      registry.ConnectorInstance
		rev    int64
		status string
	)
	err := row.Scan(&i.ID, &i.ConnectorTypeID, &i.VersionID, &i.TenantID, &rev, &i.SecretProviderRef, &status)
	i.ConfigRevision, i.Status = uint64(rev), registry.InstanceStatus(status)
	return i, err
}

func scanReplica(row pgx.Row) (registry.ConnectorReplica, error) {
	return scanReplicaRow(row, nil, nil)
}

// scanReplicaRow scans lead columns, the replica columns, then extra
// columns.
func scanReplicaRow(row pgx.Row, lead, extra []any) (registry.ConnectorReplica, error) {
	var (
		r                                 registry.ConnectorReplica
		kind, status                      string
		leaseMS, capacity, active, health int64
		reqID, reqDigest, offlineReason   *string
		failures, openMS                  int64
		offlineMS                         *int64
	)
	dest := append(lead[:len(lead):len(lead)], &r.ID, &r.InstanceID, &r.VersionID, &r.Endpoint, &r.PeerPrincipalID, &kind, &r.PeerDID,
		&r.TrustDomain, &r.TransportProfile, &r.Topology.Region, &r.Topology.Zone, &r.Topology.CapacityClass,
		&status, &leaseMS, &capacity, &active, &health, &reqID, &reqDigest, &failures, &openMS, &offlineReason, &offlineMS)
	if err := row.Scan(append(dest, extra...)...); err != nil {
		return r, err
	}
	r.PeerPrincipalKind, r.Status = aip.PrincipalKind(kind), aip.ReplicaStatus(status)
	r.LeaseExpiresAt = fromMS(leaseMS)
	r.Capacity, r.ActiveAssignments, r.HealthRevision = uint32(capacity), uint32(active), uint64(health)
	r.LastControlRequestID, r.LastControlRequestDigest = deref(reqID), deref(reqDigest)
	r.Circuit = registry.CircuitState{ConsecutiveFailures: uint32(failures), OpenUntil: fromMS(openMS)}
	r.OfflineReason = registry.OfflineReason(deref(offlineReason))
	if offlineMS != nil {
		r.OfflineAt = fromMS(*offlineMS)
	}
	return r, nil
}

func scanBinding(row pgx.Row) (registry.CapabilityBinding, error) {
	var (
		b           registry.CapabilityBinding
		prio, rev   int64
		cred, quota *string
	)
	err := row.Scan(&b.TenantID, &b.CapabilityID, &b.InstanceID, &prio, &rev, &cred, &quota, &b.Enabled)
	b.Priority, b.PolicyRevision = uint32(prio), uint64(rev)
	b.CredentialRevisionRef, b.QuotaPolicyRef = deref(cred), deref(quota)
	return b, err
}

func scanPolicy(row pgx.Row) (registry.AdmissionPolicy, error) {
	var (
		p                                         registry.AdmissionPolicy
		rev, global, tenant, typ, inst, bind, rty int64
		threshold, openMS                         int64
	)
	err := row.Scan(&p.PolicyRef, &rev, &p.Enabled, &global, &tenant, &typ, &inst, &bind, &rty, &threshold, &openMS)
	p.Revision = uint64(rev)
	p.MaxGlobalInFlight, p.MaxTenantInFlight, p.MaxConnectorTypeInFlight = uint32(global), uint32(tenant), uint32(typ)
	p.MaxInstanceInFlight, p.MaxBindingInFlight, p.MaxTenantRetryInFlight = uint32(inst), uint32(bind), uint32(rty)
	p.CircuitFailureThreshold, p.CircuitOpenMS = uint32(threshold), uint64(openMS)
	return p, err
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// nullable stores "" as NULL.
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// storable reports whether PostgreSQL can hold s in a text column: valid
// UTF-8 without NUL characters. Every stored identity is such a string (the
// records' validation admits nothing else), so a key that is not names no
// record: a lookup by it is ErrNotFound, as in memregistry, never the
// storage failure PostgreSQL's encoding error would otherwise become (a
// caller retries those).
func storable(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }

// storableArgs reports whether every string among a query's arguments is
// storable.
func storableArgs(args []any) bool {
	for _, a := range args {
		if s, ok := a.(string); ok && !storable(s) {
			return false
		}
	}
	return true
}

// readOne runs one read on the data pool and turns no row into ErrNotFound
// naming what; so is a key PostgreSQL cannot hold (storable).
func readOne[T any](ctx context.Context, r *Registry, what string, scan func(pgx.Row) (T, error), sql string, args ...any) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	if !storableArgs(args) {
		return zero, fmt.Errorf("%s: %w", what, registry.ErrNotFound)
	}
	v, err := scan(r.data.QueryRow(ctx, sql, args...))
	if errors.Is(err, pgx.ErrNoRows) {
		return zero, fmt.Errorf("%s: %w", what, registry.ErrNotFound)
	}
	if err != nil {
		return zero, storageErr("read "+what, err)
	}
	return v, nil
}

// dataRow runs one read on the data pool (recordReads for the Registry).
func (r *Registry) dataRow(ctx context.Context, what string, scan func(pgx.Row) error, sql string, args ...any) error {
	_, err := readOne(ctx, r, what, func(row pgx.Row) (struct{}, error) { return struct{}{}, scan(row) }, sql, args...)
	return err
}

// recordReads is the registry.Reader lookups of single records, over one
// way of running a query: the data pool (Registry) or a batch's
// transaction (batchAdmin). row runs sql and scans its one row with scan,
// turning no row into ErrNotFound naming what.
type recordReads struct {
	row func(ctx context.Context, what string, scan func(pgx.Row) error, sql string, args ...any) error
}

// readRecord reads one record through rr.
func readRecord[T any](ctx context.Context, rr recordReads, what string, scan func(pgx.Row) (T, error), sql string, args ...any) (T, error) {
	var v T
	if !storableArgs(args) {
		return v, fmt.Errorf("%s: %w", what, registry.ErrNotFound)
	}
	err := rr.row(ctx, what, func(row pgx.Row) error {
		var err error
		v, err = scan(row)
		return err
	}, sql, args...)
	return v, err
}

// ConnectorType implements registry.Reader.
func (rr recordReads) ConnectorType(ctx context.Context, id string) (registry.ConnectorType, error) {
	return readRecord(ctx, rr, "connector type "+id, scanType, selectType, id)
}

// ConnectorVersion implements registry.Reader.
func (rr recordReads) ConnectorVersion(ctx context.Context, id string) (registry.ConnectorVersion, error) {
	return readRecord(ctx, rr, "connector version "+id, scanVersion, selectVersion, id)
}

// ConnectorInstance implements registry.Reader.
func (rr recordReads) ConnectorInstance(ctx context.Context, id string) (registry.ConnectorInstance, error) {
	return readRecord(ctx, rr, "connector instance "+id, scanInstance, selectInstance, id)
}

// ConnectorReplica implements registry.Reader.
func (rr recordReads) ConnectorReplica(ctx context.Context, id string) (registry.ConnectorReplica, error) {
	return readRecord(ctx, rr, "connector replica "+id, scanReplica, selectReplica, id)
}

// CapabilityBinding implements registry.Reader.
func (rr recordReads) CapabilityBinding(ctx context.Context, key registry.BindingKey) (registry.CapabilityBinding, error) {
	return readRecord(ctx, rr, "capability binding "+key.String(), scanBinding, selectBinding, key.TenantID, key.CapabilityID, key.InstanceID)
}

// AdmissionPolicy implements registry.Reader.
func (rr recordReads) AdmissionPolicy(ctx context.Context, ref string) (registry.AdmissionPolicy, error) {
	return readRecord(ctx, rr, "admission policy "+ref, scanPolicy, selectPolicy, ref)
}

// CatalogRevision implements registry.Reader. In a batch it is the revision
// the batch started from; the batch's own changes publish at commit.
func (rr recordReads) CatalogRevision(ctx context.Context) (uint64, error) {
	rev, err := readRecord(ctx, rr, "catalog revision", scanUint, selectRevision)
	if errors.Is(err, registry.ErrNotFound) {
		return 0, storageErr("read catalog revision", errors.New("the catalog revision row is missing; the schema is damaged"))
	}
	return rev, err
}

func scanUint(row pgx.Row) (uint64, error) {
	var n int64
	err := row.Scan(&n)
	return uint64(n), err
}
