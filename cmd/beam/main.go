package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run a directory on embedded defaults", runServe},
		{"keygen", "generate an agent identity: beam keygen --beam-id ID [--out FILE]", runKeygen},
		{"register", "register an agent with a directory", runRegister},
		{"send", "send an intent and print the result: beam send TO INTENT [JSON]", runSend},
		{"approve", "approve a member of your org (org owner): beam approve MEMBER_ID", runApprove},
		{"acl", "let senders reach your agent: beam acl add|list|remove", runACL},
		{"poll", "print the agent's bus messages (--claim for a lease): beam poll", runPoll},
		{"ack", "record the outcome of a bus message: beam ack MESSAGE_ID", runAck},
		{"dead-letters", "list dead-lettered bus messages (operator)", runDeadLetters},
		{"requeue", "requeue a dead-lettered bus message (operator): beam requeue MESSAGE_ID", runRequeue},
		{"mesh", "pipelines of envelopes through agents: beam mesh create|get|list|watch|cancel|pause|resume|trace|dead-letters|requeue", runMesh},
		{"listen", "connect an agent and answer its intents until interrupted", runListen},
		{"cluster", "make the data directories of a new cluster: beam cluster init --nodes N --domain D --out DIR", runCluster},
		{"peer", "manage federation peers: beam peer show-self|add|list|remove|outbox|replay", runPeer},
		{"replay", "rebuild the projections from the event log", runReplay},
		{"trace", "print the events of one intent or job, in order with time deltas: beam trace [--data-dir DIR | --url URL] NONCE|JOB-ID|ENVELOPE-ID", runTrace},
		{"import", "append the intents of a Beam TypeScript database: beam import PATH", runImport},
		{"bench", "load-test a directory: beam bench [--url URL] [--mode ws|http] [--count N] [--concurrency C] [--json]", runBench},
		{"version", "print the version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 2 && args[0] == "help" {
		// beam help CMD is beam CMD --help.
		args = []string{args[1], "--help"}
	}
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "-v") {
		args = []string{"version"}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		switch {
		case err == nil:
			return 0
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		default:
			fmt.Fprintf(stderr, "beam %s: %v\n", c.name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "beam: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

// errUsage reports a command line the command could not use; the command has
// already printed why.
var errUsage = errors.New("usage")

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: beam <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'beam <command> --help' for the flags of a command.")
}

// newLogger builds the process logger from --log-level and --log-format.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, fmt.Errorf("log format %q: want text or json", format)
	}
}
