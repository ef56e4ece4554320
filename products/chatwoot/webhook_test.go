package chatwoot

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
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

// delivery is one webhook POST.
type delivery struct {
	id, ts, sig string
	body        string
	omit        string // a header to leave out
}

func signed(id string, at time.Time, body string) delivery {
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := webhook.HMACSHA256([]byte(testSecret), []byte(ts), []byte("."), []byte(body))
	return delivery{id: id, ts: ts, sig: "sha256=" + hex.EncodeToString(mac), body: body}
}

type answer struct {
	status int
	body   map[string]any
}

func (a answer) code() string {
	e, _ := a.body["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

func (e *env) post(t *testing.T, d delivery) answer {
	t.Helper()
	req, err := http.NewRequestWithContext(hostsdktest.Context(t), http.MethodPost, "http://"+e.Host.Addr().String()+WebhookPath, strings.NewReader(d.body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for h, v := range map[string]string{HeaderDelivery: d.id, HeaderTimestamp: d.ts, HeaderSignature: d.sig} {
		if h != d.omit {
			req.Header.Set(h, v)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

func (e *env) pending(t *testing.T) int {
	t.Helper()
	n, err := e.journal.PendingEvents(hostsdktest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

const incoming = `{"event":"message_created","id":55,"content":"I need help","message_type":"incoming","private":false,` +
	`"content_attributes":{},"account":{"id":7,"name":"Acme"},"conversation":{"display_id":42,"id":9042,"status":"open"},` +
	`"sender":{"id":9,"name":"Alice","type":"contact"}}`

func TestWebhookDelivery(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now()
	d := signed("dlv-1", now, incoming)
	a := e.post(t, d)
	if a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Fatalf("delivery: %d %v", a.status, a.body)
	}
	if n := e.pending(t); n != 1 {
		t.Fatalf("outbox holds %d batches, want 1", n)
	}

	// The same delivery again (even re-signed later): the same count, no new batch.
	again := e.post(t, signed("dlv-1", now.Add(2*time.Second), incoming))
	if again.status != 200 || again.body["accepted_events"] != float64(1) || again.body["duplicate"] != true {
		t.Fatalf("duplicate: %d %v", again.status, again.body)
	}
	if n := e.pending(t); n != 1 {
		t.Fatalf("outbox holds %d batches after a duplicate", n)
	}

	// The connector's own message (loop prevention): accepted, no event.
	own := strings.Replace(incoming, `"content_attributes":{}`, `"content_attributes":{"aip_action_id":"act_1"}`, 1)
	own = strings.Replace(own, `"incoming"`, `"outgoing"`, 1)
	if a := e.post(t, signed("dlv-own", now, own)); a.status != 200 || a.body["accepted_events"] != float64(0) {
		t.Fatalf("own message: %d %v", a.status, a.body)
	}
	// A conversation event.
	conv := `{"event":"conversation_status_changed","id":42,"status":"resolved","account_id":7}`
	if a := e.post(t, signed("dlv-2", now, conv)); a.status != 200 || a.body["accepted_events"] != float64(1) {
		t.Fatalf("conversation event: %d %v", a.status, a.body)
	}
	if n := e.pending(t); n != 2 {
		t.Fatalf("outbox holds %d batches, want 2", n)
	}

	batches, err := e.journal.ClaimEvents(hostsdktest.Context(t), time.Now().Add(time.Hour), time.Minute, 10)
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]aip.Event{}
	for _, b := range batches {
		if b.ChannelID != Channel {
			t.Errorf("batch on channel %q", b.ChannelID)
		}
		var evs []aip.Event
		if err := json.Unmarshal(b.Events, &evs); err != nil || len(evs) != 1 {
			t.Fatalf("batch %s: %v", b.Events, err)
		}
		events[evs[0].Kind] = evs[0]
	}
	msg, ok := events["chatwoot.message_created"]
	if !ok {
		t.Fatalf("no chatwoot.message_created event: %v", events)
	}
	var data struct {
		DeliveryID     string          `json:"delivery_id"`
		Event          string          `json:"event"`
		AccountID      int64           `json:"account_id"`
		ConversationID int64           `json:"conversation_id"`
		Payload        json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(msg.Data, &data); err != nil {
		t.Fatal(err)
	}
	// The host stores event data in canonical JSON (as the dispatcher
	// measures and signs it): the payload is the webhook's, canonicalised.
	wantPayload, err := aip.Canonicalize([]byte(incoming))
	if err != nil {
		t.Fatal(err)
	}
	if data.DeliveryID != "dlv-1" || data.Event != "message_created" || data.AccountID != testAccount || data.ConversationID != 42 ||
		string(data.Payload) != string(wantPayload) {
		t.Errorf("event data %s", msg.Data)
	}
	if !strings.HasPrefix(msg.ID, aip.PrefixEvent) || msg.OccurredAt.Unix() != now.Unix() {
		t.Errorf("event id %s occurred_at %v", msg.ID, msg.OccurredAt)
	}
	// The event ID derives from the delivery: the same delivery maps to the same ID.
	evs, err := e.conn.mapDelivery("dlv-1", time.Unix(now.Unix(), 0), []byte(incoming))
	if err != nil || len(evs) != 1 || evs[0].ID != msg.ID {
		t.Errorf("mapping again gives %+v, %v; want ID %s", evs, err, msg.ID)
	}
	if st, ok := events["chatwoot.conversation_status_changed"]; !ok || !strings.Contains(string(st.Data), `"conversation_id":42`) {
		t.Errorf("conversation event %+v", st)
	}

	// The fence is kept where the reference says.
	v, err := e.journal.State(hostsdktest.Context(t), FenceNamespace, "instance:"+e.Config.InstanceID)
	if err != nil || !strings.Contains(string(v.Value), `"dlv-1"`) || !strings.Contains(string(v.Value), `"dlv-own"`) {
		t.Errorf("fence state %s, %v", v.Value, err)
	}
}

// TestWebhookEventRefusedForGood: a signed delivery whose event the host
// refuses for its content (hostsdk.ErrInvalidEvents: a NUL character in the
// message, which the fleet's event log cannot store) is 400
// webhook.invalid_delivery naming why, not 503, which had Chatwoot deliver
// it again and again; nothing is stored or fenced.
func TestWebhookEventRefusedForGood(t *testing.T) {
	e := newEnv(t, nil)
	body := strings.Replace(incoming, `"I need help"`, `"I need\u0000help"`, 1)
	a := e.post(t, signed("dlv-nul", time.Now(), body))
	e2, _ := a.body["error"].(map[string]any)
	if msg, _ := e2["message"].(string); a.status != http.StatusBadRequest || a.code() != webhook.CodeInvalidDelivery || !strings.Contains(msg, "NUL") {
		t.Fatalf("a delivery whose event the host refuses: %d %v", a.status, a.body)
	}
	if n := e.pending(t); n != 0 {
		t.Fatalf("outbox holds %d batches, want none", n)
	}
}

func TestWebhookRefusals(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now()
	good := signed("dlv-x", now, incoming)

	badSig := good
	badSig.sig = "sha256=" + strings.Repeat("0", 64)
	noPrefix := good
	noPrefix.sig = strings.TrimPrefix(good.sig, "sha256=")
	tampered := good
	tampered.body = strings.Replace(incoming, "I need help", "I need money", 1)
	badTS := signed("dlv-x", now, incoming)
	badTS.ts = "17e8"
	longID := signed(strings.Repeat("d", MaxDeliveryIDBytes+1), now, incoming)

	cases := []struct {
		name   string
		d      delivery
		status int
		code   string
	}{
		{"bad signature", badSig, 401, webhook.CodeAuthenticationFailed},
		{"signature without sha256=", noPrefix, 401, webhook.CodeAuthenticationFailed},
		{"tampered body", tampered, 401, webhook.CodeAuthenticationFailed},
		{"stale timestamp", signed("dlv-x", now.Add(-301*time.Second), incoming), 400, webhook.CodeInvalidTimestamp},
		{"future timestamp", signed("dlv-x", now.Add(301*time.Second), incoming), 400, webhook.CodeInvalidTimestamp},
		{"timestamp not an integer", badTS, 400, webhook.CodeInvalidTimestamp},
		{"delivery ID too long", longID, 400, webhook.CodeInvalidDelivery},
		{"not UTF-8", signed("dlv-x", now, "{\"event\":\"message_created\",\"content\":\"\xff\"}"), 400, webhook.CodeInvalidUTF8},
		{"not JSON", signed("dlv-x", now, `event=message_created`), 400, webhook.CodeInvalidDelivery},
		{"no event", signed("dlv-x", now, `{"id":1}`), 400, webhook.CodeInvalidDelivery},
		{"another account", signed("dlv-x", now, strings.Replace(incoming, `"account":{"id":7`, `"account":{"id":8`, 1)), 400, webhook.CodeInvalidDelivery},
	}
	for _, h := range []string{HeaderDelivery, HeaderTimestamp, HeaderSignature} {
		d := good
		d.omit = h
		cases = append(cases, struct {
			name   string
			d      delivery
			status int
			code   string
		}{"missing " + h, d, 400, webhook.CodeMissingHeader})
	}
	for _, tc := range cases {
		if a := e.post(t, tc.d); a.status != tc.status || a.code() != tc.code {
			t.Errorf("%s: %d %v, want %d %s", tc.name, a.status, a.body, tc.status, tc.code)
		}
	}
	if n := e.pending(t); n != 0 {
		t.Errorf("refused deliveries stored %d batches", n)
	}
	// Refusals are not fenced: the good delivery is then accepted.
	if a := e.post(t, good); a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Errorf("good delivery after refusals: %d %v", a.status, a.body)
	}
}

func TestWebhookRouteAbsentWithoutSecret(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.WebhookSecret = provider.Secret{} })
	a := e.post(t, signed("dlv-1", time.Now(), incoming))
	if a.status != http.StatusNotFound {
		t.Errorf("outbound-only host answered %d %v, want 404", a.status, a.body)
	}
	m, err := e.conn.Manifest(hostsdktest.Context(t), e.Host.Tenant())
	if err != nil || len(m.Channels) != 0 {
		t.Errorf("outbound-only manifest channels %s, %v", m.Channels, err)
	}
}

// clock is a settable webhook clock.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// TestWebhookReplayOfFutureTimestamp: a delivery whose timestamp is
// ahead of this host's clock (within the skew) stays acceptable until
// timestamp+skew, up to twice the skew after it was first received; the
// replay fence must still hold it then.
func TestWebhookReplayOfFutureTimestamp(t *testing.T) {
	// The adapter's clock starts at the host's (which checks the event's
	// occurred_at, the delivery's timestamp, against its own).
	t0 := time.Now().Truncate(time.Second)
	clk := &clock{now: t0}
	e := newEnv(t, func(c *Config) { c.Now = clk.Now })
	d := signed("dlv-future", t0.Add(MaxSkew-10*time.Second), incoming)
	if a := e.post(t, d); a.status != 200 || a.body["duplicate"] != nil {
		t.Fatalf("first delivery: %d %v", a.status, a.body)
	}
	clk.set(t0.Add(MaxSkew + 100*time.Second)) // the timestamp is still within the skew
	if a := e.post(t, d); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("the same delivery %s after it was received: %d %v, want a duplicate", MaxSkew+100*time.Second, a.status, a.body)
	}
}

// TestWebhookEventID: the event ID is an AIP event identifier ("evt_" and
// a UUIDv7 in 32 lowercase hex digits) derived from the account and the
// delivery ID only, so a redelivery signed at another time keeps it and
// another delivery or account does not share it.
func TestWebhookEventID(t *testing.T) {
	e := newEnv(t, nil)
	at := time.Unix(1_900_000_000, 0)
	evs, err := e.conn.mapDelivery("dlv-1", at, []byte(incoming))
	if err != nil || len(evs) != 1 {
		t.Fatalf("mapDelivery: %v, %v", evs, err)
	}
	id := evs[0].ID
	if err := aip.ValidateID(aip.PrefixEvent, id); err != nil {
		t.Errorf("event ID: %v", err)
	}
	later, _ := e.conn.mapDelivery("dlv-1", at.Add(time.Hour), []byte(incoming))
	other, _ := e.conn.mapDelivery("dlv-2", at, []byte(incoming))
	if later[0].ID != id || other[0].ID == id {
		t.Errorf("IDs %s (same delivery later), %s (another delivery); want %s and a different one", later[0].ID, other[0].ID, id)
	}
	c8 := &Connector{cfg: Config{AccountID: 8}}
	acct8, _ := c8.mapDelivery("dlv-1", at, []byte(strings.Replace(incoming, `"account":{"id":7`, `"account":{"id":8`, 1)))
	if acct8[0].ID == id {
		t.Error("the same delivery ID for another account maps to the same event ID")
	}
}

// TestWebhookReplayUnderAnotherDeliveryID: the delivery ID header is not
// signed (the signature covers the timestamp and the body), so a captured
// delivery sent again within the timestamp window under a new
// X-Chatwoot-Delivery must still be a duplicate, not a second event.
func TestWebhookReplayUnderAnotherDeliveryID(t *testing.T) {
	e := newEnv(t, nil)
	d := signed("dlv-1", time.Now(), incoming)
	if a := e.post(t, d); a.status != 200 || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Fatalf("delivery: %d %v", a.status, a.body)
	}
	replay := d
	replay.id = "dlv-forged"
	if a := e.post(t, replay); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("replay under another delivery ID: %d %v; want a duplicate", a.status, a.body)
	}
	// The hex of the signature in upper case is the same signature.
	replay.id, replay.sig = "dlv-forged-2", "sha256="+strings.ToUpper(strings.TrimPrefix(d.sig, "sha256="))
	if a := e.post(t, replay); a.status != 200 || a.body["duplicate"] != true {
		t.Fatalf("replay with upper-case hex: %d %v; want a duplicate", a.status, a.body)
	}
	if n := e.pending(t); n != 1 {
		t.Fatalf("outbox holds %d batches after replays, want 1", n)
	}
}

// offsetClock is time.Now shifted by a settable offset.
type offsetClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *offsetClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *offsetClock) shift(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.off = d
}

// TestWebhookReplayAfterFailedPublication: a delivery whose publication
// failed (here: its time ahead of the host's clock, ResendStatus, to be
// delivered again) was not fenced at all, so a captured copy sent under another
// delivery ID was published as a second event, and the product's
// redelivery of the original published the first: two events for one
// delivery. The signed material is claimed for its delivery ID before
// publishing: the copy is a duplicate, the original's redelivery goes
// through.
func TestWebhookReplayAfterFailedPublication(t *testing.T) {
	hclk := &offsetClock{}
	e := newEnvWithHost(t, nil, func(c *hostsdk.Config) { c.Now = hclk.Now })
	d := signed("dlv-orig", time.Now(), incoming)
	hclk.shift(-6 * time.Minute) // the host's clock behind: the event is ahead of it
	if a := e.post(t, d); a.status != ResendStatus || a.code() != webhook.CodeInvalidTimestamp {
		t.Fatalf("delivery whose event is ahead of the host's clock: %d %v, want %d %s", a.status, a.body, ResendStatus, webhook.CodeInvalidTimestamp)
	}
	hclk.shift(0)
	replay := d
	replay.id = "dlv-forged"
	if a := e.post(t, replay); a.status != http.StatusOK || a.body["duplicate"] != true {
		t.Fatalf("copy of a delivery whose publication failed, under another delivery ID: %d %v; want a duplicate", a.status, a.body)
	}
	if a := e.post(t, d); a.status != http.StatusOK || a.body["duplicate"] != nil || a.body["accepted_events"] != float64(1) {
		t.Fatalf("redelivery of the original: %d %v; want it accepted", a.status, a.body)
	}
	if a := e.post(t, d); a.status != http.StatusOK || a.body["duplicate"] != true {
		t.Fatalf("the original once more: %d %v; want a duplicate", a.status, a.body)
	}
	if n := e.pending(t); n != 1 {
		t.Fatalf("outbox holds %d batches, want 1 (one event for one delivery)", n)
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
	if namespace == FenceNamespace && j.stored.Load() {
		return 0, errors.New("disk I/O error")
	}
	return j.Journal.PutState(ctx, namespace, key, value, rev)
}

// TestWebhookAcceptedWhenFenceRecordFails: a delivery whose events are
// stored but whose delivery ID the fence could not record was answered
// 503. Chatwoot takes any error as a failed delivery (it marks an API
// inbox's message failed, moves an agent bot's pending conversation to
// open), and a sender that delivers again signs the copy at another
// time: the same event ID with another occurred_at, which the fleet
// refuses as a conflict. The events are stored: the delivery is accepted.
func TestWebhookAcceptedWhenFenceRecordFails(t *testing.T) {
	var j *fenceLossJournal
	e := newEnvWithHost(t, nil, func(c *hostsdk.Config) {
		j = &fenceLossJournal{Journal: c.Journal.(*sqliteruntime.Journal)}
		c.Journal = j
	})
	d := signed("dlv-unrecorded", time.Now(), incoming)
	if a := e.post(t, d); a.status != http.StatusOK || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
		t.Fatalf("delivery whose events are stored but not fenced: %d %v, want 200 with 1 accepted event", a.status, a.body)
	}
	if !j.stored.Load() {
		t.Fatal("no event batch was stored")
	}
	if n := e.pending(t); n != 1 {
		t.Fatalf("outbox holds %d batches, want 1", n)
	}
}

// flakyJournal fails, while fail is set, the replay fence's reads
// (failState) or the storing of event batches (failEvents): the state
// store or the outbox failing for a moment.
type flakyJournal struct {
	*sqliteruntime.Journal
	failState, failEvents atomic.Bool
}

func (j *flakyJournal) State(ctx context.Context, namespace, key string) (journal.StateValue, error) {
	if namespace == FenceNamespace && j.failState.Load() {
		return journal.StateValue{}, errors.New("database is locked")
	}
	return j.Journal.State(ctx, namespace, key)
}

func (j *flakyJournal) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	if j.failEvents.Load() {
		return errors.New("disk I/O error")
	}
	return j.Journal.EnqueueEvents(ctx, e)
}

