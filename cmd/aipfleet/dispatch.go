package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/tenanttoken"
	"github.com/aipfleet/aipfleet/registry"
	"github.com/aipfleet/aipfleet/registry/dispatch"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// DefaultGatewayPrincipal is the gateway principal the dispatcher signs as
// unless --principal-id says otherwise; hosts pin it with
// --gateway-principal-id, whose default it is.
const DefaultGatewayPrincipal = hostsdk.DefaultGatewayPrincipalID

func dispatchCommand() *command {
	return &command{
		name:      "dispatch",
		summary:   "run the dispatcher: the fleet's action entry point on PostgreSQL",
		usage:     "--database-url-file FILE --signing-key-file FILE --issuer NAME=DID [flags]",
		envPrefix: "AIP_DISPATCH_",
		long: `Runs the action entry point (docs/dispatch-api.md):
  POST /aip/v1/actions              run an action (sync JSON or streaming NDJSON)
  GET  /aip/v1/actions/{id}         its route and the pinned replica's journaled state
  POST /aip/v1/actions/{id}/cancel  cancel it on its pinned replica
  GET  /aip/v1/capabilities         the caller's tenant catalog, paged
  GET  /aip/v1/events               the caller's tenant's connector events, paged
  POST /aip/v1/connector-events     hosts deliver provider events (signed, no token)
and GET /health, /ready, /metrics, /.well-known/jwks.json.

Callers authenticate with "Authorization: Bearer <token>": an EdDSA JWT from
a trusted issuer (--issuer NAME=DID; several as one comma-separated list)
for the audience --audience; its tenant_id claim is the only tenant a
request acts for. Mint development tokens with aipfleet token.

Each action is admitted by a per-tenant fair scheduler, routed through the
registry's data pool (the schema must be installed), signed with the
signing key and sent to the pinned replica; hosts pin this key's did:key
(--gateway-did, printed at start) and --principal-id (--gateway-principal-id).

The API speaks HTTPS with --tls-cert-file and --tls-key-file; plain HTTP is
allowed only on a loopback address with --allow-insecure-loopback-http.
Traces are exported over OTLP/HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
SIGTERM or Ctrl-C stops it gracefully: queued actions are refused, actions
in flight finish and settle, then the database pool closes.`,
		examples: []string{
			"aipfleet dispatch --database-url-file db.url --signing-key-file gateway.key --issuer aipfleet-dev=did:key:z6Mk... --allow-insecure-loopback-http",
			"aipfleet dispatch --database-url-file /run/secrets/data-db-url --signing-key-file /run/secrets/gateway.key --issuer idp=did:key:z6Mk...,idp=did:key:z6Mn... --bind 0.0.0.0:8443 --tls-cert-file tls.crt --tls-key-file tls.key --region eu-west",
			"AIP_DISPATCH_DATABASE_URL_FILE=db.url AIP_DISPATCH_SIGNING_KEY_FILE=gateway.key AIP_DISPATCH_ISSUER=aipfleet-dev=did:key:z6Mk... aipfleet dispatch --allow-insecure-loopback-http",
		},
		run: runDispatch,
	}
}

// dispatchFlags are the parsed flags of dispatch.
type dispatchFlags struct {
	server        *serverFlags
	principalID   string
	issuers       []tenanttoken.Issuer
	audience      string
	clockSkew     time.Duration
	topology      registry.RouteTopologyPreference
	admission     dispatch.AdmissionLimits
	actionTimeout time.Duration
	maxTimeout    time.Duration
	maxReroutes   int
	maxBodyBytes  int
	// maxActionReadBytes is dispatch.Config.MaxActionReadBytes.
	maxActionReadBytes int
	replicaCAFile      string
	// reconcileAfter and reconcileInterval tune Reconcile (0: defaults).
	reconcileAfter    time.Duration
	reconcileInterval time.Duration
}

