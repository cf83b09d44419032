package directory

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/tracing"
)

var fullPath = []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}

func TestHTTPToWebSocketAcked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "quote.request", `{"sku":"INV-240","quantity":240,"note":"<&>"}`)
	out := b.sendAsync(f)
	got := intentFrame(t, bc.nextOf("intent"))
	require.Equal(t, f.Nonce, got.Nonce)
	require.JSONEq(t, `{"sku":"INV-240","quantity":240,"note":"<&>"}`, string(got.Payload))
	require.Equal(t, `{"sku":"INV-240","quantity":240,"note":"<&>"}`, string(got.Payload), "payload bytes forwarded unchanged")
	res := bc.respond(b.clock, f.Nonce, true, `{"quotedUnitPriceEur":184}`)

	o := waitHTTP(t, out)
	require.Equal(t, http.StatusOK, o.status, string(o.body))
	require.Equal(t, string(res), string(o.body), "the recipient's result frame verbatim")
	require.Equal(t, fullPath, b.states(f.Nonce))
	row := b.row(f.Nonce)
	require.Equal(t, tracing.Acked, row.Status)
	require.Equal(t, string(res), string(row.ResultJSON))
	require.Equal(t, "ws", row.Transport)
	require.EqualValues(t, defaultHTTPTimeout.Milliseconds(), row.TimeoutMs)
}

func TestWebSocketToWebSocket(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac, bc := b.connect(alice), b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"task":"count"}`)
	ac.sendIntent(f)
	intentFrame(t, bc.nextOf("intent"))
	res := bc.respond(b.clock, f.Nonce, true, `{"done":true}`)
	m := ac.nextOf("result")
	require.Equal(t, string(res), string(m.Frame))
	require.Equal(t, fullPath, b.states(f.Nonce))
	require.EqualValues(t, defaultWSTimeout.Milliseconds(), b.row(f.Nonce).TimeoutMs)

	// A recipient failure is the sender's result too, recorded failed.
	f2 := b.frame(alice, bob.id, "task.delegate", `{"task":"fail"}`)
	ac.sendIntent(f2)
	intentFrame(t, bc.nextOf("intent"))
	res2 := bc.respond(b.clock, f2.Nonce, false, "")
	m2 := ac.nextOf("result")
	require.Equal(t, string(res2), string(m2.Frame))
	row := b.row(f2.Nonce)
	require.Equal(t, tracing.Failed, row.Status)
	require.Equal(t, "INTENT_HANDLER_ERROR", row.ErrorCode)

	// Replaying the recipient failure over HTTP returns it as a 200 result.
	status, body := b.send(f2)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, string(res2), string(body))
}

func TestBuiltinEcho(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice")

	f := b.frame(alice, registry.EchoBeamID, "conversation.message", `{"message":"hello"}`)
	status, body := b.send(f)
	require.Equal(t, http.StatusOK, status, string(body))
	rf := resultOf(t, body)
	require.True(t, rf.Success)
	require.JSONEq(t, `{"message":"Echo: hello","from":"echo@beam.directory","handledBy":"builtin-echo"}`, string(rf.Payload))
	require.Equal(t, fullPath, b.states(f.Nonce))

	ac := b.connect(alice)
	f2 := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"x":1}`)
	ac.sendIntent(f2)
	m := ac.nextOf("result")
	rf2 := resultOf(t, m.Frame)
	require.True(t, rf2.Success)
	var p map[string]any
	require.NoError(t, json.Unmarshal(rf2.Payload, &p))
	require.Equal(t, "builtin-echo", p["handledBy"])
	require.Equal(t, "builtin-echo", p["transport"])
	require.Equal(t, "agent.ping", p["intent"])
	require.Equal(t, map[string]any{"x": float64(1)}, p["originalPayload"])
	require.Equal(t, tracing.Acked, b.row(f2.Nonce).Status)
}

func TestOfflineThenRetrySameNonceSucceeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	status, body := b.send(f)
	require.Equal(t, http.StatusServiceUnavailable, status)
	code, msg := errBody(t, body)
	require.Equal(t, CodeOffline, code)
	require.Equal(t, "agent_offline", msg)
	row := b.row(f.Nonce)
	require.Equal(t, tracing.Failed, row.Status)
	require.Equal(t, CodeOffline, row.ErrorCode)

	bc := b.connect(bob)
	// The retry is re-signed with a new timestamp and the same nonce, as
	// the bus does.
	b.clock.Advance(time.Second)
	f.Timestamp = wire.FormatTimestamp(b.clock.Now())
	require.NoError(t, wire.SignIntent(f, alice.priv))
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	bc.respond(b.clock, f.Nonce, true, `{"ok":true}`)
	o := waitHTTP(t, out)
	require.Equal(t, http.StatusOK, o.status, string(o.body))
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Failed,
		tracing.Queued, tracing.Dispatched, tracing.Delivered, tracing.Acked}, b.states(f.Nonce))
	row = b.row(f.Nonce)
	require.Equal(t, tracing.Acked, row.Status)
	require.Equal(t, 2, row.Attempt)
}

func TestReplayOfFinishedNonceReturnsCachedResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	bc.respond(b.clock, f.Nonce, true, `{"answer":42}`)
	first := waitHTTP(t, out)
	require.Equal(t, http.StatusOK, first.status)

	// Same frame again, and re-signed with a newer timestamp.
	status, body := b.send(f)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(first.body), string(body))
	b.clock.Advance(2 * time.Second)
	f.Timestamp = wire.FormatTimestamp(b.clock.Now())
	require.NoError(t, wire.SignIntent(f, alice.priv))
	status, body = b.send(f)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(first.body), string(body))

	// Over WebSocket too.
	ac := b.connect(alice)
	ac.sendIntent(f)
	require.Equal(t, string(first.body), string(ac.nextOf("result").Frame))

	// Exactly one delivery: the next message bob sees is a later intent.
	barrier := b.frame(alice, bob.id, "task.delegate", `{"n":2}`)
	out2 := b.sendAsync(barrier)
	require.Equal(t, barrier.Nonce, intentFrame(t, bc.nextOf("intent")).Nonce)
	bc.respond(b.clock, barrier.Nonce, true, `{}`)
	waitHTTP(t, out2)
	require.Equal(t, fullPath, b.states(f.Nonce))
}

func TestInFlightDuplicateIsInProgress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac, bc := b.connect(alice), b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	ac.sendIntent(f)
	intentFrame(t, bc.nextOf("intent"))

	ac.sendIntent(f)
	e := ac.nextOf("error")
	require.Equal(t, CodeInProgress, e.ErrorCode)
	require.Equal(t, f.Nonce, e.Nonce)
	fr := resultOf(t, ac.nextOf("result").Frame)
	require.False(t, fr.Success)
	require.Equal(t, CodeInProgress, fr.ErrorCode)

	status, body := b.send(f)
	require.Equal(t, http.StatusConflict, status)
	code, _ := errBody(t, body)
	require.Equal(t, CodeInProgress, code)

	res := bc.respond(b.clock, f.Nonce, true, `{"ok":1}`)
	require.Equal(t, string(res), string(ac.nextOf("result").Frame))

	// No second delivery reached bob.
	barrier := b.frame(alice, bob.id, "task.delegate", `{"n":2}`)
	ac.sendIntent(barrier)
	require.Equal(t, barrier.Nonce, intentFrame(t, bc.nextOf("intent")).Nonce)
	require.Equal(t, fullPath, b.states(f.Nonce))
}

