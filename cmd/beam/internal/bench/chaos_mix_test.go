package bench

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

const mixNS = "chaos-test"

// mixedLog writes a log with what a mixed run leaves: the synchronous
// intent "s-1" acked; job "j1" (key k1) published, claimed, failed,
// claimed again and fulfilled with {"id":"j1"}; envelope "e1" created and succeeded; envelope "e2"
// recorded failed twice (two terminal steps). It returns the data
// directory.
func mixedLog(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(dir, "beam.db")})
	require.NoError(t, err)
	defer func() { require.NoError(t, lg.Close()) }()
	now := time.Now()
	ev := func(nonce string, st tracing.State, d tracing.Details) tracing.Event {
		now = now.Add(time.Millisecond)
		return tracing.Event{Nonce: nonce, State: st, At: now, From: "s@x.beam.directory", To: "r@x.beam.directory",
			IntentType: chaosSyncIntent, Transport: "ws", Attempt: 1, Details: d}
	}
	_, err = lg.Append(ctx, ev("s-1", tracing.Received, tracing.Details{}), ev("s-1", tracing.Dispatched, tracing.Details{}),
		ev("s-1", tracing.Delivered, tracing.Details{}), ev("s-1", tracing.Acked, tracing.Details{}))
	require.NoError(t, err)

	job := func(st tracing.State, jd tracing.JobDetails) tracing.Event {
		e := ev("job:j1", st, tracing.Details{Job: &jd})
		if st == tracing.Received {
			e.Details.Owner = tracing.OwnerJobs
		}
		return e
	}
	_, err = lg.Append(ctx,
		job(tracing.Received, tracing.JobDetails{Op: "publish", ID: "j1", Namespace: mixNS, Payload: json.RawMessage(`{"k":"k1"}`)}),
		job(tracing.Queued, tracing.JobDetails{Op: "publish"}),
		job(tracing.Dispatched, tracing.JobDetails{Op: "claim"}),
		job(tracing.Delivered, tracing.JobDetails{Op: "claim"}),
		job(tracing.Queued, tracing.JobDetails{Op: "fail", Error: "chaos: failing on purpose"}),
		job(tracing.Dispatched, tracing.JobDetails{Op: "claim"}),
		job(tracing.Delivered, tracing.JobDetails{Op: "claim"}),
		job(tracing.Acked, tracing.JobDetails{Op: "fulfill", Result: json.RawMessage(`{"id":"j1"}`)}))
	require.NoError(t, err)

	step := func(nonce string, st tracing.State, s tracing.MeshStep) tracing.Event {
		raw, err := json.Marshal(s)
		require.NoError(t, err)
		e := ev(nonce, st, tracing.Details{Mesh: raw})
		if st == tracing.Received {
			e.Details.Owner = tracing.OwnerMesh
		}
		return e
	}
	_, err = lg.Append(ctx,
		step("mesh:e1", tracing.Received, tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: "e1", Creator: "s@x.beam.directory", Status: tracing.MeshPending}),
		step("mesh:e1", tracing.Dispatched, tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning}),
		step("mesh:e1", tracing.Delivered, tracing.MeshStep{}),
		step("mesh:e1", tracing.Acked, tracing.MeshStep{Kind: tracing.MeshKindSink, Status: tracing.MeshSucceeded, Sink: true}),
		step("mesh:e2", tracing.Received, tracing.MeshStep{Kind: tracing.MeshKindCreated, ID: "e2", Creator: "s@x.beam.directory", Status: tracing.MeshPending}),
		step("mesh:e2", tracing.Failed, tracing.MeshStep{Kind: tracing.MeshKindFailed, Status: tracing.MeshFailed}),
		step("mesh:e2", tracing.Failed, tracing.MeshStep{Kind: tracing.MeshKindFailed, Status: tracing.MeshFailed}))
	require.NoError(t, err)
	return dir
}

