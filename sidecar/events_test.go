package sidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

const eventsGateway = "service:aipfleet-dispatch"

// eventsWorld is a sidecar whose --exec child is this test binary, next to
// the real dispatcher (package dispatch, in process) with its event log
// (memregistry), which the replica delivers its events to.
type eventsWorld struct {
	r   *replica
	reg *memregistry.Registry
}

func startEventsWorld(t *testing.T, edit func(*Config)) *eventsWorld {
	t.Helper()
	ctx := context.Background()
	key, _ := aip.GenerateSigningKey()
	iss, _ := aip.GenerateSigningKey()
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	verifier, err := tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: []tenanttoken.Issuer{{Name: "sidecar-test", DIDs: []string{iss.DID()}}}})
	if err != nil {
		t.Fatal(err)
	}
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: eventsGateway},
		dispatch.Deps{Resolver: reg, Catalog: reg, Tokens: verifier, Events: reg, Records: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(d.Handler())
	t.Cleanup(func() { srv.Close(); d.Close() })

	cp := hostsdktest.NewControlPlane(t, hostsdktest.ControlPlaneConfig{LeaseTTL: 5 * time.Minute})
	fake := hostsdktest.NewDispatcher(t, hostsdktest.DispatcherConfig{PrincipalID: eventsGateway, TrustDomain: hostsdktest.TrustDomain, Key: key})
	sock := socketPath(t)
	r := startReplicaIn(t, cp, fake, func(c *Config) {
		c.Local = LocalConfig{Socket: sock}
		c.Exec = []string{os.Args[0], "-test.run=^$"}
		c.ExecEnv = []string{envChild + "=1"}
		c.ExecStderr = os.Stderr
		c.Host.EventEndpoint = srv.URL + aip.EventsPath
		if edit != nil {
			edit(c)
		}
	})

	// The registry admits what the replica runs.
	cfg := r.host
	m, digest, err := hostsdk.BindManifest(fakeManifest(""), hostsdktest.TrustDomain)
	if err != nil {
		t.Fatal(err)
	}
	if digest != r.s.Host().ManifestDigest() {
		t.Fatalf("manifest digest %s, the replica's %s", digest, r.s.Host().ManifestDigest())
	}
	mustDo(t, reg.PutConnectorType(ctx, registry.ConnectorType{ID: cfg.ConnectorTypeID, Name: "echo", Owner: "owner-test", Enabled: true}))
	mustDo(t, reg.AdmitVersion(ctx, registrytest.Version(cfg.VersionID, cfg.ConnectorTypeID, "1.0.0", "owner-test", registry.VersionActive, *m)))
	mustDo(t, reg.PutInstance(ctx, registry.ConnectorInstance{ID: cfg.InstanceID, ConnectorTypeID: cfg.ConnectorTypeID, VersionID: cfg.VersionID,
		TenantID: cfg.TenantID, ConfigRevision: 1, SecretProviderRef: "secret://test", Status: registry.InstanceEnabled}))
	state, ok := cp.Replica(cfg.ReplicaID)
	if !ok {
		t.Fatal("the replica did not register")
	}
	p := r.s.Host().Principal()
	mustDo(t, reg.PutReplica(ctx, registry.ConnectorReplica{
		ID: cfg.ReplicaID, InstanceID: cfg.InstanceID, VersionID: cfg.VersionID, Endpoint: cfg.PublicEndpoint,
		PeerPrincipalID: p.ID, PeerPrincipalKind: p.Kind, PeerDID: r.s.Host().DID(), TrustDomain: hostsdktest.TrustDomain,
		TransportProfile: aip.NativeHTTPProfile, Topology: aip.DefaultTopology(), Status: aip.ReplicaReady,
		LeaseExpiresAt: time.Now().Add(time.Hour), Capacity: 4, HealthRevision: state.HealthRevision,
	}))
	return &eventsWorld{r: r, reg: reg}
}

