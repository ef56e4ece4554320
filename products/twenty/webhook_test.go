package twenty

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/products/internal/provider"
	"github.com/aipfleet/aipfleet/products/internal/webhook"
)

const webhookSecret = "whsec-twenty-0123456789"

func newWebhookEnv(t *testing.T) *env {
	t.Helper()
	return newEnv(t, func(v hostsdk.SettingValues) {
		v[FlagWebhookSecretFile] = writeFile(t, "webhook-secret", webhookSecret, 0o600)
	})
}

// delivery is one webhook request as Twenty signs it.
type delivery struct {
	body                 string
	timestamp, signature string
	nonce                string
}

func sign(secret, ts, body string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts + ":" + body))
	return hex.EncodeToString(m.Sum(nil))
}

func newDelivery(body string, at time.Time) delivery {
	ts := strconv.FormatInt(at.UnixMilli(), 10)
	return delivery{body: body, timestamp: ts, signature: sign(webhookSecret, ts, body), nonce: "0123456789abcdef0123456789abcdef"}
}

const webhookID = "7b1c2d3e-4f50-4a6b-9c7d-8e9fa0b1c2d3"

func payloadJSON(eventName, workspaceID, hookID, date string) string {
	b, _ := json.Marshal(map[string]any{
		"eventName": eventName, "workspaceId": workspaceID, "webhookId": hookID, "eventDate": date,
		"objectMetadata": map[string]any{"id": "m1", "nameSingular": "person"},
		"record":         map[string]any{"id": "00000000-0000-4000-8000-000000000001", "name": map[string]any{"firstName": "Ada"}},
	})
	return string(b)
}

