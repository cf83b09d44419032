package cluster

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory"
)

// bucketNode returns a node of the tests' cluster and the bucket on js,
// created with cfg, which the caller gives it.
func bucketNode(t *testing.T, ctx context.Context, js jetstream.JetStream, id string,
	cfg jetstream.KeyValueConfig) (*Node, jetstream.KeyValue) {
	t.Helper()
	kv, err := createKV(ctx, js, cfg)
	require.NoError(t, err)
	return sealNode(t, id, testClusterKey), kv
}

// deliveredNode returns a node whose delivered bucket lives on js.
func deliveredNode(t *testing.T, ctx context.Context, js jetstream.JetStream, id string) *Node {
	t.Helper()
	n, kv := bucketNode(t, ctx, js, id, jetstream.KeyValueConfig{Bucket: "BEAM_DELIVERED_test", TTL: deliveredTTL})
	n.route.delivered = kv
	return n
}

// TestDeliveryRecordRoundTrip: a record one node stores is what another
// node reads for the same sender and nonce, stamped with the recording
// node; another sender's same nonce has no record.
func TestDeliveryRecordRoundTrip(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t)
	holder, owner := deliveredNode(t, ctx, js, "holder"), deliveredNode(t, ctx, js, "owner")

	_, ok, err := owner.Delivery(ctx, "a@x.beam.directory", "n1")
	require.NoError(t, err)
	require.False(t, ok)

	result := json.RawMessage(`{"nonce":"n1","success":true}`)
	require.NoError(t, holder.RecordDelivery(ctx, directory.DeliveryRecord{From: "a@x.beam.directory", Nonce: "n1",
		MessageID: "msg_1", Attempt: 2, Result: result, Node: "forged"}))
	rec, ok, err := owner.Delivery(ctx, "a@x.beam.directory", "n1")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "msg_1", rec.MessageID)
	require.Equal(t, 2, rec.Attempt)
	require.Equal(t, "holder", rec.Node)
	require.JSONEq(t, string(result), string(rec.Result))

	_, ok, err = owner.Delivery(ctx, "b@x.beam.directory", "n1")
	require.NoError(t, err)
	require.False(t, ok, "the key is the sender and the nonce")

	// A record no member sealed (put by a client of the bucket) is no
	// acknowledgement.
	forged, err := json.Marshal(directory.DeliveryRecord{From: "a@x.beam.directory", Nonce: "n2", MessageID: "msg_2",
		Attempt: 1, Result: result, Node: "holder"})
	require.NoError(t, err)
	_, err = owner.route.delivered.Put(ctx, nonceKey("a@x.beam.directory", "n2"), forged)
	require.NoError(t, err)
	_, ok, err = owner.Delivery(ctx, "a@x.beam.directory", "n2")
	require.NoError(t, err)
	require.False(t, ok, "a forged record settled a message")
}

// TestDeliveryRecordUnavailable: while the bucket cannot be reached a read
// is an error once its context ends — never "no record", which would let
// the caller deliver the message unchecked — and a write fails the same
// way.
func TestDeliveryRecordUnavailable(t *testing.T) {
	t.Parallel()
	s, js := jetStreamServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n := deliveredNode(t, ctx, js, "owner")
	s.Shutdown()

	rctx, rcancel := context.WithTimeout(ctx, time.Second)
	defer rcancel()
	_, ok, err := n.Delivery(rctx, "a@x.beam.directory", "n1")
	require.Error(t, err)
	require.False(t, ok)
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	require.Error(t, n.RecordDelivery(wctx, directory.DeliveryRecord{From: "a@x.beam.directory", Nonce: "n1", MessageID: "msg_1"}))
}

// TestDeliveryRecordStoredOnceTheBucketIsBack: a write started while the
// bucket is unavailable keeps trying and stores the record once the
// server is back (the holder's background write after its report), and
// the record is then what a read finds.
func TestDeliveryRecordStoredOnceTheBucketIsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, opts := stoppableServer(t)
	nc, err := nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	n := deliveredNode(t, ctx, js, "holder")
	s.Shutdown()
	s.WaitForShutdown()

	rec := directory.DeliveryRecord{From: "a@x.beam.directory", Nonce: "n1", MessageID: "msg_1", Attempt: 1}
	stored := make(chan error, 1)
	go func() { stored <- n.RecordDelivery(ctx, rec) }()
	select {
	case err := <-stored:
		require.FailNow(t, "the write ended while the server was down", "err: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	restartServer(t, opts)
	require.NoError(t, <-stored)
	got, ok, err := n.Delivery(ctx, rec.From, rec.Nonce)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "msg_1", got.MessageID)
	require.Equal(t, "holder", got.Node)
}
