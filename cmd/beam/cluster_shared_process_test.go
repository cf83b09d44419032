package main

import (
	"testing"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestClusterProcesses starts one three-node cluster (three `beam serve
// --cluster` processes over a three-server embedded NATS cluster) and runs
// against it, in parallel, the tests that only register, send, poll and
// read while every node serves — each with agents of its own, so none
// depends on another. A cluster takes most of a test's time to form (the
// JetStream groups elect their leaders), so sharing one is most of what
// the cluster suite saves. Then, alone, the registry test, which kills
// and restarts a node. The tests that kill nodes under load, or need
// other flags, start clusters of their own.
func TestClusterProcesses(t *testing.T) {
	t.Parallel()
	nodes := beamtest.StartAll(t, clusterOptions(t, 3)...)

	t.Run("healthy", func(t *testing.T) {
		for name, run := range map[string]func(*testing.T, []*beamtest.Process){
			"Routing":              clusterRouting,
			"BusPoll":              clusterBusPoll,
			"Forgery":              clusterForgery,
			"RouteStrangerRefused": clusterRouteStrangerRefused,
		} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				run(t, nodes)
			})
		}
	})
	t.Run("Registry", func(t *testing.T) { clusterRegistry(t, nodes) })
}
