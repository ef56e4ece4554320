package crewai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Identifiers of the manifest.
const (
	// Profile is the connector profile the manifest declares.
	Profile = "aip.connector.crewai.v1"
	// CapabilityPrefix starts every capability ID: cap:crewai:<crew id>
	// runs the crew, cap:crewai:<crew id>:<suffix> does the rest.
	CapabilityPrefix = "cap:crewai:"
	// DefaultNamespace is the agent namespace when the tenant is empty.
	DefaultNamespace = "crews"
	// KickoffsNamespace is the host state namespace where a run's kickoff
	// id is kept, keyed by action ID, for Reconcile.
	KickoffsNamespace = "aip.connector.crewai.kickoffs.v1"
)

// Capability suffixes.
const (
	SuffixInputs = "inputs"
	SuffixStatus = "status"
	SuffixResume = "resume"
)

// Error codes of failed results this adapter builds itself (provider
// errors carry provider.* codes).
const (
	// CodeExecutionFailed: the crew ran and CrewAI AMP reported status
	// "error".
	CodeExecutionFailed = "crewai.execution_failed"
	// CodeInterrupted: a read was interrupted by a restart; run it again.
	CodeInterrupted = "crewai.interrupted"
)

// Connector serves the configured crews.
type Connector struct {
	crews map[string]*crew
	order []*crew
	poll  time.Duration
	// outageBudget is how long a run's status reads may keep failing
	// transiently before its wait ends (--crewai-outage-budget-ms);
	// backoffCap bounds the backoff between them (tests shorten it).
	outageBudget time.Duration
	backoffCap   time.Duration
	logger       *slog.Logger
	// health is each crew's last health check: a crew that failed it
	// has its actions refused without being sent, and the others are
	// served.
	health *provider.Targets
}

func newConnector(crews []*crew, poll time.Duration, logger *slog.Logger) *Connector {
	c := &Connector{crews: make(map[string]*crew, len(crews)), order: crews, poll: poll,
		outageBudget: DefaultOutageBudget, backoffCap: provider.DefaultBackoffCap, logger: logger,
		health: provider.NewTargets("crew", "crew_id", logger)}
	for _, cr := range crews {
		c.crews[cr.id] = cr
	}
	return c
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.Reconciler    = (*Connector)(nil)
)

// operation is what a capability does.
type operation int

const (
	opRun operation = iota
	opInputs
	opStatus
	opResume
)

// parseCapability splits a capability ID into its crew and operation.
func (c *Connector) parseCapability(id string) (*crew, operation, bool) {
	rest, ok := strings.CutPrefix(id, CapabilityPrefix)
	if !ok {
		return nil, 0, false
	}
	crewID, suffix, hasSuffix := strings.Cut(rest, ":")
	cr, ok := c.crews[crewID]
	if !ok {
		return nil, 0, false
	}
	if !hasSuffix {
		return cr, opRun, true
	}
	switch suffix {
	case SuffixInputs:
		return cr, opInputs, true
	case SuffixStatus:
		return cr, opStatus, true
	case SuffixResume:
		return cr, opResume, true
	}
	return nil, 0, false
}

func contract(mutation bool, sensitivity aip.Sensitivity) *aip.CapabilityContract {
	cc := &aip.CapabilityContract{
		SideEffects: []aip.SideEffect{aip.EffectRead},
		Idempotency: aip.IdempotencyContract{Requirement: aip.IdempotencyOptional,
			CollisionBehavior: aip.CollisionReturnOriginal, KeyScope: aip.ScopeAction},
		Execution: aip.ExecutionContract{SupportsSync: true, SupportsRetry: true,
			ExpectedCompletion: aip.CompletionSync, RetrySafety: aip.RetrySafe},
		Data:         aip.DataContract{Sensitivity: sensitivity},
		Compensation: &aip.CompensationContract{Mode: aip.CompensationNotRequired},
	}
	if mutation {
		cc.SideEffects = []aip.SideEffect{aip.EffectWrite, aip.EffectExternalNetwork}
		cc.Idempotency.Requirement = aip.IdempotencyRequired
		// CrewAI AMP has no idempotency key: a new action is a new run.
		cc.Execution.SupportsRetry = false
		cc.Execution.RetrySafety = aip.RetryUnsafe
		cc.Compensation = &aip.CompensationContract{Mode: aip.CompensationRollbackUnsupported}
	}
	return cc
}

