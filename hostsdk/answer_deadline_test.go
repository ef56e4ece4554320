package hostsdk_test

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// TestAnswerToAReceiverThatStopsReadingHasADeadline: a dispatcher that
// sends an action and never reads the answer (an unbuffered in-memory
// connection: the first unread byte blocks the write) held the request
// for ever, and with it the action's in-flight slot (and so a drain, until
// DrainTimeout and then the server's forced close): the synchronous
// answer and the stream's chunks and final line were written without a
// deadline. Every answer write now has one (HandleGrace, at least 10 s,
// plus the answer's size at 256 KiB/s); when it passes, the host logs that the answer could
// not be delivered and lets the slot go, and the journaled outcome stays
// for a retry or a status query.
func TestAnswerToAReceiverThatStopsReadingHasADeadline(t *testing.T) {
	for _, mode := range []aip.ActionMode{aip.ModeSync, aip.ModeStreaming} {
		t.Run(string(mode), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var logs hostsdktest.LogBuffer
				b := newBubbleFleet(t, func(c *hostsdk.Config) {
					c.HandleGrace = time.Second
					c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
				})
				ctx := b.awaitFirstBeat(t)
				target := hostsdktest.TargetOf(b.h, b.cfg)
				// An answer larger than the server's 4 KiB write buffer:
				// its write blocks in the request.
				a := action(capEcho, fmt.Sprintf(`{"message":%q}`, strings.Repeat("x", 16<<10)))
				want := aip.StateCompleted
				if mode == aip.ModeStreaming {
					a = action(capStream, `{"message":"s","n":3}`)
					a.Mode, want = mode, aip.StateOutcomeUnknown
				}
				raw := signedAction(t, b.d, target, a)
				c, err := b.client.Transport.(*http.Transport).DialContext(ctx, "tcp", "replica")
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: replica\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
					hostsdk.PathMessages, len(raw), raw); err != nil {
					t.Fatal(err)
				}
				// The receiver never reads. It gets at least 10 s whatever
				// the (here 1 s) grace: a dispatcher relaying a stream
				// pauses its reading that long for a slow client.
				time.Sleep(5 * b.cfg.HandleGrace)
				synctest.Wait()
				if v := b.metric(t, hostsdk.MetricInFlight); v != 1 {
					t.Fatalf("aip_connector_host_in_flight = %v 5 s into the write, want 1: the receiver gets at least 10 s", v)
				}
				// Past the write deadline:
				time.Sleep(30 * time.Second)
				synctest.Wait()
				if v := b.metric(t, hostsdk.MetricInFlight); v != 0 {
					t.Errorf("%s = %v after the answer's write deadline, want 0: the undeliverable answer holds the slot", hostsdk.MetricInFlight, v)
				}
				st, _, err := b.d.Status(ctx, target, a.ID, a.CapabilityID)
				if err != nil || st.State != want {
					t.Errorf("status query: %+v (%v), want %s", st, err, want)
				}
				if l := logs.String(); !strings.Contains(l, "the answer could not be delivered") || !strings.Contains(l, a.ID) {
					t.Errorf("no log line says the answer to %s could not be delivered (%d log lines)", a.ID, strings.Count(l, "\n"))
				}
			})
		})
	}
}
