package replay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSetRefusesReplayUntilExpiry(t *testing.T) {
	var s Set
	now := time.Unix(1000, 0)
	exp := now.Add(10 * time.Minute)
	require.True(t, s.Use("k\x00n1", now, exp))
	require.False(t, s.Use("k\x00n1", now.Add(time.Minute), exp.Add(time.Hour)), "a replay inside the window is refused")
	require.True(t, s.Seen("k\x00n1", exp.Add(-time.Second)))
	require.False(t, s.Seen("k\x00n1", exp))
	require.True(t, s.Use("k\x00n1", exp, exp.Add(time.Minute)), "an expired nonce may be used again")
}

func TestSetSweep(t *testing.T) {
	var s Set
	now := time.Unix(1000, 0)
	require.True(t, s.Use("a\x001", now, now.Add(time.Second)))
	require.True(t, s.Use("a\x002", now, now.Add(time.Hour)))
	require.True(t, s.Use("b\x001", now, now.Add(time.Hour)))
	require.Equal(t, 1, s.Sweep(now.Add(time.Second), nil))
	require.Equal(t, 2, s.Len())
	require.Equal(t, 0, s.Sweep(time.Time{}, nil), "the zero now expires nothing")
	require.Equal(t, 1, s.Sweep(time.Time{}, func(k string) bool { return strings.HasPrefix(k, "a\x00") }))
	require.Equal(t, 1, s.Len())
}
