package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aipfleet/aipfleet/hostsdk"
	"github.com/aipfleet/aipfleet/internal/flagsuggest"
)

// env is what a command may touch of the outside world.
type env struct {
	getenv func(string) string
	stdout io.Writer
	stderr io.Writer
	// sets are the flag sets the command made (flags), whose variables
	// the command's error is checked against (withEnvNotes).
	sets []*flagSet
}

// flags returns a new flag set of command c, reading e's environment.
func (e *env) flags(c *command) *flagSet {
	fs := newFlagSet(c, e.getenv)
	e.sets = append(e.sets, fs)
	return fs
}

// withEnvNotes adds to err, for each flag it names whose value came from
// the flag's environment variable rather than the command line, which
// variable set it: an error about --url when the command line has no
// --url is otherwise a puzzle. The value is not repeated (a variable may
// hold a token). A usage error stays one. An error that names the
// variable before the flag already says it.
func withEnvNotes(err error, sets []*flagSet) error {
	if err == nil || errors.Is(err, errHelpShown) {
		return err
	}
	msg := err.Error()
	var notes []string
	for _, fs := range sets {
		for _, name := range fs.fromEnv {
			if strings.Contains(msg, fs.envOf[name]+" (--"+name) {
				// The error already starts from the variable
				// (hostsdk's "AIP_CONNECTOR_HOST_MAX_IN_FLIGHT
				// (--max-in-flight, ...) is ...").
				continue
			}
			if regexp.MustCompile(`--` + regexp.QuoteMeta(name) + `($|[^A-Za-z0-9-])`).MatchString(msg) {
				notes = append(notes, fmt.Sprintf("--%s was set by the environment variable %s", name, fs.envOf[name]))
			}
		}
	}
	if len(notes) == 0 {
		return err
	}
	note := "\n(" + strings.Join(notes, "; ") + ")"
	var u *usageError
	if errors.As(err, &u) {
		return &usageError{msg: msg + note, err: u.err}
	}
	return fmt.Errorf("%w%s", err, note)
}

// command is one subcommand. Commands with subcommands of their own (such
// as `registry`) dispatch inside run.
type command struct {
	name     string
	summary  string
	usage    string // argument synopsis after the command name
	long     string // paragraph(s) shown by --help
	examples []string
	// envPrefix names the environment variables of the command's flags:
	// flag --lease-ttl with prefix AIP_CONTROL_ reads AIP_CONTROL_LEASE_TTL.
	envPrefix string
	// run parses its flags with e.flags(c) and does the work.
	run func(ctx context.Context, c *command, e *env, args []string) error
}

// commandList returns every command, in the order of the help text.
func commandList() []*command {
	return []*command{
		devCommand(),
		actionCommand(),
		capabilityCommand(),
		eventsCommand(),
		fleetCommand(),
		controlPlaneCommand(),
		dispatchCommand(),
		hostCommand(),
		registryCommand(),
		keygenCommand(),
		tokenCommand(),
		versionCommand(),
	}
}

func lookup(name string) *command {
	for _, c := range commandList() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// errHelpShown is returned after printing help: the process exits 0
// without another message.
var errHelpShown = errors.New("help shown")

// usageError is a mistake on the command line, or in a file a flag names
// (settingError); the process exits 2.
type usageError struct {
	msg string
	err error // what a settingError stands for, for errors.Is and As
}

func (e *usageError) Error() string { return e.msg }
func (e *usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return &usageError{msg: fmt.Sprintf(format, args...)} }

// settingError makes err, about a file a flag names that cannot be used
// (missing, readable by others, too large, not a key, a certificate or a
// valid fleet file), a usage error: the process exits 2, as aipfleet host
// does for its files (docs/operator-guide.md, section 10), since starting
// it again cannot help until the setting or the file is fixed. Such
// errors exited 1, the status of a failure at run time. The message is
// err's.
func settingError(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{msg: err.Error(), err: err}
}

// flagFileError is the settingError of every file a flag names: the message
// starts with command ("control-plane", "action send"), as the command's
// other usage errors do, then the flag ("--issuer-key", "-f"), then err
// ("secret file k does not exist"). Errors of some such files named the
// flag alone, which left the command to guess in a script of several.
func flagFileError(command, flag string, err error) error {
	return settingError(fmt.Errorf("%s: %s: %w", command, flag, err))
}

// run is the whole program: main only calls it. It owns the signal context.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	ctx, stop := hostsdk.NotifyStop(ctx)
	defer stop()
	e := &env{getenv: getenv, stdout: stdout, stderr: stderr}
	if len(args) == 0 {
		printMainHelp(stderr)
		return usagef("no command given; see the list above")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		if len(args) > 1 {
			if c := lookup(args[1]); c != nil {
				return c.run(ctx, c, e, []string{"--help"})
			}
			return usagef("unknown command %q; run `aipfleet --help` for the list", args[1])
		}
		printMainHelp(stdout)
		return errHelpShown
	case "-version", "--version":
		args = []string{"version"}
	}
	c := lookup(args[0])
	if c == nil {
		return usagef("unknown command %q; run `aipfleet --help` for the list", args[0])
	}
	return withEnvNotes(c.run(ctx, c, e, args[1:]), e.sets)
}

