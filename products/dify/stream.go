package dify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// MaxEventBytes bounds one server-sent event (its lines together).
const MaxEventBytes = 1 << 20

// Failure codes of invocations that Dify reported as failed in the stream.
const (
	CodeWorkflowFailed  = "dify.workflow_failed"
	CodeWorkflowStopped = "dify.workflow_stopped"
)

// invokeInput is the input of cap:dify:<app_id>.
type invokeInput struct {
	Inputs         map[string]json.RawMessage `json:"inputs"`
	Query          *string                    `json:"query"`
	ConversationID string                     `json:"conversation_id"`
	User           string                     `json:"user"`
	Files          []json.RawMessage          `json:"files"`
}

// InvokeOutput is the output of an app invocation. Chat and completion
// apps fill Answer, MessageID (and ConversationID for chat apps) and
// Metadata; workflow apps fill WorkflowRunID, Status, Outputs, Text and
// the run's figures; advanced-chat (chatflow) apps fill both sets.
type InvokeOutput struct {
	Mode           Mode              `json:"mode"`
	TaskID         string            `json:"task_id,omitempty"`
	Answer         *string           `json:"answer,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	MessageID      string            `json:"message_id,omitempty"`
	Metadata       json.RawMessage   `json:"metadata,omitempty"`
	Files          []json.RawMessage `json:"files,omitempty"`
	// WorkflowRun's Status is succeeded, partial-succeeded or paused (the
	// run waits for a human input form; see Paused).
	WorkflowRun
	Text   *string         `json:"text,omitempty"`
	Paused json.RawMessage `json:"paused,omitempty"`
}

// WorkflowRun is what a workflow_finished event says of a run: the
// members an app invocation's and a pipeline run's outputs share.
type WorkflowRun struct {
	WorkflowRunID string          `json:"workflow_run_id,omitempty"`
	Status        string          `json:"status,omitempty"`
	Outputs       json.RawMessage `json:"outputs,omitempty"`
	ElapsedTime   *float64        `json:"elapsed_time,omitempty"`
	TotalTokens   *int64          `json:"total_tokens,omitempty"`
	TotalSteps    *int64          `json:"total_steps,omitempty"`
}

// finish records the run's workflow_finished data d (its run ID only when
// no earlier event named one).
func (w *WorkflowRun) finish(d *workflowData) {
	w.Status = d.Status
	if len(d.Outputs) > 0 && string(d.Outputs) != "null" {
		w.Outputs = d.Outputs
	}
	w.ElapsedTime, w.TotalTokens, w.TotalSteps = d.ElapsedTime, d.TotalTokens, d.TotalSteps
	if w.WorkflowRunID == "" {
		w.WorkflowRunID = d.ID
	}
}

// event is one Dify stream event, with the fields this adapter reads.
type event struct {
	Event          string          `json:"event"`
	TaskID         string          `json:"task_id"`
	ID             string          `json:"id"`
	MessageID      string          `json:"message_id"`
	ConversationID string          `json:"conversation_id"`
	WorkflowRunID  string          `json:"workflow_run_id"`
	Answer         string          `json:"answer"`
	Metadata       json.RawMessage `json:"metadata"`
	Files          json.RawMessage `json:"files"`
	Data           json.RawMessage `json:"data"`
	// error events
	Status  json.RawMessage `json:"status"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
	// message_file events
	Type      string `json:"type"`
	BelongsTo string `json:"belongs_to"`
	URL       string `json:"url"`
	// agent_thought events
	Thought     string `json:"thought"`
	Tool        string `json:"tool"`
	ToolInput   string `json:"tool_input"`
	Observation string `json:"observation"`
}

// workflowData is the data of workflow_started, workflow_finished and
// workflow_paused events.
type workflowData struct {
	ID          string          `json:"id"`
	RunID       string          `json:"workflow_run_id"`
	Status      string          `json:"status"`
	Outputs     json.RawMessage `json:"outputs"`
	Error       *string         `json:"error"`
	ElapsedTime *float64        `json:"elapsed_time"`
	TotalTokens *int64          `json:"total_tokens"`
	TotalSteps  *int64          `json:"total_steps"`
	Text        string          `json:"text"`
	NodeID      string          `json:"node_id"`
	NodeType    string          `json:"node_type"`
	Title       string          `json:"title"`
}

