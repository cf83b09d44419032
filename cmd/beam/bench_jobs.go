package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
)

// jobsBenchFlags are the flags only --mode jobs reads.
type jobsBenchFlags struct {
	workers, publishers int
	key                 string
	unsigned            bool
}

func (j *jobsBenchFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&j.workers, "workers", 16, "--mode jobs: concurrent workers (claim then fulfill)")
	fs.IntVar(&j.publishers, "publishers", 4, "--mode jobs: concurrent publishers")
	fs.StringVar(&j.key, "intent-key", "", "--mode jobs with --url: API key of the Intent Protocol listener at --url (default $BUS_SECRET)")
	fs.BoolVar(&j.unsigned, "unsigned", false, "--mode jobs: send requests without HMAC signatures")
}

// benchJobs runs `beam bench --mode jobs`: publish --count jobs, then drain
// them with --workers, against --url (the Intent Protocol listener) or a
// started beam serve.
func benchJobs(ctx context.Context, f *benchFlags, j *jobsBenchFlags, logger *slog.Logger, stdout, stderr io.Writer) error {
	cfg := bench.JobsConfig{URL: f.url, Key: j.key, Count: f.count, Publishers: j.publishers, Workers: j.workers,
		Sign: !j.unsigned, PayloadBytes: f.payloadBytes, ServerPID: f.serverPID, Logger: logger}
	if cfg.Key == "" {
		cfg.Key = os.Getenv("BUS_SECRET")
	}
	var notes []string
	var single *bench.JobsSummary // the same load on one node, before a cluster run
	if f.url == "" {
		cfg.Key = newJobsKey()
		if f.clusterNodes > 0 && f.compareSingle {
			srv, stop, err := startJobsServer(ctx, f, cfg.Key, stderr)
			if err != nil {
				return err
			}
			one := cfg
			one.URL, one.ServerPID = srv.IntentURL, srv.PID
			single, err = bench.RunJobs(ctx, one)
			stop()
			if err != nil {
				return fmt.Errorf("one-node run: %w", err)
			}
		}
		if f.clusterNodes > 0 {
			nodes, cleanup, err := startBenchCluster(ctx, f, stderr, []string{"--intent-listen", "127.0.0.1:0"}, []string{"BUS_SECRET=" + cfg.Key})
			if err != nil {
				return err
			}
			defer cleanup()
			for i, n := range nodes {
				if n.IntentURL == "" {
					return fmt.Errorf("beam serve printed no intent bus address")
				}
				cfg.NodeURLs, cfg.NodePIDs = append(cfg.NodeURLs, n.IntentURL), append(cfg.NodePIDs, n.PID)
				if i > 0 {
					cfg.WorkerURLs = append(cfg.WorkerURLs, n.IntentURL)
				}
			}
			cfg.URL = cfg.NodeURLs[0]
			notes = append(notes, fmt.Sprintf("%d cluster nodes: jobs published through node 0, claimed and fulfilled through the others; server figures summed over the nodes", len(nodes)))
		} else {
			srv, stop, err := startJobsServer(ctx, f, cfg.Key, stderr)
			if err != nil {
				return err
			}
			defer stop()
			cfg.URL, cfg.ServerPID = srv.IntentURL, srv.PID
		}
		notes = append(notes, "server started by beam bench with --sqlite-synchronous "+f.synchronous)
	} else if cfg.Key == "" {
		fmt.Fprintln(stderr, "beam bench: --mode jobs with --url needs --intent-key or BUS_SECRET")
		return errUsage
	}
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	sum, err := bench.RunJobs(ctx, cfg)
	if sum != nil && single != nil {
		sum.CompareSingle(single)
	}
	if sum != nil {
		sum.Notes = append(sum.Notes, notes...)
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

// newJobsKey returns a fresh Intent Protocol API key for a started server.
func newJobsKey() string {
	var kb [24]byte
	_, _ = rand.Read(kb[:])
	return "bench_" + hex.EncodeToString(kb[:])
}

// startJobsServer starts beam serve with its Intent Protocol listener on
// a free port and key, on a temporary data directory, and returns it with
// a function that stops it and removes the directory.
func startJobsServer(ctx context.Context, f *benchFlags, key string, stderr io.Writer) (*bench.ServerProcess, func(), error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the beam binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "beam-bench-jobs-")
	if err != nil {
		return nil, nil, fmt.Errorf("data directory: %w", err)
	}
	opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous,
		Args: []string{"--log-level", "warn", "--intent-listen", "127.0.0.1:0"}, Env: []string{"BUS_SECRET=" + key}}
	if f.serverLog {
		opts.Output = stderr
	}
	srv, err := bench.StartServer(ctx, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
		_ = os.RemoveAll(dir)
	}
	if srv.IntentURL == "" {
		stop()
		return nil, nil, fmt.Errorf("beam serve printed no intent bus address")
	}
	return srv, stop, nil
}
