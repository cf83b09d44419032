package tracing

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenReadOnlyReadsALiveLog reads a log another Log is writing: it sees
// the committed events, refuses writes, and changes nothing on disk.
func TestOpenReadOnlyReadsALiveLog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.log.Append(ctx, Event{Nonce: "ro-1", State: Received, From: "a@x", To: "b@x", IntentType: "t"})
	require.NoError(t, err)

	ro, err := OpenReadOnly(ctx, b.path)
	require.NoError(t, err)
	events, err := ro.Trace(ctx, "ro-1")
	require.NoError(t, err)
	require.Len(t, events, 1)
	_, err = ro.Append(ctx, Event{Nonce: "ro-2", State: Received, From: "a@x", To: "b@x", IntentType: "t"})
	require.ErrorIs(t, err, ErrClosed)
	require.NoError(t, ro.Close())

	// The writer is unaffected.
	_, err = b.log.Append(ctx, Event{Nonce: "ro-1", State: Validated})
	require.NoError(t, err)

	missing := filepath.Join(t.TempDir(), "none.db")
	_, err = OpenReadOnly(ctx, missing)
	require.Error(t, err)
	_, statErr := os.Stat(missing)
	require.ErrorIs(t, statErr, os.ErrNotExist, "a read-only open creates nothing")
}
