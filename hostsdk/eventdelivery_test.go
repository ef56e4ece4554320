package hostsdk_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/internal/memjournal"
)

// publishingConnector hands the test its EventPublisher.
type publishingConnector struct {
	*testConnector
	mu  sync.Mutex
	pub *hostsdk.EventPublisher
}

func (c *publishingConnector) Routes(ctx context.Context, rc *hostsdk.RouteContext) ([]hostsdk.Route, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pub = rc.Events
	return nil, nil
}

func (c *publishingConnector) publish(t *testing.T, kinds ...string) string {
	t.Helper()
	c.mu.Lock()
	pub := c.pub
	c.mu.Unlock()
	events := make([]aip.Event, len(kinds))
	for i, k := range kinds {
		events[i] = aip.Event{Kind: k, Data: []byte(`{"n":` + strconv.Itoa(i) + `}`)}
	}
	id, err := pub.Publish(context.Background(), "test.events", events...)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// retry is one RetryEvents call the host made.
type retry struct {
	at, next  time.Time
	lastError string
}

// recordingJournal records the outcomes the host writes for outbox batches.
type recordingJournal struct {
	*memjournal.Journal
	mu      sync.Mutex
	retries []retry
	acks    int
}

func (j *recordingJournal) RetryEvents(ctx context.Context, id string, next time.Time, lastError string) error {
	j.mu.Lock()
	j.retries = append(j.retries, retry{at: time.Now(), next: next, lastError: lastError})
	j.mu.Unlock()
	return j.Journal.RetryEvents(ctx, id, next, lastError)
}

func (j *recordingJournal) AckEvents(ctx context.Context, id string) error {
	j.mu.Lock()
	j.acks++
	j.mu.Unlock()
	return j.Journal.AckEvents(ctx, id)
}

func (j *recordingJournal) snapshot() ([]retry, int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]retry(nil), j.retries...), j.acks
}

func (j *recordingJournal) pending(t *testing.T) int {
	t.Helper()
	n, err := j.PendingEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// eventFleet is a host with an event endpoint inside a testing/synctest
// bubble: control plane and ingress in memory, the host on a MemListener.
type eventFleet struct {
	cp     *hostsdktest.ControlPlane
	in     *hostsdktest.EventIngress
	j      *recordingJournal
	cfg    hostsdk.Config
	h      *hostsdk.Host
	conn   *publishingConnector
	client *http.Client
	logs   *hostsdktest.LogBuffer
}

func newEventFleet(t *testing.T, deliver bool, edit ...func(*hostsdk.Config)) *eventFleet {
	t.Helper()
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	ml := hostsdktest.NewMemListener()
	client := ml.Client()
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain, Client: client})
	in := hostsdktest.NewEventIngress(t, hostsdktest.EventIngressConfig{ControlPlane: cp, Dispatcher: d, InMemory: true})
	cfg := hostsdktest.HostConfig(t, cp, d, ml)
	j := &recordingJournal{Journal: memjournal.New()}
	cfg.Journal = j
	logs := &hostsdktest.LogBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if deliver {
		in.Configure(&cfg)
	}
	for _, e := range edit {
		e(&cfg)
	}
	conn := &publishingConnector{testConnector: newTestConnector()}
	h := hostsdktest.StartHost(t, cfg, conn)
	return &eventFleet{cp: cp, in: in, j: j, cfg: cfg, h: h, conn: conn, client: client, logs: logs}
}

// metric reads one sample ("name" or `name{label="v"}`) from /metrics; 0
// when absent.
func (f *eventFleet) metric(t *testing.T, sample string) float64 {
	t.Helper()
	v, _ := scrapeMetric(t, f.client, sample)
	return v
}

func (f *eventFleet) sequence(t *testing.T) uint64 {
	t.Helper()
	st, ok := f.cp.Replica(f.cfg.ReplicaID)
	if !ok {
		t.Fatal("replica not provisioned")
	}
	return st.HealthRevision
}

func failures(code string) string {
	return hostsdk.MetricEventDeliveryFailures + `{code="` + code + `"}`
}

func TestEventDeliveryDeliversAndAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		f.conn.publish(t, "ticket.created", "ticket.updated")
		synctest.Wait()
		dl := f.in.Deliveries()
		if len(dl) != 1 || dl[0].Status != http.StatusOK {
			t.Fatalf("deliveries %+v, want one stored", dl)
		}
		got := dl[0].Event
		want := aip.ConnectorEvent{
			TenantID: f.cfg.TenantID, InstanceID: f.cfg.InstanceID, ReplicaID: f.cfg.ReplicaID, VersionID: f.cfg.VersionID,
			ManifestDigest: f.h.ManifestDigest(), LeaseSequence: f.sequence(t), ChannelID: "test.events",
		}
		if got != want {
			t.Errorf("connector_event %+v, want %+v", got, want)
		}
		if dl[0].SignerDID != f.h.DID() {
			t.Errorf("signed by %s, want the replica's %s", dl[0].SignerDID, f.h.DID())
		}
		if ev := f.in.Events(); len(ev) != 2 || ev[0].Kind != "ticket.created" || ev[1].Kind != "ticket.updated" {
			t.Errorf("stored events %+v", ev)
		}
		if n := f.j.pending(t); n != 0 {
			t.Errorf("outbox holds %d batches after the ack", n)
		}
		if _, acks := f.j.snapshot(); acks != 1 {
			t.Errorf("%d acks, want 1", acks)
		}
		if n := f.metric(t, hostsdk.MetricEventsDelivered); n != 1 {
			t.Errorf("%s = %v, want 1", hostsdk.MetricEventsDelivered, n)
		}
	})
}

func TestEventDeliveryRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		f.in.SetDown(true)
		f.conn.publish(t, "ticket.created")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		retries, _ := f.j.snapshot()
		if len(retries) < 2 {
			t.Fatalf("%d retries in 10s, want at least 2", len(retries))
		}
		for i, r := range retries {
			lo := time.Second << min(i, 6)
			if d := r.next.Sub(r.at); d < lo || d > lo+time.Second {
				t.Errorf("retry %d scheduled %s later, want [%s, %s]", i, d, lo, lo+time.Second)
			}
			if i > 0 && retries[i].at.Before(retries[i-1].next) {
				t.Errorf("retry %d at %s, before its due time %s", i, retries[i].at, retries[i-1].next)
			}
			if !strings.Contains(r.lastError, hostsdk.CodeEventTransport) {
				t.Errorf("last error %q does not name %s", r.lastError, hostsdk.CodeEventTransport)
			}
		}
		if n := f.j.pending(t); n != 1 {
			t.Fatalf("outbox holds %d batches while the ingress is down", n)
		}
		if n := f.metric(t, hostsdk.MetricEventsPending); n != 1 {
			t.Errorf("%s = %v while the ingress is down, want 1", hostsdk.MetricEventsPending, n)
		}
		f.in.SetDown(false)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		if n := f.j.pending(t); n != 0 {
			t.Fatalf("outbox holds %d batches after the ingress came back", n)
		}
		if n := f.metric(t, hostsdk.MetricEventsPending); n != 0 {
			t.Errorf("%s = %v after the ingress came back, want 0", hostsdk.MetricEventsPending, n)
		}
		if ev := f.in.Events(); len(ev) != 1 {
			t.Errorf("stored %d events, want 1", len(ev))
		}
		retries, _ = f.j.snapshot()
		if n := f.metric(t, failures(hostsdk.CodeEventTransport)); n != float64(len(retries)) {
			t.Errorf("failure metric %v, want %d", n, len(retries))
		}
	})
}

func TestEventDeliveryPermanentRefusal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		f.in.FailNext(1, aip.CodeEventNotAuthorized)
		f.conn.publish(t, "ticket.created")
		synctest.Wait()
		retries, acks := f.j.snapshot()
		if len(retries) != 1 || acks != 0 {
			t.Fatalf("retries %+v acks %d, want one retry", retries, acks)
		}
		if d := retries[0].next.Sub(retries[0].at); d < 60*time.Second || d > 61*time.Second {
			t.Errorf("a permanent refusal is retried %s later, want the maximum backoff [60s, 61s]", d)
		}
		if !strings.Contains(retries[0].lastError, aip.CodeEventNotAuthorized) {
			t.Errorf("last error %q does not name the code", retries[0].lastError)
		}
		if n := f.j.pending(t); n != 1 {
			t.Errorf("outbox holds %d batches, want the refused one kept", n)
		}
		logs := f.logs.String()
		if !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "code="+aip.CodeEventNotAuthorized) {
			t.Errorf("no error log with the code:\n%s", logs)
		}
		if n := f.metric(t, failures(aip.CodeEventNotAuthorized)); n != 1 {
			t.Errorf("failure metric %v, want 1", n)
		}
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if dl := f.in.Deliveries(); len(dl) != 1 {
			t.Errorf("%d deliveries within 30s of a permanent refusal, want 1", len(dl))
		}
	})
}

