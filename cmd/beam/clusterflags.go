package main

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/federation/cluster"
)

// clusterFlags are beam serve's cluster-mode flags (federation/cluster).
type clusterFlags struct {
	on       bool
	nodeID   string
	listen   string
	routes   string
	replicas int
	grace    time.Duration
	fs       *flag.FlagSet // the flags were registered on
}

// needCluster are the flags that mean nothing without --cluster.
var needCluster = []string{"node-id", "cluster-listen", "cluster-routes", "cluster-replicas", "cluster-takeover-grace"}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	c.fs = fs
	fs.BoolVar(&c.on, "cluster", false, "serve --domain as one node of a cluster joined through NATS (embedded servers clustered with routes, or --nats-url); needs --domain and, with embedded servers, the route credentials `beam cluster init` writes into the data directory")
	fs.StringVar(&c.nodeID, "node-id", "", "this node's name in the cluster (a-z, 0-9, '-'); default: generated once and kept in the data directory")
	fs.StringVar(&c.listen, "cluster-listen", "", "route listener HOST:PORT of the embedded NATS server, which the other nodes' --cluster-routes name")
	fs.StringVar(&c.routes, "cluster-routes", "", "the other nodes' route URLs, comma-separated: nats-route://HOST:PORT,…")
	fs.IntVar(&c.replicas, "cluster-replicas", 0, "replicas of the cluster's JetStream streams (default min(3, nodes))")
	fs.DurationVar(&c.grace, "cluster-takeover-grace", cluster.DefaultTakeoverGrace, "how long a node must be gone, past the end of its cluster entry (about 10 s after a crash, at once after a clean stop), before a survivor takes over its log and unfinished work; a node back sooner resumes its own (make it longer than a restart takes for rolling upgrades)")
}

// config returns the directory's cluster configuration, off without
// --cluster.
func (c *clusterFlags) config() (beam.Cluster, error) {
	if !c.on {
		var set []string
		c.fs.Visit(func(f *flag.Flag) {
			if slices.Contains(needCluster, f.Name) {
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return beam.Cluster{}, fmt.Errorf("%s: only with --cluster", strings.Join(set, ", "))
		}
		return beam.Cluster{}, nil
	}
	if c.grace < time.Second {
		return beam.Cluster{}, fmt.Errorf("--cluster-takeover-grace %s: at least 1s", c.grace)
	}
	var routes []string
	for _, r := range strings.Split(c.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			routes = append(routes, r)
		}
	}
	return beam.Cluster{Enabled: true, NodeID: c.nodeID, Listen: c.listen, Routes: routes, Replicas: c.replicas, TakeoverGrace: c.grace}, nil
}
