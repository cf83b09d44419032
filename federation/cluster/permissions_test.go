package cluster

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
)

// TestNodeUserCarriesAForwardedStream: on a NATS deployment whose only
// rights for the nodes are those of beam peer nats-user --cluster
// (NodePermissions), a forwarded event stream reaches the client chunk
// after chunk, not only its first one: the answering node publishes every
// chunk into the caller's inbox, more than the one response a request
// allows.
func TestNodeUserCarriesAForwardedStream(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const domain = "stream.beam.directory"
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true,
		Nkeys: []*server.NkeyUser{{Nkey: pub, Permissions: NodePermissions(domain)}}})
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(10*time.Second))
	node := func(id string) *Node {
		n := sealNode(t, id, testClusterKey)
		n.cfg.Domain = domain
		nc, err := nats.Connect(s.ClientURL(), nats.Nkey(pub, kp.Sign),
			nats.CustomInboxPrefix(federation.InboxPrefix(domain)))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		n.nc = nc
		return n
	}
	caller, answerer := node("caller"), node("answerer")
	require.NoError(t, answerer.startStreams(ctx))
	require.NoError(t, answerer.nc.Flush())
	t.Cleanup(answerer.streams.close)

	h := countingStream(nil)
	answerer.callNext.Store(&h)

	rctx, disconnect := context.WithCancel(ctx)
	defer disconnect()
	r, err := http.NewRequestWithContext(rctx, http.MethodGet, "/api/v1/mesh/env-1/events", nil)
	require.NoError(t, err)
	w := &flushRecorder{header: http.Header{}, writes: make(chan string, 1024)}
	p := directory.BusPrincipal{Agent: "creator@stream.beam.directory", Via: directory.BusAuthAPIKey}
	served := make(chan error, 1)
	go func() {
		_, err := caller.streamFrom(w, r, "answerer", p)
		served <- err
	}()
	for i := range 5 {
		select {
		case got := <-w.writes:
			require.Equal(t, "data: "+strconv.Itoa(i)+"\n\n", got)
		case err := <-served:
			t.Fatalf("the stream ended after %d chunks: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("chunk %d never came", i)
		}
	}
	disconnect()
	<-served
}
