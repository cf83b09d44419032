package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/cmd/beam/internal/bench"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/beamtest"
	"github.com/beamdir/beam/tracing"
)

const clusterDomain = "acme.beam.directory"

// clusterOptions are the start options of n nodes of one cluster on
// loopback random ports: each embedded NATS server routes to the others,
// and every node's data directory holds what beam cluster init writes (the
// same directory key, the route credentials).
func clusterOptions(t *testing.T, n int, extra ...string) []beamtest.Options {
	t.Helper()
	dirs := make([]string, n)
	routes := make([]string, n)
	for i := range routes {
		dirs[i], routes[i] = t.TempDir(), freeAddr(t)
	}
	require.NoError(t, bench.InitClusterDirs(clusterDomain, dirs))
	opts := make([]beamtest.Options, n)
	for i := range opts {
		opts[i] = beamtest.Options{DataDir: dirs[i], Args: append(bench.ClusterNodeArgs(i, routes, clusterDomain), extra...)}
	}
	return opts
}

// withoutTakeover are extra start options, with a takeover grace longer
// than any test: a node killed and restarted comes back to its own log
// however slow the machine, never to a log a survivor took over
// (TestClusterTakeoverProcesses and the chaos runs test the takeover).
func withoutTakeover(extra ...string) []string {
	return append([]string{"--cluster-takeover-grace", "1h"}, extra...)
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

// clusterRegistry: three nodes over a three-server embedded NATS cluster
// (the shared one: it runs once the others are done, as it kills and
// restarts node 2). An agent registered on one node is known to and can
// authenticate on the others; once a key rotation (which revokes the old
// key) is acknowledged by one node, every node refuses the old key; a node
// that was down while an agent registered knows it as soon as it serves
// again.
func clusterRegistry(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

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
	steps, err := readEvents(dataDir, nonce)
	require.NoError(t, err)
	out := make([]string, len(steps))
	for i, st := range steps {
		out[i] = string(st.State) + "/" + st.Transport
	}
	return out
}

// clusterRouting: an intent for an agent connected to
// another node — over WebSocket and over HTTP — is handed to that node and
// its result comes back, with a trace of the nonce on each node; a nonce
// used on one node is refused on another.
func clusterRouting(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	aliceID, alice := sdkAgent(t, ctx, nodes[0].URL(), "rt-alice@"+clusterDomain)
	alice.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		return agents.Success(map[string]any{"from": in.From})
	})
	require.NoError(t, alice.Connect(ctx))
	bobID, bob := sdkAgent(t, ctx, nodes[1].URL(), "rt-bob@"+clusterDomain)
	require.NoError(t, bob.Connect(ctx))
	carolID, _ := sdkAgent(t, ctx, nodes[2].URL(), "rt-carol@"+clusterDomain)

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
	// beam trace on each node shows the part it holds.
	for i, part := range map[int]string{0: "ws", 1: "cluster"} {
		out, err := beamtest.Run(t, ctx, "trace", wsNonce, "--data-dir", nodes[i].DataDir)
		require.NoError(t, err, out)
		require.Contains(t, out, part)
	}
	// The dashboard of any node shows the nodes and where alice is.
	token, err := os.ReadFile(filepath.Join(nodes[2].DataDir, "admin.token"))
	require.NoError(t, err)
	type sessionRow struct{ BeamID, Node string }
	var card struct {
		Configured bool `json:"configured"`
		Status     struct {
			Node     string                    `json:"node"`
			Nodes    []struct{ NodeID string } `json:"nodes"`
			Sessions []sessionRow              `json:"sessions"`
		} `json:"status"`
	}
	// Sessions are announced asynchronously: wait until node 2 lists both.
	require.Eventually(t, func() bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[2].URL()+"/observability/cluster", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&card))
		return slices.Contains(card.Status.Sessions, sessionRow{aliceID.BeamID, "node0"}) &&
			slices.Contains(card.Status.Sessions, sessionRow{bobID.BeamID, "node1"})
	}, 30*time.Second, 50*time.Millisecond, "node 2 lists where alice and bob are connected: %+v", card)
	require.True(t, card.Configured)
	require.Equal(t, "node2", card.Status.Node)
	require.Len(t, card.Status.Nodes, 3)

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
}

// clusterAgent is an agent of the kill test: its current client and the
// node it is connected to, replaced when it moves.
type clusterAgent struct {
	id     *agents.Identity
	mu     sync.Mutex
	client *agents.Client
	node   int
}

func (a *clusterAgent) current() (*agents.Client, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.client, a.node
}

// connect connects the agent to node i (a load balancer sending it to
// another node), closing its previous client.
func (a *clusterAgent) connect(t *testing.T, ctx context.Context, base string, i int, h agents.Handler) {
	t.Helper()
	c := sdkClient(t, base, a.id)
	c.Handle("*", h)
	require.NoError(t, c.Connect(ctx))
	a.mu.Lock()
	old := a.client
	a.client, a.node = c, i
	a.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
}

