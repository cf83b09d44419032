package bus

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/beamdir/beam/attempt"
)

// Delay returns the wait before the next attempt after the n-th failed
// attempt (n ≥ 1) of the message with nonce: Schedule[n-1] (the last entry
// repeats), scaled by a jitter in [-Jitter, +Jitter] that is deterministic
// per nonce and attempt, and never below 5 s unless the schedule itself is
// shorter (test schedules).
func (b *Bus) Delay(nonce string, n int) time.Duration {
	n = max(n, 1)
	return b.backoff.Delay(n, nonceDraw(nonce, n, b.cfg.Jitter))
}

// retryBackoff is the bus's backoff: the schedule, ± jitter in whole
// percent, never below minDelay unless the schedule is shorter.
func retryBackoff(schedule []time.Duration, jitter float64) attempt.Backoff {
	return attempt.Backoff{Growth: attempt.Scheduled, Schedule: schedule,
		Jitter: float64(jitterPercent(jitter)) / 100, Floor: minDelay}
}

// jitterPercent is jitter as the whole percentage the spread uses.
func jitterPercent(jitter float64) int64 {
	if jitter <= 0 {
		return 0
	}
	return int64(jitter*100 + 0.5)
}

// nonceDraw is the backoff draw of attempt n of nonce. The reference picks
// an integer percentage in [-p, +p] (p: the jitter in whole percent) from a
// 31-multiplier string hash of "nonce:n"; the draw k/(2p), for k the
// hash's remainder modulo 2p+1, gives the backoff the same spread (k = 2p
// draws 1, the top of the range).
func nonceDraw(nonce string, n int, jitter float64) float64 {
	p := jitterPercent(jitter)
	if p == 0 {
		return 0
	}
	h := stringHash(nonce + ":" + strconv.Itoa(n))
	if h < 0 {
		h = -h
	}
	return float64(h%(2*p+1)) / float64(2*p)
}

// stringHash is the 32-bit 31-multiplier hash of s's UTF-16 code units.
func stringHash(s string) int64 {
	var h int32
	for _, r := range s {
		if r >= 0x10000 {
			r -= 0x10000
			h = 31*h + int32(0xD800+(r>>10))
			h = 31*h + int32(0xDC00+(r&0x3FF))
			continue
		}
		h = 31*h + int32(r)
	}
	return int64(h)
}

// ParseSchedule parses a comma-separated list of positive durations such as
// "30s,60s,120s,240s" (the --bus-retry-schedule flag).
func ParseSchedule(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		d, err := time.ParseDuration(part)
		if err != nil {
			return nil, fmt.Errorf("retry schedule %q: %w", s, err)
		}
		if d <= 0 {
			return nil, fmt.Errorf("retry schedule %q: delay %s must be positive", s, d)
		}
		out = append(out, d)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("retry schedule %q is empty", s)
	}
	return out, nil
}
