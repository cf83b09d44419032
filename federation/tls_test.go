package federation

import (
	"bufio"
	"crypto/ed25519"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

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
