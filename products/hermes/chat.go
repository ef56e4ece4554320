package hermes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatRequest is the chat input and, with Model and Stream set, the body
// of POST /v1/chat/completions.
type chatRequest struct {
	Model       string        `json:"model"`
	Messages    []chatMessage `json:"messages"`
	Stream      bool          `json:"stream"`
	Temperature *float64      `json:"temperature,omitempty"`
	MaxTokens   *int64        `json:"max_tokens,omitempty"`
}

// chatCompletion is the non-streaming answer (OpenAI chat.completion).
type chatCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message      chatMessage `json:"message"`
		FinishReason string      `json:"finish_reason"`
	} `json:"choices"`
	Usage json.RawMessage `json:"usage"`
}

// chatOutput is the chat capability's output (chatOutput schema).
type chatOutputValue struct {
	ID           string          `json:"id,omitempty"`
	Model        string          `json:"model,omitempty"`
	Message      chatMessage     `json:"message"`
	FinishReason string          `json:"finish_reason,omitempty"`
	Usage        json.RawMessage `json:"usage,omitempty"`
}

func (c *Connector) chatBody(ep *endpoint, in chatRequest, stream bool) chatRequest {
	if in.Model == "" {
		in.Model = ep.defaultModel
	}
	in.Stream = stream
	return in
}

// chat runs a non-streaming chat completion.
func (c *Connector) chat(ctx context.Context, call *hostsdk.Call, ep *endpoint, in chatRequest) (*aip.ActionResult, error) {
	h := headers(call)
	h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	var cc chatCompletion
	err := ep.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: "/v1/chat/completions",
		Header: h, JSON: c.chatBody(ep, in, false)}, &cc)
	if err != nil {
		return provider.Result(call, err, true)
	}
	if len(cc.Choices) == 0 {
		return nil, fmt.Errorf("%w: POST /v1/chat/completions answered without choices", hostsdk.ErrOutcomeUnknown)
	}
	ch := cc.Choices[0]
	if ch.FinishReason == finishReasonError {
		// The partial answer is confidential output, not quoted here.
		return nil, fmt.Errorf("%w: %s POST /v1/chat/completions answered finish_reason %q with %d bytes of partial answer: the agent's turn failed after it may have acted",
			hostsdk.ErrOutcomeUnknown, ep.client.Product(), ch.FinishReason, len(ch.Message.Content))
	}
	if ch.Message.Role == "" {
		ch.Message.Role = "assistant"
	}
	return call.Complete(chatOutputValue{ID: cc.ID, Model: cc.Model, Message: ch.Message,
		FinishReason: ch.FinishReason, Usage: nullToNil(cc.Usage)})
}

// finishReasonError is the finish_reason Hermes ends a chat turn with
// when the agent failed (gateway/platforms/api_server.py: a 200 answer
// carrying the partial text, or the last chunk of a stream whose agent
// crashed, before data: [DONE]). The agent ran and may have acted: the
// action is outcome_unknown.
const finishReasonError = "error"

func nullToNil(r json.RawMessage) json.RawMessage {
	if len(r) == 0 || string(r) == "null" {
		return nil
	}
	return r
}

