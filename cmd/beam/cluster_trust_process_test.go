package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/beamtest"
)

// argValue is the value following flag in args (the last one wins, as in
// beam serve).
func argValue(t *testing.T, args []string, flag string) string {
	t.Helper()
	v := ""
	for i, a := range args {
		if a == flag && i+1 < len(args) {
			v = args[i+1]
		}
	}
	require.NotEmpty(t, v, "no %s in %v", flag, args)
	return v
}

// selfSignedRouteTLS is the route TLS of a stranger: a certificate of its
// own for the cluster's route name, and no check of the node's.
func selfSignedRouteTLS(t *testing.T) *tls.Config {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rogue"},
		DNSNames: []string{"route." + clusterDomain}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	require.NoError(t, err)
	return &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: true, //nolint:gosec // the stranger trusts anyone
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: priv}}}
}

// rogueRouteServer starts a nats-server with the cluster's name that
// dials routeAddr as a route: plaintext without credentials (routeTLS
// nil, as any server could join a cluster started without a secret), or
// with routeTLS and a guessed route user.
func rogueRouteServer(t *testing.T, routeAddr string, routeTLS *tls.Config) *server.Server {
	t.Helper()
	u := &url.URL{Scheme: "nats-route", Host: routeAddr}
	if routeTLS != nil {
		u.User = url.UserPassword("beam-route", "guessed")
	}
	opts := &server.Options{ServerName: "rogue", Host: "127.0.0.1", Port: server.RANDOM_PORT, NoSigs: true, NoLog: true,
		Cluster: server.ClusterOpts{Name: "beam-" + federation.Token(clusterDomain), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			TLSConfig: routeTLS, TLSTimeout: 2},
		Routes: []*url.URL{u}}
	ns, err := server.NewServer(opts)
	require.NoError(t, err)
	go ns.Start()
	require.True(t, ns.ReadyForConnections(10*time.Second))
	t.Cleanup(ns.Shutdown)
	return ns
}

// streamNames lists the JetStream streams a client of ns can reach: none
// unless ns is a member of a cluster with JetStream.
func streamNames(t *testing.T, ctx context.Context, ns *server.Server) []string {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var names []string
	l := js.StreamNames(lctx)
	for n := range l.Name() {
		names = append(names, n)
	}
	return names
}

// clusterRouteStrangerRefused: a nats-server of the test's
// own, configured with the cluster's name, dials a node's route listener,
// once in plaintext without credentials and once over TLS with a
// certificate of its own and a guessed route password. The node refuses
// both handshakes; the stranger never becomes a route and reaches none of
// the cluster's streams. A node whose data directory lacks the route
// credentials does not start, and says how to make them.
func clusterRouteStrangerRefused(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	routeAddr := argValue(t, nodes[0].Args, "--cluster-listen")

	for name, routeTLS := range map[string]*tls.Config{"plaintext": nil, "own certificate": selfSignedRouteTLS(t)} {
		before := strings.Count(nodes[0].Output(), "route handshake error")
		rogue := rogueRouteServer(t, routeAddr, routeTLS)
		// The node refused a handshake of the stranger, or it joined.
		require.Eventually(t, func() bool {
			return rogue.NumRoutes() > 0 || strings.Count(nodes[0].Output(), "route handshake error") > before
		}, 30*time.Second, 20*time.Millisecond, name)
		require.Zero(t, rogue.NumRoutes(), "%s: the stranger became a route of the cluster", name)
		require.Empty(t, streamNames(t, ctx, rogue), "%s: the stranger reached the cluster's streams", name)
		rogue.Shutdown()
	}

	// Without route credentials a node does not start.
	out, err := beamtest.Run(t, ctx, "serve", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--intent-listen", "127.0.0.1:0",
		"--domain", clusterDomain, "--cluster", "--cluster-listen", freeAddr(t))
	require.Error(t, err, out)
	require.Contains(t, out, "no route credentials")
	require.Contains(t, out, "beam cluster init --nodes N --domain D --out DIR")
}

// peerRequest is a resolve request of the pinned peer peerDomain (key
// priv) to the cluster, sealed as a federation message.
func peerRequest(t *testing.T, peerDomain string, priv ed25519.PrivateKey) []byte {
	t.Helper()
	id := make([]byte, 16)
	_, err := rand.Read(id)
	require.NoError(t, err)
	now := time.Now()
	payload, err := json.Marshal(federation.Message{Kind: federation.KindResolve, ID: hex.EncodeToString(id), From: peerDomain,
		To: clusterDomain, IssuedAt: now.UnixMilli(), Expires: now.Add(time.Minute).UnixMilli(), BeamID: "alice@" + clusterDomain})
	require.NoError(t, err)
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.EdDSA,
		Key: jose.JSONWebKey{Key: priv, KeyID: peerDomain, Algorithm: string(jose.EdDSA)}},
		(&jose.SignerOptions{}).WithType(federation.TypMessage))
	require.NoError(t, err)
	obj, err := signer.Sign(payload)
	require.NoError(t, err)
	tok, err := obj.CompactSerialize()
	require.NoError(t, err)
	return []byte(tok)
}

