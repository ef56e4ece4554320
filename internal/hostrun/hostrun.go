// Package hostrun holds what the programs that run connector hosts share
// beyond hostsdk itself: opening the journal a host's settings name, the
// OpenTelemetry tracer provider every aipfleet process uses, what
// --print-manifest prints (ManifestReport), and the logger --log-level and
// --log-format choose (NewLogger: JSON by default, or one readable line per
// event).
// cmd/aipfleet (its host command and its servers), cmd/aip-host (the
// product adapters) and cmd/aip-sidecar use it, so a product replica, an
// echo replica and a sidecar accept the same settings and behave alike.
package hostrun

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/hostsdk/journal"
	"github.com/aipfleet/aipfleet/hostsdk/pgruntime"
)

// Run runs conn as a connector host with cfg until ctx ends (the caller's
// signal context: SIGTERM or Ctrl-C starts the drain), then closes what it
// opened. Spans go to TracerProvider(service); the journal is the
// PostgreSQL one JournalOpener opens at bootstrap step 2, else the
// embedded SQLite journal the host opens in --state-dir. hostsdk.New's
// errors (a *hostsdk.ValidateError for a bad configuration) are returned
// as they are.
func Run(ctx context.Context, cfg hostsdk.Config, conn hostsdk.Connector, getenv func(string) string, service string) error {
	tp, shutdownTracing, err := TracerProvider(ctx, getenv, service)
	if err != nil {
		return err
	}
	defer shutdownTracing()
	cfg.TracerProvider = tp
	cfg.OpenJournal = JournalOpener(cfg)
	host, err := hostsdk.New(cfg, conn)
	if err != nil {
		return err
	}
	// Run returns after the drain, the host having closed its journal;
	// the deferred call then flushes traces.
	return host.Run(ctx)
}

// JournalOpener returns the hostsdk.Config.OpenJournal of cfg: it opens
// the PostgreSQL journal named by --database-url-file (replicas may share
// the database: each keeps the namespace of its replica ID). It is nil
// without --database-url-file, so the host opens its embedded SQLite
// journal in --state-dir. The host calls it at bootstrap step 2, once the
// configuration and its files passed step 1, so that a bad setting is
// refused before the database is touched, and closes the journal when it
// stops. A file it cannot use (missing, readable by others, empty, or
// holding a URL that does not parse: pgruntime.ErrInvalidURL) is a
// setting to fix: the error matches hostsdk.ErrSetting (exit status 2);
// a database it cannot reach or open does not (1).
func JournalOpener(cfg hostsdk.Config) func(context.Context) (journal.Journal, error) {
	if cfg.DatabaseURLFile == "" {
		return nil
	}
	path, namespace := cfg.DatabaseURLFile, cfg.ReplicaID
	return func(ctx context.Context) (journal.Journal, error) {
		// The file's checks first, so that its faults are told from the
		// database's; OpenURLFile reads it again.
		raw, err := aip.ReadSecretFile(path, pgruntime.MaxURLFileBytes)
		if err != nil {
			return nil, Settingf("--database-url-file (%s): %w", DatabaseURLFileEnv, err)
		}
		clear(raw)
		j, err := pgruntime.OpenURLFile(ctx, path, pgruntime.Config{Namespace: namespace})
		if errors.Is(err, pgruntime.ErrInvalidURL) {
			return nil, Settingf("--database-url-file (%s): %w", DatabaseURLFileEnv, err)
		}
		if err != nil {
			return nil, fmt.Errorf("--database-url-file (%s): %w", DatabaseURLFileEnv, err)
		}
		return j, nil
	}
}

// DatabaseURLFileEnv is the variable behind --database-url-file.
const DatabaseURLFileEnv = "AIP_CONNECTOR_HOST_DATABASE_URL_FILE"

// TracerProvider exports spans over OTLP/HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set, and is a no-op otherwise. The exporter reads the standard OTEL_*
// variables itself; a value of an OTEL_EXPORTER_OTLP_* variable it would
// misread or drop (a malformed endpoint, an unknown protocol, a timeout
// that is not in milliseconds) is refused first, with an error naming the
// variable and the form it accepts that matches hostsdk.ErrSetting (exit
// status 2). The returned func flushes and stops it.
func TracerProvider(ctx context.Context, getenv func(string) string, service string) (trace.TracerProvider, func(), error) {
	if strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")) == "" && strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) == "" {
		return noop.NewTracerProvider(), func() {}, nil
	}
	if err := checkOTLPSettings(getenv); err != nil {
		return nil, nil, err
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
