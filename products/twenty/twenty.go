package twenty

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Operations: the part of a capability ID after "cap:twenty:".
const (
	OpList           = "record.list"
	OpGet            = "record.get"
	OpFindDuplicates = "record.find_duplicates"
	OpGroupBy        = "record.group_by"
	OpCreate         = "record.create"
	OpCreateMany     = "record.create_many"
	OpIngest         = "record.ingest"
	OpIngestMany     = "record.ingest_many"
	OpUpdate         = "record.update"
	OpUpdateMany     = "record.update_many"
	OpSoftDelete     = "record.soft_delete"
	OpSoftDeleteMany = "record.soft_delete_many"
	OpRestore        = "record.restore"
	OpRestoreMany    = "record.restore_many"
	OpDestroy        = "record.destroy"
	OpDestroyMany    = "record.destroy_many"
	OpMerge          = "record.merge"
	OpMetadataList   = "metadata.list"
	OpMetadataGet    = "metadata.get"
	OpMetadataFields = "metadata.fields"
	OpOpenAPICore    = "openapi.core"
	OpOpenAPIMeta    = "openapi.metadata"
)

// CapabilityPrefix starts every capability ID.
const CapabilityPrefix = "cap:twenty:"

// CodeRecordTooLarge is the failed result of a record body larger than
// MaxRecordBytes.
const CodeRecordTooLarge = "twenty.record_too_large"

// CodeTooManyMatches is the failed result of a filter-form update, soft
// delete, restore or permanent delete whose filter matches more than
// MaxFilterMatches records, soft-deleted ones included: nothing is
// changed.
const CodeTooManyMatches = "twenty.too_many_matches"

// CodeUnknownCapability answers an action for an operation the connector
// does not offer (not one of its operations, or left out of
// --twenty-operations-file).
const CodeUnknownCapability = "twenty.unknown_capability"

// operation is one row of the operations table.
type operation struct {
	op, name, description string
	mutation              bool
	risk                  aip.Risk
	// objectless operations take no "object" input (metadata, OpenAPI).
	objectless bool
	// destructive operations delete irreversibly (the permanent deletes,
	// and merge, which deletes the merged-away records, permanently but for
	// people): they are offered only when --twenty-operations-file lists
	// them.
	destructive bool
	// ingest operations are offered only when --twenty-operations-file
	// lists them, and need the idempotent ingest policy.
	ingest bool
	// deletes: the operation deletes records (softly or permanently); its
	// contract declares the delete side effect.
	deletes bool
}

// operations lists the operations in manifest order.
var operations = []operation{
	{op: OpList, name: "List records", description: "Lists records of an object: GET /rest/<object> with Twenty's filter, order_by, limit and starting_after or ending_before cursors; returns the records, pageInfo and totalCount.", risk: aip.RiskLow},
	{op: OpGet, name: "Get a record", description: "Reads one record: GET /rest/<object>/<id>.", risk: aip.RiskLow},
	{op: OpFindDuplicates, name: "Find duplicate records", description: "Finds the records Twenty considers duplicates of 1 to 60 given records or record IDs: POST /rest/<object>/duplicates (a read); returns one entry per input with its duplicates.", risk: aip.RiskLow},
	{op: OpGroupBy, name: "Group records", description: "Groups the records of an object by one or more fields: GET /rest/<object>/groupBy with group_by, filter and limit; returns one entry per group with its dimension values and aggregates.", risk: aip.RiskLow},
	{op: OpCreate, name: "Create a record", description: "Creates one record: POST /rest/<object> with the record's fields; returns the created record.", mutation: true, risk: aip.RiskMedium},
	{op: OpCreateMany, name: "Create records in a batch", description: "Creates 1 to 60 records of one object in one call: POST /rest/batch/<object>; returns the created records.", mutation: true, risk: aip.RiskMedium},
	{op: OpIngest, name: "Ingest a record", description: "Creates or updates one record by its id (an upsert, so sending it again changes nothing more): POST /rest/<object>?upsert=true with the id and fields the ingest policy allows; returns the record. Offered only when the operator lists it and configures an ingest policy.", mutation: true, risk: aip.RiskMedium, ingest: true},
	{op: OpIngestMany, name: "Ingest records in a batch", description: "Creates or updates 1 to the policy's maxBatchRecords (at most 60) records of one object by their ids: POST /rest/batch/<object>?upsert=true; returns the records. Twenty updates the existing records before inserting the new ones, not atomically: a refusal of a batch of several records is outcome_unknown (read the records by id). Offered only when the operator lists it and configures an ingest policy.", mutation: true, risk: aip.RiskMedium, ingest: true},
	{op: OpUpdate, name: "Update a record", description: "Updates the given fields of one record: PATCH /rest/<object>/<id>; returns the updated record.", mutation: true, risk: aip.RiskMedium},
	{op: OpUpdateMany, name: "Update records matching a filter", description: "Sets the given fields on every record of an object that matches a filter: PATCH /rest/<object>?filter=...; returns the updated records. Soft-deleted matches are updated too (add deletedAt[is]:NULL to the filter to leave them out). A filter matching more than 60 records, soft-deleted ones included, is refused (twenty.too_many_matches) and nothing is changed.", mutation: true, risk: aip.RiskHigh},
	{op: OpSoftDelete, name: "Soft-delete a record", description: "Soft-deletes one record (it can be restored in Twenty): DELETE /rest/<object>/<id>?soft_delete=true.", mutation: true, risk: aip.RiskMedium, deletes: true},
	{op: OpSoftDeleteMany, name: "Soft-delete records matching a filter", description: "Soft-deletes every record of an object that matches a filter (they can be restored): DELETE /rest/<object>?filter=...&soft_delete=true; returns the deleted records' IDs. Soft-deleted matches are deleted again (deletedAt[is]:NULL in the filter leaves them out, though Twenty then answers no records). A filter matching more than 60 records, soft-deleted ones included, is refused (twenty.too_many_matches) and nothing is deleted.", mutation: true, risk: aip.RiskHigh, deletes: true},
	{op: OpRestore, name: "Restore a record", description: "Restores one soft-deleted record: PATCH /rest/restore/<object>/<id>; returns the restored record.", mutation: true, risk: aip.RiskMedium},
	{op: OpRestoreMany, name: "Restore records matching a filter", description: "Restores every soft-deleted record of an object that matches a filter: PATCH /rest/restore/<object>?filter=...; returns every match, live ones included (Twenty restores them too; deletedAt[is]:NOT_NULL in the filter leaves them out, though Twenty then answers no records). A filter matching more than 60 records, live and soft-deleted, is refused (twenty.too_many_matches) and nothing is changed.", mutation: true, risk: aip.RiskMedium},
	{op: OpDestroy, name: "Permanently delete a record", description: "Deletes one record permanently; it cannot be restored: DELETE /rest/<object>/<id>?soft_delete=false. Offered only when the operator lists it.", mutation: true, risk: aip.RiskCritical, destructive: true, deletes: true},
	{op: OpDestroyMany, name: "Permanently delete records matching a filter", description: "Deletes every record of an object that matches a filter permanently; they cannot be restored: DELETE /rest/<object>?filter=...&soft_delete=false. A filter matching more than 60 records, soft-deleted ones included, is refused (twenty.too_many_matches) and nothing is deleted. Offered only when the operator lists it.", mutation: true, risk: aip.RiskCritical, destructive: true, deletes: true},
	{op: OpMerge, name: "Merge records", description: "Merges 2 to 60 records of an object into one: Twenty keeps the record at conflict_priority_index, merges the others' values and relations into it and deletes the others (soft for people, permanently for other objects in recent Twenty versions), so a merge cannot be undone; with dry_run it only previews the merged record (under a new ID). PATCH /rest/<object>/merge; returns the merged record. Offered only when the operator lists it.", mutation: true, risk: aip.RiskCritical, destructive: true, deletes: true},
	{op: OpMetadataList, name: "List objects", description: "Lists the workspace's objects and their fields: GET /rest/metadata/objects.", risk: aip.RiskLow, objectless: true},
	{op: OpMetadataGet, name: "Get an object or a field", description: "Reads one object's or one field's metadata by ID: GET /rest/metadata/objects/<id> or /rest/metadata/fields/<id>.", risk: aip.RiskLow, objectless: true},
	{op: OpMetadataFields, name: "List fields", description: "Lists the workspace's fields: GET /rest/metadata/fields.", risk: aip.RiskLow, objectless: true},
	{op: OpOpenAPICore, name: "Core API OpenAPI document", description: "Reads the OpenAPI document Twenty generates for this workspace's Core (records) REST API: GET /rest/open-api/core.", risk: aip.RiskLow, objectless: true},
	{op: OpOpenAPIMeta, name: "Metadata API OpenAPI document", description: "Reads the OpenAPI document Twenty generates for the Metadata REST API: GET /rest/open-api/metadata.", risk: aip.RiskLow, objectless: true},
}