// Manifest implements hostsdk.Connector: four capabilities per crew.
// ActionStateNamespaces implements hostsdk.ActionStateKeeper: a run's
// kickoff record goes when the host prunes the action that started it.
func (c *Connector) ActionStateNamespaces() []string { return []string{KickoffsNamespace} }

func (c *Connector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	ns := tenant.TenantID
	if ns == "" {
		ns = DefaultNamespace
	}
	m := &aip.Manifest{
		ManifestVersion: "aip-manifest/v1",
		Agent: aip.Principal{ID: "agent:crewai:" + ns, Kind: aip.PrincipalAgent,
			DisplayName: "CrewAI AMP crews"},
		Profiles: []string{aip.NativeHTTPProfile, Profile},
	}
	for _, cr := range c.order {
		base := CapabilityPrefix + cr.id
		runDesc := "Starts crew " + cr.id + " on CrewAI AMP (POST /kickoff) and waits, reading its status, until it completes or fails; returns the crew's output."
		if cr.description != "" {
			runDesc += " The crew: " + cr.description
		}
		m.Capabilities = append(m.Capabilities,
			aip.Capability{ID: base, Name: "Run crew " + cr.id, Kind: aip.KindAgent, Description: runDesc,
				InputSchema: runInputSchema, OutputSchema: statusOutputSchema, Risk: aip.RiskMedium,
				Stability: aip.StabilityStable, Contract: contract(true, aip.SensitivityConfidential)},
			aip.Capability{ID: base + ":" + SuffixInputs, Name: "Inputs of crew " + cr.id, Kind: aip.KindTool,
				Description: "Lists the names of the inputs crew " + cr.id + " expects (GET /inputs).",
				InputSchema: inputsInputSchema, OutputSchema: inputsOutputSchema, Risk: aip.RiskLow,
				Stability: aip.StabilityStable, Contract: contract(false, aip.SensitivityInternal)},
			aip.Capability{ID: base + ":" + SuffixStatus, Name: "Status of a run of crew " + cr.id, Kind: aip.KindTool,
				Description: "Reads the status of one run of crew " + cr.id + " by kickoff id (GET /status/{kickoff_id}): running, completed with its output, or error.",
				InputSchema: statusInputSchema, OutputSchema: statusOutputSchema, Risk: aip.RiskLow,
				Stability: aip.StabilityStable, Contract: contract(false, aip.SensitivityConfidential)},
			aip.Capability{ID: base + ":" + SuffixResume, Name: "Resume crew " + cr.id + " with human feedback", Kind: aip.KindTool,
				Description: "Gives human feedback to a run of crew " + cr.id + " paused on a task with human input (POST /resume): approve to continue, or not to retry the task with the feedback.",
				InputSchema: resumeInputSchema, OutputSchema: resumeOutputSchema, Risk: aip.RiskMedium,
				Stability: aip.StabilityStable, Contract: contract(true, aip.SensitivityConfidential)},
		)
	}
	return m, nil
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	cr, op, ok := c.parseCapability(call.Action.CapabilityID)
	if !ok {
		return nil, aip.NewProtocolError("crewai.unknown_capability", aip.CategoryPermanent, false, 0,
			"no configured crew serves capability "+call.Action.CapabilityID)
	}
	if res, refused := c.health.Refusal(call.Action.ID, cr.id); refused {
		return res, nil
	}
	switch op {
	case opInputs:
		return c.inputs(ctx, call, cr)
	case opStatus:
		return c.status(ctx, call, cr)
	case opResume:
		return c.resume(ctx, call, cr)
	default:
		return c.run(ctx, call, cr)
	}
}

func decodeInput(call *hostsdk.Call, v any) error {
	if err := json.Unmarshal(call.Action.Input, v); err != nil {
		return aip.NewProtocolError("crewai.input", aip.CategoryPermanent, false, 0, "input: "+err.Error())
	}
	return nil
}

