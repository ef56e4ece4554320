package hostsdk_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// webhookConnector mounts a product route that publishes an event.
type webhookConnector struct {
	*testConnector
	pattern string
}

func (c *webhookConnector) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	return []hostsdk.Route{{Pattern: c.pattern, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !rc.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		id, err := rc.Events.Publish(r.Context(), "test.events", aip.Event{Kind: "webhook.received"})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, id)
	})}}, nil
}

func TestProductRoutes(t *testing.T) {
	f := newFleet(t)
	h, _ := f.start(t, &webhookConnector{newTestConnector(), "POST /webhooks/test"})
	resp, err := http.Post("http://"+h.Addr().String()+"/webhooks/test", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "sha256_") {
		t.Fatalf("webhook answered %d %s", resp.StatusCode, body)
	}
	if n, _ := f.j.PendingEvents(context.Background()); n != 1 {
		t.Errorf("outbox holds %d batches", n)
	}

	for _, pattern := range []string{"POST /aip/v1/messages", "GET /health", "/", "GET /.well-known/other"} {
		f := newFleet(t)
		err := startErr(t, f, &webhookConnector{newTestConnector(), pattern})
		var be *hostsdk.BuildRoutesError
		if !errors.As(err, &be) {
			t.Errorf("pattern %q: Start %v, want *BuildRoutesError", pattern, err)
		}
	}
}

func TestTracing(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	f := newFleet(t)
	f.cfg.TracerProvider = tp
	h, target := f.start(t, newTestConnector())

	// The dispatcher's trace context travels in envelope.trace.
	parent, span := tp.Tracer("dispatcher").Start(context.Background(), "dispatch")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(parent, carrier)
	span.End()
	a := action(capEcho, `{"message":"traced"}`)
	env, _ := f.d.Envelope(target, aip.Body{Action: a}, f.d.Route(target, a.ID, a.CapabilityID, ""))
	env.Trace = carrier
	if _, err := f.d.Send(ctxT(t), target, env); err != nil {
		t.Fatal(err)
	}
	// The answer is flushed before the request's span ends: Stop waits for
	// the request to finish, so every span has ended when it returns.
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	names := map[string]trace.SpanContext{}
	parents := map[string]trace.SpanContext{}
	for _, s := range rec.Ended() {
		names[s.Name()] = s.SpanContext()
		parents[s.Name()] = s.Parent()
	}
	for _, want := range []string{"hostsdk.bootstrap", "hostsdk.bootstrap.validate", "hostsdk.bootstrap.recover",
		"hostsdk.bootstrap.register", "hostsdk.bootstrap.serve", "hostsdk.control.register", "hostsdk.message", "hostsdk.action " + capEcho,
		"hostsdk.journal.accept", "hostsdk.journal.finish"} {
		if _, ok := names[want]; !ok {
			t.Errorf("no span %q", want)
		}
	}
	if p := parents["hostsdk.message"]; p.TraceID() != span.SpanContext().TraceID() || p.SpanID() != span.SpanContext().SpanID() {
		t.Errorf("message span parent %v, want the dispatcher's span %v", p, span.SpanContext())
	}
}

// publisherConnector hands its route context's publisher to the test.
type publisherConnector struct {
	*testConnector
	pub chan *hostsdk.EventPublisher
}

func (c *publisherConnector) Routes(_ context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	c.pub <- rc.Events
	return nil, nil
}

// oddChannels declares, beside the test connector's channels, channel,
// which the fleet's event log cannot take.
type oddChannels struct {
	*publisherConnector
	channel json.RawMessage
}

func (c oddChannels) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m, err := c.publisherConnector.Manifest(ctx, tenant)
	if err != nil {
		return nil, err
	}
	m.Channels = append(m.Channels, c.channel)
	return m, nil
}

