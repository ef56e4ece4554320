package calcom

import (
	"testing"
	"time"
)

// A delivery body must be one JSON object: anything after it, a stray
// closing bracket included, is refused.
func TestParseDeliveryRefusesTrailingData(t *testing.T) {
	good := string(deliveryBody("BOOKING_CREATED", time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), "bk_1"))
	if _, _, msg := parseDelivery([]byte(good + " \n")); msg != "" {
		t.Fatalf("a delivery with trailing whitespace: %s", msg)
	}
	for _, tail := range []string{"}", "]", " }", "{}", "x", `"s"`, "1"} {
		if _, _, msg := parseDelivery([]byte(good + tail)); msg == "" {
			t.Errorf("a delivery followed by %q was accepted", tail)
		}
	}
}
