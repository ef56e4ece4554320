// Package hermes is the Hermes Agent adapter: a hostsdk.Connector that
// fronts one or more Hermes Agent API servers ("endpoints") and turns AIP
// actions into calls of their HTTP API, as the Hermes "API Server" page
// describes it (products/internal/spectest/specs/hermes-agent/api-server.md;
// there is no OpenAPI document). The OpenAI-compatible routes follow
// OpenAI's Chat Completions and Responses formats.
//
// # Capabilities
//
// The manifest agent is "hermes-agent" (kind agent). Every endpoint gets
// the same twenty-nine capabilities, cap:hermes_agent:<endpoint
// id>:<operation> with the endpoint ID lowercased (the operation names are
// the reference connector's, its variant names in snake_case):
//
//	health            GET    /health                          read
//	health_detailed   GET    /health/detailed                 read
//	models            GET    /v1/models                       read
//	capabilities      GET    /v1/capabilities                 read
//	skills            GET    /v1/skills                       read
//	toolsets          GET    /v1/toolsets                     read
//	chat              POST   /v1/chat/completions             mutation (the agent may act)
//	responses         POST   /v1/responses                    mutation
//	response_get      GET    /v1/responses/{id}               read
//	response_delete   DELETE /v1/responses/{id}               mutation, risk high (irreversible)
//	run_start         POST   /v1/runs                         mutation
//	run_status        GET    /v1/runs/{run_id}                read
//	run_events        GET    /v1/runs/{run_id}/events         read (SSE)
//	run_stop          POST   /v1/runs/{run_id}/stop           mutation
//	sessions_list     GET    /api/sessions                    read (limit, offset, source, include_children)
//	session_create    POST   /api/sessions                    mutation
//	session_get       GET    /api/sessions/{id}               read
//	session_patch     PATCH  /api/sessions/{id}               mutation (title, end_reason)
//	session_delete    DELETE /api/sessions/{id}               mutation, risk high (irreversible)
//	session_messages  GET    /api/sessions/{id}/messages      read
//	session_fork      POST   /api/sessions/{id}/fork          mutation (title)
//	session_chat      POST   /api/sessions/{id}/chat          mutation (the agent may act);
//	                  POST   /api/sessions/{id}/chat/stream   in streaming mode
//	jobs_list         GET    /api/jobs                        read
//	job_get           GET    /api/jobs/{job_id}               read
//	job_update        PATCH  /api/jobs/{job_id}               mutation (prompt, schedule)
//	job_delete        DELETE /api/jobs/{job_id}               mutation, risk high (irreversible)
//	job_pause         POST   /api/jobs/{job_id}/pause         mutation
//	job_resume        POST   /api/jobs/{job_id}/resume        mutation, risk high (the agent runs again)
//	job_run           POST   /api/jobs/{job_id}/run           mutation, risk high (the agent runs now)
//
// chat sends {model, messages, stream, temperature?, max_tokens?} (1 to 200
// messages of role system, user or assistant with string content of at
// most 65,536 characters: Hermes cuts longer message content to that
// length without a word, MAX_NORMALIZED_TEXT_LENGTH in
// gateway/platforms/api_server.py, and the agent would act on the cut
// text); model
// defaults to the endpoint's default_model, else --hermes-default-model.
// Its output is the assembled assistant message with the completion's id, model, finish_reason and
// usage. In streaming mode (hostsdk.Streamer) it sends "stream": true and
// reads the OpenAI SSE chunks ("data: {chat.completion.chunk}") until
// "data: [DONE]": each content delta becomes a data chunk {"delta": ...},
// each choices[0].delta.reasoning_content a thought chunk, and each
// Hermes "event: hermes.tool.progress" a tool chunk carrying its data; the
// result is the assembled message. A stream that ends before [DONE], or
// carries an error object, is outcome_unknown: the agent ran and may have
// acted. So is a turn that ends with finish_reason "error", in either
// mode: Hermes' answer when the agent failed after writing part of its
// reply (its source, gateway/platforms/api_server.py; the page names no
// finish reasons), which is no completed answer. The stream is opened with provider.Client.Stream (the rules of
// every other call: no redirects, the same headers and key) and bounded
// as a whole by RequestTimeout (900 s) and the action's timeout, without
// an idle bound. Other capabilities in streaming mode run as they do
// synchronously, without chunks.
//
// responses sends {model, input, instructions?, previous_response_id?,
// conversation?, store?} (input is a string; model defaults as for chat;
// conversation and previous_response_id not together: the page's named
// conversation is used instead of a response ID, and Hermes refuses both).
// The input goes to the agent whole (Hermes cuts to 65,536 characters
// only the content parts of an input array, not a string input), hence
// up to 262,144 characters. The output is Hermes' response as answered.
// A non-streaming Responses turn is answered 200 with "status":
// "completed" whatever became of the agent (the handler writes the
// status as a constant; when the agent failed without an answer the
// final message's text is its error, or "(No response generated)"), and
// 500 when the agent raised, which is outcome_unknown: no field of a 200
// tells a failed turn apart, so responses completes with it. Only the
// streaming Responses (response.failed) and stored snapshots
// (response_get: failed, incomplete, in_progress) carry another status.
// run_start sends {input, session_id?, instructions?,
// previous_response_id?, model?} — model only when given, because runs
// always honour it — with an Idempotency-Key header, so Hermes answers a
// repeated start with the original run_id. The header is not the action's
// key as it is but "aip1-" and the hex SHA-256 of [tenant ID, capability
// ID, key] (provider.ScopedIdempotencyKey): Hermes isolates keys per API
// credential only, and the hosts of several tenants may share one server
// and key, so two tenants choosing the same key would otherwise be
// answered each other's run (or a 409 idempotency_key_conflict); the
// capability (endpoint and operation) keeps one key's chat, responses and
// runs apart ("must not reuse them for unrelated operations"). A retry of
// the same action (another action ID with the same key, on any replica or
// instance of the tenant) sends the same value, 69 visible ASCII
// characters within the page's 1–255. The
// run ID is recorded in the host state (namespace
// aip.connector.hermes_agent.runs.v1, key the action ID); the output is
// {run_id, status, replayed?}. A run_id that is not an ID the adapter
// would accept as input (1 to 256 of A-Z a-z 0-9 _ . : -, not starting
// with a dot: never "/", "?", "#", "%", a control character or a dot
// segment), or none, is never put into a path: run_start ends
// outcome_unknown (Hermes accepted the run, which may be running) without
// recording or polling it, and Cancel refuses such a record. With "wait": true run_start polls GET
// /v1/runs/{run_id} until its status is completed, failed or cancelled and
// returns it in "run". A status read that fails transiently (no answer,
// 5xx, 408, 429) is repeated with exponential backoff — the poll interval (2 s)
// doubled per failure in a row up to 30 seconds, or the answer's
// Retry-After when longer, at most 10 minutes (provider.Outage) — so a
// short outage of the API server does not end the wait. When the
// action's timeout passes first, or a status read fails in another way
// (a 4xx, an unreadable answer), or transient failures in a row have
// lasted longer than 5 minutes (provider.DefaultOutageBudget), it returns
// the last status seen (the run goes on; follow it with run_status).
// Cancelling
// a running run_start action (hostsdk.Canceler) stops its run with POST
// /v1/runs/{run_id}/stop, and the action ends outcome_unknown naming the
// run (Hermes stops it at its next safe interruption point, so it may have
// completed or acted first). A run_start whose wait the host's shutdown
// cuts (a drain whose timeout passed) also ends outcome_unknown, but no
// stop is sent: the message says the run goes on and names its run_id, to
// follow with run_status or stop with run_stop. chat and responses send the same scoped key as
// Idempotency-Key too (the page lists it as accepted for deduplication).
//
// The adapter is a hostsdk.Reconciler. A run_start a restart interrupted
// (the replica crashed while it waited, or before it answered) whose run
// was recorded did start that run: it completes with {run_id, status,
// run} from one status read (bounded by ReconcileReadTimeout, 30 s), or
// {run_id, status "started"} when that read fails, so the caller learns
// the run to follow and stop. A run_start interrupted before its run was
// recorded is outcome_unknown, and the message names the action's
// idempotency key: run_start sent again with that key and the same input
// gets the run Hermes started under it (replayed true), or starts it
// once. Any other interrupted mutation is outcome_unknown, and an
// interrupted read fails connector_host.interrupted (retryable).
//
// run_events reads GET /v1/runs/{run_id}/events (SSE) until the stream
// ends or max_events events (1 to 100000, default 4096) were read,
// bounded too by --hermes-max-response-bytes (an event by 1 MiB),
// RequestTimeout and the action's timeout. An event is {"event", "data"}:
// its event: field, or, when it has none, the "event" member of its JSON
// data (the page names the events, not their framing), and its data (JSON,
// or a JSON string). In streaming mode each event is a chunk —
// message.delta and assistant.delta data, reasoning.delta thought, tool.*
// tool, anything else (lifecycle, subagent.start/complete) progress — and
// the output is {run_id, count, max_events_reached?, stream_open?};
// synchronously the output carries the events too. A live run's stream
// stays open until the run ends: when the action's timeout (or
// RequestTimeout) ends the read, the events read are the result, with
// stream_open true. It is a read: any other error, even after some
// events, is a failed result (provider.unavailable, retryable;
// provider.bad_response past the byte bound).
//
// session_chat sends {input, model?} (the page's example body, and the
// per-request model the session-chat endpoints always honour) with the
// scoped Idempotency-Key as chat does. Synchronously it posts to .../chat and
// returns Hermes' answer; in streaming mode it posts to .../chat/stream,
// forwards the events before run.completed as chunks (as run_events does)
// and returns {events, run_completed} (run.completed's data). A stream
// that fails or ends before run.completed is outcome_unknown.
//
// session_patch sends only the given title and end_reason (at least one);
// session_fork sends {"title"?} (the page's example); job_update sends
// only the given prompt and schedule (at least one; Hermes merges them).
// The page gives no body for POST /api/sessions ("create an empty
// session"), for POST /v1/runs/{run_id}/stop, nor for the jobs' pause,
// resume and run: session_create sends {} and the others no body. Reads
// and other mutations return the provider's JSON answer as the output
// ({} for an empty answer; skills and toolsets answer arrays).
//
// Every request carries X-AIP-Correlation-Id (the action ID) and, when the
// endpoint has a key, Authorization: Bearer <key>. CheckHealth (HealthChecker)
// sends GET /v1/models to every endpoint at once: an authenticated read, so
// a key the server no longer accepts fails the endpoint's check (the public
// GET /health would still answer 200). The replica is not ready only when
// every endpoint fails. An endpoint that fails while others pass is named
// in /ready's connector detail (the replica stays ready; the check returns
// hostsdk.Degraded) and logged
// (provider.Targets: at warn when it starts failing, again every 10
// minutes, at info when it passes again), and its actions, streaming ones
// too, fail at once without a request to it, naming the endpoint and its
// check's failure, classified as that failure (provider.unauthorized, not
// retryable, for a refused key; provider.unavailable, retryable, for no
// answer or a 5xx), until a later check passes. A stop (Cancel) and
// Reconcile are still sent to it. An endpoint that does not answer fails
// its own check at three quarters of the probe's time.
//
// # Settings
//
//   - --hermes-endpoints-file (AIP_HERMES_ENDPOINTS_FILE, required): a JSON
//     file (not writable by group or others, at most 4 MiB) holding an array
//     of 1 to 1000 {"id", "base_url", "api_key_file"?, "display_name"?,
//     "default_model"?}; unknown fields and duplicate ids (compared
//     lowercased) are refused.
//     id is 1 to 128 of A-Z a-z 0-9 _ -. base_url is the API server's root
//     (http://127.0.0.1:8642, or a /p/<profile> prefix): https, or http on
//     loopback only. api_key_file is an owner-only file holding the
//     server's API_SERVER_KEY, read at start and followed after
//     (provider.ReadSecret): a key rotated in it is used without a
//     restart, at once when the server answers 401 or 403; a file that
//     cannot be read again keeps the key read before and is logged. default_model is the model of the
//     endpoint's chat and responses when the action names none (a
//     profile served under its own model name), in place of
//     --hermes-default-model. A manifest holds at most
//     hostsdk.MaxCapabilities (512) capabilities and every endpoint has
//     all 29, so one host fronts at most 17 endpoints
//     (MaxEndpointsPerHost); a longer list is refused. Front more servers
//     with more hosts.
//   - --hermes-max-response-bytes (AIP_HERMES_MAX_RESPONSE_BYTES): bound on
//     a JSON answer and on a whole SSE stream (chat, run events, session
//     chat), 1024 to 256 MiB (default 16 MiB). One SSE event is at most
//     1 MiB.
//   - --hermes-default-model (AIP_HERMES_DEFAULT_MODEL): the model of chat
//     and responses when the action names none and the endpoint has no
//     default_model (default "hermes-agent").
//
// # Errors
//
// Provider errors go through provider.Result: a 4xx is a failed result
// (provider.invalid_request, .unauthorized, .forbidden, .not_found,
// .conflict, .rate_limited for Hermes' 429 "Too many concurrent runs"); a
// read that gets a 5xx or no answer is failed and retryable
// (provider.unavailable); a mutation that may have reached Hermes (a 5xx,
// no answer, an unreadable answer) is outcome_unknown, journaled and
// never run again. A 501, which Hermes answers to the job routes where its
// cron module is not available, did nothing: failed
// provider.not_implemented, not retryable.
//
// # Not covered
//
// Operations of the reference connector left out, and why:
//
//   - run_approval (POST /v1/runs/{run_id}/approval): the page says only
//     that "the body carries the approval decision", not its fields; a
//     body would be invented.
//   - job_create (POST /api/jobs): the page says the body "accepts the same
//     shape as hermes cron — prompt, schedule, skills, provider override,
//     delivery target" without the field names of the last two, their
//     types, or which fields are required; a request built from it alone
//     may be refused, and a guessed one would be invented.
//   - responses_stream (streaming Responses): not built yet; responses runs
//     synchronously.
//   - chat_stream is chat's streaming mode, and the session chat stream
//     session_chat's, not capabilities of their own.
//   - operator (governed operator runs, AIP delegation routing) and the
//     reference's per-endpoint tenants: operator-only surfaces.
//
// Also not covered: GET /api/model/options; the browser-extension control
// routes (a WebSocket controller protocol); job_update fields other than
// prompt and schedule (the page's "etc."); image and file content parts;
// the per-request provider and model_options overrides;
// X-Hermes-Session-Id/-Key; the runs' conversation_history (the page
// names it without its shape). Mutations do not require human approval
// in the manifest.
package hermes
