package sidecar

import (
	"errors"
	"fmt"
	"strings"

	"github.com/aipfleet/aipfleet/hostsdk"
)

// ConfigError reports an invalid sidecar setting: the Config field, the
// aip-sidecar flag and environment variable that set it (empty for a field
// only a Go program sets), and what is accepted. As hostsdk.ConfigError,
// its text is for the person who set the value, so it has no "sidecar: "
// prefix (aip-sidecar prints it after its own name): it starts with the
// flag and the variable ("--local-url (AIP_SIDECAR_LOCAL_URL,
// Config.Local.URL) is empty: ..."), or with the field for one only a Go
// program sets. Match it with errors.As. It matches hostsdk.ErrSetting
// too (errors.Is), as hostsdk's own refused settings do: the operator
// must change the setting, and aip-sidecar exits 2 for it.
type ConfigError struct {
	Field  string
	Flag   string // without the dashes
	Env    string
	Reason string
}

func (e *ConfigError) Error() string {
	if e.Flag == "" {
		return fmt.Sprintf("Config.%s %s", e.Field, e.Reason)
	}
	return fmt.Sprintf("--%s (%s, Config.%s) %s", e.Flag, e.Env, e.Field, e.Reason)
}

// Is reports whether target is hostsdk.ErrSetting.
func (e *ConfigError) Is(target error) bool { return target == hostsdk.ErrSetting }

// detail is err's text as a detail of another error of this package
// (ErrStartTimeout's last health check): without the "sidecar: " the
// outer error already starts with.
func detail(err error) string {
	if err == nil {
		return "<nil>"
	}
	return strings.TrimPrefix(err.Error(), "sidecar: ")
}

// detailed is an error quoted as a detail (its text without "sidecar: ",
// as detail gives it) that still matches what it wraps: a start timeout
// tells a refused connection from others by errors.Is.
type detailed struct{ err error }

func (d detailed) Error() string { return detail(d.err) }
func (d detailed) Unwrap() error { return d.err }

// EnvPrefix starts the environment variable of every aip-sidecar setting
// (AIP_SIDECAR_LOCAL_URL for --local-url); the replica's own are
// hostsdk's AIP_CONNECTOR_HOST_*.
const EnvPrefix = "AIP_SIDECAR_"

// settingOf maps a Config field to the aip-sidecar flag that sets it.
// Fields missing here are set by Go programs only.
var settingOf = map[string]string{
	"StartTimeout": "start-timeout-ms", "StopTimeout": "stop-timeout-ms",
	"RestartBackoff": "restart-backoff-ms", "MaxBackoff": "max-backoff-ms",
	"RestartUnresponsiveAfter": "restart-unresponsive-after",
	"Exec":                     "exec", "EventsToken": "events-token-file",
	"Local.URL": "local-url", "Local.Socket": "local-socket", "Local.Token": "local-token-file",
	"Local.CancelGrace": "cancel-grace-ms", "Local.MaxActionDuration": "max-action-ms",
	"Local.OnManifestChange": "on-manifest-change",
	"MCP.Command":            "mcp-command", "MCP.URL": "mcp-url", "MCP.Tools": "mcp-tools",
	"MCP.ConnectTimeout": "start-timeout-ms", "MCP.StopTimeout": "stop-timeout-ms",
	"MCP.MaxActionDuration": "max-action-ms", "MCP.RestartBackoff": "restart-backoff-ms",
	"MCP.MaxBackoff": "max-backoff-ms", "MCP.RestartUnresponsiveAfter": "restart-unresponsive-after",
	"MCP.OnManifestChange": "on-manifest-change",
}

// cfgErr returns the ConfigError of field, naming its flag and variable
// when aip-sidecar has one. Host.* fields are hostsdk's settings.
func cfgErr(field, reason string) *ConfigError {
	e := &ConfigError{Field: field, Reason: reason}
	if f, ok := settingOf[field]; ok {
		e.Flag, e.Env = f, EnvPrefix+strings.ToUpper(strings.ReplaceAll(f, "-", "_"))
	} else if field == "Host.Bind" {
		e.Flag, e.Env = "bind", "AIP_CONNECTOR_HOST_BIND"
	}
	return e
}

// LocalError is a failed exchange with the local connector: the request,
// where the connector listens, the HTTP status (0 when none arrived) and the
// cause.
type LocalError struct {
	Op     string
	Target string
	Status int
	Err    error
}

func (e *LocalError) Error() string {
	if e.Status != 0 {
		return fmt.Sprintf("sidecar: %s at %s: HTTP %d: %v", e.Op, e.Target, e.Status, e.Err)
	}
	return fmt.Sprintf("sidecar: %s at %s: %v", e.Op, e.Target, e.Err)
}

func (e *LocalError) Unwrap() error { return e.Err }

// ErrProcessDown is returned (wrapped in a *ProcessError) by health checks
// while the supervised connector process is not running.
var ErrProcessDown = errors.New("sidecar: the connector process is not running")

// ErrNotConnected is returned by health checks while the MCP session is
// down (the server crashed or is unreachable) and being re-established.
var ErrNotConnected = errors.New("sidecar: not connected to the MCP server")

// ErrManifestChanged is returned (wrapped) by health checks under
// ManifestChangeUnready while the connector's manifest differs from the
// admitted one.
var ErrManifestChanged = errors.New("sidecar: the connector's manifest differs from the admitted manifest")

// ErrStartTimeout is returned by Run when the local connector did not
// become healthy within Config.StartTimeout.
var ErrStartTimeout = errors.New("sidecar: the connector did not become healthy")

// ProcessError describes the supervised process's state when it is not
// running.
type ProcessError struct {
	// LastExit describes the last exit ("exit status 1", "signal: killed").
	LastExit string
	// Restarts counts restarts after crashes.
	Restarts int
	// Held, when set, says why the restart is held back: another process
	// listens where the connector is to listen.
	Held string
}

func (e *ProcessError) Error() string {
	if e.Held != "" {
		return fmt.Sprintf("%s (last exit: %s; not restarted: %s; checking again with backoff, %d restarts so far)", ErrProcessDown, e.LastExit, e.Held, e.Restarts)
	}
	if e.LastExit == "" {
		return ErrProcessDown.Error() + " (starting)"
	}
	return fmt.Sprintf("%s (last exit: %s; restarting with backoff, %d restarts so far)", ErrProcessDown, e.LastExit, e.Restarts)
}

func (e *ProcessError) Unwrap() error { return ErrProcessDown }
