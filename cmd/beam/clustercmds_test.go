package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/federation/cluster"
)

// beam cluster init writes node1 … nodeN with their route credentials;
// without a domain or with a bad count it writes nothing and says why.
func TestClusterInitCommand(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	code, stdout, stderr := runCLI(t, "cluster", "init", "--nodes", "2", "--domain", "acme.beam.directory", "--out", out)
	require.Equal(t, 0, code, stderr)
	require.Contains(t, stdout, "wrote "+filepath.Join(out, "node2"))
	for _, n := range []string{"node1", "node2"} {
		_, err := cluster.LoadTrust(filepath.Join(out, n))
		require.NoError(t, err, n)
	}
	code, _, stderr = runCLI(t, "cluster", "init", "--nodes", "2", "--domain", "acme.beam.directory", "--out", out)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "exists")

	code, _, stderr = runCLI(t, "cluster", "init", "--out", t.TempDir())
	require.NotZero(t, code)
	require.Contains(t, stderr, "domain")
	code, _, stderr = runCLI(t, "cluster", "init", "--nodes", "0", "--domain", "acme.beam.directory", "--out", t.TempDir())
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--nodes 0")
	code, _, _ = runCLI(t, "cluster")
	require.Equal(t, 2, code)
}
