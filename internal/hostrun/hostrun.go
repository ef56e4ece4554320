// Package hostrun holds what the programs that run connector hosts share
// beyond hostsdk itself: opening the journal a host's settings name, the
// OpenTelemetry tracer provider every aipfleet process uses, and what
// --print-manifest prints (ManifestReport).
// cmd/aipfleet (its host command and its servers), cmd/aip-host (the
// product adapters) and cmd/aip-sidecar use it, so a product replica, an
// echo replica and a sidecar accept the same settings and behave alike.
package hostrun

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
)

// Run runs conn as a connector host with cfg until ctx ends (the caller's
// signal context: SIGTERM or Ctrl-C starts the drain), then closes what it
// opened. Spans go to TracerProvider(service); the journal is OpenJournal's,
// else the embedded SQLite journal the host opens in --state-dir.
// hostsdk.New's errors (a *hostsdk.ValidateError for a bad configuration)
// are returned as they are.
func Run(ctx context.Context, cfg hostsdk.Config, conn hostsdk.Connector, getenv func(string) string, service string) error {
	tp, shutdownTracing, err := TracerProvider(ctx, getenv, service)
	if err != nil {
		return err
	}
	defer shutdownTracing()
	cfg.TracerProvider = tp
	j, closeJournal, err := OpenJournal(ctx, cfg)
	if err != nil {
		return err
	}
	defer closeJournal()
	cfg.Journal = j
	host, err := hostsdk.New(cfg, conn)
	if err != nil {
		return err
	}
	// Run returns after the drain; the deferred calls then close the
	// journal (when it is PostgreSQL; the host closes its own SQLite
	// journal) and flush traces.
	return host.Run(ctx)
}

// OpenJournal opens the PostgreSQL journal named by --database-url-file
// (replicas may share the database: each keeps the namespace of its
// replica ID), or returns nil so the host opens its embedded SQLite
// journal in --state-dir. The returned func closes what was opened.
func OpenJournal(ctx context.Context, cfg hostsdk.Config) (journal.Journal, func(), error) {
	if cfg.DatabaseURLFile == "" {
		return nil, func() {}, nil
	}
	j, err := pgruntime.OpenURLFile(ctx, cfg.DatabaseURLFile, pgruntime.Config{Namespace: cfg.ReplicaID})
	if err != nil {
		return nil, nil, fmt.Errorf("--database-url-file: %w", err)
	}
	return j, func() { j.Close() }, nil
}

// TracerProvider exports spans over OTLP/HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set, and is a no-op otherwise. The exporter reads the standard OTEL_*
// variables itself. The returned func flushes and stops it.
func TracerProvider(ctx context.Context, getenv func(string) string, service string) (trace.TracerProvider, func(), error) {
	if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return noop.NewTracerProvider(), func() {}, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attribute.String("service.name", service)))
	if err != nil {
		res = resource.Default()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tp.Shutdown(sctx)
	}, nil
}
