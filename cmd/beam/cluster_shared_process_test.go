package main

import (
	"testing"

	"github.com/beamdir/beam/internal/beamtest"
)

// clusterPeerDomain is the domain of the peer TestClusterProcesses's
// cluster pins.
const clusterPeerDomain = "beta.beam.directory"

// TestClusterProcesses starts one three-node cluster (three `beam serve
// --cluster` processes over a three-server embedded NATS cluster, pinning
// a peer directory that does not run) and runs against it, one after the
// other, the tests that only register, send, poll and read while every
// node serves, each with agents of its own so none depends on another. A
// cluster takes most of a test's time to form (the JetStream groups elect
// their leaders), so sharing one is most of what the cluster suite saves.
// The tests that kill and restart a node come last. The tests that kill
// nodes under load, or need other flags, start clusters of their own.
func TestClusterProcesses(t *testing.T) {
	t.Parallel()
	peerDir := t.TempDir()
	peerLine := showSelf(t, peerDir, clusterPeerDomain, freeAddr(t))
	opts := clusterOptions(t, 3, withoutTakeover("--peer", peerLine)...)
	for i := range opts {
		opts[i].Env = append(opts[i].Env, clusterJobsEnv()...)
	}
	nodes := beamtest.StartAll(t, opts...)

	// First, while the registry stream holds nothing but what the pinned
	// peer could write.
	t.Run("PinnedPeerReplySubject", func(t *testing.T) { clusterPinnedPeerReplySubject(t, nodes, peerDir) })
	for _, tc := range []struct {
		name string
		run  func(*testing.T, []*beamtest.Process)
	}{
		{"Routing", clusterRouting},
		{"BusPoll", clusterBusPoll},
		{"Forgery", clusterForgery},
		{"RouteStrangerRefused", clusterRouteStrangerRefused},
		{"JobsAcrossNodes", clusterJobsAcrossNodes},
		{"JobsLeases", clusterJobsLeases},
		{"JobsKeys", clusterJobsKeys},
		{"JobsExactlyOnce", clusterJobsExactlyOnce},
		{"JobsForgery", clusterJobsForgery},
		{"Pipelines", clusterPipelines},
		// Kills and restarts node 2.
		{"Registry", clusterRegistry},
		// Restarts node 0.
		{"Restarts", clusterRestarts},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, nodes) })
	}
}
