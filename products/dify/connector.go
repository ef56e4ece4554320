package dify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"sync"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// Identity of the connector.
const (
	AgentID = "agent:dify"
	Profile = "aip.connector.dify.v1"
	// TasksNamespace is the state namespace holding, per action ID, the
	// Dify task a running app invocation belongs to ({app_id, task_id,
	// user, workflow_run_id?, conversation_id?, message_id?}), so that a
	// cancel can stop it and Reconcile can read a workflow or chatflow
	// app's run after a restart.
	TasksNamespace = "aip.connector.dify.active_tasks.v1"
)

// AppCapability returns the ID of an app's capability: the invocation
// itself for suffix "", else the app-scoped operation.
func AppCapability(appID, suffix string) string {
	if suffix == "" {
		return "cap:dify:" + appID
	}
	return "cap:dify:" + appID + ":" + suffix
}

// KnowledgeCapability returns the ID of a knowledge base's capability.
func KnowledgeCapability(datasetID, suffix string) string {
	return "cap:dify:knowledge:" + datasetID + ":" + suffix
}

// RetrieveCapability returns the ID of a knowledge base's retrieval.
func RetrieveCapability(datasetID string) string {
	return KnowledgeCapability(datasetID, SuffixRetrieve)
}

// Connector is the Dify connector. It implements hostsdk.Connector,
// HealthChecker, Streamer, Canceler and Reconciler.
type Connector struct {
	cfg          Config
	base         *url.URL
	apps         map[string]*app
	appOrder     []string
	datasets     map[string]*dataset
	datasetOrder []string
	caps         map[string]target
	// appHealth and datasetHealth are each app's and knowledge base's
	// last health check: one that failed it (its key revoked) has its
	// actions refused without being sent, and the others are served.
	appHealth, datasetHealth *provider.Targets
	// tasks holds the Dify task of each running invocation (action ID →
	// taskRef) from the first event on, before and besides its state
	// record, so a cancel finds it even while the record is being written.
	tasks sync.Map
}

var (
	_ hostsdk.Connector     = (*Connector)(nil)
	_ hostsdk.HealthChecker = (*Connector)(nil)
	_ hostsdk.Streamer      = (*Connector)(nil)
	_ hostsdk.Canceler      = (*Connector)(nil)
	_ hostsdk.Reconciler    = (*Connector)(nil)
)

func (c *Connector) capabilityCount() int {
	n := len(c.datasets) * knowledgeCapabilities
	for _, a := range c.apps {
		n += a.Mode.capabilities()
	}
	return n
}

// target is what a capability ID resolves to: an app invocation, a
// knowledge retrieval, or a table operation (op) of an app or knowledge
// base.
type target struct {
	invoke, retrieve bool
	op               *operation
	app              *app
	dataset          *dataset
}

func (c *Connector) resolve(capID string) (target, bool) {
	t, ok := c.caps[capID]
	return t, ok
}

// index fills caps from the configured apps and knowledge bases.
func (c *Connector) index() {
	c.caps = map[string]target{}
	for _, id := range c.appOrder {
		a := c.apps[id]
		c.caps[AppCapability(id, "")] = target{invoke: true, app: a}
		for _, o := range a.Mode.operations() {
			c.caps[AppCapability(id, o.suffix)] = target{op: o, app: a}
		}
	}
	for _, id := range c.datasetOrder {
		d := c.datasets[id]
		c.caps[RetrieveCapability(id)] = target{retrieve: true, dataset: d}
		for i := range knowledgeOperations {
			c.caps[KnowledgeCapability(id, knowledgeOperations[i].suffix)] = target{op: &knowledgeOperations[i], dataset: d}
		}
	}
}

// Handle implements hostsdk.Connector.
func (c *Connector) Handle(ctx context.Context, call *hostsdk.Call) (*aip.ActionResult, error) {
	return c.handle(ctx, call, nil)
}

// HandleStream implements hostsdk.Streamer: an app invocation forwards
// the answer (or workflow text) chunks as they arrive, a knowledge
// pipeline's datasource node run and pipeline run their progress and
// results; other capabilities answer as Handle does.
func (c *Connector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	return c.handle(ctx, call, chunks)
}

