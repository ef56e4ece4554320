package crewai

import (
	"encoding/json"
	"regexp"
)

// uuidPattern is the document's format: uuid, as a pattern the host's
// input validation enforces.
const uuidPattern = `^[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}$`

// kickoffIDRegexp is what a kickoff id must be before it is put into a
// path (GET /status/{kickoff_id}): a UUID, as the document's
// "format: uuid" says, whether the caller gave it or AMP answered it.
var kickoffIDRegexp = regexp.MustCompile(uuidPattern)

// runInputSchema: POST /kickoff's body without the webhook URLs. inputs
// are the crew's named string inputs (GET /inputs lists them); an input
// named id must be a UUID, as AMP answers 422 otherwise.
var runInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "inputs": {
      "type": "object",
      "description": "The crew's inputs by name (cap:crewai:<crew>:inputs lists the names); values are strings.",
      "maxProperties": 256,
      "propertyNames": {"minLength": 1, "maxLength": 256},
      "properties": {
        "id": {"type": "string", "description": "AMP refuses an inputs.id that is not a UUID (422).", "pattern": "` + uuidPattern + `"}
      },
      "additionalProperties": {"type": "string", "maxLength": 262144}
    },
    "meta": {
      "type": "object",
      "description": "Additional metadata passed to the crew.",
      "maxProperties": 64,
      "propertyNames": {"minLength": 1, "maxLength": 256}
    },
    "restore_from_state_id": {
      "type": "string",
      "description": "State id of a previous @persist flow execution to fork from (restoreFromStateId).",
      "pattern": "` + uuidPattern + `"
    }
  },
  "required": ["inputs"],
  "additionalProperties": false
}`)

var inputsInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {},
  "required": [],
  "additionalProperties": false
}`)

var statusInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "kickoff_id": {"type": "string", "description": "The kickoff id a run returned.", "pattern": "` + uuidPattern + `"}
  },
  "required": ["kickoff_id"],
  "additionalProperties": false
}`)

var resumeInputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "kickoff_id": {"type": "string", "description": "The paused execution's kickoff id (execution_id).", "pattern": "` + uuidPattern + `"},
    "task_id": {"type": "string", "description": "The task that waits for human feedback.", "minLength": 1, "maxLength": 256},
    "human_feedback": {"type": "string", "description": "Feedback on the task's output, added as context for the next tasks.", "maxLength": 65536},
    "is_approve": {"type": "boolean", "description": "true: approve and continue; false: retry the task with the feedback."}
  },
  "required": ["kickoff_id", "task_id", "human_feedback", "is_approve"],
  "additionalProperties": false
}`)

// taskResultSchema and statusOutputSchema follow the document's
// TaskResult and ExecutionRunning/Completed/Error schemas, plus the
// kickoff id.
const taskResultSchema = `{
  "type": "object",
  "properties": {
    "task_id": {"type": "string"},
    "output": {"type": "string"},
    "agent": {"type": "string"},
    "execution_time": {"type": "number"}
  }
}`

var statusOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "kickoff_id": {"type": "string"},
    "status": {"type": "string", "description": "running, completed or error (as CrewAI AMP reports it; a deployed crew's state mapped to one of them)"},
    "state": {"type": "string", "description": "the state a deployed crew answered (PENDING, STARTED, RUNNING, SUCCESS, FAILED...), when it answered one"},
    "current_task": {"type": "string"},
    "progress": {"type": "object", "properties": {"completed_tasks": {"type": "integer"}, "total_tasks": {"type": "integer"}}},
    "result": {"type": "object", "properties": {"output": {"type": "string"}, "tasks": {"type": "array", "items": ` + taskResultSchema + `}}},
    "execution_time": {"type": "number"},
    "error": {"type": "string"}
  },
  "required": ["kickoff_id", "status"]
}`)

var inputsOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {"inputs": {"type": "array", "items": {"type": "string"}}},
  "required": ["inputs"]
}`)

var resumeOutputSchema = json.RawMessage(`{
  "type": "object",
  "properties": {
    "kickoff_id": {"type": "string"},
    "status": {"type": "string", "description": "resumed, retrying or completed"},
    "message": {"type": "string"}
  },
  "required": ["kickoff_id", "status"]
}`)
