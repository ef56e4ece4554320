// Package memregistry is the deterministic in-memory registry backend, for
// embedded and development fleets and for conformance work. It implements
// all five registry contracts and the event log (registry.EventLog),
// serialises every operation with one mutex, takes time from an injected
// clock, and orders route candidates exactly as registry.CompareCandidates
// (binding priority first), like every backend.
//
// State lives only in memory and is lost with the process. Records are
// indexed (bindings by tenant and capability in priority order, replicas by
// instance, live reservations by replica) so resolution and catalog pages do
// not scan the fleet; tenant catalog views are cached per catalog revision.
// Each tenant's event log is a slice in sequence order (1, 2, 3, …),
// indexed by event ID; Snapshot and Restore carry it.
package memregistry

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// Config configures a Registry.
type Config struct {
	// Now is the clock every time-dependent rule uses: lease validity,
	// circuit intervals, assignment and admission times, fleet status.
	// Defaults to time.Now.
	Now func() time.Time
	// Limits bounds manifests and catalog pages; zero fields take the
	// registry defaults.
	Limits registry.Limits
	// Logger receives Restore's warnings about stored records it kept
	// that new writes are refused. Defaults to a logger that discards.
	Logger *slog.Logger
}

// Registry is the in-memory backend. Its zero value is not usable; call New.
type Registry struct {
	now      func() time.Time
	limits   registry.Limits
	log      *slog.Logger
	implicit registry.AdmissionPolicy

	mu sync.Mutex
	// state is everything the registry holds, guarded by mu. Restore
	// replaces it in one assignment, so a field added here is carried by
	// Restore without further code (and must be rebuilt by load).
	state
}

// state is the mutable state of a Registry: records, their indexes, the
// route ledger, cached catalog views, lifecycle claims and route history.
type state struct {
	revision  uint64
	policies  map[string]*registry.AdmissionPolicy
	types     map[string]*typeEntry
	versions  map[string]*versionEntry
	releases  map[[2]string]string // (type ID, version string) -> version ID
	artifacts map[string]string    // artifact digest -> version ID
	defs      map[string]*defEntry
	instances map[string]*instanceEntry
	bindings  map[registry.BindingKey]*bindingEntry
	tenants   map[string]*tenantEntry
	replicas  map[string]*replicaEntry
	live      map[string]*replicaEntry // replicas that are not offline
	routes    map[string]*routeEntry
	counters  map[scopeID]uint32
	// Catalog views, ordered by capability ID: per tenant and profile, and
	// internal per profile. A write drops exactly the views it can change.
	// views counts them all: the profile is a caller's query parameter,
	// so the cache is bounded by views, not by tenants (maxViews).
	tenantViews   map[string]map[string][]*defEntry
	internalViews map[string][]*defEntry
	views         int
	// Lifecycle replay claims (lifecycle.go), created on first use.
	lc *lifecycleState
	// Superseded assignments by action ID (reroute.go), created on first
	// use.
	history map[string][]registry.RouteAssignment
	// Event logs by tenant (events.go).
	events map[string]*eventLog
}

// newState returns the state of an empty registry at catalog revision 0.
func newState() state {
	return state{
		policies:      make(map[string]*registry.AdmissionPolicy),
		types:         make(map[string]*typeEntry),
		versions:      make(map[string]*versionEntry),
		releases:      make(map[[2]string]string),
		artifacts:     make(map[string]string),
		defs:          make(map[string]*defEntry),
		instances:     make(map[string]*instanceEntry),
		bindings:      make(map[registry.BindingKey]*bindingEntry),
		tenants:       make(map[string]*tenantEntry),
		replicas:      make(map[string]*replicaEntry),
		live:          make(map[string]*replicaEntry),
		routes:        make(map[string]*routeEntry),
		counters:      make(map[scopeID]uint32),
		tenantViews:   make(map[string]map[string][]*defEntry),
		internalViews: make(map[string][]*defEntry),
		events:        make(map[string]*eventLog),
	}
}

// Compile-time guards: Registry is the in-memory implementation of the five
// registry contracts and of the orphan settlement and event log beside them.
var (
	_ registry.Catalog       = (*Registry)(nil)
	_ registry.Resolver      = (*Registry)(nil)
	_ registry.Reader        = (*Registry)(nil)
	_ registry.Administrator = (*Registry)(nil)
	_ registry.FleetStatus   = (*Registry)(nil)
	_ registry.OrphanSettler = (*Registry)(nil)
	_ registry.EventLog      = (*Registry)(nil)
)

type typeEntry struct{ rec registry.ConnectorType }

type versionEntry struct {
	rec      registry.ConnectorVersion
	typ      *typeEntry
	caps     map[string]struct{}
	profiles map[string]struct{}
}

func (v *versionEntry) implements(capabilityID string) bool {
	_, ok := v.caps[capabilityID]
	return ok
}

func (v *versionEntry) lists(profile string) bool {
	if profile == "" {
		return true
	}
	_, ok := v.profiles[profile]
	return ok
}

// usable reports whether the version is active and its type enabled.
func (v *versionEntry) usable() bool {
	return v.rec.Status == registry.VersionActive && v.typ.rec.Enabled
}

type defEntry struct {
	def      registry.CapabilityDefinition
	size     int
	search   string
	versions []*versionEntry
}

type instanceEntry struct {
	rec      registry.ConnectorInstance
	version  *versionEntry
	replicas []*replicaEntry          // by replica ID
	bindings map[string]*bindingEntry // by capability ID
}

