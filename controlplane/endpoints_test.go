package controlplane_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

func httptestRecorder(svc *controlplane.Service, body []byte) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, controlplane.PathControl, bytes.NewReader(body)))
	return rec
}

func httptestGet(svc *controlplane.Service, path string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

// metricValue returns the sum of the samples of metric name whose labels
// contain labels ("" matches every sample).
func metricValue(t *testing.T, e *env, name, labels string) float64 {
	t.Helper()
	status, body := e.get(controlplane.PathMetrics)
	if status != http.StatusOK {
		t.Fatalf("/metrics: HTTP %d", status)
	}
	sum, found := 0.0, false
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		if labels != "" && !strings.Contains(line, labels) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0
	}
	return sum
}

func TestHealthAndJWKS(t *testing.T) {
	e := newEnv(t, newMemBackend)
	status, body := e.get(controlplane.PathHealth)
	var health controlplane.HealthDocument
	if status != http.StatusOK || json.Unmarshal([]byte(body), &health) != nil || health.Status != "ok" || health.DID != controlKey.DID() {
		t.Fatalf("/health: HTTP %d %s", status, body)
	}
	status, body = e.get(controlplane.PathJWKS)
	var set struct {
		Keys []struct {
			Kid string `json:"kid"`
			Kty string `json:"kty"`
			Crv string `json:"crv"`
			X   string `json:"x"`
			D   string `json:"d"`
		} `json:"keys"`
	}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &set) != nil || len(set.Keys) != 1 {
		t.Fatalf("/.well-known/jwks.json: HTTP %d %s", status, body)
	}
	if k := set.Keys[0]; k.Kid != controlKey.DID() || k.Kty != "OKP" || k.Crv != "Ed25519" || k.X == "" || k.D != "" {
		t.Fatalf("JWK %+v: want the public Ed25519 key with kid = the service DID", k)
	}
	if status, _ := e.get("/nope"); status != http.StatusNotFound {
		t.Fatalf("unknown route: HTTP %d", status)
	}
	resp, err := http.Get(e.srv.URL + controlplane.PathControl)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET %s: HTTP %d", controlplane.PathControl, resp.StatusCode)
	}
}

// failingProbe is a store whose readiness checks fail.
type failingProbe struct{ controlplane.Store }

func (failingProbe) Readiness(ctx context.Context) (registry.StoreReadiness, error) {
	return registry.StoreReadiness{
		Backend: "postgres", SchemaVersion: 6, CatalogRevision: 9,
		Pool: &registry.PoolStats{DataSize: 2, DataIdle: 1, DataMax: 32},
		Checks: []registry.ReadinessCheck{
			{Name: "schema", OK: false, Message: "installed schema 6, this build needs 7; run aipfleet registry migrate"},
			{Name: "pool", OK: true},
		},
	}, nil
}

// brokenStore fails every status read and readiness probe.
type brokenStore struct{ controlplane.Store }

func (brokenStore) Status(context.Context) (registry.FleetStatusSummary, error) {
	return registry.FleetStatusSummary{}, errors.Join(registry.ErrStorage, errors.New("connection refused"))
}

func TestReady(t *testing.T) {
	e := newEnv(t, newMemBackend)
	doc := readyDoc(t, e.svc)
	if doc.Status != "ready" || doc.Backend != "memory" || doc.SchemaVersion != 0 || doc.CatalogRevision == 0 || len(doc.Failing) != 0 {
		t.Fatalf("ready document %+v", doc)
	}
	if !contains(checkNames(doc), "store.catalog") || !contains(checkNames(doc), "service") {
		t.Fatalf("checks %v", checkNames(doc))
	}

	for name, store := range map[string]controlplane.Store{
		"failing probe": failingProbe{e.b.Store},
		"broken store":  brokenStore{e.b.Store},
	} {
		t.Run(name, func(t *testing.T) {
			svc, err := controlplane.New(controlKey, store, controlplane.Config{Now: e.clock.Now, DisableMaintenance: true})
			if err != nil {
				t.Fatal(err)
			}
			stop := runService(t, svc)
			doc := readyDoc(t, svc)
			stop()
			if doc.Status != "not_ready" || contains(doc.Failing, "service") {
				t.Fatalf("document %+v", doc)
			}
			switch name {
			case "failing probe":
				if !contains(doc.Failing, "store.schema") || doc.SchemaVersion != 6 || doc.Pool == nil || doc.Pool.DataMax != 32 {
					t.Fatalf("document %+v: want the failing schema check named and the pool reported", doc)
				}
			case "broken store":
				// brokenStore hides Readiness behind the wrapper: the
				// service falls back to a status read.
				if !contains(doc.Failing, "store") {
					t.Fatalf("document %+v: want the store check failing", doc)
				}
			}
		})
	}
}

