package hostrun

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/flagsuggest"
)

// UsageError is a mistake on the command line of a host program (an
// unknown flag or product, a flag's malformed value, a stray argument);
// the process exits 2 (ExitCode).
type UsageError struct{ msg string }

func (e *UsageError) Error() string { return e.msg }

// Usagef is a *UsageError with the formatted message.
func Usagef(format string, args ...any) error {
	return &UsageError{fmt.Sprintf(format, args...)}
}

// Settingf is an error with the formatted message (%w wraps, as with
// fmt.Errorf) that matches hostsdk.ErrSetting: a setting, or a file a
// setting names, that the program itself refuses (aip-sidecar's
// --log-level, a token file it cannot read), so that ExitCode is 2.
func Settingf(format string, args ...any) error {
	return &settingError{fmt.Errorf(format, args...)}
}

type settingError struct{ err error }

func (e *settingError) Error() string   { return e.err.Error() }
func (e *settingError) Unwrap() []error { return []error{e.err, hostsdk.ErrSetting} }

// ExitCode is a host program's exit status for the error its run
// returned, the one rule of aip-host, aip-sidecar and aipfleet host:
//
//   - 0 for none or -h (flag.ErrHelp);
//   - 2 when the operator must change how the program is started: a
//     mistake on the command line (a *UsageError: an unknown flag or
//     product, a stray argument), or a setting or a file a setting names
//     that is refused (hostsdk.ErrSetting: a value the settings refuse
//     when read, a product adapter's refusal, hostsdk.New's
//     *ConfigError, bootstrap step 1's *ValidateError such as a
//     --signing-seed-file others can read, a --database-url-file
//     JournalOpener cannot use, an OTEL_EXPORTER_OTLP_* value
//     TracerProvider refuses, a *sidecar.ConfigError such as an empty
//     --local-url, Settingf, a registration the control plane refused
//     because a setting differs from what the fleet pre-provisioned for
//     the replica: a --signing-seed-file whose DID is not the replica's
//     peer_did, a --replica-id not pre-provisioned, another instance,
//     version, endpoint, trust domain, topology, tenant, configuration
//     revision, secret-provider reference or artifact digest);
//   - 1 for a failure at run time: a later bootstrap step (the journal's
//     database, the connector's discovery or health, a registration not
//     answered or refused for another reason: a version not active, an
//     instance disabled, a manifest not the admitted one), a drain that
//     was not clean.
func ExitCode(err error) int {
	var usage *UsageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &usage), errors.Is(err, hostsdk.ErrSetting):
		return 2
	}
	return 1
}

// ParseFlags parses args into fs, whose output it silences: a mistake is
// a *UsageError of one line that names it and the command that lists the
// flags (help, such as "aip-sidecar --help"), not the whole flag list
// with the mistake above it; an unknown flag's names the flag it most
// likely meant, if one is close ("unknown flag --max-in-flite; did you
// mean --max-in-flight? (run `aip-sidecar --help` for the flags)"). Flags
// are written with two dashes, as the flag list (PrintDefaults), hostsdk
// and aipfleet write them; the flag package takes one or two. -h (or
// --help) prints the flag list to stderr with fs.Usage and returns
// flag.ErrHelp.
func ParseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, help string) error {
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
	return Usagef("%s (run `%s` for the flags)", flagErrorText(fs, err), help)
}

// flagErrorText is the flag package's parse error with the flags written
// with two dashes and "flag provided but not defined" said plainly, with
// the flag most likely meant when one is close.
func flagErrorText(fs *flag.FlagSet, err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
		name = strings.TrimLeft(name, "-")
		msg = "unknown flag --" + name
		if known := flagsuggest.Closest(fs, name); known != "" {
			msg += "; did you mean --" + known + "?"
		}
		return msg
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: "); ok {
		return "flag needs an argument: --" + strings.TrimLeft(name, "-")
	}
	// "invalid value %q for flag -name: ...", "invalid boolean value %q
	// for -name: ...".
	fs.VisitAll(func(fl *flag.Flag) {
		for _, form := range []string{" for flag -", " for -"} {
			if old := form + fl.Name + ": "; strings.Contains(msg, old) {
				msg = strings.Replace(msg, old, strings.TrimSuffix(form, "-")+"--"+fl.Name+": ", 1)
			}
		}
	})
	return msg
}

// PrintDefaults writes fs's flag list to w as fs.PrintDefaults does, but
// with each flag written with two dashes ("  --bind string"), as the
// commands' messages write them.
func PrintDefaults(w io.Writer, fs *flag.FlagSet) {
	var b strings.Builder
	out := fs.Output()
	fs.SetOutput(&b)
	fs.PrintDefaults()
	fs.SetOutput(out)
	for _, line := range strings.SplitAfter(b.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "  -"); ok {
			line = "  --" + rest
		}
		io.WriteString(w, line)
	}
}
