package sidecar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxMCPLine bounds one message (one line) a stdio MCP server writes: the
// Go SDK's own default (mcp.DefaultMaxLineLength, 16 MiB), four times what
// one action result can carry (hostsdk.MaxResultBytes). A tool's answer
// repeats its structured content as text, and JSON escapes differ between
// the server and the bridge, so an answer larger than a result is not
// necessarily one whose result cannot be carried; none larger than this is
// read.
const maxMCPLine = mcp.DefaultMaxLineLength

// frameChunk is how much frameGuard reads from the server at a time.
const frameChunk = 64 << 10

// codeAnswerTooLarge and msgAnswerTooLarge make the JSON-RPC error that
// frameGuard puts in place of a server's answer larger than maxMCPLine.
// The code is in JSON-RPC's range for implementation-defined errors.
const (
	codeAnswerTooLarge = -32090
	msgAnswerTooLarge  = "aip-sidecar: the MCP server's answer is larger than the bridge reads from a stdio server; it was discarded"
)

// frameGuard is the stdio server's output as the Go SDK reads it, one
// message a line (MCP's stdio transport), with every line longer than
// limit taken out. The SDK's own limit (IOTransport.MaxLineLength) ends
// the whole session at such a line: every call in flight became
// outcome_unknown and the server was restarted, for one oversized answer.
// Here an oversized answer to a call (a line whose top-level object has
// an "id" and a "result" or "error", and no "method") is replaced by the
// JSON-RPC error codeAnswerTooLarge for that id, so that only its call
// fails (MCP.settle: hostsdk.UnusableResult); an oversized notification is
// dropped (logged). Any other oversized line — a request of the server, a
// batch, an answer whose id cannot be read — still ends the session: read
// returns an error, as the SDK's limit did.
//
// A line is held until its newline (or the end of the output) before the
// SDK reads it, so at most limit bytes of one line are buffered here; a
// longer one is scanned as it passes, not kept.
type frameGuard struct {
	r     io.Reader
	limit int
	log   *slog.Logger

	chunk []byte
	line  []byte     // the current line so far, while at most limit
	over  *frameScan // the current line, once longer than limit
	ready []byte     // what the SDK reads next
	buf   []byte     // ready's buffer, reused
	err   error      // the output's end (or read error), after ready
}

func newFrameGuard(r io.Reader, limit int, log *slog.Logger) *frameGuard {
	return &frameGuard{r: r, limit: limit, log: log, chunk: make([]byte, frameChunk)}
}

func (g *frameGuard) Read(p []byte) (int, error) {
	for len(g.ready) == 0 {
		if g.err != nil {
			if len(g.line) > 0 {
				// The last message, without its newline.
				g.ready, g.line = g.line, nil
				break
			}
			return 0, g.err
		}
		n, err := g.r.Read(g.chunk)
		if ferr := g.feed(g.chunk[:n]); ferr != nil {
			g.err = ferr
			g.line, g.over = nil, nil // the lines before it are still read
			continue
		}
		if err != nil {
			// The output ended (within an oversized line: nothing of
			// it is passed on).
			g.over = nil
			g.err = err
		}
	}
	n := copy(p, g.ready)
	g.ready = g.ready[n:]
	return n, nil
}

// feed takes in b, the next bytes of the output, once ready was read: the
// lines it completes become ready.
func (g *frameGuard) feed(b []byte) error {
	if cap(g.buf) > 4*frameChunk {
		g.buf = nil // not kept after a long line
	}
	g.ready = g.buf[:0]
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		seg := b
		if i >= 0 {
			seg = b[:i]
		}
		if g.over == nil && len(g.line)+len(seg) > g.limit {
			// Too long to pass on: scanned from here on, not kept.
			g.over = &frameScan{}
			g.over.scan(g.line)
			g.line = nil
		}
		switch {
		case g.over != nil:
			g.over.scan(seg)
		case i >= 0 && len(g.line) == 0:
			g.ready = append(g.ready, b[:i+1]...)
		case i >= 0 && len(g.ready) == 0:
			// The held line, completed, is handed over as is.
			g.ready = append(append(g.line, seg...), '\n')
			g.line = nil
		default:
			g.line = append(g.line, seg...)
			if i >= 0 {
				g.ready = append(append(g.ready, g.line...), '\n')
				g.line = g.line[:0]
				if cap(g.line) > 4*frameChunk {
					g.line = nil
				}
			}
		}
		if i < 0 {
			break
		}
		b = b[i+1:]
		if g.over != nil {
			repl, err := g.replace(g.over)
			g.over = nil
			if err != nil {
				return err
			}
			g.ready = append(g.ready, repl...)
		}
	}
	g.buf = g.ready
	return nil
}

