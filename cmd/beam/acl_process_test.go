package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestACLDotPatternMatchesOnlyASuffix: bob allows "*.beam" (meant: senders
// whose domain ends in ".beam"). mallory@evil.beam.directory holds ".beam"
// only in the middle of her ID, so the same-org default still refuses her.
func TestACLDotPatternMatchesOnlyASuffix(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{})
	ctx := context.Background()
	bob := registerAgent(t, p.URL(), "bob@acme.beam.directory")
	mallory := registerAgent(t, p.URL(), "mallory@evil.beam.directory")
	for _, pattern := range []string{"*.beam", "*.beam.dir"} {
		body, err := json.Marshal(map[string]any{"targetBeamId": bob.id, "intentType": "*", "allowedFrom": pattern})
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, p.URL()+"/acl", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Api-Key", bob.apiKey)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusCreated, resp.StatusCode, string(b))
	}
	status, b, err := postIntent(ctx, p.URL(), mallory.frame(t, bob.id, "task.run", map[string]any{"x": 1}))
	require.NoError(t, err)
	require.Equal(t, http.StatusForbidden, status, string(b))
	require.Contains(t, string(b), "FORBIDDEN")
}
