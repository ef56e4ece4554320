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
)

// TestLifecycleSpanContinuesTheHostsTrace: a lifecycle request carrying a
// W3C traceparent header is served in a span whose parent is the host's.
func TestLifecycleSpanContinuesTheHostsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	e := newEnv(t, newMemBackend, func(c *controlplane.Config) { c.TracerProvider = tp })

	ctx, hostSpan := tp.Tracer("host").Start(context.Background(), "hostsdk.control.heartbeat")
	req := httptest.NewRequest(http.MethodPost, controlplane.PathControl, bytes.NewReader([]byte(`{}`)))
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	e.svc.Handler().ServeHTTP(httptest.NewRecorder(), req)
	hostSpan.End()

	for _, s := range rec.Ended() {
		if s.Name() != "controlplane.lifecycle" {
			continue
		}
		if got, want := s.Parent().SpanID(), hostSpan.SpanContext().SpanID(); got != want || s.SpanContext().TraceID() != hostSpan.SpanContext().TraceID() {
			t.Fatalf("controlplane.lifecycle has parent %s in trace %s, want the host's span %s in trace %s",
				got, s.SpanContext().TraceID(), want, hostSpan.SpanContext().TraceID())
		}
		return
	}
	t.Fatal("no controlplane.lifecycle span ended")
}