func TestNonceReuseWithAnotherPayloadConflicts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice")

	f := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"n":1}`)
	status, _ := b.send(f)
	require.Equal(t, http.StatusOK, status)

	other := b.frame(alice, registry.EchoBeamID, "agent.ping", `{"n":2}`)
	other.Nonce = f.Nonce
	require.NoError(t, wire.SignIntent(other, alice.priv))
	status, body := b.send(other)
	require.Equal(t, http.StatusConflict, status)
	code, _ := errBody(t, body)
	require.Equal(t, CodeNonceReuse, code)

	// Same payload, different key order and spacing: JS-normalised hashes
	// match only when the order matches; whitespace never matters.
	spaced := b.frame(alice, registry.EchoBeamID, "agent.ping", `{ "n" : 1 }`)
	spaced.Nonce = f.Nonce
	require.NoError(t, wire.SignIntent(spaced, alice.priv))
	status, _ = b.send(spaced)
	require.Equal(t, http.StatusOK, status)

	otherIntent := b.frame(alice, registry.EchoBeamID, "agent.introduce", `{"n":1}`)
	otherIntent.Nonce = f.Nonce
	require.NoError(t, wire.SignIntent(otherIntent, alice.priv))
	status, _ = b.send(otherIntent)
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, fullPath, b.states(f.Nonce))
}

func TestAsyncAcceptanceStaysDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	f := b.frame(alice, bob.id, "purchase.preflight", `{"amount":10}`)
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	res := bc.respond(b.clock, f.Nonce, true, `{"accepted":true,"acknowledgement":"accepted","terminal":false}`)
	o := waitHTTP(t, out)
	require.Equal(t, http.StatusOK, o.status)
	require.Equal(t, string(res), string(o.body))
	require.Equal(t, tracing.Delivered, b.row(f.Nonce).Status)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Delivered},
		b.states(f.Nonce))

	// A replay returns the acceptance without a second delivery.
	status, body := b.send(f)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(res), string(body))
}

func TestTimeoutThenLateResult(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.WSTimeout = 300 * time.Millisecond } })
	alice, bob := b.register("alice"), b.register("bob")
	ac, bc := b.connect(alice), b.connect(bob)

	f := b.frame(alice, bob.id, "task.delegate", `{"slow":true}`)
	ac.sendIntent(f)
	intentFrame(t, bc.nextOf("intent"))
	e := ac.nextOf("error")
	require.Equal(t, CodeTimeout, e.ErrorCode)
	fr := resultOf(t, ac.nextOf("result").Frame)
	require.Equal(t, CodeTimeout, fr.ErrorCode)
	row := b.row(f.Nonce)
	require.Equal(t, tracing.Failed, row.Status)
	require.Equal(t, CodeTimeout, row.ErrorCode)
	require.Contains(t, string(row.ResultJSON), `"errorCode":"TIMEOUT"`)

	bc.respond(b.clock, f.Nonce, true, `{"late":true}`)
	require.Eventually(t, func() bool { return len(b.states(f.Nonce)) == 6 }, 10*time.Second, 5*time.Millisecond)
	evs, err := b.log.Trace(t.Context(), f.Nonce)
	require.NoError(t, err)
	last := evs[len(evs)-1]
	require.Equal(t, tracing.Failed, last.State)
	require.Equal(t, true, last.Details.Extra["lateResult"])
	row = b.row(f.Nonce)
	require.Equal(t, tracing.Failed, row.Status)
	require.Contains(t, string(row.ResultJSON), `"errorCode":"TIMEOUT"`)

	// The session still works.
	f2 := b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`)
	ac.sendIntent(f2)
	require.True(t, resultOf(t, ac.nextOf("result").Frame).Success)
}

