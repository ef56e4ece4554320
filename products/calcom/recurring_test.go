package calcom

import (
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
)

// Answers of a weekly event type (its recurrence set) and of the refusal
// of an occurrence past the event type's booking window, as API v2's
// handleBookingError words it.
const (
	weeklyJSON      = `{"id":12,"lengthInMinutes":30,"title":"Weekly","slug":"weekly","description":"","locations":[],"recurrence":{"interval":1,"occurrences":4,"frequency":"weekly"}}`
	weeklyAnswer    = `{"status":"success","data":` + weeklyJSON + `}`
	outOfBoundsBody = `{"status":"error","error":{"code":"BadRequestException","message":"The event type can't be booked at the \"start\" time provided."}}`
)

// recurringOccurrence is one RecurringBookingOutput_2024_08_13.
func recurringOccurrence(id int, start, end string) string {
	return fmt.Sprintf(`{"id":%d,"uid":"bk_r%d","title":"Weekly between Alice and Bob","description":"","hosts":[{"id":7,"name":"Alice","email":"alice@example.test","displayEmail":"alice@example.test","username":"alice","timeZone":"Europe/Rome"}],`+
		`"status":"accepted","start":%q,"end":%q,"duration":30,"eventTypeId":12,"eventType":{"id":12,"slug":"weekly"},"location":"","absentHost":false,`+
		`"createdAt":"2050-09-01T10:00:00.000Z","updatedAt":"2050-09-01T10:00:00.000Z","attendees":[{"name":"Bob","email":"bob@example.test","displayEmail":"bob@example.test","timeZone":"Europe/Rome","absent":false}],`+
		`"bookingFieldsResponses":{},"recurringBookingUid":"rec_1"}`, id, id, start, end)
}

// TestRecurringRefusalMayHaveBooked: Cal.diy books a recurring booking's
// occurrences one at a time and keeps those booked before the one it
// refuses, so a 4xx to a booking that may be recurring is outcome_unknown
// (never sent again) with a message saying to list the bookings; before,
// it was a failed provider.invalid_request, as if nothing was booked.
func TestRecurringRefusalMayHaveBooked(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	const attendee = `"attendee":{"name":"Bob","time_zone":"Europe/Rome","email":"bob@example.test"}`
	cases := []struct {
		name, input string
		refusal     answer
		lookup      map[string]answer // further answers the mock gives
		reads       []string          // the reads the adapter makes after the refusal: "METHOD /path?query"
		why         string            // in the message
	}{
		{"recurrence_count", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":4}`,
			answer{400, outOfBoundsBody, false}, nil, nil, "recurrence_count 4"},
		{"recurrence_count and a conflict", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":3}`,
			answer{409, `{"status":"error","error":{"code":"ConflictException","message":"booking already exists"}}`, false}, nil, nil, "recurrence_count 3"},
		{"recurring event type by ID", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12}`,
			answer{400, outOfBoundsBody, false}, map[string]answer{"GET /v2/event-types/12": {200, weeklyAnswer, false}},
			[]string{"GET /v2/event-types/12?"}, "event type 12 is recurring"},
		{"recurring event type by slug", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_slug":"weekly","username":"alice","organization_slug":"acme"}`,
			answer{400, outOfBoundsBody, false}, map[string]answer{"GET /v2/event-types": {200, `{"status":"success","data":[` + weeklyJSON + `]}`, false}},
			[]string{"GET /v2/event-types?eventSlug=weekly&orgSlug=acme&username=alice"}, `event type "weekly" of "alice" is recurring`},
		{"event type not readable", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":13}`,
			answer{403, `{"status":"error","error":{"code":"ForbiddenException","message":"booking limit reached"}}`, false},
			map[string]answer{"GET /v2/event-types/13": {500, `{"status":"error","error":{"message":"boom"}}`, false}},
			[]string{"GET /v2/event-types/13?"}, "whether event type 13 is recurring could not be read"},
		{"event type answered without recurrence", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":14}`,
			answer{400, outOfBoundsBody, false},
			map[string]answer{"GET /v2/event-types/14": {200, `{"status":"success","data":{"id":14,"lengthInMinutes":30,"title":"Old","slug":"old","description":"","locations":[]}}`, false}},
			[]string{"GET /v2/event-types/14?"}, "event type 14 was read without its recurrence"},
		{"team event type", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_slug":"weekly","team_slug":"sales"}`,
			answer{400, outOfBoundsBody, false}, nil, nil, "given by team slug"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mock.set("POST /v2/bookings", tc.refusal)
			for route, a := range tc.lookup {
				mock.set(route, a)
			}
			before := len(mock.requests())
			a, resp := h.act(t, "booking.create", tc.input)
			pe := resp.ProtocolError()
			if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Fatalf("answer %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
			}
			for _, want := range []string{"may have booked some occurrences", "booking.list with attendee_email, event_type_id, after_start",
				tc.why, fmt.Sprintf("answered %d", tc.refusal.status)} {
				if !strings.Contains(pe.Message, want) {
					t.Errorf("message %q lacks %q", pe.Message, want)
				}
			}
			st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
			reqs := mock.requests()[before:]
			if len(reqs) != 1+len(tc.reads) || reqs[0].Method != "POST" || reqs[0].Path != "/v2/bookings" {
				t.Fatalf("the provider got %d requests, want the booking and %v", len(reqs), tc.reads)
			}
			for i, want := range tc.reads {
				r := reqs[1+i]
				if got := r.Method + " " + r.Path + "?" + r.Query.Encode(); got != want {
					t.Errorf("read %d: %s, want %s", i, got, want)
				}
				if v := r.Header.Get("cal-api-version"); v != versionEventTypes {
					t.Errorf("read %d: cal-api-version %q, want %s", i, v, versionEventTypes)
				}
				if r.Header.Get("X-Aip-Action-Id") != a.ID {
					t.Errorf("read %d: x-aip-action-id %q, want %s", i, r.Header.Get("X-Aip-Action-Id"), a.ID)
				}
			}
			// The same action again: journaled, never sent to Cal.diy.
			mock.set("POST /v2/bookings", answer{201, bookingAnswer, false})
			h.Act(t, a)
			if n := len(mock.requests()) - before; n != len(reqs) {
				t.Fatalf("after the action was sent again the provider got %d requests, want %d", n, len(reqs))
			}
		})
	}
}

