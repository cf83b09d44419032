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
		{"bench", "--cluster-nodes", "2", "--mode", "bus"},
		{"bench", "--cluster-nodes", "2", "--server-pid", "1"},
	} {
		out, err := beamtest.Run(t, ctx, args...)
		require.Error(t, err, "%v: %s", args, out)
		require.Contains(t, out, "--cluster-nodes", "%v", args)
	}
}