// kickoffRequest is POST /kickoff's body. The webhook URLs are never sent:
// this adapter learns the outcome by polling.
type kickoffRequest struct {
	Inputs map[string]string `json:"inputs"`
	// Meta is sent as the caller wrote it (any JSON object): decoded
	// into Go values, a large integer would be rounded through a float.
	Meta               json.RawMessage `json:"meta,omitempty"`
	RestoreFromStateID string          `json:"restoreFromStateId,omitempty"`
}

type runInput struct {
	Inputs             map[string]string `json:"inputs"`
	Meta               json.RawMessage   `json:"meta"`
	RestoreFromStateID string            `json:"restore_from_state_id"`
}

// kickoffRecord is what KickoffsNamespace holds per action.
type kickoffRecord struct {
	CrewID    string `json:"crew_id"`
	KickoffID string `json:"kickoff_id"`
}

// run kicks the crew off, records the kickoff id, then polls its status
// until it is terminal.
func (c *Connector) run(ctx context.Context, call *hostsdk.Call, cr *crew) (*aip.ActionResult, error) {
	var in runInput
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	if in.Inputs == nil {
		in.Inputs = map[string]string{}
	}
	if err := ctx.Err(); err != nil {
		return nil, err // nothing sent yet
	}
	var out struct {
		KickoffID string `json:"kickoff_id"`
	}
	// The same fields under the document's names (restoreFromStateId).
	err := cr.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: "/kickoff",
		JSON: kickoffRequest(in)}, &out)
	if err != nil {
		return provider.Result(call, err, true)
	}
	if out.KickoffID == "" {
		return nil, fmt.Errorf("%w: crewai POST /kickoff answered without a kickoff_id; the crew may be running", hostsdk.ErrOutcomeUnknown)
	}
	if !kickoffIDRegexp.MatchString(out.KickoffID) {
		// AMP accepted the kickoff (a 2xx), so the crew may be running:
		// outcome_unknown, not a failure that invites a second kickoff. An
		// id that is not a UUID is never put into a status path, nor
		// recorded for Reconcile.
		return nil, fmt.Errorf("%w: crewai POST /kickoff answered kickoff_id %q, which is not a UUID (the document's format); the crew may be running and cannot be followed through this connector",
			hostsdk.ErrOutcomeUnknown, provider.Excerpt(cr.client.Redacted(out.KickoffID)))
	}
	logger := call.Logger
	if logger == nil {
		logger = c.logger
	}
	logger = logger.With("crew_id", cr.id, "kickoff_id", out.KickoffID)
	// A crash from here on is settled by Reconcile through this record.
	// Without it Reconcile says outcome_unknown, which is still true, so a
	// failure to record does not stop the run.
	if st := call.State(); st != nil {
		if _, err := st.Put(context.WithoutCancel(ctx), KickoffsNamespace, call.Action.ID,
			kickoffRecord{CrewID: cr.id, KickoffID: out.KickoffID}, 0); err != nil {
			logger.Warn("could not record the kickoff id; a restart before the run ends leaves it outcome_unknown", "error", err)
		}
	}
	return c.wait(ctx, call.Action.ID, cr, out.KickoffID, logger)
}

