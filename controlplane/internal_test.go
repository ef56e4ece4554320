package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

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

// TestLogAnswerLevels checks what logAnswer logs at each level, and that a
// renewed lease costs no allocation when debug logging is off (heartbeats
// are the hot path).
func TestLogAnswerLevels(t *testing.T) {
	reg, err := memregistry.New(memregistry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	level := new(slog.LevelVar)
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
	svc, err := New(registrytest.Key("control-plane"), reg, Config{Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	renewed := &answer{status: http.StatusOK, requestID: "req_1", op: aip.OpHeartbeat, replicaID: "crepl_a",
		outcome: aip.ControlOutcome{Status: aip.OutcomeLease, Lease: &aip.Lease{Sequence: 7, ExpiresAt: aip.At(time.Now().Add(time.Minute))}}}
	rejected := &answer{status: http.StatusForbidden, requestID: "req_2", op: aip.OpRegister, replicaID: "crepl_a", reason: "stale",
		outcome: aip.ControlOutcome{Status: aip.OutcomeRejected, Message: "stale sequence"}}

	level.Set(slog.LevelInfo)
	svc.logAnswer(renewed)
	if buf.Len() != 0 {
		t.Fatalf("a renewal was logged at info: %s", buf.String())
	}
	if n := testing.AllocsPerRun(100, func() { svc.logAnswer(renewed) }); n != 0 {
		t.Errorf("a renewal with debug off allocates %v times, want 0", n)
	}
	svc.logAnswer(rejected)
	for _, want := range []string{`"msg":"lifecycle request rejected"`, `"operation":"register"`, `"status":403`, `"reason":"stale"`, `"message":"stale sequence"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("rejection log lacks %s: %s", want, buf.String())
		}
	}

	buf.Reset()
	level.Set(slog.LevelDebug)
	svc.logAnswer(renewed)
	for _, want := range []string{`"level":"DEBUG"`, `"msg":"lease renewed"`, `"operation":"heartbeat"`, `"replica_id":"crepl_a"`, `"request_id":"req_1"`, `"sequence":7`, `"replayed":false`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("renewal log lacks %s: %s", want, buf.String())
		}
	}
}