// TestSingleBookingRefusalFails: a 4xx to a booking that is not recurring
// (recurrence_count 1, or an event type whose recurrence is null) stays a
// failed result, as do a 429 (API v2's throttler answers it before any
// booking is made) and a 404 (the event type was not found, which fails
// the first occurrence as every other), without reading the event type.
func TestSingleBookingRefusalFails(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	const attendee = `"attendee":{"name":"Bob","time_zone":"Europe/Rome","email":"bob@example.test"}`
	cases := []struct {
		name, input string
		refusal     answer
		lookup      map[string]answer
		requests    int
		code        string
	}{
		{"event type not recurring", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":11}`,
			answer{400, `{"status":"error","error":{"code":"BadRequestException","message":"User either already has booking at this time or is not available"}}`, false},
			nil, 2, provider.CodeInvalidRequest},
		{"event type by slug not recurring", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_slug":"intro","username":"alice"}`,
			answer{400, outOfBoundsBody, false}, nil, 2, provider.CodeInvalidRequest},
		{"recurrence_count 1", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":1}`,
			answer{400, outOfBoundsBody, false}, nil, 1, provider.CodeInvalidRequest},
		{"rate limited", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":4}`,
			answer{429, `{"status":"error","error":{"message":"ThrottlerException: Too Many Requests"}}`, false}, nil, 1, provider.CodeRateLimited},
		{"not found", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":99}`,
			answer{404, `{"status":"error","error":{"code":"NotFoundException","message":"Event type with id 99 not found."}}`, false},
			nil, 1, provider.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mock.set("POST /v2/bookings", tc.refusal)
			for route, a := range tc.lookup {
				mock.set(route, a)
			}
			before := len(mock.requests())
			_, resp := h.act(t, "booking.create", tc.input)
			pe := protocolError(t, resp)
			if pe.Code != tc.code {
				t.Fatalf("error %+v, want %s", pe, tc.code)
			}
			if strings.Contains(pe.Message, "occurrences") {
				t.Errorf("a single booking's refusal speaks of occurrences: %q", pe.Message)
			}
			if n := len(mock.requests()) - before; n != tc.requests {
				t.Fatalf("the provider got %d requests, want %d", n, tc.requests)
			}
		})
	}
}

