package calcom

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/spectest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "cal_live_0123456789abcdef"

// Canned answers, shaped as the published document's response schemas
// (GetMeOutput, GetEventTypesOutput_2024_06_14, GetBookingOutput_2024_08_13,
// ...): {"status":"success","data":...}.
const (
	bookingJSON = `{"id":10,"uid":"bk_1","title":"Intro between Alice and Bob","status":"accepted",` +
		`"start":"2050-09-05T09:00:00.000Z","end":"2050-09-05T09:30:00.000Z","duration":30,"eventTypeId":11,` +
		`"attendees":[{"name":"Bob","email":"bob@example.test","displayEmail":"bob@example.test","timeZone":"Europe/Rome","absent":false}],` +
		`"hosts":[{"id":7,"name":"Alice","email":"alice@example.test","username":"alice","timeZone":"Europe/Rome"}]}`
	meAnswer        = `{"status":"success","data":{"id":7,"username":"alice","email":"alice@example.test","timeFormat":24,"defaultScheduleId":3,"weekStart":"Monday","timeZone":"Europe/Rome"}}`
	eventTypeJSON   = `{"id":11,"lengthInMinutes":30,"title":"Intro","slug":"intro","description":"","locations":[],"recurrence":null}`
	eventTypesAns   = `{"status":"success","data":[` + eventTypeJSON + `]}`
	eventTypeAns    = `{"status":"success","data":` + eventTypeJSON + `}`
	slotsAnswer     = `{"status":"success","data":{"2050-09-05":[{"start":"2050-09-05T09:00:00.000Z","end":"2050-09-05T09:30:00.000Z"}]}}`
	bookingsAnswer  = `{"status":"success","data":[` + bookingJSON + `],"pagination":{"totalItems":1,"remainingItems":0,"returnedItems":1,"itemsPerPage":10,"currentPage":1,"totalPages":1,"hasNextPage":false,"hasPreviousPage":false}}`
	bookingAnswer   = `{"status":"success","data":` + bookingJSON + `}`
	schedulesAnswer = `{"status":"success","data":[{"id":3,"ownerId":7,"name":"Working hours","timeZone":"Europe/Rome","isDefault":true,"availability":[],"overrides":[]}]}`

	scheduleAnswer    = `{"status":"success","data":{"id":3,"ownerId":7,"name":"Working hours","timeZone":"Europe/Rome","isDefault":true,"availability":[{"days":["Monday"],"startTime":"09:00","endTime":"17:00"}],"overrides":[]}}`
	reservationAnswer = `{"status":"success","data":{"eventTypeId":11,"slotStart":"2050-09-05T09:00:00.000Z","slotEnd":"2050-09-05T09:30:00.000Z","slotDuration":30,"reservationUid":"rsv_1","reservationDuration":5,"reservationUntil":"2050-09-01T10:05:00.000Z"}}`
	attendeeJSON      = `{"id":21,"bookingId":10,"name":"Carol","email":"carol@example.test","displayEmail":"carol@example.test","timeZone":"Europe/Rome","absent":false}`
	attendeesAnswer   = `{"status":"success","data":[` + attendeeJSON + `]}`
	attendeeAnswer    = `{"status":"success","data":` + attendeeJSON + `}`
	reassignAnswer    = `{"status":"success","data":{"bookingUid":"bk_1","reassignedTo":{"id":8,"name":"Dan","email":"dan@example.test"}}}`
	calLinksAnswer    = `{"status":"success","data":[{"label":"Google","link":"https://calendar.google.com/calendar/r/eventedit?text=Intro"}]}`
	referencesAnswer  = `{"status":"success","data":[{"id":1,"type":"google_calendar","eventUid":"ev_1","destinationCalendarId":"alice@example.test","externalCalendarId":"alice@example.test"}]}`
	recordingsAnswer  = `{"status":"success","data":[{"id":"rec_1","roomName":"room","startTs":2550000000,"status":"finished","duration":1800,"shareToken":"tok","downloadLink":"https://example.test/rec_1.mp4"}]}`
	transcriptsAnswer = `{"status":"success","data":["https://example.test/tr_1.vtt"]}`
	calendarsAnswer   = `{"status":"success","data":{"connectedCalendars":[{"integration":{"type":"google_calendar","slug":"google-calendar"},"credentialId":5,"calendars":[{"externalId":"alice@example.test","name":"Alice","primary":true,"isSelected":true}]}],"destinationCalendar":{"id":1,"integration":"google_calendar","externalId":"alice@example.test"}}}`
	busyTimesAnswer   = `{"status":"success","data":[{"start":"2050-09-05T09:00:00.000Z","end":"2050-09-05T10:00:00.000Z","source":"google_calendar"}]}`
	conferencingAns   = `{"status":"success","data":[{"id":1,"type":"google_video","userId":7,"invalid":false}]}`
	confDefaultAnswer = `{"status":"success","data":{"appSlug":"google-meet","appLink":"https://meet.google.com"}}`
	// Webhook answers carry the signing secret, which outputs leave out.
	webhookJSON        = `{"id":"wh_1","userId":7,"subscriberUrl":"https://aip.example.test/webhooks/cal-diy/sub-1.prod","triggers":["BOOKING_CREATED"],"active":true,"payloadTemplate":"","secret":"` + testSecret + `"}`
	webhookOutJSON     = `{"id":"wh_1","userId":7,"subscriberUrl":"https://aip.example.test/webhooks/cal-diy/sub-1.prod","triggers":["BOOKING_CREATED"],"active":true,"payloadTemplate":""}`
	userWebhooksAnswer = `{"status":"success","data":[` + webhookJSON + `]}`
	userWebhookAnswer  = `{"status":"success","data":` + webhookJSON + `}`
	userWebhooksOutput = `{"status":"success","data":[` + webhookOutJSON + `]}`
	userWebhookOutput  = `{"status":"success","data":` + webhookOutJSON + `}`
	subscriberPrefix   = "https://aip.example.test/webhooks/cal-diy/"

	sessionsAnswer     = `{"status":"success","data":[{"id":"sess_1","roomName":"room","startTime":"2050-09-05T09:00:00.000Z","endTime":"2050-09-05T09:30:00.000Z","duration":1800,"maxParticipants":2,"participants":[{"userName":"Bob","joinTime":"2050-09-05T09:01:00.000Z","duration":1700}]}]}`
	confConnectAnswer  = `{"status":"success","data":{"id":2,"type":"google_video","userId":7,"invalid":false}}`
	selectedAnswer     = `{"status":"success","data":{"userId":7,"integration":"google_calendar","externalId":"team@example.test","credentialId":5}}`
	calEventAnswer     = `{"status":"success","data":{"start":{"time":"2050-09-05T10:00:00.000Z","timeZone":"Europe/Rome"},"end":{"time":"2050-09-05T10:30:00.000Z","timeZone":"Europe/Rome"},"id":"ev_1","title":"Intro","source":"google"}}`
	privateLinkJSON    = `{"linkId":"pl_1","eventTypeId":11,"isExpired":false,"bookingUrl":"https://cal.example.test/d/pl_1/intro","maxUsageCount":5,"usageCount":0}`
	privateLinksAnswer = `{"status":"success","data":[` + privateLinkJSON + `]}`
	privateLinkAnswer  = `{"status":"success","data":` + privateLinkJSON + `}`
)

// received is one request the mock provider got.
type received struct {
	Method, Path, EscapedPath string
	Query                     url.Values
	Header                    http.Header
	Body                      []byte
}

// answer is what the mock says to a request; drop closes the connection
// without an answer.
type answer struct {
	status int
	body   string
	drop   bool
}

// mockCal is a Cal.diy API v2 as the published document describes it,
// behind spectest's request checker.
type mockCal struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	got      []received
	override map[string]answer // "METHOD /path" → answer
}

func newMockCal(t *testing.T) *mockCal {
	t.Helper()
	m := &mockCal{t: t, override: map[string]answer{}}
	spec := spectest.Load(t, "cal-diy/openapi.json")
	m.srv = httptest.NewServer(spec.Handler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The document's body for a booking is any of three inputs; the
		// adapter sends the plain one (Option 1), or with recurrenceCount
		// the recurring one (Option 3).
		if r.Method == http.MethodPost && r.URL.Path == "/v2/bookings" {
			body, _ := io.ReadAll(r.Body)
			input := "/components/schemas/CreateBookingInput_2024_08_13"
			var members map[string]json.RawMessage
			if json.Unmarshal(body, &members) == nil && members["recurrenceCount"] != nil {
				input = "/components/schemas/CreateRecurringBookingInput_2024_08_13"
			}
			if err := spec.ValidateSchema(input, body); err != nil {
				t.Errorf("mock provider: POST /v2/bookings: %v", err)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		m.serve(w, r)
	})))
	t.Cleanup(m.srv.Close)
	return m
}

