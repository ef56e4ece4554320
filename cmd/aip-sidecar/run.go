package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/aipfleet/aipfleet/aip"
	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/sidecar"
)

const envPrefix = "AIP_SIDECAR_"

// setting is one AIP_SIDECAR_* option: a flag and its variable (the flag
// wins).
type setting struct {
	flag, env, usage string
	kind             kind
	min, max         int64 // for ints and milliseconds
	value            *string
}

type kind int

const (
	kindString kind = iota
	kindBool
	kindMillis
	kindArgv // a JSON array in the environment; as a flag, the rest of the arguments
)

// newSettings returns the AIP_SIDECAR_* settings (fresh for each run).
func newSettings() []*setting {
	return []*setting{
		{flag: "local-url", env: "LOCAL_URL", usage: "loopback origin of the local connector, e.g. http://127.0.0.1:8700"},
		{flag: "local-socket", env: "LOCAL_SOCKET", usage: "unix socket of the local connector"},
		{flag: "local-token-file", env: "LOCAL_TOKEN_FILE", usage: "owner-only file with the bearer token for the local connector (with --exec a fresh token is generated when unset)"},
		{flag: "exec", env: "EXEC", kind: kindArgv, usage: "start the local connector as a child: --exec CMD ARGS... (must come last; as a variable, a JSON array)"},
		{flag: "exec-dir", env: "EXEC_DIR", usage: "working directory of the --exec child"},
		{flag: "mcp-command", env: "MCP_COMMAND", kind: kindArgv, usage: "wrap a stdio MCP server: --mcp-command CMD ARGS... (must come last; as a variable, a JSON array)"},
		{flag: "mcp-url", env: "MCP_URL", usage: "wrap a Streamable HTTP MCP server at this URL (https, or http on loopback)"},
		{flag: "mcp-tools", env: "MCP_TOOLS", usage: "comma-separated MCP tool names to expose (default: all)"},
		{flag: "capability-prefix", env: "CAPABILITY_PREFIX", usage: "prefix of capability IDs made from MCP tool names (default " + sidecar.DefaultCapabilityPrefix + ")"},
		{flag: "agent-id", env: "AGENT_ID", usage: "manifest agent ID in MCP mode (default agent:mcp:<server name>)"},
		{flag: "on-manifest-change", env: "ON_MANIFEST_CHANGE", usage: "report (default) or unready: what a manifest or tools/list change after registration does"},
		{flag: "start-timeout-ms", env: "START_TIMEOUT_MS", kind: kindMillis, min: 1, max: 3_600_000, usage: "wait for the connector's health before registering, in ms (default 30000)"},
		{flag: "stop-timeout-ms", env: "STOP_TIMEOUT_MS", kind: kindMillis, min: 1, max: 3_600_000, usage: "time the child has after SIGTERM before SIGKILL, in ms (default 10000)"},
		{flag: "cancel-grace-ms", env: "CANCEL_GRACE_MS", kind: kindMillis, min: 1, max: 3_600_000, usage: "wait for a cancelled action's answer before outcome_unknown, in ms (default 5000)"},
		{flag: "max-action-ms", env: "MAX_ACTION_MS", kind: kindMillis, min: 1, max: 86_400_000, usage: "bound on an action without timeout_ms, in ms (default 3600000)"},
		{flag: "restart-backoff-ms", env: "RESTART_BACKOFF_MS", kind: kindMillis, min: 1, max: 3_600_000, usage: "first delay before restarting a crashed child, in ms (default 250)"},
		{flag: "max-backoff-ms", env: "MAX_BACKOFF_MS", kind: kindMillis, min: 1, max: 3_600_000, usage: "longest delay between restarts, in ms (default 30000)"},
		{flag: "print-manifest", env: "PRINT_MANIFEST", kind: kindBool, usage: "start the connector, print its bound manifest and digest as JSON, and exit"},
		{flag: "log-level", env: "LOG_LEVEL", usage: "debug, info (default), warn or error"},
	}
}

// splitArgv cuts args at the first --exec or --mcp-command: what follows is
// the command.
func splitArgv(args []string) (flags []string, name string, argv []string) {
	for i, a := range args {
		n := strings.TrimLeft(a, "-")
		if strings.HasPrefix(a, "-") && (n == "exec" || n == "mcp-command") {
			return args[:i], n, args[i+1:]
		}
		if a == "--" {
			break
		}
	}
	return args, "", nil
}

