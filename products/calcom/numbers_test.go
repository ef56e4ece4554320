package calcom

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
)

// JSON allows other spellings of an integer (42.0, 4.2e1) and the input
// schema's "integer" accepts them: they go to Cal.diy as the integers
// they are. Sent as written, a path ID "42.0" is refused by Cal.diy's
// integer parsing after the host validated it, and a query parameter the
// API reads with parseInt ("4.2e1" is 4) names another event type.
func TestIntegerSpellings(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	for _, tc := range []struct {
		suffix, input, path string
		query               map[string]string
	}{
		{"event_type.get", `{"event_type_id":42.0}`, "/v2/event-types/42", nil},
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06","event_type_id":4.2e1,"duration":3E1}`, "/v2/slots",
			map[string]string{"eventTypeId": "42", "duration": "30"}},
		{"booking.list", `{"event_type_ids":[11.0,1.2e1],"take":1e1}`, "/v2/bookings",
			map[string]string{"eventTypeIds": "11,12", "take": "10"}},
		{"booking.attendee.get", `{"booking_uid":"bk_1","attendee_id":21.0}`, "/v2/bookings/bk_1/attendees/21", nil},
	} {
		_, resp := h.act(t, tc.suffix, tc.input)
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultCompleted {
			t.Errorf("%s %s: HTTP %d %s", tc.suffix, tc.input, resp.Status, resp.Raw)
			continue
		}
		reqs := mock.requests()
		got := reqs[len(reqs)-1]
		if got.EscapedPath != tc.path {
			t.Errorf("%s %s: path %s, want %s", tc.suffix, tc.input, got.EscapedPath, tc.path)
		}
		for k, v := range tc.query {
			if got.Query.Get(k) != v {
				t.Errorf("%s %s: query %s=%q, want %q", tc.suffix, tc.input, k, got.Query.Get(k), v)
			}
		}
	}
}
