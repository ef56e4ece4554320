package hostsdk_test

import (
	"encoding/json"
	"errors"
	"fmt"
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

// TestReadyDetailSetting: --ready-detail none (behind a proxy on the
// replica's machine that adds no forwarding header, every caller is an
// unproxied loopback peer) keeps the probes' error texts from every peer,
// a loopback one included; local, the default, shows them to unproxied
// loopback peers. There was no way to turn them off.
func TestReadyDetailSetting(t *testing.T) {
	for _, c := range []struct {
		args       []string
		env        string // AIP_CONNECTOR_HOST_READY_DETAIL
		wantDetail bool
	}{
		{wantDetail: true},
		{args: []string{"--ready-detail", "local"}, wantDetail: true},
		{args: []string{"--ready-detail", "none"}},
		{env: "none"},
		{args: []string{"--ready-detail", "local"}, env: "none", wantDetail: true}, // the flag wins
	} {
		loaded, err := hostsdk.LoadConfig(c.args, func(k string) string {
			if k == "AIP_CONNECTOR_HOST_READY_DETAIL" {
				return c.env
			}
			return ""
		})
		if err != nil {
			t.Fatalf("%v %q: %v", c.args, c.env, err)
		}
		f := newFleet(t)
		f.cfg.HideLocalReadyDetail = loaded.HideLocalReadyDetail
		conn := newTestConnector()
		h, _ := f.start(t, conn)
		conn.setHealth(fmt.Errorf("GET https://chatwoot.internal.example:3000/api: %w", errUnhealthy))
		rec := h.ServeReadyFrom("127.0.0.1:40000")
		var doc hostsdk.ReadyDocument
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || rec.Code != http.StatusServiceUnavailable || doc.Connector.Ready {
			t.Fatalf("%v %q: HTTP %d %s", c.args, c.env, rec.Code, rec.Body)
		}
		if shown := strings.Contains(rec.Body.String(), "chatwoot.internal.example"); shown != c.wantDetail {
			t.Errorf("%v %q: an unproxied loopback peer reads the detail: %v, want %v: %s", c.args, c.env, shown, c.wantDetail, rec.Body)
		}
		if !strings.HasPrefix(doc.Connector.Detail, "connector is not ready") {
			t.Errorf("%v %q: connector detail %q", c.args, c.env, doc.Connector.Detail)
		}
	}
}

// TestReadyDetailSettingRefusesOtherValues: a value other than local or
// none is refused, naming the setting and the two values, as a setting
// to fix (exit status 2).
func TestReadyDetailSettingRefusesOtherValues(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"--ready-detail", "loopback"},
			want: `--ready-detail (AIP_CONNECTOR_HOST_READY_DETAIL, Config.HideLocalReadyDetail) is "loopback"; want local or none`},
		{env: "None",
			want: `AIP_CONNECTOR_HOST_READY_DETAIL (--ready-detail, Config.HideLocalReadyDetail) is "None"; want local or none`},
	} {
		_, err := hostsdk.LoadConfig(c.args, func(k string) string {
			if k == "AIP_CONNECTOR_HOST_READY_DETAIL" {
				return c.env
			}
			return ""
		})
		if err == nil || err.Error() != c.want || !errors.Is(err, hostsdk.ErrSetting) {
			t.Errorf("%v %q: %v; want %q, matching hostsdk.ErrSetting", c.args, c.env, err, c.want)
		}
	}
}