func mustDo(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// publish has the child POST body to the events route times times and
// returns the answers it saw.
func (w *eventsWorld) publish(t *testing.T, body any, times int, token string) []eventsReply {
	t.Helper()
	raw, _ := json.Marshal(body)
	in, _ := json.Marshal(map[string]any{"body": json.RawMessage(raw), "times": times, "token": token})
	res, err := must(w.r.d.Act(ctxT(t), w.r.target, act("echo.publish", string(in)))).Result()
	if err != nil || res.Status != aip.ResultCompleted {
		t.Fatalf("echo.publish: %+v %v", res, err)
	}
	var out struct {
		Answers []eventsReply `json:"answers"`
	}
	if err := json.Unmarshal(res.Output, &out); err != nil || len(out.Answers) != times {
		t.Fatalf("echo.publish output %s: %v", res.Output, err)
	}
	return out.Answers
}

// logged returns the tenant's event log.
func (w *eventsWorld) logged(t *testing.T) []registry.StoredEvent {
	t.Helper()
	page, err := w.reg.Events(context.Background(), w.r.host.TenantID, 0, 100)
	mustDo(t, err)
	return page.Events
}

// metric returns the value of a sample line "name value" on /metrics.
func (w *eventsWorld) metric(t *testing.T, sample string) string {
	t.Helper()
	resp, err := noKeepAlive.Get("http://" + w.r.s.Host().Addr().String() + hostsdk.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	return ""
}

// waitFor polls cond (a condition on another process or goroutine).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx := ctxT(t)
	for !cond() {
		if ctx.Err() != nil {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling another process's state
	}
}

func testEvent(kind, data string) aip.Event {
	return aip.Event{ID: aip.NewID(aip.PrefixEvent), Kind: kind, OccurredAt: aip.At(time.Now().Add(-time.Minute)), Data: json.RawMessage(data)}
}

func decodeReply[T any](t *testing.T, a eventsReply) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(a.Body, &v); err != nil {
		t.Fatalf("HTTP %d body %s: %v", a.Status, a.Body, err)
	}
	return v
}

// TestEventsFromChildReachTheDispatchersLog: the child publishes through
// the sidecar; the dispatcher's event log holds the event, stamped with the
// replica. A retry of the same batch after a lost answer (the first
// delivered already) is answered 200 with the same batch ID, delivered
// again, and collapses into the one stored event.
func TestEventsFromChildReachTheDispatchersLog(t *testing.T) {
	w := startEventsWorld(t, nil)
	schemas := compileSchemas(t)
	e := testEvent("echo.changed", `{"n":1}`)
	body := map[string]any{"channel_id": fakeChannel, "events": []aip.Event{e}}
	raw, _ := json.Marshal(body)
	validate(t, schemas, "events-request", raw)

	first := w.publish(t, body, 1, "")[0]
	if first.Status != http.StatusOK {
		t.Fatalf("publish: HTTP %d %s", first.Status, first.Body)
	}
	validate(t, schemas, "events-response", first.Body)
	ans := decodeReply[eventsAnswer](t, first)
	if ans.BatchID == "" || ans.Events != 1 {
		t.Fatalf("answer %s", first.Body)
	}
	waitFor(t, "the event in the dispatcher's log", func() bool { return len(w.logged(t)) > 0 })
	waitFor(t, "the host to count the batch delivered", func() bool { return w.metric(t, hostsdk.MetricEventsDelivered) == "1" })
	log := w.logged(t)
	if len(log) != 1 || log[0].Event.ID != e.ID || log[0].ChannelID != fakeChannel || log[0].ReplicaID != w.r.host.ReplicaID ||
		log[0].Event.Kind != "echo.changed" || !log[0].Event.OccurredAt.Equal(e.OccurredAt.Time) {
		t.Fatalf("log %+v", log)
	}

	// The answer was lost: the child sends the same batch again.
	again := w.publish(t, body, 1, "")[0]
	if again.Status != http.StatusOK || decodeReply[eventsAnswer](t, again).BatchID != ans.BatchID {
		t.Fatalf("retry: HTTP %d %s, want 200 with batch %s", again.Status, again.Body, ans.BatchID)
	}
	waitFor(t, "the retried batch to be delivered", func() bool { return w.metric(t, hostsdk.MetricEventsDelivered) == "2" })
	if log := w.logged(t); len(log) != 1 || log[0].Event.ID != e.ID {
		t.Fatalf("after the retry the log holds %d events: %+v", len(log), log)
	}
	if got := w.metric(t, MetricEventBatchesPublished); got != "2" {
		t.Errorf("%s = %q, want 2", MetricEventBatchesPublished, got)
	}
}

// TestEventsRefusals: what Publish refuses is a 400 saying what to fix; a
// wrong or missing token a 401 with WWW-Authenticate: Bearer. Nothing
// reaches the outbox.
func TestEventsRefusals(t *testing.T) {
	w := startEventsWorld(t, nil)
	schemas := compileSchemas(t)
	good := testEvent("echo.changed", `{}`)
	noTime := good
	noTime.OccurredAt = aip.Timestamp{}
	noID := good
	noID.ID = ""
	for _, tc := range []struct {
		name   string
		body   any
		token  string
		status int
		want   string
	}{
		{"undeclared channel", map[string]any{"channel_id": "echo.elsewhere", "events": []aip.Event{good}}, "", 400, `channel "echo.elsewhere" is not declared`},
		{"bad event ID", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{{ID: "evt_1", Kind: "k", OccurredAt: good.OccurredAt}}}, "", 400, `event ID "evt_1"`},
		{"no events", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{}}, "", 400, "a batch holds 1 to 100 events, got 0"},
		{"no event ID", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{noID}}, "", 400, "event 0 has no id"},
		{"no occurred_at", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{noTime}}, "", 400, "has no occurred_at"},
		{"unknown member", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{good}, "tenant": "x"}, "", 400, `unknown member "tenant"`},
		{"case variant member", map[string]any{"Channel_ID": fakeChannel, "events": []aip.Event{good}}, "", 400, `"Channel_ID" is not "channel_id"`},
		{"wrong token", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{good}}, "not-the-token", 401, "Authorization: Bearer"},
		{"no token", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{good}}, "-", 401, "Authorization: Bearer"},
		{"the connector's token", map[string]any{"channel_id": fakeChannel, "events": []aip.Event{good}}, w.r.s.local.cfg.Token, 401, "Authorization: Bearer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := w.publish(t, tc.body, 1, tc.token)[0]
			if a.Status != tc.status {
				t.Fatalf("HTTP %d %s, want %d", a.Status, a.Body, tc.status)
			}
			validate(t, schemas, "error-response", a.Body)
			pe := decodeReply[localError](t, a).Error
			if !strings.Contains(pe.Message, tc.want) {
				t.Errorf("message %q does not say %q", pe.Message, tc.want)
			}
			if tc.status == 401 && !strings.HasPrefix(a.WWWAuthenticate, "Bearer") {
				t.Errorf("WWW-Authenticate %q", a.WWWAuthenticate)
			}
		})
	}
	if got := w.metric(t, MetricEventBatchesRefused+`{reason="invalid"}`); got != "7" {
		t.Errorf("refused invalid = %q, want 7", got)
	}
	if got := w.metric(t, MetricEventBatchesRefused+`{reason="unauthorized"}`); got != "3" {
		t.Errorf("refused unauthorized = %q, want 3", got)
	}
	if got := w.metric(t, MetricEventBatchesPublished); got != "0" {
		t.Errorf("published = %q, want 0", got)
	}
}

