package hostsdk_test

import (
	"context"
	"net/http"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// headerRecorder records the traceparent header of every request it carries.
type headerRecorder struct {
	next http.RoundTripper
	mu   sync.Mutex
	seen []string
}

func (r *headerRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.seen = append(r.seen, req.Header.Get("traceparent"))
	r.mu.Unlock()
	return r.next.RoundTrip(req)
}

// TestLifecycleRequestsCarryTheTrace: each lifecycle request carries its
// span's W3C trace context, so the control plane's span joins the host's
// trace.
func TestLifecycleRequestsCarryTheTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	f := newFleet(t)
	f.cfg.TracerProvider = tp
	hr := &headerRecorder{next: f.cfg.ControlPlaneTransport}
	if hr.next == nil {
		hr.next = http.DefaultTransport
	}
	f.cfg.ControlPlaneTransport = hr
	f.start(t, newTestConnector())

	var register sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "hostsdk.control.register" {
			register = s
		}
	}
	if register == nil {
		t.Fatal("no hostsdk.control.register span ended")
	}
	hr.mu.Lock()
	defer hr.mu.Unlock()
	if len(hr.seen) == 0 {
		t.Fatal("no lifecycle request was sent")
	}
	carrier := propagation.MapCarrier{"traceparent": hr.seen[0]}
	got := propagationSpan(carrier)
	if got.TraceID() != register.SpanContext().TraceID() || got.SpanID() != register.SpanContext().SpanID() {
		t.Fatalf("the register request's traceparent is %q, want the context of span %s in trace %s",
			hr.seen[0], register.SpanContext().SpanID(), register.SpanContext().TraceID())
	}
}

func propagationSpan(c propagation.MapCarrier) trace.SpanContext {
	return trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), c))
}
