// Command noteshost runs the notes connector of docs/connector-guide.md as
// one fleet replica. Like every connector host it is configured by the
// common host flags and AIP_CONNECTOR_HOST_* variables (run it with -h for
// the list). --print-manifest prints the manifest bound to --trust-domain,
// as YAML to paste under a fleet file version's manifest:, and exits.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"gopkg.in/yaml.v3"

	"github.com/aipfleet/aipfleet/docs/connectorguide/notes"
	"github.com/aipfleet/aipfleet/hostsdk"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "noteshost:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status for run's error. A mistake in how the
// program was started exits 2, as aip-host does: an unknown flag, a
// stray argument or --print-manifest without --trust-domain (a
// usageError), or a setting, or a file a setting names,
// that the host refuses (hostsdk.ErrSetting: a value it cannot read, a
// required one missing, a --signing-seed-file others can read, a setting
// the control plane refused the registration for because it differs from
// the replica's pre-provisioned records). A start that failed at run time
// or a drain that was not clean exits 1; none, or -h, 0.
func exitCode(err error) int {
	var usage usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage), errors.Is(err, hostsdk.ErrSetting):
		return 2
	}
	return 1
}

// usageError is a mistake on the command line: an unknown flag, a stray
// argument, or --print-manifest without --trust-domain.
type usageError struct{ error }

// run is the whole program: flags and environment, then the host until
// SIGINT, SIGTERM or SIGHUP and a clean drain.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("noteshost", flag.ContinueOnError)
	fs.SetOutput(stderr)
	load := hostsdk.BindFlags(fs)
	printManifest := fs.Bool("print-manifest", false, "print the manifest bound to --trust-domain as YAML and exit")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q; every setting is a flag", fs.Arg(0))}
	}
	cfg, err := load(getenv)
	if err != nil {
		return err
	}
	conn := notes.Connector{}
	if *printManifest {
		return printBoundManifest(ctx, stdout, conn, cfg.TrustDomain)
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, nil))
	host, err := hostsdk.New(cfg, conn)
	if err != nil {
		return err
	}
	ctx, stop := hostsdk.NotifyStop(ctx)
	defer stop()
	return host.Run(ctx) // nil only after a clean drain and offline
}

// printBoundManifest prints the manifest as the host binds it (the agent in
// the trust domain, no DID): exactly what the registry must admit.
func printBoundManifest(ctx context.Context, w io.Writer, conn hostsdk.Connector, trustDomain string) error {
	if trustDomain == "" {
		return usageError{errors.New("--print-manifest needs --trust-domain (the manifest is bound to it)")}
	}
	src, err := conn.Manifest(ctx, hostsdk.TenantContext{TrustDomain: trustDomain})
	if err != nil {
		return err
	}
	m, _, err := hostsdk.BindManifest(src, trustDomain)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}
