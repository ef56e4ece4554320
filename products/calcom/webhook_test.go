package calcom

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

const (
	testSub    = "sub-1.prod"
	testSecret = "whsec_0123456789abcdef"
)

// webhookHost is a host running the connector with one webhook
// subscription, on a journal the test can read.
type webhookHost struct {
	*testHost
	j    *sqliteruntime.Journal
	now  time.Time
	base string
}

func startWebhookHost(t *testing.T) *webhookHost {
	t.Helper()
	mock := newMockCal(t)
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() }) // registered first: runs after the host stops
	now := time.Now().UTC().Truncate(time.Millisecond)
	conn := newConnector(t, mock.srv.URL, map[string]provider.Secret{testSub: provider.NewSecret(testSecret)},
		func() time.Time { return now })
	h := startHost(t, conn, j)
	return &webhookHost{testHost: h, j: j, now: now, base: "http://" + h.Config.Listener.Addr().String()}
}

func sign(secret string, body []byte) string {
	return hex.EncodeToString(webhook.HMACSHA256([]byte(secret), body))
}

func deliveryBody(trigger string, createdAt time.Time, uid string) []byte {
	return []byte(`{"triggerEvent":"` + trigger + `","createdAt":"` + createdAt.Format(time.RFC3339Nano) +
		`","payload":{"uid":"` + uid + `","title":"Intro","startTime":"2050-09-05T09:00:00Z","attendees":[{"name":"Bob"}]}}`)
}

type webhookAnswer struct {
	status int
	body   map[string]any
}

func (a webhookAnswer) code() string {
	e, _ := a.body["error"].(map[string]any)
	c, _ := e["code"].(string)
	return c
}

func post(t *testing.T, url string, body []byte, headers map[string]string) webhookAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(hostsdktest.Context(t), http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := webhookAnswer{status: resp.StatusCode}
	json.Unmarshal(raw, &a.body)
	return a
}

func (w *webhookHost) deliver(t *testing.T, sub string, body []byte, headers map[string]string) webhookAnswer {
	t.Helper()
	return post(t, w.base+"/webhooks/cal-diy/"+sub, body, headers)
}

