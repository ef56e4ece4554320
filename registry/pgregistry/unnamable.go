package pgregistry

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"unicode"

	"github.com/aipfleet/aipfleet/registry"
)

// MaxNamedRecords bounds the records an UnnamableRecords names; its Count
// counts all of them.
const MaxNamedRecords = 10

// UnnamableRecords are stored records of one kind whose identifier Field
// holds an invisible formatting character (registry.RuleFormatCharacter).
// A build before the rule stored them; nothing rewrites or removes them.
// Those whose tenant or capability ID holds one can be named by no route
// request and no write since (RouteRequest and the records' Validate
// refuse the ID), so they route nothing; those whose other identifiers
// hold one (an instance's secret provider reference, a binding's
// credential revision or quota policy reference, a policy's reference, a
// replica's peer principal, trust domain or transport profile, a
// version's version string, manifest agent ID or profiles) can, but a
// write of them as stored is refused, and Effect says what else the
// character does.
type UnnamableRecords struct {
	// Kind is "capability definitions", "connector instances",
	// "capability bindings", "admission policies", "connector replicas"
	// or "connector versions".
	Kind string `json:"kind"`
	// Field is the identifier that holds the character: "capability_id",
	// "tenant_id", "secret_provider_ref", "credential_revision_ref",
	// "quota_policy_ref", "policy_ref", "peer_principal_id",
	// "trust_domain", "transport_profile", "version",
	// "manifest.agent.id" or "manifest.profiles".
	Field string `json:"field"`
	// Count is how many there are (for manifest.profiles, how many
	// versions).
	Count int `json:"count"`
	// Records names the first MaxNamedRecords, in ID order, each quoted
	// so the character shows, with the field and the character
	// (`instance "cinst_a" of tenant "acme\u200b" (tenant_id U+200B)`).
	Records []string `json:"records"`
	// Effect says what the character does to them ("no route request can
	// name them, so they route nothing").
	Effect string `json:"effect"`
	// Fix says what to do about them.
	Fix string `json:"fix"`
}

// The effects and fixes of the kinds and fields.
const (
	effectUnnamable = "no route request can name them, so they route nothing"
	fixDefinitions  = "publish the capability under an ID without the character in a new version, move its instances to that version and revoke " +
		"the versions that declare this ID (a write can name a version; the definition stays, unseen once no active version declares it)"
	fixInstances = "create an instance for the tenant ID without the character, with its bindings and replicas (a fleet file's apply); " +
		"no write changes or removes these, and they, their bindings and their replicas take no routes"
	effectReplica = "a replica's identity is fixed and a registration carrying such a value is refused, so the replica cannot register again " +
		"(it takes routes only while its current lease is renewed)"
)

// identColumn is an identifier column the look reads: the field it
// holds, and how a record holding the character in it is named (id is
// the row's ID, v the column's value) and what it means.
type identColumn struct {
	column, field string
	effect, fix   string
	name          func(id, v string) string
}

// identTable is a table (or a query of one) the look reads once, with
// the expression of its rows' ID and its identifier columns.
type identTable struct {
	kind, from, id string
	columns        []identColumn
}

