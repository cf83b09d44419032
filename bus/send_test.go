package bus

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/testclock"
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

// A resend of a nonce the log has is answered from the log whether or not
// the send looks the nonce up first: after a restart the bus has not noted
// the nonce, so its received is recorded optimistically and refused.
func TestResendAfterRestartIsDedupedWithoutALookUp(t *testing.T) {
	t.Parallel()
	clock := testclock.NewNow()
	path := t.TempDir() + "/beam.db"
	opts := func(o *setupOpts) {
		o.path, o.clock = path, clock
		o.cfg = func(c *Config) { c.PerRecipient = 1 }
	}
	tb := setup(t, opts)
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	nonce := "resend-after-restart"
	payload := map[string]any{"k": "v"}
	done := make(chan map[string]any, 1)
	go func() {
		_, body := tb.sendAs(alice, bob.id, "task.run", payload, map[string]any{"nonce": nonce})
		done <- body
	}()
	_, f := bobWS.nextIntent()
	require.Equal(t, nonce, f.Nonce)
	bobWS.respond(nonce, true, `{"ok":1}`, "")
	first := <-done
	tb.waitStatus(nonce, tracing.Acked)
	states := tb.states(nonce)

	// Before the restart: the bus noted the nonce and looks it up.
	status, before := tb.sendAs(alice, bob.id, "task.run", payload, map[string]any{"nonce": nonce})
	require.Equal(t, http.StatusOK, status, before)
	require.Equal(t, true, before["deduped"], before)
	tb.close()

	tb2 := setup(t, opts)
	tb2.connect(bob) // online: the send plans a delivery before the log refuses it
	// A different payload under the nonce is a conflict, as before.
	status, body := tb2.sendAs(alice, bob.id, "task.run", map[string]any{"k": "other"}, map[string]any{"nonce": nonce})
	require.Equal(t, http.StatusConflict, status, body)
	require.Equal(t, codeNonceReuse, body["errorCode"], body)
	tb2.close()

	tb3 := setup(t, opts)
	bobWS = tb3.connect(bob)
	status, after := tb3.sendAs(alice, bob.id, "task.run", payload, map[string]any{"nonce": nonce})
	require.Equal(t, http.StatusOK, status, after)
	require.Equal(t, before, after, "the same answer with and without the look-up")
	require.Equal(t, first["message_id"], after["message_id"])
	require.Equal(t, "acked", after["status"])
	require.Equal(t, states, tb3.states(nonce), "nothing was recorded for the resend")

	// The refused attempt gave its recipient slot back: bob's only slot
	// takes the next message at once.
	sent := tb3.sendAsync(alice, bob.id, "task.run")
	_, next := bobWS.nextIntent()
	<-sent
	require.Equal(t, []tracing.State{tracing.Received, tracing.Dispatched, tracing.Delivered}, tb3.states(next.Nonce))
}