// set makes the mock answer "METHOD /path" with a.
func (m *mockCal) set(route string, a answer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.override[route] = a
}

// requests returns the requests actions sent (those with
// x-aip-action-id), leaving out the host's health probes.
func (m *mockCal) requests() []received {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []received
	for _, r := range m.got {
		if r.Header.Get("X-Aip-Action-Id") != "" {
			out = append(out, r)
		}
	}
	return out
}

// probes returns the requests without an action ID: health probes.
func (m *mockCal) probes() []received {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []received
	for _, r := range m.got {
		if r.Header.Get("X-Aip-Action-Id") == "" {
			out = append(out, r)
		}
	}
	return out
}

func (m *mockCal) serve(w http.ResponseWriter, r *http.Request) {
	body := new(bytes.Buffer)
	body.ReadFrom(r.Body)
	m.mu.Lock()
	m.got = append(m.got, received{Method: r.Method, Path: r.URL.Path, EscapedPath: r.URL.EscapedPath(),
		Query: r.URL.Query(), Header: r.Header.Clone(), Body: body.Bytes()})
	a, ok := m.override[r.Method+" "+r.URL.Path]
	m.mu.Unlock()
	if !ok {
		a = defaultAnswer(r)
	}
	if a.drop {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	w.Write([]byte(a.body))
}

func defaultAnswer(r *http.Request) answer {
	p := r.URL.Path
	ok := func(body string) answer {
		if r.Method == http.MethodPost && !strings.HasSuffix(p, "/guests") && !strings.HasSuffix(p, "/mark-absent") &&
			!strings.HasSuffix(p, "/reassign") && !strings.Contains(p, "/reassign/") && !strings.HasSuffix(p, "/confirm") &&
			!strings.HasSuffix(p, "/decline") && !strings.HasSuffix(p, "/cancel") && !strings.HasSuffix(p, "/default") {
			return answer{201, body, false} // the document's creates answer 201
		}
		return answer{200, body, false}
	}
	switch {
	case p == "/v2/schedules/default" || strings.HasPrefix(p, "/v2/schedules/") ||
		(p == "/v2/schedules" && r.Method == http.MethodPost):
		return ok(scheduleAnswer)
	case p == "/v2/slots/reservations" || strings.HasPrefix(p, "/v2/slots/reservations/"):
		if r.Method == http.MethodDelete {
			return ok(`{"status":"success"}`)
		}
		return ok(reservationAnswer)
	case strings.HasSuffix(p, "/attendees") && r.Method == http.MethodGet:
		return ok(attendeesAnswer)
	case strings.HasSuffix(p, "/attendees") || strings.Contains(p, "/attendees/"):
		return ok(attendeeAnswer)
	case strings.HasSuffix(p, "/conferencing-sessions"):
		return ok(sessionsAnswer)
	case strings.HasPrefix(p, "/v2/conferencing/") && strings.HasSuffix(p, "/default") && r.Method == http.MethodPost:
		return ok(`{"status":"success"}`)
	case strings.HasPrefix(p, "/v2/conferencing/") && strings.HasSuffix(p, "/connect"):
		return answer{200, confConnectAnswer, false}
	case strings.HasPrefix(p, "/v2/conferencing/") && strings.HasSuffix(p, "/disconnect"):
		return ok(`{"status":"success"}`)
	case strings.HasPrefix(p, "/v2/event-types/") && strings.HasSuffix(p, "/private-links") && r.Method == http.MethodGet:
		return ok(privateLinksAnswer)
	case strings.HasPrefix(p, "/v2/event-types/") && strings.Contains(p, "/private-links"):
		return ok(privateLinkAnswer)
	case strings.HasPrefix(p, "/v2/event-types/") && strings.HasSuffix(p, "/webhooks") && r.Method == http.MethodGet:
		return ok(userWebhooksAnswer)
	case strings.HasPrefix(p, "/v2/event-types/") && strings.HasSuffix(p, "/webhooks") && r.Method == http.MethodDelete:
		return ok(`{"status":"success","data":"2 webhooks deleted"}`)
	case strings.HasPrefix(p, "/v2/event-types/") && strings.Contains(p, "/webhooks"):
		return ok(userWebhookAnswer)
	case strings.HasSuffix(p, "/reassign") || strings.Contains(p, "/reassign/"):
		return ok(reassignAnswer)
	case strings.HasSuffix(p, "/calendar-links"):
		return ok(calLinksAnswer)
	case strings.HasSuffix(p, "/references"):
		return ok(referencesAnswer)
	case strings.HasSuffix(p, "/recordings"):
		return ok(recordingsAnswer)
	case strings.HasSuffix(p, "/transcripts"):
		return ok(transcriptsAnswer)
	case strings.HasPrefix(p, "/v2/calendars/") && strings.HasSuffix(p, "/check"):
		return ok(`{"status":"success","data":{"status":"ok"}}`)
	case strings.HasPrefix(p, "/v2/calendars/") && strings.HasSuffix(p, "/disconnect"):
		return ok(`{"status":"success","data":{"id":5,"type":"google_calendar","userId":7,"teamId":null,"appId":"google-calendar","invalid":false}}`)
	case p == "/v2/destination-calendars":
		return ok(`{"status":"success","data":{"userId":7,"integration":"google_calendar","externalId":"alice@example.test","credentialId":5}}`)
	case p == "/v2/selected-calendars":
		return ok(selectedAnswer)
	case strings.HasPrefix(p, "/v2/calendars/google/events/"):
		return ok(calEventAnswer)
	case p == "/v2/calendars":
		return ok(calendarsAnswer)
	case p == "/v2/calendars/busy-times":
		return ok(busyTimesAnswer)
	case p == "/v2/conferencing":
		return ok(conferencingAns)
	case p == "/v2/conferencing/default":
		return ok(confDefaultAnswer)
	case p == "/v2/webhooks" && r.Method == http.MethodGet:
		return ok(userWebhooksAnswer)
	case p == "/v2/webhooks" || strings.HasPrefix(p, "/v2/webhooks/"):
		return ok(userWebhookAnswer)
	case p == "/v2/event-types" && r.Method == http.MethodPost:
		return ok(eventTypeAns)
	case p == "/v2/me":
		return answer{200, meAnswer, false}
	case p == "/v2/event-types":
		return answer{200, eventTypesAns, false}
	case strings.HasPrefix(p, "/v2/event-types/"):
		return answer{200, eventTypeAns, false}
	case p == "/v2/slots":
		return answer{200, slotsAnswer, false}
	case p == "/v2/schedules":
		return answer{200, schedulesAnswer, false}
	case p == "/v2/bookings" && r.Method == http.MethodGet:
		return answer{200, bookingsAnswer, false}
	case p == "/v2/bookings" || strings.HasSuffix(p, "/reschedule"):
		return answer{201, bookingAnswer, false}
	case strings.HasPrefix(p, "/v2/bookings/"):
		return answer{200, bookingAnswer, false}
	}
	return answer{404, `{"status":"error","error":{"code":"NotFoundException","message":"no such route"}}`, false}
}

// newConnector returns a connector for the mock with the given webhook
// secrets.
func newConnector(t *testing.T, baseURL string, secrets map[string]provider.Secret, now func() time.Time) *Connector {
	t.Helper()
	return newConnectorWith(t, baseURL, func(c *Config) { c.WebhookSecrets, c.Now = secrets, now })
}

// newConnectorWith returns a connector for the mock, its Config changed
// by set.
func newConnectorWith(t *testing.T, baseURL string, set func(*Config)) *Connector {
	t.Helper()
	u, err := provider.ParseBaseURL("test base URL", baseURL, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	cfg := Config{BaseURL: u, Token: provider.NewSecret(testToken), Transport: tr}
	set(&cfg)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testHost is a connector in a real host, with the calls its tests share.
type testHost struct {
	*hostsdktest.Fixture
}

// startHost runs conn in a real host (hostsdktest.Start); j, when not nil,
// is its journal.
// completedOnce runs capability suffix with input, requires it completed
// with exactly one request to the provider, and returns the result and
// that request.
func completedOnce(t *testing.T, h *testHost, mock *mockCal, suffix, input string) (*aip.ActionResult, received) {
	t.Helper()
	before := len(mock.requests())
	_, resp := h.act(t, suffix, input)
	res, err := resp.Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("%s %s: HTTP %d, result %+v, %v: %s", suffix, input, resp.Status, res, err, resp.Raw)
	}
	reqs := mock.requests()
	if len(reqs) != before+1 {
		t.Fatalf("%s: the provider got %d requests, want 1", suffix, len(reqs)-before)
	}
	return res, reqs[len(reqs)-1]
}

// ownSubscriptionHost starts a host whose connector may point webhooks at
// subscriberPrefix and receives the deliveries of subscription testSub
// (it holds its signing secret).
func ownSubscriptionHost(t *testing.T, mock *mockCal) *testHost {
	t.Helper()
	return startHost(t, newConnectorWith(t, mock.srv.URL, func(c *Config) {
		c.SubscriberPrefixes = []string{subscriberPrefix}
		c.WebhookSecrets = map[string]provider.Secret{testSub: provider.NewSecret(testSecret)}
	}), nil)
}

func startHost(t *testing.T, conn *Connector, j journal.Journal) *testHost {
	t.Helper()
	return &testHost{hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) {
		if j != nil {
			cfg.Journal = j
		}
	})}
}

