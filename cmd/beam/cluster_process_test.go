package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

const clusterDomain = "acme.beam.directory"

// clusterOptions are the start options of n nodes of one cluster on
// loopback random ports: each embedded NATS server routes to the others.
func clusterOptions(t *testing.T, n int, extra ...string) []beamtest.Options {
	t.Helper()
	routes := make([]string, n)
	for i := range routes {
		routes[i] = freeAddr(t)
	}
	opts := make([]beamtest.Options, n)
	for i := range opts {
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, "nats-route://"+r)
			}
		}
		opts[i] = beamtest.Options{Args: append([]string{"--domain", clusterDomain, "--cluster",
			"--node-id", fmt.Sprintf("node%d", i), "--nats-listen", "127.0.0.1:0",
			"--cluster-listen", routes[i], "--cluster-routes", strings.Join(others, ","),
			"--default-policy", "allow"}, extra...)}
	}
	return opts
}

// agentStatus is GET /agents/{beamId}'s status on a node.
func agentStatus(t *testing.T, ctx context.Context, base, beamID string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/agents/"+beamID, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// rotateKey rotates id's key on base with its API key and returns the new
// identity (same Beam ID and API key).
func rotateKey(t *testing.T, ctx context.Context, base string, id *agents.Identity) *agents.Identity {
	t.Helper()
	next, err := agents.GenerateIdentity(id.BeamID)
	require.NoError(t, err)
	next.APIKey = id.APIKey
	body, err := json.Marshal(map[string]string{"newPublicKey": wire.EncodePublicKey(next.Public)})
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/agents/"+id.BeamID+"/keys/rotate", strings.NewReader(string(body)))
	require.NoError(t, err)
	req.Header.Set("x-api-key", id.APIKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	return next
}

// signedSendCode sends one intent signed by id (no API key, over HTTP) to
// node base and returns the error code ("" on success).
func signedSendCode(t *testing.T, ctx context.Context, base string, id *agents.Identity, to string) string {
	t.Helper()
	keyless := &agents.Identity{BeamID: id.BeamID, Public: id.Public, Private: id.Private}
	c := sdkClient(t, base, keyless)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := c.Send(sctx, to, "task.run", map[string]any{"n": 1})
	_ = c.Close()
	if err == nil {
		return ""
	}
	if code := agents.ErrorCode(err); code != "" {
		return code
	}
	return err.Error()
}

// TestClusterRegistryProcesses: three nodes over a three-server embedded
// NATS cluster. An agent registered on one node is known to and can
// authenticate on the others; once a key rotation (which revokes the old
// key) is acknowledged by one node, every node refuses the old key; a node
// that was down while an agent registered knows it as soon as it serves
// again.
func TestClusterRegistryProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nodes := beamtest.StartAll(t, clusterOptions(t, 3)...)

	aliceID, _ := sdkAgent(t, ctx, nodes[0].URL(), "alice@"+clusterDomain)
	bobID, _ := sdkAgent(t, ctx, nodes[1].URL(), "bob@"+clusterDomain)
	for _, n := range nodes {
		// The origin answered once every live node applied the change.
		require.Equal(t, http.StatusOK, agentStatus(t, ctx, n.URL(), aliceID.BeamID))
		require.Equal(t, http.StatusOK, agentStatus(t, ctx, n.URL(), bobID.BeamID))
	}
	// Alice's API key works on another node: a WebSocket session there.
	alice2 := sdkClient(t, nodes[2].URL(), aliceID)
	require.NoError(t, alice2.Connect(ctx))
	_ = alice2.Close()

	// Signed by alice's current key, an intent gets past verification on
	// every node (to offline bob); signed by a revoked key it is refused
	// as INVALID_INTENT.
	for _, n := range nodes {
		require.Equal(t, directory.CodeOffline, signedSendCode(t, ctx, n.URL(), aliceID, bobID.BeamID), "node %s", n.URL())
	}
	newAlice := rotateKey(t, ctx, nodes[1].URL(), aliceID)
	for _, n := range nodes {
		require.Equal(t, directory.CodeInvalidIntent, signedSendCode(t, ctx, n.URL(), aliceID, bobID.BeamID),
			"node %s accepted the revoked key", n.URL())
		require.Equal(t, directory.CodeOffline, signedSendCode(t, ctx, n.URL(), newAlice, bobID.BeamID), "node %s", n.URL())
	}

	// Node 2 is down while carol registers and bob rotates; when it serves
	// again it has caught up.
	nodes[2].Kill()
	carolID, _ := sdkAgent(t, ctx, nodes[0].URL(), "carol@"+clusterDomain)
	newBob := rotateKey(t, ctx, nodes[0].URL(), bobID)
	nodes[2].Restart()
	require.Equal(t, http.StatusOK, agentStatus(t, ctx, nodes[2].URL(), carolID.BeamID))
	require.Equal(t, directory.CodeInvalidIntent, signedSendCode(t, ctx, nodes[2].URL(), bobID, aliceID.BeamID),
		"the restarted node accepted bob's revoked key")
	require.Equal(t, directory.CodeOffline, signedSendCode(t, ctx, nodes[2].URL(), newBob, aliceID.BeamID))
}

// traceTransports returns the states and transports of nonce's trace in
// the log of a running node, "state/transport" each.
func traceTransports(t *testing.T, dataDir, nonce string) []string {
	t.Helper()
	lg, err := tracing.Open(context.Background(), tracing.Config{Path: filepath.Join(dataDir, "beam.db")})
	require.NoError(t, err)
	defer lg.Close()
	evs, err := lg.Trace(context.Background(), nonce)
	require.NoError(t, err)
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = string(ev.State) + "/" + ev.Transport
	}
	return out
}

