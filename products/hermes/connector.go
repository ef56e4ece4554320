package hermes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// AgentID is the manifest agent's ID.
const AgentID = "hermes-agent"

// RunsNamespace is the host state namespace where run_start records the
// run it started, keyed by action ID, for Cancel and Reconcile.
const RunsNamespace = "aip.connector.hermes_agent.runs.v1"

// CorrelationHeader carries the action ID on every provider request.
const CorrelationHeader = "X-AIP-Correlation-Id"

// Connector fronts one or more Hermes Agent API servers.
type Connector struct {
	endpoints []*endpoint
	byID      map[string]*endpoint
	log       *slog.Logger
	poll      time.Duration
	// outageBudget is how long run_start's status reads may keep failing
	// transiently before its wait ends; backoffCap bounds the backoff
	// between them (provider.DefaultOutageBudget and
	// provider.DefaultBackoffCap; tests shorten them).
	outageBudget time.Duration
	backoffCap   time.Duration
	// health is each endpoint's last health check: an endpoint that
	// failed it has its actions refused without being sent, and the
	// others are served.
	health *provider.Targets
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.Streamer      = (*Connector)(nil)
	_ hostsdk.Canceler      = (*Connector)(nil)
	_ hostsdk.Reconciler    = (*Connector)(nil)
)

// Manifest implements hostsdk.Connector: every operation for every
// endpoint.
// ActionStateNamespaces implements hostsdk.ActionStateKeeper: a run's
// record (its run ID, for cancel and status) goes when the host prunes the
// action that started it.
func (c *Connector) ActionStateNamespaces() []string { return []string{RunsNamespace} }

func (c *Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	caps := make([]aip.Capability, 0, len(c.endpoints)*len(operations))
	for _, ep := range c.endpoints {
		for i := range operations {
			caps = append(caps, operations[i].capability(ep))
		}
	}
	return &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent:           aip.Principal{ID: AgentID, Kind: aip.PrincipalAgent, DisplayName: "Hermes Agent"},
		Profiles:        []string{aip.NativeHTTPProfile},
		Capabilities:    caps,
	}, nil
}

// resolve finds the endpoint and operation of a capability ID.
func (c *Connector) resolve(capID string) (*endpoint, *operation, error) {
	rest, ok := strings.CutPrefix(capID, "cap:hermes_agent:")
	if ok {
		if id, name, ok := strings.Cut(rest, ":"); ok {
			ep, okE := c.byID[id]
			op, okO := operationByName(name)
			if okE && okO {
				return ep, op, nil
			}
		}
	}
	return nil, nil, aip.NewProtocolError("hermes.unknown_capability", aip.CategoryPermanent, false, 0,
		"capability "+capID+" is not one of this connector's")
}

// CheckHealth implements hostsdk.HealthChecker: GET /v1/models of every
// endpoint, all at once so that one slow endpoint does not hide the
// others; ctx bounds the probe. /v1/models is the page's cheap
// authenticated route: GET /health is public ("a cheap liveness probe"),
// so it answered 200 to a key Hermes no longer accepts (a rotated
// API_SERVER_KEY, a default key on a /p/<profile> prefix since July 2026)
// while every action failed unauthorized.
//
// The replica is ready while at least one endpoint passes: an endpoint
// that fails is named in the hostsdk.Degraded the check returns (/ready
// shows it) and logged, and its actions fail without being sent (Handle,
// HandleStream) until a later check passes, rather than one endpoint's
// failure taking every endpoint of the replica offline.
func (c *Connector) CheckHealth(ctx context.Context) error {
	ids := make([]string, len(c.endpoints))
	for i, ep := range c.endpoints {
		ids[i] = ep.id
	}
	return c.health.Check(ctx, ids, 0, func(ctx context.Context, id string) error {
		return c.byID[id].client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: "/v1/models"}, nil)
	})
}

