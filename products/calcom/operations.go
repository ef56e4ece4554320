package calcom

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
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
	// an object-valued input. A nil Body sends no body unless AlwaysBody.
	Body       map[string]string
	Nested     map[string]map[string]string
	AlwaysBody bool
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

func list(items map[string]any, maxItems int, desc string) map[string]any {
	return map[string]any{"type": "array", "items": items, "minItems": 1, "maxItems": maxItems, "uniqueItems": true, "description": desc}
}

const (
	maxID      = 256
	maxText    = 2048
	maxTime    = 64
	maxIntID   = int64(1) << 53
	maxEmail   = 320
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
			"usernames":       list(str(maxID, ""), 50, "usernames of a dynamic event type"),
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
			"start":                     str(maxTime, "ISO 8601 date or date-time (UTC) from which to look"),
			"end":                       str(maxTime, "ISO 8601 date or date-time (UTC) until which to look"),
			"event_type_id":             integer(1, maxIntID, "ID of the event type"),
			"event_type_slug":           str(maxID, "slug of the event type (with username or team_slug)"),
			"username":                  str(maxID, "owner of the event type"),
			"team_slug":                 str(maxID, "team owning the event type"),
			"organization_slug":         str(maxID, "organization of the user or team"),
			"usernames":                 list(str(maxID, ""), 50, "usernames of a dynamic event"),
			"format":                    enum("range: start and end of each slot; time: start only", "range", "time"),
			"duration":                  integer(1, 1440, "slot length in minutes, for event types with several lengths"),
			"time_zone":                 str(maxTime, "time zone of the returned slots (default UTC)"),
			"booking_uid_to_reschedule": str(maxID, "booking being rescheduled, whose slot stays available"),
		},
		Query: map[string]string{"start": "start", "end": "end", "event_type_id": "eventTypeId",
			"event_type_slug": "eventTypeSlug", "username": "username", "team_slug": "teamSlug",
			"organization_slug": "organizationSlug", "usernames": "usernames", "format": "format",
			"duration": "duration", "time_zone": "timeZone", "booking_uid_to_reschedule": "bookingUidToReschedule"},
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
			"after_start":       str(maxTime, "bookings starting after this ISO 8601 time"),
			"before_end":        str(maxTime, "bookings ending before this ISO 8601 time"),
			"after_created_at":  str(maxTime, "bookings created after this ISO 8601 time"),
			"before_created_at": str(maxTime, "bookings created before this ISO 8601 time"),
			"after_updated_at":  str(maxTime, "bookings updated after this ISO 8601 time"),
			"before_updated_at": str(maxTime, "bookings updated before this ISO 8601 time"),
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
		Description: "POST /v2/bookings: books a slot of an event type (by ID, or by slug with username or team_slug) for one attendee (cal-api-version 2024-08-13).",
		Method:      http.MethodPost, Path: "/v2/bookings", Version: versionBookings, Mutation: true, Risk: aip.RiskMedium,
		Required: []string{"start", "attendee"},
		Props: map[string]any{
			"start": str(maxTime, "start of the booking, ISO 8601 in UTC"),
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
			"recurrence_count":  integer(1, 730, "recurrences of a recurring event type"),
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
			"start":                   str(maxTime, "new start, ISO 8601 in UTC"),
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
	b, err := json.Marshal(map[string]any{"type": "object", "properties": props, "required": req, "additionalProperties": false})
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

// build maps a validated input to the provider call.
func (o *operation) build(input json.RawMessage) (*request, error) {
	in := map[string]any{}
	if len(input) > 0 && string(input) != "null" {
		d := json.NewDecoder(strings.NewReader(string(input)))
		d.UseNumber()
		if err := d.Decode(&in); err != nil {
			return nil, fmt.Errorf("calcom: %s input: %w", o.ID(), err)
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
				obj, _ := v.(map[string]any)
				out := make(map[string]any, len(obj))
				for k, nv := range obj {
					if n, ok := rename[k]; ok {
						out[n] = nv
					}
				}
				v = out
			}
			r.body[name] = v
		}
	}
	return r, nil
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