func TestEventDeliveryAnswerSignedByAnotherKeyIsNotAcked(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		other, _ := aip.GenerateSigningKey()
		f.in.SignWith(other)
		f.conn.publish(t, "ticket.created")
		synctest.Wait()
		retries, acks := f.j.snapshot()
		if len(retries) != 1 || acks != 0 || !strings.Contains(retries[0].lastError, hostsdk.CodeEventAnswerInvalid) {
			t.Fatalf("retries %+v acks %d, want one retry for an unverified answer", retries, acks)
		}
		if n := f.j.pending(t); n != 1 {
			t.Fatalf("outbox holds %d batches, want 1", n)
		}
		// Sent again once answers verify: the dispatcher stores the events
		// once, the host acks.
		f.in.SignWith(nil)
		// The retry is due within the backoff of a second failure (at
		// most 2 s and its 1 s of jitter), and the loop looks at most a
		// poll interval (1.25 s) later: 3 s fell short of that in a
		// clean-clone run.
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if n := f.j.pending(t); n != 0 {
			t.Errorf("outbox holds %d batches after a verified answer", n)
		}
		if ev := f.in.Events(); len(ev) != 1 {
			t.Errorf("stored %d events, want 1", len(ev))
		}
	})
}

func TestEventDeliveryStaleLeaseSequence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true)
		seq := f.sequence(t)
		f.in.RefuseSequencesThrough(seq)
		f.conn.publish(t, "ticket.created")
		synctest.Wait()
		dl := f.in.Deliveries()
		if len(dl) != 1 || dl[0].Code != aip.CodeEventUnavailable || dl[0].Event.LeaseSequence != seq {
			t.Fatalf("deliveries %+v, want one refused as stale", dl)
		}
		if n := f.j.pending(t); n != 1 {
			t.Fatalf("outbox holds %d batches, want 1", n)
		}
		// The next heartbeat (at most 12.5s after registration) renews the
		// lease with a new sequence; a retry carries it and is stored.
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if n := f.j.pending(t); n != 0 {
			t.Fatalf("outbox holds %d batches after the heartbeat", n)
		}
		dl = f.in.Deliveries()
		last := dl[len(dl)-1]
		if last.Status != http.StatusOK || last.Event.LeaseSequence <= seq || len(opsOf(f.cp, aip.OpHeartbeat)) == 0 {
			t.Errorf("last delivery %+v, want stored with a sequence after %d", last, seq)
		}
		if n := f.metric(t, failures(aip.CodeEventUnavailable)); n < 1 {
			t.Errorf("failure metric %v, want at least 1", n)
		}
	})
}

func TestEventDeliveryWithoutEndpoint(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, false)
		if logs := f.logs.String(); !strings.Contains(logs, "level=WARN") || !strings.Contains(logs, "--event-endpoint is not set") {
			t.Errorf("no startup warning:\n%s", logs)
		}
		f.conn.publish(t, "ticket.created")
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if dl := f.in.Deliveries(); len(dl) != 0 {
			t.Errorf("%d deliveries without an event endpoint", len(dl))
		}
		if n := f.j.pending(t); n != 1 {
			t.Errorf("outbox holds %d batches, want 1", n)
		}
		if n := f.metric(t, hostsdk.MetricEventsPending); n != 1 {
			t.Errorf("%s = %v, want 1", hostsdk.MetricEventsPending, n)
		}
	})
}

func TestEventDeliveryDuringDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newEventFleet(t, true, func(c *hostsdk.Config) { c.DrainLinger = 5 * time.Second })
		f.in.SetDown(true)
		f.conn.publish(t, "ticket.created")
		synctest.Wait()
		if retries, _ := f.j.snapshot(); len(retries) != 1 {
			t.Fatalf("%d retries, want 1", len(retries))
		}
		// The ingress comes back while the host drains: the batch published
		// before the drain is retried (due within 2s) during the 5s drain
		// and delivered before the host goes offline.
		f.in.SetDown(false)
		if err := f.h.Stop(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := f.j.pending(t); n != 0 {
			t.Errorf("outbox holds %d batches after the drain", n)
		}
		dl := f.in.Deliveries()
		offline := opsOf(f.cp, aip.OpOffline)
		if len(offline) != 1 || dl[len(dl)-1].At.After(offline[0].At) {
			t.Errorf("last delivery at %v, offline %v", dl[len(dl)-1].At, offline)
		}
	})
}

// TestEventDeliveryStopsWithTheHost runs over real loopback HTTP and checks
// that nothing the host started outlives Stop.
func TestEventDeliveryStopsWithTheHost(t *testing.T) {
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	d := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{TrustDomain: hostsdktest.TrustDomain})
	in := hostsdktest.NewEventIngress(t, hostsdktest.EventIngressConfig{ControlPlane: cp, Dispatcher: d})
	cfg := hostsdktest.HostConfig(t, cp, d, nil)
	in.Configure(&cfg)
	j := &recordingJournal{Journal: memjournal.New()}
	cfg.Journal = j
	before := goleak.IgnoreCurrent()
	conn := &publishingConnector{testConnector: newTestConnector()}
	h := hostsdktest.StartHost(t, cfg, conn)
	conn.publish(t, "ticket.created")
	if err := in.Await(ctxT(t), func(dl []hostsdktest.Delivery) bool { return len(dl) == 1 }); err != nil {
		t.Fatal(err)
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if n := j.pending(t); n != 0 {
		t.Errorf("outbox holds %d batches", n)
	}
	goleak.VerifyNone(t, before)
}

// noChannels is a connector whose manifest declares no event channels.
type noChannels struct{ *testConnector }

func (c noChannels) Manifest(ctx context.Context, tc hostsdk.TenantContext) (*aip.Manifest, error) {
	m, err := c.testConnector.Manifest(ctx, tc)
	if err != nil {
		return nil, err
	}
	m.Channels = nil
	return m, nil
}

// TestEventDeliveryNeedsChannels: with an event endpoint but no channels
// in the manifest nothing can be published, so no loop polls the outbox.
func TestEventDeliveryNeedsChannels(t *testing.T) {
	logs := &hostsdktest.LogBuffer{}
	f := hostsdktest.StartWithEvents(t, noChannels{newTestConnector()}, func(cfg *hostsdk.Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	if f.Config.EventEndpoint != f.Events.Endpoint() {
		t.Fatalf("event endpoint %q, want the fixture's ingress %q", f.Config.EventEndpoint, f.Events.Endpoint())
	}
	if l := logs.String(); strings.Contains(l, "delivering events") || !strings.Contains(l, "declares no event channels") {
		t.Errorf("event delivery started for a manifest without channels:\n%s", l)
	}
}

// eventLoop publishes one event from RunEvents, retrying while the
// replica is not serving yet.
type eventLoop struct{ *testConnector }

func (c eventLoop) RunEvents(ctx context.Context, events *hostsdk.EventPublisher) error {
	for {
		_, err := events.Publish(ctx, "test.events", aip.Event{ID: hostsdk.DeriveEventID(time.Time{}, []byte("poll-1")), Kind: "ticket.created", Data: []byte(`{"n":1}`)})
		if !errors.Is(err, hostsdk.ErrNotServing) {
			if err != nil {
				return err
			}
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(10 * time.Millisecond):
		}
	}
	<-ctx.Done()
	return nil
}

// TestStartWithEvents: hostsdktest.StartWithEvents points the host at the
// fixture's event ingress, which receives, verifies and stores what
// RunEvents publishes.
func TestStartWithEvents(t *testing.T) {
	f := hostsdktest.StartWithEvents(t, eventLoop{newTestConnector()}, nil)
	if err := f.Events.Await(ctxT(t), func(d []hostsdktest.Delivery) bool { return len(d) > 0 }); err != nil {
		t.Fatal(err)
	}
	got := f.Events.Events()
	if len(got) != 1 || got[0].Kind != "ticket.created" {
		t.Fatalf("the ingress stored %+v", got)
	}
	if dl := f.Events.Deliveries(); dl[0].Code != "" {
		t.Errorf("delivery %+v", dl[0])
	}
}
