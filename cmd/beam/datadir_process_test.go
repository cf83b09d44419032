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
// checks the directory is 0700 and the log's files 0600; then loosens them
// as a careless copy or an old version would and checks a restart
// tightens them again.
func TestDataFilesAreOwnerOnly(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	p := beamtest.Start(t, beamtest.Options{DataDir: dir})
	registerAgent(t, p.URL(), "perm@acme.beam.directory") // a write: -wal and -shm exist
	check := func() {
		t.Helper()
		st, err := os.Stat(dir)
		require.NoError(t, err)
		require.Equal(t, fs.FileMode(0o700), st.Mode().Perm(), "data directory")
		for _, name := range []string{"beam.db", "beam.db-wal", "beam.db-shm", "admin.token", "viewer.token"} {
			st, err := os.Stat(filepath.Join(dir, name))
			require.NoError(t, err)
			require.Equal(t, fs.FileMode(0o600), st.Mode().Perm(), name)
		}
	}
	check()
	p.Stop()
	require.NoError(t, os.Chmod(dir, 0o755))
	for _, name := range []string{"beam.db", "beam.db-wal", "beam.db-shm"} {
		if err := os.Chmod(filepath.Join(dir, name), 0o644); !errors.Is(err, os.ErrNotExist) {
			require.NoError(t, err)
		}
	}
	p.Restart()
	registerAgent(t, p.URL(), "perm2@acme.beam.directory")
	check()
}
