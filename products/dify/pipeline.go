package dify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// streamKind says how an operation's answer is read; the zero value is
// one JSON document.
type streamKind int

const (
	// datasourceStream: the events of a datasource node run
	// (runDatasource).
	datasourceStream streamKind = iota + 1
	// pipelineStream: the events of a pipeline run, or its JSON answer
	// (runPipeline).
	pipelineStream
)

// MaxPipelineItems bounds the datasource_info_list of a pipeline run: the
// published pipeline adds one document per item.
const MaxPipelineItems = 100

// CodeDatasourceFailed is the failure code of a datasource node run whose
// stream reported datasource_error.
const CodeDatasourceFailed = "dify.datasource_failed"

// DatasourceRunOutput is the output of a datasource node run: the data of
// each datasource_completed event (usually one: the pages, files or
// crawled pages found), and the figures of the last one that had them.
type DatasourceRunOutput struct {
	Results       []json.RawMessage `json:"results"`
	Total         *int64            `json:"total,omitempty"`
	Completed     *int64            `json:"completed,omitempty"`
	TimeConsuming *float64          `json:"time_consuming,omitempty"`
}

// datasourceEvent is one event of a datasource node run.
type datasourceEvent struct {
	Event         string          `json:"event"`
	Data          json.RawMessage `json:"data"`
	Total         *int64          `json:"total"`
	Completed     *int64          `json:"completed"`
	TimeConsuming *float64        `json:"time_consuming"`
	// datasource_error's
	Error string `json:"error"`
	// a generic error event's
	Status  json.RawMessage `json:"status"`
	Code    string          `json:"code"`
	Message string          `json:"message"`
}

// runDatasource runs a datasource node: a read. Dify streams
// datasource_processing events (progress), one datasource_completed event
// per result and ends the stream; a datasource_error event is the run's
// failure. A failure of any kind is a failed result (it changed nothing
// in Dify): retryable when the stream broke off or stayed silent, or the
// action's context ended first (its timeout: the message says how long
// the stream had sent only pings; nothing is stopped, the Service API has
// no stop endpoint for it).
func (c *Connector) runDatasource(ctx context.Context, call *hostsdk.Call, cl *provider.Client, req provider.Request, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	sent := time.Now()
	st, err := cl.Stream(ctx, req, c.cfg.StreamIdleTimeout)
	if err != nil {
		return provider.Result(call, err, false)
	}
	defer st.Close()
	fail := func(code string, cat aip.ErrorCategory, retryable bool, msg string) (*aip.ActionResult, error) {
		return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
			Error: aip.NewProtocolError(code, cat, retryable, 0, aip.TruncateUTF8("dify POST "+req.Path+": "+msg, aip.MaxErrorMessageBytes))}, nil
	}
	fwd := chunkSender{call: call, chunks: chunks}
	out := DatasourceRunOutput{Results: []json.RawMessage{}}
	events := provider.NewEventReader(st, MaxEventBytes, c.cfg.MaxResponseBytes)
	quiet := quietSpell{since: sent}
	for {
		var ev datasourceEvent
		err := nextEvent(events, &ev)
		if errors.Is(err, io.EOF) {
			break
		}
		var bound *provider.BoundError
		switch {
		case err != nil && ctx.Err() != nil:
			quiet.end(events)
			msg := interruption(ctx, "the datasource node run", sent)
			if q := quiet.String(); q != "" {
				msg += "; " + q
			}
			return fail(provider.CodeUnavailable, aip.CategoryTemporary, true, msg+
				"; the run changes nothing in Dify, and nothing was stopped (the Service API has no stop endpoint for it): run it again, with a longer timeout_ms if the source needs it")
		case errors.As(err, &bound):
			return fail(provider.CodeBadResponse, aip.CategoryConnector, false, fmt.Sprintf("%v (raise --%s)", err, FlagMaxResponseBytes))
		case errors.Is(err, errNotJSON):
			return fail(provider.CodeBadResponse, aip.CategoryConnector, false, err.Error())
		case err != nil:
			return fail(provider.CodeUnavailable, aip.CategoryTransport, true, "the event stream broke off: "+err.Error())
		}
		quiet.observe(ev.Event, events)
		switch ev.Event {
		case "datasource_processing":
			fwd.send(aip.ChunkProgress, map[string]any{"event": ev.Event, "total": ev.Total, "completed": ev.Completed})
		case "datasource_completed":
			data := ev.Data
			if len(data) == 0 {
				data = json.RawMessage("null")
			}
			out.Results = append(out.Results, data)
			if ev.Total != nil {
				out.Total = ev.Total
			}
			if ev.Completed != nil {
				out.Completed = ev.Completed
			}
			if ev.TimeConsuming != nil {
				out.TimeConsuming = ev.TimeConsuming
			}
			fwd.send(aip.ChunkData, map[string]any{"data": data})
		case "datasource_error":
			return fail(CodeDatasourceFailed, aip.CategoryPermanent, false, "datasource_error: "+cl.Redacted(ev.Error))
		case "error":
			status, msg := errorEventDetail(cl, ev.Status, ev.Code, ev.Message)
			return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
				Error: provider.ProtocolError(&provider.Error{Product: "dify", Method: req.Method, Path: req.Path,
					Status: status, Message: "error event: " + msg})}, nil
		}
	}
	if len(out.Results) == 0 {
		return fail(provider.CodeUnavailable, aip.CategoryTemporary, true, "the event stream ended without a datasource_completed event")
	}
	return call.Complete(out)
}