func (c *Connector) handle(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	t, ok := c.resolve(call.Action.CapabilityID)
	if !ok {
		return nil, aip.NewProtocolError("dify.capability_unknown", aip.CategoryPermanent, false, 0,
			"capability "+call.Action.CapabilityID+" is not configured on this connector")
	}
	if res, refused := c.refusal(call, t); refused {
		return res, nil
	}
	switch {
	case t.invoke:
		return c.invoke(ctx, call, t.app, chunks)
	case t.op != nil && t.app != nil:
		return c.call(ctx, call, t.op, t.app.client, "", chunks)
	case t.op != nil:
		// Every knowledge base operation, the pipeline's file upload
		// (whose path names no dataset) included, goes with the knowledge
		// base's own key.
		return c.call(ctx, call, t.op, t.dataset.client, t.dataset.ID, chunks)
	case t.retrieve:
		var in struct {
			Query          string `json:"query"`
			RetrievalModel *struct {
				SearchMethod    string   `json:"search_method"`
				TopK            int      `json:"top_k"`
				ScoreThreshold  *float64 `json:"score_threshold"`
				RerankingEnable bool     `json:"reranking_enable"`
				RerankingModel  *struct {
					Provider string `json:"reranking_provider_name"`
					Model    string `json:"reranking_model_name"`
				} `json:"reranking_model"`
			} `json:"retrieval_model"`
		}
		if err := decodeInput(call, &in); err != nil {
			return nil, err
		}
		body := map[string]any{"query": in.Query}
		if rm := in.RetrievalModel; rm != nil {
			m := map[string]any{"search_method": rm.SearchMethod, "reranking_enable": rm.RerankingEnable,
				"top_k": rm.TopK, "score_threshold_enabled": rm.ScoreThreshold != nil}
			if rm.ScoreThreshold != nil {
				m["score_threshold"] = *rm.ScoreThreshold
			}
			if rm.RerankingEnable {
				// The document's RetrievalModel requires reranking_mode
				// with reranking_enable; the input schema requires the
				// model it names.
				if rm.RerankingModel == nil {
					return nil, inputError(call, "retrieval_model.reranking_enable true needs reranking_model")
				}
				m["reranking_mode"] = "reranking_model"
				m["reranking_model"] = map[string]string{"reranking_provider_name": rm.RerankingModel.Provider,
					"reranking_model_name": rm.RerankingModel.Model}
			}
			body["retrieval_model"] = m
		}
		// A retrieval changes nothing: a failure is a failed read.
		return c.read(ctx, call, t.dataset.client, provider.Request{Method: http.MethodPost,
			Path: "/datasets/" + escape(t.dataset.ID) + "/retrieve", JSON: body})
	}
	return nil, fmt.Errorf("dify: capability %s has no handler", call.Action.CapabilityID)
}

// read runs a call without side effects and returns the provider's JSON
// object as the output.
func (c *Connector) read(ctx context.Context, call *hostsdk.Call, cl *provider.Client, req provider.Request) (*aip.ActionResult, error) {
	resp, err := cl.Do(ctx, req)
	if err != nil {
		return provider.Result(call, err, false)
	}
	return completeJSON(call, req, resp, false)
}

// completeJSON returns the answer's JSON object as the output. An answer
// that is not one is a provider.bad_response failure for a read, and
// outcome_unknown for a mutation (its 2xx says it was applied, but not
// what came of it), as provider.Client.JSON decides.
func completeJSON(call *hostsdk.Call, req provider.Request, resp *provider.Response, mutation bool) (*aip.ActionResult, error) {
	var obj map[string]json.RawMessage
	if err := resp.Decode(&obj); err != nil || obj == nil {
		if err == nil {
			err = errors.New("provider answered null instead of a JSON object")
		}
		return provider.Result(call, &provider.Error{Product: "dify", Method: req.Method, Path: req.Path,
			Status: resp.Status, Message: err.Error(), MayHaveApplied: true, Err: err}, mutation)
	}
	return call.Complete(obj)
}

