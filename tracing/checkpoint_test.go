package tracing

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The writer does not checkpoint (wal_autocheckpoint is off): the
// checkpointer copies the WAL into the database file in the background.
func TestCheckpointerCopiesWAL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.log.ckpt.every = 2
	st, err := os.Stat(b.path)
	require.NoError(t, err)
	initial := st.Size()
	ctx := context.Background()
	for i := range 40 {
		_, err := b.log.Append(ctx, received(fmt.Sprintf("n-%d", i)))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		st, err := os.Stat(b.path)
		return err == nil && st.Size() > initial
	}, 10*time.Second, 5*time.Millisecond, "the database file never received a checkpoint")
}

// Once the WAL is large, the writer restarts it between batches; appends go
// on and everything stays readable, also after reopening.
func TestCheckpointerRestartsLargeWAL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.log.ckpt.every = 1
	b.log.ckpt.restartPages = 1
	ctx := context.Background()
	for i := range 30 {
		_, err := b.log.Append(ctx, received(fmt.Sprintf("n-%d", i)), ev(fmt.Sprintf("n-%d", i), Validated))
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		if b.log.walRestarts.Load() > 0 {
			return true
		}
		// The writer restarts the WAL before its next batch.
		_, err := b.log.Append(ctx, ev("n-0", Dispatched), ev("n-0", Dispatched))
		require.NoError(t, err)
		return false
	}, 10*time.Second, time.Millisecond)
	_, err := b.log.Append(ctx, received("after"))
	require.NoError(t, err)
	b.reopen()
	for i := range 30 {
		st, ok, err := b.log.State(ctx, fmt.Sprintf("n-%d", i))
		require.NoError(t, err)
		require.True(t, ok)
		require.NotEmpty(t, st)
	}
	evs, err := b.log.Trace(ctx, "after")
	require.NoError(t, err)
	require.Len(t, evs, 1)
}