// lookup returns the operations table row of op.
func lookup(op string) (operation, bool) {
	i := slices.IndexFunc(operations, func(o operation) bool { return o.op == op })
	if i < 0 {
		return operation{}, false
	}
	return operations[i], true
}

// CapabilityID returns cap:twenty:<operation>.
func CapabilityID(op string) string { return CapabilityPrefix + op }

// Connector is the Twenty connector. It implements hostsdk.Connector,
// hostsdk.HealthChecker and hostsdk.RouteProvider.
type Connector struct {
	cfg    Config
	client *provider.Client
	inputs map[string]json.RawMessage
	// admitted are the operations offered (cfg.Operations or
	// DefaultOperations).
	admitted map[string]bool
	// replayCapacity is the webhook replay fence's capacity
	// (ReplayCapacity; tests lower it).
	replayCapacity int
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.RouteProvider = (*Connector)(nil)
)

// New checks cfg and returns a connector. It does no I/O.
func New(cfg Config) (*Connector, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	token := cfg.Token
	rt := cfg.Transport
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	client, err := provider.New(provider.Config{
		Product:          "twenty",
		BaseURL:          cfg.BaseURL,
		MaxResponseBytes: cfg.MaxResponseBytes,
		Timeout:          Timeout,
		UserAgent:        "aipfleet-twenty",
		// api.mdx, "Authentication": Authorization: Bearer YOUR_API_KEY.
		// The client never lets net/http resend a mutation; it sends one
		// again only when Twenty refused it 401 or 403 and the key's file
		// changed (provider.Config.Secrets).
		Auth:      func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token.Reveal()) },
		Secrets:   []provider.Secret{token},
		Transport: rt,
	})
	if err != nil {
		return nil, err
	}
	admitted, err := admit(cfg.Operations)
	if err != nil {
		return nil, err
	}
	return &Connector{cfg: cfg, client: client, inputs: inputSchemas(cfg.Objects, cfg.IngestPolicy), admitted: admitted, replayCapacity: ReplayCapacity}, nil
}

// contract is a capability's contract: a read is safe to retry; a
// mutation needs an idempotency key (sent scoped to the tenant and the
// capability as Idempotency-Key, provider.CallIdempotencyKey) and is never
// retried, since api.mdx does not say Twenty deduplicates by it, so its
// unknown outcome stays unknown. A deletion also declares the delete side
// effect.
func contract(o operation) *aip.CapabilityContract {
	mutation := o.mutation
	c := &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork},
		Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional,
			CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
		Execution: aip.ExecutionContract{SupportsSync: true, SupportsRetry: true,
			ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
		Data: aip.DataContract{Sensitivity: aip.SensitivityConfidential, ContainsPII: true},
	}
	if mutation {
		c.SideEffects = []aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork}
		if o.deletes {
			c.SideEffects = []aip.SideEffect{aip.EffectWrite, aip.EffectDelete, aip.EffectExternalNetwork}
		}
		c.Idempotency.Requirement = aip.IdempotencyRequired
		c.Execution.SupportsRetry = false
		c.Execution.RetrySafety = aip.RetryUnsafe
		c.Compensation = &aip.CompensationContract{Mode: aip.CompensationRollbackUnsupported}
	}
	return c
}

