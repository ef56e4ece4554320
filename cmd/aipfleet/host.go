package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
)

// builtinConnectors are the connectors `aipfleet host --connector NAME`
// can run, by name: the example connectors dev uses. The product adapters,
// which have settings of their own, run with cmd/aip-host.
var builtinConnectors = map[string]func() hostsdk.Connector{
	"echo": func() hostsdk.Connector { return echoconnector.Connector{} },
}

func connectorNames() []string {
	names := make([]string, 0, len(builtinConnectors))
	for n := range builtinConnectors {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func hostCommand() *command {
	return &command{
		name:      "host",
		summary:   "run a built-in connector as one fleet replica (a hostsdk host)",
		usage:     "--connector NAME [host flags]",
		envPrefix: "AIP_CONNECTOR_HOST_",
		long: `Runs one replica of a built-in connector (` + strings.Join(connectorNames(), ", ") + `) on the common
connector host: it validates its configuration, opens its durable journal,
recovers work a previous process left, registers with the control plane
(a signed request with this replica's own key), holds its lease with
heartbeats and serves the native AIP surface, /health, /ready and
/metrics. SIGTERM or Ctrl-C drains it: new actions are refused, actions in
flight finish, the replica goes offline; the exit status is 0 only when
every step was clean. A setting it refuses, or a file a setting names
that it cannot use (a --signing-seed-file others can read), exits 2; a
failure at run time (a later bootstrap step, a drain) exits 1.

The replica must be pre-provisioned in the registry (a fleet file's
replicas section) with the same IDs, endpoint and did:key. Every flag below
is the common host contract that every connector host shares, also read
from its AIP_CONNECTOR_HOST_* variable. The journal is SQLite in
--state-dir, or PostgreSQL with --database-url-file. aipfleet dev starts
its replicas with this command.

--print-manifest prints what a fleet file's version entry needs instead:
the connector's manifest bound to --trust-domain (the version's manifest),
its manifest_digest and the implementation_support of every capability.
The version's attestation.artifact_digest, which --artifact-digest must
repeat, names the build that runs the connector: for a built-in connector,
the aipfleet binary (sha256: and its sha256sum).`,
		examples: []string{
			"aipfleet host --connector echo --bind 127.0.0.1:8091 --allow-insecure-loopback-http --public-endpoint http://127.0.0.1:8091/aip/v1/messages --control-plane-endpoint http://127.0.0.1:8090/aip/v1/connector-control --control-plane-did did:key:z6Mk... --signing-seed-file replica-1.key ...",
			"AIP_CONNECTOR_HOST_CONNECTOR=echo AIP_CONNECTOR_HOST_REPLICA_ID=crepl_... aipfleet host   # everything else from AIP_CONNECTOR_HOST_* too",
			"aipfleet host --connector echo --trust-domain fleet.example.com --print-manifest   # for the fleet file's version entry",
			"aipfleet host --connector echo --help",
		},
		run: runHost,
	}
}

func runHost(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	name := fs.String("connector", "", "the built-in connector to run: "+strings.Join(connectorNames(), ", "))
	level := fs.String("log-level", "info", "log level: debug, info, warn or error")
	logFormat := fs.String("log-format", hostrun.LogJSON, logFormatUsage)
	printManifest := fs.Bool("print-manifest", false, "print the connector's manifest bound to --trust-domain, its digest and the implementation support its capabilities need, as JSON for a fleet file's version entry, then exit")
	fs.NoEnv("print-manifest")
	load := hostsdk.BindFlags(fs.fs)
	// The host flags read their AIP_CONNECTOR_HOST_* variables in load;
	// list those names in the help like every other flag's.
	fs.fs.VisitAll(func(fl *flag.Flag) {
		if u, env, ok := strings.Cut(fl.Usage, " [$"); ok && strings.HasSuffix(env, "]") {
			fl.Usage, fs.envOf[fl.Name] = u, strings.TrimSuffix(env, "]")
		}
	})
	if fl := fs.fs.Lookup("database-url-file"); fl != nil {
		fl.Usage = "owner-only file with a PostgreSQL URL: the journal goes there instead of --state-dir"
	}
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if len(fs.args()) > 0 {
		return usagef("host: unexpected argument %q; every setting is a flag", fs.args()[0])
	}
	newConn, ok := builtinConnectors[*name]
	switch {
	case *name == "":
		return usagef("host: --connector is required: one of %s", strings.Join(connectorNames(), ", "))
	case !ok:
		return usagef("host: --connector %q is not a built-in connector; choose one of %s", *name, strings.Join(connectorNames(), ", "))
	}
	lvl, err := parseLogLevel(*level)
	if err != nil {
		return usagef("host: %v", err)
	}
	if err := checkLogFormat(fs, "host", *logFormat); err != nil {
		return err
	}
	cfg, err := load(e.getenv)
	if err != nil {
		if errors.Is(err, hostsdk.ErrSetting) {
			return usagef("host: %v", err)
		}
		return err
	}
	if *printManifest {
		if cfg.TrustDomain == "" {
			return usagef("host --print-manifest: --trust-domain is required: the manifest is bound to the trust domain its replicas sign in")
		}
		r, err := hostrun.DescribeConnector(ctx, newConn(), cfg)
		if err != nil {
			return fmt.Errorf("host --print-manifest: %w", err)
		}
		return r.Print(e.stdout)
	}
	cfg.Logger = hostrun.NewLogger(e.stderr, *logFormat, lvl)
	err = hostrun.Run(ctx, cfg, newConn(), e.getenv, "aipfleet-host-"+*name)
	// The exit status follows hostrun.ExitCode's rule, as aip-host's and
	// aip-sidecar's: a setting to change, or a file a setting names
	// (hostsdk.ErrSetting: New's *ConfigError, bootstrap step 1's
	// *ValidateError, a registration refused because a setting is not
	// what the fleet pre-provisioned, such as the signing key), exits 2; a
	// failure at run time 1.
	if errors.Is(err, hostsdk.ErrSetting) {
		return usagef("host: %v (run `aipfleet host --help`)", err)
	}
	return err
}
