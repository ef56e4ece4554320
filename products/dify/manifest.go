package dify

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Schema fragments shared by the input schemas.
const (
	userSchema   = `{"type": "string", "minLength": 1, "maxLength": 255, "description": "Dify's end-user identifier, defined by the caller and unique within the app; conversations and messages are visible only to the same user"}`
	idSchema     = `{"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9_-]+$"}`
	inputsSchema = `{"type": "object", "maxProperties": 256, "description": "values of the app's input variables, keyed by variable name (see the app's parameters capability)"}`
	filesSchema  = `{"type": "array", "maxItems": 32, "items": {
      "type": "object",
      "properties": {
        "type": {"type": "string", "enum": ["image", "document", "audio", "video", "custom"]},
        "transfer_method": {"type": "string", "enum": ["remote_url", "local_file"]},
        "url": {"type": "string", "minLength": 1, "maxLength": 8192},
        "upload_file_id": {"type": "string", "minLength": 1, "maxLength": 128}
      },
      "required": ["type", "transfer_method"],
      "additionalProperties": false,
      "oneOf": [
        {"properties": {"transfer_method": {"const": "remote_url"}}, "required": ["url"], "not": {"required": ["upload_file_id"]}},
        {"properties": {"transfer_method": {"const": "local_file"}}, "required": ["upload_file_id"], "not": {"required": ["url"]}}
      ]}}`
	limitSchema = `{"type": "integer", "minimum": 1, "maximum": 100}`
)

func invokeSchema(m Mode) json.RawMessage {
	switch {
	case m.chat():
		return json.RawMessage(`{"type": "object",
  "properties": {
    "inputs": ` + inputsSchema + `,
    "query": {"type": "string", "minLength": 1, "maxLength": 65536, "description": "the user's message"},
    "conversation_id": {"type": "string", "maxLength": 128, "description": "the conversation to continue; omit or empty to start one"},
    "user": ` + userSchema + `,
    "files": ` + filesSchema + `
  },
  "required": ["query", "user"],
  "additionalProperties": false}`)
	case m == ModeCompletion:
		return json.RawMessage(`{"type": "object",
  "properties": {
    "inputs": ` + inputsSchema + `,
    "query": {"type": "string", "maxLength": 65536, "description": "legacy text field; newer apps take it inside inputs"},
    "user": ` + userSchema + `,
    "files": ` + filesSchema + `
  },
  "required": ["user"],
  "additionalProperties": false}`)
	}
	return json.RawMessage(`{"type": "object",
  "properties": {
    "inputs": ` + inputsSchema + `,
    "user": ` + userSchema + `,
    "files": ` + filesSchema + `
  },
  "required": ["user"],
  "additionalProperties": false}`)
}

var (
	parametersSchema    = json.RawMessage(`{"type": "object", "properties": {}, "additionalProperties": false}`)
	conversationsSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "user": ` + userSchema + `,
    "last_id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "the last conversation of the previous page"},
    "limit": ` + limitSchema + `,
    "sort_by": {"type": "string", "enum": ["created_at", "-created_at", "updated_at", "-updated_at"]}
  },
  "required": ["user"],
  "additionalProperties": false}`)
	messagesSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "conversation_id": {"type": "string", "minLength": 1, "maxLength": 128},
    "user": ` + userSchema + `,
    "first_id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "the first message of the current page, to read older ones"},
    "limit": ` + limitSchema + `
  },
  "required": ["conversation_id", "user"],
  "additionalProperties": false}`)
	feedbackSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "message_id": ` + idSchema + `,
    "user": ` + userSchema + `,
    "rating": {"type": ["string", "null"], "enum": ["like", "dislike", null], "description": "null withdraws the rating"},
    "content": {"type": "string", "maxLength": 10000}
  },
  "required": ["message_id", "user", "rating"],
  "additionalProperties": false}`)
	retrieveSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "query": {"type": "string", "minLength": 1, "maxLength": 250},
    "retrieval_model": {"type": "object",
      "properties": {
        "search_method": {"type": "string", "enum": ["keyword_search", "semantic_search", "full_text_search", "hybrid_search"]},
        "top_k": {"type": "integer", "minimum": 1, "maximum": 100},
        "score_threshold": {"type": "number", "minimum": 0, "maximum": 1},
        "reranking_enable": {"type": "boolean"}
      },
      "required": ["search_method", "top_k"],
      "additionalProperties": false,
      "description": "overrides the knowledge base's retrieval settings; omit to use them"}
  },
  "required": ["query"],
  "additionalProperties": false}`)
	objectOutput = json.RawMessage(`{"type": "object"}`)
	invokeOutput = json.RawMessage(`{"type": "object",
  "properties": {
    "mode": {"type": "string"},
    "task_id": {"type": "string"},
    "answer": {"type": "string"},
    "conversation_id": {"type": "string"},
    "message_id": {"type": "string"},
    "metadata": {"type": "object"},
    "files": {"type": "array"},
    "workflow_run_id": {"type": "string"},
    "status": {"type": "string"},
    "outputs": {"type": "object"},
    "text": {"type": "string"},
    "elapsed_time": {"type": "number"},
    "total_tokens": {"type": "integer"},
    "total_steps": {"type": "integer"},
    "paused": {"type": "object"}
  },
  "required": ["mode"]}`)
)