// channelIDRule is what aip.CheckChannelID's refusals say a channel ID
// may be.
const channelIDRule = "; a channel ID is 1 to 256 bytes of UTF-8 text without control characters, invisible formatting characters (Unicode Cf) or white space at either end (spaces inside are fine), as the fleet's event log stores it; rename the channel"

// TestHostRefusesUndeliverableChannels: a manifest declaring a channel
// the fleet's event log cannot take (white space at either end, a control
// character, an invisible formatting character) started a host, whose
// connector learned of it only when Publish refused its first event on
// it, or, for a formatting character, never: Publish stored the batch and
// the event log refused every delivery of it. The host now refuses to
// start, naming the channel, the character and what a channel ID may be.
func TestHostRefusesUndeliverableChannels(t *testing.T) {
	for _, c := range []struct{ channel, want string }{
		{`" padded "`, `manifest: channels[1]: channel ID " padded " starts with the white space ' ' (U+0020) at byte 0` + channelIDRule},
		{`"tab\tname"`, `manifest: channels[1]: channel ID "tab\tname" holds the control character '\t' (U+0009) at byte 3` + channelIDRule},
		{`{"id":"zero\u200bwidth"}`, `manifest: channels[1].id: channel ID "zero\u200bwidth" holds the invisible formatting character '\u200b' (U+200B) at byte 4` + channelIDRule},
	} {
		t.Run(c.channel, func(t *testing.T) {
			f := newFleet(t)
			conn := oddChannels{&publisherConnector{newTestConnector(), make(chan *hostsdk.EventPublisher, 1)}, json.RawMessage(c.channel)}
			err := startErr(t, f, conn)
			var be *hostsdk.BindManifestError
			if !errors.As(err, &be) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Start = %v\nwant a *BindManifestError saying %s", err, c.want)
			}
			if got := ops(f.cp); len(got) != 0 {
				t.Errorf("control plane saw %v from a host that refused its manifest", got)
			}
		})
	}
}

// TestPublishNamesWhatIsWrongWithAChannelID: Publish on a channel ID the
// fleet's event log cannot take (no manifest declares one now) says what
// is wrong with it, as the manifest's check does, rather than only that
// it is not declared.
func TestPublishNamesWhatIsWrongWithAChannelID(t *testing.T) {
	f := newFleet(t)
	c := &publisherConnector{newTestConnector(), make(chan *hostsdk.EventPublisher, 1)}
	f.start(t, c)
	pub := <-c.pub
	for ch, want := range map[string]string{
		"test.events\u200b":      `hostsdk: channel ID "test.events\u200b" holds the invisible formatting character '\u200b' (U+200B) at byte 11` + channelIDRule,
		"test.events ":           `hostsdk: channel ID "test.events " ends with the white space ' ' (U+0020) at byte 11` + channelIDRule,
		"":                       `hostsdk: channel ID is empty` + channelIDRule,
		strings.Repeat("a", 257): `hostsdk: channel ID "` + strings.Repeat("a", 64) + `"... is 257 bytes` + channelIDRule,
		"test.events.undeclared": `hostsdk: channel "test.events.undeclared" is not declared in the manifest's channels`,
	} {
		_, err := pub.Publish(context.Background(), ch, aip.Event{Kind: "k"})
		if err == nil || err.Error() != want || !errors.Is(err, hostsdk.ErrInvalidEvents) {
			t.Errorf("Publish on %q = %v\nwant an ErrInvalidEvents refusal %s", ch, err, want)
		}
	}
	if _, err := pub.Publish(context.Background(), "test.events", aip.Event{Kind: "k"}); err != nil {
		t.Fatalf("Publish on a good channel: %v", err)
	}
}