// headers are the headers of a provider request for call.
func headers(call *hostsdk.Call) http.Header {
	return http.Header{CorrelationHeader: {call.Action.ID}}
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	ep, op, err := c.resolve(call.Action.CapabilityID)
	if err != nil {
		return nil, err
	}
	if res, refused := c.health.Refusal(call.Action.ID, ep.id); refused {
		return res, nil
	}
	if op.name == OpChat {
		in, err := decode[chatRequest](call)
		if err != nil {
			return nil, err
		}
		return c.chat(ctx, call, ep, in)
	}
	return c.handle(ctx, call, ep, op)
}

// decode reads an action's input (the host validated it against the input
// schema already). Integers spelled as other numbers (5.0, 1e1), which the
// schema's "integer" accepts, are read as the integers they are
// (provider.IntegralNumbers), not refused.
func decode[T any](call *hostsdk.Call) (T, error) {
	var v T
	if err := json.Unmarshal(provider.IntegralNumbers(call.Action.Input), &v); err != nil {
		return v, aip.NewProtocolError("hermes.input", aip.CategoryPermanent, false, 0, "input: "+err.Error())
	}
	return v, nil
}

type idIn struct {
	ResponseID string `json:"response_id"`
	RunID      string `json:"run_id"`
	SessionID  string `json:"session_id"`
	JobID      string `json:"job_id"`
}

type sessionPatchIn struct {
	SessionID string `json:"session_id"`
	Title     string `json:"title"`
	EndReason string `json:"end_reason"`
}

// sessionPatchBody is the body of PATCH /api/sessions/{id}: only the
// fields given.
type sessionPatchBody struct {
	Title     string `json:"title,omitempty"`
	EndReason string `json:"end_reason,omitempty"`
}

type sessionForkIn struct {
	SessionID string `json:"session_id"`
	Title     string `json:"title"`
}

// sessionForkBody is the body of POST /api/sessions/{id}/fork ({} without
// a title).
type sessionForkBody struct {
	Title string `json:"title,omitempty"`
}

type sessionChatIn struct {
	SessionID string `json:"session_id"`
	Input     string `json:"input"`
	Model     string `json:"model"`
}

// sessionChatBody is the body of POST /api/sessions/{id}/chat and
// /chat/stream.
type sessionChatBody struct {
	Input string `json:"input"`
	Model string `json:"model,omitempty"`
}

type jobUpdateIn struct {
	JobID    string `json:"job_id"`
	Prompt   string `json:"prompt"`
	Schedule string `json:"schedule"`
}

// jobUpdateBody is the body of PATCH /api/jobs/{job_id}: only the fields
// given (Hermes merges them).
type jobUpdateBody struct {
	Prompt   string `json:"prompt,omitempty"`
	Schedule string `json:"schedule,omitempty"`
}

type responsesIn struct {
	Input              string `json:"input"`
	Instructions       string `json:"instructions,omitempty"`
	PreviousResponseID string `json:"previous_response_id,omitempty"`
	Conversation       string `json:"conversation,omitempty"`
	Store              *bool  `json:"store,omitempty"`
	Model              string `json:"model"`
}

type runStartIn struct {
	Input              string `json:"input"`
	SessionID          string `json:"session_id,omitempty"`
	Instructions       string `json:"instructions,omitempty"`
	PreviousResponseID string `json:"previous_response_id,omitempty"`
	Model              string `json:"model,omitempty"`
	Wait               bool   `json:"wait,omitempty"`
}

type sessionsListIn struct {
	Limit           *int64 `json:"limit"`
	Offset          *int64 `json:"offset"`
	Source          string `json:"source"`
	IncludeChildren *bool  `json:"include_children"`
}

