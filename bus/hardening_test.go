package bus

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
)

// A beam/2 JWS signed a year ago is refused by the bus as it is by
// /intents/send: one freshness rule for every entry path.
func TestBusRefusesStaleJWS(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a, b := tb.register("stale-a"), tb.register("stale-b")

	old := wire.NewIntentFrame(a.id, b.id, "task.run", json.RawMessage(`{"n":1}`), tb.clock.Now().Add(-365*24*time.Hour))
	tok, err := wire.SignIntentJWS(old, a.priv)
	require.NoError(t, err)
	status, body := tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": tok})
	require.Equal(t, http.StatusUnauthorized, status, body)
	require.Contains(t, body["error"], "5 minute window")
	_, found, err := tb.log.Intent(t.Context(), old.Nonce)
	require.NoError(t, err)
	require.False(t, found, "a stale frame must not be recorded")

	fresh := wire.NewIntentFrame(a.id, b.id, "task.run", json.RawMessage(`{"n":1}`), tb.clock.Now())
	tok, err = wire.SignIntentJWS(fresh, a.priv)
	require.NoError(t, err)
	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": tok})
	require.Less(t, status, 300, body)
}

// A signed frame whose payload names a key twice verifies (the signature
// covers JSON.parse's last-wins reading) but a first-wins recipient would
// read another amount: the bus refuses it, as a frame and as a whole body.
func TestBusRefusesDuplicateKeys(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	a, b := tb.register("dup-a"), tb.register("dup-b")

	f := wire.NewIntentFrame(a.id, b.id, "payment.send", json.RawMessage(`{"amount":1000}`), tb.clock.Now())
	require.NoError(t, wire.SignIntent(f, a.priv))
	signed, err := f.DeliveryJSON()
	require.NoError(t, err)
	dup := strings.Replace(string(signed), `{"amount":1000}`, `{"amount":1,"amount":1000}`, 1)
	require.NotEqual(t, string(signed), dup)

	status, body := tb.call(http.MethodPost, "/v1/beam/send", "", "", `{"frame":`+dup+`}`)
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Contains(t, body["error"], "duplicate JSON object key")

	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", "", dup)
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Contains(t, body["error"], "duplicate JSON object key")

	// The same inside a beam/2 JWS: the signature covers the bytes, but
	// readers would still disagree.
	tok, err := wire.SignJWS(wire.TypIntentJWS, []byte(dup), a.id, a.priv)
	require.NoError(t, err)
	status, body = tb.call(http.MethodPost, "/v1/beam/send", "", "", map[string]any{"frame": tok})
	require.Equal(t, http.StatusBadRequest, status, body)
	require.Contains(t, body["error"], "duplicate JSON object key")

	status, body = tb.sendAs(a, b.id, "payment.send", json.RawMessage(`{"amount":1,"amount":1000}`), nil)
	require.Equal(t, http.StatusBadRequest, status, body)
	_, found, err := tb.log.Intent(t.Context(), f.Nonce)
	require.NoError(t, err)
	require.False(t, found)
}

// After DELETE /agents/bob, whoever registers bob next (once an operator
// released the name) reads none of the old bob's history and receives none
// of the messages queued for him.
func TestDeletedRecipientInheritsNothing(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	alice, bob := tb.register("alice"), tb.register("bob")
	status, body := tb.sendAs(alice, bob.id, "secret.memo", map[string]any{"text": "for the old bob"}, nil)
	require.Less(t, status, 300, body)
	id, _ := body["message_id"].(string)
	nonce, _ := body["nonce"].(string)
	require.NotEmpty(t, id, body)
	require.NotEmpty(t, nonce, body)
	status, body = tb.call(http.MethodGet, "/v1/beam/history", bob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 1, body["count"])

	status, _ = tb.call(http.MethodDelete, "/agents/"+bob.id, bob.apiKey, "", nil)
	require.Equal(t, http.StatusNoContent, status)
	tb.clock.Advance(time.Second)
	status, body = tb.call(http.MethodPost, "/agents/register", "", "", map[string]any{
		"beamId": bob.id, "displayName": "New bob", "publicKey": wire.EncodePublicKey(alice.pub)})
	require.Equal(t, http.StatusConflict, status, body)
	require.Equal(t, "BEAM_ID_RETIRED", body["errorCode"])
	status, _ = tb.call(http.MethodPost, "/agents/"+bob.id+"/release", "", testOperatorToken, nil)
	require.Equal(t, http.StatusNoContent, status)
	newBob := tb.register("bob")

	status, body = tb.call(http.MethodGet, "/v1/beam/history", newBob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 0, body["count"], body)
	status, body = tb.call(http.MethodGet, "/v1/beam/poll?agent="+newBob.id+"&status=queued", newBob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 0, body["count"], body)
	status, body = tb.call(http.MethodGet, "/v1/beam/poll?agent="+newBob.id+"&claim=true&lease=30", newBob.apiKey, "", nil)
	require.Equal(t, http.StatusOK, status, body)
	require.EqualValues(t, 0, body["count"], body)
	status, body = tb.call(http.MethodGet, "/v1/beam/messages/"+id, newBob.apiKey, "", nil)
	require.Equal(t, http.StatusForbidden, status, body)

	// The worker does not hand the old message to the new bob either.
	tb.clock.Advance(time.Hour)
	tb.tick()
	require.NotEqual(t, "dispatched", string(tb.message(nonce).Status))
}
