package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/internal/dirlock"
)

// TestSecondWriterOnHeldDataDirExits runs a directory with traffic and a
// leased bus message, then starts a second `beam serve` and a `beam replay`
// on its data directory. Both must exit non-zero naming the holder before
// they touch the log, and the first server's sends, the ack of the leased
// message and /health must be unaffected. `beam trace` still reads.
func TestSecondWriterOnHeldDataDirExits(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: busArgs})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, sender := sdkAgent(t, ctx, p.URL(), "sender@acme.beam.directory")
	rid, worker := sdkAgent(t, ctx, p.URL(), "worker@acme.beam.directory")

	rec, err := sender.SendDurable(ctx, rid.BeamID, "task.run", map[string]any{"job": 1}, nil)
	require.NoError(t, err)
	leased, err := worker.Poll(ctx, agents.PollOptions{Claim: true, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, leased, 1)
	require.Equal(t, rec.MessageID, leased[0].ID)

	lockPath := filepath.Join(p.DataDir, dirlock.FileName)
	b, err := os.ReadFile(lockPath)
	require.NoError(t, err)
	serverPID := string(b[:len(b)-1])
	_, err = strconv.Atoi(serverPID)
	require.NoError(t, err, "the lock file holds the server's PID, got %q", b)

	// The server writes projection rows behind the log shortly after the
	// commits above; only once they are written is its log idle.
	waitRowsWritten(t, p)
	walBefore := fileSize(t, filepath.Join(p.DataDir, "beam.db-wal"))
	// The same address, as a user who runs `beam serve` twice would.
	out, err := beamtest.Run(t, ctx, "serve", "--listen", strings.TrimPrefix(p.URL(), "http://"), "--data-dir", p.DataDir)
	require.Error(t, err, "a second beam serve must not start:\n%s", out)
	require.Contains(t, out, "in use by process "+serverPID)
	require.Contains(t, out, lockPath)
	require.NotContains(t, out, "beam serving on")

	out, err = beamtest.Run(t, ctx, "replay", "--data-dir", p.DataDir)
	require.Error(t, err, "beam replay must refuse a held data directory:\n%s", out)
	require.Contains(t, out, "in use by process "+serverPID)
	require.NotContains(t, out, "replayed")
	require.Equal(t, walBefore, fileSize(t, filepath.Join(p.DataDir, "beam.db-wal")), "the refused commands wrote nothing to the log")

	// The running server is untouched: the lease is still valid, sends
	// and acks commit, /health is ok.
	res, err := worker.Ack(ctx, &leased[0], agents.AckAcked, map[string]any{"ok": true})
	require.NoError(t, err)
	require.NotNil(t, res)
	require.Eventually(t, func() bool {
		m, err := sender.DurableMessageStatus(ctx, rec.MessageID)
		return err == nil && m.Status == "acked"
	}, 30*time.Second, 20*time.Millisecond)
	rec2, err := sender.SendDurable(ctx, rid.BeamID, "task.run", map[string]any{"job": 2}, nil)
	require.NoError(t, err)
	more, err := worker.Poll(ctx, agents.PollOptions{Claim: true, Lease: time.Minute})
	require.NoError(t, err)
	require.Len(t, more, 1)
	require.Equal(t, rec2.MessageID, more[0].ID)
	_, err = worker.Ack(ctx, &more[0], agents.AckAcked, nil)
	require.NoError(t, err)
	resp, err := http.Get(p.URL() + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// Reading needs no lock.
	out, err = beamtest.Run(t, ctx, "trace", "--data-dir", p.DataDir, rec.Nonce)
	require.NoError(t, err, out)
	require.Contains(t, out, "acked")

	// Once the server stops, the directory is free again.
	p.Stop()
	out, err = beamtest.Run(t, ctx, "replay", "--data-dir", p.DataDir)
	require.NoError(t, err, out)
	require.Contains(t, out, "replayed")
}

// waitRowsWritten waits until the server holds no projection row in memory
// (beam_log_projection_pending_rows on its operator metrics is 0).
func waitRowsWritten(t *testing.T, p *beamtest.Process) {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodGet, p.URL()+"/metrics", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return strings.Contains(string(b), "\nbeam_log_projection_pending_rows 0\n")
	}, 30*time.Second, 10*time.Millisecond)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Size()
}
