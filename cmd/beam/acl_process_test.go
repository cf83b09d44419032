package main

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestACLDotPatternMatchesOnlyASuffix: bob allows "*.beam" and "*.beam.dir"
// (meant: senders whose domain ends so). mallory@evil.beam.directory holds
// both only in the middle of her ID, so the same-org default still refuses
// her; a "*.beam.directory" rule for another intent, which her ID does end
// in, admits her.
func TestACLDotPatternMatchesOnlyASuffix(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	ctx := context.Background()
	bob := registerAgent(t, p.URL(), "bob@acme.beam.directory")
	mallory := registerAgent(t, p.URL(), "mallory@evil.beam.directory")
	for pattern, intent := range map[string]string{"*.beam": "*", "*.beam.dir": "*", "*.beam.directory": "task.ok"} {
		body, err := json.Marshal(map[string]any{"targetBeamId": bob.id, "intentType": intent, "allowedFrom": pattern})
		require.NoError(t, err)
		status, _, b := do(t, http.MethodPost, p.URL()+"/acl", bob.apiKey, body)
		require.Equal(t, http.StatusCreated, status, string(b))
	}
	status, b, err := postIntent(ctx, p.URL(), mallory.frame(t, bob.id, "task.run", map[string]any{"x": 1}))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, string(b))
	require.Contains(t, string(b), "FORBIDDEN")

	status, b, err = postIntent(ctx, p.URL(), mallory.frame(t, bob.id, "task.ok", map[string]any{"x": 2}))
	require.NoError(t, err)
	require.NotEqual(t, http.StatusForbidden, status, "a true suffix admits her: %s", b)
}
