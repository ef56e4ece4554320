package memregistry

import (
	"cmp"
	"container/heap"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
)

// SnapshotFormat is the format field of a snapshot document.
const SnapshotFormat = "aipfleet.memregistry.snapshot/v1"

// ErrSnapshot is returned (wrapped) by Restore for a document that is not a
// usable snapshot, and for a registry that is not empty.
var ErrSnapshot = errors.New("memregistry: unusable snapshot")

// snapshot is the complete state of a Registry as JSON. Records are sorted
// by identity so equal states encode to equal bytes; definitions keep the
// order in which versions published them (the first publisher's text is
// the catalog's).
type snapshot struct {
	Format          string                       `json:"format"`
	CatalogRevision uint64                       `json:"catalog_revision"`
	Policies        []registry.AdmissionPolicy   `json:"policies"`
	Types           []registry.ConnectorType     `json:"types"`
	Versions        []registry.ConnectorVersion  `json:"versions"`
	Definitions     []snapshotDefinition         `json:"definitions"`
	Instances       []registry.ConnectorInstance `json:"instances"`
	Bindings        []registry.CapabilityBinding `json:"bindings"`
	Replicas        []registry.ConnectorReplica  `json:"replicas"`
	Routes          []snapshotRoute              `json:"routes"`
	Counters        []registry.AdmissionCounter  `json:"counters"`
	History         []snapshotHistory            `json:"history"`
	ReplayClaims    []snapshotClaim              `json:"replay_claims"`
	// Events are the tenants' event logs, by tenant, each in sequence
	// order. Absent in snapshots written before the registry kept events:
	// those restore with empty logs.
	Events []snapshotEventLog `json:"events,omitempty"`
}

type snapshotEventLog struct {
	TenantID string          `json:"tenant_id"`
	Events   []snapshotEvent `json:"events"`
	// LastSequence is the last sequence given out, which outlives pruned
	// events (absent in snapshots written before events were pruned: the
	// last event's).
	LastSequence uint64 `json:"last_sequence,omitempty"`
	// Pruned are the IDs of the events pruned from the log, by ID, with
	// when each was received, less those ForgetPrunedEvents forgot
	// (absent when there are none, and in snapshots written before pruned
	// IDs were kept).
	Pruned map[string]time.Time `json:"pruned,omitempty"`
	// PrunedDigests are the registry.RedeliveryDigests of the pruned
	// events, by ID (absent in snapshots written before they were kept:
	// those IDs restore without one, and an event delivered under one is
	// answered pruned whatever its content).
	PrunedDigests map[string][]byte `json:"pruned_digests,omitempty"`
}

type snapshotEvent struct {
	Sequence   uint64    `json:"sequence"`
	InstanceID string    `json:"instance_id"`
	ReplicaID  string    `json:"replica_id"`
	VersionID  string    `json:"version_id,omitempty"`
	ChannelID  string    `json:"channel_id"`
	Event      aip.Event `json:"event"`
	ReceivedAt time.Time `json:"received_at"`
}

type snapshotDefinition struct {
	Definition registry.CapabilityDefinition `json:"definition"`
	// VersionIDs are the versions implementing the capability, in the order
	// they were admitted.
	VersionIDs []string `json:"version_ids"`
}

type snapshotRoute struct {
	Assignment     registry.RouteAssignment `json:"assignment"`
	Reserved       bool                     `json:"reserved"`
	Retry          bool                     `json:"retry"`
	LastSettlement registry.RouteSettlement `json:"last_settlement,omitempty"`
	ResolvedAgain  bool                     `json:"resolved_again"`
	// HandedOutAt is absent in snapshots written before it was kept; a
	// route restored from one counts as handed out when it is restored,
	// the latest it can have been, so reconciliation never takes a
	// reservation for older than it is.
	HandedOutAt time.Time `json:"handed_out_at,omitzero"`
	// ReservedHandOut is the hand-out that made the reservation (the last
	// hand-out is Assignment.HandOut). Both are absent in snapshots
	// written before hand-outs were numbered: such a route's reservation
	// is settled by any hand-out, as it was then.
	ReservedHandOut uint64 `json:"reserved_hand_out,omitempty"`
	// HandOutClaim is the last hand-out's claim
	// (registry.RouteRequest.Claim), absent when it named none.
	HandOutClaim string `json:"hand_out_claim,omitempty"`
}

type snapshotHistory struct {
	ActionID    string                     `json:"action_id"`
	Assignments []registry.RouteAssignment `json:"assignments"`
}