// identTables are what the look reads, in the order it reports them. A
// binding's tenant is its instance's and its capability has a definition
// (a foreign key), so the definitions and the instances find the roots of
// every binding, replica and route no request can name; a route's
// replica fields are its replica's, so routes, which grow with actions,
// are not read.
var identTables = []identTable{
	{kind: "capability definitions", from: "aip_registry.capability_definitions", id: "capability_id", columns: []identColumn{
		{column: "capability_id", field: "capability_id", effect: effectUnnamable, fix: fixDefinitions,
			name: func(id, _ string) string { return fmt.Sprintf("capability %q (capability.id %s)", id, formatChar(id)) }},
	}},
	{kind: "connector instances", from: "aip_registry.connector_instances", id: "instance_id", columns: []identColumn{
		{column: "tenant_id", field: "tenant_id", effect: effectUnnamable, fix: fixInstances,
			name: func(id, v string) string {
				return fmt.Sprintf("instance %q of tenant %q (tenant_id %s)", id, v, formatChar(v))
			}},
		{column: "secret_provider_ref", field: "secret_provider_ref",
			effect: "the reference prints like one it is not, and a write of the instance as stored is refused",
			fix: "apply the instance with secret_provider_ref without the character and a greater config_revision (a fleet file's apply), " +
				"and restart its replicas' hosts with that --secret-provider-ref and --config-revision (registration compares both)",
			name: named("instance", "secret_provider_ref")},
	}},
	{kind: "capability bindings", from: "aip_registry.capability_bindings", id: "tenant_id || '/' || capability_id || '/' || instance_id", columns: []identColumn{
		{column: "credential_revision_ref", field: "credential_revision_ref",
			effect: "routes carry the reference to the replica, where it prints like one it is not, and a write of the binding as stored is refused",
			fix: "apply the binding with credential_revision_ref without the character and a greater policy_revision (a fleet file's apply), " +
				"and authorize that revision in its replicas' credential revision policy",
			name: named("binding", "credential_revision_ref")},
		{column: "quota_policy_ref", field: "quota_policy_ref",
			effect: "the binding names an admission policy whose reference holds the character, and a write of the binding as stored is refused",
			fix:    "apply the admission policy under a reference without the character, then the binding with quota_policy_ref naming it and a greater policy_revision",
			name:   named("binding", "quota_policy_ref")},
	}},
	{kind: "admission policies", from: "aip_registry.admission_policies", id: "policy_ref", columns: []identColumn{
		{column: "policy_ref", field: "policy_ref",
			effect: "the reference prints like one it is not, no write can put the policy again, and a binding that names it cannot be written as it is",
			fix: "apply the policy under a reference without the character and move the bindings that name it to that reference " +
				"(a greater policy_revision each); no write removes this one",
			name: named("policy", "policy_ref")},
	}},
	{kind: "connector replicas", from: "aip_registry.connector_replicas", id: "replica_id", columns: []identColumn{
		{column: "peer_principal_id", field: "peer_principal_id", effect: effectReplica,
			fix: "provision a replica under a new replica ID whose peer principal is the manifest agent's ID without the character " +
				"(admit a version whose agent ID has none first if it is the agent's), start its host, and stop this one's host (its record stays, and takes no routes once its lease ends)",
			name: named("replica", "peer_principal_id")},
		{column: "trust_domain", field: "trust_domain", effect: effectReplica,
			fix:  "provision a replica under a new replica ID with the trust domain without the character, start its host with that --trust-domain, and stop this one's host (its record stays, and takes no routes once its lease ends)",
			name: named("replica", "trust_domain")},
		{column: "transport_profile", field: "transport_profile", effect: effectReplica,
			fix:  "provision a replica under a new replica ID with transport profile aip.native.http.v1 (the one a host registers), start its host, and stop this one's host (its record stays, and takes no routes once its lease ends)",
			name: named("replica", "transport_profile")},
	}},
	{kind: "connector versions", from: "aip_registry.connector_versions", id: "version_id", columns: []identColumn{
		{column: "version", field: "version",
			effect: "the version string prints like one it is not (nothing but a version's status changes once it is admitted)",
			fix:    "admit a new version whose version string holds no such character, move the instances to it and revoke this one",
			name:   named("version", "version")},
		{column: "(manifest->'agent'->>'id')", field: "manifest.agent.id",
			effect: "every replica of the version signs as its manifest's agent, and a replica whose peer_principal_id holds the character can be neither provisioned nor registered again, " +
				"so the version serves only until its replicas' current leases end (and a fleet file that lists the version is refused)",
			fix: "admit the connector's manifest with an agent ID without the character as a new version (a new version ID in the fleet file), provision its replicas and move the instances to it; " +
				"leave this version out of the fleet file",
			name: named("version", "manifest.agent.id")},
	}},
	// A version counts once, named with the least of its profiles that
	// hold one.
	{kind: "connector versions", id: "version_id",
		from: "(SELECT version_id, min(profile) AS profile FROM aip_registry.version_profiles WHERE profile ~ $1 GROUP BY version_id) AS p",
		columns: []identColumn{
			{column: "profile", field: "manifest.profiles",
				effect: "a catalog query cannot name the profile (a profile filter holding the character is refused), so the version's capabilities are not found by it",
				fix:    "admit a new version whose manifest profiles hold no such character, move the instances to it and revoke this one",
				name:   named("version", "manifest.profiles")},
		}},
}

