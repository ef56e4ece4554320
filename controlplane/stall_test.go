package controlplane_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
)

// TestStoppedControlPlaneSaysSo: a heartbeat that waited unread while the
// control plane itself was stopped (SIGSTOP, here its clock jumping past
// the request's window with no tick of its own in between), resent by the
// host's retries, is rejected for its window with a message that says the
// control plane did not run and the request waited — not "check both
// clocks" — and logged once at info: the resent copies are at debug, marked
// as resends. A request held back by its sender while the control plane
// ran keeps the clock hint.
func TestStoppedControlPlaneSaysSo(t *testing.T) {
	logs := &syncBuffer{}
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	h := e.provision("a1")

	// Held back by its sender: the control plane ran the whole time.
	late := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: h.rep.ID, PreviousSequence: 1, ConnectorReady: true}))
	late.IssuedAt = aip.At(e.clock.Now().Add(-40 * time.Second))
	late.ExpiresAt = aip.At(e.clock.Now().Add(-10 * time.Second))
	r := e.post(h.seal(late), late.RequestID)
	r.rejected(t, http.StatusForbidden, "check both clocks")

	// Signed now; the control plane stops for a minute before reading it
	// and its two resent copies.
	held := h.request(aip.HeartbeatCommand(aip.Heartbeat{ReplicaID: h.rep.ID, PreviousSequence: 1, ConnectorReady: true}))
	raw := h.seal(held)
	e.clock.Advance(time.Minute)
	for range 3 {
		r := e.post(raw, held.RequestID)
		r.rejected(t, http.StatusForbidden, "waited 1m0s before the control plane read it: the control plane did not run from")
		if strings.Contains(r.outcome.Message, "clock") && !strings.Contains(r.outcome.Message, "not a clock problem") {
			t.Fatalf("the stopped control plane's rejection suggests the clocks: %s", r.outcome.Message)
		}
	}

	logs.mu.Lock()
	text := logs.b.String()
	logs.mu.Unlock()
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, `"msg":"lifecycle request rejected"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d rejections logged at info, want 2 (the late request, the held one once):\n%s", len(lines), text)
	}
	for _, want := range []string{`"waited":"40s"`, "check both clocks", `"resend":false`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the late request's log lacks %s: %s", want, lines[0])
		}
	}
	for _, want := range []string{`"waited":"1m0s"`, "the control plane did not run from", `"resend":false`} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("the held request's log lacks %s: %s", want, lines[1])
		}
	}
	if strings.Contains(lines[1], "check both clocks") {
		t.Errorf("the held request's log suggests the clocks: %s", lines[1])
	}
}
