package directory

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// seedIntent appends the events of an intent that a previous process left
// in state last (received … delivered), the way the relay records them,
// with extra in every event's details.
func seedIntent(t *testing.T, b *testBundle, f *wire.IntentFrame, last tracing.State, at time.Time, timeoutMs int64, extra ...map[string]any) {
	t.Helper()
	hash, err := payloadHash(f.Payload)
	require.NoError(t, err)
	ev := func(s tracing.State, transport string) tracing.Event {
		return tracing.Event{Nonce: f.Nonce, State: s, At: at, From: f.From, To: f.To, IntentType: f.Intent, Transport: transport, Attempt: 1}
	}
	rec := ev(tracing.Received, originWS)
	rec.Details = tracing.Details{Owner: tracing.OwnerDirectory, Frame: frameJSON(t, f), ClientTimestamp: f.Timestamp,
		TimeoutMs: timeoutMs, Extra: map[string]any{"payloadHash": hash}}
	events := []tracing.Event{rec}
	for _, s := range []tracing.State{tracing.Validated, tracing.Dispatched, tracing.Delivered} {
		if tracing.CanTransition(events[len(events)-1].State, s) && events[len(events)-1].State != last {
			e := ev(s, TransportWS)
			if s == tracing.Dispatched {
				e.Details.TimeoutMs = timeoutMs
			}
			events = append(events, e)
		}
	}
	require.Equal(t, last, events[len(events)-1].State)
	for i := range events {
		for _, x := range extra {
			if events[i].Details.Extra == nil {
				events[i].Details.Extra = map[string]any{}
			}
			for k, v := range x {
				events[i].Details.Extra[k] = v
			}
		}
	}
	_, err = b.log.Append(context.Background(), events...)
	require.NoError(t, err)
}

func lastEvent(t *testing.T, b *testBundle, nonce string) tracing.Event {
	t.Helper()
	evs, err := b.log.Trace(context.Background(), nonce)
	require.NoError(t, err)
	require.NotEmpty(t, evs)
	return evs[len(evs)-1]
}

