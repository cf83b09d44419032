package bus

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// takenOver is details.takenOver as a takeover's import writes it on
// every event it copies from a dead node's log.
var takenOver = map[string]any{"log": "log-dead", "node": "node-dead", "seq": 7}

// imported appends ev to tb's log as an imported event of the dead node.
func (tb *testBundle) imported(ev tracing.Event) {
	tb.t.Helper()
	if ev.Details.Extra == nil {
		ev.Details.Extra = map[string]any{}
	}
	ev.Details.Extra["takenOver"] = takenOver
	_, err := tb.log.Append(context.Background(), ev)
	require.NoError(tb.t, err)
}

// requireMarker checks that nonce's trace has exactly one takeover marker
// naming the dead node.
func (tb *testBundle) requireMarker(nonce string) {
	tb.t.Helper()
	trace, err := tb.log.Trace(context.Background(), nonce)
	require.NoError(tb.t, err)
	n := 0
	for _, ev := range trace {
		if ev.Transport != tracing.TransportTakeover {
			continue
		}
		n++
		require.Equal(tb.t, map[string]any{"log": "log-dead", "node": "node-dead"}, ev.Details.Extra["adoptedFrom"])
	}
	require.Equal(tb.t, 1, n, "one takeover marker in the trace of %s", nonce)
}

// TestAdoptTakesOverImportedMessages: messages a takeover imported behind
// the running bus — one in a WebSocket attempt, one waiting for its
// recipient, one delivered without a result — are adopted once: the
// interrupted one is delivered again with the same nonce and acked, the
// waiting one is delivered when the recipient connects, the delivered one
// times out and is retried; each trace shows one takeover marker. A
// message the bus runs itself is untouched, and a second Adopt adopts
// nothing.
func TestAdoptTakesOverImportedMessages(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	ctx := context.Background()
	alice, bob := tb.register("alice"), tb.register("bob")
	var nonces []string
	for _, intent := range []string{"task.own", "task.flying", "task.waiting", "task.delivered"} {
		_, body := tb.sendAs(alice, bob.id, intent, nil, nil)
		nonces = append(nonces, nonceOf(t, body))
	}
	own, flying, waiting, delivered := nonces[0], nonces[1], nonces[2], nonces[3]
	// The dead node's last events: an attempt in flight, a wait, and a
	// delivery whose result never came.
	tb.imported(event(tb.message(flying), tracing.Dispatched, transportWS, 1))
	tb.imported(event(tb.message(waiting), tracing.Queued, transportBus, 0))
	tb.imported(event(tb.message(delivered), tracing.Dispatched, transportWS, 1))
	tb.imported(event(tb.message(delivered), tracing.Delivered, transportWS, 1))
	ownStates := tb.states(own)

	rep, err := tb.bus.Adopt(ctx, nonces)
	require.NoError(t, err)
	require.Equal(t, RecoveryReport{Requeued: 1, AwaitingResult: 1, Adopted: 3}, rep)
	require.Equal(t, ownStates, tb.states(own), "a message the bus runs itself is not adopted")
	again, err := tb.bus.Adopt(ctx, nonces)
	require.NoError(t, err)
	require.Equal(t, RecoveryReport{}, again, "a second Adopt adopts nothing")
	for _, n := range []string{flying, waiting, delivered} {
		tb.requireMarker(n)
	}
	m := tb.message(flying)
	require.Equal(t, tracing.Queued, m.Status)

	bobWS := tb.connect(bob)
	got := map[string]int{}
	for range 3 {
		_, f := bobWS.nextIntent()
		got[f.Nonce]++
		bobWS.respond(f.Nonce, true, "", "")
	}
	require.Equal(t, map[string]int{own: 1, flying: 1, waiting: 1}, got)
	for _, n := range []string{own, flying, waiting} {
		tb.waitStatus(n, tracing.Acked)
	}
	require.Equal(t, tracing.Delivered, tb.message(delivered).Status, "the delivered one waits for its result")
	tb.clock.Advance(defaultDeliveryTimeout + time.Second)
	tb.tick()
	m = tb.message(delivered)
	require.Equal(t, tracing.Queued, m.Status, "no result within the delivery timeout: retried")
	require.Equal(t, 1, m.RetryCount)
	tb.clock.Advance(10 * time.Minute)
	tb.tick()
	_, f := bobWS.nextIntent()
	require.Equal(t, delivered, f.Nonce, "delivered again with the same nonce")
	bobWS.respond(f.Nonce, true, "", "")
	tb.waitStatus(delivered, tracing.Acked)
	again, err = tb.bus.Adopt(ctx, nonces)
	require.NoError(t, err)
	require.Equal(t, RecoveryReport{}, again)
}

// TestAdoptKeepsAScheduledRetry: an imported message waiting for its next
// attempt keeps its schedule and retry count when adopted, and is
// attempted when it is due.
func TestAdoptKeepsAScheduledRetry(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	_, body := tb.sendAs(alice, bob.id, "task.scheduled", nil, nil)
	nonce := nonceOf(t, body)
	one := 1
	retryAt := tb.clock.Now().Add(90 * time.Second)
	ev := event(tb.message(nonce), tracing.Queued, transportBus, 1)
	ev.Details = tracing.Details{RetryCount: &one, NextRetryAt: retryAt.UnixMilli(), ErrorCode: "TIMEOUT", Error: "no answer"}
	tb.imported(ev)
	before := tb.message(nonce)

	rep, err := tb.bus.Adopt(context.Background(), []string{nonce})
	require.NoError(t, err)
	require.Equal(t, RecoveryReport{Adopted: 1}, rep)
	tb.requireMarker(nonce)
	after := tb.message(nonce)
	require.Equal(t, tracing.Queued, after.Status)
	require.Equal(t, *before.NextRetryAt, *after.NextRetryAt, "the schedule is kept")
	require.Equal(t, 1, after.RetryCount)
	require.Equal(t, "no answer", after.Error)

	bobWS := tb.connect(bob)
	tb.tick()
	require.Equal(t, tracing.Queued, tb.message(nonce).Status, "not attempted before it is due")
	tb.clock.Advance(91 * time.Second)
	tb.tick()
	_, f := bobWS.nextIntent()
	require.Equal(t, nonce, f.Nonce)
	bobWS.respond(nonce, true, "", "")
	tb.waitStatus(nonce, tracing.Acked)
}
