package gcpace

import (
	"context"
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/beamdir/beam/internal/tricks"
)

// headroom is the heap growth between collections that Run aims for once
// the live heap is larger than it and the process allocates little, and
// the least it lets any heap grow: a small live heap would otherwise be
// collected every few megabytes of allocation under load.
const headroom = 32 << 20

// minCycle bounds how often a lowered percentage may make the collector
// run at the current allocation rate: the headroom is never less than
// what the process allocates in minCycle, so the live heap is marked at
// most once per minCycle more than the runtime's default would, and a busy
// directory keeps the default.
const minCycle = 10 * time.Second

// defaultPercent is the runtime's default GC percentage: the heap may grow
// by as much as is live. Run lets a heap larger than headroom grow by no
// more than that, and a smaller one by headroom; minPercent bounds the
// extra collections of a very large live heap.
const (
	minPercent     = 25
	defaultPercent = 100
)

// releaseGap is the least time between two returns of the heap's excess
// to the system (see release): each costs a forced collection.
const releaseGap = 30 * time.Second

// interval is how often Run samples the heap; window is how many intervals
// the allocation rate is taken over (the larger of that and the last
// interval's rate counts, so a burst is seen at once).
const (
	interval = time.Second
	window   = 10
)

// percent returns the GC percentage that lets a heap grow by room
// bytes, or by what it allocates in minCycle at ratePerSec bytes a second
// if that is more, before the next collection; but by no more than the
// larger of room and base (the runtime's default), and by no less than
// minPercent of base. base is what the runtime scales the percentage by:
// the live heap plus the goroutine stacks and globals it scans.
//
// The runtime never lets its heap goal fall below heapMinimum scaled by
// the percentage, so for a tiny base the percentage is also kept low
// enough that this minimum is no more than base plus the growth.
func percent(base, room, ratePerSec uint64) int {
	if base == 0 {
		return defaultPercent
	}
	grow := max(room, ratePerSec*uint64(minCycle/time.Second))
	grow = min(grow, max(base, room))
	pct := min(grow*100/base, (base+grow)*100/heapMinimum)
	return int(max(pct, minPercent))
}

// heapMinimum is the runtime's least heap goal at the default percentage
// (4 MiB, scaled by the percentage in force).
const heapMinimum = 4 << 20

// pacer turns samples of the GC's base (see percent) and of the bytes
// allocated so far, one per interval, into GC percentages and decisions to
// release the heap's excess.
type pacer struct {
	allocs  [window + 1]uint64 // cumulative allocations, a ring of samples
	k       int                // samples taken
	current int                // the percentage in force
	// released is the sample (k) of the last release, or -1.
	released int
}

func newPacer(allocs uint64) *pacer {
	p := &pacer{current: defaultPercent, released: -1}
	for i := range p.allocs {
		p.allocs[i] = allocs
	}
	return p
}

// step takes one interval's sample and returns the percentage to set, and
// false when the one in force should stay (the same, or a change too small
// to be worth a new heap goal).
func (p *pacer) step(base, allocs uint64) (int, bool) {
	p.k++
	n := len(p.allocs)
	p.allocs[p.k%n] = allocs
	last := p.lastBytes()
	overWindow := (allocs - p.allocs[(p.k+1)%n]) / window
	perSec := uint64(float64(max(last, overWindow)) / interval.Seconds())
	next := percent(base, headroom, perSec)
	if next == p.current || (next != defaultPercent && next != minPercent && abs(next-p.current) < max(5, p.current/10)) {
		return p.current, false
	}
	p.current = next
	return next, true
}

// lastBytes is what the process allocated in the last interval sampled.
func (p *pacer) lastBytes() uint64 {
	n := len(p.allocs)
	return p.allocs[p.k%n] - p.allocs[(p.k+n-1)%n]
}

// release reports whether the heap's excess should be returned to the
// system now, given the bytes the heap holds in the process's memory
// (objects, unused parts of spans, and free pages not yet returned) and the
// heap goal in force. The excess is what the heap holds beyond its goal:
// pages the heap will not grow into before its next collection (a heap
// that allocates steadily holds about its goal). There is such an excess
// when the goal falls: after a burst, once the pacer lowers the
// percentage, or when many sessions end at once. It is returned when it is
// at least headroom, the last interval allocated less than it in minCycle
// (the process has gone quiet), and no release happened within releaseGap.
// The runtime's own scavenger returns such pages too, but over minutes.
func (p *pacer) release(held, goal uint64) bool {
	if held < goal || held-goal < headroom {
		return false
	}
	rate := uint64(float64(p.lastBytes()) / interval.Seconds())
	if rate*uint64(minCycle/time.Second) >= held-goal {
		return false
	}
	if p.released >= 0 && p.k-p.released < int(releaseGap/interval) {
		return false
	}
	p.released = p.k
	return true
}

// sampled are the runtime metrics Run reads, indexed by the s constants.
var sampled = [...]string{
	sLive:    "/gc/heap/live:bytes",
	sAllocs:  "/gc/heap/allocs:bytes",
	sGoal:    "/gc/heap/goal:bytes",
	sObjects: "/memory/classes/heap/objects:bytes",
	sUnused:  "/memory/classes/heap/unused:bytes",
	sFree:    "/memory/classes/heap/free:bytes",
	sStacks:  "/gc/scan/stack:bytes",
	sGlobals: "/gc/scan/globals:bytes",
}

// Indexes into sampled.
const (
	sLive = iota
	sAllocs
	sGoal
	sObjects
	sUnused
	sFree
	sStacks
	sGlobals
)

// Run sets the GC percentage from the GC's base and the allocation rate
// (percent with headroom) every second, and returns the heap's excess to
// the system once the process goes quiet (release), until ctx ends; then it
// restores the percentage it found. It returns at once when the environment
// sets GOGC or turns the trick off (BEAM_TRICKS_OFF=gcpace).
func Run(ctx context.Context, logger *slog.Logger) {
	if _, set := os.LookupEnv("GOGC"); set || !tricks.On("gcpace") {
		return
	}
	run(ctx, logger)
}

// run is Run without its checks of the environment.
func run(ctx context.Context, logger *slog.Logger) {
	samples := make([]metrics.Sample, len(sampled))
	for i, name := range sampled {
		samples[i].Name = name
	}
	v := func(i int) uint64 { return samples[i].Value.Uint64() }
	metrics.Read(samples)
	for _, s := range samples {
		if s.Value.Kind() != metrics.KindUint64 {
			logger.Warn("gc pacing off: the runtime does not report " + s.Name)
			return
		}
	}
	p := newPacer(v(sAllocs))
	// Start from the default; the one found is put back when Run ends.
	defer debug.SetGCPercent(debug.SetGCPercent(defaultPercent))
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		metrics.Read(samples)
		base := v(sLive) + v(sStacks) + v(sGlobals)
		if pct, change := p.step(base, v(sAllocs)); change {
			debug.SetGCPercent(pct)
			logger.Debug("gc percentage", "percent", pct, "liveHeapBytes", v(sLive), "baseBytes", base)
			metrics.Read(samples) // the goal of the new percentage
		}
		held := v(sObjects) + v(sUnused) + v(sFree)
		if goal := v(sGoal); p.release(held, goal) {
			debug.FreeOSMemory()
			logger.Debug("returned the heap's excess to the system", "heldBytes", held, "goalBytes", goal)
		}
	}
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