// handle runs every operation but chat.
func (c *Connector) handle(ctx context.Context, call *hostsdk.Call, ep *endpoint, op *operation) (*aip.ActionResult, error) {
	req := provider.Request{Method: http.MethodGet, Header: headers(call)}
	switch op.name {
	case OpHealth:
		req.Path = "/health"
	case OpModels:
		req.Path = "/v1/models"
	case OpResponses:
		in, err := decode[responsesIn](call)
		if err != nil {
			return nil, err
		}
		if in.Model == "" {
			in.Model = ep.defaultModel
		}
		req.Method, req.Path, req.JSON = http.MethodPost, "/v1/responses", in
		req.Header.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	case OpResponseGet, OpResponseDelete:
		in, err := decode[idIn](call)
		if err != nil {
			return nil, err
		}
		req.Path = endpointPath("/v1/responses", in.ResponseID)
		if op.name == OpResponseDelete {
			req.Method = http.MethodDelete
		}
	case OpRunStart:
		return c.runStart(ctx, call, ep)
	case OpRunStatus, OpRunStop:
		in, err := decode[idIn](call)
		if err != nil {
			return nil, err
		}
		req.Path = endpointPath("/v1/runs", in.RunID)
		if op.name == OpRunStop {
			req.Method, req.Path = http.MethodPost, req.Path+"/stop"
		}
	case OpSessionsList:
		in, err := decode[sessionsListIn](call)
		if err != nil {
			return nil, err
		}
		req.Path, req.Query = "/api/sessions", url.Values{}
		if in.Limit != nil {
			req.Query.Set("limit", strconv.FormatInt(*in.Limit, 10))
		}
		if in.Offset != nil {
			req.Query.Set("offset", strconv.FormatInt(*in.Offset, 10))
		}
		if in.Source != "" {
			req.Query.Set("source", in.Source)
		}
		if in.IncludeChildren != nil {
			req.Query.Set("include_children", strconv.FormatBool(*in.IncludeChildren))
		}
	case OpSessionCreate:
		req.Method, req.Path, req.JSON = http.MethodPost, "/api/sessions", struct{}{}
	case OpSessionGet, OpSessionDelete:
		in, err := decode[idIn](call)
		if err != nil {
			return nil, err
		}
		req.Path = endpointPath("/api/sessions", in.SessionID)
		if op.name == OpSessionDelete {
			req.Method = http.MethodDelete
		}
	case OpHealthDetailed:
		req.Path = "/health/detailed"
	case OpCapabilities:
		req.Path = "/v1/capabilities"
	case OpSkills:
		req.Path = "/v1/skills"
	case OpToolsets:
		req.Path = "/v1/toolsets"
	case OpRunEvents:
		return c.runEvents(ctx, call, ep, nil)
	case OpSessionPatch:
		in, err := decode[sessionPatchIn](call)
		if err != nil {
			return nil, err
		}
		req.Method, req.Path = http.MethodPatch, endpointPath("/api/sessions", in.SessionID)
		req.JSON = sessionPatchBody{Title: in.Title, EndReason: in.EndReason}
	case OpSessionMessages:
		in, err := decode[idIn](call)
		if err != nil {
			return nil, err
		}
		req.Path = endpointPath("/api/sessions", in.SessionID) + "/messages"
	case OpSessionFork:
		in, err := decode[sessionForkIn](call)
		if err != nil {
			return nil, err
		}
		req.Method, req.Path = http.MethodPost, endpointPath("/api/sessions", in.SessionID)+"/fork"
		req.JSON = sessionForkBody{Title: in.Title}
	case OpSessionChat:
		in, err := decode[sessionChatIn](call)
		if err != nil {
			return nil, err
		}
		req.Method, req.Path = http.MethodPost, endpointPath("/api/sessions", in.SessionID)+"/chat"
		req.JSON = sessionChatBody{Input: in.Input, Model: in.Model}
		req.Header.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	case OpJobsList:
		req.Path = "/api/jobs"
	case OpJobGet, OpJobDelete, OpJobPause, OpJobResume, OpJobRun:
		in, err := decode[idIn](call)
		if err != nil {
			return nil, err
		}
		req.Path = endpointPath("/api/jobs", in.JobID)
		switch op.name {
		case OpJobDelete:
			req.Method = http.MethodDelete
		case OpJobPause:
			req.Method, req.Path = http.MethodPost, req.Path+"/pause"
		case OpJobResume:
			req.Method, req.Path = http.MethodPost, req.Path+"/resume"
		case OpJobRun:
			req.Method, req.Path = http.MethodPost, req.Path+"/run"
		}
	case OpJobUpdate:
		in, err := decode[jobUpdateIn](call)
		if err != nil {
			return nil, err
		}
		req.Method, req.Path = http.MethodPatch, endpointPath("/api/jobs", in.JobID)
		req.JSON = jobUpdateBody{Prompt: in.Prompt, Schedule: in.Schedule}
	default:
		return nil, fmt.Errorf("hermes: operation %s has no handler", op.name)
	}
	out, err := c.call(ctx, ep, req)
	if err != nil {
		return provider.Result(call, err, op.mutation)
	}
	return call.Complete(out)
}

