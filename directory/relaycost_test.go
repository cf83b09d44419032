package directory

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// busReceived appends the received event of a bus message, as the bus
// records a message before its first attempt.
func busReceived(t *testing.T, b *testBundle, nonce, from, to string) {
	t.Helper()
	_, err := b.log.Append(context.Background(), tracing.Event{Nonce: nonce, State: tracing.Received, From: from, To: to,
		IntentType: "task.delegate", Transport: transportBus, Attempt: 1,
		Details: tracing.Details{Owner: tracing.OwnerBus, Bus: &tracing.BusMessage{MessageID: "m-" + nonce}}})
	require.NoError(t, err)
}

// A nonce the bus holds in received must not be recorded again by the
// relay (received → received would pass as an annotation): the relay looks
// such nonces up and answers IN_PROGRESS.
func TestRelayRefusesNonceBusHoldsInReceived(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	release, rerr := b.dir.ClaimBusNonce(f.Nonce, f.From, f.To, f.Intent)
	require.Nil(t, rerr)
	busReceived(t, b, f.Nonce, f.From, f.To)
	release()

	status, body := b.send(f)
	require.Equal(t, http.StatusConflict, status)
	code, _ := errBody(t, body)
	require.Equal(t, CodeInProgress, code)
	require.Equal(t, []tracing.State{tracing.Received}, b.states(f.Nonce))
	require.Equal(t, tracing.OwnerBus, b.row(f.Nonce).Owner)
}

// The same after a restart: Recover remembers the nonces it found in
// received.
func TestRelayRefusesRecoveredNonceInReceived(t *testing.T) {
	t.Parallel()
	b1 := setup(t)
	alice, bob := b1.register("alice"), b1.register("bob")
	f := b1.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	busReceived(t, b1, f.Nonce, f.From, f.To)
	b1.close()

	b2 := setup(t, func(o *setupOpts) { o.path, o.clock = b1.path, b1.clock })
	_, err := b2.dir.Recover(context.Background())
	require.NoError(t, err)
	status, body := b2.send(f)
	require.Equal(t, http.StatusConflict, status)
	code, _ := errBody(t, body)
	require.Equal(t, CodeInProgress, code)
	require.Equal(t, []tracing.State{tracing.Received}, b2.states(f.Nonce))
}

// A nonce the log has in any other state refuses the optimistic received,
// and the frame takes the replay path: a cached result, without a second
// delivery and without any event recorded.
func TestOptimisticReceivedFallsBackToReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	res := bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)
	seq := b.log.LastSeq()

	status, body := b.send(f)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(res), string(body))
	require.Equal(t, seq, b.log.LastSeq(), "a replay records nothing")
	require.Equal(t, fullPath, b.states(f.Nonce))
}

// A recipient that holds an intent without answering still gets delivered
// recorded, and promptly: the restart-recovery scenario depends on it.
func TestDeliveredRecordedWithoutResult(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.DeliveredDelay = 20 * time.Millisecond }
	})
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	require.Eventually(t, func() bool { return b.row(f.Nonce).Status == tracing.Delivered },
		10*time.Second, 5*time.Millisecond)

	bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)
	require.Equal(t, fullPath, b.states(f.Nonce))
}

// A result that arrives before delivered was issued is recorded with it in
// one append.
func TestDeliveredRecordedWithFastResult(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.DeliveredDelay = time.Minute }
	})
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)
	require.Equal(t, fullPath, b.states(f.Nonce))
	evs, err := b.log.Trace(context.Background(), f.Nonce)
	require.NoError(t, err)
	require.Equal(t, evs[3].Seq+1, evs[4].Seq)
	require.Equal(t, evs[3].At, evs[4].At, "delivered and acked share one append")
}

// A timeout that settles an intent whose delivered is still queued records
// delivered before failed.
func TestTimeoutAfterQueuedDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.DeliveredDelay = time.Minute; c.HTTPTimeout = 300 * time.Millisecond }
	})
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	o := waitHTTP(t, out)
	require.Equal(t, http.StatusGatewayTimeout, o.status)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Failed},
		b.states(f.Nonce))
}

