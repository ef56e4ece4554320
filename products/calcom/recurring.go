package calcom

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// listBookings says how to find what a booking.create booked.
const listBookings = "list the attendee's bookings of the event type from start " +
	"(booking.list with attendee_email, event_type_id, after_start)"

// seriesError returns err, the error of a booking.create whose request
// body was body. An error that may have been applied (a 5xx, no answer,
// an unreadable 2xx: outcome_unknown already) gets a message saying how
// to find what was booked, without a further request: the booking, and
// all or some of a series' occurrences, may be booked (see unknownHint).
// A 4xx is returned unchanged unless Cal.diy refused it after it may have
// booked part of a recurring series; then the error may have been applied
// (outcome_unknown) and says how to find what was booked.
//
// For a recurring event type POST /v2/bookings books every occurrence
// with its own call of the regular booking service, one after the other,
// with no transaction around them (RecurringBookingService's
// handleNewRecurringBooking, packages/features/bookings/lib/service/),
// and stops at the first occurrence refused. Checks that depend on the
// occurrence run for each (the booking window,
// validateBookingTimeIsNotOutOfBounds; the booker's active bookings,
// checkActiveBookingsLimitForBooker; duration limits), and
// API v2 answers such a refusal with a 4xx (400 from
// ErrorsBookingsService_2024_08_13.handleBookingError, or the
// HttpError's own status), the occurrences booked before it staying
// booked. The published document describes only the 201 answer (data:
// one booking, or an array of RecurringBookingOutput_2024_08_13 for a
// series).
//
// A 429 is left as it is (API v2's throttler answers before any booking
// code runs), and so is a 404 (the event type, user or team was not
// found: BookingsService_2024_08_13.getBookedEventType looks them up
// before booking, and a lookup that fails fails for every occurrence
// alike), as is any 4xx of a single booking: recurrence_count 1, or no
// recurrence_count and an event type that Cal.diy says is not recurring
// (recurrence null), which seriesOf asks it only then.
func (c *Connector) seriesError(ctx context.Context, call *hostsdk.Call, body map[string]any, err error) error {
	var pe *provider.Error
	if !errors.As(err, &pe) {
		return err
	}
	if pe.MayHaveApplied {
		pe.Message = unknownHint(body) + ". What went wrong: " + pe.Message
		return err
	}
	if pe.Status < 400 || pe.Status > 499 || pe.Status == http.StatusTooManyRequests || pe.Status == http.StatusNotFound {
		return err
	}
	series, why := c.seriesOf(ctx, call, body)
	if !series {
		return err
	}
	pe.MayHaveApplied = true
	pe.Message = fmt.Sprintf("refused, but may have booked some occurrences first: Cal.diy books a recurring booking's "+
		"occurrences one at a time and keeps those booked before the one it refuses; "+listBookings+" and cancel "+
		"or keep them before booking again (the booking may be recurring: %s). Cal.diy said: %s",
		c.client.Redacted(why), pe.Message)
	return err
}

// unknownHint says what a booking.create whose request body was body
// may have booked when its outcome is unknown, and how to find it. The
// body's recurrence_count settles whether it was a series; without it
// Cal.diy books the event type's own count, which is not looked up (the
// read would follow an answer that was lost or a 5xx, when Cal.diy is
// likely slow or failing), so the hint covers both.
func unknownHint(body map[string]any) string {
	const then = " and cancel or keep them before booking again"
	n, ok := body["recurrenceCount"].(json.Number)
	count, err := n.Int64()
	switch {
	case ok && err == nil && count < 2:
		return "the booking may have been made: " + listBookings + then
	case ok:
		return "the booking may have been made, wholly or in part: Cal.diy books a recurring booking's " +
			n.String() + " occurrences one at a time, each kept when a later one fails; " + listBookings + then
	}
	return "the booking may have been made, and if the event type is recurring (recurrence_count was not given, " +
		"so Cal.diy books the event type's own count) some or all of its occurrences, which Cal.diy books one at a time; " +
		listBookings + then
}

// seriesOf reports whether the booking body asks for may be a recurring
// series, and why: recurrence_count 2 or more says so and 1 says not;
// without it Cal.diy books the event type's own count, so the event type
// is read (by ID, or by username and slug). An event type that cannot be
// read (given by team slug, or the read failed) may be recurring.
func (c *Connector) seriesOf(ctx context.Context, call *hostsdk.Call, body map[string]any) (bool, string) {
	if n, ok := body["recurrenceCount"].(json.Number); ok {
		count, err := n.Int64()
		if err == nil && count < 2 {
			return false, ""
		}
		return true, "recurrence_count " + n.String()
	}
	h := http.Header{}
	h.Set("x-aip-action-id", call.Action.ID)
	if call.Tenant.TenantID != "" {
		h.Set("x-aip-tenant-id", call.Tenant.TenantID)
	}
	h.Set("cal-api-version", versionEventTypes)
	type eventType struct {
		Slug       string          `json:"slug"`
		Recurrence json.RawMessage `json:"recurrence"`
	}
	recurring := func(what string, et eventType) (bool, string) {
		switch string(et.Recurrence) {
		case "null":
			return false, ""
		case "":
			return true, what + " was read without its recurrence"
		}
		return true, what + " is recurring"
	}
	if id, ok := body["eventTypeId"].(json.Number); ok {
		what := "event type " + id.String()
		out, err := c.call(ctx, provider.Request{Method: http.MethodGet, Path: "/v2/event-types/" + url.PathEscape(id.String()), Header: h})
		if err != nil {
			return true, fmt.Sprintf("whether %s is recurring could not be read: %v", what, err)
		}
		var ans struct {
			Data eventType `json:"data"`
		}
		if err := json.Unmarshal(out, &ans); err != nil {
			return true, fmt.Sprintf("whether %s is recurring could not be read: %v", what, err)
		}
		return recurring(what, ans.Data)
	}
	slug, _ := body["eventTypeSlug"].(string)
	user, _ := body["username"].(string)
	if slug == "" || user == "" {
		return true, "the event type, given by team slug, is not looked up"
	}
	what := fmt.Sprintf("event type %q of %q", slug, user)
	q := url.Values{"username": {user}, "eventSlug": {slug}}
	if org, _ := body["organizationSlug"].(string); org != "" {
		q.Set("orgSlug", org)
	}
	out, err := c.call(ctx, provider.Request{Method: http.MethodGet, Path: "/v2/event-types", Query: q, Header: h})
	if err != nil {
		return true, fmt.Sprintf("whether %s is recurring could not be read: %v", what, err)
	}
	var ans struct {
		Data []eventType `json:"data"`
	}
	if err := json.Unmarshal(out, &ans); err != nil {
		return true, fmt.Sprintf("whether %s is recurring could not be read: %v", what, err)
	}
	var found []eventType
	for _, et := range ans.Data {
		if et.Slug == slug {
			found = append(found, et)
		}
	}
	if len(found) != 1 {
		return true, fmt.Sprintf("%d event types answered for %s", len(found), what)
	}
	return recurring(what, found[0])
}
