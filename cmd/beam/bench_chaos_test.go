package main

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/cmd/beam/internal/bench"
	"github.com/beamdir/beam/internal/beamtest"
)

var chaosDuration = flag.Duration("chaos-duration", 20*time.Second, "load length of TestBenchChaos (the acceptance run is 5m)")

// runChaos runs cfg on a race-built beam serve in a fresh data directory
// within timeout, logs the report and requires a run that carried out its
// kills, settled and kept every invariant. It returns the report and its
// text.
func runChaos(t *testing.T, cfg bench.ChaosConfig, timeout time.Duration) (*bench.ChaosReport, string) {
	t.Helper()
	cfg.Binary, cfg.DataDir = beamtest.Binary(t), t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	rep, err := bench.RunChaos(ctx, cfg)
	var out bytes.Buffer
	if rep != nil {
		require.NoError(t, rep.WriteText(&out))
		t.Logf("chaos report:\n%s", out.String())
	}
	require.NoError(t, err)
	require.Len(t, rep.Kills, cfg.Kills)
	require.True(t, rep.Settled, out.String())
	require.True(t, rep.OK(), out.String())
	return rep, out.String()
}

// TestBenchChaos is the short form of `beam bench --chaos --chaos-mix=false`:
// a durable bus load (online, late-connecting and failing recipients) on a real beam
// serve that is SIGKILLed and restarted twice, then the invariants checked
// on its log: every accepted message acked or dead-lettered, legal traces,
// no misdelivery, projections equal to a rebuild. The load is sized for a
// race-built server on a small machine.
func TestBenchChaos(t *testing.T) {
	t.Parallel()
	duration, kills := *chaosDuration, 2
	if testing.Short() { // the quick local loop: one kill in a few seconds of load
		duration, kills = min(duration, 6*time.Second), 1
	}
	rep, out := runChaos(t, bench.ChaosConfig{
		Duration: duration, Kills: kills, Rate: 25, Workers: 4,
		Senders: 2, Online: 2, Late: 1, SettleTimeout: 3 * time.Minute,
	}, duration+6*time.Minute)
	require.Positive(t, rep.Accepted)
	require.Len(t, rep.Invariants, 4)
	require.Contains(t, out, "CHAOS PASS")
	// The load reached every kind of recipient.
	require.Positive(t, rep.FlakyFailures, "the flaky agent failed no delivery")
	require.Positive(t, rep.Messages["acked"])
}

// The CLI form (the mixed load, --chaos-mix's default) prints the seed
// first and the PASS verdict last.
func TestBenchChaosCLI(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := beamtest.Run(t, ctx, "bench", "--chaos", "--chaos-duration", "6s", "--chaos-kills", "1",
		"--chaos-rate", "10", "--chaos-workers", "2", "--chaos-seed", "42")
	require.NoError(t, err, out)
	require.Contains(t, out, "seed 42")
	require.Contains(t, out, "kill 1 at")
	require.True(t, strings.HasSuffix(strings.TrimSpace(out), "CHAOS PASS"), out)
}

// TestBenchChaosMixed is the acceptance form of the chaos run, small: bus
// sends, synchronous intents, Intent Protocol jobs (signed publish, claim,
// fulfil or fail) and pipeline envelopes (one actor failing some hops)
// mixed, while the server is SIGKILLed and
// restarted three times. Nothing acknowledged is lost (an acknowledged
// intent is acked, an acknowledged publish and fulfil are in the log), no
// job is published or fulfilled twice, every envelope finishes exactly
// once, and the bus and trace invariants of TestBenchChaos hold.
func TestBenchChaosMixed(t *testing.T) {
	t.Parallel()
	duration, kills := 15*time.Second, 3
	if testing.Short() {
		duration, kills = 8*time.Second, 2
	}
	rep, _ := runChaos(t, bench.ChaosConfig{
		Mixed: true, Duration: duration, Kills: kills, Rate: 30, Workers: 4,
		Senders: 2, Online: 2, Late: 1, SettleTimeout: 2 * time.Minute,
	}, duration+5*time.Minute)
	require.Len(t, rep.Invariants, 7)
	// Every kind of operation was acknowledged, and the workers fulfilled
	// jobs and the actors finished envelopes.
	m := rep.Mix
	require.NotNil(t, m)
	require.Positive(t, rep.Accepted)
	require.Positive(t, m.SyncAcked)
	require.Positive(t, m.JobsPublished)
	require.Positive(t, m.JobsFulfilled)
	require.Positive(t, m.JobsFailed, "no job was failed on purpose")
	require.Positive(t, m.HopFailures, "the flaky actor failed no hop")
	require.Positive(t, m.JobsLog["fulfilled"])
	require.Positive(t, m.EnvelopesCreated)
	require.Positive(t, m.Envelopes["succeeded"])
}
