package main

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/aipfleet/aipfleet/aip"
)

func versionCommand() *command {
	return &command{
		name:    "version",
		summary: "print the version of aipfleet and the protocol it speaks",
		usage:   "[--json]",
		long: `Prints this build's version and VCS revision (from the Go build
information), the AIP protocol version it speaks, and the Go version it was
built with. Report them with any bug.`,
		examples: []string{"aipfleet version", "aipfleet version --json", "aipfleet --version"},
		run:      runVersion,
	}
}

// buildVersion describes this binary from its embedded build information.
func buildVersion() (version, revision string) {
	version, revision = "(devel)", "unknown"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return
	}
	if info.Main.Version != "" {
		version = info.Main.Version
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return
}

func runVersion(ctx context.Context, c *command, e *env, args []string) error {
	fs := e.flags(c)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.parse(args, e.stdout); err != nil {
		return err
	}
	if err := fs.noArgs(); err != nil {
		return err
	}
	v, rev := buildVersion()
	if *asJSON {
		return writeJSON(e.stdout, map[string]string{"version": v, "revision": rev, "aip": aip.Version, "go": runtime.Version()})
	}
	fmt.Fprintf(e.stdout, "aipfleet %s (revision %s, AIP %s, %s)\n", v, rev, aip.Version, runtime.Version())
	return nil
}
