package attempt

import (
	"fmt"
	"time"
)

// Growth is how a Backoff's delay grows with the number of failures.
type Growth string

// Growths of a Backoff.
const (
	// Scheduled takes the delay after the n-th failure from
	// Backoff.Schedule; its last entry repeats.
	Scheduled Growth = "schedule"
	// Constant waits Initial after every failure.
	Constant Growth = "constant"
	// Linear waits n·Initial after the n-th failure.
	Linear Growth = "linear"
	// Exponential waits Initial·2^(n-1) after the n-th failure.
	Exponential Growth = "exponential"
)

// maxBase bounds the growth of a delay before Max applies, so that a large
// attempt number never overflows.
const maxBase = 24 * time.Hour

// Backoff says how long to wait before the next attempt after a failure.
// The zero value waits nothing.
type Backoff struct {
	// Growth picks the base delay; "" is Exponential.
	Growth Growth
	// Schedule is the base delay after the 1st, 2nd, … failure (Scheduled).
	Schedule []time.Duration
	// Initial is the base delay after the first failure (Constant, Linear,
	// Exponential).
	Initial time.Duration
	// Max caps the base delay (0: no cap beyond 24 h).
	Max time.Duration
	// Jitter scales the base delay by a factor in [1-Jitter, 1+Jitter]
	// (0 ≤ Jitter ≤ 1), picked by the draw.
	Jitter float64
	// Floor is the least delay the jitter may produce; a base delay below
	// Floor is never raised to it.
	Floor time.Duration
	// Spread adds a further [0, Spread) picked by the draw, after the cap.
	Spread time.Duration
}

// Validate reports a Backoff that cannot produce delays.
func (b Backoff) Validate() error {
	switch b.Growth {
	case "", Exponential, Constant, Linear:
		if b.Initial < 0 {
			return fmt.Errorf("backoff: initial delay %s is negative", b.Initial)
		}
	case Scheduled:
		if len(b.Schedule) == 0 {
			return fmt.Errorf("backoff: the schedule is empty")
		}
		for _, d := range b.Schedule {
			if d <= 0 {
				return fmt.Errorf("backoff: delay %s must be positive", d)
			}
		}
	default:
		return fmt.Errorf("backoff: growth %q: want schedule, constant, linear or exponential", b.Growth)
	}
	if b.Jitter < 0 || b.Jitter > 1 {
		return fmt.Errorf("backoff: jitter %v must be within [0, 1]", b.Jitter)
	}
	if b.Max < 0 || b.Spread < 0 || b.Floor < 0 {
		return fmt.Errorf("backoff: max, floor and spread must not be negative")
	}
	return nil
}

// Base returns the delay after the n-th failure (n ≥ 1) before jitter.
func (b Backoff) Base(n int) time.Duration {
	n = max(n, 1)
	var d time.Duration
	switch b.Growth {
	case Scheduled:
		if len(b.Schedule) == 0 {
			return 0
		}
		d = b.Schedule[min(n-1, len(b.Schedule)-1)]
	case Constant:
		d = b.Initial
	case Linear:
		d = b.Initial * time.Duration(min(n, int(maxBase/max(b.Initial, 1))+1))
	default:
		d = b.Initial
		for i := 1; i < n && d < maxBase; i++ {
			d *= 2
		}
	}
	d = min(d, maxBase)
	if b.Max > 0 {
		d = min(d, b.Max)
	}
	return max(d, 0)
}

// Delay returns the wait after the n-th failure (n ≥ 1). draw, in [0, 1],
// picks the jitter and the spread: the same draw gives the same delay.
func (b Backoff) Delay(n int, draw float64) time.Duration {
	base := b.Base(n)
	d := base
	if b.Jitter > 0 {
		d = base + time.Duration(float64(base)*b.Jitter*(2*draw-1))
		if floor := min(b.Floor, base); d < floor {
			d = floor
		}
	}
	if b.Spread > 0 {
		d += time.Duration(float64(b.Spread) * draw)
	}
	return max(d, 0)
}
