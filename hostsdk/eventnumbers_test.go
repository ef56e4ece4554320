package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestPublishRefusesNumbersBeyondADouble: a delivery carries an event's
// data in canonical JSON, whose numbers are doubles (or integers within 64
// bits), so a number beyond a double's range could never be delivered.
// Publish refused it, but as "data must be a JSON object", naming neither
// the number nor where it is; it refuses it now naming the number's path.
// Numbers a double holds (the smallest ones rounded to 0.0 by the
// canonical form) are delivered.
func TestPublishRefusesNumbersBeyondADouble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		f.conn.mu.Lock()
		pub := f.conn.pub
		f.conn.mu.Unlock()
		aipEvent := func(kind, data string) aip.Event { return aip.Event{Kind: kind, Data: json.RawMessage(data)} }
		for _, c := range []struct{ data, path, number string }{
			{`{"a":{"b":[1,1e400]}}`, "data.a.b[1]", "1e400"},
			{`{"z":1,"x y":[{"n":-2.5E+131072}]}`, `data["x y"][0].n`, "-2.5E+131072"},
			{`{"n":1` + strings.Repeat("0", 400) + `}`, "data.n", "(401 characters)"},
		} {
			_, err := pub.Publish(context.Background(), "test.events", aipEvent("ok", `{}`), aipEvent("big", c.data))
			if !errors.Is(err, hostsdk.ErrInvalidEvents) || !strings.Contains(err.Error(), c.path+": the number ") ||
				!strings.Contains(err.Error(), c.number) || !strings.Contains(err.Error(), "double") {
				t.Fatalf("Publish of data %.60s: %v; want ErrInvalidEvents naming %s and the number %s", c.data, err, c.path, c.number)
			}
		}
		if f.j.pending(t) != 0 {
			t.Fatalf("a refused batch is in the outbox")
		}
		if _, err := pub.Publish(context.Background(), "test.events",
			aipEvent("edges", `{"max":1.7976931348623157e308,"tiny":1e-400,"big":123456789012345678901234567890}`)); err != nil {
			t.Fatalf("Publish of numbers a double holds: %v", err)
		}
		synctest.Wait()
		ev := f.in.Events()
		if len(ev) != 1 {
			t.Fatalf("the ingress stored %d events, want the one within a double's range", len(ev))
		}
		var got map[string]json.Number
		if err := json.Unmarshal(ev[0].Data, &got); err != nil || got["tiny"] != "0.0" || got["max"] != "1.7976931348623157e308" {
			t.Fatalf("delivered data %s (%v), want the canonical numbers", ev[0].Data, err)
		}
	})
}