// TestClusterRoutingProcesses: an intent for an agent connected to
// another node — over WebSocket and over HTTP — is handed to that node and
// its result comes back, with a trace of the nonce on each node; a nonce
// used on one node is refused on another.
func TestClusterRoutingProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nodes := beamtest.StartAll(t, clusterOptions(t, 3)...)

	aliceID, alice := sdkAgent(t, ctx, nodes[0].URL(), "alice@"+clusterDomain)
	alice.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]any{"from": in.From})
	})
	require.NoError(t, alice.Connect(ctx))
	bobID, bob := sdkAgent(t, ctx, nodes[1].URL(), "bob@"+clusterDomain)
	require.NoError(t, bob.Connect(ctx))
	carolID, _ := sdkAgent(t, ctx, nodes[2].URL(), "carol@"+clusterDomain)

	// Every node learns that node 0 holds alice's session.
	var wsNonce string
	require.Eventually(t, func() bool {
		res, err := bob.Send(ctx, aliceID.BeamID, "task.ws", nil)
		if err != nil {
			return false
		}
		wsNonce = res.Nonce
		return res.Success
	}, 30*time.Second, 50*time.Millisecond)
	require.Contains(t, traceTransports(t, nodes[1].DataDir, wsNonce), "dispatched/cluster")
	require.Contains(t, traceTransports(t, nodes[1].DataDir, wsNonce), "acked/cluster")
	require.Contains(t, traceTransports(t, nodes[0].DataDir, wsNonce), "received/cluster")
	require.Contains(t, traceTransports(t, nodes[0].DataDir, wsNonce), "acked/ws")

	// Over HTTP (carol has no session) from a third node.
	carol := sdkClient(t, nodes[2].URL(), carolID)
	res, err := carol.Send(ctx, aliceID.BeamID, "task.http", nil)
	require.NoError(t, err)
	require.True(t, res.Success)
	require.Contains(t, traceTransports(t, nodes[2].DataDir, res.Nonce), "dispatched/cluster")
	require.Contains(t, traceTransports(t, nodes[0].DataDir, res.Nonce), "acked/ws")
	require.Empty(t, traceTransports(t, nodes[1].DataDir, res.Nonce))

	// The same signed frame replayed on another node is refused.
	f := wire.NewIntentFrame(carolID.BeamID, aliceID.BeamID, "task.replay", []byte(`{}`), time.Now())
	require.NoError(t, wire.SignIntent(f, carolID.Private))
	frame, err := f.DeliveryJSON()
	require.NoError(t, err)
	status, body, err := postIntent(ctx, nodes[2].URL(), frame)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, status, string(body))
	status, body, err = postIntent(ctx, nodes[1].URL(), frame)
	require.NoError(t, err)
	require.NotEqual(t, http.StatusOK, status, string(body))
	require.Contains(t, string(body), directory.CodeNonceReuse)
	_ = bobID
}