// act sends the capability CapabilityPrefix+suffix with input and the
// idempotency key "idem-"+suffix, and returns the action and the host's
// verified answer.
func (h *testHost) act(t *testing.T, suffix, input string) (*aip.Action, *hostsdktest.Response) {
	t.Helper()
	a := hostsdktest.NewAction(CapabilityPrefix+suffix, input)
	a.IdempotencyKey = "idem-" + suffix
	return a, h.Act(t, a)
}

func jsonEqual(t *testing.T, what string, got []byte, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatalf("%s: want %q is not JSON: %v", what, want, err)
	}
	if diff := cmp.Diff(w, g); diff != "" {
		t.Errorf("%s (-want +got):\n%s", what, diff)
	}
}

// TestCapabilities runs every capability through a real host against the
// mock and checks what the mock received and what the action returned.
func TestCapabilities(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnectorWith(t, mock.srv.URL, func(c *Config) {
		c.WebhookSecrets = map[string]provider.Secret{testSub: provider.NewSecret(testSecret)}
		c.SubscriberPrefixes = []string{"https://other.example.test/hooks/", subscriberPrefix}
	}), nil)
	cases := []struct {
		suffix, input string
		method, path  string // path as escaped on the wire
		version       string
		query         url.Values
		body          string // "" for none
		output        string
	}{
		{"profile.get", `{}`, "GET", "/v2/me", "", nil, "", meAnswer},
		{"event_type.list", `{"username":"alice","usernames":["alice","bob"],"org_id":5,"sort_created_at":"desc"}`,
			"GET", "/v2/event-types", "2024-06-14",
			url.Values{"username": {"alice"}, "usernames": {"alice,bob"}, "orgId": {"5"}, "sortCreatedAt": {"desc"}}, "", eventTypesAns},
		{"event_type.get", `{"event_type_id":11}`, "GET", "/v2/event-types/11", "2024-06-14", nil, "", eventTypeAns},
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06","event_type_id":11,"format":"range","time_zone":"Europe/Rome","duration":30}`,
			"GET", "/v2/slots", "2024-09-04",
			url.Values{"start": {"2050-09-05"}, "end": {"2050-09-06"}, "eventTypeId": {"11"}, "format": {"range"},
				"timeZone": {"Europe/Rome"}, "duration": {"30"}}, "", slotsAnswer},
		{"booking.list", `{"status":["upcoming","past"],"event_type_ids":[11,12],"team_ids":[5],"take":10,"skip":20,"sort_start":"asc","attendee_email":"bob@example.test"}`,
			"GET", "/v2/bookings", "2024-08-13",
			url.Values{"status": {"upcoming,past"}, "eventTypeIds": {"11,12"}, "teamsIds": {"5"}, "take": {"10"},
				"skip": {"20"}, "sortStart": {"asc"}, "attendeeEmail": {"bob@example.test"}}, "", bookingsAnswer},
		{"booking.get", `{"booking_uid":"bk 1"}`, "GET", "/v2/bookings/bk%201", "2024-08-13", nil, "", bookingAnswer},
		{"booking.create", `{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"Europe/Rome","email":"bob@example.test","language":"en"},` +
			`"event_type_id":11,"guests":["carol@example.test"],"metadata":{"source":"aip"},"length_in_minutes":30}`,
			"POST", "/v2/bookings", "2024-08-13", nil,
			`{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","timeZone":"Europe/Rome","email":"bob@example.test","language":"en"},` +
				`"eventTypeId":11,"guests":["carol@example.test"],"metadata":{"source":"aip"},"lengthInMinutes":30}`, bookingAnswer},
		{"booking.cancel", `{"booking_uid":"bk_1","cancellation_reason":"conflict","cancel_subsequent_bookings":true}`,
			"POST", "/v2/bookings/bk_1/cancel", "2024-08-13", nil,
			`{"cancellationReason":"conflict","cancelSubsequentBookings":true}`, bookingAnswer},
		{"booking.reschedule", `{"booking_uid":"bk_1","start":"2050-09-06T10:00:00Z","rescheduling_reason":"moved","rescheduled_by":"alice@example.test"}`,
			"POST", "/v2/bookings/bk_1/reschedule", "2024-08-13", nil,
			`{"start":"2050-09-06T10:00:00Z","reschedulingReason":"moved","rescheduledBy":"alice@example.test"}`, bookingAnswer},
		{"booking.confirm", `{"booking_uid":"bk_1"}`, "POST", "/v2/bookings/bk_1/confirm", "2024-08-13", nil, "", bookingAnswer},
		{"booking.decline", `{"booking_uid":"bk_1"}`, "POST", "/v2/bookings/bk_1/decline", "2024-08-13", nil, `{}`, bookingAnswer},
		{"schedule.list", `{}`, "GET", "/v2/schedules", "2024-06-11", nil, "", schedulesAnswer},
		{"event_type.create", `{"length_in_minutes":30,"title":"Intro","slug":"intro","description":"First call","slot_interval":15,` +
			`"minimum_booking_notice":120,"before_event_buffer":5,"schedule_id":3,"hidden":false,"requires_booker_email_verification":true}`,
			"POST", "/v2/event-types", "2024-06-14", nil,
			`{"lengthInMinutes":30,"title":"Intro","slug":"intro","description":"First call","slotInterval":15,` +
				`"minimumBookingNotice":120,"beforeEventBuffer":5,"scheduleId":3,"hidden":false,"requiresBookerEmailVerification":true}`, eventTypeAns},
		{"event_type.update", `{"event_type_id":11,"title":"Intro call","after_event_buffer":10,"hide_organizer_email":true}`,
			"PATCH", "/v2/event-types/11", "2024-06-14", nil, `{"title":"Intro call","afterEventBuffer":10,"hideOrganizerEmail":true}`, eventTypeAns},
		{"event_type.delete", `{"event_type_id":11}`, "DELETE", "/v2/event-types/11", "2024-06-14", nil, "", eventTypeAns},
		{"schedule.default.get", `{}`, "GET", "/v2/schedules/default", "2024-06-11", nil, "", scheduleAnswer},
		{"schedule.get", `{"schedule_id":3}`, "GET", "/v2/schedules/3", "2024-06-11", nil, "", scheduleAnswer},
		{"schedule.create", `{"name":"Evenings","time_zone":"Europe/Rome","is_default":false}`, "POST", "/v2/schedules", "2024-06-11", nil,
			`{"name":"Evenings","timeZone":"Europe/Rome","isDefault":false}`, scheduleAnswer},
		{"schedule.update", `{"schedule_id":3,"is_default":true}`, "PATCH", "/v2/schedules/3", "2024-06-11", nil, `{"isDefault":true}`, scheduleAnswer},
		{"schedule.delete", `{"schedule_id":3}`, "DELETE", "/v2/schedules/3", "2024-06-11", nil, "", scheduleAnswer},
		{"slot.reservation.create", `{"event_type_id":11,"slot_start":"2050-09-05T09:00:00Z","slot_duration":30,"reservation_duration":10}`,
			"POST", "/v2/slots/reservations", "2024-09-04", nil,
			`{"eventTypeId":11,"slotStart":"2050-09-05T09:00:00Z","slotDuration":30,"reservationDuration":10}`, reservationAnswer},
		{"slot.reservation.get", `{"reservation_uid":"rsv 1"}`, "GET", "/v2/slots/reservations/rsv%201", "2024-09-04", nil, "", reservationAnswer},
		{"slot.reservation.update", `{"reservation_uid":"rsv_1","event_type_id":11,"slot_start":"2050-09-05T10:00:00Z"}`,
			"PATCH", "/v2/slots/reservations/rsv_1", "2024-09-04", nil, `{"eventTypeId":11,"slotStart":"2050-09-05T10:00:00Z"}`, reservationAnswer},
		{"slot.reservation.delete", `{"reservation_uid":"rsv_1"}`, "DELETE", "/v2/slots/reservations/rsv_1", "2024-09-04", nil, "", `{"status":"success"}`},
		{"booking.attendee.list", `{"booking_uid":"bk_1"}`, "GET", "/v2/bookings/bk_1/attendees", "2024-08-13", nil, "", attendeesAnswer},
		{"booking.attendee.add", `{"booking_uid":"bk_1","name":"Carol","time_zone":"Europe/Rome","email":"carol@example.test","language":"it"}`,
			"POST", "/v2/bookings/bk_1/attendees", "2024-08-13", nil,
			`{"name":"Carol","timeZone":"Europe/Rome","email":"carol@example.test","language":"it"}`, attendeeAnswer},
		{"booking.attendee.get", `{"booking_uid":"bk_1","attendee_id":21}`, "GET", "/v2/bookings/bk_1/attendees/21", "2024-08-13", nil, "", attendeeAnswer},
		{"booking.guest.add", `{"booking_uid":"bk_1","guests":[{"email":"erin@example.test","name":"Erin","time_zone":"UTC"},{"email":"finn@example.test"}]}`,
			"POST", "/v2/bookings/bk_1/guests", "2024-08-13", nil,
			`{"guests":[{"email":"erin@example.test","name":"Erin","timeZone":"UTC"},{"email":"finn@example.test"}]}`, bookingAnswer},
		{"booking.mark_absent", `{"booking_uid":"bk_1","host":false,"attendees":[{"email":"bob@example.test","absent":true}]}`,
			"POST", "/v2/bookings/bk_1/mark-absent", "2024-08-13", nil,
			`{"host":false,"attendees":[{"email":"bob@example.test","absent":true}]}`, bookingAnswer},
		{"booking.reassign", `{"booking_uid":"bk_1"}`, "POST", "/v2/bookings/bk_1/reassign", "2024-08-13", nil, "", reassignAnswer},
		{"booking.location.update", `{"booking_uid":"bk_1","location":{"type":"link","link":"https://meet.example.test/abc"}}`,
			"PATCH", "/v2/bookings/bk_1/location", "2024-08-13", nil, `{"location":{"type":"link","link":"https://meet.example.test/abc"}}`, bookingAnswer},
		{"booking.get_by_seat", `{"seat_uid":"seat_1"}`, "GET", "/v2/bookings/by-seat/seat_1", "2024-08-13", nil, "", bookingAnswer},
		{"booking.calendar_links.get", `{"booking_uid":"bk_1"}`, "GET", "/v2/bookings/bk_1/calendar-links", "2024-08-13", nil, "", calLinksAnswer},
		{"booking.reference.list", `{"booking_uid":"bk_1","type":"google_calendar"}`, "GET", "/v2/bookings/bk_1/references", "2024-08-13",
			url.Values{"type": {"google_calendar"}}, "", referencesAnswer},
		{"booking.recording.list", `{"booking_uid":"bk_1"}`, "GET", "/v2/bookings/bk_1/recordings", "2024-08-13", nil, "", recordingsAnswer},
		{"booking.transcript.list", `{"booking_uid":"bk_1"}`, "GET", "/v2/bookings/bk_1/transcripts", "2024-08-13", nil, "", transcriptsAnswer},
		{"calendar.list", `{}`, "GET", "/v2/calendars", "", nil, "", calendarsAnswer},
		{"calendar.busy_time.list", `{"credential_id":5,"external_id":"alice@example.test","date_from":"2050-09-01","date_to":"2050-09-30","time_zone":"Europe/Rome"}`,
			"GET", "/v2/calendars/busy-times", "",
			url.Values{"credentialId": {"5"}, "externalId": {"alice@example.test"}, "dateFrom": {"2050-09-01"}, "dateTo": {"2050-09-30"},
				"timeZone": {"Europe/Rome"}}, "", busyTimesAnswer},
		{"conferencing.list", `{}`, "GET", "/v2/conferencing", "", nil, "", conferencingAns},
		{"conferencing.default.get", `{}`, "GET", "/v2/conferencing/default", "", nil, "", confDefaultAnswer},
		{"webhook.list", `{"take":25,"skip":50}`, "GET", "/v2/webhooks", "", url.Values{"take": {"25"}, "skip": {"50"}}, "", userWebhooksOutput},
		{"webhook.get", `{"webhook_id":"wh_1"}`, "GET", "/v2/webhooks/wh_1", "", nil, "", userWebhookOutput},
		// The subscription's configured secret is sent; the caller never
		// gives one.
		{"webhook.create", `{"subscriber_url":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED","BOOKING_CANCELLED"],"active":true,"version":"2021-10-20"}`,
			"POST", "/v2/webhooks", "", nil,
			`{"subscriberUrl":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED","BOOKING_CANCELLED"],"active":true,"version":"2021-10-20","secret":"` + testSecret + `"}`,
			userWebhookOutput},
		// A subscription without a configured secret: none is sent.
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":"https://other.example.test/hooks/sub-2","active":false}`,
			"PATCH", "/v2/webhooks/wh_1", "", nil, `{"subscriberUrl":"https://other.example.test/hooks/sub-2","active":false}`, userWebhookOutput},
		{"webhook.delete", `{"webhook_id":"wh_1"}`, "DELETE", "/v2/webhooks/wh_1", "", nil, "", userWebhookOutput},
		{"booking.reassign_to_user", `{"booking_uid":"bk_1","user_id":8,"reason":"Alice is away"}`,
			"POST", "/v2/bookings/bk_1/reassign/8", "2024-08-13", nil, `{"reason":"Alice is away"}`, reassignAnswer},
		{"booking.conferencing_session.list", `{"booking_uid":"bk_1"}`, "GET", "/v2/bookings/bk_1/conferencing-sessions", "2024-08-13", nil, "", sessionsAnswer},
		{"conferencing.default.set", `{"app":"google-meet"}`, "POST", "/v2/conferencing/google-meet/default", "", nil, "", `{"status":"success"}`},
		{"conferencing.connect", `{"app":"google-meet"}`, "POST", "/v2/conferencing/google-meet/connect", "", nil, "", confConnectAnswer},
		{"conferencing.disconnect", `{"app":"zoom"}`, "DELETE", "/v2/conferencing/zoom/disconnect", "", nil, "", `{"status":"success"}`},
		{"event_type.private_link.list", `{"event_type_id":11}`, "GET", "/v2/event-types/11/private-links", "", nil, "", privateLinksAnswer},
		{"event_type.private_link.create", `{"event_type_id":11,"max_usage_count":5}`, "POST", "/v2/event-types/11/private-links", "", nil,
			`{"maxUsageCount":5}`, privateLinkAnswer},
		{"event_type.private_link.update", `{"event_type_id":11,"link_id":"pl_1","expires_at":"2050-12-31T23:59:59Z"}`,
			"PATCH", "/v2/event-types/11/private-links/pl_1", "", nil, `{"expiresAt":"2050-12-31T23:59:59Z"}`, privateLinkAnswer},
		{"event_type.private_link.delete", `{"event_type_id":11,"link_id":"pl_1"}`, "DELETE", "/v2/event-types/11/private-links/pl_1", "", nil, "", privateLinkAnswer},
		{"event_type.webhook.list", `{"event_type_id":11,"take":10}`, "GET", "/v2/event-types/11/webhooks", "", url.Values{"take": {"10"}}, "", userWebhooksOutput},
		{"event_type.webhook.get", `{"event_type_id":11,"webhook_id":"wh_1"}`, "GET", "/v2/event-types/11/webhooks/wh_1", "", nil, "", userWebhookOutput},
		// A subscription delivered elsewhere (no secret held here) takes a
		// template; none is sent as its secret.
		{"event_type.webhook.create", `{"event_type_id":11,"subscriber_url":"` + subscriberPrefix + `other-sub","triggers":["MEETING_ENDED"],"active":true,"payload_template":"{\"t\":\"{{title}}\"}"}`,
			"POST", "/v2/event-types/11/webhooks", "", nil,
			`{"subscriberUrl":"` + subscriberPrefix + `other-sub","triggers":["MEETING_ENDED"],"active":true,"payloadTemplate":"{\"t\":\"{{title}}\"}"}`,
			userWebhookOutput},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","active":false}`, "PATCH", "/v2/event-types/11/webhooks/wh_1", "", nil,
			`{"active":false}`, userWebhookOutput},
		{"event_type.webhook.delete", `{"event_type_id":11,"webhook_id":"wh_1"}`, "DELETE", "/v2/event-types/11/webhooks/wh_1", "", nil, "", userWebhookOutput},
		{"event_type.webhook.delete_all", `{"event_type_id":11}`, "DELETE", "/v2/event-types/11/webhooks", "", nil, "", `{"status":"success","data":"2 webhooks deleted"}`},
		{"calendar.provider.check", `{"calendar":"google"}`, "GET", "/v2/calendars/google/check", "", nil, "", `{"status":"success","data":{"status":"ok"}}`},
		{"calendar.disconnect", `{"calendar":"google","credential_id":5}`, "POST", "/v2/calendars/google/disconnect", "", nil, `{"id":5}`,
			`{"status":"success","data":{"id":5,"type":"google_calendar","userId":7,"teamId":null,"appId":"google-calendar","invalid":false}}`},
		{"calendar.ics_feed.check", `{}`, "GET", "/v2/calendars/ics-feed/check", "", nil, "", `{"status":"success","data":{"status":"ok"}}`},
		{"calendar.destination.update", `{"integration":"google_calendar","external_id":"alice@example.test"}`, "PUT", "/v2/destination-calendars", "", nil,
			`{"integration":"google_calendar","externalId":"alice@example.test"}`,
			`{"status":"success","data":{"userId":7,"integration":"google_calendar","externalId":"alice@example.test","credentialId":5}}`},
		{"calendar.selected.add", `{"integration":"google_calendar","external_id":"team@example.test","credential_id":5}`, "POST", "/v2/selected-calendars", "", nil,
			`{"integration":"google_calendar","externalId":"team@example.test","credentialId":5}`, selectedAnswer},
		{"calendar.selected.delete", `{"integration":"google_calendar","external_id":"team@example.test","credential_id":5}`, "DELETE", "/v2/selected-calendars", "",
			url.Values{"integration": {"google_calendar"}, "externalId": {"team@example.test"}, "credentialId": {"5"}}, "", selectedAnswer},
		{"calendar.event.update", `{"calendar":"google","event_uid":"ev_1","title":"Intro","start":{"time":"2050-09-05T10:00:00Z","time_zone":"Europe/Rome"},"status":"accepted"}`,
			"PATCH", "/v2/calendars/google/events/ev_1", "", nil,
			`{"title":"Intro","start":{"time":"2050-09-05T10:00:00Z","timeZone":"Europe/Rome"},"status":"accepted"}`, calEventAnswer},
		{"profile.update", `{"name":"Alice A.","time_format":12,"week_start":"Sunday","locale":"it","metadata":{"team":"sales"}}`,
			"PATCH", "/v2/me", "", nil, `{"name":"Alice A.","timeFormat":12,"weekStart":"Sunday","locale":"it","metadata":{"team":"sales"}}`, meAnswer},
	}
	if len(cases) != len(operations) {
		t.Fatalf("%d cases for %d capabilities", len(cases), len(operations))
	}
	for _, tc := range cases {
		t.Run(tc.suffix, func(t *testing.T) {
			before := len(mock.requests())
			a, resp := h.act(t, tc.suffix, tc.input)
			res, err := resp.Result()
			if err != nil || res.Status != aip.ResultCompleted {
				t.Fatalf("HTTP %d, result %+v, %v: %s", resp.Status, res, err, resp.Raw)
			}
			jsonEqual(t, "output", res.Output, tc.output)
			reqs := mock.requests()
			if len(reqs) != before+1 {
				t.Fatalf("the provider got %d requests, want 1", len(reqs)-before)
			}
			r := reqs[len(reqs)-1]
			if r.Method != tc.method || r.EscapedPath != tc.path {
				t.Errorf("request %s %s, want %s %s", r.Method, r.EscapedPath, tc.method, tc.path)
			}
			if tc.query == nil {
				tc.query = url.Values{}
			}
			if diff := cmp.Diff(tc.query, r.Query); diff != "" {
				t.Errorf("query (-want +got):\n%s", diff)
			}
			if tc.body == "" {
				if len(r.Body) != 0 {
					t.Errorf("body %s, want none", r.Body)
				}
			} else {
				jsonEqual(t, "body", r.Body, tc.body)
			}
			wantHeaders := map[string]string{
				"Authorization":   "Bearer " + testToken,
				"Cal-Api-Version": tc.version,
				"X-Aip-Action-Id": a.ID,
				"X-Aip-Tenant-Id": hostsdktest.TenantID,
				"Accept":          "application/json",
				"Idempotency-Key": "",
			}
			if operationsByID[a.CapabilityID].Mutation {
				wantHeaders["Idempotency-Key"] = provider.ScopedIdempotencyKey(hostsdktest.TenantID, a.CapabilityID, a.IdempotencyKey)
			}
			for k, want := range wantHeaders {
				if got := r.Header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

func protocolError(t *testing.T, resp *hostsdktest.Response) *aip.ProtocolError {
	t.Helper()
	res, err := resp.Result()
	if err != nil {
		t.Fatalf("HTTP %d: %v: %s", resp.Status, err, resp.Raw)
	}
	if res.Status != aip.ResultFailed || res.Error == nil {
		t.Fatalf("result %+v, want failed", res)
	}
	return res.Error
}

// TestProviderErrors: provider answers map to failed results with
// provider.* codes; a mutation that may have been applied is
// outcome_unknown and never sent again.
func TestProviderErrors(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnectorWith(t, mock.srv.URL, func(c *Config) { c.SubscriberPrefixes = []string{subscriberPrefix} }), nil)

	failures := []struct {
		name, route, suffix, input string
		a                          answer
		code                       string
		retryable                  bool
	}{
		{"404 read", "GET /v2/bookings/missing", "booking.get", `{"booking_uid":"missing"}`,
			answer{404, `{"status":"error","timestamp":"2050-01-01T00:00:00Z","path":"/v2/bookings/missing","error":{"code":"NotFoundException","message":"Booking with uid=missing was not found"}}`, false},
			provider.CodeNotFound, false},
		{"401", "GET /v2/schedules", "schedule.list", `{}`,
			answer{401, `{"status":"error","error":{"code":"UnauthorizedException","message":"Invalid Access Token"}}`, false},
			provider.CodeUnauthorized, false},
		{"400 mutation", "POST /v2/bookings/bk_2/reschedule", "booking.reschedule", `{"booking_uid":"bk_2","start":"2050-09-06T10:00:00Z"}`,
			answer{400, `{"status":"error","error":{"code":"BadRequestException","message":"slot not available"}}`, false},
			provider.CodeInvalidRequest, false},
		{"429 read", "GET /v2/me", "profile.get", `{}`,
			answer{429, `{"status":"error","error":{"message":"slow down"}}`, false}, provider.CodeRateLimited, true},
		{"500 read", "GET /v2/bookings/bk_5", "booking.get", `{"booking_uid":"bk_5"}`,
			answer{500, `{"status":"error","error":{"message":"boom"}}`, false}, provider.CodeUnavailable, true},
		{"dropped read", "GET /v2/event-types/12", "event_type.get", `{"event_type_id":12}`,
			answer{drop: true}, provider.CodeUnavailable, true},
		{"404 schedule", "GET /v2/schedules/9", "schedule.get", `{"schedule_id":9}`,
			answer{404, `{"status":"error","error":{"code":"NotFoundException","message":"Schedule with id=9 not found"}}`, false},
			provider.CodeNotFound, false},
		{"403 attendee add", "POST /v2/bookings/bk_3/attendees", "booking.attendee.add",
			`{"booking_uid":"bk_3","name":"Carol","time_zone":"UTC","email":"carol@example.test"}`,
			answer{403, `{"status":"error","error":{"code":"ForbiddenException","message":"not the organizer"}}`, false},
			provider.CodeForbidden, false},
		{"409 reservation", "POST /v2/slots/reservations", "slot.reservation.create", `{"event_type_id":11,"slot_start":"2050-09-05T09:00:00Z"}`,
			answer{409, `{"status":"error","error":{"code":"ConflictException","message":"slot already reserved"}}`, false},
			provider.CodeConflict, false},
		{"500 busy times", "GET /v2/calendars/busy-times", "calendar.busy_time.list", `{"credential_id":5,"external_id":"a@example.test"}`,
			answer{502, `{"status":"error","error":{"message":"upstream calendar"}}`, false}, provider.CodeUnavailable, true},
		// A 2xx status-error envelope fails a read (a mutation answered so
		// is outcome_unknown: TestTwoHundredWithoutSuccess).
		{"2xx status error", "GET /v2/bookings/bk_6", "booking.get", `{"booking_uid":"bk_6"}`,
			answer{200, `{"status":"error","error":{"code":"BadRequestException","message":"booking not readable"}}`, false},
			provider.CodeBadResponse, false},
		// A proxy that echoes the request's Authorization header into the
		// envelope: the key is redacted before the message is clipped, so
		// neither the key nor its start (cut at 512 bytes) is quoted.
		{"2xx status error echoing the key at the clip", "GET /v2/bookings/bk_8", "booking.get", `{"booking_uid":"bk_8"}`,
			answer{200, `{"status":"error","error":{"code":"E","message":"` + strings.Repeat("x", 480) + ` Bearer ` + testToken + `"}}`, false},
			provider.CodeBadResponse, false},
		{"2xx status error echoing the key", "GET /v2/bookings/bk_9", "booking.get", `{"booking_uid":"bk_9"}`,
			answer{200, `{"status":"error","error":{"code":"E","message":"got Bearer ` + testToken + `"}}`, false},
			provider.CodeBadResponse, false},
	}
	for _, tc := range failures {
		t.Run(tc.name, func(t *testing.T) {
			mock.set(tc.route, tc.a)
			_, resp := h.act(t, tc.suffix, tc.input)
			pe := protocolError(t, resp)
			if pe.Code != tc.code || (pe.Retryable != nil && *pe.Retryable) != tc.retryable {
				t.Fatalf("error %+v, want code %s retryable %v", pe, tc.code, tc.retryable)
			}
			if strings.Contains(pe.Message, testToken[:8]) {
				t.Fatalf("the error carries the API key or its start: %q", pe.Message)
			}
		})
	}

	unknown := []struct {
		name, route, suffix, input string
		a                          answer
	}{
		{"500 cancel", "POST /v2/bookings/bk_7/cancel", "booking.cancel", `{"booking_uid":"bk_7"}`,
			answer{500, `{"status":"error","error":{"message":"boom"}}`, false}},
		{"dropped create", "POST /v2/bookings", "booking.create",
			`{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"UTC"},"event_type_id":11}`, answer{drop: true}},
		{"500 delete", "DELETE /v2/event-types/11", "event_type.delete", `{"event_type_id":11}`,
			answer{500, `{"status":"error","error":{"message":"boom"}}`, false}},
		{"dropped patch", "PATCH /v2/schedules/3", "schedule.update", `{"schedule_id":3,"name":"Evenings"}`, answer{drop: true}},
		{"dropped reservation delete", "DELETE /v2/slots/reservations/rsv_9", "slot.reservation.delete", `{"reservation_uid":"rsv_9"}`, answer{drop: true}},
		{"503 webhook create", "POST /v2/webhooks", "webhook.create",
			`{"subscriber_url":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED"],"active":true}`,
			answer{503, `{"status":"error","error":{"message":"unavailable"}}`, false}},
		{"2xx status error confirm", "POST /v2/bookings/bk_6/confirm", "booking.confirm", `{"booking_uid":"bk_6"}`,
			answer{200, `{"status":"error","error":{"code":"BadRequestException","message":"booking does not need confirmation"}}`, false}},
		{"non-JSON 201 create", "POST /v2/bookings", "booking.create",
			`{"start":"2050-09-05T10:00:00Z","attendee":{"name":"Bob","time_zone":"UTC"},"event_type_id":11}`, answer{201, `<html>ok</html>`, false}},
	}
	for _, tc := range unknown {
		t.Run(tc.name, func(t *testing.T) {
			mock.set(tc.route, tc.a)
			before := len(mock.requests())
			a, _ := h.act(t, tc.suffix, tc.input)
			calls := len(mock.requests()) - before
			if calls != 1 {
				t.Fatalf("the provider got %d requests, want 1", calls)
			}
			st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
			// The same action again: journaled, never sent to the provider.
			mock.set(tc.route, answer{201, bookingAnswer, false})
			h.Act(t, a)
			if n := len(mock.requests()) - before; n != 1 {
				t.Fatalf("after the action was sent again the provider got %d requests, want 1", n)
			}
			if st, _, _ := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID); st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status after resend %+v", st)
			}
		})
	}
}

// TestInputRejected: the host refuses inputs the schemas do not allow,
// and the provider is not called.
func TestInputRejected(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	cases := []struct{ suffix, input string }{
		{"profile.get", `{"extra":1}`},
		{"event_type.get", `{}`},
		{"event_type.get", `{"event_type_id":0}`},
		{"event_type.get", `{"event_type_id":"11"}`},
		{"slot.list", `{"start":"2050-09-05"}`},
		{"slot.list", `{"start":"2050-09-05","end":"2050-09-06","format":"table"}`},
		{"booking.list", `{"take":1000}`},
		{"booking.list", `{"status":["someday"]}`},
		{"booking.get", `{"booking_uid":""}`},
		{"booking.get", `{"booking_uid":"` + strings.Repeat("u", 300) + `"}`},
		{"booking.create", `{"start":"2050-09-05T09:00:00Z"}`},
		{"booking.create", `{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob"}}`},
		{"booking.create", `{"start":"2050-09-05T09:00:00Z","attendee":{"name":"Bob","time_zone":"UTC","timeZone":"UTC"}}`},
		{"booking.cancel", `{"booking_uid":"bk_1","seat_uid":"s1"}`},
		{"booking.reschedule", `{"booking_uid":"bk_1"}`},
		{"booking.decline", `{"booking_uid":"bk_1","reason":5}`},
		{"event_type.create", `{"length_in_minutes":30,"title":"Intro"}`},
		{"event_type.create", `{"length_in_minutes":30,"title":"Intro","slug":"intro","locations":[]}`},
		{"event_type.update", `{"event_type_id":11}`},
		{"event_type.delete", `{"event_type_id":-1}`},
		{"schedule.create", `{"name":"Evenings","time_zone":"UTC","is_default":true,"availability":[]}`},
		{"schedule.update", `{"schedule_id":3}`},
		{"slot.reservation.update", `{"reservation_uid":"rsv_1","event_type_id":11}`},
		{"booking.attendee.add", `{"booking_uid":"bk_1","name":"Carol","time_zone":"UTC"}`},
		{"booking.attendee.get", `{"booking_uid":"bk_1","attendee_id":"21"}`},
		{"booking.guest.add", `{"booking_uid":"bk_1","guests":[]}`},
		{"booking.guest.add", `{"booking_uid":"bk_1","guests":[{"name":"Erin"}]}`},
		{"booking.guest.add", `{"booking_uid":"bk_1","guests":[` + strings.Repeat(`{"email":"g@example.test"},`, 10) + `{"email":"h@example.test"}]}`},
		{"booking.mark_absent", `{"booking_uid":"bk_1"}`},
		{"booking.mark_absent", `{"booking_uid":"bk_1","attendees":[{"email":"bob@example.test"}]}`},
		{"booking.location.update", `{"booking_uid":"bk_1","location":{"type":"link","address":"Main St 1"}}`},
		{"booking.location.update", `{"booking_uid":"bk_1","location":{"type":"zoom","link":"https://zoom.example.test"}}`},
		{"booking.reference.list", `{"booking_uid":"bk_1","type":"teams"}`},
		{"calendar.busy_time.list", `{"credential_id":5}`},
		{"webhook.list", `{"take":251}`},
		{"webhook.create", `{"subscriber_url":"` + subscriberPrefix + `s","triggers":["BOOKING_CREATED"],"active":true,"secret":"mine"}`},
		{"webhook.create", `{"subscriber_url":"` + subscriberPrefix + `s","triggers":["NOPE"],"active":true}`},
		{"webhook.update", `{"webhook_id":"wh_1"}`},
		{"event_type.private_link.update", `{"event_type_id":11,"link_id":"pl_1"}`},
		{"event_type.private_link.create", `{"event_type_id":11,"max_usage_count":0}`},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1"}`},
		{"event_type.webhook.create", `{"event_type_id":11,"subscriber_url":"` + subscriberPrefix + `s","triggers":["BOOKING_CREATED"],"active":true,"secret":"mine"}`},
		{"conferencing.default.set", `{"app":"webex"}`},
		{"conferencing.disconnect", `{"app":"daily-video"}`},
		{"conferencing.connect", `{"app":"zoom"}`},
		{"booking.reassign_to_user", `{"booking_uid":"bk_1"}`},
		{"calendar.disconnect", `{"calendar":"google"}`},
		{"calendar.provider.check", `{"calendar":"caldav"}`},
		{"calendar.destination.update", `{"integration":"zoho_calendar","external_id":"x"}`},
		{"calendar.selected.delete", `{"integration":"google_calendar","external_id":"x"}`},
		{"calendar.event.update", `{"calendar":"google","event_uid":"ev_1"}`},
		{"calendar.event.update", `{"calendar":"office365","event_uid":"ev_1","title":"x"}`},
		{"calendar.event.update", `{"calendar":"google","event_uid":"ev_1","start":{"time_zone":"UTC"}}`},
		{"profile.update", `{}`},
		{"profile.update", `{"time_format":13}`},
		{"profile.update", `{"week_start":"Someday"}`},
		{"profile.update", `{"email":"mallory@example.test"}`},
	}
	for _, tc := range cases {
		_, resp := h.act(t, tc.suffix, tc.input)
		if pe := resp.ProtocolError(); resp.Status != http.StatusBadRequest || pe == nil || pe.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: HTTP %d %s, want 400 %s", tc.suffix, tc.input, resp.Status, resp.Raw, hostsdk.CodeInputInvalid)
		}
	}
	if n := len(mock.requests()); n != 0 {
		t.Fatalf("the provider got %d requests for refused inputs", n)
	}
}