func (w *webhookHost) pending(t *testing.T) int {
	t.Helper()
	n, err := w.j.PendingEvents(hostsdktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func signed(body []byte) map[string]string {
	return map[string]string{"x-cal-signature-256": sign(testSecret, body), "x-cal-webhook-version": WebhookVersion}
}

func TestWebhook(t *testing.T) {
	w := startWebhookHost(t)
	created := w.now.Add(-time.Minute)
	first := deliveryBody("BOOKING_CREATED", created, "bk_1")

	a := w.deliver(t, testSub, first, signed(first))
	if a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Fatalf("valid delivery: %d %v", a.status, a.body)
	}
	if n := w.pending(t); n != 1 {
		t.Fatalf("%d outbox batches after one delivery, want 1", n)
	}

	// Duplicates: the same delivery, and with the signature in upper case.
	for _, h := range []map[string]string{signed(first),
		{"x-cal-signature-256": strings.ToUpper(sign(testSecret, first)), "x-cal-webhook-version": WebhookVersion}} {
		a = w.deliver(t, testSub, first, h)
		if a.status != 200 || a.body["duplicate"] != true {
			t.Fatalf("duplicate delivery: %d %v", a.status, a.body)
		}
	}
	if n := w.pending(t); n != 1 {
		t.Fatalf("%d outbox batches after duplicates, want 1", n)
	}

	refused := []struct {
		name    string
		sub     string
		body    []byte
		headers map[string]string
		status  int
		code    string
	}{
		{"wrong secret", testSub, first, map[string]string{"x-cal-signature-256": sign("other", first), "x-cal-webhook-version": WebhookVersion},
			401, webhook.CodeAuthenticationFailed},
		{"short signature", testSub, first, map[string]string{"x-cal-signature-256": sign(testSecret, first)[:62], "x-cal-webhook-version": WebhookVersion},
			401, webhook.CodeAuthenticationFailed},
		{"tampered body", testSub, deliveryBody("BOOKING_CREATED", created, "bk_X"), signed(first), 401, webhook.CodeAuthenticationFailed},
		{"no signature", testSub, first, map[string]string{"x-cal-webhook-version": WebhookVersion}, 400, webhook.CodeMissingHeader},
		{"no version", testSub, first, map[string]string{"x-cal-signature-256": sign(testSecret, first)}, 400, webhook.CodeMissingHeader},
		{"other version", testSub, first, map[string]string{"x-cal-signature-256": sign(testSecret, first), "x-cal-webhook-version": "2024-01-01"},
			400, webhook.CodeInvalidDelivery},
		{"stale", testSub, deliveryBody("BOOKING_CREATED", w.now.Add(-25*time.Hour), "bk_2"), nil, 400, webhook.CodeInvalidTimestamp},
		// Ahead of the clock: delivered again (TestWebhookCreatedAtAheadOfClock).
		{"future", testSub, deliveryBody("BOOKING_CREATED", w.now.Add(10*time.Minute), "bk_3"), nil, 503, webhook.CodeInvalidTimestamp},
		{"payload not an object", testSub, []byte(`{"triggerEvent":"BOOKING_CREATED","createdAt":"` + created.Format(time.RFC3339) + `","payload":[1]}`),
			nil, 400, webhook.CodeInvalidDelivery},
		{"bad createdAt", testSub, []byte(`{"triggerEvent":"BOOKING_CREATED","createdAt":"yesterday","payload":{}}`),
			nil, 400, webhook.CodeInvalidDelivery},
		{"bad trigger", testSub, []byte(`{"triggerEvent":"BOOKING CREATED","createdAt":"` + created.Format(time.RFC3339) + `","payload":{}}`),
			nil, 400, webhook.CodeInvalidDelivery},
		{"not UTF-8", testSub, []byte("{\"triggerEvent\":\"\xff\"}"), nil, 400, webhook.CodeInvalidUTF8},
		{"unknown subscription", "sub-2", first, nil, 404, webhook.CodeInvalidDelivery},
		{"invalid subscription", "-sub", first, nil, 404, webhook.CodeInvalidDelivery},
		{"too large", testSub, bytes.Repeat([]byte("a"), WebhookMaxBody+1), nil, 413, webhook.CodeTooLarge},
		// An event too large is cut down to fit (TestWebhookEventTooLarge).
	}
	for _, tc := range refused {
		h := tc.headers
		if h == nil {
			h = signed(tc.body)
		}
		a := w.deliver(t, tc.sub, tc.body, h)
		if a.status != tc.status || a.code() != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, a.status, a.body, tc.status, tc.code)
		}
	}
	if n := w.pending(t); n != 1 {
		t.Fatalf("%d outbox batches after refused deliveries, want 1", n)
	}

	second := deliveryBody("BOOKING_CANCELLED", w.now.Add(2*time.Minute), "bk_1") // within the allowed skew
	if a := w.deliver(t, testSub, second, signed(second)); a.status != 200 || a.body["duplicate"] != nil {
		t.Fatalf("second delivery: %d %v", a.status, a.body)
	}

	entries, err := w.j.ClaimEvents(hostsdktest.Context(t), time.Now().Add(time.Hour), time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 2 {
		t.Fatalf("%d outbox batches, want 2", len(entries))
	}
	kinds := map[string]aip.Event{}
	for _, e := range entries {
		if e.ChannelID != WebhookChannel {
			t.Errorf("channel %q, want %q", e.ChannelID, WebhookChannel)
		}
		var evs []aip.Event
		if err := json.Unmarshal(e.Events, &evs); err != nil || len(evs) != 1 {
			t.Fatalf("batch %s: %v", e.Events, err)
		}
		kinds[evs[0].Kind] = evs[0]
	}
	ev, ok := kinds["cal_diy.booking_created"]
	if !ok {
		t.Fatalf("no cal_diy.booking_created event in %v", kinds)
	}
	if _, ok := kinds["cal_diy.booking_cancelled"]; !ok {
		t.Fatalf("no cal_diy.booking_cancelled event in %v", kinds)
	}
	wantID := eventID(fenceID(testSub, WebhookVersion, sign(testSecret, first), first), created)
	if ev.ID != wantID {
		t.Errorf("event ID %s, want %s (derived from the delivery)", ev.ID, wantID)
	}
	if err := aip.ValidateID(aip.PrefixEvent, ev.ID); err != nil {
		t.Errorf("event ID: %v", err)
	}
	if !ev.OccurredAt.Time.Equal(created) {
		t.Errorf("occurred_at %v, want createdAt %v", ev.OccurredAt.Time, created)
	}
	var data struct {
		SubscriptionID string          `json:"subscription_id"`
		TriggerEvent   string          `json:"trigger_event"`
		Payload        json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		t.Fatal(err)
	}
	if data.SubscriptionID != testSub || data.TriggerEvent != "BOOKING_CREATED" || !strings.Contains(string(data.Payload), `"uid":"bk_1"`) {
		t.Errorf("event data %s", ev.Data)
	}
}