func TestDirectHTTPDelivery(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var gotHeaders atomic.Value
	endpoint := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		gotHeaders.Store(r.Header.Clone())
		body, _ := io.ReadAll(r.Body)
		var in struct {
			Nonce   string          `json:"nonce"`
			Payload json.RawMessage `json:"payload"`
		}
		_ = json.Unmarshal(body, &in)
		if strings.Contains(string(in.Payload), "fail") {
			http.Error(w, "boom", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"received":true,"echo":` + string(in.Payload) + `}`))
	}))
	t.Cleanup(endpoint.Close)
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.HTTPClient = endpoint.Client() } })
	alice := b.register("alice")
	hook := b.register("hook", map[string]any{"httpEndpoint": endpoint.URL + "/beam"})

	f := b.frame(alice, hook.id, "task.delegate", `{"job":"x"}`)
	status, body := b.send(f)
	require.Equal(t, http.StatusOK, status, string(body))
	rf := resultOf(t, body)
	require.True(t, rf.Success)
	require.JSONEq(t, `{"received":true,"echo":{"job":"x"}}`, string(rf.Payload))
	h := gotHeaders.Load().(http.Header)
	require.Equal(t, alice.id, h.Get("X-Beam-Sender"))
	require.Equal(t, f.Nonce, h.Get("X-Beam-Nonce"))
	require.Equal(t, f.Signature, h.Get("X-Beam-Signature"))
	require.Equal(t, fullPath, b.states(f.Nonce))
	require.Equal(t, TransportDirectHTTP, b.row(f.Nonce).Transport)

	// Replay: cached, the endpoint is not called again.
	status, body2 := b.send(f)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, string(body), string(body2))
	require.EqualValues(t, 1, calls.Load())

	// Endpoint failure without a session: DIRECT_HTTP_FAILED (retryable).
	ff := b.frame(alice, hook.id, "task.delegate", `{"job":"fail"}`)
	status, body = b.send(ff)
	require.Equal(t, http.StatusBadGateway, status, string(body))
	code, _ := errBody(t, body)
	require.Equal(t, codeDirectHTTPFailed, code)

	// With a session, the failure falls through to WebSocket.
	hc := b.connect(hook)
	ff2 := b.frame(alice, hook.id, "task.delegate", `{"job":"fail-2"}`)
	out := b.sendAsync(ff2)
	intentFrame(t, hc.nextOf("intent"))
	hc.respond(b.clock, ff2.Nonce, true, `{"via":"ws"}`)
	o := waitHTTP(t, out)
	require.Equal(t, http.StatusOK, o.status, string(o.body))
	evs, err := b.log.Trace(t.Context(), ff2.Nonce)
	require.NoError(t, err)
	var fallback bool
	for _, ev := range evs {
		if ev.State == tracing.Dispatched && ev.Transport == TransportWS {
			fallback = ev.Details.Extra["fallbackReason"] == codeDirectHTTPFailed
		}
	}
	require.True(t, fallback, "ws dispatch records the direct-http failure")
	require.Equal(t, tracing.Acked, b.row(ff2.Nonce).Status)
}

func TestPolicyDenyIsRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mallory := b.register("mallory@evil.beam.directory")
	bob := b.register("bob")
	f := b.frame(mallory, bob.id, "task.delegate", `{}`)
	status, body := b.send(f)
	require.Equal(t, http.StatusForbidden, status, string(body))
	code, _ := errBody(t, body)
	require.Equal(t, CodeForbidden, code)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Failed}, b.states(f.Nonce))
	require.Equal(t, CodeForbidden, b.row(f.Nonce).ErrorCode)
	// The cached failure answers a replay with the same status.
	status, _ = b.send(f)
	require.Equal(t, http.StatusForbidden, status)
}

// An unknown recipient is UNKNOWN_AGENT; when its domain is not the
// directory's own the error names the fix, pinning its directory.
func TestUnknownRecipientIsUnknownAgent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		domain, to string
		pin        bool
	}{
		{"", "nobody@elsewhere.beam.directory", false}, // beam.directory serves every org
		{"acme.beam.directory", "nobody@other.beam.directory", true},
	} {
		b := setup(t, func(o *setupOpts) { o.domain = tc.domain })
		alice := b.register("alice")
		status, body := b.send(b.frame(alice, tc.to, "task.delegate", `{}`))
		require.Equal(t, http.StatusNotFound, status)
		code, _ := errBody(t, body)
		require.Equal(t, codeUnknownAgent, code)
		require.Contains(t, string(body), "not registered here and no pinned peer serves its domain")
		const fix = "federation does not forward through intermediate directories: pin its directory as a peer"
		if tc.pin {
			require.Contains(t, string(body), fix, tc.to)
		} else {
			require.NotContains(t, string(body), fix, "the directory serves %s itself", tc.to)
		}
	}
}

func TestBadFramesOverHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob)

	check := func(name string, status int, body []byte, wantStatus int, wantCode string) {
		t.Helper()
		require.Equal(t, wantStatus, status, "%s: %s", name, body)
		code, _ := errBody(t, body)
		require.Equal(t, wantCode, code, name)
	}

	// Bad signature: rejected and not recorded under the nonce.
	f := b.frame(alice, bob.id, "task.delegate", `{"n":1}`)
	forged := *f
	forged.Payload = json.RawMessage(`{"n":2}`)
	status, body := b.send(&forged)
	check("bad signature", status, body, http.StatusBadRequest, CodeInvalidIntent)
	require.False(t, b.hasRow(f.Nonce), "a forged frame must not burn the nonce")
	// The genuine frame with that nonce still goes through.
	out := b.sendAsync(f)
	intentFrame(t, bc.nextOf("intent"))
	bc.respond(b.clock, f.Nonce, true, `{}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, out).status)

	// Signed by someone else's key.
	mallory := b.register("mallory")
	imp := b.frame(alice, bob.id, "task.delegate", `{}`)
	require.NoError(t, wire.SignIntent(imp, mallory.priv))
	status, body = b.send(imp)
	check("wrong key", status, body, http.StatusBadRequest, CodeInvalidIntent)

	// Missing signature.
	unsigned := b.frame(alice, bob.id, "task.delegate", `{}`)
	unsigned.Signature = ""
	status, body = b.send(unsigned)
	check("unsigned", status, body, http.StatusBadRequest, CodeInvalidIntent)

	// Unknown sender.
	_, ghostPriv, err := wire.GenerateKey()
	require.NoError(t, err)
	ghost := wire.NewIntentFrame("ghost@acme.beam.directory", bob.id, "task.delegate", nil, b.clock.Now())
	require.NoError(t, wire.SignIntent(ghost, ghostPriv))
	status, body = b.send(ghost)
	check("unknown sender", status, body, http.StatusBadRequest, CodeInvalidIntent)

	// Stale timestamp: authentic, so recorded received → failed.
	stale := wire.NewIntentFrame(alice.id, bob.id, "task.delegate", nil, b.clock.Now().Add(-6*time.Minute))
	require.NoError(t, wire.SignIntent(stale, alice.priv))
	status, body = b.send(stale)
	check("stale", status, body, http.StatusBadRequest, CodeInvalidIntent)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Failed}, b.states(stale.Nonce))
	require.Equal(t, codeBadRequest, b.row(stale.Nonce).ErrorCode)

	// Oversized: the delivered frame would exceed 4096 bytes.
	big := b.frame(alice, bob.id, "task.delegate", `{"blob":"`+strings.Repeat("x", 4000)+`"}`)
	status, body = b.send(big)
	check("oversized", status, body, http.StatusRequestEntityTooLarge, codeFrameTooLarge)
	require.Equal(t, codeFrameTooLarge, b.row(big.Nonce).ErrorCode)

	// Malformed JSON, wrong field types, a non-object, a huge body.
	status, body = b.postRaw([]byte(`{"intent":`))
	check("malformed", status, body, http.StatusBadRequest, codeInvalidJSON)
	status, body = b.postRaw([]byte(`{"v":"1","intent":7,"from":"a","to":"b","payload":{},"nonce":"n","timestamp":"t"}`))
	check("wrong types", status, body, http.StatusBadRequest, CodeInvalidIntent)
	status, body = b.postRaw([]byte(`{"v":"1","intent":"x","from":"a","to":"b","payload":[1],"nonce":"n","timestamp":"t"}`))
	check("array payload", status, body, http.StatusBadRequest, CodeInvalidIntent)
	status, body = b.postRaw([]byte(`[1,2,3]`))
	check("array", status, body, http.StatusBadRequest, CodeInvalidIntent)
	status, body = b.postRaw([]byte(`{"blob":"` + strings.Repeat("y", 70<<10) + `"}`))
	check("huge body", status, body, http.StatusRequestEntityTooLarge, codePayloadTooLarge)
}

func TestStatsRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice := b.register("alice")
	b.register("bob")
	b.connect(alice)
	status, _ := b.send(b.frame(alice, registry.EchoBeamID, "agent.ping", `{}`))
	require.Equal(t, http.StatusOK, status)

	get := func(path string) map[string]any {
		resp, err := http.Get(b.srv.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var v map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
		return v
	}
	s := get("/stats")
	require.EqualValues(t, 2, s["agents"])
	require.EqualValues(t, 1, s["intentsProcessed"])
	require.EqualValues(t, 1, s["connectedAgents"])
	require.Contains(t, s, "uptime")
	require.Contains(t, s, "version")
	a := get("/agents/stats")
	require.EqualValues(t, 2, a["total_agents"])
	require.EqualValues(t, 0, a["verified_agents"])
	require.EqualValues(t, 1, a["intents_processed"])
	require.Contains(t, a, "avg_response_time_ms")
}

// TestRelayVerifiesUnlessVouched relays frames through Relay itself: an
// unsigned frame is refused with zero options, a tampered signature is
// refused even when a peer vouches, and only VouchedByPeer admits an
// unsigned one.
func TestRelayVerifiesUnlessVouched(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ws := b.connect(bob)
	ctx := context.Background()

	unsigned := b.frame(alice, bob.id, "task", `{"n":1}`)
	unsigned.Signature = ""
	_, rerr := b.dir.Relay(ctx, unsigned, RelayOptions{})
	require.NotNil(t, rerr)
	require.Equal(t, CodeInvalidIntent, rerr.Code)
	require.Contains(t, rerr.Message, "Signature required")

	tampered := b.frame(alice, bob.id, "task", `{"n":2}`)
	tampered.Signature = b.frame(alice, bob.id, "task", `{"n":3}`).Signature
	_, rerr = b.dir.Relay(ctx, tampered, RelayOptions{}.VouchedByPeer("peer.beam.directory"))
	require.NotNil(t, rerr)
	require.Contains(t, rerr.Message, "Signature verification failed")

	vouched := b.frame(alice, bob.id, "task", `{"n":4}`)
	vouched.Signature = ""
	done := make(chan *RelayError, 1)
	go func() {
		_, rerr := b.dir.Relay(ctx, vouched, RelayOptions{}.VouchedByPeer("peer.beam.directory"))
		done <- rerr
	}()
	got, err := wire.DecodeIntentFrame(ws.nextOf("intent").Frame)
	require.NoError(t, err)
	require.Equal(t, vouched.Nonce, got.Nonce)
	ws.respond(b.clock, got.Nonce, true, `{}`)
	require.Nil(t, <-done)
}

