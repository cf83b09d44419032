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
	"strings"
	"time"

	"github.com/beamdir/beam/internal/bench"
)

// benchFlags are the flags of beam bench. --url, --mode, --count,
// --concurrency and --json are a stable interface.
type benchFlags struct {
	url         string
	mode        string
	count       int
	concurrency int
	json        bool

	rate             float64
	duration         time.Duration
	warmup           int
	senders          int
	recipients       int
	idleAgents       int
	registerParallel int
	payloadBytes     int
	timeout          time.Duration
	serverPID        int

	synchronous string
	dataDir     string
	serverLog   bool
	logLevel    string

	restartEvents int
	inFlightEvery int
}

func (f *benchFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "url", "", "base URL of a running directory; empty starts `beam serve` on a temporary data directory")
	fs.StringVar(&f.mode, "mode", "ws", "how intents are sent: ws, http, bus or federation")
	fs.IntVar(&f.count, "count", 10000, "intents of a burn-down run")
	fs.IntVar(&f.concurrency, "concurrency", 64, "intents in flight at most")
	fs.BoolVar(&f.json, "json", false, "print one JSON object instead of the table")
	fs.Float64Var(&f.rate, "rate", 0, "steady-rate run: intents per second for --duration (0: burn-down of --count)")
	fs.DurationVar(&f.duration, "duration", 30*time.Second, "length of a steady-rate run")
	fs.IntVar(&f.warmup, "warmup", 200, "intents sent before the measurement, not counted")
	fs.IntVar(&f.senders, "senders", 0, "sending agents (default min(concurrency, 8))")
	fs.IntVar(&f.recipients, "recipients", 0, "answering agents (default min(concurrency, 8))")
	fs.IntVar(&f.idleAgents, "idle-agents", 0, "agents to register and keep connected but idle; the server's RSS is reported once they are connected")
	fs.IntVar(&f.registerParallel, "register-parallel", 16, "registrations in flight at most")
	fs.IntVar(&f.payloadBytes, "payload-bytes", 64, "filler bytes in each intent's payload")
	fs.DurationVar(&f.timeout, "timeout", 35*time.Second, "how long one intent may take")
	fs.IntVar(&f.serverPID, "server-pid", 0, "with --url: process id of the server on this machine, read for CPU and RSS")
	fs.StringVar(&f.synchronous, "sqlite-synchronous", "FULL", "without --url: SQLite synchronous mode of the started server")
	fs.StringVar(&f.dataDir, "data-dir", "", "without --url: data directory of the started server (default a temporary one, removed afterwards)")
	fs.BoolVar(&f.serverLog, "server-log", false, "without --url: copy the started server's log to stderr")
	fs.StringVar(&f.logLevel, "log-level", "warn", "progress log level on stderr: debug, info, warn, error")
	fs.IntVar(&f.restartEvents, "restart-events", 0, "instead of a load run: seed a log with this many events and time two starts of beam serve on it")
	fs.IntVar(&f.inFlightEvery, "restart-in-flight-every", 1000, "with --restart-events: leave every n-th seeded intent in flight (0: none)")
}

