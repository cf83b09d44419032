package federation

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/lifecycletest"
	"github.com/beamdir/beam/tracing"
)

// TestOutboxLifecycleWalk: random operations of relays and operators on
// the real outbox (enqueue, claim, publish, retry, kill, reap, reap of
// another relay's claims, replay) only ever move a row along the outbox
// table (outboxLifecycle), in the table as in the steps the log records;
// and RebuildOutbox, a full refold of the steps, gives the rows the outbox
// wrote, as a rebuild of the log gives its projections.
func TestOutboxLifecycleWalk(t *testing.T) {
	t.Parallel()
	b := setupOutbox(t)
	ctx := context.Background()
	seed := lifecycletest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x0b0c))
	held := map[int64]claim{}
	var ids []int64
	pick := func() (claim, bool) {
		for id, c := range held {
			delete(held, id)
			return c, true
		}
		return claim{}, false
	}
	snapshot := func() map[string]Row { return rowsByEventID(t, b.ob) }
	prev := map[string]Row{}
	moves := 0
	for step := range 400 {
		var err error
		switch op := rng.IntN(8); {
		case op == 0 && len(ids) < 25 || len(ids) == 0:
			nonce := fmt.Sprintf("walk-%d-%d", seed%1000, step)
			ev := tracing.Event{Nonce: nonce, State: tracing.Received, From: "a@alpha.beam.directory",
				To: "b@beta.beam.directory", IntentType: "task"}
			err = b.ob.Enqueue(ctx, newRow{EventID: nonce + "/1", Kind: kindIntent, Peer: "beta.beam.directory",
				Nonce: nonce, Owner: tracing.OwnerBus, Payload: []byte(`{}`), MaxAttempts: 5}, ev)
			rows, _ := b.ob.Rows(ctx, "", 1000)
			ids = ids[:0]
			for _, r := range rows {
				ids = append(ids, r.ID)
			}
		case op == 1:
			var cs []claim
			cs, err = b.ob.Claim(ctx, []string{"r1", "r2"}[rng.IntN(2)], 1+rng.IntN(3))
			for _, c := range cs {
				held[c.ID] = c
			}
		case op == 2:
			if c, ok := pick(); ok {
				err = b.ob.Publish(ctx, c)
			}
		case op == 3:
			if c, ok := pick(); ok {
				err = b.ob.Retry(ctx, c, "try again", b.clock.Now())
			}
		case op == 4:
			if c, ok := pick(); ok {
				err = b.ob.Kill(ctx, c, "gave up")
			}
		case op == 5:
			b.clock.Advance(time.Minute)
			_, err = b.ob.Reap(ctx, 30*time.Second)
		case op == 6:
			_, err = b.ob.ReapOthers(ctx, "r1")
		default:
			err = b.ob.Replay(ctx, ids[rng.IntN(len(ids))])
		}
		var te *outboxTransitionError
		if err != nil && !errors.Is(err, errClaimLost) && !errors.As(err, &te) {
			require.NoError(t, err, "step %d", step)
		}
		cur := snapshot()
		for id, r := range cur {
			if p := prev[id]; p.State != r.State {
				require.True(t, canTransitionOutbox(p.State, r.State), "step %d: row %s %s -> %s", step, id, p.State, r.State)
				moves++
			}
		}
		prev = cur
	}
	t.Logf("%d rows, %d moves", len(prev), moves)
	require.Positive(t, moves)

	// The steps in the log move along the table too.
	for _, r := range prev {
		tr, err := b.log.Trace(ctx, r.Nonce)
		require.NoError(t, err)
		var state OutboxState
		for _, st := range stepsOf(t, tr) {
			require.True(t, canTransitionOutbox(state, st.State), "row %s: %s -> %s in the log", r.EventID, state, st.State)
			state = st.State
		}
		require.Equal(t, r.State, state)
	}

	// A full refold of the steps gives the rows the outbox wrote.
	n, err := RebuildOutbox(ctx, b.log)
	require.NoError(t, err)
	require.Equal(t, len(prev), n)
	require.Equal(t, prev, snapshot())
	lifecycletest.RequireRebuildEqual(t, b.log)
}
