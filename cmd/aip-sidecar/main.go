// Command aip-sidecar gives a connector that is not written in Go the
// connector-host lifecycle of hostsdk: bootstrap, durable journal, signed
// heartbeats, drain and recovery. It forwards actions to a local connector
// speaking the local contract (docs/sidecar-protocol.md) on a loopback
// port or unix socket — started as its child with --exec, or already
// running — or wraps an MCP server (--mcp-command or --mcp-url).
//
// It takes the common AIP_CONNECTOR_HOST_* configuration and its own
// AIP_SIDECAR_* settings (run it with --help for the list), and exits with
// status 0 only after a clean drain, offline transition and stop of its
// child. What the operator must fix in how it is started is one line on
// stderr and exit status 2: a mistake on the command line (an unknown
// flag, a stray argument), a flag's or variable's value that is refused
// (--start-timeout-ms=soon, an empty --local-url, a --local-token-file
// others can read, a setting of the other mode) or that the host refuses
// (no --public-endpoint, a --signing-seed-file others can read). A
// failure at run time (a connector that does not become healthy, a later
// bootstrap step, a drain that was not clean) exits 1 (hostrun.ExitCode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/aipfleet/aipfleet/internal/hostrun"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "aip-sidecar:", message(err))
	}
	os.Exit(hostrun.ExitCode(err))
}

// message is err's text as main prints it after "aip-sidecar: ": without
// the "sidecar: " that package sidecar's own errors start with
// (sidecar.ErrStartTimeout, a *sidecar.LocalError, a child that did not
// stop), which would name the program twice. The errors keep it (they
// are matched with errors.Is and errors.As, and logged as they are).
func message(err error) string {
	return strings.TrimPrefix(err.Error(), "sidecar: ")
}
