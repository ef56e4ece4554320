package provider

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"
)

// MaxErrorBodyBytes bounds the body read from a stream request's answer
// that is not a 2xx; the message taken from it is clipped anyway.
const MaxErrorBodyBytes = 64 << 10

// ErrIdle is wrapped by the error of a stream that stayed silent longer
// than its idle bound.
var ErrIdle = errors.New("the event stream stayed silent too long")

// Stream is the open body of a 2xx text/event-stream answer. Read it
// directly or through NewEventReader; Close it when done, which also
// releases its idle timer.
type Stream struct {
	Status int
	Header http.Header

	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

// Stream sends req asking for a Server-Sent Events answer
// (Accept: text/event-stream) and returns the open stream on a 2xx
// text/event-stream answer, or an *Error. It follows the rules of Do:
// the same URL, headers, User-Agent and credentials, redirects never
// followed, MayHaveApplied set the same way (a 2xx that is not an event
// stream counts as applied, with the answer's status), and the body of an
// answer that is not a 2xx read up to MaxErrorBodyBytes for its message.
//
// Config.Timeout does not apply: a stream may last longer than any one
// request. Its bounds are ctx (the whole stream, from sending the request
// to the last read) and idle: when idle is positive, waiting for the
// answer or for any read of the stream longer than idle cancels the
// stream, and the failing read (or Stream's *Error) wraps ErrIdle. Time
// the caller spends between reads does not count. With idle zero, ctx
// must carry a deadline.
func (c *Client) Stream(ctx context.Context, req Request, idle time.Duration) (*Stream, error) {
	s, _, err := c.streamOnce(ctx, req, idle, false)
	return s, err
}

// StreamOrJSON is Stream for an operation whose 2xx answer may be an
// event stream or a JSON document (Accept: text/event-stream,
// application/json): it returns either the open stream, or the JSON
// answer as a *Response, read as Do reads one (at most MaxResponseBytes;
// an answer that cannot be read whole may have applied) within the
// stream's bounds (ctx and idle, not Config.Timeout). Any other 2xx
// answer is an *Error, as for Stream.
func (c *Client) StreamOrJSON(ctx context.Context, req Request, idle time.Duration) (*Stream, *Response, error) {
	return c.streamOnce(ctx, req, idle, true)
}

// streamOnce is stream, sent once more when the provider answers 401 or
// 403 and one of Config.Secrets changed meanwhile, as Do does.
func (c *Client) streamOnce(ctx context.Context, req Request, idle time.Duration, orJSON bool) (*Stream, *Response, error) {
	gen := c.secretsGeneration()
	s, resp, err := c.stream(ctx, req, idle, orJSON)
	if c.credentialsRotated(err, gen) {
		s, resp, err = c.stream(ctx, req, idle, orJSON)
	}
	return s, resp, err
}

func (c *Client) stream(ctx context.Context, req Request, idle time.Duration, orJSON bool) (*Stream, *Response, error) {
	if _, ok := ctx.Deadline(); idle <= 0 && !ok {
		return nil, nil, c.fail(req, 0, false, "a stream needs an idle bound or a context deadline", nil)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	s := &Stream{ctx: sctx, cancel: cancel, idle: idle}
	if idle > 0 {
		idleErr := fmt.Errorf("%w (%s)", ErrIdle, idle)
		s.timer = time.AfterFunc(idle, func() { cancel(idleErr) })
	}
	accept := "text/event-stream"
	if orJSON {
		accept = "text/event-stream, application/json"
	}
	hr, err := c.newRequest(sctx, req, accept)
	if err != nil {
		s.stop()
		return nil, nil, err
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		if cause := context.Cause(sctx); errors.Is(cause, ErrIdle) {
			err = cause
		}
		s.stop()
		return nil, nil, c.fail(req, 0, !notSent(err), "no answer", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer s.stop()
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, MaxErrorBodyBytes))
		if err != nil && !refusal(resp.StatusCode) {
			return nil, nil, c.fail(req, 0, true, fmt.Sprintf("reading the %d answer failed", resp.StatusCode), err)
		}
		return nil, nil, c.refused(req, resp, data)
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if orJSON && mt == "application/json" {
		s.Status, s.Header, s.body = resp.StatusCode, resp.Header, resp.Body
		defer s.Close()
		// Read through s: each read is bounded by idle, the whole by ctx.
		data, err := io.ReadAll(io.LimitReader(s, c.cfg.MaxResponseBytes+1))
		if err != nil {
			return nil, nil, c.fail(req, 0, true, fmt.Sprintf("reading the %d answer failed", resp.StatusCode), err)
		}
		if int64(len(data)) > c.cfg.MaxResponseBytes {
			return nil, nil, c.fail(req, resp.StatusCode, true,
				fmt.Sprintf("answer is larger than the %d bytes allowed (raise the max response bytes setting)", c.cfg.MaxResponseBytes), nil)
		}
		return nil, &Response{Status: resp.StatusCode, Header: resp.Header, Body: data}, nil
	}
	if mt != "text/event-stream" {
		resp.Body.Close()
		s.stop()
		want := "an event stream (text/event-stream)"
		if orJSON {
			want = "an event stream (text/event-stream) or JSON (application/json)"
		}
		return nil, nil, c.fail(req, resp.StatusCode, true,
			fmt.Sprintf("answered %q instead of %s", mt, want), nil)
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.Status, s.Header, s.body = resp.StatusCode, resp.Header, resp.Body
	return s, nil, nil
}

// Read reads the stream's body, within the idle bound.
func (s *Stream) Read(p []byte) (int, error) {
	if s.timer != nil {
		s.timer.Reset(s.idle)
	}
	n, err := s.body.Read(p)
	if s.timer != nil {
		s.timer.Stop()
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(s.ctx); errors.Is(cause, ErrIdle) {
			err = cause
		}
	}
	return n, err
}

// Close closes the stream's body.
func (s *Stream) Close() error {
	s.stop()
	return s.body.Close()
}

func (s *Stream) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
	s.cancel(nil)
}

// Event is one Server-Sent Event.
type Event struct {
	// Name is the event's type (its event: field), "" when it has none.
	Name string
	// Data is its data: lines, joined with "\n".
	Data []byte
}

// BoundError is an EventReader's error when the stream passes one of its
// bounds.
type BoundError struct {
	// Total is true for the whole stream's bound, false for one event's.
	Total bool
	Limit int64
}

func (e *BoundError) Error() string {
	if e.Total {
		return fmt.Sprintf("the event stream is larger than the %d bytes allowed", e.Limit)
	}
	return fmt.Sprintf("an event is larger than the %d bytes allowed", e.Limit)
}

// EventReader reads Server-Sent Events: event: and data: fields up to a
// blank line, several data: lines joined with "\n", comment lines (":",
// as in pings) skipped, id: and retry: fields and unknown fields ignored.
// Lines end with "\n", "\r\n" or "\r". An event without data: lines is not
// returned; nor is an event the stream ends before its blank line (the
// stream was cut). Each event (its lines, comments among them) is bounded
// by maxEvent bytes and the whole stream by maxTotal bytes; passing
// either is a *BoundError. KeepAlives counts what was skipped.
type EventReader struct {
	r          *bufio.Reader
	maxEvent   int64
	maxTotal   int64
	read       int64
	keepAlives int64
	err        error
	// afterCR: the last line ended with "\r"; a "\n" next belongs to it.
	afterCR bool
}

// KeepAlives returns how many keep-alives the reader has skipped so far:
// blocks up to a blank line that carried no data: line (an event such as
// "event: ping", comment lines such as ": ping"). A stream that sends
// only those is alive but says nothing.
func (er *EventReader) KeepAlives() int64 { return er.keepAlives }

// NewEventReader returns a reader of the events of r.
func NewEventReader(r io.Reader, maxEvent, maxTotal int64) *EventReader {
	return &EventReader{r: bufio.NewReaderSize(r, 64<<10), maxEvent: maxEvent, maxTotal: maxTotal}
}

// Next returns the next event. At the end of the stream it returns
// io.EOF; after any error it returns that error again.
func (er *EventReader) Next() (Event, error) {
	if er.err != nil {
		return Event{}, er.err
	}
	ev, err := er.next()
	if err != nil {
		er.err = err
	}
	return ev, err
}

func (er *EventReader) next() (Event, error) {
	var (
		name      string
		data      bytes.Buffer
		have      bool
		eventSize int64
	)
	for {
		line, err := er.line(&eventSize)
		if err != nil {
			return Event{}, err
		}
		if len(line) == 0 {
			if have {
				return Event{Name: name, Data: data.Bytes()}, nil
			}
			if eventSize > 1 {
				er.keepAlives++ // more than the blank line itself
			}
			name, eventSize = "", 0
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			name = string(value)
		case "data":
			if have {
				data.WriteByte('\n')
			}
			data.Write(value)
			have = true
		}
	}
}

// line reads one line without its line ending ("\r\n", "\n" or a lone
// "\r", as the Server-Sent Events format allows), adding its bytes to
// *eventSize and to the stream's count. A line ended by "\r" is returned
// at once: the "\n" that may follow it is skipped when the next line is
// read, so an event framed with lone "\r"s is not held back until the
// stream sends more.
func (er *EventReader) line(eventSize *int64) ([]byte, error) {
	var line []byte
	for {
		if _, err := er.r.Peek(1); err != nil {
			// io.EOF included: a line without its end belongs to an
			// event the stream ended before.
			return nil, err
		}
		buf, _ := er.r.Peek(er.r.Buffered())
		if er.afterCR {
			er.afterCR = false
			if buf[0] == '\n' {
				// The previous line's: counted in the stream only.
				if err := er.count(1, new(int64)); err != nil {
					return nil, err
				}
				er.r.Discard(1)
				continue
			}
		}
		i := bytes.IndexAny(buf, "\r\n")
		take := len(buf)
		if i >= 0 {
			take = i + 1
		}
		if err := er.count(int64(take), eventSize); err != nil {
			return nil, err
		}
		line = append(line, buf[:take]...)
		er.r.Discard(take)
		if i >= 0 {
			er.afterCR = buf[i] == '\r'
			return line[:len(line)-1], nil
		}
	}
}

// count adds n bytes read to the event's and the stream's counts.
func (er *EventReader) count(n int64, eventSize *int64) error {
	er.read += n
	*eventSize += n
	if er.read > er.maxTotal {
		return &BoundError{Total: true, Limit: er.maxTotal}
	}
	if *eventSize > er.maxEvent {
		return &BoundError{Limit: er.maxEvent}
	}
	return nil
}
