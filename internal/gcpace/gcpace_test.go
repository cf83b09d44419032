package gcpace

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/beamdir/beam/internal/tricks"
	"github.com/stretchr/testify/require"
)

const mib = 1 << 20

// TestPercentBoundsHeadroomInBytes: a small live heap may grow by
// headroom, whatever its allocation rate; a large one that allocates little grows by about headroom
// between collections, down to minPercent; an allocation rate that would
// collect more often than once per minCycle keeps the headroom at what is
// allocated in minCycle.
func TestPercentBoundsHeadroomInBytes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name       string
		live, rate uint64
		want       int
	}{
		{"nothing live", 0, 0, defaultPercent},
		{"small heap", 20 * mib, 0, 160},
		{"tiny heap, busy", 4 * mib, 50 * mib, 800},
		{"half a MiB: held to the runtime's heap minimum", mib / 2, 0, 812},
		{"as large as the headroom", 32 * mib, 0, defaultPercent},
		{"as large as the headroom, busy", 32 * mib, 50 * mib, defaultPercent},
		{"twice the headroom", 64 * mib, 0, 50},
		{"very large", 1024 * mib, 0, minPercent},
		{"large and busy", 96 * mib, 10 * mib, defaultPercent},
		{"large, some traffic", 200 * mib, 8 * mib, 40},
		{"large, light traffic", 96 * mib, 1 * mib, 33},
	} {
		require.Equal(t, c.want, percent(c.live, headroom, c.rate), c.name)
	}
}

// TestPacerFollowsTheAllocationRate: a large heap that goes idle gets a
// lower percentage; the first second of a burst restores the default; the
// rate over the window keeps it up after the burst, until the burst has
// left the window; small changes are left alone.
func TestPacerFollowsTheAllocationRate(t *testing.T) {
	t.Parallel()
	live := uint64(128 * mib)
	var allocs uint64
	p := newPacer(allocs)

	pct, change := p.step(live, allocs)
	require.True(t, change)
	require.Equal(t, 25, pct, "idle: headroom over 128 MiB")
	pct, change = p.step(live, allocs)
	require.False(t, change, "nothing changed")
	require.Equal(t, 25, pct)

	allocs += 50 * mib // a second of a burst
	pct, change = p.step(live, allocs)
	require.True(t, change)
	require.Equal(t, defaultPercent, pct, "500 MiB in minCycle is more than what is live")

	pct, change = p.step(live, allocs)
	require.True(t, change)
	require.Equal(t, 39, pct, "the burst is over but within the window: 5 MiB/s, 50 MiB in minCycle")
	for range window - 2 {
		pct, change = p.step(live, allocs)
		require.False(t, change)
		require.Equal(t, 39, pct)
	}
	pct, change = p.step(live, allocs)
	require.True(t, change)
	require.Equal(t, 25, pct, "the burst left the window")

	pct, change = p.step(live+8*mib, allocs)
	require.False(t, change, "a live heap 8 MiB larger moves the percentage by less than 5")
	require.Equal(t, 25, pct)
}

// TestRunLeavesAnOperatorsGOGCAlone: with GOGC in the environment Run
// returns at once and the percentage stays the operator's.
func TestRunLeavesAnOperatorsGOGCAlone(t *testing.T) {
	t.Setenv("GOGC", "300")
	old := debug.SetGCPercent(300)
	defer debug.SetGCPercent(old)
	requireRunReturns(t)
	require.Equal(t, 300, debug.SetGCPercent(300))
}

// requireRunReturns requires Run to return at once.
func requireRunReturns(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan struct{})
	go func() {
		Run(ctx, slog.New(slog.DiscardHandler))
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		require.FailNow(t, "Run did not return")
	}
}

// gogc reads the GC percentage in force without changing it.
func gogc() int64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}

// TestRunLowersThePercentageOfALargeIdleHeap: with 256 MiB live and
// nothing allocated, Run sets minPercent within a few seconds, and puts
// back the percentage it found when it stops.
func TestRunLowersThePercentageOfALargeIdleHeap(t *testing.T) {
	old := debug.SetGCPercent(defaultPercent)
	defer debug.SetGCPercent(old)
	live := make([]byte, 256*mib)
	for i := range live {
		live[i] = byte(i)
	}
	runtime.GC() // the live heap metric is updated at the end of a collection
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, slog.New(slog.DiscardHandler))
		close(done)
	}()
	require.Eventually(t, func() bool { return gogc() == minPercent }, time.Minute, 50*time.Millisecond)
	cancel()
	<-done
	require.Equal(t, int64(defaultPercent), gogc())
	runtime.KeepAlive(live)
}