func checkNames(doc controlplane.ReadyDocument) []string {
	var out []string
	for _, c := range doc.Checks {
		out = append(out, c.Name)
	}
	return out
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, newMemBackend)
	h := e.provision("a1")
	r, _ := h.send(h.registration())
	r.lease(t)
	h.send(h.heartbeat(0, 0, true)) // stale
	h.send(h.heartbeat(1, 0, true))
	if got := metricValue(t, e, controlplane.MetricRequests, `operation="heartbeat",outcome="unhealthy"`); got != 0 {
		t.Errorf("unhealthy heartbeats before any: %v, want the series at 0", got)
	}
	// An unhealthy heartbeat is answered with a lease that ends now; it
	// took the replica offline, and counts as that, twice with its replay.
	unhealthy := h.request(h.heartbeat(2, 0, false))
	body := h.seal(unhealthy)
	for range 2 {
		if r := e.post(body, unhealthy.RequestID); r.status != http.StatusOK || r.outcome.Status != aip.OutcomeLease {
			t.Fatalf("unhealthy heartbeat: HTTP %d %+v", r.status, r.outcome)
		}
	}
	for _, c := range []struct {
		name, labels string
		want         float64
	}{
		{controlplane.MetricRequests, `operation="register",outcome="lease"`, 1},
		{controlplane.MetricRequests, `operation="heartbeat",outcome="rejected"`, 1},
		{controlplane.MetricRequests, `operation="heartbeat",outcome="lease"`, 1},
		{controlplane.MetricRequests, `operation="heartbeat",outcome="unhealthy"`, 2},
		{controlplane.MetricReplays, `operation="heartbeat"`, 1},
		{controlplane.MetricRejections, `reason="sequence"`, 1},
		{controlplane.MetricRequestDuration + "_count", `operation="heartbeat"`, 4},
		{controlplane.MetricBatchCommands + "_count", "", 5},
		{controlplane.MetricRunning, "", 1},
		{"go_goroutines", "", -1},
	} {
		got := metricValue(t, e, c.name, c.labels)
		if c.want < 0 {
			if got <= 0 {
				t.Errorf("%s{%s} missing", c.name, c.labels)
			}
			continue
		}
		if got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// openFleetViews configures a service whose fleet views every peer reads.
func openFleetViews(c *controlplane.Config) { c.OperatorAuth = controlplane.AllowEveryone }

func TestFleetEndpoints(t *testing.T) {
	e := newEnv(t, newMemBackend, openFleetViews)
	var hosts []*host
	for _, n := range []string{"c", "a", "b"} {
		hosts = append(hosts, e.provision(n))
	}
	r, _ := hosts[1].send(hosts[1].registration())
	r.lease(t)

	status, body := e.get(controlplane.PathFleetStatus)
	var st registry.FleetStatusSummary
	if status != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("fleet status: HTTP %d %s", status, body)
	}
	if st.Replicas != 3 || st.ReadyReplicas != 1 || st.OfflineReplicas != 2 || st.ReadyCapacity != 4 {
		t.Fatalf("fleet status %+v", st)
	}

	status, body = e.get(controlplane.PathFleetReplicas + "?limit=2")
	var page controlplane.FleetReplicaPage
	if status != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
		t.Fatalf("fleet replicas: HTTP %d %s", status, body)
	}
	if len(page.Replicas) != 2 || page.Replicas[0].ID != "crepl_a" || page.Replicas[1].ID != "crepl_b" || page.Next != "crepl_b" {
		t.Fatalf("first page %+v", page)
	}
	a := page.Replicas[0]
	if a.Status != aip.ReplicaReady || !a.LeaseValid || a.HealthRevision != 1 || a.Capacity != 4 || a.InstanceID != e.w.Instance.ID || a.Circuit.Open {
		t.Fatalf("replica a %+v", a)
	}
	status, body = e.get(controlplane.PathFleetReplicas + "?limit=2&after=" + page.Next)
	page = controlplane.FleetReplicaPage{}
	if status != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Replicas) != 1 || page.Replicas[0].ID != "crepl_c" || page.Next != "" {
		t.Fatalf("last page: HTTP %d %s", status, body)
	}
	for _, bad := range []string{"0", "1001", "x"} {
		if status, _ := e.get(controlplane.PathFleetReplicas + "?limit=" + bad); status != http.StatusBadRequest {
			t.Errorf("limit=%s: HTTP %d, want 400", bad, status)
		}
	}
}

