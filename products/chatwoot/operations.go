package chatwoot

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// CapabilityPrefix starts every capability ID.
const CapabilityPrefix = "cap:chatwoot:"

// operation is one catalogue operation: one Chatwoot application API call
// under /api/v1/accounts/{account_id}, its input fields mapped to path
// segments, query parameters and JSON body members as the published
// document (swagger.json) names them.
type operation struct {
	Suffix      string
	Name        string
	Description string
	Method      string
	// Path follows the account path; {field} segments are filled from the
	// input (escaped).
	Path string
	// Query are input fields sent as query parameters (arrays repeat the
	// parameter, the document's form/explode default).
	Query []string
	// Body are input fields sent as members of the JSON body.
	Body     []string
	Mutation bool
	Risk     aip.Risk
	// Schema is the input schema.
	Schema string
}

func (op *operation) id() string { return CapabilityPrefix + op.Suffix }

func (op *operation) capability() aip.Capability {
	return aip.Capability{
		ID: op.id(), Name: op.Name, Kind: aip.KindTool, Description: op.Description,
		InputSchema: json.RawMessage(op.Schema), Risk: op.Risk, Stability: aip.StabilityStable,
		Contract: contract(op.Mutation, op.Mutation && op.Method == http.MethodPost, aip.EffectWrite),
	}
}

// contract describes a capability: reads are safe to retry; mutations
// need an idempotency key (the host runs one action ID once) and, when
// they create something (createNew), are unsafe to retry as a new action.
func contract(mutation, createNew bool, effect aip.SideEffect) *aip.CapabilityContract {
	c := &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{aip.EffectRead},
		Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional,
			CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
		Execution: aip.ExecutionContract{SupportsSync: true, SupportsRetry: true,
			ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
		Data: aip.DataContract{Sensitivity: aip.SensitivityConfidential, ContainsPII: true},
	}
	if mutation {
		c.SideEffects = []aip.SideEffect{effect}
		c.Idempotency.Requirement = aip.IdempotencyRequired
		c.Execution.SupportsRetry = false
		c.Execution.RetrySafety = aip.RetrySafeWithIdempotencyKey
		if createNew {
			c.Execution.RetrySafety = aip.RetryUnsafe
		}
	}
	return c
}

// Schema fragments.
const (
	idProp     = `{"type":"integer","minimum":1,"maximum":9007199254740991`
	pageProp   = `"page":{"type":"integer","minimum":1,"maximum":100000,"description":"Page number (default 1)."}`
	queryProp  = `"q":{"type":"string","minLength":1,"maxLength":1024,"description":"Search term."}`
	labelsProp = `"labels":{"type":"array","maxItems":50,"items":{"type":"string","minLength":1,"maxLength":255},"description":"Filter by labels."}`
	convStatus = `"status":{"type":"string","enum":["all","open","resolved","pending","snoozed"],"description":"Filter by conversation status (default open)."}`
	inboxProp  = `"inbox_id":` + idProp + `,"description":"Filter by inbox."}`
	teamProp   = `"team_id":` + idProp + `,"description":"Filter by team."}`
	sortProp   = `"sort":{"type":"string","enum":["name","email","phone_number","last_activity_at","-name","-email","-phone_number","-last_activity_at"],"description":"Sort attribute; a leading - sorts descending."}`
	convIDProp = `"conversation_id":` + idProp + `,"description":"Numeric conversation ID (display ID) in the account."}`
	contactID  = `"contact_id":` + idProp + `,"description":"Numeric contact ID."}`
	// contactFields are the writable contact members of the document's
	// contact_create_payload / contact_update_payload (avatar uploads are
	// multipart and not offered; avatar_url is).
	contactFields = `"name":{"type":"string","minLength":1,"maxLength":255},` +
		`"email":{"type":"string","minLength":3,"maxLength":320},` +
		`"phone_number":{"type":"string","minLength":1,"maxLength":32,"description":"E.164, e.g. +123456789."},` +
		`"blocked":{"type":"boolean"},` +
		`"avatar_url":{"type":"string","minLength":1,"maxLength":2048,"description":"URL of a jpeg or png avatar."},` +
		`"identifier":{"type":"string","minLength":1,"maxLength":255,"description":"The contact's ID in an external system."},` +
		`"additional_attributes":{"type":"object","maxProperties":100},` +
		`"custom_attributes":{"type":"object","maxProperties":100,"description":"Values of defined custom attributes."}`
)