// Manifest implements hostsdk.Connector.
func (c *Connector) Manifest(context.Context, hostsdk.TenantContext) (*aip.Manifest, error) {
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent: aip.Principal{ID: "agent:twenty:" + c.cfg.WorkspaceID, Kind: aip.PrincipalAgent,
			DisplayName: "Twenty CRM workspace " + c.cfg.WorkspaceID},
		Profiles: []string{aip.NativeHTTPProfile},
	}
	for _, o := range operations {
		if !c.admitted[o.op] {
			continue
		}
		no := false
		m.Capabilities = append(m.Capabilities, aip.Capability{
			ID: CapabilityID(o.op), Name: o.name, Kind: aip.KindTool, Description: o.description,
			InputSchema: c.inputs[o.op], OutputSchema: outputSchemas[o.op],
			Risk: o.risk, Stability: aip.StabilityStable, RequiresHumanApproval: &no,
			Contract: contract(o),
		})
	}
	if !c.cfg.WebhookSecret.Empty() {
		ch, _ := json.Marshal(map[string]any{
			"id": Channel, "system": "twenty",
			"description": "verified Twenty webhook deliveries (POST /webhooks/twenty), one event per delivery, kind twenty.<eventName>",
		})
		m.Channels = []json.RawMessage{ch}
	}
	return m, nil
}

// input is the union of the capabilities' inputs (the host has validated
// the input against the capability's schema).
type input struct {
	Object        string            `json:"object"`
	ID            string            `json:"id"`
	Filter        string            `json:"filter"`
	OrderBy       string            `json:"order_by"`
	Limit         int               `json:"limit"`
	StartingAfter string            `json:"starting_after"`
	EndingBefore  string            `json:"ending_before"`
	Fields        []string          `json:"fields"`
	Depth         *int              `json:"depth"`
	Record        json.RawMessage   `json:"record"`
	Records       []json.RawMessage `json:"records"`
	IDs           []string          `json:"ids"`
	GroupBy       json.RawMessage   `json:"group_by"`
	Priority      *int              `json:"conflict_priority_index"`
	DryRun        bool              `json:"dry_run"`
	Resource      string            `json:"resource"`
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	op, _ := strings.CutPrefix(call.Action.CapabilityID, CapabilityPrefix)
	o, ok := lookup(op)
	if !ok || !c.admitted[op] {
		return nil, aip.NewProtocolError(CodeUnknownCapability, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("capability %s is not offered by this connector (operations: %s)", call.Action.CapabilityID, strings.Join(c.offered(), ", ")))
	}
	// Twenty keeps records in PostgreSQL (TypeORM over node-postgres),
	// which cannot hold U+0000 in text or jsonb nor compare with it; its
	// REST API answers the database's refusal with a 500 (see the package
	// comment), so an input holding it is refused before any request.
	if err := provider.RefuseNUL(hostsdk.CodeInputInvalid, "Twenty", call); err != nil {
		return nil, err
	}
	var in input
	// Integers spelled as other numbers (5.0, 1e0), which the schema's
	// "integer" accepts, are read as the integers they are.
	if err := json.Unmarshal(provider.IntegralNumbers(call.Action.Input), &in); err != nil {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, "input: "+err.Error())
	}
	if !o.objectless && !slices.Contains(c.cfg.Objects, in.Object) {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("object %q is not one of the configured objects %v", provider.Excerpt(in.Object), c.cfg.Objects))
	}
	if res := c.checkSizes(call, in); res != nil {
		return res, nil
	}
	objectPath := "/rest/" + url.PathEscape(in.Object)
	switch op {
	case OpList:
		return c.list(ctx, call, in)
	case OpGet:
		return c.single(ctx, call, in, provider.Request{Method: http.MethodGet, Path: recordPath(in), Query: selection(in)}, false)
	case OpFindDuplicates:
		return c.findDuplicates(ctx, call, in)
	case OpGroupBy:
		return c.groupBy(ctx, call, in)
	case OpCreate:
		// POST /rest/<objectNamePlural> (api.mdx, "Core API": CRUD on records).
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPost, Path: objectPath, JSON: in.Record}, true)
	case OpCreateMany:
		// POST /rest/batch/<objectNamePlural> with a JSON array (api.mdx,
		// "Batch operations": at most 60 records per request; the page does
		// not spell the path, which is the generated REST API's).
		return c.many(ctx, call, in, provider.Request{Method: http.MethodPost, Path: "/rest/batch/" + url.PathEscape(in.Object), JSON: in.Records})
	case OpIngest:
		// POST /rest/<objectNamePlural>?upsert=true (the generated REST
		// API's upsert parameter: create, or update the record with that
		// id if it exists).
		if err := c.checkIngest(in, []json.RawMessage{in.Record}); err != nil {
			return nil, err
		}
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPost, Path: objectPath,
			Query: url.Values{"upsert": {"true"}}, JSON: in.Record}, true)
	case OpIngestMany:
		if err := c.checkIngest(in, in.Records); err != nil {
			return nil, err
		}
		return c.many(ctx, call, in, provider.Request{Method: http.MethodPost, Path: "/rest/batch/" + url.PathEscape(in.Object),
			Query: url.Values{"upsert": {"true"}}, JSON: in.Records})
	case OpUpdate:
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPatch, Path: recordPath(in), JSON: in.Record}, true)
	case OpUpdateMany:
		filter, res, err := c.boundMatches(ctx, call, in)
		if res != nil || err != nil {
			return res, err
		}
		// PATCH /rest/<objectNamePlural>?filter=... with the fields to set
		// (api.mdx, "Batch operations": update; the filter form is the
		// generated REST API's updateMany<Objects>), the count's filter.
		return c.many(ctx, call, in, provider.Request{Method: http.MethodPatch, Path: objectPath,
			Query: url.Values{"filter": {filter}}, JSON: in.Record})
	case OpSoftDelete:
		// soft_delete=true: Twenty's generated REST API deletes the record
		// permanently when soft_delete is absent or false (its default).
		return c.single(ctx, call, in, provider.Request{Method: http.MethodDelete, Path: recordPath(in),
			Query: url.Values{"soft_delete": {"true"}}}, true)
	case OpSoftDeleteMany:
		filter, res, err := c.boundMatches(ctx, call, in)
		if res != nil || err != nil {
			return res, err
		}
		// DELETE /rest/<objectNamePlural>?filter=...&soft_delete=true (the
		// generated REST API's deleteMany<Objects>), the count's filter.
		return c.many(ctx, call, in, provider.Request{Method: http.MethodDelete, Path: objectPath,
			Query: url.Values{"filter": {filter}, "soft_delete": {"true"}}})
	case OpRestore:
		// PATCH /rest/restore/<objectNamePlural>/<id>, no body (the
		// generated REST API's restoreOne<Object>).
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPatch,
			Path: "/rest/restore/" + url.PathEscape(in.Object) + "/" + url.PathEscape(in.ID)}, true)
	case OpRestoreMany:
		filter, res, err := c.boundMatches(ctx, call, in)
		if res != nil || err != nil {
			return res, err
		}
		// PATCH /rest/restore/<objectNamePlural>?filter=..., no body (the
		// generated REST API's restoreMany<Objects>), the count's filter.
		return c.many(ctx, call, in, provider.Request{Method: http.MethodPatch, Path: "/rest/restore/" + url.PathEscape(in.Object),
			Query: url.Values{"filter": {filter}}})
	case OpDestroy:
		// soft_delete=false said explicitly: a permanent delete.
		return c.single(ctx, call, in, provider.Request{Method: http.MethodDelete, Path: recordPath(in),
			Query: url.Values{"soft_delete": {"false"}}}, true)
	case OpDestroyMany:
		filter, res, err := c.boundMatches(ctx, call, in)
		if res != nil || err != nil {
			return res, err
		}
		return c.many(ctx, call, in, provider.Request{Method: http.MethodDelete, Path: objectPath,
			Query: url.Values{"filter": {filter}, "soft_delete": {"false"}}})
	case OpMerge:
		return c.merge(ctx, call, in)
	case OpMetadataList:
		return c.metadataList(ctx, call, in, "objects")
	case OpMetadataFields:
		return c.metadataList(ctx, call, in, "fields")
	case OpMetadataGet:
		return c.metadataGet(ctx, call, in)
	case OpOpenAPICore:
		return c.openAPI(ctx, call, "/rest/open-api/core")
	case OpOpenAPIMeta:
		return c.openAPI(ctx, call, "/rest/open-api/metadata")
	}
	return nil, fmt.Errorf("twenty: operation %q has no handler", op)
}

