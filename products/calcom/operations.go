package calcom

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// CapabilityPrefix begins every capability ID: "cap:cal_diy:<suffix>".
const CapabilityPrefix = "cap:cal_diy:"

// cal-api-version values, per resource, as the published document
// requires them (its "Must be set to ..." header parameters).
const (
	versionBookings   = "2024-08-13"
	versionSlots      = "2024-09-04"
	versionEventTypes = "2024-06-14"
	versionSchedules  = "2024-06-11"
)

// operation is one capability: an AIP input mapped to one Cal.diy API v2
// call.
type operation struct {
	Suffix      string
	Name        string
	Description string
	Method      string
	// Path is the provider path; {key} is replaced with the input's key,
	// path-escaped.
	Path string
	// Version is the cal-api-version header ("" when the document has
	// none for the operation).
	Version  string
	Mutation bool
	Risk     aip.Risk
	// Required and Props make the input schema (additionalProperties
	// false).
	Required []string
	Props    map[string]any
	// Query maps input keys to query parameters (arrays are sent
	// comma-separated, as the document asks).
	Query map[string]string
	// Body maps input keys to body fields; Nested renames the members of
	// an object-valued input, or of each object of an array-valued one.
	// A nil Body sends no body unless AlwaysBody.
	Body       map[string]string
	Nested     map[string]map[string]string
	AlwaysBody bool
	// MinProps, when not 0, is the input's minProperties (updates need
	// something to change).
	MinProps int
	// Webhook marks the user webhook operations: a subscriber URL must be
	// allowed (subscriber.go), the configured signing secret is sent, and
	// secrets are left out of the output.
	Webhook bool
	// Series marks booking.create, which books every occurrence of a
	// recurring event type one by one: a 4xx may come after some were
	// booked, and an outcome_unknown says how to find what was booked
	// (recurring.go).
	Series bool
	// Check, when set, returns why an input the schema accepts would be
	// misread by Cal.diy, and what to send instead ("" when it is fine):
	// such an input is refused as input_invalid before anything is sent.
	Check func(in map[string]any) string
}

// ID returns the capability ID.
func (o *operation) ID() string { return CapabilityPrefix + o.Suffix }

// Schema helpers.
func str(maxLen int, desc string) map[string]any {
	return map[string]any{"type": "string", "minLength": 1, "maxLength": maxLen, "description": desc}
}

func integer(minimum, maximum int64, desc string) map[string]any {
	return map[string]any{"type": "integer", "minimum": minimum, "maximum": maximum, "description": desc}
}

func enum(desc string, values ...string) map[string]any {
	return map[string]any{"type": "string", "enum": values, "description": desc}
}

// listItem is a string item of a list sent as one comma-separated query
// parameter: it may not hold a comma.
func listItem(maxLen int) map[string]any {
	m := str(maxLen, "")
	m["pattern"] = "^[^,]+$"
	return m
}

