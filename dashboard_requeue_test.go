package beam_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
)

// TestDashboardAttackMeshRequeueMistakesAre4xx: an operator's dashboard
// asking to requeue an envelope that does not exist, or one that is not a
// dead letter, makes a client mistake: 404 and 409 with the pipeline's own
// codes, never a 500 INTERNAL_ERROR logged as a server fault.
func TestDashboardAttackMeshRequeueMistakesAre4xx(t *testing.T) {
	t.Parallel()
	r := serve(t, beam.Config{})
	admin, _ := r.srv.AdminToken()
	post := func(path, token string, body []byte) (int, []byte) {
		t.Helper()
		return r.call(t, http.MethodPost, path, token, body)
	}
	code := func(body []byte) string {
		var e struct {
			ErrorCode string `json:"errorCode"`
		}
		require.NoError(t, json.Unmarshal(body, &e), string(body))
		return e.ErrorCode
	}

	status, out := post("/observability/mesh/no-such-envelope/requeue", admin, nil)
	require.Equal(t, http.StatusNotFound, status, string(out))
	require.Equal(t, "NOT_FOUND", code(out))

	// An envelope waiting for its (offline) actor is not a dead letter.
	id, err := agents.GenerateIdentity("carol@acme.beam.directory")
	require.NoError(t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: r.url, Identity: id})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	reg, err := c.Register(context.Background(), "Carol", []string{"test"})
	require.NoError(t, err)
	status, out = post("/api/v1/mesh", reg.APIKey, []byte(`{"route":["carol@acme.beam.directory"],"payload":{}}`))
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	status, out = post("/observability/mesh/"+created.ID+"/requeue", admin, nil)
	require.Equal(t, http.StatusConflict, status, string(out))
	require.Equal(t, "CONFLICT", code(out))
}
