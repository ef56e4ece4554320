package calcom

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
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

// jsTime writes t as JavaScript's Date.toJSON does, as Cal.diy's
// JSON.stringify of a booking writes its times.
func jsTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// scheduledBody is a delivery in the shape Cal.diy's scheduler sends
// MEETING_STARTED and MEETING_ENDED in (scheduleTrigger.ts stores
// JSON.stringify({triggerEvent, ...booking})): the booking's members at
// the top, no payload member, createdAt the booking's own; extra members
// are added before the booking's times.
func scheduledBody(trigger, uid string, start, end, created time.Time, extra string) []byte {
	return []byte(`{"triggerEvent":"` + trigger + `","id":101,"uid":"` + uid + `","eventTypeId":11,"userId":7,"title":"Intro",` + extra +
		`"startTime":"` + jsTime(start) + `","endTime":"` + jsTime(end) + `","createdAt":"` + jsTime(created) +
		`","status":"ACCEPTED","attendees":[{"name":"Bob","email":"bob@example.com"}],"responses":{"name":"Bob"}}`)
}

// outboxEvents claims the outbox's batches of one event each and returns
// them by ID.
func (w *webhookHost) outboxEvents(t *testing.T) map[string]aip.Event {
	t.Helper()
	entries, err := w.j.ClaimEvents(hostsdktest.Context(t), time.Now().Add(time.Hour), time.Minute, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]aip.Event{}
	for _, e := range entries {
		var evs []aip.Event
		if err := json.Unmarshal(e.Events, &evs); err != nil || len(evs) != 1 {
			t.Fatalf("batch %.200s: %v", e.Events, err)
		}
		if e.ChannelID != WebhookChannel {
			t.Errorf("channel %q, want %q", e.ChannelID, WebhookChannel)
		}
		out[evs[0].ID] = evs[0]
	}
	return out
}

