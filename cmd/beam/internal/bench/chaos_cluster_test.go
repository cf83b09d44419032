package bench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation/cluster"
)

// cleanRecords is a cluster chaos run where everything went right: one
// durable send delivered, one synchronous intent, a job fulfilled once, a
// job dead, an envelope succeeded through every actor.
func cleanRecords() *clusterRecords {
	return &clusterRecords{
		Sent:      map[string]string{"chaos-1": "r@x", "chaos-2": "r@x"},
		Acked:     map[string]bool{"chaos-1": true},
		Seen:      map[string]map[string]bool{"r@x": {"chaos-1": true, "sync-1": true}},
		SyncAcked: map[string]string{"sync-1": "r@x"},
		Published: []string{"j1", "j2"},
		Fulfils:   map[string]int{"j1": 1},
		JobStatus: map[string]string{"j1": "fulfilled", "j2": "dead"},
		Created:   []string{"e1"},
		EnvStatus: map[string]string{"e1": "succeeded"},
		EnvEnds:   map[string]int{"e1": 1},
		Actors:    []string{"a@x", "b@x"},
		Ran:       map[string]map[string]bool{"e1": {"a@x": true, "b@x": true}},
	}
}

// violations returns each invariant's violation count by its letter.
func violations(t *testing.T, invs []*Invariant) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, inv := range invs {
		out[inv.Name[:3]] = inv.ViolationCount
	}
	return out
}

func TestClusterChaosCheckPasses(t *testing.T) {
	rec := cleanRecords()
	require.True(t, rec.settled())
	rep := &ChaosReport{Mix: &ChaosMixReport{}}
	rep.Invariants = rec.check(rep)
	require.True(t, rep.OK(), rep.Invariants)
	require.Equal(t, map[string]int64{"delivered": 1}, rep.Messages)
	require.Equal(t, map[string]int64{"fulfilled": 1, "dead": 1}, rep.Mix.JobsLog)
	require.Equal(t, map[string]int64{"succeeded": 1}, rep.Mix.Envelopes)
}

// Each kind of loss or duplicate the cluster could commit is reported
// against its invariant, and fails the run.
func TestClusterChaosCheckDetectsViolations(t *testing.T) {
	for name, tc := range map[string]struct {
		spoil func(*clusterRecords)
		inv   string
		want  string
	}{
		"acknowledged send never delivered": {func(r *clusterRecords) { r.Acked["chaos-2"] = true }, "(a)", "chaos-2 was acknowledged but r@x never got it"},
		"job fulfilled twice":               {func(r *clusterRecords) { r.Fulfils["j1"] = 2 }, "(f)", "job j1: 2 fulfils answered 200"},
		"published job unknown":             {func(r *clusterRecords) { r.JobStatus["j2"] = "" }, "(f)", "published job j2: no live node knows it"},
		"published job still open":          {func(r *clusterRecords) { r.JobStatus["j2"] = "open" }, "(f)", "published job j2 ended open"},
		"fulfilled job requeued":            {func(r *clusterRecords) { r.JobStatus["j1"] = "dead" }, "(f)", "job j1: fulfil answered 200, the cluster says dead"},
		"envelope finished twice":           {func(r *clusterRecords) { r.EnvEnds["e1"] = 2 }, "(g)", "envelope e1 ended succeeded after 2 terminal steps"},
		"envelope lost":                     {func(r *clusterRecords) { r.EnvStatus["e1"] = "" }, "(g)", "envelope e1: no live node knows it"},
		"hop skipped":                       {func(r *clusterRecords) { delete(r.Ran["e1"], "b@x") }, "(g)", "b@x never ran its hop"},
		"misdelivered":                      {func(r *clusterRecords) { r.Seen["z@x"] = map[string]bool{"chaos-2": true} }, "(c)", "z@x saw nonce chaos-2 sent to r@x"},
		"sync answered, never seen":         {func(r *clusterRecords) { r.SyncAcked["sync-2"] = "r@x" }, "(e)", "intent sync-2 was answered but r@x never got it"},
	} {
		t.Run(name, func(t *testing.T) {
			rec := cleanRecords()
			tc.spoil(rec)
			rep := &ChaosReport{Mix: &ChaosMixReport{}}
			rep.Invariants = rec.check(rep)
			require.False(t, rep.OK())
			v := violations(t, rep.Invariants)
			require.EqualValues(t, 1, v[tc.inv], v)
			for _, inv := range rep.Invariants {
				if inv.Name[:3] == tc.inv {
					require.Contains(t, inv.Violations[0], tc.want)
				}
			}
		})
	}
	rec := cleanRecords()
	rec.JobStatus["j2"] = "open"
	require.False(t, rec.settled())
}

// The home is read from /observability/cluster in either shape; without
// one the run falls back to node0.
func TestClusterChaosHomeOf(t *testing.T) {
	require.Equal(t, "node2", homeOf(json.RawMessage(`{"status":{"homes":{"jobs":{"node":"node2","logId":"x"}}}}`)))
	require.Equal(t, "node1", homeOf(json.RawMessage(`{"status":{"homes":[{"kind":"jobs","nodeId":"node1"}]}}`)))
	require.Equal(t, "", homeOf(json.RawMessage(`{"status":{"nodes":[]}}`)))
	require.Equal(t, "", homeOf(json.RawMessage(`not json`)))

	since := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	card := json.RawMessage(`{"status":{"nodes":[{"nodeId":"node1","started":"2026-01-01T00:00:05Z"},{"nodeId":"node2","started":"2025-12-31T00:00:00Z"}]}}`)
	require.True(t, listsSince(card, "node1", since))
	require.False(t, listsSince(card, "node2", since), "a member that started before the kill is not the fresh one")
	require.False(t, listsSince(card, "node0", since))
}

func TestClusterChaosRoles(t *testing.T) {
	for _, r := range []string{RoleOwner, RoleHolder, RoleHome, RoleAll} {
		require.NoError(t, CheckChaosRole(r))
	}
	require.ErrorIs(t, CheckChaosRole("leader"), errNoRole)
	c := &clusterChaos{down: []bool{false, true, false}}
	require.Equal(t, 2, c.live(1))
	require.Equal(t, 0, c.live(0))
	require.Equal(t, []int{0, 2}, c.liveNodes())
	require.Equal(t, roleOwner, c.place("sender-x", 3))
	require.Equal(t, roleHolder, c.place("online-x", 0))
	require.Equal(t, roleThird, c.place("late-x", 0))
	require.Equal(t, roleHolder, c.place("actor-x", 0))
	require.Equal(t, roleThird, c.place("actor-x", 1))
	require.NotEqual(t, c.workerNode(0), c.workerNode(1))
}

// A node's data directory deleted by the chaos run keeps what `beam
// cluster init` wrote, so the node starts again in the same cluster.
func TestBenchChaosClusterKeepsInitFiles(t *testing.T) {
	dirs := []string{filepath.Join(t.TempDir(), "n0"), filepath.Join(t.TempDir(), "n1")}
	require.NoError(t, InitClusterDirs(DefaultClusterDomain, dirs))
	for _, d := range dirs {
		for _, f := range cluster.InitFiles() {
			_, err := os.Stat(filepath.Join(d, f))
			require.NoError(t, err, "beam cluster init writes %s", f)
		}
		_, err := cluster.LoadTrust(d)
		require.NoError(t, err)
	}
}
