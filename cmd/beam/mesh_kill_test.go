package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// TestMeshSIGKILLUnderLoad kills beam serve while envelopes are in flight
// through a three-hop route; after the restart every envelope ends in x-sink
// exactly once, succeeded, with a legal trace and the full payload.
func TestMeshSIGKILLUnderLoad(t *testing.T) {
	t.Parallel()
	n := 60
	if testing.Short() {
		n = 20
	}
	// The creator and the actors are members of one org (each hop obeys
	// its actor's policy).
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--mesh-hop-timeout", "5s", "--open-orgs"}})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	creator, _ := sdkAgent(t, ctx, p.URL(), id("client"))

	var delivered atomic.Int64
	hold := make(chan struct{})
	var holdOnce sync.Once
	handler := func(step string) agents.MeshHandler {
		return func(ctx context.Context, h *agents.MeshHop) (any, error) {
			if delivered.Add(1) > int64(n) {
				// Past the first wave, hold every hop so the kill finds
				// envelopes dispatched and delivered.
				select {
				case <-hold:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return enrichPayload(h, func(m map[string]any) { m[step] = true })
		}
	}
	steps := []string{"one", "two", "three"}
	idents := map[string]*agents.Identity{}
	connect := func() []*agents.Client {
		var cs []*agents.Client
		for _, st := range steps {
			ident := idents[st]
			if ident == nil {
				ident, _ = sdkAgent(t, ctx, p.URL(), id(st))
				idents[st] = ident
			}
			c := sdkClient(t, p.URL(), ident)
			c.HandleMesh(handler(st))
			require.NoError(t, c.Connect(ctx))
			cs = append(cs, c)
		}
		return cs
	}
	clients := connect()

	route := []string{id("one"), id("two"), id("three")}
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"route": route, "payload": map[string]any{"i": i}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, p.URL()+"/api/v1/mesh", strings.NewReader(string(body)))
			req.Header.Set("X-Api-Key", creator.APIKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			var out struct {
				ID string `json:"id"`
			}
			if resp.StatusCode == http.StatusCreated && json.NewDecoder(resp.Body).Decode(&out) == nil {
				ids[i] = out.ID
			}
		}()
	}
	wg.Wait()
	for i, envID := range ids {
		require.NotEmpty(t, envID, "envelope %d acknowledged", i)
	}
	require.Eventually(t, func() bool { return delivered.Load() > int64(n)+5 }, 60*time.Second, 10*time.Millisecond,
		"hops are being held in flight")
	p.Kill()
	for _, c := range clients {
		_ = c.Close()
	}

	p.Restart()
	holdOnce.Do(func() { close(hold) })
	connect()
	lg := func() *tracing.Log { return openLog(t, p.DataDir) }
	assert.Eventually(t, func() bool {
		for _, envID := range ids {
			st, err := queryState(t, p.DataDir, "mesh:"+envID)
			if err != nil || (st != tracing.Acked && st != tracing.DeadLetter && st != tracing.Failed) {
				return false
			}
		}
		return true
	}, 90*time.Second, 200*time.Millisecond, "every envelope finishes after the restart")
	if t.Failed() {
		l := lg()
		rows, _ := l.MeshRows(context.Background())
		for _, r := range rows {
			if !r.Status.Terminal() {
				t.Logf("open: %s state=%s status=%s attempt=%d next=%d actor=%s reason=%s", r.ID, r.State, r.Status, r.Attempt, r.NextAt, r.Actor, r.Reason)
			}
		}
		_ = l.Close()
		t.FailNow()
	}
	p.Stop()

	l := lg()
	defer l.Close()
	for i, envID := range ids {
		row, ok, err := l.MeshEnvelope(context.Background(), envID)
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, tracing.MeshSucceeded, row.Status, "envelope %d: %s", i, row.Error)
		require.True(t, row.Sink)
		var env struct {
			Payload map[string]any `json:"payload"`
		}
		require.NoError(t, json.Unmarshal(row.Envelope, &env))
		require.Equal(t, map[string]any{"i": float64(i), "one": true, "two": true, "three": true}, env.Payload)
		trace, err := l.Trace(context.Background(), "mesh:"+envID)
		require.NoError(t, err)
		var cur tracing.State
		sinks := 0
		for _, ev := range trace {
			require.True(t, tracing.CanTransition(cur, ev.State), "legal %s -> %s", cur, ev.State)
			cur = ev.State
			if ev.State == tracing.Acked {
				sinks++
			}
		}
		require.Equal(t, 1, sinks, "envelope %d reaches x-sink exactly once", i)
	}
	requireProjectionsEqualRebuild(t, l)
	fmt.Fprintln(testWriter{t}, "envelopes:", n, "hops delivered:", delivered.Load())
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