// run parses flags and the environment, then runs the sidecar until
// SIGINT or SIGTERM and a clean drain.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	flagArgs, argvName, argv := splitArgv(args)
	fs := flag.NewFlagSet("aip-sidecar", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aip-sidecar [flags] [--exec CMD ARGS... | --mcp-command CMD ARGS...]\n\n")
		fmt.Fprintf(stderr, "Runs a replica for a connector not written in Go: forwards to a local connector\n")
		fmt.Fprintf(stderr, "(docs/sidecar-protocol.md) or wraps an MCP server.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	load := hostsdk.BindFlags(fs)
	settings := newSettings()
	for _, s := range settings {
		s.value = new(string)
		usage := s.usage + " [$" + envPrefix + s.env + "]"
		switch s.kind {
		case kindBool:
			fs.Var(boolFlag{s.value}, s.flag, usage)
		case kindArgv:
			fs.Var(argvFlag{}, s.flag, usage)
		default:
			fs.StringVar(s.value, s.flag, "", usage)
		}
	}
	if err := fs.Parse(flagArgs); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; put the connector's command after --exec (or --mcp-command)", fs.Arg(0))
	}
	if argvName != "" && len(argv) == 0 {
		return fmt.Errorf("--%s needs a command: --%s CMD [ARG ...]", argvName, argvName)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	val := map[string]string{}
	for _, s := range settings {
		raw, source := *s.value, "--"+s.flag
		if !set[s.flag] {
			raw, source = getenv(envPrefix+s.env), envPrefix+s.env
		}
		if raw == "" {
			continue
		}
		if err := s.check(raw, source); err != nil {
			return err
		}
		val[s.flag] = raw
	}
	if argvName != "" {
		val[argvName] = "flag"
	}

	hostCfg, err := load(getenv)
	if err != nil {
		return err
	}
	var level slog.Level
	lvl := val["log-level"]
	if lvl == "" {
		lvl = "info"
	}
	if err := level.UnmarshalText([]byte(lvl)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", lvl)
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	hostCfg.Logger = logger

	cfg := sidecar.Config{Host: hostCfg, Logger: logger, ExecStdout: stderr, ExecStderr: stderr}
	commandOf := func(name string) ([]string, error) {
		if argvName == name {
			return argv, nil
		}
		raw := val[name]
		if raw == "" {
			return nil, nil
		}
		var cmd []string
		if err := json.Unmarshal([]byte(raw), &cmd); err != nil || len(cmd) == 0 || cmd[0] == "" {
			return nil, fmt.Errorf("%s%s is %q; want a JSON array of the program and its arguments, e.g. [\"python3\",\"connector.py\"]",
				envPrefix, strings.ToUpper(strings.ReplaceAll(name, "-", "_")), raw)
		}
		return cmd, nil
	}
	if cfg.Exec, err = commandOf("exec"); err != nil {
		return err
	}
	if cfg.MCP.Command, err = commandOf("mcp-command"); err != nil {
		return err
	}
	if len(cfg.Exec) > 0 && len(cfg.MCP.Command) > 0 {
		return errors.New("--exec and --mcp-command are both given; a sidecar runs one connector")
	}
	cfg.ExecDir = val["exec-dir"]
	cfg.MCP.Dir = val["exec-dir"]
	cfg.MCP.Stderr = stderr
	cfg.Local.URL, cfg.Local.Socket = val["local-url"], val["local-socket"]
	if f := val["local-token-file"]; f != "" {
		raw, err := aip.ReadSecretFile(f, aip.MaxSecretFileBytes)
		if err != nil {
			return fmt.Errorf("--local-token-file: %w", err)
		}
		cfg.Local.Token = strings.TrimSpace(string(raw))
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
	ms := func(name string) time.Duration {
		n, _ := strconv.ParseInt(val[name], 10, 64)
		return time.Duration(n) * time.Millisecond
	}
	cfg.StartTimeout, cfg.StopTimeout = ms("start-timeout-ms"), ms("stop-timeout-ms")
	cfg.Local.CancelGrace = ms("cancel-grace-ms")
	cfg.Local.MaxActionDuration, cfg.MCP.MaxActionDuration = ms("max-action-ms"), ms("max-action-ms")
	cfg.RestartBackoff, cfg.MaxBackoff = ms("restart-backoff-ms"), ms("max-backoff-ms")

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if b, _ := strconv.ParseBool(val["print-manifest"]); b {
		m, digest, err := sidecar.Describe(ctx, cfg)
		if err != nil {
			return err
		}
		out, err := json.MarshalIndent(map[string]any{"manifest_digest": digest, "capability_count": len(m.Capabilities), "manifest": m}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", out)
		return err
	}
	s, err := sidecar.New(cfg)
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

func (s *setting) check(raw, source string) error {
	bad := func(reason string, args ...any) error {
		return fmt.Errorf("--%s (%s%s) from %s is %q; %s", s.flag, envPrefix, s.env, source, raw, fmt.Sprintf(reason, args...))
	}
	switch s.kind {
	case kindBool:
		if _, err := strconv.ParseBool(raw); err != nil {
			return bad("want true or false")
		}
	case kindMillis:
		n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
		if err != nil || n < s.min || n > s.max {
			return bad("want an integer from %d to %d ms", s.min, s.max)
		}
	}
	if s.flag == "on-manifest-change" && raw != string(sidecar.ManifestChangeReport) && raw != string(sidecar.ManifestChangeUnready) {
		return bad("want report or unready")
	}
	return nil
}

// boolFlag accepts a bare --flag as true.
type boolFlag struct{ p *string }

func (b boolFlag) String() string {
	if b.p == nil {
		return ""
	}
	return *b.p
}
func (b boolFlag) Set(s string) error { *b.p = s; return nil }
func (b boolFlag) IsBoolFlag() bool   { return true }

// argvFlag documents --exec and --mcp-command in the usage; splitArgv
// removes them (and their command) before parsing, so Set is never called
// with a command.
type argvFlag struct{}

func (argvFlag) String() string { return "" }
func (argvFlag) Set(string) error {
	return errors.New("put the command after the flag, as the last arguments")
}
func (argvFlag) IsBoolFlag() bool { return true }