func printMainHelp(w io.Writer) {
	fmt.Fprint(w, `aipfleet runs and operates an AIP 1.0 connector fleet.

Usage:
  aipfleet <command> [flags]

Commands:
`)
	sorted := commandList()
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].name < sorted[j].name })
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range sorted {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprint(w, `
Settings are flags; most can also come from an environment variable,
which each command's --help lists next to its flag. A flag wins over its
variable. Secrets (keys, database URLs) are only read from files.

Exit status: 0 done; 2 a setting to fix: a flag, or a file a flag names
that is missing, readable by others or not what the flag wants (a key,
a certificate, a fleet file), which running the command again cannot fix;
1 a failure at run time (a database, a server or an action that did not
succeed), which the error describes.

Start here:
  aipfleet dev                  a whole fleet on this machine, no setup
  aipfleet help <command>       what a command does, its flags and examples

The README's tour, docs/operator-guide.md and docs/connector-guide.md
explain the rest.
`)
}

func printCommandHelp(w io.Writer, c *command, fs *flagSet) {
	fmt.Fprintf(w, "aipfleet %s — %s\n\nUsage:\n  aipfleet %s %s\n", c.name, c.summary, c.name, c.usage)
	if c.long != "" {
		fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.long))
	}
	fs.printDefaults(w)
	if len(c.examples) > 0 {
		fmt.Fprintln(w, "\nExamples:")
		for _, ex := range c.examples {
			fmt.Fprintf(w, "  %s\n", ex)
		}
	}
}

// flagSet wraps flag.FlagSet: every flag also reads an environment
// variable named after it, and help lists those names.
type flagSet struct {
	cmd    *command
	fs     *flag.FlagSet
	getenv func(string) string
	envOf  map[string]string // flag name -> env name ("" for none)
	// given counts how often each flag appeared on the command line, over
	// every parse; a flag given twice is refused (the flag package would
	// silently keep the last value, dropping e.g. the first of two
	// --issuer flags).
	given   map[string]int
	dup     string // the first flag given twice
	parsing bool
	// fromEnv lists the flags whose value came from their environment
	// variable, for envNotes.
	fromEnv []string
	// sub is the subcommand subcommand found ("send" of action send), ""
	// before it or for a command without subcommands.
	sub string
}

// typed is the command as the user typed it, for the errors of its flags:
// "action send" once subcommand found send, else "action". Those errors
// named the top command alone, while the command's other errors name the
// subcommand too.
func (f *flagSet) typed() string {
	if f.sub == "" {
		return f.cmd.name
	}
	return f.cmd.name + " " + f.sub
}

// countedValue counts the command-line settings of its flag.
type countedValue struct {
	flag.Value
	name string
	set  *flagSet
}

func (v *countedValue) Set(s string) error {
	if v.set.parsing {
		v.set.given[v.name]++
		if v.set.given[v.name] > 1 {
			v.set.dup = v.name
			return errors.New("given more than once")
		}
	}
	if err := v.Value.Set(s); err != nil {
		return valueError(v.Get(), err)
	}
	return nil
}

// valueError replaces the flag package's bare "parse error" (also what an
// environment variable's value gets) with the form the value must take.
func valueError(current any, err error) error {
	if err.Error() != "parse error" {
		return err
	}
	switch current.(type) {
	case time.Duration:
		return errors.New("want a duration with its unit, such as 30s, 5m or 1h30m")
	case int:
		return errors.New("want a whole number")
	case bool:
		return errors.New("want true or false")
	}
	return err
}

