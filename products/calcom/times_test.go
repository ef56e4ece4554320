package calcom

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
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

// TestReadFiltersWithoutZoneRefused: the time filters of slot.list and
// booking.list take a date (one reading: UTC) or a date-time with its
// zone. A date-time without one is refused as input_invalid and nothing is
// sent: Cal.diy's slots read it as UTC and a Date parsed on its server
// reads it in the server's own zone, neither of which a caller meaning a
// local time asked for. Dates and zoned date-times go as given.
func TestReadFiltersWithoutZoneRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	for _, tc := range []struct{ suffix, input string }{
		{"slot.list", `{"start":"2050-09-05T09:00:00","end":"2050-09-06","event_type_id":11}`},
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06T18:00:00.000","event_type_id":11}`},
		{"slot.list", `{"start":"2050-09-05 09:00","end":"2050-09-06","event_type_id":11}`},
		{"booking.list", `{"after_start":"2050-09-05T09:00:00"}`},
		{"booking.list", `{"before_end":"2050-09-05T09:00"}`},
		{"booking.list", `{"after_created_at":"yesterday"}`},
		{"booking.list", `{"before_created_at":"2050-09-05T09:00:00.000"}`},
		{"booking.list", `{"after_updated_at":"2050-9-5"}`},
		{"booking.list", `{"before_updated_at":"2050-09-05T09:00:00+0200"}`},
	} {
		_, resp := h.act(t, tc.suffix, tc.input)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s, want 400 %s", tc.suffix, tc.input, resp.Status, resp.Raw, hostsdk.CodeInputInvalid)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests for filters without a zone, first %s %s?%s", len(reqs), reqs[0].Method, reqs[0].Path, reqs[0].Query.Encode())
	}

	for _, tc := range []struct{ suffix, input, param, want string }{
		{"slot.list", `{"start":"2050-09-05T09:00:00Z","end":"2050-09-06","event_type_id":11}`, "start", "2050-09-05T09:00:00Z"},
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06T18:00:00.000+02:00","event_type_id":11}`, "end", "2050-09-06T18:00:00.000+02:00"},
		{"booking.list", `{"after_start":"2050-09-05"}`, "afterStart", "2050-09-05"},
		{"booking.list", `{"before_end":"2050-09-05T09:00:00.5-04:00"}`, "beforeEnd", "2050-09-05T09:00:00.5-04:00"},
	} {
		_, r := completedOnce(t, h, mock, tc.suffix, tc.input)
		if got := r.Query.Get(tc.param); got != tc.want {
			t.Errorf("%s %s: query %s=%q, want %q as given", tc.suffix, tc.input, tc.param, got, tc.want)
		}
	}
}

// TestSlotListEndAtUTCMidnightRefused: Cal.diy's slots read end with
// Luxon's DateTime.fromISO(end, {zone: "utc"}), honouring an offset, and
// then stretch any time at 00:00:00 UTC (the fraction aside) to 23:59:59
// that day, as if it were a date alone (adjustEndTime, API v2 2024-09-04).
// An end within the first second of a UTC day, written with Z or an
// offset, would be answered a whole day of slots more than asked: refused
// (input_invalid, naming the date to give instead) and nothing sent.
// Other zoned ends, an offset that is not midnight UTC among them, and
// dates alone go as given.
func TestSlotListEndAtUTCMidnightRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	for _, end := range []string{
		"2050-09-06T00:00:00Z",
		"2050-09-06T00:00:00.000+00:00",
		"2050-09-06T02:00:00+02:00",
		"2050-09-05T19:00:00.5-05:00",
	} {
		_, resp := h.act(t, "slot.list", `{"start":"2050-09-05","end":"`+end+`","event_type_id":11}`)
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInputInvalid {
			t.Errorf("end %s: result %+v, %v; want failed %s", end, res, err, hostsdk.CodeInputInvalid)
			continue
		}
		if !strings.Contains(res.Error.Message, "date 2050-09-05") {
			t.Errorf("end %s: message %q does not name the date to give instead (2050-09-05)", end, res.Error.Message)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests for ends at midnight UTC, first %s?%s", len(reqs), reqs[0].Path, reqs[0].Query.Encode())
	}

	for _, end := range []string{"2050-09-06", "2050-09-06T00:00:01Z", "2050-09-06T00:00:00+02:00", "2050-09-05T23:59:59.999Z"} {
		_, r := completedOnce(t, h, mock, "slot.list", `{"start":"2050-09-05","end":"`+end+`","event_type_id":11}`)
		if got := r.Query.Get("end"); got != end {
			t.Errorf("end %s: sent %q, want it as given", end, got)
		}
	}
}
