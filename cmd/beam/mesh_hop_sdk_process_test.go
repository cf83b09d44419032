package main

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
)

// TestMeshHopNamesCreatorAndPrevActor: the SDK's MeshHop tells a handler
// who wrote the content it got (From, the frame's authenticated sender),
// who created the envelope and which actor came before it.
func TestMeshHopNamesCreatorAndPrevActor(t *testing.T) {
	t.Parallel()
	s := startTrustStack(t, "--open-orgs")
	creator, _ := sdkAgent(t, s.ctx, s.p.URL(), "client@acme.beam.directory")
	type seen struct{ from, creator, prev string }
	var mu sync.Mutex
	got := map[string]seen{}
	actor := func(name string) string {
		id, c := sdkAgent(t, s.ctx, s.p.URL(), name+"@acme.beam.directory")
		c.HandleMesh(func(ctx context.Context, hop *agents.MeshHop) (any, error) {
			mu.Lock()
			got[name] = seen{hop.From, hop.Creator, hop.PrevActor}
			mu.Unlock()
			return hop.Envelope.Payload, nil
		})
		require.NoError(t, c.Connect(s.ctx))
		return id.BeamID
	}
	first, second := actor("first"), actor("second")
	s.succeeded(creator, s.create(creator, first, second))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, seen{creator.BeamID, creator.BeamID, ""}, got["first"])
	require.Equal(t, seen{first, creator.BeamID, first}, got["second"])
}