// A timeout that settles an intent while its frame is still being written
// (the recipient does not read, so the write blocks) waits for the write,
// then records delivered once, with failed.
func TestTimeoutWhileFrameIsWritten(t *testing.T) {
	t.Parallel()
	const (
		payloadBytes = 240 << 10 // a frame may have 256 KiB
		perRound     = 16        // 3.8 MB of frames per round
		maxRounds    = 16
	)
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) {
			c.DeliveredDelay = time.Minute
			c.HTTPTimeout = 500 * time.Millisecond
			c.WriteTimeout = time.Minute
			c.MaxFrameBytes = wire.MaxFrameBytes
			c.MaxBodyBytes = 2 * wire.MaxFrameBytes
		}
	})
	alice, bob := b.register("alice"), b.register("bob")
	bc, err := b.dial("beamId="+url.QueryEscape(bob.id)+"&apiKey="+url.QueryEscape(bob.apiKey), false)
	require.NoError(t, err)
	bc.conn.SetReadLimit(4 * payloadBytes)
	_, data, err := bc.conn.Read(context.Background())
	require.NoError(t, err)
	require.Contains(t, string(data), `"connected"`)
	require.Eventually(t, func() bool { return b.dir.Online(bob.id) }, 5*time.Second, 5*time.Millisecond)

	// Frames go out until one blocks (the socket buffers' sizes depend on
	// the machine) and a timeout fires while it does: that claim is
	// settled, and its delivery has begun but is not written.
	var nonces []string
	var outs []<-chan httpOutcome
	writing := map[string]bool{}
	blocked := func() bool {
		b.dir.mu.Lock()
		defer b.dir.mu.Unlock()
		for _, n := range nonces {
			if inf := b.dir.claims[n]; inf != nil && inf.finished && inf.delivering && !inf.delivQueued {
				writing[n] = true
			}
		}
		return len(writing) > 0
	}
	for round := 0; !blocked(); round++ {
		require.Less(t, round, maxRounds, "no frame write blocked with %d frames queued", len(nonces))
		for range perRound {
			f := b.frame(alice, bob.id, "task.delegate",
				fmt.Sprintf(`{"n":%d,"blob":"%s"}`, len(nonces), strings.Repeat("x", payloadBytes)))
			nonces = append(nonces, f.Nonce)
			outs = append(outs, b.sendAsync(f))
		}
		require.Eventually(t, func() bool {
			for _, n := range nonces[len(nonces)-perRound:] {
				if st, _, err := b.log.State(context.Background(), n); err != nil || st == tracing.Received {
					return false
				}
			}
			return true
		}, 10*time.Second, 5*time.Millisecond, "round %d dispatched", round)
		// Wait for the round's timeouts: each claim settled (or released).
		require.Eventually(t, func() bool {
			b.dir.mu.Lock()
			defer b.dir.mu.Unlock()
			for _, n := range nonces[len(nonces)-perRound:] {
				if inf := b.dir.claims[n]; inf != nil && !inf.finished {
					return false
				}
			}
			return true
		}, 10*time.Second, 5*time.Millisecond, "round %d timed out", round)
	}

	// Reading lets the writes finish.
	go func() {
		for {
			if _, _, err := bc.conn.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	for i, out := range outs {
		require.Equal(t, http.StatusGatewayTimeout, waitHTTP(t, out).status, "intent %d", i)
	}
	written := []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Failed}
	for _, n := range nonces {
		states := b.states(n)
		if writing[n] {
			require.Equal(t, written, states, "settled while written")
			continue
		}
		require.Contains(t, [][]tracing.State{written,
			{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Failed}}, states)
	}
}

// An idle session costs about one goroutine (its reader): the writer,
// the workers and the keepalive run only when there is work.
func TestIdleSessionGoroutines(t *testing.T) {
	b := setup(t)
	const n = 20
	agents := make([]*agent, n)
	for i := range agents {
		agents[i] = b.register("idle" + string(rune('a'+i)))
	}
	base := runtime.NumGoroutine()
	for _, a := range agents {
		b.connect(a)
	}
	// Each connected session: the server's reader plus the test client's
	// own reader goroutines (two: its read loop and coder/websocket's).
	require.Eventually(t, func() bool {
		return runtime.NumGoroutine()-base <= n*3
	}, 10*time.Second, 10*time.Millisecond, "goroutines: %d more for %d sessions", runtime.NumGoroutine()-base, n)
}