// invoke runs an app in streaming mode and aggregates its events.
func (c *Connector) invoke(ctx context.Context, call *hostsdk.Call, a *app, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	var in invokeInput
	if err := decodeInput(call, &in); err != nil {
		return nil, err
	}
	if err := refuseNestedNUL(call, "app", in.Inputs, "files", in.Files); err != nil {
		return nil, err
	}
	body := map[string]any{"response_mode": "streaming", "user": in.User}
	if in.Inputs != nil {
		body["inputs"] = in.Inputs
	} else {
		body["inputs"] = map[string]any{}
	}
	if in.Query != nil {
		body["query"] = *in.Query
	}
	if a.Mode.chat() && in.ConversationID != "" {
		body["conversation_id"] = in.ConversationID
	}
	if len(in.Files) > 0 {
		body["files"] = in.Files
	}
	path := invokePath(a.Mode)
	// The memory entry goes with the action; the state record stays, so a
	// cancel racing the action's end still finds the task.
	defer c.tasks.Delete(call.Action.ID)
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("dify: encode the request of %s: %w", call.Action.CapabilityID, err)
	}
	sent := time.Now()
	st, err := a.client.Stream(ctx, provider.Request{Method: http.MethodPost, Path: path,
		Body: raw, ContentType: "application/json"}, c.cfg.StreamIdleTimeout)
	if err != nil {
		return provider.Result(call, err, true)
	}
	defer st.Close()

	r := &run{c: c, call: call, app: a, user: in.User, inputConversation: in.ConversationID, chunks: chunks,
		out: InvokeOutput{Mode: a.Mode}}
	events := provider.NewEventReader(st, MaxEventBytes, c.cfg.MaxResponseBytes)
	quiet := quietSpell{since: sent}
	var readErr error
	for !r.closed {
		var ev event
		if readErr = nextEvent(events, &ev); readErr != nil {
			break
		}
		quiet.observe(ev.Event, events)
		if ev.TaskID != "" && r.out.TaskID == "" && !validTaskID(ev.TaskID) {
			if ev.Event != "error" {
				// The app runs (Dify answered its stream) under a task ID
				// that cannot be put into the stop path: outcome_unknown,
				// as for any stream that cannot be followed to its end; a
				// cancel could not stop the task.
				readErr = fmt.Errorf("the stream names task_id %q, which is not a UUID (the format of Dify's API document); the app may be running and cannot be stopped through this connector", provider.Excerpt(r.app.client.Redacted(ev.TaskID)))
				break
			}
			// An error event is classified on its own; its task is not
			// kept.
			ev.TaskID = ""
		}
		r.apply(ctx, &ev)
	}
	if res, ok := r.result(); ok {
		return res, nil
	}
	if r.failure != nil {
		status, msg := r.failureDetail()
		readErr = fmt.Errorf("error event (status %d): %s", status, msg)
	}
	if r.badFinish != nil {
		readErr = r.badFinish
	}
	// The stream ended before its closing event: the app ran, or runs
	// still, and how it ended is not known.
	quiet.end(events)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("%w: dify POST %s: %s", hostsdk.ErrOutcomeUnknown, path, r.interrupted(ctx, sent, quiet))
	}
	r.logQuiet(quiet, readErr)
	msg := streamEndError(readErr).Error()
	if r.out.TaskID != "" {
		msg += "; " + r.running()
	}
	if hint := r.readHint(); hint != "" {
		msg += "; " + hint
	}
	return nil, fmt.Errorf("%w: dify POST %s: %s", hostsdk.ErrOutcomeUnknown, path, msg)
}

// TimeoutStopLimit bounds the stop the connector sends for the task of an
// invocation whose action timed out: the host waits for Handle to return
// only hostsdk.Config.HandleGrace (10 s by default) after the timeout.
const TimeoutStopLimit = 5 * time.Second

// quietSpell is the end of a run's stream (an app invocation's, a
// knowledge pipeline run's, a datasource node run's) after its last
// event: when that event came (or the request was sent, when none did),
// its name, and how many keep-alives (Dify's "event: ping", every 10
// seconds while the run is at work and sends nothing else) came after it.
// Start it as quietSpell{since: sent}, call observe after each event and
// end when the stream ended.
type quietSpell struct {
	since      time.Time
	lastEvent  string
	keepAlives int64
}