// TestFleetReplicasOfflineReason: the replicas view says why and when each
// offline replica went offline — its own offline (shutdown), an unhealthy
// heartbeat, lease expiry by maintenance — and says nothing for a replica
// that never registered or is live again.
func TestFleetReplicasOfflineReason(t *testing.T) {
	e := newEnv(t, newMemBackend, openFleetViews)
	hosts := map[string]*host{}
	for _, n := range []string{"shut", "sick", "lost", "new", "back"} {
		hosts[n] = e.provision(n)
		if n != "new" {
			r, _ := hosts[n].send(hosts[n].registration())
			r.lease(t)
		}
	}
	e.clock.Advance(time.Second)
	if r, _ := hosts["shut"].send(hosts["shut"].transition(aip.OpOffline, 1)); r.outcome.Status != aip.OutcomeOffline {
		t.Fatalf("offline: HTTP %d %+v", r.status, r.outcome)
	}
	shutAt := e.clock.Now()
	e.clock.Advance(time.Second)
	hosts["sick"].send(hosts["sick"].heartbeat(1, 0, false))
	hosts["back"].send(hosts["back"].heartbeat(1, 0, false))
	sickAt := e.clock.Now()
	for _, n := range []string{"shut", "sick", "back"} {
		hosts[n].send(hosts[n].heartbeat(2, 0, true)) // refused: offline
	}
	e.clock.Advance(registry.DefaultLeaseTTL)
	if n, err := e.svc.Maintain(e.ctx); err != nil || n != 1 {
		t.Fatalf("Maintain: %d, %v; want crepl_lost expired", n, err)
	}
	lostAt := e.clock.Now()
	hosts["back"].send(hosts["back"].registration()) // live again

	status, body := e.get(controlplane.PathFleetReplicas)
	var page controlplane.FleetReplicaPage
	if status != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
		t.Fatalf("fleet replicas: HTTP %d %s", status, body)
	}
	want := map[string]struct {
		status aip.ReplicaStatus
		reason registry.OfflineReason
		at     time.Time
	}{
		"crepl_shut": {aip.ReplicaOffline, registry.OfflineShutdown, shutAt},
		"crepl_sick": {aip.ReplicaOffline, registry.OfflineUnhealthy, sickAt},
		"crepl_lost": {aip.ReplicaOffline, registry.OfflineLeaseExpired, lostAt},
		"crepl_new":  {aip.ReplicaOffline, "", time.Time{}},
		"crepl_back": {aip.ReplicaReady, "", time.Time{}},
	}
	if len(page.Replicas) != len(want) {
		t.Fatalf("fleet replicas: %s", body)
	}
	for _, r := range page.Replicas {
		w := want[r.ID]
		var at time.Time
		if r.OfflineAt != nil {
			at = r.OfflineAt.Time
		}
		if r.Status != w.status || r.OfflineReason != w.reason || !at.Equal(w.at) || (w.reason == "") != (r.OfflineAt == nil) {
			t.Errorf("%s: %s, offline for %q at %v; want %s, offline for %q at %s", r.ID, r.Status, r.OfflineReason, r.OfflineAt, w.status, w.reason, aip.At(w.at))
		}
	}
	for _, member := range []string{`"offline_reason":"lease_expired","offline_at":"`, `"offline_reason":"shutdown"`, `"offline_reason":"unhealthy"`} {
		if !strings.Contains(body, member) {
			t.Errorf("fleet replicas lack %s: %s", member, body)
		}
	}
}