// TestWebhookMeetingEvents: Cal.diy's scheduler sends MEETING_STARTED at
// the booking's startTime and MEETING_ENDED at its endTime as
// {triggerEvent, ...booking}, without the payload member and with the
// booking's own createdAt, days old by the meeting. The route refused
// every one (400, which Cal.diy does not resend). It now reads that shape:
// each becomes an event cal_diy.meeting_started or cal_diy.meeting_ended
// whose time (occurred_at, created_at and the ID's) is the booking's
// startTime or endTime, the time the freshness window and the replay
// fence hold it to; its payload is the body as delivered. A duplicate is
// stored once, a time more than 25 hours old (WebhookScheduledMaxAge) is
// refused with the clock warning, one ahead of the clock is asked again, and a payload too large
// is cut down keeping the members that name the booking.
func TestWebhookMeetingEvents(t *testing.T) {
	w, logs := startLoggedWebhookHost(t)
	booked := w.now.Add(-72 * time.Hour)
	start := w.now.Add(-time.Minute)
	started := scheduledBody("MEETING_STARTED", "bk_meet", start, start.Add(30*time.Minute), booked, "")
	// A meeting that began more than a day ago and ended within it: its
	// MEETING_ENDED is held to its endTime, not its startTime.
	end := w.now.Add(-23 * time.Hour)
	ended := scheduledBody("MEETING_ENDED", "bk_long", end.Add(-2*time.Hour), end, booked, "")

	for _, body := range [][]byte{started, ended} {
		if a := w.deliver(t, testSub, body, signed(body)); a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
			t.Fatalf("scheduler delivery %.40s: %d %v, want accepted", body, a.status, a.body)
		}
	}
	if a := w.deliver(t, testSub, started, signed(started)); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("the same MEETING_STARTED again: %d %v, want a duplicate", a.status, a.body)
	}
	if n := w.pending(t); n != 2 {
		t.Fatalf("%d outbox batches, want 2", n)
	}

	for _, tc := range []struct {
		name      string
		body      []byte
		status    int
		msg       string
		logged    []string
		notLogged bool
	}{
		{"MEETING_STARTED more than a day and an hour old", scheduledBody("MEETING_STARTED", "bk_old", w.now.Add(-26*time.Hour), w.now.Add(-25*time.Hour-30*time.Minute), booked, ""),
			400, "startTime is more than 25 hours old",
			[]string{"trigger_event=MEETING_STARTED", "its startTime is more than 25h0m0s before this replica's clock", "clock_offset=26h0m0s",
				"check this host's clock (NTP)", "start_time=" + jsTime(w.now.Add(-26*time.Hour))}, false},
		// The same kind of refusal within a minute is counted, not logged.
		{"MEETING_ENDED more than a day and an hour old", scheduledBody("MEETING_ENDED", "bk_old", w.now.Add(-27*time.Hour), w.now.Add(-26*time.Hour), booked, ""),
			400, "endTime is more than 25 hours old", nil, true},
		{"MEETING_ENDED ahead of the clock", scheduledBody("MEETING_ENDED", "bk_soon", w.now.Add(-time.Hour), w.now.Add(10*time.Minute), booked, ""),
			503, "endTime is more than 5 minutes ahead of this replica's clock",
			[]string{"trigger_event=MEETING_ENDED", "endTime is ahead of this replica's clock", "end_time=" + jsTime(w.now.Add(10*time.Minute))}, false},
	} {
		a := w.deliver(t, testSub, tc.body, signed(tc.body))
		e, _ := a.body["error"].(map[string]any)
		if msg, _ := e["message"].(string); a.status != tc.status || a.code() != webhook.CodeInvalidTimestamp || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %v, want %d %s %q", tc.name, a.status, a.body, tc.status, webhook.CodeInvalidTimestamp, tc.msg)
		}
		got := logs.Take("cal-diy webhook")
		if tc.notLogged {
			if len(got) != 0 {
				t.Errorf("%s: logged %q, want nothing (counted)", tc.name, got)
			}
			continue
		}
		if len(got) != 1 || !strings.Contains(got[0], "level=WARN") {
			t.Fatalf("%s: logged %q, want one warning", tc.name, got)
		}
		for _, s := range tc.logged {
			if !strings.Contains(got[0], s) {
				t.Errorf("%s: logged %q, want %q in it", tc.name, got[0], s)
			}
		}
	}
	if n := w.pending(t); n != 2 {
		t.Fatalf("%d outbox batches after the refusals, want 2", n)
	}

	evs := w.outboxEvents(t)
	for _, tc := range []struct {
		body         []byte
		kind, at     string
		when         time.Time
		trigger, uid string
	}{
		{started, "cal_diy.meeting_started", jsTime(start), start, "MEETING_STARTED", "bk_meet"},
		{ended, "cal_diy.meeting_ended", jsTime(end), end, "MEETING_ENDED", "bk_long"},
	} {
		id := eventID(fenceID(testSub, WebhookVersion, sign(testSecret, tc.body), tc.body), tc.when)
		ev, ok := evs[id]
		if !ok {
			t.Fatalf("%s: no event %s (derived from the delivery and the booking's time) in %v", tc.kind, id, evs)
		}
		if ev.Kind != tc.kind || !ev.OccurredAt.Time.Equal(tc.when) {
			t.Errorf("%s: kind %s, occurred_at %v; want %s at %v", id, ev.Kind, ev.OccurredAt.Time, tc.kind, tc.when)
		}
		var data struct {
			SubscriptionID string          `json:"subscription_id"`
			TriggerEvent   string          `json:"trigger_event"`
			CreatedAt      string          `json:"created_at"`
			WebhookVersion string          `json:"webhook_version"`
			Payload        json.RawMessage `json:"payload"`
		}
		if err := json.Unmarshal(ev.Data, &data); err != nil {
			t.Fatal(err)
		}
		if data.SubscriptionID != testSub || data.TriggerEvent != tc.trigger || data.CreatedAt != tc.at || data.WebhookVersion != WebhookVersion {
			t.Errorf("%s: data %s", tc.kind, ev.Data)
		}
		jsonEqual(t, tc.kind+" payload", data.Payload, string(tc.body))
		if !strings.Contains(string(data.Payload), `"uid":"`+tc.uid+`"`) {
			t.Errorf("%s: payload %s", tc.kind, data.Payload)
		}
	}
}

