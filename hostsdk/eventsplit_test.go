package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
	"github.com/aipfleet/aipfleet/hostsdk/sqliteruntime"
	"github.com/aipfleet/aipfleet/internal/pgtest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// These tests run a host against the real dispatcher's connector-event
// ingress (registry/dispatch on a memregistry event log), reached in
// process so that the whole fleet lives in a testing/synctest bubble, with
// the real journal backends: the embedded SQLite journal and PostgreSQL.

const splitChannel = "test.events"

// durableJournal is a journal backend: storage makes a fresh store (called
// outside the test's bubble) and returns how to open it; each open sees
// what the previous ones wrote, as a restarted process does.
type durableJournal struct {
	name    string
	storage func(t *testing.T) func(t *testing.T) journal.Journal
}

// durableJournals are the backends to run a test on.
var durableJournals = []durableJournal{
	{"sqlite", func(t *testing.T) func(t *testing.T) journal.Journal {
		dir := t.TempDir()
		return func(t *testing.T) journal.Journal {
			t.Helper()
			j, err := sqliteruntime.Open(context.Background(), sqliteruntime.Config{Dir: dir})
			if err != nil {
				t.Fatal(err)
			}
			return j
		}
	}},
	{"postgres", func(t *testing.T) func(t *testing.T) journal.Journal {
		url := pgtest.NewDatabase(t)
		return func(t *testing.T) journal.Journal {
			t.Helper()
			j, err := pgruntime.Open(context.Background(), pgruntime.Config{DatabaseURL: url, Namespace: "evsplit", MaxConns: 4})
			if err != nil {
				t.Fatal(err)
			}
			return j
		}
	}},
}

// errCrashed is what every outbox operation returns once outboxProbe's
// crash point was reached: from then on nothing the host does reaches the
// journal, as if the process had died there.
var errCrashed = errors.New("test: the process crashed at this point")

// outboxProbe records the outbox writes a host makes and can crash at a
// chosen one.
type outboxProbe struct {
	journal.Journal
	// crashAt, when set, is asked before each outbox write (op "enqueue",
	// "ack" or "retry", and the batch ID); true crashes there, before the
	// write.
	crashAt func(op, id string) bool

	mu      sync.Mutex
	crashed bool
	retries map[string][]retry
}

func newOutboxProbe(j journal.Journal, crashAt func(op, id string) bool) *outboxProbe {
	return &outboxProbe{Journal: j, crashAt: crashAt, retries: map[string][]retry{}}
}

func (j *outboxProbe) dead(op, id string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.crashed && j.crashAt != nil && j.crashAt(op, id) {
		j.crashed = true
	}
	return j.crashed
}

func (j *outboxProbe) didCrash() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.crashed
}

func (j *outboxProbe) EnqueueEvents(ctx context.Context, e journal.OutboxEntry) error {
	if j.dead("enqueue", e.ID) {
		return errCrashed
	}
	return j.Journal.EnqueueEvents(ctx, e)
}

func (j *outboxProbe) ClaimEvents(ctx context.Context, now time.Time, lease time.Duration, limit int) ([]journal.OutboxEntry, error) {
	if j.dead("claim", "") {
		return nil, errCrashed
	}
	return j.Journal.ClaimEvents(ctx, now, lease, limit)
}

func (j *outboxProbe) AckEvents(ctx context.Context, id string) error {
	if j.dead("ack", id) {
		return errCrashed
	}
	return j.Journal.AckEvents(ctx, id)
}

func (j *outboxProbe) RetryEvents(ctx context.Context, id string, next time.Time, lastError string) error {
	if j.dead("retry", id) {
		return errCrashed
	}
	j.mu.Lock()
	j.retries[id] = append(j.retries[id], retry{at: time.Now(), next: next, lastError: lastError})
	j.mu.Unlock()
	return j.Journal.RetryEvents(ctx, id, next, lastError)
}

// retriesOf returns the retries recorded for batch id.
func (j *outboxProbe) retriesOf(id string) []retry {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]retry(nil), j.retries[id]...)
}

// replicaRecords is the registry as the dispatcher reads it, with the
// replica's status, lease and health revision those the control plane
// granted last (in a fleet both share one registry).
type replicaRecords struct {
	*memregistry.Registry
	cp *hostsdktest.ControlPlane
}