// checkIngest enforces the ingest policy on records (the input schema
// says the same; this holds when Handle is called without a host): the
// object is listed, each record has a UUID id, distinct within the batch,
// and only listed fields, and the batch is within maxBatchRecords.
func (c *Connector) checkIngest(in input, records []json.RawMessage) error {
	invalid := func(format string, args ...any) error {
		return aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, fmt.Sprintf(format, args...))
	}
	o, ok := c.cfg.IngestPolicy.Objects[in.Object]
	if !ok {
		return invalid("the ingest policy does not list object %q", provider.Excerpt(in.Object))
	}
	if len(records) > o.MaxBatchRecords {
		return invalid("%d records; the ingest policy allows at most %d for %s", len(records), o.MaxBatchRecords, in.Object)
	}
	ids := map[string]bool{}
	for i, raw := range records {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(raw, &rec); err != nil {
			return invalid("record %d is not an object", i)
		}
		var id string
		if err := json.Unmarshal(rec["id"], &id); err != nil || !uuidPattern.MatchString(id) {
			return invalid("record %d has no id (a UUID): ingest upserts by id", i)
		}
		if ids[strings.ToLower(id)] {
			return invalid("record %d repeats id %s", i, id)
		}
		ids[strings.ToLower(id)] = true
		for f := range rec {
			if f != "id" && !slices.Contains(o.Fields, f) {
				return invalid("record %d: the ingest policy does not allow field %q of %s", i, provider.Excerpt(f), in.Object)
			}
		}
	}
	return nil
}

// boundMatches counts the records the filter of update_many,
// soft_delete_many, restore_many or destroy_many matches (GET
// /rest/<object>?filter=...&limit=1, its totalCount) and refuses the action when they are more
// than MaxFilterMatches, api.mdx's batch size: a filter that matches a
// whole object (id[is]:NOT_NULL) must not update or delete it in one
// action. The count is a read taken before the mutation: when it fails the
// action fails and nothing was sent; records created between the count
// and the mutation are not counted. It returns the filter the mutation
// sends: the count's, so that the same string parses to the same filter.
//
// A list leaves soft-deleted records out unless its filter names
// deletedAt (Twenty's find-many then reads them too: applyDeletedAtToBuilder),
// but Twenty's mutations by filter apply the filter alone, to every match,
// soft-deleted or not (the common update-many, delete-many, restore-many
// and destroy-many query runners call applyFilterToBuilder only, and
// TypeORM adds its "deletedAt IS NULL" to select queries only): an update
// sets the fields of soft-deleted matches too, a soft delete deletes them
// again, a permanent delete removes them, and a restore sets deletedAt to
// NULL on every match, live ones included, and answers and announces them
// all as restored. So the count and the mutation use the filter
// countAllFilter makes of the caller's: the same matches, with deletedAt
// named in a condition every record meets. A filter that
// could change the meaning of that wrapper is refused first
// (checkWrappable).
func (c *Connector) boundMatches(ctx context.Context, call *hostsdk.Call, in input) (string, *aip.ActionResult, error) {
	if err := checkWrappable(in.Filter); err != nil {
		return "", nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, "filter: "+err.Error())
	}
	filter := countAllFilter(in.Filter)
	req := provider.Request{Method: http.MethodGet, Path: "/rest/" + url.PathEscape(in.Object),
		Query: url.Values{"filter": {filter}, "limit": {"1"}}}
	a, err := c.do(ctx, req)
	if err != nil {
		res, err := provider.Result(call, err, false)
		return "", res, err
	}
	if a.TotalCount == nil {
		res, err := provider.Result(call, badAnswer(req, 200, "the answer has no totalCount to count the filter's matches"), false)
		return "", res, err
	}
	if n := *a.TotalCount; n > MaxFilterMatches {
		return "", call.Fail(CodeTooManyMatches, aip.CategoryPermanent, false,
			fmt.Sprintf("the filter matches %d %s (soft-deleted ones included: Twenty's mutations by filter act on them too); %s acts on at most %d records per action (Twenty's batch size): narrow the filter (e.g. id[in]:[...], or deletedAt[is]:NULL for the live records only) and split the work",
				n, in.Object, call.Action.CapabilityID, MaxFilterMatches)), nil
	}
	return filter, nil, nil
}

