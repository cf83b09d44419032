package bus

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// requireSignatures turns on a's requireSenderSignatures setting.
func (tb *testBundle) requireSignatures(a *agent, on bool) {
	tb.t.Helper()
	status, body := tb.call(http.MethodPatch, "/agents/"+a.id+"/config", a.apiKey, "",
		map[string]any{"requireSenderSignatures": on})
	require.Equal(tb.t, http.StatusOK, status, "%v", body)
}

// requireRefusedUndelivered requires that m, the message of nonce, was
// dead-lettered by the recipient's policy with code and an error that says
// why (why), and that it was never handed to the recipient.
func (tb *testBundle) requireRefusedUndelivered(m tracing.MessageRow, nonce, code, why string) {
	tb.t.Helper()
	require.Equal(tb.t, tracing.DeadLetter, m.Status)
	require.Contains(tb.t, m.Error, why)
	ir, _, err := tb.log.Intent(tb.t.Context(), nonce)
	require.NoError(tb.t, err)
	require.Equal(tb.t, code, ir.ErrorCode)
	require.NotContains(tb.t, tb.states(nonce), tracing.Dispatched, "never handed to the recipient")
}

// TestSendsToAnAgentRequiringSignatures: API-key, bus-key and beam/2 JWS
// sends are refused at send time with 403 SENDER_SIGNATURE_REQUIRED naming
// the setting, and nothing is recorded; a sender-signed frame is accepted
// and delivered verbatim.
func TestSendsToAnAgentRequiringSignatures(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	tb.requireSignatures(bob, true)
	bobWS := tb.connect(bob)

	jws, err := wire.SignIntentJWS(wire.NewIntentFrame(alice.id, bob.id, "x", nil, tb.clock.Now()), alice.priv)
	require.NoError(t, err)
	for name, send := range map[string]func() (int, map[string]any){
		"api key": func() (int, map[string]any) { return tb.sendAs(alice, bob.id, "x", nil, nil) },
		"bus key": func() (int, map[string]any) {
			return tb.call(http.MethodPost, "/v1/beam/send", "", testBusKey, map[string]any{"from": alice.id, "to": bob.id, "intent": "x"})
		},
		"jws": func() (int, map[string]any) {
			return tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": jws})
		},
	} {
		status, body := send()
		require.Equal(t, http.StatusForbidden, status, "%s: %v", name, body)
		require.Equal(t, directory.CodeSenderSignatureRequired, body["errorCode"], name)
		require.Contains(t, body["error"], "requireSenderSignatures", name)
	}
	status, hist := tb.call(http.MethodGet, "/v1/beam/history?agent="+bob.id, "", testBusKey, nil)
	require.Equal(t, http.StatusOK, status)
	require.EqualValues(t, 0, hist["count"], "refused sends are not recorded")

	f := wire.NewIntentFrame(alice.id, bob.id, "x", json.RawMessage(`{"n":1}`), tb.clock.Now())
	require.NoError(t, wire.SignIntent(f, alice.priv))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	status, body := tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": json.RawMessage(raw)})
	require.Equal(t, http.StatusCreated, status, "%v", body)
	msg, got := bobWS.nextIntent()
	require.Nil(t, msg.Attestation)
	require.Equal(t, f.Signature, got.Signature)
	require.NoError(t, got.Verify(alice.pub))
	_, hist = tb.call(http.MethodGet, "/v1/beam/history?agent="+bob.id, "", testBusKey, nil)
	require.EqualValues(t, 1, hist["count"])
}

// TestQueuedUnsignedMessageIsNotDeliveredAttestedAfterTheSettingTurnsOn: a
// message accepted while the recipient allowed attested frames, which the
// recipient then forbids, is dead-lettered with the setting's code rather
// than delivered.
func TestQueuedUnsignedMessageIsNotDeliveredAttestedAfterTheSettingTurnsOn(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "x", nil, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	nonce := nonceOf(t, body)
	tb.requireSignatures(bob, true)
	tb.connect(bob)
	tb.requireRefusedUndelivered(tb.waitStatus(nonce, tracing.DeadLetter), nonce, directory.CodeSenderSignatureRequired, "requireSenderSignatures")
}

// TestUnansweredAttemptIsNotASuccess: a recipient whose session takes the
// frame and never answers leaves the message delivered, and when the
// delivery timeout passes the attempt is recorded as unanswered, with the
// attempt and the session's protocol, never as acked.
func TestUnansweredAttemptIsNotASuccess(t *testing.T) {
	t.Parallel()
	tb := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.DeliveryTimeout = 200 * time.Millisecond } })
	alice, bob := tb.register("alice"), tb.register("bob")
	bobWS := tb.connect(bob)
	status, body := tb.sendAs(alice, bob.id, "x", nil, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	require.Equal(t, "delivered", body["status"], "the frame was handed to the session, nothing more")
	nonce := nonceOf(t, body)
	bobWS.nextIntent()
	m := tb.waitStatus(nonce, tracing.Queued)
	require.Contains(t, m.Error, "did not answer attempt 1")
	require.Contains(t, m.Error, "may have rejected the frame")
	trace, err := tb.log.Trace(t.Context(), nonce)
	require.NoError(t, err)
	last := trace[len(trace)-1]
	require.Equal(t, tracing.Queued, last.State)
	require.Equal(t, 1, last.Attempt)
	require.Equal(t, directory.CodeTimeout, last.Details.ErrorCode)
	require.Equal(t, map[string]any{"sessionProtocol": "beam/1", "sessionAuth": "api_key", "noAnswer": true}, last.Details.Extra)
	require.NotContains(t, tb.states(nonce), tracing.Acked)
}

