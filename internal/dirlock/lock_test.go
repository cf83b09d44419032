package dirlock

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSecondAcquireIsRefusedWithHolder(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	first, err := Acquire(dir)
	require.NoError(t, err)

	second, err := Acquire(dir)
	require.Nil(t, second)
	var held *HeldError
	require.True(t, errors.As(err, &held), "got %v", err)
	require.Equal(t, os.Getpid(), held.PID)
	require.Equal(t, filepath.Join(dir, FileName), held.Path)
	require.True(t, strings.Contains(err.Error(), filepath.Join(dir, FileName)), err.Error())

	require.NoError(t, first.Release())
	again, err := Acquire(dir)
	require.NoError(t, err, "the lock is free once released")
	require.NoError(t, again.Release())
	require.NoError(t, again.Release(), "a second release is harmless")
}
