package sidecar

import (
	"errors"
	"fmt"
)

// ConfigError reports an invalid sidecar setting: the Config field and what
// is accepted.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string { return "sidecar: " + e.Field + " " + e.Reason }

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
var ErrStartTimeout = errors.New("sidecar: the connector did not become healthy in time")

// ProcessError describes the supervised process's state when it is not
// running.
type ProcessError struct {
	// LastExit describes the last exit ("exit status 1", "signal: killed").
	LastExit string
	// Restarts counts restarts after crashes.
	Restarts int
}

func (e *ProcessError) Error() string {
	if e.LastExit == "" {
		return ErrProcessDown.Error() + " (starting)"
	}
	return fmt.Sprintf("%s (last exit: %s; restarting with backoff, %d restarts so far)", ErrProcessDown, e.LastExit, e.Restarts)
}

func (e *ProcessError) Unwrap() error { return ErrProcessDown }
