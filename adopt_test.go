package beam

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/tracing"
)

// TestServerAdoptsImportedWork: items whose latest events a takeover
// imported behind a running directory — a bus message and a pipeline hop
// the dead node had dispatched, an open job, an intent it was relaying —
// are handed by owner to their subsystems and adopted once: the message is
// delivered to its connected recipient with its nonce and acked, the hop
// is dispatched again and the envelope finishes once, the job is claimed
// and fulfilled, the intent fails retryably. Each trace shows one takeover
// marker; the node's own envelope is untouched; a second adopt adopts
// nothing.
func TestServerAdoptsImportedWork(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	ctx := context.Background()
	l := startLive(t, Config{OpenOrgs: true, JobBus: JobBus{Enabled: true}})
	lg := l.srv.Log()
	takenOver := map[string]any{"log": "log-dead", "node": "node-dead", "seq": 9}
	imported := func(evs ...tracing.Event) {
		t.Helper()
		for i := range evs {
			evs[i].Details.Extra = map[string]any{"takenOver": takenOver}
		}
		_, err := lg.Append(ctx, evs...)
		require.NoError(t, err)
	}
	agent := func(name string) (*agents.Client, string) {
		t.Helper()
		id, err := agents.GenerateIdentity(name + "@" + domain)
		require.NoError(t, err)
		return registerAs(t, l, id, name)
	}
	post := func(path, key string, body any) map[string]any {
		t.Helper()
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		req, err := http.NewRequest(http.MethodPost, l.url+path, bytes.NewReader(raw))
		require.NoError(t, err)
		req.Header.Set("X-Api-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		require.Less(t, resp.StatusCode, 300, out)
		return out
	}
	_, aliceKey := agent("alice")
	bob, _ := agent("bob")
	_, creatorKey := agent("creator")
	actor, _ := agent("actor")
	agent("idle")

	// A bus message the dead node had in a WebSocket attempt.
	sent := post("/v1/beam/send", aliceKey, map[string]any{"from": "alice@" + domain, "to": "bob@" + domain, "intent": "task.run"})
	msgNonce := sent["nonce"].(string)
	msg := l.message(msgNonce)
	imported(tracing.Event{Nonce: msgNonce, State: tracing.Dispatched, From: msg.Sender, To: msg.Recipient,
		IntentType: msg.Intent, Transport: "ws", Attempt: 1})

	// A pipeline hop the dead node had dispatched, and an envelope of this
	// node waiting for its actor.
	envelope := func(actor string) tracing.MeshRow {
		t.Helper()
		out := post("/api/v1/mesh", creatorKey, map[string]any{"route": []string{actor + "@" + domain}, "payload": map[string]any{}})
		var row tracing.MeshRow
		require.Eventually(t, func() bool {
			var err error
			row, _, err = lg.MeshEnvelope(ctx, out["id"].(string))
			require.NoError(t, err)
			return row.State == tracing.Queued && row.Actor != ""
		}, 10*time.Second, 10*time.Millisecond, "the envelope waits for its actor")
		return row
	}
	env, own := envelope("actor"), envelope("idle")
	step := tracing.MeshStep{Kind: tracing.MeshKindDispatch, Status: tracing.MeshRunning, Actor: env.Actor, Attempt: 1,
		FirstAttemptAt: time.Now().UnixMilli()}
	imported(tracing.Event{Nonce: env.Nonce, State: tracing.Dispatched, Transport: "ws", Attempt: 1,
		Details: tracing.Details{Mesh: step.Encode()}})
	ownTrace, err := lg.Trace(ctx, own.Nonce)
	require.NoError(t, err)

	// An open job published on the dead node.
	prio, now := 0, time.Now()
	publish := tracing.JobDetails{Op: "publish", ID: "j1", Namespace: "default", Goal: "g", Payload: json.RawMessage(`{"n":1}`),
		Priority: &prio, Visibility: "public", MaxAttempts: 3, BackoffBase: 5, Publisher: "dead-publisher",
		ExpiresAt: now.Add(time.Hour).UnixMilli(), RunAt: now.UnixMilli()}
	imported(tracing.Event{Nonce: "job:j1", State: tracing.Received, Transport: "intent", From: "intent:dead-publisher",
		To: "intent:default", IntentType: "g", Details: tracing.Details{Owner: tracing.OwnerJobs, Job: &publish}},
		tracing.Event{Nonce: "job:j1", State: tracing.Queued, Transport: "intent",
			Details: tracing.Details{Job: &tracing.JobDetails{Op: "queue"}}})

	// An intent the dead node was relaying.
	imported(tracing.Event{Nonce: "relayed-1", State: tracing.Received, From: "alice@" + domain, To: "bob@" + domain,
		IntentType: "task.run", Transport: "ws", Details: tracing.Details{Owner: tracing.OwnerDirectory}})

	byOwner := map[tracing.Owner][]string{
		tracing.OwnerBus: {msgNonce}, tracing.OwnerMesh: {env.Nonce, own.Nonce}, tracing.OwnerJobs: {"job:j1"},
		tracing.OwnerDirectory: {"relayed-1"},
	}
	n, err := l.srv.adopt(ctx, byOwner)
	require.NoError(t, err)
	require.Equal(t, map[tracing.Owner]int{tracing.OwnerBus: 1, tracing.OwnerMesh: 1, tracing.OwnerJobs: 1,
		tracing.OwnerDirectory: 1}, n)
	n, err = l.srv.adopt(ctx, byOwner)
	require.NoError(t, err)
	require.Equal(t, map[tracing.Owner]int{tracing.OwnerBus: 0, tracing.OwnerMesh: 0, tracing.OwnerJobs: 0,
		tracing.OwnerDirectory: 0}, n, "a second adopt adopts nothing")
	trace, err := lg.Trace(ctx, own.Nonce)
	require.NoError(t, err)
	require.Equal(t, ownTrace, trace, "the node's own envelope is untouched")
	for _, nonce := range []string{msgNonce, env.Nonce, "job:j1", "relayed-1"} {
		trace, err := lg.Trace(ctx, nonce)
		require.NoError(t, err)
		markers := 0
		for _, ev := range trace {
			if ev.Transport == tracing.TransportTakeover {
				markers++
				require.Equal(t, map[string]any{"log": "log-dead", "node": "node-dead"}, ev.Details.Extra["adoptedFrom"], nonce)
			}
		}
		require.Equal(t, 1, markers, "one takeover marker in the trace of %s", nonce)
	}
	row, ok, err := lg.Intent(ctx, "relayed-1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, tracing.Failed, row.Status)

	var mu sync.Mutex
	got := map[string]int{}
	bob.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		got[in.Nonce]++
		mu.Unlock()
		return agents.Success(nil)
	})
	actor.HandleMesh(func(_ context.Context, hop *agents.MeshHop) (any, error) {
		mu.Lock()
		got[hop.Envelope.ID]++
		mu.Unlock()
		return map[string]any{"done": true}, nil
	})
	require.NoError(t, bob.Connect(ctx))
	require.NoError(t, actor.Connect(ctx))
	require.Eventually(t, func() bool { return l.message(msgNonce).Status == tracing.Acked }, 20*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		row, _, err := lg.MeshEnvelope(ctx, env.ID)
		require.NoError(t, err)
		return row.Status == tracing.MeshSucceeded
	}, 20*time.Second, 10*time.Millisecond)
	mu.Lock()
	require.Equal(t, map[string]int{msgNonce: 1, env.ID: 1}, got)
	mu.Unlock()

	h := l.srv.JobBus().Handler()
	job := func(path string, body any) map[string]any {
		t.Helper()
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		req := httptest.NewRequest(http.MethodPost, path, bytes.NewReader(raw))
		req.Header.Set("X-API-KEY", l.srv.intent.secret)
		req.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		require.Equal(t, http.StatusOK, w.Code, w.Body.String())
		var out map[string]any
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &out))
		return out
	}
	claim := job("/claim?goal=g", map[string]any{})
	require.Equal(t, "j1", claim["id"])
	job("/fulfill/j1", map[string]any{"claim_token": claim["claim_token"], "result": "r"})
}