// observe records the event name just read from events.
func (q *quietSpell) observe(name string, events *provider.EventReader) {
	*q = quietSpell{since: time.Now(), lastEvent: name, keepAlives: events.KeepAlives()}
}

// end counts the keep-alives events skipped after the last event.
func (q *quietSpell) end(events *provider.EventReader) {
	q.keepAlives = events.KeepAlives() - q.keepAlives
}

// log logs, at warn, a stream (whose: "the app's", "the pipeline's")
// that ended (err) after only keep-alives since its last event, with
// attrs naming the run: an operator sees how long it seemed stuck.
func (q quietSpell) log(logger *slog.Logger, whose string, err error, attrs ...any) {
	if q.keepAlives == 0 {
		return
	}
	logger.Warn("dify: "+whose+" event stream sent only keep-alive pings before it ended without its closing event",
		append(attrs, "pinged_for", roundDuration(time.Since(q.since)).String(), "pings", q.keepAlives, "last_event", q.lastEvent, "error", err)...)
}

// interruption says what ended ctx (the action's timeout, a cancel, the
// host's shutdown) and how long after what (a run's request: "the
// invocation", "the pipeline run") was sent.
func interruption(ctx context.Context, what string, sent time.Time) string {
	cause := context.Cause(ctx)
	var ended string
	switch {
	case errors.Is(cause, hostsdk.ErrActionTimeout):
		ended = "the action's timeout passed"
	case errors.Is(cause, hostsdk.ErrActionCancelled):
		ended = "the action was cancelled"
	case errors.Is(cause, hostsdk.ErrHostStopping):
		ended = "the host is shutting down"
	default:
		ended = fmt.Sprintf("the action was interrupted (%v)", cause)
	}
	return fmt.Sprintf("%s %s after %s was sent", ended, roundDuration(time.Since(sent)), what)
}

// String says how the stream stayed quiet, "" when no keep-alive came
// after its last event.
func (q quietSpell) String() string {
	if q.keepAlives == 0 {
		return ""
	}
	after := "and no event at all"
	if q.lastEvent != "" {
		after = "since its last event (" + provider.Excerpt(q.lastEvent) + ")"
	}
	return fmt.Sprintf("Dify's stream had sent only keep-alive pings (%d) for %s, %s", q.keepAlives, roundDuration(time.Since(q.since)), after)
}

// logQuiet logs a stream that ended (err) after only keep-alives since its
// last event.
func (r *run) logQuiet(q quietSpell, err error) {
	q.log(r.call.Logger, "the app's", err, "app_id", r.app.ID, "task_id", r.out.TaskID)
}

// interrupted is the outcome_unknown message of an invocation whose
// action's context ended (its timeout, a cancel, the host's shutdown)
// before the stream's closing event, sent is when the request was sent
// and q the stream's end. At the action's timeout, the connector stops
// the app's task itself (the host calls the Canceler only for a cancel):
// the caller gave up on the action, and nothing else could stop the task
// once the action ended. The message names the task and says how to read
// what the app did; without a task (a stream that sent only pings) there
// was nothing to stop, and it says where to look for the app's run.
func (r *run) interrupted(ctx context.Context, sent time.Time, q quietSpell) string {
	cause := context.Cause(ctx)
	taskID := r.out.TaskID
	parts := []string{interruption(ctx, "the invocation", sent)}
	if quiet := q.String(); quiet != "" {
		parts = append(parts, quiet)
	}
	r.logQuiet(q, cause)
	if taskID == "" {
		parts = append(parts, "the stream never named the app's task, so nothing could be stopped: Dify accepted the invocation, and the app may be running")
	} else {
		parts = append(parts, r.running())
		stopped := "Dify stops a task at its next step: the app may have completed or partly done the work first"
		switch {
		case errors.Is(cause, hostsdk.ErrActionTimeout):
			if msg, ok := r.stopAtTimeout(ctx); ok {
				parts = append(parts, msg, stopped)
			} else {
				parts = append(parts, msg, "the app may have completed, partly done the work or be running still")
			}
		case errors.Is(cause, hostsdk.ErrActionCancelled):
			parts = append(parts, "the cancel asks Dify to stop the task", stopped)
		default:
			parts = append(parts, "no stop was sent: the app may have completed, partly done the work or be running still")
		}
	}
	if hint := r.readHint(); hint != "" {
		parts = append(parts, hint)
	}
	return strings.Join(parts, "; ")
}

