package tracing

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// TestKeySetNeverForgetsAKey: every key added, across several layers, is
// reported as maybe present, the count is exact, and keys never added are
// mostly reported absent.
func TestKeySetNeverForgetsAKey(t *testing.T) {
	t.Parallel()
	var s keySet
	require.False(t, s.mayHave("x"), "an empty set has nothing")
	const n = 5*keySetFirst + 17 // three layers
	for i := range n {
		s.add(fmt.Sprintf("nonce-%d", i))
	}
	require.Len(t, s.layers, 3)
	require.EqualValues(t, n, s.count())
	for i := range n {
		require.True(t, s.mayHave(fmt.Sprintf("nonce-%d", i)), "key %d", i)
	}
	fp := 0
	for i := range n {
		if s.mayHave(fmt.Sprintf("other-%d", i)) {
			fp++
		}
	}
	// Three layers at 0.1 % each: about 0.3 % of absent keys pass.
	require.Less(t, float64(fp)/n, 0.01, "false positives")
}

// TestRowKeysSpareLookUpsAndMissNoRow: once the row keys are read, a batch
// of new nonces is written without reading intent_log or beam_messages, and
// a nonce or message id that has a row — written by an earlier process or by
// this one — is still refused.
func TestRowKeysSpareLookUpsAndMissNoRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	finish := func(nonce string) []Event {
		evs := make([]Event, 5)
		for i := range evs {
			evs[i] = lifecycle(nonce, i)
		}
		return evs
	}
	for i := range 20 {
		b.append(finish(fmt.Sprintf("old-%d", i))...)
	}
	old := busReceived("old-bus", "id-old")
	b.append(old, Event{Nonce: "old-bus", State: Failed})
	require.NoError(t, b.log.Sync(ctx))
	b.reopen()
	require.Eventually(t, func() bool { return b.log.w.rows.scanned.Load() != nil }, 10*time.Second, time.Millisecond)

	b.append(finish("mid")...)
	b.append(busReceived("mid-bus", "id-mid"), Event{Nonce: "mid-bus", State: Failed})
	require.NoError(t, b.log.Sync(ctx), "the rows are written by this process")

	lookedUp := func() int {
		var n int
		_, err := b.log.Do(ctx, func(*sqlx.Tx) error { n = b.log.w.rows.lookedUp; return nil })
		require.NoError(t, err)
		return n
	}
	before := lookedUp()
	var batch []Event
	for i := range 40 {
		batch = append(batch, busReceived(fmt.Sprintf("new-%d", i), fmt.Sprintf("id-new-%d", i)))
	}
	b.append(batch...)
	require.LessOrEqual(t, lookedUp()-before, 2, "80 new keys, at most a false positive or two read")

	for _, n := range []string{"old-7", "mid"} {
		_, err := b.log.Append(ctx, received(n))
		var te *TransitionError
		require.ErrorAs(t, err, &te, "%s has a row", n)
		require.Equal(t, Acked, te.From)
	}
	for _, id := range []string{"id-old", "id-mid"} {
		_, err := b.log.Append(ctx, busReceived("again-"+id, id))
		var ve *ValidationError
		require.ErrorAs(t, err, &ve, "message id %s has a row", id)
	}
	// And the same before the rows of this process are written.
	b.append(finish("fresh")...)
	b.append(busReceived("fresh-bus", "id-fresh"))
	_, err := b.log.Append(ctx, received("fresh"))
	var te *TransitionError
	require.ErrorAs(t, err, &te)
	_, err = b.log.Append(ctx, busReceived("fresh-2", "id-fresh"))
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
}