// wait polls GET /status/{kickoff_id} every poll interval until the run
// is completed or error. When ctx ends first (a cancel, a timeout, the
// host's shutdown) the run is outcome_unknown: the crew was kicked off and
// keeps running on CrewAI AMP, which has no cancel, so recording it
// cancelled would tell the caller that nothing happened.
//
// A status read that fails transiently (no answer, 5xx, 408, 429) is
// repeated with exponential backoff (provider.Outage: the poll interval
// doubled per failure up to backoffCap, or the answer's Retry-After when
// longer, at most MaxPollInterval) for as long as the failures in a row
// last at most outageBudget: an AMP outage of a few minutes does not
// turn a long run, which goes on on AMP, into outcome_unknown. A kickoff
// id the crew does not know (a 404, or the state NOT FOUND) ends the wait
// at once as outcome_unknown (no later read can find it). A longer
// outage, or any other failure, ends the wait as outcome_unknown too.
func (c *Connector) wait(ctx context.Context, actionID string, cr *crew, kickoffID string, logger *slog.Logger) (*aip.ActionResult, error) {
	timer := time.NewTimer(0) // the first read is immediate
	defer timer.Stop()
	outage := provider.Outage{Poll: c.poll, Cap: c.backoffCap, Budget: c.outageBudget,
		MaxRetryWait: max(c.poll, MaxPollInterval)}
	stopped := func() error {
		return fmt.Errorf("%w: crew %s was kicked off as %s and keeps running on CrewAI AMP, which has no cancel; the wait ended (%v) (read it with %s%s:%s)",
			hostsdk.ErrOutcomeUnknown, cr.id, kickoffID, context.Cause(ctx), CapabilityPrefix, cr.id, SuffixStatus)
	}
	for {
		select {
		case <-ctx.Done():
			return nil, stopped()
		case <-timer.C:
		}
		began := time.Now()
		st, err := c.readStatus(ctx, cr, kickoffID)
		if err != nil {
			if ctx.Err() != nil {
				return nil, stopped()
			}
			var nf *kickoffNotFound
			if errors.As(err, &nf) {
				// No later read can find it: end now rather than
				// poll until the action's timeout.
				return nil, nf.unknown()
			}
			delay, again := outage.Retry(err, began)
			if again {
				logger.Warn("status read failed; trying again", "error", err, "failures", outage.Failures(), "after", delay)
				timer.Reset(delay)
				continue
			}
			if _, transient := provider.Transient(err); transient {
				return nil, fmt.Errorf("%w: crew %s was kicked off as %s but its status reads kept failing for longer than the %s outage budget (%d in a row; read it with %s%s:%s): %v",
					hostsdk.ErrOutcomeUnknown, cr.id, kickoffID, outage.Budget, outage.Failures(), CapabilityPrefix, cr.id, SuffixStatus, err)
			}
			return nil, fmt.Errorf("%w: crew %s was kicked off as %s but its status could not be read (read it with %s%s:%s): %v",
				hostsdk.ErrOutcomeUnknown, cr.id, kickoffID, CapabilityPrefix, cr.id, SuffixStatus, err)
		}
		outage.Reset()
		if res, done := settled(actionID, cr, st); done {
			return res, nil
		}
		timer.Reset(c.poll)
	}
}

// settled turns a terminal status into the run's result.
func settled(actionID string, cr *crew, st *statusOutput) (*aip.ActionResult, bool) {
	switch st.Status {
	case statusCompleted:
		raw, err := json.Marshal(st)
		if err != nil {
			return nil, false
		}
		return &aip.ActionResult{ActionID: actionID, Status: aip.ResultCompleted, Output: raw}, true
	case statusError:
		// AMP's error is provider text: redacted of the crew's token (a
		// crew, a tool or a proxy may echo the request) and clipped, as a
		// provider's error body is.
		why := st.Error
		if why == "" && st.Result != nil {
			why = st.Result.Output // a deployed crew's failed result
		}
		if why == "" {
			why = "CrewAI AMP reported it failed (state " + st.State + ") without an error message"
		}
		msg := fmt.Sprintf("crew %s run %s failed: %s", cr.id, st.KickoffID, cr.client.Redacted(why))
		return &aip.ActionResult{ActionID: actionID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(CodeExecutionFailed, aip.CategoryPermanent, false, 0,
				aip.TruncateUTF8(msg, aip.MaxErrorMessageBytes))}, true
	}
	return nil, false
}

// Status values of the document's ExecutionRunning, ExecutionCompleted
// and ExecutionError schemas.
// Any other status ("running", or a state the document does not list)
// is polled on.
const (
	statusRunning   = "running"
	statusCompleted = "completed"
	statusError     = "error"
)

