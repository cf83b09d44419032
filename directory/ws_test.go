package directory

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

func TestAttachRequiresProof(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")

	refused := func(query, wantReason string) {
		t.Helper()
		c, err := b.dial(query, true)
		require.NoError(t, err)
		code, reason := c.closeStatus()
		require.Equal(t, websocket.StatusPolicyViolation, code, reason)
		require.Contains(t, reason, wantReason)
	}
	refused("beamId="+url.QueryEscape(bob.id), "authentication required")
	refused("beamId="+url.QueryEscape(bob.id)+"&apiKey="+url.QueryEscape(alice.apiKey), "invalid API key")
	refused("", "Missing beamId")
	refused("beamId=ghost%40acme.beam.directory", "is not registered")
	require.False(t, b.dir.Online(bob.id))

	// The API key in a header works too.
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+bob.apiKey)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, b.wsURL("beamId="+url.QueryEscape(bob.id)), &websocket.DialOptions{HTTPHeader: hdr})
	require.NoError(t, err)
	defer conn.CloseNow()
	_, data, err := conn.Read(ctx)
	require.NoError(t, err)
	require.Contains(t, string(data), `"auth":"api_key"`)
}

func TestSignedConnectToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bob := b.register("bob")
	query := func(ts time.Time, nonce string) string {
		stamp := wire.FormatTimestamp(ts)
		sig, err := wire.SignCanonical(map[string]any{"action": connectAction, "beamId": bob.id, "nonce": nonce, "timestamp": stamp}, bob.priv)
		require.NoError(t, err)
		return "beamId=" + url.QueryEscape(bob.id) + "&timestamp=" + url.QueryEscape(stamp) + "&nonce=" + nonce + "&signature=" + url.QueryEscape(sig)
	}
	q := query(b.clock.Now(), "n-1")
	c := b.connectQuery(bob, q)
	_ = c

	// The same URL cannot be replayed.
	r, err := b.dial(q, true)
	require.NoError(t, err)
	code, reason := r.closeStatus()
	require.Equal(t, websocket.StatusPolicyViolation, code)
	require.Contains(t, reason, "nonce already used")

	// A stale token is refused.
	r, err = b.dial(query(b.clock.Now().Add(-10*time.Minute), "n-2"), true)
	require.NoError(t, err)
	code, reason = r.closeStatus()
	require.Equal(t, websocket.StatusPolicyViolation, code)
	require.Contains(t, reason, "window")
}

