package controlplane_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/registry/registrytest"
)

// TestLifecycleSpanContinuesTheHostsTrace: a lifecycle request carrying a
// W3C traceparent header is served in a span whose parent is the host's
// when the request verified as the replica's. One that did not — a body
// that is no signed request, a request signed by another key — is a root
// span of its own: anyone who can reach the control plane could
// otherwise hang failed spans under any trace whose ID they know, as
// 70173f8 made the host's listener refuse.
func TestLifecycleSpanContinuesTheHostsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.TracerProvider = tp })
	h := e.provision("a1")

	forged := h.request(h.heartbeat(0, 0, true))
	for _, c := range []struct {
		name      string
		body      []byte
		continues bool
	}{
		{"not a signed request", []byte(`{}`), false},
		{"signed by another key", sealWith(t, registrytest.Key("intruder"), forged), false},
		{"the replica's registration", h.seal(h.request(h.registration())), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec.Reset()
			ctx, hostSpan := tp.Tracer("host").Start(context.Background(), "hostsdk.control.heartbeat")
			req := httptest.NewRequest(http.MethodPost, controlplane.PathControl, bytes.NewReader(c.body))
			propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
			rw := httptest.NewRecorder()
			e.svc.Handler().ServeHTTP(rw, req)
			hostSpan.End()
			if (rw.Code == http.StatusOK) != c.continues {
				t.Fatalf("answered %d: %s", rw.Code, rw.Body)
			}
			for _, s := range rec.Ended() {
				if s.Name() != "controlplane.lifecycle" {
					continue
				}
				joined := s.SpanContext().TraceID() == hostSpan.SpanContext().TraceID()
				if c.continues && (!joined || s.Parent().SpanID() != hostSpan.SpanContext().SpanID()) {
					t.Fatalf("controlplane.lifecycle has parent %s in trace %s, want the host's span %s in trace %s",
						s.Parent().SpanID(), s.SpanContext().TraceID(), hostSpan.SpanContext().SpanID(), hostSpan.SpanContext().TraceID())
				}
				if !c.continues && (joined || s.Parent().IsValid()) {
					t.Fatalf("the span of a request that did not verify joined the trace its header names (parent %v)", s.Parent())
				}
				if !s.StartTime().Before(s.EndTime()) {
					t.Errorf("the span starts at %v and ends at %v", s.StartTime(), s.EndTime())
				}
				return
			}
			t.Fatal("no controlplane.lifecycle span ended")
		})
	}
}
