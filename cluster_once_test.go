package beam

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/testclock"
	"github.com/beamdir/beam/tracing"
)

// TestClusterBusSettlesFromDeliveryRecord: a durable message whose
// acknowledgement the cluster's delivery record holds is not delivered
// again. The recipient's node records the acknowledgement of the first
// attempt and the attempt then ends without it reaching the owner (as when
// the holder dies before answering): the owner's retry settles the message
// from the record — acked, transport cluster, details naming the record —
// and the recipient saw it once. A handed-over attempt of a recorded
// message is answered from the record by the node holding the session,
// without a delivery; an attempt of another message with the same nonce
// is not.
func TestClusterBusSettlesFromDeliveryRecord(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := startClusterPair(t, domain, func(c *Config) {
		c.Bus.RetrySchedule, c.Bus.MaxAttempts, c.Bus.TickInterval = []time.Duration{200 * time.Millisecond}, 50, 50*time.Millisecond
	})
	client := func(base string, id *agents.Identity) *agents.Client { return clusterClient(t, base, id) }
	register := func(base, beamID string) *agents.Identity { return clusterAgent(t, ctx, base, beamID) }
	aliceID := register(nodes[0].url, "alice@"+domain)
	bobID := register(nodes[1].url, "bob@"+domain)

	var (
		mu   sync.Mutex
		seen = map[string]int{}
	)
	bob := client(nodes[1].url, bobID)
	bob.Handle("*", func(ctx context.Context, in *agents.Intent) agents.Reply {
		mu.Lock()
		seen[in.Nonce]++
		mu.Unlock()
		if in.Durable == nil {
			return agents.Success(nil)
		}
		// Node 1 records bob's acknowledgement, then the attempt fails
		// anyway: the owner never learns of it.
		result, err := wire.Result{Nonce: in.Nonce, Success: true}.Build(time.Now(), nil)
		if err == nil {
			err = nodes[1].srv.clusterNode().RecordDelivery(ctx, directory.DeliveryRecord{From: in.From, Nonce: in.Nonce,
				MessageID: in.Durable.MessageID, Attempt: in.Durable.Attempt, Result: result})
		}
		if err != nil {
			t.Errorf("record the delivery: %v", err)
		}
		return agents.Failure("BUSY", "lost on the way")
	})
	require.NoError(t, bob.Connect(ctx))
	alice := client(nodes[0].url, aliceID)
	require.Eventually(t, func() bool {
		res, err := alice.Send(ctx, bobID.BeamID, "task.warm", nil)
		return err == nil && res.Success
	}, 30*time.Second, 20*time.Millisecond, "node 0 routes to bob on node 1")

	rec, err := alice.SendDurable(ctx, bobID.BeamID, "task.once", map[string]any{"n": 1}, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		st, ok, err := nodes[0].srv.Log().State(ctx, rec.Nonce)
		return err == nil && ok && st == tracing.Acked
	}, time.Minute, 20*time.Millisecond)
	mu.Lock()
	require.Equal(t, 1, seen[rec.Nonce], "bob got the message once")
	mu.Unlock()
	evs, err := nodes[0].srv.Log().Trace(ctx, rec.Nonce)
	require.NoError(t, err)
	last := evs[len(evs)-1]
	require.Equal(t, tracing.Acked, last.State)
	require.Equal(t, directory.TransportCluster, last.Transport)
	require.Equal(t, "clusterDeliveryRecord", last.Details.Extra["settledFrom"])
	require.Equal(t, "n1", last.Details.Extra["recordedBy"])

	// A handed-over attempt of the recorded message: answered from the
	// record on node 1, not delivered.
	f := wire.NewIntentFrame(aliceID.BeamID, bobID.BeamID, "task.once", json.RawMessage(`{"n":1}`), time.Now())
	f.Nonce = rec.Nonce
	frame, err := f.DeliveryJSON()
	require.NoError(t, err)
	h := directory.HandOver{Frame: frame, Unsigned: true, TimeoutMs: 5000, FromNode: "n0",
		Bus: &directory.BusMark{MessageID: rec.MessageID, Attempt: 3, Auth: directory.BusAuthAPIKey}, Admitted: time.Now()}
	// For its first seconds in the cluster node 1 answers "retry"
	// (directory.RecordsSettling), as it does to the owner's attempts.
	var rep directory.HandReply
	require.Eventually(t, func() bool {
		rep = nodes[1].srv.dir.RelayHandOver(ctx, h)
		return rep.Error == nil || !strings.Contains(rep.Error.Message, "joined the cluster")
	}, 30*time.Second, 100*time.Millisecond)
	require.Nil(t, rep.Error)
	require.True(t, rep.Recorded)
	rf, err := wire.DecodeResultFrame(rep.Result)
	require.NoError(t, err)
	require.True(t, rf.Success)
	mu.Lock()
	require.Equal(t, 1, seen[rec.Nonce], "the handed-over attempt was not delivered")
	mu.Unlock()

	// The record names its message: an attempt of another message with
	// the same sender and nonce is not answered from it.
	h.Bus.MessageID = "msg_other"
	rep = nodes[1].srv.dir.RelayHandOver(ctx, h)
	require.False(t, rep.Recorded)
}

// TestClusterDeliveryRecordsSettleAfterJoining: for a few seconds after a
// node joins its cluster, a missing delivery record is an error (the bus
// puts the attempt off) rather than "not acknowledged": a node that could
// not store its record while the cluster was without this node stores it
// soon after. Then a missing record reads as none.
func TestClusterDeliveryRecordsSettleAfterJoining(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := testclock.NewNow()
	nodes := startClusterPair(t, "acme.beam.directory", func(c *Config) { c.Clock = clock.Now })
	dir := nodes[0].srv.dir

	clock.Advance(2 * time.Second)
	_, ok, err := dir.ClusterDelivery(ctx, "alice@acme.beam.directory", "n1", "msg_1")
	require.ErrorContains(t, err, "joined the cluster 2s ago")
	settling, isSettling := errors.AsType[*directory.RecordsSettling](err)
	require.True(t, isSettling)
	require.Equal(t, 3*time.Second, settling.Wait, "the bus puts its attempt off until then")
	require.False(t, ok)

	clock.Advance(3 * time.Second)
	_, ok, err = dir.ClusterDelivery(ctx, "alice@acme.beam.directory", "n1", "msg_1")
	require.NoError(t, err)
	require.False(t, ok, "no record: not acknowledged")
}

// clusterClient is an agent client of id on the node at base, closed when
// the test ends.
func clusterClient(t *testing.T, base string, id *agents.Identity) *agents.Client {
	t.Helper()
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: base, Identity: id, APIKey: id.APIKey,
		Logger: quietLogger(), ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// clusterAgent registers beamID on the node at base and returns its
// identity with its API key.
func clusterAgent(t *testing.T, ctx context.Context, base, beamID string) *agents.Identity {
	t.Helper()
	id, err := agents.GenerateIdentity(beamID)
	require.NoError(t, err)
	res, err := clusterClient(t, base, id).Register(ctx, beamID, []string{"test"})
	require.NoError(t, err)
	id.APIKey = res.APIKey
	return id
}
