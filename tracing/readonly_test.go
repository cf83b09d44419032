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
	require.ErrorIs(t, err, errClosed)
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

// TestSecondWriterIsRefused: while a log is open for writing, a second
// Open of the same file (here, in the same process) is refused with an
// error that names the way to read it; OpenReadOnly still reads it; after
// Close the file opens for writing again.
func TestSecondWriterIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "beam.db")
	first, err := Open(ctx, Config{Path: path})
	require.NoError(t, err)
	_, err = first.Append(ctx, Event{Nonce: "n1", State: Received, From: "a@x.beam.directory", To: "b@x.beam.directory", IntentType: "t"})
	require.NoError(t, err)

	_, err = Open(ctx, Config{Path: path})
	require.ErrorContains(t, err, "open for writing")
	require.ErrorContains(t, err, "OpenReadOnly")

	ro, err := OpenReadOnly(ctx, path)
	require.NoError(t, err)
	require.NoError(t, ro.Close())

	require.NoError(t, first.Close())
	again, err := Open(ctx, Config{Path: path})
	require.NoError(t, err)
	st, ok, err := again.State(ctx, "n1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Received, st)
	require.NoError(t, again.Close())
}