// TestWebhookMeetingEventTooLarge: a MEETING_STARTED whose booking is too
// large for one event (a long description) is cut down as the other
// deliveries are (webhook.TrimPayload), keeping the members that name the
// booking in the scheduler's shape (its id, uid, times and the trigger);
// payload_bytes and payload_sha256 describe the body as delivered.
func TestWebhookMeetingEventTooLarge(t *testing.T) {
	w := startWebhookHost(t)
	start := w.now.Add(-time.Minute)
	body := scheduledBody("MEETING_STARTED", "bk_big", start, start.Add(time.Hour), w.now.Add(-48*time.Hour),
		`"description":"`+strings.Repeat("d", 400<<10)+`",`)
	if a := w.deliver(t, testSub, body, signed(body)); a.status != 200 || a.body["accepted_events"] != float64(1) {
		t.Fatalf("delivery of a %d-byte booking: %d %v, want 200", len(body), a.status, a.body)
	}
	evs := w.outboxEvents(t)
	ev, ok := evs[eventID(fenceID(testSub, WebhookVersion, sign(testSecret, body), body), start)]
	if !ok || len(evs) != 1 {
		t.Fatalf("events %v, want the delivery's", evs)
	}
	if raw, _ := json.Marshal(ev); len(raw) > hostsdk.MaxEventBytes {
		t.Errorf("the event is %d bytes", len(raw))
	}
	var data struct {
		Payload map[string]json.RawMessage `json:"payload"`
		Omitted []string                   `json:"payload_omitted"`
		Bytes   int                        `json:"payload_bytes"`
		SHA256  string                     `json:"payload_sha256"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if strings.Join(data.Omitted, ",") != "description" || data.Bytes != len(body) || data.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("omitted %v, bytes %d, sha256 %s", data.Omitted, data.Bytes, data.SHA256)
	}
	for _, m := range []string{"triggerEvent", "id", "uid", "eventTypeId", "userId", "startTime", "endTime", "status"} {
		if _, ok := data.Payload[m]; !ok {
			t.Errorf("the cut-down payload lost %s: %v", m, data.Payload)
		}
	}
}

// TestParseDeliveryScheduledShape: which member a delivery's time is
// read from. MEETING_STARTED and MEETING_ENDED without a payload member
// are the scheduler's shape, timed by the booking's startTime or endTime
// (the booking's createdAt is ignored); with a payload member they are
// Cal.diy's default shape, timed by createdAt, as every other trigger.
func TestParseDeliveryScheduledShape(t *testing.T) {
	start := time.Date(2050, 9, 5, 9, 0, 0, 0, time.UTC)
	end := start.Add(30 * time.Minute)
	booked := start.Add(-72 * time.Hour)
	for _, tc := range []struct {
		name, body string
		scheduled  bool
		at         time.Time
		msg        string
	}{
		{"started", string(scheduledBody("MEETING_STARTED", "bk", start, end, booked, "")), true, start, ""},
		{"ended", string(scheduledBody("MEETING_ENDED", "bk", start, end, booked, "")), true, end, ""},
		{"started in the default shape", `{"triggerEvent":"MEETING_STARTED","createdAt":"` + jsTime(booked) + `","payload":{"uid":"bk"}}`, false, booked, ""},
		{"booking created with a startTime", `{"triggerEvent":"BOOKING_CREATED","startTime":"` + jsTime(start) + `","createdAt":"` + jsTime(booked) + `","payload":{}}`,
			false, booked, ""},
		{"no startTime", `{"triggerEvent":"MEETING_STARTED","id":1,"createdAt":"` + jsTime(booked) + `"}`, true, time.Time{},
			"startTime must be an RFC 3339 time: Cal.diy's scheduler sends MEETING_STARTED as {triggerEvent, ...booking}, at the booking's startTime"},
		{"endTime a number", `{"triggerEvent":"MEETING_ENDED","startTime":"` + jsTime(start) + `","endTime":1}`, true, time.Time{},
			"endTime must be an RFC 3339 time"},
		{"scheduled shape for another trigger", `{"triggerEvent":"BOOKING_CREATED","startTime":"` + jsTime(start) + `","createdAt":"` + jsTime(booked) + `"}`,
			false, time.Time{}, "payload must be a JSON object"},
		{"trailing data", string(scheduledBody("MEETING_STARTED", "bk", start, end, booked, "")) + "}", false, time.Time{}, "the body has data after its JSON object"},
	} {
		d, at, msg := parseDelivery([]byte(tc.body))
		if d.Scheduled != tc.scheduled || !at.Equal(tc.at) || (tc.msg == "") != (msg == "") || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: scheduled %v, time %v, %q; want %v, %v, %q", tc.name, d.Scheduled, at, msg, tc.scheduled, tc.at, tc.msg)
		}
		if tc.scheduled && msg == "" && string(d.Payload) != tc.body {
			t.Errorf("%s: payload %s, want the body as delivered", tc.name, d.Payload)
		}
	}
}

// TestWebhookMeetingEventADayLate: Cal.diy's scheduler sends a
// MEETING_STARTED or MEETING_ENDED until a day after the booking's
// startTime or endTime by its own clock, once, whatever the answer. One
// it sends close to a day late (a cron job that was down, a long queue of
// rows sent one after the other), received a little after, or by a
// replica whose clock is ahead of Cal.diy's, was refused as more than 24
// hours old and lost. The scheduler's shape now has WebhookScheduledMaxAge
// (25 hours); Cal.diy's default shape keeps its 24 hours.
func TestWebhookMeetingEventADayLate(t *testing.T) {
	w := startWebhookHost(t)
	booked := w.now.Add(-72 * time.Hour)
	start := w.now.Add(-24*time.Hour - 10*time.Minute)
	end := w.now.Add(-25*time.Hour + time.Minute)
	for _, tc := range []struct {
		body []byte
		at   time.Time
	}{
		{scheduledBody("MEETING_STARTED", "bk_late", start, start.Add(30*time.Minute), booked, ""), start},
		{scheduledBody("MEETING_ENDED", "bk_late", end.Add(-time.Hour), end, booked, ""), end},
	} {
		if a := w.deliver(t, testSub, tc.body, signed(tc.body)); a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
			t.Errorf("scheduler delivery %.40s received %s after its time: %d %v, want accepted", tc.body, w.now.Sub(tc.at), a.status, a.body)
		}
	}
	if n := w.pending(t); n != 2 {
		t.Fatalf("%d outbox batches, want 2", n)
	}
	old := deliveryBody("BOOKING_CREATED", start, "bk_default")
	if a := w.deliver(t, testSub, old, signed(old)); a.status != 400 || a.code() != webhook.CodeInvalidTimestamp {
		t.Errorf("a createdAt %s old: %d %v, want 400 %s", w.now.Sub(start), a.status, a.body, webhook.CodeInvalidTimestamp)
	}
}

// TestWebhookMeetingEventReplayFenced: a scheduler delivery whose time is
// up to WebhookMaxSkew ahead of the clock when received passes the age
// check until WebhookScheduledMaxAge after that time; the replay fence
// must still hold it then (a fence kept for WebhookMaxAge+WebhookMaxSkew,
// as before, would let the same body be taken a second time), and past
// the bound it is refused.
func TestWebhookMeetingEventReplayFenced(t *testing.T) {
	mock := newMockCal(t)
	var mu sync.Mutex
	t0 := time.Now().UTC().Truncate(time.Millisecond)
	now := t0
	setNow := func(at time.Time) { mu.Lock(); defer mu.Unlock(); now = at }
	conn := newConnector(t, mock.srv.URL, map[string]provider.Secret{testSub: provider.NewSecret(testSecret)},
		func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	h := startHost(t, conn, nil)
	url := "http://" + h.Config.Listener.Addr().String() + "/webhooks/cal-diy/" + testSub
	start := t0.Add(WebhookMaxSkew - time.Minute)
	body := scheduledBody("MEETING_STARTED", "bk_replay", start, start.Add(time.Hour), t0.Add(-72*time.Hour), "")
	if a := post(t, url, body, signed(body)); a.status != 200 || a.body["duplicate"] != nil {
		t.Fatalf("first delivery: %d %v", a.status, a.body)
	}
	setNow(start.Add(WebhookScheduledMaxAge - time.Second))
	if a := post(t, url, body, signed(body)); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("the same delivery %s after its startTime: %d %v, want a duplicate", WebhookScheduledMaxAge-time.Second, a.status, a.body)
	}
	setNow(start.Add(WebhookScheduledMaxAge + time.Second))
	if a := post(t, url, body, signed(body)); a.status != 400 || a.code() != webhook.CodeInvalidTimestamp {
		t.Fatalf("the same delivery %s after its startTime: %d %v, want 400 %s", WebhookScheduledMaxAge+time.Second, a.status, a.body, webhook.CodeInvalidTimestamp)
	}
}

// TestWebhookMeetingEventOfMovedWebhook: Cal.diy's scheduler stores each
// MEETING_STARTED / MEETING_ENDED row with the subscriber URL the webhook
// had when the booking was accepted, and signs it when it sends it with
// the webhook's secret of that moment. A webhook moved from one
// subscription to another (webhook.update with a new subscriber_url,
// which sends the new subscription's secret) still has the meetings
// booked before posted to the old subscription's URL, signed with the
// new one's secret: the route refused every one (401) and they were lost.
// Such a delivery is taken as the subscription whose secret verifies it
// (its event's subscription_id; the same body at that subscription's URL
// is a duplicate), logged at info; any other delivery a subscription's
// secret does not verify is still refused, as is a scheduler body larger
// than MovedMaxBody (checking it against every secret is what a forged
// body costs).
func TestWebhookMeetingEventOfMovedWebhook(t *testing.T) {
	w, logs := movedWebhookHost(t, map[string]provider.Secret{testSub: provider.NewSecret(testSecret), movedSub: provider.NewSecret(movedSecret)})
	const newSub, newSecret = movedSub, movedSecret
	now := w.now

	start := now.Add(-time.Minute)
	body := scheduledBody("MEETING_STARTED", "bk_moved", start, start.Add(time.Hour), now.Add(-72*time.Hour), "")
	if a := w.deliver(t, testSub, body, signedBy(newSecret, body)); a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Fatalf("a scheduler delivery at the old subscription's URL signed with the new one's secret: %d %v, want accepted", a.status, a.body)
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") ||
		!strings.Contains(got[0], "url_subscription_id="+testSub) || !strings.Contains(got[0], "subscription_id="+newSub) {
		t.Errorf("logged %q, want one info line naming both subscriptions", got)
	}
	if a := w.deliver(t, newSub, body, signedBy(newSecret, body)); a.status != 200 || a.body["duplicate"] != true {
		t.Errorf("the same body at the new subscription's URL: %d %v, want a duplicate", a.status, a.body)
	}
	evs := w.outboxEvents(t)
	ev, ok := evs[eventID(fenceID(newSub, WebhookVersion, sign(newSecret, body), body), start)]
	if !ok || len(evs) != 1 {
		t.Fatalf("events %v, want the delivery's as %s's", evs, newSub)
	}
	var data struct {
		SubscriptionID string `json:"subscription_id"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil || data.SubscriptionID != newSub {
		t.Errorf("event data %s, want subscription_id %s", ev.Data, newSub)
	}

	big := scheduledBody("MEETING_ENDED", "bk_big", start, start.Add(time.Hour), now.Add(-72*time.Hour),
		`"description":"`+strings.Repeat("d", MovedMaxBody)+`",`)
	for _, tc := range []struct {
		name    string
		body    []byte
		headers map[string]string
	}{
		{"a default-shape delivery signed with another subscription's secret", deliveryBody("BOOKING_CREATED", now, "bk_default"),
			signedBy(newSecret, deliveryBody("BOOKING_CREATED", now, "bk_default"))},
		{"a scheduler delivery signed with no subscription's secret", body, signedBy("whsec_unknown", body)},
		{"a scheduler delivery over MovedMaxBody signed with another subscription's secret", big, signedBy(newSecret, big)},
	} {
		if a := w.deliver(t, testSub, tc.body, tc.headers); a.status != 401 || a.code() != webhook.CodeAuthenticationFailed {
			t.Errorf("%s: %d %v, want 401 %s", tc.name, a.status, a.body, webhook.CodeAuthenticationFailed)
		}
	}
	if n := w.pending(t); n != 1 {
		t.Errorf("%d outbox batches after the refusals, want 1 (the accepted delivery's)", n)
	}
}

// The subscription a webhook moved to (TestWebhookMeetingEventOfMovedWebhook).
const movedSub, movedSecret = "sub-2", "whsec_fedcba9876543210"

// movedWebhookHost starts a host of a connector holding secrets, on an
// embedded journal, logging at info into the buffer it returns (emptied).
func movedWebhookHost(t *testing.T, secrets map[string]provider.Secret) (*webhookHost, *hostsdktest.LogBuffer) {
	t.Helper()
	mock := newMockCal(t)
	j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { j.Close() })
	now := time.Now().UTC().Truncate(time.Millisecond)
	conn := newConnector(t, mock.srv.URL, secrets, func() time.Time { return now })
	logs := &hostsdktest.LogBuffer{}
	h := &testHost{hostsdktest.Start(t, conn, func(cfg *hostsdk.Config) {
		cfg.Journal = j
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})}
	logs.Take("")
	return &webhookHost{testHost: h, j: j, now: now, base: "http://" + h.Config.Listener.Addr().String()}, logs
}

