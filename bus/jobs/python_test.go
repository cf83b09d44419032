package jobs_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPythonClientInterop runs a standard-library Python client that signs
// every request exactly as the intent-bus 2.1.2 SDK does against a real
// beam serve: cross-language HMAC, the job lifecycle and the KV store.
func TestPythonClientInterop(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not installed")
	}
	b := startBus(t, "BUS_REQUIRE_SIGNATURES=true")
	script, err := filepath.Abs(filepath.Join("..", "..", "fixtures", "intent-python", "client.py"))
	require.NoError(t, err)
	for _, key := range []string{mainKey, b.newKey(t, "python")} {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		out, err := exec.CommandContext(ctx, py, script, b.url(), key, adminSecret).CombinedOutput()
		cancel()
		require.NoError(t, err, string(out))
		require.Equal(t, "OK\n", string(out))
	}
}
