package pgregistry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"

	"github.com/jackc/pgx/v5"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Catalog reads run on the data pool as one pipelined implicit transaction:
// the shared form of the publication lock, the revision, then the page (or
// the view the page is cut from). Holding the shared lock until the page is
// read means no catalog write can publish in between, so the page and its
// total are exactly those of the revision returned with them.
//
// Views are cached per revision. A catalog revision names one catalog state
// (every effective catalog write advances it in its own transaction), so
// the set of capabilities a read context sees at revision N never changes:
// the registry keeps, for the newest revision it has read, the sorted IDs
// each (tenant or internal, profile) sees, built by the view query under
// the shared lock at that revision, and the capability definitions, which
// are immutable once published. A read then costs one round trip (shared
// lock and revision) when its view is cached, two when it is not. Replica
// churn never moves the revision, so it never invalidates a view.

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
// The lateral LIMIT 1 asks for a fast-start plan: walk the capability's
// versions by index and stop at the first usable one, instead of hashing
// every version of every capability (an EXISTS would lose the LIMIT).
const internalVisible = `SELECT d.capability_id
	FROM aip_registry.capability_definitions d
	CROSS JOIN LATERAL (SELECT 1 FROM aip_registry.version_capabilities vc
			JOIN aip_registry.connector_versions v ON v.version_id = vc.version_id
			JOIN aip_registry.connector_types t ON t.type_id = v.type_id
			WHERE vc.capability_id = d.capability_id AND v.status = 'active' AND t.enabled
				AND ($2 = '' OR EXISTS (SELECT 1 FROM aip_registry.version_profiles vp
					WHERE vp.version_id = v.version_id AND vp.profile = $2))
			LIMIT 1) AS usable
	WHERE ($1::text IS NOT NULL) AND ($3 = '' OR d.capability_id = $3)`

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

// viewOf is the view query: every capability ID a read context sees, in
// order ($3 is "").
func viewOf(visible string) string {
	return `SELECT capability_id FROM (` + visible + `) AS visible WHERE $3 = '' ORDER BY capability_id`
}

const selectDefinitions = `SELECT capability_id, contract_digest, schema_digest, capability, size_bytes, search_text
FROM aip_registry.capability_definitions WHERE capability_id = ANY($1)`

