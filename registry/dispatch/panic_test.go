package dispatch_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/memregistry"
)

// panickingCatalog fails every catalog read with a panic.
type panickingCatalog struct{ registry.Catalog }

func (panickingCatalog) QueryCapabilities(context.Context, registry.CatalogQuery, registry.ReadContext) (registry.CapabilityPage, error) {
	panic("catalog exploded: secret-detail")
}

// TestHandlerPanicIsA500WithoutDetails: a panic in a handler answers 500
// dispatch.internal, whose message holds none of the panic, logs the panic
// with its stack, counts the request, and leaves the server serving. The
// connection was cut with no answer, and the panic went to the server's
// error log only.
func TestHandlerPanicIsA500WithoutDetails(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	must(t, err)
	key, _ := aip.GenerateSigningKey()
	var logs hostsdktest.LogBuffer
	d, err := dispatch.New(dispatch.Config{SigningKey: key, PrincipalID: gatewayID, Logger: slog.New(slog.NewTextHandler(&logs, nil))},
		dispatch.Deps{Resolver: reg, Catalog: panickingCatalog{reg}, Tokens: &countingVerifier{}})
	must(t, err)
	defer d.Close()
	srv := httptest.NewUnstartedServer(d.Handler())
	srv.Config.ErrorLog = slog.NewLogLogger(slog.DiscardHandler, slog.LevelError)
	srv.Start()
	defer srv.Close()
	for range 2 { // the second one proves the server still serves
		req, _ := http.NewRequest(http.MethodGet, srv.URL+dispatch.PathCapabilities, nil)
		req.Header.Set("Authorization", "Bearer good-acme")
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatalf("a panicking handler gave no answer: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || errorCode(t, body) != dispatch.CodeInternal || strings.Contains(string(body), "secret-detail") {
			t.Fatalf("answer %d %s", resp.StatusCode, body)
		}
	}
	if l := logs.String(); !strings.Contains(l, "handler panicked") || !strings.Contains(l, "secret-detail") || !strings.Contains(l, "panic_test.go") {
		t.Fatalf("the panic is not logged with its stack: %s", l)
	}
	resp, err := srv.Client().Get(srv.URL + dispatch.PathMetrics)
	must(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `route="/aip/v1/capabilities",status="500"} 2`) {
		t.Fatalf("the 500s are not counted: %s", metrics)
	}
}
