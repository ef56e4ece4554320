package calcom

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// The AIP idempotency key goes to Cal.diy scoped to the tenant and the
// capability (provider.ScopedIdempotencyKey), never as it is: a Cal.diy
// deployment and key shared by several tenants' hosts must not see two
// tenants' equal keys as one. The digest also lets a key that is not a
// valid HTTP header value (a control character) through: net/http refused
// to send such a header, and that refusal, before any byte was sent, was
// recorded outcome_unknown.
func TestIdempotencyKeyScoped(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	seen := map[string]string{}
	for _, key := range []string{"order-42", "line\nbreak"} {
		a := hostsdktest.NewAction(CapabilityPrefix+"booking.confirm", `{"booking_uid":"bk_1"}`)
		a.IdempotencyKey = key
		res, err := h.Act(t, a).Result()
		if err != nil || res.Status != aip.ResultCompleted {
			t.Fatalf("key %q: result %+v, %v; want completed", key, res, err)
		}
		reqs := mock.requests()
		got := reqs[len(reqs)-1].Header.Get("Idempotency-Key")
		if want := provider.ScopedIdempotencyKey(hostsdktest.TenantID, a.CapabilityID, key); got != want {
			t.Errorf("key %q sent as %q, want %q", key, got, want)
		}
		seen[got] = key
	}
	if len(seen) != 2 {
		t.Errorf("two keys sent as %v", seen)
	}
}