func TestLegacyAttachOnlyWithFlag(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.AllowLegacyWSIdentity = true } })
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connectQuery(bob, "beamId="+url.QueryEscape(bob.id))
	_ = bc
	ac := b.connectQuery(alice, "beamId="+url.QueryEscape(alice.id))

	// A legacy session must sign its frames.
	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`)
	f.Signature = ""
	ac.sendIntent(f)
	e := ac.nextOf("error")
	require.Equal(t, CodeInvalidIntent, e.ErrorCode)
	require.False(t, resultOf(t, ac.nextOf("result").Frame).Success)

	signed := b.frame(alice, bob.id, "agent.ping", `{}`)
	ac.sendIntent(signed)
	intentFrame(t, bc.nextOf("intent"))
	bc.respond(b.clock, signed.Nonce, true, `{}`)
	require.True(t, resultOf(t, ac.nextOf("result").Frame).Success)
}

func TestAPIKeySessionMaySendUnsigned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac := b.connect(alice)
	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`)
	f.Signature = ""
	ac.sendIntent(f)
	require.True(t, resultOf(t, ac.nextOf("result").Frame).Success)

	// A present signature is still verified.
	bad := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"a":1}`)
	bad.Payload = []byte(`{"a":2}`)
	ac.sendIntent(bad)
	require.Equal(t, CodeInvalidIntent, ac.nextOf("error").ErrorCode)
	ac.nextOf("result")

	// A session may not send as another agent.
	asBob := b.frame(bob, registry.EchoBeamID, "agent.ping", `{}`)
	ac.sendIntent(asBob)
	e := ac.nextOf("error")
	require.Equal(t, CodeForbidden, e.ErrorCode)
	ac.nextOf("result")
	require.False(t, b.hasRow(asBob.Nonce))
}

func TestResultOnlyFromRecipient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob, carol := b.register("alice"), b.register("bob"), b.register("carol")
	ac, bc, cc := b.connect(alice), b.connect(bob), b.connect(carol)

	f := b.frame(alice, bob.id, "task.delegate", `{}`)
	ac.sendIntent(f)
	intentFrame(t, bc.nextOf("intent"))
	cc.respond(b.clock, f.Nonce, true, `{"spoofed":true}`)
	e := cc.nextOf("error")
	require.Equal(t, CodeForbidden, e.ErrorCode)
	require.Equal(t, f.Nonce, e.Nonce)

	res := bc.respond(b.clock, f.Nonce, true, `{"real":true}`)
	require.Equal(t, string(res), string(ac.nextOf("result").Frame))

	// A late spoof after completion is refused as well.
	cc.respond(b.clock, f.Nonce, false, "")
	require.Equal(t, CodeForbidden, cc.nextOf("error").ErrorCode)
	require.Equal(t, fullPath, b.states(f.Nonce))
}

func TestBadWebSocketMessages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice")
	ac := b.connect(alice)

	ac.write("not json")
	require.Equal(t, "Invalid message format: must be valid JSON", ac.nextOf("error").Message)
	ac.write(`{"type":"hello"}`)
	require.Equal(t, "Unknown message type: hello", ac.nextOf("error").Message)
	ac.write(`{"type":"intent","frame":{"intent":1,"nonce":"abc"}}`)
	e := ac.nextOf("error")
	require.Equal(t, CodeInvalidIntent, e.ErrorCode)
	require.Equal(t, "abc", e.Nonce)
	require.Equal(t, "abc", resultOf(t, ac.nextOf("result").Frame).Nonce)
	ac.write(`{"type":"result","frame":{"success":"yes"}}`)
	require.Equal(t, wire.CodeInvalidResult, ac.nextOf("error").ErrorCode)
	ac.write(`{"type":"result","frame":{"v":"1","success":true,"nonce":"unknown","timestamp":"2026-01-01T00:00:00.000Z"}}`)
	// Unknown nonces are ignored; the session still works.
	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`)
	ac.sendIntent(f)
	require.True(t, resultOf(t, ac.nextOf("result").Frame).Success)

	// Oversized delivery over WebSocket.
	big := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"blob":"`+strings.Repeat("z", 4100)+`"}`)
	ac.sendIntent(big)
	require.Equal(t, codeFrameTooLarge, ac.nextOf("error").ErrorCode)
	ac.nextOf("result")

	// A message above the read limit closes the session with 1009.
	ac.write(`{"type":"intent","frame":"` + strings.Repeat("a", 70<<10) + `"}`)
	code, _ := ac.closeStatus()
	require.Equal(t, websocket.StatusMessageTooBig, code)
}

func TestSessionReplacement(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	first := b.connect(bob)
	second := b.connect(bob)
	code, reason := first.closeStatus()
	require.Equal(t, websocket.StatusGoingAway, code)
	require.Equal(t, "Replaced by new connection", reason)
	require.True(t, b.dir.Online(bob.id))

	f := b.frame(alice, bob.id, "agent.ping", `{}`)
	out := b.sendAsync(f)
	intentFrame(t, second.nextOf("intent"))
	second.respond(b.clock, f.Nonce, true, `{}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)
}

