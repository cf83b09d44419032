package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation"
)

// TestPeerListLinkColumn: beam peer list's LINK column, with the count of
// retrying sends in the right number.
func TestPeerListLinkColumn(t *testing.T) {
	t.Parallel()
	up, down := true, false
	require.Equal(t, "up", linkText(federation.LinkState{Connected: &up}))
	require.Equal(t, "down (1 send retrying)", linkText(federation.LinkState{Connected: &down, Failing: 1}))
	require.Equal(t, "down (3 sends retrying)", linkText(federation.LinkState{Connected: &down, Failing: 3}))
	require.Equal(t, "shared NATS (1 send retrying)", linkText(federation.LinkState{Failing: 1}))
}
