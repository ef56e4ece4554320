package calcom

import (
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// TestTwoHundredWithoutSuccess: a 2xx answer whose envelope does not say
// "status":"success" (the document's statuses are success and error), or
// that has no body at all, confirms nothing. For a mutation Cal.diy took the request and answered
// it, so it may have applied it: outcome_unknown, never sent again — a
// failed result (what "status":"error" gave) invites the caller to book
// or cancel again, and a completed one (what any other status gave)
// claims what the answer does not say, as did the {"status":"success"}
// an empty body was taken for. A read is a failed
// provider.bad_response.
func TestTwoHundredWithoutSuccess(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)

	for _, tc := range []struct {
		name, route, suffix, input string
		a                          answer
	}{
		{"status error", "POST /v2/bookings/bk_6/cancel", "booking.cancel", `{"booking_uid":"bk_6"}`,
			answer{200, `{"status":"error","error":{"code":"BadRequestException","message":"could not cancel"}}`, false}},
		{"status pending", "POST /v2/bookings", "booking.create",
			`{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"UTC"},"event_type_id":11}`,
			answer{201, `{"status":"pending","data":{"uid":"bk_7"}}`, false}},
		{"no status", "POST /v2/bookings/bk_8/reschedule", "booking.reschedule", `{"booking_uid":"bk_8","start":"2050-09-06T10:00:00Z"}`,
			answer{201, `{"data":{"uid":"bk_9"}}`, false}},
		// The document gives every answer a JSON body with its status; an
		// empty one (a proxy's 200, a 204) says nothing of the booking.
		{"empty body", "POST /v2/bookings", "booking.create",
			`{"start":"2050-09-05T10:00:00Z","attendee":{"name":"Bob","time_zone":"UTC"},"event_type_id":11}`,
			answer{201, ``, false}},
		{"204", "POST /v2/bookings/bk_10/cancel", "booking.cancel", `{"booking_uid":"bk_10"}`, answer{204, ``, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock.set(tc.route, tc.a)
			before := len(mock.requests())
			a, _ := h.act(t, tc.suffix, tc.input)
			st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
			mock.set(tc.route, answer{201, bookingAnswer, false})
			h.Act(t, a)
			if n := len(mock.requests()) - before; n != 1 {
				t.Fatalf("the provider got %d requests, want 1 (never sent again)", n)
			}
		})
	}

	for _, body := range []string{`{"status":"ok","data":{"uid":"bk_1"}}`, `{"status":"error","error":{"message":"nope"}}`, ``} {
		mock.set("GET /v2/bookings/bk_1", answer{200, body, false})
		_, resp := h.act(t, "booking.get", `{"booking_uid":"bk_1"}`)
		if pe := protocolError(t, resp); pe.Code != provider.CodeBadResponse || pe.IsRetryable() {
			t.Errorf("read answered 200 %s: error %+v, want %s", body, pe, provider.CodeBadResponse)
		}
	}
}

// TestRequestTimeoutMayHaveApplied: Cal.diy's API answers 408 when the
// work it started took too long (its tRPC exception filter maps a
// TIMEOUT to 408, "The request took too long to complete"), not only
// when the request did not arrive in time, so a mutation answered 408
// may have been applied: outcome_unknown, never sent again. It was a
// failed result marked retryable, inviting the caller to book or cancel
// again. A read answered 408 stays a retryable provider.unavailable.
func TestRequestTimeoutMayHaveApplied(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	timeout := answer{408, `{"status":"error","timestamp":"2050-01-01T00:00:00Z","path":"/v2/bookings","error":{"code":"TRPCError","message":"The request took too long to complete. Please try again later"}}`, false}

	mock.set("POST /v2/bookings", timeout)
	before := len(mock.requests())
	a, _ := h.act(t, "booking.create", `{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"UTC"},"event_type_id":11}`)
	st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
	if err != nil || st.State != aip.StateOutcomeUnknown {
		t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
	}
	mock.set("POST /v2/bookings", answer{201, bookingAnswer, false})
	h.Act(t, a)
	if n := len(mock.requests()) - before; n != 1 {
		t.Fatalf("the provider got %d requests, want 1 (never sent again)", n)
	}

	mock.set("GET /v2/bookings/bk_1", timeout)
	_, resp := h.act(t, "booking.get", `{"booking_uid":"bk_1"}`)
	if pe := protocolError(t, resp); pe.Code != provider.CodeUnavailable || !pe.IsRetryable() {
		t.Errorf("read answered 408: error %+v, want retryable %s", pe, provider.CodeUnavailable)
	}
}