func parseDispatchFlags(c *command, e *env, args []string) (*dispatchFlags, error) {
	fs := e.flags(c)
	server := bindServerFlags(fs, serverFlagText{
		bind: dispatch.DefaultAddr, maxConns: 32,
		databaseURL:    "file holding the PostgreSQL URL of the registry's data pool; mode 0600, at most 16 KiB",
		databaseRole:   "the registry data pool's",
		signingKey:     "the dispatcher's Ed25519 signing key file (64-hex seed or JWK, mode 0600): the gateway key hosts pin",
		speaksHTTPSFor: "the API",
	})
	principal := fs.String("principal-id", DefaultGatewayPrincipal, "gateway principal the dispatcher signs as (hosts' --gateway-principal-id)")
	issuers := fs.String("issuer", "", "trusted token issuers: NAME=DID[,NAME=DID...] (a name may repeat, one entry per key)")
	audience := fs.String("audience", tenanttoken.DefaultAudience, "audience (aud claim) tokens must name")
	skew := fs.Duration("clock-skew", 30*time.Second, "clock skew tolerated on token times (0s to 5m)")
	region := fs.String("region", "", "preferred region of new routes")
	zone := fs.String("zone", "", "preferred zone of new routes")
	class := fs.String("capacity-class", "", "capacity class new routes must have (a filter)")
	forbid := fs.Bool("forbid-cross-region", false, "route only to replicas in --region")
	maxInFlight := fs.Int("max-in-flight", dispatch.DefaultMaxInFlight, "actions dispatched at once")
	perTenant := fs.Int("max-in-flight-per-tenant", dispatch.DefaultMaxInFlightPerTenant, "one tenant's actions dispatched at once")
	maxQueued := fs.Int("max-queued", dispatch.DefaultMaxQueued, "actions waiting for admission (0: none wait, an action beyond the in-flight bounds is refused at once)")
	queuedPerTenant := fs.Int("max-queued-per-tenant", dispatch.DefaultMaxQueuedPerTenant, "one tenant's actions waiting for admission (0: none wait)")
	queueBytes := fs.Int("max-queue-bytes", dispatch.DefaultMaxQueueBytes, "bytes of the actions waiting for admission")
	queueAge := fs.Duration("max-queue-age", dispatch.DefaultMaxQueueAge, "longest wait for admission")
	actionTimeout := fs.Duration("action-timeout", dispatch.DefaultActionTimeout, "timeout of an action that names no timeout_ms")
	maxTimeout := fs.Duration("max-timeout", dispatch.DefaultMaxTimeout, "largest timeout_ms accepted")
	maxReroutes := fs.Int("max-reroutes", dispatch.DefaultMaxReroutes, "provably-not-started reroutes per request (0 disables)")
	maxBody := fs.Int("max-body-bytes", dispatch.DefaultMaxBodyBytes, "largest request body")
	maxActionRead := fs.Int("max-action-read-bytes", dispatch.DefaultMaxActionReadBytes, "bytes of action request bodies being read at once, before admission (a tenant holds at most a quarter)")
	caFile := fs.String("replica-ca-file", "", "extra PEM root CA for replicas' https endpoints")
	reconcileAfter := fs.Duration("reconcile-after", 0, "age since it was last handed out at which a reservation still held is settled from its replica's journal (default 10m, or twice (--max-timeout + 6s) when longer; must exceed --max-timeout + 6s)")
	reconcileInterval := fs.Duration("reconcile-interval", dispatch.DefaultReconcileInterval, "how often orphaned reservations are reconciled")
	if err := fs.parse(args, e.stdout); err != nil {
		return nil, err
	}
	if len(fs.args()) > 0 {
		return nil, usagef("dispatch: unexpected argument %q; every setting is a flag", fs.args()[0])
	}
	f := &dispatchFlags{
		server: server, principalID: *principal, audience: *audience, clockSkew: *skew,
		topology:      registry.RouteTopologyPreference{Region: *region, Zone: *zone, CapacityClass: *class, ForbidCrossRegion: *forbid},
		actionTimeout: *actionTimeout, maxTimeout: *maxTimeout, maxReroutes: *maxReroutes, maxBodyBytes: *maxBody,
		maxActionReadBytes: *maxActionRead,
		replicaCAFile:      *caFile, reconcileAfter: *reconcileAfter, reconcileInterval: *reconcileInterval,
		admission: dispatch.AdmissionLimits{
			MaxInFlight: *maxInFlight, MaxInFlightPerTenant: *perTenant, MaxQueued: noQueueIfZero(*maxQueued),
			MaxQueuedPerTenant: noQueueIfZero(*queuedPerTenant), MaxQueueBytes: int64(*queueBytes), MaxQueueAge: *queueAge,
		},
	}
	// The library takes a zero limit as its default: a zero flag must not
	// silently become one.
	for _, l := range []struct {
		flag string
		v    int64
		min  int64
	}{
		{"--max-in-flight", int64(*maxInFlight), 1}, {"--max-in-flight-per-tenant", int64(*perTenant), 1},
		{"--max-queued", int64(*maxQueued), 0}, {"--max-queued-per-tenant", int64(*queuedPerTenant), 0},
		{"--max-queue-bytes", int64(*queueBytes), 1},
	} {
		if l.v < l.min {
			what := "at least 1"
			if l.min == 0 {
				what = "0 (no queue) or more"
			}
			return nil, usagef("dispatch: %s %d must be %s", l.flag, l.v, what)
		}
	}
	if *queueAge <= 0 {
		return nil, usagef("dispatch: --max-queue-age %s must be positive", *queueAge)
	}
	switch {
	case *issuers == "":
		return nil, usagef("dispatch: --issuer NAME=DID is required: requests are authenticated by tokens of a trusted issuer")
	case f.principalID == "":
		return nil, usagef("dispatch: --principal-id is empty")
	case f.audience == "":
		// The verifier would take "" for its default, so an empty
		// variable would pass unnoticed.
		return nil, usagef("dispatch: --audience is empty (leave it out for %s)", tenanttoken.DefaultAudience)
	case f.clockSkew < 0 || f.clockSkew > 5*time.Minute:
		return nil, usagef("dispatch: --clock-skew %s is outside 0s..5m", f.clockSkew)
	case f.maxTimeout <= 0:
		return nil, usagef("dispatch: --max-timeout %s must be positive", f.maxTimeout)
	case f.actionTimeout <= 0 || f.maxTimeout < f.actionTimeout:
		return nil, usagef("dispatch: --action-timeout %s must be positive and at most --max-timeout %s", f.actionTimeout, f.maxTimeout)
	case f.maxReroutes < 0 || f.maxReroutes > 8:
		return nil, usagef("dispatch: --max-reroutes %d is outside 0..8", f.maxReroutes)
	case f.maxBodyBytes < 1<<10 || f.maxBodyBytes > 64<<20:
		return nil, usagef("dispatch: --max-body-bytes %d is outside 1 KiB..64 MiB", f.maxBodyBytes)
	case f.maxActionReadBytes < f.maxBodyBytes || int64(f.maxActionReadBytes) > 4<<30: // int64: 4 GiB overflows a 32-bit int
		return nil, usagef("dispatch: --max-action-read-bytes %d must be at least --max-body-bytes %d and at most 4 GiB", f.maxActionReadBytes, f.maxBodyBytes)
	case f.reconcileAfter < 0 || (f.reconcileAfter > 0 && f.reconcileAfter <= f.maxTimeout+dispatch.DefaultHopSlack+dispatch.DefaultRegistryTimeout):
		return nil, usagef("dispatch: --reconcile-after %s must be longer than an action can be in flight (--max-timeout %s plus %s)",
			f.reconcileAfter, f.maxTimeout, dispatch.DefaultHopSlack+dispatch.DefaultRegistryTimeout)
	case f.reconcileInterval <= 0:
		return nil, usagef("dispatch: --reconcile-interval %s must be positive", f.reconcileInterval)
	}
	// The routing preference's own check names its topology.* field:
	// name the flag instead.
	var fe *registry.FieldError
	if err := f.topology.Validate(); errors.As(err, &fe) {
		flagOf := map[string]string{"topology.region": "--region", "topology.zone": "--zone",
			"topology.capacity_class": "--capacity-class", "topology.forbid_cross_region": "--forbid-cross-region"}
		if fe.Field == "topology.forbid_cross_region" {
			return nil, usagef("dispatch: --forbid-cross-region needs --region, the region routes must stay in")
		}
		if name, ok := flagOf[fe.Field]; ok {
			return nil, usagef("dispatch: %s %s", name, fe.Reason)
		}
	}
	if err := f.admission.Validate(); err != nil {
		return nil, usagef("dispatch: admission limits: %v", err)
	}
	var err error
	if f.issuers, err = parseIssuers(*issuers); err != nil {
		return nil, usagef("dispatch: --issuer: %v", err)
	}
	if err := server.check("dispatch"); err != nil {
		return nil, err
	}
	return f, nil
}