// HandleStream implements hostsdk.Streamer. A chat action in streaming
// mode asks Hermes for an SSE stream and forwards each answer delta as a
// data chunk ({"delta": "..."}), reasoning deltas as thought chunks and
// hermes.tool.progress events as tool chunks; the result is the assembled
// message. run_events and session_chat forward their SSE events (see
// events.go). Other capabilities run as in Handle, without chunks.
func (c *Connector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	ep, op, err := c.resolve(call.Action.CapabilityID)
	if err != nil {
		return nil, err
	}
	if res, refused := c.health.Refusal(call.Action.ID, ep.id); refused {
		return res, nil
	}
	switch op.name {
	case OpChat:
	case OpRunEvents:
		return c.runEvents(ctx, call, ep, chunks)
	case OpSessionChat:
		return c.sessionChatStream(ctx, call, ep, chunks)
	default:
		return c.handle(ctx, call, ep, op)
	}
	in, err := decode[chatRequest](call)
	if err != nil {
		return nil, err
	}
	h := headers(call)
	h.Set("Idempotency-Key", provider.CallIdempotencyKey(call))
	body, err := json.Marshal(c.chatBody(ep, in, true))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	// RequestTimeout bounds the whole stream; there is no idle bound.
	st, err := ep.client.Stream(ctx, provider.Request{Method: http.MethodPost, Path: "/v1/chat/completions",
		Header: h, Body: body, ContentType: "application/json"}, 0)
	if err != nil {
		return provider.Result(call, err, true)
	}
	defer st.Close()

	// Chunks are best effort: once the receiver is gone the stream is
	// still read to the end, so the journaled result is complete.
	sendOK := true
	send := func(kind aip.ChunkKind, data any) {
		if sendOK && chunks.Send(kind, data) != nil {
			sendOK = false
		}
	}
	var out chatOutputValue
	out.Message.Role = "assistant"
	var text strings.Builder
	done := false
	err = events(st, ep.maxBytes, func(event string, data []byte) (bool, error) {
		if event == "hermes.tool.progress" {
			var v json.RawMessage
			if json.Unmarshal(data, &v) != nil {
				v, _ = json.Marshal(string(data))
			}
			send(aip.ChunkTool, v)
			return false, nil
		}
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			done = true
			return true, nil
		}
		var ch struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Role             string `json:"role"`
					Content          string `json:"content"`
					ReasoningContent string `json:"reasoning_content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage json.RawMessage  `json:"usage"`
			Error *json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			return false, fmt.Errorf("stream event is not a chat.completion.chunk: %v", err)
		}
		if ch.Error != nil {
			return false, fmt.Errorf("stream carried an error: %s", ep.client.Redacted(string(*ch.Error)))
		}
		if ch.ID != "" {
			out.ID = ch.ID
		}
		if ch.Model != "" {
			out.Model = ch.Model
		}
		if u := nullToNil(ch.Usage); u != nil {
			out.Usage = u
		}
		for _, choice := range ch.Choices {
			d := choice.Delta
			if d.Role != "" {
				out.Message.Role = d.Role
			}
			if d.ReasoningContent != "" {
				send(aip.ChunkThought, map[string]string{"delta": d.ReasoningContent})
			}
			if d.Content != "" {
				text.WriteString(d.Content)
				send(aip.ChunkData, map[string]string{"delta": d.Content})
			}
			if choice.FinishReason != nil && *choice.FinishReason != "" {
				out.FinishReason = *choice.FinishReason
			}
		}
		return false, nil
	})
	if err == nil && !done {
		err = errors.New("the stream ended before data: [DONE]")
	}
	if err == nil && out.FinishReason == finishReasonError {
		err = fmt.Errorf("the stream ended with finish_reason %q: the agent's turn failed", out.FinishReason)
	}
	if err != nil {
		// The agent ran (and may have acted); what it did is unknown.
		return nil, fmt.Errorf("%w: %s POST /v1/chat/completions stream: %v", hostsdk.ErrOutcomeUnknown, ep.client.Product(), err)
	}
	out.Message.Content = text.String()
	return call.Complete(out)
}

// events reads the SSE events of r (provider.EventReader: an event at
// most MaxFrameBytes, the stream at most maxBytes) and calls fn with each
// event's name ("" for the default) and data until fn says stop or r
// ends. An event the stream ends before its blank line is discarded: the
// stream was cut.
func events(r io.Reader, maxBytes int64, fn func(event string, data []byte) (stop bool, err error)) error {
	er := provider.NewEventReader(r, MaxFrameBytes, maxBytes)
	for {
		ev, err := er.Next()
		var bound *provider.BoundError
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.As(err, &bound) && bound.Total:
			return fmt.Errorf("%w (raise --%s)", err, FlagMaxResponseBytes)
		case err != nil:
			return err
		}
		if stop, err := fn(ev.Name, ev.Data); err != nil || stop {
			return err
		}
	}
}
