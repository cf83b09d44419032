package bus

import (
	"fmt"
	"strings"
	"time"
)

// Delay returns the wait before the next attempt after the n-th failed
// attempt (n ≥ 1) of the message with nonce: Schedule[n-1] (the last entry
// repeats), scaled by a jitter in [-Jitter, +Jitter] that is deterministic
// per nonce and attempt, and never below 5 s unless the schedule itself is
// shorter (test schedules).
func (b *Bus) Delay(nonce string, n int) time.Duration {
	return delay(b.cfg.Schedule, b.cfg.Jitter, nonce, n)
}

func delay(schedule []time.Duration, jitter float64, nonce string, n int) time.Duration {
	if n < 1 {
		n = 1
	}
	base := schedule[min(n-1, len(schedule)-1)]
	if jitter <= 0 {
		return base
	}
	// Spread: an integer percentage in [-p, +p] from a 31-multiplier string
	// hash of "nonce:n", as the reference computes it.
	p := int64(jitter*100 + 0.5)
	h := stringHash(nonce + ":" + itoa(n))
	if h < 0 {
		h = -h
	}
	pct := h%(2*p+1) - p
	d := base + time.Duration(int64(base)*pct/100)
	floor := min(minDelay, base)
	if d < floor {
		d = floor
	}
	return d
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

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var buf [20]byte
	i := len(buf)
	neg := n < 0
	if neg {
		n = -n
	}
	for n > 0 {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
	}
	if neg {
		i--
		buf[i] = '-'
	}
	return string(buf[i:])
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
