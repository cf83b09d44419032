package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

// busArgs are short bus schedules for process tests.
var busArgs = []string{
	"--open-orgs", // sender and workers share the org acme
	"--bus-api-key", "test-bus-key",
	"--bus-retry-schedule", "300ms,600ms",
	"--bus-max-attempts", "5",
	"--bus-delivery-timeout", "2s",
	"--bus-tick-interval", "50ms",
}

// sdkAgent registers a new agent through the Go SDK and returns its
// identity (with its API key) and a client for baseURL.
func sdkAgent(t *testing.T, ctx context.Context, baseURL, beamID string) (*agents.Identity, *agents.Client) {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	c := sdkClient(t, baseURL, id)
	res, err := c.Register(ctx, beamID, []string{"test"})
	require.NoError(t, err)
	id.APIKey = res.APIKey
	require.NotEmpty(t, id.APIKey)
	return id, c
}

func sdkClient(t *testing.T, baseURL string, id *agents.Identity) *agents.Client {
	t.Helper()
	c, err := agents.NewClient(agents.ClientConfig{
		DirectoryURL: baseURL, Identity: id, APIKey: id.APIKey,
		Logger:       beamtest.Logger(t),
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestBusOfflineRecipientGetsMessageOnConnect(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: busArgs})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, sender := sdkAgent(t, ctx, p.URL(), "sender@acme.beam.directory")
	rid, _ := sdkAgent(t, ctx, p.URL(), "worker@acme.beam.directory")

	rec, err := sender.SendDurable(ctx, rid.BeamID, "task.run", map[string]any{"job": 1}, nil)
	require.NoError(t, err)
	require.Equal(t, "queued", rec.Status, "the recipient is offline")

	got := make(chan *agents.Intent, 4)
	recipient := sdkClient(t, p.URL(), rid)
	recipient.Handle("task.run", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(map[string]any{"done": true})
	})
	require.NoError(t, recipient.Connect(ctx))
	select {
	case in := <-got:
		require.Equal(t, rec.Nonce, in.Nonce)
		require.NotNil(t, in.Durable)
		require.Equal(t, "signature", in.Durable.Auth)
	case <-ctx.Done():
		require.FailNow(t, "the queued message was not delivered after the recipient connected")
	}
	require.Eventually(t, func() bool {
		m, err := sender.DurableMessageStatus(ctx, rec.MessageID)
		return err == nil && m.Status == "acked"
	}, 30*time.Second, 20*time.Millisecond)

	// An unsigned (API-key) send is accepted by the SDK as a bus delivery.
	status, body := busCall(t, ctx, http.MethodPost, p.URL()+"/v1/beam/send", "test-bus-key",
		fmt.Sprintf(`{"from":"sender@acme.beam.directory","to":%q,"intent":"task.run"}`, rid.BeamID))
	require.Equal(t, http.StatusCreated, status, body)
	select {
	case in := <-got:
		require.Equal(t, "bus_key", in.Durable.Auth)
	case <-ctx.Done():
		require.FailNow(t, "the bus-key message was not delivered")
	}
	p.Stop()
	lg := openLog(t, p.DataDir)
	requireProjectionsEqualRebuild(t, lg)
}

func busCall(t *testing.T, ctx context.Context, method, u, bearer, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBusSIGKILLWhileDispatchedLosesNothing kills the process while the
// recipient holds its deliveries unanswered; after the restart every
// message is delivered again with its nonce and ends acked.
func TestBusSIGKILLWhileDispatchedLosesNothing(t *testing.T) {
	t.Parallel()
	const n = 12
	// A delivery timeout long enough that the held deliveries are still
	// outstanding when the process dies, even on a loaded machine.
	args := append(append([]string{}, busArgs...), "--bus-delivery-timeout", "10s")
	p := beamtest.Start(t, beamtest.Options{Args: args})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, sender := sdkAgent(t, ctx, p.URL(), "sender@acme.beam.directory")
	rid, _ := sdkAgent(t, ctx, p.URL(), "worker@acme.beam.directory")

	var mu sync.Mutex
	seen := map[string]int{}
	hold := make(chan struct{})
	handler := func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		seen[in.Nonce]++
		mu.Unlock()
		select {
		case <-hold:
		case <-ctx.Done():
		}
		return agents.Success(map[string]any{"nonce": in.Nonce})
	}
	recipient := sdkClient(t, p.URL(), rid)
	recipient.Handle("*", handler)
	require.NoError(t, recipient.Connect(ctx))

	nonces := make([]string, 0, n)
	for i := range n {
		rec, err := sender.SendDurable(ctx, rid.BeamID, "task.run", map[string]any{"i": i}, nil)
		require.NoError(t, err)
		nonces = append(nonces, rec.Nonce)
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}, 30*time.Second, 10*time.Millisecond, "every message reaches the held handler")
	p.Kill()
	_ = recipient.Close()
	_ = sender.Close()

	lg := openLog(t, p.DataDir)
	for _, nonce := range nonces {
		m, ok, err := lg.Message(context.Background(), nonce)
		require.NoError(t, err)
		require.True(t, ok)
		// Held by the recipient (or, on a very slow machine, already
		// rescheduled after a timed-out attempt): not finished either way.
		require.Contains(t, []tracing.State{tracing.Dispatched, tracing.Delivered, tracing.Queued}, m.Status)
	}
	require.NoError(t, lg.Close())

	p.Restart()
	close(hold)
	again := sdkClient(t, p.URL(), rid)
	again.Handle("*", handler)
	require.NoError(t, again.Connect(ctx))
	require.Eventually(t, func() bool {
		for _, nonce := range nonces {
			st, err := queryState(t, p.DataDir, nonce)
			if err != nil || (st != tracing.Acked && st != tracing.DeadLetter) {
				return false
			}
		}
		return true
	}, 60*time.Second, 100*time.Millisecond, "every message ends acked or dead_letter")
	p.Stop()

	lg = openLog(t, p.DataDir)
	mu.Lock()
	defer mu.Unlock()
	for _, nonce := range nonces {
		require.GreaterOrEqual(t, seen[nonce], 2, "nonce %s delivered before and after the kill", nonce)
		st, _, err := lg.State(context.Background(), nonce)
		require.NoError(t, err)
		require.Equal(t, tracing.Acked, st)
		trace, err := lg.Trace(context.Background(), nonce)
		require.NoError(t, err)
		attempts := map[int]bool{}
		for _, ev := range trace {
			if ev.State == tracing.Dispatched {
				attempts[ev.Attempt] = true
			}
		}
		require.GreaterOrEqual(t, len(attempts), 2, "the trace shows each attempt of %s", nonce)
	}
	requireProjectionsEqualRebuild(t, lg)
}