// completeArray returns the answer's JSON array as the output member
// name, and fails as completeJSON does when the answer is not an array.
func completeArray(call *hostsdk.Call, req provider.Request, resp *provider.Response, name string, mutation bool) (*aip.ActionResult, error) {
	var list []json.RawMessage
	if err := resp.Decode(&list); err != nil || list == nil {
		if err == nil {
			err = errors.New("provider answered null instead of a JSON array")
		}
		return provider.Result(call, &provider.Error{Product: "dify", Method: req.Method, Path: req.Path,
			Status: resp.Status, Message: err.Error(), MayHaveApplied: true, Err: err}, mutation)
	}
	return call.Complete(map[string]any{name: list})
}

// decodeInput decodes an action's input (the host validated it against the
// input schema already) and refuses unknown fields. Integers spelled as
// other numbers (3.0, 3e0), which the schema's "integer" accepts, are read
// as the integers they are (provider.IntegralNumbers).
func decodeInput(call *hostsdk.Call, v any) error {
	if err := provider.DecodeStrict(provider.IntegralNumbers(call.Action.Input), v); err != nil {
		return aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
			"input of "+call.Action.CapabilityID+": "+err.Error())
	}
	return nil
}

// healthCheckLimit is how many of one kind of key (apps, knowledge bases)
// CheckHealth checks at once against the one Dify server.
const healthCheckLimit = 16

// CheckHealth implements hostsdk.HealthChecker with the cheapest
// authenticated read for every key: each app's info (GET /info) and each
// knowledge base's first dataset (GET /datasets?page=1&limit=1). The
// replica is ready while at least one app or knowledge base passes: one
// whose key was revoked is named in the hostsdk.Degraded the check
// returns (provider.AnyReady; /ready shows it) and logged, and its
// actions fail without being sent (refusal) until a later check passes,
// rather than one key taking every app of the replica offline.
func (c *Connector) CheckHealth(ctx context.Context) error {
	var appErr, datasetErr error
	var wg sync.WaitGroup
	if len(c.appOrder) > 0 {
		wg.Go(func() {
			appErr = c.appHealth.Check(ctx, c.appOrder, healthCheckLimit, func(ctx context.Context, id string) error {
				_, err := c.apps[id].client.Do(ctx, provider.Request{Method: http.MethodGet, Path: "/info"})
				return err
			})
		})
	}
	if len(c.datasetOrder) > 0 {
		wg.Go(func() {
			datasetErr = c.datasetHealth.Check(ctx, c.datasetOrder, healthCheckLimit, func(ctx context.Context, id string) error {
				_, err := c.datasets[id].client.Do(ctx, provider.Request{Method: http.MethodGet, Path: "/datasets",
					Query: url.Values{"page": {"1"}, "limit": {"1"}}})
				return err
			})
		})
	}
	wg.Wait()
	switch {
	case len(c.appOrder) == 0:
		return datasetErr
	case len(c.datasetOrder) == 0:
		return appErr
	}
	return provider.AnyReady(appErr, datasetErr)
}

// refusal is the failed result of an action whose app or knowledge base
// failed its last health check: it is not sent.
func (c *Connector) refusal(call *hostsdk.Call, t target) (*aip.ActionResult, bool) {
	if t.app != nil {
		return c.appHealth.Refusal(call.Action.ID, t.app.ID)
	}
	if t.dataset != nil {
		return c.datasetHealth.Refusal(call.Action.ID, t.dataset.ID)
	}
	return nil, false
}

// taskRef is the state record of a running invocation.
type taskRef struct {
	AppID  string `json:"app_id"`
	TaskID string `json:"task_id"`
	User   string `json:"user"`
	// WorkflowRunID is the run of a workflow or chatflow app, once its
	// stream named it (Reconcile reads the run by it).
	WorkflowRunID string `json:"workflow_run_id,omitempty"`
	// ConversationID and MessageID are a chatflow's conversation and
	// message, once its stream named them (Reconcile reads the message's
	// answer by them).
	ConversationID string `json:"conversation_id,omitempty"`
	MessageID      string `json:"message_id,omitempty"`
}