// call sends req and returns the answer's JSON ({} for an empty answer).
func (c *Connector) call(ctx context.Context, ep *endpoint, req provider.Request) (json.RawMessage, error) {
	var out json.RawMessage
	if err := ep.client.JSON(ctx, req, &out); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		out = json.RawMessage(`{}`)
	}
	return out, nil
}

// runStarted is what POST /v1/runs answers.
type runStarted struct {
	RunID  string `json:"run_id"`
	Status string `json:"status"`
}

// runRecord is what run_start keeps in RunsNamespace.
type runRecord struct {
	Endpoint string `json:"endpoint"`
	RunID    string `json:"run_id"`
}

// runStartOutput is run_start's output.
type runStartOutput struct {
	RunID    string          `json:"run_id"`
	Status   string          `json:"status"`
	Replayed bool            `json:"replayed,omitempty"`
	Run      json.RawMessage `json:"run,omitempty"`
}

func terminalRunStatus(s string) bool {
	return s == "completed" || s == "failed" || s == "cancelled"
}

// runStart starts a run, records its ID for Cancel and, with wait, polls
// it until it ends.
func (c *Connector) runStart(ctx context.Context, call *hostsdk.Call, ep *endpoint) (*aip.ActionResult, error) {
	in, err := decode[runStartIn](call)
	if err != nil {
		return nil, err
	}
	wait := in.Wait
	in.Wait = false
	h := headers(call)
	h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	resp, err := ep.client.Do(ctx, provider.Request{Method: http.MethodPost, Path: "/v1/runs", Header: h, JSON: in})
	if err != nil {
		return provider.Result(call, err, true)
	}
	var started runStarted
	if err := resp.Decode(&started); err != nil || started.RunID == "" {
		return nil, fmt.Errorf("%w: %s POST /v1/runs answered %d without a run_id: %s", hostsdk.ErrOutcomeUnknown, ep.client.Product(), resp.Status, ep.client.Redacted(string(resp.Body)))
	}
	if !validID(started.RunID) {
		// Hermes accepted the run (a 2xx), so it may be running and
		// acting: outcome_unknown, not a failure that invites a second
		// start. Its ID cannot address it (it would be put into the paths
		// of the status polls, run_status and the stop), so it is neither
		// recorded nor polled.
		return nil, fmt.Errorf("%w: %s POST /v1/runs answered %d with run_id %q, which is not a run ID (1 to %d of A-Z a-z 0-9 _ . : -, not starting with a dot); the run may have started, and cannot be followed or stopped through this connector",
			hostsdk.ErrOutcomeUnknown, ep.client.Product(), resp.Status, provider.Excerpt(ep.client.Redacted(started.RunID)), maxIDLength)
	}
	// Recorded even when the action is being cancelled (the Canceler reads
	// it), but bounded: a stuck journal must not hold the action.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	_, err = call.State().Put(wctx, RunsNamespace, call.Action.ID, runRecord{Endpoint: ep.id, RunID: started.RunID}, 0)
	cancel()
	if err != nil {
		call.Logger.Warn("record the started run; cancelling the action will not stop it", "run_id", started.RunID, "error", err)
	}
	out := runStartOutput{RunID: started.RunID, Status: started.Status,
		Replayed: strings.EqualFold(resp.Header.Get("Idempotency-Replayed"), "true")}
	if !wait {
		return call.Complete(out)
	}
	path := endpointPath("/v1/runs", started.RunID)
	t := time.NewTimer(0)
	defer t.Stop()
	outage := provider.Outage{Poll: c.poll, Cap: c.backoffCap, Budget: c.outageBudget}
	for {
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// The run goes on; the caller follows it with run_status.
				return call.Complete(out)
			}
			return nil, waitCut(ctx, ep, started.RunID)
		case <-t.C:
		}
		var run json.RawMessage
		began := time.Now()
		err := ep.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: path, Header: headers(call)}, &run)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			// A transient failure (no answer, 5xx, 408, 429) is read again
			// with backoff while the failures in a row last at most the
			// outage budget: a short outage of the API server does not end
			// the wait for a run that goes on.
			if delay, again := outage.Retry(err, began); again {
				call.Logger.Warn("hermes: run status read failed; trying again", "run_id", started.RunID, "error", err,
					"failures", outage.Failures(), "after", delay)
				t.Reset(delay)
				continue
			}
			// The run started: a failed result would say it did not, and
			// invite a second start. Return it as it was last seen, as
			// when the wait times out; run_status follows it.
			call.Logger.Warn("hermes: run status unreadable; run_start returns the run as last seen", "run_id", started.RunID, "error", err,
				"failures", outage.Failures())
			return call.Complete(out)
		}
		outage.Reset()
		var st struct {
			Status string `json:"status"`
		}
		_ = json.Unmarshal(run, &st)
		out.Status, out.Run = st.Status, run
		if terminalRunStatus(st.Status) {
			return call.Complete(out)
		}
		t.Reset(c.poll)
	}
}

