// Package crewai is the product adapter for crews deployed on CrewAI AMP
// (CrewAI's hosted platform), through the REST API every deployed crew
// publishes (specs/crewai/enterprise-api.en.yaml in
// products/internal/spectest: GET /inputs, POST /kickoff,
// GET /status/{kickoff_id}, POST /resume, bearer authentication).
//
// # Relation to upstream
//
// The upstream implementation (getaip/core, aip-host-crewai) runs CrewAI
// itself in a Python sidecar (FastAPI) that the Rust host calls over its
// own /jobs protocol. This adapter does not: it calls CrewAI AMP's
// published HTTP API for crews that are already deployed there, so there
// is no sidecar, no Python and no local run journal. It keeps upstream's
// capability naming (cap:crewai:<crew_id> runs the crew,
// cap:crewai:<crew_id>:<suffix> does the rest), agent kind, risks and
// profile. Upstream's events, cancel, batch_run, replay, train, test,
// knowledge_query and memory_reset operations have no counterpart in the
// AMP API and are not offered; resume and inputs are AMP operations
// upstream does not have.
//
// # Manifest
//
// The agent is agent:crewai:<namespace> (kind agent), where the namespace
// is the tenant ID the host serves, or "crews" when it has none; profiles
// aip.native.http.v1 and aip.connector.crewai.v1. Per configured crew:
//
//	cap:crewai:<crew_id>         run: POST /kickoff {inputs, meta?, restoreFromStateId?},
//	                             then GET /status/{kickoff_id} every poll interval
//	                             until completed or error (kind agent, risk medium, mutation)
//	cap:crewai:<crew_id>:inputs  GET /inputs: the names of the crew's inputs (tool, low, read)
//	cap:crewai:<crew_id>:status  GET /status/{kickoff_id} once (tool, low, read)
//	cap:crewai:<crew_id>:resume  POST /resume {execution_id, task_id, human_feedback,
//	                             is_approve}: human feedback to a paused task (tool, medium, mutation)
//
// Every input schema is closed (additionalProperties false) and bounded;
// kickoff ids must be UUIDs, as the document's format says, and so must
// an input named id (AMP answers 422 to an inputs.id that is not one). The run and
// status output is the document's status object (status, current_task,
// progress, result {output, tasks[]}, execution_time, error) with
// kickoff_id added; resume returns {kickoff_id, status, message}. No
// capability requires human approval (the reference does not say so).
//
// # Runs, polling and recovery
//
// A run sends POST /kickoff and, as soon as the kickoff id is answered,
// checks that it is a UUID (the document's format; anything else — empty,
// a "/", a dot segment, a control character — is never put into a status
// path, and the run ends outcome_unknown: AMP accepted the kickoff, so the
// crew may be running), then records {crew_id, kickoff_id} in the host state (namespace
// aip.connector.crewai.kickoffs.v1, key: the action ID). It then reads the
// status at once and after every poll interval. "completed" completes the
// action with the status object as output; "error" fails it with code
// crewai.execution_failed, quoting AMP's error message redacted of the
// token and clipped, as provider error bodies are; any other status ("running", or one the
// document does not list, such as a run paused for human input) is polled
// on. A status answer without one of the document's statuses but with a
// state — what deployed crews answer, and what CrewAI's own client of
// this API (crewai-tools' InvokeCrewAIAutomationTool) reads:
// {"state": "SUCCESS", "result": "<the crew's output>"} — is read as the
// document's shape: SUCCESS (or COMPLETED) completed, FAILED, FAILURE (or
// ERROR) error, any other state (PENDING, STARTED, RUNNING) running; a
// result string is the output (result.output), and the state is kept in
// the output as state. An answer with neither status nor state is a bad
// answer.
//
// A kickoff id the crew does not know ends the run's wait at once as
// outcome_unknown, naming the crew and the kickoff id and saying what may
// have happened: the kickoff expired, the crew's base_url or token names
// another deployment than the one that accepted it, or the crew was
// redeployed. Not failed: AMP accepted the kickoff, so the crew may have
// run and acted before its record was lost, which nothing can read. The document
// answers such an id with a 404 ("Kickoff ID not found", body {"error":
// "Execution not found", "message": "No execution found with ID: ..."});
// deployed crews also answer the state NOT FOUND, which the document does
// not list (Microsoft Semantic Kernel's client of this API stops waiting
// on it); both are read so. Before, the state was polled on until the
// action's timeout. The crew is never kicked off again: whether it ran
// before its record was lost cannot be read. The status capability
// answers both as provider.not_found.
//
// A status read that fails transiently (no answer, 5xx, 429, 408) is
// repeated with exponential backoff: the read after the n-th failure in a
// row waits the poll interval × 2^(n-1), at most 30 seconds (never less
// than the poll interval), or the answer's Retry-After (in seconds or an
// HTTP date) when that is longer, at most 10 minutes (or the poll
// interval, when longer). So an AMP outage of a few minutes does not end
// the wait for a run that goes on on AMP. The reads go on until the
// action's timeout or cancel, or until a read fails transiently when the
// failures in a row have lasted longer than the outage budget
// (--crewai-outage-budget-ms, default 5 minutes, counted from the start
// of the first failed read); that failure, or any other failure (a 4xx
// other than the 404 above, an answer without a status) at once, ends the
// wait as outcome_unknown,
// with the kickoff id and the status capability in the message so the
// run can be read later.
//
// When the action is cancelled or times out after the kickoff, polling
// stops and the action is outcome_unknown, with the kickoff id in the
// message: the AMP API has no cancel operation, so the crew itself keeps
// running on CrewAI AMP (the contract says supports_cancel false), and a
// "cancelled" record would wrongly tell the caller nothing happened. A
// cancel that arrives before the kickoff is sent records the action
// cancelled.
//
// The adapter is a hostsdk.Reconciler. A run a crash left running whose
// kickoff id is recorded (and is a UUID) is settled by one status read: completed or
// failed as AMP reports; a kickoff the crew does not know (a 404, or the
// state NOT FOUND) outcome_unknown saying so, never kicked off
// again; still running or unreadable, outcome_unknown naming the kickoff
// id. A run without a recorded kickoff id is
// outcome_unknown (the kickoff may have reached AMP), as is an interrupted
// resume; an interrupted read fails with crewai.interrupted, retryable.
//
// # Health
//
// CheckHealth (HealthChecker) sends GET /inputs, a cheap authenticated
// read, to every crew, 32 at a time. The replica is not ready only when
// every crew fails: one crew's rotated token or deleted deployment does
// not take the other crews offline. A crew that fails while others pass
// is named in /ready's connector detail (the replica stays ready; the
// check returns hostsdk.Degraded) and logged (provider.Targets: at warn when it starts failing, again every 10
// minutes, at info when it passes again), and its actions fail at once
// without a request to AMP, naming the crew and its check's failure,
// classified as that failure (provider.unauthorized, not retryable, for a
// refused token; provider.unavailable, retryable, for no answer or a 5xx),
// until a later check passes. The wait of a run already kicked off and
// Reconcile still read its status. A crew that does not answer fails its
// own check at three quarters of the probe's time, so the host still gets
// the others' outcome in time; a crew whose read could not start by then
// keeps its last outcome.
//
// # Settings
//
//	--crewai-crews-file / AIP_CREWAI_CREWS_FILE (required): a JSON array of
//	    1 to 1000 {id, base_url, token_file, description?}, not writable by
//	    group or others, at most 4 MiB, unknown fields refused. id: 1 to
//	    128 of [A-Za-z0-9_-], unique. base_url: the crew's URL from the AMP
//	    dashboard, an origin (https, or http to loopback). token_file: an
//	    owner-only file with the crew's bearer token; a relative path is
//	    taken from the crews file's directory. The token file is read at
//	    start and followed after (provider.ReadSecret): a token rotated in
//	    it is used without a restart, at once when the crew answers 401
//	    or 403; a file that cannot be read again keeps the token read
//	    before and is logged at warn. The crews file itself is read at
//	    start only. description: at most 16 KiB,
//	    appended to the run capability's description. One manifest holds
//	    at most hostsdk.MaxCapabilities (512) capabilities, four per crew,
//	    so one host serves at most 128 crews: split larger fleets across
//	    connector instances.
//	--crewai-max-response-bytes / AIP_CREWAI_MAX_RESPONSE_BYTES: largest
//	    answer read, 1 KiB to 256 MiB (default 64 MiB).
//	--crewai-poll-interval-ms / AIP_CREWAI_POLL_INTERVAL_MS: status poll
//	    interval, 50 ms to 10 min (default 1000).
//	--crewai-outage-budget-ms / AIP_CREWAI_OUTAGE_BUDGET_MS: how long a
//	    run's status reads may keep failing transiently before the run is
//	    outcome_unknown, 1 s to 24 h (default 300000, 5 min).
//
// # Errors
//
// Provider errors map through provider.Result: a 4xx fails the action
// with provider.invalid_request (400, 422), provider.unauthorized (401),
// provider.forbidden (403), provider.not_found (404)...; a read that got
// no answer or a 5xx fails retryably (provider.unavailable); a kickoff or
// resume that may have reached AMP (no answer, a 5xx, an unreadable 2xx)
// is outcome_unknown and never sent again under the same action ID.
// Tokens never appear in manifests, errors or logs.
//
// # Not covered
//
// Webhooks (taskWebhookUrl, stepWebhookUrl, crewWebhookUrl) are never sent:
// the adapter polls, and needs no public callback route. AMP has no
// idempotency key, so a new action ID is a new run. Streaming of
// intermediate progress is not offered.
package crewai
