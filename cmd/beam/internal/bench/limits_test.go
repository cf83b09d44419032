package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/internal/beamtest"
)

// TestStartServerTurnsRateLimitsOff registers more agents from one address
// than beam serve's default registration limit allows: the server a load
// test starts must not refuse its own load.
func TestStartServerTurnsRateLimitsOff(t *testing.T) {
	t.Parallel()
	p, err := StartServer(context.Background(), ServerOptions{Binary: beamtest.Binary(t), DataDir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	for i := range 40 {
		pub, _, err := wire.GenerateKey()
		require.NoError(t, err)
		body, err := json.Marshal(map[string]any{"beamId": fmt.Sprintf("load%d@acme.beam.directory", i),
			"displayName": "load", "capabilities": []string{}, "publicKey": wire.EncodePublicKey(pub)})
		require.NoError(t, err)
		resp, err := http.Post(p.URL+"/agents/register", "application/json", bytes.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, "registration %d", i)
	}
}
