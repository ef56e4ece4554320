package twenty

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Operations: the part of a capability ID after "cap:twenty:".
const (
	OpList         = "record.list"
	OpGet          = "record.get"
	OpCreate       = "record.create"
	OpUpdate       = "record.update"
	OpSoftDelete   = "record.soft_delete"
	OpCreateMany   = "record.create_many"
	OpMetadataList = "metadata.list"
)

// CapabilityPrefix starts every capability ID.
const CapabilityPrefix = "cap:twenty:"

// CodeRecordTooLarge is the failed result of a record body larger than
// MaxRecordBytes.
const CodeRecordTooLarge = "twenty.record_too_large"

// operations lists the operations in manifest order.
var operations = []struct {
	op, name, description string
	mutation              bool
	risk                  aip.Risk
}{
	{OpList, "List records", "Lists records of an object: GET /rest/<object> with Twenty's filter, order_by, limit and starting_after or ending_before cursors; returns the records, pageInfo and totalCount.", false, aip.RiskLow},
	{OpGet, "Get a record", "Reads one record: GET /rest/<object>/<id>.", false, aip.RiskLow},
	{OpCreate, "Create a record", "Creates one record: POST /rest/<object> with the record's fields; returns the created record.", true, aip.RiskMedium},
	{OpUpdate, "Update a record", "Updates the given fields of one record: PATCH /rest/<object>/<id>; returns the updated record.", true, aip.RiskMedium},
	{OpSoftDelete, "Soft-delete a record", "Soft-deletes one record (it can be restored in Twenty): DELETE /rest/<object>/<id>?soft_delete=true.", true, aip.RiskMedium},
	{OpCreateMany, "Create records in a batch", "Creates 1 to 60 records of one object in one call: POST /rest/batch/<object>; returns the created records.", true, aip.RiskMedium},
	{OpMetadataList, "List objects", "Lists the workspace's objects and their fields: GET /rest/metadata/objects.", false, aip.RiskLow},
}

// CapabilityID returns cap:twenty:<operation>.
func CapabilityID(op string) string { return CapabilityPrefix + op }

// Connector is the Twenty connector. It implements hostsdk.Connector,
// hostsdk.HealthChecker and hostsdk.RouteProvider.
type Connector struct {
	cfg    Config
	client *provider.Client
	inputs map[string]json.RawMessage
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
		// The client never lets net/http resend a mutation.
		Auth:      func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+token.Reveal()) },
		Transport: rt,
	})
	if err != nil {
		return nil, err
	}
	return &Connector{cfg: cfg, client: client, inputs: inputSchemas(cfg.Objects), replayCapacity: ReplayCapacity}, nil
}

// contract is a capability's contract: a read is safe to retry; a
// mutation needs an idempotency key (sent as Idempotency-Key) and is never
// retried, since api.mdx does not say Twenty deduplicates by it, so its
// unknown outcome stays unknown.
func contract(mutation bool) *aip.CapabilityContract {
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
		no := false
		m.Capabilities = append(m.Capabilities, aip.Capability{
			ID: CapabilityID(o.op), Name: o.name, Kind: aip.KindTool, Description: o.description,
			InputSchema: c.inputs[o.op], OutputSchema: outputSchemas[o.op],
			Risk: o.risk, Stability: aip.StabilityStable, RequiresHumanApproval: &no,
			Contract: contract(o.mutation),
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
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	op, ok := strings.CutPrefix(call.Action.CapabilityID, CapabilityPrefix)
	if !ok {
		return nil, fmt.Errorf("twenty: capability %s is not one of this connector's", call.Action.CapabilityID)
	}
	var in input
	if err := json.Unmarshal(call.Action.Input, &in); err != nil {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0, "input: "+err.Error())
	}
	if op != OpMetadataList && !slices.Contains(c.cfg.Objects, in.Object) {
		return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
			fmt.Sprintf("object %q is not one of the configured objects %v", in.Object, c.cfg.Objects))
	}
	if res := c.checkSizes(call, in); res != nil {
		return res, nil
	}
	switch op {
	case OpList:
		return c.list(ctx, call, in)
	case OpGet:
		return c.single(ctx, call, in, provider.Request{Method: http.MethodGet, Path: recordPath(in), Query: selection(in)}, false)
	case OpCreate:
		// POST /rest/<objectNamePlural> (api.mdx, "Core API": CRUD on records).
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPost, Path: "/rest/" + url.PathEscape(in.Object), JSON: in.Record}, true)
	case OpUpdate:
		return c.single(ctx, call, in, provider.Request{Method: http.MethodPatch, Path: recordPath(in), JSON: in.Record}, true)
	case OpSoftDelete:
		// soft_delete=true: Twenty's generated REST API deletes the record
		// permanently when soft_delete is absent or false (its default).
		return c.single(ctx, call, in, provider.Request{Method: http.MethodDelete, Path: recordPath(in),
			Query: url.Values{"soft_delete": {"true"}}}, true)
	case OpCreateMany:
		return c.createMany(ctx, call, in)
	case OpMetadataList:
		return c.metadataList(ctx, call, in)
	}
	return nil, fmt.Errorf("twenty: unknown operation %q", op)
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
// action's idempotency key and its ID.
func mutationHeaders(call *hostsdk.Call) http.Header {
	h := http.Header{}
	h.Set("Idempotency-Key", call.IdempotencyKey)
	h.Set("X-AIP-Action-ID", call.Action.ID)
	return h
}

