package twenty

import (
	"encoding/json"
)

// Input bounds.
const (
	// MaxListLimit is the largest page record.list asks for (Twenty's
	// REST page limit).
	MaxListLimit = 200
	// MaxBatchRecords is the most records one batch creates (api.mdx:
	// "Batch size | 60 records per call").
	MaxBatchRecords = 60
	// MaxFilterMatches is the most records update_many, soft_delete_many,
	// restore_many and destroy_many act on: their filter is counted first,
	// soft-deleted matches included, and more matches are refused
	// (twenty.too_many_matches).
	MaxFilterMatches = MaxBatchRecords
	// MaxRecordBytes bounds one record body as JSON; MaxRecordFields its
	// fields.
	MaxRecordBytes  = 256 << 10
	MaxRecordFields = 1024
	// MaxFilterBytes bounds record.list's filter, MaxOrderByBytes its
	// order_by and MaxCursorBytes a cursor.
	MaxFilterBytes  = 8 << 10
	MaxOrderByBytes = 1 << 10
	MaxCursorBytes  = 1 << 10
	// MaxGroupByBytes bounds record.group_by's group_by as JSON;
	// MaxGroupByFields its entries.
	MaxGroupByBytes  = 4 << 10
	MaxGroupByFields = 16
	// MaxFields bounds the fields selection (api.mdx: 200 fields are
	// returned when none are selected).
	MaxFields = 200
)

// uuidSchema is a record ID: Twenty's record IDs are UUIDs.
var uuidSchema = map[string]any{
	"type": "string", "pattern": uuidPattern.String(),
	"description": "the record's id (a UUID)",
}

func objectSchema(objects []string) map[string]any {
	return map[string]any{
		"type": "string", "enum": objects,
		"description": "the plural API name of the object (e.g. people, companies)",
	}
}

func fieldsSchema() map[string]any {
	return map[string]any{
		"type": "array", "minItems": 1, "maxItems": MaxFields, "uniqueItems": true,
		"items":       map[string]any{"type": "string", "pattern": `^[a-zA-Z][A-Za-z0-9]{0,62}$`},
		"description": "only these fields are returned (id always is); sent as the fields query parameter",
	}
}

func depthSchema() map[string]any {
	return map[string]any{"type": "integer", "minimum": 0, "maximum": 1,
		"description": "0: relations as their join column; 1: the relations listed in fields expanded"}
}

func recordSchema(minProps int) map[string]any {
	return map[string]any{
		"type": "object", "minProperties": minProps, "maxProperties": MaxRecordFields,
		"description": "the record's fields as the workspace's schema names them (at most 256 KiB as JSON)",
	}
}

func cursorSchema(what string) map[string]any {
	return map[string]any{"type": "string", "minLength": 1, "maxLength": MaxCursorBytes, "description": what}
}

func strict(required []string, props map[string]any) map[string]any {
	if required == nil {
		required = []string{}
	}
	return map[string]any{"type": "object", "required": required, "properties": props, "additionalProperties": false}
}

