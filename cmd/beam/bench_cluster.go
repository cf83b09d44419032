package main

import (
	"context"
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
