// Command aip-sidecar gives a connector that is not written in Go the
// connector-host lifecycle of hostsdk: bootstrap, durable journal, signed
// heartbeats, drain and recovery. It forwards actions to a local connector
// speaking the local contract (docs/sidecar-protocol.md) on a loopback
// port or unix socket — started as its child with --exec, or already
// running — or wraps an MCP server (--mcp-command or --mcp-url).
//
// It takes the common AIP_CONNECTOR_HOST_* configuration and its own
// AIP_SIDECAR_* settings (run it with -h for the list), and exits with
// status 0 only after a clean drain, offline transition and stop of its
// child. A mistake on the command line (an unknown flag, a stray
// argument, a flag's or variable's value that is refused, such as
// --start-timeout-ms=soon) is one line on stderr and exit status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/aipfleet/aipfleet/hostsdk"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "aip-sidecar:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status for run's error: 0 for none or -h, 2 for a
// mistake on the command line (a *usageError, or a flag's or variable's
// value hostsdk's settings refuse, hostsdk.ErrSetting), 1 for the rest.
func exitCode(err error) int {
	var usage *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage), errors.Is(err, hostsdk.ErrSetting):
		return 2
	}
	return 1
}

// usageError is a mistake on the command line (an unknown flag, a flag's
// malformed value, a stray argument); the process exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// parseFlags parses args into fs, whose output it silences: a mistake is
// one line that names it and says where the flags are listed, not the
// whole flag list with the mistake above it; -h prints the flag list to
// stderr with fs.Usage.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	usage := fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(stderr)
	fs.Usage = usage
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.Usage()
		return err
	case err == nil:
		return nil
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		msg = "unknown flag -" + strings.TrimLeft(name, "-")
	}
	return usagef("%s (run `aip-sidecar -h` for the flags)", msg)
}