// zonedTimePattern is an RFC 3339 date-time: a date, a time with
// seconds and the time's zone (Z or an offset). Cal.diy reads a time without a zone as
// UTC (its booking input parses start with DateTime.fromISO(start, {zone:
// "utc"})), which is not what a caller who meant the attendee's local
// time wanted; the document asks for UTC ("ISO 8601 ... in UTC timezone")
// or format date-time, which requires the zone.
const zonedTimePattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$`

// zonedTime is a date-time input that must say its zone: Z or an offset
// (2050-09-05T09:00:00Z, 2050-09-05T11:00:00+02:00 as slot.list answers
// with time_zone Europe/Rome).
func zonedTime(desc string) map[string]any {
	m := str(maxTime, desc+": an ISO 8601 date-time with its zone, Z or an offset (2050-09-05T09:00:00Z, "+
		"2050-09-05T11:00:00+02:00); a time without one is refused, since Cal.diy would read it as UTC")
	m["pattern"] = zonedTimePattern
	return m
}

// dateOrZonedTimePattern is a date alone (2050-09-05) or a zonedTimePattern
// date-time: what a read filter takes. A date alone has one reading
// (slot.list: the start or end of that day in UTC, as the document says;
// the booking filters: midnight UTC, as JavaScript's Date reads a date),
// whereas a date-time without its zone is read as UTC by Cal.diy's slots
// and in the server's own zone by a Date it parses, neither of which a
// caller meaning a local time wanted.
const dateOrZonedTimePattern = `^[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2}))?$`

// slotListEnd refuses a slot.list end date-time that falls within the
// first second of a UTC day (2050-09-06T00:00:00Z, or the same instant
// as 2050-09-06T02:00:00+02:00). Cal.diy's slots read end with Luxon's
// DateTime.fromISO(end, {zone: "utc"}), which honours an offset and
// converts to UTC (so other zoned times are read right and go as given),
// and then take any time whose UTC hour, minute and second are 0 for a
// date alone, setting it to 23:59:59 of that day
// (SlotsInputService_2024_09_04.adjustEndTime, API v2 2024-09-04): a
// caller asking for slots until midnight would be answered the slots of
// the whole day after. The date of the day before says what was meant (a
// date alone is read to the end of that day).
func slotListEnd(in map[string]any) string {
	s, _ := in["end"].(string)
	if len(s) <= len(time.DateOnly) {
		return ""
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return "" // the schema's pattern admits it; Cal.diy judges it
	}
	u := t.UTC()
	if u.Hour() != 0 || u.Minute() != 0 || u.Second() != 0 {
		return ""
	}
	return fmt.Sprintf("end %q is %s at 00:00:00 UTC, which Cal.diy reads as the end of that day (23:59:59 UTC), "+
		"a whole day more than asked; for slots until that midnight give the date %s (read to the end of that day), "+
		"or a time at least one second past midnight UTC", s, u.Format(time.DateOnly), u.AddDate(0, 0, -1).Format(time.DateOnly))
}

// dateOrZonedTime is a read filter's date or zoned date-time input.
func dateOrZonedTime(desc string) map[string]any {
	m := str(maxTime, desc+": a date (2050-09-05, read as UTC) or an ISO 8601 date-time with its zone, Z or an offset "+
		"(2050-09-05T09:00:00Z, 2050-09-05T11:00:00+02:00); a date-time without one is refused")
	m["pattern"] = dateOrZonedTimePattern
	return m
}

func list(items map[string]any, maxItems int, desc string) map[string]any {
	return map[string]any{"type": "array", "items": items, "minItems": 1, "maxItems": maxItems, "uniqueItems": true, "description": desc}
}

const (
	maxID      = 256
	maxText    = 2048
	maxTime    = 64
	maxIntID   = int64(1) << 53
	maxEmail   = 320
	maxURL     = 2048
	bookingUID = "booking_uid"
)

var (
	bookingUIDProp = str(maxID, "UID of the booking")
	sortOrder      = func(desc string) map[string]any { return enum(desc, "asc", "desc") }
	languages      = []string{"ar", "ca", "de", "es", "eu", "he", "id", "ja", "lv", "pl", "ro", "sr", "th", "vi", "az", "cs",
		"el", "es-419", "fi", "hr", "it", "km", "nl", "pt", "ru", "sv", "tr", "zh-CN", "bg", "da", "en", "et", "fr", "hu",
		"iw", "ko", "no", "pt-BR", "sk", "ta", "uk", "zh-TW", "bn"}
)

// operations are the capabilities, in manifest order.
var operations = []*operation{
	{
		Suffix: "profile.get", Name: "Get the authenticated Cal.diy profile",
		Description: "GET /v2/me: the profile of the user the API key belongs to.",
		Method:      http.MethodGet, Path: "/v2/me", Risk: aip.RiskLow,
	},
	{
		Suffix: "event_type.list", Name: "List event types",
		Description: "GET /v2/event-types: the authenticated user's event types, or another user's by username (cal-api-version 2024-06-14).",
		Method:      http.MethodGet, Path: "/v2/event-types", Version: versionEventTypes, Risk: aip.RiskLow,
		Props: map[string]any{
			"username":        str(maxID, "username whose event types to list"),
			"event_slug":      str(maxID, "slug of one event type (needs username)"),
			"usernames":       list(listItem(maxID), 50, "usernames of a dynamic event type"),
			"org_slug":        str(maxID, "slug of the user's organization"),
			"org_id":          integer(1, maxIntID, "ID of the user's organization"),
			"sort_created_at": sortOrder("order by creation date"),
		},
		Query: map[string]string{"username": "username", "event_slug": "eventSlug", "usernames": "usernames",
			"org_slug": "orgSlug", "org_id": "orgId", "sort_created_at": "sortCreatedAt"},
	},
	{
		Suffix: "event_type.get", Name: "Get an event type",
		Description: "GET /v2/event-types/{eventTypeId} (cal-api-version 2024-06-14).",
		Method:      http.MethodGet, Path: "/v2/event-types/{event_type_id}", Version: versionEventTypes, Risk: aip.RiskLow,
		Required: []string{"event_type_id"},
		Props:    map[string]any{"event_type_id": integer(1, maxIntID, "ID of the event type")},
	},
	{
		Suffix: "slot.list", Name: "List available slots",
		Description: "GET /v2/slots: available booking slots between start and end, by event type ID, by event type slug with username or team_slug, or by usernames (cal-api-version 2024-09-04).",
		Method:      http.MethodGet, Path: "/v2/slots", Version: versionSlots, Risk: aip.RiskLow,
		Required: []string{"start", "end"},
		Props: map[string]any{
			"start":                     dateOrZonedTime("from which to look (a date: from the start of that day)"),
			"end":                       dateOrZonedTime("until which to look (a date: to the end of that day)"),
			"event_type_id":             integer(1, maxIntID, "ID of the event type"),
			"event_type_slug":           str(maxID, "slug of the event type (with username or team_slug)"),
			"username":                  str(maxID, "owner of the event type"),
			"team_slug":                 str(maxID, "team owning the event type"),
			"organization_slug":         str(maxID, "organization of the user or team"),
			"usernames":                 list(listItem(maxID), 50, "usernames of a dynamic event"),
			"format":                    enum("range: start and end of each slot; time: start only", "range", "time"),
			"duration":                  integer(1, 1440, "slot length in minutes, for event types with several lengths"),
			"time_zone":                 str(maxTime, "time zone of the returned slots (default UTC)"),
			"booking_uid_to_reschedule": str(maxID, "booking being rescheduled, whose slot stays available"),
		},
		Query: map[string]string{"start": "start", "end": "end", "event_type_id": "eventTypeId",
			"event_type_slug": "eventTypeSlug", "username": "username", "team_slug": "teamSlug",
			"organization_slug": "organizationSlug", "usernames": "usernames", "format": "format",
			"duration": "duration", "time_zone": "timeZone", "booking_uid_to_reschedule": "bookingUidToReschedule"},
		Check: slotListEnd,
	},
	{
		Suffix: "booking.list", Name: "List bookings",
		Description: "GET /v2/bookings: the authenticated user's bookings, filtered, sorted and paged (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings", Version: versionBookings, Risk: aip.RiskLow,
		Props: map[string]any{
			"status":            list(enum("", "upcoming", "recurring", "past", "cancelled", "unconfirmed"), 5, "booking statuses to include"),
			"attendee_email":    str(maxEmail, "attendee email"),
			"attendee_name":     str(maxID, "attendee name"),
			bookingUID:          str(maxID, "booking UID"),
			"event_type_ids":    list(integer(1, maxIntID, ""), 100, "event type IDs"),
			"event_type_id":     integer(1, maxIntID, "event type ID"),
			"team_ids":          list(integer(1, maxIntID, ""), 100, "team IDs"),
			"team_id":           integer(1, maxIntID, "team ID"),
			"after_start":       dateOrZonedTime("bookings starting after this time"),
			"before_end":        dateOrZonedTime("bookings ending before this time"),
			"after_created_at":  dateOrZonedTime("bookings created after this time"),
			"before_created_at": dateOrZonedTime("bookings created before this time"),
			"after_updated_at":  dateOrZonedTime("bookings updated after this time"),
			"before_updated_at": dateOrZonedTime("bookings updated before this time"),
			"sort_start":        sortOrder("order by start"),
			"sort_end":          sortOrder("order by end"),
			"sort_created":      sortOrder("order by creation"),
			"sort_updated_at":   sortOrder("order by last update"),
			"take":              integer(1, 250, "page size (provider default 100)"),
			"skip":              integer(0, 1_000_000, "bookings to skip"),
		},
		Query: map[string]string{"status": "status", "attendee_email": "attendeeEmail", "attendee_name": "attendeeName",
			bookingUID: "bookingUid", "event_type_ids": "eventTypeIds", "event_type_id": "eventTypeId",
			"team_ids": "teamsIds", "team_id": "teamId", "after_start": "afterStart", "before_end": "beforeEnd",
			"after_created_at": "afterCreatedAt", "before_created_at": "beforeCreatedAt",
			"after_updated_at": "afterUpdatedAt", "before_updated_at": "beforeUpdatedAt",
			"sort_start": "sortStart", "sort_end": "sortEnd", "sort_created": "sortCreated",
			"sort_updated_at": "sortUpdatedAt", "take": "take", "skip": "skip"},
	},
	{
		Suffix: "booking.get", Name: "Get a booking",
		Description: "GET /v2/bookings/{bookingUid} (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.create", Name: "Create a booking",
		Description: "POST /v2/bookings: books a slot of an event type (by ID, or by slug with username or team_slug) for one attendee (cal-api-version 2024-08-13). " +
			"For a recurring event type Cal.diy books the occurrences one by one; a refusal may come after some were booked, " +
			"and is then outcome_unknown: list the bookings before booking again.",
		Method: http.MethodPost, Path: "/v2/bookings", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Series:   true,
		Required: []string{"start", "attendee"},
		Props: map[string]any{
			"start": zonedTime("start of the booking"),
			"attendee": map[string]any{
				"type": "object", "additionalProperties": false, "required": []string{"name", "time_zone"},
				"description": "the attendee",
				"properties": map[string]any{
					"name":         str(maxID, "attendee name"),
					"time_zone":    str(maxTime, "attendee time zone, e.g. Europe/Rome"),
					"email":        str(maxEmail, "attendee email"),
					"phone_number": str(32, "attendee phone number in international format"),
					"language":     enum("attendee language", languages...),
				},
			},
			"event_type_id":     integer(1, maxIntID, "ID of the event type"),
			"event_type_slug":   str(maxID, "slug of the event type (with username or team_slug)"),
			"username":          str(maxID, "owner of the event type"),
			"team_slug":         str(maxID, "team owning the event type"),
			"organization_slug": str(maxID, "organization of the user or team"),
			"guests":            list(str(maxEmail, ""), 30, "guest emails"),
			"length_in_minutes": integer(1, 1440, "booking length, for event types with several lengths"),
			"recurrence_count":  integer(1, 730, "recurrences of a recurring event type (default: the event type's own count)"),
			"metadata": map[string]any{"type": "object", "maxProperties": 50, "description": "up to 50 keys of 40 characters, string values up to 500",
				"propertyNames":        map[string]any{"maxLength": 40},
				"additionalProperties": map[string]any{"type": "string", "maxLength": 500}},
			"booking_fields_responses": map[string]any{"type": "object", "maxProperties": 100,
				"description": "answers to custom booking fields, by field slug"},
			"email_verification_code": str(64, "email verification code, when the event type requires one"),
		},
		Body: map[string]string{"start": "start", "attendee": "attendee", "event_type_id": "eventTypeId",
			"event_type_slug": "eventTypeSlug", "username": "username", "team_slug": "teamSlug",
			"organization_slug": "organizationSlug", "guests": "guests", "length_in_minutes": "lengthInMinutes",
			"recurrence_count": "recurrenceCount", "metadata": "metadata",
			"booking_fields_responses": "bookingFieldsResponses", "email_verification_code": "emailVerificationCode"},
		Nested: map[string]map[string]string{"attendee": {"name": "name", "time_zone": "timeZone", "email": "email",
			"phone_number": "phoneNumber", "language": "language"}},
	},
	{
		Suffix: "booking.cancel", Name: "Cancel a booking",
		Description: "POST /v2/bookings/{bookingUid}/cancel (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/cancel", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID},
		Props: map[string]any{bookingUID: bookingUIDProp,
			"cancellation_reason":        str(maxText, "reason shown to the attendees"),
			"cancel_subsequent_bookings": map[string]any{"type": "boolean", "description": "for a recurring booking, also cancel the later recurrences"},
		},
		Body:       map[string]string{"cancellation_reason": "cancellationReason", "cancel_subsequent_bookings": "cancelSubsequentBookings"},
		AlwaysBody: true,
	},
	{
		Suffix: "booking.reschedule", Name: "Reschedule a booking",
		Description: "POST /v2/bookings/{bookingUid}/reschedule: moves the booking to a new start (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/reschedule", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID, "start"},
		Props: map[string]any{bookingUID: bookingUIDProp,
			"start":                   zonedTime("new start"),
			"rescheduled_by":          str(maxEmail, "email of who reschedules (the owner's email auto-confirms)"),
			"rescheduling_reason":     str(maxText, "reason for rescheduling"),
			"email_verification_code": str(64, "email verification code, when the event type requires one"),
		},
		Body: map[string]string{"start": "start", "rescheduled_by": "rescheduledBy",
			"rescheduling_reason": "reschedulingReason", "email_verification_code": "emailVerificationCode"},
	},
	{
		Suffix: "booking.confirm", Name: "Confirm a booking",
		Description: "POST /v2/bookings/{bookingUid}/confirm: confirms a booking that requires confirmation (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/confirm", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.decline", Name: "Decline a booking",
		Description: "POST /v2/bookings/{bookingUid}/decline: declines a booking that requires confirmation (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/decline", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID},
		Props:    map[string]any{bookingUID: bookingUIDProp, "reason": str(maxText, "reason for declining")},
		Body:     map[string]string{"reason": "reason"}, AlwaysBody: true,
	},
	{
		Suffix: "schedule.list", Name: "List schedules",
		Description: "GET /v2/schedules: the authenticated user's availability schedules (cal-api-version 2024-06-11).",
		Method:      http.MethodGet, Path: "/v2/schedules", Version: versionSchedules, Risk: aip.RiskLow,
	},
	{
		Suffix: "event_type.create", Name: "Create an event type",
		Description: "POST /v2/event-types: a new event type of the authenticated user, with its scalar settings (cal-api-version 2024-06-14).",
		Method:      http.MethodPost, Path: "/v2/event-types", Version: versionEventTypes, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"length_in_minutes", "title", "slug"},
		Props:    eventTypeProps(nil), Body: eventTypeBody,
	},
	{
		Suffix: "event_type.update", Name: "Update an event type",
		Description: "PATCH /v2/event-types/{eventTypeId}: changes the given settings of an event type (cal-api-version 2024-06-14).",
		Method:      http.MethodPatch, Path: "/v2/event-types/{event_type_id}", Version: versionEventTypes, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"event_type_id"}, MinProps: 2,
		Props: eventTypeProps(map[string]any{"event_type_id": integer(1, maxIntID, "ID of the event type")}), Body: eventTypeBody,
	},
	{
		Suffix: "event_type.delete", Name: "Delete an event type",
		Description: "DELETE /v2/event-types/{eventTypeId}: deletes the event type for good (cal-api-version 2024-06-14).",
		Method:      http.MethodDelete, Path: "/v2/event-types/{event_type_id}", Version: versionEventTypes, Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"event_type_id"},
		Props:    map[string]any{"event_type_id": integer(1, maxIntID, "ID of the event type")},
	},
	{
		Suffix: "schedule.default.get", Name: "Get the default schedule",
		Description: "GET /v2/schedules/default: the authenticated user's default availability schedule (cal-api-version 2024-06-11).",
		Method:      http.MethodGet, Path: "/v2/schedules/default", Version: versionSchedules, Risk: aip.RiskLow,
	},
	{
		Suffix: "schedule.get", Name: "Get a schedule",
		Description: "GET /v2/schedules/{scheduleId} (cal-api-version 2024-06-11).",
		Method:      http.MethodGet, Path: "/v2/schedules/{schedule_id}", Version: versionSchedules, Risk: aip.RiskLow,
		Required: []string{"schedule_id"}, Props: map[string]any{"schedule_id": scheduleIDProp},
	},
	{
		Suffix: "schedule.create", Name: "Create a schedule",
		Description: "POST /v2/schedules: a new availability schedule; Cal.diy gives it Monday to Friday 09:00-17:00 (cal-api-version 2024-06-11).",
		Method:      http.MethodPost, Path: "/v2/schedules", Version: versionSchedules, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"name", "time_zone", "is_default"},
		Props:    scheduleProps(nil), Body: scheduleBody,
	},
	{
		Suffix: "schedule.update", Name: "Update a schedule",
		Description: "PATCH /v2/schedules/{scheduleId}: renames a schedule, changes its time zone or makes it the default (cal-api-version 2024-06-11).",
		Method:      http.MethodPatch, Path: "/v2/schedules/{schedule_id}", Version: versionSchedules, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"schedule_id"}, MinProps: 2,
		Props: scheduleProps(map[string]any{"schedule_id": scheduleIDProp}), Body: scheduleBody,
	},
	{
		Suffix: "schedule.delete", Name: "Delete a schedule",
		Description: "DELETE /v2/schedules/{scheduleId}: deletes the schedule for good (cal-api-version 2024-06-11).",
		Method:      http.MethodDelete, Path: "/v2/schedules/{schedule_id}", Version: versionSchedules, Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"schedule_id"}, Props: map[string]any{"schedule_id": scheduleIDProp},
	},
	{
		Suffix: "slot.reservation.create", Name: "Reserve a slot",
		Description: "POST /v2/slots/reservations: holds a slot of an event type so that nobody else books it meanwhile (cal-api-version 2024-09-04).",
		Method:      http.MethodPost, Path: "/v2/slots/reservations", Version: versionSlots, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"event_type_id", "slot_start"},
		Props:    reservationProps(nil), Body: reservationBody,
	},
	{
		Suffix: "slot.reservation.get", Name: "Get a slot reservation",
		Description: "GET /v2/slots/reservations/{uid} (cal-api-version 2024-09-04).",
		Method:      http.MethodGet, Path: "/v2/slots/reservations/{reservation_uid}", Version: versionSlots, Risk: aip.RiskLow,
		Required: []string{"reservation_uid"}, Props: map[string]any{"reservation_uid": reservationUIDProp},
	},
	{
		Suffix: "slot.reservation.update", Name: "Update a slot reservation",
		Description: "PATCH /v2/slots/reservations/{uid}: moves or extends a reservation; the body is a whole reservation (cal-api-version 2024-09-04).",
		Method:      http.MethodPatch, Path: "/v2/slots/reservations/{reservation_uid}", Version: versionSlots, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"reservation_uid", "event_type_id", "slot_start"},
		Props:    reservationProps(map[string]any{"reservation_uid": reservationUIDProp}), Body: reservationBody,
	},
	{
		Suffix: "slot.reservation.delete", Name: "Delete a slot reservation",
		Description: "DELETE /v2/slots/reservations/{uid}: releases the reserved slot (cal-api-version 2024-09-04).",
		Method:      http.MethodDelete, Path: "/v2/slots/reservations/{reservation_uid}", Version: versionSlots, Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"reservation_uid"}, Props: map[string]any{"reservation_uid": reservationUIDProp},
	},
	{
		Suffix: "booking.attendee.list", Name: "List a booking's attendees",
		Description: "GET /v2/bookings/{bookingUid}/attendees (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/attendees", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.attendee.add", Name: "Add an attendee to a booking",
		Description: "POST /v2/bookings/{bookingUid}/attendees: adds one attendee, who is notified (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/attendees", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID, "name", "time_zone", "email"},
		Props: map[string]any{bookingUID: bookingUIDProp,
			"name":         str(maxID, "attendee name"),
			"time_zone":    str(maxTime, "attendee time zone, e.g. Europe/Rome"),
			"email":        str(maxEmail, "attendee email"),
			"phone_number": str(32, "attendee phone number in international format"),
			"language":     enum("attendee language", languages...),
		},
		Body: map[string]string{"name": "name", "time_zone": "timeZone", "email": "email", "phone_number": "phoneNumber", "language": "language"},
	},
	{
		Suffix: "booking.attendee.get", Name: "Get a booking's attendee",
		Description: "GET /v2/bookings/{bookingUid}/attendees/{attendeeId} (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/attendees/{attendee_id}", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID, "attendee_id"},
		Props:    map[string]any{bookingUID: bookingUIDProp, "attendee_id": integer(1, maxIntID, "ID of the attendee")},
	},
	{
		Suffix: "booking.guest.add", Name: "Add guests to a booking",
		Description: "POST /v2/bookings/{bookingUid}/guests: adds up to 10 guests, who are notified (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/guests", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID, "guests"},
		Props: map[string]any{bookingUID: bookingUIDProp,
			"guests": list(map[string]any{
				"type": "object", "additionalProperties": false, "required": []string{"email"}, "description": "a guest",
				"properties": map[string]any{
					"email":        str(maxEmail, "guest email"),
					"name":         str(maxID, "guest name"),
					"time_zone":    str(maxTime, "guest time zone"),
					"phone_number": str(32, "guest phone number in international format"),
					"language":     enum("guest language", languages...),
				},
			}, 10, "the guests (at most 10 a request)"),
		},
		Body:   map[string]string{"guests": "guests"},
		Nested: map[string]map[string]string{"guests": {"email": "email", "name": "name", "time_zone": "timeZone", "phone_number": "phoneNumber", "language": "language"}},
	},
	{
		Suffix: "booking.mark_absent", Name: "Mark absences of a booking",
		Description: "POST /v2/bookings/{bookingUid}/mark-absent: records whether the host and which attendees did not show up (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/mark-absent", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID}, MinProps: 2,
		Props: map[string]any{bookingUID: bookingUIDProp,
			"host": map[string]any{"type": "boolean", "description": "whether the host was absent"},
			"attendees": list(map[string]any{
				"type": "object", "additionalProperties": false, "required": []string{"email", "absent"}, "description": "an attendee",
				"properties": map[string]any{
					"email":  str(maxEmail, "attendee email"),
					"absent": map[string]any{"type": "boolean", "description": "whether the attendee was absent"},
				},
			}, 100, "attendees and whether each was absent"),
		},
		Body: map[string]string{"host": "host", "attendees": "attendees"},
	},
	{
		Suffix: "booking.reassign", Name: "Reassign a booking",
		Description: "POST /v2/bookings/{bookingUid}/reassign: hands a round-robin booking to another available host that Cal.diy picks (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/reassign", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.location.update", Name: "Change a booking's location",
		Description: "PATCH /v2/bookings/{bookingUid}/location: sets the booking's location to an address, a link, a phone number or an attendee's location (cal-api-version 2024-08-13).",
		Method:      http.MethodPatch, Path: "/v2/bookings/{booking_uid}/location", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID, "location"},
		Props:    map[string]any{bookingUID: bookingUIDProp, "location": locationProp},
		Body:     map[string]string{"location": "location"},
	},
	{
		Suffix: "booking.get_by_seat", Name: "Get a booking by seat",
		Description: "GET /v2/bookings/by-seat/{seatUid}: the booking one seat of a seated event type belongs to (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/by-seat/{seat_uid}", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{"seat_uid"}, Props: map[string]any{"seat_uid": str(maxID, "UID of the seat")},
	},
	{
		Suffix: "booking.calendar_links.get", Name: "Get a booking's calendar links",
		Description: "GET /v2/bookings/{bookingUid}/calendar-links: links that add the booking to Google, Microsoft, Yahoo or ICS calendars (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/calendar-links", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.reference.list", Name: "List a booking's references",
		Description: "GET /v2/bookings/{bookingUid}/references: the booking's entries in calendars and video apps (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/references", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID},
		Props: map[string]any{bookingUID: bookingUIDProp,
			"type": enum("only references of this app", "google_calendar", "office365_calendar", "daily_video", "google_video", "office365_video", "zoom_video")},
		Query: map[string]string{"type": "type"},
	},
	{
		Suffix: "booking.recording.list", Name: "List a booking's recordings",
		Description: "GET /v2/bookings/{bookingUid}/recordings: Cal Video recordings of the meeting (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/recordings", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "booking.transcript.list", Name: "List a booking's transcripts",
		Description: "GET /v2/bookings/{bookingUid}/transcripts: Cal Video transcript download links of the meeting (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/transcripts", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "calendar.list", Name: "List connected calendars",
		Description: "GET /v2/calendars: the calendars connected to the authenticated user, with the destination calendar.",
		Method:      http.MethodGet, Path: "/v2/calendars", Risk: aip.RiskLow,
	},
	{
		Suffix: "calendar.busy_time.list", Name: "List busy times of a calendar",
		Description: "GET /v2/calendars/busy-times: busy times of one connected calendar (by credential ID and external ID) between two dates.",
		Method:      http.MethodGet, Path: "/v2/calendars/busy-times", Risk: aip.RiskLow,
		Required: []string{"credential_id", "external_id"},
		Props: map[string]any{
			"credential_id":      integer(1, maxIntID, "ID of the calendar's credential (calendar.list)"),
			"external_id":        str(maxID, "external ID of the calendar (calendar.list)"),
			"date_from":          str(maxTime, "first date, e.g. 2050-09-01"),
			"date_to":            str(maxTime, "last date, e.g. 2050-09-30"),
			"time_zone":          str(maxTime, "time zone of the dates"),
			"logged_in_users_tz": str(maxTime, "time zone of the authenticated user"),
		},
		Query: map[string]string{"credential_id": "credentialId", "external_id": "externalId", "date_from": "dateFrom",
			"date_to": "dateTo", "time_zone": "timeZone", "logged_in_users_tz": "loggedInUsersTz"},
	},
	{
		Suffix: "conferencing.list", Name: "List conferencing apps",
		Description: "GET /v2/conferencing: the conferencing apps the authenticated user installed.",
		Method:      http.MethodGet, Path: "/v2/conferencing", Risk: aip.RiskLow,
	},
	{
		Suffix: "conferencing.default.get", Name: "Get the default conferencing app",
		Description: "GET /v2/conferencing/default: the authenticated user's default conferencing app.",
		Method:      http.MethodGet, Path: "/v2/conferencing/default", Risk: aip.RiskLow,
	},
	{
		Suffix: "webhook.list", Name: "List user webhooks",
		Description: "GET /v2/webhooks: the authenticated user's webhooks, paged (signing secrets left out of the output).",
		Method:      http.MethodGet, Path: "/v2/webhooks", Risk: aip.RiskLow, Webhook: true,
		Props: map[string]any{"take": integer(1, 250, "page size (provider default 250)"), "skip": integer(0, 1_000_000, "webhooks to skip")},
		Query: map[string]string{"take": "take", "skip": "skip"},
	},
	{
		Suffix: "webhook.get", Name: "Get a user webhook",
		Description: "GET /v2/webhooks/{webhookId} (signing secret left out of the output).",
		Method:      http.MethodGet, Path: "/v2/webhooks/{webhook_id}", Risk: aip.RiskLow, Webhook: true,
		Required: []string{"webhook_id"}, Props: map[string]any{"webhook_id": webhookIDProp},
	},
	{
		Suffix: "webhook.create", Name: "Create a user webhook",
		Description: "POST /v2/webhooks: subscribes a URL to booking events. The subscriber URL must be one of the deployment's " +
			"allowed HTTPS prefixes followed by a subscription ID; when the connector holds that subscription's secret it is sent as the signing secret.",
		Method: http.MethodPost, Path: "/v2/webhooks", Mutation: true, Risk: aip.RiskMedium, Webhook: true,
		Required: []string{"subscriber_url", "triggers", "active"},
		Props:    webhookProps(nil), Body: webhookBody,
	},
	{
		Suffix: "webhook.update", Name: "Update a user webhook",
		Description: "PATCH /v2/webhooks/{webhookId}: changes a webhook's URL (allowed prefixes only, as for webhook.create), triggers, template or state; " +
			"without an allowed subscriber_url it may only switch the webhook off (active false).",
		Method: http.MethodPatch, Path: "/v2/webhooks/{webhook_id}", Mutation: true, Risk: aip.RiskMedium, Webhook: true,
		Required: []string{"webhook_id"}, MinProps: 2,
		Props: webhookProps(map[string]any{"webhook_id": webhookIDProp}), Body: webhookBody,
	},
	{
		Suffix: "webhook.delete", Name: "Delete a user webhook",
		Description: "DELETE /v2/webhooks/{webhookId}: deletes the webhook for good.",
		Method:      http.MethodDelete, Path: "/v2/webhooks/{webhook_id}", Mutation: true, Risk: aip.RiskHigh, Webhook: true,
		Required: []string{"webhook_id"}, Props: map[string]any{"webhook_id": webhookIDProp},
	},
	{
		Suffix: "booking.reassign_to_user", Name: "Reassign a booking to a user",
		Description: "POST /v2/bookings/{bookingUid}/reassign/{userId}: hands a round-robin booking to the given host (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings/{booking_uid}/reassign/{user_id}", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{bookingUID, "user_id"},
		Props: map[string]any{bookingUID: bookingUIDProp, "user_id": integer(1, maxIntID, "ID of the new host"),
			"reason": str(maxText, "reason for reassigning")},
		Body: map[string]string{"reason": "reason"}, AlwaysBody: true,
	},
	{
		Suffix: "booking.conferencing_session.list", Name: "List a booking's conferencing sessions",
		Description: "GET /v2/bookings/{bookingUid}/conferencing-sessions: Cal Video sessions of the meeting and who joined (cal-api-version 2024-08-13).",
		Method:      http.MethodGet, Path: "/v2/bookings/{booking_uid}/conferencing-sessions", Version: versionBookings, Risk: aip.RiskLow,
		Required: []string{bookingUID}, Props: map[string]any{bookingUID: bookingUIDProp},
	},
	{
		Suffix: "conferencing.default.set", Name: "Set the default conferencing app",
		Description: "POST /v2/conferencing/{app}/default: makes an installed conferencing app the authenticated user's default.",
		Method:      http.MethodPost, Path: "/v2/conferencing/{app}/default", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"app"}, Props: map[string]any{"app": enum("conferencing app", "google-meet", "zoom", "msteams", "daily-video")},
	},
	{
		Suffix: "conferencing.connect", Name: "Connect a conferencing app",
		Description: "POST /v2/conferencing/{app}/connect: installs a conferencing app that needs no OAuth consent of its own (Google Meet, over the connected Google calendar).",
		Method:      http.MethodPost, Path: "/v2/conferencing/{app}/connect", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"app"}, Props: map[string]any{"app": enum("conferencing app", "google-meet")},
	},
	{
		Suffix: "conferencing.disconnect", Name: "Disconnect a conferencing app",
		Description: "DELETE /v2/conferencing/{app}/disconnect: removes the app's credentials for good; connecting it again needs the user's OAuth consent.",
		Method:      http.MethodDelete, Path: "/v2/conferencing/{app}/disconnect", Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"app"}, Props: map[string]any{"app": enum("conferencing app", "google-meet", "zoom", "msteams")},
	},
	{
		Suffix: "event_type.private_link.list", Name: "List an event type's private links",
		Description: "GET /v2/event-types/{eventTypeId}/private-links.",
		Method:      http.MethodGet, Path: "/v2/event-types/{event_type_id}/private-links", Risk: aip.RiskLow,
		Required: []string{"event_type_id"}, Props: map[string]any{"event_type_id": eventTypeIDProp},
	},
	{
		Suffix: "event_type.private_link.create", Name: "Create a private link",
		Description: "POST /v2/event-types/{eventTypeId}/private-links: a link that books the event type until it expires or is used up (default: once).",
		Method:      http.MethodPost, Path: "/v2/event-types/{event_type_id}/private-links", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"event_type_id"},
		Props:    privateLinkProps(map[string]any{"event_type_id": eventTypeIDProp}), Body: privateLinkBody, AlwaysBody: true,
	},
	{
		Suffix: "event_type.private_link.update", Name: "Update a private link",
		Description: "PATCH /v2/event-types/{eventTypeId}/private-links/{linkId}: changes the link's expiry or usage limit.",
		Method:      http.MethodPatch, Path: "/v2/event-types/{event_type_id}/private-links/{link_id}", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"event_type_id", "link_id"}, MinProps: 3,
		Props: privateLinkProps(map[string]any{"event_type_id": eventTypeIDProp, "link_id": linkIDProp}), Body: privateLinkBody,
	},
	{
		Suffix: "event_type.private_link.delete", Name: "Delete a private link",
		Description: "DELETE /v2/event-types/{eventTypeId}/private-links/{linkId}: the link stops working for good.",
		Method:      http.MethodDelete, Path: "/v2/event-types/{event_type_id}/private-links/{link_id}", Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"event_type_id", "link_id"}, Props: map[string]any{"event_type_id": eventTypeIDProp, "link_id": linkIDProp},
	},
	{
		Suffix: "event_type.webhook.list", Name: "List an event type's webhooks",
		Description: "GET /v2/event-types/{eventTypeId}/webhooks, paged (signing secrets left out of the output).",
		Method:      http.MethodGet, Path: "/v2/event-types/{event_type_id}/webhooks", Risk: aip.RiskLow, Webhook: true,
		Required: []string{"event_type_id"},
		Props: map[string]any{"event_type_id": eventTypeIDProp,
			"take": integer(1, 250, "page size (provider default 250)"), "skip": integer(0, 1_000_000, "webhooks to skip")},
		Query: map[string]string{"take": "take", "skip": "skip"},
	},
	{
		Suffix: "event_type.webhook.get", Name: "Get an event type's webhook",
		Description: "GET /v2/event-types/{eventTypeId}/webhooks/{webhookId} (signing secret left out of the output).",
		Method:      http.MethodGet, Path: "/v2/event-types/{event_type_id}/webhooks/{webhook_id}", Risk: aip.RiskLow, Webhook: true,
		Required: []string{"event_type_id", "webhook_id"}, Props: map[string]any{"event_type_id": eventTypeIDProp, "webhook_id": webhookIDProp},
	},
	{
		Suffix: "event_type.webhook.create", Name: "Create an event type webhook",
		Description: "POST /v2/event-types/{eventTypeId}/webhooks: subscribes a URL to the event type's events; the subscriber URL rules of webhook.create apply.",
		Method:      http.MethodPost, Path: "/v2/event-types/{event_type_id}/webhooks", Mutation: true, Risk: aip.RiskMedium, Webhook: true,
		Required: []string{"event_type_id", "subscriber_url", "triggers", "active"},
		Props:    webhookProps(map[string]any{"event_type_id": eventTypeIDProp}), Body: webhookBody,
	},
	{
		Suffix: "event_type.webhook.update", Name: "Update an event type webhook",
		Description: "PATCH /v2/event-types/{eventTypeId}/webhooks/{webhookId}; the subscriber URL rules of webhook.update apply.",
		Method:      http.MethodPatch, Path: "/v2/event-types/{event_type_id}/webhooks/{webhook_id}", Mutation: true, Risk: aip.RiskMedium, Webhook: true,
		Required: []string{"event_type_id", "webhook_id"}, MinProps: 3,
		Props: webhookProps(map[string]any{"event_type_id": eventTypeIDProp, "webhook_id": webhookIDProp}), Body: webhookBody,
	},
	{
		Suffix: "event_type.webhook.delete", Name: "Delete an event type webhook",
		Description: "DELETE /v2/event-types/{eventTypeId}/webhooks/{webhookId}: deletes the webhook for good.",
		Method:      http.MethodDelete, Path: "/v2/event-types/{event_type_id}/webhooks/{webhook_id}", Mutation: true, Risk: aip.RiskHigh, Webhook: true,
		Required: []string{"event_type_id", "webhook_id"}, Props: map[string]any{"event_type_id": eventTypeIDProp, "webhook_id": webhookIDProp},
	},
	{
		Suffix: "event_type.webhook.delete_all", Name: "Delete all of an event type's webhooks",
		Description: "DELETE /v2/event-types/{eventTypeId}/webhooks: deletes every webhook of the event type for good.",
		Method:      http.MethodDelete, Path: "/v2/event-types/{event_type_id}/webhooks", Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"event_type_id"}, Props: map[string]any{"event_type_id": eventTypeIDProp},
	},
	{
		Suffix: "calendar.provider.check", Name: "Check a calendar connection",
		Description: "GET /v2/calendars/{calendar}/check: whether the authenticated user's Apple, Google or Office 365 calendar credentials work.",
		Method:      http.MethodGet, Path: "/v2/calendars/{calendar}/check", Risk: aip.RiskLow,
		Required: []string{"calendar"}, Props: map[string]any{"calendar": enum("calendar provider", "apple", "google", "office365")},
	},
	{
		Suffix: "calendar.disconnect", Name: "Disconnect a calendar",
		Description: "POST /v2/calendars/{calendar}/disconnect: deletes the calendar credential for good; connecting again needs the user's consent.",
		Method:      http.MethodPost, Path: "/v2/calendars/{calendar}/disconnect", Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"calendar", "credential_id"},
		Props: map[string]any{"calendar": enum("calendar provider", "apple", "google", "office365"),
			"credential_id": integer(1, maxIntID, "ID of the calendar's credential (calendar.list)")},
		Body: map[string]string{"credential_id": "id"},
	},
	{
		Suffix: "calendar.ics_feed.check", Name: "Check the ICS feeds",
		Description: "GET /v2/calendars/ics-feed/check: whether the authenticated user's ICS feed calendars can be read.",
		Method:      http.MethodGet, Path: "/v2/calendars/ics-feed/check", Risk: aip.RiskLow,
	},
	{
		Suffix: "calendar.destination.update", Name: "Set the destination calendar",
		Description: "PUT /v2/destination-calendars: the connected calendar that new bookings are written to.",
		Method:      http.MethodPut, Path: "/v2/destination-calendars", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"integration", "external_id"},
		Props: map[string]any{
			"integration":              enum("calendar service (calendar.list)", "apple_calendar", "google_calendar", "office365_calendar"),
			"external_id":              str(maxText, "external ID of the calendar (calendar.list)"),
			"delegation_credential_id": str(maxID, "delegation credential, for organization calendars"),
		},
		Body: map[string]string{"integration": "integration", "external_id": "externalId", "delegation_credential_id": "delegationCredentialId"},
	},
	{
		Suffix: "calendar.selected.add", Name: "Select a calendar for conflicts",
		Description: "POST /v2/selected-calendars: adds a connected calendar to those checked for conflicts.",
		Method:      http.MethodPost, Path: "/v2/selected-calendars", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"integration", "external_id", "credential_id"},
		Props:    selectedCalendarProps, Body: map[string]string{"integration": "integration", "external_id": "externalId",
			"credential_id": "credentialId", "delegation_credential_id": "delegationCredentialId"},
	},
	{
		Suffix: "calendar.selected.delete", Name: "Unselect a calendar for conflicts",
		Description: "DELETE /v2/selected-calendars: stops checking a connected calendar for conflicts (calendar.selected.add selects it again; " +
			"bookings made meanwhile may conflict with it).",
		Method: http.MethodDelete, Path: "/v2/selected-calendars", Mutation: true, Risk: aip.RiskHigh,
		Required: []string{"integration", "external_id", "credential_id"},
		Props:    selectedCalendarProps, Query: map[string]string{"integration": "integration", "external_id": "externalId",
			"credential_id": "credentialId", "delegation_credential_id": "delegationCredentialId"},
	},
	{
		Suffix: "calendar.event.update", Name: "Update a calendar event",
		Description: "PATCH /v2/calendars/{calendar}/events/{eventUid}: changes the title, description, times or status of an event in a connected Google calendar.",
		Method:      http.MethodPatch, Path: "/v2/calendars/{calendar}/events/{event_uid}", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"calendar", "event_uid"}, MinProps: 3,
		Props: map[string]any{
			"calendar":    enum("calendar provider", "google"),
			"event_uid":   str(maxID, "UID of the calendar event (a booking reference's eventUid)"),
			"title":       str(maxID, "title"),
			"description": str(maxText, "description"),
			"start":       eventTimeProp("new start"),
			"end":         eventTimeProp("new end"),
			"status":      enum("event status", "accepted", "pending", "declined", "cancelled"),
		},
		Body:   map[string]string{"title": "title", "description": "description", "start": "start", "end": "end", "status": "status"},
		Nested: map[string]map[string]string{"start": {"time": "time", "time_zone": "timeZone"}, "end": {"time": "time", "time_zone": "timeZone"}},
	},
	{
		Suffix: "profile.update", Name: "Update the authenticated Cal.diy profile",
		Description: "PATCH /v2/me: changes the given fields of the API key owner's profile (not its email: the sign-in identity is the operator's).",
		Method:      http.MethodPatch, Path: "/v2/me", Mutation: true, Risk: aip.RiskMedium,
		Required: []string{}, MinProps: 1,
		Props: map[string]any{
			"name":                str(maxID, "display name"),
			"time_format":         map[string]any{"type": "integer", "enum": []int{12, 24}, "minimum": 12, "maximum": 24, "description": "12 or 24 hour clock"},
			"default_schedule_id": scheduleIDProp,
			"week_start":          enum("first day of the week", weekDays...),
			"time_zone":           str(maxTime, "time zone, e.g. Europe/Rome"),
			"locale":              enum("language", languages...),
			"avatar_url":          str(maxURL, "URL of the avatar image"),
			"bio":                 str(maxText, "bio"),
			"metadata":            metadataProp,
		},
		Body: map[string]string{"name": "name", "time_format": "timeFormat", "default_schedule_id": "defaultScheduleId",
			"week_start": "weekStart", "time_zone": "timeZone", "locale": "locale", "avatar_url": "avatarUrl", "bio": "bio", "metadata": "metadata"},
	},
}

// Schema parts shared by several operations.
var (
	scheduleIDProp     = integer(1, maxIntID, "ID of the schedule")
	eventTypeIDProp    = integer(1, maxIntID, "ID of the event type")
	linkIDProp         = str(maxID, "ID of the private link")
	reservationUIDProp = str(maxID, "UID of the slot reservation")
	webhookIDProp      = str(maxID, "ID of the webhook")
	weekDays           = []string{"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}
	metadataProp       = map[string]any{"type": "object", "maxProperties": 50, "description": "up to 50 keys of 40 characters, string values up to 500",
		"propertyNames":        map[string]any{"maxLength": 40},
		"additionalProperties": map[string]any{"type": "string", "maxLength": 500}}
	// webhookTriggers are the document's CreateWebhookInputDto triggers.
	webhookTriggers = []string{"BOOKING_CREATED", "BOOKING_PAYMENT_INITIATED", "BOOKING_PAID", "BOOKING_RESCHEDULED",
		"BOOKING_REQUESTED", "BOOKING_CANCELLED", "BOOKING_REJECTED", "BOOKING_NO_SHOW_UPDATED", "FORM_SUBMITTED",
		"MEETING_ENDED", "MEETING_STARTED", "RECORDING_READY", "INSTANT_MEETING", "RECORDING_TRANSCRIPTION_GENERATED",
		"OOO_CREATED", "AFTER_HOSTS_CAL_VIDEO_NO_SHOW", "AFTER_GUESTS_CAL_VIDEO_NO_SHOW", "FORM_SUBMITTED_NO_EVENT",
		"ROUTING_FORM_FALLBACK_HIT", "DELEGATION_CREDENTIAL_ERROR", "WRONG_ASSIGNMENT_REPORT"}
	// locationProp is one of the document's UpdateBookingLocationInput
	// location objects: a type and the one member it needs.
	locationProp = map[string]any{"type": "object", "maxProperties": 2, "description": "the new location", "oneOf": []any{
		locationAlt("address", "address", "an address"),
		locationAlt("attendeeAddress", "address", "the attendee's address"),
		locationAlt("attendeeDefined", "location", "a location the attendee gave"),
		locationAlt("attendeePhone", "phone", "the attendee's phone number"),
		locationAlt("link", "link", "a meeting link"),
		locationAlt("phone", "phone", "a phone number"),
	}}
)

func locationAlt(typ, member, desc string) map[string]any {
	return map[string]any{"type": "object", "additionalProperties": false, "required": []string{"type", member},
		"description": desc, "properties": map[string]any{
			"type": enum("location type", typ),
			member: str(maxText, desc),
		}}
}

// eventTypeBody maps the event type inputs to CreateEventTypeInput and
// UpdateEventTypeInput fields (2024-06-14).
var eventTypeBody = map[string]string{"length_in_minutes": "lengthInMinutes", "title": "title", "slug": "slug",
	"description": "description", "disable_guests": "disableGuests", "slot_interval": "slotInterval",
	"minimum_booking_notice": "minimumBookingNotice", "before_event_buffer": "beforeEventBuffer",
	"after_event_buffer": "afterEventBuffer", "schedule_id": "scheduleId", "offset_start": "offsetStart",
	"only_show_first_available_slot": "onlyShowFirstAvailableSlot", "requires_booker_email_verification": "requiresBookerEmailVerification",
	"hide_calendar_notes": "hideCalendarNotes", "lock_time_zone_toggle_on_booking_page": "lockTimeZoneToggleOnBookingPage",
	"custom_name": "customName", "hide_calendar_event_details": "hideCalendarEventDetails",
	"hide_organizer_email": "hideOrganizerEmail", "hidden": "hidden"}

func eventTypeProps(extra map[string]any) map[string]any {
	boolean := func(desc string) map[string]any { return map[string]any{"type": "boolean", "description": desc} }
	p := map[string]any{
		"length_in_minutes":                     integer(1, 1440, "length of the event in minutes"),
		"title":                                 str(maxID, "title"),
		"slug":                                  str(maxID, "slug, unique among the user's event types"),
		"description":                           str(maxText, "description"),
		"disable_guests":                        boolean("attendees may not add guests"),
		"slot_interval":                         integer(1, 1440, "minutes between slot starts"),
		"minimum_booking_notice":                integer(0, 525_600, "minutes of notice a booking needs"),
		"before_event_buffer":                   integer(0, 1440, "free minutes before each event"),
		"after_event_buffer":                    integer(0, 1440, "free minutes after each event"),
		"schedule_id":                           scheduleIDProp,
		"offset_start":                          integer(0, 1440, "minutes by which slot starts are offset"),
		"only_show_first_available_slot":        boolean("show only the first slot of each day"),
		"requires_booker_email_verification":    boolean("bookers must verify their email"),
		"hide_calendar_notes":                   boolean("keep notes out of calendar events"),
		"lock_time_zone_toggle_on_booking_page": boolean("bookers cannot change the time zone"),
		"custom_name":                           str(maxID, "name of the calendar event, with variables such as {Event type title}"),
		"hide_calendar_event_details":           boolean("calendar events show only busy"),
		"hide_organizer_email":                  boolean("hide the organizer's email"),
		"hidden":                                boolean("not shown on the profile page"),
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// scheduleBody maps the schedule inputs to CreateScheduleInput and
// UpdateScheduleInput fields (2024-06-11).
var scheduleBody = map[string]string{"name": "name", "time_zone": "timeZone", "is_default": "isDefault"}

func scheduleProps(extra map[string]any) map[string]any {
	p := map[string]any{
		"name":       str(maxID, "name of the schedule"),
		"time_zone":  str(maxTime, "time zone of the schedule, e.g. Europe/Rome"),
		"is_default": map[string]any{"type": "boolean", "description": "make it the user's default schedule"},
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// reservationBody maps the reservation inputs to ReserveSlotInput fields
// (2024-09-04).
var reservationBody = map[string]string{"event_type_id": "eventTypeId", "slot_start": "slotStart",
	"slot_duration": "slotDuration", "reservation_duration": "reservationDuration"}

func reservationProps(extra map[string]any) map[string]any {
	p := map[string]any{
		"event_type_id":        integer(1, maxIntID, "ID of the event type"),
		"slot_start":           zonedTime("start of the slot"),
		"slot_duration":        integer(1, 1440, "slot length in minutes, for event types with several lengths"),
		"reservation_duration": integer(1, 1440, "minutes to hold the slot (provider default 5)"),
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// selectedCalendarProps are the inputs of calendar.selected.add and
// calendar.selected.delete.
var selectedCalendarProps = map[string]any{
	"integration":              str(maxID, "calendar integration (calendar.list), e.g. google_calendar"),
	"external_id":              str(maxText, "external ID of the calendar (calendar.list)"),
	"credential_id":            integer(1, maxIntID, "ID of the calendar's credential (calendar.list)"),
	"delegation_credential_id": str(maxID, "delegation credential, for organization calendars"),
}

func eventTimeProp(desc string) map[string]any {
	return map[string]any{"type": "object", "additionalProperties": false, "required": []string{"time"}, "description": desc,
		"properties": map[string]any{
			"time":      zonedTime("the time"),
			"time_zone": str(maxTime, "time zone, e.g. Europe/Rome"),
		}}
}

// privateLinkBody maps the private link inputs to CreatePrivateLinkInput
// and UpdatePrivateLinkBody fields.
var privateLinkBody = map[string]string{"expires_at": "expiresAt", "max_usage_count": "maxUsageCount"}

func privateLinkProps(extra map[string]any) map[string]any {
	p := map[string]any{
		"expires_at":      zonedTime("time after which the link stops working"),
		"max_usage_count": integer(1, 1_000_000, "bookings the link allows"),
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

// webhookBody maps the webhook inputs to CreateWebhookInputDto and
// UpdateWebhookInputDto fields. The signing secret is never an input: the
// connector sends the configured one (see subscriber.go).
var webhookBody = map[string]string{"subscriber_url": "subscriberUrl", "triggers": "triggers", "active": "active",
	"payload_template": "payloadTemplate", "version": "version"}

func webhookProps(extra map[string]any) map[string]any {
	p := map[string]any{
		"subscriber_url":   str(maxURL, "https URL under one of the deployment's allowed subscriber prefixes, followed by a subscription ID"),
		"triggers":         list(enum("", webhookTriggers...), len(webhookTriggers), "events that trigger a delivery"),
		"active":           map[string]any{"type": "boolean", "description": "whether deliveries are sent"},
		"payload_template": str(maxText*4, "template of the delivered payload (default: Cal.diy's payload)"),
		"version":          enum("webhook payload version", "2021-10-20"),
	}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

var operationsByID = func() map[string]*operation {
	m := make(map[string]*operation, len(operations))
	for _, o := range operations {
		m[o.ID()] = o
	}
	return m
}()

// inputSchema returns the operation's strict input schema.
func (o *operation) inputSchema() json.RawMessage {
	props := o.Props
	if props == nil {
		props = map[string]any{}
	}
	req := o.Required
	if req == nil {
		req = []string{}
	}
	schema := map[string]any{"type": "object", "properties": props, "required": req, "additionalProperties": false}
	if o.MinProps > 0 {
		schema["minProperties"] = o.MinProps
	}
	b, err := json.Marshal(schema)
	if err != nil {
		panic(err) // the table is static
	}
	return b
}

// request is a provider call built from an input.
type request struct {
	path  string
	query url.Values
	body  map[string]any // nil: no body
}

// build maps a validated input to the provider call. Integers spelled
// as other numbers (42.0, 4.2e1: the schema's "integer" accepts them, and
// the host passes an input on in canonical JSON, which writes 4.2e1 as
// 42.0) are read as the integers they are (provider.IntegralNumbers):
// Cal.diy refuses a path ID "42.0", and reads some query parameters with
// parseInt, to which "4.2e1" is 4.
func (o *operation) build(input json.RawMessage) (*request, error) {
	in := map[string]any{}
	if len(input) > 0 && string(input) != "null" {
		d := json.NewDecoder(bytes.NewReader(provider.IntegralNumbers(input)))
		d.UseNumber()
		if err := d.Decode(&in); err != nil {
			return nil, fmt.Errorf("calcom: %s input: %w", o.ID(), err)
		}
	}
	if o.Check != nil {
		if msg := o.Check(in); msg != "" {
			return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
				fmt.Sprintf("input of %s: %s", o.ID(), msg))
		}
	}
	r := &request{path: o.Path}
	for {
		i := strings.IndexByte(r.path, '{')
		if i < 0 {
			break
		}
		j := strings.IndexByte(r.path[i:], '}') + i
		key := r.path[i+1 : j]
		v, ok := in[key]
		if !ok {
			return nil, fmt.Errorf("calcom: %s input lacks %s", o.ID(), key)
		}
		s := scalar(v)
		if s == "" {
			return nil, fmt.Errorf("calcom: %s input %s is empty", o.ID(), key)
		}
		if s == "." || s == ".." {
			// PathEscape keeps dots: the segment would be a dot segment,
			// which servers and proxies resolve to another resource
			// (DELETE .../webhooks/.. deletes the event type).
			return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
				fmt.Sprintf("input of %s: %s %q is not an ID; give the ID Cal.diy returned", o.ID(), key, s))
		}
		r.path = r.path[:i] + url.PathEscape(s) + r.path[j+1:]
	}
	for key, name := range o.Query {
		v, ok := in[key]
		if !ok {
			continue
		}
		if r.query == nil {
			r.query = url.Values{}
		}
		if items, isList := v.([]any); isList {
			parts := make([]string, len(items))
			for i, it := range items {
				parts[i] = scalar(it)
				if strings.Contains(parts[i], ",") {
					// The list is sent comma-separated: an item holding a
					// comma would be read as two (usernames
					// ["alice,mallory"] would ask for mallory's slots too).
					return nil, aip.NewProtocolError(hostsdk.CodeInputInvalid, aip.CategoryPermanent, false, 0,
						fmt.Sprintf("input of %s: an item of %s holds a comma (%q); give each value as its own item", o.ID(), key, parts[i]))
				}
			}
			r.query.Set(name, strings.Join(parts, ","))
		} else {
			r.query.Set(name, scalar(v))
		}
	}
	if o.Body != nil || o.AlwaysBody {
		r.body = map[string]any{}
		for key, name := range o.Body {
			v, ok := in[key]
			if !ok {
				continue
			}
			if rename, nested := o.Nested[key]; nested {
				if items, isList := v.([]any); isList {
					out := make([]any, len(items))
					for i, it := range items {
						obj, _ := it.(map[string]any)
						out[i] = renameMembers(obj, rename)
					}
					v = out
				} else {
					obj, _ := v.(map[string]any)
					v = renameMembers(obj, rename)
				}
			}
			r.body[name] = v
		}
	}
	return r, nil
}

// renameMembers renames an object's members (those rename does not name
// are left out).
func renameMembers(obj map[string]any, rename map[string]string) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		if n, ok := rename[k]; ok {
			out[n] = v
		}
	}
	return out
}

// scalar formats a string, number or boolean input value.
func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		if x {
			return "true"
		}
		return "false"
	default:
		return fmt.Sprint(x)
	}
}