// tokenVerifier returns the verifier of the callers' tokens: the trusted
// issuers, the audience and the clock skew (--clock-skew 0s tolerates
// none).
func (f *dispatchFlags) tokenVerifier() (*tenanttoken.Verifier, error) {
	skew := f.clockSkew
	if skew == 0 {
		skew = -1 // the library's zero means its default
	}
	return tenanttoken.NewVerifier(tenanttoken.VerifierConfig{Issuers: f.issuers, Audience: f.audience, ClockSkew: skew})
}

// parseIssuers reads NAME=DID[,NAME=DID...]; entries with the same name
// are one issuer with several keys.
func parseIssuers(s string) ([]tenanttoken.Issuer, error) {
	var out []tenanttoken.Issuer
	index := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, did, ok := strings.Cut(part, "=")
		name, did = strings.TrimSpace(name), strings.TrimSpace(did)
		if !ok || name == "" || did == "" {
			return nil, fmt.Errorf("%q is not NAME=DID", part)
		}
		if _, err := aip.ParseDIDKey(did); err != nil {
			return nil, fmt.Errorf("issuer %s: %v", name, err)
		}
		if i, seen := index[name]; seen {
			out[i].DIDs = append(out[i].DIDs, did)
			continue
		}
		index[name] = len(out)
		out = append(out, tenanttoken.Issuer{Name: name, DIDs: []string{did}})
	}
	if len(out) == 0 {
		return nil, errors.New("no issuer given")
	}
	return out, nil
}

