package hermes

import (
	"encoding/json"

	"github.com/aipfleet/aipfleet/aip"
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

// idProperty is a provider identifier taken from the caller: it becomes a
// path segment, so it may not start with a dot ("." and ".." segments).
func idProperty(what string) string {
	return `{"type":"string","minLength":1,"maxLength":256,"pattern":"^[A-Za-z0-9_][A-Za-z0-9_.:-]*$","description":"` + what + `"}`
}

const emptyInput = `{"type":"object","properties":{},"required":[],"additionalProperties":false}`

const modelProperty = `{"type":"string","minLength":1,"maxLength":256,"pattern":"^[^\\x00-\\x1f\\x7f]+$","description":"model to request; the --hermes-default-model when absent (runs: Hermes' own default)"}`

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
	{name: OpResponseDelete, title: "Delete a stored response", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: deleteEffects,
		input: idInput("response_id", "stored response ID"), retrySafety: aip.RetryUnsafe,
		description: "DELETE /v1/responses/{id}: deletes a stored response."},
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
	{name: OpSessionDelete, title: "Delete a session", kind: aip.KindTool, risk: aip.RiskMedium, mutation: true, effects: deleteEffects,
		input: idInput("session_id", "Hermes session ID"), retrySafety: aip.RetryUnsafe,
		description: "DELETE /api/sessions/{id}: deletes a session."},
}

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