// runStatus is the status of a status answer: its status when it is one
// of the document's (running, completed, error); else, when the answer
// has a state, that state as the document's status. Deployed crews
// answer {"state", "result"} (PENDING, STARTED, RUNNING, SUCCESS,
// FAILED or FAILURE, and the crew's output as a string in result):
// CrewAI's own client of this API, crewai-tools'
// InvokeCrewAIAutomationTool, reads state "success" and "failed" and
// result, and never status. SUCCESS (or COMPLETED) is completed, FAILED,
// FAILURE (or ERROR) is error, any other state running (NOT FOUND never
// gets here: readStatus makes it a *kickoffNotFound). Without a state,
// the status as answered (another status is polled on; none is a bad
// answer).
func runStatus(status, state string) string {
	if documentStatus(status) {
		return status
	}
	switch strings.ToUpper(strings.TrimSpace(state)) {
	case "":
		return status
	case "SUCCESS", "COMPLETED":
		return statusCompleted
	case "FAILED", "FAILURE", "ERROR":
		return statusError
	}
	return statusRunning
}

// documentStatus reports whether status is one of the document's.
func documentStatus(status string) bool {
	switch status {
	case statusRunning, statusCompleted, statusError:
		return true
	}
	return false
}

// statusOutput is GET /status/{kickoff_id}'s answer (one of
// ExecutionRunning, ExecutionCompleted, ExecutionError) with the kickoff
// id added; it is the output of the run and status capabilities.
type statusOutput struct {
	KickoffID string `json:"kickoff_id"`
	Status    string `json:"status"`
	// State is the state a deployed crew answered, as it answered it
	// (see runStatus).
	State         string          `json:"state,omitempty"`
	CurrentTask   string          `json:"current_task,omitempty"`
	Progress      *progress       `json:"progress,omitempty"`
	Result        *executionValue `json:"result,omitempty"`
	ExecutionTime *float64        `json:"execution_time,omitempty"`
	Error         string          `json:"error,omitempty"`
}

type progress struct {
	CompletedTasks *int64 `json:"completed_tasks,omitempty"`
	TotalTasks     *int64 `json:"total_tasks,omitempty"`
}

type executionValue struct {
	Output string       `json:"output"`
	Tasks  []taskResult `json:"tasks,omitempty"`
}

// UnmarshalJSON reads the document's result object, or the string a
// deployed crew answers as its result (the crew's output).
func (v *executionValue) UnmarshalJSON(raw []byte) error {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		*v = executionValue{Output: s}
		return nil
	}
	type plain executionValue
	return json.Unmarshal(raw, (*plain)(v))
}

type taskResult struct {
	TaskID        string   `json:"task_id,omitempty"`
	Output        string   `json:"output,omitempty"`
	Agent         string   `json:"agent,omitempty"`
	ExecutionTime *float64 `json:"execution_time,omitempty"`
}

// kickoffNotFound is a status read that found the kickoff id unknown to
// the crew. The document's answer is a 404 ("Kickoff ID not found", with
// its Error body {"error": "Execution not found", "message": "No
// execution found with ID: ..."}); deployed crews also answer a status
// object with the state NOT FOUND, a state the document does not list
// (Microsoft Semantic Kernel's client of this API,
// CrewAIEnterpriseKickoffState, stops waiting on it). Either way no later
// read can find the run.
type kickoffNotFound struct {
	crewID, kickoffID string
	// answer is what CrewAI AMP answered: "answered 404: <message>" or
	// "answered the state \"NOT FOUND\"".
	answer string
}

func (e *kickoffNotFound) Error() string {
	return fmt.Sprintf("crew %s does not know kickoff %s (crewai GET /status/%s %s): the kickoff may have expired, the crew's base_url or token may name another deployment than the one that accepted it, or the crew was redeployed since",
		e.crewID, e.kickoffID, e.kickoffID, e.answer)
}

// unknown is the outcome of a run whose kickoff is not found: CrewAI AMP
// accepted the kickoff, so the crew may have run (and acted) before its
// record was lost, and nothing can read whether it did: outcome_unknown,
// never failed (which would tell the caller nothing happened) and never
// a new kickoff (a second run).
func (e *kickoffNotFound) unknown() error {
	return fmt.Errorf("%w: %v; whether the crew ran before its record was lost cannot be read, and it was not kicked off again: check the crew's deployment on CrewAI AMP",
		hostsdk.ErrOutcomeUnknown, e)
}

// stateNotFound reports whether a deployed crew's state says the kickoff
// is unknown ("NOT FOUND", in any case, or spelled NOT_FOUND).
func stateNotFound(state string) bool {
	return strings.ReplaceAll(strings.ToUpper(strings.TrimSpace(state)), "_", " ") == "NOT FOUND"
}