// signedBy are the headers of body signed with secret.
func signedBy(secret string, body []byte) map[string]string {
	return map[string]string{"x-cal-signature-256": sign(secret, body), "x-cal-webhook-version": WebhookVersion}
}

// TestWebhookMeetingEventOfRemovedSubscription: after a webhook moved,
// an operator who removed the old subscription from
// --cal-diy-webhook-secret-files lost every meeting booked before the move
// (the scheduler still posts them to the old URL): a subscription the
// replica did not hold was answered 404 before anything was read. A
// scheduler delivery at most MovedMaxBody bytes, at such a URL, that a
// held subscription's secret verifies is taken as that subscription's;
// anything else there is still 404 unknown subscription.
func TestWebhookMeetingEventOfRemovedSubscription(t *testing.T) {
	w, logs := movedWebhookHost(t, map[string]provider.Secret{movedSub: provider.NewSecret(movedSecret)})
	now := w.now
	start := now.Add(-time.Minute)
	body := scheduledBody("MEETING_ENDED", "bk_removed", start.Add(-time.Hour), start, now.Add(-72*time.Hour), "")
	if a := w.deliver(t, testSub, body, signedBy(movedSecret, body)); a.status != 200 || a.body["accepted_events"] != float64(1) {
		t.Fatalf("a scheduler delivery at a removed subscription's URL signed with a held one's secret: %d %v, want accepted", a.status, a.body)
	}
	if got := logs.Take("cal-diy webhook"); len(got) != 1 || !strings.Contains(got[0], "url_subscription_id="+testSub) || !strings.Contains(got[0], "subscription_id="+movedSub) {
		t.Errorf("logged %q, want one info line naming both subscriptions", got)
	}
	evs := w.outboxEvents(t)
	if _, ok := evs[eventID(fenceID(movedSub, WebhookVersion, sign(movedSecret, body), body), start)]; !ok || len(evs) != 1 {
		t.Fatalf("events %v, want the delivery's as %s's", evs, movedSub)
	}

	big := scheduledBody("MEETING_ENDED", "bk_big", start, start.Add(time.Hour), now.Add(-72*time.Hour),
		`"description":"`+strings.Repeat("d", MovedMaxBody)+`",`)
	def := deliveryBody("BOOKING_CREATED", now, "bk_default")
	for _, tc := range []struct {
		name    string
		body    []byte
		headers map[string]string
	}{
		{"a default-shape delivery signed with a held subscription's secret", def, signedBy(movedSecret, def)},
		{"a scheduler delivery signed with no held subscription's secret", body, signedBy(testSecret, body)},
		{"a scheduler delivery over MovedMaxBody", big, signedBy(movedSecret, big)},
		{"a scheduler delivery without a signature", body, map[string]string{"x-cal-webhook-version": WebhookVersion}},
		{"a scheduler delivery without a webhook version", body, map[string]string{"x-cal-signature-256": sign(movedSecret, body)}},
	} {
		if a := w.deliver(t, testSub, tc.body, tc.headers); a.status != 404 || a.code() != webhook.CodeInvalidDelivery {
			t.Errorf("%s: %d %v, want 404 %s", tc.name, a.status, a.body, webhook.CodeInvalidDelivery)
		}
	}
	if n := w.pending(t); n != 1 {
		t.Errorf("%d outbox batches after the refusals, want 1 (the accepted delivery's)", n)
	}
}