func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("beam bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f benchFlags
	f.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: beam bench [--url URL] [--mode ws|http|bus|federation] [--count N] [--concurrency C] [--json]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Registers real agents (each with its own Ed25519 key), sends signed intents that the")
		fmt.Fprintln(stderr, "recipients verify and answer with signed results, and prints intents/s, latency")
		fmt.Fprintln(stderr, "percentiles, errors and the server's CPU per intent and peak RSS. Without --url it")
		fmt.Fprintln(stderr, "starts `beam serve` on a temporary data directory and measures that process.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "beam bench: unexpected arguments %v\n", fs.Args())
		return errUsage
	}
	logger, err := newLogger(stderr, f.logLevel, "text")
	if err != nil {
		return err
	}
	if f.restartEvents > 0 {
		return benchRestart(ctx, &f, logger, stdout, stderr)
	}

	if err := bench.CheckMode(bench.Mode(f.mode)); err != nil {
		if errors.Is(err, bench.ErrModeUnavailable) {
			return fmt.Errorf("mode %s is not available yet: this build has no %s support to benchmark (available: ws, http)", f.mode, f.mode)
		}
		fmt.Fprintf(stderr, "beam bench: %v\n", err)
		return errUsage
	}
	cfg := bench.Config{
		URL: f.url, Mode: bench.Mode(f.mode), Count: f.count, Concurrency: f.concurrency,
		Rate: f.rate, Duration: f.duration, Warmup: f.warmup,
		Senders: f.senders, Recipients: f.recipients, IdleAgents: f.idleAgents,
		RegisterParallel: f.registerParallel, PayloadBytes: f.payloadBytes, Timeout: f.timeout,
		ServerPID: f.serverPID, Logger: logger,
	}
	if f.url == "" {
		if f.serverPID != 0 {
			fmt.Fprintln(stderr, "beam bench: --server-pid needs --url (without it the started server is measured)")
			return errUsage
		}
		srv, cleanup, err := startBenchServer(ctx, &f, stderr)
		if err != nil {
			return err
		}
		defer cleanup()
		cfg.URL, cfg.ServerPID = srv.URL, srv.PID
		logger.Info("started beam serve", "url", srv.URL, "pid", srv.PID, "ready", srv.Ready)
	}
	sum, err := bench.Run(ctx, cfg)
	if sum != nil {
		if f.url == "" {
			sum.Notes = append(sum.Notes, "server started by beam bench with --sqlite-synchronous "+strings.ToUpper(f.synchronous))
		}
		if f.json {
			if werr := sum.WriteJSON(stdout); werr != nil {
				return werr
			}
		} else if werr := sum.WriteTable(stdout); werr != nil {
			return werr
		}
	}
	return err
}

// startBenchServer starts beam serve for a run without --url and returns
// it with a function that stops it and removes a temporary data directory.
func startBenchServer(ctx context.Context, f *benchFlags, stderr io.Writer) (*bench.ServerProcess, func(), error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the beam binary: %w", err)
	}
	dir, remove := f.dataDir, func() {}
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-"); err != nil {
			return nil, nil, fmt.Errorf("data directory: %w", err)
		}
		remove = func() { _ = os.RemoveAll(dir) }
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("data directory: %w", err)
	}
	opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous, Args: []string{"--log-level", "warn"}}
	if f.serverLog {
		opts.Output = stderr
	}
	srv, err := bench.StartServer(ctx, opts)
	if err != nil {
		remove()
		return nil, nil, err
	}
	return srv, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := srv.Stop(sctx); err != nil {
			fmt.Fprintf(stderr, "beam bench: %v\n", err)
		}
		remove()
	}, nil
}

// benchRestart seeds a log and times restarts of beam serve on it.
func benchRestart(ctx context.Context, f *benchFlags, logger *slog.Logger, stdout, stderr io.Writer) error {
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the beam binary: %w", err)
	}
	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-restart-"); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("--data-dir %s is not empty; --restart-events seeds a fresh log", dir)
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("data directory: %w", err)
	}
	opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous, Args: []string{"--log-level", "warn"}}
	if f.serverLog {
		opts.Output = stderr
	}
	logger.Info("seeding the log", "events", f.restartEvents, "dir", dir)
	sum, err := bench.MeasureRestart(ctx, opts, bench.SeedOptions{Events: f.restartEvents, InFlightEvery: f.inFlightEvery})
	if err != nil {
		return err
	}
	if f.json {
		b, err := json.Marshal(sum)
		if err != nil {
			return fmt.Errorf("encode summary: %w", err)
		}
		_, err = fmt.Fprintln(stdout, string(b))
		return err
	}
	rss := "n/a"
	if sum.RestartRSSMB != nil {
		rss = fmt.Sprintf("%.1f", *sum.RestartRSSMB)
	}
	fmt.Fprintf(stdout, "events\tintents\tin flight\tseed s\tfirst start s\trestart s\trestart rss MB\n")
	fmt.Fprintf(stdout, "%d\t%d\t%d\t%.2f\t%.3f\t%.3f\t%s\n", sum.Events, sum.Intents, sum.InFlight, sum.SeedS, sum.FirstStartS, sum.RestartS, rss)
	return nil
}
