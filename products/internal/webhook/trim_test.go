package webhook

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestTrimPayload: First's members go first, then the largest members
// (an inner member before a top-level one of the same size), never Keep's
// or InnerKeep's; the result fits; a payload within the bound is
// returned as it is; one that cannot fit with what is kept is an error.
func TestTrimPayload(t *testing.T) {
	long := func(n int) string { return strings.Repeat("x", n) }
	payload, _ := json.Marshal(map[string]any{
		"event":        "message_created",
		"content":      long(100 << 10),
		"conversation": map[string]any{"id": 42, "messages": []string{long(90 << 10)}},
		"record":       map[string]any{"id": "r1", "body": long(60 << 10), "note": long(8 << 10)},
		"extra":        long(60 << 10),
		"small":        "s",
	})
	trim := Trim{First: []string{"conversation.messages", "absent", "absent.inner"}, Keep: []string{"event", "record"},
		Inner: "record", InnerKeep: []string{"id"}}
	got, omitted, err := TrimPayload(payload, 72<<10, trim)
	if err != nil {
		t.Fatal(err)
	}
	// 100 KiB content, then record.body before extra (equal size: the
	// inner member first): the 8 KiB note, 60 KiB extra and the rest fit
	// in 72 KiB.
	if want := "conversation.messages,content,record.body"; strings.Join(omitted, ",") != want {
		t.Errorf("omitted %v, want %s", omitted, want)
	}
	if len(got) > 72<<10 {
		t.Errorf("trimmed payload is %d bytes", len(got))
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(got, &p); err != nil {
		t.Fatal(err)
	}
	if string(p["event"]) != `"message_created"` || string(p["conversation"]) != `{"id":42}` || !strings.Contains(string(p["record"]), `"id":"r1"`) ||
		!strings.Contains(string(p["record"]), `"note"`) || p["small"] == nil || p["extra"] == nil {
		t.Errorf("trimmed payload kept %.300s", got)
	}

	if got, omitted, err := TrimPayload(payload, len(payload), trim); err != nil || string(got) != string(payload) || len(omitted) != 0 {
		t.Errorf("payload within the bound: %d bytes, omitted %v, %v", len(got), omitted, err)
	}
	if _, _, err := TrimPayload([]byte(`{"event":"`+long(2000)+`","other":"`+long(2000)+`"}`), 1000, Trim{Keep: []string{"event"}}); err == nil ||
		!strings.Contains(err.Error(), "(event)") {
		t.Errorf("a kept member over the bound: %v, want an error naming what is kept", err)
	}
	if _, _, err := TrimPayload([]byte(`[`+long(2000)+`]`), 1000, Trim{}); err == nil {
		t.Error("a payload that is not an object was cut down")
	}
}

// TestTrimPayloadManyMembers: a payload of many small members is cut
// down in one pass, not one encoding per member left out.
func TestTrimPayloadManyMembers(t *testing.T) {
	m := map[string]string{"uid": "bk_1"}
	for i := range 100_000 {
		m[fmt.Sprintf("m%06d", i)] = "0123456789"
	}
	payload, _ := json.Marshal(m)
	start := time.Now()
	got, omitted, err := TrimPayload(payload, 64<<10, Trim{Keep: []string{"uid"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) > 64<<10 || len(got) < 60<<10 || len(omitted) == 0 || !strings.Contains(string(got), `"uid":"bk_1"`) {
		t.Errorf("trimmed to %d bytes, %d members omitted", len(got), len(omitted))
	}
	// Members of one size go in name order.
	if omitted[0] != "m000000" || omitted[1] != "m000001" {
		t.Errorf("omitted first %v", omitted[:2])
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %s", d)
	}
}
