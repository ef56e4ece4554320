package chatwoot

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
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
	// Query are input fields sent as query parameters. An array is sent
	// as one parameter, its items joined by commas (OpenAPI's form style
	// without explode): Rails keeps only the last of a repeated parameter
	// (labels=a&labels=b reads as "b"), and Chatwoot's label filter
	// splits a value at commas.
	Query []string
	// Body are input fields sent as members of the JSON body.
	Body     []string
	Mutation bool
	// Creates marks a mutation that makes a new object at every call
	// (retry-unsafe as a new action); other mutations set state and
	// are safe to repeat with the same idempotency key.
	Creates bool
	// Effect is a mutation's side effect (default write).
	Effect aip.SideEffect
	// OptIn operations are admitted only when the operations file lists
	// them (account administration).
	OptIn bool
	Risk  aip.Risk
	// Schema is the input schema.
	Schema string
	// Check, when set, checks what the schema cannot express.
	Check func(in map[string]json.RawMessage) error
	// Refused, when set, is given the error of a request Chatwoot did
	// not answer with 2xx and returns it, with what the request may have
	// changed although it failed said in its message.
	Refused func(in map[string]json.RawMessage, err error) error
	// Redact are members left out of the output wherever they occur
	// (credentials Chatwoot includes in answers to administrators).
	Redact []string
}

// inboxSecrets are the channel credentials Chatwoot's inbox answers carry
// for administrators (the identity validation HMAC token, IMAP and SMTP
// passwords, the WhatsApp and other providers' configuration with their
// API keys, bot and page tokens); the document does not list them, the
// Chatwoot server sends them.
var inboxSecrets = []string{"hmac_token", "imap_password", "smtp_password", "provider_config", "api_key", "auth_token",
	"access_token", "bot_token", "page_access_token", "secret"}

func (op *operation) id() string { return CapabilityPrefix + op.Suffix }