func runDispatch(ctx context.Context, c *command, e *env, args []string) error {
	f, err := parseDispatchFlags(c, e, args)
	if err != nil {
		return err
	}
	// Native hops go to many replicas at high rates: keep plenty of
	// connections warm.
	client, err := tlsClient("dispatch", "--replica-ca-file", f.replicaCAFile, 4096, 512)
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	verifier, err := f.tokenVerifier()
	if err != nil {
		return fmt.Errorf("--issuer: %w", err)
	}
	srv, err := f.server.open(ctx, e, "aipfleet-dispatch", pgregistry.Dispatcher)
	if err != nil {
		return err
	}
	defer srv.close()
	// Connector events (the ingress and GET /aip/v1/events) go to the
	// registry's event log.
	deps := dispatch.Deps{
		Resolver: srv.reg, Catalog: srv.reg, Rerouter: srv.reg, Tokens: verifier, Client: client,
		Ready: dispatch.ReadinessProbe(srv.reg), Reservations: srv.reg, Events: srv.reg, Records: srv.reg,
	}
	cfg := f.serviceConfig()
	cfg.SigningKey, cfg.Listener, cfg.TLSConfig, cfg.Logger, cfg.TracerProvider = srv.key, srv.ln, srv.tlsConfig, srv.logger, srv.tracer
	d, err := dispatch.New(cfg, deps)
	if err != nil {
		return err
	}
	srv.logger.Info("starting", "component", "aipfleet-dispatch", "status", "starting",
		"did", d.DID(), "principal_id", d.PrincipalID(), "bind", srv.ln.Addr().String(), "scheme", srv.scheme(),
		"schema_version", pgregistry.SchemaVersion, "reroute", cfg.MaxReroutes > 0)
	// Run returns after ctx ends (SIGTERM, Ctrl-C): queued actions are
	// refused, actions in flight finish and settle; the deferred calls then
	// close the database pool, flush traces and close replica connections.
	err = d.Run(ctx)
	logStopped(srv.logger, "aipfleet-dispatch", err)
	return err
}

