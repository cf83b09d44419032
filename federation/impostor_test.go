package federation

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
)

// registerStatus posts a registration of beamID to d and returns the status
// and body.
func registerStatus(t *testing.T, d *fedDir, beamID string) (int, string) {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	body := `{"beamId":"` + beamID + `","displayName":"x","publicKey":"` + id.PublicKeyBase64() + `"}`
	resp, err := http.Post(d.srv.URL+"/agents/register", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(data)
}

// With two directories peered, nobody can register a peer's agent locally:
// neither b@beta on alpha (which would receive alpha's intents for the
// real b) nor a@alpha on beta (which would send as a@alpha there). An
// impostor registered before the peer was pinned is bypassed: intents for
// the peer's domain go to the peer.
func TestFederationImpostorRefused(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)

	// Before pinning, alpha serves beta's domain like any other org.
	status, body := registerStatus(t, alpha, "b@beta.beam.directory")
	require.Equal(t, http.StatusCreated, status, body)
	pin(t, alpha, beta)

	status, body = registerStatus(t, alpha, "b2@beta.beam.directory")
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, "DOMAIN_NOT_SERVED")
	status, body = registerStatus(t, beta, "a@alpha.beam.directory")
	require.Equal(t, http.StatusForbidden, status, body)
	require.Contains(t, body, "DOMAIN_NOT_SERVED")

	// The real b on beta gets alpha's intent, not the impostor on alpha.
	b := beta.agent("b")
	var handled atomic.Int64
	b.Handle("task", func(ctx context.Context, in *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(map[string]any{"by": "real b"})
	})
	require.NoError(t, b.Connect(context.Background()))
	a := alpha.agent("a")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := a.Send(ctx, "b@beta.beam.directory", "task", map[string]any{})
	require.NoError(t, err)
	require.True(t, res.Success, string(res.Raw))
	require.Contains(t, string(res.Payload), "real b")
	require.EqualValues(t, 1, handled.Load())
}