// replace returns what takes the place of an oversized line s: the error
// answer to its call, or nothing for a notification; an error for any
// other line.
func (g *frameGuard) replace(s *frameScan) ([]byte, error) {
	switch {
	case s.top == '{' && s.keys["method"] && !s.keys["id"]:
		g.log.Warn("an MCP notification larger than the bridge reads from a stdio server was dropped",
			"method", s.method, "bytes", s.n, "max_bytes", g.limit)
		return nil, nil
	case s.top == '{' && !s.keys["method"] && (s.keys["result"] || s.keys["error"]) && s.validID():
		g.log.Warn("an MCP answer larger than the bridge reads from a stdio server was discarded; its call fails",
			"id", string(s.id), "bytes", s.n, "max_bytes", g.limit)
		data, _ := json.Marshal(map[string]int64{"bytes": s.n, "max_bytes": int64(g.limit)})
		msg, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(s.id),
			"error": map[string]any{"code": codeAnswerTooLarge, "message": msgAnswerTooLarge, "data": json.RawMessage(data)}})
		if err != nil {
			return nil, err
		}
		return append(msg, '\n'), nil
	}
	return nil, fmt.Errorf("the MCP server wrote a message of more than %d bytes that is not an answer to a call with a readable id (a request of the server, a batch, or not a JSON-RPC message); the bridge reads none that large", g.limit)
}

// frameScan reads what frameGuard needs of an oversized line as it
// passes, without keeping it: its first character, its top-level member
// names, and the raw values of its "id" and "method" (when short).
type frameScan struct {
	n        int64 // bytes scanned
	top      byte  // the line's first non-space character
	depth    int
	inStr    bool
	esc      bool
	wantKey  bool // at depth 1, the next string is a member name
	inKey    bool
	key      []byte
	member   string // the top-level member whose value is being read
	capture  bool   // the value of member is being kept (id, method)
	val      []byte
	tooLong  bool
	keys     map[string]bool
	id       []byte
	method   string
	idNested bool
}

// maxScanned bounds a member name or id value frameScan keeps.
const maxScanned = 256

func (s *frameScan) scan(b []byte) {
	s.n += int64(len(b))
	for _, c := range b {
		if s.inStr {
			switch {
			case s.esc:
				s.esc = false
			case c == '\\':
				s.esc = true
			case c == '"':
				s.inStr = false
			}
			if s.inKey {
				if s.inStr {
					s.keep(&s.key, c)
				} else {
					s.inKey = false
				}
			} else if s.capture && s.depth == 1 {
				s.keep(&s.val, c)
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		if s.top == 0 {
			s.top = c
		}
		switch c {
		case '"':
			s.inStr = true
			if s.depth == 1 && s.wantKey {
				s.inKey, s.key, s.tooLong = true, s.key[:0], false
				continue
			}
			if s.capture && s.depth == 1 {
				s.keep(&s.val, c)
			}
		case '{', '[':
			if s.capture && s.depth == 1 {
				s.idNested = s.idNested || s.member == "id"
				s.capture = false
			}
			s.depth++
			if s.depth == 1 && c == '{' {
				s.wantKey = true
			}
		case '}', ']':
			if s.depth == 1 {
				s.endValue()
			}
			s.depth--
		case ':':
			if s.depth == 1 {
				s.wantKey = false
				if !s.tooLong {
					s.member = string(s.key)
					if s.keys == nil {
						s.keys = make(map[string]bool)
					}
					s.keys[s.member] = true
					s.capture = s.member == "id" || s.member == "method"
					s.val = s.val[:0]
				}
			}
		case ',':
			if s.depth == 1 {
				s.endValue()
				s.wantKey = true
			}
		default:
			if s.capture && s.depth == 1 {
				s.keep(&s.val, c)
			}
		}
	}
}

func (s *frameScan) keep(dst *[]byte, c byte) {
	if len(*dst) >= maxScanned {
		s.tooLong = true
		return
	}
	*dst = append(*dst, c)
}

// endValue ends the value of a top-level member.
func (s *frameScan) endValue() {
	if s.capture && !s.tooLong {
		switch s.member {
		case "id":
			s.id = append([]byte(nil), s.val...)
		case "method":
			var m string
			if json.Unmarshal(s.val, &m) == nil {
				s.method = m
			}
		}
	}
	if s.capture && s.tooLong && s.member == "id" {
		s.idNested = true // not kept: no readable id
	}
	s.capture, s.member, s.tooLong = false, "", false
}

// validID reports whether the line's id was read and is a JSON-RPC id (a
// string or a number).
func (s *frameScan) validID() bool {
	if s.idNested || len(s.id) == 0 || !json.Valid(s.id) {
		return false
	}
	return s.id[0] == '"' || s.id[0] == '-' || (s.id[0] >= '0' && s.id[0] <= '9')
}
