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

// UnnamableRecords are stored records of one kind whose tenant or
// capability ID holds an invisible formatting character
// (registry.RuleFormatCharacter). A build before the rule stored them;
// since, no route request and no write can name them (RouteRequest and
// the records' Validate refuse the ID), so they route nothing. They are
// kept as stored: nothing rewrites or removes them.
type UnnamableRecords struct {
	// Kind is "capability definitions" or "connector instances".
	Kind string `json:"kind"`
	// Field is the identifier that holds the character: "capability_id"
	// or "tenant_id".
	Field string `json:"field"`
	// Count is how many there are.
	Count int `json:"count"`
	// Records names the first MaxNamedRecords, in ID order, each quoted
	// so the character shows, with the field and the character
	// (`instance "cinst_a" of tenant "acme\u200b" (tenant_id U+200B)`).
	Records []string `json:"records"`
	// Fix says what to do about them.
	Fix string `json:"fix"`
}

// The fixes of the kinds.
const (
	fixDefinitions = "publish the capability under an ID without the character in a new version, move its instances to that version and revoke " +
		"the versions that declare this ID (a write can name a version; the definition stays, unseen once no active version declares it)"
	fixInstances = "create an instance for the tenant ID without the character, with its bindings and replicas (a fleet file's apply); " +
		"no write changes or removes these, and they, their bindings and their replicas take no routes"
)

// selectUnnamableDefinitions and selectUnnamableInstances find the
// capability definitions and the instances whose capability or tenant ID
// matches $1 (formatCharPattern): the first $2 in ID order, each with the
// count of all (counted before the limit). Each reads its table once,
// sequentially: a table of one row per capability, and one of one row
// per instance. A binding's tenant is its instance's and its capability
// has a definition (a foreign key), so between them they find the roots
// of every unnamable binding, replica and route without reading those
// tables, which grow with tenants times capabilities and with actions.
const (
	selectUnnamableDefinitions = `
SELECT capability_id, '', count(*) OVER ()
FROM aip_registry.capability_definitions
WHERE capability_id ~ $1
ORDER BY capability_id
LIMIT $2`
	selectUnnamableInstances = `
SELECT instance_id, tenant_id, count(*) OVER ()
FROM aip_registry.connector_instances
WHERE tenant_id ~ $1
ORDER BY instance_id
LIMIT $2`
)

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

// unnamableRecords finds the capability definitions and instances whose
// capability or tenant ID holds an invisible formatting character; kinds
// without any are left out.
func unnamableRecords(ctx context.Context, q querier) ([]UnnamableRecords, error) {
	var found []UnnamableRecords
	for _, k := range []struct {
		kind, field, fix, sql string
		name                  func(id, tenant string) string
	}{
		{"capability definitions", "capability_id", fixDefinitions, selectUnnamableDefinitions, func(id, _ string) string {
			return fmt.Sprintf("capability %q (capability.id %s)", id, formatChar(id))
		}},
		{"connector instances", "tenant_id", fixInstances, selectUnnamableInstances, func(id, tenant string) string {
			return fmt.Sprintf("instance %q of tenant %q (tenant_id %s)", id, tenant, formatChar(tenant))
		}},
	} {
		rows, err := q.Query(ctx, k.sql, formatCharPattern(), MaxNamedRecords)
		if err != nil {
			return nil, storageErr("look for "+k.kind+" no request can name", err)
		}
		u := UnnamableRecords{Kind: k.kind, Field: k.field, Fix: k.fix}
		for rows.Next() {
			var id, tenant string
			var n int64
			if err := rows.Scan(&id, &tenant, &n); err != nil {
				rows.Close()
				return nil, storageErr("look for "+k.kind+" no request can name", err)
			}
			u.Count = int(n)
			u.Records = append(u.Records, k.name(id, tenant))
		}
		if err := rows.Err(); err != nil {
			return nil, storageErr("look for "+k.kind+" no request can name", err)
		}
		if u.Count > 0 {
			found = append(found, u)
		}
	}
	return found, nil
}

// formatChar is "U+200B" for the first formatting character of v.
func formatChar(v string) string {
	c, _ := registry.FormatCharacter(v)
	return fmt.Sprintf("U+%04X", c)
}
