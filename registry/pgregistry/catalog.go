package pgregistry

import (
	"context"
	"encoding/json"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Catalog reads run on the data pool as one pipelined implicit transaction:
// the shared form of the publication lock, the revision, then the page.
// Holding the shared lock until the page is read means no catalog write can
// publish in between, so the page and its total are exactly those of the
// revision returned with them.

const lockCatalogShared = `SELECT pg_advisory_xact_lock_shared($1, $2)`

// Parameters of the catalog queries: $1 tenant, $2 profile ("" = any), $3
// capability ID ("" = any), $4 search needle ("" = none), $5 the capability
// ID to continue after, $6 rows to fetch (limit + 1), $7 the page limit, $8
// the page byte budget.

// tenantVisible: the capabilities a tenant sees — an enabled binding of the
// tenant whose instance is the tenant's and enabled, whose version is
// active and implements the capability (and lists the profile), of an
// enabled type.
const tenantVisible = `SELECT DISTINCT b.capability_id
	FROM aip_registry.capability_bindings b
	JOIN aip_registry.connector_instances i ON i.instance_id = b.instance_id
	JOIN aip_registry.connector_versions v ON v.version_id = i.version_id
	JOIN aip_registry.connector_types t ON t.type_id = v.type_id
	WHERE b.tenant_id = $1 AND b.enabled
		AND ($3 = '' OR b.capability_id = $3)
		AND i.tenant_id = b.tenant_id AND i.status = 'enabled'
		AND v.status = 'active' AND t.enabled
		AND EXISTS (SELECT 1 FROM aip_registry.version_capabilities vc
			WHERE vc.version_id = i.version_id AND vc.capability_id = b.capability_id)
		AND ($2 = '' OR EXISTS (SELECT 1 FROM aip_registry.version_profiles vp
			WHERE vp.version_id = i.version_id AND vp.profile = $2))`

// internalVisible: every capability some active version of an enabled type
// implements (and lists the profile). $1 is unused.
const internalVisible = `SELECT d.capability_id
	FROM aip_registry.capability_definitions d
	WHERE ($1::text IS NOT NULL) AND ($3 = '' OR d.capability_id = $3)
		AND EXISTS (SELECT 1 FROM aip_registry.version_capabilities vc
			JOIN aip_registry.connector_versions v ON v.version_id = vc.version_id
			JOIN aip_registry.connector_types t ON t.type_id = v.type_id
			WHERE vc.capability_id = d.capability_id AND v.status = 'active' AND t.enabled
				AND ($2 = '' OR EXISTS (SELECT 1 FROM aip_registry.version_profiles vp
					WHERE vp.version_id = v.version_id AND vp.profile = $2)))`

// pageOf builds the page query over a visibility query: the total of
// matches, then up to $6 matches after $5 with their running byte total;
// the definition document is returned only for rows within the page's item
// and byte bounds.
func pageOf(visible string, needle bool) string {
	matched := `SELECT capability_id FROM visible`
	if needle {
		matched = `SELECT d.capability_id FROM visible JOIN aip_registry.capability_definitions d USING (capability_id)
	WHERE strpos(d.search_text, $4) > 0`
	} else {
		matched += ` WHERE $4 = ''`
	}
	return `WITH visible AS (` + visible + `),
matched AS (` + matched + `),
page AS (
	SELECT d.capability_id, d.contract_digest, d.schema_digest,
		row_number() OVER (ORDER BY d.capability_id) AS n,
		sum(d.size_bytes) OVER (ORDER BY d.capability_id) AS bytes
	FROM (SELECT capability_id FROM matched WHERE capability_id > $5 ORDER BY capability_id LIMIT $6) m
	JOIN aip_registry.capability_definitions d USING (capability_id)
)
SELECT (SELECT count(*) FROM matched), p.capability_id, p.contract_digest, p.schema_digest,
	CASE WHEN p.n <= $7 AND p.bytes <= $8 THEN d.capability END
FROM (VALUES (1)) AS one (x)
LEFT JOIN page p ON true
LEFT JOIN aip_registry.capability_definitions d ON d.capability_id = p.capability_id
ORDER BY p.capability_id`
}

var (
	tenantPage         = pageOf(tenantVisible, false)
	tenantPageSearch   = pageOf(tenantVisible, true)
	internalPage       = pageOf(internalVisible, false)
	internalPageSearch = pageOf(internalVisible, true)
)

// catalogQuery selects one catalog page.
type catalogQuery struct {
	rc           registry.ReadContext
	profile      string
	capabilityID string
	needle       string
	after        string
	limit        int
	maxBytes     int
}

// pageResult is a page as read, before the cursor check.
type pageResult struct {
	revision uint64
	total    int
	defs     []registry.CapabilityDefinition
	more     bool // a match beyond the page exists
}

// readPage reads one page and its revision in one round trip.
func (r *Registry) readPage(ctx context.Context, q catalogQuery) (pageResult, error) {
	sql := tenantPage
	switch {
	case q.rc.Internal && q.needle != "":
		sql = internalPageSearch
	case q.rc.Internal:
		sql = internalPage
	case q.needle != "":
		sql = tenantPageSearch
	}
	b := &pgx.Batch{}
	b.Queue(lockCatalogShared, lockClass, lockCatalog)
	var res pageResult
	b.Queue(selectRevision).QueryRow(func(row pgx.Row) error {
		var err error
		res.revision, err = scanUint(row)
		return err
	})
	b.Queue(sql, q.rc.TenantID, q.profile, q.capabilityID, q.needle, q.after, q.limit+1, q.limit, q.maxBytes).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			var (
				total      int64
				id, cd, sd *string
				doc        []byte
			)
			if err := rows.Scan(&total, &id, &cd, &sd, &doc); err != nil {
				return err
			}
			res.total = int(total)
			switch {
			case id == nil:
			case doc == nil:
				res.more = true
			default:
				var c aip.Capability
				if err := json.Unmarshal(doc, &c); err != nil {
					return fmt.Errorf("decode the stored definition of %s: %w", *id, err)
				}
				res.defs = append(res.defs, registry.CapabilityDefinition{Capability: c, ContractDigest: *cd, SchemaDigest: *sd})
			}
		}
		return rows.Err()
	})
	conn, err := r.acquire(ctx, r.data, "read catalog")
	if err != nil {
		return pageResult{}, err
	}
	defer conn.Release()
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return pageResult{}, storageErr("read catalog", err)
	}
	return res, nil
}

