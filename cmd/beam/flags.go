package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// sharedEnvFlags are the flags that mean the same thing in every command
// that has them, so one variable (BEAM_URL, BEAM_DATA_DIR, …) sets them all.
var sharedEnvFlags = map[string]bool{
	"url": true, "identity": true, "data-dir": true, "admin-token": true,
	"log-level": true, "log-format": true, "api-key": true,
}

// envName is the environment variable that sets the flag flagName of the
// command cmdName ("beam poll"). Shared flags and every flag of beam serve
// use BEAM_<FLAG>; the other flags are named after their command
// (BEAM_POLL_STATUS, BEAM_KEYGEN_OUT), so that no variable means two things.
func envName(cmdName, flagName string) string {
	up := func(s string) string { return strings.ToUpper(strings.NewReplacer("-", "_", " ", "_").Replace(s)) }
	cmd := strings.TrimSpace(strings.TrimPrefix(cmdName, "beam"))
	if cmd == "trace" && flagName == "url" {
		// trace reads --data-dir unless --url is given: BEAM_URL, set for
		// the agent commands, must not turn it into a remote trace.
		return "BEAM_TRACE_URL"
	}
	if sharedEnvFlags[flagName] || cmd == "" || cmd == "serve" {
		return "BEAM_" + up(flagName)
	}
	return "BEAM_" + up(cmd) + "_" + up(flagName)
}

// parseFlags applies BEAM_* environment values to every flag of fs that the
// environment sets, then parses args, so that flags win over the environment.
// Each flag's usage names its variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage = fmt.Sprintf("%s (env %s)", f.Usage, envName(fs.Name(), f.Name))
	})
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(fs.Name(), f.Name)); ok && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(fs.Name(), f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	return parseInterleaved(fs, args)
}