// TestPublishRefusesWhatTheFleetRefuses: an event the dispatcher's event
// ingress would refuse is refused at Publish, with nothing stored, so no
// batch waits in the outbox that can never be delivered.
func TestPublishRefusesWhatTheFleetRefuses(t *testing.T) {
	f := newFleet(t)
	c := &publisherConnector{newTestConnector(), make(chan *hostsdk.EventPublisher, 1)}
	f.start(t, c)
	pub := <-c.pub
	ctx := context.Background()
	future := aip.At(time.Now().Add(time.Hour))
	for _, tc := range []struct {
		name string
		ev   aip.Event
		want string
	}{
		{"raw hash as ID", aip.Event{ID: "evt_" + strings.Repeat("ab", 16), Kind: "k"}, "event ID"},
		{"foreign prefix", aip.Event{ID: aip.NewID(aip.PrefixAction), Kind: "k"}, "event ID"},
		{"NUL in kind", aip.Event{Kind: "k\x00"}, "kind"},
		{"invalid UTF-8 kind", aip.Event{Kind: "k\xff"}, "kind"},
		{"far future", aip.Event{Kind: "k", OccurredAt: future}, "ahead of this host's clock"},
		{"data an array", aip.Event{Kind: "k", Data: json.RawMessage(`[1]`)}, "data must be a JSON object"},
		{"data null", aip.Event{Kind: "k", Data: json.RawMessage(`null`)}, "data must be a JSON object"},
		{"NUL in data", aip.Event{Kind: "k", Data: json.RawMessage(`{"a":["x\u0000"]}`)}, "NUL"},
		// The dispatcher stamps data.aip_connector itself; the event
		// log takes no NUL in an event's IDs and no event twice in a
		// delivery.
		{"aip_connector in data", aip.Event{Kind: "k", Data: json.RawMessage(`{"aip_connector":{"replica_id":"r"}}`)}, "aip_connector"},
		{"NUL in session", aip.Event{Kind: "k", SessionID: "s\x00"}, "session_id"},
		{"NUL in action", aip.Event{Kind: "k", ActionID: "a\x00"}, "action_id"},
		{"NUL in correlation", aip.Event{Kind: "k", CorrelationID: "c\x00"}, "correlation_id"},
		// 70 kB as given, 266 kB in the canonical form a delivery carries.
		{"data too large in canonical form", aip.Event{Kind: "k",
			Data: json.RawMessage(`{"n":[` + strings.TrimSuffix(strings.Repeat("1e15,", 14000), ",") + `]}`)}, "at most"},
	} {
		if _, err := pub.Publish(ctx, "test.events", tc.ev); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Publish = %v, want an error about %q", tc.name, err, tc.want)
		} else if !errors.Is(err, hostsdk.ErrInvalidEvents) || errors.Is(err, hostsdk.ErrEventOutboxFull) || errors.Is(err, hostsdk.ErrNotServing) {
			t.Errorf("%s: Publish = %v, want it to match ErrInvalidEvents only", tc.name, err)
		}
	}
	same := aip.Event{ID: aip.NewID(aip.PrefixEvent), Kind: "k"}
	if _, err := pub.Publish(ctx, "test.events", same, aip.Event{Kind: "k"}, same); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("an event twice in one batch: Publish = %v, want an error about the event appearing twice", err)
	}
	// A backslash followed by u0000 as text is not a NUL.
	if _, err := pub.Publish(ctx, "test.events", aip.Event{Kind: "k", Data: json.RawMessage(`{"a":"\\u0000"}`)}); err != nil {
		t.Errorf("an escaped backslash: %v", err)
	}
	if n, _ := f.j.PendingEvents(ctx); n != 1 {
		t.Errorf("the outbox holds %d batches, want only the valid one", n)
	}
}