// countAllFilter is filter extended so that a list counts every record it
// matches, soft-deleted ones included: and(<filter>,or(deletedAt[is]:NULL,
// deletedAt[is]:NOT_NULL)). The added condition holds for every record;
// naming deletedAt makes Twenty read soft-deleted records too. It means
// "filter, and a condition every record meets" only for a filter
// checkWrappable accepts.
func countAllFilter(filter string) string {
	return "and(" + filter + ",or(deletedAt[is]:NULL,deletedAt[is]:NOT_NULL))"
}

// rootConjunction is Twenty's ROOT_FILTER_CONJUNCTION_REGEX: a filter it
// takes for one conjunction, which it parses as is instead of wrapping it
// in and(...).
var rootConjunction = regexp.MustCompile(`^(or|and|not)\((.+)\)$`)

// checkWrappable says why filter cannot go inside and(<filter>,<condition>)
// and keep its meaning, nil if it can. Twenty's REST filter parser
// (engine/api/rest/input-request-parsers/filter-parser-utils:
// checkFilterQuery, addDefaultConjunctionIfMissing, parseFilter and
// parseFilterContent) splits a conjunction at its commas at parenthesis
// depth 1 that are outside brackets and quotes, where every ( and ) counts
// (quoted ones too) and every [ or ], " and ' toggles its own "inside"
// state, with no escapes and no nesting. So the comma before the added
// condition separates it from the caller's filter only if the filter's
// parentheses never close one they did not open and all close by its end,
// and its ", ' and brackets come in pairs; otherwise the condition would be
// read as part of a value, or the caller's filter could end the and(...)
// early and put itself beside it. And a filter that starts with and(, or(
// or not( and ends with ) is parsed alone as that conjunction even when
// its first parenthesis closes before the end (or(a),and(b) is read as
// the single condition of or(...)), which and(...) around it would read as
// two: it must end with the parenthesis its first one opens.
func checkWrappable(filter string) error {
	depth, firstClose := 0, -1
	for i := 0; i < len(filter); i++ {
		switch filter[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return fmt.Errorf("it closes a parenthesis it did not open at byte %d; Twenty counts every ( and ), quoted ones included: the parentheses must pair up", i)
			}
			if depth == 0 && firstClose < 0 {
				firstClose = i
			}
		}
	}
	if depth > 0 {
		return fmt.Errorf("it leaves %d parenthesis open (Twenty counts every ( and ), quoted ones included): the parentheses must pair up", depth)
	}
	for _, q := range []struct{ chars, what string }{
		{`"`, `" characters`},
		{`'`, `' characters (an apostrophe in a value, as in O'Brien, is read as a quote: match it with [like] and _ in its place, e.g. name.lastName[like]:O_Brien)`},
		{`[]`, `[ and ] characters (each one opens or closes a bracket for Twenty, in a value too)`},
	} {
		n := 0
		for _, c := range q.chars {
			n += strings.Count(filter, string(c))
		}
		if n%2 != 0 {
			return fmt.Errorf("it has an odd number of %s; Twenty's filter parser reads everything after an unpaired one as inside it, so the condition the adapter adds to count the matches would be read as part of a value", q.what)
		}
	}
	if m := rootConjunction.FindStringSubmatch(filter); m != nil && firstClose != len(filter)-1 {
		return fmt.Errorf("it starts with %s( but that parenthesis closes at byte %d, before the end: Twenty reads such a filter as one condition made of its parts run together; put the parts in one conjunction, e.g. and(%s(...),...)", m[1], firstClose, m[1])
	}
	return nil
}

// offered lists the admitted operations in manifest order.
func (c *Connector) offered() []string {
	var out []string
	for _, o := range operations {
		if c.admitted[o.op] {
			out = append(out, o.op)
		}
	}
	return out
}

// checkSizes refuses record bodies larger than MaxRecordBytes.
func (c *Connector) checkSizes(call *hostsdk.Call, in input) *aip.ActionResult {
	for i, r := range append([]json.RawMessage{in.Record}, in.Records...) {
		if len(r) > MaxRecordBytes {
			what := "record"
			if i > 0 {
				what = fmt.Sprintf("records[%d]", i-1)
			}
			return call.Fail(CodeRecordTooLarge, aip.CategoryPermanent, false,
				fmt.Sprintf("%s is %d bytes of JSON; at most %d", what, len(r), MaxRecordBytes))
		}
	}
	return nil
}

// recordPath is /rest/<objectNamePlural>/<id> (api.mdx: the REST Core API
// under /rest/, one path per object named by its plural API name).
func recordPath(in input) string {
	return "/rest/" + url.PathEscape(in.Object) + "/" + url.PathEscape(in.ID)
}