var contactBody = []string{"name", "email", "phone_number", "blocked", "avatar_url", "identifier", "additional_attributes", "custom_attributes"}

func schema(required string, props ...string) string {
	return `{"type":"object","properties":{` + strings.Join(props, ",") + `},"required":[` + required + `],"additionalProperties":false}`
}

// catalogue is the focused set of Chatwoot account API operations,
// in manifest order.
var catalogue = []operation{
	{Suffix: "account.get", Name: "Get the account", Method: http.MethodGet, Path: "", Risk: aip.RiskLow,
		Description: "Account details (GET /api/v1/accounts/{account_id}).",
		Schema:      schema(``)},
	{Suffix: "agent.list", Name: "List agents", Method: http.MethodGet, Path: "/agents", Risk: aip.RiskLow,
		Description: "Active agents of the account (GET .../agents).",
		Schema:      schema(``)},
	{Suffix: "conversation.list", Name: "List conversations", Method: http.MethodGet, Path: "/conversations", Risk: aip.RiskLow,
		Description: "Conversations with counts, filtered by assignee type, status, search term, inbox, team and labels (GET .../conversations).",
		Query:       []string{"assignee_type", "status", "q", "inbox_id", "team_id", "labels", "page"},
		Schema: schema(``, `"assignee_type":{"type":"string","enum":["me","unassigned","all","assigned"],"description":"Filter by assignee type (default all)."}`,
			convStatus, queryProp, inboxProp, teamProp, labelsProp, pageProp)},
	{Suffix: "conversation.meta", Name: "Count conversations", Method: http.MethodGet, Path: "/conversations/meta", Risk: aip.RiskLow,
		Description: "Conversation counts (mine, unassigned, assigned, all) for the same filters as conversation.list (GET .../conversations/meta).",
		Query:       []string{"status", "q", "inbox_id", "team_id", "labels"},
		Schema:      schema(``, convStatus, queryProp, inboxProp, teamProp, labelsProp)},
	{Suffix: "conversation.get", Name: "Get a conversation", Method: http.MethodGet, Path: "/conversations/{conversation_id}", Risk: aip.RiskLow,
		Description: "One conversation (GET .../conversations/{conversation_id}).",
		Schema:      schema(`"conversation_id"`, convIDProp)},
	{Suffix: "message.list", Name: "List messages", Method: http.MethodGet, Path: "/conversations/{conversation_id}/messages", Risk: aip.RiskLow,
		Description: "Messages of a conversation; after returns up to 100 messages after a message ID, before up to 20 before one (GET .../conversations/{conversation_id}/messages).",
		Query:       []string{"after", "before"},
		Schema: schema(`"conversation_id"`, convIDProp,
			`"after":`+idProp+`,"description":"Messages after this message ID."}`,
			`"before":`+idProp+`,"description":"Messages before this message ID."}`)},
	{Suffix: "contact.list", Name: "List contacts", Method: http.MethodGet, Path: "/contacts", Risk: aip.RiskLow,
		Description: "Contacts of the account, 15 a page (GET .../contacts).",
		Query:       []string{"sort", "page"},
		Schema:      schema(``, sortProp, pageProp)},
	{Suffix: "contact.search", Name: "Search contacts", Method: http.MethodGet, Path: "/contacts/search", Risk: aip.RiskLow,
		Description: "Contacts whose name, identifier, email or phone number match q (GET .../contacts/search).",
		Query:       []string{"q", "sort", "page"},
		Schema:      schema(`"q"`, queryProp, sortProp, pageProp)},
	{Suffix: "contact.get", Name: "Get a contact", Method: http.MethodGet, Path: "/contacts/{contact_id}", Risk: aip.RiskLow,
		Description: "One contact (GET .../contacts/{id}).",
		Schema:      schema(`"contact_id"`, contactID)},
	{Suffix: "contact.create", Name: "Create a contact", Method: http.MethodPost, Path: "/contacts", Mutation: true, Risk: aip.RiskMedium,
		Description: "Creates a contact in an inbox (POST .../contacts). Not idempotent at Chatwoot: a new action creates another contact.",
		Body:        append([]string{"inbox_id"}, contactBody...),
		Schema:      schema(`"inbox_id"`, `"inbox_id":`+idProp+`,"description":"Inbox the contact belongs to."}`, contactFields)},
	{Suffix: "contact.update", Name: "Update a contact", Method: http.MethodPut, Path: "/contacts/{contact_id}", Mutation: true, Risk: aip.RiskMedium,
		Description: "Updates the given fields of a contact (PUT .../contacts/{id}).",
		Body:        contactBody,
		Schema: strings.Replace(schema(`"contact_id"`, contactID, contactFields),
			`"additionalProperties":false`, `"additionalProperties":false,"minProperties":2`, 1)},
}

