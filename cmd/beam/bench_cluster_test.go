package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// A tiny cluster run: two `beam serve --cluster` nodes, agents spread over
// them; every intent is answered, and the report's per-node figures add up
// to its totals.
func TestBenchClusterMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"ws", "http"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			sum := benchJSON(t, "--cluster-nodes", "2", "--mode", mode, "--count", "40", "--concurrency", "4", "--senders", "3", "--recipients", "3")
			require.Equal(t, mode, sum["mode"])
			require.EqualValues(t, 40, sum["ok"], sum)
			require.EqualValues(t, 0, sum["errors"], sum)
			require.Greater(t, sum["intents_per_second"], 0.0)
			require.Greater(t, sum["p99_ms"], 0.0)
			require.NotNil(t, sum["ed25519_verify_ms"], sum)
			nodes, ok := sum["cluster_nodes"].([]any)
			require.True(t, ok, sum)
			require.Len(t, nodes, 2)
			var cpu, senders, recipients float64
			urls := map[any]bool{}
			for _, n := range nodes {
				node := n.(map[string]any)
				c, ok := node["server_cpu_ms_per_intent"].(float64)
				require.True(t, ok, node)
				require.Greater(t, c, 0.0, node)
				require.Greater(t, node["pid"], 0.0, node)
				// Round-robin: both nodes hold senders and recipients.
				require.Greater(t, node["senders"], 0.0, node)
				require.Greater(t, node["recipients"], 0.0, node)
				urls[node["url"]] = true
				cpu += c
				senders += node["senders"].(float64)
				recipients += node["recipients"].(float64)
			}
			require.Len(t, urls, 2)
			require.EqualValues(t, 3, senders)
			require.EqualValues(t, 3, recipients)
			// Each figure is rounded to 0.001 ms.
			require.InDelta(t, sum["server_cpu_ms_per_intent"], cpu, 0.002, sum)
		})
	}
}

// A cluster run that cannot work is refused before anything starts.
func TestBenchClusterUsageErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"bench", "--cluster-nodes", "2", "--url", "http://127.0.0.1:1"},
		{"bench", "--cluster-nodes", "1"},
		{"bench", "--cluster-nodes", "2", "--mode", "federation"},
		{"bench", "--cluster-nodes", "2", "--mode", "a2a"},
		{"bench", "--cluster-nodes", "2", "--server-pid", "1"},
	} {
		out, err := beamtest.Run(t, ctx, args...)
		require.Error(t, err, "%v: %s", args, out)
		require.Contains(t, out, "--cluster-nodes", "%v", args)
	}
}

// clusterModeRun runs `beam bench --cluster-nodes 3` in mode with a short
// load and checks the report: every operation done, the load spread over
// the nodes as the mode places it, server CPU per node adding up to the
// total, and the one-node run reported next to it.
func clusterModeRun(t *testing.T, mode string, args ...string) map[string]any {
	t.Helper()
	sum := benchJSON(t, append([]string{"--cluster-nodes", "3", "--mode", mode, "--warmup", "5"}, args...)...)
	require.Equal(t, mode, sum["mode"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	nodes, ok := sum["cluster_nodes"].([]any)
	require.True(t, ok, sum)
	require.Len(t, nodes, 3)
	single, ok := sum["single_node"].(map[string]any)
	require.True(t, ok, sum)
	require.Equal(t, mode, single["mode"], single)
	require.Nil(t, single["cluster_nodes"], single)
	vs, ok := sum["vs_single_node"].(map[string]any)
	require.True(t, ok, sum)
	require.Greater(t, vs["throughput"], 0.0, vs)
	return sum
}

// --cluster-nodes 3 --mode bus: durable messages sent through the first
// node to recipients connected to the other two, next to the same load on
// one node.
func TestBenchClusterBus(t *testing.T) {
	t.Parallel()
	sum := clusterModeRun(t, "bus", "--count", "30", "--concurrency", "4", "--senders", "2", "--recipients", "4")
	require.EqualValues(t, 30, sum["ok"], sum)
	var cpu float64
	for i, n := range sum["cluster_nodes"].([]any) {
		node := n.(map[string]any)
		if i == 0 {
			require.EqualValues(t, 2, node["senders"], node)
			require.EqualValues(t, 0, node["recipients"], node)
		} else {
			require.EqualValues(t, 0, node["senders"], node)
			require.EqualValues(t, 2, node["recipients"], node)
		}
		c, ok := node["server_cpu_ms_per_intent"].(float64)
		require.True(t, ok, node)
		cpu += c
	}
	require.InDelta(t, sum["server_cpu_ms_per_intent"], cpu, 0.003, sum)
	require.EqualValues(t, 30, sum["single_node"].(map[string]any)["ok"], sum)
}