// waitCut is run_start's outcome when its wait for run runID ends by a
// cancellation (not its timeout): outcome_unknown, never "cancelled", as
// the run started and may have acted. The host cancels an action-scoped
// cancel's context with a cause of its own and then calls the Canceler,
// which sends Hermes a stop for the run; Hermes stops a run "at the next
// safe interruption point", so it may have completed or acted first. The
// host's shutdown (a drain whose timeout passed, a hard stop: the cause
// hostsdk.ErrHostStopping) sends no stop: the run goes on on Hermes, and
// the caller is told so, with the run ID to follow or stop.
func waitCut(ctx context.Context, ep *endpoint, runID string) error {
	cause := context.Cause(ctx)
	if errors.Is(cause, hostsdk.ErrHostStopping) {
		return fmt.Errorf("%w: %s: run %s was started and goes on: the wait for it ended because the host is shutting down, which sends Hermes no stop; follow the run with run_status, or stop it with run_stop (run_id %s)",
			hostsdk.ErrOutcomeUnknown, ep.client.Product(), runID, runID)
	}
	return fmt.Errorf("%w: %s: run %s was started; the action was cancelled (%v), which sends Hermes a stop for the run, and Hermes stops a run at its next safe interruption point, so it may have completed or acted first; follow it with run_status (run_id %s), and send run_stop if it is still running",
		hostsdk.ErrOutcomeUnknown, ep.client.Product(), runID, cause, runID)
}

// Cancel implements hostsdk.Canceler: a run_start action being cancelled
// stops the run it started (POST /v1/runs/{run_id}/stop). Other actions
// are stopped by the cancellation of their context alone.
func (c *Connector) Cancel(ctx context.Context, call *hostsdk.Call, reason string) error {
	_, op, err := c.resolve(call.Action.CapabilityID)
	if err != nil || op.name != OpRunStart {
		return nil
	}
	var rec runRecord
	found, err := provider.LoadRecord(ctx, call.State(), RunsNamespace, call.Action.ID, "the run record", &rec)
	if err != nil {
		return fmt.Errorf("hermes: %w", err)
	}
	if !found {
		return fmt.Errorf("hermes: action %s has no started run recorded yet; nothing to stop", call.Action.ID)
	}
	ep, ok := c.byID[rec.Endpoint]
	if !ok {
		return fmt.Errorf("hermes: run %s was started on endpoint %q, which is no longer configured", rec.RunID, rec.Endpoint)
	}
	if !validID(rec.RunID) {
		return fmt.Errorf("hermes: the run record of %s holds run_id %q, which is not a run ID; nothing was sent to stop it", call.Action.ID, provider.Excerpt(rec.RunID))
	}
	return ep.client.JSON(ctx, provider.Request{Method: http.MethodPost,
		Path: endpointPath("/v1/runs", rec.RunID) + "/stop", Header: headers(call)}, nil)
}

