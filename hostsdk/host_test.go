package hostsdk_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
)

func TestActionRoundTrip(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, target := f.start(t, conn)
	ctx := ctxT(t)

	a := action(capEcho, `{"message":"hello"}`)
	resp, err := f.d.Act(ctx, target, a)
	if err != nil {
		t.Fatal(err)
	}
	res, err := resp.Result()
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != aip.ResultCompleted || res.ActionID != a.ID {
		t.Fatalf("result %+v", res)
	}
	var out map[string]any
	json.Unmarshal(res.Output, &out)
	if diff := cmp.Diff(map[string]any{"message": "hello", "runs": 1.0, "tenant": "tenant-test"}, out); diff != "" {
		t.Errorf("output (-want +got):\n%s", diff)
	}
	if res.Receipt == nil || res.Receipt.ID == "" || res.Receipt.Hash == "" {
		t.Errorf("result has no receipt: %+v", res.Receipt)
	}
	if !h.Ready() {
		t.Error("host is not ready")
	}
}

func TestHealthReadyManifestJWKSMetrics(t *testing.T) {
	f := newFleet(t)
	h, _ := f.start(t, newTestConnector())
	base := "http://" + h.Addr().String()
	get := func(path string) (int, []byte) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, body := get("/health"); code != 200 || string(body) != `{"protocol":"AIP","service":"aip-connector-host","status":"ok","version":"1.0"}` {
		t.Errorf("/health %d %s", code, body)
	}
	code, body := get("/ready")
	var ready hostsdk.ReadyDocument
	if err := json.Unmarshal(body, &ready); err != nil || code != 200 || ready.Status != "ready" || !ready.LeaseValid || !ready.Runtime.Ready || !ready.Connector.Ready {
		t.Errorf("/ready %d %s", code, body)
	}
	code, body = get("/aip/v1/manifest")
	var m aip.Manifest
	if err := json.Unmarshal(body, &m); err != nil || code != 200 {
		t.Fatalf("/aip/v1/manifest %d %s", code, body)
	}
	if d, _ := aip.ManifestDigest(&m); d != h.ManifestDigest() || m.Agent.TrustDomain != f.cfg.TrustDomain || m.Agent.DID != "" {
		t.Errorf("manifest digest %s, want %s; agent %+v", d, h.ManifestDigest(), m.Agent)
	}
	code, body = get("/.well-known/jwks.json")
	if code != 200 || !json.Valid(body) || !containsString(string(body), h.DID()) {
		t.Errorf("/.well-known/jwks.json %d %s", code, body)
	}
	code, body = get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	var names []string
	runtime := map[string]bool{}
	for _, n := range metricNames(string(body)) {
		if strings.HasPrefix(n, "aip_") {
			names = append(names, n)
		} else {
			runtime[n] = true
		}
	}
	// The Go runtime's and the process's own (memory, descriptors, CPU).
	for _, n := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_open_fds"} {
		if !runtime[n] {
			t.Errorf("/metrics lacks %s", n)
		}
	}
	want := []string{ // sorted, as metricNames returns them
		"aip_connector_host_abandoned_calls", "aip_connector_host_actions_expired_total", "aip_connector_host_degraded",
		"aip_connector_host_event_delivery_failures_total",
		"aip_connector_host_events_delivered_total", "aip_connector_host_events_pending", "aip_connector_host_events_refused_total",
		"aip_connector_host_heartbeat_failures_total", "aip_connector_host_in_flight", "aip_connector_host_ingress_reads_waiting",
		"aip_connector_host_journal_actions_pruned_total", "aip_connector_host_lease_recoveries_total", "aip_connector_host_lease_recovery_attempts_total",
		"aip_connector_host_ready", "aip_connector_host_register_wait_seconds", "aip_connector_host_rejected_total",
		"aip_connector_host_requests_total", "aip_connector_host_storage_ready",
	}
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("metric names (-want +got):\n%s", diff)
	}
}

