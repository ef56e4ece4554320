package chatwoot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Composite capability IDs.
const (
	CapMessageCreate       = CapabilityPrefix + "message:create"
	CapConversationStatus  = CapabilityPrefix + "conversation:status"
	CapConversationHandoff = CapabilityPrefix + "conversation:handoff"
)

// CodeHandoffNoteFailed is the failed result of a handoff whose assignment
// was applied but whose private note Chatwoot refused.
const CodeHandoffNoteFailed = "chatwoot.handoff_note_failed"

// CodeHandoffNotAssigned is the failed result of a handoff to an agent or
// team the account does not have: Chatwoot answers 200 with null and
// clears the conversation's assignee (or team) instead.
const CodeHandoffNotAssigned = "chatwoot.handoff_not_assigned"

// MaxContent bounds a message's content (Chatwoot's own limit is 150 000
// characters).
const MaxContent = 150000

// composite is a capability made of one or more provider calls with a
// shaped input and output.
type composite struct {
	ID, Name, Description string
	Risk                  aip.Risk
	Effect                aip.SideEffect
	CreatesNew            bool
	Schema                string
	run                   func(ctx context.Context, c *Connector, call *hostsdk.Call) (*aip.ActionResult, error)
}

func (op *composite) id() string { return op.ID }

func (op *composite) capability() aip.Capability {
	return aip.Capability{ID: op.ID, Name: op.Name, Kind: aip.KindTool, Description: op.Description,
		InputSchema: json.RawMessage(op.Schema), Risk: op.Risk, Stability: aip.StabilityStable,
		Contract: contract(true, op.CreatesNew, op.Effect)}
}

var composites = []*composite{
	{
		ID: CapMessageCreate, Name: "Send a message", Risk: aip.RiskMedium, Effect: aip.EffectSendMessage, CreatesNew: true,
		Description: "Posts an outgoing message (or, with private, an internal note) in a conversation " +
			"(POST .../conversations/{conversation_id}/messages, message_type outgoing). The AIP action ID is recorded in the " +
			"message's content_attributes." + ActionIDAttribute + " so that its webhook is not turned back into an event. " +
			"Chatwoot answers 422 also to an error raised after it stored the message: the connector then looks for the message " +
			"among the conversation's latest, and the action is outcome_unknown unless they show it was not stored.",
		Schema: schema(`"conversation_id","content"`, convIDProp,
			`"content":{"type":"string","minLength":1,"maxLength":150000,"description":"Message text."}`,
			`"private":{"type":"boolean","description":"An internal note visible to agents only (default false)."}`),
		run: runMessageCreate,
	},
	{
		ID: CapConversationStatus, Name: "Set a conversation's status", Risk: aip.RiskMedium, Effect: aip.EffectWrite,
		Description: "Sets a conversation's status to open, resolved or pending (POST .../conversations/{conversation_id}/toggle_status).",
		Schema: schema(`"conversation_id","status"`, convIDProp,
			`"status":{"type":"string","enum":["open","resolved","pending"],"description":"The new status."}`),
		run: runConversationStatus,
	},
	{
		ID: CapConversationHandoff, Name: "Hand a conversation off", Risk: aip.RiskMedium, Effect: aip.EffectWrite,
		Description: "Assigns a conversation to an agent (assignee_id) or a team (team_id), not both (Chatwoot ignores team_id " +
			"next to assignee_id) " +
			"(POST .../conversations/{conversation_id}/assignments), then, when note is given, adds it as a private note. " +
			"If the assignment is applied and the note is refused the action fails with " + CodeHandoffNoteFailed +
			", saying the assignment was applied (outcome_unknown when the note may have been stored, as for message:create).",
		Schema: `{"type":"object","properties":{` + convIDProp + `,` +
			`"assignee_id":` + idProp + `,"description":"Agent (user) to assign."},` +
			`"team_id":` + idProp + `,"description":"Team to assign (instead of an agent)."},` +
			`"note":{"type":"string","minLength":1,"maxLength":150000,"description":"Private note added after the assignment."}},` +
			`"required":["conversation_id"],"oneOf":[{"required":["assignee_id"]},{"required":["team_id"]}],"additionalProperties":false}`,
		run: runConversationHandoff,
	},
}

func (c *Connector) conversationPath(id int64) string {
	return c.base + "/conversations/" + strconv.FormatInt(id, 10)
}

// messageBody is the document's conversation_message_create_payload as
// the connector sends it.
type messageBody struct {
	Content           string            `json:"content"`
	MessageType       string            `json:"message_type"`
	Private           bool              `json:"private"`
	ContentAttributes map[string]string `json:"content_attributes"`
}

func (c *Connector) postMessage(ctx context.Context, call *hostsdk.Call, conversationID int64, content string, private bool) (map[string]any, error) {
	attrs := map[string]string{ActionIDAttribute: call.Action.ID}
	if call.IdempotencyKey != "" && call.IdempotencyKey != call.Action.ID {
		// Scoped as every provider gets a key: content_attributes reach
		// the contact's widget, and one account may serve several tenants.
		attrs["aip_idempotency_key"] = provider.CallIdempotencyKey(call)
	}
	var out map[string]any
	err := c.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: c.conversationPath(conversationID) + "/messages",
		JSON: messageBody{Content: content, MessageType: "outgoing", Private: private, ContentAttributes: attrs}}, &out)
	return out, err
}