// readStatus reads one status. An answer without a status is a bad
// response (a *provider.Error with the 2xx status); a kickoff id the crew
// does not know (a 404, or the state NOT FOUND) is a *kickoffNotFound.
func (c *Connector) readStatus(ctx context.Context, cr *crew, kickoffID string) (*statusOutput, error) {
	path := "/status/" + url.PathEscape(kickoffID)
	var st statusOutput
	if err := cr.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: path}, &st); err != nil {
		var pe *provider.Error
		if errors.As(err, &pe) && pe.Status == http.StatusNotFound {
			return nil, &kickoffNotFound{crewID: cr.id, kickoffID: kickoffID, answer: "answered 404: " + pe.Message}
		}
		return nil, err
	}
	if !documentStatus(st.Status) && stateNotFound(st.State) {
		return nil, &kickoffNotFound{crewID: cr.id, kickoffID: kickoffID,
			answer: fmt.Sprintf("answered the state %q", provider.Excerpt(cr.client.Redacted(st.State)))}
	}
	st.Status = runStatus(st.Status, st.State)
	if st.Status == "" {
		return nil, &provider.Error{Product: "crewai", Method: http.MethodGet, Path: path, Status: http.StatusOK,
			Message: "the status answer has neither a status nor a state"}
	}
	st.KickoffID = kickoffID
	return &st, nil
}

func (c *Connector) status(ctx context.Context, call *hostsdk.Call, cr *crew) (*aip.ActionResult, error) {
	var in struct {
		KickoffID string `json:"kickoff_id"`
	}
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	st, err := c.readStatus(ctx, cr, in.KickoffID)
	var nf *kickoffNotFound
	if errors.As(err, &nf) {
		return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(provider.CodeNotFound, aip.CategoryPermanent, false, 0,
				aip.TruncateUTF8(nf.Error(), aip.MaxErrorMessageBytes))}, nil
	}
	if err != nil {
		return provider.Result(call, err, false)
	}
	return call.Complete(st)
}

func (c *Connector) inputs(ctx context.Context, call *hostsdk.Call, cr *crew) (*aip.ActionResult, error) {
	names, err := readInputs(ctx, cr)
	if err != nil {
		return provider.Result(call, err, false)
	}
	return call.Complete(map[string]any{"inputs": names})
}

func readInputs(ctx context.Context, cr *crew) ([]string, error) {
	var out struct {
		Inputs []string `json:"inputs"`
	}
	if err := cr.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: "/inputs"}, &out); err != nil {
		return nil, err
	}
	if out.Inputs == nil {
		out.Inputs = []string{}
	}
	return out.Inputs, nil
}

// resumeRequest is POST /resume's body with its required fields; the
// webhook URLs are not sent, as none were sent at kickoff.
type resumeRequest struct {
	ExecutionID   string `json:"execution_id"`
	TaskID        string `json:"task_id"`
	HumanFeedback string `json:"human_feedback"`
	IsApprove     bool   `json:"is_approve"`
}

func (c *Connector) resume(ctx context.Context, call *hostsdk.Call, cr *crew) (*aip.ActionResult, error) {
	var in struct {
		KickoffID     string `json:"kickoff_id"`
		TaskID        string `json:"task_id"`
		HumanFeedback string `json:"human_feedback"`
		IsApprove     bool   `json:"is_approve"`
	}
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	var out struct {
		Status  string `json:"status"`
		Message string `json:"message,omitempty"`
	}
	err := cr.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: "/resume",
		JSON: resumeRequest{ExecutionID: in.KickoffID, TaskID: in.TaskID, HumanFeedback: in.HumanFeedback, IsApprove: in.IsApprove}}, &out)
	if err != nil {
		return provider.Result(call, err, true)
	}
	return call.Complete(map[string]any{"kickoff_id": in.KickoffID, "status": out.Status, "message": out.Message})
}

// healthCheckLimit is how many crews CheckHealth reads at once: the
// most crews one host serves (hostsdk.MaxCapabilities/CapabilitiesPerCrew,
// 128) in four rounds within the host's default 2 s probe.
const healthCheckLimit = 32