// TestPublishRefusesWhenTheOutboxIsFull: with 10000 batches waiting (no
// event endpoint delivers them), Publish refuses the next with
// ErrEventOutboxFull — try again later — and stores nothing.
func TestPublishRefusesWhenTheOutboxIsFull(t *testing.T) {
	f := newFleet(t)
	c := &publisherConnector{newTestConnector(), make(chan *hostsdk.EventPublisher, 1)}
	f.start(t, c)
	pub := <-c.pub
	ctx := context.Background()
	for i := range 10000 {
		if _, err := pub.Publish(ctx, "test.events", aip.Event{Kind: "k"}); err != nil {
			t.Fatalf("Publish %d: %v", i, err)
		}
	}
	_, err := pub.Publish(ctx, "test.events", aip.Event{Kind: "k"})
	if !errors.Is(err, hostsdk.ErrEventOutboxFull) || errors.Is(err, hostsdk.ErrInvalidEvents) || !strings.Contains(err.Error(), "10000 batches") {
		t.Fatalf("Publish with a full outbox = %v, want ErrEventOutboxFull (and not ErrInvalidEvents) naming the 10000 batches", err)
	}
}

// countingCollector is a prometheus.Collector of one constant counter.
type countingCollector struct{ desc *prometheus.Desc }

func (c countingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c countingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, 7)
}

// TestConfigCollectorsAreServed: Config.Collectors appear on the host's
// /metrics; one that collides with the host's own metrics is refused by New.
func TestConfigCollectorsAreServed(t *testing.T) {
	f := newFleet(t)
	f.cfg.Collectors = []prometheus.Collector{countingCollector{prometheus.NewDesc("wrapper_things_total", "Things the wrapper did.", nil, nil)}}
	h, _ := f.start(t, newTestConnector())
	resp, err := http.Get("http://" + h.Addr().String() + hostsdk.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), "\nwrapper_things_total 7\n") {
		t.Fatalf("/metrics lacks the collector's sample:\n%s", page)
	}

	g := newFleet(t)
	g.cfg.Collectors = []prometheus.Collector{countingCollector{prometheus.NewDesc("aip_connector_host_ready", "A clash.", nil, nil)}}
	_, err = hostsdk.New(g.cfg, newTestConnector())
	var ve *hostsdk.ValidateError
	if !errors.As(err, &ve) || !strings.Contains(err.Error(), "collector 0 of Config.Collectors") {
		t.Fatalf("New with a colliding collector = %v, want a *ValidateError naming collector 0 of Config.Collectors", err)
	}
}

// A message the host cannot authenticate (a broken signature, another
// key's) does not join the trace its envelope names: anyone who can reach
// the listener could otherwise hang failed spans under any trace they
// know the ID of (the dispatcher's own, say). Its span is a root of its
// own.
func TestUnauthenticatedMessageDoesNotJoinItsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	f := newFleet(t)
	f.cfg.TracerProvider = tp
	h, target := f.start(t, newTestConnector())

	parent, span := tp.Tracer("dispatcher").Start(context.Background(), "dispatch")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(parent, carrier)
	span.End()
	other := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	for _, d := range []*hostsdktest.Dispatcher{other, f.d} {
		a := action(capEcho, `{"message":"traced"}`)
		env, err := d.Envelope(target, aip.Body{Action: a}, d.Route(target, a.ID, a.CapabilityID, ""))
		if err != nil {
			t.Fatal(err)
		}
		env.Trace = carrier
		raw, err := d.Sign(env)
		if err != nil {
			t.Fatal(err)
		}
		if d == f.d {
			// A signature that does not verify.
			raw = bytes.Replace(raw, []byte(`"traced"`), []byte(`"forged"`), 1)
		}
		resp, _ := f.d.Post(ctxT(t), target, raw, env.MessageID)
		if resp == nil || resp.Status != http.StatusUnauthorized {
			t.Fatalf("answer %+v, want 401", resp)
		}
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range rec.Ended() {
		if s.Name() != "hostsdk.message" {
			continue
		}
		n++
		if s.SpanContext().TraceID() == span.SpanContext().TraceID() || s.Parent().IsValid() {
			t.Errorf("the span of an unauthenticated message joined the trace its envelope names (parent %v)", s.Parent())
		}
	}
	if n != 2 {
		t.Errorf("%d message spans, want 2", n)
	}
}
