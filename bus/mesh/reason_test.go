package mesh_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam"
	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/tracing"
)

// TestSucceededEnvelopeKeepsNoWaitReason: an envelope that waited for an
// offline actor says why while it waits, and nothing of it once the actor
// came online and the envelope succeeded.
func TestSucceededEnvelopeKeepsNoWaitReason(t *testing.T) {
	t.Parallel()
	s := startStack(t, beam.Config{})
	creator, _ := s.agent("creator@acme.beam.directory")
	auth := func(r *http.Request, _ []byte) { r.Header.Set("X-Api-Key", creator.APIKey) }
	_, late := s.agent("late@acme.beam.directory")
	late.HandleMesh(func(_ context.Context, h *agents.MeshHop) (any, error) { return h.Envelope.Payload, nil })

	status, out := s.call(http.MethodPost, "/api/v1/mesh", []byte(`{"route":["late@acme.beam.directory"],"payload":{"n":1}}`), auth)
	require.Equal(t, http.StatusCreated, status, string(out))
	var created struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(out, &created))
	var v view
	require.Eventually(t, func() bool {
		status, out := s.call(http.MethodGet, "/api/v1/mesh/"+created.ID, nil, auth)
		require.Equal(t, http.StatusOK, status, string(out))
		require.NoError(t, json.Unmarshal(out, &v))
		return v.Reason == "actor offline"
	}, 30*time.Second, 20*time.Millisecond, "the envelope says it waits for its actor")

	require.NoError(t, late.Connect(context.Background()))
	s.wait(created.ID, auth)
	// A fresh decode: the reason is left out of the JSON when empty.
	v = view{}
	status, out = s.call(http.MethodGet, "/api/v1/mesh/"+created.ID, nil, auth)
	require.Equal(t, http.StatusOK, status, string(out))
	require.NoError(t, json.Unmarshal(out, &v))
	require.Equal(t, tracing.MeshSucceeded, v.Status, v.Error)
	require.Empty(t, v.Reason, "a succeeded envelope keeps no reason of a wait")
	var st struct {
		Reason string `json:"reason"`
	}
	require.NoError(t, json.Unmarshal(v.Envelope.Status, &st))
	require.Empty(t, st.Reason, "nor does its envelope's status")
}