// directoryConn connects to a node's NATS server as the cluster's own
// directory (its nkey from the shared directory key).
func directoryConn(t *testing.T, natsAddr, dataDir string) *nats.Conn {
	t.Helper()
	priv, _, err := federation.LoadOrCreateKey(dataDir)
	require.NoError(t, err)
	return nkeyConn(t, natsAddr, priv, federation.PeerTLS(priv.Public().(ed25519.PublicKey)), "")
}

// nkeyConn connects to natsAddr with the nkey of directory key priv.
func nkeyConn(t *testing.T, natsAddr string, priv ed25519.PrivateKey, tc *tls.Config, inbox string) *nats.Conn {
	t.Helper()
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, priv.Seed())
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	o := []nats.Option{nats.Nkey(pub, kp.Sign), nats.Secure(tc)}
	if inbox != "" {
		o = append(o, nats.CustomInboxPrefix(inbox))
	}
	nc, err := nats.Connect("nats://"+natsAddr, o...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

// clusterPinnedPeerReplySubject: a pinned peer (its data directory
// peerDir), connected to a cluster node's NATS server with its own nkey,
// sends signed requests whose reply subjects name the cluster's JetStream:
// the directory-key entry of the cluster bucket, the registry stream's
// subject and the JetStream API. It also publishes to those subjects
// directly. Nothing is written: the announced directory key is unchanged
// and the registry stream holds no message of the peer (clusterRestarts
// shows the node restarts). A request with a reply in the peer's own inbox
// is answered.
func clusterPinnedPeerReplySubject(t *testing.T, nodes []*beamtest.Process, peerDir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	peerKey, _, err := federation.LoadOrCreateKey(peerDir)
	require.NoError(t, err)
	node0, err := federation.ParsePeerLine(nodes[0].FederationLine())
	require.NoError(t, err)
	natsAddr := strings.TrimPrefix(node0.URL, "nats://")
	const peerDomain = clusterPeerDomain

	tok := federation.Token(clusterDomain)
	self := directoryConn(t, natsAddr, nodes[0].DataDir)
	js, err := jetstream.New(self)
	require.NoError(t, err)
	kv, err := js.KeyValue(ctx, "BEAM_CLUSTER_"+tok)
	require.NoError(t, err)
	announced, err := kv.Get(ctx, "directory-key")
	require.NoError(t, err)
	registry, err := js.Stream(ctx, "BEAM_REGISTRY_"+tok)
	require.NoError(t, err)
	info, err := registry.Info(ctx)
	require.NoError(t, err)
	registrySeq := info.State.LastSeq

	clusterKey, _, err := federation.LoadOrCreateKey(nodes[0].DataDir)
	require.NoError(t, err)
	rogue := nkeyConn(t, natsAddr, peerKey, federation.PeerTLS(clusterKey.Public().(ed25519.PublicKey)), federation.InboxPrefix(peerDomain))
	subject := federation.Subject(clusterDomain, peerDomain, federation.KindResolve)
	targets := []string{"$KV.BEAM_CLUSTER_" + tok + ".directory-key", "beam.cluster." + tok + ".registry",
		"$JS.API.STREAM.DELETE.BEAM_REGISTRY_" + tok}
	for _, reply := range targets {
		require.NoError(t, rogue.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: peerRequest(t, peerDomain, peerKey)}))
		// Directly: refused by the server's permissions.
		require.NoError(t, rogue.Publish(reply, []byte("rogue")))
	}
	require.NoError(t, rogue.Flush())

	// A request into the peer's own inbox is answered.
	res, err := rogue.RequestWithContext(ctx, subject, peerRequest(t, peerDomain, peerKey))
	require.NoError(t, err)
	require.NotEmpty(t, res.Data)
	// Every hostile request was handled (refused or, on a server that
	// lets a peer choose where answers go, answered), by whichever node
	// took it.
	require.Eventually(t, func() bool {
		var out string
		for _, n := range nodes {
			out += n.Output()
		}
		return strings.Count(out, "reply subject") >= len(targets) || func() bool {
			e, err := kv.Get(ctx, "directory-key")
			return err == nil && e.Revision() != announced.Revision()
		}()
	}, 30*time.Second, 20*time.Millisecond)

	e, err := kv.Get(ctx, "directory-key")
	require.NoError(t, err)
	require.Equal(t, announced.Revision(), e.Revision(), "the peer overwrote the cluster's directory key with %q", e.Value())
	info, err = registry.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, registrySeq, info.State.LastSeq, "the peer wrote into the registry stream")
	names := slices.Collect(func(yield func(string) bool) {
		l := js.StreamNames(ctx)
		for n := range l.Name() {
			if !yield(n) {
				return
			}
		}
	})
	require.Contains(t, names, "BEAM_REGISTRY_"+tok)
}

// clusterRestarts: node 0 restarts after the pinned peer's requests
// (clusterPinnedPeerReplySubject) and every other test: its directory key
// is still the cluster's.
func clusterRestarts(t *testing.T, nodes []*beamtest.Process) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes[0].Restart()
	require.Equal(t, http.StatusNotFound, agentStatus(t, ctx, nodes[0].URL(), "nobody@"+clusterDomain))
}