// selection is the fields and depth query parameters (api.mdx,
// "Selecting fields (REST)").
func selection(in input) url.Values {
	q := url.Values{}
	if len(in.Fields) > 0 {
		q.Set("fields", strings.Join(in.Fields, ","))
	}
	if in.Depth != nil {
		q.Set("depth", strconv.Itoa(*in.Depth))
	}
	return q
}

// mutationHeaders are the headers of a mutation (reference §8.6): the
// action's idempotency key, scoped to the tenant and the capability, and
// its ID.
func mutationHeaders(call *hostsdk.Call) http.Header {
	h := http.Header{}
	h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	h.Set("X-AIP-Action-ID", call.Action.ID)
	return h
}

// answer is Twenty's REST answer: {"data": {<key>: ...}} with pageInfo and
// totalCount on lists.
type answer struct {
	Data       map[string]json.RawMessage `json:"data"`
	PageInfo   json.RawMessage            `json:"pageInfo"`
	TotalCount *int64                     `json:"totalCount"`
	// capped is what the answer's headers say of a fields selection
	// Twenty capped.
	capped fieldsCap
}

// fieldsCap is api.mdx's "Selecting fields (REST)": when fields is
// omitted on an object with more than 200 fields, Twenty returns 200 of
// them and says so with the headers X-Twenty-Fields-Capped: true and
// X-Twenty-Fields-Max: <n>. The outputs carrying records repeat it
// (fields_capped, fields_max), so that a field missing from a record is
// not taken for one without a value; pass fields to read the others.
type fieldsCap struct {
	Capped bool `json:"fields_capped,omitempty"`
	Max    int  `json:"fields_max,omitempty"`
}

func capOf(h http.Header) fieldsCap {
	if !strings.EqualFold(strings.TrimSpace(h.Get("X-Twenty-Fields-Capped")), "true") {
		return fieldsCap{}
	}
	n, err := strconv.Atoi(strings.TrimSpace(h.Get("X-Twenty-Fields-Max")))
	if err != nil || n < 0 {
		n = 0
	}
	return fieldsCap{Capped: true, Max: n}
}

func (c *Connector) do(ctx context.Context, req provider.Request) (*answer, error) {
	var a answer
	h, err := c.send(ctx, req, &a)
	if err != nil {
		return nil, err
	}
	if a.Data == nil {
		return nil, badAnswer(req, 200, "the answer has no data object")
	}
	a.capped = capOf(h)
	return &a, nil
}

// send runs req and decodes its 2xx answer into into, and returns the
// answer's headers; an answer that is not JSON is a bad answer (which a
// mutation treats as maybe applied).
func (c *Connector) send(ctx context.Context, req provider.Request, into any) (http.Header, error) {
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := resp.Decode(into); err != nil {
		return nil, &provider.Error{Product: "twenty", Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: err.Error(), MayHaveApplied: true, Err: err}
	}
	return resp.Header, nil
}

// badAnswer is a 2xx answer whose shape is not the expected one.
func badAnswer(req provider.Request, status int, msg string) error {
	return &provider.Error{Product: "twenty", Method: req.Method, Path: req.Path, Status: status,
		Message: msg, MayHaveApplied: true}
}

// only returns the single member of data: Twenty names it after the
// operation and the object's singular name (person, createPerson,
// updatePerson, deletePerson, createPeople), which the adapter does not
// need to know.
func only(data map[string]json.RawMessage) (json.RawMessage, bool) {
	if len(data) != 1 {
		return nil, false
	}
	for _, v := range data {
		return v, true
	}
	return nil, false
}

func isJSON(raw json.RawMessage, open byte) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == open
}

// objects reports whether raw is a JSON array of objects, what the output
// schemas promise of records, duplicates, groups and metadata lists. An
// answer that is not (an array of IDs, a null in it) is a bad answer:
// completed with such an output, the action would be refused by the host
// as output_invalid, a failed result, though a mutation may have been
// applied.
func objects(raw json.RawMessage) bool {
	var items []json.RawMessage
	if !isJSON(raw, '[') || json.Unmarshal(raw, &items) != nil {
		return false
	}
	for _, it := range items {
		if !isJSON(it, '{') {
			return false
		}
	}
	return true
}

// pageInfo is a list answer's pageInfo as the output carries it: an
// object, or nothing when Twenty sent none or null; ok is false for
// anything else.
func pageInfo(raw json.RawMessage) (json.RawMessage, bool) {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) == 0 || bytes.Equal(raw, []byte("null")):
		return nil, true
	case isJSON(raw, '{'):
		return raw, true
	}
	return nil, false
}

func (c *Connector) list(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	if in.StartingAfter != "" && in.EndingBefore != "" {
		return call.Fail(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, "give starting_after or ending_before, not both"), nil
	}
	q := selection(in)
	for k, v := range map[string]string{"filter": in.Filter, "order_by": in.OrderBy,
		"starting_after": in.StartingAfter, "ending_before": in.EndingBefore} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if in.Limit > 0 {
		q.Set("limit", strconv.Itoa(in.Limit))
	}
	// GET /rest/<objectNamePlural> (api.mdx, "Selecting fields (REST)":
	// GET /rest/people?fields=...). filter, order_by, limit and the cursors
	// are not on the page: they are the generated REST API's (§8.6).
	req := provider.Request{Method: http.MethodGet, Path: "/rest/" + url.PathEscape(in.Object), Query: q}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	records, ok := a.Data[in.Object]
	if !ok || !objects(records) {
		return provider.Result(call, badAnswer(req, 200, fmt.Sprintf("the answer's data has no %q array of records", in.Object)), false)
	}
	page, ok := pageInfo(a.PageInfo)
	if !ok {
		return provider.Result(call, badAnswer(req, 200, "the answer's pageInfo is not an object"), false)
	}
	return call.Complete(listOutput{Object: in.Object, Records: records, PageInfo: page, TotalCount: a.TotalCount, fieldsCap: a.capped})
}