// post sends d to the host's webhook route and returns the status and the
// error code of the answer, if any.
func (e *env) post(t *testing.T, d delivery, omit string) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(hostsdktest.Context(t), http.MethodPost, "http://"+e.Host.Addr().String()+"/webhooks/twenty", strings.NewReader(d.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range map[string]string{HeaderTimestamp: d.timestamp, HeaderSignature: d.signature, HeaderNonce: d.nonce} {
		if k != omit {
			req.Header.Set(k, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var ans struct {
		Error struct{ Code string } `json:"error"`
	}
	json.Unmarshal(body, &ans)
	return resp.StatusCode, ans.Error.Code, body
}

// outbox claims, as a publisher would at time.Now()+later with a
// one-minute lease, the event batches the host stored.
func (e *env) outbox(t *testing.T, later time.Duration) map[string][]aip.Event {
	t.Helper()
	entries, err := e.journal.ClaimEvents(hostsdktest.Context(t), time.Now().Add(later), time.Minute, 100)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]aip.Event{}
	for _, en := range entries {
		var evs []aip.Event
		if err := json.Unmarshal(en.Events, &evs); err != nil {
			t.Fatal(err)
		}
		if en.ChannelID != Channel {
			t.Errorf("batch on channel %q", en.ChannelID)
		}
		out[en.ID] = evs
	}
	return out
}

func TestWebhookAccepted(t *testing.T) {
	e := newWebhookEnv(t)
	date := "2026-11-30T09:58:01.250Z"
	body := payloadJSON("person.created", strings.ToUpper(workspace), webhookID, date)
	d := newDelivery(body, time.Now())
	status, code, raw := e.post(t, d, "")
	if status != http.StatusOK || code != "" {
		t.Fatalf("valid delivery: %d %s", status, raw)
	}
	var ans struct {
		Accepted int    `json:"accepted_events"`
		Central  string `json:"central_delivery"`
	}
	if json.Unmarshal(raw, &ans); ans.Accepted != 1 || ans.Central != "durably_queued" {
		t.Errorf("answer %s", raw)
	}
	batches := e.outbox(t, time.Hour)
	if len(batches) != 1 {
		t.Fatalf("%d batches in the outbox, want 1", len(batches))
	}
	var ev aip.Event
	var batchID string
	for id, evs := range batches {
		batchID = id
		if len(evs) != 1 {
			t.Fatalf("%d events in the batch", len(evs))
		}
		ev = evs[0]
	}
	eventDate, _ := time.Parse(time.RFC3339, date)
	if want := EventID(workspace, webhookID, []byte(body), eventDate); ev.ID != want {
		t.Errorf("event ID %s, want %s", ev.ID, want)
	}
	// The fleet's event log accepts it.
	if err := aip.ValidateID(aip.PrefixEvent, ev.ID); err != nil {
		t.Errorf("event ID %s: %v", ev.ID, err)
	}
	if ev.Kind != "twenty.person.created" {
		t.Errorf("kind %s", ev.Kind)
	}
	if want, _ := time.Parse(time.RFC3339, date); !ev.OccurredAt.Time.Equal(want) {
		t.Errorf("occurred_at %v, want %v", ev.OccurredAt, want)
	}
	jsonEqual(t, "event data", string(ev.Data), body)

	// The same delivery again: refused as a replay, nothing stored.
	if status, code, raw := e.post(t, d, ""); status != http.StatusUnauthorized || code != "webhook.authentication_failed" {
		t.Fatalf("replayed delivery: %d %s", status, raw)
	}
	// Twenty sending the same payload again with a new timestamp: a new
	// delivery, accepted, and the same event (same batch, stored once).
	d2 := newDelivery(body, time.Now().Add(time.Second))
	if status, _, raw := e.post(t, d2, ""); status != http.StatusOK {
		t.Fatalf("redelivery: %d %s", status, raw)
	}
	// An hour later the first claim's lease has passed: the outbox holds
	// that one batch and no other.
	again := e.outbox(t, 2*time.Hour)
	if _, ok := again[batchID]; !ok || len(again) != 1 {
		t.Errorf("after the redelivery the outbox holds %d batches (the first one: %v)", len(again), ok)
	}
}

func TestWebhookRefused(t *testing.T) {
	e := newWebhookEnv(t)
	now := time.Now()
	good := payloadJSON("company.updated", workspace, webhookID, "2026-11-30T09:58:01Z")
	for _, tc := range []struct {
		name   string
		d      delivery
		omit   string
		status int
		code   string
	}{
		{"no timestamp", newDelivery(good, now), HeaderTimestamp, 400, "webhook.missing_header"},
		{"no signature", newDelivery(good, now), HeaderSignature, 400, "webhook.missing_header"},
		{"no nonce", newDelivery(good, now), HeaderNonce, 400, "webhook.missing_header"},
		{"bad signature", func() delivery {
			d := newDelivery(good, now)
			d.signature = sign("another-secret", d.timestamp, good)
			return d
		}(), "", 401, "webhook.authentication_failed"},
		{"signature of another body", func() delivery {
			d := newDelivery(good, now)
			d.body = strings.Replace(good, "company.updated", "company.deleted", 1)
			return d
		}(), "", 401, "webhook.authentication_failed"},
		{"signature not hex", func() delivery {
			d := newDelivery(good, now)
			d.signature = strings.Repeat("z", 64)
			return d
		}(), "", 401, "webhook.authentication_failed"},
		{"stale timestamp", newDelivery(good, now.Add(-301*time.Second)), "", 400, "webhook.invalid_timestamp"},
		{"future timestamp", newDelivery(good, now.Add(301*time.Second)), "", 400, "webhook.invalid_timestamp"},
		// Far enough ahead that now minus it does not fit a time.Duration.
		{"timestamp centuries ahead", func() delivery {
			ts := strconv.FormatInt(math.MaxInt64, 10)
			return delivery{body: good, timestamp: ts, signature: sign(webhookSecret, ts, good), nonce: strings.Repeat("a", 32)}
		}(), "", 400, "webhook.invalid_timestamp"},
		{"timestamp in seconds", func() delivery {
			ts := strconv.FormatInt(now.Unix(), 10)
			return delivery{body: good, timestamp: ts, signature: sign(webhookSecret, ts, good), nonce: strings.Repeat("a", 32)}
		}(), "", 400, "webhook.invalid_timestamp"},
		{"timestamp of 33 digits", func() delivery {
			ts := strings.Repeat("1", 33)
			return delivery{body: good, timestamp: ts, signature: sign(webhookSecret, ts, good), nonce: strings.Repeat("a", 32)}
		}(), "", 400, "webhook.invalid_timestamp"},
		{"short nonce", func() delivery {
			d := newDelivery(good, now)
			d.nonce = "abc"
			return d
		}(), "", 400, "webhook.invalid_delivery"},
		{"other workspace", newDelivery(payloadJSON("person.created", "9f2b8c1e-9d4a-4b7e-8c21-5a6f7e8d9c0b", webhookID, "2026-11-30T09:58:01Z"), now), "", 400, "webhook.invalid_delivery"},
		{"webhookId not a UUID", newDelivery(payloadJSON("person.created", workspace, "hook-1", "2026-11-30T09:58:01Z"), now), "", 400, "webhook.invalid_delivery"},
		{"eventDate not RFC 3339", newDelivery(payloadJSON("person.created", workspace, webhookID, "30/11/2026"), now), "", 400, "webhook.invalid_delivery"},
		{"no eventName", newDelivery(payloadJSON("", workspace, webhookID, "2026-11-30T09:58:01Z"), now), "", 400, "webhook.invalid_delivery"},
		{"not JSON", newDelivery("eventName=person.created", now), "", 400, "webhook.invalid_delivery"},
		{"not UTF-8", newDelivery("{\"eventName\":\"a.b\xff\"}", now), "", 400, "webhook.invalid_utf8"},
	} {
		status, code, raw := e.post(t, tc.d, tc.omit)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, raw, tc.status, tc.code)
		}
	}
	if n := len(e.outbox(t, time.Hour)); n != 0 {
		t.Errorf("refused deliveries stored %d batches", n)
	}
	// The manifest declares the channel when the route is served.
	m, _ := e.conn.Manifest(hostsdktest.Context(t), hostsdk.TenantContext{})
	if len(m.Channels) != 1 || !bytes.Contains(m.Channels[0], []byte(`"id":"twenty-webhooks"`)) {
		t.Errorf("channels %s", m.Channels)
	}
}

// TestWebhookMappingErrorsCutValues: a payload value the mapping refuses
// (eventName, workspaceId, webhookId, eventDate) was quoted whole in the
// answer and the log line, at any length up to the 4 MiB body. It is
// quoted as its first provider.MaxExcerptBytes bytes and "…".
func TestWebhookMappingErrorsCutValues(t *testing.T) {
	e, logs := newLoggedWebhookHost(t)
	long := strings.Repeat("x", 10000)
	excerpt := `"` + long[:provider.MaxExcerptBytes] + `…"`
	now := time.Now()
	date := now.UTC().Format(time.RFC3339)
	for i, tc := range []struct{ member, body string }{
		{"eventName", payloadJSON(long, workspace, webhookID, date)},
		{"workspaceId", payloadJSON("person.created", long, webhookID, date)},
		{"webhookId", payloadJSON("person.created", workspace, long, date)},
		{"eventDate", payloadJSON("person.created", workspace, webhookID, long)},
	} {
		status, code, raw := e.post(t, newDelivery(tc.body, now.Add(time.Duration(i)*time.Millisecond)), "")
		var ans struct {
			Error struct{ Message string } `json:"error"`
		}
		json.Unmarshal(raw, &ans)
		if status != http.StatusBadRequest || code != webhook.CodeInvalidDelivery || !strings.Contains(ans.Error.Message, tc.member+" "+excerpt) ||
			len(ans.Error.Message) > 200 {
			t.Errorf("%s of %d bytes: %d %.300s; want 400 %s quoting its first %d bytes", tc.member, len(long), status, raw, webhook.CodeInvalidDelivery, provider.MaxExcerptBytes)
		}
	}
	// One line for the three invalid deliveries, one for the workspace.
	got := logs.Take("twenty webhook")
	if len(got) != 2 {
		t.Fatalf("logged %q, want two lines", got)
	}
	for _, line := range got {
		if !strings.Contains(line, long[:provider.MaxExcerptBytes]+"…") || strings.Contains(line, long[:provider.MaxExcerptBytes+1]) {
			t.Errorf("logged %.300q..., want the value cut to %d bytes", line, provider.MaxExcerptBytes)
		}
	}
}

func TestWebhookRouteAbsentWithoutSecret(t *testing.T) {
	e := newEnv(t, nil)
	d := newDelivery(payloadJSON("person.created", workspace, webhookID, "2026-11-30T09:58:01Z"), time.Now())
	if status, _, raw := e.post(t, d, ""); status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
		t.Fatalf("without a secret the route answered %d %s", status, raw)
	}
	if n := len(e.outbox(t, time.Hour)); n != 0 {
		t.Errorf("%d batches stored", n)
	}
}

