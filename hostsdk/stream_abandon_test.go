package hostsdk_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// chattyConnector's stream ignores its context and keeps sending 2 MiB
// chunks until a Send fails; it reports that error on sendErr and then
// runs on until unstick is closed.
type chattyConnector struct {
	*testConnector
	sendErr chan error
	unstick chan struct{}
}

func (c *chattyConnector) HandleStream(ctx context.Context, call *hostsdk.Call, chunks *hostsdk.ChunkWriter) (*aip.ActionResult, error) {
	c.countRun(call.Action.ID)
	pad := strings.Repeat("x", 2<<20)
	for i := 0; ; i++ {
		if err := chunks.Send(aip.ChunkProgress, map[string]any{"step": i, "pad": pad}); err != nil {
			c.sendErr <- err
			<-c.unstick
			return nil, err
		}
	}
}

// TestStreamAbandonedWhileItsReceiverPausesIsAnswered: a streaming call
// that ignores its context keeps sending chunks; the dispatcher pauses
// reading (it relays the stream to a slow client, up to its own
// StreamWriteTimeout), so a Send is blocked writing when the host
// abandons the call, HandleGrace after its context ended (its timeout_ms,
// or the shutdown's cancellation at the drain timeout). The dispatcher
// reads again well within that Send's write deadline: the Send completes,
// the next fails with ErrStreamClosed, and the stream's last line is the
// signed outcome_unknown. Abandoning the chunk writer set the response's
// write deadline to now whenever a Send held the writer's lock: the
// blocked write failed, the connection broke, and the dispatcher got a
// stream cut short instead of the answer (at a shutdown, the answer step
// 6 cancels actions to deliver). In a synctest bubble over an unbuffered
// in-memory connection.
func TestStreamAbandonedWhileItsReceiverPausesIsAnswered(t *testing.T) {
	for _, when := range []string{"timeout", "shutdown"} {
		t.Run(when, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var conn *chattyConnector
				b := newWrappedBubbleFleet(t, func(c *hostsdk.Config) {
					c.DrainTimeout, c.DrainLinger, c.HandleGrace = 2*time.Second, time.Millisecond, time.Second
				}, func(tc *testConnector) hostsdk.Connector {
					conn = &chattyConnector{testConnector: tc, sendErr: make(chan error, 1), unstick: make(chan struct{})}
					return conn
				})
				defer close(conn.unstick)
				ctx := b.awaitFirstBeat(t)
				target := hostsdktest.TargetOf(b.h, b.cfg)

				a := action(capStream, `{"message":"chatty"}`)
				a.Mode = aip.ModeStreaming
				if when == "timeout" {
					ms := uint64(50)
					a.TimeoutMS = &ms
				}
				raw := signedAction(t, b.d, target, a)
				resp := postRaw(t, ctx, b.client, target, raw)
				defer resp.Body.Close()
				stopped := make(chan error, 1)
				if when == "shutdown" {
					go func() { stopped <- b.h.Stop(ctx) }()
				}
				// The receiver pauses past the abandonment (the context ends
				// at 50 ms, or at the drain timeout, 2 s; the grace is 1 s),
				// well before the blocked Send's write deadline (1 s + 2 MiB
				// at 256 KiB/s, 9 s).
				time.Sleep(4 * time.Second)
				synctest.Wait()
				var last string
				sc := bufio.NewScanner(resp.Body)
				sc.Buffer(nil, aip.MaxMessageBytes+1)
				lines := 0
				for sc.Scan() {
					last = sc.Text()
					lines++
				}
				if err := sc.Err(); err != nil {
					t.Fatalf("the stream broke after %d lines: %v", lines, err)
				}
				var final aip.Envelope
				if err := json.Unmarshal([]byte(last), &final); err != nil || final.Body.Error == nil || final.Body.Error.Error.Code != hostsdk.CodeOutcomeUnknown {
					t.Fatalf("the stream's last line (of %d) is %.200s (%v), want the signed outcome_unknown", lines, last, err)
				}
				if err := <-conn.sendErr; !errors.Is(err, hostsdk.ErrStreamClosed) {
					t.Errorf("a Send after the abandonment: %v, want ErrStreamClosed", err)
				}
				if when == "shutdown" {
					if err := <-stopped; !strings.Contains(errString(err), "1 abandoned connector call still running") {
						t.Errorf("Stop: %v, want a *ShutdownError naming the abandoned call", err)
					}
				}
				if rec, err := b.cfg.Journal.Action(ctx, a.ID); err != nil || rec.Status != aip.StateOutcomeUnknown {
					t.Errorf("journal record %s (%v), want outcome_unknown", rec.Status, err)
				}
			})
		})
	}
}
