package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
	"github.com/beamdir/beam/internal/beamtest"
)

// The chaos acceptance of a whole cluster: under the mixed load (durable
// sends, synchronous intents, Intent Protocol jobs, pipeline envelopes)
// spread over three nodes, the node of each role — the owner that accepted
// the sends, creates and publishes; the holder the recipients, actors and
// workers are connected to; the job bus's home — is SIGKILLed and its data
// directory deleted. It stays down past its entry's expiry and the
// takeover grace, so a survivor takes its work over, then starts again as
// a fresh member. Nothing acknowledged is lost, no job is fulfilled twice
// and every envelope finishes once, read through the live nodes.
func TestBenchChaosClusterAcceptance(t *testing.T) {
	t.Parallel()
	for _, role := range []string{bench.RoleOwner, bench.RoleHolder, bench.RoleHome} {
		t.Run(role, func(t *testing.T) {
			t.Parallel()
			rep, out := runClusterChaos(t, bench.ClusterChaosConfig{
				ChaosConfig: bench.ChaosConfig{Duration: 25 * time.Second, Rate: 25, Workers: 4,
					Senders: 2, Online: 2, Late: 1, Mixed: true, SettleTimeout: 3 * time.Minute},
				Role: role, DeleteData: true, RestartDelay: 20 * time.Second,
			}, 8*time.Minute)
			require.True(t, rep.Rejoined, out)
			require.Empty(t, rep.Notes, "the cluster lists the job bus's home")
			require.True(t, rep.Settled, out)
			require.True(t, rep.OK(), out)
			require.Positive(t, rep.Accepted)
			require.Positive(t, rep.Mix.JobsPublished)
			require.Positive(t, rep.Mix.JobsFulfilled)
			require.Positive(t, rep.Mix.EnvelopesCreated)
			require.Positive(t, rep.Mix.Envelopes["succeeded"], out)
		})
	}
}

// --cluster-nodes 3 --mode jobs: jobs published through node0 and claimed
// and fulfilled through node1 and node2, each exactly once, next to the
// same load on one node.
func TestBenchClusterJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := beamtest.Run(t, ctx, "bench", "--json", "--cluster-nodes", "3", "--mode", "jobs", "--count", "60",
		"--publishers", "2", "--workers", "4")
	require.NoError(t, err, out)
	// The jobs summary is one indented JSON object after the progress logs.
	at := strings.Index(out, "{\n")
	require.GreaterOrEqual(t, at, 0, out)
	var sum map[string]any
	require.NoError(t, json.Unmarshal([]byte(out[at:]), &sum), out)
	require.EqualValues(t, 60, sum["published"], sum)
	require.EqualValues(t, 60, sum["fulfilled"], sum)
	require.EqualValues(t, 0, sum["duplicate_fulfills"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	require.Len(t, sum["cluster_nodes"], 3)
	single, ok := sum["single_node"].(map[string]any)
	require.True(t, ok, sum)
	require.EqualValues(t, 60, single["fulfilled"], single)
	require.NotNil(t, sum["vs_single_node"], sum)
}

// --cluster-nodes 3 --mode mesh: envelopes created on node0 run through
// actors on node1 and node2, next to the same load on one node.
func TestBenchClusterMesh(t *testing.T) {
	t.Parallel()
	sum := clusterModeRun(t, "mesh", "--count", "20", "--concurrency", "4", "--senders", "2", "--recipients", "4", "--hops", "3")
	require.EqualValues(t, 20, sum["ok"], sum)
	require.Greater(t, sum["hops_per_second"], 0.0, sum)
}
