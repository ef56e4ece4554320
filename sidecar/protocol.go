package sidecar

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/aipfleet/aipfleet/aip"
)

// Paths of the local connector contract (docs/sidecar-protocol.md). The
// connector serves them on a loopback TCP port or a unix socket.
const (
	PathLocalManifest  = "/aip/manifest"
	PathLocalHealth    = "/aip/health"
	PathLocalActions   = "/aip/actions"
	PathLocalReconcile = "/aip/reconcile"
	// The cancel path is PathLocalActions + "/{action_id}/cancel".
)

// Headers the sidecar sets on every action, cancel and reconcile request.
// (They are deliberately not "Idempotency-Key": Go's HTTP client treats a
// POST with that header as replayable on a fresh connection, and a crashed
// connector's request must never be replayed behind the sidecar's back.)
const (
	HeaderActionID       = "AIP-Action-ID"
	HeaderIdempotencyKey = "AIP-Idempotency-Key"
)

// Environment variables the sidecar sets for a connector it starts (--exec).
const (
	EnvLocalURL    = "AIP_SIDECAR_LOCAL_URL"
	EnvLocalSocket = "AIP_SIDECAR_LOCAL_SOCKET"
	EnvLocalToken  = "AIP_SIDECAR_LOCAL_TOKEN"
	// EnvChildOf marks every process the sidecar starts (the --exec
	// connector, a stdio MCP server) with the replica's ID, and so every
	// process they start that keeps its environment. A sidecar that starts
	// for this replica, once it holds the replica's journal (no live
	// sidecar of the replica exists), kills the processes of its user that
	// carry exactly this entry: what a killed sidecar's child left running
	// (Linux; see stopOrphans).
	EnvChildOf = "AIP_SIDECAR_CHILD_OF"
)

// Status values of a local result and of a reconcile answer.
const (
	localCompleted      = "completed"
	localFailed         = "failed"
	localCancelled      = "cancelled"
	localOutcomeUnknown = "outcome_unknown"
	localNotFound       = "not_found" // reconcile only
	localRunning        = "running"   // reconcile only
)

// Error codes the sidecar writes into results itself.
const (
	// CodeConnectorUnavailable: the local connector (or MCP server) could
	// not be reached; the action was not delivered and did not run.
	CodeConnectorUnavailable = "sidecar.connector_unavailable"
	// CodeConnectorRejected: the local connector refused the request with a
	// 4xx or 503 status and no usable error object; it did not run it.
	// It is retryable for 408, 425, 429 and 503 (with Retry-After's
	// seconds as retry_after_ms), not for any other status.
	CodeConnectorRejected = "sidecar.connector_rejected"
	// CodeNotExecuted: the action had no effect: after a restart the
	// connector reported that it has no record of it (it never ran).
	CodeNotExecuted = "sidecar.not_executed"
	// CodeToolError: an MCP tool answered with isError.
	CodeToolError = "mcp.tool_error"
	// CodeMCPError: the MCP server refused the call with a JSON-RPC error
	// before running it (invalid params, unknown tool, ...).
	CodeMCPError = "mcp.error"
	// CodeInteractionUnavailable: a read-only MCP tool needed what only an
	// interactive MCP client gives — sampling (a model's completion), or
	// user input it kept asking for — which the AIP bridge, with no model
	// and no user, cannot provide. Sending it again does not help.
	CodeInteractionUnavailable = "mcp.interaction_unavailable"
)

// localTenant is the deployment identity passed with every action.
type localTenant struct {
	TenantID        string `json:"tenant_id"`
	ConnectorTypeID string `json:"connector_type_id"`
	VersionID       string `json:"version_id"`
	InstanceID      string `json:"instance_id"`
	ReplicaID       string `json:"replica_id"`
	ConfigRevision  uint64 `json:"config_revision"`
	TrustDomain     string `json:"trust_domain"`
	// MembershipID is the tenant membership the instance acts under
	// (--membership-id), and CredentialRevisionRef the revision of its
	// tenant credential (--credential-revision-ref); omitted when not
	// configured.
	MembershipID          string `json:"membership_id,omitempty"`
	CredentialRevisionRef string `json:"credential_revision_ref,omitempty"`
}