// parseInterleaved parses args like fs.Parse but also accepts flags after
// positional arguments (beam send TO INTENT --durable); everything after
// "--" is positional. The positional arguments end up in fs.Args().
func parseInterleaved(fs *flag.FlagSet, args []string) error {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		// fs.Parse stops at the first non-flag or after "--".
		consumed := len(args) - len(rest)
		if consumed > 0 && args[consumed-1] == "--" {
			positional = append(positional, rest...)
			break
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
	// Leave the positional arguments in fs.Args().
	return fs.Parse(append([]string{"--"}, positional...))
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// anyArgs as the maximum of cmdFlags.parse lets a command take any number of
// positional arguments.
const anyArgs = -1

// cmdFlags is the flag set of one command, writing its usage and errors to
// the command's stderr.
type cmdFlags struct {
	*flag.FlagSet
	// brief, when set, is the one-line usage printed instead of the full
	// usage on a bad command line.
	brief string
	// hidden are flags left out of the usage (old names kept as aliases).
	hidden map[string]bool
}

// alias registers name as a flag that sets the same value as the flag to,
// left out of the usage: an old name kept working.
func (c *cmdFlags) alias(name, to string) {
	f := c.Lookup(to)
	c.Var(f.Value, name, "same as --"+to)
	if c.hidden == nil {
		c.hidden = map[string]bool{}
	}
	c.hidden[name] = true
}

// printDefaults is PrintDefaults without the hidden flags.
func (c *cmdFlags) printDefaults() {
	if len(c.hidden) == 0 {
		c.PrintDefaults()
		return
	}
	shown := flag.NewFlagSet(c.Name(), flag.ContinueOnError)
	shown.SetOutput(c.Output())
	c.VisitAll(func(f *flag.Flag) {
		if !c.hidden[f.Name] {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

// newCmdFlags returns the flag set of the command name (e.g. "beam send").
// Its usage, printed for --help and on a bad command line, is
// "usage: "+synopsis, then the description lines set off by blank lines when
// there are any, then the flags.
func newCmdFlags(name, synopsis string, stderr io.Writer, description ...string) *cmdFlags {
	return newUsageCmdFlags(name, synopsis, stderr, true, description)
}

// newCompactCmdFlags is newCmdFlags with the description lines printed
// without blank lines around them.
func newCompactCmdFlags(name, synopsis string, stderr io.Writer, description ...string) *cmdFlags {
	return newUsageCmdFlags(name, synopsis, stderr, false, description)
}

// newUsageCmdFlags builds the flag set of newCmdFlags (padded) or of
// newCompactCmdFlags.
func newUsageCmdFlags(name, synopsis string, stderr io.Writer, padded bool, description []string) *cmdFlags {
	c := newFlagSet(name, stderr)
	c.Usage = func() {
		fmt.Fprintln(stderr, "usage: "+synopsis)
		pad := padded && len(description) > 0
		if pad {
			fmt.Fprintln(stderr)
		}
		for _, line := range description {
			fmt.Fprintln(stderr, line)
		}
		if pad {
			fmt.Fprintln(stderr)
		}
		c.printDefaults()
	}
	return c
}

// newPlainCmdFlags returns the flag set of the command name with the flag
// package's own --help text; a bad command line prints only
// "usage: "+synopsis.
func newPlainCmdFlags(name string, stderr io.Writer, synopsis string) *cmdFlags {
	c := newFlagSet(name, stderr)
	c.brief = "usage: " + synopsis
	return c
}

// newFlagSet returns an empty flag set of the command name writing to stderr.
func newFlagSet(name string, stderr io.Writer) *cmdFlags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return &cmdFlags{FlagSet: fs}
}

// parse applies the environment and args (see parseFlags) and checks that
// between minArgs and maxArgs positional arguments remain (maxArgs anyArgs:
// no upper bound). A wrong count prints the usage and returns errUsage.
func (c *cmdFlags) parse(args []string, minArgs, maxArgs int) error {
	if err := c.parseArgs(args); err != nil {
		return err
	}
	if c.NArg() < minArgs || (maxArgs != anyArgs && c.NArg() > maxArgs) {
		return c.usageError()
	}
	return nil
}

// parseNoArgs is parse for a command that takes no positional arguments and
// whose usage is long: an argument is reported on one line, without the
// usage.
func (c *cmdFlags) parseNoArgs(args []string) error {
	if err := c.parseArgs(args); err != nil {
		return err
	}
	if c.NArg() > 0 {
		fmt.Fprintf(c.Output(), "%s: unexpected arguments %v\n", c.Name(), c.Args())
		return errUsage
	}
	return nil
}

// usageError prints the usage (or the brief one) and returns errUsage, for
// a command line that parsed but is missing something the command needs.
func (c *cmdFlags) usageError() error {
	if c.brief != "" || c.Usage == nil {
		fmt.Fprintln(c.Output(), c.brief)
	} else {
		c.Usage()
	}
	return errUsage
}

// parseArgs is parseFlags for the command. A bad flag has already been
// reported by the flag package (its error line, then the usage), so it
// returns errUsage rather than the error, which would be printed a second
// time below the usage.
func (c *cmdFlags) parseArgs(args []string) error {
	err := parseFlags(c.FlagSet, args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	if strings.HasPrefix(err.Error(), "BEAM_") {
		// An environment value: the flag package has printed nothing.
		return err
	}
	return errUsage
}

// missing reports a required flag the command line lacks: one error line
// naming it, then the usage.
func (c *cmdFlags) missing(flagName string) error {
	fmt.Fprintf(c.Output(), "%s: --%s is required\n", c.Name(), flagName)
	return c.usageError()
}

// leaseFlag is a duration flag that also takes plain seconds ("60" is 60s).
type leaseFlag struct{ d *time.Duration }

func (l leaseFlag) String() string {
	if l.d == nil {
		return ""
	}
	return l.d.String()
}

func (l leaseFlag) Set(v string) error {
	d, err := parseSecondsOrDuration(v)
	if err != nil {
		return err
	}
	*l.d = d
	return nil
}

// parseSecondsOrDuration parses "60" as 60 seconds and "90s", "2m" as Go
// durations.
func parseSecondsOrDuration(v string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("negative duration %q", v)
		}
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("%q is neither seconds (60) nor a duration (60s, 2m)", v)
	}
	return d, nil
}