type listOutput struct {
	Object     string          `json:"object"`
	Records    json.RawMessage `json:"records"`
	PageInfo   json.RawMessage `json:"page_info,omitempty"`
	TotalCount *int64          `json:"total_count,omitempty"`
	fieldsCap
}

type recordOutput struct {
	Object string          `json:"object"`
	Record json.RawMessage `json:"record"`
	fieldsCap
}

// single runs a call whose answer is one record.
func (c *Connector) single(ctx context.Context, call *hostsdk.Call, in input, req provider.Request, mutation bool) (*aip.ActionResult, error) {
	if mutation {
		req.Header = mutationHeaders(call)
	}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, mutation)
	}
	rec, ok := only(a.Data)
	if !ok || !isJSON(rec, '{') {
		return provider.Result(call, badAnswer(req, 200, "the answer's data does not hold exactly one record"), mutation)
	}
	return call.Complete(recordOutput{Object: in.Object, Record: rec, fieldsCap: a.capped})
}

// many runs a mutation whose answer is one array of records (or of
// deleted records' IDs): create_many, update_many, soft_delete_many,
// restore_many, destroy_many. Twenty names the array after the operation
// and the object (createPeople, updatePeople, deletePeople,
// restorePeople), which the adapter does not need to know.
func (c *Connector) many(ctx context.Context, call *hostsdk.Call, in input, req provider.Request) (*aip.ActionResult, error) {
	req.Header = mutationHeaders(call)
	a, err := c.do(ctx, req)
	if err != nil {
		if req.Query.Get("upsert") == "true" {
			err = upsertRefusal(in, err)
		}
		return provider.Result(call, err, true)
	}
	recs, ok := only(a.Data)
	if !ok || !objects(recs) {
		return provider.Result(call, badAnswer(req, 200, "the answer's data does not hold exactly one array of records"), true)
	}
	return call.Complete(listOutput{Object: in.Object, Records: recs, fieldsCap: a.capped})
}

// upsertRefusal returns err, the error of a batch upsert
// (record.ingest_many) of in.Records, unchanged unless Twenty refused it
// with a 4xx after it may have written part of the batch; then the error
// may have been applied (outcome_unknown) and says how to find what was
// written.
//
// Twenty's batch upsert (CommonCreateManyQueryRunnerService's
// performUpsertOperation) looks the records up, updates those it finds,
// then inserts the others in a separate statement, with no transaction
// around the two (its merge, by contrast, runs in
// runInWorkspaceTransaction). An insert the database refuses (a unique,
// not-null or foreign-key constraint, which later Twenty versions answer
// with 400) leaves the updates written. A batch of one record is either
// an update or an insert, and 401, 403, 404 (an unknown object) and 429
// (the throttler, before the query runs) come before anything is
// written: those stay as they are.
func upsertRefusal(in input, err error) error {
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.MayHaveApplied || pe.Status < 400 || pe.Status > 499 || len(in.Records) < 2 {
		return err
	}
	switch pe.Status {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusTooManyRequests:
		return err
	}
	pe.MayHaveApplied = true
	pe.Message = "refused, but may have written part of the batch: Twenty's batch upsert updates the records it finds " +
		"before it inserts the others, with no transaction around the two, so a refusal of the insert leaves the updates " +
		"written; read the batch's records (record.list with filter id[in]:[...] of their ids) before acting on it again " +
		"(sending the same records again changes nothing more in those already written). Twenty said: " + pe.Message
	return err
}

type duplicatesOutput struct {
	Object     string          `json:"object"`
	Duplicates json.RawMessage `json:"duplicates"`
}

// findDuplicates asks which records duplicate the given records or IDs.
// It changes nothing (Twenty answers 200, not 201), so it is a read
// despite its POST.
func (c *Connector) findDuplicates(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	body := map[string]any{}
	if in.IDs != nil {
		body["ids"] = in.IDs
	} else {
		body["data"] = in.Records
	}
	q := url.Values{}
	if in.Depth != nil {
		q.Set("depth", strconv.Itoa(*in.Depth))
	}
	// POST /rest/<objectNamePlural>/duplicates with {"ids":[...]} or
	// {"data":[...]} (the generated REST API's find<Object>Duplicates);
	// the answer's data is an array with one entry per input:
	// {totalCount, pageInfo, <object singular>Duplicates: [...]}.
	req := provider.Request{Method: http.MethodPost, Path: "/rest/" + url.PathEscape(in.Object) + "/duplicates", Query: q, JSON: body}
	var a struct {
		Data json.RawMessage `json:"data"`
	}
	if _, err := c.send(ctx, req, &a); err != nil {
		return provider.Result(call, err, false)
	}
	if !objects(a.Data) {
		return provider.Result(call, badAnswer(req, 200, "the answer's data is not an array of objects"), false)
	}
	return call.Complete(duplicatesOutput{Object: in.Object, Duplicates: a.Data})
}

type groupsOutput struct {
	Object string          `json:"object"`
	Groups json.RawMessage `json:"groups"`
}

// groupBy runs GET /rest/<objectNamePlural>/groupBy. group_by is a JSON
// array of field selections, sent as the group_by query parameter as
// Twenty's REST parser reads it (JSON.parse of the parameter); filter and
// limit are the list's. The answer is {"data":{"<objects>GroupBy":[...]}}.
func (c *Connector) groupBy(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	if len(in.GroupBy) > MaxGroupByBytes {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("group_by is %d bytes of JSON; at most %d", len(in.GroupBy), MaxGroupByBytes))
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, in.GroupBy); err != nil {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, "group_by: "+err.Error())
	}
	q := url.Values{"group_by": {compact.String()}}
	if in.Filter != "" {
		q.Set("filter", in.Filter)
	}
	if in.Limit > 0 {
		q.Set("limit", strconv.Itoa(in.Limit))
	}
	req := provider.Request{Method: http.MethodGet, Path: "/rest/" + url.PathEscape(in.Object) + "/groupBy", Query: q}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	groups, ok := only(a.Data)
	if !ok || !objects(groups) {
		return provider.Result(call, badAnswer(req, 200, "the answer's data does not hold exactly one array of groups"), false)
	}
	return call.Complete(groupsOutput{Object: in.Object, Groups: groups})
}