// TestRunRaisesThePercentageOfASmallHeap: a test process's live heap is a
// few MiB; Run lets it grow by headroom, so the runtime's heap goal rises
// to about headroom, where the default would collect every few MiB.
func TestRunRaisesThePercentageOfASmallHeap(t *testing.T) {
	old := debug.SetGCPercent(defaultPercent)
	defer debug.SetGCPercent(old)
	runtime.GC()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, slog.New(slog.DiscardHandler))
		close(done)
	}()
	goal := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	require.Eventually(t, func() bool {
		metrics.Read(goal)
		return gogc() > defaultPercent && goal[0].Value.Uint64() >= headroom*9/10
	}, time.Minute, 50*time.Millisecond)
	require.Less(t, goal[0].Value.Uint64(), uint64(2*headroom),
		"the goal is about headroom: the runtime's heap minimum, scaled by the percentage, must not raise it")
	cancel()
	<-done
	require.Equal(t, int64(defaultPercent), gogc())
}

// TestReleaseOnlyTheExcessOfAQuietHeap: the pages a heap holds beyond its
// goal are returned once it is quiet and they are at least headroom; not
// while it allocates enough to use them within minCycle, and not again
// within releaseGap.
func TestReleaseOnlyTheExcessOfAQuietHeap(t *testing.T) {
	t.Parallel()
	var allocs uint64
	p := newPacer(allocs)
	p.step(100*mib, allocs)

	require.False(t, p.release(150*mib, 130*mib), "20 MiB over the goal is less than headroom")
	require.False(t, p.release(100*mib, 130*mib), "under the goal")

	allocs += 10 * mib
	p.step(100*mib, allocs)
	require.False(t, p.release(200*mib, 130*mib), "10 MiB/s would use 70 MiB within minCycle")

	p.step(100*mib, allocs)
	require.True(t, p.release(200*mib, 130*mib), "quiet, 70 MiB over the goal")
	for range int(releaseGap/interval) - 1 {
		p.step(100*mib, allocs)
		require.False(t, p.release(200*mib, 130*mib), "within releaseGap of the last release")
	}
	p.step(100*mib, allocs)
	require.True(t, p.release(200*mib, 130*mib), "releaseGap later")
}

// TestRunReturnsTheExcessOfAQuietHeap: after 200 MiB of garbage is
// collected, the runtime keeps the free pages (its scavenger returns them
// over minutes); Run returns them within seconds.
func TestRunReturnsTheExcessOfAQuietHeap(t *testing.T) {
	old := debug.SetGCPercent(defaultPercent)
	defer debug.SetGCPercent(old)
	garbage := make([][]byte, 0, 200)
	for range 200 {
		garbage = append(garbage, make([]byte, mib))
	}
	runtime.KeepAlive(garbage)
	garbage = nil
	runtime.GC()
	free := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(free)
	require.Greater(t, free[0].Value.Uint64(), uint64(150*mib), "the collected garbage is held as free pages")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		run(ctx, slog.New(slog.DiscardHandler))
		close(done)
	}()
	require.Eventually(t, func() bool {
		metrics.Read(free)
		return free[0].Value.Uint64() < headroom
	}, time.Minute, 50*time.Millisecond)
	cancel()
	<-done
}

// TestRunIsOffUnderBEAM_TRICKS_OFF: with BEAM_TRICKS_OFF=gcpace Run returns
// at once and leaves the percentage alone. The switch is read once per
// process, so a process of its own runs the check.
func TestRunIsOffUnderBEAM_TRICKS_OFF(t *testing.T) {
	if tricks.On("gcpace") {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRunIsOffUnderBEAM_TRICKS_OFF$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), tricks.EnvVar+"=gcpace")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		require.Contains(t, string(out), "--- PASS: TestRunIsOffUnderBEAM_TRICKS_OFF")
		return
	}
	old := debug.SetGCPercent(defaultPercent)
	defer debug.SetGCPercent(old)
	live := make([]byte, 256*mib) // would be paced down to minPercent
	runtime.GC()
	requireRunReturns(t)
	require.Equal(t, int64(defaultPercent), gogc())
	runtime.KeepAlive(live)
}
