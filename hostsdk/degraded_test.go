package hostsdk_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
)

// readyFrom reads /ready as a peer at remote sees it.
func readyFrom(t *testing.T, h *hostsdk.Host, remote string) (int, hostsdk.ReadyDocument, string) {
	t.Helper()
	rec := h.ServeReadyFrom(remote)
	var doc hostsdk.ReadyDocument
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("from %s: HTTP %d %s: %v", remote, rec.Code, rec.Body, err)
	}
	return rec.Code, doc, rec.Body.String()
}

// A CheckHealth that returns Degraded (here wrapped with %w) keeps the
// replica ready; /ready's connector detail says it is degraded, with what
// the connector said to a local peer and a fixed text to a remote one, and
// the host logs the change once, not at every probe.
func TestDegradedConnectorStaysReady(t *testing.T) {
	f := newFleet(t)
	var logs hostsdktest.LogBuffer
	f.cfg.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	conn := newTestConnector()
	h, _ := f.start(t, conn)
	conn.setHealth(fmt.Errorf("1 of 2 crews: %w", hostsdk.Degraded(errors.New("crew b: GET https://b.internal.example/kickoff: 401"))))
	for range 2 {
		code, doc, body := readyFrom(t, h, "127.0.0.1:40000")
		if code != http.StatusOK || doc.Status != "ready" || !doc.Connector.Ready {
			t.Fatalf("a degraded connector: HTTP %d %s", code, body)
		}
		if want := "connector is ready but degraded: crew b: GET https://b.internal.example/kickoff: 401"; doc.Connector.Detail != want {
			t.Errorf("local connector detail %q, want %q", doc.Connector.Detail, want)
		}
	}
	code, doc, body := readyFrom(t, h, "203.0.113.7:40000")
	if code != http.StatusOK || doc.Connector.Detail != "connector is ready but degraded" || strings.Contains(body, "internal.example") {
		t.Errorf("remote: HTTP %d %s", code, body)
	}
	if !h.Ready() {
		t.Error("Ready() = false for a degraded connector")
	}
	if v := gaugeValue(t, h, hostsdk.MetricDegraded); v != 1 {
		t.Errorf("%s = %v for a degraded connector, want 1 (no other component learns of it)", hostsdk.MetricDegraded, v)
	}
	if n := strings.Count(logs.String(), "connector is ready but degraded"); n != 1 {
		t.Errorf("degraded logged %d times, want once: %s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "b.internal.example") {
		t.Errorf("the log does not say what is degraded: %s", logs.String())
	}

	conn.setHealth(nil)
	if _, doc, _ := readyFrom(t, h, "127.0.0.1:40000"); doc.Connector.Detail != "connector is ready" {
		t.Errorf("healthy again: connector detail %q", doc.Connector.Detail)
	}
	if !strings.Contains(logs.String(), "connector is no longer degraded") {
		t.Errorf("recovery from degraded not logged: %s", logs.String())
	}
	if v := gaugeValue(t, h, hostsdk.MetricDegraded); v != 0 {
		t.Errorf("%s = %v once healthy again, want 0", hostsdk.MetricDegraded, v)
	}
}

// A degraded detail joined with a failure is a failure: only a Degraded
// returned alone (or wrapped by one %w) keeps the replica ready.
func TestDegradedJoinedWithAFailureIsNotReady(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, _ := f.start(t, conn)
	conn.setHealth(errors.Join(errUnhealthy, hostsdk.Degraded(errors.New("crew b"))))
	code, doc, body := readyFrom(t, h, "127.0.0.1:40000")
	if code != http.StatusServiceUnavailable || doc.Connector.Ready || !strings.HasPrefix(doc.Connector.Detail, "connector is not ready") {
		t.Errorf("joined with a failure: HTTP %d %s", code, body)
	}
	if v := gaugeValue(t, h, hostsdk.MetricDegraded); v != 0 {
		t.Errorf("%s = %v for a connector that is not ready, want 0 (degraded says a ready connector serves in part)", hostsdk.MetricDegraded, v)
	}
	if hostsdk.Degraded(nil) != nil {
		t.Error("Degraded(nil) is not nil")
	}
}