// IsBoolFlag keeps boolean flags usable without a value.
func (v *countedValue) IsBoolFlag() bool {
	b, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// Get keeps the value readable through flag.Getter.
func (v *countedValue) Get() any {
	if g, ok := v.Value.(flag.Getter); ok {
		return g.Get()
	}
	return v.Value.String()
}

// listHint tells how to give several values to a flag that takes a list.
func (f *flagSet) listHint(name string) string {
	if fl := f.fs.Lookup(name); fl != nil && strings.Contains(fl.Usage, "[,") {
		return " (several values go in one comma-separated list)"
	}
	return ""
}

func newFlagSet(c *command, getenv func(string) string) *flagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	return &flagSet{cmd: c, fs: fs, getenv: getenv, envOf: map[string]string{}}
}

func (f *flagSet) envName(name string) string {
	if f.cmd.envPrefix == "" {
		return ""
	}
	return f.cmd.envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

func (f *flagSet) String(name, def, usage string) *string {
	f.envOf[name] = f.envName(name)
	return f.fs.String(name, def, usage)
}

func (f *flagSet) Bool(name string, def bool, usage string) *bool {
	f.envOf[name] = f.envName(name)
	return f.fs.Bool(name, def, usage)
}

func (f *flagSet) Int(name string, def int, usage string) *int {
	f.envOf[name] = f.envName(name)
	return f.fs.Int(name, def, usage)
}

func (f *flagSet) Duration(name string, def time.Duration, usage string) *time.Duration {
	f.envOf[name] = f.envName(name)
	return f.fs.Duration(name, def, usage)
}

func (f *flagSet) StringVar(p *string, name, def, usage string) {
	f.envOf[name] = f.envName(name)
	f.fs.StringVar(p, name, def, usage)
}

func (f *flagSet) BoolVar(p *bool, name string, def bool, usage string) {
	f.envOf[name] = f.envName(name)
	f.fs.BoolVar(p, name, def, usage)
}

func (f *flagSet) IntVar(p *int, name string, def int, usage string) {
	f.envOf[name] = f.envName(name)
	f.fs.IntVar(p, name, def, usage)
}

func (f *flagSet) DurationVar(p *time.Duration, name string, def time.Duration, usage string) {
	f.envOf[name] = f.envName(name)
	f.fs.DurationVar(p, name, def, usage)
}

// NoEnv marks a flag as command-line only.
func (f *flagSet) NoEnv(name string) { f.envOf[name] = "" }

// parse parses args; flags not given on the command line take their
// environment variable when it is set. --help prints the command's help
// and returns errHelpShown.
func (f *flagSet) parse(args []string, stdout io.Writer) error {
	if f.given == nil {
		f.given = map[string]int{}
		f.fs.VisitAll(func(fl *flag.Flag) {
			fl.Value = &countedValue{Value: fl.Value, name: fl.Name, set: f}
		})
	}
	f.parsing = true
	parseErr := f.fs.Parse(args)
	f.parsing = false
	if f.dup != "" {
		return usagef("%s: --%s is given more than once; give it once%s (run `aipfleet %s --help`)", f.typed(), f.dup, f.listHint(f.dup), f.cmd.name)
	}
	if parseErr != nil {
		if errors.Is(parseErr, flag.ErrHelp) {
			printCommandHelp(stdout, f.cmd, f)
			return errHelpShown
		}
		return usagef("%s: %s (run `aipfleet %s --help`)", f.typed(), f.flagErrorText(parseErr), f.cmd.name)
	}
	given := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	// A command whose flags may follow its positional arguments parses
	// each run of flags in turn (action get ID --url U): a flag an
	// earlier run read from its variable may be given by this one, and
	// one still not given is read again.
	f.fromEnv = slices.DeleteFunc(f.fromEnv, func(name string) bool { return given[name] })
	var err error
	f.fs.VisitAll(func(fl *flag.Flag) {
		envName := f.envOf[fl.Name]
		if err != nil || given[fl.Name] || envName == "" {
			return
		}
		if v, ok := lookupEnv(f.getenv, envName); ok {
			if setErr := fl.Value.Set(v); setErr != nil {
				err = usagef("%s: environment variable %s=%q: %v", f.typed(), envName, v, setErr)
			} else if !slices.Contains(f.fromEnv, fl.Name) {
				f.fromEnv = append(f.fromEnv, fl.Name)
			}
		}
	})
	return err
}

// parseInterleaved parses args whose flags may come before, between or
// after positional arguments (action get ID --url U), and returns the
// positional arguments in order.
func (f *flagSet) parseInterleaved(args []string, stdout io.Writer) ([]string, error) {
	var rest []string
	for remaining := args; ; {
		if err := f.parse(remaining, stdout); err != nil {
			return nil, err
		}
		if remaining = f.args(); len(remaining) == 0 {
			return rest, nil
		}
		rest, remaining = append(rest, remaining[0]), remaining[1:]
	}
}

// flagErrorText is the flag package's parse error with the flags spelled
// as the help spells them (--name, not -name) and its "flag provided but
// not defined" said plainly, with the flag it most likely meant when one
// is close ("unknown flag --max-in-flite; did you mean --max-in-flight?").
func (f *flagSet) flagErrorText(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		name = strings.TrimPrefix(name, "-")
		if known := flagsuggest.Closest(f.fs, name); known != "" {
			return "unknown flag --" + name + "; did you mean --" + known + "?"
		}
		return "unknown flag --" + name
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + strings.TrimPrefix(name, "-") + " needs a value"
	}
	f.fs.VisitAll(func(fl *flag.Flag) {
		for _, form := range []string{" for flag -", " for -"} {
			if old := form + fl.Name + ": "; strings.Contains(msg, old) {
				msg = strings.Replace(msg, old, strings.TrimSuffix(form, "-")+"--"+fl.Name+": ", 1)
			}
		}
	})
	return msg
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func (f *flagSet) printDefaults(w io.Writer) {
	fmt.Fprintln(w, "\nFlags:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	f.fs.VisitAll(func(fl *flag.Flag) {
		def := ""
		if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" {
			def = " (default " + fl.DefValue + ")"
		}
		envCol := ""
		if n := f.envOf[fl.Name]; n != "" {
			envCol = "$" + n
		}
		fmt.Fprintf(tw, "  --%s\t%s\t%s%s\n", fl.Name, envCol, fl.Usage, def)
	})
	tw.Flush()
}

