package federation

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/directory/attest"
	"github.com/beamdir/beam/internal/apitest"
	"github.com/beamdir/beam/tracing"
)

// attestingPair starts alpha and beta, peered, beta with an attester the
// test knows.
func attestingPair(t *testing.T) (alpha, beta *fedDir, betaAtt *attest.Attester) {
	t.Helper()
	betaAtt, err := attest.Ephemeral("beta.beam.directory")
	require.NoError(t, err)
	alpha = startDir(t, "alpha.beam.directory", "", "", nil)
	beta = startDir(t, "beta.beam.directory", "", "", nil, func(c *directory.Config) { c.Attester = betaAtt })
	pin(t, alpha, beta)
	return alpha, beta, betaAtt
}

// TestVouchedFrameIsAttestedByTheTargetDirectory: an unsigned frame from
// an API-key session at alpha reaches b@beta vouched for by alpha; beta
// delivers it attested by its own key with auth "peer" and vouchedBy
// alpha, and records that on its dispatched event.
func TestVouchedFrameIsAttestedByTheTargetDirectory(t *testing.T) {
	t.Parallel()
	alpha, beta, betaAtt := attestingPair(t)

	b := beta.agent("b")
	got := make(chan *agents.Intent, 1)
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		got <- in
		return agents.Success(nil)
	})
	require.NoError(t, b.Connect(context.Background()))

	a := apitest.Register(t, alpha.srv.URL, "a@alpha.beam.directory", "a", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wsURL := "ws" + strings.TrimPrefix(alpha.srv.URL, "http") + "/ws?beamId=" + url.QueryEscape(a.ID) + "&apiKey=" + url.QueryEscape(a.APIKey)
	conn, _, err := websocket.Dial(ctx, wsURL, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.CloseNow() })
	_, _, err = conn.Read(ctx) // connected
	require.NoError(t, err)

	f := wire.NewIntentFrame(a.ID, "b@beta.beam.directory", "task", json.RawMessage(`{"n":1}`), time.Now())
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	require.NoError(t, conn.Write(ctx, websocket.MessageText, []byte(`{"type":"intent","frame":`+string(raw)+`}`)))

	var in *agents.Intent
	select {
	case in = <-got:
	case <-ctx.Done():
		t.Fatal("b's handler never ran")
	}
	require.NotNil(t, in.Attested)
	require.Equal(t, wire.AttestPeer, in.Attested.Auth)
	require.Equal(t, "alpha.beam.directory", in.Attested.VouchedBy)
	require.Equal(t, "beta.beam.directory", in.Attested.By)
	require.Equal(t, betaAtt.KeyID(), in.Attested.KeyID)

	// The sender hears the result.
	_, msg, err := conn.Read(ctx)
	require.NoError(t, err)
	var res struct {
		Type  string          `json:"type"`
		Frame json.RawMessage `json:"frame"`
	}
	require.NoError(t, json.Unmarshal(msg, &res), string(msg))
	require.Equal(t, "result", res.Type, string(msg))
	rf, err := wire.DecodeResultFrame(res.Frame)
	require.NoError(t, err)
	require.True(t, rf.Success)

	var disp tracing.Event
	for _, ev := range beta.trace(f.Nonce) {
		if ev.State == tracing.Dispatched {
			disp = ev
		}
	}
	require.Equal(t, map[string]any{"by": "beta.beam.directory", "keyId": betaAtt.KeyID(), "auth": "peer",
		"vouchedBy": "alpha.beam.directory"}, disp.Details.Extra["attestation"])
}
