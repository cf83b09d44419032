package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/beamdir/beam/federation/cluster"
)

// runCluster dispatches beam cluster's subcommands.
func runCluster(_ context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: beam cluster init --nodes N --domain D --out DIR")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "  init   write the data directories DIR/node1 … DIR/nodeN of a new cluster: the shared directory key,")
		fmt.Fprintln(stderr, "         the route password and each node's certificate from a new cluster CA")
	}
	if len(args) == 0 {
		usage()
		return errUsage
	}
	switch args[0] {
	case "init":
		return runClusterInit(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		usage()
		return nil
	default:
		fmt.Fprintf(stderr, "beam cluster: unknown subcommand %q\n", args[0])
		usage()
		return errUsage
	}
}

// maxClusterNodes bounds beam cluster init --nodes.
const maxClusterNodes = 32

// runClusterInit writes every node's data directory of a new cluster
// (cluster.WriteNodeDirs) and prints them.
func runClusterInit(args []string, stdout, stderr io.Writer) error {
	fs := newPlainCmdFlags("beam cluster init", stderr, "beam cluster init --nodes N --domain D --out DIR")
	var (
		nodes       int
		domain, out string
	)
	fs.IntVar(&nodes, "nodes", 3, "how many nodes")
	fs.StringVar(&domain, "domain", "", "the domain the cluster serves, e.g. acme.beam.directory (required)")
	fs.StringVar(&out, "out", "", "directory in which node1 … nodeN are written (required)")
	if err := fs.parse(args, 0, 0); err != nil {
		return err
	}
	if domain == "" {
		return fs.missing("domain")
	}
	if out == "" {
		return fs.missing("out")
	}
	if nodes < 1 || nodes > maxClusterNodes {
		return fmt.Errorf("--nodes %d: want 1-%d", nodes, maxClusterNodes)
	}
	dirs := make([]string, nodes)
	for i := range dirs {
		dirs[i] = filepath.Join(out, fmt.Sprintf("node%d", i+1))
	}
	if err := cluster.WriteNodeDirs(domain, dirs); err != nil {
		return err
	}
	for _, d := range dirs {
		fmt.Fprintf(stdout, "wrote %s\n", d)
	}
	fmt.Fprintf(stdout, "start each node with: beam serve --cluster --domain %s --data-dir DIR --cluster-listen HOST:PORT --cluster-routes nats-route://OTHER:PORT,…\n", domain)
	return nil
}