func TestWebhookRouteAbsentWithoutSecret(t *testing.T) {
	mock := newMockCal(t)
	conn := newConnector(t, mock.srv.URL, nil, nil)
	h := startHost(t, conn, nil)
	body := deliveryBody("BOOKING_CREATED", time.Now(), "bk_1")
	a := post(t, "http://"+h.Config.Listener.Addr().String()+"/webhooks/cal-diy/"+testSub, body, signed(body))
	if a.status != http.StatusNotFound && a.status != http.StatusMethodNotAllowed {
		t.Fatalf("webhook without a secret: %d %v, want no route", a.status, a.body)
	}
	if a.code() != "" {
		t.Fatalf("the connector's webhook handler answered: %v", a.body)
	}
	m, _ := conn.Manifest(hostsdktest.Context(t), h.Host.Tenant())
	if len(m.Channels) != 0 {
		t.Fatalf("channels %s without webhook secrets", m.Channels)
	}
}

// TestEventIDDeterministic: the event ID depends on the delivery only,
// so a delivery the fence forgot still maps to the same event.
func TestEventIDDeterministic(t *testing.T) {
	at := time.Date(2050, 9, 5, 9, 0, 0, 0, time.UTC)
	body := deliveryBody("BOOKING_CREATED", at, "bk_1")
	f := fenceID(testSub, WebhookVersion, sign(testSecret, body), body)
	if len(f) != 64 {
		t.Fatalf("fence ID %q is not hex SHA-256", f)
	}
	if f != fenceID(testSub, WebhookVersion, strings.ToUpper(sign(testSecret, body)), body) {
		t.Fatal("the fence ID depends on the signature's case")
	}
	for _, other := range []string{
		fenceID("sub-2", WebhookVersion, sign(testSecret, body), body),
		fenceID(testSub, "2021-10-21", sign(testSecret, body), body),
		fenceID(testSub, WebhookVersion, sign("x", body), body),
		fenceID(testSub, WebhookVersion, sign(testSecret, body), append(body, ' ')),
	} {
		if other == f {
			t.Fatal("two different deliveries share a fence ID")
		}
	}
	d, createdAt, msg := parseDelivery(body)
	if msg != "" {
		t.Fatal(msg)
	}
	e1, _ := event(testSub, f, d, createdAt)
	e2, _ := event(testSub, f, d, createdAt)
	a, _ := json.Marshal(e1)
	b, _ := json.Marshal(e2)
	if !bytes.Equal(a, b) {
		t.Fatalf("the same delivery maps to two events:\n%s\n%s", a, b)
	}
	if id, err := aip.IDTime(aip.PrefixEvent, e1.ID); err != nil || !id.Equal(at) {
		t.Fatalf("event ID time %v, %v; want %v", id, err, at)
	}
}