// running names the invocation's task (and workflow run), once its stream
// named it.
func (r *run) running() string {
	running := "the app runs as Dify task " + r.out.TaskID
	if r.out.WorkflowRunID != "" {
		running += " (workflow run " + r.out.WorkflowRunID + ")"
	}
	return running
}

// stopAtTimeout stops the invocation's task (its action timed out),
// within TimeoutStopLimit, and says how that went: false when the stop
// failed.
func (r *run) stopAtTimeout(ctx context.Context) (string, bool) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), TimeoutStopLimit)
	defer cancel()
	taskID, path := r.out.TaskID, stopPath(r.app.Mode, r.out.TaskID)
	if err := r.c.stop(sctx, r.app, taskID, r.user); err != nil {
		r.call.Logger.Warn("dify: the task of a timed-out invocation was not stopped", "app_id", r.app.ID, "task_id", taskID, "error", err)
		return fmt.Sprintf("the connector could not stop the task (%v): stop it with POST %s and {\"user\": %q} (the app's key)", err, path, r.user), false
	}
	r.call.Logger.Info("dify: task stopped at the action's timeout", "app_id", r.app.ID, "task_id", taskID)
	return "the connector asked Dify to stop the task (POST " + path + ")", true
}

// readHint says which capability reads what the invocation did, "" when
// none does (a completion app: its logs in Dify's console).
func (r *run) readHint() string {
	a := r.app
	conv := r.out.ConversationID
	if conv == "" {
		conv = r.inputConversation
	}
	var hints []string
	if r.out.WorkflowRunID != "" {
		hints = append(hints, fmt.Sprintf("read the run with %s (workflow_run_id %s)", AppCapability(a.ID, SuffixWorkflowRun), r.out.WorkflowRunID))
	}
	switch {
	case a.Mode.chat() && conv != "":
		hints = append(hints, fmt.Sprintf("read the conversation's messages with %s (conversation_id %s, user %q)", AppCapability(a.ID, SuffixMessages), conv, r.user))
	case a.Mode.chat():
		hints = append(hints, fmt.Sprintf("look for its conversation with %s (user %q)", AppCapability(a.ID, SuffixConversations), r.user))
	case a.Mode == ModeWorkflow && r.out.WorkflowRunID == "":
		hints = append(hints, fmt.Sprintf("look for its run with %s (created_by_end_user_session_id %q)", AppCapability(a.ID, SuffixWorkflowLogs), r.user))
	}
	return strings.Join(hints, "; ")
}

// roundDuration rounds d for a message: to the second from a second on.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

// refuseNestedNUL refuses a run (an app invocation, a knowledge pipeline
// run: runner names it, "app" or "pipeline") whose inputs or list (files,
// datasource_info_list; listName names it) hold the character U+0000 in a
// string Dify does not clean: a string inside an object or array input (a
// member name or value, an array item, at any depth) or anywhere in an
// item of the list. Dify removes the character from an app's query and
// from each string input itself (BaseAppGenerator._sanitize_value, which
// the app generators and the PipelineGenerator call through
// _prepare_user_inputs, replaces "\x00" in the values of inputs, not in
// what an object or array value holds), and the rest reaches the run: a
// JSON object variable's member, a file's URL or ID, a pipeline item's
// reference, URL or name. Its data is in PostgreSQL, which cannot hold
// the character in text, so the run could fail once it had started
// (outcome_unknown, after its nodes or tools may have acted) rather than
// be refused: the connector refuses it before sending, naming the first
// such string (inputs in the order of their names) by its path, as
// inputs.customer.notes[2], files[0].url or datasource_info_list[0].title.
func refuseNestedNUL(call *hostsdk.Call, runner string, inputs map[string]json.RawMessage, listName string, list []json.RawMessage) error {
	var path string
	found := false
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		var v any
		if !mayHoldNUL(inputs[name]) || decodeAny(inputs[name], &v) != nil {
			continue
		}
		if _, ok := v.(string); ok {
			continue // Dify removes it
		}
		if path, found = nulPath(v, "inputs"+memberPath(name)); found {
			break
		}
	}
	for i := 0; !found && i < len(list); i++ {
		var v any
		if mayHoldNUL(list[i]) && decodeAny(list[i], &v) == nil {
			path, found = nulPath(v, listName+"["+strconv.Itoa(i)+"]")
		}
	}
	if !found {
		return nil
	}
	return inputError(call, path+" holds the character U+0000, which Dify removes from a string input but not from a string inside an object or array, "+
		"and cannot store (its data is in PostgreSQL): the "+runner+" could fail after it started; remove the character")
}

