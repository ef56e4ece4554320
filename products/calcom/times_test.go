package calcom

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestTimesWithoutZoneRefused: the times that book, move or hold a
// meeting (and private links' expiry, calendar event times, which the
// document types as date-time) must be RFC 3339 date-times with their
// zone (Z or an offset). Cal.diy reads a time
// without one as UTC (the booking input's DateTime.fromISO(start, {zone:
// "utc"})), so "2050-09-05T09:00:00" meant as the attendee's 09:00 in
// Europe/Rome booked 11:00 there. Refused (input_invalid) and nothing
// sent; a time with Z or an offset (as slot.list answers with time_zone)
// goes as given.
func TestTimesWithoutZoneRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	for _, tc := range []struct{ suffix, input string }{
		{"booking.create", `{"start":"2050-09-05T09:00:00","attendee":{"name":"Bob","time_zone":"Europe/Rome"},"event_type_id":11}`},
		{"booking.create", `{"start":"2050-09-05 09:00","attendee":{"name":"Bob","time_zone":"Europe/Rome"},"event_type_id":11}`},
		{"booking.create", `{"start":"2050-09-05","attendee":{"name":"Bob","time_zone":"Europe/Rome"},"event_type_id":11}`},
		{"booking.reschedule", `{"booking_uid":"bk_1","start":"2050-09-06T10:00:00.000"}`},
		{"slot.reservation.create", `{"event_type_id":11,"slot_start":"2050-09-05T09:00"}`},
		{"slot.reservation.create", `{"event_type_id":11,"slot_start":"2050-09-05T09:00Z"}`},
		{"slot.reservation.update", `{"reservation_uid":"rsv_1","event_type_id":11,"slot_start":"2050-09-05T09:00:00"}`},
		{"event_type.private_link.create", `{"event_type_id":11,"expires_at":"2050-12-31T23:59:59"}`},
		{"event_type.private_link.update", `{"event_type_id":11,"link_id":"pl_1","expires_at":"2050-12-31"}`},
		{"calendar.event.update", `{"calendar":"google","event_uid":"ev_1","start":{"time":"2050-09-05T10:00:00","time_zone":"Europe/Rome"}}`},
	} {
		_, resp := h.act(t, tc.suffix, tc.input)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s, want 400 %s", tc.suffix, tc.input, resp.Status, resp.Raw, hostsdk.CodeInputInvalid)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests for times without a zone, first %s %s: %s", len(reqs), reqs[0].Method, reqs[0].Path, reqs[0].Body)
	}

	for _, tc := range []struct{ suffix, input, start string }{
		{"booking.create", `{"start":"2050-09-05T11:00:00.000+02:00","attendee":{"name":"Bob","time_zone":"Europe/Rome"},"event_type_id":11}`,
			"2050-09-05T11:00:00.000+02:00"},
		{"booking.reschedule", `{"booking_uid":"bk_1","start":"2050-09-06T10:00:00.5Z"}`, "2050-09-06T10:00:00.5Z"},
		{"slot.reservation.create", `{"event_type_id":11,"slot_start":"2050-09-05T09:00:00-04:00"}`, "2050-09-05T09:00:00-04:00"},
	} {
		_, r := completedOnce(t, h, mock, tc.suffix, tc.input)
		if got := string(r.Body); !strings.Contains(got, `"`+tc.start+`"`) {
			t.Errorf("%s: body %s, want start %s as given", tc.suffix, got, tc.start)
		}
	}
}
