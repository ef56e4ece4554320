package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/aipfleet/aipfleet/controlplane"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

func controlPlaneCommand() *command {
	return &command{
		name:      "control-plane",
		summary:   "run the signed connector lifecycle service on PostgreSQL",
		usage:     "--database-url-file FILE --signing-key-file FILE [flags]",
		envPrefix: "AIP_CONTROL_",
		long: `Runs the lifecycle service hosts register with: POST /aip/v1/connector-control
(signed register, heartbeat, drain and offline), GET /health, /ready,
/metrics, /.well-known/jwks.json and the read-only fleet views
/aip/v1/fleet/status and /aip/v1/fleet/replicas.

The fleet views (every replica's endpoint, identity and load) are for
operators: requests need an operator token (Authorization: Bearer) of an
issuer in --operator-issuer, for --operator-audience; mint one with
aipfleet token --operator. Without --operator-issuer they answer 401,
unless --open-fleet-views opens them to every peer (a trusted network
only). The detail of a failing /ready check goes to operators and to peers
on this machine; others see which checks fail.

It connects to the registry with the data pool only (no catalog-admin
rights): the database URL should name the restricted lifecycle role, and
the schema must already be installed at this build's version (run
aipfleet registry migrate first). Secrets come only from files, which must
not be readable by group or others.

Every answer is signed with the signing key; hosts pin its did:key, which
the startup log line prints (create one with aipfleet keygen). The service
speaks HTTPS with --tls-cert-file and --tls-key-file; plain HTTP is allowed
only on a loopback address and only with --allow-insecure-loopback-http.
Traces are exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
SIGTERM or Ctrl-C stops it gracefully: requests in flight are answered,
then the lease maintenance stops and the database pool closes.`,
		examples: []string{
			"aipfleet control-plane --database-url-file /run/secrets/lifecycle-db-url --signing-key-file /run/secrets/control.key --bind 0.0.0.0:8090 --tls-cert-file tls.crt --tls-key-file tls.key",
			"aipfleet control-plane --database-url-file db.url --signing-key-file control.key --allow-insecure-loopback-http",
			"aipfleet control-plane --database-url-file db.url --signing-key-file control.key --operator-issuer ops=did:key:z6Mk... --allow-insecure-loopback-http",
			"AIP_CONTROL_DATABASE_URL_FILE=db.url AIP_CONTROL_SIGNING_KEY_FILE=control.key AIP_CONTROL_LEASE_TTL=15s aipfleet control-plane --allow-insecure-loopback-http",
		},
		run: runControlPlane,
	}
}

// controlPlaneFlags are the parsed flags of control-plane.
type controlPlaneFlags struct {
	server         *serverFlags
	leaseTTL       time.Duration
	maxBatch       int
	batchWorkers   int
	eventRetention time.Duration
	// prunedIDsRetention is --pruned-event-ids-retention (0: for ever).
	prunedIDsRetention time.Duration
	// operators verifies operator tokens (nil: none trusted);
	// openFleetViews admits every peer instead.
	operators      *tenanttoken.Verifier
	openFleetViews bool
}