// TestWebhookEventRefusedForGood: a signed delivery whose event the host
// refuses for its content (hostsdk.ErrInvalidEvents: here a NUL character
// in the booking's title, which the fleet's event log cannot store) is
// refused with 400 webhook.invalid_delivery naming why, not 503, which had
// Cal.diy deliver it again and again; nothing is stored, and the fence
// does not hold it (a corrected delivery is not a duplicate).
func TestWebhookEventRefusedForGood(t *testing.T) {
	w := startWebhookHost(t)
	body := []byte(strings.Replace(string(deliveryBody("BOOKING_CREATED", w.now.Add(-time.Minute), "bk_nul")), `"Intro"`, `"In\u0000tro"`, 1))
	a := w.deliver(t, testSub, body, signed(body))
	e, _ := a.body["error"].(map[string]any)
	if msg, _ := e["message"].(string); a.status != http.StatusBadRequest || a.code() != webhook.CodeInvalidDelivery || !strings.Contains(msg, "NUL") {
		t.Fatalf("a delivery whose event the host refuses: %d %v", a.status, a.body)
	}
	if n := w.pending(t); n != 0 {
		t.Fatalf("%d outbox batches, want none", n)
	}
}

// TestWebhookPublishRefusalsLogged: a verified delivery whose event the
// host refused to store was logged on every attempt (the PublishFailed
// function), so a delivery sent again while the host keeps refusing it
// wrote a line each time. It is logged as the route's other refusals
// are: at most once a minute of each kind, naming the subscription,
// the event and the trigger.
func TestWebhookPublishRefusalsLogged(t *testing.T) {
	w, logs := startLoggedWebhookHost(t)
	body := []byte(strings.Replace(string(deliveryBody("BOOKING_CREATED", w.now.Add(-time.Minute), "bk_nul")), `"Intro"`, `"In\u0000tro"`, 1))
	for i := range 3 {
		if a := w.deliver(t, testSub, body, signed(body)); a.status != http.StatusBadRequest || a.code() != webhook.CodeInvalidDelivery {
			t.Fatalf("attempt %d of a delivery whose event the host refuses: %d %v", i+1, a.status, a.body)
		}
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "level=WARN") ||
		!strings.Contains(got[0], "subscription_id="+testSub) || !strings.Contains(got[0], "event_id=") ||
		!strings.Contains(got[0], "trigger_event=BOOKING_CREATED") || !strings.Contains(got[0], "NUL") {
		t.Fatalf("a delivery sent 3 times while the host refuses its event logged %q, want one warning naming it", got)
	}
}

// TestWebhookReplayOfFutureCreatedAt: a delivery whose createdAt is ahead
// of this host's clock (within WebhookMaxSkew) passes the age check until
// createdAt+WebhookMaxAge, which is later than WebhookMaxAge after it was
// received; the replay fence must still hold it then.
func TestWebhookReplayOfFutureCreatedAt(t *testing.T) {
	mock := newMockCal(t)
	var mu sync.Mutex
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	now := t0
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	conn := newConnector(t, mock.srv.URL, map[string]provider.Secret{testSub: provider.NewSecret(testSecret)}, clock)
	h := startHost(t, conn, nil)
	url := "http://" + h.Config.Listener.Addr().String() + "/webhooks/cal-diy/" + testSub
	body := deliveryBody("BOOKING_CREATED", t0.Add(WebhookMaxSkew-time.Minute), "bk_f")
	if a := post(t, url, body, signed(body)); a.status != 200 || a.body["duplicate"] != nil {
		t.Fatalf("first delivery: %d %v", a.status, a.body)
	}
	mu.Lock()
	now = t0.Add(WebhookMaxAge + WebhookMaxSkew/2) // createdAt is younger than WebhookMaxAge
	mu.Unlock()
	if a := post(t, url, body, signed(body)); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("the same delivery %s after it was received: %d %v, want a duplicate", WebhookMaxAge+WebhookMaxSkew/2, a.status, a.body)
	}
}

