package dispatch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
)

// smallSendBuffers gives each accepted connection a small socket send
// buffer, so a client that stops reading blocks the server's writes after
// a few kilobytes rather than megabytes.
type smallSendBuffers struct{ net.Listener }

func (l smallSendBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetWriteBuffer(8 << 10)
	}
	return c, err
}

// TestStreamingClientThatStopsReading: a streaming client that reads the
// answer's headers and then nothing does not hold up the replica's stream:
// after StreamWriteTimeout the dispatcher stops writing to it, reads the
// rest of the stream, and the action settles completed — not
// outcome_unknown at the hop's deadline, which is what a blocked write
// led to before.
func TestStreamingClientThatStopsReading(t *testing.T) {
	w := newWorld(t, worldOptions{cfg: func(c *dispatch.Config) { c.StreamWriteTimeout = 300 * time.Millisecond }})
	w.startHost(8, 8)
	srv := httptest.NewUnstartedServer(w.d.Handler())
	srv.Listener = smallSendBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		c.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4<<10) })
		return err
	}}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return dialer.DialContext(ctx, network, addr)
		},
		ReadBufferSize:  4 << 10,
		WriteBufferSize: 4 << 10,
	}}
	defer client.CloseIdleConnections()

	// 64 chunks of 64 KiB: 4 MiB, far more than the sockets hold. The
	// hop may take 30 s (streaming 4 MiB under -race on two loaded cores
	// took more than 8 s); the client reads nothing for longer.
	id := aip.NewActionID()
	body, _ := json.Marshal(dispatch.ActionRequest{ActionID: id, CapabilityID: capStream, Mode: aip.ModeStreaming, TimeoutMS: new(uint64(30000)),
		Input: say("flood", `,"chunks":64,"chunk_pad":65536`)})
	req, _ := http.NewRequestWithContext(w.ctx, http.MethodPost, srv.URL+dispatch.PathActions, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+w.token(tenant))
	resp, err := client.Do(req)
	must(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != dispatch.ContentTypeNDJSON {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	// Settled completed well before the hop's deadline; with a write that
	// blocks until then (the defect), outcome_unknown at 30 s.
	var res registry.RouteReservation
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		res, err = w.reg.Reservation(w.ctx, id)
		if err == nil && !res.Reserved && res.LastSettlement != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the action has not settled after 45 s: %+v, %v", res, err)
		}
	}
	if res.LastSettlement != registry.SettlementCompleted {
		t.Fatalf("a streaming action whose client stopped reading settled %s, want completed", res.LastSettlement)
	}
	if runs := w.counter.runs(id); len(runs) != 1 {
		t.Fatalf("ran %d times", len(runs))
	}
	w.idle()
}
