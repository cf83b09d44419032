package federation

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// outboxSnapshot is every outbox row by event id, without the claim token
// (never logged).
func outboxSnapshot(t *testing.T, d *fedDir) map[string]Row {
	t.Helper()
	return rowsByEventID(t, d.node.outbox)
}

// rowsByEventID reads every row of ob (without claim tokens, which the
// log does not record), by event id.
func rowsByEventID(t *testing.T, ob *Outbox) map[string]Row {
	t.Helper()
	rows, err := ob.Rows(context.Background(), "", 1000)
	require.NoError(t, err)
	out := map[string]Row{}
	for _, r := range rows {
		r.token = ""
		out[r.EventID] = r
	}
	return out
}

// stepsOf returns the outbox steps recorded in a trace, in order.
func stepsOf(t *testing.T, tr []tracing.Event) []step {
	t.Helper()
	var out []step
	for _, ev := range tr {
		v, ok := ev.Details.Extra["outbox"]
		if !ok {
			continue
		}
		raw, err := json.Marshal(v)
		require.NoError(t, err)
		var st step
		require.NoError(t, json.Unmarshal(raw, &st))
		out = append(out, st)
	}
	return out
}

// lifecycle returns the states of a trace with the annotations (an event
// in the state of the one before it, like the outbox's steps) folded away.
func lifecycle(tr []tracing.Event) []tracing.State {
	var out []tracing.State
	for _, st := range states(tr) {
		if len(out) == 0 || out[len(out)-1] != st {
			out = append(out, st)
		}
	}
	return out
}

// requireOutboxSteps checks that a forwarded intent's steps begin with
// PENDING, CLAIMED and end with want, alternating retries between.
func requireOutboxSteps(t *testing.T, tr []tracing.Event, want OutboxState) {
	t.Helper()
	got := stepStates(t, tr)
	require.GreaterOrEqual(t, len(got), 3, "%v", got)
	require.Equal(t, []OutboxState{Pending, Claimed}, got[:2], "%v", got)
	require.Equal(t, want, got[len(got)-1], "%v", got)
}

// stepStates returns the outbox states of the steps in a trace.
func stepStates(t *testing.T, tr []tracing.Event) []OutboxState {
	t.Helper()
	var out []OutboxState
	for _, st := range stepsOf(t, tr) {
		out = append(out, st.State)
	}
	return out
}

// TestOutboxStepsAreInTheLogAndRebuildTheOutbox: every transition of an
// outbox row is an event of its intent — a durable send while the peer is
// down shows PENDING, CLAIMED, PENDING again with the attempt and the
// error, …, CLAIMED, PUBLISHED, all naming the peer — and RebuildOutbox
// refolds the table from them to exactly what the live writes produced,
// also after the table was damaged. A dead row and its operator replay are
// steps too; a replay of a row whose intent is acked is refused.
func TestOutboxStepsAreInTheLogAndRebuildTheOutbox(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b := beta.agent("b")
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply { return agents.Success(nil) })
	require.NoError(t, b.Connect(ctx))
	a := sdkAt(t, front.url, "a@alpha.beam.directory")

	// A sync send: PENDING on the dispatched event, CLAIMED, PUBLISHED on acked.
	sync := alpha.agent("s")
	res, err := sync.Send(ctx, "b@beta.beam.directory", "task.run", map[string]any{})
	require.NoError(t, err)
	require.True(t, res.Success)

	// A durable send while the peer does not answer: retries are steps.
	require.NoError(t, beta.node.Close())
	rec, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.run", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n := 0
		for _, st := range stepsOf(t, alpha.trace(rec.Nonce)) {
			if st.State == Pending && st.LastError != "" {
				n++
			}
		}
		return n >= 2
	}, 30*time.Second, 20*time.Millisecond, "the failed publishes are in the trace")
	steps := stepsOf(t, alpha.trace(rec.Nonce))
	require.Equal(t, Pending, steps[0].State)
	require.NotEmpty(t, steps[0].Payload, "the creating step carries what the relay publishes")
	require.Equal(t, Claimed, steps[1].State)
	require.Equal(t, Pending, steps[2].State)
	require.Equal(t, 1, steps[2].Attempts)
	require.Contains(t, steps[2].LastError, "beta.beam.directory")
	for _, st := range steps {
		require.Equal(t, "beta.beam.directory", st.Peer)
	}
	// The operator's status shows the peer's backlog.
	status, err := alpha.node.Status(ctx)
	require.NoError(t, err)
	bl := status.(map[string]any)["backlog"].(map[string]backlog)["beta.beam.directory"]
	require.EqualValues(t, 1, bl.Depth)
	require.False(t, bl.Oldest.IsZero())
	require.Contains(t, bl.LastError, "beta.beam.directory")

	// Unpinning beta kills the row: DEAD rides on the dead_letter event.
	_, err = alpha.node.RemovePeer(ctx, "beta.beam.directory")
	require.NoError(t, err)
	defer func() {
		if t.Failed() {
			for _, ev := range alpha.trace(rec.Nonce) {
				t.Logf("%s %v", ev.State, ev.Details.Extra)
			}
			t.Logf("%+v", outboxSnapshot(t, alpha))
		}
	}()
	// A publish in flight to the stopped peer may have to time out first.
	require.Eventually(t, func() bool {
		m, ok, err := alpha.log.Message(ctx, rec.Nonce)
		return err == nil && ok && m.Status == tracing.DeadLetter
	}, 2*time.Minute, 20*time.Millisecond)
	tr := alpha.trace(rec.Nonce)
	last := tr[len(tr)-1]
	require.Equal(t, tracing.DeadLetter, last.State)
	steps = stepsOf(t, tr)
	require.Equal(t, Dead, steps[len(steps)-1].State)

	// The operator replays the dead row: a step on the dead_letter intent.
	rows, err := alpha.node.outbox.Rows(ctx, Dead, 10)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	before := len(steps)
	require.NoError(t, alpha.node.outbox.Replay(ctx, rows[0].ID))
	// The relay may claim the replayed row at once, so the replay step is
	// the first new one, not necessarily the last.
	steps = stepsOf(t, alpha.trace(rec.Nonce))
	require.Greater(t, len(steps), before)
	require.True(t, steps[before].Replay, "the first step after the dead one is the operator's replay")
	require.Eventually(t, func() bool {
		r, _, err := alpha.node.outbox.Get(ctx, rows[0].ID)
		require.NoError(t, err)
		return r.State == Dead
	}, 30*time.Second, 20*time.Millisecond, "the replayed row dies again: the peer is not pinned")

	// A replay of the sync intent's PUBLISHED row is refused: it is acked.
	pub, err := alpha.node.outbox.Rows(ctx, Published, 10)
	require.NoError(t, err)
	require.Len(t, pub, 1)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, alpha.srv.URL+"/federation/outbox/"+
		strconv.FormatInt(pub[0].ID, 10)+"/replay", nil)
	require.NoError(t, err)
	req.Header.Set("X-Admin-Token", "op")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusConflict, resp.StatusCode)

	// The table is the fold of the steps, also after damage.
	live := outboxSnapshot(t, alpha)
	require.Len(t, live, 2)
	_, err = alpha.log.Do(ctx, func(tx *sqlx.Tx) error {
		// (Not to PENDING: the live relay would claim the damaged row.)
		if _, err := tx.Exec(`UPDATE federation_outbox SET status = 'DEAD', attempts = 99, last_error = 'x'`); err != nil {
			return err
		}
		_, err := tx.Exec(`DELETE FROM federation_outbox WHERE id = ?`, pub[0].ID)
		return err
	})
	require.NoError(t, err)
	n, err := RebuildOutbox(ctx, alpha.log)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	after := outboxSnapshot(t, alpha)
	// The deleted row comes back under a new id.
	restored := after[pub[0].EventID]
	restored.ID = pub[0].ID
	after[pub[0].EventID] = restored
	require.Equal(t, live, after)
	lifecycletest.RequireRebuildEqual(t, alpha.log)
}

