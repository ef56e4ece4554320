package dify

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// operation is one Service API call behind a capability, other than an
// app invocation (streamed, cancellable) and a knowledge retrieval (its
// body is reshaped): the operations table below declares them, and one
// handler (call) runs them all.
type operation struct {
	suffix string
	// name follows the app's or knowledge base's name in the
	// capability's name.
	name string
	// modes are the app modes whose apps have the operation (the
	// document's "Available for"); nil for a knowledge base operation.
	modes []Mode
	// method and path are the document's; {field} in path is the
	// input's string field (path-escaped), {dataset_id} the knowledge
	// base's ID.
	method, path string
	// query are the input fields sent as query parameters, body those
	// sent as members of the JSON body.
	query, body []string
	// emptyBody sends {} when no body field is given (the document
	// requires a body).
	emptyBody bool
	// upload sends a multipart/form-data body instead: the part "file"
	// made of the input's filename, content_base64 and mime_type, a plain
	// part for each of form, and the part "data" holding the JSON object
	// of the data fields given (none when no data field is given).
	upload bool
	form   []string
	data   []string
	// createsDocument names the input field holding the name of the
	// document the operation creates (the text's name, or the file's
	// name of an upload): a 400 may come after the document was created
	// (refused.go).
	createsDocument string
	// mutation: the call may change Dify's state (provider.Result with
	// mutation=true, a 5xx or lost connection is outcome_unknown).
	mutation bool
	// deletes: the operation deletes what its path names; the document's
	// answer is 204 without a body (older Dify versions answered
	// {"result": "success"}), and the output is {"deleted": true} with the
	// path's input fields.
	deletes bool
	// fixed are JSON body members always sent (the pipeline run's
	// response_mode).
	fixed map[string]string
	// runList, when set, names the body's list member whose items reach
	// the run the operation starts as they are (the pipeline run's
	// datasource_info_list), with the body's inputs: refuseNestedNUL
	// checks both before sending, as for an app invocation.
	runList string
	// array names the output member holding the answer when the
	// document's answer is a JSON array (the output is an object).
	array string
	// stream says how the answer is read: as one JSON document, or as
	// the events of a datasource node run or of a pipeline run
	// (pipeline.go).
	stream   streamKind
	schema   json.RawMessage
	output   json.RawMessage
	risk     aip.Risk
	contract *aip.CapabilityContract
	// describe is the description; %[1]s is the app or knowledge base
	// ID, %[2]s its name and description.
	describe string
}

// Capability ID suffixes of an app's operations.
const (
	SuffixParameters            = "parameters"
	SuffixInfo                  = "info"
	SuffixMeta                  = "meta"
	SuffixSite                  = "site"
	SuffixConversations         = "conversations"
	SuffixConversationRename    = "conversation.rename"
	SuffixConversationDelete    = "conversation.delete"
	SuffixConversationVariables = "conversation.variables"
	SuffixMessages              = "messages"
	SuffixSuggested             = "messages.suggested"
	SuffixFeedback              = "feedback"
	SuffixFeedbacks             = "feedbacks"
	SuffixWorkflowRun           = "workflow.run.get"
	SuffixWorkflowLogs          = "workflow.logs"
	SuffixFileUpload            = "files.upload"
	SuffixAudioToText           = "audio.to_text"
)

// MaxUploadBytes bounds a file uploaded by files.upload: its base64 form
// must fit, with the rest of the action, in the 4 MiB a replica reads.
const MaxUploadBytes = 5 << 19 // 2.5 MiB

// uploadFileFields are the input fields of files.upload that make the
// multipart "file" part.
var uploadFileFields = []string{"filename", "content_base64", "mime_type"}

// Capability ID suffixes of a knowledge base's operations.
const (
	SuffixRetrieve             = "retrieve"
	SuffixDocuments            = "documents"
	SuffixDocument             = "document.get"
	SuffixDocumentCreate       = "document.create_by_text"
	SuffixDocumentUpdate       = "document.update_by_text"
	SuffixDocumentCreateByFile = "document.create_by_file"
	SuffixDocumentUpdateByFile = "document.update_by_file"
	SuffixDocumentDelete       = "document.delete"
	SuffixSegments             = "segments"
	// The knowledge pipeline's.
	SuffixPipelineDatasourcePlugins = "pipeline.datasource_plugins"
	SuffixPipelineDatasourceRun     = "pipeline.datasource_node.run"
	SuffixPipelineRun               = "pipeline.run"
	SuffixPipelineFileUpload        = "pipeline.file_upload"
)