func parseControlPlaneFlags(c *command, e *env, args []string) (*controlPlaneFlags, error) {
	fs := e.flags(c)
	f := &controlPlaneFlags{server: bindServerFlags(fs, serverFlagText{
		bind: "127.0.0.1:8090", maxConns: 16,
		databaseURL:    "file holding the PostgreSQL URL of the data pool (the lifecycle role); mode 0600, at most 16 KiB",
		databaseRole:   "the lifecycle role's",
		signingKey:     "the service's Ed25519 signing key file (64-hex seed or JWK, mode 0600)",
		speaksHTTPSFor: "the service",
	})}
	fs.DurationVar(&f.leaseTTL, "lease-ttl", registry.DefaultLeaseTTL, "lease granted by register, heartbeat and drain (1s to 300s)")
	fs.IntVar(&f.maxBatch, "max-batch", controlplane.DefaultMaxBatch, "most lifecycle requests coalesced into one transaction (1 disables coalescing)")
	fs.IntVar(&f.batchWorkers, "batch-workers", controlplane.DefaultBatchWorkers, "lifecycle transactions in flight at once")
	fs.DurationVar(&f.eventRetention, "event-retention", controlplane.DefaultEventRetention, "how long the fleet's event log keeps an event; older ones are deleted (at least 1h; 0 keeps every event)")
	fs.DurationVar(&f.prunedIDsRetention, "pruned-event-ids-retention", controlplane.DefaultPrunedEventIDsRetention,
		"how long after its receipt the event log remembers a deleted event's ID, so that a host delivering it again does not have it stored twice; older IDs are forgotten (at least 1h and --event-retention; 0 keeps every ID)")
	operatorIssuers := fs.String("operator-issuer", "", "trusted issuers of operator tokens for the fleet views: NAME=DID[,NAME=DID...]")
	operatorAudience := fs.String("operator-audience", tenanttoken.OperatorAudience, "audience operator tokens must name")
	fs.BoolVar(&f.openFleetViews, "open-fleet-views", false, "serve the fleet views to every peer, without a token (a trusted network only)")
	if err := fs.parse(args, e.stdout); err != nil {
		return nil, err
	}
	if len(fs.args()) > 0 {
		return nil, usagef("control-plane: unexpected argument %q; every setting is a flag", fs.args()[0])
	}
	if *operatorAudience == "" {
		// The verifier would take "" for its default.
		return nil, usagef("control-plane: --operator-audience is empty (leave it out for %s)", tenanttoken.OperatorAudience)
	}
	if *operatorIssuers != "" {
		if f.openFleetViews {
			return nil, usagef("control-plane: give either --operator-issuer (fleet views for operator tokens) or --open-fleet-views (for everyone), not both")
		}
		issuers, err := parseIssuers(*operatorIssuers)
		if err != nil {
			return nil, usagef("control-plane: --operator-issuer: %v", err)
		}
		if f.operators, err = tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: issuers, Operator: true, Audience: *operatorAudience}); err != nil {
			return nil, usagef("control-plane: --operator-issuer: %v", err)
		}
	}
	// In controlplane.Config 0 means the default; on the command line the
	// default is the flag left out, so 0 is refused.
	for _, z := range []struct {
		flag string
		zero bool
	}{{"--lease-ttl", f.leaseTTL == 0}, {"--max-batch", f.maxBatch == 0}, {"--batch-workers", f.batchWorkers == 0}} {
		if z.zero {
			return nil, usagef("control-plane: %s 0 is not allowed; leave the flag out for its default", z.flag)
		}
	}
	if f.eventRetention != 0 && f.eventRetention < controlplane.MinEventRetention {
		return nil, usagef("control-plane: --event-retention %s is below %s; give 0 to keep every event", f.eventRetention, controlplane.MinEventRetention)
	}
	if f.prunedIDsRetention != 0 && f.prunedIDsRetention < controlplane.MinEventRetention {
		return nil, usagef("control-plane: --pruned-event-ids-retention %s is below %s; give 0 to keep the IDs of deleted events for ever", f.prunedIDsRetention, controlplane.MinEventRetention)
	}
	if f.prunedIDsRetention != 0 && f.eventRetention != 0 && f.prunedIDsRetention < f.eventRetention {
		return nil, usagef("control-plane: --pruned-event-ids-retention %s is below --event-retention %s: a deleted event's ID would be forgotten with it, and a host delivering it again would have it stored twice; give at least the event retention, or 0 to keep the IDs for ever",
			f.prunedIDsRetention, f.eventRetention)
	}
	if err := f.serviceConfig().Validate(); err != nil {
		return nil, controlPlaneConfigError(err)
	}
	if err := f.server.check("control-plane"); err != nil {
		return nil, err
	}
	return f, nil
}

