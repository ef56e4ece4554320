// Command aip-host runs one of the built-in product adapters (package
// products) as an AIP connector host:
//
//	aip-host <product> [flags]
//
// The flags are the common connector host flags and AIP_CONNECTOR_HOST_*
// variables (hostsdk.BindFlags), aip-host's own --log-level, --log-format
// and --print-manifest (AIP_HOST_LOG_LEVEL, AIP_HOST_LOG_FORMAT and
// AIP_HOST_PRINT_MANIFEST, as the operator guide's Logs section lists
// them) and the product's own (AIP_<PRODUCT>_*); `aip-host <product>
// --help` lists them, `aip-host` alone lists the products.
// With --print-manifest it prints the bound manifest, its digest and the
// implementation support its capabilities need (what an operator admits
// with `aipfleet registry apply`) and exits. Otherwise it runs the
// ten-step bootstrap and serves until SIGINT or SIGTERM, and exits 0 only
// after a clean drain and offline transition. The journal is SQLite in
// --state-dir, or PostgreSQL with --database-url-file; spans are exported
// over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/products.md).
// What the operator must fix in how it is started is one line on stderr
// and exit status 2: a mistake on the command line (an unknown product or
// flag, a stray argument), a flag's or variable's value that is refused
// (--drain-timeout-ms=soon), that the product refuses (no
// --chatwoot-base-url, a token file others can read) or that the host
// refuses (no --public-endpoint, a --signing-seed-file others can read).
// A failure at run time (a later bootstrap step, such as an unreachable
// product or control plane, or a drain that was not clean) exits 1
// (hostrun.ExitCode).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/aipfleet/aipfleet/internal/hostrun"
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
	os.Exit(hostrun.ExitCode(err))
}