var (
	allModes       = []Mode{ModeChat, ModeAdvancedChat, ModeAgentChat, ModeCompletion, ModeWorkflow}
	chatModes      = []Mode{ModeChat, ModeAdvancedChat, ModeAgentChat}
	messageModes   = []Mode{ModeChat, ModeAdvancedChat, ModeAgentChat, ModeCompletion}
	workflowModes  = []Mode{ModeAdvancedChat, ModeWorkflow}
	readContract   = contract([]aip.SideEffect{aip.EffectRead}, aip.RetrySafe, false, false)
	writeContract  = mutationContract(aip.EffectWrite, aip.RetrySafeWithIdempotencyKey)
	createContract = mutationContract(aip.EffectWrite, aip.RetryUnsafe)
	deleteContract = mutationContract(aip.EffectDelete, aip.RetrySafeWithIdempotencyKey)
	// A datasource node run reads the external source (Notion, a drive,
	// a crawler) through Dify and changes nothing in Dify; its events are
	// streamed.
	datasourceRunContract = contract([]aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}, aip.RetrySafe, true, false)
	// A pipeline run creates documents (a creation, as create_by_text)
	// and streams its events; Dify has no stop endpoint for it.
	pipelineRunContract = streamed(mutationContract(aip.EffectWrite, aip.RetryUnsafe))
)

// streamed is contract c for an operation whose events are forwarded in
// streaming mode.
func streamed(c *aip.CapabilityContract) *aip.CapabilityContract {
	c.Execution.SupportsStreaming = true
	c.Execution.ExpectedCompletion = aip.CompletionAny
	return c
}

// mutationContract is the contract of a table mutation: it needs an
// idempotency key (the host runs one action ID once; Dify has no key of
// its own) and is never retried as a new action. A creation is unsafe to
// repeat; an update or delete of a named object may be repeated under the
// same key.
func mutationContract(effect aip.SideEffect, safety aip.RetrySafety) *aip.CapabilityContract {
	c := contract([]aip.SideEffect{effect, aip.EffectExternalNetwork}, safety, false, false)
	c.Idempotency.Requirement = aip.IdempotencyRequired
	c.Execution.SupportsRetry = false
	return c
}