// Capability implements registry.Catalog.
func (r *Registry) Capability(ctx context.Context, capabilityID string, rc registry.ReadContext) (registry.ResolvedCapability, error) {
	if err := ctx.Err(); err != nil {
		return registry.ResolvedCapability{}, err
	}
	notFound := fmt.Errorf("capability %s: %w", capabilityID, registry.ErrNotFound)
	if rc.Empty() || capabilityID == "" || len(capabilityID) > registry.MaxIdentifierBytes {
		return registry.ResolvedCapability{}, notFound
	}
	res, err := r.readPage(ctx, catalogQuery{rc: rc, capabilityID: capabilityID, limit: 1, maxBytes: math.MaxInt32})
	if err != nil {
		return registry.ResolvedCapability{}, err
	}
	if len(res.defs) == 0 {
		return registry.ResolvedCapability{}, notFound
	}
	return registry.ResolvedCapability{Definition: res.defs[0], CatalogRevision: res.revision}, nil
}

// QueryCapabilities implements registry.Catalog.
func (r *Registry) QueryCapabilities(ctx context.Context, q registry.CatalogQuery, rc registry.ReadContext) (registry.CapabilityPage, error) {
	if err := ctx.Err(); err != nil {
		return registry.CapabilityPage{}, err
	}
	if err := q.Validate(); err != nil {
		return registry.CapabilityPage{}, err
	}
	after := ""
	if q.Cursor != "" {
		_, after, _ = registry.ParseCursor(q.Cursor) // validated above
	}
	limit := r.limits.ClampPageSize(q.Limit)
	if rc.Empty() {
		rev, err := r.CatalogRevision(ctx)
		if err != nil {
			return registry.CapabilityPage{}, err
		}
		if _, err := registry.CheckCursor(q.Cursor, rev); err != nil {
			return registry.CapabilityPage{}, err
		}
		return registry.CapabilityPage{CatalogRevision: rev, Capabilities: []registry.CapabilityDefinition{}}, nil
	}
	res, err := r.readPage(ctx, catalogQuery{rc: rc, profile: q.Profile, capabilityID: q.CapabilityID, needle: q.SearchNeedle(),
		after: after, limit: limit, maxBytes: r.limits.MaxPageBytes})
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	if _, err := registry.CheckCursor(q.Cursor, res.revision); err != nil {
		return registry.CapabilityPage{}, err
	}
	page := registry.CapabilityPage{CatalogRevision: res.revision, Capabilities: res.defs, Total: res.total}
	if page.Capabilities == nil {
		page.Capabilities = []registry.CapabilityDefinition{}
	}
	if res.more {
		if len(res.defs) == 0 {
			return registry.CapabilityPage{}, fmt.Errorf("%w: the next catalog definition after %q is larger than a page of %d bytes holds",
				registry.ErrStorage, after, r.limits.MaxPageBytes)
		}
		page.NextCursor = registry.Cursor(res.revision, res.defs[len(res.defs)-1].Capability.ID)
	}
	return page, nil
}
