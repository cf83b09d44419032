package federation

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// TestBeam2AcrossFederation: a beam/2 intent sent at alpha to a beam/2
// agent of beta reaches it with the sender's JWS verbatim (the SDK verifies
// it against the sender's key, as for a local sender), and the agent's
// result JWS comes back to the sender intact, verifiable with the agent's
// key. Both traces record the tokens; a JWS that does not verify is
// refused and never delivered.
func TestBeam2AcrossFederation(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	bID, err := agents.GenerateIdentity("b@beta.beam.directory")
	require.NoError(t, err)
	b, err := agents.NewClient(agents.ClientConfig{DirectoryURL: beta.srv.URL, Identity: bID, Protocol: agents.ProtocolBeam2,
		ReconnectMin: 50 * time.Millisecond, ReconnectMax: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	_, err = b.Register(ctx, "b", nil)
	require.NoError(t, err)
	got := make(chan *agents.Intent, 2)
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(map[string]any{"heard": in.Nonce})
	})
	require.NoError(t, b.Connect(ctx))
	_, aPriv := alpha.registerKey("a")

	send := func(token string) (int, http.Header, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, alpha.srv.URL+"/intents/send", strings.NewReader(token))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/jose")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header, string(body)
	}

	f := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{"n":1}`), time.Now())
	token, err := wire.SignIntentJWS(f, aPriv)
	require.NoError(t, err)
	status, hdr, body := send(token)
	require.Equal(t, http.StatusOK, status, body)

	in := <-got
	require.Equal(t, token, in.JWS, "the recipient gets the sender's JWS verbatim")
	require.Nil(t, in.Attested, "a JWS is the sender's own signature, not an attestation")

	resultJWS := hdr.Get(wire.HeaderResultJWS)
	require.NotEmpty(t, resultJWS, "the result JWS comes back to the sender")
	rf, _, err := wire.DecodeResultJWS(resultJWS, func(kid string) (ed25519.PublicKey, error) {
		require.Equal(t, "b@beta.beam.directory", kid)
		return bID.Public, nil
	})
	require.NoError(t, err, "verifies with the recipient's own key")
	require.True(t, rf.Success)
	require.Equal(t, f.Nonce, rf.Nonce)
	require.JSONEq(t, body, string(rf.Raw))

	btr := beta.trace(f.Nonce)
	require.Equal(t, token, btr[0].Details.Extra["jws"])
	require.Equal(t, "beam/2", btr[0].Details.Extra["protocol"])
	require.Equal(t, resultJWS, eventOf(t, btr, tracing.Acked).Details.Extra["resultJWS"])
	require.Equal(t, resultJWS, eventOf(t, alpha.trace(f.Nonce), tracing.Acked).Details.Extra["resultJWS"])

	// The Go SDK speaking beam/2 gets the same: it verifies the result JWS
	// against the key its own directory looks up for the peer's agent.
	sID, err := agents.GenerateIdentity("s@alpha.beam.directory")
	require.NoError(t, err)
	sdk, err := agents.NewClient(agents.ClientConfig{DirectoryURL: alpha.srv.URL, Identity: sID, Protocol: agents.ProtocolBeam2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sdk.Close() })
	_, err = sdk.Register(ctx, "s", nil)
	require.NoError(t, err)
	sres, err := sdk.Send(ctx, "b@beta.beam.directory", "task", map[string]any{"n": 2})
	require.NoError(t, err)
	require.True(t, sres.Success)
	in = <-got
	require.NotEmpty(t, in.JWS)
	look, err := sdk.Lookup(ctx, "b@beta.beam.directory")
	require.NoError(t, err)
	require.Equal(t, wire.EncodePublicKey(bID.Public), look.PublicKey)
	_, err = sdk.Lookup(ctx, "nobody@beta.beam.directory")
	require.ErrorContains(t, err, "NOT_FOUND", "an agent the peer does not know is still not found")

	// A JWS signed with another key than a's is refused.
	_, rogue, err := wire.GenerateKey()
	require.NoError(t, err)
	forged := wire.NewIntentFrame("a@alpha.beam.directory", "b@beta.beam.directory", "task", json.RawMessage(`{}`), time.Now())
	bad, err := wire.SignIntentJWS(forged, rogue)
	require.NoError(t, err)
	status, _, body = send(bad)
	require.NotEqual(t, http.StatusOK, status, body)
	require.Contains(t, body, "JWS verification failed")
	select {
	case in := <-got:
		t.Fatalf("a forged JWS reached b: %s", in.Nonce)
	default:
	}
}