func TestCheckHealth(t *testing.T) {
	mock := newMockCal(t)
	c := newConnector(t, mock.srv.URL, nil, nil)
	if err := c.CheckHealth(hostsdktest.Context(t)); err != nil {
		t.Fatalf("healthy provider: %v", err)
	}
	r := mock.probes()
	if len(r) != 1 || r[0].Path != "/v2/me" || r[0].Header.Get("Authorization") != "Bearer "+testToken {
		t.Fatalf("health probe sent %+v", r)
	}
	mock.set("GET /v2/me", answer{401, `{"status":"error","error":{"message":"Invalid Access Token"}}`, false})
	err := c.CheckHealth(hostsdktest.Context(t))
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Status != 401 || strings.Contains(err.Error(), testToken) {
		t.Fatalf("unauthorized provider: %v", err)
	}
}

// TestWebhookSubscriberPolicy: webhook.create and webhook.update register
// only <allowed prefix><subscription ID>, nothing without configured
// prefixes, and a refused URL never reaches Cal.diy.
func TestWebhookSubscriberPolicy(t *testing.T) {
	mock := newMockCal(t)
	denyAll := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	h := startHost(t, newConnectorWith(t, mock.srv.URL, func(c *Config) { c.SubscriberPrefixes = []string{subscriberPrefix} }), nil)

	create := func(u string) string {
		return `{"subscriber_url":` + strconv.Quote(u) + `,"triggers":["BOOKING_CREATED"],"active":true}`
	}
	refused := func(t *testing.T, th *testHost, suffix, input, wantMsg string) {
		t.Helper()
		_, resp := th.act(t, suffix, input)
		pe := protocolError(t, resp)
		if pe.Code != CodeSubscriberURLNotAllowed || pe.Category != aip.CategoryPolicy || pe.IsRetryable() ||
			!strings.Contains(pe.Message, wantMsg) {
			t.Errorf("%s %s: error %+v, want %s (policy, not retryable) saying %q", suffix, input, pe, CodeSubscriberURLNotAllowed, wantMsg)
		}
	}
	// Deny by default.
	refused(t, denyAll, "webhook.create", create(subscriberPrefix+testSub), "--cal-diy-webhook-subscriber-prefixes")
	refused(t, denyAll, "webhook.update", `{"webhook_id":"wh_1","subscriber_url":"`+subscriberPrefix+testSub+`"}`, "--cal-diy-webhook-subscriber-prefixes")
	refused(t, denyAll, "event_type.webhook.create", `{"event_type_id":11,"subscriber_url":"`+subscriberPrefix+testSub+`","triggers":["BOOKING_CREATED"],"active":true}`,
		"--cal-diy-webhook-subscriber-prefixes")

	for _, u := range []string{
		"https://evil.example.test/webhooks/cal-diy/" + testSub,
		"http://aip.example.test/webhooks/cal-diy/" + testSub,
		"https://AIP.example.test/webhooks/cal-diy/" + testSub,
		"https://aip.example.test/webhooks/cal-diy-x/" + testSub,
		"https://aip.example.test/webhooks/" + testSub,
		"https://aip.example.test.evil.test/webhooks/cal-diy/" + testSub,
		"https://user@aip.example.test/webhooks/cal-diy/" + testSub,
		subscriberPrefix,
		subscriberPrefix + testSub + "/more",
		subscriberPrefix + "../" + testSub,
		subscriberPrefix + "%2e%2e",
		subscriberPrefix + testSub + "?x=1",
		subscriberPrefix + testSub + "#f",
		subscriberPrefix + "-sub",
		" " + subscriberPrefix + testSub,
	} {
		refused(t, h, "webhook.create", create(u), "not an allowed prefix")
		refused(t, h, "webhook.update", `{"webhook_id":"wh_1","subscriber_url":`+strconv.Quote(u)+`}`, "not an allowed prefix")
		refused(t, h, "event_type.webhook.create", `{"event_type_id":11,"subscriber_url":`+strconv.Quote(u)+`,"triggers":["BOOKING_CREATED"],"active":true}`, "not an allowed prefix")
		refused(t, h, "event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":`+strconv.Quote(u)+`}`, "not an allowed prefix")
	}
	if n := len(mock.requests()); n != 0 {
		t.Fatalf("refused subscriber URLs reached the provider %d times", n)
	}

	// An update that leaves the URL alone keeps a URL set who knows where:
	// it may switch the webhook off and nothing else.
	for _, th := range []*testHost{denyAll, h} {
		for _, in := range []string{`"triggers":["MEETING_ENDED"]`, `"active":true`, `"payload_template":"{{attendees}}"`,
			`"active":false,"triggers":["MEETING_ENDED"]`} {
			refused(t, th, "webhook.update", `{"webhook_id":"wh_1",`+in+`}`, "may only switch the webhook off")
			refused(t, th, "event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1",`+in+`}`, "may only switch the webhook off")
		}
	}
	if n := len(mock.requests()); n != 0 {
		t.Fatalf("refused updates reached the provider %d times", n)
	}
	_, resp := denyAll.act(t, "webhook.update", `{"webhook_id":"wh_1","active":false}`)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("switching off without URL: %+v %v: %s", res, err, resp.Raw)
	}
	reqs := mock.requests()
	if len(reqs) != 1 {
		t.Fatalf("the provider got %d requests, want 1", len(reqs))
	}
	jsonEqual(t, "body", reqs[0].Body, `{"active":false}`)
}