// CheckHealth implements hostsdk.HealthChecker: GET /inputs of every
// crew (a cheap authenticated read), healthCheckLimit at a time. The
// replica is ready while at least one crew passes: a crew that fails (a
// rotated token, a deleted deployment, no answer) is named in the
// hostsdk.Degraded the check returns (/ready shows it) and logged, and its
// actions fail without being sent (Handle) until a later check passes,
// rather than one crew's failure taking every crew of the replica
// offline.
func (c *Connector) CheckHealth(ctx context.Context) error {
	ids := make([]string, len(c.order))
	for i, cr := range c.order {
		ids[i] = cr.id
	}
	return c.health.Check(ctx, ids, healthCheckLimit, func(ctx context.Context, id string) error {
		_, err := readInputs(ctx, c.crews[id])
		return err
	})
}

// Reconcile implements hostsdk.Reconciler. A run a crash left running
// whose kickoff id was recorded is settled by one status read: completed
// or failed as CrewAI AMP reports; a kickoff id the crew does not know
// (a 404, or the state NOT FOUND) is outcome_unknown saying so, and is
// never kicked off again; still running, or unreadable, it is
// outcome_unknown (the message names the kickoff id to read later). A run
// without a recorded kickoff id, and an interrupted resume, are
// outcome_unknown: the request may have reached CrewAI AMP. An
// interrupted read (inputs, status) changed nothing and fails retryably.
func (c *Connector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	id := u.Action.ActionID
	cr, op, ok := c.parseCapability(u.Action.CapabilityID)
	switch {
	case ok && (op == opInputs || op == opStatus):
		return &aip.ActionResult{ActionID: id, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(CodeInterrupted, aip.CategoryTemporary, true, 0,
				"the replica restarted during this read; it changed nothing, send it again under a new action id")}, nil
	case ok && op == opResume:
		return nil, fmt.Errorf("%w: the replica restarted while POST /resume was in flight", hostsdk.ErrOutcomeUnknown)
	}
	// A run (or a capability of a crew no longer configured).
	var rec kickoffRecord
	if _, err := provider.LoadRecord(ctx, u.State, KickoffsNamespace, id, "the kickoff record", &rec); errors.Is(err, provider.ErrRecordUnreadable) {
		// Unreadable: the run's kickoff cannot be found again. Block
		// nothing (a recovery error would stop every restart).
		return nil, fmt.Errorf("%w: %v; the crew may have been started", hostsdk.ErrOutcomeUnknown, err)
	} else if err != nil {
		return nil, err
	}
	if rec.KickoffID == "" {
		return nil, fmt.Errorf("%w: the replica restarted before CrewAI AMP's kickoff answer was recorded; the crew may have been started", hostsdk.ErrOutcomeUnknown)
	}
	if !ok || cr.id != rec.CrewID {
		return nil, fmt.Errorf("%w: crew %s (kickoff %s) is no longer configured", hostsdk.ErrOutcomeUnknown, rec.CrewID, rec.KickoffID)
	}
	if !kickoffIDRegexp.MatchString(rec.KickoffID) {
		return nil, fmt.Errorf("%w: the kickoff record of %s holds kickoff_id %q, which is not a UUID; its status was not read", hostsdk.ErrOutcomeUnknown, id, provider.Excerpt(rec.KickoffID))
	}
	st, err := c.readStatus(ctx, cr, rec.KickoffID)
	var nf *kickoffNotFound
	if errors.As(err, &nf) {
		// As the wait would have: no later read can find the run,
		// and the crew is never kicked off again.
		return nil, nf.unknown()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: crew %s kickoff %s: status unreadable after a restart: %v", hostsdk.ErrOutcomeUnknown, cr.id, rec.KickoffID, err)
	}
	if res, done := settled(id, cr, st); done {
		return res, nil
	}
	return nil, fmt.Errorf("%w: crew %s kickoff %s is still %q after the restart; read it with %s%s:%s",
		hostsdk.ErrOutcomeUnknown, cr.id, rec.KickoffID, provider.Excerpt(cr.client.Redacted(st.Status)), CapabilityPrefix, cr.id, SuffixStatus)
}
