package hermes

import (
	"encoding/json"
	"regexp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// Operations, the last part of a capability ID.
const (
	OpHealth         = "health"
	OpModels         = "models"
	OpChat           = "chat"
	OpResponses      = "responses"
	OpResponseGet    = "response_get"
	OpResponseDelete = "response_delete"
	OpRunStart       = "run_start"
	OpRunStatus      = "run_status"
	OpRunStop        = "run_stop"
	OpSessionsList   = "sessions_list"
	OpSessionCreate  = "session_create"
	OpSessionGet     = "session_get"
	OpSessionDelete  = "session_delete"

	OpHealthDetailed  = "health_detailed"
	OpCapabilities    = "capabilities"
	OpSkills          = "skills"
	OpToolsets        = "toolsets"
	OpRunEvents       = "run_events"
	OpSessionPatch    = "session_patch"
	OpSessionMessages = "session_messages"
	OpSessionFork     = "session_fork"
	OpSessionChat     = "session_chat"
	OpJobsList        = "jobs_list"
	OpJobGet          = "job_get"
	OpJobUpdate       = "job_update"
	OpJobDelete       = "job_delete"
	OpJobPause        = "job_pause"
	OpJobResume       = "job_resume"
	OpJobRun          = "job_run"
)

// operation is one capability offered for every endpoint.
type operation struct {
	name        string
	title       string
	description string
	kind        aip.CapabilityKind
	risk        aip.Risk
	// mutation: the call can change the provider's state (or, for chat,
	// responses and runs, the agent may act with its tools).
	mutation bool
	effects  []aip.SideEffect
	input    string
	output   string
	// streaming: the capability also runs in streaming mode.
	streaming bool
	// retrySafety says whether sending the action again is safe.
	retrySafety aip.RetrySafety
}

// idPattern is what a Hermes identifier (run, session, response, job) must
// look like to be put into a request path: the page's examples (run_abc123,
// resp_abc123, chatcmpl-abc123) and more, but never "/", "?", "#", "%",
// a control character or a leading dot ("." and ".." segments).
const idPattern = `^[A-Za-z0-9_][A-Za-z0-9_.:-]*$`

// maxIDLength bounds an identifier.
const maxIDLength = 256

var idRegexp = regexp.MustCompile(idPattern)

// validID reports whether id may be put into a request path: the same
// rule as the input schemas' (idProperty). It applies to the IDs Hermes
// answers too (run_start's run_id), which the caller then passes back.
func validID(id string) bool { return len(id) <= maxIDLength && idRegexp.MatchString(id) }

// idProperty is a provider identifier taken from the caller: it becomes a
// path segment, so it may not start with a dot ("." and ".." segments).
func idProperty(what string) string {
	return `{"type":"string","minLength":1,"maxLength":256,"pattern":"` + idPattern + `","description":"` + what + `"}`
}

const emptyInput = `{"type":"object","properties":{},"required":[],"additionalProperties":false}`

const modelProperty = `{"type":"string","minLength":1,"maxLength":256,"pattern":"^[^\\x00-\\x1f\\x7f]+$","description":"model to request; when absent, the endpoint's default model (runs: Hermes' own default)"}`

var chatInput = `{
  "type": "object",
  "properties": {
    "messages": {
      "type": "array", "minItems": 1, "maxItems": 200,
      "items": {
        "type": "object",
        "properties": {
          "role": {"type": "string", "enum": ["system", "user", "assistant"]},
          "content": {"type": "string", "maxLength": 65536}
        },
        "required": ["role", "content"],
        "additionalProperties": false
      }
    },
    "model": ` + modelProperty + `,
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 1048576}
  },
  "required": ["messages"],
  "additionalProperties": false
}`

const chatOutput = `{
  "type": "object",
  "properties": {
    "id": {"type": "string"},
    "model": {"type": "string"},
    "message": {
      "type": "object",
      "properties": {"role": {"type": "string"}, "content": {"type": "string"}},
      "required": ["role", "content"]
    },
    "finish_reason": {"type": "string"},
    "usage": {"type": "object"}
  },
  "required": ["message"]
}`

// responsesInput: a named conversation is used "instead of"
// previous_response_id (§ Named conversations); Hermes refuses both.
var responsesInput = `{
  "type": "object",
  "properties": {
    "input": {"type": "string", "minLength": 1, "maxLength": 262144},
    "instructions": {"type": "string", "minLength": 1, "maxLength": 65536},
    "previous_response_id": ` + idProperty("stored response to continue from") + `,
    "conversation": {"type": "string", "minLength": 1, "maxLength": 256, "pattern": "^[^\\x00-\\x1f\\x7f]+$"},
    "store": {"type": "boolean"},
    "model": ` + modelProperty + `
  },
  "required": ["input"],
  "not": {"required": ["conversation", "previous_response_id"]},
  "additionalProperties": false
}`

func idInput(name, what string) string {
	return `{"type":"object","properties":{"` + name + `":` + idProperty(what) + `},"required":["` + name + `"],"additionalProperties":false}`
}

var runStartInput = `{
  "type": "object",
  "properties": {
    "input": {"type": "string", "minLength": 1, "maxLength": 262144},
    "session_id": ` + idProperty("Hermes session to run in and to report in the run status") + `,
    "instructions": {"type": "string", "minLength": 1, "maxLength": 65536},
    "previous_response_id": ` + idProperty("stored response to continue from") + `,
    "model": ` + modelProperty + `,
    "wait": {"type": "boolean", "description": "poll the run until it is completed, failed or cancelled (cancelling the action stops the run)"}
  },
  "required": ["input"],
  "additionalProperties": false
}`

const sessionsListInput = `{
  "type": "object",
  "properties": {
    "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    "offset": {"type": "integer", "minimum": 0, "maximum": 1000000000},
    "source": {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[^\\x00-\\x1f\\x7f]+$"},
    "include_children": {"type": "boolean"}
  },
  "required": [],
  "additionalProperties": false
}`

// DefaultMaxEvents and MaxMaxEvents bound the events run_events reads
// (the reference connector's SSE event bound: 4096, at most 100000).
const (
	DefaultMaxEvents = 4096
	MaxMaxEvents     = 100000
)

var runEventsInput = `{
  "type": "object",
  "properties": {
    "run_id": ` + idProperty("run ID from run_start") + `,
    "max_events": {"type": "integer", "minimum": 1, "maximum": 100000, "description": "stop after this many events (default 4096)"}
  },
  "required": ["run_id"],
  "additionalProperties": false
}`

// shortText is a single-line caller string.
const shortText = `{"type":"string","minLength":1,"maxLength":256,"pattern":"^[^\\x00-\\x1f\\x7f]+$"}`

// sessionPatchInput: the Sessions API table, "Update title or end_reason".
var sessionPatchInput = `{
  "type": "object",
  "properties": {
    "session_id": ` + idProperty("Hermes session ID") + `,
    "title": ` + shortText + `,
    "end_reason": ` + shortText + `
  },
  "required": ["session_id"],
  "anyOf": [{"required": ["title"]}, {"required": ["end_reason"]}],
  "additionalProperties": false
}`

// sessionForkInput: the page's fork example sends {"title": ...}.
var sessionForkInput = `{
  "type": "object",
  "properties": {
    "session_id": ` + idProperty("Hermes session to branch") + `,
    "title": ` + shortText + `
  },
  "required": ["session_id"],
  "additionalProperties": false
}`

// sessionChatInput: the page's chat/stream example sends {"input": ...};
// session chat always honours model (§ Per-request model selection).
var sessionChatInput = `{
  "type": "object",
  "properties": {
    "session_id": ` + idProperty("Hermes session to run the turn in") + `,
    "input": {"type": "string", "minLength": 1, "maxLength": 262144},
    "model": ` + modelProperty + `
  },
  "required": ["session_id", "input"],
  "additionalProperties": false
}`

// jobUpdateInput: § PATCH /api/jobs/{job_id}, "Update fields on an
// existing job (prompt, schedule, etc.). Partial updates are merged." Only
// the two fields the page names.
var jobUpdateInput = `{
  "type": "object",
  "properties": {
    "job_id": ` + idProperty("scheduled job ID") + `,
    "prompt": {"type": "string", "minLength": 1, "maxLength": 65536},
    "schedule": ` + shortText + `
  },
  "required": ["job_id"],
  "anyOf": [{"required": ["prompt"]}, {"required": ["schedule"]}],
  "additionalProperties": false
}`

var (
	readEffects   = []aip.SideEffect{aip.EffectRead, aip.EffectExternalNetwork}
	agentEffects  = []aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork, aip.EffectCodeExecution}
	writeEffects  = []aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork}
	deleteEffects = []aip.SideEffect{aip.EffectDelete, aip.EffectExternalNetwork}
)