// inputSchemas returns each operation's input schema for the configured
// objects.
func inputSchemas(objects []string, policy *IngestPolicy) map[string]json.RawMessage {
	obj := objectSchema(objects)
	list := strict([]string{"object"}, map[string]any{
		"object": obj,
		"filter": map[string]any{"type": "string", "minLength": 1, "maxLength": MaxFilterBytes,
			"description": "Twenty's filter expression, e.g. name.firstName[eq]:John or and(a[gte]:1,b[is]:NULL)"},
		"order_by": map[string]any{"type": "string", "minLength": 1, "maxLength": MaxOrderByBytes,
			"description": "Twenty's order expression, e.g. createdAt[DescNullsLast]"},
		"limit":          map[string]any{"type": "integer", "minimum": 1, "maximum": MaxListLimit, "description": "page size"},
		"starting_after": cursorSchema("the endCursor of the previous page: the page after it"),
		"ending_before":  cursorSchema("the startCursor of the next page: the page before it"),
		"fields":         fieldsSchema(),
		"depth":          depthSchema(),
	})
	list["not"] = map[string]any{"required": []string{"starting_after", "ending_before"}}
	filter := map[string]any{"type": "string", "minLength": 1, "maxLength": MaxFilterBytes,
		"description": "Twenty's filter expression selecting the records, e.g. id[in]:[\"<uuid>\",\"<uuid>\"] or companyId[eq]:\"<uuid>\""}
	ids := func(minItems int, what string) map[string]any {
		return map[string]any{"type": "array", "minItems": minItems, "maxItems": MaxBatchRecords, "uniqueItems": true,
			"items": uuidSchema, "description": what}
	}
	duplicates := strict([]string{"object"}, map[string]any{
		"object": obj,
		"ids":    ids(1, "1 to 60 record IDs whose duplicates to find"),
		"records": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxBatchRecords,
			"items": recordSchema(1), "description": "1 to 60 records (not yet created) whose duplicates to find; sent as data"},
		"depth": depthSchema(),
	})
	duplicates["oneOf"] = []any{
		map[string]any{"required": []string{"ids"}},
		map[string]any{"required": []string{"records"}},
	}
	metadataPage := func() map[string]any {
		return strict(nil, map[string]any{
			"limit":          map[string]any{"type": "integer", "minimum": 1, "maximum": MaxListLimit, "description": "page size"},
			"starting_after": cursorSchema("the endCursor of the previous page"),
		})
	}
	schemas := map[string]any{
		OpList: list,
		OpGet: strict([]string{"object", "id"}, map[string]any{
			"object": obj, "id": uuidSchema, "fields": fieldsSchema(), "depth": depthSchema(),
		}),
		OpCreate: strict([]string{"object", "record"}, map[string]any{
			"object": obj, "record": recordSchema(0),
		}),
		OpUpdate: strict([]string{"object", "id", "record"}, map[string]any{
			"object": obj, "id": uuidSchema, "record": recordSchema(1),
		}),
		OpSoftDelete: strict([]string{"object", "id"}, map[string]any{
			"object": obj, "id": uuidSchema,
		}),
		OpCreateMany: strict([]string{"object", "records"}, map[string]any{
			"object": obj,
			"records": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxBatchRecords,
				"items": recordSchema(0), "description": "1 to 60 records to create in one call"},
		}),
		OpMetadataList:   metadataPage(),
		OpFindDuplicates: duplicates,
		OpGroupBy: strict([]string{"object", "group_by"}, map[string]any{
			"object": obj,
			"group_by": map[string]any{"type": "array", "minItems": 1, "maxItems": MaxGroupByFields,
				"items":       map[string]any{"type": "object", "minProperties": 1, "maxProperties": 1},
				"description": `the fields to group by, one per entry, as Twenty's group_by takes them (at most 4 KiB as JSON): {"<field>": true}, {"<composite field>": {"<sub-field>": true}} or {"<date field>": {"granularity": "DAY"}}`},
			"filter": filter,
			"limit":  map[string]any{"type": "integer", "minimum": 1, "maximum": MaxListLimit, "description": "most groups returned"},
		}),
		OpUpdateMany: strict([]string{"object", "filter", "record"}, map[string]any{
			"object": obj, "filter": filter, "record": recordSchema(1),
		}),
		OpSoftDeleteMany: strict([]string{"object", "filter"}, map[string]any{"object": obj, "filter": filter}),
		OpRestore:        strict([]string{"object", "id"}, map[string]any{"object": obj, "id": uuidSchema}),
		OpRestoreMany:    strict([]string{"object", "filter"}, map[string]any{"object": obj, "filter": filter}),
		OpDestroy:        strict([]string{"object", "id"}, map[string]any{"object": obj, "id": uuidSchema}),
		OpDestroyMany:    strict([]string{"object", "filter"}, map[string]any{"object": obj, "filter": filter}),
		OpMerge: strict([]string{"object", "ids", "conflict_priority_index"}, map[string]any{
			"object": obj,
			"ids":    ids(2, "2 to 60 IDs of the records to merge"),
			"conflict_priority_index": map[string]any{"type": "integer", "minimum": 0, "maximum": MaxBatchRecords - 1,
				"description": "the index in ids of the record that is kept and whose values win conflicts"},
			"dry_run": map[string]any{"type": "boolean", "description": "preview the merged record without merging (default false)"},
			"depth":   depthSchema(),
		}),
		OpMetadataGet: strict([]string{"resource", "id"}, map[string]any{
			"resource": map[string]any{"type": "string", "enum": []string{"objects", "fields"}, "description": "objects or fields"},
			"id":       map[string]any{"type": "string", "pattern": uuidPattern.String(), "description": "the object's or field's id (a UUID)"},
		}),
		OpMetadataFields: metadataPage(),
		OpOpenAPICore:    strict(nil, map[string]any{}),
		OpOpenAPIMeta:    strict(nil, map[string]any{}),
	}
	if policy != nil {
		schemas[OpIngest], schemas[OpIngestMany] = ingestSchemas(policy)
	}
	out := make(map[string]json.RawMessage, len(schemas))
	for op, s := range schemas {
		raw, err := json.Marshal(s)
		if err != nil {
			panic("twenty: input schema of " + op + ": " + err.Error())
		}
		out[op] = raw
	}
	return out
}

