package tracing

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStateGaugesAfterReopenWhileAppending: the finished intents are
// counted after the log is serving, while appends move intents into and
// out of the terminal states; once the count is in, every state gauge
// equals a full count of intent_log.
func TestStateGaugesAfterReopenWhileAppending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// Finished and open intents before the restart.
	for i := range 300 {
		n := fmt.Sprintf("old-%d", i)
		switch i % 4 {
		case 0, 1:
			b.append(received(n), ev(n, Dispatched), ev(n, Delivered), ev(n, Acked))
		case 2:
			b.append(received(n), ev(n, Failed))
		default:
			b.append(received(n), ev(n, Queued))
		}
	}
	b.reopen()

	// Appends race the deferred count: new intents finish, and queued ones
	// from before the restart fail and are requeued again.
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				n := fmt.Sprintf("new-%d-%d", w, i)
				_, err := b.log.Append(ctx, received(n), ev(n, Dispatched), ev(n, Delivered), ev(n, Acked))
				require.NoError(t, err)
				old := fmt.Sprintf("old-%d", 4*(w*10+i%10)+3)
				_, err = b.log.Append(ctx, ev(old, Failed))
				if err == nil {
					_, err = b.log.Append(ctx, ev(old, Queued))
				}
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool {
		b.log.countMu.Lock()
		defer b.log.countMu.Unlock()
		return b.log.tc.known
	}, 10*time.Second, 5*time.Millisecond)

	want, err := b.log.CountByState(ctx)
	require.NoError(t, err)
	for _, s := range States {
		require.Equal(t, float64(want[s]), b.metric("beam_intents", "state", string(s)), "state %s", s)
	}
	require.Equal(t, float64(310), b.metric("beam_intents", "state", "acked"))

	// A rebuild agrees, and later appends keep the gauges exact.
	_, err = b.log.Rebuild(ctx)
	require.NoError(t, err)
	b.append(received("after"), ev("after", Failed))
	want, err = b.log.CountByState(ctx)
	require.NoError(t, err)
	for _, s := range States {
		require.Equal(t, float64(want[s]), b.metric("beam_intents", "state", string(s)), "state %s after a rebuild", s)
	}
}

// TestInstallTerminalCountsSubtractsCommitsInTheSnapshot: commits the
// snapshot already holds are not counted twice; later ones are kept.
func TestInstallTerminalCountsSubtractsCommitsInTheSnapshot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	l := b.log
	l.stopTerminalCount() // drive the correction by hand
	l.countMu.Lock()
	l.tc.known, l.tc.pending = false, nil
	for i := range States {
		l.m.gauges[i].Set(0)
	}
	l.countMu.Unlock()
	acked := stateIndex(Acked)
	for seq, d := range []int64{2, 3, 5} {
		var deltas [8]int64
		deltas[acked] = d
		l.addGaugeDeltas(&deltas, int64(10*(seq+1)))
		require.Zero(t, deltas[acked], "the deltas are consumed")
	}
	require.Equal(t, float64(10), b.metric("beam_intents", "state", "acked"))
	// The snapshot at seq 20 holds the first two commits: 100 acked in all.
	l.installTerminalCounts(20, map[State]int64{Acked: 100})
	require.Equal(t, float64(105), b.metric("beam_intents", "state", "acked"))
	// Counted once: a second install changes nothing.
	l.installTerminalCounts(20, map[State]int64{Acked: 1})
	require.Equal(t, float64(105), b.metric("beam_intents", "state", "acked"))
}