// TestRecurringBookingCreated: a recurring booking's answer (data: an
// array of RecurringBookingOutput_2024_08_13, which the document's
// CreateBookingOutput_2024_08_13 allows) is the output as sent, with one
// request and the recurring body (Option 3) the mock checks.
func TestRecurringBookingCreated(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	created := `{"status":"success","data":[` + recurringOccurrence(31, "2050-09-05T09:00:00.000Z", "2050-09-05T09:30:00.000Z") + `,` +
		recurringOccurrence(32, "2050-09-12T09:00:00.000Z", "2050-09-12T09:30:00.000Z") + `]}`
	if err := spectest.Load(t, "cal-diy/openapi.json").ValidateSchema("/components/schemas/CreateBookingOutput_2024_08_13", []byte(created)); err != nil {
		t.Fatalf("the canned answer does not follow the document: %v", err)
	}
	mock.set("POST /v2/bookings", answer{201, created, false})
	res, req := completedOnce(t, &testHost{h.Fixture}, mock, "booking.create",
		`{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"Europe/Rome","email":"bob@example.test"},"event_type_id":12,"recurrence_count":2}`)
	jsonEqual(t, "output", res.Output, created)
	jsonEqual(t, "body", req.Body, `{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","timeZone":"Europe/Rome","email":"bob@example.test"},"eventTypeId":12,"recurrenceCount":2}`)
	if q := req.Query; len(q) != 0 {
		t.Errorf("query %v, want none", url.Values(q))
	}
}

// TestUnknownBookingSaysHowToFind: a booking.create whose outcome is
// unknown (a 5xx, a dropped answer, an unreadable 2xx) says to list the
// attendee's bookings, and for a series that some or all occurrences may
// be booked, without any request after the booking's; before, its
// message was only the provider's answer.
func TestUnknownBookingSaysHowToFind(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	const attendee = `"attendee":{"name":"Bob","time_zone":"Europe/Rome","email":"bob@example.test"}`
	cases := []struct {
		name, input string
		a           answer
		want        []string // in the message
	}{
		{"500 to a series", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":4}`,
			answer{500, `{"status":"error","error":{"message":"boom"}}`, false},
			[]string{"wholly or in part", "recurring booking's 4 occurrences one at a time", "answered 500", "What went wrong: boom"}},
		{"dropped series", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12,"recurrence_count":3}`,
			answer{drop: true}, []string{"recurring booking's 3 occurrences one at a time", "What went wrong: no answer"}},
		{"502 without recurrence_count", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":12}`,
			answer{502, `{"status":"error","error":{"message":"bad gateway"}}`, false},
			[]string{"if the event type is recurring", "some or all of its occurrences", "What went wrong: bad gateway"}},
		{"non-JSON 201 to a single booking", `{"start":"2050-09-05T09:00:00Z",` + attendee + `,"event_type_id":11,"recurrence_count":1}`,
			answer{201, `<html>ok</html>`, false}, []string{"the booking may have been made: list", "not a JSON object"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mock.set("POST /v2/bookings", tc.a)
			before := len(mock.requests())
			a, resp := h.act(t, "booking.create", tc.input)
			pe := resp.ProtocolError()
			if pe == nil || pe.Code != hostsdk.CodeOutcomeUnknown {
				t.Fatalf("answer %d %s, want %s", resp.Status, resp.Raw, hostsdk.CodeOutcomeUnknown)
			}
			for _, want := range append(tc.want, "booking.list with attendee_email, event_type_id, after_start", "before booking again") {
				if !strings.Contains(pe.Message, want) {
					t.Errorf("message %q lacks %q", pe.Message, want)
				}
			}
			if n := len(mock.requests()) - before; n != 1 {
				t.Fatalf("the provider got %d requests, want the booking's only", n)
			}
			st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
		})
	}
}