// TestDeadCrossDirectoryMessageIsRequeuedLikeAnyDeadLetter: a durable
// message whose outbox row died (the peer's agent stayed offline through
// every attempt) is a dead letter of the bus; the operator's requeue sends
// it again through a new row, and it is delivered once.
func TestDeadCrossDirectoryMessageIsRequeuedLikeAnyDeadLetter(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", func(c *Config) { c.MaxAttempts = 2 })
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	front := startBus(t, alpha)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := beta.agent("b") // registered, offline for now
	var delivered atomic.Int64
	b.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		delivered.Add(1)
		return agents.Success(nil)
	})
	a := sdkAt(t, front.url, "a@alpha.beam.directory")
	// The link to beta is up first, so that the row dies of b being
	// offline, not of the link.
	require.Eventually(t, func() bool {
		links, err := alpha.node.Links(ctx)
		require.NoError(t, err)
		return len(links) == 1 && links[0].Connected != nil && *links[0].Connected
	}, 30*time.Second, 20*time.Millisecond)

	rec, err := a.SendDurable(ctx, "b@beta.beam.directory", "task.run", map[string]any{}, nil)
	require.NoError(t, err)
	alpha.waitMessage(rec.Nonce, tracing.DeadLetter)
	require.Contains(t, eventOf(t, alpha.trace(rec.Nonce), tracing.DeadLetter).Details.Error, "OFFLINE")
	steps := stepStates(t, alpha.trace(rec.Nonce))
	require.Equal(t, Dead, steps[len(steps)-1])

	require.NoError(t, b.Connect(ctx))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, front.url+"/v1/beam/dead-letter/"+rec.MessageID+"/requeue", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testBusKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	defer func() {
		if t.Failed() {
			for _, ev := range alpha.trace(rec.Nonce) {
				t.Logf("%s %s %v", ev.State, ev.Transport, ev.Details.Extra)
			}
		}
	}()
	alpha.waitMessage(rec.Nonce, tracing.Acked)
	require.EqualValues(t, 1, delivered.Load())
	rows, err := alpha.node.outbox.Rows(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, rows, 2, "the requeued attempt has a row of its own")
}

// TestOutboxRowsOfAckedIntentsDoNotHoldUpClaims: a PENDING row whose
// intent is already acked takes no step, is not claimed, and does not
// keep the rows behind it from being claimed.
func TestOutboxRowsOfAckedIntentsDoNotHoldUpClaims(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	first := b.enqueue()
	r := b.get(first)
	for _, st := range []tracing.State{tracing.Dispatched, tracing.Delivered, tracing.Acked} {
		_, err := b.log.Append(ctx, tracing.Event{Nonce: r.Nonce, State: st})
		require.NoError(t, err)
	}
	second := b.enqueue()
	c := b.claimOne("relay-1")
	require.Equal(t, second, c.ID)
	require.Equal(t, Pending, b.get(first).State)
	tr, err := b.log.Trace(ctx, c.Nonce)
	require.NoError(t, err)
	require.Equal(t, []OutboxState{Pending, Claimed}, stepStates(t, tr))
}
