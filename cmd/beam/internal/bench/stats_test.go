package bench

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentileNearestRank(t *testing.T) {
	t.Parallel()
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	require.Equal(t, 50*time.Millisecond, percentile(s, 0.50))
	require.Equal(t, 90*time.Millisecond, percentile(s, 0.90))
	require.Equal(t, 99*time.Millisecond, percentile(s, 0.99))
	require.Equal(t, 100*time.Millisecond, percentile(s, 1))
	require.Equal(t, 1*time.Millisecond, percentile(s, 0))
	require.Equal(t, 1*time.Millisecond, percentile(s, 0.001))
	require.Equal(t, time.Duration(0), percentile(nil, 0.5))

	one := []time.Duration{7 * time.Millisecond}
	require.Equal(t, 7*time.Millisecond, percentile(one, 0.5))
	require.Equal(t, 7*time.Millisecond, percentile(one, 0.99))

	// Ten samples: p90 is the 9th, p99 the 10th.
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(9), percentile(ten, 0.9))
	require.Equal(t, time.Duration(10), percentile(ten, 0.99))
	require.Equal(t, time.Duration(5), percentile(ten, 0.5))
}

func TestMean(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Duration(0), mean(nil))
	require.Equal(t, 2*time.Millisecond, mean([]time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}))
}

func TestRecorderCountsAndSorts(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	perm := rand.Perm(1000)
	for _, v := range perm {
		r.Success(time.Duration(v+1) * time.Microsecond)
	}
	r.Failure("TIMEOUT")
	r.Failure("TIMEOUT")
	r.Failure("")
	l := r.Snapshot()
	require.EqualValues(t, 1000, l.OK)
	require.EqualValues(t, 3, l.Errors)
	require.Equal(t, map[string]int64{"TIMEOUT": 2, "UNKNOWN": 1}, l.ErrorCodes)
	require.Len(t, l.Sorted, 1000)
	require.IsNonDecreasing(t, l.Sorted)
	require.Equal(t, 1000*time.Microsecond, l.Max)
	require.Equal(t, 500*time.Microsecond, percentile(l.Sorted, 0.5))
}

func TestRecorderThinsBeyondCap(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	r.capLimit = 100
	for i := 1; i <= 1000; i++ {
		r.Success(time.Duration(i))
	}
	l := r.Snapshot()
	require.EqualValues(t, 1000, l.OK)
	require.LessOrEqual(t, len(l.Sorted), 100)
	require.GreaterOrEqual(t, len(l.Sorted), 50)
	require.Equal(t, time.Duration(1000), l.Max, "max stays exact")
	// Thinning keeps an even spread: the median stays near the middle.
	require.InDelta(t, 500, float64(percentile(l.Sorted, 0.5)), 30)
}

func TestRecorderBoundsErrorCodes(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	for i := range 200 {
		r.Failure(string(rune('A'+i%26)) + string(rune('a'+i/26)))
	}
	l := r.Snapshot()
	require.EqualValues(t, 200, l.Errors)
	require.LessOrEqual(t, len(l.ErrorCodes), 65)
	require.Positive(t, l.ErrorCodes["OTHER"])
}

func TestSummaryFill(t *testing.T) {
	t.Parallel()
	r := newRecorder()
	for i := 1; i <= 100; i++ {
		r.Success(time.Duration(i) * time.Millisecond)
	}
	r.Failure("X")
	s := &Summary{ErrorCodes: map[string]int64{}}
	s.fill(r.Snapshot(), 2*time.Second)
	require.EqualValues(t, 100, s.OK)
	require.EqualValues(t, 1, s.Errors)
	require.InDelta(t, 50.0, s.IntentsPerSecond, 1e-9)
	require.InDelta(t, 50.0, s.P50ms, 1e-9)
	require.InDelta(t, 90.0, s.P90ms, 1e-9)
	require.InDelta(t, 99.0, s.P99ms, 1e-9)
	require.InDelta(t, 100.0, s.Maxms, 1e-9)
	require.InDelta(t, 50.5, s.Meanms, 1e-9)

	before := procSample{At: time.Unix(100, 0), CPU: 1 * time.Second}
	after := procSample{At: time.Unix(102, 0), CPU: 1500 * time.Millisecond, RSS: 50 << 20, HWM: 80 << 20, Threads: 9}
	s.setServer(before, after, 1000)
	require.InDelta(t, 0.5, *s.ServerCPUmsPerIntent, 1e-9)
	require.InDelta(t, 0.25, *s.ServerCPUUtil, 1e-9)
	require.InDelta(t, 80.0, *s.ServerRSSMB, 1e-9)
	require.InDelta(t, 50.0, *s.ServerRSSEndMB, 1e-9)
}

// TestVerifyFloor: the floor is a positive duration and the ratio the
// summary states is the server's cost divided by it.
func TestVerifyFloor(t *testing.T) {
	d := verifyFloor()
	require.Greater(t, d, time.Duration(0))
	perOp := 0.5
	ms, ratio := floorFields(d, &perOp)
	require.NotNil(t, ms)
	require.NotNil(t, ratio)
	require.InDelta(t, perOp / *ms, *ratio, 0.01*perOp / *ms + 0.01)
	_, none := floorFields(d, nil)
	require.Nil(t, none)
}

func TestParseOpenFilesLimit(t *testing.T) {
	t.Parallel()
	limits := []byte("Limit                     Soft Limit           Hard Limit           Units     \n" +
		"Max cpu time              unlimited            unlimited            seconds   \n" +
		"Max open files            20000                20000                files     \n")
	n, err := parseOpenFilesLimit(limits)
	require.NoError(t, err)
	require.Equal(t, 20000, n)
	n, err = parseOpenFilesLimit([]byte("Max open files            unlimited            unlimited            files\n"))
	require.NoError(t, err)
	require.Equal(t, math.MaxInt32, n)
	_, err = parseOpenFilesLimit([]byte("Max cpu time unlimited unlimited seconds\n"))
	require.Error(t, err)
	_, err = parseOpenFilesLimit([]byte("Max open files            lots            lots            files\n"))
	require.Error(t, err)
}

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	m := parseMetrics([]byte("# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 5036\n" +
		"go_memstats_stack_inuse_bytes 2.162688e+07\nbeam_relay_seconds{quantile=\"0.5\"} 0.1\nbroken\n"))
	require.Equal(t, map[string]float64{"go_goroutines": 5036, "go_memstats_stack_inuse_bytes": 2.162688e+07}, m)
}