// TestWebhookTransientFailureResent: a delivery the route could not take
// for a reason that passes (its replay fence unreadable, its events not
// stored) was answered 503, which Chatwoot never sends again: an agent
// bot's delivery is resent on 429 and 500 only (AgentBots::WebhookJob,
// twice more, 3 s apart, the same delivery ID signed at the new time), so
// it was lost and the bot's pending conversation moved to open. It is
// answered ResendStatus (500), and the resent delivery is taken, once.
// What a resend cannot change keeps its answer (another account: 400).
func TestWebhookTransientFailureResent(t *testing.T) {
	if ResendStatus != http.StatusInternalServerError && ResendStatus != http.StatusTooManyRequests {
		t.Fatalf("ResendStatus %d is not one Chatwoot resends an agent bot's delivery on (429, 500)", ResendStatus)
	}
	var j *flakyJournal
	e := newEnvWithHost(t, nil, func(c *hostsdk.Config) {
		j = &flakyJournal{Journal: c.Journal.(*sqliteruntime.Journal)}
		c.Journal = j
	})
	t0 := time.Now()
	for i, tc := range []struct {
		name string
		fail *atomic.Bool
	}{
		{"replay fence unreadable", &j.failState},
		{"events not stored", &j.failEvents},
	} {
		id := "dlv-" + strings.ReplaceAll(tc.name, " ", "-")
		body := strings.Replace(incoming, `"id":55,`, fmt.Sprintf(`"id":%d,`, 60+i), 1)
		tc.fail.Store(true)
		if a := e.post(t, signed(id, t0, body)); a.status != ResendStatus || a.code() != webhook.CodeStorageUnavailable {
			t.Errorf("%s: %d %v, want %d %s", tc.name, a.status, a.body, ResendStatus, webhook.CodeStorageUnavailable)
		}
		tc.fail.Store(false)
		// A failed outbox write leaves the replica not ready until a
		// storage check (a heartbeat's, /ready's) writes again.
		if resp, err := http.Get("http://" + e.Host.Addr().String() + "/ready"); err != nil {
			t.Fatal(err)
		} else {
			resp.Body.Close()
		}
		// Chatwoot's retry: the same delivery ID, signed 3 s later.
		if a := e.post(t, signed(id, t0.Add(3*time.Second), body)); a.status != http.StatusOK || a.body["accepted_events"] != float64(1) || a.body["duplicate"] != nil {
			t.Errorf("%s, then resent: %d %v, want accepted", tc.name, a.status, a.body)
		}
		if a := e.post(t, signed(id, t0.Add(6*time.Second), body)); a.status != http.StatusOK || a.body["duplicate"] != true {
			t.Errorf("%s, resent once more: %d %v, want a duplicate", tc.name, a.status, a.body)
		}
	}
	if n := e.pending(t); n != 2 {
		t.Fatalf("outbox holds %d batches, want 2 (one a delivery)", n)
	}
	other := strings.Replace(incoming, `"account":{"id":7,`, `"account":{"id":8,`, 1)
	if a := e.post(t, signed("dlv-other", t0, other)); a.status != http.StatusBadRequest || a.code() != webhook.CodeInvalidDelivery {
		t.Errorf("a delivery for another account: %d %v, want 400 %s", a.status, a.body, webhook.CodeInvalidDelivery)
	}
}