// TestQueuedMessageObeysADenyRuleAddedBeforeDelivery: ATTACK — a sender
// queues a message for an offline recipient, which then denies it with an
// ACL rule. The send-time check passed; the delivery goes through the
// directory's one door, which applies the recipient's policy again, so the
// message is dead-lettered FORBIDDEN and never reaches the recipient.
func TestQueuedMessageObeysADenyRuleAddedBeforeDelivery(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "x", nil, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	nonce := nonceOf(t, body)
	status, body = tb.call(http.MethodPost, "/acl", bob.apiKey, "",
		map[string]any{"targetBeamId": bob.id, "allowedFrom": alice.id, "intentType": "*", "effect": "deny"})
	require.Equal(t, http.StatusCreated, status, "%v", body)
	bobWS := tb.connect(bob)
	m := tb.waitStatus(nonce, tracing.DeadLetter)
	require.Contains(t, m.Error, "ACL denied")
	ir, _, err := tb.log.Intent(t.Context(), nonce)
	require.NoError(t, err)
	require.Equal(t, directory.CodeForbidden, ir.ErrorCode)
	require.NotContains(t, tb.states(nonce), tracing.Delivered, "the frame reached the recipient")
	// The session got nothing: the next thing it reads is a later message
	// of another sender.
	carol := tb.register("carol")
	status, body = tb.sendAs(carol, bob.id, "y", nil, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	_, f := bobWS.nextIntent()
	require.Equal(t, nonceOf(t, body), f.Nonce)
}

// TestPolledMessageObeysADenyRuleAddedBeforeDelivery: ATTACK — the same
// queued message as in TestQueuedMessageObeysADenyRuleAddedBeforeDelivery,
// but the recipient takes its inbox by polling with a claim instead of a
// WebSocket. The poll path must apply the recipient's policy as the door
// does: the message is not handed out, and it ends FORBIDDEN.
func TestPolledMessageObeysADenyRuleAddedBeforeDelivery(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "x", map[string]any{"secret": "denied content"}, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	nonce := nonceOf(t, body)
	status, body = tb.call(http.MethodPost, "/acl", bob.apiKey, "",
		map[string]any{"targetBeamId": bob.id, "allowedFrom": alice.id, "intentType": "*", "effect": "deny"})
	require.Equal(t, http.StatusCreated, status, "%v", body)
	status, p := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true&lease=30", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, "%v", p)
	require.EqualValues(t, 0, p["count"], "a message from a denied sender was handed out by a poll: %v", p)
	tb.requireRefusedUndelivered(tb.message(nonce), nonce, directory.CodeForbidden, "ACL denied")
}

// TestPolledUnsignedMessageIsNotHandedOutAfterTheSettingTurnsOn: ATTACK —
// an API-key message queued while the recipient allowed attested frames,
// which the recipient then forbids, must not reach it by a poll claim
// either: it is dead-lettered SENDER_SIGNATURE_REQUIRED, as the WebSocket
// path does (TestQueuedUnsignedMessageIsNotDeliveredAttestedAfterTheSettingTurnsOn).
// A sender-signed message queued with it is still handed out.
func TestPolledUnsignedMessageIsNotHandedOutAfterTheSettingTurnsOn(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "x", map[string]any{"unsigned": true}, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	nonce := nonceOf(t, body)
	f := wire.NewIntentFrame(alice.id, bob.id, "x", json.RawMessage(`{"signed":true}`), tb.clock.Now())
	require.NoError(t, wire.SignIntent(f, alice.priv))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": json.RawMessage(raw)})
	require.Equal(t, http.StatusCreated, status, "%v", body)
	tb.requireSignatures(bob, true)
	status, p := tb.call(http.MethodGet, "/v1/beam/poll?agent="+bob.id+"&claim=true&lease=30", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, "%v", p)
	require.EqualValues(t, 1, p["count"], "only the signed message is handed out: %v", p)
	got := p["messages"].([]any)[0].(map[string]any)
	require.Equal(t, f.Nonce, got["nonce"])
	tb.requireRefusedUndelivered(tb.message(nonce), nonce, directory.CodeSenderSignatureRequired, "requireSenderSignatures")
}

// TestBusMessageNamedLikeAPipelineHopIsNoHop: ATTACK — an agent that
// requires sender signatures but accepts the directory's attested pipeline
// hops must not receive an attested bus message just because its sender
// named its intent like a hop ("mesh.envelope"). The message was queued
// before the recipient turned the requirement on; at delivery the door must
// judge it as the bus message it is, not as a pipeline hop.
func TestBusMessageNamedLikeAPipelineHopIsNoHop(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "mesh.envelope", map[string]any{"id": "forged", "route": map[string]any{}}, nil)
	require.Equal(t, http.StatusCreated, status, "%v", body)
	nonce := nonceOf(t, body)
	status, body = tb.call(http.MethodPatch, "/agents/"+bob.id+"/config", bob.apiKey, "",
		map[string]any{"requireSenderSignatures": true, "acceptAttestedPipelineHops": true})
	require.Equal(t, http.StatusOK, status, "%v", body)
	tb.connect(bob)
	m := tb.waitStatus(nonce, tracing.DeadLetter)
	require.Contains(t, m.Error, "requireSenderSignatures")
	require.NotContains(t, tb.states(nonce), tracing.Delivered, "an attested bus message reached a recipient that requires signatures")
}