// outputSchemas are each operation's output schema.
var outputSchemas = map[string]json.RawMessage{
	OpList: json.RawMessage(`{"type":"object","required":["object","records"],"properties":{
		"object":{"type":"string"},"records":{"type":"array","items":{"type":"object"}},
		"page_info":{"type":"object"},"total_count":{"type":"integer"},
		` + fieldsCapSchema + `}}`),
	OpGet:        json.RawMessage(`{"type":"object","required":["object","record"],"properties":{"object":{"type":"string"},"record":{"type":"object"},` + fieldsCapSchema + `}}`),
	OpCreate:     json.RawMessage(`{"type":"object","required":["object","record"],"properties":{"object":{"type":"string"},"record":{"type":"object"},` + fieldsCapSchema + `}}`),
	OpUpdate:     json.RawMessage(`{"type":"object","required":["object","record"],"properties":{"object":{"type":"string"},"record":{"type":"object"},` + fieldsCapSchema + `}}`),
	OpSoftDelete: json.RawMessage(`{"type":"object","required":["object","record"],"properties":{"object":{"type":"string"},"record":{"type":"object"},` + fieldsCapSchema + `}}`),
	OpCreateMany: json.RawMessage(`{"type":"object","required":["object","records"],"properties":{
		"object":{"type":"string"},"records":{"type":"array","items":{"type":"object"}},` + fieldsCapSchema + `}}`),
	OpMetadataList: json.RawMessage(`{"type":"object","required":["objects"],"properties":{
		"objects":{"type":"array","items":{"type":"object"}},"page_info":{"type":"object"},"total_count":{"type":"integer"}}}`),
	OpFindDuplicates: json.RawMessage(`{"type":"object","required":["object","duplicates"],"properties":{
		"object":{"type":"string"},"duplicates":{"type":"array","items":{"type":"object"}}}}`),
	OpGroupBy: json.RawMessage(`{"type":"object","required":["object","groups"],"properties":{
		"object":{"type":"string"},"groups":{"type":"array","items":{"type":"object"}}}}`),
	OpIngest:         recordOutputSchema,
	OpIngestMany:     recordsOutput,
	OpUpdateMany:     recordsOutput,
	OpSoftDeleteMany: recordsOutput,
	OpRestore:        recordOutputSchema,
	OpRestoreMany:    recordsOutput,
	OpDestroy:        recordOutputSchema,
	OpDestroyMany:    recordsOutput,
	OpMerge:          recordOutputSchema,
	OpMetadataGet: json.RawMessage(`{"type":"object","required":["resource","item"],"properties":{
		"resource":{"type":"string"},"item":{"type":"object"}}}`),
	OpMetadataFields: json.RawMessage(`{"type":"object","required":["fields"],"properties":{
		"fields":{"type":"array","items":{"type":"object"}},"page_info":{"type":"object"},"total_count":{"type":"integer"}}}`),
	OpOpenAPICore: documentOutputSchema,
	OpOpenAPIMeta: documentOutputSchema,
}

var (
	recordOutputSchema = json.RawMessage(`{"type":"object","required":["object","record"],"properties":{"object":{"type":"string"},"record":{"type":"object"},` + fieldsCapSchema + `}}`)
	recordsOutput      = json.RawMessage(`{"type":"object","required":["object","records"],"properties":{
		"object":{"type":"string"},"records":{"type":"array","items":{"type":"object"}},` + fieldsCapSchema + `}}`)
	documentOutputSchema = json.RawMessage(`{"type":"object","required":["document"],"properties":{
		"document":{"type":"object","required":["openapi"],"properties":{"openapi":{"type":"string"}}}}}`)
)

// fieldsCapSchema are the output members of a capped fields selection
// (fieldsCap).
const fieldsCapSchema = `"fields_capped":{"type":"boolean","description":"Twenty returned only fields_max of the record's fields (fields was not given): pass fields to read the others"},"fields_max":{"type":"integer"}`
