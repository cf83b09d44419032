package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// chaosLog writes a log with two bus messages to r@x: "m-acked" (received →
// dispatched → delivered → acked) and "m-dead" (received → queued →
// dead_letter), and returns its data directory.
func chaosLog(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	ctx := context.Background()
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(dir, "beam.db")})
	require.NoError(t, err)
	now := time.Now()
	ev := func(nonce string, st tracing.State, d tracing.Details) tracing.Event {
		now = now.Add(time.Millisecond)
		return tracing.Event{Nonce: nonce, State: st, At: now, From: "s@x.beam.directory", To: "r@x.beam.directory",
			IntentType: chaosIntent, Transport: "bus", Attempt: 1, Details: d}
	}
	for _, n := range []string{"m-acked", "m-dead"} {
		_, err := lg.Append(ctx, ev(n, tracing.Received, tracing.Details{Owner: tracing.OwnerBus,
			Bus: &tracing.BusMessage{MessageID: "id-" + n, Payload: json.RawMessage(`{}`)}}))
		require.NoError(t, err)
	}
	_, err = lg.Append(ctx, ev("m-acked", tracing.Dispatched, tracing.Details{}), ev("m-acked", tracing.Delivered, tracing.Details{}),
		ev("m-acked", tracing.Acked, tracing.Details{}), ev("m-dead", tracing.Queued, tracing.Details{}),
		ev("m-dead", tracing.DeadLetter, tracing.Details{ErrorCode: "CHAOS_FLAKY"}))
	require.NoError(t, err)
	require.NoError(t, lg.Close())
	return dir
}

func newCheckRun(dir string) *chaosRun {
	return &chaosRun{
		cfg:       ChaosConfig{DataDir: dir},
		attempted: map[string]string{"m-acked": "r@x.beam.directory", "m-dead": "r@x.beam.directory"},
		accepted:  map[string]bool{"m-acked": true, "m-dead": true},
		seen:      map[string]map[string]bool{"r@x.beam.directory": {"m-acked": true, "m-dead": true}},
		failures:  map[string]int64{},
	}
}

func TestChaosCheckPassesOnAConsistentLog(t *testing.T) {
	t.Parallel()
	r := newCheckRun(chaosLog(t))
	rep := &ChaosReport{}
	require.NoError(t, r.check(context.Background(), rep))
	require.True(t, rep.OK(), "%+v", rep.Invariants)
	require.Equal(t, map[string]int64{"acked": 1, "dead_letter": 1}, rep.Messages)
	var out bytes.Buffer
	require.NoError(t, rep.WriteText(&out))
	require.Contains(t, out.String(), "CHAOS PASS")
}

// Each broken invariant is reported: an accepted nonce missing from the
// log (a), an agent that saw someone else's nonce (c), an acked message its
// recipient never saw (c).
func TestChaosCheckReportsViolations(t *testing.T) {
	t.Parallel()
	r := newCheckRun(chaosLog(t))
	r.accepted["m-lost"] = true
	r.attempted["m-lost"] = "r@x.beam.directory"
	r.seen["o@x.beam.directory"] = map[string]bool{"m-dead": true, "m-unknown": true}
	delete(r.seen["r@x.beam.directory"], "m-acked")
	rep := &ChaosReport{}
	require.NoError(t, r.check(context.Background(), rep))
	require.False(t, rep.OK())
	byName := map[string]*Invariant{}
	for _, inv := range rep.Invariants {
		byName[inv.Name[:3]] = inv
	}
	require.EqualValues(t, 1, byName["(a)"].ViolationCount, byName["(a)"].Violations)
	require.Contains(t, byName["(a)"].Violations[0], "m-lost")
	require.Zero(t, byName["(b)"].ViolationCount)
	require.EqualValues(t, 3, byName["(c)"].ViolationCount, byName["(c)"].Violations)
	require.Zero(t, byName["(d)"].ViolationCount)
	var out bytes.Buffer
	require.NoError(t, rep.WriteText(&out))
	require.Contains(t, out.String(), "CHAOS FAIL")
}

// A projection row that differs from what the log folds to is caught (d).
func TestChaosCheckDetectsProjectionDrift(t *testing.T) {
	t.Parallel()
	dir := chaosLog(t)
	db, err := sqlx.Open("sqlite", filepath.Join(dir, "beam.db"))
	require.NoError(t, err)
	_, err = db.Exec(`UPDATE beam_messages SET priority = 7 WHERE nonce = 'm-dead'`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	rep := &ChaosReport{}
	require.NoError(t, newCheckRun(dir).check(context.Background(), rep))
	d := rep.Invariants[3]
	require.EqualValues(t, 1, d.ViolationCount, d.Violations)
	require.Contains(t, d.Violations[0], "m-dead")
}

// An event sequence the lifecycle forbids is caught (b).
func TestChaosCheckTracesDetectsIllegalPath(t *testing.T) {
	t.Parallel()
	dir := chaosLog(t)
	db, err := sqlx.Open("sqlite", filepath.Join(dir, "beam.db"))
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO intent_trace_events(nonce, state, at) VALUES('ghost', 'acked', 1)`)
	require.NoError(t, err)
	require.NoError(t, db.Close())
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(dir, "beam.db")})
	require.NoError(t, err)
	defer lg.Close()
	inv := &Invariant{}
	require.NoError(t, checkTraces(context.Background(), lg, inv))
	require.EqualValues(t, 3, inv.Checked)
	require.EqualValues(t, 1, inv.ViolationCount, inv.Violations)
	require.Contains(t, inv.Violations[0], "ghost")
}

func TestChaosConfigBounds(t *testing.T) {
	t.Parallel()
	_, err := ChaosConfig{}.withDefaults()
	require.Error(t, err)
	_, err = ChaosConfig{Binary: "b", DataDir: "d", Kills: maxChaosKills + 1}.withDefaults()
	require.Error(t, err)
	_, err = ChaosConfig{Binary: "b", DataDir: "d", FlakyPercent: 101}.withDefaults()
	require.Error(t, err)
	c, err := ChaosConfig{Binary: "b", DataDir: "d"}.withDefaults()
	require.NoError(t, err)
	require.NotZero(t, c.Seed)
	require.Equal(t, 3, c.Kills)
	require.Equal(t, 5*time.Minute, c.Duration)
}

func TestFederationConfig(t *testing.T) {
	t.Parallel()
	_, err := Config{URL: "http://a", Mode: ModeFederation}.withDefaults()
	require.ErrorContains(t, err, "peer-url")
	_, err = Config{URL: "http://a", PeerURL: "http://b", Mode: ModeFederation, Domain: "nope.example.com"}.withDefaults()
	require.Error(t, err)
	_, err = Config{URL: "http://a", PeerURL: "http://b", Mode: ModeFederation, Domain: "beta.beam.directory"}.withDefaults()
	require.Error(t, err)
	c, err := Config{URL: "http://a", PeerURL: "http://b/", Mode: ModeFederation, Org: "bench1"}.withDefaults()
	require.NoError(t, err)
	pl := c.placement()
	require.Equal(t, placement{[]string{"http://a"}, "alpha", "sbench1", []string{"http://b"}, "beta", "rbench1"}, pl)
	c, err = Config{URL: "http://a", Mode: modeBus, Org: "bench1"}.withDefaults()
	require.NoError(t, err)
	require.Equal(t, placement{[]string{"http://a"}, "bench1", "s", []string{"http://a"}, "bench1", "r"}, c.placement())
}