func contract(effects []aip.SideEffect, safety aip.RetrySafety, streaming, cancel bool) *aip.CapabilityContract {
	completion := aip.CompletionSync
	if streaming {
		completion = aip.CompletionAny
	}
	return &aip.CapabilityContract{
		SideEffects: effects,
		Idempotency: aip.IdempotencyContract{
			Requirement: aip.IdempotencyOptional, CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction,
		},
		Execution: aip.ExecutionContract{
			SupportsSync: true, SupportsStreaming: streaming, SupportsCancel: cancel,
			SupportsRetry: safety == aip.RetrySafe, ExpectedCompletion: completion, RetrySafety: safety,
		},
		Data: aip.DataContract{Sensitivity: aip.SensitivityConfidential, ContainsPII: true},
	}
}

// Manifest implements hostsdk.Connector.
func (c *Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: AgentID, Kind: aip.PrincipalAgent, DisplayName: "Dify"},
		Profiles:        []string{aip.NativeHTTPProfile, Profile},
	}
	read := contract([]aip.SideEffect{aip.EffectRead}, aip.RetrySafe, false, false)
	for _, id := range c.appOrder {
		a := c.apps[id]
		about := a.Name
		if a.Description != "" {
			about += ": " + a.Description
		}
		for _, op := range a.Mode.ops() {
			capID := AppCapability(id, suffixOf(op))
			var cp aip.Capability
			switch op {
			case opInvoke:
				kind := aip.KindAgent
				if a.Mode == ModeWorkflow {
					kind = aip.KindWorkflow
				}
				returns := "its answer"
				switch a.Mode {
				case ModeWorkflow:
					returns = "its outputs and text"
				case ModeAdvancedChat:
					returns = "its answer and workflow outputs"
				}
				cp = aip.Capability{Name: "Run " + a.Name, Kind: kind, InputSchema: invokeSchema(a.Mode), OutputSchema: invokeOutput,
					Description: fmt.Sprintf("Runs the Dify %s app %s (%s) and returns %s. In streaming mode the chunks are forwarded as they arrive; a cancel stops the app's task.",
						a.Mode, id, about, returns),
					Risk:     aip.RiskMedium,
					Contract: contract([]aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork}, aip.RetryUnsafe, true, true)}
			case opParameters:
				cp = aip.Capability{Name: a.Name + ": parameters", Kind: aip.KindTool, InputSchema: parametersSchema, OutputSchema: objectOutput,
					Description: "Reads the input form, file upload settings and features of the Dify app " + id + " (" + about + ").",
					Risk:        aip.RiskLow, Contract: read}
			case opConversations:
				cp = aip.Capability{Name: a.Name + ": conversations", Kind: aip.KindTool, InputSchema: conversationsSchema, OutputSchema: objectOutput,
					Description: "Lists one end user's conversations with the Dify app " + id + ", newest first, paged by last_id.",
					Risk:        aip.RiskLow, Contract: read}
			case opMessages:
				cp = aip.Capability{Name: a.Name + ": messages", Kind: aip.KindTool, InputSchema: messagesSchema, OutputSchema: objectOutput,
					Description: "Lists the messages of one conversation with the Dify app " + id + ", paged backwards by first_id.",
					Risk:        aip.RiskLow, Contract: read}
			case opFeedback:
				cp = aip.Capability{Name: a.Name + ": feedback", Kind: aip.KindTool, InputSchema: feedbackSchema, OutputSchema: objectOutput,
					Description: "Rates a message of the Dify app " + id + " (like, dislike, or null to withdraw) as the end user, with an optional comment.",
					Risk:        aip.RiskLow,
					Contract:    contract([]aip.SideEffect{aip.EffectWrite}, aip.RetrySafe, false, false)}
			}
			cp.ID = capID
			cp.Stability = aip.StabilityStable
			m.Capabilities = append(m.Capabilities, cp)
		}
	}
	for _, id := range c.datasetOrder {
		d := c.datasets[id]
		about := d.Name
		if d.Description != "" {
			about += ": " + d.Description
		}
		m.Capabilities = append(m.Capabilities, aip.Capability{
			ID: RetrieveCapability(id), Name: d.Name + ": retrieve", Kind: aip.KindTool,
			InputSchema: retrieveSchema, OutputSchema: objectOutput,
			Description: "Searches the Dify knowledge base " + id + " (" + about + ") and returns the matching chunks with their scores. Changes nothing.",
			Risk:        aip.RiskLow, Stability: aip.StabilityStable, Contract: read,
		})
	}
	return m, nil
}