// noArgs refuses positional arguments, for commands that take none: a
// stray word (a value with a space in it, a file name without its flag)
// must not be dropped silently.
func (f *flagSet) noArgs() error {
	if a := f.args(); len(a) > 0 {
		return usagef("%s: unexpected argument %q; every setting is a flag (run `aipfleet %s --help`)", f.typed(), a[0], f.cmd.name)
	}
	return nil
}

// notEmpty refuses each of names given on the command line with an empty
// value: `--token "$TOKEN"` with TOKEN unset would otherwise fall back,
// in silence, to what the flag's absence means (aipfleet dev's token, its
// state directory), which is not what the command line asked for. fix
// says, for each flag, what to do instead.
func (f *flagSet) notEmpty(cmd string, fix map[string]string) error {
	names := make([]string, 0, len(fix))
	for name := range fix {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if f.given[name] == 0 {
			continue
		}
		if fl := f.fs.Lookup(name); fl != nil && fl.Value.String() == "" {
			return usagef("%s: --%s is empty (an unset shell variable?): %s", cmd, name, fix[name])
		}
	}
	return nil
}

// subcommand returns the subcommand args start with, one of subs. The
// subcommand comes before the flags: a command line that starts with
// flags (or is empty) is parsed, for --help, and refused, saying to put
// the subcommand first when it follows the flags (aipfleet fleet --json
// status: the flag package stops at the first word that is not a flag, so
// the flags after it would not be read) or to name one; an unknown first
// word is refused before any flag is parsed (`fleet bogus --help` is no
// help for status).
func (f *flagSet) subcommand(args []string, stdout io.Writer, subs ...string) (string, error) {
	list := subs[len(subs)-1]
	if len(subs) > 1 {
		list = strings.Join(subs[:len(subs)-1], ", ") + " or " + list
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if err := f.parse(args, stdout); err != nil {
			return "", err
		}
		if a := f.args(); len(a) > 0 && slices.Contains(subs, a[0]) {
			return "", usagef("%s: the subcommand comes first, then its flags: aipfleet %s %s [flags]", f.cmd.name, f.cmd.name, a[0])
		}
		return "", usagef("%s: name a subcommand: %s (run `aipfleet %s --help`)", f.cmd.name, list, f.cmd.name)
	}
	if !slices.Contains(subs, args[0]) {
		return "", usagef("%s: unknown subcommand %q; use %s", f.cmd.name, args[0], list)
	}
	f.sub = args[0]
	return args[0], nil
}

// isSet reports whether name was given on the command line or through its
// environment variable (after parse).
func (f *flagSet) isSet(name string) bool {
	if f.given[name] > 0 {
		return true
	}
	env := f.envOf[name]
	return env != "" && f.getenv(env) != ""
}

// args returns the positional arguments after the flags.
func (f *flagSet) args() []string { return f.fs.Args() }
