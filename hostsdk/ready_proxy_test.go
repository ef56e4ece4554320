package hostsdk_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// TestReadyDetailNotForProxiedLoopback: behind a proxy on the replica's
// machine (an Envoy or Istio sidecar) every caller is a loopback peer, so
// /ready gave anyone the connector's and the journal's error texts, which
// name hosts, files and product URLs. A loopback request that a proxy
// marks as forwarded reads the fixed texts, as the control plane's and
// the dispatcher's /ready do; an unproxied one still reads the detail.
func TestReadyDetailNotForProxiedLoopback(t *testing.T) {
	f := newFleet(t)
	conn := newTestConnector()
	h, _ := f.start(t, conn)
	conn.setHealth(hostsdk.Degraded(errors.New("crew b: GET https://b.internal.example/kickoff: 401")))
	read := func(header ...string) (hostsdk.ReadyDocument, string) {
		t.Helper()
		rec := h.ServeReadyFrom("127.0.0.1:40000", header...)
		var doc hostsdk.ReadyDocument
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &doc) != nil {
			t.Fatalf("/ready with %v: HTTP %d %s", header, rec.Code, rec.Body)
		}
		return doc, rec.Body.String()
	}
	if doc, _ := read(); !strings.Contains(doc.Connector.Detail, "b.internal.example") {
		t.Errorf("an unproxied local peer reads %q, want the connector's detail", doc.Connector.Detail)
	}
	for _, header := range [][]string{
		{"X-Forwarded-For", "203.0.113.7"},
		{"Forwarded", "for=203.0.113.7"},
		{"X-Envoy-External-Address", "203.0.113.7"},
	} {
		if doc, body := read(header...); doc.Connector.Detail != "connector is ready but degraded" || strings.Contains(body, "internal.example") {
			t.Errorf("a loopback peer sending %s reads %s, want the fixed texts", header[0], body)
		}
	}
}