func TestBootstrapStepErrors(t *testing.T) {
	t.Run("discover", func(t *testing.T) {
		f := newFleet(t)
		conn := newTestConnector()
		conn.manifestErr = errors.New("provider down")
		err := startErr(t, f, conn)
		var de *hostsdk.DiscoverError
		if !errors.As(err, &de) {
			t.Fatalf("error %v, want *DiscoverError", err)
		}
	})
	t.Run("bind_manifest", func(t *testing.T) {
		f := newFleet(t)
		f.cfg.TrustDomain = "other.invalid"
		conn := &trustDomainConnector{newTestConnector()}
		err := startErr(t, f, conn)
		var be *hostsdk.BindManifestError
		if !errors.As(err, &be) {
			t.Fatalf("error %v, want *BindManifestError", err)
		}
	})
	t.Run("probe", func(t *testing.T) {
		f := newFleet(t)
		conn := newTestConnector()
		conn.setHealth(errUnhealthy)
		err := startErr(t, f, conn)
		var pe *hostsdk.ProbeError
		if !errors.As(err, &pe) || !errors.Is(err, errUnhealthy) {
			t.Fatalf("error %v, want *ProbeError wrapping the health error", err)
		}
		if got := ops(f.cp); len(got) != 0 {
			t.Errorf("control plane saw %v before a healthy probe", got)
		}
	})
	t.Run("register", func(t *testing.T) {
		f := newFleet(t)
		f.cp.FailNext(1, 3) // FaultReject
		err := startErr(t, f, newTestConnector())
		var re *hostsdk.RegisterError
		var rej *hostsdk.ControlRejectedError
		if !errors.As(err, &re) || !errors.As(err, &rej) {
			t.Fatalf("error %v, want *RegisterError wrapping *ControlRejectedError", err)
		}
		if se, ok := err.(hostsdk.StepError); !ok || se.Step() != hostsdk.StepRegister {
			t.Errorf("step of %v is not register", err)
		}
	})
}

type trustDomainConnector struct{ *testConnector }

func (c *trustDomainConnector) Manifest(ctx context.Context, tenant hostsdk.TenantContext) (*aip.Manifest, error) {
	m, err := c.testConnector.Manifest(ctx, tenant)
	if err == nil {
		m.Agent.TrustDomain = "elsewhere.invalid"
	}
	return m, err
}

func startErr(t *testing.T, f *fleet, conn hostsdk.Connector) error {
	t.Helper()
	h, err := hostsdk.New(f.cfg, conn)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start(ctxT(t))
	if err == nil {
		t.Fatal("Start succeeded")
	}
	if err := h.Stop(ctxT(t)); err != nil {
		t.Errorf("Stop after a failed Start: %v", err)
	}
	return err
}

// TestReadyDetailOnlyForLocalPeers: a failing probe's error text (it names
// product URLs, hosts, files) is in /ready for a peer on this machine; a
// remote peer reads that the connector is not ready, and a fixed text.
func TestReadyDetailOnlyForLocalPeers(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, _ := f.start(t, conn)
	conn.setHealth(fmt.Errorf("GET https://chatwoot.internal.example:3000/api: %w", errUnhealthy))
	for remote, wantDetail := range map[string]bool{
		"127.0.0.1:40000":   true,
		"[::1]:40000":       true,
		"203.0.113.7:40000": false,
		"10.0.0.9:40000":    false,
	} {
		rec := h.ServeReadyFrom(remote)
		var doc hostsdk.ReadyDocument
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != http.StatusServiceUnavailable || doc.Connector.Ready {
			t.Fatalf("from %s: HTTP %d %s", remote, rec.Code, rec.Body)
		}
		shown := strings.Contains(rec.Body.String(), "chatwoot.internal.example")
		if shown != wantDetail {
			t.Errorf("from %s: detail shown = %v, want %v: %s", remote, shown, wantDetail, rec.Body)
		}
		if !strings.HasPrefix(doc.Connector.Detail, "connector is not ready") {
			t.Errorf("from %s: connector detail %q", remote, doc.Connector.Detail)
		}
	}
}
