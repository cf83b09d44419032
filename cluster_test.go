package beam

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/federation/cluster"
)

// freeRoutePort returns a loopback address nothing listens on.
func freeRoutePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// startClusterPair starts two in-process nodes of one cluster serving
// domain on a routed pair of embedded NATS servers, sharing one directory
// key, and serves both on loopback ports.
func startClusterPair(t *testing.T, domain string, tune ...func(*Config)) [2]*liveServer {
	t.Helper()
	dirs := [2]string{t.TempDir(), t.TempDir()}
	require.NoError(t, cluster.WriteNodeDirs(domain, dirs[:]))
	routes := [2]string{freeRoutePort(t), freeRoutePort(t)}
	return startPair(t, func(i int) Config {
		cfg := Config{DataDir: dirs[i], Domain: domain, Synchronous: "NORMAL", Logger: quietLogger(),
			DefaultPolicy: "allow", AdminToken: browserAdminToken, ViewerToken: browserViewerToken,
			Limits: &Limits{}, Cluster: Cluster{Enabled: true, NodeID: []string{"n0", "n1"}[i], Listen: routes[i],
				Routes: []string{"nats-route://" + routes[1-i]}, Replicas: 2}}
		for _, f := range tune {
			f(&cfg)
		}
		return cfg
	})
}

// startPair starts the servers of cfg(0) and cfg(1) together (a cluster
// forms only once both run) and serves both on loopback ports.
func startPair(t *testing.T, cfg func(i int) Config) [2]*liveServer {
	t.Helper()
	var (
		wg   sync.WaitGroup
		srvs [2]*Server
		errs [2]error
	)
	for i := range 2 {
		c := cfg(i)
		wg.Go(func() { srvs[i], errs[i] = New(context.Background(), c) })
	}
	wg.Wait()
	var out [2]*liveServer
	for i, s := range srvs {
		require.NoError(t, errs[i], "node %d", i)
		out[i] = serveLive(t, s)
	}
	return out
}

// TestClusterPeerFrameClaimsClusterNonce: the nodes take federation
// messages in one queue group, so a peer's retry of a frame may reach the
// other node. The same peer frame relayed on both nodes (as federation
// does after the queue group picked each) reaches the recipient once, even
// though the recipient moved to the second node in between: the second
// node answers IN_PROGRESS, which the peer's relay retries, and the node
// that accepted the frame answers a retry with its cached result.
func TestClusterPeerFrameClaimsClusterNonce(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	nodes := startClusterPair(t, domain)

	var delivered atomic.Int32
	aliceID, err := agents.GenerateIdentity("alice@" + domain)
	require.NoError(t, err)
	connect := func(base string) *agents.Client {
		c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: base, Identity: aliceID, APIKey: aliceID.APIKey,
			Logger: quietLogger(), ReconnectMin: 50 * time.Millisecond, ReconnectMax: 500 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		c.Handle("*", func(context.Context, *agents.Intent) agents.Reply {
			delivered.Add(1)
			return agents.Success(map[string]any{"ok": true})
		})
		return c
	}
	first := connect(nodes[0].url)
	res, err := first.Register(ctx, aliceID.BeamID, []string{"test"})
	require.NoError(t, err)
	aliceID.APIKey = res.APIKey
	first = connect(nodes[0].url)
	require.NoError(t, first.Connect(ctx))

	// A frame of a peer directory's agent, signed with its key.
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	const carol = "carol@beta.beam.directory"
	f := &wire.IntentFrame{Intent: "task.run", From: carol, To: aliceID.BeamID, Payload: json.RawMessage(`{}`),
		Nonce: "peer-retry-1", Timestamp: wire.FormatTimestamp(time.Now())}
	require.NoError(t, wire.SignIntent(f, priv))
	raw, err := f.DeliveryJSON()
	require.NoError(t, err)
	relay := func(n *liveServer) ([]byte, *directory.RelayError) {
		fr, err := wire.DecodeIntentFrame(raw)
		require.NoError(t, err)
		sender := directory.RemoteSender(carol, pub)
		return n.srv.dir.Relay(ctx, fr, directory.RelayOptions{Origin: directory.OriginFederation, Sender: &sender,
			Timeout: 20 * time.Second})
	}

	out, rerr := relay(nodes[0])
	require.Nil(t, rerr)
	require.Contains(t, string(out), `"success":true`)
	require.EqualValues(t, 1, delivered.Load())

	// Alice moves to node 1; node 1 sees her session there.
	require.NoError(t, first.Close())
	second := connect(nodes[1].url)
	require.NoError(t, second.Connect(ctx))
	require.Eventually(t, func() bool { return nodes[1].srv.dir.ConnectedAgents() == 1 }, 30*time.Second, 20*time.Millisecond)

	// The peer's retry reaches node 1: refused as in progress elsewhere,
	// not delivered again.
	_, rerr = relay(nodes[1])
	require.NotNil(t, rerr)
	require.Equal(t, directory.CodeInProgress, rerr.Code, rerr.Message)
	// A retry reaching node 0 gets the cached result.
	out, rerr = relay(nodes[0])
	require.Nil(t, rerr)
	require.Contains(t, string(out), `"success":true`)
	require.EqualValues(t, 1, delivered.Load(), "the peer frame reached alice once")
}

// TestClusterOnSharedNATSWithNodeUser: two nodes of a cluster on an
// external nats-server with JetStream (--nats-url) whose only user is the
// entry beam peer nats-user --cluster prints (cluster.NodePermissions):
// those permissions are enough to form the cluster, and an agent
// registered on one node is known to the other.
func TestClusterOnSharedNATSWithNodeUser(t *testing.T) {
	t.Parallel()
	const domain = "acme.beam.directory"
	dirs := []string{t.TempDir(), t.TempDir()}
	require.NoError(t, cluster.WriteNodeDirs(domain, dirs))
	priv, _, err := federation.LoadOrCreateKey(dirs[0])
	require.NoError(t, err)
	entry, err := federation.UserConfig(domain, priv.Public().(ed25519.PublicKey), cluster.NodePermissions(domain))
	require.NoError(t, err)
	conf := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(fmt.Sprintf("listen: 127.0.0.1:-1\njetstream { store_dir: %q }\n"+
		"authorization {\n  users = [\n%s\n  ]\n}\n", t.TempDir(), entry)), 0o600))
	opts, err := natsserver.ProcessConfigFile(conf)
	require.NoError(t, err)
	opts.NoLog, opts.NoSigs = true, true
	ns, err := natsserver.NewServer(opts)
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)

	nodes := startPair(t, func(i int) Config {
		return Config{DataDir: dirs[i], Domain: domain, Synchronous: "NORMAL", Logger: quietLogger(), Federation: Federation{NATSURL: ns.ClientURL()},
			DefaultPolicy: "allow", AdminToken: browserAdminToken, ViewerToken: browserViewerToken,
			Limits: &Limits{}, Cluster: Cluster{Enabled: true, Replicas: 1}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	id, err := agents.GenerateIdentity("alice@" + domain)
	require.NoError(t, err)
	c, err := agents.NewClient(agents.ClientConfig{DirectoryURL: nodes[0].url, Identity: id, Logger: quietLogger()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Register(ctx, id.BeamID, []string{"test"})
	require.NoError(t, err)
	resp, err := http.Get(nodes[1].url + "/agents/" + id.BeamID)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
