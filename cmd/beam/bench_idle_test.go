package main

import (
	"context"
	"encoding/json"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// Idle agents end to end: they connect from several loopback source
// addresses, and the summary gives the RSS per agent and its breakdown read
// from the started server's /metrics.
func TestBenchIdleAgentsReportsPerAgentMemory(t *testing.T) {
	t.Parallel()
	sum := benchJSON(t, "--idle-agents", "60", "--idle-settle", "1s", "--count", "20", "--concurrency", "4", "--senders", "2", "--recipients", "2")
	require.EqualValues(t, 60, sum["idle_agents"], sum)
	require.EqualValues(t, 60, sum["idle_agents_connected"], sum)
	require.GreaterOrEqual(t, sum["idle_source_addrs"], 2.0, sum)
	require.NotNil(t, sum["server_rss_idle_mb"], sum)
	require.NotNil(t, sum["server_rss_before_idle_mb"], sum)
	require.NotNil(t, sum["server_rss_kb_per_idle_agent"], sum)
	require.Nil(t, sum["server_rss_idle_extrapolated_mb"], "every agent connected: nothing is extrapolated")
	require.EqualValues(t, 1, sum["idle_settle_s"], sum)
	require.NotNil(t, sum["server_rss_idle_settled_mb"], sum)
	require.NotNil(t, sum["server_rss_kb_per_idle_agent_settled"], sum)
	require.Nil(t, sum["server_rss_idle_settled_extrapolated_mb"], "every agent connected: nothing is extrapolated")
	per, ok := sum["server_per_idle_agent"].(map[string]any)
	require.True(t, ok, sum)
	for _, k := range []string{"heap_bytes", "stack_bytes", "goroutines", "free_heap_bytes", "rss_bytes_after_gc"} {
		require.Contains(t, per, k)
	}
	require.Greater(t, per["goroutines"], 0.0, "each connected session has its reader")
}

// When the open-file limit leaves room for fewer idle agents than asked
// for, the bench connects as many as fit, says why, and labels the RSS for
// the number asked for as extrapolated instead of failing.
func TestBenchIdleAgentsBeyondTheDescriptorLimit(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("descriptor limits are read from /proc")
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash to lower the open-file limit with")
	}
	bin := beamtest.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	// Lowering the hard limit is allowed without privileges; the server
	// the bench starts inherits it.
	cmd := exec.CommandContext(ctx, bash, "-c", `ulimit -n 700 && exec "$0" "$@"`, bin,
		"bench", "--json", "--warmup", "0", "--idle-agents", "2000", "--idle-settle", "1s", "--count", "10", "--concurrency", "2", "--senders", "1", "--recipients", "1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var sum map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), string(out))
	require.EqualValues(t, 2000, sum["idle_agents"], sum)
	connected, _ := sum["idle_agents_connected"].(float64)
	require.Positive(t, connected, sum)
	require.Less(t, connected, 2000.0, sum)
	require.NotNil(t, sum["server_rss_idle_extrapolated_mb"], sum)
	require.Greater(t, sum["server_rss_idle_extrapolated_mb"], sum["server_rss_idle_mb"])
	require.Greater(t, sum["server_rss_idle_settled_extrapolated_mb"], sum["server_rss_idle_settled_mb"])
	notes, _ := json.Marshal(sum["notes"])
	require.Contains(t, string(notes), "open-file limit is 700", sum)
}
