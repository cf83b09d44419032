package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// benchJSON runs `beam bench` with args and --json and decodes its summary.
func benchJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	out, err := beamtest.Run(t, ctx, append([]string{"bench", "--json", "--warmup", "0"}, args...)...)
	require.NoError(t, err, out)
	// The summary is the last line; progress logs (warn and up) come before.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), out)
	return sum
}

// A small bus run end to end: every message is accepted by the bus and
// acked by its recipient, and the summary reports both rates.
func TestBenchBusMode(t *testing.T) {
	t.Parallel()
	sum := benchJSON(t, "--mode", "bus", "--count", "60", "--concurrency", "6", "--senders", "3", "--recipients", "2")
	require.Equal(t, "bus", sum["mode"])
	require.EqualValues(t, 60, sum["ok"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	require.EqualValues(t, 60, sum["accepted"], sum)
	require.Greater(t, sum["sent_per_second"], 0.0)
	require.Greater(t, sum["intents_per_second"], 0.0)
	require.Greater(t, sum["p99_ms"], 0.0)
	require.NotNil(t, sum["server_cpu_ms_per_intent"])
	require.NotNil(t, sum["server_rss_mb"])
}

// A small mesh run: every envelope crosses its three hops and succeeds,
// and the summary reports hops/s and server CPU per hop.
func TestBenchMeshMode(t *testing.T) {
	t.Parallel()
	sum := benchJSON(t, "--mode", "mesh", "--hops", "3", "--count", "40", "--concurrency", "4", "--senders", "2", "--recipients", "3")
	require.Equal(t, "mesh", sum["mode"])
	require.EqualValues(t, 40, sum["ok"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	require.EqualValues(t, 3, sum["hops"], sum)
	require.InDelta(t, sum["intents_per_second"].(float64)*3, sum["hops_per_second"], 0.5)
	require.NotNil(t, sum["server_cpu_ms_per_hop"])
}

// A small federation run: two federated processes, senders on one,
// recipients on the other; every intent crosses and is answered.
func TestBenchFederationMode(t *testing.T) {
	t.Parallel()
	sum := benchJSON(t, "--mode", "federation", "--count", "40", "--concurrency", "4", "--senders", "2", "--recipients", "2")
	require.Equal(t, "federation", sum["mode"])
	require.EqualValues(t, 40, sum["ok"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	require.NotNil(t, sum["server_cpu_ms_per_intent"])
	require.NotNil(t, sum["peer_server_rss_mb"])
}

// Flag combinations that cannot work are refused before anything starts.
func TestBenchModeUsageErrors(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"bench", "--mode", "federation", "--url", "http://127.0.0.1:1"},
		{"bench", "--mode", "bus", "--peer-url", "http://127.0.0.1:1"},
		{"bench", "--chaos", "--url", "http://127.0.0.1:1"},
		{"bench", "--mode", "carrier-pigeon"},
		{"bench", "--mode", "a2a", "--url", "http://127.0.0.1:1"},
	} {
		out, err := beamtest.Run(t, ctx, args...)
		require.Error(t, err, "%v: %s", args, out)
	}
}

// A small A2A run: beam bench starts a directory declaring a pipeline over
// its recipients; every blocking SendMessage completes after three hops.
func TestBenchA2AMode(t *testing.T) {
	t.Parallel()
	sum := benchJSON(t, "--mode", "a2a", "--hops", "3", "--count", "40", "--concurrency", "4", "--senders", "2", "--recipients", "3")
	require.Equal(t, "a2a", sum["mode"])
	require.EqualValues(t, 40, sum["ok"], sum)
	require.EqualValues(t, 0, sum["errors"], sum)
	require.EqualValues(t, 3, sum["hops"], sum)
	require.NotNil(t, sum["server_cpu_ms_per_hop"])
}