// PipelineRunOutput is the output of a pipeline run Dify answered with an
// event stream (a run of the draft pipeline). A run Dify answered with a
// JSON object (the published pipeline's batch and documents) has that
// object as its output.
type PipelineRunOutput struct {
	TaskID string `json:"task_id,omitempty"`
	WorkflowRun
}

// runPipeline runs the knowledge pipeline of knowledge base datasetID
// (published: the input's is_published): a mutation (the published
// pipeline adds documents). It asks for response_mode "streaming" (see
// doc.go), and takes either answer the document gives a 200: an event
// stream (workflow_started, node_started, node_finished, workflow_finished
// or error, pings), aggregated as a workflow app's, or a JSON object,
// which is the output.
func (c *Connector) runPipeline(ctx context.Context, call *hostsdk.Call, cl *provider.Client, req provider.Request, datasetID string, published bool, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	sent := time.Now()
	st, resp, err := cl.StreamOrJSON(ctx, req, c.cfg.StreamIdleTimeout)
	if err != nil {
		return provider.Result(call, err, true)
	}
	if resp != nil {
		// The document's JSON answer (its blocking form) holds the run
		// in data: one that failed or was stopped is a failed result, as
		// its workflow_finished is in a stream.
		var blocking struct {
			Data *workflowData `json:"data"`
		}
		if json.Unmarshal(resp.Body, &blocking) == nil {
			if res := finishedFailure(cl, call.Action.ID, req.Path, "pipeline", blocking.Data); res != nil {
				return res, nil
			}
		}
		return completeJSON(call, req, resp, true)
	}
	defer st.Close()
	fwd := chunkSender{call: call, chunks: chunks}
	var (
		out        PipelineRunOutput
		finished   *workflowData
		failure    *event
		progressed bool
		readErr    error
	)
	events := provider.NewEventReader(st, MaxEventBytes, c.cfg.MaxResponseBytes)
	quiet := quietSpell{since: sent}
read:
	for finished == nil && failure == nil {
		var ev event
		if readErr = nextEvent(events, &ev); readErr != nil {
			break
		}
		quiet.observe(ev.Event, events)
		if ev.TaskID != "" && out.TaskID == "" {
			out.TaskID = ev.TaskID
		}
		if ev.WorkflowRunID != "" {
			out.WorkflowRunID = ev.WorkflowRunID
		}
		var d workflowData
		if len(ev.Data) > 0 {
			// An event whose data is not the workflow shape still counts.
			_ = json.Unmarshal(ev.Data, &d)
		}
		switch ev.Event {
		case "error":
			failure = &ev
			continue
		case "workflow_started":
			if out.WorkflowRunID == "" {
				out.WorkflowRunID = d.ID
			}
		case "node_started", "node_finished":
			fwd.send(aip.ChunkProgress, nodeProgress(ev.Event, d))
		case "text_chunk":
			fwd.send(aip.ChunkData, map[string]any{"text": d.Text})
		case "workflow_finished":
			fd, err := readFinished(ev.Data)
			if err != nil {
				readErr = err
				break read
			}
			finished = fd
		}
		progressed = true
	}
	path := req.Path
	if failure != nil {
		status, msg := errorEventDetail(cl, failure.Status, failure.Code, failure.Message)
		if status < 500 && !progressed {
			// Refused before the pipeline did anything.
			return &aip.ActionResult{ActionID: call.Action.ID, Status: aip.ResultFailed,
				Error: provider.ProtocolError(&provider.Error{Product: "dify", Method: http.MethodPost, Path: path,
					Status: status, Message: "error event: " + msg})}, nil
		}
		// Dify failed mid-run, after nodes may have written.
		return nil, fmt.Errorf("%w: dify POST %s: error event (status %d): %s", hostsdk.ErrOutcomeUnknown, path, status, msg)
	}
	if res := finishedFailure(cl, call.Action.ID, path, "pipeline", finished); res != nil {
		return res, nil
	}
	if d := finished; d != nil {
		out.finish(d)
		return call.Complete(out)
	}
	// The stream ended before its closing event: the pipeline ran, or
	// runs still, and how it ended is not known.
	quiet.end(events)
	p := pipelineRun{cl: cl, datasetID: datasetID, published: published, out: &out}
	if ctx.Err() != nil {
		quiet.log(call.Logger, "the pipeline's", context.Cause(ctx), p.logAttrs()...)
		return nil, fmt.Errorf("%w: dify POST %s: %s", hostsdk.ErrOutcomeUnknown, path, p.interrupted(ctx, sent, quiet))
	}
	quiet.log(call.Logger, "the pipeline's", readErr, p.logAttrs()...)
	msg := streamEndError(readErr).Error()
	if running := p.running(); running != "" {
		msg += "; " + running
	}
	return nil, fmt.Errorf("%w: dify POST %s: %s; %s", hostsdk.ErrOutcomeUnknown, path, msg, p.readHint())
}