func TestRecoveryAfterRestart(t *testing.T) {
	t.Parallel()
	b1 := setup(t)
	alice, bob := b1.register("alice"), b1.register("bob")
	now := b1.clock.Now()

	fReceived := b1.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	fDispatched := b1.frame(alice, bob.id, "task.delegate", `{"n":2}`)
	fDelivered := b1.frame(alice, bob.id, "task.delegate", `{"n":3}`)
	fOverdue := b1.frame(alice, bob.id, "task.delegate", `{"n":4}`)
	seedIntent(t, b1, fReceived, tracing.Validated, now, 30000)
	seedIntent(t, b1, fDispatched, tracing.Dispatched, now, 30000)
	seedIntent(t, b1, fDelivered, tracing.Delivered, now, 30000)
	seedIntent(t, b1, fOverdue, tracing.Delivered, now.Add(-10*time.Minute), 30000)
	// A bus-owned message is not the directory's to recover.
	_, err := b1.log.Append(context.Background(), tracing.Event{Nonce: "bus-1", State: tracing.Received, From: alice.id, To: bob.id,
		IntentType: "task.delegate", Transport: "bus", Attempt: 1,
		Details: tracing.Details{Owner: tracing.OwnerBus, Bus: &tracing.BusMessage{MessageID: "m-1"}}})
	require.NoError(t, err)
	b1.close()

	b2 := setup(t, func(o *setupOpts) { o.path, o.clock = b1.path, b1.clock })
	rep, err := b2.dir.Recover(context.Background())
	require.NoError(t, err)
	require.Equal(t, recoveryReport{FailedInterrupted: 2, ResumedAwaitingResult: 1, TimedOutAwaitingResult: 1}, rep)

	for _, f := range []*wire.IntentFrame{fReceived, fDispatched} {
		row := b2.row(f.Nonce)
		require.Equal(t, tracing.Failed, row.Status)
		require.Equal(t, CodeDeliveryFailed, row.ErrorCode)
		require.Equal(t, recoveryInterrupted, lastEvent(t, b2, f.Nonce).Details.Extra["recoveryAction"])
		require.True(t, lastEvent(t, b2, f.Nonce).Details.Retryable)
	}
	require.Equal(t, CodeTimeout, b2.row(fOverdue.Nonce).ErrorCode)
	require.Equal(t, recoveryTimeoutAfterRestart, lastEvent(t, b2, fOverdue.Nonce).Details.Extra["recoveryAction"])
	require.Equal(t, tracing.Delivered, b2.row(fDelivered.Nonce).Status)
	require.Equal(t, tracing.Received, b2.row("bus-1").Status)

	// The recipient reconnects and returns the late result: acked.
	bc := b2.connect(bob)
	res := bc.respond(b2.clock, fDelivered.Nonce, true, `{"late":"but fine"}`)
	require.Eventually(t, func() bool { return b2.row(fDelivered.Nonce).Status == tracing.Acked }, 10*time.Second, 5*time.Millisecond)
	last := lastEvent(t, b2, fDelivered.Nonce)
	require.Equal(t, true, last.Details.Extra["lateResult"])
	require.Equal(t, string(res), string(b2.row(fDelivered.Nonce).ResultJSON))

	// A replay returns the cached result with no second delivery.
	status, body := b2.send(fDelivered)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, string(res), string(body))
	require.Equal(t, fullPath, b2.states(fDelivered.Nonce))

	// The interrupted intent may be retried with its nonce and succeeds.
	out := b2.sendAsync(fDispatched)
	got := intentFrame(t, bc.nextOf("intent"))
	require.Equal(t, fDispatched.Nonce, got.Nonce, "the first intent bob sees is the retry, not a redelivery")
	bc.respond(b2.clock, fDispatched.Nonce, true, `{}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)
	require.Equal(t, tracing.Acked, b2.row(fDispatched.Nonce).Status)

	// Sweeping finds nothing left.
	n, err := b2.dir.Sweep(context.Background())
	require.NoError(t, err)
	require.Zero(t, n)
}

func TestRecoverySweepExpiresOverdue(t *testing.T) {
	t.Parallel()
	b1 := setup(t)
	alice, bob := b1.register("alice"), b1.register("bob")
	f := b1.frame(alice, bob.id, "task.delegate", `{}`)
	g := b1.frame(alice, bob.id, "task.delegate", `{"no":"timeout stored"}`)
	seedIntent(t, b1, f, tracing.Delivered, b1.clock.Now(), 1000)
	seedIntent(t, b1, g, tracing.Delivered, b1.clock.Now(), 0)
	b1.close()

	b2 := setup(t, func(o *setupOpts) {
		o.path, o.clock = b1.path, b1.clock
		o.cfg = func(c *Config) { c.RecoverySweepInterval = 10 * time.Millisecond; c.RelayTimeout = 90 * time.Second }
	})
	rep, err := b2.dir.Recover(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, rep.ResumedAwaitingResult)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b2.dir.Start(ctx)

	b2.clock.Advance(2 * time.Second)
	require.Eventually(t, func() bool { return b2.row(f.Nonce).Status == tracing.Failed }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, CodeTimeout, b2.row(f.Nonce).ErrorCode)
	require.Equal(t, recoveryTimeoutNoWaiter, lastEvent(t, b2, f.Nonce).Details.Extra["recoveryAction"])
	// Without a stored timeout, RelayTimeout applies: still open.
	require.Equal(t, tracing.Delivered, b2.row(g.Nonce).Status)
	b2.clock.Advance(90 * time.Second)
	require.Eventually(t, func() bool { return b2.row(g.Nonce).Status == tracing.Failed }, 10*time.Second, 5*time.Millisecond)

	// A result after the sweep is a late annotation, not a crash.
	bc := b2.connect(bob)
	bc.respond(b2.clock, f.Nonce, true, `{}`)
	require.Eventually(t, func() bool { return lastEvent(t, b2, f.Nonce).Details.Extra["lateResult"] == true }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, tracing.Failed, b2.row(f.Nonce).Status)
}