// TestPayloadTemplateForOwnSubscriptionRefused: a subscription whose
// deliveries come to this connector (it holds the signing secret) takes no
// payload_template — the webhook route reads Cal.diy's default payload, so
// a template would make every delivery fail — and nothing is sent; a
// subscription delivered elsewhere keeps it.
func TestPayloadTemplateForOwnSubscriptionRefused(t *testing.T) {
	mock := newMockCal(t)
	h := ownSubscriptionHost(t, mock)
	own := strconv.Quote(subscriberPrefix + testSub)
	for _, tc := range []struct{ suffix, input string }{
		{"webhook.create", `{"subscriber_url":` + own + `,"triggers":["BOOKING_CREATED"],"active":true,"payload_template":"{\"t\":\"{{type}}\"}"}`},
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":` + own + `,"payload_template":"x"}`},
		{"event_type.webhook.create", `{"event_type_id":11,"subscriber_url":` + own + `,"triggers":["BOOKING_CREATED"],"active":true,"payload_template":"x"}`},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":` + own + `,"payload_template":"x"}`},
	} {
		_, resp := h.act(t, tc.suffix, tc.input)
		pe := protocolError(t, resp)
		if pe.Code != CodePayloadTemplateRefused || pe.Category != aip.CategoryPolicy || pe.IsRetryable() || !strings.Contains(pe.Message, "leave payload_template out") {
			t.Errorf("%s: error %+v, want %s", tc.suffix, pe, CodePayloadTemplateRefused)
		}
	}
	if n := len(mock.requests()); n != 0 {
		t.Fatalf("refused templates reached the provider %d times", n)
	}
	// Delivered elsewhere (no secret held here): the template is sent.
	mock.set("POST /v2/webhooks", answer{201, userWebhookAnswer, false})
	_, resp := h.act(t, "webhook.create", `{"subscriber_url":`+strconv.Quote(subscriberPrefix+"elsewhere")+`,"triggers":["BOOKING_CREATED"],"active":true,"payload_template":"x"}`)
	if res, err := resp.Result(); err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("template for another receiver: %v %s", err, resp.Raw)
	}
	if reqs := mock.requests(); len(reqs) != 1 || !strings.Contains(string(reqs[0].Body), `"payloadTemplate":"x"`) {
		t.Fatalf("requests %+v", reqs)
	}
}