// Cancel implements hostsdk.Canceler: it stops the Dify task of a running
// invocation with the matching stop endpoint, as the same end user. An
// invocation whose first event has not arrived yet has no task to stop.
func (c *Connector) Cancel(ctx context.Context, call *hostsdk.Call, reason string) error {
	t, ok := c.resolve(call.Action.CapabilityID)
	if !ok || !t.invoke {
		return nil
	}
	var ref taskRef
	if v, ok := c.tasks.Load(call.Action.ID); ok {
		ref = v.(taskRef)
	} else {
		found, err := provider.LoadRecord(ctx, call.State(), TasksNamespace, call.Action.ID, "the task record", &ref)
		if err != nil {
			return fmt.Errorf("dify: %w", err)
		}
		if !found {
			call.Logger.Info("dify: cancel before the app's task was known; nothing to stop", "app_id", t.app.ID)
			return nil
		}
	}
	a, ok := c.apps[ref.AppID]
	if !ok || ref.TaskID == "" {
		return fmt.Errorf("dify: task record of %s names app %q, which is not configured", call.Action.ID, ref.AppID)
	}
	if !validTaskID(ref.TaskID) {
		return fmt.Errorf("dify: task record of %s holds task_id %q, which is not a UUID; nothing was sent to stop it", call.Action.ID, provider.Excerpt(ref.TaskID))
	}
	if err := c.stop(ctx, a, ref.TaskID, ref.User); err != nil {
		return err
	}
	call.Logger.Info("dify: task stopped", "app_id", a.ID, "task_id", ref.TaskID, "reason", reason)
	return nil
}

// stop asks Dify to stop app a's task taskID (a UUID), as end user user,
// with the app mode's stop endpoint.
func (c *Connector) stop(ctx context.Context, a *app, taskID, user string) error {
	req := provider.Request{Method: http.MethodPost, Path: stopPath(a.Mode, taskID), JSON: map[string]string{"user": user}}
	_, err := a.client.Do(ctx, req)
	return err
}

func invokePath(m Mode) string {
	switch {
	case m.chat():
		return "/chat-messages"
	case m == ModeCompletion:
		return "/completion-messages"
	}
	return "/workflows/run"
}

// taskIDRegexp is a Dify task ID: a UUID (the API document's "format:
// uuid" for task_id). Only such an ID is put into a stop path.
var taskIDRegexp = regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

func validTaskID(id string) bool { return taskIDRegexp.MatchString(id) }

func stopPath(m Mode, taskID string) string {
	switch {
	case m.chat():
		return "/chat-messages/" + escape(taskID) + "/stop"
	case m == ModeCompletion:
		return "/completion-messages/" + escape(taskID) + "/stop"
	}
	return "/workflows/tasks/" + escape(taskID) + "/stop"
}

// ReconcileReadTimeout bounds Reconcile's reads of a run (the workflow
// run, and a chatflow's message): recovery runs before the host
// registers, so a Dify that does not answer must not hold the start.
const ReconcileReadTimeout = 30 * time.Second

// Bounds of Reconcile's search for a chatflow's message in its
// conversation (GET /messages, newest first, paged back with first_id).
const (
	reconcileMessagesLimit = 100
	reconcileMessagePages  = 10
)

// workflowRunDetail is GET /workflows/run/{workflow_run_id}'s answer (the
// document's WorkflowRunDetailResponse), the members Reconcile reads.
type workflowRunDetail struct {
	ID          string          `json:"id"`
	Status      string          `json:"status"`
	Outputs     json.RawMessage `json:"outputs"`
	Error       *string         `json:"error"`
	ElapsedTime *float64        `json:"elapsed_time"`
	TotalTokens *int64          `json:"total_tokens"`
	TotalSteps  *int64          `json:"total_steps"`
}