// A page of the largest size that is followed by more replicas still names
// the next page: aipfleet fleet status pages with limit=1000 and stops at
// the first page without one.
func TestFleetReplicasFullLargestPage(t *testing.T) {
	e := newEnv(t, newMemBackend, openFleetViews)
	n := registry.MaxReplicaPage + 1
	for i := range n {
		e.provision(fmt.Sprintf("%05d", i))
	}
	var seen []string
	after := ""
	for range 3 {
		status, body := e.get(controlplane.PathFleetReplicas + fmt.Sprintf("?limit=%d&after=%s", registry.MaxReplicaPage, after))
		var page controlplane.FleetReplicaPage
		if status != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil {
			t.Fatalf("fleet replicas after %q: HTTP %d", after, status)
		}
		for _, r := range page.Replicas {
			seen = append(seen, r.ID)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if len(seen) != n || seen[0] != "crepl_00000" || seen[n-1] != fmt.Sprintf("crepl_%05d", n-1) {
		t.Fatalf("paging with limit=%d saw %d replicas, want all %d", registry.MaxReplicaPage, len(seen), n)
	}
	// A page that ends exactly at the last replica names no next page.
	status, body := e.get(controlplane.PathFleetReplicas + fmt.Sprintf("?limit=%d&after=crepl_00000", registry.MaxReplicaPage))
	var page controlplane.FleetReplicaPage
	if status != http.StatusOK || json.Unmarshal([]byte(body), &page) != nil || len(page.Replicas) != registry.MaxReplicaPage || page.Next != "" {
		t.Fatalf("last full page: HTTP %d, %d replicas, next %q", status, len(page.Replicas), page.Next)
	}
}

func TestFleetReplicasWithoutLister(t *testing.T) {
	clock := registrytest.NewClock(registrytest.Epoch)
	b := newMemBackend(t, clock)
	svc, err := controlplane.New(controlKey, brokenStore{b.Store}, controlplane.Config{Now: clock.Now, OperatorAuth: controlplane.AllowEveryone})
	if err != nil {
		t.Fatal(err)
	}
	// Unsigned errors carry code, message, category and retryable.
	for _, c := range []struct {
		path      string
		status    int
		code      string
		category  aip.ErrorCategory
		retryable bool
	}{
		{controlplane.PathFleetReplicas, http.StatusNotImplemented, "fleet.unsupported", aip.CategoryPermanent, false},
		{controlplane.PathFleetStatus, http.StatusServiceUnavailable, "fleet.unavailable", aip.CategoryTemporary, true},
		{"/aip/v1/nowhere", http.StatusNotFound, "not_found", aip.CategoryPermanent, false},
	} {
		rec := httptestGet(svc, c.path)
		var body aip.ErrorBody
		dec := json.NewDecoder(rec.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&body); err != nil || rec.Code != c.status {
			t.Fatalf("GET %s: HTTP %d, %v; want %d and an error body", c.path, rec.Code, err, c.status)
		}
		e := body.Error
		if err := e.Validate(); err != nil || e.Code != c.code || e.Category != c.category || e.Retryable == nil || *e.Retryable != c.retryable || e.Message == "" {
			t.Errorf("GET %s: error %+v (%v), want code %s, category %s, retryable %v and a message", c.path, e, err, c.code, c.category, c.retryable)
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	b := newMemBackend(t, registrytest.NewClock(registrytest.Epoch))
	for _, c := range []struct {
		cfg   controlplane.Config
		field string
	}{
		{controlplane.Config{LeaseTTL: 999 * 1e6}, "LeaseTTL"},
		{controlplane.Config{LeaseTTL: 301 * 1e9}, "LeaseTTL"},
		{controlplane.Config{MaxBatch: registry.MaxLifecycleBatch + 1}, "MaxBatch"},
		{controlplane.Config{BatchWorkers: -1}, "BatchWorkers"},
		{controlplane.Config{BatchWorkers: controlplane.MaxBatchWorkers + 1}, "BatchWorkers"},
		{controlplane.Config{StoreTimeout: -1}, "StoreTimeout"},
		{controlplane.Config{ReplicaCacheSize: -1}, "ReplicaCacheSize"},
		{controlplane.Config{MaxReadBytes: 1024}, "MaxReadBytes"},
		{controlplane.Config{ExpiryBatchSize: -1}, "ExpiryBatchSize"},
		{controlplane.Config{ExpiryMaxBatches: -1}, "ExpiryMaxBatches"},
		{controlplane.Config{MaintenanceInterval: 2e9, MaintenanceMaxBackoff: 1e9}, "MaintenanceMaxBackoff"},
	} {
		var ce *controlplane.ConfigError
		if err := c.cfg.Validate(); !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("%+v.Validate() = %v, want a *ConfigError for %s", c.cfg, err, c.field)
		}
		if _, err := controlplane.New(controlKey, b.Store, c.cfg); !errors.As(err, &ce) || ce.Field != c.field {
			t.Errorf("New(%+v) = %v, want a *ConfigError for %s", c.cfg, err, c.field)
		}
	}
	if err := (controlplane.Config{}).Validate(); err != nil {
		t.Errorf("the zero Config (every default) is refused: %v", err)
	}
	if _, err := controlplane.New(nil, b.Store, controlplane.Config{}); err == nil {
		t.Error("New without a key succeeded")
	}
	if _, err := controlplane.New(controlKey, nil, controlplane.Config{}); err == nil {
		t.Error("New without a store succeeded")
	}
}

// TestServeAnswersOnlyOnceRunning starts a service with Serve and asks for
// /ready at once, many times: the first answer is always ready, never "not
// running" (Serve answers HTTP only once Run is running).
func TestServeAnswersOnlyOnceRunning(t *testing.T) {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range 25 {
		clock := registrytest.NewClock(registrytest.Epoch)
		svc, err := controlplane.New(controlKey, newMemBackend(t, clock).Store, controlplane.Config{Now: clock.Now, DisableMaintenance: true})
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- svc.Serve(ctx, ln, controlplane.ServeConfig{}) }()
		status := 0
		resp, err := client.Get("http://" + ln.Addr().String() + controlplane.PathReady)
		if err == nil {
			status = resp.StatusCode
			resp.Body.Close()
		}
		cancel()
		if serveErr := <-done; serveErr != nil {
			t.Fatalf("start %d: Serve: %v", i, serveErr)
		}
		if err != nil || status != http.StatusOK {
			t.Fatalf("start %d: the first /ready answered HTTP %d (%v), want 200", i, status, err)
		}
	}
}