// TestOwnSubscriptionUpdateClearsTemplate: an update pointing a webhook
// at a subscription this connector receives clears the webhook's payload
// template. PATCH keeps what it does not name, so a template set while
// the webhook pointed elsewhere would stay and make every delivery the
// route reads unreadable (400, not resent). A create needs none (the
// default is no template), nor does an update to a subscription
// delivered elsewhere.
func TestOwnSubscriptionUpdateClearsTemplate(t *testing.T) {
	mock := newMockCal(t)
	h := ownSubscriptionHost(t, mock)
	own := subscriberPrefix + testSub
	for _, tc := range []struct{ suffix, input, body string }{
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":"` + own + `","active":true,"triggers":["BOOKING_CREATED"]}`,
			`{"subscriberUrl":"` + own + `","active":true,"triggers":["BOOKING_CREATED"],"payloadTemplate":"","secret":"` + testSecret + `"}`},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":"` + own + `","triggers":["BOOKING_CREATED"]}`,
			`{"subscriberUrl":"` + own + `","triggers":["BOOKING_CREATED"],"payloadTemplate":"","secret":"` + testSecret + `"}`},
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":"` + subscriberPrefix + `elsewhere","active":true}`,
			`{"subscriberUrl":"` + subscriberPrefix + `elsewhere","active":true}`},
		{"webhook.create", `{"subscriber_url":"` + own + `","triggers":["BOOKING_CREATED"],"active":true}`,
			`{"subscriberUrl":"` + own + `","triggers":["BOOKING_CREATED"],"active":true,"secret":"` + testSecret + `"}`},
	} {
		_, r := completedOnce(t, h, mock, tc.suffix, tc.input)
		jsonEqual(t, tc.suffix+" body", r.Body, tc.body)
	}
}