// The signing secret webhook creates and updates send is a credential
// like the API key: when Cal.diy or a proxy echoes the request body in an
// error, the action's error (a failed result, or the outcome_unknown
// record) quotes it as [redacted].
func TestEchoedWebhookSecretIsRedacted(t *testing.T) {
	mock := newMockCal(t)
	h := ownSubscriptionHost(t, mock)
	echo := `{"status":"error","error":{"code":"BadRequestException","message":"refused body {\"secret\":\"` + testSecret + `\"}"}}`
	create := `{"subscriber_url":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED"],"active":true}`
	for _, tc := range []struct {
		name, route, suffix, input string
		a                          answer
	}{
		{"400", "POST /v2/webhooks", "webhook.create", create, answer{400, echo, false}},
		{"2xx status error", "PATCH /v2/event-types/11/webhooks/wh_1", "event_type.webhook.update",
			`{"event_type_id":11,"webhook_id":"wh_1","subscriber_url":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED"]}`, answer{200, echo, false}},
		{"502", "POST /v2/event-types/11/webhooks", "event_type.webhook.create",
			`{"event_type_id":11,"subscriber_url":"` + subscriberPrefix + testSub + `","triggers":["BOOKING_CREATED"],"active":true}`,
			answer{502, echo, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mock.set(tc.route, tc.a)
			a, resp := h.act(t, tc.suffix, tc.input)
			reqs := mock.requests()
			if sent := reqs[len(reqs)-1]; !bytes.Contains(sent.Body, []byte(testSecret)) {
				t.Fatalf("the request did not carry the signing secret: %s", sent.Body)
			}
			st, _, err := h.Dispatcher.Status(hostsdktest.Context(t), h.Target, a.ID, a.CapabilityID)
			if err != nil {
				t.Fatal(err)
			}
			recorded, _ := json.Marshal(st)
			for what, text := range map[string][]byte{"answer": resp.Raw, "status": recorded} {
				if bytes.Contains(text, []byte(testSecret[:12])) {
					t.Errorf("the %s quotes the signing secret: %s", what, text)
				}
			}
			if !bytes.Contains(append(resp.Raw, recorded...), []byte("[redacted]")) {
				t.Errorf("neither the answer nor the status quotes the echoed secret as [redacted]: %s %s", resp.Raw, recorded)
			}
		})
	}
}

// TestWebhookCreatedAtAheadOfClock: a delivery whose createdAt is more
// than WebhookMaxSkew ahead of this replica's clock is answered 503
// webhook.invalid_timestamp, to be delivered again, as the fleet's routes
// answer an event time ahead of the clock (webhook.Refusals.PublishFailed,
// hostsdk.ErrEventAhead): the replica's clock may be the wrong one. It
// was 400, which Cal.diy does not resend, so a replica whose clock lagged
// lost the booking's event for good. Once the clock is right the same
// delivery is taken. A createdAt more than WebhookMaxAge old stays 400.
func TestWebhookCreatedAtAheadOfClock(t *testing.T) {
	mock := newMockCal(t)
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	var mu sync.Mutex
	lag := 10 * time.Minute // this replica's clock is 10 minutes behind
	conn := newConnector(t, mock.srv.URL, map[string]provider.Secret{testSub: provider.NewSecret(testSecret)},
		func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(-lag) })
	h := startHost(t, conn, j)
	w := &webhookHost{testHost: h, j: j, base: "http://" + h.Config.Listener.Addr().String()}

	body := deliveryBody("BOOKING_CREATED", time.Now().UTC(), "bk_ahead")
	a := w.deliver(t, testSub, body, signed(body))
	if a.status != http.StatusServiceUnavailable || a.code() != webhook.CodeInvalidTimestamp {
		t.Fatalf("createdAt ahead of the replica's clock: %d %v, want 503 %s", a.status, a.body, webhook.CodeInvalidTimestamp)
	}
	if n := w.pending(t); n != 0 {
		t.Fatalf("%d outbox batches, want none", n)
	}
	mu.Lock()
	lag = 0
	mu.Unlock()
	if a := w.deliver(t, testSub, body, signed(body)); a.status != 200 || a.body["duplicate"] != nil {
		t.Fatalf("the same delivery once the clock is right: %d %v", a.status, a.body)
	}
	if n := w.pending(t); n != 1 {
		t.Fatalf("%d outbox batches, want 1", n)
	}

	old := deliveryBody("BOOKING_CREATED", time.Now().Add(-WebhookMaxAge-time.Hour), "bk_old")
	if a := w.deliver(t, testSub, old, signed(old)); a.status != http.StatusBadRequest || a.code() != webhook.CodeInvalidTimestamp {
		t.Fatalf("createdAt older than %s: %d %v, want 400 %s", WebhookMaxAge, a.status, a.body, webhook.CodeInvalidTimestamp)
	}
}