type snapshotClaim struct {
	RequestID string    `json:"request_id"`
	Digest    string    `json:"digest"`
	ReplicaID string    `json:"replica_id"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Snapshot writes the registry's complete state to w as one JSON document:
// every record, the catalog revision, route assignments with their
// reservations and superseded history, admission counters, the live
// lifecycle replay claims and the tenants' event logs. The state is copied under the registry's mutex
// (one consistent instant); the encoding and the write happen after it is
// released. Restore reads the document back. Cached catalog views are not
// part of the state.
func (r *Registry) Snapshot(w io.Writer) error {
	s := r.snapshot()
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return fmt.Errorf("memregistry: write snapshot: %w", err)
	}
	return nil
}

func (r *Registry) snapshot() *snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &snapshot{
		Format: SnapshotFormat, CatalogRevision: r.revision,
		Policies: make([]registry.AdmissionPolicy, 0, len(r.policies)), Types: make([]registry.ConnectorType, 0, len(r.types)),
		Versions: make([]registry.ConnectorVersion, 0, len(r.versions)), Definitions: make([]snapshotDefinition, 0, len(r.defs)),
		Instances: make([]registry.ConnectorInstance, 0, len(r.instances)), Bindings: make([]registry.CapabilityBinding, 0, len(r.bindings)),
		Replicas: make([]registry.ConnectorReplica, 0, len(r.replicas)), Routes: make([]snapshotRoute, 0, len(r.routes)),
		Counters: make([]registry.AdmissionCounter, 0, len(r.counters)), History: make([]snapshotHistory, 0, len(r.history)),
		ReplayClaims: []snapshotClaim{},
	}
	for _, p := range r.policies {
		s.Policies = append(s.Policies, *p)
	}
	for _, t := range r.types {
		s.Types = append(s.Types, t.rec)
	}
	for _, v := range r.versions {
		s.Versions = append(s.Versions, v.rec.Clone())
	}
	for _, d := range r.defs {
		sd := snapshotDefinition{Definition: d.def.Clone(), VersionIDs: make([]string, len(d.versions))}
		for i, v := range d.versions {
			sd.VersionIDs[i] = v.rec.ID
		}
		s.Definitions = append(s.Definitions, sd)
	}
	for _, i := range r.instances {
		s.Instances = append(s.Instances, i.rec)
	}
	for _, b := range r.bindings {
		s.Bindings = append(s.Bindings, b.rec)
	}
	for _, e := range r.replicas {
		s.Replicas = append(s.Replicas, e.rec)
	}
	for _, rt := range r.routes {
		s.Routes = append(s.Routes, snapshotRoute{Assignment: rt.a.Clone(), Reserved: rt.reserved, Retry: rt.retry,
			LastSettlement: rt.last, ResolvedAgain: rt.resolvedAgain, HandedOutAt: rt.handedOut, ReservedHandOut: rt.reservedBy,
			HandOutClaim: rt.claim})
	}
	for id, n := range r.counters {
		s.Counters = append(s.Counters, registry.AdmissionCounter{Kind: id.kind, Key: id.key, Active: n})
	}
	for actionID, h := range r.history {
		sh := snapshotHistory{ActionID: actionID, Assignments: make([]registry.RouteAssignment, len(h))}
		for i := range h {
			sh.Assignments[i] = h[i].Clone()
		}
		s.History = append(s.History, sh)
	}
	if r.lc != nil {
		now := r.clock()
		for _, c := range r.lc.claims {
			if c.Live(now) {
				s.ReplayClaims = append(s.ReplayClaims, snapshotClaim{RequestID: c.RequestID, Digest: c.Digest, ReplicaID: c.ReplicaID, ExpiresAt: c.ExpiresAt})
			}
		}
	}
	for tenant, l := range r.events {
		sl := snapshotEventLog{TenantID: tenant, Events: make([]snapshotEvent, len(l.events)), LastSequence: l.last()}
		for id, p := range l.pruned {
			if sl.Pruned == nil {
				sl.Pruned = make(map[string]time.Time, len(l.pruned))
			}
			sl.Pruned[id] = p.received
			if p.digest != nil {
				if sl.PrunedDigests == nil {
					sl.PrunedDigests = make(map[string][]byte, len(l.pruned))
				}
				sl.PrunedDigests[id] = slices.Clone(p.digest)
			}
		}
		for i, e := range l.events {
			e = cloneStoredEvent(e)
			sl.Events[i] = snapshotEvent{Sequence: e.Sequence, InstanceID: e.InstanceID, ReplicaID: e.ReplicaID, VersionID: e.VersionID,
				ChannelID: e.ChannelID, Event: e.Event, ReceivedAt: e.ReceivedAt}
		}
		s.Events = append(s.Events, sl)
	}
	slices.SortFunc(s.Events, func(a, b snapshotEventLog) int { return strings.Compare(a.TenantID, b.TenantID) })
	slices.SortFunc(s.Policies, func(a, b registry.AdmissionPolicy) int { return strings.Compare(a.PolicyRef, b.PolicyRef) })
	slices.SortFunc(s.Types, func(a, b registry.ConnectorType) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Versions, func(a, b registry.ConnectorVersion) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Definitions, func(a, b snapshotDefinition) int {
		return strings.Compare(a.Definition.Capability.ID, b.Definition.Capability.ID)
	})
	slices.SortFunc(s.Instances, func(a, b registry.ConnectorInstance) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Bindings, func(a, b registry.CapabilityBinding) int { return strings.Compare(a.Key().String(), b.Key().String()) })
	slices.SortFunc(s.Replicas, func(a, b registry.ConnectorReplica) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(s.Routes, func(a, b snapshotRoute) int { return strings.Compare(a.Assignment.ActionID, b.Assignment.ActionID) })
	slices.SortFunc(s.Counters, func(a, b registry.AdmissionCounter) int {
		return cmp.Or(strings.Compare(string(a.Kind), string(b.Kind)), strings.Compare(a.Key, b.Key))
	})
	slices.SortFunc(s.History, func(a, b snapshotHistory) int { return strings.Compare(a.ActionID, b.ActionID) })
	slices.SortFunc(s.ReplayClaims, func(a, b snapshotClaim) int { return strings.Compare(a.RequestID, b.RequestID) })
	return s
}

// Restore loads a document written by Snapshot into r, which must be
// empty (as New returns it). Afterwards every contract answers exactly as
// the snapshotted registry did at the instant of the snapshot, given the
// same clock. A document that is not a snapshot, that references records
// it does not contain or that is inconsistent is refused with ErrSnapshot,
// and r stays empty.
//
// Events stored by an earlier build that break a rule this build holds
// new writes to (registry.StoredRule: an identifier with an invisible
// formatting character, data with a number beyond PostgreSQL's numeric,
// a \u escape of a lone surrogate, a NUL character, or nesting deeper
// than a signed delivery carries) are restored as they were stored and
// served so: refusing them would refuse the whole registry for one old
// event. Restore logs, at warn, each such rule once, with how many events
// break it and the first of them, so an operator can remove them; a new
// write of the same is still refused.
//
// Catalog records are not validated on load, so records an earlier build
// stored under rules since added load as stored. Those whose tenant or
// capability ID holds an invisible formatting character
// (registry.RuleFormatCharacter: capability definitions, instances,
// bindings, routes) can no longer be named by any route request or write,
// so they route nothing: Restore keeps them as stored (a snapshot
// afterwards holds them byte for byte) and logs, at warn, one warning per
// kind with how many there are, the first maxNamedRecords of them with
// the field and character, and what to do. Records whose other
// identifiers hold one (an instance's secret_provider_ref, a binding's
// credential_revision_ref or quota_policy_ref, a policy's policy_ref, a
// replica's peer_principal_id, trust_domain or transport_profile, a
// version's version, manifest agent ID or manifest profiles) are kept
// likewise, with one warning per kind and field saying what the character
// does to them and what to do.
func (r *Registry) Restore(rd io.Reader) error {
	var s snapshot
	dec := json.NewDecoder(rd)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: data after the snapshot document", ErrSnapshot)
	}
	if s.Format != SnapshotFormat {
		return fmt.Errorf("%w: format %q, want %q", ErrSnapshot, s.Format, SnapshotFormat)
	}
	fresh, err := New(Config{Now: r.now, Limits: r.limits})
	if err != nil {
		return err
	}
	kept, err := fresh.load(&s)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrSnapshot, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.revision != 0 || len(r.policies)+len(r.types)+len(r.versions)+len(r.replicas)+len(r.routes)+len(r.events) > 0 {
		return fmt.Errorf("%w: restore into a registry that already holds state; restore into a new one", ErrSnapshot)
	}
	r.state = fresh.state // with empty catalog views: load builds none
	kept.log(r.log)
	for _, u := range unnamableRecords(&s) {
		u.log(r.log)
	}
	return nil
}

// maxNamedRecords bounds the records a warning about restored records
// names; it gives the count of all of them.
const maxNamedRecords = 10

// unnamable are restored records of one kind whose tenant or capability
// ID breaks registry.RuleFormatCharacter: an earlier build stored them,
// and no route request or write can name them now. With a field, they are
// the records of the kind whose other identifier field breaks the rule:
// they can be named, and effect says what the character does to them.
type unnamable struct {
	kind   string // plural, as the warning names it
	field  string // "" for the tenant and capability IDs; else the field
	effect string // with a field: what the character does
	fix    string // what to do about them
	count  int
	named  []string // the first maxNamedRecords
}

// add counts a record; what names it and breaks says which of its fields
// hold which character.
func (u *unnamable) add(what, breaks string) {
	u.count++
	if len(u.named) < maxNamedRecords {
		u.named = append(u.named, what+" ("+breaks+")")
	}
}

func (u *unnamable) log(log *slog.Logger) {
	records := strings.Join(u.named, "; ")
	if u.count > len(u.named) {
		records += fmt.Sprintf("; and %d more", u.count-len(u.named))
	}
	if u.field != "" {
		log.Warn("restored records with an identifier that holds an invisible formatting character, kept as they were stored: an earlier build stored them before the rule; "+u.effect,
			"rule", string(registry.RuleFormatCharacter), "kind", u.kind, "field", u.field, "count", u.count, "records", records, "fix", u.fix)
		return
	}
	log.Warn("restored records that no request can name, kept as they were stored: an earlier build stored them before the rule; "+
		"a route request or a write carrying such an identifier is refused, so they route nothing (and no write changes an instance or binding among them). "+
		"No write removes them: they stay until the registry is restored from a snapshot without them (aipfleet dev: --reset starts from an empty registry)",
		"rule", string(registry.RuleFormatCharacter), "kind", u.kind, "count", u.count, "records", records, "fix", u.fix)
}

// formatBreaks names the fields among name, value pairs whose value holds
// an invisible formatting character, and the character ("tenant_id
// U+200B"); "" when none does.
func formatBreaks(fields ...string) string {
	var b []string
	for i := 0; i+1 < len(fields); i += 2 {
		if c, ok := registry.FormatCharacter(fields[i+1]); ok {
			b = append(b, fmt.Sprintf("%s U+%04X", fields[i], c))
		}
	}
	return strings.Join(b, ", ")
}

// unnamableRecords finds, in the order s holds them, the capability
// definitions, instances, bindings and routes whose tenant or capability
// ID holds an invisible formatting character, by kind (the event logs'
// are keptEvents'), and then the records whose other identifiers hold
// one, by kind and field. It reads each kind of record once. Restore
// keeps them as stored.
func unnamableRecords(s *snapshot) []*unnamable {
	defs := &unnamable{kind: "capability definitions",
		fix: "publish the capability under an ID without the character in a new version, move its instances to that version and revoke the versions that declare this ID"}
	insts := &unnamable{kind: "connector instances",
		fix: "create an instance for the tenant ID without the character, with its bindings and replicas: the replicas of these instances take no routes"}
	binds := &unnamable{kind: "capability bindings",
		fix: "bind the tenant and capability again under IDs without the character (PutBinding, or the fleet file)"}
	routes := &unnamable{kind: "routes",
		fix: "a retry of these actions is refused; send new actions under IDs without the character (a reservation these routes hold is still released by settlement or lease expiry)"}
	secretRefs := fieldBreaks("connector instances", "secret_provider_ref")
	credRefs := fieldBreaks("capability bindings", "credential_revision_ref")
	quotaRefs := fieldBreaks("capability bindings", "quota_policy_ref")
	policyRefs := fieldBreaks("admission policies", "policy_ref")
	principals := fieldBreaks("connector replicas", "peer_principal_id")
	trustDomains := fieldBreaks("connector replicas", "trust_domain")
	transports := fieldBreaks("connector replicas", "transport_profile")
	versions := fieldBreaks("connector versions", "version")
	agents := fieldBreaks("connector versions", "manifest.agent.id")
	profiles := fieldBreaks("connector versions", "manifest.profiles")
	for i := range s.Policies {
		p := &s.Policies[i]
		policyRefs.check(fmt.Sprintf("policy %q", p.PolicyRef), p.PolicyRef)
	}
	for i := range s.Versions {
		v := &s.Versions[i]
		versions.check(fmt.Sprintf("version %q", v.ID), v.Version)
		agents.check(fmt.Sprintf("version %q", v.ID), v.Manifest.Agent.ID)
		// A version counts once, named with the least of its profiles
		// that hold one (as pgregistry's migrate names it).
		least := ""
		for _, p := range v.Manifest.Profiles {
			if _, ok := registry.FormatCharacter(p); ok && (least == "" || p < least) {
				least = p
			}
		}
		profiles.check(fmt.Sprintf("version %q", v.ID), least)
	}
	for i := range s.Definitions {
		id := s.Definitions[i].Definition.Capability.ID
		if br := formatBreaks("capability.id", id); br != "" {
			defs.add(fmt.Sprintf("capability %q", id), br)
		}
	}
	for i := range s.Instances {
		in := &s.Instances[i]
		if br := formatBreaks("tenant_id", in.TenantID); br != "" {
			insts.add(fmt.Sprintf("instance %q of tenant %q", in.ID, in.TenantID), br)
		}
		secretRefs.check(fmt.Sprintf("instance %q", in.ID), in.SecretProviderRef)
	}
	for i := range s.Bindings {
		b := &s.Bindings[i]
		if br := formatBreaks("tenant_id", b.TenantID, "capability_id", b.CapabilityID); br != "" {
			binds.add(fmt.Sprintf("binding %q", b.Key().String()), br)
		}
		credRefs.check(fmt.Sprintf("binding %q", b.Key().String()), b.CredentialRevisionRef)
		quotaRefs.check(fmt.Sprintf("binding %q", b.Key().String()), b.QuotaPolicyRef)
	}
	for i := range s.Replicas {
		rep := &s.Replicas[i]
		what := fmt.Sprintf("replica %q", rep.ID)
		principals.check(what, rep.PeerPrincipalID)
		trustDomains.check(what, rep.TrustDomain)
		transports.check(what, rep.TransportProfile)
	}
	for i := range s.Routes {
		a := &s.Routes[i].Assignment
		if br := formatBreaks("tenant_id", a.TenantID, "capability_id", a.CapabilityID); br != "" {
			routes.add(fmt.Sprintf("action %q of tenant %q, capability %q", a.ActionID, a.TenantID, a.CapabilityID), br)
		}
	}
	var found []*unnamable
	for _, u := range []*unnamable{defs, insts, binds, routes,
		secretRefs, credRefs, quotaRefs, policyRefs, principals, trustDomains, transports, versions, agents, profiles} {
		if u.count > 0 {
			found = append(found, u)
		}
	}
	return found
}

// check counts the record what names when v, its value of u's field,
// holds an invisible formatting character, naming it with the value
// quoted, the field and the character: instance "cinst_a" with
// secret_provider_ref "vault://a\u200b" (secret_provider_ref U+200B).
func (u *unnamable) check(what, v string) {
	if br := formatBreaks(u.field, v); br != "" {
		u.add(fmt.Sprintf("%s with %s %q", what, u.field, v), br)
	}
}

// fieldBreaks returns the empty finding of kind's records whose
// identifier field holds an invisible formatting character, with what
// the character does to them and what to do (fieldFindings).
func fieldBreaks(kind, field string) *unnamable {
	f := fieldFindings[kind+" "+field]
	return &unnamable{kind: kind, field: field, effect: f[0], fix: f[1]}
}

// fieldFindings are, by kind and field, what an invisible formatting
// character in that identifier does to the record, and what to do.
var fieldFindings = map[string][2]string{
	"connector instances secret_provider_ref": {
		"the reference prints like one it is not, and a write of the instance as stored is refused",
		"apply the instance with secret_provider_ref without the character and a greater config_revision, and restart its replicas' hosts with that --secret-provider-ref and --config-revision (registration compares both)"},
	"capability bindings credential_revision_ref": {
		"routes carry the reference to the replica, where it prints like one it is not, and a write of the binding as stored is refused",
		"put the binding with credential_revision_ref without the character and a greater policy_revision (PutBinding, or the fleet file), and authorize that revision in its replicas' credential revision policy"},
	"capability bindings quota_policy_ref": {
		"the binding names an admission policy whose reference holds the character, and a write of the binding as stored is refused",
		"put the admission policy under a reference without the character, then the binding with quota_policy_ref naming it and a greater policy_revision"},
	"admission policies policy_ref": {
		"the reference prints like one it is not, no write can put the policy again, and a binding that names it cannot be written as it is",
		"put the policy under a reference without the character and move the bindings that name it to that reference (a greater policy_revision each); no write removes this one"},
	"connector replicas peer_principal_id": {
		"a replica's identity is fixed and a registration carrying such a value is refused, so the replica cannot register again (it takes routes only while its current lease is renewed)",
		"provision a replica under a new replica ID whose peer principal is the manifest agent's ID without the character (admit a version whose agent ID has none first if it is the agent's), start its host, and stop this one's host (its record stays, and takes no routes once its lease ends)"},
	"connector replicas trust_domain": {
		"a replica's identity is fixed and a registration carrying such a value is refused (a host refuses such a --trust-domain at the start), so the replica cannot register again (it takes routes only while its current lease is renewed)",
		"provision a replica under a new replica ID with the trust domain without the character, start its host with that --trust-domain, and stop this one's host (its record stays, and takes no routes once its lease ends)"},
	"connector replicas transport_profile": {
		"a replica's identity is fixed and a registration carrying such a value is refused (a host registers aip.native.http.v1), so the replica cannot register again (it takes routes only while its current lease is renewed)",
		"provision a replica under a new replica ID with transport profile aip.native.http.v1, start its host, and stop this one's host (its record stays, and takes no routes once its lease ends)"},
	"connector versions version": {
		"the version string prints like one it is not (nothing but a version's status changes once it is admitted)",
		"admit a new version whose version string holds no such character, move the instances to it and revoke this one"},
	"connector versions manifest.agent.id": {
		"every replica of the version signs as its manifest's agent, and a replica whose peer_principal_id holds the character can be neither put nor registered again, " +
			"so the version serves only until its replicas' current leases end (and a fleet file that lists the version is refused)",
		"admit the connector's manifest with an agent ID without the character as a new version (a new version ID), put its replicas and move the instances to it; " +
			"leave this version out of the fleet file"},
	"connector versions manifest.profiles": {
		"a catalog query cannot name the profile (a profile filter holding the character is refused), so the version's capabilities are not found by it",
		"admit a new version whose manifest profiles hold no such character, move the instances to it and revoke this one"},
}

// keptEvents are the stored events load kept although they break a rule
// new writes are held to, by rule: how many, and the first of them.
type keptEvents struct {
	rules []registry.StoredRule // in the order first found
	by    map[registry.StoredRule]*keptRule
}

type keptRule struct {
	events int
	first  string
	last   [2]string // the tenant and ID of the last event counted
}

// add counts a break of the event eventID of tenant (an event that breaks
// a rule in several fields once).
func (k *keptEvents) add(tenant, eventID string, b registry.StoredBreak) {
	if k.by == nil {
		k.by = make(map[registry.StoredRule]*keptRule)
	}
	kr := k.by[b.Rule]
	if kr == nil {
		kr = &keptRule{first: fmt.Sprintf("tenant %q event %q: %v", tenant, eventID, b.Err)}
		k.by[b.Rule] = kr
		k.rules = append(k.rules, b.Rule)
	} else if kr.last == [2]string{tenant, eventID} {
		return
	}
	kr.last = [2]string{tenant, eventID}
	kr.events++
}

// log writes one warning per rule.
func (k *keptEvents) log(log *slog.Logger) {
	for _, rule := range k.rules {
		kr := k.by[rule]
		log.Warn("restored events that this build refuses to store, kept as they were stored: an earlier build stored them before the rule; "+
			"a new write of the same is refused, so remove them (event retention prunes them) or fix what sends them",
			"rule", string(rule), "events", kr.events, "first", kr.first)
	}
}

// load builds r's records and indexes from s. r is new and not shared. It
// returns the events it kept that break a registry.StoredRule.
func (r *Registry) load(s *snapshot) (*keptEvents, error) {
	if err := r.loadRecords(s); err != nil {
		return nil, err
	}
	return r.loadEvents(s.Events)
}

// loadRecords builds everything but the event logs.
func (r *Registry) loadRecords(s *snapshot) error {
	r.revision = s.CatalogRevision
	for i := range s.Policies {
		p := s.Policies[i]
		if _, dup := r.policies[p.PolicyRef]; dup {
			return fmt.Errorf("admission policy %s appears twice", p.PolicyRef)
		}
		r.policies[p.PolicyRef] = &p
	}
	for _, t := range s.Types {
		if _, dup := r.types[t.ID]; dup {
			return fmt.Errorf("connector type %s appears twice", t.ID)
		}
		r.types[t.ID] = &typeEntry{rec: t}
	}
	for _, v := range s.Versions {
		t, ok := r.types[v.ConnectorTypeID]
		if !ok {
			return fmt.Errorf("connector version %s: its type %s is missing", v.ID, v.ConnectorTypeID)
		}
		if _, dup := r.versions[v.ID]; dup {
			return fmt.Errorf("connector version %s appears twice", v.ID)
		}
		r.addVersion(newVersionEntry(v, t))
	}
	published := map[[2]string]bool{} // (capability, version) pairs the definitions list
	for _, sd := range s.Definitions {
		d := sd.Definition
		id := d.Capability.ID
		if _, dup := r.defs[id]; dup {
			return fmt.Errorf("capability %s is defined twice", id)
		}
		size, err := registry.DefinitionSize(&d)
		if err != nil {
			return fmt.Errorf("capability %s: %v", id, err)
		}
		de := &defEntry{def: d, size: size, search: registry.SearchText(&d)}
		for _, vid := range sd.VersionIDs {
			v, ok := r.versions[vid]
			if !ok || !v.implements(id) {
				return fmt.Errorf("capability %s: version %s is missing or does not declare it", id, vid)
			}
			published[[2]string{id, vid}] = true
			de.versions = append(de.versions, v)
		}
		r.defs[id] = de
	}
	for vid, v := range r.versions {
		for capID := range v.caps {
			if !published[[2]string{capID, vid}] {
				return fmt.Errorf("version %s declares capability %s, which no definition lists", vid, capID)
			}
		}
	}
	for _, i := range s.Instances {
		v, ok := r.versions[i.VersionID]
		if !ok {
			return fmt.Errorf("connector instance %s: its version %s is missing", i.ID, i.VersionID)
		}
		if _, dup := r.instances[i.ID]; dup {
			return fmt.Errorf("connector instance %s appears twice", i.ID)
		}
		r.instances[i.ID] = newInstanceEntry(i, v)
	}
	for _, b := range s.Bindings {
		inst, ok := r.instances[b.InstanceID]
		if !ok {
			return fmt.Errorf("capability binding %s: its instance is missing", b.Key())
		}
		if _, ok := r.defs[b.CapabilityID]; !ok {
			return fmt.Errorf("capability binding %s: its capability has no definition", b.Key())
		}
		if b.QuotaPolicyRef != "" && r.policies[b.QuotaPolicyRef] == nil {
			return fmt.Errorf("capability binding %s: its policy %s is missing", b.Key(), b.QuotaPolicyRef)
		}
		if _, dup := r.bindings[b.Key()]; dup {
			return fmt.Errorf("capability binding %s appears twice", b.Key())
		}
		r.addBinding(b, inst)
	}
	for _, te := range r.tenants {
		for _, tc := range te.order {
			sortTenantBindings(tc)
		}
	}
	for _, rep := range s.Replicas {
		inst, ok := r.instances[rep.InstanceID]
		if !ok {
			return fmt.Errorf("connector replica %s: its instance %s is missing", rep.ID, rep.InstanceID)
		}
		if _, dup := r.replicas[rep.ID]; dup {
			return fmt.Errorf("connector replica %s appears twice", rep.ID)
		}
		r.addReplica(rep, inst)
	}
	for _, sr := range s.Routes {
		a := sr.Assignment
		rep, ok := r.replicas[a.ReplicaID]
		if !ok {
			return fmt.Errorf("route of action %s: its replica %s is missing", a.ActionID, a.ReplicaID)
		}
		if _, ok := r.versions[a.VersionID]; !ok {
			return fmt.Errorf("route of action %s: its version %s is missing", a.ActionID, a.VersionID)
		}
		if _, dup := r.routes[a.ActionID]; dup {
			return fmt.Errorf("route of action %s appears twice", a.ActionID)
		}
		rt := &routeEntry{a: a, replica: rep, reserved: sr.Reserved, retry: sr.Retry, last: sr.LastSettlement, resolvedAgain: sr.ResolvedAgain,
			handedOut: sr.HandedOutAt, reservedBy: sr.ReservedHandOut, claim: sr.HandOutClaim}
		if rt.handedOut.IsZero() {
			rt.handedOut = r.clock()
		}
		r.routes[a.ActionID] = rt
		if rt.reserved {
			rep.reserved[a.ActionID] = rt
		}
	}
	for _, c := range s.Counters {
		if c.Active == 0 {
			return fmt.Errorf("admission counter %s/%s is zero; zero counters are not kept", c.Kind, c.Key)
		}
		r.counters[scopeID{c.Kind, c.Key}] = c.Active
	}
	if err := r.checkLedger(); err != nil {
		return err
	}
	for _, h := range s.History {
		if _, ok := r.routes[h.ActionID]; !ok {
			return fmt.Errorf("route history of action %s: the action has no route", h.ActionID)
		}
		if r.history == nil {
			r.history = make(map[string][]registry.RouteAssignment)
		}
		r.history[h.ActionID] = h.Assignments
	}
	if len(s.ReplayClaims) > 0 {
		lc := r.lifecycle()
		for _, sc := range s.ReplayClaims {
			c := &registry.ReplayClaim{RequestID: sc.RequestID, Digest: sc.Digest, ReplicaID: sc.ReplicaID, ExpiresAt: sc.ExpiresAt}
			lc.claims[c.RequestID] = c
			lc.expiry = append(lc.expiry, c)
		}
		heap.Init(&lc.expiry)
	}
	return nil
}

// loadEvents rebuilds the tenants' event logs: each tenant once, its
// events with strictly increasing sequences and distinct IDs, each as
// AppendEvents would have stored it, and its last sequence given out (at
// least its last event's). An event that breaks a registry.StoredRule is
// kept as stored, and counted in the answer.
func (r *Registry) loadEvents(logs []snapshotEventLog) (*keptEvents, error) {
	kept := &keptEvents{}
	for _, sl := range logs {
		if _, dup := r.events[sl.TenantID]; dup {
			return nil, fmt.Errorf("the event log of tenant %s appears twice", sl.TenantID)
		}
		if len(sl.Events) == 0 && sl.LastSequence == 0 {
			return nil, fmt.Errorf("the event log of tenant %s is empty and has no last sequence; such logs are not kept", sl.TenantID)
		}
		l := newEventLog()
		for _, se := range sl.Events {
			if se.Sequence <= l.last() {
				return nil, fmt.Errorf("tenant %s: event %s has sequence %d after %d; sequences must increase", sl.TenantID, se.Event.ID, se.Sequence, l.last())
			}
			if _, dup := l.byID[se.Event.ID]; dup {
				return nil, fmt.Errorf("tenant %s: event %s appears twice", sl.TenantID, se.Event.ID)
			}
			b := registry.EventBatch{TenantID: sl.TenantID, InstanceID: se.InstanceID, ReplicaID: se.ReplicaID, VersionID: se.VersionID,
				ChannelID: se.ChannelID, Events: []aip.Event{se.Event}}
			breaks, err := b.ValidateStored()
			if err != nil {
				return nil, fmt.Errorf("tenant %s: event %s: %v", sl.TenantID, se.Event.ID, err)
			}
			for _, k := range breaks {
				kept.add(sl.TenantID, se.Event.ID, k)
			}
			l.byID[se.Event.ID] = len(l.events)
			l.events = append(l.events, registry.StoredEvent{Sequence: se.Sequence, TenantID: sl.TenantID, InstanceID: se.InstanceID,
				ReplicaID: se.ReplicaID, VersionID: se.VersionID, ChannelID: se.ChannelID, Event: se.Event, ReceivedAt: se.ReceivedAt})
			l.lastSeq = se.Sequence
		}
		for id, at := range sl.Pruned {
			if _, stored := l.byID[id]; stored {
				return nil, fmt.Errorf("tenant %s: event %s is both stored and pruned", sl.TenantID, id)
			}
			if id == "" {
				return nil, fmt.Errorf("tenant %s: a pruned event has an empty ID", sl.TenantID)
			}
			l.pruned[id] = prunedEvent{received: at, digest: slices.Clone(sl.PrunedDigests[id])}
		}
		for id, d := range sl.PrunedDigests {
			if _, ok := sl.Pruned[id]; !ok {
				return nil, fmt.Errorf("tenant %s: pruned_digests names event %s, which is not among the pruned", sl.TenantID, id)
			}
			if len(d) != sha256.Size {
				return nil, fmt.Errorf("tenant %s: the digest of pruned event %s is %d bytes, want %d", sl.TenantID, id, len(d), sha256.Size)
			}
		}
		if sl.LastSequence != 0 {
			if sl.LastSequence < l.lastSeq {
				return nil, fmt.Errorf("tenant %s: last_sequence %d is below its last event's sequence %d", sl.TenantID, sl.LastSequence, l.lastSeq)
			}
			l.lastSeq = sl.LastSequence
		}
		r.events[sl.TenantID] = l
	}
	return kept, nil
}

// checkLedger verifies the invariants that tie reservations to counters
// and replicas: each counter equals the live reservations holding its
// scope, and each replica's active assignments equal its live
// reservations.
func (r *Registry) checkLedger() error {
	want := map[scopeID]uint32{}
	for _, rt := range r.routes {
		if !rt.reserved {
			continue
		}
		for _, sc := range rt.scopes() {
			want[scopeID{sc.Kind, sc.Key}]++
		}
	}
	for id, n := range r.counters {
		if want[id] != n {
			return fmt.Errorf("admission counter %s/%s is %d but %d live reservations hold it", id.kind, id.key, n, want[id])
		}
	}
	for id, n := range want {
		if r.counters[id] != n {
			return fmt.Errorf("admission counter %s/%s is missing (%d live reservations hold it)", id.kind, id.key, n)
		}
	}
	for _, e := range r.replicas {
		if int(e.rec.ActiveAssignments) != len(e.reserved) {
			return fmt.Errorf("replica %s counts %d active assignments but holds %d live reservations", e.rec.ID, e.rec.ActiveAssignments, len(e.reserved))
		}
		if e.rec.Status != aip.ReplicaOffline && e.rec.Status != aip.ReplicaReady && e.rec.Status != aip.ReplicaDraining {
			return fmt.Errorf("replica %s has unknown status %q", e.rec.ID, e.rec.Status)
		}
		if !e.rec.OfflineReason.Valid() {
			return fmt.Errorf("replica %s has unknown offline reason %q", e.rec.ID, e.rec.OfflineReason)
		}
	}
	return nil
}