type bindingEntry struct {
	rec      registry.CapabilityBinding
	inst     *instanceEntry
	scopeKey string
}

type replicaEntry struct {
	rec      registry.ConnectorReplica
	inst     *instanceEntry
	reserved map[string]*routeEntry // live reservations by action ID
}

type routeEntry struct {
	// a is the assignment; a.HandOut is the route's last hand-out.
	a        registry.RouteAssignment
	replica  *replicaEntry
	reserved bool
	retry    bool
	last     registry.RouteSettlement
	// resolvedAgain is set once a Resolve returned this assignment after
	// the one that created it: it can no longer be rerouted (reroute.go).
	resolvedAgain bool
	// handedOut is when the reservation was last handed out (see
	// registry.RouteReservation.HandedOutAt); meaningful while reserved.
	handedOut time.Time
	// reservedBy is the hand-out that made the current reservation:
	// settlements of hand-outs before it change nothing
	// (registry.SettlesReservation); meaningful while reserved.
	reservedBy uint64
	// claim is the last hand-out's claim (registry.RouteRequest.Claim;
	// "" for none), which ReleaseUnsent matches.
	claim string
}

func (rt *routeEntry) scopes() []registry.AdmissionScope { return rt.a.Admission.Scopes(rt.retry) }

// tenantEntry indexes one tenant's bindings by capability.
type tenantEntry struct {
	caps  map[string]*tenantCap
	order []*tenantCap // by capability ID
}

// tenantCap is one capability the tenant has bindings for.
type tenantCap struct {
	def      *defEntry
	bindings []*bindingEntry // by (priority, instance ID)
}

type scopeID struct {
	kind registry.AdmissionScopeKind
	key  string
}

// maxViews bounds the cached catalog views, tenant and internal, of every
// profile; the cache is dropped when full.
const maxViews = 4096

// New returns an empty registry at catalog revision 0.
func New(cfg Config) (*Registry, error) {
	if err := cfg.Limits.Validate(); err != nil {
		return nil, err
	}
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registry{
		now:      now,
		limits:   cfg.Limits.WithDefaults(),
		log:      log,
		implicit: registry.ImplicitAdmissionPolicy(),
		state:    newState(),
	}, nil
}

// publish advances the catalog revision after a catalog write.
func (r *Registry) publish() { r.revision++ }

// Which cached catalog views a write can change.
const (
	viewsNone     = iota
	viewsInternal // a new version: internal views only (no instance uses it yet)
	viewsAll      // version status or type state: any view
)

func (r *Registry) dropViews(scope int) {
	switch scope {
	case viewsAll:
		clear(r.tenantViews)
		clear(r.internalViews)
		r.views = 0
	case viewsInternal:
		r.views -= len(r.internalViews)
		clear(r.internalViews)
	}
}

// dropTenantViews forgets one tenant's views after a write to its
// instances or bindings.
func (r *Registry) dropTenantViews(tenant string) {
	r.views -= len(r.tenantViews[tenant])
	delete(r.tenantViews, tenant)
}

// makeRoomForView drops every cached view when the cache holds maxViews.
func (r *Registry) makeRoomForView() {
	if r.views >= maxViews {
		r.dropViews(viewsAll)
	}
	r.views++
}

func (r *Registry) clock() time.Time { return registry.Millis(r.now()) }

// chainValid reports whether a binding passes the whole tenant chain: it is
// enabled, its instance is enabled and the tenant's, the instance's version
// is active, implements the capability, and its type is enabled.
func chainValid(b *bindingEntry) bool {
	inst := b.inst
	return b.rec.Enabled && inst.rec.Status == registry.InstanceEnabled && inst.rec.TenantID == b.rec.TenantID &&
		inst.version.usable() && inst.version.implements(b.rec.CapabilityID)
}

// policyFor returns the admission policy of a binding.
func (r *Registry) policyFor(b *bindingEntry) *registry.AdmissionPolicy {
	if b.rec.QuotaPolicyRef == "" {
		return &r.implicit
	}
	return r.policies[b.rec.QuotaPolicyRef]
}

// ---------------------------------------------------------------- Reader

