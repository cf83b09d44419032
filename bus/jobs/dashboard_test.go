package jobs_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDashboardJobsPageAndLiveFeed: the web dashboard shows the protocol's
// queues and dead letters, retries and cancels jobs, and its live feed
// carries the jobs' events.
func TestDashboardJobsPageAndLiveFeed(t *testing.T) {
	t.Parallel()
	b := startBus(t)
	tok, err := os.ReadFile(filepath.Join(b.p.DataDir, "admin.token"))
	require.NoError(t, err)
	bearer := "Bearer " + strings.TrimSpace(string(tok))
	call := func(method, path string) (int, map[string]any) {
		req, err := http.NewRequest(method, b.p.URL()+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", bearer)
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var m map[string]any
		require.NoError(t, json.NewDecoder(res.Body).Decode(&m))
		return res.StatusCode, m
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", b.p.URL()+"/observability/stream", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", bearer)
	stream, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer stream.Body.Close()
	require.Equal(t, http.StatusOK, stream.StatusCode)

	c := b.client(t, mainKey)
	ns := uniqueNS(t)
	id := c.publishOK(map[string]any{"goal": "dash", "payload": 1, "namespace": ns, "max_attempts": 1})
	cl := c.claim(ns)
	require.Equal(t, 200, c.do("POST", "/fail/"+id, nil, map[string]any{"claim_token": cl.str("claim_token"), "error": "x"}).status)

	// The live feed carries the job's events up to dead_letter.
	sc := bufio.NewScanner(stream.Body)
	var states []string
	for sc.Scan() && !containsStr(states, "dead_letter") {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct {
			Nonce, State string
		}
		require.NoError(t, json.Unmarshal([]byte(line), &ev))
		if ev.Nonce == "job:"+id {
			states = append(states, ev.State)
		}
	}
	require.Equal(t, []string{"received", "queued", "dispatched", "delivered", "dead_letter"}, states)

	st, page := call("GET", "/observability/jobs")
	require.Equal(t, 200, st)
	require.Equal(t, true, page["enabled"])
	var found bool
	for _, q := range page["queues"].([]any) {
		q := q.(map[string]any)
		if q["namespace"] == ns {
			found = true
			require.EqualValues(t, 1, q["dead"])
		}
	}
	require.True(t, found, "namespace %s missing from %v", ns, page["queues"])
	require.Contains(t, jsonString(t, page["dead"]), id)

	st, r := call("POST", "/observability/jobs/"+id+"/retry")
	require.Equal(t, 200, st, r)
	require.Equal(t, "open", r["status"])
	require.Equal(t, "open", c.do("GET", "/status/"+id, nil, nil).str("status"))
	st, r = call("POST", "/observability/jobs/"+id+"/retry")
	require.Equal(t, http.StatusConflict, st, r)
	st, r = call("POST", "/observability/jobs/"+id+"/cancel")
	require.Equal(t, 200, st, r)
	require.Equal(t, "dead", c.do("GET", "/status/"+id, nil, nil).str("status"))
	st, _ = call("POST", "/observability/jobs/"+strings.Repeat("0", 32)+"/cancel")
	require.Equal(t, http.StatusNotFound, st)
}

func containsStr(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func jsonString(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
