package controlplane

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/registry/memregistry"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestUnsignedSigningFailure checks the one unsigned answer: HTTP 500
// connector_control.response_signing when the service cannot sign.
func TestUnsignedSigningFailure(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(registrytest.Key("control-plane"), reg, Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc.seal = func(*aip.SigningKey, string, any) ([]byte, error) { return nil, errors.New("hardware key unavailable") }
	rec := httptest.NewRecorder()
	svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodPost, PathControl, strings.NewReader(`{}`)))
	var body struct {
		Error struct {
			Code      string `json:"code"`
			Category  string `json:"category"`
			Retryable bool   `json:"retryable"`
		} `json:"error"`
	}
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &body) != nil ||
		body.Error.Code != aip.CodeControlResponseSigning || body.Error.Category != "permanent" || body.Error.Retryable {
		t.Fatalf("HTTP %d %s", rec.Code, rec.Body)
	}
}
