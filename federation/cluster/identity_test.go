package cluster

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// jetStream starts an embedded NATS server with JetStream on a random
// loopback port and returns a JetStream context on it.
func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	_, js := jetStreamServer(t)
	return js
}

// jetStreamServer is jetStream that also returns the server.
func jetStreamServer(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(s.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return s, js
}

// stoppableServer starts an embedded NATS server with JetStream on a
// loopback port and returns it with its options, which start it again on
// the same port and store once it is shut down (restartServer).
func stoppableServer(t *testing.T) (*server.Server, *server.Options) {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true}
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	s.Start()
	t.Cleanup(s.Shutdown)
	require.True(t, s.ReadyForConnections(10*time.Second))
	opts.Port = s.Addr().(*net.TCPAddr).Port
	return s, opts
}

// restartServer starts the server of opts again.
func restartServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	back, err := server.NewServer(opts)
	require.NoError(t, err)
	back.Start()
	t.Cleanup(back.Shutdown)
	require.True(t, back.ReadyForConnections(10*time.Second))
	return back
}

func TestCheckIdentityRefusesAnotherDirectoryKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js := jetStream(t)
	node := func(key string) *Node {
		return &Node{cfg: Config{Domain: "acme.beam.directory", NodeID: "n", Replicas: 1, DirectoryKey: key}, lg: beamtest.Logger(t)}
	}
	first := "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	require.NoError(t, node(first).checkIdentity(ctx, js), "the first node announces its key")
	require.NoError(t, node(first).checkIdentity(ctx, js), "a node with the same key joins")
	err := node("BBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBBB").checkIdentity(ctx, js)
	require.ErrorIs(t, err, errDirectoryKeyMismatch)
	require.Contains(t, err.Error(), first)
	require.NoError(t, node("").checkIdentity(ctx, js), "no key: no check")
}
