package web

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// appendFlows appends n complete intents (5 events each, one Append per
// intent) and reports the first error.
func appendFlows(ctx context.Context, lg *tracing.Log, prefix string, n int) error {
	for i := 0; i < n; i++ {
		nonce := fmt.Sprintf("%s-%d", prefix, i)
		_, err := lg.Append(ctx,
			tracing.Event{Nonce: nonce, State: tracing.Received, From: alice, To: bob, IntentType: "task.run", Transport: "ws"},
			tracing.Event{Nonce: nonce, State: tracing.Validated},
			tracing.Event{Nonce: nonce, State: tracing.Dispatched, Transport: "ws"},
			tracing.Event{Nonce: nonce, State: tracing.Delivered},
			tracing.Event{Nonce: nonce, State: tracing.Acked, Details: tracing.Details{LatencyMs: msPtr(3)}})
		if err != nil {
			return err
		}
	}
	return nil
}

func decodeStream(t *testing.T, ev sseEvent) streamEvent {
	t.Helper()
	require.Equal(t, "intent", ev.event)
	var se streamEvent
	require.NoError(t, json.Unmarshal(ev.data, &se), string(ev.data))
	require.Equal(t, ev.id, se.Seq)
	return se
}

func TestStreamReconnectContinuesExactly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	require.NoError(t, appendFlows(ctx, b.log, "before", 4)) // seq 1..20

	// First connection replays from the start; read part of it and leave.
	c1 := b.openSSE(0, "")
	var last int64
	for i := 0; i < 13; i++ {
		ev, ok := c1.next(t, 10*time.Second)
		require.True(t, ok)
		se := decodeStream(t, ev)
		require.Equal(t, last+1, se.Seq, "in order, no gap")
		require.NotNil(t, se.Intent, "each event carries its intent's summary")
		require.Equal(t, se.Nonce, se.Intent.Nonce)
		require.Equal(t, alice, se.Intent.From)
		last = se.Seq
	}
	c1.close()

	// Appends continue while the client is away and after it is back.
	const more = 30
	errc := make(chan error, 1)
	go func() { errc <- appendFlows(ctx, b.log, "during", more) }()

	c2 := b.openSSE(last, "")
	want := int64(20 + more*5)
	for last < want {
		ev, ok := c2.next(t, 10*time.Second)
		require.True(t, ok, "stream ended at %d", last)
		se := decodeStream(t, ev)
		require.Equal(t, last+1, se.Seq, "no gap and no duplicate after resuming")
		last = se.Seq
	}
	require.NoError(t, <-errc)
	require.Equal(t, b.log.LastSeq(), last)
}

func TestStreamStartsAtTheEndByDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	require.NoError(t, appendFlows(ctx, b.log, "old", 2))
	c := b.openSSE(-1, "")
	require.NoError(t, appendFlows(ctx, b.log, "new", 1))
	ev, ok := c.next(t, 10*time.Second)
	require.True(t, ok)
	se := decodeStream(t, ev)
	require.EqualValues(t, 11, se.Seq)
	require.Equal(t, "new-0", se.Nonce)
	require.Equal(t, tracing.Received, se.State)
	require.Equal(t, tracing.BucketInFlight, se.Bucket)
	// The summary is the intent's current row (the whole flow committed at once).
	require.Equal(t, tracing.Acked, se.Intent.Status)

	// ?after= starts an EventSource that has no Last-Event-ID yet.
	c2 := b.openSSE(-1, "?after=9")
	ev, ok = c2.next(t, 10*time.Second)
	require.True(t, ok)
	require.EqualValues(t, 10, ev.id)
	// Last-Event-ID wins over ?after= (the browser's reconnect).
	c3 := b.openSSE(12, "?after=2")
	ev, ok = c3.next(t, 10*time.Second)
	require.True(t, ok)
	require.EqualValues(t, 13, ev.id)
}

func TestStreamLagEndsTheResponseAndResumes(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.streamBuffer = 8 })
	ctx := t.Context()
	c := b.openSSE(-1, "")
	// One commit bigger than the stream's buffer makes it lag.
	evs := make([]tracing.Event, 0, 50)
	for i := 0; i < 10; i++ {
		nonce := fmt.Sprintf("burst-%d", i)
		evs = append(evs,
			tracing.Event{Nonce: nonce, State: tracing.Received, From: alice, To: bob, IntentType: "t"},
			tracing.Event{Nonce: nonce, State: tracing.Validated},
			tracing.Event{Nonce: nonce, State: tracing.Dispatched},
			tracing.Event{Nonce: nonce, State: tracing.Delivered},
			tracing.Event{Nonce: nonce, State: tracing.Acked})
	}
	_, err := b.log.Append(ctx, evs...)
	require.NoError(t, err)
	var last int64
	for {
		ev, ok := c.next(t, 10*time.Second)
		if !ok {
			break // the server ended the stream
		}
		require.Equal(t, last+1, ev.id)
		last = ev.id
	}
	require.NoError(t, <-c.done)
	require.Less(t, last, int64(50), "the stream ended before the burst was through")

	// The browser reconnects with Last-Event-ID and gets exactly the rest.
	c2 := b.openSSE(last, "")
	for last < 50 {
		ev, ok := c2.next(t, 10*time.Second)
		require.True(t, ok)
		require.Equal(t, last+1, ev.id)
		last = ev.id
	}
}

func TestStreamKeepaliveAndBadCursor(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.KeepAlive = 20 * time.Millisecond } })
	c := b.openSSE(-1, "")
	require.Eventually(t, func() bool { return c.comments.Load() >= 3 }, 10*time.Second, 10*time.Millisecond)

	for _, q := range []string{"?after=x", "?after=-4"} {
		r := b.get("/observability/stream"+q, viewerToken)
		require.Equal(t, http.StatusBadRequest, r.status, q)
		require.Equal(t, "INVALID_QUERY", r.json(t)["errorCode"])
	}
	// A cursor beyond the log resumes at its end.
	c2 := b.openSSE(1_000_000, "")
	require.NoError(t, appendFlows(t.Context(), b.log, "x", 1))
	ev, ok := c2.next(t, 10*time.Second)
	require.True(t, ok)
	require.EqualValues(t, 1, ev.id)
}

func TestStreamNeedsAuth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := b.get("/observability/stream", "")
	require.Equal(t, http.StatusUnauthorized, r.status)
	op := b.login(viewerToken)
	req := b.req("GET", "/observability/stream", nil)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	resp, err := op.c.Do(req.WithContext(ctx))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
}
