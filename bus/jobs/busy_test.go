package jobs

import (
	"bytes"
	"context"
	"database/sql"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// TestHeldDatabaseLockAnswers503WithinTheSDKTimeout: another process holds
// the database's write lock. A publish answers 503 database_busy (which the
// Python SDK retries) before the SDK's 10 s request timeout gives up on it,
// and once the lock is released the bus takes writes again.
func TestHeldDatabaseLockAnswers503WithinTheSDKTimeout(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "beam.db")
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: path, Synchronous: "NORMAL"})
	require.NoError(t, err)
	svc, err := Open(context.Background(), Config{Log: lg, Secret: "main", AdminSecret: "adm"})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = svc.Close()
		_ = lg.Close()
	})
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)

	other, err := sql.Open("sqlite", path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Close() })
	conn, err := other.Conn(context.Background())
	require.NoError(t, err)
	_, err = conn.ExecContext(context.Background(), "BEGIN IMMEDIATE")
	require.NoError(t, err)

	// The SDK's client: a 10 s timeout per request.
	sdk := &http.Client{Timeout: 10 * time.Second}
	publish := func() (*http.Response, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/intent", bytes.NewReader([]byte(`{"goal":"g","payload":{"n":1}}`)))
		require.NoError(t, err)
		req.Header.Set("X-API-KEY", "main")
		req.Header.Set("Content-Type", "application/json")
		return sdk.Do(req)
	}
	resp, err := publish()
	require.NoError(t, err, "the bus must answer within the SDK's timeout")
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))

	_, err = conn.ExecContext(context.Background(), "ROLLBACK")
	require.NoError(t, err)
	require.NoError(t, conn.Close())
	require.Eventually(t, func() bool {
		resp, err := publish()
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusCreated
	}, 30*time.Second, 50*time.Millisecond)
}