// named names a record of what with its value v of field quoted, the
// field and the character (`replica "crepl_a" with trust_domain
// "fleet\u200b.test" (trust_domain U+200B)`).
func named(what, field string) func(id, v string) string {
	return func(id, v string) string {
		return fmt.Sprintf("%s %q with %s %q (%s %s)", what, id, field, v, field, formatChar(v))
	}
}

// sql is the look at t: one read of it, the rows whose identifier
// columns match $1 (formatCharPattern), each with every column's value,
// the count of rows matching in that column and the row's rank in ID
// order among them (NULL when the column does not match). Only rows
// ranked within $2 in some column are returned, in ID order.
func (t *identTable) sql() string {
	var cols, where, ranked []string
	for i, c := range t.columns {
		m := c.column + " ~ $1"
		cols = append(cols,
			fmt.Sprintf("coalesce(%s, '') AS v%d", c.column, i),
			fmt.Sprintf("count(*) FILTER (WHERE %s) OVER () AS n%d", m, i),
			fmt.Sprintf("CASE WHEN %s THEN row_number() OVER (PARTITION BY %s ORDER BY %s) END AS r%d", m, m, t.id, i))
		where = append(where, m)
		ranked = append(ranked, fmt.Sprintf("r%d <= $2", i))
	}
	return fmt.Sprintf("SELECT * FROM (SELECT %s AS id, %s FROM %s WHERE %s) AS m WHERE %s ORDER BY id",
		t.id, strings.Join(cols, ", "), t.from, strings.Join(where, " OR "), strings.Join(ranked, " OR "))
}

// formatCharPattern is a PostgreSQL regular expression that matches any
// invisible formatting character (unicode.Cf, what registry.FormatCharacter
// finds): one bracket expression of the characters, in ranges by code
// point.
var formatCharPattern = sync.OnceValue(func() string {
	var b strings.Builder
	b.WriteByte('[')
	add := func(lo, hi, stride rune) {
		if stride == 1 {
			b.WriteRune(lo)
			if hi > lo {
				b.WriteByte('-')
				b.WriteRune(hi)
			}
			return
		}
		for c := lo; c <= hi; c += stride {
			b.WriteRune(c)
		}
	}
	for _, r := range unicode.Cf.R16 {
		add(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
	for _, r := range unicode.Cf.R32 {
		add(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
	b.WriteByte(']')
	return b.String()
})

// unnamableRecords finds the records whose identifiers hold an invisible
// formatting character, reading each table of identTables once; kinds
// and fields without any are left out.
func unnamableRecords(ctx context.Context, q querier) ([]UnnamableRecords, error) {
	var found []UnnamableRecords
	for ti := range identTables {
		t := &identTables[ti]
		fail := func(err error) ([]UnnamableRecords, error) {
			return nil, storageErr("look for "+t.kind+" holding an invisible formatting character", err)
		}
		rows, err := q.Query(ctx, t.sql(), formatCharPattern(), MaxNamedRecords)
		if err != nil {
			return fail(err)
		}
		us := make([]UnnamableRecords, len(t.columns))
		for i, c := range t.columns {
			us[i] = UnnamableRecords{Kind: t.kind, Field: c.field, Effect: c.effect, Fix: c.fix}
		}
		for rows.Next() {
			var id string
			vals := make([]string, len(t.columns))
			counts := make([]int64, len(t.columns))
			ranks := make([]*int64, len(t.columns))
			dest := []any{&id}
			for i := range t.columns {
				dest = append(dest, &vals[i], &counts[i], &ranks[i])
			}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return fail(err)
			}
			for i, c := range t.columns {
				us[i].Count = int(counts[i])
				if ranks[i] != nil && *ranks[i] <= MaxNamedRecords {
					us[i].Records = append(us[i].Records, c.name(id, vals[i]))
				}
			}
		}
		if err := rows.Err(); err != nil {
			return fail(err)
		}
		for _, u := range us {
			if u.Count > 0 {
				found = append(found, u)
			}
		}
	}
	return found, nil
}

// formatChar is "U+200B" for the first formatting character of v.
func formatChar(v string) string {
	c, _ := registry.FormatCharacter(v)
	return fmt.Sprintf("U+%04X", c)
}
