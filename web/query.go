package web

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/tracing"
)

// Bounds of query parameters.
const (
	// defaultWindowHours is the window of overview and errors without hours.
	defaultWindowHours = 24
	// maxWindowHours is the largest window (30 days).
	maxWindowHours = 720
	// defaultListLimit and maxListLimit bound list endpoints.
	defaultListLimit = 50
	maxListLimit     = 500
	maxOffset        = 100_000
	maxParamBytes    = 512
	maxGroupKeys     = 10_000
)

// queryError is a client mistake in a query string.
type queryError struct{ msg string }

func (e *queryError) Error() string { return e.msg }

func badQuery(format string, args ...any) error {
	return &queryError{msg: fmt.Sprintf(format, args...)}
}

// param returns a bounded query parameter.
func param(q url.Values, name string) (string, error) {
	v := strings.TrimSpace(q.Get(name))
	if len(v) > maxParamBytes {
		return "", badQuery("query parameter %s is longer than %d bytes", name, maxParamBytes)
	}
	return v, nil
}

// intParam parses an integer parameter in [lo, hi], def when absent.
func intParam(q url.Values, name string, def, lo, hi int) (int, error) {
	v, err := param(q, name)
	if err != nil || v == "" {
		return def, err
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < lo || n > hi {
		return 0, badQuery("query parameter %s must be an integer between %d and %d", name, lo, hi)
	}
	return n, nil
}

// hoursParam parses hours (a window in hours, fractions allowed down to
// one minute).
func hoursParam(q url.Values, def float64) (float64, error) {
	v, err := param(q, "hours")
	if err != nil || v == "" {
		return def, err
	}
	h, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(h) || h < 1.0/60 || h > maxWindowHours {
		return 0, badQuery("query parameter hours must be a number between 0.0167 and %d", maxWindowHours)
	}
	return h, nil
}

// timeParam parses an RFC 3339 time or unix milliseconds.
func timeParam(q url.Values, name string) (time.Time, bool, error) {
	v, err := param(q, name)
	if err != nil || v == "" {
		return time.Time{}, false, err
	}
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		if ms < 0 || ms > 1<<50 {
			return time.Time{}, false, badQuery("query parameter %s is out of range", name)
		}
		return time.UnixMilli(ms).UTC(), true, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, false, badQuery("query parameter %s must be RFC 3339 or unix milliseconds", name)
	}
	return t.UTC(), true, nil
}

// statesParam expands a comma list of states and buckets (success, error,
// in_flight) into states.
func statesParam(q url.Values, name string) ([]tracing.State, error) {
	v, err := param(q, name)
	if err != nil || v == "" || v == "all" {
		return nil, err
	}
	var out []tracing.State
	add := func(s tracing.State) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		switch tracing.Bucket(part) {
		case tracing.BucketSuccess, tracing.BucketError, tracing.BucketInFlight:
			for _, s := range tracing.States {
				if s.Bucket() == tracing.Bucket(part) {
					add(s)
				}
			}
			continue
		}
		if part == "inflight" || part == "in-flight" {
			for _, s := range tracing.States {
				if s.Bucket() == tracing.BucketInFlight {
					add(s)
				}
			}
			continue
		}
		s, err := tracing.ParseState(part)
		if err != nil {
			return nil, badQuery("query parameter %s: %q is neither a lifecycle state nor a bucket (success, error, in_flight)", name, part)
		}
		add(s)
	}
	return out, nil
}

// isoMicros formats unix microseconds as RFC 3339 UTC with milliseconds.
func isoMicros(us int64) string {
	return time.UnixMicro(us).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}

func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

func isoPtr(us *int64) *string {
	if us == nil {
		return nil
	}
	s := isoMicros(*us)
	return &s
}

func isoSeconds(secs *float64) *string {
	if secs == nil {
		return nil
	}
	s := isoMicros(int64(math.Round(*secs * 1e6)))
	return &s
}

// sampler keeps a bounded uniform sample of latencies (reservoir sampling
// with a fixed seed, so answers are reproducible).
type sampler struct {
	vals []int64
	seen int64
	cap  int
	rng  *rand.Rand
}

func newSampler(capacity int) *sampler {
	return &sampler{cap: capacity, rng: rand.New(rand.NewPCG(1, 2))}
}

func (s *sampler) add(v int64) {
	s.seen++
	if len(s.vals) < s.cap {
		s.vals = append(s.vals, v)
		return
	}
	if j := s.rng.Int64N(s.seen); j < int64(s.cap) {
		s.vals[j] = v
	}
}

// percentiles returns the nearest-rank percentiles ps (0..1) of the sample,
// nil when empty. It sorts the sample.
func (s *sampler) percentiles(ps ...float64) []*int64 {
	out := make([]*int64, len(ps))
	if len(s.vals) == 0 {
		return out
	}
	slices.Sort(s.vals)
	for i, p := range ps {
		idx := int(math.Ceil(p*float64(len(s.vals)))) - 1
		idx = max(0, min(idx, len(s.vals)-1))
		v := s.vals[idx]
		out[i] = &v
	}
	return out
}

func (s *sampler) sampled() bool { return s.seen > int64(len(s.vals)) }

// bucketSize picks the timeline resolution for a window.
func bucketSize(window time.Duration) time.Duration {
	switch {
	case window <= 15*time.Minute:
		return 30 * time.Second
	case window <= time.Hour:
		return 2 * time.Minute
	case window <= 6*time.Hour:
		return 15 * time.Minute
	case window <= 24*time.Hour:
		return time.Hour
	case window <= 72*time.Hour:
		return 3 * time.Hour
	case window <= 7*24*time.Hour:
		return 6 * time.Hour
	default:
		return 24 * time.Hour
	}
}
