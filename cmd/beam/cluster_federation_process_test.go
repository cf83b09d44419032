package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/beamtest"
)

// copyDirectoryKey puts the directory key of data directory from into to.
func copyDirectoryKey(t *testing.T, from, to string) {
	t.Helper()
	key, err := os.ReadFile(filepath.Join(from, federation.KeyFile))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(to, federation.KeyFile), key, 0o600))
}

// TestClusterFederationProcesses: a peer directory federated with a
// two-node cluster that shares one directory key (clusterOptions) and pins the peer on
// every node. The peer pins the cluster once, with one node's NATS
// address. An agent of the peer reaches agents connected to either node
// and gets their results; an agent of the cluster on the other node
// reaches the peer's agent. A node whose directory key differs from the
// cluster's refuses to start.
func TestClusterFederationProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const peerDomain = "beta.beam.directory"

	peerDir, peerNATS := t.TempDir(), freeAddr(t)
	peerLine := showSelf(t, peerDir, peerDomain, peerNATS)
	opts := clusterOptions(t, 2, "--peer", peerLine, "--http-timeout", "30s")
	node0NATS := freeAddr(t)
	opts[0].Args = append(opts[0].Args, "--nats-listen", node0NATS) // a later flag wins
	clusterLine := showSelf(t, opts[0].DataDir, clusterDomain, node0NATS)

	// The peer starts with the nodes rather than after them.
	all := beamtest.StartAll(t, append(opts, beamtest.Options{DataDir: peerDir, Name: "peer", Args: []string{"--domain", peerDomain,
		"--nats-listen", peerNATS, "--peer", clusterLine, "--default-policy", "allow", "--http-timeout", "30s"}})...)
	nodes, peer := all[:2], all[2]

	reply := func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]any{"from": in.From})
	}
	aliceID, alice := sdkAgent(t, ctx, nodes[0].URL(), "alice@"+clusterDomain)
	alice.Handle("*", reply)
	require.NoError(t, alice.Connect(ctx))
	_, bob := sdkAgent(t, ctx, nodes[1].URL(), "bob@"+clusterDomain)
	bob.Handle("*", reply)
	require.NoError(t, bob.Connect(ctx))
	carolID, carol := sdkAgent(t, ctx, peer.URL(), "carol@"+peerDomain)
	carol.Handle("*", reply)
	require.NoError(t, carol.Connect(ctx))

	// The peer's agent reaches the agents of both nodes, whichever node
	// takes the federation message.
	for _, to := range []string{aliceID.BeamID, "bob@" + clusterDomain} {
		var res *wire.ResultFrame
		require.Eventually(t, func() bool {
			var err error
			res, err = carol.Send(ctx, to, "task.run", map[string]any{"to": to})
			return err == nil && res.Success
		}, 60*time.Second, 100*time.Millisecond, "carol -> %s: %+v", to, res)
		require.JSONEq(t, `{"from":"`+carolID.BeamID+`"}`, string(res.Payload), to)
	}
	// Agents of either node reach the peer's agent.
	for name, c := range map[string]*agents.Client{"alice": alice, "bob": bob} {
		res, err := c.Send(ctx, carolID.BeamID, "task.run", nil)
		require.NoError(t, err, name)
		require.True(t, res.Success, "%s: %+v", name, res)
		require.JSONEq(t, `{"from":"`+name+`@`+clusterDomain+`"}`, string(res.Payload), name)
	}

	// Node 1 restarted with a directory key of its own is refused.
	nodes[1].Kill()
	otherDir := t.TempDir()
	showSelf(t, otherDir, clusterDomain, freeAddr(t))
	copyDirectoryKey(t, otherDir, nodes[1].DataDir)
	out, err := beamtest.Run(t, ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--intent-listen", "127.0.0.1:0",
		"--data-dir", nodes[1].DataDir}, nodes[1].Args...)...)
	require.Error(t, err, out)
	require.Contains(t, out, "directory key differs from the cluster's")
}
