package main

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// TestDataFilesAreOwnerOnly starts a server on a fresh data directory and
// checks the directory is 0700 and the log's files and every secret file
// 0600; then loosens them all to 0644, as a careless copy or an old
// version would, and checks a restart tightens every one of them again.
// The cluster's secret files (written by beam cluster init) are laid down
// loose before the restart to check they are tightened too.
func TestDataFilesAreOwnerOnly(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	// Federation on: the directory key exists too.
	p := beamtest.Start(t, beamtest.Options{DataDir: dir, Args: []string{"--domain", "acme.beam.directory",
		"--nats-listen", freeAddr(t)}})
	registerAgent(t, p.URL(), "perm@acme.beam.directory") // a write: -wal and -shm exist
	secrets := []string{"beam.db", "beam.db-wal", "beam.db-shm", "admin.token", "viewer.token", "directory.key",
		"attestation.key", "intent.secret", "beam.lock"}
	clusterSecrets := []string{"cluster.node", "cluster-node.key", "cluster-route.secret"}
	check := func(names []string) {
		t.Helper()
		st, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o700), st.Mode().Perm(), "data directory")
		for _, name := range names {
			st, err := os.Stat(filepath.Join(dir, name))
			require.NoError(t, err)
			require.Equal(t, fs.FileMode(0o600), st.Mode().Perm(), name)
		}
	}
	check(secrets)
	p.Stop()
	require.NoError(t, os.Chmod(dir, 0o755))
	for _, name := range secrets {
		if err := os.Chmod(filepath.Join(dir, name), 0o644); !errors.Is(err, os.ErrNotExist) {
			require.NoError(t, err)
		}
	}
	for _, name := range clusterSecrets {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("unused by a single node\n"), 0o644))
	}
	p.Restart()
	registerAgent(t, p.URL(), "perm2@acme.beam.directory")
	check(append(secrets, clusterSecrets...))
}
