package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// nonceNode returns a node whose nonces bucket lives on js.
func nonceNode(t *testing.T, ctx context.Context, js jetstream.JetStream, id string) *Node {
	t.Helper()
	n, kv := bucketNode(t, ctx, js, id, jetstream.KeyValueConfig{Bucket: "BEAM_NONCES_test", TTL: nonceTTL})
	n.route.nonces = kv
	return n
}

// TestNonceClaims: a nonce one node claimed is refused on another and
// answered again by the first. A client of the bucket without the key
// cannot let a nonce in twice: a claim it deletes still counts, and a
// value it writes (unsigned, or another key's claim copied) counts as
// another node's claim, on every node.
func TestNonceClaims(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t)
	n0, n1 := nonceNode(t, ctx, js, "n0"), nonceNode(t, ctx, js, "n1")
	kv := n0.route.nonces
	claim := func(n *Node, nonce string) bool {
		t.Helper()
		ok, err := n.ClaimNonce(ctx, "a@x.beam.directory", nonce)
		require.NoError(t, err)
		return ok
	}
	require.True(t, claim(n0, "first"))
	require.True(t, claim(n0, "first"), "the node that accepted it answers its replays")
	require.False(t, claim(n1, "first"))

	require.True(t, claim(n0, "deleted"))
	require.NoError(t, kv.Delete(ctx, nonceKey("a@x.beam.directory", "deleted")))
	require.False(t, claim(n1, "deleted"), "a deleted claim let the nonce in on another node")

	_, err := kv.Put(ctx, nonceKey("a@x.beam.directory", "unsigned"), []byte("n1"))
	require.NoError(t, err)
	require.False(t, claim(n1, "unsigned"), "an unsigned claim naming the node")
	require.False(t, claim(n0, "unsigned"))

	first, err := kv.Get(ctx, nonceKey("a@x.beam.directory", "first"))
	require.NoError(t, err)
	_, err = kv.Put(ctx, nonceKey("a@x.beam.directory", "copied"), first.Value())
	require.NoError(t, err)
	require.False(t, claim(n0, "copied"), "n0's claim of another nonce, copied")
}
