package hermes

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
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

func (c *Connector) chatBody(in chatRequest, stream bool) chatRequest {
	if in.Model == "" {
		in.Model = c.defaultModel
	}
	in.Stream = stream
	return in
}

// chat runs a non-streaming chat completion.
func (c *Connector) chat(ctx context.Context, call *hostsdk.Call, ep *endpoint, in chatRequest) (*aip.ActionResult, error) {
	h := headers(call)
	h.Set("Idempotency-Key", idempotencyKey(call.IdempotencyKey))
	var cc chatCompletion
	err := ep.client.JSON(ctx, provider.Request{Method: http.MethodPost, Path: "/v1/chat/completions",
		Header: h, JSON: c.chatBody(in, false)}, &cc)
	if err != nil {
		return provider.Result(call, err, true)
	}
	if len(cc.Choices) == 0 {
		return nil, fmt.Errorf("%w: POST /v1/chat/completions answered without choices", hostsdk.ErrOutcomeUnknown)
	}
	ch := cc.Choices[0]
	if ch.Message.Role == "" {
		ch.Message.Role = "assistant"
	}
	return call.Complete(chatOutputValue{ID: cc.ID, Model: cc.Model, Message: ch.Message,
		FinishReason: ch.FinishReason, Usage: nullToNil(cc.Usage)})
}

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
// message. Other capabilities run as in Handle, without chunks.
func (c *Connector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	ep, op, err := c.resolve(call.Action.CapabilityID)
	if err != nil {
		return nil, err
	}
	if op.name != OpChat {
		return c.handle(ctx, call, ep, op)
	}
	in, err := decode[chatRequest](call)
	if err != nil {
		return nil, err
	}
	h := headers(call)
	h.Set("Idempotency-Key", idempotencyKey(call.IdempotencyKey))
	body, err := json.Marshal(c.chatBody(in, true))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, RequestTimeout)
	defer cancel()
	resp, err := ep.stream.open(ctx, "/v1/chat/completions", h, body)
	if err != nil {
		return provider.Result(call, err, true)
	}
	defer resp.Body.Close()

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
	err = ep.stream.events(resp.Body, func(event string, data []byte) (bool, error) {
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
			return false, fmt.Errorf("stream carried an error: %s", clip(*ch.Error))
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
	if err != nil {
		// The agent ran (and may have acted); what it did is unknown.
		return nil, fmt.Errorf("%w: %s POST /v1/chat/completions stream: %v", hostsdk.ErrOutcomeUnknown, ep.stream.product, err)
	}
	out.Message.Content = text.String()
	return call.Complete(out)
}

// streamClient opens SSE streams. provider.Client reads a whole answer
// before returning, so streams get their own client with the same rules:
// no redirects, the same credentials, a bound on the whole stream and on
// each frame.
type streamClient struct {
	product  string
	base     *url.URL
	maxBytes int64
	auth     func(*http.Request)
	http     *http.Client
}

func newStreamClient(product string, base *url.URL, maxBytes int64, auth func(*http.Request), rt http.RoundTripper) *streamClient {
	if rt == nil {
		rt = http.DefaultTransport.(*http.Transport).Clone()
	}
	return &streamClient{product: product, base: base, maxBytes: maxBytes, auth: auth, http: &http.Client{
		Transport:     rt,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// open posts body to path and returns a 2xx event-stream answer, or a
// *provider.Error.
func (s *streamClient) open(ctx context.Context, path string, h http.Header, body []byte) (*http.Response, error) {
	fail := func(status int, may bool, msg string, err error) *provider.Error {
		return &provider.Error{Product: s.product, Method: http.MethodPost, Path: path, Status: status,
			Message: msg, MayHaveApplied: may, Err: err}
	}
	u := *s.base
	u.Path = s.base.Path + path
	u.RawPath = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fail(0, false, "build request", err)
	}
	for k, vs := range h {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("User-Agent", UserAgent)
	s.auth(req)
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, fail(0, !dialError(err), "no answer", err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			resp.Body.Close()
			return nil, fail(resp.StatusCode, true, fmt.Sprintf("answered %q instead of an event stream", ct), nil)
		}
		return resp, nil
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := strings.TrimSpace(string(data))
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(data, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		var s string
		switch {
		case json.Unmarshal(e.Error, &inner) == nil && inner.Message != "":
			msg = inner.Message
		case json.Unmarshal(e.Error, &s) == nil && s != "":
			msg = s
		case e.Message != "":
			msg = e.Message
		}
	}
	if len(msg) > 512 {
		msg = msg[:512] + "…"
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		msg = fmt.Sprintf("redirect to %q not followed; point base_url at the API server itself", resp.Header.Get("Location"))
	}
	return nil, fail(resp.StatusCode, resp.StatusCode >= 500, msg, nil)
}

// events reads SSE events from r and calls fn with each event's name
// ("" for the default) and data (data lines joined by newlines) until fn
// says stop, r ends or a bound is passed.
func (s *streamClient) events(r io.Reader, fn func(event string, data []byte) (stop bool, err error)) error {
	lim := &io.LimitedReader{R: r, N: s.maxBytes + 1}
	sc := bufio.NewScanner(lim)
	sc.Buffer(make([]byte, 0, 64<<10), MaxFrameBytes)
	var event string
	var data []byte
	have := false
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			if have {
				stop, err := fn(event, data)
				if err != nil || stop {
					return err
				}
			}
			event, data, have = "", data[:0], false
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			event = string(value)
		case "data":
			if have {
				data = append(data, '\n')
			}
			if len(data)+len(value) > MaxFrameBytes {
				return fmt.Errorf("an event's data is larger than %d bytes", MaxFrameBytes)
			}
			data = append(data, value...)
			have = true
		}
	}
	if lim.N <= 0 {
		return fmt.Errorf("the stream is larger than the %d bytes allowed (raise --%s)", s.maxBytes, FlagMaxResponseBytes)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("a stream line is larger than %d bytes", MaxFrameBytes)
		}
		return err
	}
	// An event without its closing blank line is discarded, as the SSE
	// format says: the stream was cut.
	return nil
}

// dialError reports whether err happened before any byte of the request
// could reach the provider: the name did not resolve or the connection
// was refused.
func dialError(err error) bool {
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
