package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// openBundle is a Service with cfg on a real log in a temporary directory.
func openBundle(t *testing.T, cfg Config) *handlerBundle {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"), Synchronous: "NORMAL"})
	require.NoError(t, err)
	cfg.Log, cfg.Secret, cfg.AdminSecret = lg, "main", "adm"
	svc, err := Open(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = svc.Close()
		_ = lg.Close()
	})
	return &handlerBundle{svc: svc, log: lg, h: svc.Handler()}
}

// call serves a request with the main key and decodes the answer.
func (b *handlerBundle) call(t *testing.T, method, target string, body any) (int, map[string]any) {
	t.Helper()
	var raw []byte
	if body != nil {
		var err error
		raw, err = json.Marshal(body)
		require.NoError(t, err)
	}
	w := b.serve(method, target, raw, map[string]string{"X-API-KEY": "main", "Content-Type": "application/json"})
	var out map[string]any
	if w.Body.Len() > 0 {
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out), w.Body.String())
	}
	return w.Code, out
}

func (b *handlerBundle) publish(t *testing.T, goal string) string {
	t.Helper()
	code, out := b.call(t, "POST", "/intent", map[string]any{"goal": goal, "payload": map[string]any{"goal": goal}, "backoff_base": 1})
	require.Equal(t, http.StatusCreated, code, out)
	return out["id"].(string)
}

func (b *handlerBundle) claim(t *testing.T, goal string) (code int, id, token string, attempts float64) {
	t.Helper()
	code, out := b.call(t, "POST", "/claim?goal="+goal, nil)
	if code != http.StatusOK {
		return code, "", "", 0
	}
	return code, out["id"].(string), out["claim_token"].(string), out["claim_attempts"].(float64)
}

// importJobs copies the events of jobs ids from the dead node's log into
// b's, each with details.takenOver, as a takeover's import does.
func (b *handlerBundle) importJobs(t *testing.T, dead *handlerBundle, ids ...string) {
	t.Helper()
	ctx := context.Background()
	for _, id := range ids {
		trace, err := dead.log.Trace(ctx, noncePrefix+id)
		require.NoError(t, err)
		require.NotEmpty(t, trace)
		for i, ev := range trace {
			ev.Seq = 0
			ev.Details.Extra = map[string]any{"takenOver": map[string]any{"log": "log-dead", "node": "node-dead", "seq": i + 1}}
			_, err := b.log.Append(ctx, ev)
			require.NoError(t, err)
		}
	}
}

// TestAdoptIndexesImportedJobsOnce: jobs of a dead node imported behind a
// running job bus are adopted once: an open one is claimable, a claimed
// one keeps its lease and its worker fulfils it with the token the dead
// node handed out, an abandoned claim is requeued when its lease ends and
// claimed again; the service's own job is untouched, and neither a second
// Adopt nor any claim sees a job twice. Each adopted trace has one
// takeover marker.
func TestAdoptIndexesImportedJobsOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dead := openBundle(t, Config{ClaimTimeout: time.Second, ReapInterval: time.Hour})
	open := dead.publish(t, "open")
	kept := dead.publish(t, "kept")
	lost := dead.publish(t, "lost")
	_, id, keptToken, _ := dead.claim(t, "kept")
	require.Equal(t, kept, id)
	code, out := dead.call(t, "POST", "/extend_claim/"+kept, map[string]any{"claim_token": keptToken, "seconds": 60})
	require.Equal(t, http.StatusOK, code, out)
	_, id, lostToken, _ := dead.claim(t, "lost")
	require.Equal(t, lost, id)

	taker := openBundle(t, Config{ReapInterval: 20 * time.Millisecond})
	own := taker.publish(t, "own")
	ownTrace, err := taker.log.Trace(ctx, noncePrefix+own)
	require.NoError(t, err)
	taker.importJobs(t, dead, open, kept, lost)
	code, _, _, _ = taker.claim(t, "open")
	require.NotEqual(t, http.StatusOK, code, "an imported job is not claimable before it is adopted")

	n, err := taker.svc.Adopt(ctx, []string{own, noncePrefix + open, kept, lost})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	n, err = taker.svc.Adopt(ctx, []string{own, open, kept, lost})
	require.NoError(t, err)
	require.Zero(t, n, "a second Adopt adopts nothing")
	trace, err := taker.log.Trace(ctx, noncePrefix+own)
	require.NoError(t, err)
	require.Equal(t, ownTrace, trace, "the service's own job is untouched")
	for _, id := range []string{open, kept, lost} {
		trace, err := taker.log.Trace(ctx, noncePrefix+id)
		require.NoError(t, err)
		var markers []tracing.Event
		for _, ev := range trace {
			if ev.Transport == tracing.TransportTakeover {
				markers = append(markers, ev)
			}
		}
		require.Len(t, markers, 1, id)
		require.Equal(t, opTakeover, markers[0].Details.Job.Op)
		require.Equal(t, map[string]any{"log": "log-dead", "node": "node-dead"}, markers[0].Details.Extra["adoptedFrom"])
	}

	code, out = taker.call(t, "POST", "/fulfill/"+kept, map[string]any{"claim_token": keptToken, "result": "done"})
	require.Equal(t, http.StatusOK, code, "the worker fulfils with the token the dead node handed out: %v", out)
	code, out = taker.call(t, "GET", "/status/"+kept, nil)
	require.Equal(t, http.StatusOK, code, out)
	require.Equal(t, tracing.JobFulfilled, out["status"])

	for _, goal := range []string{"own", "open"} {
		code, id, _, _ := taker.claim(t, goal)
		require.Equal(t, http.StatusOK, code, goal)
		require.Equal(t, map[string]string{"own": own, "open": open}[goal], id)
	}
	require.Eventually(t, func() bool {
		_, out := taker.call(t, "GET", "/status/"+lost, nil)
		return out["status"] == tracing.JobOpen
	}, 10*time.Second, 20*time.Millisecond, "the reaper requeues the abandoned claim when its lease ends")
	var attempts float64
	require.Eventually(t, func() bool {
		code, id, _, attempts = taker.claim(t, "lost")
		return code == http.StatusOK && id == lost
	}, 15*time.Second, 50*time.Millisecond, "the requeued job is claimable after its backoff")
	require.EqualValues(t, 2, attempts)
	code, out = taker.call(t, "POST", "/fulfill/"+lost, map[string]any{"claim_token": lostToken, "result": "late"})
	require.Equal(t, http.StatusNotFound, code, "the expired claim's token no longer works: %v", out)
	for _, goal := range []string{"own", "open", "kept", "lost"} {
		code, _, _, _ := taker.claim(t, goal)
		require.NotEqual(t, http.StatusOK, code, fmt.Sprintf("%s is claimed once", goal))
	}
	n, err = taker.svc.Adopt(ctx, []string{own, open, kept, lost})
	require.NoError(t, err)
	require.Zero(t, n)
}