// conversationMessage is one message of GET /messages's answer (the
// document's ConversationMessageItem), the members Reconcile reads.
type conversationMessage struct {
	ID           string            `json:"id"`
	Answer       string            `json:"answer"`
	Status       string            `json:"status"`
	Error        *string           `json:"error"`
	MessageFiles []json.RawMessage `json:"message_files"`
	CreatedAt    int64             `json:"created_at"`
}

// Reconcile implements hostsdk.Reconciler. A workflow or chatflow app's
// invocation a restart interrupted, whose run the stream had named, is
// settled by one read of the run (GET /workflows/run/{workflow_run_id}):
// failed or stopped, it fails as a stream's workflow_finished would
// (dify.workflow_failed, dify.workflow_stopped); succeeded or
// partial-succeeded, a workflow app's completes with the run's status,
// outputs and figures (the text chunks streamed before the restart are
// not kept), and a chatflow's with the answer of its message too, read
// from its conversation (GET /messages; chatflowMessage). A run still
// running or paused, a run that cannot be read, a chatflow whose message
// cannot be read, an invocation of another app mode or one whose run (or
// chatflow message) was never named is outcome_unknown, naming the run
// and the capability that reads it when known; so is every other
// mutation. Nothing is sent again. An interrupted read fails
// connector_host.interrupted (the host's rule for a read no Reconciler
// settled).
func (c *Connector) Reconcile(ctx context.Context, u *hostsdk.UncertainAction) (*aip.ActionResult, error) {
	id := u.Action.ActionID
	t, ok := c.resolve(u.Action.CapabilityID)
	if !ok || !t.invoke {
		return nil, fmt.Errorf("%w: the replica restarted while %s was in flight", hostsdk.ErrOutcomeUnknown, u.Action.CapabilityID)
	}
	var ref taskRef
	if _, err := provider.LoadRecord(ctx, u.State, TasksNamespace, id, "the task record", &ref); errors.Is(err, provider.ErrRecordUnreadable) {
		return nil, fmt.Errorf("%w: %v; the app may have run", hostsdk.ErrOutcomeUnknown, err)
	} else if err != nil {
		return nil, fmt.Errorf("dify: %w", err)
	}
	a := t.app
	chatflow := a.Mode == ModeAdvancedChat
	followable := ref.AppID == a.ID && ref.WorkflowRunID != "" &&
		(a.Mode == ModeWorkflow || chatflow && ref.ConversationID != "" && ref.MessageID != "")
	if !followable {
		what := "before Dify's stream named the app's task"
		if ref.TaskID != "" {
			what = "while Dify ran it as task " + ref.TaskID
		}
		if ref.WorkflowRunID != "" && ref.AppID == a.ID {
			what += fmt.Sprintf(" (workflow run %s; read it with %s)", ref.WorkflowRunID, AppCapability(a.ID, SuffixWorkflowRun))
		}
		return nil, fmt.Errorf("%w: the replica restarted %s; the app may have run", hostsdk.ErrOutcomeUnknown, what)
	}
	for _, v := range []struct{ name, id string }{{"workflow_run_id", ref.WorkflowRunID},
		{"conversation_id", ref.ConversationID}, {"message_id", ref.MessageID}} {
		if v.id != "" && !validTaskID(v.id) {
			return nil, fmt.Errorf("%w: the task record of %s holds %s %q, which is not a UUID; the run was not read",
				hostsdk.ErrOutcomeUnknown, id, v.name, provider.Excerpt(v.id))
		}
	}
	path := "/workflows/run/" + escape(ref.WorkflowRunID)
	readCap := AppCapability(a.ID, SuffixWorkflowRun)
	rctx, cancel := context.WithTimeout(ctx, ReconcileReadTimeout)
	defer cancel()
	var d workflowRunDetail
	if err := a.client.JSON(rctx, provider.Request{Method: http.MethodGet, Path: path}, &d); err != nil {
		return nil, fmt.Errorf("%w: the replica restarted while workflow run %s ran, and reading it failed (read it with %s): %v",
			hostsdk.ErrOutcomeUnknown, ref.WorkflowRunID, readCap, err)
	}
	wd := &workflowData{ID: ref.WorkflowRunID, Status: d.Status, Outputs: d.Outputs, Error: d.Error,
		ElapsedTime: d.ElapsedTime, TotalTokens: d.TotalTokens, TotalSteps: d.TotalSteps}
	if res := finishedFailure(a.client, id, invokePath(a.Mode), "workflow", wd); res != nil {
		return res, nil
	}
	switch d.Status {
	case "succeeded", "partial-succeeded":
	default:
		return nil, fmt.Errorf("%w: workflow run %s is %q after the restart (read it with %s)",
			hostsdk.ErrOutcomeUnknown, ref.WorkflowRunID, provider.Excerpt(a.client.Redacted(d.Status)), readCap)
	}
	out := InvokeOutput{Mode: a.Mode, TaskID: ref.TaskID, WorkflowRun: WorkflowRun{WorkflowRunID: ref.WorkflowRunID}}
	out.finish(wd)
	if chatflow {
		m, err := c.chatflowMessage(rctx, a, ref)
		if err != nil {
			return nil, fmt.Errorf("%w: the replica restarted while chatflow run %s ran; the run ended %s, but its answer, message %s of conversation %s, could not be read (read it with %s): %v",
				hostsdk.ErrOutcomeUnknown, ref.WorkflowRunID, d.Status, ref.MessageID, ref.ConversationID, AppCapability(a.ID, SuffixMessages), err)
		}
		answer := m.Answer
		out.Answer, out.ConversationID, out.MessageID = &answer, ref.ConversationID, ref.MessageID
		// The files the answer carries (the stream's message_file
		// events); the user's own attachments are not the app's output.
		for _, f := range m.MessageFiles {
			var file struct {
				BelongsTo *string `json:"belongs_to"`
			}
			if json.Unmarshal(f, &file) == nil && (file.BelongsTo == nil || *file.BelongsTo != "user") {
				out.Files = append(out.Files, f)
			}
		}
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("dify: marshal the output of %s: %w", id, err)
	}
	return &aip.ActionResult{ActionID: id, Status: aip.ResultCompleted, Output: raw}, nil
}

