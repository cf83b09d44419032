package legacy_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
	"github.com/beamdir/beam/tracing/legacy"
	"github.com/beamdir/beam/tracing/legacy/legacytest"
)

// TestImportIntoLog imports the fixture databases into a real tracing.Log
// and checks the projections, the stored details and a re-import.
func TestImportIntoLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := t.Context()
	lg, err := tracing.Open(ctx, tracing.Config{Path: filepath.Join(dir, "beam.db")})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, lg.Close()) })

	parts := []legacytest.Part{legacytest.Directory, legacytest.Bus}
	src := legacytest.Build(t, filepath.Join(dir, "legacy with space #1.db"), parts...)
	old := legacytest.Build(t, filepath.Join(dir, "old.db"), legacytest.DirectoryWithoutNonce)

	rep, err := legacy.Import(ctx, src, lg, legacy.Options{})
	require.NoError(t, err)
	rep2, err := legacy.Import(ctx, old, lg, legacy.Options{})
	require.NoError(t, err)

	want, broken := legacytest.Expected(append(parts, legacytest.DirectoryWithoutNonce)...)
	require.Len(t, append(rep.Errors, rep2.Errors...), len(broken), "%s\n%s", rep, rep2)
	events := 0
	for nonce, w := range want {
		st, ok, err := lg.State(ctx, nonce)
		require.NoError(t, err)
		require.True(t, ok, nonce)
		require.Equal(t, w.Final(), st, nonce)

		row, ok, err := lg.Intent(ctx, nonce)
		require.NoError(t, err)
		require.True(t, ok, nonce)
		require.Equal(t, w.Final(), row.Status, nonce)
		require.Equal(t, w.Owner, row.Owner, nonce)
		require.NotEmpty(t, row.From, nonce)
		if w.Final().Terminal() {
			require.NotNil(t, row.CompletedAt, nonce)
		}

		trace, err := lg.Trace(ctx, nonce)
		require.NoError(t, err)
		require.Equal(t, w.States, states(trace), nonce)
		require.Equal(t, w.LegacyStatus, trace[len(trace)-1].Details.LegacyStatus, nonce)
		events += len(trace)

		_, isMsg, err := lg.Message(ctx, nonce)
		require.NoError(t, err)
		require.Equal(t, w.Owner == tracing.OwnerBus, isMsg, nonce)
	}
	require.Equal(t, events, rep.Events+rep2.Events)
	for nonce := range broken {
		_, ok, err := lg.State(ctx, nonce)
		require.NoError(t, err)
		require.False(t, ok, "rejected nonce %s was written", nonce)
	}

	// Legacy labels and details survive storage.
	trace, err := lg.Trace(ctx, "n-legacy-federated")
	require.NoError(t, err)
	require.Equal(t, "federation.resolve", trace[2].Details.LegacyStage)
	require.Equal(t, "success", trace[2].Details.LegacyStatus)
	require.Equal(t, "https://peer.example", trace[2].Details.Extra["peerUrl"])
	require.Equal(t, time.Date(2024, 3, 1, 10, 1, 0, 30e6, time.UTC), trace[2].At.UTC())

	row, _, err := lg.Intent(ctx, "n-legacy-acked")
	require.NoError(t, err)
	require.JSONEq(t, `{"v":"1","success":true,"nonce":"n-legacy-acked","payload":{"ok":true}}`, string(row.ResultJSON))
	require.NotNil(t, row.RoundTripLatencyMs)
	require.EqualValues(t, 420, *row.RoundTripLatencyMs)
	require.Equal(t, "2024-03-01T10:00:00.000Z", row.ClientTimestamp)
	row, _, err = lg.Intent(ctx, "n-legacy-offline")
	require.NoError(t, err)
	require.Equal(t, "OFFLINE", row.ErrorCode)

	msg, ok, err := lg.Message(ctx, "0b5e7c1a00000000000000000000a002")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Queued, msg.Status)
	require.Equal(t, 2, msg.RetryCount)
	require.NotNil(t, msg.NextRetryAt)
	require.InDelta(t, 1709294490.5, *msg.NextRetryAt, 0.001)
	require.Equal(t, "HTTP 503", msg.Error)
	msg, _, err = lg.Message(ctx, "b-acked")
	require.NoError(t, err)
	require.Equal(t, tracing.Acked, msg.Status)
	require.Equal(t, "0b5e7c1a00000000000000000000a006", msg.ID)
	require.JSONEq(t, `{"ok":true}`, string(msg.Response))
	require.NotNil(t, msg.AckedAt)
	require.InDelta(t, 1709294406, *msg.AckedAt, 0.001)

	// Importing again writes nothing.
	seq := lg.LastSeq()
	again, err := legacy.Import(ctx, src, lg, legacy.Options{})
	require.NoError(t, err)
	require.Zero(t, again.Events)
	require.Equal(t, rep.Intents+rep.Messages, again.Skipped)
	require.Len(t, again.Errors, len(rep.Errors))
	require.Equal(t, seq, lg.LastSeq())
}