// pipelineRun is a knowledge pipeline run whose stream ended before its
// workflow_finished, as far as the stream went.
type pipelineRun struct {
	cl        *provider.Client
	datasetID string
	published bool
	out       *PipelineRunOutput
}

func (p pipelineRun) logAttrs() []any {
	return []any{"dataset_id", p.datasetID, "task_id", p.id(p.out.TaskID), "workflow_run_id", p.id(p.out.WorkflowRunID)}
}

// id is an ID the stream named, fit for a message: nothing checks that
// a pipeline's task_id or workflow_run_id is a UUID (neither goes into a
// path), so it is redacted of the key and clipped.
func (p pipelineRun) id(s string) string { return provider.Excerpt(p.cl.Redacted(s)) }

// running names the run's task and workflow run, "" when the stream
// named neither.
func (p pipelineRun) running() string {
	var ids []string
	if p.out.TaskID != "" {
		ids = append(ids, "task "+p.id(p.out.TaskID))
	}
	if p.out.WorkflowRunID != "" {
		ids = append(ids, "workflow run "+p.id(p.out.WorkflowRunID))
	}
	if len(ids) == 0 {
		return ""
	}
	return "the pipeline runs as Dify " + strings.Join(ids, ", ")
}

// interrupted is the outcome_unknown message of a pipeline run whose
// action's context ended (its timeout, the host's shutdown) before the
// stream's workflow_finished, sent is when the request was sent and q
// the stream's end. Unlike an app's task, the run cannot be stopped:
// Dify's Service API has no stop endpoint for a pipeline run (its stop
// endpoints are the apps', and take an app's key). The message says so,
// names the run and says what can be read of it.
func (p pipelineRun) interrupted(ctx context.Context, sent time.Time, q quietSpell) string {
	parts := []string{interruption(ctx, "the pipeline run", sent)}
	if quiet := q.String(); quiet != "" {
		parts = append(parts, quiet)
	}
	if running := p.running(); running != "" {
		parts = append(parts, running)
	} else {
		parts = append(parts, "the stream never named the pipeline's task or run: Dify accepted the run, and the pipeline may be running")
	}
	parts = append(parts, "nothing was stopped: Dify's Service API has no stop endpoint for a knowledge pipeline run, so the pipeline may have completed, partly done the work or be running still",
		p.readHint())
	return strings.Join(parts, "; ")
}