// appOperations are the app-scoped operations, in manifest order.
var appOperations = []operation{
	{suffix: SuffixParameters, name: "parameters", modes: allModes, method: http.MethodGet, path: "/parameters",
		schema: emptySchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads the input form, file upload settings and features of the Dify app %[1]s (%[2]s)."},
	{suffix: SuffixInfo, name: "info", modes: allModes, method: http.MethodGet, path: "/info",
		schema: emptySchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads the name, description, tags, mode and author of the Dify app %[1]s (%[2]s)."},
	{suffix: SuffixMeta, name: "meta", modes: allModes, method: http.MethodGet, path: "/meta",
		schema: emptySchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads the icons of the tools the Dify app %[1]s (%[2]s) uses, keyed by tool name."},
	{suffix: SuffixSite, name: "site", modes: allModes, method: http.MethodGet, path: "/site",
		schema: emptySchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads the WebApp settings (title, icon, theme, language) of the Dify app %[1]s (%[2]s); an app without a WebApp answers forbidden."},
	{suffix: SuffixConversations, name: "conversations", modes: chatModes, method: http.MethodGet, path: "/conversations",
		query: []string{"user", "last_id", "limit", "sort_by"}, schema: conversationsSchema, output: objectOutput,
		risk: aip.RiskLow, contract: readContract,
		describe: "Lists one end user's conversations with the Dify app %[1]s, newest first, paged by last_id."},
	{suffix: SuffixConversationRename, name: "rename a conversation", modes: chatModes, method: http.MethodPost,
		path: "/conversations/{conversation_id}/name", body: []string{"name", "auto_generate", "user"},
		schema: renameSchema, output: objectOutput, risk: aip.RiskMedium, contract: writeContract, mutation: true,
		describe: "Renames one end user's conversation with the Dify app %[1]s, or has Dify name it from its messages (auto_generate); returns the conversation."},
	{suffix: SuffixConversationDelete, name: "delete a conversation", modes: chatModes, method: http.MethodDelete,
		path: "/conversations/{conversation_id}", body: []string{"user"}, emptyBody: true, deletes: true,
		schema: conversationDeleteSchema, output: deletedOutput, risk: aip.RiskHigh, contract: deleteContract, mutation: true,
		describe: "Deletes one end user's conversation with the Dify app %[1]s, with its messages. Irreversible."},
	{suffix: SuffixConversationVariables, name: "conversation variables", modes: chatModes, method: http.MethodGet,
		path: "/conversations/{conversation_id}/variables", query: []string{"user", "last_id", "limit", "variable_name"},
		schema: variablesSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Lists the variables stored in one conversation with the Dify app %[1]s, paged by last_id."},
	{suffix: SuffixMessages, name: "messages", modes: chatModes, method: http.MethodGet, path: "/messages",
		query: []string{"conversation_id", "user", "first_id", "limit"}, schema: messagesSchema, output: objectOutput,
		risk: aip.RiskLow, contract: readContract,
		describe: "Lists the messages of one conversation with the Dify app %[1]s, paged backwards by first_id."},
	{suffix: SuffixSuggested, name: "suggested questions", modes: chatModes, method: http.MethodGet,
		path: "/messages/{message_id}/suggested", query: []string{"user"},
		schema: suggestedSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads the follow-up questions the Dify app %[1]s suggests after one of its messages (the app must have the feature on)."},
	{suffix: SuffixFeedback, name: "feedback", modes: messageModes, method: http.MethodPost,
		path: "/messages/{message_id}/feedbacks", body: []string{"user", "rating", "content"},
		schema: feedbackSchema, output: objectOutput, risk: aip.RiskLow, contract: writeContract, mutation: true,
		describe: "Rates a message of the Dify app %[1]s (like, dislike, or null to withdraw) as the end user, with an optional comment."},
	{suffix: SuffixFeedbacks, name: "feedback list", modes: messageModes, method: http.MethodGet, path: "/app/feedbacks",
		query: []string{"page", "limit"}, schema: feedbacksSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Lists the feedback (end users' and admins') on the messages of the Dify app %[1]s, newest first, by page."},
	{suffix: SuffixWorkflowRun, name: "workflow run", modes: workflowModes, method: http.MethodGet,
		path: "/workflows/run/{workflow_run_id}", schema: workflowRunSchema, output: objectOutput,
		risk: aip.RiskLow, contract: readContract,
		describe: "Reads one workflow run of the Dify app %[1]s: status, inputs, outputs, error, steps, tokens and timing."},
	{suffix: SuffixWorkflowLogs, name: "workflow logs", modes: workflowModes, method: http.MethodGet, path: "/workflows/logs",
		query: []string{"keyword", "status", "page", "limit", "created_at__before", "created_at__after",
			"created_by_end_user_session_id", "created_by_account"},
		schema: workflowLogsSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Lists past workflow runs of the Dify app %[1]s (one summary per run), newest first, with optional filters."},
	{suffix: SuffixFileUpload, name: "upload a file", modes: allModes, method: http.MethodPost, path: "/files/upload",
		upload: true, form: []string{"user"}, schema: uploadSchema, output: objectOutput, risk: aip.RiskMedium,
		contract: createContract, mutation: true,
		describe: "Uploads one file (at most 2.5 MiB, given in base64) to the Dify app %[1]s for the end user and returns its id: pass it as a files entry with transfer_method local_file and upload_file_id when invoking the app as the same user (only that user can reference it). Which file types the app consumes is in its parameters' file upload settings."},
	{suffix: SuffixAudioToText, name: "transcribe audio", modes: allModes, method: http.MethodPost, path: "/audio-to-text",
		upload: true, form: []string{"user"}, schema: audioSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Transcribes an audio file (mp3, m4a, wav, amr or mpga; at most 2.5 MiB, given in base64) to text with the speech-to-text model of the Dify app %[1]s; returns {\"text\"}."},
}

// knowledgeOperations are the knowledge base operations besides
// retrieval, in manifest order.
var knowledgeOperations = []operation{
	{suffix: SuffixDocuments, name: "documents", method: http.MethodGet, path: "/datasets/{dataset_id}/documents",
		query: []string{"page", "limit", "keyword", "status"}, schema: documentsSchema, output: objectOutput,
		risk: aip.RiskLow, contract: readContract,
		describe: "Lists the documents of the Dify knowledge base %[1]s (%[2]s), by page, optionally filtered by name and status."},
	{suffix: SuffixDocument, name: "document", method: http.MethodGet, path: "/datasets/{dataset_id}/documents/{document_id}",
		query: []string{"metadata"}, schema: documentSchema, output: objectOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Reads one document of the Dify knowledge base %[1]s (%[2]s): indexing status, chunking, counts and metadata."},
	{suffix: SuffixDocumentCreate, name: "create a document from text", method: http.MethodPost,
		path: "/datasets/{dataset_id}/document/create-by-text",
		body: []string{"name", "text", "indexing_technique", "doc_form", "doc_language", "process_rule",
			"embedding_model", "embedding_model_provider", "original_document_id"},
		createsDocument: "name",
		schema:          documentCreateSchema, output: objectOutput, risk: aip.RiskMedium, contract: createContract, mutation: true,
		describe: "Adds a document made of the given text to the Dify knowledge base %[1]s (%[2]s); indexing runs afterwards (see the document's indexing_status). Returns the document and its batch. A 400 may come after the document was created; it is then outcome_unknown, naming the document or saying how to look for it."},
	{suffix: SuffixDocumentUpdate, name: "update a document's text", method: http.MethodPost,
		path:   "/datasets/{dataset_id}/documents/{document_id}/update-by-text",
		body:   []string{"name", "text", "process_rule", "doc_form", "doc_language"},
		schema: documentUpdateSchema, output: objectOutput, risk: aip.RiskHigh, contract: writeContract, mutation: true,
		describe: "Replaces the text, name or chunking of a document of the Dify knowledge base %[1]s (%[2]s) and re-indexes it; the previous text is not kept."},
	{suffix: SuffixDocumentCreateByFile, name: "create a document from a file", method: http.MethodPost,
		path: "/datasets/{dataset_id}/document/create-by-file", upload: true,
		data:            []string{"indexing_technique", "doc_form", "doc_language", "process_rule", "embedding_model", "embedding_model_provider"},
		createsDocument: "filename",
		schema:          documentCreateByFileSchema, output: objectOutput, risk: aip.RiskMedium, contract: createContract, mutation: true,
		describe: "Adds a document made from an uploaded file (PDF, TXT, DOCX and other common formats; at most 2.5 MiB, given in base64) to the Dify knowledge base %[1]s (%[2]s); indexing runs afterwards (see the document's indexing_status). Returns the document and its batch. A 400 may come after the document was created; it is then outcome_unknown, naming the document or saying how to look for it."},
	{suffix: SuffixDocumentUpdateByFile, name: "replace a document's file", method: http.MethodPatch,
		path: "/datasets/{dataset_id}/documents/{document_id}", upload: true,
		data:   []string{"doc_form", "doc_language", "process_rule"},
		schema: documentUpdateByFileSchema, output: objectOutput, risk: aip.RiskHigh, contract: writeContract, mutation: true,
		describe: "Replaces the file (at most 2.5 MiB, given in base64) and optionally the chunking of a document of the Dify knowledge base %[1]s (%[2]s) and re-indexes it; the previous content is not kept."},
	{suffix: SuffixDocumentDelete, name: "delete a document", method: http.MethodDelete,
		path: "/datasets/{dataset_id}/documents/{document_id}", deletes: true,
		schema: documentIDSchema, output: deletedOutput, risk: aip.RiskHigh, contract: deleteContract, mutation: true,
		describe: "Deletes a document and all its chunks from the Dify knowledge base %[1]s (%[2]s). Irreversible."},
	{suffix: SuffixSegments, name: "chunks", method: http.MethodGet,
		path:  "/datasets/{dataset_id}/documents/{document_id}/segments",
		query: []string{"page", "limit", "status", "keyword"}, schema: segmentsSchema, output: objectOutput,
		risk: aip.RiskLow, contract: readContract,
		describe: "Lists the chunks of one document of the Dify knowledge base %[1]s (%[2]s), by page, optionally filtered by indexing status and keyword."},
	{suffix: SuffixPipelineDatasourcePlugins, name: "pipeline datasource nodes", method: http.MethodGet,
		path: "/datasets/{dataset_id}/pipeline/datasource-plugins", query: []string{"is_published"}, array: "datasource_plugins",
		schema: datasourcePluginsSchema, output: datasourcePluginsOutput, risk: aip.RiskLow, contract: readContract,
		describe: "Lists the datasource nodes of the knowledge pipeline of the Dify knowledge base %[1]s (%[2]s), from the published pipeline or (is_published false) the draft: each node's node_id, plugin, datasource_type, the input variables it needs and the credentials it can use. Returns {\"datasource_plugins\": [...]}."},
	{suffix: SuffixPipelineDatasourceRun, name: "run a pipeline datasource node", method: http.MethodPost,
		path: "/datasets/{dataset_id}/pipeline/datasource/nodes/{node_id}/run",
		body: []string{"inputs", "datasource_type", "credential_id", "is_published"}, stream: datasourceStream,
		schema: datasourceRunSchema, output: datasourceRunOutput, risk: aip.RiskLow, contract: datasourceRunContract,
		describe: "Runs one datasource node of the knowledge pipeline of the Dify knowledge base %[1]s (%[2]s): browses its external source (online document pages, an online drive's files, a website crawl) and returns what it found, to pick the items of a pipeline run. Creates nothing in Dify (a crawl uses the crawl provider's quota). In streaming mode its progress and results are forwarded as they arrive."},
	{suffix: SuffixPipelineRun, name: "run the knowledge pipeline", method: http.MethodPost,
		path:  "/datasets/{dataset_id}/pipeline/run",
		body:  []string{"inputs", "datasource_type", "datasource_info_list", "start_node_id", "is_published"},
		fixed: map[string]string{"response_mode": "streaming"}, stream: pipelineStream, runList: "datasource_info_list",
		schema: pipelineRunSchema, output: objectOutput, risk: aip.RiskMedium, contract: pipelineRunContract, mutation: true,
		describe: "Runs the knowledge pipeline of the Dify knowledge base %[1]s (%[2]s) from its datasource node start_node_id over the given items (files uploaded with pipeline.file_upload, online document pages, crawled pages or drive files). The published pipeline (is_published true) adds one document per item and indexes them afterwards: Dify answers with the batch and the documents. The draft pipeline runs as a test run: its node progress is forwarded in streaming mode and its status and outputs returned."},
	{suffix: SuffixPipelineFileUpload, name: "upload a pipeline file", method: http.MethodPost,
		path: "/datasets/pipeline/file-upload", upload: true,
		schema: pipelineUploadSchema, output: objectOutput, risk: aip.RiskMedium, contract: createContract, mutation: true,
		describe: "Uploads one file (at most 2.5 MiB, given in base64) for the knowledge pipeline of the Dify knowledge base %[1]s (%[2]s) and returns Dify's file record: pass its id as the reference of a local_file item of pipeline.run."},
}

// operations returns the table operations an app of mode m has.
func (m Mode) operations() []*operation {
	var out []*operation
	for i := range appOperations {
		if slices.Contains(appOperations[i].modes, m) {
			out = append(out, &appOperations[i])
		}
	}
	return out
}

// capabilities is the number of capabilities an app of mode m has: its
// invocation and its table operations.
func (m Mode) capabilities() int { return 1 + len(m.operations()) }

// knowledgeCapabilities is the number of capabilities of a knowledge
// base: retrieval and the table operations.
var knowledgeCapabilities = 1 + len(knowledgeOperations)

func (o *operation) capability(id, name, about string, capID string) aip.Capability {
	return aip.Capability{
		ID: capID, Name: name + ": " + o.name, Kind: aip.KindTool,
		InputSchema: o.schema, OutputSchema: o.output,
		Description: fmt.Sprintf(o.describe, id, about),
		Risk:        o.risk, Stability: aip.StabilityStable, Contract: o.contract,
	}
}

var pathField = regexp.MustCompile(`\{([a-z_]+)\}`)

// call runs a table operation with the client of its app or knowledge
// base. The host has validated the input against the operation's schema;
// call still refuses a field the operation does not send.
func (c *Connector) call(ctx context.Context, call *hostsdk.Call, o *operation, cl *provider.Client, datasetID string, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	var in map[string]json.RawMessage
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	pathVals := map[string]string{}
	var bad error
	path := pathField.ReplaceAllStringFunc(o.path, func(m string) string {
		name := m[1 : len(m)-1]
		if name == "dataset_id" && datasetID != "" {
			return escape(datasetID)
		}
		var s string
		if err := json.Unmarshal(in[name], &s); err != nil || s == "" {
			bad = fmt.Errorf("%s must be a non-empty string", name)
		}
		pathVals[name] = s
		return escape(s)
	})
	if bad != nil {
		return nil, inputError(call, bad.Error())
	}
	for k := range in {
		if _, ok := pathVals[k]; !ok && !slices.Contains(o.query, k) && !slices.Contains(o.body, k) &&
			!slices.Contains(o.form, k) && !slices.Contains(o.data, k) && !(o.upload && slices.Contains(uploadFileFields, k)) {
			return nil, inputError(call, fmt.Sprintf("unknown field %q", k))
		}
	}
	if o.runList != "" {
		// The host validated the shapes (inputs an object, the list an
		// array); one that does not decode is left to Dify.
		var inputs map[string]json.RawMessage
		var list []json.RawMessage
		_ = json.Unmarshal(in["inputs"], &inputs)
		_ = json.Unmarshal(in[o.runList], &list)
		if err := refuseNestedNUL(call, "pipeline", inputs, o.runList, list); err != nil {
			return nil, err
		}
	}
	req := provider.Request{Method: o.method, Path: path}
	if o.upload {
		body, ctype, err := uploadBody(in, o.form, o.data)
		if err != nil {
			return nil, inputError(call, err.Error())
		}
		req.Body, req.ContentType = body, ctype
	}
	for _, k := range o.query {
		raw, ok := in[k]
		if !ok {
			continue
		}
		vals, err := queryValues(raw)
		if err != nil {
			return nil, inputError(call, k+": "+err.Error())
		}
		if req.Query == nil {
			req.Query = url.Values{}
		}
		req.Query[k] = vals
	}
	if len(o.body) > 0 {
		body := map[string]json.RawMessage{}
		for _, k := range o.body {
			if raw, ok := in[k]; ok {
				body[k] = raw
			}
		}
		for k, v := range o.fixed {
			body[k], _ = json.Marshal(v)
		}
		if len(body) > 0 || o.emptyBody {
			req.JSON = body
		}
	}
	switch o.stream {
	case datasourceStream:
		return c.runDatasource(ctx, call, cl, req, chunks)
	case pipelineStream:
		return c.runPipeline(ctx, call, cl, req, datasetID, string(in["is_published"]) == "true", chunks)
	}
	sent := time.Now()
	resp, err := cl.Do(ctx, req)
	if err != nil {
		// create-by-text with original_document_id updates that document
		// (update_document_with_dataset_id): its refusals come before it
		// writes the document, and after that it only queues a Celery task
		// (document_indexing_update_task.delay), reading no plan.
		if _, update := in["original_document_id"]; o.createsDocument != "" && !update {
			var name string
			json.Unmarshal(in[o.createsDocument], &name)
			err = c.documentRefusal(ctx, cl, datasetID, name, o.createsDocument == "filename", sent, err)
		}
		return provider.Result(call, err, o.mutation)
	}
	if o.deletes {
		// A 2xx is the deletion: 204 now, {"result": "success"} from
		// older Dify versions.
		out := map[string]any{"deleted": true}
		for k, v := range pathVals {
			out[k] = v
		}
		return call.Complete(out)
	}
	if o.array != "" {
		return completeArray(call, req, resp, o.array, o.mutation)
	}
	return completeJSON(call, req, resp, o.mutation)
}

// uploadBody builds the multipart/form-data body of an upload: the part
// "file" with the input's filename, its content (content_base64, decoded)
// and its Content-Type (mime_type, default application/octet-stream), then
// each of form given as a plain part, then the part "data": the JSON
// object of the data fields given (none when none is).
func uploadBody(in map[string]json.RawMessage, form, dataFields []string) ([]byte, string, error) {
	var filename, content, mimeType string
	for _, f := range []struct {
		name     string
		dst      *string
		required bool
	}{{"filename", &filename, true}, {"content_base64", &content, true}, {"mime_type", &mimeType, false}} {
		raw, ok := in[f.name]
		if !ok {
			if f.required {
				return nil, "", fmt.Errorf("%s is required", f.name)
			}
			continue
		}
		if err := json.Unmarshal(raw, f.dst); err != nil || *f.dst == "" {
			return nil, "", fmt.Errorf("%s must be a non-empty string", f.name)
		}
	}
	if strings.ContainsAny(filename, `/\"`) || strings.IndexFunc(filename, unicode.IsControl) >= 0 {
		return nil, "", fmt.Errorf("filename %q must not contain / \\ \" or control characters", filename)
	}
	data, err := base64.StdEncoding.DecodeString(content)
	if err != nil {
		return nil, "", fmt.Errorf("content_base64 is not standard base64 with padding: %v", err)
	}
	if len(data) == 0 || len(data) > MaxUploadBytes {
		return nil, "", fmt.Errorf("content_base64 decodes to %d bytes; a file must be 1 to %d bytes (2.5 MiB)", len(data), MaxUploadBytes)
	}
	if mimeType == "" {
		mimeType = "application/octet-stream"
	}
	if mt, _, err := mime.ParseMediaType(mimeType); err != nil || !strings.Contains(mt, "/") {
		return nil, "", fmt.Errorf("mime_type %q is not a media type such as image/png", mimeType)
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", mime.FormatMediaType("form-data", map[string]string{"name": "file", "filename": filename}))
	h.Set("Content-Type", mimeType)
	part, err := mw.CreatePart(h)
	if err != nil {
		return nil, "", err
	}
	part.Write(data)
	for _, k := range form {
		raw, ok := in[k]
		if !ok {
			continue
		}
		var v string
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, "", fmt.Errorf("%s must be a string", k)
		}
		if err := mw.WriteField(k, v); err != nil {
			return nil, "", err
		}
	}
	settings := map[string]json.RawMessage{}
	for _, k := range dataFields {
		if raw, ok := in[k]; ok {
			settings[k] = raw
		}
	}
	if len(settings) > 0 {
		b, err := json.Marshal(settings)
		if err != nil {
			return nil, "", err
		}
		if err := mw.WriteField("data", string(b)); err != nil {
			return nil, "", err
		}
	}
	if err := mw.Close(); err != nil {
		return nil, "", err
	}
	return buf.Bytes(), mw.FormDataContentType(), nil
}

// queryValues turns a JSON string, number, boolean or array of strings
// into query parameter values.
func queryValues(raw json.RawMessage) ([]string, error) {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, err
	}
	switch v := v.(type) {
	case string:
		return []string{v}, nil
	case float64:
		return []string{strconv.FormatFloat(v, 'f', -1, 64)}, nil
	case bool:
		return []string{strconv.FormatBool(v)}, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("want an array of strings")
			}
			out = append(out, s)
		}
		return out, nil
	}
	return nil, fmt.Errorf("want a string, number, boolean or array of strings")
}

func inputError(call *hostsdk.Call, msg string) error {
	return aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
		"input of "+call.Action.CapabilityID+": "+msg)
}