// TestScheduledTriggersForOwnSubscriptionSent: a subscription whose
// deliveries come to this connector takes MEETING_STARTED and
// MEETING_ENDED. They were refused (cal_diy.trigger_not_receivable,
// nothing sent) while the webhook route could not read the shape
// Cal.diy's scheduler sends them in ({triggerEvent, ...booking}); it
// reads it now (TestWebhookMeetingEvents), so the webhook is sent to
// Cal.diy with the subscription's secret, and an update pointing a
// webhook here need not restate its triggers any more.
func TestScheduledTriggersForOwnSubscriptionSent(t *testing.T) {
	mock := newMockCal(t)
	h := ownSubscriptionHost(t, mock)
	own := subscriberPrefix + testSub
	secret := `"secret":"` + testSecret + `"`
	for _, tc := range []struct{ suffix, input, body string }{
		{"webhook.create", `{"subscriber_url":"` + own + `","triggers":["BOOKING_CREATED","MEETING_ENDED"],"active":true}`,
			`{"subscriberUrl":"` + own + `","triggers":["BOOKING_CREATED","MEETING_ENDED"],"active":true,` + secret + `}`},
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":"` + own + `","triggers":["MEETING_STARTED"]}`,
			`{"subscriberUrl":"` + own + `","triggers":["MEETING_STARTED"],"payloadTemplate":"",` + secret + `}`},
		{"event_type.webhook.create", `{"event_type_id":11,"subscriber_url":"` + own + `","triggers":["MEETING_STARTED","BOOKING_CANCELLED"],"active":true}`,
			`{"subscriberUrl":"` + own + `","triggers":["MEETING_STARTED","BOOKING_CANCELLED"],"active":true,` + secret + `}`},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":"` + own + `","triggers":["MEETING_ENDED"],"active":true}`,
			`{"subscriberUrl":"` + own + `","triggers":["MEETING_ENDED"],"active":true,"payloadTemplate":"",` + secret + `}`},
		// An update pointing a webhook here keeps the webhook's triggers
		// unless it restates them; whatever they are, the route reads them.
		{"webhook.update", `{"webhook_id":"wh_1","subscriber_url":"` + own + `","active":true}`,
			`{"subscriberUrl":"` + own + `","active":true,"payloadTemplate":"",` + secret + `}`},
		{"event_type.webhook.update", `{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":"` + own + `"}`,
			`{"subscriberUrl":"` + own + `","payloadTemplate":"",` + secret + `}`},
	} {
		_, r := completedOnce(t, h, mock, tc.suffix, tc.input)
		jsonEqual(t, tc.suffix+" body", r.Body, tc.body)
	}
}