// TestWebhookFenceFull: a full replay fence does not forget old
// deliveries, and it cannot record a new one; the new one's event is
// stored all the same and the delivery accepted (it was answered 503
// after its event was stored, and Twenty does not deliver again). A
// replay of it maps to the same event, which the outbox stores once.
func TestWebhookFenceFull(t *testing.T) {
	e := newEnvWith(t, func(v hostsdk.SettingValues) {
		v[FlagWebhookSecretFile] = writeFile(t, "webhook-secret", webhookSecret, 0o600)
	}, func(c *Connector) { c.replayCapacity = 1 })
	now := time.Now()
	first := newDelivery(payloadJSON("person.created", workspace, webhookID, "2026-11-30T09:58:01Z"), now)
	if status, _, raw := e.post(t, first, ""); status != http.StatusOK {
		t.Fatalf("first delivery: %d %s", status, raw)
	}
	second := newDelivery(payloadJSON("person.updated", workspace, webhookID, "2026-11-30T09:58:02Z"), now)
	for range 2 {
		if status, _, raw := e.post(t, second, ""); status != http.StatusOK {
			t.Fatalf("delivery to a full fence: %d %s, want 200 (its event is stored)", status, raw)
		}
	}
	if got := e.outbox(t, 0); len(got) != 2 {
		t.Fatalf("outbox holds %d batches, want 2 (one a delivery)", len(got))
	}
	// The first is still fenced.
	if status, _, raw := e.post(t, first, ""); status != http.StatusUnauthorized {
		t.Fatalf("replay after the fence filled: %d %s", status, raw)
	}
}

