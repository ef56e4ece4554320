package hermes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// hermesEvent is one Hermes SSE event as run_events and session_chat
// forward it: its name and its data (JSON as sent, or a JSON string when
// the data is not JSON).
type hermesEvent struct {
	Event string          `json:"event"`
	Data  json.RawMessage `json:"data"`
}

// eventOf names an SSE event: its event: field, or, when it has none, the
// "event" member of its JSON data. The page names the events
// (message.delta, reasoning.delta, run.completed, ...) without saying
// how they are framed, so both framings are read.
func eventOf(name string, data []byte) hermesEvent {
	var raw json.RawMessage
	if json.Valid(data) {
		raw = bytes.Clone(data)
	} else {
		raw, _ = json.Marshal(string(data))
	}
	if name == "" {
		var d struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(raw, &d) == nil {
			name = d.Event
		}
	}
	return hermesEvent{Event: name, Data: raw}
}

// chunkKind is the chunk an event is forwarded as: answer text
// (message.delta, assistant.delta) as data, reasoning.delta as thought,
// tool.* as tool, anything else (lifecycle, subagent.*) as progress.
func chunkKind(name string) aip.ChunkKind {
	switch {
	case name == "message.delta" || name == "assistant.delta":
		return aip.ChunkData
	case name == "reasoning.delta":
		return aip.ChunkThought
	case strings.HasPrefix(name, "tool."):
		return aip.ChunkTool
	default:
		return aip.ChunkProgress
	}
}

// chunkSender sends chunks best effort: once the receiver is gone the
// stream is still read, so the journaled result is complete.
type chunkSender struct {
	w  *hostsdk.ChunkWriter
	ok bool
}

func (s *chunkSender) send(kind aip.ChunkKind, data any) {
	if s.w != nil && s.ok && s.w.Send(kind, data) != nil {
		s.ok = false
	}
}

type runEventsIn struct {
	RunID     string `json:"run_id"`
	MaxEvents int    `json:"max_events"`
}

// runEventsOutput is run_events' output.
type runEventsOutput struct {
	RunID string `json:"run_id"`
	// Count is how many events were read.
	Count int `json:"count"`
	// Events are the events read, in synchronous mode only (streaming
	// mode forwards them as chunks).
	Events []hermesEvent `json:"events,omitempty"`
	// MaxEventsReached: reading stopped at max_events; the stream may have
	// more.
	MaxEventsReached bool `json:"max_events_reached,omitempty"`
	// StreamOpen: the stream was still open when the action's timeout (or
	// RequestTimeout) ended the read: the run may emit more.
	StreamOpen bool `json:"stream_open,omitempty"`
}

// runEvents reads GET /v1/runs/{run_id}/events until the stream ends or
// max_events events: with chunks, each event is forwarded as a chunk;
// without, they are returned in the output. The stream is bounded by
// --hermes-max-response-bytes (an event by MaxFrameBytes), RequestTimeout
// and the action's timeout. It is a read: a failure is a failed result,
// except the timeout, which a live run's open stream reaches: what was read
// is the result, with stream_open set.
func (c *Connector) runEvents(ctx context.Context, call *hostsdk.Call, ep *endpoint, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	in, err := decode[runEventsIn](call)
	if err != nil {
		return nil, err
	}
	if in.MaxEvents <= 0 {
		in.MaxEvents = DefaultMaxEvents
	}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	path := endpointPath("/v1/runs", in.RunID) + "/events"
	st, err := ep.client.Stream(ctx, provider.Request{Method: http.MethodGet, Path: path, Header: headers(call)}, 0)
	if err != nil {
		return provider.Result(call, err, false)
	}
	defer st.Close()
	s := chunkSender{w: chunks, ok: true}
	out := runEventsOutput{RunID: in.RunID}
	err = events(st, ep.maxBytes, func(name string, data []byte) (bool, error) {
		ev := eventOf(name, data)
		out.Count++
		if chunks != nil {
			s.send(chunkKind(ev.Event), ev)
		} else {
			out.Events = append(out.Events, ev)
		}
		if out.Count >= in.MaxEvents {
			out.MaxEventsReached = true
			return true, nil
		}
		return false, nil
	})
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The stream was open when the time ran out (the action's timeout
		// or RequestTimeout, whichever came first): a live run's stream
		// stays open until the run ends, so the events read are the
		// answer, not a failure that would drop them.
		out.StreamOpen = true
		err = nil
	}
	if err != nil {
		msg := fmt.Sprintf("%s GET %s: event stream: %v", ep.client.Product(), path, err)
		if bound := (*provider.BoundError)(nil); errors.As(err, &bound) {
			return call.Fail(provider.CodeBadResponse, aip.CategoryPermanent, false, msg), nil
		}
		return call.Fail(provider.CodeUnavailable, aip.CategoryTransport, true, msg), nil
	}
	return call.Complete(out)
}

// sessionChatStreamOutput is session_chat's output in streaming mode.
type sessionChatStreamOutput struct {
	// Events is how many events came before run.completed.
	Events int `json:"events"`
	// RunCompleted is the run.completed event's data.
	RunCompleted json.RawMessage `json:"run_completed"`
}

// sessionChatStream runs one session turn over POST
// /api/sessions/{id}/chat/stream and forwards its events (reasoning.delta,
// assistant.delta, tool.started, tool.completed, ...) as chunks until
// run.completed, whose data is the result. A stream that fails or ends
// before run.completed is outcome_unknown: the agent ran and may have
// acted.
func (c *Connector) sessionChatStream(ctx context.Context, call *hostsdk.Call, ep *endpoint, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	in, err := decode[sessionChatIn](call)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(sessionChatBody{Input: in.Input, Model: in.Model})
	if err != nil {
		return nil, err
	}
	h := headers(call)
	h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	path := endpointPath("/api/sessions", in.SessionID) + "/chat/stream"
	st, err := ep.client.Stream(ctx, provider.Request{Method: http.MethodPost, Path: path,
		Header: h, Body: body, ContentType: "application/json"}, 0)
	if err != nil {
		return provider.Result(call, err, true)
	}
	defer st.Close()
	s := chunkSender{w: chunks, ok: true}
	var out sessionChatStreamOutput
	err = events(st, ep.maxBytes, func(name string, data []byte) (bool, error) {
		ev := eventOf(name, data)
		if ev.Event == "run.completed" {
			out.RunCompleted = ev.Data
			return true, nil
		}
		out.Events++
		s.send(chunkKind(ev.Event), ev)
		return false, nil
	})
	if err == nil && out.RunCompleted == nil {
		err = errors.New("the stream ended before run.completed")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s POST %s: %v", hostsdk.ErrOutcomeUnknown, ep.client.Product(), path, err)
	}
	return call.Complete(out)
}