// ReconcileReadTimeout bounds Reconcile's status read of a recorded run:
// recovery runs before the host registers, so a server that does not
// answer must not hold the start for RequestTimeout.
const ReconcileReadTimeout = 30 * time.Second

// Reconcile implements hostsdk.Reconciler. A run_start a restart
// interrupted whose run was recorded did start that run: it completes
// with the run as one status read finds it ({run_id, status, run}, as a
// wait that timed out returns it; {run_id, status "started"} when the read
// fails), so the caller learns the run ID it follows with run_status and
// stops with run_stop. Without the record a run_start is outcome_unknown,
// and the message names the idempotency key to send run_start again with:
// Hermes answers a repeated start under the same key and input with the
// run it started (Idempotency-Replayed), or starts it once. Any other
// action is outcome_unknown (the host fails an interrupted read
// connector_host.interrupted, retryable).
func (c *Connector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	id := u.Action.ActionID
	_, op, err := c.resolve(u.Action.CapabilityID)
	if err != nil || op.name != OpRunStart {
		return nil, fmt.Errorf("%w: the replica restarted while %s was in flight", hostsdk.ErrOutcomeUnknown, u.Action.CapabilityID)
	}
	var rec runRecord
	if _, err := provider.LoadRecord(ctx, u.State, RunsNamespace, id, "the run record", &rec); errors.Is(err, provider.ErrRecordUnreadable) {
		return nil, fmt.Errorf("%w: %v; the run may have started", hostsdk.ErrOutcomeUnknown, err)
	} else if err != nil {
		return nil, err
	}
	if rec.RunID == "" {
		return nil, fmt.Errorf("%w: the replica restarted before Hermes' answer to POST /v1/runs was recorded; the run may have started. To learn its run_id without starting another, send run_start again with the same input and idempotency key %q: Hermes answers a start it has seen under that key (for 24 hours) with the original run (replayed true)",
			hostsdk.ErrOutcomeUnknown, provider.Excerpt(u.Action.IdempotencyKey))
	}
	ep, ok := c.byID[rec.Endpoint]
	if !ok || !validID(rec.RunID) {
		return nil, fmt.Errorf("%w: run %q was started on endpoint %q, which is no longer configured or whose run ID cannot be read back", hostsdk.ErrOutcomeUnknown, provider.Excerpt(rec.RunID), provider.Excerpt(rec.Endpoint))
	}
	out := runStartOutput{RunID: rec.RunID, Status: "started"}
	rctx, cancel := context.WithTimeout(ctx, ReconcileReadTimeout)
	defer cancel()
	var run json.RawMessage
	err = ep.client.JSON(rctx, provider.Request{Method: http.MethodGet, Path: endpointPath("/v1/runs", rec.RunID),
		Header: http.Header{CorrelationHeader: {id}}}, &run)
	if err != nil {
		if u.Logger != nil {
			u.Logger.Warn("hermes: run status unreadable after a restart; run_start returns the run as started", "run_id", rec.RunID, "error", err)
		}
	} else {
		var st struct {
			Status string `json:"status"`
		}
		if json.Unmarshal(run, &st) == nil && st.Status != "" {
			out.Status, out.Run = st.Status, run
		}
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("hermes: marshal the output of %s: %w", id, err)
	}
	return &aip.ActionResult{ActionID: id, Status: aip.ResultCompleted, Output: raw}, nil
}