// TestRedactSecrets: webhook outputs never carry a signing secret, in an
// object, in an array, or nowhere at all.
func TestRedactSecrets(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{userWebhookAnswer, userWebhookOutput},
		{userWebhooksAnswer, userWebhooksOutput},
		{`{"status":"success","data":[]}`, `{"status":"success","data":[]}`},
		{`{"status":"success"}`, `{"status":"success"}`},
		{`{"status":"success","data":[1,{"id":"x","secret":"s"}],"pagination":{"total":2}}`,
			`{"status":"success","data":[1,{"id":"x"}],"pagination":{"total":2}}`},
	} {
		got, err := redactSecrets(json.RawMessage(tc.in))
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		jsonEqual(t, tc.in, got, tc.want)
	}
}

// TestDotSegmentIDsRefused: an ID that is a whole path segment of its own
// ("." or "..") would make the request path name another resource once a
// server or proxy resolves dot segments (DELETE
// /v2/event-types/11/webhooks/.. is DELETE /v2/event-types/11): such an
// input is refused and nothing is sent.
func TestDotSegmentIDsRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	cases := []struct{ suffix, input string }{
		{"event_type.webhook.delete", `{"event_type_id":11,"webhook_id":".."}`},
		{"event_type.private_link.delete", `{"event_type_id":11,"link_id":".."}`},
		{"booking.cancel", `{"booking_uid":".."}`},
		{"booking.get", `{"booking_uid":"."}`},
		{"webhook.delete", `{"webhook_id":".."}`},
		{"slot.reservation.delete", `{"reservation_uid":"."}`},
		{"calendar.event.update", `{"calendar":"google","event_uid":"..","title":"x"}`},
	}
	for _, tc := range cases {
		_, resp := h.act(t, tc.suffix, tc.input)
		res, err := resp.Result()
		if err != nil || res.Status != aip.ResultFailed || res.Error == nil || res.Error.Code != hostsdk.CodeInputInvalid {
			t.Errorf("%s %s: result %+v, %v; want failed %s", tc.suffix, tc.input, res, err, hostsdk.CodeInputInvalid)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests for dot-segment IDs, first %s %s", len(reqs), reqs[0].Method, reqs[0].EscapedPath)
	}
}

// TestNULRefused: an input holding U+0000 (a "\u0000" escape) anywhere,
// in a value or a member name, of a mutation or a read, is refused
// connector_host.input_invalid naming where it is, and Cal.diy is not
// called: it keeps its data in PostgreSQL through Prisma, which cannot
// hold the character nor compare with it, and API v2's Prisma exception
// filter answers that with a 500, which a mutation could only report as
// outcome_unknown and a read as a retryable failure that can never
// succeed. An escaped backslash followed by "u0000" is text, and goes.
func TestNULRefused(t *testing.T) {
	mock := newMockCal(t)
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
	cases := []struct{ suffix, input, path string }{
		{"booking.create", `{"start":"2050-09-05T09:00:00Z","event_type_id":11,"attendee":{"name":"Bob\u0000","time_zone":"UTC","email":"bob@example.test"}}`, `"/attendee/name"`},
		{"booking.create", `{"start":"2050-09-05T09:00:00Z","event_type_id":11,"attendee":{"name":"Bob","time_zone":"UTC","email":"bob@example.test"},"metadata":{"sou\u0000rce":"aip"}}`, `"/metadata/sou\x00rce"`},
		{"booking.cancel", `{"booking_uid":"bk_1","cancellation_reason":"con\u0000flict"}`, `"/cancellation_reason"`},
		{"booking.list", `{"attendee_name":"Bob\u0000"}`, `"/attendee_name"`},
	}
	for _, tc := range cases {
		_, resp := h.act(t, tc.suffix, tc.input)
		pe := protocolError(t, resp)
		if pe.Code != hostsdk.CodeInputInvalid || pe.IsRetryable() || !strings.Contains(pe.Message, tc.path) || !strings.Contains(pe.Message, "U+0000") {
			t.Errorf("%s %s: %+v, want %s naming %s and U+0000", tc.suffix, tc.input, pe, hostsdk.CodeInputInvalid, tc.path)
		}
	}
	if reqs := mock.requests(); len(reqs) != 0 {
		t.Fatalf("the provider got %d requests for inputs holding U+0000, first %s %s", len(reqs), reqs[0].Method, reqs[0].EscapedPath)
	}
	_, req := completedOnce(t, h, mock, "booking.cancel", `{"booking_uid":"bk_1","cancellation_reason":"C:\\u0000 is text"}`)
	if !strings.Contains(string(req.Body), `C:\\u0000 is text`) {
		t.Errorf("sent %s, want the reason as given", req.Body)
	}
}
