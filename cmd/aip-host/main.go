// Command aip-host runs one of the built-in product adapters (package
// products) as an AIP connector host:
//
//	aip-host <product> [flags]
//
// The flags are the common connector host flags and AIP_CONNECTOR_HOST_*
// variables (hostsdk.BindFlags) and the product's own (AIP_<PRODUCT>_*);
// `aip-host <product> -h` lists them, `aip-host` alone lists the products.
// With --print-manifest it prints the bound manifest, its digest and the
// implementation support its capabilities need (what an operator admits
// with `aipfleet registry apply`) and exits. Otherwise it runs the
// ten-step bootstrap and serves until SIGINT or SIGTERM, and exits 0 only
// after a clean drain and offline transition. The journal is SQLite in
// --state-dir, or PostgreSQL with --database-url-file; spans are exported
// over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/products.md).
// A mistake on the command line (an unknown product or flag, a stray
// argument, a flag's or variable's value that is refused, such as
// --drain-timeout-ms=soon) is one line on stderr and exit status 2.
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
	"github.com/aipfleet/aipfleet/products"
)

// catalog holds the built-in products by name; each product's file in
// this directory adds itself.
var catalog = map[string]products.Product{}

func register(p products.Product) {
	if _, dup := catalog[p.Name]; dup {
		panic("aip-host: product " + p.Name + " registered twice")
	}
	catalog[p.Name] = p
}

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "aip-host:", err)
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

// usageError is a mistake on the command line (an unknown product or
// flag, a flag's malformed value, a stray argument); the process exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return &usageError{fmt.Sprintf(format, args...)} }

// parseFlags parses args into fs, whose output it silences: a mistake is
// one line that names it and where the flags are listed (usage, the
// command line of the help), not the whole flag list with the mistake
// above it; -h prints the flag list to stderr with fs.Usage.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, help string) error {
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
	return usagef("%s (run `%s` for the flags)", msg, help)
}