// TestEventsWhileDraining: once the replica drains, the route answers 503
// with Retry-After (the child keeps the batch and retries).
func TestEventsWhileDraining(t *testing.T) {
	w := startEventsWorld(t, func(c *Config) { c.Host.DrainTimeout = time.Minute })
	ctx := ctxT(t)
	// An action in flight holds the drain open while the child publishes.
	slow := act("echo.slow", `{"delay_ms":60000}`)
	done := make(chan *hostsdktest.Response, 1)
	go func() { done <- must(w.r.d.Act(ctx, w.r.target, slow)) }()
	awaitRunning(t, w.r, slow.ID, "echo.slow")
	w.r.cancel() // SIGTERM
	waitFor(t, "the drain", func() bool { return !w.r.s.Host().Ready() })

	e := testEvent("echo.changed", `{}`)
	raw, _ := json.Marshal(map[string]any{"channel_id": fakeChannel, "events": []aip.Event{e}})
	a := postEvents(t, w.r, raw, w.r.s.local.events.token)
	if a.Status != http.StatusServiceUnavailable || a.RetryAfter == "" {
		t.Fatalf("while draining: HTTP %d Retry-After %q %s", a.Status, a.RetryAfter, a.Body)
	}
	if pe := decodeReply[localError](t, a).Error; pe.Code != CodeEventsUnavailable || !pe.IsRetryable() {
		t.Errorf("error %+v", pe)
	}
	if got := w.metric(t, MetricEventBatchesRefused+`{reason="unavailable"}`); got != "1" {
		t.Errorf("refused unavailable = %q, want 1", got)
	}
	must(w.r.d.Cancel(ctx, w.r.target, slow.ID, "echo.slow", "test over"))
	<-done
}