// mayHoldNUL is false when raw surely holds no U+0000 (no "\u0000"
// escape, no NUL byte): the common case, not decoded.
func mayHoldNUL(raw json.RawMessage) bool {
	return bytes.IndexByte(raw, 0) >= 0 || bytes.Contains(raw, []byte(`\u0000`))
}

func decodeAny(raw json.RawMessage, v *any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	return dec.Decode(v)
}

// nulPath returns the path of the first string in v (member names
// included, members in the order of their names) that holds U+0000.
func nulPath(v any, path string) (string, bool) {
	switch v := v.(type) {
	case string:
		return path, strings.IndexByte(v, 0) >= 0
	case []any:
		for i, e := range v {
			if p, ok := nulPath(e, path+"["+strconv.Itoa(i)+"]"); ok {
				return p, true
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			p := path + memberPath(k)
			if strings.IndexByte(k, 0) >= 0 {
				return p, true
			}
			if p, ok := nulPath(v[k], p); ok {
				return p, true
			}
		}
	}
	return "", false
}

// identifierRegexp is a member name written .name in a path; any other is
// written ["name"], JSON-quoted.
var identifierRegexp = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func memberPath(name string) string {
	if identifierRegexp.MatchString(name) {
		return "." + name
	}
	var q bytes.Buffer
	enc := json.NewEncoder(&q)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(name)
	return "[" + strings.TrimSuffix(q.String(), "\n") + "]"
}

// run aggregates the events of one invocation.
type run struct {
	c    *Connector
	call *hostsdk.Call
	app  *app
	user string
	// inputConversation is the conversation_id the input named, if any.
	inputConversation string
	chunks            *hostsdk.ChunkWriter

	out InvokeOutput
	// messageID is a chatflow's message, as its events name it.
	messageID string
	// recorded is the task record last written (remember).
	recorded    taskRef
	answer      strings.Builder
	text        strings.Builder
	agentChunks bool
	messageEnd  bool
	finished    *workflowData
	paused      bool
	failure     *event
	// badFinish: a workflow_finished event did not say how the run ended
	// (readFinished's error).
	badFinish error
	closed    bool // the closing event arrived: read no further
	// progressed: an event before the error event showed the app at work
	// (an answer chunk, an agent thought, a workflow or node event), so an
	// app with tools may have called them.
	progressed bool
}

func (r *run) apply(ctx context.Context, ev *event) {
	if ev.WorkflowRunID != "" {
		r.out.WorkflowRunID = ev.WorkflowRunID
	} else if ev.Event == "workflow_started" && r.out.WorkflowRunID == "" {
		var d workflowData
		if json.Unmarshal(ev.Data, &d) == nil {
			r.out.WorkflowRunID = d.ID
		}
	}
	if ev.ConversationID != "" && r.app.Mode.chat() {
		r.out.ConversationID = ev.ConversationID
	}
	if ev.MessageID != "" && r.app.Mode == ModeAdvancedChat {
		// Every chatflow event names its message (the document's common
		// fields), workflow_started first.
		r.messageID = ev.MessageID
	}
	if ev.TaskID != "" && r.out.TaskID == "" {
		r.out.TaskID = ev.TaskID
	}
	if ref := r.ref(); ref.TaskID != "" && ref != r.recorded {
		// The task is known, or an ID Reconcile reads by came after it
		// (a workflow run, a chatflow's conversation and message): the
		// record gets it as soon as it is known.
		r.remember(ctx, ref)
	}
	if ev.Event != "error" {
		r.progressed = true
	}
	switch ev.Event {
	case "message":
		r.noteMessage(ev)
		if r.agentChunks {
			// A New Agent app closes with one message carrying the whole
			// answer: it replaces the agent_message chunks, for the
			// chunks' receiver too.
			r.answer.Reset()
			r.answer.WriteString(ev.Answer)
			r.send(aip.ChunkData, map[string]any{"answer": ev.Answer, "replace": true})
			return
		}
		r.answer.WriteString(ev.Answer)
		r.send(aip.ChunkData, map[string]any{"answer": ev.Answer})
	case "agent_message":
		r.noteMessage(ev)
		r.agentChunks = true
		r.answer.WriteString(ev.Answer)
		r.send(aip.ChunkData, map[string]any{"answer": ev.Answer})
	case "message_replace":
		r.answer.Reset()
		r.answer.WriteString(ev.Answer)
		r.send(aip.ChunkData, map[string]any{"answer": ev.Answer, "replace": true})
	case "agent_thought":
		r.send(aip.ChunkThought, map[string]any{"thought": ev.Thought, "tool": ev.Tool,
			"tool_input": ev.ToolInput, "observation": ev.Observation})
	case "message_file":
		f, _ := json.Marshal(map[string]string{"id": ev.ID, "type": ev.Type, "belongs_to": ev.BelongsTo, "url": ev.URL})
		r.out.Files = append(r.out.Files, f)
	case "message_end":
		r.noteMessage(ev)
		r.messageEnd = true
		if len(ev.Metadata) > 0 && string(ev.Metadata) != "null" {
			r.out.Metadata = ev.Metadata
		}
		if len(ev.Files) > 0 && string(ev.Files) != "null" {
			var files []json.RawMessage
			if json.Unmarshal(ev.Files, &files) == nil {
				r.out.Files = append(r.out.Files, files...)
			}
		}
		// A chatflow sends workflow_finished after message_end; the
		// other apps close here.
		r.closed = r.app.Mode != ModeAdvancedChat
	case "text_chunk":
		var d workflowData
		if json.Unmarshal(ev.Data, &d) == nil {
			r.text.WriteString(d.Text)
			r.send(aip.ChunkData, map[string]any{"text": d.Text})
		}
	case "node_started", "node_finished":
		var d workflowData
		if json.Unmarshal(ev.Data, &d) == nil {
			r.send(aip.ChunkProgress, nodeProgress(ev.Event, d))
		}
	case "workflow_finished":
		d, err := readFinished(ev.Data)
		if err != nil {
			// How the run ended is not known: read no further.
			r.badFinish = err
			r.closed = true
			return
		}
		r.finished = d
		// A failed chatflow sends an error event next; the rest close here.
		r.closed = !(r.app.Mode == ModeAdvancedChat && d.Status == "failed")
	case "workflow_paused":
		r.paused = true
		r.out.Paused = ev.Data
		r.closed = true
	case "error":
		r.failure = ev
		r.closed = true
	}
}

func (r *run) noteMessage(ev *event) {
	switch {
	case ev.MessageID != "":
		r.out.MessageID = ev.MessageID
	case ev.ID != "" && r.out.MessageID == "":
		r.out.MessageID = ev.ID
	}
}

// send forwards a chunk of a streaming action; a receiver that went away
// stops the forwarding, not the invocation.
func (r *run) send(kind aip.ChunkKind, data any) {
	if r.chunks == nil {
		return
	}
	if err := r.chunks.Send(kind, data); err != nil {
		r.call.Logger.Debug("dify: chunk not forwarded; forwarding stops", "error", err)
		r.chunks = nil
	}
}

// ref is the invocation's task record as far as its events named it: the
// task, a workflow or chatflow app's run, and a chatflow's conversation
// and message.
func (r *run) ref() taskRef {
	ref := taskRef{AppID: r.app.ID, TaskID: r.out.TaskID, User: r.user, WorkflowRunID: r.out.WorkflowRunID}
	if r.app.Mode == ModeAdvancedChat {
		ref.ConversationID, ref.MessageID = r.out.ConversationID, r.messageID
	}
	return ref
}

// remember records the invocation's task (and its workflow run, and a
// chatflow's conversation and message, once known), in memory and in the
// state store, so that a cancel can stop it and Reconcile can read the
// run after a restart. The write is not cancelled with the action: a
// cancel needs it most.
func (r *run) remember(ctx context.Context, ref taskRef) {
	r.recorded = ref
	taskID := ref.TaskID
	id := r.call.Action.ID
	r.c.tasks.Store(id, ref)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	raw, _ := json.Marshal(ref)
	if _, _, err := r.call.State().Update(wctx, TasksNamespace, id, func(json.RawMessage) (json.RawMessage, error) {
		return raw, nil
	}); err != nil {
		r.call.Logger.Warn("dify: task record not written; a cancel after this action ends cannot stop the task",
			"task_id", taskID, "error", err)
	}
}

// result returns the invocation's result when the stream said how it
// ended.
func (r *run) result() (*aip.ActionResult, bool) {
	call := r.call
	path := invokePath(r.app.Mode)
	if r.failure != nil {
		status, msg := r.failureDetail()
		switch {
		case status < 500 && !(r.progressed && r.app.Mode.usesTools()):
			// Refused before the app did anything (a bad input, a quota
			// already used up), or by an app that has no tools (a
			// chatbot, a text generator): nothing was done outside Dify.
			return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
				Error: provider.ProtocolError(&provider.Error{Product: "dify", Method: http.MethodPost, Path: path,
					Status: status, Message: "error event: " + msg})}, true
		case r.finished == nil || r.finished.Status != "failed":
			// A 4xx error event after the app was at work (a model quota
			// running out between two tool calls) is no safer.
			// Dify failed unexpectedly mid-run: what the app did first
			// (tools, nodes) is unknown, as after a 5xx answer to a
			// mutation. Not a retryable failure.
			return nil, false
		}
		// A chatflow reported its failure with workflow_finished first:
		// the run ended failed (below).
	}
	if res := finishedFailure(r.app.client, call.Action.ID, path, "workflow", r.finished); res != nil {
		return res, true
	}
	done := false
	switch {
	case r.app.Mode == ModeWorkflow:
		done = r.finished != nil || r.paused
	default:
		// A chatflow may drop after message_end, before workflow_finished:
		// the answer is complete.
		done = r.messageEnd || (r.app.Mode == ModeAdvancedChat && r.paused)
	}
	if !done {
		return nil, false
	}
	out := r.out
	if r.app.Mode != ModeWorkflow {
		s := r.answer.String()
		out.Answer = &s
	}
	if r.app.Mode == ModeWorkflow || r.app.Mode == ModeAdvancedChat {
		if r.text.Len() > 0 {
			s := r.text.String()
			out.Text = &s
		}
		if d := r.finished; d != nil {
			out.finish(d)
		} else if r.paused {
			out.Status = "paused"
		}
	}
	res, err := call.Complete(out)
	if err != nil {
		return failedResult(call.Action.ID, path, "dify.output", err.Error()), true
	}
	return res, true
}