// merge runs PATCH /rest/<objectNamePlural>/merge with {"ids": [...],
// "conflictPriorityIndex": n, "dryRun": b} (the generated REST API's
// mergeMany<Objects>); the answer is {"data":{"merge<Objects>": record}}.
func (c *Connector) merge(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	if in.Priority == nil {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, "conflict_priority_index is required")
	}
	if *in.Priority >= len(in.IDs) {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("conflict_priority_index %d is not an index of ids (0 to %d)", *in.Priority, len(in.IDs)-1))
	}
	q := url.Values{}
	if in.Depth != nil {
		q.Set("depth", strconv.Itoa(*in.Depth))
	}
	return c.single(ctx, call, in, provider.Request{Method: http.MethodPatch, Path: "/rest/" + url.PathEscape(in.Object) + "/merge", Query: q,
		JSON: map[string]any{"ids": in.IDs, "conflictPriorityIndex": *in.Priority, "dryRun": in.DryRun}}, true)
}

type metadataOutput struct {
	Objects    json.RawMessage `json:"objects,omitempty"`
	Fields     json.RawMessage `json:"fields,omitempty"`
	PageInfo   json.RawMessage `json:"page_info,omitempty"`
	TotalCount *int64          `json:"total_count,omitempty"`
}

// metadataList lists a Metadata API resource: GET /rest/metadata/objects
// or /rest/metadata/fields (api.mdx, "Metadata API": /rest/metadata/);
// the answer's data holds the list under the resource's name.
func (c *Connector) metadataList(ctx context.Context, call *hostsdk.Call, in input, resource string) (*aip.ActionResult, error) {
	q := url.Values{}
	if in.Limit > 0 {
		q.Set("limit", strconv.Itoa(in.Limit))
	}
	if in.StartingAfter != "" {
		q.Set("starting_after", in.StartingAfter)
	}
	req := provider.Request{Method: http.MethodGet, Path: "/rest/metadata/" + resource, Query: q}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	list, ok := a.Data[resource]
	if !ok || !objects(list) {
		return provider.Result(call, badAnswer(req, 200, fmt.Sprintf("the answer's data has no %q array of objects", resource)), false)
	}
	page, ok := pageInfo(a.PageInfo)
	if !ok {
		return provider.Result(call, badAnswer(req, 200, "the answer's pageInfo is not an object"), false)
	}
	out := metadataOutput{PageInfo: page, TotalCount: a.TotalCount}
	if resource == "objects" {
		out.Objects = list
	} else {
		out.Fields = list
	}
	return call.Complete(out)
}

type metadataItemOutput struct {
	Resource string          `json:"resource"`
	Item     json.RawMessage `json:"item"`
}

// metadataGet reads one object or field: GET /rest/metadata/<resource>/<id>;
// the answer is {"data":{"object"|"field": {...}}}.
func (c *Connector) metadataGet(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	req := provider.Request{Method: http.MethodGet, Path: "/rest/metadata/" + url.PathEscape(in.Resource) + "/" + url.PathEscape(in.ID)}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	item, ok := only(a.Data)
	if !ok || !isJSON(item, '{') {
		return provider.Result(call, badAnswer(req, 200, "the answer's data does not hold exactly one item"), false)
	}
	return call.Complete(metadataItemOutput{Resource: in.Resource, Item: item})
}

type documentOutput struct {
	Document json.RawMessage `json:"document"`
}

// openAPI reads one of the OpenAPI documents Twenty generates for the
// workspace the API key belongs to (GET /rest/open-api/core or
// /rest/open-api/metadata): the answer is the document itself, not a
// {"data":...} envelope; it must be a JSON object with an "openapi"
// version string.
func (c *Connector) openAPI(ctx context.Context, call *hostsdk.Call, path string) (*aip.ActionResult, error) {
	req := provider.Request{Method: http.MethodGet, Path: path}
	var doc struct {
		OpenAPI string                     `json:"openapi"`
		Paths   map[string]json.RawMessage `json:"paths"`
	}
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	raw := bytes.TrimSpace(resp.Body)
	if err := json.Unmarshal(raw, &doc); err != nil || doc.OpenAPI == "" || !isJSON(raw, '{') {
		return provider.Result(call, badAnswer(req, resp.Status, "the answer is not an OpenAPI document (a JSON object with an \"openapi\" version)"), false)
	}
	// A key Twenty does not accept for a workspace is not refused here:
	// Twenty answers 200 with its anonymous base document, whose only path
	// is the document's own /open-api/<name> (open-api.service.ts,
	// getWorkspaceFromRequest and baseSchema). That is no workspace's
	// document.
	workspace := false
	for p := range doc.Paths {
		if !strings.HasPrefix(p, "/open-api/") {
			workspace = true
		}
	}
	if !workspace {
		return call.Fail(provider.CodeUnauthorized, aip.CategoryAuth, false,
			fmt.Sprintf("twenty GET %s: Twenty answered its anonymous base document (no path of a workspace): it did not accept the API key for a workspace; check --%s", path, FlagAPITokenFile)), nil
	}
	return call.Complete(documentOutput{Document: raw})
}

// CheckHealth implements hostsdk.HealthChecker: one record of the first
// configured object (GET /rest/<object>?limit=1), which needs a valid API
// key and a reachable server.
func (c *Connector) CheckHealth(ctx context.Context) error {
	_, err := c.client.Do(ctx, provider.Request{Method: http.MethodGet,
		Path: "/rest/" + url.PathEscape(c.cfg.Objects[0]), Query: url.Values{"limit": {"1"}}})
	return err
}
