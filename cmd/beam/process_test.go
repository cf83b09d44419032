package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/internal/dirlock"
	"github.com/beamdir/beam/tracing"
)

func TestServeHealthAndMetrics(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})

	resp, err := http.Get(p.URL() + "/health")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var h struct {
		Status        string `json:"status"`
		Protocol      string `json:"protocol"`
		Version       string `json:"version"`
		UptimeSeconds *int64 `json:"uptimeSeconds"`
		DB            struct {
			Status string `json:"status"`
		} `json:"db"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&h))
	require.Equal(t, "ok", h.Status)
	require.Equal(t, "beam/1", h.Protocol)
	require.NotEmpty(t, h.Version)
	require.NotNil(t, h.UptimeSeconds)
	require.Equal(t, "ok", h.DB.Status)

	// Traffic moves the log metrics.
	a := registerAgent(t, p.URL(), "metrics@acme.beam.directory")
	status, body, err := postIntent(context.Background(), p.URL(), a.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"message": "hi"}))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))

	// Metrics are operator-only: they name peers, outbox states and codes.
	anon, err := http.Get(p.URL() + "/metrics")
	require.NoError(t, err)
	anon.Body.Close()
	require.Equal(t, http.StatusUnauthorized, anon.StatusCode)
	tok, err := os.ReadFile(filepath.Join(p.DataDir, "admin.token"))
	require.NoError(t, err)
	mreq, err := http.NewRequest(http.MethodGet, p.URL()+"/metrics", nil)
	require.NoError(t, err)
	mreq.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	mresp, err := http.DefaultClient.Do(mreq)
	require.NoError(t, err)
	defer mresp.Body.Close()
	require.Equal(t, http.StatusOK, mresp.StatusCode)
	mb, err := io.ReadAll(mresp.Body)
	require.NoError(t, err)
	metrics := string(mb)
	for _, name := range []string{"beam_log_events_appended_total", "beam_log_append_seconds_bucket", "beam_log_batch_events_bucket", `beam_intents{state="acked"} 1`} {
		require.Contains(t, metrics, name)
	}
	require.NotContains(t, metrics, "beam_log_events_appended_total 0\n")
}

func TestGracefulShutdownExitsCleanly(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	a := registerAgent(t, p.URL(), "graceful@acme.beam.directory")
	frame := a.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"message": "before stop"})
	status, body, err := postIntent(context.Background(), p.URL(), frame)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))
	p.Stop()
	require.Contains(t, p.Output(), "stopped")

	var f struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal(frame, &f))
	lg := openLog(t, p.DataDir)
	row, ok, err := lg.Intent(context.Background(), f.Nonce)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Acked, row.Status)
}

// TestSIGKILLDuringBurstLosesNothing drives a burst of echo intents through
// a real process and SIGKILLs it mid-burst: every intent whose HTTP response
// arrived (its events were committed before the response was written) must
// be acked after the restart, and the projections must equal a rebuild.
func TestSIGKILLDuringBurstLosesNothing(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	a := registerAgent(t, p.URL(), "burst@acme.beam.directory")

	var (
		mu     sync.Mutex
		acked  = map[string][]byte{}
		killed atomic.Bool
		wg     sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const senders = 8
	const killAfter = 120
	reached := make(chan struct{})
	var reachedOnce sync.Once
	for i := 0; i < senders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && !killed.Load() {
				frame := a.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"message": "burst"})
				status, body, err := postIntent(ctx, p.URL(), frame)
				if err != nil || status != http.StatusOK {
					continue // the process is gone or going: nothing was promised
				}
				var res wire.ResultFrame
				if json.Unmarshal(body, &res) != nil || !res.Success {
					continue
				}
				mu.Lock()
				acked[res.Nonce] = frame
				n := len(acked)
				mu.Unlock()
				if n >= killAfter {
					reachedOnce.Do(func() { close(reached) })
				}
			}
		}()
	}
	select {
	case <-reached:
	case <-time.After(2 * time.Minute):
		t.Fatal("the burst did not reach its kill point")
	}
	p.Kill() // mid-burst: senders are still sending
	killed.Store(true)
	cancel()
	wg.Wait()

	p.Restart()
	// A replay of an acknowledged nonce returns the cached result, served
	// by the restarted process from the log.
	mu.Lock()
	var sample []byte
	for _, f := range acked {
		sample = f
		break
	}
	mu.Unlock()
	status, body, err := postIntent(context.Background(), p.URL(), sample)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))
	p.Stop()

	lg := openLog(t, p.DataDir)
	for nonce := range acked {
		row, ok, err := lg.Intent(context.Background(), nonce)
		require.NoError(t, err)
		require.True(t, ok, "nonce %s acknowledged to the client is missing after SIGKILL", nonce)
		require.Equal(t, tracing.Acked, row.Status, "nonce %s", nonce)
	}
	requireProjectionsEqualRebuild(t, lg)
}

// TestRestartDeliveredIntentCompletesAfterRestart is the recovery scenario
// of the restart-recovery specification: a recipient holds an intent when
// the directory dies, returns its result after the restart, and the sender's
// nonce ends acked; a replay of that nonce returns the cached result without
// a second delivery.
func TestRestartDeliveredIntentCompletesAfterRestart(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--http-timeout", "2m", "--open-orgs"}})
	sender := registerAgent(t, p.URL(), "sender@acme.beam.directory")
	recipient := registerAgent(t, p.URL(), "recipient@acme.beam.directory")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	conn := recipient.connect(t, ctx, p.URL())

	frame := sender.frame(t, recipient.id, "task.delegate", map[string]any{"task": "survive a restart"})
	var f struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal(frame, &f))

	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		_, _, _ = postIntent(ctx, p.URL(), frame) // cut off by the kill
	}()
	msg := readWS(t, ctx, conn)
	require.Equal(t, "intent", msg.Type)
	var delivered struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal(msg.Frame, &delivered))
	require.Equal(t, f.Nonce, delivered.Nonce)

	// The intent is delivered and unanswered when the directory dies.
	require.Eventually(t, func() bool {
		st, _ := queryState(t, p.DataDir, f.Nonce)
		return st == tracing.Delivered
	}, 30*time.Second, 20*time.Millisecond)
	p.Kill()
	<-sendDone
	conn.CloseNow()

	p.Restart()
	conn = recipient.connect(t, ctx, p.URL())
	defer conn.CloseNow()
	recipient.respond(t, ctx, conn, f.Nonce, map[string]any{"done": true})

	// The late result reconciles the same nonce; the replay returns it.
	var body []byte
	require.Eventually(t, func() bool {
		var status int
		var err error
		status, body, err = postIntent(ctx, p.URL(), frame)
		return err == nil && status == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	var res wire.ResultFrame
	require.NoError(t, json.Unmarshal(body, &res))
	require.True(t, res.Success)
	require.JSONEq(t, `{"done":true}`, string(res.Payload))
	p.Stop()

	lg := openLog(t, p.DataDir)
	trace, err := lg.Trace(context.Background(), f.Nonce)
	require.NoError(t, err)
	var states []string
	for _, ev := range trace {
		states = append(states, string(ev.State))
	}
	require.Equal(t, "acked", states[len(states)-1], "trace %v", states)
	require.Equal(t, 1, strings.Count(strings.Join(states, ","), "delivered"), "exactly one delivery: %v", states)
	requireProjectionsEqualRebuild(t, lg)
}

func TestOfflineCommands(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	a := registerAgent(t, p.URL(), "cli@acme.beam.directory")
	frame := a.frame(t, "echo@beam.directory", "conversation.message", map[string]any{"message": "trace me"})
	status, body, err := postIntent(context.Background(), p.URL(), frame)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))
	var f struct {
		Nonce string `json:"nonce"`
	}
	require.NoError(t, json.Unmarshal(frame, &f))
	p.Stop()

	ctx := context.Background()
	out, err := beamtest.Run(t, ctx, "trace", "--data-dir", p.DataDir, f.Nonce)
	require.NoError(t, err, out)
	idx := -1
	for _, st := range []string{"received", "validated", "dispatched", "delivered", "acked"} {
		next := strings.Index(out[idx+1:], st)
		require.GreaterOrEqual(t, next, 0, "state %s missing or out of order in:\n%s", st, out)
		idx += 1 + next
	}

	out, err = beamtest.Run(t, ctx, "replay", "--data-dir", p.DataDir)
	require.NoError(t, err, out)
	require.Regexp(t, `replayed \d+ events into 1 intents and 0 bus messages`, out)

	out, err = beamtest.Run(t, ctx, "trace", "--data-dir", p.DataDir, "no-such-nonce")
	require.Error(t, err)
	require.Contains(t, out, "no events")

	out, err = beamtest.Run(t, ctx, "version")
	require.NoError(t, err, out)
	require.Contains(t, out, "beam ")
}

// openLog opens the log of a data directory whose server is not running
// (its lock is checked), for reading and writing: opening folds the events
// its projection rows lack.
func openLog(t *testing.T, dataDir string) *tracing.Log {
	t.Helper()
	lock, err := dirlock.Acquire(dataDir)
	require.NoError(t, err, "the log of a running server is read with readEvents")
	require.NoError(t, lock.Release())
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(dataDir, "beam.db"), Logger: beamtest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = lg.Close() })
	return lg
}

// eventStep is one event of a nonce as the events table holds it.
type eventStep struct {
	State     tracing.State `db:"state"`
	Transport string        `db:"transport"`
}

// readEvents returns the events of nonce, in order, from the log of a data
// directory whose server may be running. It reads the events table through
// a read-only connection: a running server writes its projection rows
// behind its events, so they may lag, and opening its log for writing
// would fold its pending rows into them behind its back (its own insert of
// those rows then fails, and every commit after it).
func readEvents(dataDir, nonce string) ([]eventStep, error) {
	lg, err := tracing.OpenReadOnly(context.Background(), filepath.Join(dataDir, "beam.db"))
	if err != nil {
		return nil, err
	}
	defer lg.Close()
	var steps []eventStep
	err = lg.ReadDB().SelectContext(context.Background(), &steps,
		`SELECT state, transport FROM intent_trace_events WHERE nonce = ? ORDER BY seq`, nonce)
	return steps, err
}

// queryState reads a nonce's state (its last event's) from the data
// directory of a process, running or not, without writing to it.
func queryState(t *testing.T, dataDir, nonce string) (tracing.State, error) {
	t.Helper()
	steps, err := readEvents(dataDir, nonce)
	if err != nil || len(steps) == 0 {
		return "", errors.Join(err, errors.New("no state"))
	}
	return steps[len(steps)-1].State, nil
}

// requireProjectionsEqualRebuild snapshots the projections, rebuilds them
// from the log and requires the two to be equal row for row.
func requireProjectionsEqualRebuild(t *testing.T, lg *tracing.Log) {
	t.Helper()
	ctx := context.Background()
	before := snapshotProjections(t, lg)
	_, err := lg.Rebuild(ctx)
	require.NoError(t, err)
	after := snapshotProjections(t, lg)
	require.Equal(t, before, after)
	require.NotEmpty(t, before["intent_log"])
}

func snapshotProjections(t *testing.T, lg *tracing.Log) map[string]map[string]string {
	t.Helper()
	snap, err := lg.Snapshot(context.Background())
	require.NoError(t, err)
	return snap
}
