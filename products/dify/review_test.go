package dify

import (
	"net/http"
	"strings"
	"testing"

	"github.com/aipfleet/aipfleet/hostsdk/hostsdktest"
	"github.com/aipfleet/aipfleet/products/internal/provider"
)

// An invocation Dify refuses with a 4xx whose body is cut short was not
// run: a failed result with the status's code, not outcome_unknown.
func TestInvokeRefusedWithCutBody(t *testing.T) {
	f := newFixture(t, nil)
	f.mock.handle("POST /chat-messages", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", "4096")
		w.WriteHeader(http.StatusTooManyRequests)
		w.Write([]byte(`{"status":429,"code":"too_many_requests","message":"Too many`))
	})
	pe := f.failed(t, hostsdktest.NewAction(AppCapability("support", ""), `{"query":"q","user":"u"}`))
	if pe.Code != provider.CodeRateLimited || !pe.IsRetryable() || strings.Contains(pe.Message, "outcome") {
		t.Errorf("cut 429: %s %q", pe.Code, pe.Message)
	}
}
