package bus

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

func TestSendAtRecipientLimitIsQueuedAndDeliveredWhenASlotFrees(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.PerRecipient = 1 } })
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)

	sent := tb.sendAsync(alice, bob.id, "task.run")
	_, first := bobWS.nextIntent()
	<-sent
	// bob's only slot is taken: the next message waits for it, queued.
	status, body := tb.sendAs(alice, bob.id, "task.run", nil, nil)
	require.Equal(t, http.StatusCreated, status, body)
	require.Equal(t, "queued", body["status"], body)
	second := nonceOf(t, body)
	require.Nil(t, tb.message(second).NextRetryAt)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Queued}, tb.states(second))

	// The first attempt's outcome frees the slot and the second is delivered.
	bobWS.respond(first.Nonce, true, `{"n":1}`, "")
	_, got := bobWS.nextIntent()
	require.Equal(t, second, got.Nonce)
	bobWS.respond(second, true, `{"n":2}`, "")
	tb.waitStatus(second, tracing.Acked)
	require.Equal(t, tracing.Acked, tb.message(first.Nonce).Status)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Queued, tracing.Dispatched, tracing.Delivered, tracing.Acked},
		tb.states(second))
}

func TestResultAfterHTTPAckOfTheSameAttemptIsIgnored(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.PerRecipient = 1 } })
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)

	sent := tb.sendAsync(alice, bob.id, "task.run")
	_, f := bobWS.nextIntent()
	<-sent
	tb.waitStatus(f.Nonce, tracing.Delivered)
	status, body := tb.call(http.MethodPost, "/v1/beam/ack", bob.apiKey, "", map[string]any{"nonce": f.Nonce, "response": map[string]any{"ok": 1}})
	require.Equal(t, http.StatusOK, status, body)

	// The WebSocket result of the same attempt comes after the ack: a
	// failure that would otherwise be retried.
	bobWS.respond(f.Nonce, false, "", "HANDLER_ERROR")
	// The slot is freed only after that outcome was handled: a next
	// message delivered to bob proves it.
	sent = tb.sendAsync(alice, bob.id, "task.run")
	_, g := bobWS.nextIntent()
	<-sent
	bobWS.respond(g.Nonce, true, "", "")
	tb.waitStatus(g.Nonce, tracing.Acked)

	m := tb.message(f.Nonce)
	require.Equal(t, tracing.Acked, m.Status)
	require.JSONEq(t, `{"ok":1}`, string(m.Response))
	require.Equal(t, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Delivered, tracing.Acked}, tb.states(f.Nonce))
	require.Zero(t, counterValue(t, tb.bus.m.retries))
}