// startLoggedWebhookHost is startWebhookHost whose host logs at warn and
// above to the buffer it returns.
func startLoggedWebhookHost(t *testing.T) (*webhookHost, *hostsdktest.LogBuffer) {
	t.Helper()
	mock := newMockCal(t)
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	now := time.Now().UTC().Truncate(time.Millisecond)
	conn := newConnector(t, mock.srv.URL, map[string]provider.Secret{testSub: provider.NewSecret(testSecret)},
		func() time.Time { return now })
	logs := &hostsdktest.LogBuffer{}
	h := &testHost{hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) {
		cfg.Journal = j
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})}
	logs.Take("")
	return &webhookHost{testHost: h, j: j, now: now, base: "http://" + h.Config.Listener.Addr().String()}, logs
}

// TestWebhookRefusalsLogged: a verified delivery the route refused — a
// MEETING_STARTED in the shape of Cal.diy's scheduler whose startTime is
// not a time, a createdAt more than a day old, an event too large — was
// answered without a log line, and Cal.diy does not deliver it again: its
// event was lost without a trace on the replica.
// Each is logged at warn with the subscription, the trigger and why; the
// same refusal again within a minute is counted, not logged. A signature
// that does not verify is logged too, rate-limited the same way.
func TestWebhookRefusalsLogged(t *testing.T) {
	w, logs := startLoggedWebhookHost(t)
	for _, tc := range []struct {
		name   string
		body   []byte
		status int
		want   []string
	}{
		{"meeting started", []byte(`{"triggerEvent":"MEETING_STARTED","id":101,"uid":"bk_meet","title":"Intro","startTime":"soon","createdAt":"` +
			w.now.Add(-72*time.Hour).Format(time.RFC3339) + `"}`), 400,
			[]string{"trigger_event=MEETING_STARTED", "shape of Cal.diy's scheduler", "startTime must be an RFC 3339 time", "subscription_id=" + testSub}},
		{"stale", deliveryBody("BOOKING_CREATED", w.now.Add(-25*time.Hour), "bk_stale"), 400,
			[]string{"trigger_event=BOOKING_CREATED", "clock_offset=25h0m0s", "check this host's clock (NTP)"}},
		{"unmappable", []byte(`{"triggerEvent":"BOOKING_CREATED","createdAt":"yesterday","payload":{}}`), 400,
			[]string{"cannot be mapped", "createdAt must be an RFC 3339 time"}},
	} {
		a := w.deliver(t, testSub, tc.body, signed(tc.body))
		if a.status != tc.status {
			t.Fatalf("%s: %d %v, want %d", tc.name, a.status, a.body, tc.status)
		}
		got := logs.Take("cal-diy webhook")
		if len(got) != 1 || !strings.Contains(got[0], "level=WARN") {
			t.Fatalf("%s: logged %q, want one warning", tc.name, got)
		}
		for _, s := range tc.want {
			if !strings.Contains(got[0], s) {
				t.Errorf("%s: logged %q, want %q in it", tc.name, got[0], s)
			}
		}
		// The same refusal again within a minute: counted, not logged.
		w.deliver(t, testSub, tc.body, signed(tc.body))
		if got := logs.Take("cal-diy webhook"); len(got) != 0 {
			t.Errorf("%s: the same refusal again logged %q", tc.name, got)
		}
	}
	forged := deliveryBody("BOOKING_CREATED", w.now, "bk_forged")
	for range 2 {
		if a := w.deliver(t, testSub, forged, map[string]string{"x-cal-signature-256": sign("other", forged), "x-cal-webhook-version": WebhookVersion}); a.status != 401 {
			t.Fatalf("forged delivery: %d %v", a.status, a.body)
		}
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "does not verify") || !strings.Contains(got[0], "subscription_id="+testSub) {
		t.Fatalf("two deliveries that do not verify logged %q, want one line", got)
	}
}

