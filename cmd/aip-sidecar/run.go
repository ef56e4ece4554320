package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/sidecar"
)

const envPrefix = sidecar.EnvPrefix

// newSettings returns the AIP_SIDECAR_* settings read with
// hostsdk.BindSettings (the flag wins over the variable).
func newSettings() []hostsdk.Setting {
	ms := func(flag, env string, max int64, usage string) hostsdk.Setting {
		return hostsdk.Setting{Flag: flag, Env: envPrefix + env, Kind: hostsdk.SettingMillis, Min: 1, Max: max, Usage: usage}
	}
	str := func(flag, env, usage string) hostsdk.Setting {
		return hostsdk.Setting{Flag: flag, Env: envPrefix + env, Usage: usage}
	}
	policy := str("on-manifest-change", "ON_MANIFEST_CHANGE", "report (default) or unready: what a manifest or tools/list change after registration does")
	policy.Check = func(v string) error {
		if v != string(sidecar.ManifestChangeReport) && v != string(sidecar.ManifestChangeUnready) {
			return errors.New("want report or unready")
		}
		return nil
	}
	// Checked when read, as the other settings are, so that the error
	// names where the value came from: the flag or AIP_SIDECAR_LOG_LEVEL.
	logLevel := str("log-level", "LOG_LEVEL", "debug, info (default), warn or error")
	logLevel.Check = hostrun.CheckLogLevel
	return []hostsdk.Setting{
		str("local-url", "LOCAL_URL", "loopback origin of the local connector, e.g. http://127.0.0.1:8700"),
		str("local-socket", "LOCAL_SOCKET", "unix socket of the local connector"),
		str("local-token-file", "LOCAL_TOKEN_FILE", "owner-only file with the bearer token for the local connector (with --exec a fresh token is generated when unset)"),
		str("events-token-file", "EVENTS_TOKEN_FILE", "owner-only file with the bearer token the local connector publishes events with on POST "+sidecar.PathEvents+" (with --exec a fresh token is generated when unset and handed to the child in "+sidecar.EnvEventsToken+"; without either the route is not served)"),
		str("exec-dir", "EXEC_DIR", "working directory of the --exec child"),
		str("mcp-url", "MCP_URL", "wrap a Streamable HTTP MCP server at this URL (https, or http on loopback)"),
		str("mcp-tools", "MCP_TOOLS", "comma-separated MCP tool names to expose (default: all); the start fails if one is not a tool the server offers or cannot become a capability"),
		str("capability-prefix", "CAPABILITY_PREFIX", "prefix of capability IDs made from MCP tool names (default "+sidecar.DefaultCapabilityPrefix+")"),
		str("agent-id", "AGENT_ID", "manifest agent ID in MCP mode (default agent:mcp:<server name>)"),
		policy,
		ms("start-timeout-ms", "START_TIMEOUT_MS", 3_600_000, "wait for the connector's health before registering, in ms (default 30000)"),
		ms("stop-timeout-ms", "STOP_TIMEOUT_MS", 3_600_000, "time the child has after SIGTERM before SIGKILL, in ms (default 10000)"),
		ms("cancel-grace-ms", "CANCEL_GRACE_MS", 3_600_000, "wait for a cancelled action's answer before outcome_unknown, in ms (default 5000)"),
		ms("max-action-ms", "MAX_ACTION_MS", 86_400_000, "bound on an action without timeout_ms (or with 0), in ms (default 3600000)"),
		ms("restart-backoff-ms", "RESTART_BACKOFF_MS", 3_600_000, "first delay before restarting a crashed child, in ms (default 250)"),
		ms("max-backoff-ms", "MAX_BACKOFF_MS", 3_600_000, "longest delay between restarts, in ms (default 30000)"),
		{Flag: "restart-unresponsive-after", Env: envPrefix + "RESTART_UNRESPONSIVE_AFTER", Kind: hostsdk.SettingInt, Min: 0, Max: 1000,
			Usage: "after this many health checks in a row without any answer (a hung process): with --exec or --mcp-command, restart the child; with --mcp-url, open a new MCP session (an MCP error answer to the ping is an answer); checks made while an action sent to the child (a tool call, in MCP mode) is in progress and within its deadline do not count (a busy connector or MCP server may not answer them); 0 (default) never does"},
		{Flag: "print-manifest", Env: envPrefix + "PRINT_MANIFEST", Kind: hostsdk.SettingBool, Usage: "start the connector, print its bound manifest, digest and the implementation support its capabilities need as JSON, and exit"},
		logLevel,
		hostrun.LogFormatSetting(envPrefix + "LOG_FORMAT"),
	}
}

