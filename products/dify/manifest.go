package dify

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

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
	pageSchema  = `{"type": "integer", "minimum": 1, "maximum": 99999}`
	uuidSchema  = `{"type": "string", "pattern": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"}`
	// Documents created from text.
	docNameSchema     = `{"type": "string", "minLength": 1, "maxLength": 255}`
	docTextSchema     = `{"type": "string", "minLength": 1, "maxLength": 1000000}`
	docFormSchema     = `{"type": "string", "enum": ["text_model", "hierarchical_model", "qa_model"], "description": "chunking: standard text (default), parent-child, or question-answer pairs"}`
	docLanguageSchema = `{"type": "string", "minLength": 1, "maxLength": 64, "description": "the document's language (default English)"}`
	// The knowledge pipeline's.
	nodeIDSchema         = `{"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/]+$", "description": "a datasource node of the pipeline (its node_id in pipeline.datasource_plugins)"}`
	pipelineInputsSchema = `{"type": "object", "maxProperties": 256, "description": "values of the pipeline's input variables, keyed by variable name ({} when it has none)"}`
	datasourceTypeSchema = `{"type": "string", "enum": ["local_file", "online_document", "website_crawl", "online_drive"]}`
	processRuleSchema    = `{"type": "object",
      "properties": {
        "mode": {"type": "string", "enum": ["automatic", "custom", "hierarchical"]},
        "rules": {"type": "object",
          "properties": {
            "pre_processing_rules": {"type": "array", "maxItems": 3, "items": {"type": "object",
              "properties": {
                "id": {"type": "string", "enum": ["remove_stopwords", "remove_extra_spaces", "remove_urls_emails"]},
                "enabled": {"type": "boolean"}
              },
              "required": ["id", "enabled"], "additionalProperties": false}},
            "segmentation": {"type": "object",
              "properties": {
                "separator": {"type": "string", "minLength": 1, "maxLength": 64},
                "max_tokens": {"type": "integer", "minimum": 1, "maximum": 100000},
                "chunk_overlap": {"type": "integer", "minimum": 0, "maximum": 100000}
              },
              "additionalProperties": false}
          },
          "additionalProperties": false}
      },
      "required": ["mode"],
      "additionalProperties": false,
      "description": "how the text is cut into chunks; custom mode takes rules"}`
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
	emptySchema         = json.RawMessage(`{"type": "object", "properties": {}, "additionalProperties": false}`)
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
        "reranking_enable": {"type": "boolean", "description": "true: rerank the results with reranking_model"},
        "reranking_model": {"type": "object",
          "properties": {
            "reranking_provider_name": {"type": "string", "minLength": 1, "maxLength": 255, "description": "organization/plugin/provider, e.g. langgenius/cohere/cohere"},
            "reranking_model_name": {"type": "string", "minLength": 1, "maxLength": 255}
          },
          "required": ["reranking_provider_name", "reranking_model_name"],
          "additionalProperties": false,
          "description": "the rerank model; required with reranking_enable true, and only then"}
      },
      "required": ["search_method", "top_k"],
      "additionalProperties": false,
      "if": {"properties": {"reranking_enable": {"const": true}}, "required": ["reranking_enable"]},
      "then": {"required": ["reranking_model"]},
      "else": {"not": {"required": ["reranking_model"]}},
      "description": "overrides the knowledge base's retrieval settings; omit to use them"}
  },
  "required": ["query"],
  "additionalProperties": false}`)
	uploadSchema = json.RawMessage(`{"type": "object",
  "properties": {
    ` + fileFields + `,
    "user": ` + userSchema + `
  },
  "required": ["filename", "content_base64"],
  "additionalProperties": false}`)
	objectOutput  = json.RawMessage(`{"type": "object"}`)
	deletedOutput = json.RawMessage(`{"type": "object", "properties": {"deleted": {"type": "boolean"}}, "required": ["deleted"]}`)

	renameSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "conversation_id": ` + idSchema + `,
    "user": ` + userSchema + `,
    "name": {"type": "string", "minLength": 1, "maxLength": 255, "description": "the new name; required unless auto_generate is true"},
    "auto_generate": {"type": "boolean", "description": "true: Dify names the conversation from its messages (name is then ignored)"}
  },
  "required": ["conversation_id", "user"],
  "anyOf": [{"required": ["name"]}, {"properties": {"auto_generate": {"const": true}}, "required": ["auto_generate"]}],
  "additionalProperties": false}`)
	conversationDeleteSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "conversation_id": ` + idSchema + `,
    "user": ` + userSchema + `
  },
  "required": ["conversation_id", "user"],
  "additionalProperties": false}`)
	variablesSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "conversation_id": ` + idSchema + `,
    "user": ` + userSchema + `,
    "last_id": {"type": "string", "minLength": 1, "maxLength": 128, "description": "the last variable of the previous page"},
    "limit": ` + limitSchema + `,
    "variable_name": {"type": "string", "minLength": 1, "maxLength": 255, "description": "only the variable of this name"}
  },
  "required": ["conversation_id", "user"],
  "additionalProperties": false}`)
	suggestedSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "message_id": ` + idSchema + `,
    "user": ` + userSchema + `
  },
  "required": ["message_id", "user"],
  "additionalProperties": false}`)
	// GET /app/feedbacks takes up to 101 per page (the document's maximum,
	// Dify's le=101), one more than its other lists.
	feedbacksSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "page": ` + pageSchema + `,
    "limit": {"type": "integer", "minimum": 1, "maximum": 101}
  },
  "additionalProperties": false}`)
	workflowRunSchema = json.RawMessage(`{"type": "object",
  "properties": {"workflow_run_id": ` + idSchema + `},
  "required": ["workflow_run_id"],
  "additionalProperties": false}`)
	workflowLogsSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "keyword": {"type": "string", "minLength": 1, "maxLength": 255},
    "status": {"type": "string", "enum": ["succeeded", "failed", "stopped"]},
    "page": ` + pageSchema + `,
    "limit": ` + limitSchema + `,
    "created_at__before": {"type": "string", "format": "date-time", "maxLength": 64, "description": "ISO 8601 timestamp"},
    "created_at__after": {"type": "string", "format": "date-time", "maxLength": 64, "description": "ISO 8601 timestamp"},
    "created_by_end_user_session_id": {"type": "string", "minLength": 1, "maxLength": 255, "description": "the end user (the user of the invocation)"},
    "created_by_account": {"type": "string", "minLength": 3, "maxLength": 320, "description": "the email of the account that ran it"}
  },
  "additionalProperties": false}`)
	documentsSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "page": ` + pageSchema + `,
    "limit": ` + limitSchema + `,
    "keyword": {"type": "string", "minLength": 1, "maxLength": 255, "description": "part of the document name"},
    "status": {"type": "string", "enum": ["queuing", "indexing", "paused", "error", "available", "disabled", "archived"]}
  },
  "additionalProperties": false}`)
	documentSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "document_id": ` + uuidSchema + `,
    "metadata": {"type": "string", "enum": ["all", "only", "without"], "description": "all (default): every field; only: id, doc_type and doc_metadata; without: all but doc_metadata"}
  },
  "required": ["document_id"],
  "additionalProperties": false}`)
	documentIDSchema = json.RawMessage(`{"type": "object",
  "properties": {"document_id": ` + uuidSchema + `},
  "required": ["document_id"],
  "additionalProperties": false}`)
	documentCreateSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "name": ` + docNameSchema + `,
    "text": ` + docTextSchema + `,
    "indexing_technique": {"type": "string", "enum": ["high_quality", "economy"], "description": "required for the knowledge base's first document; later ones inherit it"},
    "doc_form": ` + docFormSchema + `,
    "doc_language": ` + docLanguageSchema + `,
    "process_rule": ` + processRuleSchema + `,
    "embedding_model": {"type": "string", "minLength": 1, "maxLength": 255},
    "embedding_model_provider": {"type": "string", "minLength": 1, "maxLength": 255},
    "original_document_id": ` + uuidSchema + `
  },
  "required": ["name", "text"],
  "additionalProperties": false}`)
	documentUpdateSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "document_id": ` + uuidSchema + `,
    "name": ` + docNameSchema + `,
    "text": ` + docTextSchema + `,
    "doc_form": ` + docFormSchema + `,
    "doc_language": ` + docLanguageSchema + `,
    "process_rule": ` + processRuleSchema + `
  },
  "required": ["document_id"],
  "minProperties": 2,
  "dependentRequired": {"text": ["name"]},
  "additionalProperties": false}`)
	// fileFields are the file of an upload (filename, content_base64,
	// mime_type).
	// fileContentFields are the file of an upload: its name and bytes.
	fileContentFields = `"filename": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^/\\\\\"\\x00-\\x1f\\x7f]+$",
      "description": "the file's name with its extension (Dify checks the extension against the deployment's blacklist); no / \\ \" or control characters"},
    "content_base64": {"type": "string", "minLength": 4, "maxLength": ` + strconv.Itoa(4*((MaxUploadBytes+2)/3)) + `,
      "contentEncoding": "base64", "description": "the file's bytes in standard base64 with padding, at most 2.5 MiB decoded"}`
	// fileFields add the file's media type.
	fileFields = fileContentFields + `,
    "mime_type": {"type": "string", "minLength": 3, "maxLength": 255, "description": "the file's media type, e.g. image/png or application/pdf; default application/octet-stream"}`
	audioSchema = json.RawMessage(`{"type": "object",
  "properties": {
    ` + fileContentFields + `,
    "mime_type": {"type": "string", "enum": ["audio/mp3", "audio/m4a", "audio/wav", "audio/amr", "audio/mpga"],
      "description": "the types Dify accepts (it refuses others, audio/mpeg included)"},
    "user": ` + userSchema + `
  },
  "required": ["filename", "content_base64", "mime_type"],
  "additionalProperties": false}`)
	documentCreateByFileSchema = json.RawMessage(`{"type": "object",
  "properties": {
    ` + fileFields + `,
    "indexing_technique": {"type": "string", "enum": ["high_quality", "economy"], "description": "required for the knowledge base's first document; later ones inherit it"},
    "doc_form": ` + docFormSchema + `,
    "doc_language": ` + docLanguageSchema + `,
    "process_rule": ` + processRuleSchema + `,
    "embedding_model": {"type": "string", "minLength": 1, "maxLength": 255},
    "embedding_model_provider": {"type": "string", "minLength": 1, "maxLength": 255}
  },
  "required": ["filename", "content_base64"],
  "additionalProperties": false}`)
	documentUpdateByFileSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "document_id": ` + uuidSchema + `,
    ` + fileFields + `,
    "doc_form": ` + docFormSchema + `,
    "doc_language": ` + docLanguageSchema + `,
    "process_rule": ` + processRuleSchema + `
  },
  "required": ["document_id", "filename", "content_base64"],
  "additionalProperties": false}`)
	segmentsSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "document_id": ` + uuidSchema + `,
    "page": ` + pageSchema + `,
    "limit": ` + limitSchema + `,
    "status": {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "string", "minLength": 1, "maxLength": 32}, "description": "indexing statuses, e.g. completed, indexing, error"},
    "keyword": {"type": "string", "minLength": 1, "maxLength": 255}
  },
  "required": ["document_id"],
  "additionalProperties": false}`)
	// The knowledge pipeline's.
	datasourcePluginsSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "is_published": {"type": "boolean", "description": "true (default): the nodes of the published pipeline; false: of the draft"}
  },
  "additionalProperties": false}`)
	datasourcePluginsOutput = json.RawMessage(`{"type": "object",
  "properties": {"datasource_plugins": {"type": "array", "items": {"type": "object"}}},
  "required": ["datasource_plugins"]}`)
	datasourceRunSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "node_id": ` + nodeIDSchema + `,
    "inputs": ` + pipelineInputsSchema + `,
    "datasource_type": ` + datasourceTypeSchema + `,
    "credential_id": {"type": ["string", "null"], "maxLength": 255, "description": "the credential to use, from the node's credentials (pipeline.datasource_plugins); omit or null for the provider's default"},
    "is_published": {"type": "boolean", "description": "true: run the published version of the node; false: the draft"}
  },
  "required": ["node_id", "inputs", "datasource_type", "is_published"],
  "additionalProperties": false}`)
	datasourceRunOutput = json.RawMessage(`{"type": "object",
  "properties": {
    "results": {"type": "array", "description": "the data of each datasource_completed event, in order"},
    "total": {"type": "integer"},
    "completed": {"type": "integer"},
    "time_consuming": {"type": "number"}
  },
  "required": ["results"]}`)
	pipelineRunSchema = json.RawMessage(`{"type": "object",
  "properties": {
    "inputs": ` + pipelineInputsSchema + `,
    "datasource_type": ` + datasourceTypeSchema + `,
    "datasource_info_list": {"type": "array", "maxItems": ` + strconv.Itoa(MaxPipelineItems) + `, "items": {"type": "object"},
      "description": "the items to process; their shape depends on datasource_type"},
    "start_node_id": ` + nodeIDSchema + `,
    "is_published": {"type": "boolean", "description": "true: run the published pipeline (it adds documents); false: a test run of the draft"}
  },
  "required": ["inputs", "datasource_type", "datasource_info_list", "start_node_id", "is_published"],
  "additionalProperties": false,
  "allOf": [
    {"if": {"properties": {"datasource_type": {"const": "local_file"}}, "required": ["datasource_type"]},
     "then": {"properties": {"datasource_info_list": {"items": {"type": "object",
       "properties": {
         "reference": {"type": "string", "minLength": 1, "maxLength": 255, "description": "the id pipeline.file_upload returned"},
         "name": {"type": "string", "maxLength": 255, "description": "the document's title (default untitled)"}
       },
       "required": ["reference"], "additionalProperties": false}}}}},
    {"if": {"properties": {"datasource_type": {"const": "online_document"}}, "required": ["datasource_type"]},
     "then": {"properties": {"datasource_info_list": {"items": {"type": "object",
       "properties": {
         "workspace_id": {"type": "string", "minLength": 1, "maxLength": 255, "description": "the workspace or database in the external platform"},
         "page": {"type": "object",
           "properties": {
             "page_id": {"type": "string", "minLength": 1, "maxLength": 255},
             "type": {"type": "string", "minLength": 1, "maxLength": 64, "description": "the page type the datasource plugin defines, e.g. page or database"},
             "page_name": {"type": "string", "maxLength": 255, "description": "default untitled"}
           },
           "required": ["page_id", "type"], "additionalProperties": false},
         "credential_id": {"type": "string", "maxLength": 255, "description": "omit for the provider's default credential"}
       },
       "required": ["workspace_id", "page"], "additionalProperties": false}}}}},
    {"if": {"properties": {"datasource_type": {"const": "website_crawl"}}, "required": ["datasource_type"]},
     "then": {"properties": {"datasource_info_list": {"items": {"type": "object",
       "properties": {
         "url": {"type": "string", "minLength": 1, "maxLength": 8192},
         "title": {"type": "string", "maxLength": 255, "description": "the document's name (default untitled)"}
       },
       "required": ["url"], "additionalProperties": false}}}}},
    {"if": {"properties": {"datasource_type": {"const": "online_drive"}}, "required": ["datasource_type"]},
     "then": {"properties": {"datasource_info_list": {"items": {"type": "object",
       "properties": {
         "id": {"type": "string", "minLength": 1, "maxLength": 1024, "description": "the file or folder"},
         "type": {"type": "string", "enum": ["file", "folder"], "description": "a folder is expanded to its files"},
         "bucket": {"type": "string", "minLength": 1, "maxLength": 255, "description": "for providers with buckets (S3-compatible stores)"},
         "name": {"type": "string", "maxLength": 1024, "description": "default untitled"}
       },
       "required": ["id", "type"], "additionalProperties": false}}}}}
  ]}`)
	pipelineUploadSchema = json.RawMessage(`{"type": "object",
  "properties": {
    ` + fileFields + `
  },
  "required": ["filename", "content_base64"],
  "additionalProperties": false}`)
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
// ActionStateNamespaces implements hostsdk.ActionStateKeeper: an action's
// task record (for a later cancel) goes when the host prunes the action.
func (c *Connector) ActionStateNamespaces() []string { return []string{TasksNamespace} }

func (c *Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: AgentID, Kind: aip.PrincipalAgent, DisplayName: "Dify"},
		Profiles:        []string{aip.NativeHTTPProfile, Profile},
	}
	for _, id := range c.appOrder {
		a := c.apps[id]
		about := a.Name
		if a.Description != "" {
			about += ": " + a.Description
		}
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
		m.Capabilities = append(m.Capabilities, aip.Capability{
			ID: AppCapability(id, ""), Name: "Run " + a.Name, Kind: kind, InputSchema: invokeSchema(a.Mode), OutputSchema: invokeOutput,
			Description: fmt.Sprintf("Runs the Dify %s app %s (%s) and returns %s. In streaming mode the chunks are forwarded as they arrive; a cancel stops the app's task.",
				a.Mode, id, about, returns),
			Risk: aip.RiskMedium, Stability: aip.StabilityStable,
			Contract: contract([]aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork}, aip.RetryUnsafe, true, true)})
		for _, o := range a.Mode.operations() {
			m.Capabilities = append(m.Capabilities, o.capability(id, a.Name, about, AppCapability(id, o.suffix)))
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
			Risk:        aip.RiskLow, Stability: aip.StabilityStable, Contract: readContract,
		})
		for i := range knowledgeOperations {
			o := &knowledgeOperations[i]
			m.Capabilities = append(m.Capabilities, o.capability(id, d.Name, about, KnowledgeCapability(id, o.suffix)))
		}
	}
	return m, nil
}