// serviceConfig is the controlplane.Config the flags ask for (the logger
// is added by runControlPlane).
func (f *controlPlaneFlags) serviceConfig() controlplane.Config {
	retention := f.eventRetention
	if retention == 0 {
		retention = controlplane.KeepEventsForever
	}
	prunedIDs := f.prunedIDsRetention
	if prunedIDs == 0 {
		prunedIDs = controlplane.KeepPrunedEventIDsForever
	}
	cfg := controlplane.Config{LeaseTTL: f.leaseTTL, MaxBatch: f.maxBatch, BatchWorkers: f.batchWorkers, EventRetention: retention,
		PrunedEventIDsRetention: prunedIDs, HideLocalReadyDetail: f.server.hideLocalReadyDetail()}
	switch {
	case f.openFleetViews:
		cfg.OperatorAuth = controlplane.AllowEveryone
	case f.operators != nil:
		cfg.OperatorAuth = operatorAuth(f.operators)
	}
	return cfg
}

// operatorAuth admits the requests that carry an operator token v verifies.
func operatorAuth(v *tenanttoken.Verifier) func(*http.Request) error {
	return func(r *http.Request) error {
		_, err := v.VerifyRequest(r)
		return err
	}
}

// controlPlaneConfigFlags maps the controlplane.Config fields the flags set
// to their flags.
var controlPlaneConfigFlags = map[string]string{"LeaseTTL": "--lease-ttl", "MaxBatch": "--max-batch", "BatchWorkers": "--batch-workers",
	"EventRetention": "--event-retention", "PrunedEventIDsRetention": "--pruned-event-ids-retention"}

// controlPlaneConfigError turns a controlplane.Config.Validate error into a
// usage error naming the flag.
func controlPlaneConfigError(err error) error {
	var ce *controlplane.ConfigError
	if errors.As(err, &ce) {
		if flag, ok := controlPlaneConfigFlags[ce.Field]; ok {
			return usagef("control-plane: %s %s %s", flag, ce.Value, ce.Problem)
		}
	}
	return usagef("control-plane: %v", err)
}

// fleetViews says who may read the fleet views, for the startup log line.
func (f *controlPlaneFlags) fleetViews() string {
	switch {
	case f.openFleetViews:
		return "every peer (--open-fleet-views)"
	case f.operators != nil:
		return "operator tokens (--operator-issuer)"
	}
	return "no one: set --operator-issuer or --open-fleet-views"
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func runControlPlane(ctx context.Context, c *command, e *env, args []string) error {
	f, err := parseControlPlaneFlags(c, e, args)
	if err != nil {
		return err
	}
	srv, err := f.server.open(ctx, e, controlplane.Component, pgregistry.LifecycleService)
	if err != nil {
		return err
	}
	// Deferred: after Serve has stopped the service, the pool closes and
	// the traces are flushed.
	defer srv.close()
	cfg := f.serviceConfig()
	cfg.Logger, cfg.TracerProvider = srv.logger, srv.tracer
	svc, err := controlplane.New(srv.key, srv.reg, cfg)
	if err != nil {
		return err
	}
	stats := srv.reg.PoolStats()
	srv.logger.Info("starting", "component", controlplane.Component, "status", "starting",
		"did", svc.DID(), "bind", srv.ln.Addr().String(), "scheme", srv.scheme(),
		"schema_version", pgregistry.SchemaVersion, "lease_ttl", f.leaseTTL.String(), "fleet_views", f.fleetViews(),
		"control_pool_max", stats.ControlMax, "data_pool_max", stats.DataMax)
	// Serve returns after ctx ends (SIGTERM, Ctrl-C): the HTTP server drains,
	// then the batch workers and maintenance stop; the deferred close then
	// closes the database pool and flushes traces.
	err = svc.Serve(ctx, srv.ln, controlplane.ServeConfig{TLSConfig: srv.tlsConfig})
	logStopped(srv.logger, controlplane.Component, err)
	return err
}

// logStopped logs a server's last line: "stopped", with the error only
// when the stop was not clean.
func logStopped(logger *slog.Logger, component string, err error) {
	if err != nil {
		logger.Info("stopped", "component", component, "error", err.Error())
		return
	}
	logger.Info("stopped", "component", component)
}