// argvSettings are the connector's command: as a flag, the rest of the
// arguments (must come last; splitArgv); as a variable, a JSON array.
var argvSettings = []struct{ flag, env, usage string }{
	{"exec", "EXEC", "start the local connector as a child: --exec CMD ARGS... (must come last; as a variable, a JSON array)"},
	{"mcp-command", "MCP_COMMAND", "wrap a stdio MCP server: --mcp-command CMD ARGS... (must come last; as a variable, a JSON array)"},
}

// splitArgv cuts args at the first --exec or --mcp-command: what follows is
// the command, after a "--" right after the flag (--exec -- CMD ARGS...,
// as docker and kubectl take a command), which only ends the flags.
func splitArgv(args []string) (flags []string, name string, argv []string) {
	for i, a := range args {
		n := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && (n == "exec" || n == "mcp-command") {
			argv = args[i+1:]
			if len(argv) > 0 && argv[0] == "--" {
				argv = argv[1:]
			}
			return args[:i], n, argv
		}
		if a == "--" {
			break
		}
	}
	return args, "", nil
}

// run parses flags and the environment, then runs the sidecar until
// SIGINT or SIGTERM and a clean drain.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) (err error) {
	flagArgs, argvName, argv := splitArgv(args)
	fs := flag.NewFlagSet("aip-sidecar", flag.ContinueOnError)
	defer func() { err = misplacedFlags(err, fs, argvName, argv) }()
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aip-sidecar [flags] [--exec CMD ARGS... | --mcp-command CMD ARGS...]\n\n")
		fmt.Fprintf(stderr, "Runs a replica for a connector not written in Go: forwards to a local connector\n")
		fmt.Fprintf(stderr, "(docs/sidecar-protocol.md) or wraps an MCP server.\n\nFlags:\n")
		hostrun.PrintDefaults(stderr, fs)
	}
	load := hostsdk.BindFlags(fs)
	loadSettings := hostsdk.BindSettings(fs, newSettings())
	for _, a := range argvSettings {
		fs.Var(argvFlag{}, a.flag, a.usage+" [$"+envPrefix+a.env+"]")
	}
	if err := hostrun.ParseFlags(fs, flagArgs, stderr, "aip-sidecar --help"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return hostrun.Usagef("unexpected argument %q; put the connector's command after --exec (or --mcp-command)", fs.Arg(0))
	}
	if argvName != "" && len(argv) == 0 {
		return hostrun.Usagef("--%s needs a command: --%s CMD [ARG ...]", argvName, argvName)
	}
	val, err := loadSettings(getenv)
	if err != nil {
		return err
	}

	hostCfg, err := load(getenv)
	if err != nil {
		return err
	}
	var level slog.Level // info; a value given was checked when read
	if lvl := val["log-level"]; lvl != "" {
		if level, err = hostrun.ParseLogLevel(lvl); err != nil {
			return hostrun.Settingf("--log-level (%sLOG_LEVEL) is %q: %w", envPrefix, lvl, err)
		}
	}
	logger := hostrun.NewLogger(stderr, val["log-format"], level)
	hostCfg.Logger = logger

	cfg := sidecar.Config{Host: hostCfg, Logger: logger, ExecStdout: stderr, ExecStderr: stderr}
	commandOf := func(name, env string) ([]string, error) {
		if argvName == name {
			return argv, nil
		}
		raw := getenv(envPrefix + env)
		if raw == "" {
			return nil, nil
		}
		var cmd []string
		if err := json.Unmarshal([]byte(raw), &cmd); err != nil || len(cmd) == 0 || cmd[0] == "" {
			return nil, hostrun.Settingf("%s%s is %q; want a JSON array of the program and its arguments, e.g. [\"python3\",\"connector.py\"]",
				envPrefix, env, raw)
		}
		return cmd, nil
	}
	if cfg.Exec, err = commandOf("exec", "EXEC"); err != nil {
		return err
	}
	if cfg.MCP.Command, err = commandOf("mcp-command", "MCP_COMMAND"); err != nil {
		return err
	}
	if len(cfg.Exec) > 0 && len(cfg.MCP.Command) > 0 {
		return hostrun.Settingf("--exec and --mcp-command are both given; a sidecar runs one connector")
	}
	if err := checkModeSettings(val, len(cfg.Exec) > 0, len(cfg.MCP.Command) > 0); err != nil {
		return err
	}
	cfg.ExecDir = val["exec-dir"]
	cfg.MCP.Dir = val["exec-dir"]
	cfg.MCP.Stderr = stderr
	cfg.Local.URL, cfg.Local.Socket = val["local-url"], val["local-socket"]
	if f := val["local-token-file"]; f != "" {
		raw, err := aip.ReadSecretFile(f, aip.MaxSecretFileBytes)
		if err != nil {
			return hostrun.Settingf("--local-token-file: %w", err)
		}
		cfg.Local.Token = strings.TrimSpace(string(raw))
	}
	if f := val["events-token-file"]; f != "" {
		raw, err := aip.ReadSecretFile(f, aip.MaxSecretFileBytes)
		if err != nil {
			return hostrun.Settingf("--events-token-file: %w", err)
		}
		cfg.EventsToken = strings.TrimSpace(string(raw))
	}
	cfg.MCP.URL = val["mcp-url"]
	if t := val["mcp-tools"]; t != "" {
		for _, name := range strings.Split(t, ",") {
			if name = strings.TrimSpace(name); name != "" {
				cfg.MCP.Tools = append(cfg.MCP.Tools, name)
			}
		}
	}
	cfg.MCP.CapabilityPrefix = val["capability-prefix"]
	cfg.MCP.AgentID = val["agent-id"]
	policy := sidecar.ManifestChangePolicy(val["on-manifest-change"])
	cfg.Local.OnManifestChange, cfg.MCP.OnManifestChange = policy, policy
	cfg.StartTimeout, cfg.StopTimeout = val.Millis("start-timeout-ms"), val.Millis("stop-timeout-ms")
	cfg.Local.CancelGrace = val.Millis("cancel-grace-ms")
	cfg.Local.MaxActionDuration, cfg.MCP.MaxActionDuration = val.Millis("max-action-ms"), val.Millis("max-action-ms")
	cfg.RestartBackoff, cfg.MaxBackoff = val.Millis("restart-backoff-ms"), val.Millis("max-backoff-ms")
	cfg.RestartUnresponsiveAfter = int(val.Int("restart-unresponsive-after"))

	ctx, stop := hostsdk.NotifyStop(ctx)
	defer stop()

	if val.Bool("print-manifest") {
		m, digest, err := sidecar.Describe(ctx, cfg)
		if err != nil {
			return err
		}
		// Reconciliation is not claimed: only the operator knows whether
		// the connector answers POST /aip/reconcile.
		return hostrun.NewManifestReport(m, digest, false).Print(stdout)
	}
	// As aip-host: --database-url-file names a PostgreSQL journal (each
	// replica keeps its own namespace), and spans go over OTLP/HTTP when
	// OTEL_EXPORTER_OTLP_ENDPOINT is set.
	tp, shutdownTracing, err := hostrun.TracerProvider(ctx, getenv, "aip-sidecar")
	if err != nil {
		return err
	}
	defer shutdownTracing()
	cfg.Host.TracerProvider = tp
	// Opened at the host's bootstrap step 2, after its settings and files
	// were checked; the host closes it.
	cfg.Host.OpenJournal = hostrun.JournalOpener(cfg.Host)
	s, err := sidecar.New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

