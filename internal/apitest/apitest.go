package apitest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/tracing"
)

// Agent is an agent registered by Register, with its keys.
type Agent struct {
	ID     string
	Pub    ed25519.PublicKey
	Priv   ed25519.PrivateKey
	APIKey string
}

// Register registers beamID at the directory serving baseURL with a fresh
// Ed25519 key (POST /agents/register, display name displayName, capability
// "test", plus the members of extra) and requires 201 with an API key.
func Register(t testing.TB, baseURL, beamID, displayName string, extra map[string]any) *Agent {
	t.Helper()
	pub, priv, err := wire.GenerateKey()
	require.NoError(t, err)
	body := map[string]any{"beamId": beamID, "displayName": displayName, "capabilities": []string{"test"},
		"publicKey": wire.EncodePublicKey(pub)}
	maps.Copy(body, extra)
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	resp, err := http.Post(baseURL+"/agents/register", "application/json", bytes.NewReader(raw))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, string(data))
	var out struct {
		APIKey string `json:"apiKey"`
	}
	require.NoError(t, json.Unmarshal(data, &out))
	require.NotEmpty(t, out.APIKey)
	return &Agent{ID: beamID, Pub: pub, Priv: priv, APIKey: out.APIKey}
}

// States returns the states of nonce's trace in log order.
func States(t testing.TB, log *tracing.Log, nonce string) []tracing.State {
	t.Helper()
	evs, err := log.Trace(context.Background(), nonce)
	require.NoError(t, err)
	return EventStates(evs)
}

// EventStates returns the states of events, in order.
func EventStates(evs []tracing.Event) []tracing.State {
	out := make([]tracing.State, len(evs))
	for i, ev := range evs {
		out[i] = ev.State
	}
	return out
}
