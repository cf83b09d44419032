package directory

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// TestAdoptSettlesImportedIntents: intents a dead node was relaying,
// imported behind a running directory, are settled once as startup
// recovery settles them — an interrupted one fails retryably, an overdue
// delivery fails TIMEOUT, a delivery still in its deadline waits for its
// result and the sweep fails it after — each with a takeover event naming
// the dead node; this directory's own intent is untouched, and a second
// Adopt adopts nothing.
func TestAdoptSettlesImportedIntents(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	alice, bob := b.register("alice"), b.register("bob")
	now := b.clock.Now()
	imported := map[string]any{"takenOver": map[string]any{"log": "log-dead", "node": "node-dead", "seq": 3}}
	fOwn := b.frame(alice, bob.id, "task.delegate", `{"n":0}`)
	fDispatched := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	fDelivered := b.frame(alice, bob.id, "task.delegate", `{"n":2}`)
	fOverdue := b.frame(alice, bob.id, "task.delegate", `{"n":3}`)
	seedIntent(t, b, fOwn, tracing.Dispatched, now, 30000)
	seedIntent(t, b, fDispatched, tracing.Dispatched, now, 30000, imported)
	seedIntent(t, b, fDelivered, tracing.Delivered, now, 30000, imported)
	seedIntent(t, b, fOverdue, tracing.Delivered, now.Add(-10*time.Minute), 30000, imported)
	ownStates := b.states(fOwn.Nonce)
	nonces := []string{fOwn.Nonce, fDispatched.Nonce, fDelivered.Nonce, fOverdue.Nonce}

	n, err := b.dir.Adopt(ctx, nonces)
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = b.dir.Adopt(ctx, nonces)
	require.NoError(t, err)
	require.Zero(t, n, "a second Adopt adopts nothing")
	require.Equal(t, ownStates, b.states(fOwn.Nonce), "this directory's own intent is untouched")

	marker := func(f *wire.IntentFrame) tracing.Event {
		ev := lastEvent(t, b, f.Nonce)
		require.Equal(t, tracing.TransportTakeover, ev.Transport)
		require.Equal(t, map[string]any{"log": "log-dead", "node": "node-dead"}, ev.Details.Extra["adoptedFrom"])
		return ev
	}
	ev := marker(fDispatched)
	require.Equal(t, tracing.Failed, ev.State)
	require.Equal(t, CodeDeliveryFailed, ev.Details.ErrorCode)
	require.True(t, ev.Details.Retryable)
	ev = marker(fOverdue)
	require.Equal(t, tracing.Failed, ev.State)
	require.Equal(t, CodeTimeout, ev.Details.ErrorCode)
	ev = marker(fDelivered)
	require.Equal(t, tracing.Delivered, ev.State, "a delivery in its deadline waits for its result")

	b.clock.Advance(31 * time.Second)
	swept, err := b.dir.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, swept)
	row := b.row(fDelivered.Nonce)
	require.Equal(t, tracing.Failed, row.Status)
	require.Equal(t, CodeTimeout, row.ErrorCode)
}
