package main

import (
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation"
	"github.com/beamdir/beam/internal/beamtest"
)

// TestServeReportsTheBoundNATSAddress starts federation on port 0 and reads
// the port the embedded NATS server bound from the process's "federation:"
// line, so that process tests need not pick ports by listening and closing.
func TestServeReportsTheBoundNATSAddress(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--domain", "bound.beam.directory", "--nats-listen", "127.0.0.1:0"}})
	line := p.FederationLine()
	require.NotEmpty(t, line, p.Output())
	peer, err := federation.ParsePeerLine(line)
	require.NoError(t, err)
	require.Equal(t, "bound.beam.directory", peer.Domain)
	u, err := url.Parse(peer.URL)
	require.NoError(t, err)
	require.NotEqual(t, "0", u.Port(), line)
	conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
	require.NoError(t, err, "the NATS server listens where the line says")
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	buf := make([]byte, 4)
	_, err = conn.Read(buf)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(buf), "INFO"), "a NATS server greets with INFO, got %q", buf)
}
