package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/registry/pgregistry"
)

// serverFlags are the flags the server commands (control-plane, dispatch)
// share: the registry's data pool, the signing key, the listener and its
// transport, and the log level and format.
type serverFlags struct {
	databaseURLFile string
	signingKeyFile  string
	bind            string
	tlsCertFile     string
	tlsKeyFile      string
	insecure        bool
	maxConns        int
	acquireTimeout  time.Duration
	logLevel        string
	readyDetail     string     // --ready-detail: local or none
	level           slog.Level // logLevel parsed by check
	logFormat       string
	fs              *flagSet // where the flags were defined, for checkLogFormat
	databaseRole    string   // for the "is required" error of --database-url-file
	command         string   // the command's name, set by check: its errors start with it
}

// serverFlagText is what differs between the server commands' shared
// flags: defaults and the words that name the command's database role,
// key and API.
type serverFlagText struct {
	bind           string // default of --bind
	maxConns       int    // default of --max-connections
	databaseURL    string // help of --database-url-file
	databaseRole   string // whose URL --database-url-file holds, for its "is required" error
	signingKey     string // help of --signing-key-file
	speaksHTTPSFor string // what speaks HTTPS with --tls-cert-file: "the service", "the API"
}

// bindServerFlags defines the shared server flags on fs; they are filled
// in when fs is parsed.
func bindServerFlags(fs *flagSet, text serverFlagText) *serverFlags {
	f := &serverFlags{databaseRole: text.databaseRole, fs: fs}
	fs.StringVar(&f.databaseURLFile, "database-url-file", "", text.databaseURL)
	fs.StringVar(&f.signingKeyFile, "signing-key-file", "", text.signingKey)
	fs.StringVar(&f.bind, "bind", text.bind, "address to listen on")
	fs.StringVar(&f.tlsCertFile, "tls-cert-file", "", "TLS certificate chain (PEM); with --tls-key-file "+text.speaksHTTPSFor+" speaks HTTPS")
	fs.StringVar(&f.tlsKeyFile, "tls-key-file", "", "TLS private key (PEM, mode 0600)")
	fs.BoolVar(&f.insecure, "allow-insecure-loopback-http", false, "allow plain HTTP, only on a loopback --bind (development)")
	fs.IntVar(&f.maxConns, "max-connections", text.maxConns, "maximum database connections of the data pool (1 to 256)")
	fs.DurationVar(&f.acquireTimeout, "acquire-timeout", 5*time.Second, "wait for a pooled database connection (1ms to 60s)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.logFormat, "log-format", hostrun.LogJSON, logFormatUsage)
	fs.StringVar(&f.readyDetail, "ready-detail", readyDetailLocal, "who reads the error text of failing /ready checks (it names database hosts and roles): "+
		"local (loopback peers whose request carries no proxy forwarding header), or none (set it behind a proxy on the same machine, such as an Envoy or Istio sidecar: every caller is loopback there); the log always has it")
	return f
}

// The values of --ready-detail.
const (
	readyDetailLocal = "local"
	readyDetailNone  = "none"
)

// hideLocalReadyDetail is the Config.HideLocalReadyDetail --ready-detail
// asks for (check validated it).
func (f *serverFlags) hideLocalReadyDetail() bool { return f.readyDetail == readyDetailNone }

// check validates the shared flags of command after parsing, as usage
// errors naming the flag, parses --log-level once and checks --log-format.
func (f *serverFlags) check(command string) error {
	f.command = command
	switch {
	case f.databaseURLFile == "":
		return usagef("%s: --database-url-file is required (a file holding %s PostgreSQL URL)", command, f.databaseRole)
	case f.signingKeyFile == "":
		return usagef("%s: --signing-key-file is required (create one with `aipfleet keygen --out FILE`)", command)
	case f.maxConns < 1 || f.maxConns > 256:
		return usagef("%s: --max-connections %d is outside 1..256", command, f.maxConns)
	case f.acquireTimeout < time.Millisecond || f.acquireTimeout > pgregistry.MaxAcquireTimeout:
		return usagef("%s: --acquire-timeout %s is outside 1ms..%s", command, f.acquireTimeout, pgregistry.MaxAcquireTimeout)
	case (f.tlsCertFile == "") != (f.tlsKeyFile == ""):
		return usagef("%s: --tls-cert-file and --tls-key-file go together", command)
	case f.readyDetail != readyDetailLocal && f.readyDetail != readyDetailNone:
		return usagef("%s: --ready-detail %q is neither %s nor %s", command, f.readyDetail, readyDetailLocal, readyDetailNone)
	}
	level, err := parseLogLevel(f.logLevel)
	if err != nil {
		return usagef("%s: %v", command, err)
	}
	f.level = level
	if err := checkLogFormat(f.fs, command, f.logFormat); err != nil {
		return err
	}
	return checkServerTransport(command, f.bind, f.tlsCertFile != "", f.insecure)
}

// server is what a server command runs with, opened from its serverFlags.
type server struct {
	logger    *slog.Logger
	key       *aip.SigningKey
	tlsConfig *tls.Config // nil for plain HTTP
	tracer    trace.TracerProvider
	reg       *pgregistry.Registry // the data pool only
	ln        net.Listener

	shutdownTracing func()
}

// open opens what f names, in order: the logger on stderr (--log-format),
// the secret files, the trace exporter (named service), the registry's data pool
// (whose role must hold what serves needs) and the listener. On error it
// closes what it opened.
func (f *serverFlags) open(ctx context.Context, e *env, service string, serves pgregistry.Service) (_ *server, err error) {
	s := &server{logger: hostrun.NewLogger(e.stderr, f.logFormat, f.level), shutdownTracing: func() {}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	var dbURL string
	if dbURL, s.key, s.tlsConfig, err = (serverFiles{f.command, f.databaseURLFile, f.signingKeyFile, f.tlsCertFile, f.tlsKeyFile}).load(); err != nil {
		return nil, err
	}
	if s.tracer, s.shutdownTracing, err = hostrun.TracerProvider(ctx, e.getenv, service); err != nil {
		s.shutdownTracing = func() {}
		if errors.Is(err, hostsdk.ErrSetting) {
			// An OTEL_EXPORTER_OTLP_* value to fix, as a flag's (exit 2).
			return nil, usagef("%v", err)
		}
		return nil, err
	}
	if s.reg, err = pgregistry.OpenDataPlane(ctx, pgregistry.Config{
		DataURL: dbURL, DataMaxConns: int32(f.maxConns), AcquireTimeout: f.acquireTimeout, Service: serves,
	}); err != nil {
		var roleErr *pgregistry.RoleError
		if errors.As(err, &roleErr) {
			// The fix is a different URL file or roles.sql: say which
			// file holds the role's URL.
			return nil, fmt.Errorf("open the registry (data pool) with the URL in --database-url-file %s: %w", f.databaseURLFile, err)
		}
		return nil, withConnectHint(fmt.Errorf("open the registry (data pool): %w", err), f.databaseURLFile)
	}
	var lc net.ListenConfig
	if s.ln, err = lc.Listen(ctx, "tcp", f.bind); err != nil {
		return nil, fmt.Errorf("--bind %s: %w", f.bind, err)
	}
	return s, nil
}

// scheme is "https" or "http", for the startup log line.
func (s *server) scheme() string {
	if s.tlsConfig == nil {
		return "http"
	}
	return "https"
}

// close closes the listener (if the service has not already), then the
// database pool, then flushes traces.
func (s *server) close() {
	if s.ln != nil {
		s.ln.Close()
	}
	if s.reg != nil {
		s.reg.Close()
	}
	s.shutdownTracing()
}

// checkServerTransport is the transport rule of the server commands
// (control-plane, dispatch): TLS (hasCert) anywhere; plain HTTP only on a
// loopback bind and only with --allow-insecure-loopback-http (insecure).
func checkServerTransport(command, bind string, hasCert, insecure bool) error {
	loopback, err := isLoopbackBind(bind)
	if err != nil {
		return usagef("%s: --bind %q: %v; give HOST:PORT, such as 127.0.0.1:8090 or 0.0.0.0:8443", command, bind, err)
	}
	// A port out of range would be found only at the listen, after the
	// secret files and the database.
	if _, port, _ := net.SplitHostPort(bind); port != "" {
		if _, err := net.LookupPort("tcp", port); err != nil {
			return usagef("%s: --bind %s: %q is not a port: give 0 to 65535", command, bind, port)
		}
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

// logFormatUsage is the help of --log-format, whose default the flag list
// shows.
const logFormatUsage = "json (one JSON object per line) or text (one readable line per event)"

// checkLogFormat refuses a --log-format value (given, or read from the
// command's variable: AIP_CONTROL_LOG_FORMAT,
// AIP_CONNECTOR_HOST_LOG_FORMAT, ...) other than json or text as command's
// usage error (exit 2) that names the flag, its variable, where the value
// came from and the accepted values, as hostsdk's settings do:
// `control-plane: --log-format (AIP_CONTROL_LOG_FORMAT) is "xml"; want
// json or text`.
func checkLogFormat(fs *flagSet, command, v string) error {
	err := hostrun.CheckLogFormat(v)
	if err == nil {
		return nil
	}
	env, source := fs.envOf["log-format"], "--log-format"
	if slices.Contains(fs.fromEnv, "log-format") {
		source = env
	}
	return usagef("%s: %v", command, &hostsdk.SettingError{Flag: "log-format", Env: env, Source: source, Value: v, Want: err.Error()})
}