// TestWebhookEventTooLarge: a delivery whose event would exceed
// hostsdk.MaxEventBytes (a note whose body is long: Twenty sends it twice,
// as blocknote and markdown) was refused 413, and Twenty does not deliver
// again, so the event was lost. Its payload is cut down to fit: the
// record without its largest fields, the rest kept, what was left out
// named, and the whole body's size and digest given; the event ID is the
// whole delivery's.
func TestWebhookEventTooLarge(t *testing.T) {
	e := newWebhookEnv(t)
	long := strings.Repeat("n", hostsdk.MaxEventBytes/2)
	const noteID = "00000000-0000-4000-8000-0000000000aa"
	body, _ := json.Marshal(map[string]any{"eventName": "note.created", "workspaceId": workspace, "webhookId": webhookID,
		"eventDate": "2026-11-30T09:58:01Z", "objectMetadata": map[string]any{"id": "m2", "nameSingular": "note"},
		"record": map[string]any{"id": noteID, "title": "Call notes", "bodyV2": map[string]any{"blocknote": long, "markdown": long}}})
	status, code, raw := e.post(t, newDelivery(string(body), time.Now()), "")
	if status != http.StatusOK {
		t.Fatalf("delivery of a long note: %d %s %s, want 200", status, code, raw)
	}
	var evs []aip.Event
	for _, b := range e.outbox(t, 0) {
		evs = append(evs, b...)
	}
	if len(evs) != 1 {
		t.Fatalf("outbox holds %d events, want 1", len(evs))
	}
	ev := evs[0]
	at, _ := time.Parse(time.RFC3339, "2026-11-30T09:58:01Z")
	if want := EventID(workspace, webhookID, body, at); ev.ID != want {
		t.Errorf("event ID %s, want %s (the whole delivery's)", ev.ID, want)
	}
	var data struct {
		EventName string `json:"eventName"`
		Record    struct {
			ID     string          `json:"id"`
			Title  string          `json:"title"`
			BodyV2 json.RawMessage `json:"bodyV2"`
		} `json:"record"`
		Omitted []string `json:"payload_omitted"`
		Bytes   int      `json:"payload_bytes"`
		SHA256  string   `json:"payload_sha256"`
	}
	if err := json.Unmarshal(ev.Data, &data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	if data.EventName != "note.created" || data.Record.ID != noteID || data.Record.Title != "Call notes" || data.Record.BodyV2 != nil ||
		len(data.Omitted) != 1 || data.Omitted[0] != "record.bodyV2" || data.Bytes != len(body) || data.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("data %+v", data)
	}
	if len(ev.Data) > webhook.MaxInlinePayload+1024 {
		t.Errorf("data is %d bytes", len(ev.Data))
	}
}

