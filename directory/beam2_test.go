package directory

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"

	"github.com/beamdir/beam/internal/testclock"
)

// jwsOf signs f as a beam/2 intent by a.
func jwsOf(t *testing.T, f *wire.IntentFrame, a *agent) string {
	t.Helper()
	tok, err := wire.SignIntentJWS(f, a.priv)
	require.NoError(t, err)
	return tok
}

// unsignedFrame builds an intent without a beam/1 signature.
func (b *testBundle) unsignedFrame(a *agent, to, intent, payload string) *wire.IntentFrame {
	return wire.NewIntentFrame(a.id, to, intent, json.RawMessage(payload), b.clock.Now())
}

// postJOSE posts token as application/jose and returns status, body and
// the result JWS header.
func (b *testBundle) postJOSE(token string) (int, []byte, string) {
	b.t.Helper()
	resp, err := http.Post(b.srv.URL+"/intents/send", contentTypeJOSE, bytes.NewReader([]byte(token)))
	require.NoError(b.t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, data, resp.Header.Get(wire.HeaderResultJWS)
}

// connectBeam2 attaches a announcing beam/2 and checks the confirmation.
func (b *testBundle) connectBeam2(a *agent) *wsClient {
	b.t.Helper()
	c, err := b.dial("beamId="+url.QueryEscape(a.id)+"&apiKey="+url.QueryEscape(a.apiKey)+"&protocol=beam/2", true)
	require.NoError(b.t, err)
	c.a = a
	m := c.nextOf("connected")
	var v struct {
		Protocols []string `json:"protocols"`
	}
	require.NoError(b.t, json.Unmarshal(m.raw, &v))
	require.Equal(b.t, []string{protocolBeam1, ProtocolBeam2}, v.Protocols)
	require.Eventually(b.t, func() bool { return b.dir.Online(a.id) }, 5e9, 5e6)
	return c
}

// beam2Delivery checks a delivered beam/2 intent: the original token
// verbatim, and the frame inside it.
func beam2Delivery(t *testing.T, m wsMsg, token string) *wire.IntentFrame {
	t.Helper()
	require.Equal(t, "intent", m.Type, string(m.raw))
	var v struct {
		JWS string `json:"jws"`
	}
	require.NoError(t, json.Unmarshal(m.raw, &v))
	require.Equal(t, token, v.JWS)
	pub, err := wire.ParsePublicKey(m.SenderPublicKey)
	require.NoError(t, err)
	f, err := wire.DecodeIntentJWS(v.JWS, func(string) (ed25519.PublicKey, error) { return pub, nil })
	require.NoError(t, err)
	return f
}

// respondJWS answers nonce with a result JWS signed by key (kid = kid).
func (c *wsClient) respondJWS(clock *testclock.Clock, nonce, payload string, kid string, key *agent) (string, []byte) {
	c.t.Helper()
	frame, err := wire.Result{Success: true, Nonce: nonce, Payload: json.RawMessage(payload)}.Build(clock.Now(), nil)
	require.NoError(c.t, err)
	tok, err := wire.SignJWS(wire.TypResultJWS, frame, kid, key.priv)
	require.NoError(c.t, err)
	c.write(map[string]string{"type": "result", "jws": tok})
	return tok, frame
}

func TestBeam2HTTPToBeam2Recipient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connectBeam2(bob)

	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{"n":1}`)
	token := jwsOf(t, f, alice)
	ch := make(chan [3]any, 1)
	go func() {
		st, body, hdr := b.postJOSE(token)
		ch <- [3]any{st, body, hdr}
	}()
	got := beam2Delivery(t, bc.next(), token)
	require.Equal(t, f.Nonce, got.Nonce)
	resTok, frame := bc.respondJWS(b.clock, f.Nonce, `{"pong":2}`, bob.id, bob)

	out := <-ch
	require.Equal(t, http.StatusOK, out[0], string(out[1].([]byte)))
	require.JSONEq(t, string(frame), string(out[1].([]byte)))
	require.Equal(t, resTok, out[2])

	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Delivered, tracing.Acked}, b.states(f.Nonce))
	evs, err := b.log.Trace(context.Background(), f.Nonce)
	require.NoError(t, err)
	require.Equal(t, ProtocolBeam2, evs[0].Details.Extra["protocol"])
	require.Equal(t, token, evs[0].Details.Extra["jws"])
	ack := evs[len(evs)-1]
	require.Equal(t, resTok, ack.Details.Extra["resultJWS"])
	require.JSONEq(t, string(frame), string(ack.Details.Result))

	// The JSON body form {"jws": …} is accepted too (here: the echo).
	f2 := b.unsignedFrame(alice, "echo@beam.directory", "agent.ping", `{}`)
	raw, _ := json.Marshal(map[string]string{"jws": jwsOf(t, f2, alice)})
	st, body := b.postRaw(raw)
	require.Equal(t, http.StatusOK, st, string(body))
	require.True(t, resultOf(t, body).Success)
}

func TestBeam2WebSocketToBeam2Recipient(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac := b.connectBeam2(alice)
	bc := b.connectBeam2(bob)

	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{"n":1}`)
	token := jwsOf(t, f, alice)
	ac.write(map[string]string{"type": "intent", "jws": token})
	beam2Delivery(t, bc.next(), token)
	resTok, frame := bc.respondJWS(b.clock, f.Nonce, `{"pong":2}`, bob.id, bob)

	m := ac.nextOf("result")
	require.JSONEq(t, string(frame), string(m.Frame))
	var v struct {
		JWS string `json:"jws"`
	}
	require.NoError(t, json.Unmarshal(m.raw, &v))
	require.Equal(t, resTok, v.JWS)
	require.Equal(t, tracing.Acked, b.row(f.Nonce).Status)
}

