package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
	"github.com/beamdir/beam/internal/beamtest"
)

// memberClient connects to node's embedded NATS server as a client with
// every publish right there is (the node's own nkey user): the attacker of
// these tests may write any subject and bucket of the cluster, but does
// not hold the directory key's signing use — it never signs with it.
func memberClient(t *testing.T, node *beamtest.Process) *nats.Conn {
	t.Helper()
	peer, err := federation.ParsePeerLine(node.FederationLine())
	require.NoError(t, err)
	priv, _, err := federation.LoadOrCreateKey(node.DataDir)
	require.NoError(t, err)
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, priv.Seed())
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	nc, err := nats.Connect(peer.URL, nats.Nkey(pub, kp.Sign), nats.Secure(federation.PeerTLS(peer.PublicKey)))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// apiKeyGet is the status of GET url with key as the agent's API key.
func apiKeyGet(t *testing.T, ctx context.Context, url, key string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Api-Key", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// forgedJWS is a compact JWS of payload signed by a key that is not the
// cluster's.
func forgedJWS(t *testing.T, typ string, payload []byte) []byte {
	t.Helper()
	_, wrong, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tok, err := wire.SignJWS(typ, payload, "node0", wrong)
	require.NoError(t, err)
	return []byte(tok)
}

// clusterForgery: a NATS client with publish rights on a
// cluster's subjects and buckets, but without the directory key, forges
// what the nodes trust from each other.
//
// registry: it publishes on the registry subject the SQL text that used to
// be an entry (giving alice an API key it chose) and a well-formed typed
// operation doing the same, unsigned and signed by another key. No node
// applies them: alice's key works everywhere, the attacker's gets 401, and
// the registry keeps applying the changes published after them.
//
// session copy: it copies alice's session entry, sealed by the node that
// holds her session, under bob's key in the sessions bucket. No node takes
// it for bob's (the entry names alice): intents to bob keep reaching him.
//
// call replay: it listens on a node's subject for the bus calls other
// nodes send it (as it may: it can subscribe to the cluster's subjects),
// captures the call a poll through another node made, and sends it again,
// over NATS and as an HTTP request. Each call is answered once: the replay
// is refused and leases no message.
//
// nodes: it puts entries for a fake node (an HTTP server of the test) in
// the nodes bucket, unsigned and signed by another key. A client polling,
// and looking up a message, through a node makes the node ask the other
// nodes — never the fake one — and no request ever carries the client's
// API key; a request claiming to come from a node without its signature is
// refused.
func clusterForgery(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	token := cluster.Token(clusterDomain)
	nc := memberClient(t, nodes[0])
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	aliceID, _ := sdkAgent(t, ctx, nodes[0].URL(), "forge-alice@"+clusterDomain)

	t.Run("registry", func(t *testing.T) {
		stolen := "bk_" + base64.RawURLEncoding.EncodeToString([]byte(aliceID.BeamID)) + ".attacker-chosen-secret"
		sum := sha256.Sum256([]byte(stolen))
		stolenHash := hex.EncodeToString(sum[:])

		subject := "beam.cluster." + token + ".registry"
		sql, err := json.Marshal(map[string]any{"id": "forged-1", "stmts": []map[string]any{{
			"q": "UPDATE agents SET api_key_hash = ? WHERE beam_id = ?",
			"a": []map[string]any{{"s": stolenHash}, {"s": aliceID.BeamID}},
		}}})
		require.NoError(t, err)
		now := time.Now()
		key := wire.EncodePublicKey(aliceID.Public)
		op := map[string]any{"kind": "agent.reregister", "at": now.UnixMicro(), "actor": "agent:" + aliceID.BeamID,
			"target": aliceID.BeamID, "keys": true, "agent": map[string]any{
				"row": map[string]any{"BeamID": aliceID.BeamID, "Org": "acme", "DisplayName": "alice",
					"Capabilities": "[]", "PublicKey": key, "APIKeyHash": stolenHash, "VerificationTier": "basic",
					"Visibility": "public", "CreatedAt": now.UnixMicro(), "UpdatedAt": now.UnixMicro(), "LastSeen": now.UnixMicro()},
				"keys": []map[string]any{{"publicKey": key, "createdAt": now.UnixMicro()}}}}
		stream, err := js.Stream(ctx, "BEAM_REGISTRY_"+token)
		require.NoError(t, err)
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		typed, err := json.Marshal(map[string]any{"after": info.State.LastSeq + 1, "op": op})
		require.NoError(t, err)
		for _, entry := range [][]byte{sql, typed, forgedJWS(t, "beam-cluster-registry+jws", typed)} {
			_, err := js.Publish(ctx, subject, entry)
			require.NoError(t, err)
		}

		// A change published after the forged entries is applied by every
		// node (the origin answers once all did).
		carolID, _ := sdkAgent(t, ctx, nodes[1].URL(), "forge-carol@"+clusterDomain)
		for _, n := range nodes {
			require.Equal(t, http.StatusOK, agentStatus(t, ctx, n.URL(), carolID.BeamID), "node %s", n.URL())
			// GET /acl/{beamId} answers the agent's own API key only.
			acl := n.URL() + "/acl/" + aliceID.BeamID
			require.Equal(t, http.StatusOK, apiKeyGet(t, ctx, acl, aliceID.APIKey), "node %s", n.URL())
			require.Equal(t, http.StatusUnauthorized, apiKeyGet(t, ctx, acl, stolen),
				"node %s took the attacker's API key", n.URL())
		}
	})

	t.Run("nodes", func(t *testing.T) {
		var (
			mu   sync.Mutex
			hits []http.Header
		)
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			hits = append(hits, r.Header.Clone())
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"messages":[],"count":0}`))
		}))
		defer fake.Close()
		kv, err := js.KeyValue(ctx, "BEAM_NODES_"+token)
		require.NoError(t, err)
		announce := func() {
			now := time.Now().UTC()
			for _, id := range []string{"fake1", "fake2"} {
				entry, err := json.Marshal(cluster.NodeInfo{NodeID: id, URL: fake.URL, Started: now, Seen: now})
				require.NoError(t, err)
				if id == "fake2" {
					entry = forgedJWS(t, "beam-cluster-node+jws", entry)
				}
				_, err = kv.Put(ctx, id, entry)
				require.NoError(t, err)
			}
		}

		// A message owned by node 0, for an agent without a session.
		_, sender := sdkAgent(t, ctx, nodes[0].URL(), "forge-sender@"+clusterDomain)
		pollerID, _ := sdkAgent(t, ctx, nodes[0].URL(), "forge-poller@"+clusterDomain)
		rec, err := sender.SendDurable(ctx, pollerID.BeamID, "task.poll", map[string]any{"n": 1}, nil)
		require.NoError(t, err)

		announce()
		onTwo := sdkClient(t, nodes[2].URL(), pollerID)
		msgs, err := onTwo.Poll(ctx, agents.PollOptions{Claim: true, Lease: 30 * time.Second})
		require.NoError(t, err)
		require.Len(t, msgs, 1, "node 2 reached node 0's message through a signed node call")
		require.Equal(t, rec.Nonce, msgs[0].Nonce)

		announce()
		require.Equal(t, http.StatusNotFound,
			apiKeyGet(t, ctx, nodes[1].URL()+"/v1/beam/messages/no-such-message", pollerID.APIKey))

		// A request claiming to be a node's call, unsigned, is refused.
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[0].URL()+"/v1/beam/poll", nil)
		require.NoError(t, err)
		req.Header.Set("X-Beam-Cluster-Call", string(forgedJWS(t, "beam-cluster-call+jws", []byte(`{}`))))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

		mu.Lock()
		defer mu.Unlock()
		for _, h := range hits {
			require.Empty(t, h.Get("X-Api-Key"), "the fake node got the client's API key")
			require.Empty(t, h.Get("Authorization"), "the fake node got the client's credentials")
		}
		require.Empty(t, hits, "a node called a node whose entry the cluster's key did not sign")
	})

	t.Run("session copy", func(t *testing.T) {
		alice := sdkClient(t, nodes[0].URL(), aliceID)
		alice.Handle("*", func(context.Context, *agents.Intent) agents.Reply {
			return agents.Success(map[string]any{"who": "alice"})
		})
		require.NoError(t, alice.Connect(ctx))
		bobID, bob := sdkAgent(t, ctx, nodes[1].URL(), "forge-bobcopy@"+clusterDomain)
		bob.Handle("*", func(context.Context, *agents.Intent) agents.Reply {
			return agents.Success(map[string]any{"who": "bob"})
		})
		require.NoError(t, bob.Connect(ctx))
		_, carol := sdkAgent(t, ctx, nodes[2].URL(), "forge-carolcopy@"+clusterDomain)
		sessions, err := js.KeyValue(ctx, "BEAM_SESSIONS_"+token)
		require.NoError(t, err)
		key := func(id string) string { return base64.RawURLEncoding.EncodeToString([]byte(id)) }
		var entry jetstream.KeyValueEntry
		require.Eventually(t, func() bool {
			entry, err = sessions.Get(ctx, key(aliceID.BeamID))
			return err == nil
		}, 20*time.Second, 100*time.Millisecond, "alice's session entry")
		send := func() error {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			_, err := carol.Send(sctx, bobID.BeamID, "task.run", map[string]any{"n": 1})
			return err
		}
		// Node 2 has learnt where bob's session is.
		require.Eventually(t, func() bool { return send() == nil }, 20*time.Second, 100*time.Millisecond)
		neverWithin(t, 8*time.Second, 500*time.Millisecond, func() bool {
			_, err := sessions.Put(ctx, key(bobID.BeamID), entry.Value())
			require.NoError(t, err)
			return send() != nil
		}, "a copy of alice's session entry moved bob's session")
	})

	t.Run("call replay", func(t *testing.T) {
		const queued = 5
		_, sender := sdkAgent(t, ctx, nodes[1].URL(), "forge-replaysender@"+clusterDomain)
		pollerID, _ := sdkAgent(t, ctx, nodes[1].URL(), "forge-replaypoller@"+clusterDomain)
		for i := range queued {
			_, err := sender.SendDurable(ctx, pollerID.BeamID, "task.poll", map[string]any{"n": i}, nil)
			require.NoError(t, err)
		}
		captured := make(chan *nats.Msg, 64)
		sub, err := nc.ChanSubscribe("beam.cluster."+token+".node.node1.call", captured)
		require.NoError(t, err)
		require.NoError(t, nc.Flush())
		onTwo := sdkClient(t, nodes[2].URL(), pollerID)
		leased := 0
		var call *nats.Msg
		require.Eventually(t, func() bool {
			msgs, err := onTwo.Poll(ctx, agents.PollOptions{Claim: true, Lease: time.Minute, Limit: 1})
			require.NoError(t, err)
			leased += len(msgs)
			for {
				select {
				case m := <-captured:
					// The call of this poll (the cluster's other tests poll too).
					if sealNames(m.Header.Get("Beam-Cluster-Seal"), pollerID.BeamID) && len(msgs) == 1 {
						call = m
					}
				default:
					return call != nil
				}
			}
		}, 20*time.Second, 200*time.Millisecond, "a poll through node 2 calls node 1")
		require.NoError(t, sub.Unsubscribe())

		replay := &nats.Msg{Subject: call.Subject, Header: call.Header, Data: call.Data}
		answer, err := nc.RequestMsg(replay, 10*time.Second)
		require.NoError(t, err)
		require.Contains(t, string(answer.Data), "UNAUTHORIZED", "the replayed call was answered: %s", answer.Data)

		req, err := http.NewRequestWithContext(ctx, http.MethodGet, nodes[1].URL()+"/v1/beam/poll?claim=true&limit=1", nil)
		require.NoError(t, err)
		req.Header.Set("X-Beam-Cluster-Call", call.Header.Get("Beam-Cluster-Seal"))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a node call over HTTP")

		// Every message the clients did not lease is still queued.
		onOne := sdkClient(t, nodes[1].URL(), pollerID)
		rest, err := onOne.Poll(ctx, agents.PollOptions{Claim: true, Lease: time.Minute, Limit: 100})
		require.NoError(t, err)
		require.Len(t, rest, queued-leased, "the replay leased a message")
	})

	t.Run("handover", func(t *testing.T) {
		// Bob is connected to node 1; his handler keeps what it receives.
		bobID, _ := sdkAgent(t, ctx, nodes[1].URL(), "forge-bob@"+clusterDomain)
		var (
			mu       sync.Mutex
			received []string
		)
		bob := sdkClient(t, nodes[1].URL(), bobID)
		bob.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
			mu.Lock()
			received = append(received, string(in.Payload))
			mu.Unlock()
			return agents.Success(map[string]any{"ok": true})
		})
		require.NoError(t, bob.Connect(ctx))
		forgedSeen := func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, p := range received {
				if strings.Contains(p, "forged") {
					return true
				}
			}
			return false
		}

		// A hand-over to node 1 of a frame "from alice" that node 0
		// supposedly authenticated by her API key: node 1 would deliver
		// it attested as alice's.
		f := &wire.IntentFrame{Intent: "task.run", From: aliceID.BeamID, To: bobID.BeamID,
			Payload: json.RawMessage(`{"forged":true}`), Nonce: "forged-handover-1", Timestamp: wire.FormatTimestamp(time.Now())}
		raw, err := f.DeliveryJSON()
		require.NoError(t, err)
		h, err := json.Marshal(directory.HandOver{Frame: raw, Unsigned: true, TimeoutMs: 5000, FromNode: "node0"})
		require.NoError(t, err)
		msg, err := nc.Request("beam.cluster."+token+".node.node1.intent", h, 20*time.Second)
		require.NoError(t, err)
		var rep directory.HandReply
		require.NoError(t, json.Unmarshal(msg.Data, &rep))
		require.NotNil(t, rep.Error, "node 1 took a forged hand-over: %s", msg.Data)

		// Bob's session "moves" to a node the attacker listens as, and
		// that node is announced too: intents to bob stay with node 1.
		var stolen atomic.Bool
		sub, err := nc.Subscribe("beam.cluster."+token+".node.nodefake.intent", func(*nats.Msg) { stolen.Store(true) })
		require.NoError(t, err)
		defer func() { _ = sub.Unsubscribe() }()
		sessions, err := js.KeyValue(ctx, "BEAM_SESSIONS_"+token)
		require.NoError(t, err)
		kv, err := js.KeyValue(ctx, "BEAM_NODES_"+token)
		require.NoError(t, err)
		alice := sdkClient(t, nodes[0].URL(), aliceID)
		neverWithin(t, 8*time.Second, 500*time.Millisecond, func() bool {
			now := time.Now().UTC()
			entry, err := json.Marshal(cluster.NodeInfo{NodeID: "nodefake", URL: "http://127.0.0.1:9", Started: now, Seen: now})
			require.NoError(t, err)
			_, err = kv.Put(ctx, "nodefake", entry)
			require.NoError(t, err)
			se, err := json.Marshal(map[string]any{"node": "nodefake", "at": now})
			require.NoError(t, err)
			_, err = sessions.Put(ctx, base64.RawURLEncoding.EncodeToString([]byte(bobID.BeamID)), se)
			require.NoError(t, err)
			sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, _ = alice.Send(sctx, bobID.BeamID, "task.run", map[string]any{"n": 1})
			return stolen.Load()
		}, "an intent to bob went to the attacker's node")
		// Alice's intents through node 0 reach bob on node 1 (sealed
		// hand-overs), and the forged frame never did.
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(received) > 0
		}, 30*time.Second, 100*time.Millisecond)
		require.False(t, forgedSeen(), "bob received the forged frame")
	})
}

// sealNames reports whether tok is a compact JWS whose payload names
// beamID.
func sealNames(tok, beamID string) bool {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	return err == nil && strings.Contains(string(payload), `"`+beamID+`"`)
}

// neverWithin checks, on the test's goroutine, that cond stays false each
// time it is run, every tick for d. Unlike require.Never it never runs cond
// after the test moved on, so cond may use t.
func neverWithin(t *testing.T, d, tick time.Duration, cond func() bool, msg string) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		require.False(t, cond(), msg)
		if time.Now().After(end) {
			return
		}
		<-time.After(tick)
	}
}
