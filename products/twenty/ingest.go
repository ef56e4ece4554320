package twenty

import (
	"fmt"
	"maps"
	"regexp"
	"slices"

	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// The idempotent ingest policy (reference §8.6,
// aip.twenty.idempotent-ingest-policy/v1) opens record.ingest and
// record.ingest_many: upserts by record ID of the listed fields of the
// listed objects.
const (
	// FlagIngestPolicyFile names the policy file (variable
	// AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE).
	FlagIngestPolicyFile = "twenty-idempotent-ingest-policy-file"
	// IngestPolicyVersion is the policy's version member.
	IngestPolicyVersion = "aip.twenty.idempotent-ingest-policy/v1"
	// MaxIngestPolicyBytes bounds the policy file (reference: 1 MiB).
	MaxIngestPolicyBytes = 1 << 20
	// MaxIngestObjects and MaxIngestFields bound the policy (reference:
	// at most 128 objects and 2 048 fields in all).
	MaxIngestObjects = 128
	MaxIngestFields  = 2048
)

// IngestPolicy is the idempotent ingest policy: for each object (plural
// API name) the fields record.ingest and record.ingest_many may write and
// the largest ingest_many batch.
type IngestPolicy struct {
	Version string                  `json:"version"`
	Objects map[string]IngestObject `json:"objects"`
}

// IngestObject is one object's entry in the policy.
type IngestObject struct {
	// Fields are the fields an ingested record may carry besides id.
	Fields []string `json:"fields"`
	// MaxBatchRecords bounds record.ingest_many for the object: 1 to
	// MaxBatchRecords (api.mdx: 60 records per call); 0 means
	// MaxBatchRecords.
	MaxBatchRecords int `json:"maxBatchRecords"`
}

// ingestFieldPattern is a field name the policy accepts: a workspace
// field's API name (composite fields are written whole).
var ingestFieldPattern = regexp.MustCompile(`^[a-zA-Z][A-Za-z0-9]{0,62}$`)

// ReadIngestPolicyFile reads --twenty-idempotent-ingest-policy-file: the
// policy as JSON (camelCase members, unknown members refused, nothing after
// it) in a file not writable by group or others, at most 1 MiB.
func ReadIngestPolicyFile(path string) (*IngestPolicy, error) {
	what := "--" + FlagIngestPolicyFile + " (AIP_TWENTY_IDEMPOTENT_INGEST_POLICY_FILE)"
	var p IngestPolicy
	if err := provider.ReadJSONFile(what, path, MaxIngestPolicyBytes, "an ingest policy ("+IngestPolicyVersion+")", &p); err != nil {
		return nil, err
	}
	if err := p.check(nil); err != nil {
		return nil, fmt.Errorf("%s: %s: %w", what, path, err)
	}
	return &p, nil
}

// check validates the policy; with objects, every policy object must be
// one of them. It fills in MaxBatchRecords defaults.
func (p *IngestPolicy) check(objects []string) error {
	if p.Version != IngestPolicyVersion {
		return fmt.Errorf("version %q; want %q", p.Version, IngestPolicyVersion)
	}
	if len(p.Objects) == 0 || len(p.Objects) > MaxIngestObjects {
		return fmt.Errorf("%d objects; list 1 to %d", len(p.Objects), MaxIngestObjects)
	}
	total := 0
	for _, name := range slices.Sorted(maps.Keys(p.Objects)) {
		o := p.Objects[name]
		if !objectNamePattern.MatchString(name) {
			return fmt.Errorf("object %q is not a plural object API name", name)
		}
		if objects != nil && !slices.Contains(objects, name) {
			return fmt.Errorf("object %q is not one of --%s %v; configure it there too", name, FlagObjects, objects)
		}
		if len(o.Fields) == 0 {
			return fmt.Errorf("object %q lists no fields", name)
		}
		seen := map[string]bool{}
		for _, f := range o.Fields {
			if !ingestFieldPattern.MatchString(f) {
				return fmt.Errorf("object %q: field %q is not a field API name", name, f)
			}
			if f == "id" {
				return fmt.Errorf("object %q: id is always required and must not be listed", name)
			}
			if seen[f] {
				return fmt.Errorf("object %q: field %q is listed twice", name, f)
			}
			seen[f] = true
		}
		total += len(o.Fields)
		if o.MaxBatchRecords == 0 {
			o.MaxBatchRecords = MaxBatchRecords
		}
		if o.MaxBatchRecords < 1 || o.MaxBatchRecords > MaxBatchRecords {
			return fmt.Errorf("object %q: maxBatchRecords %d is outside 1 to %d (Twenty's batch limit)", name, o.MaxBatchRecords, MaxBatchRecords)
		}
		p.Objects[name] = o
	}
	if total > MaxIngestFields {
		return fmt.Errorf("%d fields in all; at most %d", total, MaxIngestFields)
	}
	return nil
}

// ingestSchemas are the input schemas of record.ingest and
// record.ingest_many under policy p: the object is one of the policy's,
// and for each object its records carry an id (a UUID) and only the
// listed fields.
func ingestSchemas(p *IngestPolicy) (one, many map[string]any) {
	names := slices.Sorted(maps.Keys(p.Objects))
	record := func(o IngestObject) map[string]any {
		props := map[string]any{"id": uuidSchema}
		for _, f := range o.Fields {
			props[f] = map[string]any{"description": "a field the ingest policy allows"}
		}
		return map[string]any{"type": "object", "required": []string{"id"}, "minProperties": 2,
			"properties": props, "additionalProperties": false}
	}
	var oneRules, manyRules []any
	for _, name := range names {
		o := p.Objects[name]
		when := map[string]any{"properties": map[string]any{"object": map[string]any{"const": name}}}
		oneRules = append(oneRules, map[string]any{"if": when, "then": map[string]any{
			"properties": map[string]any{"record": record(o)}}})
		manyRules = append(manyRules, map[string]any{"if": when, "then": map[string]any{
			"properties": map[string]any{"records": map[string]any{"maxItems": o.MaxBatchRecords, "items": record(o)}}}})
	}
	obj := map[string]any{"type": "string", "enum": names,
		"description": "the plural API name of an object the ingest policy lists"}
	one = strict([]string{"object", "record"}, map[string]any{
		"object": obj,
		"record": map[string]any{"type": "object",
			"description": "the record: its id (a UUID chosen by the caller, the upsert key) and fields the policy lists for the object"},
	})
	one["allOf"] = oneRules
	many = strict([]string{"object", "records"}, map[string]any{
		"object": obj,
		"records": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxBatchRecords, "items": map[string]any{"type": "object"},
			"description": "1 to the object's maxBatchRecords records, each with its id and fields the policy lists"},
	})
	many["allOf"] = manyRules
	return one, many
}
