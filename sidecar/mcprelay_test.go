package sidecar

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// relayed reads body through the relay of its content type, one byte at
// a time from the server.
func relayed(t *testing.T, contentType, body string) string {
	t.Helper()
	src := io.NopCloser(iotest.OneByteReader(strings.NewReader(body)))
	var r io.Reader = &jsonRelay{body: src}
	if contentType == "text/event-stream" {
		r = &sseRelay{body: src, src: bufio.NewReaderSize(src, 16)}
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(out)
}

// TestClosingCodeRelay: closingCodeTransport changes a server's error
// answer -32003 or -32004, in a JSON body or in an SSE event (with CRLF
// line endings, data over several lines, the stream's last event without
// its blank line), to codeRelayed with the server's code and data kept
// (unrelayed gives them back), and passes everything else on byte for
// byte: other messages and events, the other lines of the event, an
// event too large to examine.
func TestClosingCodeRelay(t *testing.T) {
	errAnswer := func(code int) string {
		return `{"jsonrpc":"2.0","id":7,"error":{"code":` + strconv.Itoa(code) + `,"message":"the server's own","data":{"n":1}}}`
	}
	relayedAnswer := `{"error":{"code":-3200399,"data":{"aipfleet_sidecar_jsonrpc_code":-32003,"data":{"n":1}},"message":"the server's own"},"id":7,"jsonrpc":"2.0"}`
	progress := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"-32003","progress":1}}`
	other := `{"jsonrpc":"2.0","id":8,"error":{"code":-32000,"message":"-32003"}}`
	big := `{"jsonrpc":"2.0","id":9,"error":{"code":-32003,"message":"` + strings.Repeat("x", maxRelayed) + `"}}`
	for _, c := range []struct {
		name, contentType, in, want string
	}{
		{"JSON answer", "application/json", errAnswer(-32003), relayedAnswer},
		{"JSON batch", "application/json", "[" + other + "," + errAnswer(-32003) + "]", "[" + other + "," + relayedAnswer + "]"},
		{"JSON without one", "application/json", other, other},
		{"SSE", "text/event-stream",
			"event: message\nid: 1\ndata: " + progress + "\n\nevent: message\nid: 2\ndata: " + errAnswer(-32003) + "\n\n: comment\n\n",
			"event: message\nid: 1\ndata: " + progress + "\n\nevent: message\nid: 2\ndata: " + relayedAnswer + "\n\n: comment\n\n"},
		{"SSE with CRLF and split data", "text/event-stream",
			"id: 3\r\ndata: " + errAnswer(-32003)[:17] + "\r\ndata:" + errAnswer(-32003)[17:] + "\r\n\r\n",
			"id: 3\r\ndata: " + relayedAnswer + "\n\r\n"},
		{"SSE ending without a blank line", "text/event-stream", "data: " + errAnswer(-32003), "data: " + relayedAnswer + "\n"},
		{"SSE event too large", "text/event-stream",
			"data: " + big + "\n\ndata: " + errAnswer(-32003) + "\n\n",
			"data: " + big + "\n\ndata: " + relayedAnswer + "\n\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := relayed(t, c.contentType, c.in); got != c.want {
				if len(got) > 400 {
					got = got[:200] + "..." + got[len(got)-200:]
				}
				t.Errorf("relayed:\n%q\nwant:\n%q", got, c.want)
			}
		})
	}
	var msg struct{ Error *jsonrpc.Error }
	if err := json.Unmarshal([]byte(relayedAnswer), &msg); err != nil {
		t.Fatal(err)
	}
	if we := unrelayed(msg.Error); we.Code != -32003 || we.Message != "the server's own" || !bytes.Equal(we.Data, []byte(`{"n":1}`)) {
		t.Errorf("unrelayed = %+v; want the server's code, message and data", we)
	}
	// A server's own use of the stand-in code, without the key, is its own.
	own := &jsonrpc.Error{Code: codeRelayed, Message: "m", Data: json.RawMessage(`{"x":1}`)}
	if we := unrelayed(own); we != own {
		t.Errorf("unrelayed(%+v) = %+v; want it as it is", own, we)
	}
}
