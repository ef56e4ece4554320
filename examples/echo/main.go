// Command echo runs the echo connector (package echoconnector) as a
// standalone AIP connector host built with hostsdk: echo.say echoes a
// message and counts its side effect per action in the runtime journal,
// echo.stream sends progress chunks first. It is configured purely
// by the common connector host flags and AIP_CONNECTOR_HOST_* variables (run
// it with -h for the list) and exits with status 0 only after a clean drain
// and offline transition. A mistake in how it was started (an unknown flag,
// a stray argument, a value the settings refuse) exits 2, as aip-host and
// the connector guide's noteshost do; a start that failed or a drain that
// was not clean exits 1.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/aipfleet/aipfleet/examples/echo/echoconnector"
	"github.com/aipfleet/aipfleet/hostsdk"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "echo:", err)
	}
	os.Exit(exitCode(err))
}

// exitCode is the exit status for run's error, as the connector guide's
// noteshost has it: 2 for a mistake in how the program was started (a
// usageError: an unknown flag, a stray argument, a bad --log-level; or a
// setting, or a file a setting names, that the host refuses,
// hostsdk.ErrSetting), 1 for a start that failed at run time or a drain
// that was not clean, 0 for none or -h.
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
// argument or a bad log level.
type usageError struct{ error }

// run parses flags and the environment, then runs the host until SIGINT or
// SIGTERM and a clean drain.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("echo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	load := hostsdk.BindFlags(fs)
	level := fs.String("log-level", "info", "debug, info, warn or error [$AIP_ECHO_LOG_LEVEL]")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q; every setting is a flag", fs.Arg(0))}
	}
	lvl, source := *level, "--log-level"
	if v := getenv("AIP_ECHO_LOG_LEVEL"); v != "" && !flagSet(fs, "log-level") {
		lvl, source = v, "AIP_ECHO_LOG_LEVEL"
	}
	var sl slog.Level
	if err := sl.UnmarshalText([]byte(lvl)); err != nil {
		return usageError{fmt.Errorf("%s %q: want debug, info, warn or error", source, lvl)}
	}
	cfg, err := load(getenv)
	if err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: sl}))
	cfg.OpenJournal = journalOpener(cfg)

	host, err := hostsdk.New(cfg, echoconnector.Connector{})
	if err != nil {
		return err
	}
	ctx, stop := hostsdk.NotifyStop(ctx)
	defer stop()
	return host.Run(ctx)
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
