package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/apitest"
	"github.com/beamdir/beam/internal/beamtest"
)

// A real beam serve refuses to deliver to an endpoint on a loopback
// address, without saying where it tried; BEAM_ALLOW_PRIVATE_ENDPOINTS (or
// --allow-private-endpoints) allows it for local development.
func TestServeAllowPrivateEndpointsFlag(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	internal := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = w.Write([]byte(`{"internal":"secret"}`))
	}))
	t.Cleanup(internal.Close)
	send := func(url string) (int, string) {
		t.Helper()
		alice := apitest.Register(t, url, "alice@beam.directory", "Alice", nil)
		apitest.Register(t, url, "hook@beam.directory", "Hook", map[string]any{"httpEndpoint": internal.URL + "/x"})
		f := wire.NewIntentFrame(alice.ID, "hook@beam.directory", "task.run", json.RawMessage(`{}`), time.Now())
		require.NoError(t, wire.SignIntent(f, alice.Priv))
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		resp, err := http.Post(url+"/intents/send", "application/json", bytes.NewReader(raw))
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	common := []string{"--default-policy", "allow", "--allow-insecure-endpoints"}

	strict := beamtest.Start(t, beamtest.Options{Args: common})
	status, body := send(strict.URL())
	require.Equal(t, http.StatusBadGateway, status, body)
	require.Contains(t, body, "endpoint address is not allowed")
	require.NotContains(t, body, "127.0.0.1")
	require.NotContains(t, body, "secret")
	require.Zero(t, calls.Load())

	open := beamtest.Start(t, beamtest.Options{Args: common, Env: []string{"BEAM_ALLOW_PRIVATE_ENDPOINTS=true"}})
	status, body = send(open.URL())
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "secret")
	require.EqualValues(t, 1, calls.Load())
}