// postEvents posts raw to the replica's events route from this process (a
// loopback peer) with token.
func postEvents(t *testing.T, r *replica, raw []byte, token string) eventsReply {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.s.Host().Addr().String()+PathEvents, strings.NewReader(string(raw)))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := noKeepAlive.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return eventsReply{Status: resp.StatusCode, Body: body, RetryAfter: resp.Header.Get("Retry-After"), WWWAuthenticate: resp.Header.Get("WWW-Authenticate")}
}

// TestEventsHandlerRefusesOtherMachines: a peer that is not on this machine
// is refused before its token is looked at, and nothing is published.
func TestEventsHandlerRefusesOtherMachines(t *testing.T) {
	published := 0
	pub := func(context.Context, string, ...aip.Event) (string, error) { published++; return "batch", nil }
	m := newEventsMetrics()
	h := eventsHandler("tok", pub, m, slog.New(slog.DiscardHandler))
	raw, _ := json.Marshal(map[string]any{"channel_id": fakeChannel, "events": []aip.Event{testEvent("k", `{}`)}})
	for _, tc := range []struct {
		remote, local string
		status        int
	}{
		{"192.0.2.7:40000", "192.0.2.1:8081", http.StatusForbidden},
		{"[2001:db8::7]:40000", "[2001:db8::1]:8081", http.StatusForbidden},
		{"127.0.0.1:40000", "127.0.0.1:8081", http.StatusOK},
		{"[::1]:40000", "[::1]:8081", http.StatusOK},
		// A process here dialling the replica's own non-loopback address.
		{"192.0.2.1:40000", "192.0.2.1:8081", http.StatusOK},
	} {
		req := httptest.NewRequest(http.MethodPost, PathEvents, strings.NewReader(string(raw)))
		req.RemoteAddr = tc.remote
		req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, addr(tc.local)))
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != tc.status {
			t.Errorf("from %s to %s: HTTP %d %s, want %d", tc.remote, tc.local, rec.Code, rec.Body, tc.status)
		}
	}
	if published != 3 {
		t.Errorf("published %d batches, want 3", published)
	}
}