// TestWebhookEventRefusedForGood: a signed delivery whose event the host
// refuses for its content (hostsdk.ErrInvalidEvents: here a NUL character,
// which the fleet's event log cannot store) can never be stored: it is a
// 400 webhook.invalid_delivery naming why, not a 503 that has Twenty send
// the same delivery again and again. An eventDate more than
// aip.MaxEnvelopeSkew ahead of the replica's clock is different: the
// replica's clock may be the wrong one, so it is a 503 invalid_timestamp,
// delivered again (refused for good, the event would be lost once the
// clock is right). Neither is stored.
func TestWebhookEventRefusedForGood(t *testing.T) {
	e := newWebhookEnv(t)
	nul := strings.Replace(payloadJSON("person.created", workspace, webhookID, time.Now().UTC().Format(time.RFC3339)), `"Ada"`, `"A\u0000da"`, 1)
	status, code, raw := e.post(t, newDelivery(nul, time.Now()), "")
	if status != http.StatusBadRequest || code != webhook.CodeInvalidDelivery || !strings.Contains(string(raw), "NUL") {
		t.Fatalf("an event the host refuses: %d %s", status, raw)
	}
	ahead := time.Now().Add(aip.MaxEnvelopeSkew + time.Hour).UTC().Format(time.RFC3339)
	status, code, raw = e.post(t, newDelivery(payloadJSON("person.created", workspace, webhookID, ahead), time.Now()), "")
	if status != http.StatusServiceUnavailable || code != webhook.CodeInvalidTimestamp || !strings.Contains(string(raw), "clock") {
		t.Fatalf("an event ahead of the replica's clock: %d %s", status, raw)
	}
	if got := e.outbox(t, 0); len(got) != 0 {
		t.Fatalf("stored %v", got)
	}
}

// fenceLossJournal fails every write of the replay fence once an event
// batch is stored: the state store failing between the publication and
// the fence's record.
type fenceLossJournal struct {
	*sqliteruntime.Journal
	stored atomic.Bool
}

func (j *fenceLossJournal) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	err := j.Journal.EnqueueEvents(ctx, e)
	if err == nil {
		j.stored.Store(true)
	}
	return err
}

func (j *fenceLossJournal) PutState(ctx context.Context, namespace, key string, value json.RawMessage, rev uint64) (uint64, error) {
	if namespace == ReplayNamespace && j.stored.Load() {
		return 0, errors.New("disk I/O error")
	}
	return j.Journal.PutState(ctx, namespace, key, value, rev)
}

