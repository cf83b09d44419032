package beam

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/dirlock"
	"github.com/beamdir/beam/tracing"
)

// TestHealthReportsUnwritableLog writes a row into the live log file behind
// the server's back, as a second process on the same data directory did:
// every later commit then fails, and /health must say so instead of "ok".
func TestHealthReportsUnwritableLog(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{})
	ctx := context.Background()
	first := tracing.Event{Nonce: "health-1", State: tracing.Received, From: "a@x.beam.directory", To: "b@x.beam.directory", IntentType: "t"}
	got, err := l.srv.Log().Append(ctx, first)
	require.NoError(t, err)
	requireHealth(t, l.url, http.StatusOK)

	db, err := sql.Open("sqlite", filepath.Join(l.srv.cfg.DataDir, "beam.db"))
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`INSERT INTO intent_trace_events(seq, nonce, state, at, first_seq) VALUES (?, 'intruder', 'received', 0, ?)`,
		got[0].Seq+1, got[0].Seq+1)
	require.NoError(t, err)

	second := first
	second.Nonce = "health-2"
	_, err = l.srv.Log().Append(ctx, second)
	require.Error(t, err, "the writer's next seq is taken")
	requireHealth(t, l.url, http.StatusServiceUnavailable)
}

// TestSecondServerOnHeldDataDirIsRefused starts a second directory on the
// data directory of a running one, in the same process: it is refused with
// the holder's PID and the lock path before it opens the log.
func TestSecondServerOnHeldDataDirIsRefused(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{})
	_, err := New(context.Background(), Config{DataDir: l.srv.cfg.DataDir, Logger: quietLogger(), Limits: &Limits{}})
	var held *dirlock.HeldError
	require.True(t, errors.As(err, &held), "got %v", err)
	require.Equal(t, filepath.Join(l.srv.cfg.DataDir, dirlock.FileName), held.Path)
	requireHealth(t, l.url, http.StatusOK)
}

// requireHealth waits until /health answers want. A health check runs a
// transaction through the log's writer with a 2 s bound, which a machine
// loaded by other tests can exceed once; what the tests look for (a log
// that refuses writes, or one a second process broke) persists.
func requireHealth(t *testing.T, base string, want int) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		resp, err := http.Get(base + "/health")
		if !assert.NoError(c, err) {
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(c, want, resp.StatusCode, "%s", body)
	}, 20*time.Second, 50*time.Millisecond)
}
