package federation

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// The messages every node of a forming cluster prints are debug detail;
// a refused route handshake and an authorization violation stay warnings.
func TestNATSLoggerQuietsFormingCluster(t *testing.T) {
	t.Parallel()
	m, err := newMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	var buf bytes.Buffer
	l := &natsLogger{lg: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})), m: m}
	l.Errorf("Error trying to connect to route (attempt %d): %v", 1, "dial tcp 127.0.0.1:1: connect: connection refused")
	l.Warnf("Waiting for routing to be established...")
	l.Warnf("JetStream has not established contact with a meta leader")
	require.Empty(t, buf.String())
	l.Errorf("TLS route handshake error: %v", "tls: certificate required")
	l.Errorf("Authorization Violation")
	require.Contains(t, buf.String(), "level=WARN msg=\"TLS route handshake error")
	require.Contains(t, buf.String(), "Authorization Violation")
}
