package calcom

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	eventTypeJSON   = `{"id":11,"lengthInMinutes":30,"title":"Intro","slug":"intro","description":"","locations":[]}`
	eventTypesAns   = `{"status":"success","data":[` + eventTypeJSON + `]}`
	eventTypeAns    = `{"status":"success","data":` + eventTypeJSON + `}`
	slotsAnswer     = `{"status":"success","data":{"2050-09-05":[{"start":"2050-09-05T09:00:00.000Z","end":"2050-09-05T09:30:00.000Z"}]}}`
	bookingsAnswer  = `{"status":"success","data":[` + bookingJSON + `],"pagination":{"totalItems":1,"remainingItems":0,"returnedItems":1,"itemsPerPage":10,"currentPage":1,"totalPages":1,"hasNextPage":false,"hasPreviousPage":false}}`
	bookingAnswer   = `{"status":"success","data":` + bookingJSON + `}`
	schedulesAnswer = `{"status":"success","data":[{"id":3,"ownerId":7,"name":"Working hours","timeZone":"Europe/Rome","isDefault":true,"availability":[],"overrides":[]}]}`
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
		// adapter sends the plain one (Option 1).
		if r.Method == http.MethodPost && r.URL.Path == "/v2/bookings" {
			body, _ := io.ReadAll(r.Body)
			if err := spec.ValidateSchema("/components/schemas/CreateBookingInput_2024_08_13", body); err != nil {
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
	switch {
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
	u, err := provider.ParseBaseURL("test base URL", baseURL, false, false)
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c, err := New(Config{BaseURL: u, Token: provider.NewSecret(testToken), WebhookSecrets: secrets, Now: now, Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testHost runs conn in a real host; j, when not nil, is its journal.
type testHost struct {
	d      *hostsdktest.Dispatcher
	target hostsdktest.Target
	cfg    hostsdk.Config
	host   *hostsdk.Host
}

func startHost(t *testing.T, conn *Connector, j journal.Journal) *testHost {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)
	if j != nil {
		cfg.Journal = j
	}
	h := hostsdktest.StartHost(t, cfg, conn)
	return &testHost{d: d, target: hostsdktest.TargetOf(h, cfg), cfg: cfg, host: h}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (h *testHost) act(t *testing.T, suffix, input string) (*aip.Action, *hostsdktest.Response) {
	t.Helper()
	a := &aip.Action{ID: aip.NewActionID(), CapabilityID: CapabilityPrefix + suffix, Input: json.RawMessage(input),
		IdempotencyKey: "idem-" + suffix}
	resp, err := h.d.Act(ctxT(t), h.target, a)
	if err != nil {
		t.Fatalf("%s: %v", suffix, err)
	}
	return a, resp
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
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)
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
				wantHeaders["Idempotency-Key"] = a.IdempotencyKey
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
	h := startHost(t, newConnector(t, mock.srv.URL, nil, nil), nil)

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
		{"2xx status error", "POST /v2/bookings/bk_6/confirm", "booking.confirm", `{"booking_uid":"bk_6"}`,
			answer{200, `{"status":"error","error":{"code":"BadRequestException","message":"booking does not need confirmation"}}`, false},
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
			if strings.Contains(pe.Message, testToken) {
				t.Fatal("the error carries the API key")
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
			st, _, err := h.d.Status(ctxT(t), h.target, a.ID, a.CapabilityID)
			if err != nil || st.State != aip.StateOutcomeUnknown {
				t.Fatalf("status %+v, %v; want outcome_unknown", st, err)
			}
			// The same action again: journaled, never sent to the provider.
			mock.set(tc.route, answer{201, bookingAnswer, false})
			if _, err := h.d.Act(ctxT(t), h.target, a); err != nil {
				t.Fatal(err)
			}
			if n := len(mock.requests()) - before; n != 1 {
				t.Fatalf("after the action was sent again the provider got %d requests, want 1", n)
			}
			if st, _, _ := h.d.Status(ctxT(t), h.target, a.ID, a.CapabilityID); st.State != aip.StateOutcomeUnknown {
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
	if err := c.CheckHealth(ctxT(t)); err != nil {
		t.Fatalf("healthy provider: %v", err)
	}
	r := mock.probes()
	if len(r) != 1 || r[0].Path != "/v2/me" || r[0].Header.Get("Authorization") != "Bearer "+testToken {
		t.Fatalf("health probe sent %+v", r)
	}
	mock.set("GET /v2/me", answer{401, `{"status":"error","error":{"message":"Invalid Access Token"}}`, false})
	err := c.CheckHealth(ctxT(t))
	var pe *provider.Error
	if !errors.As(err, &pe) || pe.Status != 401 || strings.Contains(err.Error(), testToken) {
		t.Fatalf("unauthorized provider: %v", err)
	}
}