func lookupOperation(suffix string) *operation {
	for i := range catalogue {
		if catalogue[i].Suffix == suffix {
			return &catalogue[i]
		}
	}
	return nil
}

var pathField = regexp.MustCompile(`\{([a-z_]+)\}`)

// runCatalogue makes a catalogue operation's call and returns the
// provider's JSON as output.data (null for an empty answer).
func (c *Connector) runCatalogue(ctx context.Context, op *operation, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in map[string]json.RawMessage
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	req, err := c.request(op, in)
	if err != nil {
		return nil, aip.NewProtocolError("chatwoot.input_invalid", aip.CategoryPermanent, false, 0, err.Error())
	}
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		return provider.Result(call, err, op.Mutation)
	}
	data := json.RawMessage("null")
	if len(strings.TrimSpace(string(resp.Body))) > 0 {
		if !json.Valid(resp.Body) {
			return provider.Result(call, &provider.Error{Product: "chatwoot", Method: req.Method, Path: req.Path,
				Status: resp.Status, Message: "the answer is not JSON", MayHaveApplied: true}, op.Mutation)
		}
		data = resp.Body
	}
	return call.Complete(map[string]any{"status": resp.Status, "data": data})
}

// request builds op's provider request from the (schema-checked) input.
func (c *Connector) request(op *operation, in map[string]json.RawMessage) (provider.Request, error) {
	var missing error
	path := pathField.ReplaceAllStringFunc(op.Path, func(m string) string {
		name := m[1 : len(m)-1]
		v, ok := scalar(in[name])
		if !ok || v == "" {
			missing = fmt.Errorf("input field %s is required", name)
		}
		return url.PathEscape(v)
	})
	if missing != nil {
		return provider.Request{}, missing
	}
	req := provider.Request{Method: op.Method, Path: c.base + path}
	for _, name := range op.Query {
		raw, ok := in[name]
		if !ok {
			continue
		}
		if req.Query == nil {
			req.Query = url.Values{}
		}
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			for _, item := range list {
				v, ok := scalar(item)
				if !ok {
					return provider.Request{}, fmt.Errorf("input field %s: want a list of strings or numbers", name)
				}
				req.Query.Add(name, v)
			}
			continue
		}
		v, ok := scalar(raw)
		if !ok {
			return provider.Request{}, fmt.Errorf("input field %s: want a string or a number", name)
		}
		req.Query.Set(name, v)
	}
	if op.Body != nil {
		body := map[string]json.RawMessage{}
		for _, name := range op.Body {
			if raw, ok := in[name]; ok {
				body[name] = raw
			}
		}
		req.JSON = body
	}
	return req, nil
}

// scalar renders a JSON string, number or boolean as text.
func scalar(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), true
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		if b {
			return "true", true
		}
		return "false", true
	}
	return "", false
}
