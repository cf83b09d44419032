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
	if f.url == "" {
		bin, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find the beam binary: %w", err)
		}
		dir, err := os.MkdirTemp("", "beam-bench-jobs-")
		if err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		defer os.RemoveAll(dir)
		var kb [24]byte
		_, _ = rand.Read(kb[:])
		cfg.Key = "bench_" + hex.EncodeToString(kb[:])
		opts := bench.ServerOptions{Binary: bin, DataDir: dir, Synchronous: f.synchronous,
			Args: []string{"--log-level", "warn", "--intent-listen", "127.0.0.1:0"}, Env: []string{"BUS_SECRET=" + cfg.Key}}
		if f.serverLog {
			opts.Output = stderr
		}
		srv, err := bench.StartServer(ctx, opts)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = srv.Stop(sctx)
		}()
		if srv.IntentURL == "" {
			return fmt.Errorf("beam serve printed no intent bus address")
		}
		cfg.URL, cfg.ServerPID = srv.IntentURL, srv.PID
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