// checkModeSettings refuses a setting that the chosen mode would ignore:
// silently dropped, a token file would leave an MCP server believed to be
// authenticated unauthenticated, and an MCP allow-list would leave a local
// connector's capabilities believed to be restricted all exposed.
func checkModeSettings(val hostsdk.SettingValues, exec, mcpCommand bool) error {
	mcpMode := mcpCommand || val["mcp-url"] != ""
	only := func(flags []string, what string) error {
		for _, f := range flags {
			if val[f] != "" {
				env := envPrefix + strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
				return hostrun.Settingf("--%s (%s) applies only to %s; remove it", f, env, what)
			}
		}
		return nil
	}
	if mcpMode {
		if err := only([]string{"local-token-file", "events-token-file", "cancel-grace-ms"}, "a local-contract connector (--local-url, --local-socket), not to an MCP server"); err != nil {
			return err
		}
	} else if err := only([]string{"mcp-tools", "capability-prefix", "agent-id"}, "an MCP server (--mcp-command, --mcp-url), not to a local-contract connector"); err != nil {
		return err
	}
	if !exec && !mcpCommand {
		return only([]string{"exec-dir"}, "a child the sidecar starts (--exec, --mcp-command)")
	}
	return nil
}

// misplacedFlags adds to err, when it names a flag of the sidecar's that
// the connector's command line (argv, after --argvName) holds, that this
// flag went to the connector: everything after --exec or --mcp-command is
// the child's command line, so a sidecar flag written after it (the dev
// banner's host command completed with "aip-sidecar --exec CMD" in front)
// is not read, and the error about it ("--public-endpoint ... is
// required") contradicted a command line that seemed to give it. A flag
// the error does not name is left alone: a connector may take a flag of
// the same name (--bind) for itself, and so is one also given before
// --exec, which the sidecar did read.
func misplacedFlags(err error, fs *flag.FlagSet, argvName string, argv []string) error {
	if err == nil || argvName == "" {
		return err
	}
	msg := err.Error()
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var found []string
	for _, a := range argv {
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name == "" || fs.Lookup(name) == nil || given[name] || slices.Contains(found, "--"+name) || !namesFlag(msg, name) {
			continue
		}
		found = append(found, "--"+name)
	}
	if len(found) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s came after --%s, so it went to the connector's command line and aip-sidecar did not read it: everything after --%s CMD is the connector's; put aip-sidecar's own flags before --%s)",
		err, strings.Join(found, ", "), argvName, argvName, argvName)
}

// namesFlag reports whether msg names --name as a whole flag (not as the
// start of a longer one: --control-plane-did in --control-plane-did-file).
func namesFlag(msg, name string) bool {
	for rest := msg; ; {
		i := strings.Index(rest, "--"+name)
		if i < 0 {
			return false
		}
		rest = rest[i+2+len(name):]
		if rest == "" {
			return true
		}
		if c := rest[0]; c != '-' && c != '_' && !('a' <= c && c <= 'z') && !('0' <= c && c <= '9') {
			return true
		}
	}
}

// argvFlag documents --exec and --mcp-command in the usage; splitArgv
// removes them (and their command) before parsing, so Set is never called
// with a command.
type argvFlag struct{}

func (argvFlag) String() string { return "" }
func (argvFlag) Set(string) error {
	return errors.New("put the command after the flag, as the last arguments")
}
func (argvFlag) IsBoolFlag() bool { return true }