// ConnectorType implements registry.Reader.
func (r *Registry) ConnectorType(ctx context.Context, id string) (registry.ConnectorType, error) {
	if err := ctx.Err(); err != nil {
		return registry.ConnectorType{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.types[id]
	if !ok {
		return registry.ConnectorType{}, fmt.Errorf("connector type %s: %w", id, registry.ErrNotFound)
	}
	return t.rec, nil
}

// ConnectorVersion implements registry.Reader.
func (r *Registry) ConnectorVersion(ctx context.Context, id string) (registry.ConnectorVersion, error) {
	if err := ctx.Err(); err != nil {
		return registry.ConnectorVersion{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.versions[id]
	if !ok {
		return registry.ConnectorVersion{}, fmt.Errorf("connector version %s: %w", id, registry.ErrNotFound)
	}
	return v.rec.Clone(), nil
}

// ConnectorInstance implements registry.Reader.
func (r *Registry) ConnectorInstance(ctx context.Context, id string) (registry.ConnectorInstance, error) {
	if err := ctx.Err(); err != nil {
		return registry.ConnectorInstance{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.instances[id]
	if !ok {
		return registry.ConnectorInstance{}, fmt.Errorf("connector instance %s: %w", id, registry.ErrNotFound)
	}
	return i.rec, nil
}

// ConnectorReplica implements registry.Reader.
func (r *Registry) ConnectorReplica(ctx context.Context, id string) (registry.ConnectorReplica, error) {
	if err := ctx.Err(); err != nil {
		return registry.ConnectorReplica{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rep, ok := r.replicas[id]
	if !ok {
		return registry.ConnectorReplica{}, fmt.Errorf("connector replica %s: %w", id, registry.ErrNotFound)
	}
	return rep.rec, nil
}

// CapabilityBinding implements registry.Reader.
func (r *Registry) CapabilityBinding(ctx context.Context, key registry.BindingKey) (registry.CapabilityBinding, error) {
	if err := ctx.Err(); err != nil {
		return registry.CapabilityBinding{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.bindings[key]
	if !ok {
		return registry.CapabilityBinding{}, fmt.Errorf("capability binding %s: %w", key, registry.ErrNotFound)
	}
	return b.rec, nil
}

// AdmissionPolicy implements registry.Reader.
func (r *Registry) AdmissionPolicy(ctx context.Context, ref string) (registry.AdmissionPolicy, error) {
	if err := ctx.Err(); err != nil {
		return registry.AdmissionPolicy{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.policies[ref]
	if !ok {
		return registry.AdmissionPolicy{}, fmt.Errorf("admission policy %s: %w", ref, registry.ErrNotFound)
	}
	return *p, nil
}

// CatalogRevision implements registry.Reader.
func (r *Registry) CatalogRevision(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.revision, nil
}

// ---------------------------------------------------------------- Catalog

// Capability implements registry.Catalog.
func (r *Registry) Capability(ctx context.Context, capabilityID string, rc registry.ReadContext) (registry.ResolvedCapability, error) {
	if err := ctx.Err(); err != nil {
		return registry.ResolvedCapability{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var d *defEntry
	switch {
	case rc.Internal:
		if e, ok := r.defs[capabilityID]; ok && internalVisible(e, "") {
			d = e
		}
	case rc.TenantID != "":
		if te := r.tenants[rc.TenantID]; te != nil {
			if tc := te.caps[capabilityID]; tc != nil && tenantVisible(tc, "") {
				d = tc.def
			}
		}
	}
	if d == nil {
		return registry.ResolvedCapability{}, fmt.Errorf("capability %s: %w", capabilityID, registry.ErrNotFound)
	}
	return registry.ResolvedCapability{Definition: d.def.Clone(), CatalogRevision: r.revision}, nil
}

// internalVisible: some active version of an enabled type implements the
// definition (and lists the profile).
func internalVisible(d *defEntry, profile string) bool {
	for _, v := range d.versions {
		if v.usable() && v.lists(profile) {
			return true
		}
	}
	return false
}

// tenantVisible: some binding of the tenant for the capability passes the
// whole chain (and its version lists the profile).
func tenantVisible(tc *tenantCap, profile string) bool {
	for _, b := range tc.bindings {
		if chainValid(b) && b.inst.version.lists(profile) {
			return true
		}
	}
	return false
}

// view returns the definitions visible to a read context, ordered by
// capability ID. Views are cached until a write that can change them.
func (r *Registry) view(rc registry.ReadContext, profile string) []*defEntry {
	switch {
	case rc.Internal:
		if v, ok := r.internalViews[profile]; ok {
			return v
		}
		list := make([]*defEntry, 0, len(r.defs))
		for _, d := range r.defs {
			if internalVisible(d, profile) {
				list = append(list, d)
			}
		}
		slices.SortFunc(list, func(a, b *defEntry) int { return strings.Compare(a.def.Capability.ID, b.def.Capability.ID) })
		r.makeRoomForView()
		r.internalViews[profile] = list
		return list
	case rc.TenantID != "":
		byProfile := r.tenantViews[rc.TenantID]
		if v, ok := byProfile[profile]; ok {
			return v
		}
		te := r.tenants[rc.TenantID]
		if te == nil {
			return nil
		}
		list := make([]*defEntry, 0, len(te.order))
		for _, tc := range te.order {
			if tenantVisible(tc, profile) {
				list = append(list, tc.def)
			}
		}
		r.makeRoomForView()
		if byProfile = r.tenantViews[rc.TenantID]; byProfile == nil {
			byProfile = make(map[string][]*defEntry, 1)
			r.tenantViews[rc.TenantID] = byProfile
		}
		byProfile[profile] = list
		return list
	}
	return nil
}

// QueryCapabilities implements registry.Catalog.
func (r *Registry) QueryCapabilities(ctx context.Context, q registry.CatalogQuery, rc registry.ReadContext) (registry.CapabilityPage, error) {
	if err := ctx.Err(); err != nil {
		return registry.CapabilityPage{}, err
	}
	if err := q.Validate(); err != nil {
		return registry.CapabilityPage{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	page := registry.CapabilityPage{CatalogRevision: r.revision, Capabilities: []registry.CapabilityDefinition{}}
	after, err := registry.CheckCursor(q.Cursor, r.revision)
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	list := r.view(rc, q.Profile)
	if q.CapabilityID != "" {
		i, found := slices.BinarySearchFunc(list, q.CapabilityID, func(d *defEntry, id string) int { return strings.Compare(d.def.Capability.ID, id) })
		if !found {
			return page, nil
		}
		list = list[i : i+1]
	}
	needle := q.SearchNeedle()
	match := func(d *defEntry) bool { return needle == "" || strings.Contains(d.search, needle) }
	if needle == "" {
		page.Total = len(list)
	} else {
		for _, d := range list {
			if match(d) {
				page.Total++
			}
		}
	}
	start := 0
	if after != "" {
		start, _ = slices.BinarySearchFunc(list, after, func(d *defEntry, id string) int { return strings.Compare(d.def.Capability.ID, id) })
		if start < len(list) && list[start].def.Capability.ID == after {
			start++
		}
	}
	err = registry.CutPage(&page, r.revision, r.limits.ClampPageSize(q.Limit), r.limits.MaxPageBytes,
		func(yield func(*registry.CapabilityDefinition, int) bool) {
			for _, d := range list[start:] {
				if match(d) && !yield(&d.def, d.size) {
					return
				}
			}
		})
	if err != nil {
		return registry.CapabilityPage{}, err
	}
	return page, nil
}

// ---------------------------------------------------------------- Administrator

// PutAdmissionPolicy implements registry.Administrator.
func (r *Registry) PutAdmissionPolicy(ctx context.Context, p registry.AdmissionPolicy) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if stored, ok := r.policies[p.PolicyRef]; ok {
		changed, err := registry.CheckPolicyUpdate(stored, &p)
		if err != nil || !changed {
			return err
		}
	}
	r.policies[p.PolicyRef] = &p
	r.publish()
	return nil
}

// PutConnectorType implements registry.Administrator.
func (r *Registry) PutConnectorType(ctx context.Context, t registry.ConnectorType) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := t.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if stored, ok := r.types[t.ID]; ok {
		return registry.CheckTypePut(&stored.rec, &t)
	}
	r.types[t.ID] = &typeEntry{rec: t}
	r.publish()
	return nil
}

// SetConnectorTypeEnabled implements registry.Administrator.
func (r *Registry) SetConnectorTypeEnabled(ctx context.Context, id string, enabled bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	t, ok := r.types[id]
	if !ok {
		return fmt.Errorf("connector type %s: %w", id, registry.ErrNotFound)
	}
	if t.rec.Enabled != enabled {
		t.rec.Enabled = enabled
		r.publish()
		r.dropViews(viewsAll)
	}
	return nil
}

// AdmitVersion implements registry.Administrator.
func (r *Registry) AdmitVersion(ctx context.Context, v registry.ConnectorVersion) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p, err := registry.PrepareVersion(v, r.limits)
	if err != nil {
		return err
	}
	v = p.Version
	r.mu.Lock()
	defer r.mu.Unlock()
	if stored, ok := r.versions[v.ID]; ok {
		return registry.CheckVersionReadmission(&stored.rec, &v)
	}
	t, ok := r.types[v.ConnectorTypeID]
	if !ok {
		return registry.MissingReference(registry.RecordConnectorVersion, v.ID, "connector_type_id", "connector type", v.ConnectorTypeID)
	}
	if err := registry.CheckVersionAdmission(&t.rec, &v); err != nil {
		return err
	}
	if other, ok := r.releases[[2]string{v.ConnectorTypeID, v.Version}]; ok {
		return registry.DuplicateRelease(&v, other)
	}
	if other, ok := r.artifacts[v.Attestation.ArtifactDigest]; ok {
		return registry.DuplicateArtifact(&v, other)
	}
	for i, d := range p.Definitions {
		if stored, ok := r.defs[d.Capability.ID]; ok {
			if err := registry.CheckDefinition(v.ID, i, &stored.def, &d); err != nil {
				return err
			}
		}
	}
	v.AdmittedAt = r.clock()
	e := newVersionEntry(v, t)
	for i, d := range p.Definitions {
		de, ok := r.defs[d.Capability.ID]
		if !ok {
			de = &defEntry{def: d, size: p.Sizes[i], search: registry.SearchText(&d)}
			r.defs[d.Capability.ID] = de
		}
		de.versions = append(de.versions, e)
	}
	r.addVersion(e)
	r.publish()
	r.dropViews(viewsInternal)
	return nil
}

// newVersionEntry indexes a version's capabilities and profiles. The
// capabilities are the manifest's, one definition each.
func newVersionEntry(v registry.ConnectorVersion, t *typeEntry) *versionEntry {
	e := &versionEntry{rec: v, typ: t, caps: make(map[string]struct{}, len(v.Manifest.Capabilities)),
		profiles: make(map[string]struct{}, len(v.Manifest.Profiles))}
	for _, c := range v.Manifest.Capabilities {
		e.caps[c.ID] = struct{}{}
	}
	for _, prof := range v.Manifest.Profiles {
		e.profiles[prof] = struct{}{}
	}
	return e
}

// addVersion stores a new version with its release and artifact indexes.
func (r *Registry) addVersion(e *versionEntry) {
	v := &e.rec
	r.versions[v.ID] = e
	r.releases[[2]string{v.ConnectorTypeID, v.Version}] = v.ID
	r.artifacts[v.Attestation.ArtifactDigest] = v.ID
}

// SetVersionStatus implements registry.Administrator.
func (r *Registry) SetVersionStatus(ctx context.Context, id string, status registry.VersionStatus) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.versions[id]
	if !ok {
		return fmt.Errorf("connector version %s: %w", id, registry.ErrNotFound)
	}
	if err := registry.CheckVersionTransition(id, v.rec.Status, status); err != nil {
		return err
	}
	if v.rec.Status == status {
		return nil
	}
	if status == registry.VersionActive {
		if err := v.rec.Attestation.Qualify(id, &v.rec.Manifest); err != nil {
			return err
		}
	}
	v.rec.Status = status
	r.publish()
	r.dropViews(viewsAll)
	return nil
}

// PutInstance implements registry.Administrator.
func (r *Registry) PutInstance(ctx context.Context, i registry.ConnectorInstance) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := i.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	stored, exists := r.instances[i.ID]
	if exists {
		changed, err := registry.CheckInstanceUpdate(&stored.rec, &i)
		if err != nil || !changed {
			return err
		}
	} else if _, ok := r.types[i.ConnectorTypeID]; !ok {
		return registry.MissingReference(registry.RecordConnectorInstance, i.ID, "connector_type_id", "connector type", i.ConnectorTypeID)
	}
	v, ok := r.versions[i.VersionID]
	if !ok {
		return registry.MissingReference(registry.RecordConnectorInstance, i.ID, "version_id", "connector version", i.VersionID)
	}
	if !exists || stored.rec.VersionID != i.VersionID {
		if err := registry.CheckInstanceVersion(&i, &v.rec); err != nil {
			return err
		}
	}
	if exists && stored.rec.VersionID != i.VersionID {
		caps := make([]string, 0, len(stored.bindings))
		for capID, b := range stored.bindings {
			if b.rec.Enabled && !v.implements(capID) {
				caps = append(caps, capID)
			}
		}
		if len(caps) > 0 {
			slices.Sort(caps)
			return registry.VersionLacksBoundCapability(&i, caps)
		}
	}
	if exists {
		stored.rec, stored.version = i, v
	} else {
		r.instances[i.ID] = newInstanceEntry(i, v)
	}
	r.publish()
	r.dropTenantViews(i.TenantID)
	return nil
}

func newInstanceEntry(i registry.ConnectorInstance, v *versionEntry) *instanceEntry {
	return &instanceEntry{rec: i, version: v, bindings: make(map[string]*bindingEntry)}
}

// PutBinding implements registry.Administrator.
func (r *Registry) PutBinding(ctx context.Context, b registry.CapabilityBinding) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := b.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	stored, exists := r.bindings[b.Key()]
	if exists {
		changed, err := registry.CheckBindingUpdate(&stored.rec, &b)
		if err != nil || !changed {
			return err
		}
	}
	inst, ok := r.instances[b.InstanceID]
	if !ok {
		return registry.MissingReference(registry.RecordCapabilityBinding, b.Key().String(), "instance_id", "connector instance", b.InstanceID)
	}
	if err := registry.CheckBindingTarget(&b, &inst.rec, &inst.version.rec, !exists); err != nil {
		return err
	}
	if b.QuotaPolicyRef != "" {
		if _, ok := r.policies[b.QuotaPolicyRef]; !ok {
			return registry.MissingReference(registry.RecordCapabilityBinding, b.Key().String(), "quota_policy_ref", "admission policy", b.QuotaPolicyRef)
		}
	}
	var tc *tenantCap
	if exists {
		stored.rec = b
		tc = r.tenantCap(b.TenantID, b.CapabilityID)
	} else {
		tc = r.addBinding(b, inst)
	}
	sortTenantBindings(tc)
	r.publish()
	r.dropTenantViews(b.TenantID)
	return nil
}

// addBinding stores a new binding of inst and appends it to its tenant's
// index entry, which it returns; the caller sorts that entry.
func (r *Registry) addBinding(b registry.CapabilityBinding, inst *instanceEntry) *tenantCap {
	e := &bindingEntry{rec: b, inst: inst, scopeKey: registry.BindingScopeKey(b.Key())}
	r.bindings[b.Key()] = e
	inst.bindings[b.CapabilityID] = e
	tc := r.tenantCap(b.TenantID, b.CapabilityID)
	tc.bindings = append(tc.bindings, e)
	return tc
}

// sortTenantBindings puts a tenant's bindings for a capability in route
// order: by priority, then instance ID.
func sortTenantBindings(tc *tenantCap) {
	slices.SortFunc(tc.bindings, func(x, y *bindingEntry) int {
		return cmp.Or(cmp.Compare(x.rec.Priority, y.rec.Priority), strings.Compare(x.rec.InstanceID, y.rec.InstanceID))
	})
}

// tenantCap returns the tenant's index entry for a capability, creating it.
// The capability has a definition: bindings are only put for capabilities
// their instance's version implements.
func (r *Registry) tenantCap(tenant, capabilityID string) *tenantCap {
	te := r.tenants[tenant]
	if te == nil {
		te = &tenantEntry{caps: make(map[string]*tenantCap)}
		r.tenants[tenant] = te
	}
	tc := te.caps[capabilityID]
	if tc == nil {
		tc = &tenantCap{def: r.defs[capabilityID]}
		te.caps[capabilityID] = tc
		i, _ := slices.BinarySearchFunc(te.order, capabilityID, func(x *tenantCap, id string) int { return strings.Compare(x.def.def.Capability.ID, id) })
		te.order = slices.Insert(te.order, i, tc)
	}
	return tc
}

// PutReplica implements registry.Administrator. It never advances the
// catalog revision.
func (r *Registry) PutReplica(ctx context.Context, rep registry.ConnectorReplica) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rep.Normalize()
	if err := rep.Validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if stored, ok := r.replicas[rep.ID]; ok {
		registry.AdminOffline(&stored.rec, &rep, r.clock())
		changed, err := registry.CheckReplicaUpdate(&stored.rec, &rep)
		if err != nil || !changed {
			return err
		}
		stored.rec = rep
		r.track(stored)
		return nil
	}
	inst, ok := r.instances[rep.InstanceID]
	if !ok {
		return registry.MissingReference(registry.RecordConnectorReplica, rep.ID, "instance_id", "connector instance", rep.InstanceID)
	}
	if err := registry.CheckNewReplica(&rep, &inst.rec); err != nil {
		return err
	}
	registry.AdminOffline(nil, &rep, r.clock())
	r.addReplica(rep, inst)
	return nil
}

// addReplica stores a new replica of inst, in the instance's replicas by
// ID and, unless it is offline, in the live set.
func (r *Registry) addReplica(rep registry.ConnectorReplica, inst *instanceEntry) *replicaEntry {
	e := &replicaEntry{rec: rep, inst: inst, reserved: make(map[string]*routeEntry)}
	r.replicas[rep.ID] = e
	i, _ := slices.BinarySearchFunc(inst.replicas, rep.ID, func(x *replicaEntry, id string) int { return strings.Compare(x.rec.ID, id) })
	inst.replicas = slices.Insert(inst.replicas, i, e)
	r.track(e)
	return e
}

// track keeps the set of replicas that are not offline.
func (r *Registry) track(e *replicaEntry) {
	if e.rec.Status == aip.ReplicaOffline {
		delete(r.live, e.rec.ID)
	} else {
		r.live[e.rec.ID] = e
	}
}

// ---------------------------------------------------------------- Resolver

// Resolve implements registry.Resolver.
func (r *Registry) Resolve(ctx context.Context, req registry.RouteRequest) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	if err := req.Validate(); err != nil {
		return registry.RouteAssignment{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	if rt, ok := r.routes[req.ActionID]; ok {
		if err := r.resume(rt, &req, now); err != nil {
			return registry.RouteAssignment{}, err
		}
		rt.resolvedAgain = true
		rt.handedOut = registry.Millis(now)
		rt.claim = req.Claim
		return rt.a.Clone(), nil
	}
	return r.assign(&req, now)
}

// resume hands an existing route out again: it takes the next hand-out
// number, and reserves the pinned scopes and replica again (made by that
// hand-out) if they were released.
func (r *Registry) resume(rt *routeEntry, req *registry.RouteRequest, now time.Time) error {
	a := &rt.a
	if a.TenantID != req.TenantID || a.CapabilityID != req.CapabilityID {
		return registry.RouteConflict(a, req)
	}
	if rt.reserved {
		a.HandOut++
		return nil
	}
	rep := rt.replica
	v := r.versions[a.VersionID]
	if why := registry.PinnedReplicaUnusable(&rep.rec, &rep.inst.rec, &v.rec, v.typ.rec.Enabled, now); why != "" {
		return registry.PinnedReplicaUnavailable(a, why)
	}
	if err := r.reserve(a.Admission.Scopes(true)); err != nil {
		return err
	}
	rep.rec.ActiveAssignments++
	rep.reserved[a.ActionID] = rt
	a.HandOut++
	rt.reserved, rt.retry, rt.last, rt.reservedBy = true, true, "", a.HandOut
	return nil
}

// assign selects, reserves and records a new route.
func (r *Registry) assign(req *registry.RouteRequest, now time.Time) (registry.RouteAssignment, error) {
	bestB, bestR, err := r.pick(req, now, "")
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	rt, err := r.place(req, bestB, bestR, nil, now)
	if err != nil {
		return registry.RouteAssignment{}, err
	}
	return rt.a.Clone(), nil
}

// place reserves a new route of req to replica rep of binding b and makes
// it the action's route. A reroute passes the route it replaces as old: if
// old still holds its reservation, that is released as cancelled first (the
// new route may need its scopes), but only once the new reservation is
// known to fit, so a refusal changes nothing.
func (r *Registry) place(req *registry.RouteRequest, b *bindingEntry, rep *replicaEntry, old *routeEntry, now time.Time) (*routeEntry, error) {
	inst := b.inst
	admission := registry.NewReservation(r.policyFor(b), &b.rec, inst.rec.ConnectorTypeID, b.scopeKey)
	if old != nil && old.reserved {
		if err := r.fits(admission.BaseScopes, old.scopes()); err != nil {
			return nil, err
		}
		r.unreserve(old, registry.SettlementCancelled)
	}
	if err := r.reserve(admission.BaseScopes); err != nil {
		return nil, err
	}
	rep.rec.ActiveAssignments++
	handOut := uint64(1) // a reroute's assignment goes on with the action's numbers
	if old != nil {
		handOut = old.a.HandOut + 1
	}
	rt := &routeEntry{
		a:          registry.NewAssignment(req, &b.rec, &inst.version.rec, &rep.rec, r.revision, admission, aip.NewID(aip.PrefixRoute), now),
		replica:    rep,
		reserved:   true,
		handedOut:  registry.Millis(now),
		reservedBy: handOut,
		claim:      req.Claim,
	}
	rt.a.HandOut = handOut // NewAssignment's 1 for a new route
	r.routes[req.ActionID] = rt
	rep.reserved[req.ActionID] = rt
	return rt, nil
}

// pick selects the replica of a new route, skipping the replica excluded
// (a reroute's refusing replica; "" for none).
func (r *Registry) pick(req *registry.RouteRequest, now time.Time, excluded string) (*bindingEntry, *replicaEntry, error) {
	pref := &req.Topology
	var (
		firstValid *bindingEntry
		best       registry.RouteCandidate
		bestB      *bindingEntry
		bestR      *replicaEntry
	)
	var bindings []*bindingEntry
	if te := r.tenants[req.TenantID]; te != nil {
		if tc := te.caps[req.CapabilityID]; tc != nil {
			bindings = tc.bindings
		}
	}
	for _, b := range bindings {
		if !chainValid(b) || !r.policyFor(b).Enabled {
			continue
		}
		if firstValid == nil {
			firstValid = b
		}
		if bestR != nil && b.rec.Priority > best.Priority {
			break // bindings are in priority order: no later one can win
		}
		inst := b.inst
		for _, rep := range inst.replicas {
			if rep.rec.ID == excluded || !registry.ReplicaEligible(&rep.rec, inst.rec.VersionID, pref, now) {
				continue
			}
			c := registry.RouteCandidate{Priority: b.rec.Priority, InstanceID: inst.rec.ID, ReplicaID: rep.rec.ID, Topology: rep.rec.Topology, Active: rep.rec.ActiveAssignments}
			if bestR == nil || registry.CompareCandidates(pref, req.ActionID, &c, &best) < 0 {
				best, bestB, bestR = c, b, rep
			}
		}
	}
	if firstValid == nil {
		return nil, nil, fmt.Errorf("%w: tenant %s has no usable binding for capability %s", registry.ErrBindingUnavailable, req.TenantID, req.CapabilityID)
	}
	if bestR == nil {
		return nil, nil, fmt.Errorf("%w: no eligible replica for capability %s of tenant %s (first binding: instance %s)",
			registry.ErrReplicaUnavailable, req.CapabilityID, req.TenantID, firstValid.rec.InstanceID)
	}
	return bestB, bestR, nil
}

// reserve takes one unit of every scope, or none when one is full.
func (r *Registry) reserve(scopes []registry.AdmissionScope) error {
	if err := r.fits(scopes, nil); err != nil {
		return err
	}
	for _, s := range scopes {
		r.counters[scopeID{s.Kind, s.Key}]++
	}
	return nil
}

// fits returns CapacityExceeded for the first of scopes that is full,
// counting the scopes in freed (about to be released) as released already.
func (r *Registry) fits(scopes, freed []registry.AdmissionScope) error {
	for _, s := range scopes {
		n := r.counters[scopeID{s.Kind, s.Key}]
		for _, f := range freed {
			if f.Kind == s.Kind && f.Key == s.Key && n > 0 {
				n--
			}
		}
		if n >= s.Limit {
			return registry.CapacityExceeded(s)
		}
	}
	return nil
}

func (r *Registry) release(scopes []registry.AdmissionScope) {
	for _, s := range scopes {
		id := scopeID{s.Kind, s.Key}
		if n := r.counters[id]; n > 1 {
			r.counters[id] = n - 1
		} else {
			delete(r.counters, id)
		}
	}
}

// unreserve releases a live reservation with an outcome.
func (r *Registry) unreserve(rt *routeEntry, outcome registry.RouteSettlement) {
	r.release(rt.scopes())
	rep := rt.replica
	if rep.rec.ActiveAssignments > 0 {
		rep.rec.ActiveAssignments--
	}
	delete(rep.reserved, rt.a.ActionID)
	rt.reserved, rt.last = false, outcome
}

// Assignment implements registry.Resolver.
func (r *Registry) Assignment(ctx context.Context, actionID string) (registry.RouteAssignment, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteAssignment{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[actionID]
	if !ok {
		return registry.RouteAssignment{}, registry.RouteNotFound(actionID)
	}
	return rt.a.Clone(), nil
}

// Reservation implements registry.Resolver.
func (r *Registry) Reservation(ctx context.Context, actionID string) (registry.RouteReservation, error) {
	if err := ctx.Err(); err != nil {
		return registry.RouteReservation{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[actionID]
	if !ok {
		return registry.RouteReservation{}, registry.RouteNotFound(actionID)
	}
	return reservationOf(rt), nil
}

func reservationOf(rt *routeEntry) registry.RouteReservation {
	res := registry.RouteReservation{ActionID: rt.a.ActionID, ReplicaID: rt.a.ReplicaID, AssignedAt: rt.a.AssignedAt, Reserved: rt.reserved,
		LastSettlement: rt.last, Scopes: []registry.AdmissionScope{}, HandOut: rt.a.HandOut}
	if rt.reserved {
		res.HandedOutAt = rt.handedOut
		res.Retry = rt.retry
		res.Scopes = slices.Clone(rt.scopes())
	}
	return res
}

// Settle implements registry.Resolver.
func (r *Registry) Settle(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement) error {
	return r.settle(ctx, a, outcome, 0)
}

// SettleOrphan implements registry.OrphanSettler.
func (r *Registry) SettleOrphan(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement, handOut uint64) error {
	if err := registry.CheckOrphanHandOut(a.ActionID, handOut); err != nil {
		return err
	}
	return r.settle(ctx, a, outcome, handOut)
}

// settle releases a's reservation with outcome: when orphanSeen is zero,
// only if a's hand-out settles it (registry.SettlesReservation); else only
// if the route's last hand-out is orphanSeen.
func (r *Registry) settle(ctx context.Context, a registry.RouteAssignment, outcome registry.RouteSettlement, orphanSeen uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := outcome.Check(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[a.ActionID]
	if !ok {
		return registry.RouteNotFound(a.ActionID)
	}
	if !rt.a.Equal(&a) {
		return registry.SettleFenceLost(&a)
	}
	if !rt.reserved {
		return nil
	}
	switch {
	case orphanSeen != 0 && rt.a.HandOut != orphanSeen:
		return registry.HandedOutAgain(a.ActionID, orphanSeen, rt.a.HandOut)
	case orphanSeen == 0 && !registry.SettlesReservation(a.HandOut, rt.reservedBy):
		return nil // a late settlement of an earlier hand-out: not this reservation's
	}
	r.unreserve(rt, outcome)
	rep := rt.replica
	rep.rec.Circuit = registry.ApplySettlementToCircuit(rep.rec.Circuit, outcome, &rt.a.Admission, r.clock())
	return nil
}

// ReleaseUnsent implements registry.UnsentReleaser, under the mutex, so it
// is atomic with routing, settlement and lease expiry.
func (r *Registry) ReleaseUnsent(ctx context.Context, actionID, claim string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if err := registry.CheckUnsentRelease(actionID, claim); err != nil {
		return false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rt, ok := r.routes[actionID]
	if !ok || !rt.reserved || !registry.ReleasesUnsent(claim, rt.claim, rt.a.HandOut, rt.reservedBy) {
		return false, nil
	}
	r.unreserve(rt, registry.SettlementCancelled) // the circuit is left alone
	return true, nil
}

// ---------------------------------------------------------------- FleetStatus

// ExpireStaleReplicas implements registry.FleetStatus.
func (r *Registry) ExpireStaleReplicas(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if limit < 1 {
		return 0, fmt.Errorf("%w: expiry limit %d must be at least 1", registry.ErrInvalid, limit)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	var stale []*replicaEntry
	for _, e := range r.live {
		if !e.rec.LeaseValid(now) {
			stale = append(stale, e)
		}
	}
	slices.SortFunc(stale, func(a, b *replicaEntry) int {
		return cmp.Or(a.rec.LeaseExpiresAt.Compare(b.rec.LeaseExpiresAt), strings.Compare(a.rec.ID, b.rec.ID))
	})
	stale = stale[:min(limit, len(stale))]
	for _, e := range stale {
		for _, rt := range e.reserved {
			r.unreserve(rt, registry.SettlementLeaseExpired)
		}
		registry.ExpireReplica(&e.rec, now)
		r.track(e)
	}
	return len(stale), nil
}

// ReleaseStrandedReservations implements registry.FleetStatus. It looks at
// every replica (offline ones are not indexed), which is cheap in memory.
func (r *Registry) ReleaseStrandedReservations(ctx context.Context, grace time.Duration, limit int) (registry.StrandedRelease, error) {
	var out registry.StrandedRelease
	if err := ctx.Err(); err != nil {
		return out, err
	}
	if err := registry.CheckStrandedRelease(grace, limit); err != nil {
		return out, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	cutoff := registry.StrandedCutoff(r.clock(), grace)
	var stranded []*replicaEntry
	for _, e := range r.replicas {
		if e.rec.Status != aip.ReplicaOffline || e.rec.LeaseExpiresAt.After(cutoff) {
			continue
		}
		for _, rt := range e.reserved {
			if registry.Stranded(&e.rec, rt.handedOut, cutoff) {
				stranded = append(stranded, e)
				break
			}
		}
	}
	slices.SortFunc(stranded, func(a, b *replicaEntry) int {
		return cmp.Or(a.rec.LeaseExpiresAt.Compare(b.rec.LeaseExpiresAt), strings.Compare(a.rec.ID, b.rec.ID))
	})
	stranded = stranded[:min(limit, len(stranded))]
	for _, e := range stranded {
		for _, rt := range e.reserved {
			if registry.Stranded(&e.rec, rt.handedOut, cutoff) {
				r.unreserve(rt, registry.SettlementLeaseExpired)
				out.Reservations++
			}
		}
	}
	out.Replicas = len(stranded)
	return out, nil
}

// Status implements registry.FleetStatus.
func (r *Registry) Status(ctx context.Context) (registry.FleetStatusSummary, error) {
	if err := ctx.Err(); err != nil {
		return registry.FleetStatusSummary{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	s := registry.FleetStatusSummary{CatalogRevision: r.revision, ConnectorTypes: len(r.types), ObservedAt: now}
	for _, v := range r.versions {
		if v.rec.Status == registry.VersionActive {
			s.ActiveVersions++
		}
	}
	for _, i := range r.instances {
		if i.rec.Status == registry.InstanceEnabled {
			s.EnabledInstances++
		}
	}
	for _, e := range r.replicas {
		registry.CountReplica(&s, &e.rec, now)
	}
	return s, nil
}

// Ledger implements registry.FleetStatus.
func (r *Registry) Ledger(ctx context.Context) (registry.Ledger, error) {
	if err := ctx.Err(); err != nil {
		return registry.Ledger{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := registry.Ledger{Counters: make([]registry.AdmissionCounter, 0, len(r.counters)), Reservations: []registry.RouteReservation{}}
	for id, n := range r.counters {
		l.Counters = append(l.Counters, registry.AdmissionCounter{Kind: id.kind, Key: id.key, Active: n})
	}
	for _, e := range r.replicas {
		for _, rt := range e.reserved {
			l.Reservations = append(l.Reservations, reservationOf(rt))
		}
	}
	registry.SortLedger(&l)
	return l, nil
}
