package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/beamdir/beam/internal/server"
)

// clusterFlags are beam serve's cluster-mode flags (federation/cluster).
type clusterFlags struct {
	on       bool
	nodeID   string
	listen   string
	routes   string
	replicas int
	secret   string
}

func (c *clusterFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&c.on, "cluster", false, "serve --domain as one node of a cluster joined through NATS (embedded servers clustered with routes, or --nats-url); needs --domain")
	fs.StringVar(&c.nodeID, "node-id", "", "this node's name in the cluster (a-z, 0-9, '-'); default: generated once and kept in the data directory")
	fs.StringVar(&c.listen, "cluster-listen", "", "route listener HOST:PORT of the embedded NATS server, which the other nodes' --cluster-routes name")
	fs.StringVar(&c.routes, "cluster-routes", "", "the other nodes' route URLs, comma-separated: nats-route://HOST:PORT,…")
	fs.IntVar(&c.replicas, "cluster-replicas", 0, "replicas of the cluster's JetStream streams (default min(3, nodes))")
	fs.StringVar(&c.secret, "cluster-secret", "", "password of the route connections between the nodes (the same on every node); without it anyone who reaches --cluster-listen can join")
}

// config returns the server's cluster configuration, nil without --cluster.
func (c *clusterFlags) config() (*server.ClusterConfig, error) {
	if !c.on {
		if c.nodeID != "" || c.listen != "" || c.routes != "" || c.replicas != 0 || c.secret != "" {
			return nil, fmt.Errorf("--node-id, --cluster-listen, --cluster-routes, --cluster-replicas and --cluster-secret need --cluster")
		}
		return nil, nil
	}
	var routes []string
	for _, r := range strings.Split(c.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			routes = append(routes, r)
		}
	}
	return &server.ClusterConfig{NodeID: c.nodeID, Listen: c.listen, Routes: routes, Replicas: c.replicas, Secret: c.secret}, nil
}
