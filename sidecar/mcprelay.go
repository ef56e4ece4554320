package sidecar

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// closingCodeTransport keeps a Streamable HTTP server's JSON-RPC error
// answers -32003 and -32004 from the go-sdk's closing errors, as
// watchedConn.Read does for a stdio server. The SDK takes any answer with
// those codes — its own "client is closing" and "server is closing", in
// the range JSON-RPC leaves to implementations, where a server is free to
// use them — for the connection's end (mcp.ErrConnectionClosed), so one
// tools/call answered so took the whole session down, every call on it
// cut off, and the call lost the server's code. The HTTP connection
// cannot be wrapped as the stdio one is: the SDK tells it the negotiated
// session through an unexported method that a wrapper would hide. So the
// answers are changed on their way in, in the HTTP bodies the SDK reads
// (application/json, and each event of a text/event-stream): such an
// error gets codeRelayed, with its code (and data) in its data under
// relayedCodeKey, and serverError gives the call the server's own error
// back. An answer or event over maxRelayed bytes is passed on unchanged
// (an error answer is far smaller).
type closingCodeTransport struct{ base http.RoundTripper }

func (t closingCodeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(r)
	if err != nil || resp.Body == nil || resp.Body == http.NoBody {
		return resp, err
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch ct {
	case "application/json":
		resp.Body = &jsonRelay{body: resp.Body}
	case "text/event-stream":
		resp.Body = &sseRelay{body: resp.Body, src: bufio.NewReaderSize(resp.Body, 64<<10)}
	default:
		return resp, nil
	}
	resp.ContentLength = -1
	resp.Header.Del("Content-Length")
	return resp, nil
}

// codeRelayed is the code a server's -32003 or -32004 answer reaches the
// SDK with (closingCodeTransport): outside JSON-RPC's reserved range and
// taken for the server's code only with relayedCodeKey in its data.
const codeRelayed = -3_200_399

// relayedCodeKey holds, in the data of an error with codeRelayed, the
// server's code; "data" holds the server's data, if it sent any.
const relayedCodeKey = "aipfleet_sidecar_jsonrpc_code"

// maxRelayed bounds the JSON body or SSE event closingCodeTransport
// examines.
const maxRelayed = 1 << 20

// unrelayed is the server's own error of we when closingCodeTransport
// changed it, else we.
func unrelayed(we *jsonrpc.Error) *jsonrpc.Error {
	if we == nil || we.Code != codeRelayed {
		return we
	}
	var d map[string]json.RawMessage
	var code int64
	if json.Unmarshal(we.Data, &d) != nil || d[relayedCodeKey] == nil || json.Unmarshal(d[relayedCodeKey], &code) != nil {
		return we
	}
	return &jsonrpc.Error{Code: code, Message: we.Message, Data: d["data"]}
}

// relayClosingCodes returns raw, a JSON-RPC message or batch, with every
// error answer -32003 or -32004 in it changed to codeRelayed; ok is false
// when there is none (or raw is not JSON), and raw is then to be passed on
// as it is.
func relayClosingCodes(raw []byte) (out []byte, ok bool) {
	if !bytes.Contains(raw, []byte("-3200")) {
		return nil, false
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		var batch []json.RawMessage
		if json.Unmarshal(trimmed, &batch) != nil {
			return nil, false
		}
		for i, m := range batch {
			if n, changed := relayOne(m); changed {
				batch[i], ok = n, true
			}
		}
		if !ok {
			return nil, false
		}
		out, err := json.Marshal(batch)
		return out, err == nil
	}
	return relayOne(trimmed)
}

// relayOne is relayClosingCodes of one message.
func relayOne(raw []byte) ([]byte, bool) {
	var msg map[string]json.RawMessage
	if json.Unmarshal(raw, &msg) != nil || msg["id"] == nil || msg["error"] == nil {
		return nil, false
	}
	var e map[string]json.RawMessage
	var code int64
	if json.Unmarshal(msg["error"], &e) != nil || json.Unmarshal(e["code"], &code) != nil ||
		(code != codeSDKClientClosing && code != codeSDKServerClosing) {
		return nil, false
	}
	data := map[string]json.RawMessage{relayedCodeKey: e["code"]}
	if d, ok := e["data"]; ok {
		data["data"] = d
	}
	var err error
	if e["data"], err = json.Marshal(data); err != nil {
		return nil, false
	}
	e["code"] = json.RawMessage(strconv.Itoa(codeRelayed))
	if msg["error"], err = json.Marshal(e); err != nil {
		return nil, false
	}
	out, err := json.Marshal(msg)
	return out, err == nil
}

// jsonRelay is an application/json body with relayClosingCodes applied
// when it is first read (not in RoundTrip: the SDK reads the body on its
// own goroutine, while the tool runs).
type jsonRelay struct {
	body io.ReadCloser
	r    io.Reader
}

func (j *jsonRelay) Read(p []byte) (int, error) {
	if j.r == nil {
		head, err := io.ReadAll(io.LimitReader(j.body, maxRelayed+1))
		switch {
		case err != nil:
			j.r = io.MultiReader(bytes.NewReader(head), errReader{err})
		case len(head) > maxRelayed:
			j.r = io.MultiReader(bytes.NewReader(head), j.body)
		default:
			if out, ok := relayClosingCodes(head); ok {
				head = out
			}
			j.r = bytes.NewReader(head)
		}
	}
	return j.r.Read(p)
}

func (j *jsonRelay) Close() error { return j.body.Close() }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// sseRelay is a text/event-stream body with relayClosingCodes applied to
// the data of each event, passed on as soon as its blank line is read;
// the other lines, and every event without such an answer, are passed on
// byte for byte. An event over maxRelayed bytes is passed on as read.
type sseRelay struct {
	body  io.ReadCloser
	src   *bufio.Reader
	out   []byte   // ready to be read
	event [][]byte // the complete lines of the event being read
	cur   []byte   // the line being read
	size  int      // bytes of event and cur
	// pass: the event is over maxRelayed; its lines go out as read.
	// passMid: within pass, the current line began in an earlier read.
	pass, passMid bool
	err           error // src's, returned once out is drained
}

func (s *sseRelay) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		s.step()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

func (s *sseRelay) Close() error { return s.body.Close() }

// step reads one line, or the part of a long one that fits the buffer.
func (s *sseRelay) step() {
	frag, err := s.src.ReadSlice('\n')
	full := errors.Is(err, bufio.ErrBufferFull)
	if full {
		err = nil
	}
	if s.pass {
		s.out = append(s.out, frag...)
		switch {
		case err != nil:
			s.err = err
		case full:
			s.passMid = true
		default:
			if !s.passMid && blankLine(frag) {
				s.pass = false // the event ended
			}
			s.passMid = false
		}
		return
	}
	s.cur = append(s.cur, frag...)
	s.size += len(frag)
	switch {
	case err != nil: // the stream's end: its last event ends here too
		if len(s.cur) > 0 {
			s.event = append(s.event, s.cur)
		}
		s.out = append(s.out, s.render()...)
		s.event, s.cur, s.size, s.err = nil, nil, 0, err
	case !full && blankLine(s.cur):
		s.out = append(append(s.out, s.render()...), s.cur...)
		s.event, s.cur, s.size = nil, nil, 0
	case s.size > maxRelayed:
		for _, l := range s.event {
			s.out = append(s.out, l...)
		}
		s.out = append(s.out, s.cur...)
		s.pass, s.passMid = true, full
		s.event, s.cur, s.size = nil, nil, 0
	case !full:
		s.event = append(s.event, s.cur)
		s.cur = nil
	}
}

// render is the event's lines, with its data replaced by one data line
// when relayClosingCodes changed it.
func (s *sseRelay) render() []byte {
	var data [][]byte
	first := -1
	for i, l := range s.event {
		if v, ok := bytes.CutPrefix(bytes.TrimRight(l, "\r\n"), []byte("data:")); ok {
			if first < 0 {
				first = i
			}
			data = append(data, bytes.TrimPrefix(v, []byte(" ")))
		}
	}
	var out []byte
	relayed, ok := []byte(nil), false
	if first >= 0 {
		relayed, ok = relayClosingCodes(bytes.Join(data, []byte("\n")))
	}
	for i, l := range s.event {
		switch {
		case !ok:
			out = append(out, l...)
		case i == first:
			out = append(append(append(out, "data: "...), relayed...), '\n')
		case bytes.HasPrefix(l, []byte("data:")):
		default:
			out = append(out, l...)
		}
	}
	return out
}

// blankLine reports whether line, with its line ending, is empty: the end
// of an event.
func blankLine(line []byte) bool { return len(bytes.TrimRight(line, "\r\n")) == 0 }