// TestWebhookAcceptedWhenFenceRecordFails: a delivery whose event is
// stored but which the fence could not record was answered 503 "so that
// Twenty sends it again"; Twenty never sends a delivery again (its
// CallWebhookJob records the error as a failed call), so the answer only
// reported a stored event as lost. It is accepted.
func TestWebhookAcceptedWhenFenceRecordFails(t *testing.T) {
	var j *fenceLossJournal
	e := newEnvJournal(t, func(v hostsdk.SettingValues) {
		v[FlagWebhookSecretFile] = writeFile(t, "webhook-secret", webhookSecret, 0o600)
	}, nil, func(sj *sqliteruntime.Journal) journal.Journal {
		j = &fenceLossJournal{Journal: sj}
		return j
	})
	now := time.Now()
	d := newDelivery(payloadJSON("person.created", workspace, webhookID, now.UTC().Format(time.RFC3339Nano)), now)
	if status, code, body := e.post(t, d, ""); status != http.StatusOK {
		t.Fatalf("delivery whose event is stored but not fenced: %d %s %s, want 200", status, code, body)
	}
	if !j.stored.Load() {
		t.Fatal("no event batch was stored")
	}
	if got := e.outbox(t, 0); len(got) != 1 {
		t.Fatalf("outbox holds %d batches, want 1", len(got))
	}
}

// TestTrimPayloadBeyondRecord: a payload whose largest member is not in
// its record loses that member, not the record's fields, and never the
// members that name the event.
func TestTrimPayloadBeyondRecord(t *testing.T) {
	big := make([]string, 0, 4096)
	for range cap(big) {
		big = append(big, strings.Repeat("f", 60))
	}
	body, _ := json.Marshal(map[string]any{"eventName": "person.updated", "workspaceId": workspace, "webhookId": webhookID,
		"eventDate": "2026-11-30T09:58:01Z", "objectMetadata": map[string]any{"id": "m1", "nameSingular": "person"},
		"record": map[string]any{"id": "p1", "notes": strings.Repeat("x", 100)}, "updatedFields": big})
	data, err := trimPayload(body)
	if err != nil {
		t.Fatal(err)
	}
	var p map[string]json.RawMessage
	if err := json.Unmarshal(data, &p); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"eventName", "workspaceId", "webhookId", "eventDate", "objectMetadata", "record"} {
		if p[k] == nil {
			t.Errorf("%s left out", k)
		}
	}
	if string(p["payload_omitted"]) != `["updatedFields"]` || p["updatedFields"] != nil || !strings.Contains(string(p["record"]), `"notes"`) {
		t.Errorf("trimmed payload %s", data)
	}
}