var (
	tenantView         = viewOf(tenantVisible)
	internalView       = viewOf(internalVisible)
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

// capabilitySQL is Capability without the view cache.
func (r *Registry) capabilitySQL(ctx context.Context, capabilityID string, rc registry.ReadContext) (registry.ResolvedCapability, error) {
	if err := ctx.Err(); err != nil {
		return registry.ResolvedCapability{}, err
	}
	notFound := fmt.Errorf("capability %s: %w", capabilityID, registry.ErrNotFound)
	if rc.Empty() || !registry.PossibleCapabilityID(capabilityID) {
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

// querySQL is QueryCapabilities without the view cache: the page query
// filters, counts and cuts the page in the database.
func (r *Registry) querySQL(ctx context.Context, q registry.CatalogQuery, rc registry.ReadContext) (registry.CapabilityPage, error) {
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

// Capability implements registry.Catalog.
func (r *Registry) Capability(ctx context.Context, capabilityID string, rc registry.ReadContext) (registry.ResolvedCapability, error) {
	if r.views == nil {
		return r.capabilitySQL(ctx, capabilityID, rc)
	}
	if err := ctx.Err(); err != nil {
		return registry.ResolvedCapability{}, err
	}
	notFound := fmt.Errorf("capability %s: %w", capabilityID, registry.ErrNotFound)
	if rc.Empty() || !registry.PossibleCapabilityID(capabilityID) {
		return registry.ResolvedCapability{}, notFound
	}
	rev, view, err := r.views.view(ctx, r, rc, "")
	if err != nil {
		return registry.ResolvedCapability{}, err
	}
	if _, ok := slices.BinarySearch(view, capabilityID); !ok {
		return registry.ResolvedCapability{}, notFound
	}
	defs, err := r.views.definitions(ctx, r, []string{capabilityID})
	if err != nil {
		return registry.ResolvedCapability{}, err
	}
	return registry.ResolvedCapability{Definition: defs[0].def.Clone(), CatalogRevision: rev}, nil
}

// QueryCapabilities implements registry.Catalog.
func (r *Registry) QueryCapabilities(ctx context.Context, q registry.CatalogQuery, rc registry.ReadContext) (registry.CapabilityPage, error) {
	if err := ctx.Err(); err != nil {
		return registry.CapabilityPage{}, err
	}
	if err := q.Validate(); err != nil {
		return registry.CapabilityPage{}, err
	}
	if r.views == nil {
		return r.querySQL(ctx, q, rc)
	}
	rev, view, err := r.views.view(ctx, r, rc, q.Profile)
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	after, err := registry.CheckCursor(q.Cursor, rev)
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	page := registry.CapabilityPage{CatalogRevision: rev, Capabilities: []registry.CapabilityDefinition{}}
	if q.CapabilityID != "" {
		i, ok := slices.BinarySearch(view, q.CapabilityID)
		if !ok {
			return page, nil
		}
		view = view[i : i+1]
	}
	needle := q.SearchNeedle()
	if needle != "" {
		defs, err := r.views.definitions(ctx, r, view)
		if err != nil {
			return registry.CapabilityPage{}, err
		}
		matched := make([]string, 0, len(view))
		for _, d := range defs {
			if strings.Contains(d.search, needle) {
				matched = append(matched, d.def.Capability.ID)
			}
		}
		view = matched
	}
	page.Total = len(view)
	start, _ := slices.BinarySearch(view, after)
	if start < len(view) && view[start] == after {
		start++
	}
	limit := r.limits.ClampPageSize(q.Limit)
	next := view[start:min(len(view), start+limit+1)]
	defs, err := r.views.definitions(ctx, r, next)
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	err = registry.CutPage(&page, rev, limit, r.limits.MaxPageBytes, func(yield func(*registry.CapabilityDefinition, int) bool) {
		for _, d := range defs {
			if !yield(&d.def, d.size) {
				return
			}
		}
	})
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	return page, nil
}

// Bounds of the catalog cache.
const (
	maxCachedViews    = 4096
	maxCachedDefBytes = 64 << 20
	maxInternedIDs    = 1 << 20
)

// viewKey names one catalog view.
type viewKey struct {
	tenant   string
	internal bool
	profile  string
}

// cachedDef is a published capability definition with its page size and
// search text.
type cachedDef struct {
	def    registry.CapabilityDefinition
	size   int
	search string
}

// catalogCache holds the views of the newest revision read and the
// (immutable) definitions.
type catalogCache struct {
	mu       sync.Mutex
	revision uint64
	views    map[viewKey][]string
	ids      map[string]string // interned capability IDs, shared by all views
	defs     map[string]*cachedDef
	defBytes int
	build    singleflight.Group
}

func newCatalogCache() *catalogCache {
	return &catalogCache{views: make(map[viewKey][]string), ids: make(map[string]string), defs: make(map[string]*cachedDef)}
}

// view returns the current revision and the sorted IDs rc sees at it
// (with profile, "" for any).
func (c *catalogCache) view(ctx context.Context, r *Registry, rc registry.ReadContext, profile string) (uint64, []string, error) {
	if rc.Empty() {
		rev, err := r.CatalogRevision(ctx)
		return rev, nil, err
	}
	key := viewKey{internal: rc.Internal, profile: profile}
	if !rc.Internal {
		key.tenant = rc.TenantID
	}
	conn, err := r.acquire(ctx, r.data, "read catalog")
	if err != nil {
		return 0, nil, err
	}
	defer conn.Release()
	var rev uint64
	b := &pgx.Batch{}
	b.Queue(lockCatalogShared, lockClass, lockCatalog)
	b.Queue(selectRevision).QueryRow(func(row pgx.Row) error {
		var err error
		rev, err = scanUint(row)
		return err
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return 0, nil, storageErr("read catalog", err)
	}
	if v, ok := c.lookup(rev, key); ok {
		return rev, v, nil
	}
	// Build the view under the shared lock, together with the revision it
	// belongs to (which may be newer than rev by now). Concurrent readers of
	// the same view wait for one build, which runs on the connection and
	// under the context of the reader that started it: when that reader's
	// context ends the build fails for every reader waiting for it, and a
	// reader whose own context is live builds the view again.
	type built struct {
		rev  uint64
		view []string
	}
again:
	res, err, shared := c.build.Do(fmt.Sprintf("%d\x00%t\x00%s\x00%s", rev, key.internal, key.tenant, key.profile), func() (any, error) {
		var out built
		sql := tenantView
		if key.internal {
			sql = internalView
		}
		b := &pgx.Batch{}
		b.Queue(lockCatalogShared, lockClass, lockCatalog)
		b.Queue(selectRevision).QueryRow(func(row pgx.Row) error {
			var err error
			out.rev, err = scanUint(row)
			return err
		})
		b.Queue(sql, key.tenant, key.profile, "").Query(func(rows pgx.Rows) error {
			ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
			out.view = ids
			return err
		})
		if err := conn.SendBatch(ctx, b).Close(); err != nil {
			return nil, storageErr("read catalog", err)
		}
		if out.view == nil {
			out.view = []string{}
		}
		c.store(out.rev, key, out.view)
		return out, nil
	})
	if err != nil {
		if shared && ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			goto again // another reader's build, ended by that reader's context
		}
		return 0, nil, err
	}
	bv := res.(built)
	return bv.rev, bv.view, nil
}

func (c *catalogCache) lookup(rev uint64, key viewKey) ([]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev != c.revision {
		return nil, false
	}
	v, ok := c.views[key]
	return v, ok
}

func (c *catalogCache) store(rev uint64, key viewKey, view []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case rev < c.revision:
		return // an older revision's view is of no use to later reads
	case rev > c.revision:
		clear(c.views)
		c.revision = rev
	case len(c.views) >= maxCachedViews:
		clear(c.views)
	}
	// Views of many tenants share their IDs: keep one copy of each.
	for i, id := range view {
		if s, ok := c.ids[id]; ok {
			view[i] = s
		} else if len(c.ids) < maxInternedIDs {
			c.ids[id] = id
		}
	}
	c.views[key] = view
}

// definitions returns the definitions of ids, in order, loading the ones
// not cached in one query. Every ID must be published.
func (c *catalogCache) definitions(ctx context.Context, r *Registry, ids []string) ([]*cachedDef, error) {
	out := make([]*cachedDef, len(ids))
	var missing []string
	c.mu.Lock()
	for i, id := range ids {
		if d, ok := c.defs[id]; ok {
			out[i] = d
		} else {
			missing = append(missing, id)
		}
	}
	c.mu.Unlock()
	if len(missing) == 0 {
		return out, nil
	}
	rows, err := r.data.Query(ctx, selectDefinitions, missing)
	if err != nil {
		return nil, storageErr("read capability definitions", err)
	}
	loaded := make(map[string]*cachedDef, len(missing))
	var (
		id, contract, schema, search string
		doc                          []byte
		size                         int32
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &contract, &schema, &doc, &size, &search}, func() error {
		var capability aip.Capability
		if err := json.Unmarshal(doc, &capability); err != nil {
			return fmt.Errorf("decode the stored definition of %s: %w", id, err)
		}
		loaded[id] = &cachedDef{def: registry.CapabilityDefinition{Capability: capability, ContractDigest: contract, SchemaDigest: schema},
			size: int(size), search: search}
		return nil
	})
	if err != nil {
		return nil, storageErr("read capability definitions", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		if out[i] != nil {
			continue
		}
		d, ok := loaded[id]
		if !ok {
			return nil, storageErr("read capability definitions", fmt.Errorf("capability %s is in a catalog view but has no definition", id))
		}
		out[i] = d
		if _, dup := c.defs[id]; !dup {
			if c.defBytes+d.size > maxCachedDefBytes {
				clear(c.defs)
				c.defBytes = 0
			}
			c.defs[id] = d
			c.defBytes += d.size
		}
	}
	return out, nil
}