func runMessageCreate(ctx context.Context, c *Connector, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in struct {
		ConversationID int64  `json:"conversation_id"`
		Content        string `json:"content"`
		Private        bool   `json:"private"`
	}
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	sent := time.Now()
	msg, err := c.postMessage(ctx, call, in.ConversationID, in.Content, in.Private)
	if err != nil {
		return provider.Result(call, c.messageRefusal(ctx, call, in.ConversationID, sent, err), true)
	}
	return call.Complete(map[string]any{"conversation_id": in.ConversationID, "message_id": msg["id"],
		"private": in.Private, "message": msg})
}

func runConversationStatus(ctx context.Context, c *Connector, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in struct {
		ConversationID int64  `json:"conversation_id"`
		Status         string `json:"status"`
	}
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	var out struct {
		Payload struct {
			Success       *bool  `json:"success"`
			CurrentStatus string `json:"current_status"`
		} `json:"payload"`
	}
	err := c.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: c.conversationPath(in.ConversationID) + "/toggle_status",
		JSON: map[string]string{"status": in.Status}}, &out)
	if err != nil {
		return provider.Result(call, err, true)
	}
	if out.Payload.Success != nil && !*out.Payload.Success {
		return call.Fail("chatwoot.status_not_changed", aip.CategoryPermanent, false,
			fmt.Sprintf("Chatwoot answered success false for status %q of conversation %d (current status %q)",
				in.Status, in.ConversationID, out.Payload.CurrentStatus)), nil
	}
	current := out.Payload.CurrentStatus
	if current == "" {
		current = in.Status
	}
	return call.Complete(map[string]any{"conversation_id": in.ConversationID, "status": current})
}

func runConversationHandoff(ctx context.Context, c *Connector, call *hostsdk.Call) (*aip.ActionResult, error) {
	var in struct {
		ConversationID int64  `json:"conversation_id"`
		AssigneeID     *int64 `json:"assignee_id"`
		TeamID         *int64 `json:"team_id"`
		Note           string `json:"note"`
	}
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	// key is the body member, what and none name the assignee in errors.
	var key, what, none string
	var id int64
	switch {
	case in.AssigneeID != nil:
		key, what, none, id = "assignee_id", "agent", "an assigned agent", *in.AssigneeID
	case in.TeamID != nil:
		key, what, none, id = "team_id", "team", "a team", *in.TeamID
	default:
		return nil, aip.NewProtocolError("chatwoot.input_invalid", aip.CategoryPermanent, false, 0,
			"handoff needs assignee_id or team_id")
	}
	body := map[string]int64{key: id}
	var assignee map[string]any
	err := c.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: c.conversationPath(in.ConversationID) + "/assignments",
		JSON: body}, &assignee)
	if err != nil {
		return provider.Result(call, err, true)
	}
	// Chatwoot looks the agent (team) up in the account and assigns what
	// it finds: for an ID the account does not have, nobody, answering
	// null.
	if assignee == nil {
		// Nothing asked for was assigned, but the conversation's assignee
		// (team) was cleared: details say both, not "applied: false" alone.
		details, _ := json.Marshal(map[string]any{"assignment_applied": false, key + "_found": false, "cleared": strings.TrimSuffix(key, "_id")})
		return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
			Error: &aip.ProtocolError{Code: CodeHandoffNotAssigned, Category: aip.CategoryPermanent, Retryable: new(false),
				Message: fmt.Sprintf("Chatwoot did not assign conversation %d to %s %d: it answered null, as it does for a %s "+
					"account %d does not have, and has left the conversation without %s (applied); no note was added",
					in.ConversationID, what, id, what, c.cfg.AccountID, none),
				Details: details}}, nil
	}
	if got, ok := assignee["id"].(float64); !ok || got != float64(id) {
		raw, _ := json.Marshal(assignee)
		return nil, fmt.Errorf("%w: Chatwoot answered the assignment of conversation %d to %s %d with %s, another %s",
			hostsdk.ErrOutcomeUnknown, in.ConversationID, what, id, provider.Excerpt(string(raw)), what)
	}
	out := map[string]any{"conversation_id": in.ConversationID, "assigned": true, "assignee": assignee}
	for k, v := range body {
		out[k] = v
	}
	if in.Note == "" {
		return call.Complete(out)
	}
	sent := time.Now()
	note, err := c.postMessage(ctx, call, in.ConversationID, in.Note, true)
	if err != nil {
		err = c.messageRefusal(ctx, call, in.ConversationID, sent, err)
		var pe *provider.Error
		if !errors.As(err, &pe) {
			return nil, fmt.Errorf("conversation %d was assigned (applied); adding the private note: %w", in.ConversationID, err)
		}
		if pe.MayHaveApplied {
			return nil, fmt.Errorf("%w: conversation %d was assigned (applied); the private note may or may not have been added: %v",
				hostsdk.ErrOutcomeUnknown, in.ConversationID, pe)
		}
		perr := provider.ProtocolError(pe)
		details, _ := json.Marshal(map[string]any{"assignment_applied": true, "note_added": false, "note_error": perr})
		raw, _ := json.Marshal(out)
		return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed, Output: raw,
			Error: &aip.ProtocolError{Code: CodeHandoffNoteFailed, Category: aip.CategoryPermanent, Retryable: new(false),
				Message: fmt.Sprintf("conversation %d was assigned (applied), but Chatwoot refused the private note: %v", in.ConversationID, pe),
				Details: details}}, nil
	}
	out["note_message_id"] = note["id"]
	return call.Complete(out)
}
