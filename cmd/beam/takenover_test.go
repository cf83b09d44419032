package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSetLogAsideKeepsTheTakenOverLog: the log file and its -wal and -shm
// move aside under one name, nothing of the log is left in place, and a
// log without -wal/-shm files moves too.
func TestSetLogAsideKeepsTheTakenOverLog(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"beam.db", "beam.db-wal", "beam.db-shm"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(name), 0o600))
	}
	at := time.Unix(1700000000, 0)
	aside, err := setLogAside(dir, at)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "beam.db.taken-over-1700000000"), aside)
	for _, suffix := range []string{"", "-wal", "-shm"} {
		b, err := os.ReadFile(aside + suffix)
		require.NoError(t, err)
		require.Equal(t, "beam.db"+suffix, string(b))
		_, err = os.Stat(filepath.Join(dir, "beam.db"+suffix))
		require.ErrorIs(t, err, os.ErrNotExist)
	}

	require.NoError(t, os.WriteFile(filepath.Join(dir, "beam.db"), []byte("again"), 0o600))
	_, err = setLogAside(dir, at.Add(time.Second))
	require.NoError(t, err)
	_, err = setLogAside(dir, at.Add(2*time.Second))
	require.Error(t, err, "no log to set aside")
}
