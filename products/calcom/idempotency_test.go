package calcom

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// An AIP idempotency key that is not a valid HTTP header value (a control
// character) still lets the mutation run: net/http refused to send the
// header, and that refusal, before any byte was sent, was recorded
// outcome_unknown. Such a key goes as "sha256-" and its hex digest; a
// plain one as it is.
func TestIdempotencyKeyNotAHeaderValue(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	sum := sha256.Sum256([]byte("line\nbreak"))
	for _, tc := range []struct{ key, want string }{
		{"order-42", "order-42"},
		{"line\nbreak", "sha256-" + hex.EncodeToString(sum[:])},
	} {
		a := hostsdktest.NewAction(CapabilityPrefix+"booking.confirm", `{"booking_uid":"bk_1"}`)
		a.IdempotencyKey = tc.key
		res, err := h.Act(t, a).Result()
		if err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("key %q: result %+v, %v; want completed", tc.key, res, err)
		}
		reqs := mock.requests()
		if got := reqs[len(reqs)-1].Header.Get("Idempotency-Key"); got != tc.want {
			t.Errorf("key %q sent as %q, want %q", tc.key, got, tc.want)
		}
	}
}