func (r replicaRecords) ConnectorReplica(ctx context.Context, id string) (registry.ConnectorReplica, error) {
	rep, err := r.Registry.ConnectorReplica(ctx, id)
	if err != nil {
		return rep, err
	}
	if st, ok := r.cp.Replica(id); ok {
		rep.Status, rep.LeaseExpiresAt, rep.HealthRevision = st.Status, st.LeaseExpiresAt, st.HealthRevision
	}
	return rep, nil
}

// noTokens refuses every bearer token: these tests use only the event
// ingress, which takes none.
type noTokens struct{}

func (noTokens) Verify(string) (tenanttoken.Claims, error) {
	return tenanttoken.Claims{}, errors.New("this test dispatcher takes no tokens")
}

// countingTransport hands requests to a handler in process and counts them.
type countingTransport struct {
	h http.Handler
	n atomic.Int64
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	rec := httptest.NewRecorder()
	c.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

// splitFleet is a host delivering to the real dispatcher's ingress.
type splitFleet struct {
	reg   *memregistry.Registry
	cp    *hostsdktest.ControlPlane
	ml    *hostsdktest.MemListener
	cfg   hostsdk.Config
	h     *hostsdk.Host
	conn  *publishingConnector
	probe *outboxProbe
	logs  *hostsdktest.LogBuffer
	sent  *countingTransport
}

// newSplitFleet starts the dispatcher, the control plane and a host whose
// journal is j (seen through an outboxProbe crashing at crashAt), and
// records the host's connector type, version, instance and replica in the
// registry as the fleet's admission would.
func newSplitFleet(t *testing.T, j journal.Journal, crashAt func(op, id string) bool) *splitFleet {
	t.Helper()
	return newSplitFleetClock(t, j, crashAt, nil)
}

// newSplitFleetClock is newSplitFleet with the dispatcher's clock (nil:
// time.Now, which the bubble fakes).
func newSplitFleetClock(t *testing.T, j journal.Journal, crashAt func(op, id string) bool, now func() time.Time) *splitFleet {
	t.Helper()
	ctx := context.Background()
	const gatewayID = "service:aipfleet-dispatch"
	key, _ := aip.GenerateSigningKey()
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{InMemory: true})
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, Now: now},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: noTokens{}, Events: reg, Records: replicaRecords{reg, cp}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	ml := hostsdktest.NewMemListener()
	fake := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{PrincipalID: gatewayID, TrustDomain: hostsdktest.TrustDomain,
		Key: key, Client: ml.Client()})
	f := &splitFleet{reg: reg, cp: cp, ml: ml, cfg: hostsdktest.HostConfig(t, cp, fake, ml), sent: &countingTransport{h: d.Handler()}}
	f.cfg.EventEndpoint = "http://127.0.0.1:8" + aip.EventsPath
	f.cfg.EventTransport = f.sent
	f.start(t, j, crashAt)

	resp, err := f.ml.Client().Get("http://127.0.0.1:9" + hostsdk.PathManifest)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m aip.Manifest
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	cfg := f.cfg
	version := registrytest.Version(cfg.VersionID, cfg.ConnectorTypeID, "1.0.0", "owner-test", registry.VersionActive, m)
	if version.ManifestDigest != f.h.ManifestDigest() {
		t.Fatalf("registry manifest digest %s, host %s", version.ManifestDigest, f.h.ManifestDigest())
	}
	p := f.h.Principal()
	for _, err := range []error{
		reg.PutConnectorType(ctx, registry.ConnectorType{ID: cfg.ConnectorTypeID, Name: "events", Owner: "owner-test", Enabled: true}),
		reg.AdmitVersion(ctx, version),
		reg.PutInstance(ctx, registry.ConnectorInstance{ID: cfg.InstanceID, ConnectorTypeID: cfg.ConnectorTypeID, VersionID: cfg.VersionID,
			TenantID: cfg.TenantID, ConfigRevision: 1, SecretProviderRef: "secret://test", Status: registry.InstanceEnabled}),
		reg.PutReplica(ctx, registry.ConnectorReplica{
			ID: cfg.ReplicaID, InstanceID: cfg.InstanceID, VersionID: cfg.VersionID, Endpoint: cfg.PublicEndpoint,
			PeerPrincipalID: p.ID, PeerPrincipalKind: p.Kind, PeerDID: f.h.DID(), TrustDomain: hostsdktest.TrustDomain,
			TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
			LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: 1,
		}),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// start starts a host of the fleet's replica on journal j, as a new
// process: a fresh listener, connector and log.
func (f *splitFleet) start(t *testing.T, j journal.Journal, crashAt func(op, id string) bool) {
	t.Helper()
	if f.h != nil {
		f.ml = hostsdktest.NewMemListener()
		f.cfg.Listener = f.ml
	}
	f.probe = newOutboxProbe(j, crashAt)
	f.cfg.Journal = f.probe
	f.logs = &hostsdktest.LogBuffer{}
	f.cfg.Logger = slog.New(slog.NewTextHandler(f.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f.conn = &publishingConnector{testConnector: newTestConnector()}
	f.h = hostsdktest.StartHost(t, f.cfg, f.conn)
}

// storeConflicting puts an event with id into the tenant's log as an
// earlier delivery of this instance would have, with data the host's
// event of that ID does not have: the dispatcher refuses every delivery
// holding the host's one as connector_event.idempotency_conflict.
func (f *splitFleet) storeConflicting(t *testing.T, id string) {
	t.Helper()
	now := time.Now()
	_, err := f.reg.AppendEvents(context.Background(), registry.EventBatch{
		TenantID: f.cfg.TenantID, InstanceID: f.cfg.InstanceID, ReplicaID: f.cfg.ReplicaID, VersionID: f.cfg.VersionID,
		ChannelID: splitChannel, LeaseSequence: 1, ReceivedAt: now,
		Events: []aip.Event{{ID: id, Kind: "ticket.created", OccurredAt: aip.At(now), Data: json.RawMessage(`{"n":"earlier"}`)}},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// publishBatch publishes n events in one batch, event bad at index badAt
// (none when badAt < 0), and returns the IDs of the others.
func (f *splitFleet) publishBatch(t *testing.T, n, badAt int, bad string) (string, []string) {
	t.Helper()
	f.conn.mu.Lock()
	pub := f.conn.pub
	f.conn.mu.Unlock()
	events := make([]aip.Event, n)
	var good []string
	for i := range events {
		id := aip.NewID(aip.PrefixEvent)
		if i == badAt {
			id = bad
		} else {
			good = append(good, id)
		}
		events[i] = aip.Event{ID: id, Kind: "ticket.created", Data: json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`)}
	}
	batch, err := pub.Publish(context.Background(), splitChannel, events...)
	if err != nil {
		t.Fatal(err)
	}
	return batch, good
}

// eventLog returns the tenant's log: how many times each event ID is in
// it, and how many entries it holds.
func (f *splitFleet) eventLog(t *testing.T) (map[string]int, int) {
	t.Helper()
	seen := map[string]int{}
	total := 0
	var after uint64
	for {
		page, err := f.reg.Events(context.Background(), f.cfg.TenantID, after, registry.MaxEventPage)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Events {
			seen[e.Event.ID]++
			total++
			after = e.Sequence
		}
		if !page.More {
			return seen, total
		}
	}
}

func (f *splitFleet) metric(t *testing.T, sample string) float64 {
	t.Helper()
	v, _ := scrapeMetric(t, f.ml.Client(), sample)
	return v
}

func pendingIn(t *testing.T, j journal.Journal) int {
	t.Helper()
	n, err := j.PendingEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// checkDelivered checks that every good event is in the log once, next to
// the conflicting one stored before, and that the outbox holds one batch.
func checkDelivered(t *testing.T, f *splitFleet, j journal.Journal, bad string, good []string) {
	t.Helper()
	seen, total := f.eventLog(t)
	if total != len(good)+1 {
		t.Errorf("the event log holds %d events, want the %d good ones and the earlier %s", total, len(good), bad)
	}
	missing := 0
	for _, id := range good {
		if seen[id] != 1 {
			missing++
		}
	}
	if missing > 0 || seen[bad] != 1 {
		t.Errorf("%d of the %d good events are not in the log once; %s is there %d times", missing, len(good), bad, seen[bad])
	}
	if n := pendingIn(t, j); n != 1 {
		t.Errorf("the outbox holds %d batches, want the refused event's alone: %v", n, outboxIDs(t, j))
	}
}

// outboxIDs lists the outbox's batches (claiming them as a day from now
// would, which changes nothing a test reads afterwards but their leases).
func outboxIDs(t *testing.T, j journal.Journal) []string {
	t.Helper()
	batches, err := j.ClaimEvents(context.Background(), time.Now().Add(24*time.Hour), time.Second, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, b := range batches {
		ids = append(ids, b.ID+" ("+b.LastError+")")
	}
	return ids
}

// refusedBatch returns the ID of the batch the host keeps for the refused
// event: the one retried at the refused cadence.
func refusedBatch(t *testing.T, probe *outboxProbe, original string) string {
	t.Helper()
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for id, rs := range probe.retries {
		if strings.HasPrefix(id, original+".") && len(rs) > 0 && rs[len(rs)-1].next.Sub(rs[len(rs)-1].at) >= time.Hour {
			return id
		}
	}
	t.Fatalf("no part of %s is retried at the refused cadence; retries %+v", original, probe.retries)
	return ""
}

// TestEventDeliverySplitsARefusedBatch: the dispatcher refuses a 100-event
// batch because one event conflicts with an event of the same ID stored
// earlier; the host splits the batch until the 99 others are stored and
// acked, and keeps the bad one alone in the outbox, retried hourly.
func TestEventDeliverySplitsARefusedBatch(t *testing.T) {
	for _, dj := range durableJournals {
		t.Run(dj.name, func(t *testing.T) {
			open := dj.storage(t)
			synctest.Test(t, func(t *testing.T) {
				j := open(t)
				t.Cleanup(func() { j.Close() })
				f := newSplitFleet(t, j, nil)
				bad := aip.NewID(aip.PrefixEvent)
				f.storeConflicting(t, bad)
				original, good := f.publishBatch(t, hostsdk.MaxEventsPerBatch, 57, bad)
				synctest.Wait()

				checkDelivered(t, f, j, bad, good)
				// Bisection: one delivery of the batch and two per level
				// of the 7 that isolate one event of 100.
				if n := f.sent.n.Load(); n > 15 {
					t.Errorf("%d deliveries to isolate one event of 100, want at most 15", n)
				}
				kept := refusedBatch(t, f.probe, original)
				rs := f.probe.retriesOf(kept)
				if d := rs[0].next.Sub(rs[0].at); len(rs) != 1 || d < time.Hour || d > time.Hour+5*time.Minute {
					t.Errorf("the refused event's batch is retried %s later (retries %+v), want once, in [1h, 1h5m]", d, rs)
				}
				if !strings.Contains(rs[0].lastError, aip.CodeEventIdempotencyConflict) {
					t.Errorf("last error %q does not name %s", rs[0].lastError, aip.CodeEventIdempotencyConflict)
				}
				if n := f.metric(t, hostsdk.MetricEventsRefused); n != 1 {
					t.Errorf("%s = %v, want 1", hostsdk.MetricEventsRefused, n)
				}
				logs := f.logs.String()
				for _, want := range []string{"level=ERROR", "batch=" + kept, "event_id=" + bad, "code=" + aip.CodeEventIdempotencyConflict, "already stored with other content"} {
					if !strings.Contains(logs, want) {
						t.Errorf("no %q in the log:\n%s", want, logs)
					}
				}

				// Kept, not retried within the hour; retried (and refused
				// again) once it is due.
				sent := f.sent.n.Load()
				time.Sleep(50 * time.Minute)
				synctest.Wait()
				if n := f.sent.n.Load(); n != sent {
					t.Errorf("%d deliveries within 50 minutes of the refusal, want none", n-sent)
				}
				time.Sleep(20 * time.Minute)
				synctest.Wait()
				if n := f.sent.n.Load(); n != sent+1 {
					t.Errorf("%d deliveries 70 minutes after the refusal, want 1", n-sent)
				}
				if n := f.metric(t, hostsdk.MetricEventsRefused); n != 2 {
					t.Errorf("%s = %v after the hourly retry, want 2", hostsdk.MetricEventsRefused, n)
				}
				checkDelivered(t, f, j, bad, good)
			})
		})
	}
}

// TestEventDeliverySplitSurvivesACrash: the host dies in the middle of a
// split — after enqueuing the first part, or after enqueuing both parts
// and before removing the batch — and starts again on the same journal:
// nothing is lost and the log holds each event once.
func TestEventDeliverySplitSurvivesACrash(t *testing.T) {
	// Published batch IDs are content addresses without a dot; the parts
	// of a split append ".0" and ".1".
	points := []struct {
		name    string
		crashAt func(op, id string) bool
	}{
		{"between the parts", func(op, id string) bool {
			return op == "enqueue" && strings.Count(id, ".") == 1 && strings.HasSuffix(id, ".1")
		}},
		{"before removing the batch", func(op, id string) bool {
			return op == "ack" && !strings.Contains(id, ".")
		}},
	}
	for _, dj := range durableJournals {
		for _, p := range points {
			t.Run(dj.name+"/"+p.name, func(t *testing.T) {
				open := dj.storage(t)
				synctest.Test(t, func(t *testing.T) {
					j := open(t)
					t.Cleanup(func() { j.Close() })
					f := newSplitFleet(t, j, p.crashAt)
					bad := aip.NewID(aip.PrefixEvent)
					f.storeConflicting(t, bad)
					original, good := f.publishBatch(t, hostsdk.MaxEventsPerBatch, 57, bad)
					synctest.Wait()
					if !f.probe.didCrash() {
						t.Fatalf("the host never reached the crash point (outbox retries %+v)", f.probe.retries)
					}
					if err := f.h.Stop(context.Background()); err != nil {
						t.Logf("stop after the crash: %v", err)
					}
					if err := j.Close(); err != nil {
						t.Fatal(err)
					}

					j = open(t)
					t.Cleanup(func() { j.Close() })
					if n := pendingIn(t, j); n < 2 {
						t.Fatalf("after the crash the outbox holds %d batches, want the batch and its parts", n)
					}
					f.start(t, j, nil)
					// The batch's claim by the dead process expires after
					// 30s; it is refused and split again then.
					time.Sleep(2 * time.Minute)
					synctest.Wait()
					checkDelivered(t, f, j, bad, good)
					refusedBatch(t, f.probe, original)
				})
			})
		}
	}
}

// TestEventDeliveryDoesNotSplitOnOtherFailures: a batch that fails for a
// reason that is not about its events — the dispatcher busy or
// unreachable (transient), or refusing the sender (not authorized) — is
// retried whole: every delivery carries all its events and the outbox
// never holds a part.
func TestEventDeliveryDoesNotSplitOnOtherFailures(t *testing.T) {
	for _, code := range []string{aip.CodeEventCapacity, aip.CodeEventUnavailable, hostsdk.CodeEventTransport, aip.CodeEventNotAuthorized} {
		t.Run(code, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newEventFleet(t, true)
				if code == hostsdk.CodeEventTransport {
					f.in.SetDown(true)
				} else {
					f.in.FailNext(3, code)
				}
				f.conn.publish(t, "ticket.created", "ticket.updated", "ticket.closed")
				synctest.Wait()
				if n := f.j.pending(t); n != 1 || len(f.in.Deliveries()) != 1 {
					t.Errorf("the outbox holds %d batches after %d failed deliveries, want the one published after one", n, len(f.in.Deliveries()))
				}
				time.Sleep(30 * time.Second)
				f.in.SetDown(false)
				time.Sleep(5 * time.Minute)
				synctest.Wait()
				dl := f.in.Deliveries()
				if len(dl) < 2 {
					t.Fatalf("%d deliveries, want the failed ones and a stored one", len(dl))
				}
				for i, d := range dl {
					if d.Status != 0 && len(d.Events) != 3 {
						t.Errorf("delivery %d carries %d events, want the whole batch of 3", i, len(d.Events))
					}
				}
				if ev := f.in.Events(); len(ev) != 3 || f.j.pending(t) != 0 {
					t.Errorf("stored %d events with %d batches left, want 3 and none", len(ev), f.j.pending(t))
				}
				if n := f.metric(t, hostsdk.MetricEventsRefused); n != 0 {
					t.Errorf("%s = %v, want 0", hostsdk.MetricEventsRefused, n)
				}
			})
		})
	}
}