// localAction is the body of POST /aip/actions.
type localAction struct {
	ActionID       string               `json:"action_id"`
	IdempotencyKey string               `json:"idempotency_key"`
	CapabilityID   string               `json:"capability_id"`
	Input          json.RawMessage      `json:"input"`
	Mode           string               `json:"mode"` // "sync" or "streaming"
	TimeoutMS      *uint64              `json:"timeout_ms,omitempty"`
	MessageID      string               `json:"message_id"`
	Tenant         localTenant          `json:"tenant"`
	Identity       *aip.IdentityContext `json:"identity,omitempty"`
}

// localResult is the answer to an action (and to a reconcile).
type localResult struct {
	ActionID string             `json:"action_id,omitempty"`
	Status   string             `json:"status"`
	Output   json.RawMessage    `json:"output,omitempty"`
	Message  []aip.MessagePart  `json:"message,omitempty"`
	Usage    *aip.Usage         `json:"usage,omitempty"`
	Error    *aip.ProtocolError `json:"error,omitempty"`
	Detail   string             `json:"detail,omitempty"`
}

// localChunk is one stream chunk of a streaming answer.
type localChunk struct {
	Kind aip.ChunkKind    `json:"kind"`
	Data json.RawMessage  `json:"data,omitempty"`
	Part *aip.MessagePart `json:"part,omitempty"`
}

// localLine is one NDJSON line of a streaming answer: exactly one of Chunk
// and Result.
type localLine struct {
	Chunk  *localChunk  `json:"chunk,omitempty"`
	Result *localResult `json:"result,omitempty"`
}

// localCancel is the body of POST /aip/actions/{action_id}/cancel.
type localCancel struct {
	ActionID string `json:"action_id"`
	Reason   string `json:"reason,omitempty"`
}

// localReconcile is the body of POST /aip/reconcile.
type localReconcile struct {
	ActionID       string         `json:"action_id"`
	IdempotencyKey string         `json:"idempotency_key"`
	CapabilityID   string         `json:"capability_id"`
	InputDigest    string         `json:"input_digest"`
	ReceivedAt     aip.Timestamp  `json:"received_at"`
	StartedAt      *aip.Timestamp `json:"started_at,omitempty"`
}

// localHealth is the body of GET /aip/health.
type localHealth struct {
	Status string `json:"status"` // "ok" when ready
	Detail string `json:"detail,omitempty"`
}

// localError is the body of a 4xx/5xx answer.
type localError struct {
	Error *aip.ProtocolError `json:"error"`
}

var errNoStatus = errors.New("status is missing")

// toResult validates a completed, failed or cancelled local result for
// actionID and converts it. Any other status is an error; the caller
// handles outcome_unknown (and the reconcile statuses) before.
func (r *localResult) toResult(actionID string) (*aip.ActionResult, error) {
	if r.ActionID != "" && r.ActionID != actionID {
		return nil, fmt.Errorf("the answer is for action %s, not %s", r.ActionID, actionID)
	}
	res := &aip.ActionResult{ActionID: actionID, Output: r.Output, Message: r.Message, Usage: r.Usage, Error: r.Error}
	switch r.Status {
	case localCompleted:
		res.Status = aip.ResultCompleted
	case localFailed:
		res.Status = aip.ResultFailed
		if res.Error == nil {
			detail := r.Detail
			if detail == "" {
				detail = "the connector reported a failure without an error object"
			}
			res.Error = aip.NewProtocolError("connector.failed", aip.CategoryConnector, false, 0, aip.TruncateUTF8(detail, aip.MaxErrorMessageBytes))
		}
	case localCancelled:
		res.Status = aip.ResultCancelled
	case "":
		return nil, errNoStatus
	default:
		return nil, fmt.Errorf("status %q is not completed, failed, cancelled or outcome_unknown", r.Status)
	}
	if err := res.Validate(); err != nil {
		return nil, err
	}
	return res, nil
}
