package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
)

// maxBenchClusterNodes bounds --cluster-nodes: every node is a process on
// this machine.
const maxBenchClusterNodes = 16

// startBenchCluster starts f.clusterNodes `beam serve --cluster` nodes of
// one domain for a run without --url and returns them with a function that
// stops them and removes their temporary data directories.
// args and env are extra flags and environment entries of every node.
func startBenchCluster(ctx context.Context, f *benchFlags, stderr io.Writer, args, env []string) ([]*bench.ServerProcess, func(), error) {
	bin, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the beam binary: %w", err)
	}
	root := f.dataDir
	remove := func() {}
	if root == "" {
		if root, err = os.MkdirTemp("", "beam-bench-cluster-"); err != nil {
			return nil, nil, fmt.Errorf("data directory: %w", err)
		}
		remove = func() { _ = os.RemoveAll(root) }
	}
	dirs := make([]string, f.clusterNodes)
	for i := range dirs {
		dirs[i] = filepath.Join(root, fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(dirs[i], 0o700); err != nil {
			remove()
			return nil, nil, fmt.Errorf("data directory: %w", err)
		}
	}
	opts := bench.ClusterOptions{
		Server: bench.ServerOptions{Binary: bin, Synchronous: f.synchronous, Env: env,
			Args: append([]string{"--log-level", "warn", "--open-orgs"}, args...)},
		DataDirs: dirs,
	}
	if f.serverLog {
		opts.Server.Output = stderr
	}
	nodes, err := bench.StartCluster(ctx, opts)
	if err != nil {
		remove()
		return nil, nil, err
	}
	return nodes, func() {
		if err := bench.StopAll(nodes); err != nil {
			fmt.Fprintf(stderr, "beam bench: %v\n", err)
		}
		remove()
	}, nil
}

// clusterUsageOK reports whether f's --cluster-nodes run can work, and
// says why not on stderr.
func clusterUsageOK(f *benchFlags, stderr io.Writer) bool {
	mode := bench.Mode(f.mode)
	if f.url != "" || f.serverPID != 0 || f.clusterNodes < 2 || f.clusterNodes > maxBenchClusterNodes ||
		!(slices.Contains(bench.ClusterModes, mode) || mode == bench.ModeJobs) {
		fmt.Fprintf(stderr, "beam bench: --cluster-nodes takes 2..%d nodes, --mode %v or %s, and no --url or --server-pid\n",
			maxBenchClusterNodes, bench.ClusterModes, bench.ModeJobs)
		return false
	}
	return true
}

// benchOneNode runs cfg's load on one started beam serve (on a temporary
// data directory), the row a cluster run is compared with.
func benchOneNode(ctx context.Context, f *benchFlags, cfg bench.Config, logger *slog.Logger, stderr io.Writer) (*bench.Summary, error) {
	one := *f
	one.dataDir = ""
	srv, cleanup, err := startBenchServer(ctx, &one, stderr)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	cfg.URL, cfg.ServerPID, cfg.OperatorToken = srv.URL, srv.PID, srv.OperatorToken
	logger.Info("one-node run first, to compare with", "url", srv.URL)
	sum, err := bench.Run(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("one-node run: %w", err)
	}
	return sum, nil
}

// benchClusterChaos runs beam bench --chaos --cluster-nodes 3: one cluster
// chaos run per kill role asked for, and prints every report.
func benchClusterChaos(ctx context.Context, f *benchFlags, logger *slog.Logger, stdout, stderr io.Writer) error {
	if f.clusterNodes != 3 {
		fmt.Fprintln(stderr, "beam bench: --chaos runs on --cluster-nodes 3 (an owner, a holder and a third node)")
		return errUsage
	}
	if err := bench.CheckChaosRole(f.chaosRole); err != nil {
		fmt.Fprintf(stderr, "beam bench: --chaos-kill-role: %v\n", err)
		return errUsage
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the beam binary: %w", err)
	}
	dir := f.dataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "beam-bench-chaos-cluster-"); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		defer os.RemoveAll(dir)
	} else if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return fmt.Errorf("--data-dir %s is not empty; --chaos needs a fresh one", dir)
	}
	cfg := bench.ClusterChaosConfig{
		ChaosConfig: bench.ChaosConfig{Binary: bin, DataDir: dir, Duration: f.chaosDuration, Seed: f.chaosSeed,
			Rate: f.chaosRate, Workers: f.chaosWorkers, SettleTimeout: f.chaosSettle, Mixed: f.chaosMix,
			Synchronous: f.synchronous, Logger: logger},
		DeleteData: f.chaosDelete, NoRestart: !f.chaosRestart, RestartDelay: f.chaosDelay,
	}
	if f.serverLog {
		cfg.Output = stderr
	}
	if cfg.Seed == 0 {
		cfg.Seed = bench.RandomSeed()
	}
	fmt.Fprintf(stderr, "beam bench --chaos --cluster-nodes 3: seed %d (repeat with --chaos-seed %d)\n", cfg.Seed, cfg.Seed)
	reps, err := bench.RunClusterChaosRoles(ctx, cfg, f.chaosRole)
	ok := len(reps) > 0
	for _, r := range reps {
		ok = ok && r.OK()
	}
	if f.json {
		b, jerr := json.Marshal(map[string]any{"runs": reps, "ok": ok && err == nil})
		if jerr != nil {
			return fmt.Errorf("encode chaos report: %w", jerr)
		}
		if _, werr := fmt.Fprintln(stdout, string(b)); werr != nil {
			return werr
		}
	} else {
		for _, r := range reps {
			if werr := r.WriteText(stdout); werr != nil {
				return werr
			}
		}
	}
	if err != nil {
		return err
	}
	if !ok {
		return errChaosFailed
	}
	return nil
}
