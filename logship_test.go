package beam

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// jobCall runs one request against a server's job bus with its admin key
// and returns the status and the decoded answer.
func jobCall(t *testing.T, s *Server, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		rd = bytes.NewReader(raw)
	} else {
		rd = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("X-API-KEY", s.intent.secret)
	req.Header.Set("Content-Type", "application/json")
	w := httptest.NewRecorder()
	s.JobBus().Handler().ServeHTTP(w, req)
	var out map[string]any
	_ = json.Unmarshal(w.Body.Bytes(), &out)
	return w.Code, out
}

// TestTakeoverServesFinishedJobs: a takeover of the job bus's home moves
// the home to the taker, so every job the dead home knew — the finished
// ones too, not only those it left open — is read through the taker's job
// bus afterwards: a job fulfilled before the home died answers its status
// and result there, and one still open is claimable once.
func TestTakeoverServesFinishedJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dead := startLive(t, Config{OpenOrgs: true, JobBus: JobBus{Enabled: true}})
	code, out := jobCall(t, dead.srv, http.MethodPost, "/intent", map[string]any{"goal": "done", "payload": map[string]any{"n": 1}})
	require.Equal(t, http.StatusCreated, code, out)
	done := out["id"].(string)
	code, out = jobCall(t, dead.srv, http.MethodPost, "/claim?goal=done", map[string]any{})
	require.Equal(t, http.StatusOK, code, out)
	code, out = jobCall(t, dead.srv, http.MethodPost, "/fulfill/"+done, map[string]any{"claim_token": out["claim_token"], "result": "r"})
	require.Equal(t, http.StatusOK, code, out)
	code, out = jobCall(t, dead.srv, http.MethodPost, "/intent", map[string]any{"goal": "open", "visibility": "public", "payload": map[string]any{"n": 2}})
	require.Equal(t, http.StatusCreated, code, out)
	open := out["id"].(string)

	var batches [][]byte
	require.NoError(t, dead.srv.Log().Unshipped(ctx, 0, func(b []byte, _ int64) error {
		batches = append(batches, bytes.Clone(b))
		return nil
	}))
	taker := startLive(t, Config{OpenOrgs: true, JobBus: JobBus{Enabled: true}})
	sl := newShippedLog(taker.srv)
	close(sl.ready)
	deadLog := dead.srv.Log().ID()
	for i, b := range batches {
		require.NoError(t, sl.Import(ctx, deadLog, "node-dead", uint64(i+1), b))
	}
	adopted, err := sl.Adopt(ctx, deadLog, "node-dead")
	require.NoError(t, err)
	require.Equal(t, 2, adopted[string(tracing.OwnerJobs)], adopted)

	code, out = jobCall(t, taker.srv, http.MethodGet, "/status/"+done, nil)
	require.Equal(t, http.StatusOK, code, "a job fulfilled before the takeover is read through the taker: %v", out)
	require.Equal(t, tracing.JobFulfilled, out["status"])
	code, out = jobCall(t, taker.srv, http.MethodGet, "/result/"+done, nil)
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, "r", out["result"])
	code, out = jobCall(t, taker.srv, http.MethodPost, "/claim?goal=open", map[string]any{})
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, open, out["id"])
	code, out = jobCall(t, taker.srv, http.MethodPost, "/claim?goal=done", map[string]any{})
	require.NotEqual(t, http.StatusOK, code, "the finished job is not claimable again: %v", out)
}