// answer is Twenty's REST answer: {"data": {<key>: ...}} with pageInfo and
// totalCount on lists.
type answer struct {
	Data       map[string]json.RawMessage `json:"data"`
	PageInfo   json.RawMessage            `json:"pageInfo"`
	TotalCount *int64                     `json:"totalCount"`
}

func (c *Connector) do(ctx context.Context, req provider.Request) (*answer, error) {
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		return nil, err
	}
	var a answer
	if err := resp.Decode(&a); err != nil || a.Data == nil {
		if err == nil {
			err = fmt.Errorf("provider answered %d without a data object", resp.Status)
		}
		return nil, &provider.Error{Product: "twenty", Method: req.Method, Path: req.Path, Status: resp.Status,
			Message: err.Error(), MayHaveApplied: true, Err: err}
	}
	return &a, nil
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
	if !ok || !isJSON(records, '[') {
		return provider.Result(call, badAnswer(req, 200, fmt.Sprintf("the answer's data has no %q array", in.Object)), false)
	}
	return call.Complete(listOutput{Object: in.Object, Records: records, PageInfo: a.PageInfo, TotalCount: a.TotalCount})
}

type listOutput struct {
	Object     string          `json:"object"`
	Records    json.RawMessage `json:"records"`
	PageInfo   json.RawMessage `json:"page_info,omitempty"`
	TotalCount *int64          `json:"total_count,omitempty"`
}

type recordOutput struct {
	Object string          `json:"object"`
	Record json.RawMessage `json:"record"`
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
	return call.Complete(recordOutput{Object: in.Object, Record: rec})
}

func (c *Connector) createMany(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	// POST /rest/batch/<objectNamePlural> with a JSON array (api.mdx,
	// "Batch operations": at most 60 records per request; the page does not
	// spell the path, which is the generated REST API's).
	req := provider.Request{Method: http.MethodPost, Path: "/rest/batch/" + url.PathEscape(in.Object),
		JSON: in.Records, Header: mutationHeaders(call)}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, true)
	}
	recs, ok := only(a.Data)
	if !ok || !isJSON(recs, '[') {
		return provider.Result(call, badAnswer(req, 200, "the answer's data does not hold exactly one array of records"), true)
	}
	return call.Complete(listOutput{Object: in.Object, Records: recs})
}

type metadataOutput struct {
	Objects    json.RawMessage `json:"objects"`
	PageInfo   json.RawMessage `json:"page_info,omitempty"`
	TotalCount *int64          `json:"total_count,omitempty"`
}

func (c *Connector) metadataList(ctx context.Context, call *hostsdk.Call, in input) (*aip.ActionResult, error) {
	q := url.Values{}
	if in.Limit > 0 {
		q.Set("limit", strconv.Itoa(in.Limit))
	}
	if in.StartingAfter != "" {
		q.Set("starting_after", in.StartingAfter)
	}
	// GET /rest/metadata/objects (api.mdx, "Metadata API": /rest/metadata/).
	req := provider.Request{Method: http.MethodGet, Path: "/rest/metadata/objects", Query: q}
	a, err := c.do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	objs, ok := a.Data["objects"]
	if !ok || !isJSON(objs, '[') {
		return provider.Result(call, badAnswer(req, 200, `the answer's data has no "objects" array`), false)
	}
	return call.Complete(metadataOutput{Objects: objs, PageInfo: a.PageInfo, TotalCount: a.TotalCount})
}

// CheckHealth implements hostsdk.HealthChecker: one record of the first
// configured object (GET /rest/<object>?limit=1), which needs a valid API
// key and a reachable server.
func (c *Connector) CheckHealth(ctx context.Context) error {
	_, err := c.client.Do(ctx, provider.Request{Method: http.MethodGet,
		Path: "/rest/" + url.PathEscape(c.cfg.Objects[0]), Query: url.Values{"limit": {"1"}}})
	return err
}
