package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestFrameGuard: lines up to the limit pass unchanged, however the
// output is cut into reads; an oversized answer becomes the error answer
// to its id (wherever the id stands in it), an oversized notification is
// dropped, and any other oversized line ends the output with an error
// after the lines before it.
func TestFrameGuard(t *testing.T) {
	const limit = 64
	big := strings.Repeat("y", 2*limit)
	small := `{"jsonrpc":"2.0","id":1,"result":{}}` + "\n"
	for _, tc := range []struct {
		name, over string
		id         string // the answer's id; "" when it is not an answer
		dropped    bool   // a notification
	}{
		{"answer, id first", `{"jsonrpc":"2.0","id":7,"result":{"text":"` + big + `"}}`, "7", false},
		{"answer, id last", `{"result":{"content":[{"type":"text","text":"` + big + `\"}{,\"id\":5"}]},"jsonrpc":"2.0", "id" : "s-1" }`, `"s-1"`, false},
		{"error answer", `{"jsonrpc":"2.0","error":{"code":1,"message":"` + big + `"},"id":-3}`, "-3", false},
		{"notification", `{"jsonrpc":"2.0","method":"notifications/progress","params":{"m":"` + big + `"}}`, "", true},
		{"request", `{"jsonrpc":"2.0","id":9,"method":"sampling/createMessage","params":{"m":"` + big + `"}}`, "", false},
		{"nested id only", `{"jsonrpc":"2.0","result":{"id":4,"t":"` + big + `"}}`, "", false},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"result":"` + big + `"}`, "", false},
		{"batch", `[{"jsonrpc":"2.0","id":1,"result":"` + big + `"}]`, "", false},
	} {
		in := small + tc.over + "\n" + small + `{"last":true}`
		want := small
		switch {
		case tc.id != "":
			want += `{"error":{"code":-32090,"data":{"bytes":` + strconv.Itoa(len(tc.over)) + `,"max_bytes":64},"message":"` + msgAnswerTooLarge + `"},"id":` + tc.id + `,"jsonrpc":"2.0"}` + "\n"
		case !tc.dropped:
			// The output ends at the line.
		}
		if tc.id != "" || tc.dropped {
			want += small + `{"last":true}`
		}
		for name, wrap := range map[string]func(io.Reader) io.Reader{
			"whole": func(r io.Reader) io.Reader { return r }, "bytewise": iotest.OneByteReader, "halves": iotest.HalfReader,
		} {
			t.Run(tc.name+"/"+name, func(t *testing.T) {
				g := newFrameGuard(wrap(strings.NewReader(in)), limit, slog.New(slog.DiscardHandler))
				got, err := io.ReadAll(g)
				if string(got) != want {
					t.Errorf("read %q\nwant %q", got, want)
				}
				if fails := tc.id == "" && !tc.dropped; fails != (err != nil) || err != nil && !strings.Contains(err.Error(), "not an answer to a call") {
					t.Errorf("error %v; want one: %v", err, fails)
				}
			})
		}
	}
	// A line of exactly the limit passes.
	exact := `{"id":1,"result":"` + strings.Repeat("z", limit-len(`{"id":1,"result":""}`)) + `"}` + "\n"
	if got, err := io.ReadAll(newFrameGuard(strings.NewReader(exact), limit, slog.New(slog.DiscardHandler))); string(got) != exact || err != nil {
		t.Errorf("a line of %d bytes: read %q, %v", limit, got, err)
	}
}

// TestMCPOversizedStdioAnswerFailsOnlyItsCall: a stdio server's answer
// longer than maxMCPLine fails its call as a result that cannot be used
// (a read: failed connector_host.output_invalid; otherwise
// outcome_unknown), and nothing else: a call in flight keeps waiting, the
// session stays up (no restart) and later calls are answered. The SDK's
// own limit ended the session: every call in flight became
// outcome_unknown and the server was restarted.
func TestMCPOversizedStdioAnswerFailsOnlyItsCall(t *testing.T) {
	m, _, man := connectRestartingStdioMCP(t)
	ctx := ctxT(t)
	stuckCtx, cancelStuck := context.WithCancel(ctx)
	defer cancelStuck()
	stuck := make(chan error, 1)
	go func() {
		_, err := m.Handle(stuckCtx, toolCall(t, man, "stuck", `{}`))
		stuck <- err
	}()
	input := `{"bytes":` + strconv.Itoa(maxMCPLine+100) + `}`
	_, err := m.Handle(ctx, toolCall(t, man, "huge", input))
	var pe *aip.ProtocolError
	if !errors.As(err, &pe) || pe.Code != hostsdk.CodeOutputInvalid || pe.IsRetryable() || !strings.Contains(pe.Message, "larger than") {
		t.Errorf("an oversized read: %v; want %s naming the size", err, hostsdk.CodeOutputInvalid)
	}
	_, err = m.Handle(ctx, toolCall(t, man, "huge_rw", input))
	if !errors.Is(err, hostsdk.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("an oversized answer to a write: %v; want outcome unknown naming the size", err)
	}
	if res, err := m.Handle(ctx, toolCall(t, man, "lookup", `{}`)); err != nil || res.Status != aip.ResultCompleted {
		t.Errorf("a call after the oversized answers: %+v, %v", res, err)
	}
	select {
	case err := <-stuck:
		t.Errorf("the call in flight ended: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	if st := m.snapshot(); st.Restarts != 0 || st.Starts != 1 {
		t.Errorf("status %+v: the session was re-established", st)
	}
}