// TestWebhookRefusalsLogged: a verified delivery refused for its
// timestamp (a replica whose clock is more than MaxSkew off refuses every
// delivery) or for another workspace was answered without a log line,
// and Twenty does not deliver it again: its event was lost without a
// trace on the replica. Each is logged at warn with what identifies the
// delivery, why, and for the clock the offset and what to check; a
// streak of the same refusal is not a line a delivery. A signature that
// does not verify is logged too, rate-limited the same way.
func TestWebhookRefusalsLogged(t *testing.T) {
	e, logs := newLoggedWebhookHost(t)
	const recordID = "00000000-0000-4000-8000-000000000001"

	// This replica's clock is 7 minutes ahead of Twenty's.
	sent := time.Now().Add(-7 * time.Minute)
	body := payloadJSON("person.created", workspace, webhookID, sent.UTC().Format(time.RFC3339))
	if status, code, _ := e.post(t, newDelivery(body, sent), ""); status != 400 || code != webhook.CodeInvalidTimestamp {
		t.Fatalf("delivery 7 minutes old: %d %s", status, code)
	}
	got := logs.Take("twenty webhook")
	if len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "clock_offset=7m0s") ||
		!strings.Contains(got[0], "check this host's clock (NTP)") || !strings.Contains(got[0], "record_id="+recordID) ||
		!strings.Contains(got[0], "event_name=person.created") {
		t.Fatalf("refusal for the clock logged %q, want one warning with the delivery, the offset and what to check", got)
	}
	e.post(t, newDelivery(body, sent.Add(time.Second)), "")
	if got := logs.Take("twenty webhook"); len(got) != 0 {
		t.Fatalf("a second refusal for the clock logged %q, want nothing within %s", got, webhook.RefusalLogEvery)
	}

	const otherWorkspace = "11111111-2222-4333-8444-555555555555"
	now := time.Now()
	other := payloadJSON("person.created", otherWorkspace, webhookID, now.UTC().Format(time.RFC3339))
	if status, code, _ := e.post(t, newDelivery(other, now), ""); status != 400 || code != webhook.CodeInvalidDelivery {
		t.Fatalf("delivery for another workspace: %d %s", status, code)
	}
	if got := logs.Take("twenty webhook"); len(got) != 1 || !strings.Contains(got[0], "another workspace") ||
		!strings.Contains(got[0], otherWorkspace) || !strings.Contains(got[0], "record_id="+recordID) {
		t.Fatalf("refusal for another workspace logged %q", got)
	}

	forged := newDelivery(payloadJSON("person.created", workspace, webhookID, now.UTC().Format(time.RFC3339)), now)
	forged.signature = strings.Repeat("0", 64)
	for range 2 {
		if status, _, _ := e.post(t, forged, ""); status != 401 {
			t.Fatalf("forged delivery: %d", status)
		}
	}
	if got := logs.Take("twenty webhook"); len(got) != 1 || !strings.Contains(got[0], "does not verify") || !strings.Contains(got[0], "--twenty-webhook-secret-file") {
		t.Fatalf("two deliveries that do not verify logged %q, want one line", got)
	}
}

// TestWebhookPublishRefusalsLogged: a verified delivery whose event the
// host refused to store (here: its eventDate ahead of the host's clock,
// 503, to be delivered again) was logged on every attempt, so a delivery
// resent while the host keeps refusing it wrote a line each time. It is
// logged as the other refusals are: at most once a minute of each kind.
func TestWebhookPublishRefusalsLogged(t *testing.T) {
	e, logs := newLoggedWebhookHost(t)
	now := time.Now()
	d := newDelivery(payloadJSON("person.created", workspace, webhookID, now.Add(10*time.Minute).UTC().Format(time.RFC3339)), now)
	for i := range 3 {
		if status, code, body := e.post(t, d, ""); status != http.StatusServiceUnavailable || code != webhook.CodeInvalidTimestamp {
			t.Fatalf("attempt %d of a delivery whose eventDate is 10 minutes ahead: %d %s %s, want 503 %s", i+1, status, code, body, webhook.CodeInvalidTimestamp)
		}
	}
	if got := logs.Take("twenty webhook"); len(got) != 1 || !strings.Contains(got[0], "level=WARN") ||
		!strings.Contains(got[0], "ahead of this replica's clock") || !strings.Contains(got[0], "event_id=") ||
		!strings.Contains(got[0], "event_name=person.created") {
		t.Fatalf("a delivery sent 3 times while the host refuses its event logged %q, want one warning", got)
	}
}

