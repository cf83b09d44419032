package jobs

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// shipRecorder is a tracing.Replicator that keeps the batches.
type shipRecorder struct {
	mu      sync.Mutex
	batches [][]byte
}

func (r *shipRecorder) Replicate(_ context.Context, batch []byte, _ int64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, append([]byte(nil), batch...))
	return nil
}

func openJobs(t *testing.T, rep tracing.Replicator) *handlerBundle {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(t.TempDir(), "beam.db"),
		Synchronous: "NORMAL", Replicator: rep})
	require.NoError(t, err)
	svc, err := Open(context.Background(), Config{Log: lg, Secret: "main", AdminSecret: "adm", ReapInterval: time.Hour,
		CleanupInterval: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = svc.Close()
		_ = lg.Close()
	})
	return &handlerBundle{svc: svc, log: lg, h: svc.Handler()}
}

// sideTables reads the job bus's tables and beam_jobs (without seqs).
func sideTables(t *testing.T, lg *tracing.Log) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	for _, tbl := range []string{"intent_bus_keys", "intent_bus_kv", "intent_bus_idempotency", "intent_bus_tombstones",
		"intent_bus_nonces", "beam_jobs"} {
		out[tbl] = beamtest.Rows(t, lg.ReadDB(), `SELECT * FROM `+tbl+` ORDER BY 1, 2`, "last_seq", "first_seq")
	}
	return out
}

// TestSideTablesTravelAsOps: the job bus's tester keys, KV values,
// idempotency keys, used nonces and tombstones reach the replicator as
// ops; a log importing the batches has the same tables and jobs, and
// after Reload its service accepts the tester key and serves the values.
func TestSideTablesTravelAsOps(t *testing.T) {
	t.Parallel()
	rec := &shipRecorder{}
	src := openJobs(t, rec)
	w := src.serve("POST", "/admin/generate_key", []byte(`{"owner":"tester"}`), map[string]string{"X-Admin-Token": "adm"})
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	var gen struct {
		Key string `json:"api_key"`
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &gen))
	key := map[string]string{"X-API-KEY": gen.Key}

	w = src.serve("POST", "/set/color", []byte(`{"value":"blue"}`), key)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	w = src.serve("POST", "/intent", []byte(`{"goal":"g","payload":1,"namespace":"ns"}`),
		map[string]string{"X-API-KEY": gen.Key, "Idempotency-Key": "once"})
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	w = src.serve("POST", "/intent", []byte(`{"goal":"g2","payload":2,"namespace":"gone"}`), key)
	require.Equal(t, http.StatusCreated, w.Code, w.Body.String())
	w = src.serve("POST", "/admin/purge", []byte(`{"confirm":true,"namespace":"gone"}`), map[string]string{"X-Admin-Token": "adm"})
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	// A signed read stores its nonce by an op of its own.
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	w = src.serve("GET", "/get/color", nil, map[string]string{"X-API-KEY": "main", "X-Timestamp": ts, "X-Nonce": "n-1",
		"X-Signature": Sign("main", "GET\n/get/color\n"+ts+"\nn-1\n")})
	require.Equal(t, http.StatusNotFound, w.Code, "the main key has its own scope: %s", w.Body.String())

	want := sideTables(t, src.log)
	for _, tbl := range []string{"intent_bus_keys", "intent_bus_kv", "intent_bus_idempotency", "intent_bus_tombstones", "intent_bus_nonces"} {
		require.NotEmpty(t, want[tbl], tbl)
	}

	dst := openJobs(t, nil)
	rec.mu.Lock()
	batches := rec.batches
	rec.mu.Unlock()
	for i, b := range batches {
		_, err := dst.log.Import(context.Background(), tracing.ImportSource{Log: src.log.ID(), Node: "n1", StreamSeq: uint64(i + 1)}, b)
		require.NoError(t, err)
	}
	got := sideTables(t, dst.log)
	require.Equal(t, want["intent_bus_keys"], got["intent_bus_keys"])
	require.Equal(t, want["intent_bus_kv"], got["intent_bus_kv"])
	require.Equal(t, want["intent_bus_idempotency"], got["intent_bus_idempotency"])
	require.Equal(t, want["intent_bus_tombstones"], got["intent_bus_tombstones"])
	require.Equal(t, want["intent_bus_nonces"], got["intent_bus_nonces"])
	require.Equal(t, want["beam_jobs"], got["beam_jobs"])

	require.Equal(t, http.StatusUnauthorized, dst.serve("GET", "/get/color", nil, key).Code, "not read yet")
	require.NoError(t, dst.svc.Reload(context.Background()))
	w = dst.serve("GET", "/get/color", nil, key)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.JSONEq(t, `{"value":"blue"}`, w.Body.String())
}