// TestRotatedKeyFrameSaysKeyIsRevoked: a frame signed with a key the sender
// rotated out is refused (INVALID_INTENT) with a message that says the key
// is revoked and what to use instead; a frame signed with a key the agent
// never had says it does not verify with the current key.
func TestRotatedKeyFrameSaysKeyIsRevoked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ws := b.connect(bob)
	newPub, newPriv, err := wire.GenerateKey()
	require.NoError(t, err)
	body, err := json.Marshal(map[string]string{"newPublicKey": wire.EncodePublicKey(newPub)})
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/agents/"+alice.id+"/keys/rotate", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+alice.apiKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, string(out))

	status, raw := b.send(b.frame(alice, bob.id, "task", `{"n":1}`))
	require.Equal(t, http.StatusBadRequest, status, string(raw))
	code, msg := errBody(t, raw)
	require.Equal(t, CodeInvalidIntent, code)
	require.Contains(t, msg, "signed with a revoked key of "+alice.id)
	require.Contains(t, msg, "use the identity file that holds it")

	_, strangerPriv, err := wire.GenerateKey()
	require.NoError(t, err)
	status, raw = b.send(b.frame(&agent{id: alice.id, priv: strangerPriv}, bob.id, "task", `{"n":2}`))
	require.Equal(t, http.StatusBadRequest, status, string(raw))
	code, msg = errBody(t, raw)
	require.Equal(t, CodeInvalidIntent, code)
	require.Contains(t, msg, "does not verify with "+alice.id+"'s current key")

	current := b.frame(&agent{id: alice.id, priv: newPriv}, bob.id, "task", `{"n":3}`)
	done := b.sendAsync(current)
	intentFrame(t, ws.nextOf("intent"))
	ws.respond(b.clock, current.Nonce, true, `{}`)
	require.Equal(t, http.StatusOK, waitHTTP(t, done).status, "the current key signs")
}