// serviceConfig is the dispatch.Config the flags ask for; runDispatch adds
// what it opened: the signing key, the listener and its TLS configuration,
// the logger and the tracer.
func (f *dispatchFlags) serviceConfig() dispatch.Config {
	maxReroutes := f.maxReroutes
	if maxReroutes == 0 {
		maxReroutes = -1 // the library's zero means its default
	}
	return dispatch.Config{
		PrincipalID: f.principalID, Admission: f.admission, Topology: f.topology, ActionTimeout: f.actionTimeout, MaxTimeout: f.maxTimeout,
		MaxReroutes: maxReroutes, MaxBodyBytes: int64(f.maxBodyBytes), MaxActionReadBytes: int64(f.maxActionReadBytes),
		ReconcileAfter: f.reconcileAfter, ReconcileInterval: f.reconcileInterval, HideLocalReadyDetail: f.server.hideLocalReadyDetail(),
	}
}

// noQueueIfZero turns a queue bound flag into AdmissionLimits' terms:
// the flag's 0 is no queue, which the library spells negative (its zero is
// the default).
func noQueueIfZero(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// untrustedCertError is a request the client itself refused because the
// server's TLS certificate did not verify: nothing was sent.
type untrustedCertError struct {
	// server names what was asked ("the dispatcher", "the control
	// plane"), url where.
	server, url string
	err         error
}

func (e *untrustedCertError) Error() string {
	return fmt.Sprintf("%s at %s presented a certificate this client does not trust, so nothing was sent (%v): if your own CA signed it, give that CA with --ca-file", e.server, e.url, e.err)
}
func (e *untrustedCertError) Unwrap() error { return e.err }

// asUntrustedCert returns err as an *untrustedCertError when it is a
// failed verification of the server's certificate, else nil.
func asUntrustedCert(err error, server, url string) error {
	var cv *tls.CertificateVerificationError
	if !errors.As(err, &cv) {
		return nil
	}
	return &untrustedCertError{server: server, url: url, err: cv.Err}
}

// tlsClient returns an HTTP client keeping up to maxIdle idle connections
// (maxIdlePerHost to one host) that trusts caFile's roots in addition to the
// system's when caFile is given; errors about caFile start with command
// and name flagName, the flag it came from (flagFileError).
func tlsClient(command, flagName, caFile string, maxIdle, maxIdlePerHost int) (*http.Client, error) {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        maxIdle,
		MaxIdleConnsPerHost: maxIdlePerHost,
		IdleConnTimeout:     90 * time.Second,
		TLSHandshakeTimeout: 10 * time.Second,
	}
	if caFile != "" {
		pem, err := aip.ReadTrustFile(caFile, maxTLSFileBytes)
		if err != nil {
			return nil, flagFileError(command, flagName, err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("%s: %s %s holds no PEM certificate; want the PEM file of the CA certificates the server's certificate chains to", command, flagName, caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}, nil
}
