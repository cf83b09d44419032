package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// envName is the environment variable that sets the flag name.
func envName(flagName string) string {
	return "BEAM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags applies BEAM_* environment values to every flag of fs that the
// environment sets, then parses args, so that flags win over the environment.
// Each flag's usage names its variable.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage = fmt.Sprintf("%s (env %s)", f.Usage, envName(f.Name))
	})
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := os.LookupEnv(envName(f.Name)); ok && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		return envErr
	}
	return fs.Parse(args)
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
		c.PrintDefaults()
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
	if err := parseFlags(c.FlagSet, args); err != nil {
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
	if err := parseFlags(c.FlagSet, args); err != nil {
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