// TestWebhookEventTooLarge: a delivery whose event would exceed
// hostsdk.MaxEventBytes (a booking with long notes or many responses,
// within the route's 1 MiB body limit) was refused 413, and Cal.diy does
// not deliver again, so the booking's event was lost. Its payload is cut
// down to fit as Chatwoot's and Twenty's routes do: its largest members
// left out and named, the members naming the booking kept, the payload as
// delivered described by its size and digest; the event ID stays the
// whole delivery's.
func TestWebhookEventTooLarge(t *testing.T) {
	w := startWebhookHost(t)
	created := w.now.Add(-time.Minute)
	payload := `{"uid":"bk_long","bookingId":101,"title":"Intro","startTime":"2050-09-05T09:00:00Z",` +
		`"description":"` + strings.Repeat("d", 400<<10) + `","responses":{"notes":"` + strings.Repeat("n", 300<<10) + `"}}`
	body := []byte(`{"triggerEvent":"BOOKING_CREATED","createdAt":"` + created.Format(time.RFC3339Nano) + `","payload":` + payload + `}`)
	if len(body) > WebhookMaxBody {
		t.Fatalf("the test's body is %d bytes, over the route's limit", len(body))
	}
	if a := w.deliver(t, testSub, body, signed(body)); a.status != 200 || a.body["accepted_events"] != float64(1) {
		t.Fatalf("delivery of a %d-byte booking: %d %v, want 200", len(body), a.status, a.body)
	}
	entries, err := w.j.ClaimEvents(hostsdktest.Context(t), time.Now().Add(time.Hour), time.Minute, 10)
	if err != nil || len(entries) != 1 {
		t.Fatalf("%d outbox batches (%v), want 1", len(entries), err)
	}
	var evs []aip.Event
	if err := json.Unmarshal(entries[0].Events, &evs); err != nil || len(evs) != 1 {
		t.Fatalf("batch %.200s: %v", entries[0].Events, err)
	}
	ev := evs[0]
	if want := eventID(fenceID(testSub, WebhookVersion, sign(testSecret, body), body), created); ev.ID != want {
		t.Errorf("event ID %s, want %s (the whole delivery's)", ev.ID, want)
	}
	if raw, _ := json.Marshal(ev); len(raw) > hostsdk.MaxEventBytes {
		t.Errorf("the event is %d bytes", len(raw))
	}
	var data struct {
		TriggerEvent string `json:"trigger_event"`
		Payload      struct {
			UID         string          `json:"uid"`
			BookingID   int             `json:"bookingId"`
			Title       string          `json:"title"`
			StartTime   string          `json:"startTime"`
			Description json.RawMessage `json:"description"`
			Responses   json.RawMessage `json:"responses"`
		} `json:"payload"`
		Omitted []string `json:"payload_omitted"`
		Bytes   int      `json:"payload_bytes"`
		SHA256  string   `json:"payload_sha256"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(payload))
	if data.TriggerEvent != "BOOKING_CREATED" || data.Payload.UID != "bk_long" || data.Payload.BookingID != 101 || data.Payload.Title != "Intro" ||
		data.Payload.StartTime == "" || data.Payload.Description != nil || data.Payload.Responses != nil ||
		strings.Join(data.Omitted, ",") != "description,responses" || data.Bytes != len(payload) || data.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("data %+v", data)
	}
}

// TestWebhookPreviousSecret: while a Cal.diy webhook switches to a new
// secret, deliveries signed with the previous one were refused 401 (each
// subscription had one secret) and lost, since Cal.diy does not deliver
// them again. With the subscription in
// --cal-diy-webhook-previous-secret-files both verify; the previous one's
// use is logged at info once, and so is the first delivery with the
// current secret after it; any other signature is still refused, and
// webhook creates and updates still send the current secret.
func TestWebhookPreviousSecret(t *testing.T) {
	const oldSecret = "whsec_previous_9876"
	mock := newMockCal(t)
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	now := time.Now().UTC().Truncate(time.Millisecond)
	conn := newConnectorWith(t, mock.srv.URL, func(c *Config) {
		c.WebhookSecrets = map[string]provider.Secret{testSub: provider.NewSecret(testSecret)}
		c.PreviousWebhookSecrets = map[string]provider.Secret{testSub: provider.NewSecret(oldSecret)}
		c.Now = func() time.Time { return now }
		c.SubscriberPrefixes = []string{"https://aip.example.com/webhooks/cal-diy/"}
	})
	logs := &hostsdktest.LogBuffer{}
	h := &testHost{hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) {
		cfg.Journal = j
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})}
	w := &webhookHost{testHost: h, j: j, now: now, base: "http://" + h.Config.Listener.Addr().String()}
	logs.Take("")
	n := 0
	deliverWith := func(secret string) webhookAnswer {
		n++
		body := deliveryBody("BOOKING_CREATED", now.Add(-time.Minute), fmt.Sprintf("bk_%d", n))
		return w.deliver(t, testSub, body, map[string]string{"x-cal-signature-256": sign(secret, body), "x-cal-webhook-version": WebhookVersion})
	}
	for range 2 {
		if a := deliverWith(oldSecret); a.status != 200 || a.body["duplicate"] != nil {
			t.Fatalf("delivery signed with the previous secret: %d %v, want accepted", a.status, a.body)
		}
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[0], "subscription_id="+testSub) ||
		!strings.Contains(got[0], "previous webhook secret (the "+testSub+" entry of --cal-diy-webhook-previous-secret-files)") {
		t.Fatalf("two deliveries with the previous secret logged %q, want one info line", got)
	}
	for range 2 {
		if a := deliverWith(testSecret); a.status != 200 {
			t.Fatalf("delivery signed with the current secret: %d %v", a.status, a.body)
		}
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "the product has switched") {
		t.Fatalf("deliveries with the current secret after the previous logged %q, want one info line", got)
	}
	if a := deliverWith("whsec_someone_else"); a.status != 401 || a.code() != webhook.CodeAuthenticationFailed {
		t.Fatalf("delivery signed with another secret: %d %v, want 401", a.status, a.body)
	}
	if n := w.pending(t); n != 4 {
		t.Fatalf("%d outbox batches, want 4", n)
	}
	// A webhook pointed at the subscription is given the current secret.
	body := map[string]any{"subscriberUrl": "https://aip.example.com/webhooks/cal-diy/" + testSub, "triggers": []any{"BOOKING_CREATED"}}
	if perr := conn.prepareWebhook(body, false); perr != nil || body["secret"] != testSecret {
		t.Fatalf("webhook create for the subscription: %v, secret sent %v, want the current one", perr, body["secret"])
	}
}
