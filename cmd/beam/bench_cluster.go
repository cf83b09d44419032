package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
)

// maxBenchClusterNodes bounds --cluster-nodes: every node is a process on
// this machine.
const maxBenchClusterNodes = 16

// startBenchCluster starts f.clusterNodes `beam serve --cluster` nodes of
// one domain for a run without --url and returns them with a function that
// stops them and removes their temporary data directories.
func startBenchCluster(ctx context.Context, f *benchFlags, stderr io.Writer) ([]*bench.ServerProcess, func(), error) {
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
		Server:   bench.ServerOptions{Binary: bin, Synchronous: f.synchronous, Args: []string{"--log-level", "warn"}},
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