// chatflowMessage finds a chatflow invocation's message in its
// conversation, as the invocation's user: GET /messages?conversation_id=
// &user=&limit=100, then older pages (first_id: the oldest message of the
// page, whichever order Dify lists them in), at most reconcileMessagePages
// pages. It fails when the message is not found, or says it failed
// (status "error") though its run succeeded.
func (c *Connector) chatflowMessage(ctx context.Context, a *app, ref taskRef) (*conversationMessage, error) {
	firstID := ""
	for range reconcileMessagePages {
		q := url.Values{"conversation_id": {ref.ConversationID}, "user": {ref.User}, "limit": {fmt.Sprint(reconcileMessagesLimit)}}
		if firstID != "" {
			q.Set("first_id", firstID)
		}
		var page struct {
			HasMore bool                  `json:"has_more"`
			Data    []conversationMessage `json:"data"`
		}
		if err := a.client.JSON(ctx, provider.Request{Method: http.MethodGet, Path: "/messages", Query: q}, &page); err != nil {
			return nil, err
		}
		oldest := -1
		for i := range page.Data {
			m := &page.Data[i]
			if m.ID == ref.MessageID {
				if m.Status == "error" {
					why := ""
					if m.Error != nil {
						why = ": " + provider.Excerpt(a.client.Redacted(*m.Error))
					}
					return nil, fmt.Errorf("the message has status error, though its run did not fail%s", why)
				}
				return m, nil
			}
			if oldest < 0 || m.CreatedAt <= page.Data[oldest].CreatedAt {
				oldest = i
			}
		}
		if !page.HasMore || oldest < 0 || page.Data[oldest].ID == firstID || page.Data[oldest].ID == "" {
			return nil, errors.New("the conversation does not hold the message")
		}
		firstID = page.Data[oldest].ID
	}
	return nil, fmt.Errorf("the message is not among the conversation's newest %d", reconcileMessagePages*reconcileMessagesLimit)
}
