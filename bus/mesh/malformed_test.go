package mesh_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
)

// TestMeshAttackMalformedBodiesLeakNoGoText: an agent probing the gateway
// with bodies of the wrong shape learns that the body is malformed, not the
// server's Go types and struct fields (encoding/json's error text names
// them: "Go value of type mesh.createBody", "Go struct field
// createBody.headers").
func TestMeshAttackMalformedBodiesLeakNoGoText(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{})
	creator, _ := s.agent("creator@alpha.beam.directory")
	key := func(r *http.Request, _ []byte) { r.Header.Set("x-api-key", creator.APIKey) }
	for _, c := range []struct{ path, body string }{
		{"/api/v1/mesh", `[]`},
		{"/api/v1/mesh", `"x"`},
		{"/api/v1/mesh", `{`},
		{"/api/v1/mesh", `{"a":1}{"b":2}`},
		{"/api/v1/mesh", `{"route":["creator@alpha.beam.directory"],"headers":5}`},
		{"/api/v1/mesh", `{"route":["creator@alpha.beam.directory"],"creator":7}`},
		{"/api/v1/mesh/00000000-0000-4000-8000-000000000000/processing", `[]`},
		{"/api/v1/mesh/00000000-0000-4000-8000-000000000000/processing", `{"attempt":"one"}`},
	} {
		status, out := s.call(http.MethodPost, c.path, []byte(c.body), key)
		require.Equal(t, http.StatusBadRequest, status, "%s %s: %s", c.path, c.body, out)
		require.Equal(t, "INVALID_JSON", errorCode(t, out), "%s %s", c.path, c.body)
		for _, leak := range []string{"Go ", "createBody", "json:", "struct", "unmarshal", "invalid character", "JSON input"} {
			require.NotContains(t, string(out), leak, "%s %s", c.path, c.body)
		}
	}
}
