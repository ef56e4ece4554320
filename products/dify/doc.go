// Package dify is the Dify product adapter: a hostsdk.Connector that runs
// Dify apps and reads Dify knowledge bases through Dify's Service API (the
// published document products/internal/spectest/specs/dify/
// openapi_service.json, server path /v1).
//
// # Capabilities
//
// Per app listed in the apps file (agent "agent:dify", profile
// aip.connector.dify.v1):
//
//   - cap:dify:<app_id> runs the app: chat, advanced-chat (chatflow) and
//     agent-chat apps with POST /chat-messages, completion apps with POST
//     /completion-messages, workflow apps with POST /workflows/run. The
//     request always asks for response_mode "streaming" (agent apps
//     support nothing else) and the server-sent events are aggregated:
//     message and agent_message chunks into answer (message_replace
//     replaces it; a New Agent app's closing message is the whole answer),
//     message_end's metadata (usage, retriever resources) and files,
//     text_chunk into text, workflow_finished's status, outputs and
//     figures. Input: inputs (object), query (chat apps, required;
//     completion apps, optional legacy field), conversation_id (chat
//     apps), user (required: Dify's end-user id) and files. A mutation:
//     risk medium, no human approval required.
//
// The other capabilities are declared in one operations table
// (operations.go: suffix, app modes, method, path, query, body and
// multipart fields, input schema, risk, contract) and run by one handler.
// Per app (capability IDs cap:dify:<app_id>:<suffix>), where the
// document's "Available for" lists the app's mode (chat = Chatbot,
// advanced-chat = Chatflow, agent-chat = Agent, completion = Text
// Generator):
//
//   - :parameters: GET /parameters (every mode; read).
//   - :info: GET /info (every mode; read).
//   - :meta: GET /meta (every mode; read).
//   - :site: GET /site (every mode; read; an app without a WebApp answers
//     403, provider.forbidden).
//   - :conversations: GET /conversations (chat modes; user, last_id, limit
//     1..100, sort_by; read).
//   - :conversation.rename: POST /conversations/{conversation_id}/name
//     (chat modes; user, name or auto_generate true; a mutation, risk
//     medium; returns the conversation).
//   - :conversation.delete: DELETE /conversations/{conversation_id} with
//     {"user"} (chat modes; a deletion, risk high; Dify answers 204, the
//     output is {"deleted": true, "conversation_id"}).
//   - :conversation.variables: GET
//     /conversations/{conversation_id}/variables (chat modes; user,
//     last_id, limit, variable_name; read).
//   - :messages: GET /messages (chat modes; conversation_id, user,
//     first_id, limit; read).
//   - :messages.suggested: GET /messages/{message_id}/suggested (chat
//     modes; user; read).
//   - :feedback: POST /messages/{message_id}/feedbacks (chat and
//     completion apps; rating like, dislike or null, content; a mutation,
//     risk low).
//   - :feedbacks: GET /app/feedbacks (chat and completion apps; page,
//     limit up to 101 as the document allows; read).
//   - :workflow.run.get: GET /workflows/run/{workflow_run_id}
//     (advanced-chat and workflow apps; read).
//   - :workflow.logs: GET /workflows/logs (advanced-chat and workflow
//     apps; keyword, status, page, limit, created_at__before/__after,
//     created_by_end_user_session_id, created_by_account; read).
//   - :files.upload: POST /files/upload as multipart/form-data (every
//     mode): the part "file" from filename (no / \ " or control
//     characters), content_base64 (standard base64, 1 byte to
//     MaxUploadBytes, 2.5 MiB, decoded: the base64 must fit with the rest
//     of the action in the 4 MiB a replica reads) and mime_type (default
//     application/octet-stream), and the field user; a mutation (it
//     creates a file), risk medium. The output is Dify's file record:
//     pass its id as upload_file_id (transfer_method local_file) when
//     invoking the app as the same user.
//   - :audio.to_text: POST /audio-to-text as multipart/form-data (every
//     mode): the audio as the part "file" (filename, content_base64 and a
//     mime_type Dify accepts: audio/mp3, m4a, wav, amr or mpga) and the
//     field user; a read (it changes nothing in Dify), returns {"text"}.
//
// Per knowledge base listed in the knowledge file
// (cap:dify:knowledge:<id>:<suffix>):
//
//   - :retrieve: POST /datasets/{id}/retrieve with query (1..250
//     characters) and an optional retrieval_model (search_method and
//     top_k required, score_threshold, reranking_enable; reranking by a
//     model: reranking_enable true needs reranking_model
//     {reranking_provider_name, reranking_model_name}, sent with the
//     reranking_mode "reranking_model" the document requires with it;
//     weighted-score reranking is not offered). A read: it changes
//     nothing, so a failure is never outcome_unknown.
//   - :documents: GET /datasets/{id}/documents (page, limit, keyword,
//     status; read).
//   - :document.get: GET /datasets/{id}/documents/{document_id}
//     (metadata all, only or without; read).
//   - :document.create_by_text: POST /datasets/{id}/document/create-by-text
//     (name, text up to 1,000,000 characters, indexing_technique,
//     doc_form, doc_language, process_rule, embedding_model,
//     embedding_model_provider, original_document_id; a mutation, risk
//     medium, unsafe to repeat as a new action: it creates a document; a
//     400 may come after it did, see below).
//   - :document.update_by_text: POST
//     /datasets/{id}/documents/{document_id}/update-by-text (name, text —
//     text needs name —, process_rule, doc_form, doc_language; a
//     mutation, risk high: the previous text is not kept).
//   - :document.create_by_file: POST
//     /datasets/{id}/document/create-by-file as multipart/form-data: the
//     part "file" (filename, content_base64, mime_type, as files.upload)
//     and the part "data", the JSON of the settings given
//     (indexing_technique, doc_form, doc_language, process_rule,
//     embedding_model, embedding_model_provider); a mutation, risk medium,
//     unsafe to repeat as a new action (a 400 may come after it created
//     the document, see below).
//   - :document.update_by_file: PATCH /datasets/{id}/documents/{document_id}
//     (the document's canonical file update; POST .../update-by-file is
//     deprecated), likewise (doc_form, doc_language, process_rule in
//     "data"); a mutation, risk high: the previous content is not kept.
//   - :document.delete: DELETE /datasets/{id}/documents/{document_id} (a
//     deletion, risk high; 204, output {"deleted": true, "document_id"}).
//   - :segments: GET /datasets/{id}/documents/{document_id}/segments
//     (page, limit, status as repeated query values, keyword; read).
//
// The knowledge pipeline of each knowledge base (the document's tag
// "Knowledge Pipeline"):
//
//   - :pipeline.datasource_plugins: GET
//     /datasets/{id}/pipeline/datasource-plugins (is_published, default
//     true; read). Dify answers a JSON array of the pipeline's datasource
//     nodes (node_id, plugin_id, provider_name, datasource_type, title,
//     user_input_variables, credentials); the output is
//     {"datasource_plugins": [...]}.
//   - :pipeline.datasource_node.run: POST
//     /datasets/{id}/pipeline/datasource/nodes/{node_id}/run with inputs,
//     datasource_type (local_file, online_document, website_crawl,
//     online_drive), credential_id (or null) and is_published, all but
//     credential_id required. It browses the node's external source
//     (online document pages, a drive's files, a website crawl) and
//     changes nothing in Dify: a read (side effects read and
//     external_network, risk low), streamed. Dify answers with events
//     and ends the stream, with no closing event: datasource_processing
//     ({total, completed}, forwarded as progress chunks),
//     datasource_completed ({data, total, completed, time_consuming}, one
//     per result, forwarded as data chunks) or datasource_error ({error}:
//     a failed result, dify.datasource_failed). The output is {results:
//     the data of each datasource_completed, in order; total, completed,
//     time_consuming of the last one that had them}. A stream that breaks
//     off, stays silent or ends with no result is a failed, retryable
//     provider.unavailable result, as a read's 5xx. So is one whose
//     action's timeout_ms passes while the stream only pings (a slow
//     crawl): its message says so, how long the stream had sent only
//     pings and since which event; nothing is stopped (the document has
//     no stop endpoint for it, and it changes nothing in Dify).
//   - :pipeline.run: POST /datasets/{id}/pipeline/run with inputs,
//     datasource_type, datasource_info_list (at most MaxPipelineItems,
//     100, items of the datasource_type's shape: local_file {reference,
//     name?}, online_document {workspace_id, page {page_id, type,
//     page_name?}, credential_id?}, website_crawl {url, title?},
//     online_drive {id, type file or folder, bucket?, name?}),
//     start_node_id and is_published, all required. A mutation (the
//     published pipeline adds one document per item), risk medium, unsafe
//     to repeat as a new action, as document.create_by_text; streamed, not
//     cancellable (the Service API has no stop endpoint for it).
//     response_mode is not an input: the request always asks for
//     "streaming", as app invocations do. A blocking run would hold the
//     connection silent for the whole run (no pings, so a dropped
//     connection could not be told from a long run, and the request
//     timeout would cut a long run into outcome_unknown) and would give
//     no progress. The document lets the 200 be an event stream or a JSON
//     object, and Dify answers a published run with JSON even in streaming
//     mode (the batch and the documents it created; indexing runs
//     afterwards): a JSON object is the output as it is (unless it is
//     the document's blocking form, whose data.status failed or stopped
//     is a failed result, as in a stream); an event stream
//     (a run of the draft) is read as a workflow app's (node_started and
//     node_finished forwarded as progress chunks, text_chunk as data
//     chunks) up to workflow_finished, and the output is {task_id,
//     workflow_run_id, status, outputs, elapsed_time, total_tokens,
//     total_steps}. A workflow_finished with status failed or stopped is
//     a failed result (dify.workflow_failed, dify.workflow_stopped); an
//     error event with a 4xx status as the stream's first event is a
//     failed result; any other error event, a stream that ends, breaks
//     off or stays silent before workflow_finished, a workflow_finished
//     without a status, a 5xx (the document's
//     500 pipeline_run_error among them), a lost connection, and a 2xx
//     that is neither an event stream nor a JSON object are
//     outcome_unknown. A stream that only pings (a node that hangs, a
//     slow crawl) is waited on until the action's timeout_ms, as an app
//     invocation is, and nothing is stopped then: the document has no
//     stop endpoint for a pipeline run (its stop endpoints are the apps',
//     under an app's key). The outcome_unknown message of a stream that
//     did not reach workflow_finished names the run's task_id and
//     workflow_run_id (or says the stream named neither) and what can be
//     read instead: the Service API has no read of a pipeline's runs
//     (Dify's console lists them); a published run's documents and their
//     indexing_status are read with :documents; a draft run adds no
//     documents (its knowledge index node only previews the chunks). At
//     the timeout (or the host's shutdown) the message, and a warning in
//     the log (pinged_for, pings, last_event, dataset_id), also say what
//     ended the action, when, and how long the stream had sent only
//     pings, since its last event or since the request.
//   - :pipeline.file_upload: POST /datasets/pipeline/file-upload as
//     multipart/form-data with the one part "file" (filename,
//     content_base64, mime_type, as files.upload); a mutation (it creates
//     a file), risk medium, unsafe to repeat. The path names no knowledge
//     base: the request carries the key of the knowledge base whose
//     capability it is, as every knowledge base operation does. Dify
//     answers 201 with the file record; pass its id as the reference of a
//     local_file item of :pipeline.run.
//
// Reads declare retry_safety "safe". Table mutations need an idempotency
// key (Dify has none of its own: the host's one-run-per-action-ID is the
// protection), are never retried as new actions, and say "unsafe"
// (creation) or "safe_with_idempotency_key" (an update or deletion of a
// named object); a deletion declares the delete side effect.
//
// # Streaming, cancel and outcomes
//
// An invocation reads the event stream as it arrives (provider.Client's
// Stream and EventReader, with the rules of every other call: no
// redirects; the response bound counts every byte of the stream, and an
// event is at most 1 MiB). The first event carrying a task_id is
// checked to be a UUID (the document's format: anything else is never
// put into a stop path, and the invocation ends outcome_unknown, as the
// app runs; an error event's is dropped and the error classified as
// below) and recorded as {app_id, task_id, user} under the action ID in the host's
// state store (namespace aip.connector.dify.active_tasks.v1) and in
// memory, with the workflow_run_id of a workflow or chatflow app, and a
// chatflow's conversation_id and message_id, as soon as an event names
// them (for Reconcile, below; a chatflow's first event, workflow_started,
// names them all); Cancel (hostsdk.Canceler) reads it and calls the app's stop
// endpoint (POST /chat-messages/{task_id}/stop,
// /completion-messages/{task_id}/stop or /workflows/tasks/{task_id}/stop
// with {"user": ...}). A cancel that arrives before the first event has no
// task to stop. Either way a cancelled invocation ends outcome_unknown,
// never cancelled: the app may have finished, or acted, before the stop.
// HandleStream (hostsdk.Streamer) forwards answer and text deltas as data
// chunks, agent thoughts as thought chunks and node starts and ends as
// progress chunks.
//
// The stream closes on message_end (chat apps other than chatflows,
// completion apps), workflow_finished (workflows, chatflows),
// workflow_paused (the run waits for a human input form: completed with
// status "paused" and the pause data) or error. An error event is
// classified by its status like an HTTP error to a mutation: a 4xx is a
// failed result carrying Dify's code and message (a 400 is
// provider.invalid_request) when it is the stream's first event or the app
// has no tools (chat, completion); a 4xx after an agent, chatflow or
// workflow was at work (a model quota running out between two tool calls),
// a 5xx, or no status, is outcome_unknown (Dify failed mid-run, after the
// app may have acted), except after a chatflow's workflow_finished with
// status failed. A workflow_finished
// with status failed or stopped is a failed result
// (dify.workflow_failed, dify.workflow_stopped). A stream that ends, is
// dropped or stays silent for two minutes (waiting for the answer or for
// its next bytes; Dify pings every 10 seconds) before its closing event,
// or whose workflow_finished does not say how the run ended (its data is
// not an object with a status), is outcome_unknown: the request reached
// Dify and the app ran. Its message names the task and says which
// capability reads what the app did: :workflow.run.get with the
// workflow_run_id, :messages with the conversation_id and user, or, when
// the stream named neither, :conversations as the user (chat modes) or
// :workflow.logs with created_by_end_user_session_id (workflow apps); a
// completion app's are in Dify's console.
//
// Pings keep a stream alive: an app that sends nothing else (a model slow
// to answer, a node that hangs; Dify ends a run itself after its
// APP_MAX_EXECUTION_TIME or WORKFLOW_MAX_EXECUTION_TIME) is waited on
// until the action's timeout_ms, as a long run is. The timeout ends the
// invocation outcome_unknown, and the connector stops the task the
// stream named itself, as a cancel would (the host calls the Canceler
// only for a cancel, and once the action has ended nothing could stop
// the task through the connector), within TimeoutStopLimit (5 s, inside
// the host's default HandleGrace); a stop that fails is named in the
// message with the request that stops the task. A stream that sent only
// pings never named its task: there is nothing to stop, and the app may
// be running. The message and a warning in the log (pinged_for, pings,
// last_event) say how long the stream had sent only pings, since its
// last event or since the request. A cancel (the Canceler stops the
// task) or the host's shutdown (which sends no stop) ends it the same
// way.
//
// HTTP errors follow provider.Result: a 4xx is a failed result with a
// provider.* code (400 invalid_request, 401 unauthorized, 403 forbidden,
// 404 not_found, 429 rate_limited; the pipeline upload's 413
// file_too_large and 415 unsupported_file_type invalid_request); a 5xx or a lost connection is
// outcome_unknown for the invocation and every mutation (a 2xx answer to
// a mutation that is not a JSON object too: applied, result unknown), and
// a failed, retryable provider.unavailable result for the reads. The message of
// Dify's {"status", "code", "message"} error bodies becomes the error's
// message (as for every provider.Client call; the code is not added).
// What Dify says inside an event stream (an error event's code and
// message, a failed run's error, datasource_error's error) goes into the
// error's message the same way: the request's key redacted, clipped.
//
// A document create may answer 400 after it created the document.
// DocumentService.save_document_with_dataset_id (api/services/
// dataset_service.py) commits the new document, then queues its indexing
// with DocumentIndexingTaskProxy(...).delay() (api/services/
// document_indexing_proxy/), which reads the workspace's plan
// (FeatureService.get_features): on Dify Cloud a request to the billing
// service, whose failure raises a ValueError (BillingService._send_request:
// "Unable to retrieve billing information. Please try again later or
// contact support."), which the Service API answers 400 invalid_param
// (handle_value_error). The document then exists, never queued for
// indexing. So after a 400 to :document.create_by_text (without
// original_document_id, which updates that document instead and reads no
// plan after writing it) or :document.create_by_file, the connector
// lists the knowledge base's documents whose name holds the name's first
// 40 characters (GET /datasets/{id}/documents?keyword=&limit=100, newest
// first) and looks for one named as the document (Dify keeps the first
// 200 characters of a longer name) created since 5 minutes before the
// create (allowing for Dify's clock being behind). Found: outcome_unknown,
// naming the documents and their indexing_status. Not found: the 400
// stands as a failed result when the page reaches back to before the
// create (fewer than 100 documents, or an older one); otherwise (the list
// failed, or all 100 are newer) outcome_unknown, saying how to look. The
// refusals the document lists (provider_not_initialize, no_file_uploaded,
// invalid_param for indexing_technique, ...) are raised before the commit
// and end failed after that read.
//
// An input holding the character U+0000 is not refused, unlike in the
// Chatwoot, Twenty and Cal.diy adapters (provider.RefuseNUL), though Dify
// keeps its data in PostgreSQL too: Dify removes the character itself
// from an invocation's query (query.replace("\x00", "") in each app
// generator, api/core/app/apps/*/app_generator.py) and from the app's
// string inputs (BaseAppGenerator._sanitize_value) before storing them,
// and its driver, psycopg2, refuses one that reaches the database
// elsewhere (a user, a conversation name, a feedback's content, a
// document's text) with a ValueError ("A string literal cannot contain
// NUL (0x00) characters.", as in langgenius/dify#27873) before sending
// the statement, which Dify's API answers 400 invalid_param
// (api/libs/external_api.py, handle_value_error): a failed
// provider.invalid_request carrying that message, not the 500 that makes
// a mutation outcome_unknown. The exceptions are the runs: an app
// invocation whose inputs hold the character in a string inside an
// object or array input (a member name or value, an array item, at any
// depth: a JSON object variable's members, a file input) or whose files
// do, and a knowledge pipeline run (:pipeline.run) whose inputs do or
// whose datasource_info_list does (anywhere in an item). _sanitize_value
// (called by the app generators and by the pipeline's, PipelineGenerator,
// through _prepare_user_inputs) cleans only the inputs' own string
// values, and such a string reaches the running app or pipeline, where
// storing it could fail after its nodes or tools acted (a published
// pipeline run whose item's name holds it fails as Dify stores its
// documents, answered 500 pipeline_run_error: outcome_unknown, though
// nothing was written). That run is refused connector_host.input_invalid
// before anything is sent, naming the first such string by its path
// (inputs.customer.notes[2], inputs["my var"].a, files[0].url,
// datasource_info_list[1].page.page_name).
//
// # Settings
//
//   - --dify-base-url / AIP_DIFY_BASE_URL: the Service API base URL, path
//     included (https://api.dify.ai/v1); plain http only to loopback.
//   - --dify-apps-file / AIP_DIFY_APPS_FILE: a JSON array (1..1000) of
//     {id, name, mode, description?, api_key_file}; id is 1..128 of
//     [A-Za-z0-9_-], mode one of chat, advanced-chat, agent-chat,
//     completion, workflow; each app's Service API key is read from its
//     owner-only api_key_file. Unknown fields and duplicate ids are
//     refused.
//   - --dify-knowledge-file / AIP_DIFY_KNOWLEDGE_FILE: a JSON array of
//     {id (the dataset ID), name, description?, api_key_file} with the
//     knowledge API key.
//   - Each api_key_file is read at start and followed after
//     (provider.ReadSecret): a key rotated in its file is used without a
//     restart, at once when Dify answers 401 or 403; a file that cannot
//     be read again keeps the key read before and is logged at warn. The
//     apps and knowledge files themselves are read at start only.
//   - --dify-max-response-bytes / AIP_DIFY_MAX_RESPONSE_BYTES: the bound
//     of every answer and event stream (default 8 MiB, at most 64 MiB).
//
// At least one app or knowledge base is required, and the manifest holds
// at most hostsdk.MaxCapabilities (512) capabilities: 17 per
// advanced-chat app, 15 per chat or agent-chat app, 9 per completion or
// workflow app, 13 per knowledge base. New refuses a configuration over
// the limit, naming its count: a host serves at most 30 advanced-chat, 34
// chat or agent-chat, or 56 completion or workflow apps, or 39 knowledge
// bases (fewer with a mix); split larger fleets over several hosts. The
// files' own bound (1000 entries, the reference's) is therefore never
// reached.
// Every request carries "Authorization: Bearer <key>" of the app or
// knowledge base its capability belongs to. CheckHealth checks every key,
// 16 of each kind at a time: each app's GET /info and each knowledge
// base's GET /datasets?page=1&limit=1. The replica is not ready only when
// every app and knowledge base fails. One that fails while others pass (a
// revoked key) is named in /ready's connector detail (the replica stays
// ready; the check returns hostsdk.Degraded) and logged (provider.Targets: at warn when it starts
// failing, again every 10 minutes, at info when it passes again), and its
// actions fail at once without a request to Dify, naming the app or
// knowledge base and its check's failure, classified as that failure
// (provider.unauthorized, not retryable, for a refused key;
// provider.unavailable, retryable, for no answer or a 5xx), until a later
// check passes. A stop (Cancel) and Reconcile are still sent.
//
// # Not covered
//
// The legacy shared key (AIP_DIFY_API_KEY_FILE) is left out. Binary
// answers (file preview, text-to-audio, document download and ZIP
// download) are left out too. A pipeline run's local_file item takes
// reference, the document's required field, not the alias related_id
// its description mentions. Also not covered:
// conversation variable update (PUT .../variables/{variable_id}), runs of
// a workflow by ID and the workflow event stream, end-user lookup, human
// input forms, annotations and annotation reply, document indexing status
// and batch status changes, chunk and child-chunk writes and single-chunk
// reads, document metadata, tags, models, and dataset management
// (create, update, delete a knowledge base: the knowledge file names the
// knowledge bases this host serves). The document's retrieval_model on
// create-by-text and update-by-text (it sets the knowledge base's search
// settings) is not offered; retrieve takes its own. Dify's Service API
// has no idempotency key: the host's one-run-per-action-ID guarantee is
// the only protection against a second run, so invocations declare
// retry_safety "unsafe". Blocking mode is never used (apps, pipeline
// runs). The workflow event stream (GET /workflow/{workflow_run_id}/events)
// is not read to follow a run after a restart; Reconcile reads the run
// once instead.
//
// # Restarts
//
// The adapter is a hostsdk.Reconciler; it never sends an interrupted
// invocation again. A workflow app's invocation a restart interrupted,
// whose workflow_run_id was recorded, is settled by one read of the run
// (GET /workflows/run/{workflow_run_id}; the reads are bounded together
// by ReconcileReadTimeout, 30 s): succeeded or partial-succeeded, it
// completes with {mode, task_id, workflow_run_id, status, outputs,
// elapsed_time, total_tokens, total_steps} (the text chunks streamed
// before the restart are not kept); failed or stopped, it fails
// dify.workflow_failed (with the run's error) or dify.workflow_stopped, as
// a stream's workflow_finished would. Still running or paused, or
// unreadable, it is outcome_unknown naming the run and the
// :workflow.run.get capability that reads it.
//
// A chatflow (advanced-chat) app's invocation whose workflow_run_id,
// conversation_id and message_id were recorded is settled the same way
// from its run (the document's Get Workflow Run Detail is available for
// chatflows), and when the run succeeded its answer is read from its
// message: GET /messages?conversation_id=&user=&limit=100 as the
// invocation's user, then older pages with first_id (the oldest message
// of the page), at most 10 pages (the newest 1000 messages: the
// conversation may have gone on after the crash). It completes with the
// output a stream gives, less what only the stream carried: mode,
// task_id, answer (the message's), conversation_id, message_id, files
// (the message's files that do not belong to the user), workflow_run_id,
// status, outputs and the run's figures; not metadata (usage, retriever
// resources) or text chunks. A message not found, a message with status
// error, or a conversation that cannot be read, after a succeeded run, is
// outcome_unknown naming the run, the message, the conversation and the
// :messages capability that reads it.
//
// The invocation of a chat, agent or completion app is outcome_unknown:
// the document offers nothing that says such a message is finished (a
// message being generated reads status "normal" with the answer so far,
// and these apps have no run to read), so its answer cannot be proven
// whole. So are an invocation whose run (or, for a chatflow, its
// conversation and message) was never named, one whose record holds an ID
// that is not a UUID, and every other mutation a restart interrupted; an
// interrupted read fails connector_host.interrupted (retryable).
package dify
