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
// the same thirteen capabilities, cap:hermes_agent:<endpoint id>:<operation>
// with the endpoint ID lowercased:
//
//	health           GET    /health                    read
//	models           GET    /v1/models                 read
//	chat             POST   /v1/chat/completions       mutation (the agent may act)
//	responses        POST   /v1/responses              mutation
//	response_get     GET    /v1/responses/{id}         read
//	response_delete  DELETE /v1/responses/{id}         mutation
//	run_start        POST   /v1/runs                   mutation
//	run_status       GET    /v1/runs/{run_id}          read
//	run_stop         POST   /v1/runs/{run_id}/stop     mutation
//	sessions_list    GET    /api/sessions              read (limit, offset, source, include_children)
//	session_create   POST   /api/sessions              mutation
//	session_get      GET    /api/sessions/{id}         read
//	session_delete   DELETE /api/sessions/{id}         mutation
//
// chat sends {model, messages, stream, temperature?, max_tokens?} (1 to 200
// messages of role system, user or assistant with string content); model
// defaults to --hermes-default-model. Its output is the assembled
// assistant message with the completion's id, model, finish_reason and
// usage. In streaming mode (hostsdk.Streamer) it sends "stream": true and
// reads the OpenAI SSE chunks ("data: {chat.completion.chunk}") until
// "data: [DONE]": each content delta becomes a data chunk {"delta": ...},
// each choices[0].delta.reasoning_content a thought chunk, and each
// Hermes "event: hermes.tool.progress" a tool chunk carrying its data; the
// result is the assembled message. A stream that ends before [DONE], or
// carries an error object, is outcome_unknown: the agent ran and may have
// acted. The stream is opened with provider.Client.Stream (the rules of
// every other call: no redirects, the same headers and key) and bounded
// as a whole by RequestTimeout (900 s) and the action's timeout, without
// an idle bound. Other capabilities in streaming mode run as they do
// synchronously, without chunks.
//
// responses sends {model, input, instructions?, previous_response_id?,
// conversation?, store?} (input is a string; model defaults as for chat).
// run_start sends {input, session_id?, instructions?,
// previous_response_id?, model?} — model only when given, because runs
// always honour it — with an Idempotency-Key header (the action's key when
// it is 1 to 255 visible ASCII characters, else "sha256-" and its hex
// digest), so Hermes answers a repeated start with the original run_id. The
// run ID is recorded in the host state (namespace
// aip.connector.hermes_agent.runs.v1, key the action ID); the output is
// {run_id, status, replayed?}. With "wait": true run_start polls GET
// /v1/runs/{run_id} until its status is completed, failed or cancelled and
// returns it in "run"; when the action's timeout passes first, or a status
// read fails, it returns the last status seen (the run goes on; follow it
// with run_status). Cancelling
// a running run_start action (hostsdk.Canceler) stops its run with POST
// /v1/runs/{run_id}/stop; a run_start interrupted while it waits ends
// outcome_unknown naming the run (the run may have completed or acted
// before the stop). chat and responses send the action's key as
// Idempotency-Key too (the page lists it as accepted for deduplication).
//
// The page gives no body for POST /api/sessions ("create an empty
// session") nor for POST /v1/runs/{run_id}/stop: session_create sends {}
// and run_stop sends no body. Reads and other mutations return the
// provider's JSON answer as the output ({} for an empty answer).
//
// Every request carries X-AIP-Correlation-Id (the action ID) and, when the
// endpoint has a key, Authorization: Bearer <key>. CheckHealth (HealthChecker)
// sends GET /health to every endpoint.
//
// # Settings
//
//   - --hermes-endpoints-file (AIP_HERMES_ENDPOINTS_FILE, required): a JSON
//     file (not writable by group or others, at most 4 MiB) holding an array
//     of 1 to 1000 {"id", "base_url", "api_key_file"?, "display_name"?};
//     unknown fields and duplicate ids (compared lowercased) are refused.
//     id is 1 to 128 of A-Z a-z 0-9 _ -. base_url is the API server's root
//     (http://127.0.0.1:8642, or a /p/<profile> prefix): https, or http on
//     loopback only. api_key_file is an owner-only file holding the
//     server's API_SERVER_KEY. A manifest holds at most
//     hostsdk.MaxCapabilities capabilities, so one host fronts at most 39
//     endpoints.
//   - --hermes-max-response-bytes (AIP_HERMES_MAX_RESPONSE_BYTES): bound on
//     a JSON answer and on a whole chat stream, 1024 to 256 MiB (default
//     16 MiB). One SSE event is at most 1 MiB.
//   - --hermes-default-model (AIP_HERMES_DEFAULT_MODEL): the model of chat
//     and responses when the action names none (default "hermes-agent").
//
// # Errors
//
// Provider errors go through provider.Result: a 4xx is a failed result
// (provider.invalid_request, .unauthorized, .forbidden, .not_found,
// .conflict, .rate_limited for Hermes' 429 "Too many concurrent runs"); a
// read that gets a 5xx or no answer is failed and retryable
// (provider.unavailable); a mutation that may have reached Hermes (a 5xx,
// no answer, an unreadable answer) is outcome_unknown, journaled and
// never run again.
//
// # Not covered
//
// The detailed health, capabilities, model options, skills and toolsets
// reads; the run events SSE stream and run approval; session patch,
// messages, fork and session chat; the jobs API; streaming Responses;
// image and file content parts; the per-request provider and model_options
// overrides; X-Hermes-Session-Id/-Key; the runs' conversation_history (the
// page names it without its shape); the reference connector's operator
// delegation and per-endpoint tenants. Mutations do not require human
// approval in the manifest.
package hermes