// smallBuffers shrinks the kernel socket buffers of the connections it
// accepts once on is set, so that a client that does not read blocks the
// server's writes quickly. Connections accepted before keep their buffers:
// a sender whose results are written into a tiny buffer would itself be
// disconnected as too slow whenever its reader is scheduled late.
type smallBuffers struct {
	net.Listener
	on *atomic.Bool
}

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && l.on.Load() {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

func TestSlowConsumerIsDisconnected(t *testing.T) {
	t.Parallel()
	shrink := new(atomic.Bool)
	b := setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) { c.SendQueue = 4 }
		o.listener = func(l net.Listener) net.Listener { return smallBuffers{l, shrink} }
	})
	alice, slow, carol := b.register("alice"), b.register("slow"), b.register("carol")
	ac, cc := b.connect(alice), b.connect(carol)
	shrink.Store(true)

	// The slow agent connects with a tiny receive buffer and never reads.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(4096)
		}
		return c, err
	}}}
	conn, _, err := websocket.Dial(ctx, b.wsURL("beamId="+url.QueryEscape(slow.id)+"&apiKey="+url.QueryEscape(slow.apiKey)),
		&websocket.DialOptions{HTTPClient: client})
	require.NoError(t, err)
	defer conn.CloseNow()
	conn.SetReadLimit(1 << 20)
	require.Eventually(t, func() bool { return b.dir.Online(slow.id) }, 5*time.Second, 5*time.Millisecond)

	payload := `{"blob":"` + strings.Repeat("s", 3000) + `"}`
	for i := 0; i < 200 && b.dir.Online(slow.id); i++ {
		ac.sendIntent(b.frame(alice, slow.id, "task.delegate", payload))
	}
	require.Eventually(t, func() bool { return !b.dir.Online(slow.id) }, 20*time.Second, 5*time.Millisecond)

	// Another agent keeps receiving meanwhile.
	f := b.frame(alice, carol.id, "agent.ping", `{}`)
	out := b.sendAsync(f)
	got := intentFrame(t, cc.nextOf("intent"))
	require.Equal(t, f.Nonce, got.Nonce)
	cc.respond(b.clock, f.Nonce, true, `{}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)

	// Once the slow agent reads, it finds the close frame: 1008 too slow.
	for {
		_, _, err := conn.Read(ctx)
		if err != nil {
			require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "err: %v", err)
			require.Contains(t, err.Error(), "too slow")
			break
		}
	}
	// Intents that were never written failed retryably.
	counts, err := b.log.CountByState(t.Context())
	require.NoError(t, err)
	require.Positive(t, counts[tracing.Failed])
}

func TestConnectWithJWSToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bob := b.register("bob")
	payload, err := json.Marshal(map[string]string{"action": connectAction, "beamId": bob.id, "nonce": "j-1",
		"timestamp": wire.FormatTimestamp(b.clock.Now())})
	require.NoError(t, err)
	tok, err := wire.SignJWS(typConnectJWS, payload, bob.id, bob.priv)
	require.NoError(t, err)
	c, err := b.dial("beamId="+url.QueryEscape(bob.id)+"&token="+url.QueryEscape(tok), true)
	require.NoError(t, err)
	m := c.nextOf("connected")
	require.Equal(t, authJWS, m.Auth)

	// A token signed by another agent's key is refused.
	mallory := b.register("mallory")
	forged, err := wire.SignJWS(typConnectJWS, payload, bob.id, mallory.priv)
	require.NoError(t, err)
	r, err := b.dial("beamId="+url.QueryEscape(bob.id)+"&token="+url.QueryEscape(forged), true)
	require.NoError(t, err)
	code, _ := r.closeStatus()
	require.Equal(t, websocket.StatusPolicyViolation, code)
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.Registerer = reg } })
	alice := b.register("alice")
	b.connect(alice)
	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"a":1}`)
	status, _ := b.send(f)
	require.Equal(t, http.StatusOK, status)
	bad := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"a":1}`)
	bad.Payload = []byte(`{"a":2}`)
	status, _ = b.send(bad)
	require.Equal(t, http.StatusBadRequest, status)

	value := func(name string, label ...string) float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				if len(label) == 2 {
					match := false
					for _, lp := range m.GetLabel() {
						match = match || (lp.GetName() == label[0] && lp.GetValue() == label[1])
					}
					if !match {
						continue
					}
				}
				switch {
				case m.GetGauge() != nil:
					return m.GetGauge().GetValue()
				case m.GetCounter() != nil:
					return m.GetCounter().GetValue()
				case m.GetHistogram() != nil:
					return float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
		return -1
	}
	require.Equal(t, 1.0, value("beam_ws_sessions"))
	require.Equal(t, 1.0, value("beam_intents_relayed_total", "outcome", "acked"))
	require.Equal(t, 1.0, value("beam_frames_rejected_total", "code", CodeInvalidIntent))
	require.Equal(t, 2.0, value("beam_relay_seconds"))
}

func TestKeepaliveClosesUnresponsivePeer(t *testing.T) {
	t.Parallel()
	// The interval is also the pong deadline: long enough that a reading
	// peer on a loaded machine answers in time, short enough for a test.
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.PingInterval = time.Second } })
	bob := b.register("bob")
	alice := b.register("alice")
	ac := b.connect(alice) // reads, so it answers pings
	// bob never reads, so it never answers a ping.
	_, err := b.dial("beamId="+url.QueryEscape(bob.id)+"&apiKey="+url.QueryEscape(bob.apiKey), false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.dir.Online(bob.id) }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return !b.dir.Online(bob.id) }, 10*time.Second, 10*time.Millisecond)
	// A responsive peer stays attached across several ping rounds.
	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`)
	ac.sendIntent(f)
	require.True(t, resultOf(t, ac.nextOf("result").Frame).Success)
	require.True(t, b.dir.Online(alice.id))
}