// readHint says what can be read of a pipeline run that did not finish:
// the Service API has no read of a pipeline's runs (Dify's console lists
// them); a published run's documents, with their indexing_status, are
// the knowledge base's; a draft run adds none (its knowledge index node
// only previews the chunks).
func (p pipelineRun) readHint() string {
	hint := "the Service API has no read of a pipeline's runs: Dify's console lists them"
	if p.published {
		return hint + "; read the documents the run added, with their indexing_status, with " + KnowledgeCapability(p.datasetID, SuffixDocuments)
	}
	return hint + "; a draft run (is_published false) adds no documents to the knowledge base"
}

// errNotJSON is nextEvent's error for an event whose data is not JSON.
var errNotJSON = errors.New("an event is not JSON")

// nextEvent reads the next event that carries data, skipping pings, into
// v. It returns the reader's error (io.EOF at the end of the stream), or
// an error wrapping errNotJSON.
func nextEvent(events *provider.EventReader, v any) error {
	for {
		e, err := events.Next()
		if err != nil {
			return err
		}
		if e.Name == "ping" || len(bytes.TrimSpace(e.Data)) == 0 {
			continue
		}
		if err := json.Unmarshal(e.Data, v); err != nil {
			return fmt.Errorf("%w: %v", errNotJSON, err)
		}
		return nil
	}
}

// streamEndError describes why a stream ended before its closing event,
// err being the read's error; a stream its action's context ended is
// described by the run (interruption).
func streamEndError(err error) error {
	var bound *provider.BoundError
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("the event stream ended before its closing event")
	case errors.As(err, &bound) && bound.Total:
		return fmt.Errorf("%w (raise --%s)", err, FlagMaxResponseBytes)
	}
	return err
}

// errorEventDetail returns the HTTP status of an error event (500 when it
// has none) and its code and message, redacted of cl's credentials and
// clipped (provider.Client.Redacted), as an error body's message is: Dify,
// a node or a proxy may echo what the request carried.
func errorEventDetail(cl *provider.Client, rawStatus json.RawMessage, code, message string) (int, string) {
	status := 0
	_ = json.Unmarshal(rawStatus, &status)
	if status < 400 {
		status = http.StatusInternalServerError
	}
	if code != "" {
		message = code + ": " + message
	}
	return status, cl.Redacted(message)
}

// nodeProgress is the progress chunk of a node_started or node_finished
// event.
func nodeProgress(name string, d workflowData) map[string]any {
	p := map[string]any{"event": name, "node_id": d.NodeID, "node_type": d.NodeType, "title": d.Title}
	if d.Status != "" {
		p["status"] = d.Status
	}
	return p
}

// chunkSender forwards the chunks of a streaming action; a receiver that
// went away stops the forwarding, not the action.
type chunkSender struct {
	call   *hostsdk.Call
	chunks *hostsdk.ChunkWriter
}

func (s *chunkSender) send(kind aip.ChunkKind, data any) {
	if s.chunks == nil {
		return
	}
	if err := s.chunks.Send(kind, data); err != nil {
		s.call.Logger.Debug("dify: chunk not forwarded; forwarding stops", "error", err)
		s.chunks = nil
	}
}
