package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/controlplane"
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

It connects to the registry with the data pool only (no catalog-admin
rights): the database URL should name the restricted lifecycle role, and
the schema must already be installed at this build's version (run
aipfleet registry migrate first). Secrets come only from files, which must
not be readable by group or others.

Every answer is signed with the signing key; hosts pin its did:key, which
the startup log line prints (create one with aipfleet keygen). The service
speaks HTTPS with --tls-cert-file and --tls-key-file; plain HTTP is allowed
only on a loopback address and only with --allow-insecure-loopback-http.
SIGTERM or Ctrl-C stops it gracefully: requests in flight are answered,
then the lease maintenance stops and the database pool closes.`,
		examples: []string{
			"aipfleet control-plane --database-url-file /run/secrets/lifecycle-db-url --signing-key-file /run/secrets/control.key --bind 0.0.0.0:8090 --tls-cert-file tls.crt --tls-key-file tls.key",
			"aipfleet control-plane --database-url-file db.url --signing-key-file control.key --allow-insecure-loopback-http",
			"AIP_CONTROL_DATABASE_URL_FILE=db.url AIP_CONTROL_SIGNING_KEY_FILE=control.key AIP_CONTROL_LEASE_TTL=15s aipfleet control-plane --allow-insecure-loopback-http",
		},
		run: runControlPlane,
	}
}

// controlPlaneFlags are the parsed flags of control-plane.
type controlPlaneFlags struct {
	databaseURLFile string
	signingKeyFile  string
	bind            string
	leaseTTL        time.Duration
	tlsCertFile     string
	tlsKeyFile      string
	insecure        bool
	maxConns        int
	acquireTimeout  time.Duration
	maxBatch        int
	batchWorkers    int
	logLevel        string
}

func parseControlPlaneFlags(c *command, e *env, args []string) (*controlPlaneFlags, error) {
	fs := newFlagSet(c, e.getenv)
	f := &controlPlaneFlags{}
	dbFile := fs.String("database-url-file", "", "file holding the PostgreSQL URL of the data pool (the lifecycle role); mode 0600, at most 16 KiB")
	keyFile := fs.String("signing-key-file", "", "the service's Ed25519 signing key file (64-hex seed or JWK, mode 0600)")
	bind := fs.String("bind", "127.0.0.1:8090", "address to listen on")
	ttl := fs.Duration("lease-ttl", registry.DefaultLeaseTTL, "lease granted by register, heartbeat and drain (1s to 300s)")
	cert := fs.String("tls-cert-file", "", "TLS certificate chain (PEM); with --tls-key-file the service speaks HTTPS")
	key := fs.String("tls-key-file", "", "TLS private key (PEM, mode 0600)")
	insecure := fs.Bool("allow-insecure-loopback-http", false, "allow plain HTTP, only on a loopback --bind (development)")
	maxConns := fs.Int("max-connections", 16, "maximum database connections of the data pool (1 to 256)")
	acquire := fs.Duration("acquire-timeout", 5*time.Second, "wait for a pooled database connection (1ms to 60s)")
	maxBatch := fs.Int("max-batch", controlplane.DefaultMaxBatch, "most lifecycle requests coalesced into one transaction (1 disables coalescing)")
	workers := fs.Int("batch-workers", controlplane.DefaultBatchWorkers, "lifecycle transactions in flight at once")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	if err := fs.parse(args, e.stdout); err != nil {
		return nil, err
	}
	if len(fs.args()) > 0 {
		return nil, usagef("control-plane: unexpected argument %q; every setting is a flag", fs.args()[0])
	}
	*f = controlPlaneFlags{
		databaseURLFile: *dbFile, signingKeyFile: *keyFile, bind: *bind, leaseTTL: *ttl,
		tlsCertFile: *cert, tlsKeyFile: *key, insecure: *insecure, maxConns: *maxConns, acquireTimeout: *acquire,
		maxBatch: *maxBatch, batchWorkers: *workers, logLevel: *logLevel,
	}
	switch {
	case f.databaseURLFile == "":
		return nil, usagef("control-plane: --database-url-file is required (a file holding the lifecycle role's PostgreSQL URL)")
	case f.signingKeyFile == "":
		return nil, usagef("control-plane: --signing-key-file is required (create one with `aipfleet keygen --out FILE`)")
	case f.maxConns < 1 || f.maxConns > 256:
		return nil, usagef("control-plane: --max-connections %d is outside 1..256", f.maxConns)
	case f.acquireTimeout < time.Millisecond || f.acquireTimeout > pgregistry.MaxAcquireTimeout:
		return nil, usagef("control-plane: --acquire-timeout %s is outside 1ms..%s", f.acquireTimeout, pgregistry.MaxAcquireTimeout)
	case (f.tlsCertFile == "") != (f.tlsKeyFile == ""):
		return nil, usagef("control-plane: --tls-cert-file and --tls-key-file go together")
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
	if err := f.serviceConfig().Validate(); err != nil {
		return nil, controlPlaneConfigError(err)
	}
	if _, err := parseLogLevel(f.logLevel); err != nil {
		return nil, usagef("control-plane: %v", err)
	}
	if err := checkServerTransport("control-plane", f.bind, f.tlsCertFile != "", f.insecure); err != nil {
		return nil, err
	}
	return f, nil
}

// serviceConfig is the controlplane.Config the flags ask for (the logger
// is added by runControlPlane).
func (f *controlPlaneFlags) serviceConfig() controlplane.Config {
	return controlplane.Config{LeaseTTL: f.leaseTTL, MaxBatch: f.maxBatch, BatchWorkers: f.batchWorkers}
}

// controlPlaneConfigFlags maps the controlplane.Config fields the flags set
// to their flags.
var controlPlaneConfigFlags = map[string]string{"LeaseTTL": "--lease-ttl", "MaxBatch": "--max-batch", "BatchWorkers": "--batch-workers"}

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

// checkServerTransport is the transport rule of the server commands
// (control-plane, dispatch): TLS (hasCert) anywhere; plain HTTP only on a
// loopback bind and only with --allow-insecure-loopback-http (insecure).
func checkServerTransport(command, bind string, hasCert, insecure bool) error {
	loopback, err := isLoopbackBind(bind)
	if err != nil {
		return usagef("%s: --bind %q: %v", command, bind, err)
	}
	switch {
	case hasCert:
		return nil
	case !loopback:
		return usagef("%s: --bind %s is not a loopback address, so TLS is required: set --tls-cert-file and --tls-key-file", command, bind)
	case !insecure:
		return usagef("%s: no TLS certificate given; plain HTTP needs --allow-insecure-loopback-http (development on loopback only), or set --tls-cert-file and --tls-key-file", command)
	}
	return nil
}

// isLoopbackBind reports whether a host:port names only loopback
// addresses (localhost, 127.0.0.0/8, ::1).
func isLoopbackBind(bind string) (bool, error) {
	host, _, err := net.SplitHostPort(bind)
	if err != nil {
		return false, err
	}
	if strings.EqualFold(host, "localhost") {
		return true, nil
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback(), nil
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
	level, _ := parseLogLevel(f.logLevel)
	logger := slog.New(slog.NewJSONHandler(e.stderr, &slog.HandlerOptions{Level: level}))

	dbURL, key, tlsConfig, err := serverFiles{f.databaseURLFile, f.signingKeyFile, f.tlsCertFile, f.tlsKeyFile}.load()
	if err != nil {
		return err
	}

	reg, err := pgregistry.OpenDataPlane(ctx, pgregistry.Config{
		DataURL: dbURL, DataMaxConns: int32(f.maxConns), AcquireTimeout: f.acquireTimeout,
	})
	if err != nil {
		return fmt.Errorf("open the registry (data pool): %w", err)
	}
	defer reg.Close()
	cfg := f.serviceConfig()
	cfg.Logger = logger
	svc, err := controlplane.New(key, reg, cfg)
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", f.bind)
	if err != nil {
		return fmt.Errorf("--bind %s: %w", f.bind, err)
	}
	scheme := "https"
	if tlsConfig == nil {
		scheme = "http"
	}
	stats := reg.PoolStats()
	logger.Info("starting", "component", controlplane.Component, "status", "starting",
		"did", svc.DID(), "bind", ln.Addr().String(), "scheme", scheme,
		"schema_version", pgregistry.SchemaVersion, "lease_ttl", f.leaseTTL.String(),
		"control_pool_max", stats.ControlMax, "data_pool_max", stats.DataMax)
	// Serve returns after ctx ends (SIGTERM, Ctrl-C): the HTTP server drains,
	// then the batch workers and maintenance stop; the deferred Close then
	// closes the database pool.
	err = svc.Serve(ctx, ln, controlplane.ServeConfig{TLSConfig: tlsConfig})
	logger.Info("stopped", "component", controlplane.Component, "error", errString(err))
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