// readFinished reads the data of a workflow_finished event. It fails when
// the data does not say how the run ended (it is not a JSON object, or has
// no status string): the run's outcome is then unknown. A member of
// another type than the document's is left out; the status decides.
func readFinished(raw json.RawMessage) (*workflowData, error) {
	var obj map[string]json.RawMessage
	var d workflowData
	if json.Unmarshal(raw, &obj) == nil && obj != nil {
		_ = json.Unmarshal(raw, &d) // fills what it can besides a mistyped member
	}
	if d.Status == "" {
		return nil, errors.New("workflow_finished does not say how the run ended (its data is not an object with a status)")
	}
	return &d, nil
}

// failureDetail returns the HTTP status of the error event (500 when it
// has none) and its code and message.
func (r *run) failureDetail() (int, string) {
	return errorEventDetail(r.app.client, r.failure.Status, r.failure.Code, r.failure.Message)
}

// finishedFailure is the failed result of a run (what: "workflow",
// "pipeline") whose workflow_finished event d says it failed or was
// stopped, or nil (d nil, or another status). Dify's error message is
// redacted of cl's credentials, as an error body's is.
func finishedFailure(cl *provider.Client, actionID, path, what string, d *workflowData) *aip.ActionResult {
	if d == nil {
		return nil
	}
	var code, msg string
	switch d.Status {
	case "failed":
		code, msg = CodeWorkflowFailed, "the "+what+" run failed"
		if d.Error != nil && *d.Error != "" {
			msg += ": " + cl.Redacted(*d.Error)
		}
	case "stopped":
		code, msg = CodeWorkflowStopped, "the "+what+" run was stopped"
	default:
		return nil
	}
	return failedResult(actionID, path, code, msg)
}

// failedResult is a permanent failure of the POST to path.
func failedResult(actionID, path, code, msg string) *aip.ActionResult {
	return &aip.ActionResult{ActionID: actionID, Status: aip.ResultFailed,
		Error: aip.NewProtocolError(code, aip.CategoryPermanent, false, 0, aip.TruncateUTF8("dify POST "+path+": "+msg, aip.MaxErrorMessageBytes))}
}
