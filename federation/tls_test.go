package federation

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/agents"
	"github.com/beamdir/beam/agents/wire"
)

// TestFederationPlaintextClientIsRefused speaks the NATS protocol in clear
// text to a directory's embedded server, as an eavesdropper's peer would:
// the server demands TLS and never answers a plaintext CONNECT.
func TestFederationPlaintextClientIsRefused(t *testing.T) {
	t.Parallel()
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	c, err := net.DialTimeout("tcp", beta.natsAddr, 5*time.Second)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	rd := bufio.NewReader(c)
	info, err := rd.ReadString('\n')
	require.NoError(t, err)
	require.Contains(t, info, `"tls_required":true`)

	_, err = c.Write([]byte("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n"))
	require.NoError(t, err)
	rest, err := rd.ReadString('\n')
	require.Error(t, err, "the server must close a plaintext connection, got %q", rest)
	require.NotContains(t, rest, "PONG")
}

// TestFederationWrongCertificateIsRefused dials a directory's NATS server
// pinning another key, as a directory whose peer line was redirected to an
// impostor would: the TLS handshake fails before any credential is sent.
// With the right pin the same client gets through.
func TestFederationWrongCertificateIsRefused(t *testing.T) {
	t.Parallel()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	pin(t, alpha, beta)
	kp, err := nkeyPair(alpha.key)
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)

	otherPub, _, err := wire.GenerateKey()
	require.NoError(t, err)
	_, err = nats.Connect("nats://"+beta.natsAddr, nats.Secure(PeerTLS(otherPub)), nats.Nkey(pub, kp.Sign))
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "pinned directory key"), err.Error())

	betaPub := ed25519.PrivateKey(beta.key).Public().(ed25519.PublicKey)
	nc, err := nats.Connect("nats://"+beta.natsAddr, nats.Secure(PeerTLS(betaPub)), nats.Nkey(pub, kp.Sign))
	require.NoError(t, err, "the pinned key is accepted")
	nc.Close()
}

// TestFederationRedirectedPeerIsRefused plays an attacker who controls the
// route to beta: alpha's connection to beta's address lands on an impostor
// that calls itself beta.beam.directory and even admits alpha. The pinned
// key in beta's line makes the TLS handshake fail, so no intent of alpha's
// reaches the impostor's server, let alone its "b@beta".
func TestFederationRedirectedPeerIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	alpha := startDir(t, "alpha.beam.directory", "", "", nil)
	beta := startDir(t, "beta.beam.directory", "", "", nil)
	impostor := startDir(t, "beta.beam.directory", "", "", nil)
	require.NoError(t, impostor.node.AddPeer(ctx, alpha.node.Self()))
	redirected := beta.node.Self()
	redirected.URL = impostor.node.Self().URL
	require.NoError(t, alpha.node.AddPeer(ctx, redirected))

	// The impostor listens to everything on its server.
	kp, err := nkeyPair(impostor.key)
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	spy, err := nats.Connect("nats://"+impostor.natsAddr,
		nats.Secure(PeerTLS(ed25519.PrivateKey(impostor.key).Public().(ed25519.PublicKey))), nats.Nkey(pub, kp.Sign))
	require.NoError(t, err)
	defer spy.Close()
	var seen atomic.Int64
	_, err = spy.Subscribe(subjectPrefix+".>", func(*nats.Msg) { seen.Add(1) })
	require.NoError(t, err)
	require.NoError(t, spy.Flush())

	var handled atomic.Int64
	b := impostor.agent("b")
	b.Handle("task", func(context.Context, *agents.Intent) agents.Reply {
		handled.Add(1)
		return agents.Success(map[string]any{"stolen": true})
	})
	require.NoError(t, b.Connect(ctx))

	a := alpha.agent("a")
	sctx, cancel := context.WithTimeout(ctx, 8*time.Second)
	defer cancel()
	res, err := a.Send(sctx, "b@beta.beam.directory", "task", map[string]any{"secret": 1})
	require.Error(t, err, "the intent must not be answered by the impostor: %+v", res)
	require.Zero(t, handled.Load(), "the impostor's agent received alpha's intent")
	require.Zero(t, seen.Load(), "the impostor's server saw alpha's federation traffic")
}
