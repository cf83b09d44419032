package beam

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
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

// registerAs registers the agent of identity id as name on l and returns
// its client (closed when the test ends) and API key.
func registerAs(t *testing.T, l *liveServer, id *agents.Identity, name string) (*agents.Client, string) {
	t.Helper()
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: l.url, Identity: id, Logger: quietLogger(),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	res, err := c.Register(context.Background(), name, []string{"test"})
	require.NoError(t, err)
	return c, res.APIKey
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

// TestTakeoverLeavesImportedEnvelopesToAdopt: while a takeover imports a
// lost node's log, an envelope the import brought in queued and due is
// the takeover's: the taker's engine, which starts the due hops it finds
// in its log, does not dispatch it on its own (the rest of the import may
// show the hop done, and the envelope would finish twice). Once adopted it
// runs its hop once and finishes once.
func TestTakeoverLeavesImportedEnvelopesToAdopt(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	ctx := context.Background()
	creatorID, err := agents.GenerateIdentity("creator@" + domain)
	require.NoError(t, err)
	actorID, err := agents.GenerateIdentity("actor@" + domain)
	require.NoError(t, err)
	// The lost node: an envelope waiting for its actor, which is offline.
	dead := startLive(t, Config{OpenOrgs: true})
	_, creatorKey := registerAs(t, dead, creatorID, "creator")
	registerAs(t, dead, actorID, "actor")
	raw, err := json.Marshal(map[string]any{"route": []string{"actor@" + domain}, "payload": map[string]any{}})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, dead.url+"/api/v1/mesh", bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", creatorKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var created map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&created))
	_ = resp.Body.Close()
	require.Equal(t, http.StatusCreated, resp.StatusCode, created)
	id := created["id"].(string)
	require.Eventually(t, func() bool {
		row, _, err := dead.srv.Log().MeshEnvelope(ctx, id)
		require.NoError(t, err)
		return row.State == tracing.Queued && row.Actor != ""
	}, 10*time.Second, 10*time.Millisecond, "the envelope waits for its actor")
	var batches [][]byte
	require.NoError(t, dead.srv.Log().Unshipped(ctx, 0, func(b []byte, _ int64) error {
		batches = append(batches, bytes.Clone(b))
		return nil
	}))

	// The taker, where the actor is connected.
	taker := startLive(t, Config{OpenOrgs: true})
	registerAs(t, taker, creatorID, "creator")
	actor, _ := registerAs(t, taker, actorID, "actor")
	var hops atomic.Int32
	actor.HandleMesh(func(context.Context, *agents.MeshHop) (any, error) {
		hops.Add(1)
		return map[string]any{"done": true}, nil
	})
	require.NoError(t, actor.Connect(ctx))
	sl := newShippedLog(taker.srv)
	close(sl.ready)
	deadLog := dead.srv.Log().ID()
	for i, b := range batches {
		require.NoError(t, sl.Import(ctx, deadLog, "node-dead", uint64(i+1), b))
	}
	lg := taker.srv.Log()
	row, ok, err := lg.MeshEnvelope(ctx, id)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Queued, row.State)
	require.Never(t, func() bool { return hops.Load() > 0 }, time.Second, 20*time.Millisecond,
		"the taker's engine leaves an imported envelope to the takeover until it is adopted")

	adopted, err := sl.Adopt(ctx, deadLog, "node-dead")
	require.NoError(t, err)
	require.Equal(t, 1, adopted[string(tracing.OwnerMesh)], adopted)
	require.Eventually(t, func() bool {
		row, _, err := lg.MeshEnvelope(ctx, id)
		require.NoError(t, err)
		return row.Status == tracing.MeshSucceeded
	}, 20*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, hops.Load(), "the hop ran once")
	trace, err := lg.Trace(ctx, row.Nonce)
	require.NoError(t, err)
	ends := 0
	for _, ev := range trace {
		var st tracing.MeshStep
		if len(ev.Details.Mesh) > 0 && json.Unmarshal(ev.Details.Mesh, &st) == nil && st.Status.Terminal() {
			ends++
		}
	}
	require.Equal(t, 1, ends, "the envelope finished once")
}