func newMix() *chaosMix {
	return &chaosMix{
		ns:        mixNS,
		syncAcked: map[string]string{"s-1": "r@x.beam.directory"},
		syncSeen:  map[string]map[string]bool{"r@x.beam.directory": {"s-1": true}},
		published: map[string]string{"k1": "j1"}, fulfilled: map[string]int{"j1": 1}, failed: map[string]int{"j1": 1},
		results: map[string]string{"j1": `{"id": "j1"}`},
		pending: map[string]bool{}, created: map[string]string{"e1": "s@x.beam.directory"}, failures: map[string]int64{},
	}
}

func mixCheck(t *testing.T, dir string, m *chaosMix) (*ChaosReport, map[string]*Invariant) {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(dir, "beam.db")})
	require.NoError(t, err)
	defer lg.Close()
	rep := &ChaosReport{}
	m.report(rep)
	invs, err := m.check(context.Background(), lg, rep)
	require.NoError(t, err)
	byName := map[string]*Invariant{}
	for _, inv := range invs {
		byName[inv.Name[:3]] = inv
	}
	require.Len(t, byName, 3)
	return rep, byName
}

// The mixed invariants hold on a consistent log, except that an envelope
// with two terminal steps did not finish exactly once (g).
func TestChaosMixCheck(t *testing.T) {
	t.Parallel()
	rep, inv := mixCheck(t, mixedLog(t), newMix())
	require.Zero(t, inv["(e)"].ViolationCount, inv["(e)"].Violations)
	require.EqualValues(t, 1, inv["(e)"].Checked)
	require.Zero(t, inv["(f)"].ViolationCount, inv["(f)"].Violations)
	require.EqualValues(t, 1, inv["(g)"].ViolationCount, inv["(g)"].Violations)
	require.Contains(t, inv["(g)"].Violations[0], "e2 ended failed after 2 terminal steps")
	require.Equal(t, map[string]int64{"fulfilled": 1}, rep.Mix.JobsLog)
	require.Equal(t, map[string]int64{"succeeded": 1, "failed": 1}, rep.Mix.Envelopes)
	require.EqualValues(t, 1, rep.Mix.JobsFulfilled)
}

// Each lost acknowledgement is reported: an intent the log does not have or
// its recipient never saw (e), a publish, a fulfil or a fail the log lost, a
// fulfil acknowledged twice, a result that differs (f), an envelope the log does
// not have (g).
func TestChaosMixCheckReportsLosses(t *testing.T) {
	t.Parallel()
	m := newMix()
	m.syncAcked["s-lost"] = "r@x.beam.directory"
	m.syncSeen["r@x.beam.directory"]["s-1"] = false
	m.published["k2"] = "j-lost"
	m.fulfilled["j-gone"] = 1
	m.fulfilled["j1"] = 2
	m.failed["j1"] = 2
	m.results["j1"] = `{"id":"other"}`
	m.created["e-lost"] = "s@x.beam.directory"
	_, inv := mixCheck(t, mixedLog(t), m)
	require.EqualValues(t, 2, inv["(e)"].ViolationCount, inv["(e)"].Violations)
	require.EqualValues(t, 4, inv["(f)"].ViolationCount, inv["(f)"].Violations)
	require.Contains(t, inv["(f)"].Violations, "job j1: 2 fails acknowledged, the log has 1")
	require.EqualValues(t, 2, inv["(g)"].ViolationCount, inv["(g)"].Violations)
	require.Contains(t, inv["(g)"].Violations, "acknowledged envelope e-lost is not in the log")

	m = newMix()
	m.results["j1"] = `{"id":"other"}`
	_, inv = mixCheck(t, mixedLog(t), m)
	require.EqualValues(t, 1, inv["(f)"].ViolationCount, inv["(f)"].Violations)
	require.Contains(t, inv["(f)"].Violations[0], `fulfilled with {"id":"other"}`)
}