func (op *operation) capability() aip.Capability {
	return aip.Capability{
		ID: op.id(), Name: op.Name, Kind: aip.KindTool, Description: op.Description,
		InputSchema: json.RawMessage(op.Schema), Risk: op.Risk, Stability: aip.StabilityStable,
		Contract: contract(op.Mutation, op.Creates, cmp.Or(op.Effect, aip.EffectWrite)),
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
	idProp    = `{"type":"integer","minimum":1,"maximum":9007199254740991`
	pageProp  = `"page":{"type":"integer","minimum":1,"maximum":100000,"description":"Page number (default 1)."}`
	queryProp = `"q":{"type":"string","minLength":1,"maxLength":1024,"description":"Search term."}`
	// labelItem is one label title. Chatwoot reads labels through
	// acts_as_taggable_on, which splits a title at commas (and its own
	// titles are letters, digits, _ and -): a comma in an item would
	// name two labels, so it is refused.
	labelItem  = `{"type":"string","minLength":1,"maxLength":255,"pattern":"^[^,]+$"}`
	labelsProp = `"labels":{"type":"array","maxItems":50,"items":` + labelItem + `,"description":"Conversations with any of these labels."}`
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

// More schema fragments.
const (
	labelListProp = `"labels":{"type":"array","maxItems":50,"uniqueItems":true,"items":` + labelItem + `,` +
		`"description":"The complete list of labels; it replaces the current labels (an empty list removes them all)."}`
	priorityProp  = `"priority":{"type":"string","enum":["urgent","high","medium","low","none"],"description":"Conversation priority."}`
	customAttrs   = `"custom_attributes":{"type":"object","maxProperties":100,"description":"Custom attribute keys and values."}`
	messageIDProp = `"message_id":` + idProp + `,"description":"Numeric message ID."}`
	cannedID      = `"canned_response_id":` + idProp + `,"description":"Numeric canned response ID."}`
	cannedFields  = `"short_code":{"type":"string","minLength":1,"maxLength":255,"description":"Short code agents type to insert the response."},` +
		`"content":{"type":"string","minLength":1,"maxLength":150000,"description":"Message text of the canned response."}`
	agentID     = `"agent_id":` + idProp + `,"description":"Numeric agent (user) ID."}`
	agentRole   = `"role":{"type":"string","enum":["agent","administrator"],"description":"Role in the account."}`
	agentFields = `"availability_status":{"type":"string","enum":["available","busy","offline"]},` +
		`"auto_offline":{"type":"boolean","description":"Go offline when the agent's sessions end."}`
	// filterProp is the filter payload of conversation.filter and
	// contact.filter (the document's payload array).
	filterProp = `"payload":{"type":"array","minItems":1,"maxItems":50,"description":"Conditions, joined in order by each condition's query_operator (left out on the last).",` +
		`"items":{"type":"object","properties":{` +
		`"attribute_key":{"type":"string","minLength":1,"maxLength":255,"description":"Attribute to filter on, e.g. status or a custom attribute key."},` +
		`"filter_operator":{"type":"string","enum":["equal_to","not_equal_to","contains","does_not_contain"]},` +
		`"values":{"type":"array","minItems":1,"maxItems":100,"items":{"type":"string","maxLength":1024}},` +
		`"query_operator":{"type":"string","enum":["AND","OR"],"description":"Joins this condition to the next one."}},` +
		`"required":["attribute_key","filter_operator","values"],"additionalProperties":false}}`
)

// createConversationRefused returns err, the error of a
// conversation.create, unchanged unless the request may have changed a
// contact inbox before Chatwoot refused it or did not answer: then its
// message says so, and how to check.
//
// Chatwoot's ConversationsController runs, before create, the
// before_actions inbox, contact and contact_inbox. Given inbox_id and
// contact_id, contact_inbox calls ContactInboxBuilder, which links the
// contact to the inbox with source_id (ContactInbox find_or_create_by!)
// and, in an email, SMS, Twilio or WhatsApp inbox where another contact's
// contact inbox holds that source ID (the unique index on inbox and
// source ID refuses the link), first gives that contact inbox a new
// source ID ("<digit><source_id>", or "whatsapp:<source_id><number>" in
// SMS, Twilio and WhatsApp inboxes), then links. None of it is in the
// transaction create opens for the conversation and its initial message,
// so a create that fails in that transaction (a 422 for an invalid
// assignee, team or message, a 500) leaves it done. Refusals that come
// before the builder runs, or from it without a change, leave err as it
// is: 401 and 403 (the account or the inbox not accessible), 404 (the
// inbox or the contact not found), 429 (the rate limiter), and the 422
// "source_id should be unique" (the source ID is another contact's in an
// inbox of another kind: nothing is changed). Without inbox_id and
// contact_id Chatwoot only looks the source ID up.
func createConversationRefused(in map[string]json.RawMessage, err error) error {
	var pe *provider.Error
	inbox, okInbox := scalar(in["inbox_id"])
	contact, okContact := scalar(in["contact_id"])
	source, _ := scalar(in["source_id"])
	if !errors.As(err, &pe) || !okInbox || !okContact {
		return err
	}
	if !pe.MayHaveApplied {
		switch {
		case pe.Status < 400 || pe.Status > 499,
			pe.Status == http.StatusUnauthorized, pe.Status == http.StatusForbidden,
			pe.Status == http.StatusNotFound, pe.Status == http.StatusTooManyRequests,
			pe.Status == http.StatusUnprocessableEntity && pe.Message == "source_id should be unique":
			return err
		}
	}
	outcome := "no conversation was created, but"
	if pe.MayHaveApplied {
		outcome = "the conversation may or may not have been created, and"
	}
	// Kept short: the host cuts a message to aip.MaxErrorMessageBytes,
	// and Chatwoot's reason comes after it (its usual one-line reasons
	// fit; one near provider.MaxMessageBytes loses its end).
	note := fmt.Sprintf("%s Chatwoot first links contact %s to inbox %s with source_id %q and does not undo that: the contact may "+
		"now have that contact inbox and, in an email, SMS, Twilio or WhatsApp inbox, another contact's contact inbox that had this "+
		"source ID may have been given a new one; check with contact.get of contact %s (contact_inboxes), and for the other contact "+
		"contact.search with q the source ID (its email or phone number) then contact.get",
		outcome, contact, inbox, provider.Excerpt(source), contact)
	if pe.Message != "" {
		note += ". Chatwoot said: " + pe.Message
	}
	pe.Message = note
	return err
}

// checkFilter requires a query_operator on every filter condition but the
// last, and none on the last (the document's example ends with a null
// one): Chatwoot joins the conditions with them in order.
func checkFilter(in map[string]json.RawMessage) error {
	var conds []map[string]json.RawMessage
	if err := json.Unmarshal(in["payload"], &conds); err != nil {
		return fmt.Errorf("input field payload: %v", err)
	}
	for i, c := range conds {
		_, has := c["query_operator"]
		switch {
		case i < len(conds)-1 && !has:
			return fmt.Errorf("input field payload[%d]: query_operator (AND or OR) is required on every condition but the last", i)
		case i == len(conds)-1 && has:
			return fmt.Errorf("input field payload[%d]: leave query_operator out on the last condition", i)
		}
	}
	return nil
}

// minFields makes a schema require at least n members (the path IDs and
// at least one field to change).
func minFields(s string, n int) string {
	return strings.Replace(s, `"additionalProperties":false`, `"additionalProperties":false,"minProperties":`+strconv.Itoa(n), 1)
}

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
	{Suffix: "agent.create", Name: "Add an agent", Method: http.MethodPost, Path: "/agents", Mutation: true, Creates: true,
		Effect: aip.EffectIdentity, Risk: aip.RiskHigh, OptIn: true,
		Description: "Adds a user to the account as agent or administrator; Chatwoot invites them by email (POST .../agents). " +
			"Account administration: admitted only when the operations file lists it.",
		Body: []string{"name", "email", "role", "availability_status", "auto_offline"},
		Schema: schema(`"name","email","role"`, `"name":{"type":"string","minLength":1,"maxLength":255}`,
			`"email":{"type":"string","minLength":3,"maxLength":320}`, agentRole, agentFields)},
	{Suffix: "agent.update", Name: "Update an agent", Method: http.MethodPatch, Path: "/agents/{agent_id}", Mutation: true,
		Effect: aip.EffectIdentity, Risk: aip.RiskHigh, OptIn: true,
		Description: "Sets an agent's role (and availability) in the account (PATCH .../agents/{id}). " +
			"Account administration: admitted only when the operations file lists it.",
		Body:   []string{"role", "availability_status", "auto_offline"},
		Schema: schema(`"agent_id","role"`, agentID, agentRole, agentFields)},
	{Suffix: "agent.delete", Name: "Remove an agent", Method: http.MethodDelete, Path: "/agents/{agent_id}", Mutation: true,
		Effect: aip.EffectIdentity, Risk: aip.RiskHigh, OptIn: true,
		Description: "Removes an agent from the account (DELETE .../agents/{id}). Irreversible. " +
			"Account administration: admitted only when the operations file lists it.",
		Schema: schema(`"agent_id"`, agentID)},
	{Suffix: "canned_response.list", Name: "List canned responses", Method: http.MethodGet, Path: "/canned_responses", Risk: aip.RiskLow,
		Description: "Canned responses of the account (GET .../canned_responses).",
		Schema:      schema(``)},
	{Suffix: "canned_response.create", Name: "Create a canned response", Method: http.MethodPost, Path: "/canned_responses", Mutation: true, Creates: true,
		Risk:        aip.RiskMedium,
		Description: "Adds a canned response (POST .../canned_responses). Not idempotent at Chatwoot: a new action creates another one.",
		Body:        []string{"short_code", "content"},
		Schema:      schema(`"short_code","content"`, cannedFields)},
	{Suffix: "canned_response.update", Name: "Update a canned response", Method: http.MethodPatch, Path: "/canned_responses/{canned_response_id}",
		Mutation: true, Risk: aip.RiskMedium,
		Description: "Changes a canned response's short code or content (PATCH .../canned_responses/{id}).",
		Body:        []string{"short_code", "content"},
		Schema:      minFields(schema(`"canned_response_id"`, cannedID, cannedFields), 2)},
	{Suffix: "canned_response.delete", Name: "Delete a canned response", Method: http.MethodDelete, Path: "/canned_responses/{canned_response_id}",
		Mutation: true, Effect: aip.EffectDelete, Risk: aip.RiskHigh,
		Description: "Removes a canned response from the account (DELETE .../canned_responses/{id}). Irreversible.",
		Schema:      schema(`"canned_response_id"`, cannedID)},
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
	{Suffix: "conversation.create", Name: "Create a conversation", Method: http.MethodPost, Path: "/conversations", Mutation: true, Creates: true,
		Effect: aip.EffectSendMessage, Risk: aip.RiskMedium, Refused: createConversationRefused,
		Description: "Creates a conversation for a contact's inbox source ID, optionally with an initial message that Chatwoot sends " +
			"(POST .../conversations). Not idempotent at Chatwoot: a new action creates another conversation.",
		Body: []string{"source_id", "inbox_id", "contact_id", "additional_attributes", "custom_attributes", "status",
			"assignee_id", "team_id", "snoozed_until", "message"},
		Schema: schema(`"source_id"`,
			`"source_id":{"type":"string","minLength":1,"maxLength":255,"description":"The contact inbox's source ID (contact_inboxes[].source_id)."}`,
			`"inbox_id":`+idProp+`,"description":"Inbox (Website, Phone, Api or Email) the conversation is created in."}`,
			`"contact_id":`+idProp+`,"description":"Contact the conversation is for."}`,
			`"additional_attributes":{"type":"object","maxProperties":100,"description":"E.g. browser information."}`,
			customAttrs,
			`"status":{"type":"string","enum":["open","resolved","pending"],"description":"Initial status."}`,
			`"assignee_id":`+idProp+`,"description":"Agent to assign."}`,
			`"team_id":`+idProp+`,"description":"Team to assign."}`,
			`"snoozed_until":{"type":"string","format":"date-time","maxLength":64,`+
				`"pattern":"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$",`+
				`"description":"RFC 3339 time the conversation is snoozed until."}`,
			`"message":{"type":"object","properties":{`+
				`"content":{"type":"string","minLength":1,"maxLength":150000,"description":"Initial message text."},`+
				`"template_params":{"type":"object","properties":{`+
				`"name":{"type":"string","minLength":1,"maxLength":512},"category":{"type":"string","minLength":1,"maxLength":64},`+
				`"language":{"type":"string","minLength":1,"maxLength":32},"processed_params":{"type":"object","maxProperties":100}},`+
				`"additionalProperties":false,"description":"WhatsApp template parameters."}},`+
				`"required":["content"],"additionalProperties":false,"description":"Initial message."}`)},
	{Suffix: "conversation.update", Name: "Update a conversation", Method: http.MethodPatch, Path: "/conversations/{conversation_id}", Mutation: true,
		Risk:        aip.RiskMedium,
		Description: "Sets a conversation's priority or SLA policy (PATCH .../conversations/{conversation_id}; SLA policies exist in the Enterprise edition only).",
		Body:        []string{"priority", "sla_policy_id"},
		Schema: minFields(schema(`"conversation_id"`, convIDProp, priorityProp,
			`"sla_policy_id":`+idProp+`,"description":"SLA policy to apply (Enterprise edition)."}`), 2)},
	{Suffix: "conversation.filter", Name: "Filter conversations", Method: http.MethodPost, Path: "/conversations/filter", Risk: aip.RiskLow,
		Mutation:    true, // a POST the document does not say changes nothing
		Description: "Conversations matching filter conditions, with counts (POST .../conversations/filter; handled as a mutation, as every POST).",
		Query:       []string{"page"}, Body: []string{"payload"}, Check: checkFilter,
		Schema: schema(`"payload"`, filterProp, pageProp)},
	{Suffix: "conversation.priority", Name: "Set a conversation's priority", Method: http.MethodPost, Path: "/conversations/{conversation_id}/toggle_priority",
		Mutation: true, Risk: aip.RiskMedium,
		Description: "Sets a conversation's priority (POST .../conversations/{conversation_id}/toggle_priority).",
		Body:        []string{"priority"},
		Schema:      schema(`"conversation_id","priority"`, convIDProp, priorityProp)},
	{Suffix: "conversation.custom_attributes", Name: "Update a conversation's custom attributes", Method: http.MethodPost,
		Path: "/conversations/{conversation_id}/custom_attributes", Mutation: true, Risk: aip.RiskMedium,
		Description: "Updates the custom attributes of a conversation (POST .../conversations/{conversation_id}/custom_attributes).",
		Body:        []string{"custom_attributes"},
		Schema:      schema(`"conversation_id","custom_attributes"`, convIDProp, customAttrs)},
	{Suffix: "conversation.label.list", Name: "List a conversation's labels", Method: http.MethodGet, Path: "/conversations/{conversation_id}/labels", Risk: aip.RiskLow,
		Description: "Labels of a conversation (GET .../conversations/{conversation_id}/labels).",
		Schema:      schema(`"conversation_id"`, convIDProp)},
	{Suffix: "conversation.label.update", Name: "Set a conversation's labels", Method: http.MethodPost, Path: "/conversations/{conversation_id}/labels",
		Mutation: true, Risk: aip.RiskMedium,
		Description: "Replaces the labels of a conversation with the given list (POST .../conversations/{conversation_id}/labels).",
		Body:        []string{"labels"},
		Schema:      schema(`"conversation_id","labels"`, convIDProp, labelListProp)},
	{Suffix: "message.list", Name: "List messages", Method: http.MethodGet, Path: "/conversations/{conversation_id}/messages", Risk: aip.RiskLow,
		Description: "Messages of a conversation; after returns up to 100 messages after a message ID, before up to 20 before one (GET .../conversations/{conversation_id}/messages).",
		Query:       []string{"after", "before"},
		Schema: schema(`"conversation_id"`, convIDProp,
			`"after":`+idProp+`,"description":"Messages after this message ID."}`,
			`"before":`+idProp+`,"description":"Messages before this message ID."}`)},
	{Suffix: "message.delete", Name: "Delete a message", Method: http.MethodDelete, Path: "/conversations/{conversation_id}/messages/{message_id}",
		Mutation: true, Effect: aip.EffectDelete, Risk: aip.RiskHigh,
		Description: "Deletes a message's content and attachments (DELETE .../conversations/{conversation_id}/messages/{message_id}). Irreversible.",
		Schema:      schema(`"conversation_id","message_id"`, convIDProp, messageIDProp)},
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
	{Suffix: "contact.create", Name: "Create a contact", Method: http.MethodPost, Path: "/contacts", Mutation: true, Creates: true, Risk: aip.RiskMedium,
		Description: "Creates a contact in an inbox (POST .../contacts). Not idempotent at Chatwoot: a new action creates another contact.",
		Body:        append([]string{"inbox_id"}, contactBody...),
		Schema:      schema(`"inbox_id"`, `"inbox_id":`+idProp+`,"description":"Inbox the contact belongs to."}`, contactFields)},
	{Suffix: "contact.update", Name: "Update a contact", Method: http.MethodPut, Path: "/contacts/{contact_id}", Mutation: true, Risk: aip.RiskMedium,
		Description: "Updates the given fields of a contact (PUT .../contacts/{id}).",
		Body:        contactBody,
		Schema:      minFields(schema(`"contact_id"`, contactID, contactFields), 2)},
	{Suffix: "contact.delete", Name: "Delete a contact", Method: http.MethodDelete, Path: "/contacts/{contact_id}", Mutation: true,
		Effect: aip.EffectDelete, Risk: aip.RiskHigh,
		Description: "Deletes a contact of the account (DELETE .../contacts/{id}). Irreversible.",
		Schema:      schema(`"contact_id"`, contactID)},
	{Suffix: "contact.filter", Name: "Filter contacts", Method: http.MethodPost, Path: "/contacts/filter", Risk: aip.RiskLow,
		Mutation:    true, // a POST the document does not say changes nothing
		Description: "Contacts matching filter conditions, 15 a page (POST .../contacts/filter; handled as a mutation, as every POST).",
		Query:       []string{"page"}, Body: []string{"payload"}, Check: checkFilter,
		Schema: schema(`"payload"`, filterProp, pageProp)},
	{Suffix: "contact.conversation.list", Name: "List a contact's conversations", Method: http.MethodGet, Path: "/contacts/{contact_id}/conversations", Risk: aip.RiskLow,
		Description: "Conversations of a contact (GET .../contacts/{id}/conversations).",
		Schema:      schema(`"contact_id"`, contactID)},
	{Suffix: "contact.label.list", Name: "List a contact's labels", Method: http.MethodGet, Path: "/contacts/{contact_id}/labels", Risk: aip.RiskLow,
		Description: "Labels of a contact (GET .../contacts/{id}/labels).",
		Schema:      schema(`"contact_id"`, contactID)},
	{Suffix: "contact.label.update", Name: "Set a contact's labels", Method: http.MethodPost, Path: "/contacts/{contact_id}/labels", Mutation: true, Risk: aip.RiskMedium,
		Description: "Replaces the labels of a contact with the given list (POST .../contacts/{id}/labels).",
		Body:        []string{"labels"},
		Schema:      schema(`"contact_id","labels"`, contactID, labelListProp)},
	{Suffix: "inbox.list", Name: "List inboxes", Method: http.MethodGet, Path: "/inboxes", Risk: aip.RiskLow,
		Description: "Inboxes of the account, without channel credentials (GET .../inboxes).",
		Schema:      schema(``), Redact: inboxSecrets},
	{Suffix: "inbox.get", Name: "Get an inbox", Method: http.MethodGet, Path: "/inboxes/{inbox_id}", Risk: aip.RiskLow,
		Description: "One inbox, without channel credentials (GET .../inboxes/{id}).",
		Schema:      schema(`"inbox_id"`, `"inbox_id":`+idProp+`,"description":"Numeric inbox ID."}`), Redact: inboxSecrets},
	{Suffix: "team.list", Name: "List teams", Method: http.MethodGet, Path: "/teams", Risk: aip.RiskLow,
		Description: "Teams of the account (GET .../teams).",
		Schema:      schema(``)},
	{Suffix: "team.get", Name: "Get a team", Method: http.MethodGet, Path: "/teams/{team_id}", Risk: aip.RiskLow,
		Description: "One team (GET .../teams/{team_id}).",
		Schema:      schema(`"team_id"`, `"team_id":`+idProp+`,"description":"Numeric team ID."}`)},
	{Suffix: "label.list", Name: "List labels", Method: http.MethodGet, Path: "/labels", Risk: aip.RiskLow,
		Description: "Labels defined in the account (GET .../labels).",
		Schema:      schema(``)},
	{Suffix: "custom_attribute_definition.list", Name: "List custom attribute definitions", Method: http.MethodGet,
		Path: "/custom_attribute_definitions", Risk: aip.RiskLow,
		Description: "Custom attribute definitions of conversations (attribute_model \"0\") or contacts (\"1\") (GET .../custom_attribute_definitions).",
		Query:       []string{"attribute_model"},
		Schema: schema(`"attribute_model"`,
			`"attribute_model":{"type":"string","enum":["0","1"],"description":"0: conversation attributes, 1: contact attributes."}`)},
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
	if err == nil && op.Check != nil {
		err = op.Check(in)
	}
	if err != nil {
		return nil, aip.NewProtocolError("chatwoot.input_invalid", aip.CategoryPermanent, false, 0, err.Error())
	}
	resp, err := c.client.Do(ctx, req)
	if err != nil {
		if op.Refused != nil {
			err = op.Refused(in, err)
		}
		return provider.Result(call, err, op.Mutation)
	}
	data := json.RawMessage("null")
	if len(strings.TrimSpace(string(resp.Body))) > 0 {
		if !json.Valid(resp.Body) {
			return provider.Result(call, &provider.Error{Product: "chatwoot", Method: req.Method, Path: req.Path,
				Status: resp.Status, Message: "the answer is not JSON", MayHaveApplied: true}, op.Mutation)
		}
		data = resp.Body
		if len(op.Redact) > 0 {
			if data, err = redact(data, op.Redact); err != nil {
				return provider.Result(call, &provider.Error{Product: "chatwoot", Method: req.Method, Path: req.Path,
					Status: resp.Status, Message: "the answer could not be read", MayHaveApplied: true}, op.Mutation)
			}
		}
	}
	return call.Complete(map[string]any{"status": resp.Status, "data": data})
}

// redact returns raw without the named members, at any depth.
func redact(raw json.RawMessage, names []string) (json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, n := range names {
				delete(v, n)
			}
			for _, m := range v {
				walk(m)
			}
		case []any:
			for _, m := range v {
				walk(m)
			}
		}
	}
	walk(v)
	return json.Marshal(v)
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
			if len(list) == 0 {
				continue
			}
			items := make([]string, len(list))
			for i, item := range list {
				v, ok := scalar(item)
				if !ok || strings.Contains(v, ",") {
					return provider.Request{}, fmt.Errorf("input field %s: want a list of strings or numbers without commas", name)
				}
				items[i] = v
			}
			req.Query.Set(name, strings.Join(items, ","))
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
