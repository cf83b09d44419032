package bench

import (
	"math"
	"slices"
	"sync"
	"time"
)

// maxSamples bounds the latencies a Recorder keeps; past it every later
// sample is still counted but only every k-th one is kept (k doubling), so
// memory stays bounded on very long steady-rate runs.
const maxSamples = 4 << 20

// recorder collects the outcome of each intent. It is safe for concurrent
// use.
type recorder struct {
	mu       sync.Mutex
	samples  []time.Duration
	stride   int64
	seen     int64
	ok       int64
	errors   int64
	byCode   map[string]int64
	maxLat   time.Duration
	capLimit int
}

// newRecorder returns an empty recorder.
func newRecorder() *recorder {
	return &recorder{stride: 1, byCode: map[string]int64{}, capLimit: maxSamples}
}

// Success records an intent whose result came back successfully after d.
func (r *recorder) Success(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ok++
	r.maxLat = max(r.maxLat, d)
	r.seen++
	if r.seen%r.stride != 0 {
		return
	}
	if len(r.samples) >= r.capLimit {
		// Keep every other sample and halve the sampling rate from now on.
		kept := r.samples[:0]
		for i := 0; i < len(r.samples); i += 2 {
			kept = append(kept, r.samples[i])
		}
		r.samples = kept
		r.stride *= 2
	}
	r.samples = append(r.samples, d)
}

// Failure records an intent that failed with code (an error code from the
// directory or the recipient, or a local one such as TIMEOUT).
func (r *recorder) Failure(code string) {
	if code == "" {
		code = "UNKNOWN"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors++
	if len(r.byCode) < 64 || r.byCode[code] > 0 {
		r.byCode[code]++
	} else {
		r.byCode["OTHER"]++
	}
}

// latencies is a snapshot of the recorded outcomes.
type latencies struct {
	// OK and Errors count the intents that succeeded and failed.
	OK, Errors int64
	// ErrorCodes counts the failures by code.
	ErrorCodes map[string]int64
	// Max is the largest latency seen (exact even when samples were
	// thinned).
	Max time.Duration
	// Sorted holds the kept latency samples in ascending order.
	Sorted []time.Duration
}

// Snapshot returns the outcomes recorded so far, samples sorted.
func (r *recorder) Snapshot() latencies {
	r.mu.Lock()
	s := slices.Clone(r.samples)
	codes := make(map[string]int64, len(r.byCode))
	for k, v := range r.byCode {
		codes[k] = v
	}
	l := latencies{OK: r.ok, Errors: r.errors, ErrorCodes: codes, Max: r.maxLat}
	r.mu.Unlock()
	slices.Sort(s)
	l.Sorted = s
	return l
}

// percentile returns the q-quantile (0 ≤ q ≤ 1) of sorted by the
// nearest-rank method: the smallest sample such that at least q of all
// samples are less than or equal to it. It returns 0 for no samples.
func percentile(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	switch {
	case q <= 0 || math.IsNaN(q):
		return sorted[0]
	case q >= 1:
		return sorted[n-1]
	}
	rank := int(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// mean returns the arithmetic mean of samples, 0 for none.
func mean(samples []time.Duration) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	var sum float64
	for _, d := range samples {
		sum += float64(d)
	}
	return time.Duration(sum / float64(len(samples)))
}

// ms converts d to milliseconds with microsecond resolution.
func ms(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}