// durableSent is a durable message the bus acknowledged.
type durableSent struct {
	nonce string
	owner int // the node that acknowledged it
}

// TestClusterKillProcesses: three nodes over a three-server embedded NATS
// cluster. Agents spread over the nodes exchange intents over WebSocket
// and HTTP and durable messages; one node is SIGKILLed under load, its
// agent reconnects to another node and traffic to it continues; every
// message the bus acknowledged ends acked in the log of the node that
// acknowledged it and was delivered — exactly once when the dead node had
// received the recipient's acknowledgement — and messages sent once the
// cluster is whole again are delivered exactly once; the restarted node
// knows an agent registered while it was down as soon as it serves.
func TestClusterKillProcesses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	nodes := beamtest.StartAll(t, clusterOptions(t, 3, withoutTakeover("--bus-retry-schedule", "200ms,500ms,1s",
		"--bus-max-attempts", "500", "--bus-delivery-timeout", "5s", "--bus-tick-interval", "100ms")...)...)

	var mu sync.Mutex
	seen := map[string]int{}
	handler := func(_ context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		seen[in.Nonce]++
		mu.Unlock()
		return agents.Success(map[string]any{"ok": true})
	}
	as := make([]*clusterAgent, 3)
	for i := range as {
		id, _ := sdkAgent(t, ctx, nodes[i].URL(), fmt.Sprintf("a%d@%s", i, clusterDomain))
		as[i] = &clusterAgent{id: id}
		as[i].connect(t, ctx, nodes[i].URL(), i, handler)
	}
	// Every node knows where every session is: each sends to each.
	for i, a := range as {
		for j, b := range as {
			if i == j {
				continue
			}
			c, _ := a.current()
			require.Eventually(t, func() bool {
				res, err := c.Send(ctx, b.id.BeamID, "task.warm", nil)
				return err == nil && res.Success
			}, 30*time.Second, 50*time.Millisecond, "a%d → a%d", i, j)
		}
	}

	var (
		lmu                sync.Mutex
		sent               []durableSent
		toMovedOK, syncErr int
		moved              bool
	)
	httpClients := map[string]*agents.Client{}
	httpClient := func(i, node int) *agents.Client {
		key := fmt.Sprintf("%d/%d", i, node)
		if c, ok := httpClients[key]; ok {
			return c
		}
		c := sdkClient(t, nodes[node].URL(), as[i].id)
		httpClients[key] = c
		return c
	}
	stopLoad := runLoad(func(k int) {
		i, j := k%3, (k+1)%3
		c, node := as[i].current()
		to := as[j].id.BeamID
		if rec, err := c.SendDurable(ctx, to, "task.durable", map[string]any{"k": k}, nil); err == nil {
			lmu.Lock()
			sent = append(sent, durableSent{nonce: rec.Nonce, owner: node})
			lmu.Unlock()
		}
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := c.Send(sctx, to, "task.ws", nil)
		if err == nil {
			_, err = httpClient(i, node).Send(sctx, to, "task.http", nil)
		}
		scancel()
		lmu.Lock()
		if err != nil {
			syncErr++
		} else if moved && j == 2 {
			toMovedOK++
		}
		lmu.Unlock()
	})
	acknowledged := func() int {
		lmu.Lock()
		defer lmu.Unlock()
		return len(sent)
	}
	require.Eventually(t, func() bool { return acknowledged() >= 15 }, time.Minute, 20*time.Millisecond)

	// Node 2 dies under load; its agent reconnects to node 0.
	nodes[2].Kill()
	as[2].connect(t, ctx, nodes[0].URL(), 0, handler)
	lmu.Lock()
	moved = true
	lmu.Unlock()
	lateID, _ := sdkAgent(t, ctx, nodes[0].URL(), "late@"+clusterDomain)
	require.Eventually(t, func() bool {
		lmu.Lock()
		defer lmu.Unlock()
		return toMovedOK >= 5
	}, 2*time.Minute, 20*time.Millisecond, "traffic to the moved agent continues")

	nodes[2].Restart()
	require.Equal(t, http.StatusOK, agentStatus(t, ctx, nodes[2].URL(), lateID.BeamID))
	stopLoad()

	lmu.Lock()
	all := append([]durableSent(nil), sent...)
	t.Logf("durable messages acknowledged: %d; sync intents that failed around the kill: %d", len(all), syncErr)
	lmu.Unlock()
	waitClusterAcked(t, nodes, all, 3*time.Minute)
	mu.Lock()
	for _, m := range all {
		require.GreaterOrEqual(t, seen[m.nonce], 1, "message %s was never delivered", m.nonce)
		if m.owner == 2 {
			continue
		}
		// Acked in node 2's log: handed to it, and the recipient's
		// acknowledgement reached it (and the delivery record) before it
		// died or after it was back.
		if st, err := queryState(t, nodes[2].DataDir, m.nonce); err == nil && st == tracing.Acked {
			require.Equal(t, 1, seen[m.nonce], "message %s acknowledged at node 2 was delivered again", m.nonce)
		}
	}
	mu.Unlock()

	// The cluster is whole again: messages from every node to every agent
	// are delivered exactly once.
	var after []durableSent
	for i, a := range as {
		c, node := a.current()
		for j, b := range as {
			if i != j {
				rec, err := c.SendDurable(ctx, b.id.BeamID, "task.after", nil, nil)
				require.NoError(t, err)
				after = append(after, durableSent{nonce: rec.Nonce, owner: node})
			}
		}
	}
	waitClusterAcked(t, nodes, after, time.Minute)
	mu.Lock()
	defer mu.Unlock()
	for _, m := range after {
		require.Equal(t, 1, seen[m.nonce], "message %s", m.nonce)
	}
}