// operations are the capabilities of every endpoint, in manifest order.
var operations = []operation{
	{name: OpHealth, title: "Health", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /health: the API server's liveness probe ({\"status\": \"ok\"})."},
	{name: OpModels, title: "List models", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /v1/models: the model names the API server advertises (OpenAI list format)."},
	{name: OpChat, title: "Chat completion", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: chatInput, output: chatOutput, streaming: true, retrySafety: aip.RetryUnsafe,
		description: "POST /v1/chat/completions: one agent turn over the given messages; the agent may use its tools (terminal, files, web). Streaming mode forwards the answer's deltas."},
	{name: OpResponses, title: "Create a response", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: responsesInput, retrySafety: aip.RetryUnsafe,
		description: "POST /v1/responses: one agent turn in OpenAI Responses format, optionally chained (previous_response_id) or in a named conversation; the agent may use its tools."},
	{name: OpResponseGet, title: "Get a stored response", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: idInput("response_id", "stored response ID"), retrySafety: aip.RetrySafe,
		description: "GET /v1/responses/{id}: a previously stored response."},
	{name: OpResponseDelete, title: "Delete a stored response", kind: aip.KindTool, risk: aip.RiskHigh, mutation: true, effects: deleteEffects,
		input: idInput("response_id", "stored response ID"), retrySafety: aip.RetryUnsafe,
		description: "DELETE /v1/responses/{id}: deletes a stored response irreversibly."},
	{name: OpRunStart, title: "Start a run", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: runStartInput, retrySafety: aip.RetrySafeWithIdempotencyKey,
		description: "POST /v1/runs: starts an agent run (Idempotency-Key sent) and returns its run_id; with wait, polls GET /v1/runs/{run_id} until the run ends. Cancelling the action stops the run (POST /v1/runs/{run_id}/stop)."},
	{name: OpRunStatus, title: "Run status", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: idInput("run_id", "run ID from run_start"), retrySafety: aip.RetrySafe,
		description: "GET /v1/runs/{run_id}: the run's current state (status, output, usage)."},
	{name: OpRunStop, title: "Stop a run", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: writeEffects,
		input: idInput("run_id", "run ID from run_start"), retrySafety: aip.RetryUnsafe,
		description: "POST /v1/runs/{run_id}/stop: asks the run to stop at the next safe point ({\"status\": \"stopping\"})."},
	{name: OpSessionsList, title: "List sessions", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: sessionsListInput, retrySafety: aip.RetrySafe,
		description: "GET /api/sessions: sessions, paginated with limit and offset, filtered by source, with or without child sessions."},
	{name: OpSessionCreate, title: "Create a session", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: writeEffects,
		input: emptyInput, retrySafety: aip.RetryUnsafe,
		description: "POST /api/sessions: creates an empty session."},
	{name: OpSessionGet, title: "Get a session", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: idInput("session_id", "Hermes session ID"), retrySafety: aip.RetrySafe,
		description: "GET /api/sessions/{id}: a session's metadata."},
	{name: OpSessionDelete, title: "Delete a session", kind: aip.KindTool, risk: aip.RiskHigh, mutation: true, effects: deleteEffects,
		input: idInput("session_id", "Hermes session ID"), retrySafety: aip.RetryUnsafe,
		description: "DELETE /api/sessions/{id}: deletes a session (its transcript) irreversibly."},

	{name: OpHealthDetailed, title: "Detailed health", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /health/detailed: authenticated readiness (status and readiness.checks; a degraded result is still HTTP 200)."},
	{name: OpCapabilities, title: "API capabilities", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /v1/capabilities: the API server's machine-readable surface (features, endpoints, auth)."},
	{name: OpSkills, title: "List skills", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /v1/skills: the agent's skills ({name, description, category} each)."},
	{name: OpToolsets, title: "List toolsets", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /v1/toolsets: the toolsets resolved for the api_server platform, with the tools each expands to."},
	{name: OpRunEvents, title: "Run events", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: runEventsInput, streaming: true, retrySafety: aip.RetrySafe,
		description: "GET /v1/runs/{run_id}/events: the run's SSE events until the stream ends or max_events; streaming mode forwards each as a chunk, synchronous mode returns them."},
	{name: OpSessionPatch, title: "Update a session", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: writeEffects,
		input: sessionPatchInput, retrySafety: aip.RetryUnsafe,
		description: "PATCH /api/sessions/{id}: updates the session's title or end_reason."},
	{name: OpSessionMessages, title: "Session messages", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: idInput("session_id", "Hermes session ID"), retrySafety: aip.RetrySafe,
		description: "GET /api/sessions/{id}/messages: the session's message history."},
	{name: OpSessionFork, title: "Fork a session", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: writeEffects,
		input: sessionForkInput, retrySafety: aip.RetryUnsafe,
		description: "POST /api/sessions/{id}/fork: branches the session (CLI /branch semantics), optionally titled."},
	{name: OpSessionChat, title: "Session chat turn", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: sessionChatInput, streaming: true, retrySafety: aip.RetryUnsafe,
		description: "POST /api/sessions/{id}/chat: one synchronous agent turn in the session; the agent may use its tools. Streaming mode uses /chat/stream and forwards its events."},
	{name: OpJobsList, title: "List scheduled jobs", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects, input: emptyInput, retrySafety: aip.RetrySafe,
		description: "GET /api/jobs: all scheduled jobs."},
	{name: OpJobGet, title: "Get a scheduled job", kind: aip.KindTool, risk: aip.RiskLow, effects: readEffects,
		input: idInput("job_id", "scheduled job ID"), retrySafety: aip.RetrySafe,
		description: "GET /api/jobs/{job_id}: a job's definition and last-run state."},
	{name: OpJobUpdate, title: "Update a scheduled job", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: jobUpdateInput, retrySafety: aip.RetryUnsafe,
		description: "PATCH /api/jobs/{job_id}: changes the job's prompt or schedule (merged); the agent runs the new prompt on schedule."},
	{name: OpJobDelete, title: "Delete a scheduled job", kind: aip.KindTool, risk: aip.RiskHigh, mutation: true, effects: deleteEffects,
		input: idInput("job_id", "scheduled job ID"), retrySafety: aip.RetryUnsafe,
		description: "DELETE /api/jobs/{job_id}: removes the job irreversibly and cancels any in-flight run."},
	{name: OpJobPause, title: "Pause a scheduled job", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: writeEffects,
		input: idInput("job_id", "scheduled job ID"), retrySafety: aip.RetryUnsafe,
		description: "POST /api/jobs/{job_id}/pause: suspends the job's scheduled runs until it is resumed."},
	{name: OpJobResume, title: "Resume a scheduled job", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: idInput("job_id", "scheduled job ID"), retrySafety: aip.RetryUnsafe,
		description: "POST /api/jobs/{job_id}/resume: resumes a paused job; the agent runs it on schedule again."},
	{name: OpJobRun, title: "Run a scheduled job now", kind: aip.KindAgent, risk: aip.RiskHigh, mutation: true, effects: agentEffects,
		input: idInput("job_id", "scheduled job ID"), retrySafety: aip.RetryUnsafe,
		description: "POST /api/jobs/{job_id}/run: runs the job immediately, out of schedule; the agent may use its tools."},
}

// MaxEndpointsPerHost is how many endpoints one manifest can front: every
// endpoint has every operation, and a manifest holds at most
// hostsdk.MaxCapabilities capabilities.
var MaxEndpointsPerHost = hostsdk.MaxCapabilities / len(operations)

func operationByName(name string) (*operation, bool) {
	for i := range operations {
		if operations[i].name == name {
			return &operations[i], true
		}
	}
	return nil, false
}

func (op *operation) contract() *aip.CapabilityContract {
	completion := aip.CompletionSync
	if op.streaming {
		completion = aip.CompletionAny
	}
	requirement := aip.IdempotencyOptional
	if op.mutation {
		requirement = aip.IdempotencyRequired
	}
	return &aip.CapabilityContract{
		SideEffects: op.effects,
		Idempotency: aip.IdempotencyContract{Requirement: requirement,
			CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
		Execution: aip.ExecutionContract{SupportsSync: true, SupportsStreaming: op.streaming,
			SupportsCancel: true, SupportsRetry: !op.mutation || op.retrySafety == aip.RetrySafeWithIdempotencyKey,
			ExpectedCompletion: completion, RetrySafety: op.retrySafety},
		Data: aip.DataContract{Sensitivity: aip.SensitivityConfidential},
	}
}

func (op *operation) capability(ep *endpoint) aip.Capability {
	name := op.title
	if ep.displayName != "" {
		name += " (" + ep.displayName + ")"
	} else {
		name += " (" + ep.id + ")"
	}
	c := aip.Capability{
		ID: CapabilityID(ep.id, op.name), Name: name, Kind: op.kind,
		InputSchema: json.RawMessage(op.input), Description: op.description,
		Risk: op.risk, Stability: aip.StabilityStable, Contract: op.contract(),
	}
	if op.output != "" {
		c.OutputSchema = json.RawMessage(op.output)
	}
	return c
}

// CapabilityID returns cap:hermes_agent:<endpoint id>:<operation>.
func CapabilityID(endpointID, op string) string {
	return "cap:hermes_agent:" + endpointID + ":" + op
}
