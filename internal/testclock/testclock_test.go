package testclock

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestClockMovesOnlyWhenAdvanced(t *testing.T) {
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	c := New(start)
	require.Equal(t, start, c.Now())
	require.Equal(t, start, c.Now())
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { c.Advance(time.Second) })
	}
	wg.Wait()
	require.Equal(t, start.Add(8*time.Second), c.Now())
	n := NewNow()
	require.Equal(t, n.Now(), n.Now().Truncate(time.Millisecond))
}
