package gcpace

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// Headroom is the heap growth between collections that Run aims for once
// the live heap is larger than it and the process allocates little, and
// the least it lets any heap grow: a small live heap would otherwise be
// collected every few megabytes of allocation under load.
const Headroom = 32 << 20

// MinCycle bounds how often a lowered percentage may make the collector
// run at the current allocation rate: the headroom is never less than
// what the process allocates in MinCycle, so the live heap is marked at
// most once per MinCycle more than the runtime's default would, and a busy
// directory keeps the default.
const MinCycle = 10 * time.Second

// DefaultPercent is the runtime's default GC percentage: the heap may grow
// by as much as is live. Run lets a heap larger than Headroom grow by no
// more than that, and a smaller one by Headroom; MinPercent bounds the
// extra collections of a very large live heap.
const (
	MinPercent     = 25
	DefaultPercent = 100
)

// interval is how often Run samples the heap; window is how many intervals
// the allocation rate is taken over (the larger of that and the last
// interval's rate counts, so a burst is seen at once).
const (
	interval = time.Second
	window   = 10
)

// Percent returns the GC percentage that lets a heap with live bytes in
// use grow by headroom bytes, or by what it allocates in MinCycle at
// ratePerSec bytes a second if that is more, before the next collection;
// but by no more than the larger of headroom and live (the runtime's
// default), and by no less than MinPercent of live.
func Percent(live, headroom, ratePerSec uint64) int {
	if live == 0 {
		return DefaultPercent
	}
	grow := max(headroom, ratePerSec*uint64(MinCycle/time.Second))
	grow = min(grow, max(live, headroom))
	return int(max(grow*100/live, MinPercent))
}

// pacer turns samples of the live heap and of the bytes allocated so far,
// one per interval, into GC percentages.
type pacer struct {
	allocs  [window + 1]uint64 // cumulative allocations, a ring of samples
	k       int                // samples taken
	current int                // the percentage in force
}

func newPacer(allocs uint64) *pacer {
	p := &pacer{current: DefaultPercent}
	for i := range p.allocs {
		p.allocs[i] = allocs
	}
	return p
}

// step takes one interval's sample and returns the percentage to set, and
// false when the one in force should stay (the same, or a change too small
// to be worth a new heap goal).
func (p *pacer) step(live, allocs uint64) (int, bool) {
	p.k++
	n := len(p.allocs)
	p.allocs[p.k%n] = allocs
	last := allocs - p.allocs[(p.k-1)%n]
	overWindow := (allocs - p.allocs[(p.k+1)%n]) / window
	perSec := uint64(float64(max(last, overWindow)) / interval.Seconds())
	next := Percent(live, Headroom, perSec)
	if next == p.current || (next != DefaultPercent && next != MinPercent && abs(next-p.current) < max(5, p.current/10)) {
		return p.current, false
	}
	p.current = next
	return next, true
}

// Run sets the GC percentage from the live heap and the allocation rate
// (Percent with Headroom) every second until ctx ends, and then restores
// the one it found. It returns at once when the environment sets GOGC.
func Run(ctx context.Context, logger *slog.Logger) {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	samples := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(samples)
	for _, s := range samples {
		if s.Value.Kind() != metrics.KindUint64 {
			logger.Warn("gc pacing off: the runtime does not report " + s.Name)
			return
		}
	}
	p := newPacer(samples[1].Value.Uint64())
	// Start from the default; the one found is put back when Run ends.
	defer debug.SetGCPercent(debug.SetGCPercent(DefaultPercent))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(samples)
		if pct, change := p.step(samples[0].Value.Uint64(), samples[1].Value.Uint64()); change {
			debug.SetGCPercent(pct)
			logger.Debug("gc percentage", "percent", pct, "liveHeapBytes", samples[0].Value.Uint64())
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