// waitClusterAcked waits until every message is acked in the log of the node that
// acknowledged it, and otherwise fails naming one that is not, with its
// trace.
func waitClusterAcked(t *testing.T, nodes []*beamtest.Process, msgs []durableSent, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	pending := msgs
	for len(pending) > 0 {
		// One read of each owner's log per pass: a pass over a thousand
		// messages stays well under a second.
		byOwner := map[int][]string{}
		for _, m := range pending {
			byOwner[m.owner] = append(byOwner[m.owner], m.nonce)
		}
		states := map[string]tracing.State{}
		for owner, nonces := range byOwner {
			maps.Copy(states, lastStates(t, nodes[owner].DataDir, nonces))
		}
		var still []durableSent
		for _, m := range pending {
			if states[m.nonce] != tracing.Acked {
				still = append(still, m)
			}
		}
		pending = still
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			m := pending[0]
			require.FailNow(t, "not every acknowledged message ends acked",
				"%d pending; %s on node %d: %v", len(pending), m.nonce, m.owner, traceTransports(t, nodes[m.owner].DataDir, m.nonce))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lastStates reads the state of each nonce (its last event's) from the log
// in dataDir, opened once; a nonce without events is left out, as is every
// nonce while the log cannot be opened (a node restarting).
func lastStates(t *testing.T, dataDir string, nonces []string) map[string]tracing.State {
	t.Helper()
	lg, err := tracing.OpenReadOnly(context.Background(), filepath.Join(dataDir, "beam.db"))
	if err != nil {
		return nil
	}
	defer lg.Close()
	states := make(map[string]tracing.State, len(nonces))
	for _, nonce := range nonces {
		var st tracing.State
		err := lg.ReadDB().GetContext(context.Background(), &st,
			`SELECT state FROM intent_trace_events WHERE nonce = ? ORDER BY seq DESC LIMIT 1`, nonce)
		if err == nil {
			states[nonce] = st
		}
	}
	return states
}

// clusterBusPoll: a message accepted by one node for an agent
// without a session is refused when resent through another node, claimed
// by the agent polling another node and acked on a third; the owner's log
// records it acked, and a second poll finds nothing left.
func clusterBusPoll(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	senderID, sender := sdkAgent(t, ctx, nodes[0].URL(), "poll-sender@"+clusterDomain)
	pollerID, _ := sdkAgent(t, ctx, nodes[1].URL(), "poll-poller@"+clusterDomain)
	rec, err := sender.SendDurable(ctx, pollerID.BeamID, "task.poll", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	// The same message sent again through another node is refused, not
	// accepted a second time.
	_, err = sdkClient(t, nodes[1].URL(), senderID).SendDurable(ctx, pollerID.BeamID, "task.poll",
		map[string]any{"n": 1}, &agents.DurableOptions{Nonce: rec.Nonce})
	require.Error(t, err)
	require.Equal(t, directory.CodeNonceReuse, agents.ErrorCode(err), "%v", err)

	onTwo := sdkClient(t, nodes[2].URL(), pollerID)
	msgs, err := onTwo.Poll(ctx, agents.PollOptions{Claim: true, Lease: 30 * time.Second})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	require.Equal(t, rec.Nonce, msgs[0].Nonce)

	onOne := sdkClient(t, nodes[1].URL(), pollerID)
	_, err = onOne.Ack(ctx, &msgs[0], agents.AckAcked, map[string]any{"done": true})
	require.NoError(t, err)
	st, err := queryState(t, nodes[0].DataDir, rec.Nonce)
	require.NoError(t, err)
	require.Equal(t, tracing.Acked, st)

	msgs, err = onTwo.Poll(ctx, agents.PollOptions{Claim: true, Lease: 30 * time.Second})
	require.NoError(t, err)
	require.Empty(t, msgs)
}