func TestBeam2ToBeam1RecipientRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	bc := b.connect(bob) // no protocol=beam/2
	ac := b.connect(alice)

	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{}`)
	st, body, _ := b.postJOSE(jwsOf(t, f, alice))
	require.Equal(t, http.StatusBadRequest, st)
	code, msg := errBody(t, body)
	require.Equal(t, codeUnsupportedProtocol, code)
	require.Contains(t, msg, "beam/1 only")
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Failed}, b.states(f.Nonce))
	require.Equal(t, codeUnsupportedProtocol, b.row(f.Nonce).ErrorCode)

	// Over WebSocket: an error message, then the failure result.
	f2 := b.unsignedFrame(alice, bob.id, "agent.ping", `{}`)
	ac.write(map[string]string{"type": "intent", "jws": jwsOf(t, f2, alice)})
	e := ac.nextOf("error")
	require.Equal(t, codeUnsupportedProtocol, e.ErrorCode)
	require.Equal(t, f2.Nonce, e.Nonce)
	require.False(t, resultOf(t, ac.nextOf("result").Frame).Success)

	// bob never saw either: the first thing he gets is this beam/1 intent.
	f3 := b.frame(alice, bob.id, "agent.ping", `{}`)
	ac.sendIntent(f3)
	require.Equal(t, f3.Nonce, intentFrame(t, bc.next()).Nonce)
}

func TestBeam2BadTokensRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, mallory := b.register("alice"), b.register("mallory")
	b.connectBeam2(b.register("bob"))
	bobID := "bob@acme.beam.directory"

	hs, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")},
		(&jose.SignerOptions{}).WithType(wire.TypIntentJWS).WithHeader("kid", alice.id))
	require.NoError(t, err)
	embed, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA, Key: mallory.priv},
		(&jose.SignerOptions{EmbedJWK: true}).WithType(wire.TypIntentJWS))
	require.NoError(t, err)
	sign := func(s jose.Signer, payload []byte) string {
		obj, err := s.Sign(payload)
		require.NoError(t, err)
		tok, err := obj.CompactSerialize()
		require.NoError(t, err)
		return tok
	}
	b64 := base64.RawURLEncoding.EncodeToString
	cases := map[string]func(f *wire.IntentFrame) string{
		"garbage":   func(*wire.IntentFrame) string { return "not.a.jws" },
		"two parts": func(*wire.IntentFrame) string { return "abc.def" },
		"wrong key": func(f *wire.IntentFrame) string {
			tok, err := wire.SignJWS(wire.TypIntentJWS, frameJSON(t, f), alice.id, mallory.priv)
			require.NoError(t, err)
			return tok
		},
		"kid is not from": func(f *wire.IntentFrame) string {
			tok, err := wire.SignJWS(wire.TypIntentJWS, frameJSON(t, f), mallory.id, mallory.priv)
			require.NoError(t, err)
			return tok
		},
		"wrong typ": func(f *wire.IntentFrame) string {
			tok, err := wire.SignJWS(wire.TypResultJWS, frameJSON(t, f), alice.id, alice.priv)
			require.NoError(t, err)
			return tok
		},
		"alg none": func(f *wire.IntentFrame) string {
			h := b64([]byte(`{"alg":"none","typ":"beam-intent+jws","kid":"` + alice.id + `"}`))
			return h + "." + b64(frameJSON(t, f)) + "."
		},
		"HS256":        func(f *wire.IntentFrame) string { return sign(hs, frameJSON(t, f)) },
		"embedded jwk": func(f *wire.IntentFrame) string { return sign(embed, frameJSON(t, f)) },
		"not a frame": func(*wire.IntentFrame) string {
			tok, err := wire.SignJWS(wire.TypIntentJWS, []byte(`{"hello":1}`), alice.id, alice.priv)
			require.NoError(t, err)
			return tok
		},
	}
	for name, mk := range cases {
		f := b.unsignedFrame(alice, bobID, "agent.ping", `{}`)
		st, body, _ := b.postJOSE(mk(f))
		require.Equal(t, http.StatusBadRequest, st, "%s: %s", name, body)
		code, msg := errBody(t, body)
		require.Equal(t, CodeInvalidIntent, code, name)
		require.NotEmpty(t, msg, name)
		require.False(t, b.hasRow(f.Nonce), "%s: a refused token must not burn the nonce", name)
	}
}

func TestBeam2ForgedResultRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob, mallory := b.register("alice"), b.register("bob"), b.register("mallory")
	bc := b.connectBeam2(bob)
	mc := b.connectBeam2(mallory)
	ac := b.connect(alice)

	f := b.frame(alice, bob.id, "agent.ping", `{}`)
	ac.sendIntent(f)
	intentFrame(t, bc.next())

	// bob's session, but not bob's key.
	bc.respondJWS(b.clock, f.Nonce, `{"forged":true}`, bob.id, mallory)
	e := bc.nextOf("error")
	require.Equal(t, wire.CodeInvalidResult, e.ErrorCode)
	require.Equal(t, f.Nonce, e.Nonce)
	// kid naming someone else than the session's agent.
	bc.respondJWS(b.clock, f.Nonce, `{"forged":true}`, mallory.id, mallory)
	require.Equal(t, wire.CodeInvalidResult, bc.nextOf("error").ErrorCode)
	// mallory's genuine JWS for an intent that is not hers.
	mc.respondJWS(b.clock, f.Nonce, `{"forged":true}`, mallory.id, mallory)
	require.Equal(t, CodeForbidden, mc.nextOf("error").ErrorCode)
	// None of them settled it: still in flight (delivered may not be
	// committed yet, since it is recorded in batches).
	require.Contains(t, []tracing.State{tracing.Dispatched, tracing.Delivered}, b.row(f.Nonce).Status)

	// The real result still settles it; a beam/1 sender gets the frame
	// (and the JWS alongside).
	tok, frame := bc.respondJWS(b.clock, f.Nonce, `{"real":true}`, bob.id, bob)
	m := ac.nextOf("result")
	require.JSONEq(t, string(frame), string(m.Frame))
	require.Equal(t, tracing.Acked, b.row(f.Nonce).Status)
	require.Equal(t, tok, lastEvent(t, b, f.Nonce).Details.Extra["resultJWS"])
}