// TestClusterAdoptedMessageSettlesFromDeliveryRecord: a message the dead
// node had delivered and seen acknowledged — its attempt in the imported
// log still dispatched, the acknowledgement in the cluster's delivery
// record — is settled from the record after the taker adopts it, never
// delivered again; a message the dead node had in an attempt that was not
// acknowledged is delivered again, once, with its nonce.
func TestClusterAdoptedMessageSettlesFromDeliveryRecord(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := startClusterPair(t, domain, func(c *Config) {
		c.Bus.RetrySchedule, c.Bus.TickInterval = []time.Duration{200 * time.Millisecond}, 50*time.Millisecond
	})
	client := func(base string, id *agents.Identity) *agents.Client { return clusterClient(t, base, id) }
	register := func(base, beamID string) *agents.Identity { return clusterAgent(t, ctx, base, beamID) }
	aliceID := register(nodes[0].url, "alice@"+domain)
	bobID := register(nodes[1].url, "bob@"+domain)
	alice := client(nodes[0].url, aliceID)
	lg := nodes[0].srv.Log()

	// Two messages the dead node had in an attempt to bob (bob offline
	// here until then): one bob acknowledged, one he did not.
	var msgs [2]*agents.DurableReceipt
	for i := range msgs {
		rec, err := alice.SendDurable(ctx, bobID.BeamID, "task.once", map[string]any{"n": i}, nil)
		require.NoError(t, err)
		msgs[i] = rec
		m, ok, err := lg.Message(ctx, rec.Nonce)
		require.NoError(t, err)
		require.True(t, ok)
		_, err = lg.Append(ctx, tracing.Event{Nonce: rec.Nonce, State: tracing.Dispatched, From: m.Sender, To: m.Recipient,
			IntentType: m.Intent, Transport: "ws", Attempt: 1, Details: tracing.Details{
				Extra: map[string]any{"takenOver": map[string]any{"log": "log-dead", "node": "node-dead", "seq": 4 + i}}}})
		require.NoError(t, err)
	}
	acked, lost := msgs[0], msgs[1]
	result, err := wire.Result{Nonce: acked.Nonce, Success: true}.Build(time.Now(), nil)
	require.NoError(t, err)
	require.NoError(t, nodes[1].srv.clusterNode().RecordDelivery(ctx, directory.DeliveryRecord{From: aliceID.BeamID,
		Nonce: acked.Nonce, MessageID: acked.MessageID, Attempt: 1, Result: result}))

	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	bob := client(nodes[1].url, bobID)
	bob.Handle("*", func(_ context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		seen[in.Nonce]++
		mu.Unlock()
		return agents.Success(nil)
	})
	require.NoError(t, bob.Connect(ctx))
	require.Eventually(t, func() bool { return nodes[0].srv.dir.Online(bobID.BeamID) }, 30*time.Second, 20*time.Millisecond)

	n, err := nodes[0].srv.adopt(ctx, map[tracing.Owner][]string{tracing.OwnerBus: {acked.Nonce, lost.Nonce}})
	require.NoError(t, err)
	require.Equal(t, 2, n[tracing.OwnerBus])
	for _, rec := range msgs {
		require.Eventually(t, func() bool {
			st, ok, err := lg.State(ctx, rec.Nonce)
			return err == nil && ok && st == tracing.Acked
		}, time.Minute, 20*time.Millisecond, rec.Nonce)
	}
	evs, err := lg.Trace(ctx, acked.Nonce)
	require.NoError(t, err)
	last := evs[len(evs)-1]
	require.Equal(t, directory.TransportCluster, last.Transport)
	require.Equal(t, "clusterDeliveryRecord", last.Details.Extra["settledFrom"])
	mu.Lock()
	require.Equal(t, map[string]int{lost.Nonce: 1}, seen, "the acknowledged message is not delivered again; the other once")
	mu.Unlock()
}
