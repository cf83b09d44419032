package mesh

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestGoWarmRunsEveryFunctionOnceAndWorkersEndWithTheEngine: work handed
// to hop workers, some waiting and some new, runs exactly once each, and
// no worker outlives the engine's stop.
func TestGoWarmRunsEveryFunctionOnceAndWorkersEndWithTheEngine(t *testing.T) {
	base := runtime.NumGoroutine()
	// Workers wait for work far longer than the test: only the stop can
	// end them.
	e := &Engine{warm: make(chan func()), idle: time.Hour}
	e.stop = e.loop.Stopping()
	const n = 2000
	var ran [n]atomic.Int32
	var wg sync.WaitGroup
	for round := 0; round < 4; round++ {
		for i := round * n / 4; i < (round+1)*n/4; i++ {
			wg.Add(1)
			e.goWarm(func() {
				defer wg.Done()
				ran[i].Add(1)
			})
		}
		wg.Wait() // the next round finds workers waiting
	}
	for i := range ran {
		require.Equal(t, int32(1), ran[i].Load(), "function %d", i)
	}
	require.Greater(t, runtime.NumGoroutine(), base, "workers wait for more work")
	e.loop.Close()
	// Polled here: require.Eventually's own goroutines would be counted.
	for deadline := time.Now().Add(20 * time.Second); runtime.NumGoroutine() > base; {
		require.True(t, time.Now().Before(deadline), "%d goroutines left, %d before", runtime.NumGoroutine(), base)
		time.Sleep(5 * time.Millisecond)
	}
}