// TestEventsHandlerRefusesTwoAuthorizationHeaders: a request with two
// Authorization headers is refused 401 whichever holds the token (only the
// first was compared, so the token followed by another header was taken
// while a proxy in front could have read the other), and nothing is
// published.
func TestEventsHandlerRefusesTwoAuthorizationHeaders(t *testing.T) {
	published := 0
	pub := func(context.Context, string, ...aip.Event) (string, error) { published++; return "batch", nil }
	m := newEventsMetrics()
	h := eventsHandler("tok", pub, m, slog.New(slog.DiscardHandler))
	raw, _ := json.Marshal(map[string]any{"channel_id": fakeChannel, "events": []aip.Event{testEvent("k", `{}`)}})
	for name, auth := range map[string][]string{
		"token then other": {"Bearer tok", "Bearer other"},
		"other then token": {"Bearer other", "Bearer tok"},
		"the token twice":  {"Bearer tok", "Bearer tok"},
	} {
		req := httptest.NewRequest(http.MethodPost, PathEvents, strings.NewReader(string(raw)))
		req.RemoteAddr = "127.0.0.1:40000"
		for _, a := range auth {
			req.Header.Add("Authorization", a)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		var le localError
		if rec.Code != http.StatusUnauthorized || json.Unmarshal(rec.Body.Bytes(), &le) != nil || le.Error == nil ||
			le.Error.Code != CodeUnauthorized || !strings.Contains(le.Error.Message, "2 Authorization headers; send exactly one") {
			t.Errorf("%s: HTTP %d %s; want 401 %s saying there are 2 Authorization headers", name, rec.Code, rec.Body, CodeUnauthorized)
		}
		if c := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(c, "Bearer") {
			t.Errorf("%s: WWW-Authenticate %q", name, c)
		}
	}
	if published != 0 {
		t.Errorf("published %d batches, want 0", published)
	}
	var refused dto.Metric
	if err := m.refused.WithLabelValues("unauthorized").Write(&refused); err != nil || refused.GetCounter().GetValue() != 3 {
		t.Errorf("refused unauthorized = %v (%v), want 3", refused.GetCounter().GetValue(), err)
	}
}

type addr string

func (a addr) Network() string { return "tcp" }
func (a addr) String() string  { return string(a) }

// TestEventsRouteNeedsAToken: without a token (attached, no
// EventsToken) the route is not mounted; with EventsToken it is, and the
// child is told nothing (it is attached).
func TestEventsRouteNeedsAToken(t *testing.T) {
	r, _ := localReplica(t, nil)
	raw, _ := json.Marshal(map[string]any{"channel_id": fakeChannel, "events": []aip.Event{testEvent("k", `{}`)}})
	if a := postEvents(t, r, raw, "anything"); a.Status != http.StatusNotFound {
		t.Errorf("without a token: HTTP %d %s, want 404", a.Status, a.Body)
	}
	r2, _ := localReplica(t, func(c *Config) { c.EventsToken = "events-s3cret" })
	if a := postEvents(t, r2, raw, "events-s3cret"); a.Status != http.StatusOK {
		t.Errorf("with --events-token-file: HTTP %d %s, want 200", a.Status, a.Body)
	}
}

func TestEventsConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"same token both ways", Config{Local: LocalConfig{Socket: "/tmp/x.sock", Token: "same"}, EventsToken: "same"}, "is the local connector's token"},
		{"token with a space", Config{Local: LocalConfig{Socket: "/tmp/x.sock"}, EventsToken: "a b"}, "Config.EventsToken) has byte 0x20"},
		{"MCP", Config{MCP: MCPConfig{URL: "http://127.0.0.1:9/mcp"}, EventsToken: "t"}, "MCP servers do not publish AIP events"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := newLocalSide(tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestEventsWithPortZero: a replica binding port 0 cannot tell its --exec
// child the events URL before the listener binds: the sidecar still starts
// (as before the events route existed), without the route and without the
// child's events variables.
func TestEventsWithPortZero(t *testing.T) {
	s, err := newLocalSide(Config{Local: LocalConfig{Socket: "/tmp/x.sock"}, Exec: []string{"x"}, Host: hostsdk.Config{Bind: "127.0.0.1:0"}})
	if err != nil {
		t.Fatalf("--exec with port 0: %v", err)
	}
	if s.local.events != nil {
		t.Error("the events route is served though the child cannot know its URL")
	}
	for _, kv := range s.sup.cfg.Env {
		if strings.HasPrefix(kv, EnvEventsURL+"=") || strings.HasPrefix(kv, EnvEventsToken+"=") {
			t.Errorf("the child's environment has %s", kv)
		}
	}
}

func TestEventsURLFor(t *testing.T) {
	for listen, want := range map[string]string{
		"0.0.0.0:8081":   "http://127.0.0.1:8081" + PathEvents,
		":8081":          "http://127.0.0.1:8081" + PathEvents,
		"[::]:8081":      "http://[::1]:8081" + PathEvents,
		"127.0.0.1:9000": "http://127.0.0.1:9000" + PathEvents,
		"10.1.2.3:8081":  "http://10.1.2.3:8081" + PathEvents,
	} {
		if got, err := eventsURLFor(listen); err != nil || got != want {
			t.Errorf("eventsURLFor(%q) = %q, %v; want %q", listen, got, err, want)
		}
	}
}

// blockingBody is a request body whose first Read says so on started and
// then waits for release before giving body (a connector still sending).
type blockingBody struct {
	started chan<- struct{}
	release <-chan struct{}
	body    io.Reader
	once    bool
}

func (b *blockingBody) Read(p []byte) (int, error) {
	if !b.once {
		b.once = true
		b.started <- struct{}{}
		<-b.release
	}
	return b.body.Read(p)
}

// readMark is a body that records that it was read.
type readMark struct {
	io.Reader
	read atomic.Bool
}

func (r *readMark) Read(p []byte) (int, error) {
	r.read.Store(true)
	return r.Reader.Read(p)
}

// TestEventsRequestsAreBoundedAtOnce: at most MaxConcurrentEventRequests
// requests are read or stored at once (each may hold a 25 MiB body); one
// beyond is answered 503 sidecar.events_unavailable with Retry-After,
// counted as busy, before its body is read or its batch published. Nothing
// limited them: a local connector flooding the route could take the
// replica's memory.
func TestEventsRequestsAreBoundedAtOnce(t *testing.T) {
	entered, releasePublish := make(chan struct{}), make(chan struct{})
	reading, releaseBodies := make(chan struct{}), make(chan struct{})
	var releasedPublish, releasedBodies sync.Once
	// A failing test still lets the requests in progress finish.
	defer releasedBodies.Do(func() { close(releaseBodies) })
	defer releasedPublish.Do(func() { close(releasePublish) })
	var published atomic.Int32
	pub := func(context.Context, string, ...aip.Event) (string, error) {
		select {
		case entered <- struct{}{}:
		case <-releasePublish:
		}
		<-releasePublish
		published.Add(1)
		return "batch", nil
	}
	m := newEventsMetrics()
	h := eventsHandler("tok", pub, m, slog.New(slog.DiscardHandler))
	raw, _ := json.Marshal(map[string]any{"channel_id": fakeChannel, "events": []aip.Event{testEvent("k", `{}`)}})
	serve := func(body io.Reader) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, PathEvents, body)
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("Authorization", "Bearer tok")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	// Half the requests in progress are still being read, half are being
	// stored.
	held := make(chan *httptest.ResponseRecorder, MaxConcurrentEventRequests+1)
	for i := range MaxConcurrentEventRequests {
		if i%2 == 0 {
			go func() {
				held <- serve(&blockingBody{started: reading, release: releaseBodies, body: bytes.NewReader(raw)})
			}()
			<-reading
		} else {
			go func() { held <- serve(bytes.NewReader(raw)) }()
			<-entered
		}
	}
	extra := &readMark{Reader: bytes.NewReader(raw)}
	go func() { held <- serve(extra) }()
	var rec *httptest.ResponseRecorder
	select {
	case rec = <-held:
	case <-entered:
		t.Fatalf("request %d, beyond the %d in progress, was read and is being stored", MaxConcurrentEventRequests+1, MaxConcurrentEventRequests)
	}
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("request %d: HTTP %d Retry-After %q %s; want 503 with Retry-After", MaxConcurrentEventRequests+1, rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	var le localError
	if err := json.Unmarshal(rec.Body.Bytes(), &le); err != nil || le.Error == nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	if pe := le.Error; pe.Code != CodeEventsUnavailable || !pe.IsRetryable() || !strings.Contains(pe.Message, fmt.Sprintf("at most %d at once", MaxConcurrentEventRequests)) {
		t.Errorf("error %+v", pe)
	}
	if extra.read.Load() {
		t.Error("the refused request's body was read")
	}
	var busy dto.Metric
	if err := m.refused.WithLabelValues("busy").Write(&busy); err != nil || busy.GetCounter().GetValue() != 1 {
		t.Errorf("refused busy = %v (%v), want 1", busy.GetCounter().GetValue(), err)
	}

	// Once the requests in progress are answered, the next is taken.
	releasedBodies.Do(func() { close(releaseBodies) })
	for range MaxConcurrentEventRequests / 2 {
		<-entered // the requests that were being read are stored now
	}
	releasedPublish.Do(func() { close(releasePublish) })
	for range MaxConcurrentEventRequests {
		if rec := <-held; rec.Code != http.StatusOK {
			t.Errorf("a request in progress: HTTP %d %s", rec.Code, rec.Body)
		}
	}
	if rec := serve(bytes.NewReader(raw)); rec.Code != http.StatusOK {
		t.Errorf("after the requests in progress: HTTP %d %s", rec.Code, rec.Body)
	}
	if got := published.Load(); got != MaxConcurrentEventRequests+1 {
		t.Errorf("published %d batches, want %d", got, MaxConcurrentEventRequests+1)
	}
}
