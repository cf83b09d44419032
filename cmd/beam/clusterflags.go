package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/beamdir/beam"
)

// clusterFlags are beam serve's cluster-mode flags (federation/cluster).
type clusterFlags struct {
	on       bool
	nodeID   string
	listen   string
	routes   string
	replicas int
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "cluster", false, "serve --domain as one node of a cluster joined through NATS (embedded servers clustered with routes, or --nats-url); needs --domain and, with embedded servers, the route credentials `beam cluster init` writes into the data directory")
	fs.StringVar(&c.nodeID, "node-id", "", "this node's name in the cluster (a-z, 0-9, '-'); default: generated once and kept in the data directory")
	fs.StringVar(&c.listen, "cluster-listen", "", "route listener HOST:PORT of the embedded NATS server, which the other nodes' --cluster-routes name")
	fs.StringVar(&c.routes, "cluster-routes", "", "the other nodes' route URLs, comma-separated: nats-route://HOST:PORT,…")
	fs.IntVar(&c.replicas, "cluster-replicas", 0, "replicas of the cluster's JetStream streams (default min(3, nodes))")
}

// config returns the directory's cluster configuration, off without
// --cluster.
func (c *clusterFlags) config() (beam.Cluster, error) {
	if !c.on {
		if c.nodeID != "" || c.listen != "" || c.routes != "" || c.replicas != 0 {
			return beam.Cluster{}, fmt.Errorf("--node-id, --cluster-listen, --cluster-routes and --cluster-replicas need --cluster")
		}
		return beam.Cluster{}, nil
	}
	var routes []string
	for _, r := range strings.Split(c.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			routes = append(routes, r)
		}
	}
	return beam.Cluster{Enabled: true, NodeID: c.nodeID, Listen: c.listen, Routes: routes, Replicas: c.replicas}, nil
}