// newLoggedEnv is newEnv whose host logs at info and above to the buffer
// it returns.
func newLoggedEnv(t *testing.T, edit func(*Config)) (*env, *hostsdktest.LogBuffer) {
	t.Helper()
	logs := &hostsdktest.LogBuffer{}
	e := newEnvWithHost(t, edit, func(c *hostsdk.Config) {
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	return e, logs
}

// TestWebhookRefusalsLogged: a verified delivery refused for its
// timestamp (a replica whose clock is more than MaxSkew off refuses every
// delivery) or for another account was answered without a log line, and
// Chatwoot does not deliver it again: its event was lost without a trace
// on the replica. Each is logged at warn with the delivery ID, why, and
// for the clock the offset and what to check; a streak of the same
// refusal is one line a minute with the count. A signature that does not
// verify is logged too (a secret differing from Chatwoot's refuses every
// delivery), rate-limited the same way.
func TestWebhookRefusalsLogged(t *testing.T) {
	t0 := time.Now().Truncate(time.Second)
	clk := &clock{now: t0}
	e, logs := newLoggedEnv(t, func(c *Config) { c.Now = clk.Now })
	logs.Take("") // the host's start

	// This replica's clock is 7 minutes ahead of Chatwoot's.
	if a := e.post(t, signed("dlv-skew-1", t0.Add(-7*time.Minute), incoming)); a.status != 400 || a.code() != webhook.CodeInvalidTimestamp {
		t.Fatalf("delivery 7 minutes old: %d %v", a.status, a.body)
	}
	got := logs.Take("chatwoot webhook")
	if len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "delivery=dlv-skew-1") ||
		!strings.Contains(got[0], "clock_offset=7m0s") || !strings.Contains(got[0], "check this host's clock (NTP)") {
		t.Fatalf("refusal for the clock logged %q, want one warning with the delivery, the offset and what to check", got)
	}
	for i := range 3 {
		e.post(t, signed(fmt.Sprintf("dlv-skew-%d", i+2), t0.Add(-7*time.Minute), incoming))
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 0 {
		t.Fatalf("a streak of the same refusal logged %q, want nothing within %s", got, webhook.RefusalLogEvery)
	}
	clk.set(t0.Add(webhook.RefusalLogEvery))
	e.post(t, signed("dlv-skew-5", t0.Add(webhook.RefusalLogEvery-7*time.Minute), incoming))
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "delivery=dlv-skew-5") || !strings.Contains(got[0], "not_logged_since=3") {
		t.Fatalf("the streak a minute later logged %q, want one line counting the 3 not logged", got)
	}

	now := clk.Now()
	other := strings.Replace(incoming, `"account":{"id":7`, `"account":{"id":8`, 1)
	if a := e.post(t, signed("dlv-acct", now, other)); a.status != 400 || a.code() != webhook.CodeInvalidDelivery {
		t.Fatalf("delivery for account 8: %d %v", a.status, a.body)
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "delivery=dlv-acct") ||
		!strings.Contains(got[0], "another account") || !strings.Contains(got[0], "account 8") {
		t.Fatalf("refusal for another account logged %q", got)
	}
	if a := e.post(t, signed("dlv-notjson", now, `[1]`)); a.status != 400 {
		t.Fatalf("delivery that is not an object: %d %v", a.status, a.body)
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "delivery=dlv-notjson") || !strings.Contains(got[0], "cannot be mapped") {
		t.Fatalf("refusal of an unmappable delivery logged %q", got)
	}

	forged := signed("dlv-forged", now, incoming)
	forged.sig = "sha256=" + strings.Repeat("0", 64)
	for range 2 {
		if a := e.post(t, forged); a.status != 401 {
			t.Fatalf("forged delivery: %d %v", a.status, a.body)
		}
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "does not verify") || !strings.Contains(got[0], "--chatwoot-webhook-secret-file") {
		t.Fatalf("two deliveries that do not verify logged %q, want one line", got)
	}
}

// TestWebhookPublishRefusalsLogged: a verified delivery the host refused
// to store (here: its time ahead of the host's clock, ResendStatus, to be
// delivered again) was logged on every attempt, so a delivery resent
// while the host keeps refusing it wrote a line each time. It is logged
// as the other refusals are: once a minute with the count.
func TestWebhookPublishRefusalsLogged(t *testing.T) {
	t0 := time.Now().Truncate(time.Second)
	clk := &clock{now: t0}
	hclk := &offsetClock{}
	logs := &hostsdktest.LogBuffer{}
	e := newEnvWithHost(t, func(c *Config) { c.Now = clk.Now }, func(c *hostsdk.Config) {
		c.Now = hclk.Now
		c.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	logs.Take("")                // the host's start
	hclk.shift(-6 * time.Minute) // the host's clock behind: every event is ahead of it
	t.Cleanup(func() { hclk.shift(0) })

	d := signed("dlv-ahead", t0, incoming)
	for i := range 3 {
		if a := e.post(t, d); a.status != ResendStatus || a.code() != webhook.CodeInvalidTimestamp {
			t.Fatalf("attempt %d of a delivery whose event is ahead of the host's clock: %d %v, want %d %s", i+1, a.status, a.body, ResendStatus, webhook.CodeInvalidTimestamp)
		}
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "level=WARN") || !strings.Contains(got[0], "delivery=dlv-ahead") ||
		!strings.Contains(got[0], "ahead of this replica's clock") || strings.Contains(got[0], "not_logged_since") {
		t.Fatalf("a delivery sent 3 times while the host refuses its event logged %q, want one warning", got)
	}
	clk.set(t0.Add(webhook.RefusalLogEvery))
	if a := e.post(t, signed("dlv-ahead-2", t0.Add(webhook.RefusalLogEvery), incoming)); a.status != ResendStatus {
		t.Fatalf("a delivery a minute later: %d %v, want %d", a.status, a.body, ResendStatus)
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "delivery=dlv-ahead-2") || !strings.Contains(got[0], "not_logged_since=2") {
		t.Fatalf("the refusal a minute later logged %q, want one line counting the 2 not logged", got)
	}
}

// TestWebhookPreviousSecret: while Chatwoot switches to a new secret,
// deliveries it signed with the previous one were refused 401 (each
// route took one secret) and lost, since Chatwoot does not deliver them
// again. With --chatwoot-webhook-previous-secret-file both verify; the
// previous one's use is logged at info once, and so is the first delivery
// with the current secret after it (the switch is done); any other
// signature is still refused.
func TestWebhookPreviousSecret(t *testing.T) {
	const oldSecret = "cw-old-secret-xyz"
	e, logs := newLoggedEnv(t, func(c *Config) { c.PreviousWebhookSecret = provider.NewSecret(oldSecret) })
	logs.Take("")
	now := time.Now()
	n := 0
	signedWith := func(secret, id string) delivery {
		n++ // each at another second: another signature
		at := now.Add(time.Duration(n) * time.Second)
		d := signed(id, at, incoming)
		ts := strconv.FormatInt(at.Unix(), 10)
		d.sig = "sha256=" + hex.EncodeToString(webhook.HMACSHA256([]byte(secret), []byte(ts), []byte("."), []byte(incoming)))
		return d
	}
	for _, id := range []string{"dlv-old-1", "dlv-old-2"} {
		if a := e.post(t, signedWith(oldSecret, id)); a.status != 200 || a.body["duplicate"] != nil {
			t.Fatalf("%s signed with the previous secret: %d %v, want accepted", id, a.status, a.body)
		}
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[0], "delivery=dlv-old-1") ||
		!strings.Contains(got[0], "previous webhook secret (--chatwoot-webhook-previous-secret-file)") {
		t.Fatalf("two deliveries with the previous secret logged %q, want one info line", got)
	}
	for _, id := range []string{"dlv-new-1", "dlv-new-2"} {
		if a := e.post(t, signedWith(testSecret, id)); a.status != 200 {
			t.Fatalf("%s signed with the current secret: %d %v", id, a.status, a.body)
		}
	}
	if got := logs.Take("chatwoot webhook"); len(got) != 1 || !strings.Contains(got[0], "level=INFO") || !strings.Contains(got[0], "delivery=dlv-new-1") ||
		!strings.Contains(got[0], "the product has switched") {
		t.Fatalf("deliveries with the current secret after the previous logged %q, want one info line", got)
	}
	if a := e.post(t, signedWith("cw-other-secret", "dlv-other")); a.status != 401 || a.code() != webhook.CodeAuthenticationFailed {
		t.Fatalf("delivery signed with another secret: %d %v, want 401", a.status, a.body)
	}
	if n := e.pending(t); n != 4 {
		t.Fatalf("outbox holds %d batches, want 4", n)
	}
}