// TestWebhookPreviousSecret: while Twenty switches to a new secret,
// deliveries it signed with the previous one were refused 401 (the route
// took one secret) and lost, since Twenty does not deliver them again.
// With --twenty-webhook-previous-secret-file, read from its owner-only
// file as the secret is, both verify; the previous one's use is logged
// at info once, and so is the first delivery with the current secret
// after it; any other signature is still refused.
func TestWebhookPreviousSecret(t *testing.T) {
	const oldSecret = "whsec-twenty-old-9876543210"
	logs := &hostsdktest.LogBuffer{}
	e := newEnvHost(t, func(v hostsdk.SettingValues) {
		v[FlagWebhookSecretFile] = writeFile(t, "webhook-secret", webhookSecret, 0o600)
		v[FlagPreviousWebhookSecretFile] = writeFile(t, "webhook-secret-old", oldSecret+"\n", 0o600)
	}, nil, nil, func(c *hostsdk.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	logs.Take("")
	now := time.Now()
	n := 0
	signedWith := func(secret string) delivery {
		n++ // each at another millisecond: another delivery
		at := now.Add(time.Duration(n) * time.Millisecond)
		d := newDelivery(payloadJSON("person.created", workspace, webhookID, at.UTC().Format(time.RFC3339Nano)), at)
		d.signature = sign(secret, d.timestamp, d.body)
		return d
	}
	for range 2 {
		if status, code, raw := e.post(t, signedWith(oldSecret), ""); status != 200 {
			t.Fatalf("delivery signed with the previous secret: %d %s %s, want 200", status, code, raw)
		}
	}
	if got := logs.Take("twenty webhook"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") ||
		!strings.Contains(got[0], "previous webhook secret (--twenty-webhook-previous-secret-file)") {
		t.Fatalf("two deliveries with the previous secret logged %q, want one info line", got)
	}
	for range 2 {
		if status, code, raw := e.post(t, signedWith(webhookSecret), ""); status != 200 {
			t.Fatalf("delivery signed with the current secret: %d %s %s", status, code, raw)
		}
	}
	if got := logs.Take("twenty webhook"); len(got) != 1 || !strings.Contains(got[0], "the product has switched") {
		t.Fatalf("deliveries with the current secret after the previous logged %q, want one info line", got)
	}
	if status, code, _ := e.post(t, signedWith("whsec-someone-else"), ""); status != 401 || code != webhook.CodeAuthenticationFailed {
		t.Fatalf("delivery signed with another secret: %d %s, want 401", status, code)
	}
	if got := e.outbox(t, 0); len(got) != 4 {
		t.Fatalf("outbox holds %d batches, want 4", len(got))
	}
}

// TestPreviousWebhookSecretSetting: a previous secret without a secret,
// or the same as the secret, is refused naming the settings.
func TestPreviousWebhookSecretSetting(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(v hostsdk.SettingValues)
		want string
	}{
		{"without a secret", func(v hostsdk.SettingValues) {
			v[FlagPreviousWebhookSecretFile] = writeFile(t, "old", "whsec-old", 0o600)
		}, "--twenty-webhook-previous-secret-file (AIP_TWENTY_WEBHOOK_PREVIOUS_SECRET_FILE) is set without --twenty-webhook-secret-file"},
		{"the same secret", func(v hostsdk.SettingValues) {
			v[FlagWebhookSecretFile] = writeFile(t, "new", webhookSecret, 0o600)
			v[FlagPreviousWebhookSecretFile] = writeFile(t, "old", webhookSecret+"\n", 0o600)
		}, "holds the same secret as --twenty-webhook-secret-file"},
		{"group-readable", func(v hostsdk.SettingValues) {
			v[FlagWebhookSecretFile] = writeFile(t, "new", webhookSecret, 0o600)
			v[FlagPreviousWebhookSecretFile] = writeFile(t, "old", "whsec-old", 0o644)
		}, "--twenty-webhook-previous-secret-file"},
	} {
		m := newMock(t)
		v := hostsdk.SettingValues{FlagBaseURL: m.srv.URL, FlagWorkspaceID: workspace, FlagAPITokenFile: writeFile(t, "token", m.token, 0o600)}
		tc.edit(v)
		if _, err := newFromSettings(v, nil); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), webhookSecret) {
			t.Errorf("%s: %v, want an error with %q and no secret", tc.name, err, tc.want)
		}
	}
}

// newLoggedWebhookHost starts a host with the webhook secret set whose
// warnings (and errors) are kept in the returned buffer, emptied of the
// start's lines.
func newLoggedWebhookHost(t *testing.T) (*env, *hostsdktest.LogBuffer) {
	t.Helper()
	logs := &hostsdktest.LogBuffer{}
	e := newEnvHost(t, func(v hostsdk.SettingValues) {
		v[FlagWebhookSecretFile] = writeFile(t, "webhook-secret", webhookSecret, 0o600)
	}, nil, nil, func(c *hostsdk.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	})
	logs.Take("")
	return e, logs
}
