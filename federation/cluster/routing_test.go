package cluster

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// newRouter returns a router that knows no session yet.
func newRouter() *router {
	return &router{where: map[string]sessionEntry{}, held: map[string]bool{}, dirty: map[string]bool{}}
}

// TestNoteWakesWhenASessionBecomesReachable: a message waiting on this node
// for an agent is woken each time the agent becomes reachable on another
// node — a first entry, a move, or a refresh of an entry that had gone
// stale — and not by a refresh of an entry that was reachable, by this
// node's own session or by a removal.
func TestNoteWakesWhenASessionBecomesReachable(t *testing.T) {
	t.Parallel()
	rt := newRouter()
	now := time.Now()
	at := func(node string, age time.Duration) sessionEntry { return sessionEntry{Node: node, At: now.Add(-age)} }

	require.True(t, rt.note("n0", "a", at("n1", 0), true), "first entry on another node")
	require.False(t, rt.note("n0", "a", at("n1", 0), true), "refresh of a reachable entry")
	require.True(t, rt.note("n0", "a", at("n2", 0), true), "moved to another node")
	require.False(t, rt.note("n0", "a", at("n0", 0), true), "this node holds it")
	require.True(t, rt.note("n0", "a", at("n2", 0), true), "back on another node")

	require.False(t, rt.note("n0", "b", at("n1", 2*sessionTTL), true), "a stale entry is not reachable")
	require.True(t, rt.note("n0", "b", at("n1", 0), true), "its holder refreshed it")

	require.False(t, rt.note("n0", "a", sessionEntry{}, false))
	_, known := rt.where["a"]
	require.False(t, known, "a removal forgets the entry")
	require.True(t, rt.note("n0", "a", at("n1", 0), true), "an entry after a removal")
}

// TestSetLiveWakesTheSessionsOfARejoiningNode: while a node is missing
// from the nodes bucket its sessions are unreachable; when it is back, the
// agents it holds are woken, and only those.
func TestSetLiveWakesTheSessionsOfARejoiningNode(t *testing.T) {
	t.Parallel()
	rt := newRouter()
	now := time.Now()
	rt.note("n0", "a", sessionEntry{Node: "n1", At: now}, true)
	rt.note("n0", "b", sessionEntry{Node: "n2", At: now}, true)
	rt.note("n0", "c", sessionEntry{Node: "n1", At: now.Add(-2 * sessionTTL)}, true)
	rt.note("n0", "d", sessionEntry{Node: "n0", At: now}, true)

	require.Empty(t, rt.setLive("n0", map[string]bool{"n0": true, "n2": true}),
		"the first list of live nodes wakes nothing: every node counted as live before it")
	require.False(t, rt.note("n0", "a", sessionEntry{Node: "n1", At: now}, true),
		"a refresh does not wake an agent whose node is not live")
	require.ElementsMatch(t, []string{"a"}, rt.setLive("n0", map[string]bool{"n0": true, "n1": true, "n2": true}),
		"n1 is back: its fresh session is woken, not its stale one nor the others")
	require.Empty(t, rt.setLive("n0", map[string]bool{"n0": true, "n1": true, "n2": true}), "no node came back")
}
