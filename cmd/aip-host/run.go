package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/hostrun"
	"github.com/aipfleet/aipfleet/products"
)

// commonSettings are aip-host's own settings, beside the host's and the
// product's.
var commonSettings = []hostsdk.Setting{
	{Flag: "log-level", Env: "AIP_HOST_LOG_LEVEL", Usage: "debug, info, warn or error (default info)", Check: hostrun.CheckLogLevel},
	hostrun.LogFormatSetting("AIP_HOST_LOG_FORMAT"),
	{Flag: "print-manifest", Env: "AIP_HOST_PRINT_MANIFEST", Kind: hostsdk.SettingBool,
		Usage: "print the bound manifest and its digest as JSON, then exit"},
}

func names() []string {
	var out []string
	for n := range catalog {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "Usage: aip-host <product> [flags]\n\nRuns a built-in product adapter as an AIP connector host. Products:\n\n")
	width := 0
	for _, n := range names() {
		width = max(width, len(n))
	}
	for _, n := range names() {
		fmt.Fprintf(w, "  %-*s  %s\n", width, n, catalog[n].Summary)
	}
	fmt.Fprintf(w, "\n`aip-host <product> --help` lists the product's flags.\n")
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return hostrun.Usagef("name a product: %s", strings.Join(names(), ", "))
		}
		return flag.ErrHelp
	}
	p, ok := catalog[args[0]]
	if !ok {
		return hostrun.Usagef("unknown product %q; want one of %s", args[0], strings.Join(names(), ", "))
	}
	fs := flag.NewFlagSet("aip-host "+p.Name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: aip-host %s [flags]\n\n%s\n\nFlags:\n", p.Name, p.Summary)
		hostrun.PrintDefaults(stderr, fs)
	}
	loadHost, loadCommon, loadProduct := bindFlags(fs, p)
	if err := hostrun.ParseFlags(fs, args[1:], stderr, "aip-host "+p.Name+" --help"); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return hostrun.Usagef("unexpected argument %q; every setting is a flag (run `aip-host %s --help` for the flags)", fs.Arg(0), p.Name)
	}
	common, err := loadCommon(getenv)
	if err != nil {
		return err
	}
	var level slog.Level
	if v := common["log-level"]; v != "" {
		level, _ = hostrun.ParseLogLevel(v) // checked by the setting
	}
	logger := hostrun.NewLogger(stderr, common["log-format"], level).With("product", p.Name)
	values, err := loadProduct(getenv)
	if err != nil {
		return err
	}
	conn, err := p.New(values, logger)
	if err != nil {
		return fmt.Errorf("%s: %w", p.Name, err)
	}
	cfg, err := loadHost(getenv)
	if err != nil {
		return err
	}
	if common.Bool("print-manifest") {
		// The manifest bound for the configured tenant and trust domain,
		// its digest and the implementation support every capability
		// needs, as aipfleet host and aip-sidecar print them.
		r, err := hostrun.DescribeConnector(ctx, conn, cfg)
		if err != nil {
			return err
		}
		return r.Print(stdout)
	}
	cfg.Logger = logger
	ctx, stop := hostsdk.NotifyStop(ctx)
	defer stop()
	return hostrun.Run(ctx, cfg, conn, getenv, "aip-host-"+p.Name)
}

// bindFlags defines the host's, aip-host's and the product's flags on fs
// and returns their loaders.
func bindFlags(fs *flag.FlagSet, p products.Product) (
	loadHost func(func(string) string) (hostsdk.Config, error),
	loadCommon, loadProduct func(func(string) string) (hostsdk.SettingValues, error),
) {
	return hostsdk.BindFlags(fs), hostsdk.BindSettings(fs, commonSettings), hostsdk.BindSettings(fs, p.Settings)
}
