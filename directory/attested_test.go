package directory

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// attestationOf returns the attestation member of a delivered message.
func attestationOf(t *testing.T, m wsMsg) *wire.Attestation {
	t.Helper()
	var v struct {
		Attestation *wire.Attestation `json:"attestation"`
	}
	require.NoError(t, json.Unmarshal(m.raw, &v))
	return v.Attestation
}

// dispatchedAttestation returns details.attestation of nonce's dispatched event.
func (b *testBundle) dispatchedAttestation(nonce string) any {
	b.t.Helper()
	evs, err := b.log.Trace(b.t.Context(), nonce)
	require.NoError(b.t, err)
	for _, ev := range evs {
		if ev.State == tracing.Dispatched {
			return ev.Details.Extra["attestation"]
		}
	}
	require.FailNow(b.t, "no dispatched event", "nonce %s", nonce)
	return nil
}

// TestAPIKeySessionFramesAreAttested: an unsigned frame from a session
// opened with the agent's API key reaches the recipient signed by the
// directory's attestation key, with that key as senderPublicKey and the
// attestation member; a sender-signed frame travels verbatim.
func TestAPIKeySessionFramesAreAttested(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	ac, bc := b.connect(alice), b.connect(bob)
	att := b.dir.Attester()

	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{"m":"grüße <&>"}`)
	ac.sendIntent(f)
	m := bc.nextOf("intent")
	got, err := wire.DecodeIntentFrame(m.Frame)
	require.NoError(t, err)
	require.Equal(t, att.PublicKey(), m.SenderPublicKey)
	key, err := wire.ParsePublicKey(m.SenderPublicKey)
	require.NoError(t, err)
	require.NoError(t, wire.VerifyAttested(got, key))
	require.Error(t, got.Verify(alice.pub))
	require.Equal(t, &wire.Attestation{By: "beam.directory", KeyID: att.KeyID(), Auth: wire.AttestAPIKey}, attestationOf(t, m))
	require.Equal(t, map[string]any{"by": "beam.directory", "keyId": att.KeyID(), "auth": "api_key"},
		b.dispatchedAttestation(f.Nonce))
	bc.respond(b.clock, f.Nonce, true, `{}`)
	require.Equal(t, "result", ac.nextOf("result").Type)

	signed := b.frame(alice, bob.id, "agent.ping", `{"n":2}`)
	ac.sendIntent(signed)
	m = bc.nextOf("intent")
	require.Nil(t, attestationOf(t, m))
	require.Equal(t, wire.EncodePublicKey(alice.pub), m.SenderPublicKey)
	require.Equal(t, signed.Signature, intentFrame(t, m).Signature)
	require.Nil(t, b.dispatchedAttestation(signed.Nonce))

	// The key is published at the well-known route.
	resp, err := http.Get(b.srv.URL + wire.AttestationKeysPath)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	_, keys, err := wire.DecodeAttestationKeys(raw)
	require.NoError(t, err)
	require.True(t, key.Equal(keys[att.KeyID()]))
}

// TestDirectHTTPDeliveryOfAnAttestedFrame: the endpoint gets the
// attestation signature in X-Beam-Signature, the key and the member in
// their own headers, and can verify the frame it rebuilds from the body.
func TestDirectHTTPDeliveryOfAnAttestedFrame(t *testing.T) {
	t.Parallel()
	var hdr atomic.Value
	var body atomic.Value
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		hdr.Store(r.Header.Clone())
		body.Store(raw)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"success":true}`))
	}))
	t.Cleanup(endpoint.Close)
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.HTTPClient = endpoint.Client() } })
	alice := b.register("alice")
	hook := b.register("hook", map[string]any{"httpEndpoint": endpoint.URL + "/beam"})
	ac := b.connect(alice)

	f := b.unsignedFrame(alice, hook.id, "task.delegate", `{"job":"x"}`)
	ac.sendIntent(f)
	require.Equal(t, "result", ac.nextOf("result").Type)
	h := hdr.Load().(http.Header)
	var member wire.Attestation
	require.NoError(t, json.Unmarshal([]byte(h.Get(wire.HeaderAttestation)), &member))
	require.Equal(t, wire.AttestAPIKey, member.Auth)
	require.Equal(t, b.dir.Attester().KeyID(), member.KeyID)
	key, err := wire.ParsePublicKey(h.Get(wire.HeaderAttestationKey))
	require.NoError(t, err)

	// Rebuild the frame as a receiver would: the body plus its own "to".
	var in map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body.Load().([]byte), &in))
	in["to"], _ = json.Marshal(hook.id)
	in["signature"], _ = json.Marshal(h.Get("X-Beam-Signature"))
	rebuilt, err := json.Marshal(in)
	require.NoError(t, err)
	rf, err := wire.DecodeIntentFrame(rebuilt)
	require.NoError(t, err)
	require.NoError(t, wire.VerifyAttested(rf, key))
	require.NotNil(t, b.dispatchedAttestation(f.Nonce))
}

// TestRecipientRequiringSenderSignaturesRefusesAttestedFrames: the relay
// refuses an unsigned frame to an agent with requireSenderSignatures, with
// a 403 naming the setting, and still delivers a sender-signed one.
func TestRecipientRequiringSenderSignaturesRefusesAttestedFrames(t *testing.T) {
	t.Parallel()
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	req, err := http.NewRequest(http.MethodPatch, b.srv.URL+"/agents/"+bob.id+"/config",
		bytes.NewReader([]byte(`{"requireSenderSignatures":true}`)))
	require.NoError(t, err)
	req.Header.Set("x-api-key", bob.apiKey)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	ac, bc := b.connect(alice), b.connect(bob)

	f := b.unsignedFrame(alice, bob.id, "agent.ping", `{}`)
	ac.sendIntent(f)
	e := ac.nextOf("error")
	require.Equal(t, CodeSenderSignatureRequired, e.ErrorCode)
	require.Contains(t, e.Message, "requireSenderSignatures")
	require.Equal(t, []tracing.State{tracing.Received, tracing.Failed}, b.states(f.Nonce))
	require.Equal(t, http.StatusForbidden, httpStatus(CodeSenderSignatureRequired))

	signed := b.frame(alice, bob.id, "agent.ping", `{}`)
	ac.sendIntent(signed)
	require.Equal(t, signed.Nonce, intentFrame(t, bc.nextOf("intent")).Nonce)
}
