package limits

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Rate is a token bucket: up to N events at once, refilled at N per Per.
// The zero Rate (N 0) means no limit.
type Rate struct {
	N   int
	Per time.Duration
}

// ParseRate reads "N/DURATION" (e.g. "60/1m"); "0" or "off" is no limit.
func ParseRate(s string) (Rate, error) {
	s = strings.TrimSpace(s)
	if s == "0" || strings.EqualFold(s, "off") {
		return Rate{}, nil
	}
	n, per, ok := strings.Cut(s, "/")
	if !ok {
		return Rate{}, fmt.Errorf("rate %q: want N/DURATION, e.g. 60/1m, or off", s)
	}
	count, err := strconv.Atoi(n)
	if err != nil || count < 0 {
		return Rate{}, fmt.Errorf("rate %q: %q is not a count", s, n)
	}
	d, err := time.ParseDuration(per)
	if err != nil || d <= 0 {
		return Rate{}, fmt.Errorf("rate %q: %q is not a positive duration", s, per)
	}
	return Rate{N: count, Per: d}, nil
}

// String formats r as ParseRate reads it.
func (r Rate) String() string {
	if r.N == 0 {
		return "off"
	}
	return fmt.Sprintf("%d/%s", r.N, r.Per)
}

// maxKeys bounds the buckets one Keyed keeps; beyond it, full (idle)
// buckets are dropped, and if none is idle, the oldest half (or, for a
// Keyed of NewKeyedShared, new keys share one bucket).
const maxKeys = 100_000

// Keyed is a set of token buckets of one Rate, one per key (an address, a
// Beam ID). It is safe for concurrent use. A nil *Keyed allows everything.
type Keyed struct {
	rate  Rate
	clock func() time.Time

	maxKeys int
	// overflow, when not nil, is the bucket new keys share while the table
	// is full, instead of dropping the oldest half.
	overflow *bucket

	mu      sync.Mutex
	buckets map[string]*bucket
}

type bucket struct {
	lim  *rate.Limiter
	used time.Time
}

// NewKeyed returns the buckets of r, or nil (no limit) for the zero Rate.
// clock nil means time.Now.
func NewKeyed(r Rate, clock func() time.Time) *Keyed {
	if r.N <= 0 || r.Per <= 0 {
		return nil
	}
	if clock == nil {
		clock = time.Now
	}
	return &Keyed{rate: r, clock: clock, maxKeys: maxKeys, buckets: make(map[string]*bucket)}
}

// NewKeyedShared is NewKeyed with a table of at most max keys that, when
// full of buckets still refilling, lets new keys share one bucket rather
// than drop old ones: a flood of new keys cannot hand a key that is being
// limited a fresh bucket.
func NewKeyedShared(r Rate, clock func() time.Time, max int) *Keyed {
	k := NewKeyed(r, clock)
	if k != nil {
		k.maxKeys = max
		k.overflow = &bucket{lim: k.newLimiter()}
	}
	return k
}

func (k *Keyed) newLimiter() *rate.Limiter {
	return rate.NewLimiter(rate.Every(k.rate.Per/time.Duration(k.rate.N)), k.rate.N)
}

// Blocked reports whether key's bucket has no token now, without taking
// one.
func (k *Keyed) Blocked(key string) bool {
	if k == nil {
		return false
	}
	now := k.clock()
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.buckets[key]
	if b == nil {
		if k.overflow == nil || len(k.buckets) < k.maxKeys {
			return false // a new bucket is full
		}
		b = k.overflow
	}
	return b.lim.TokensAt(now) < 1
}

// Allow takes one token from key's bucket. When the bucket is empty it
// takes nothing and returns false and how long until a token is there.
func (k *Keyed) Allow(key string) (bool, time.Duration) {
	if k == nil {
		return true, 0
	}
	now := k.clock()
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.buckets[key]
	if b == nil {
		if len(k.buckets) >= k.maxKeys {
			k.evict(now)
		}
		if len(k.buckets) >= k.maxKeys {
			b = k.overflow // evict left the table full only when there is one
		} else {
			b = &bucket{lim: k.newLimiter()}
			k.buckets[key] = b
		}
	}
	b.used = now
	res := b.lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return false, d
	}
	return true, 0
}

// evict drops the buckets that have refilled (they behave as new ones), and
// when that is not enough and there is no shared overflow bucket, the least
// recently used ones.
func (k *Keyed) evict(now time.Time) {
	for key, b := range k.buckets {
		if now.Sub(b.used) >= k.rate.Per || b.lim.TokensAt(now) >= float64(k.rate.N) {
			delete(k.buckets, key)
		}
	}
	if len(k.buckets) < k.maxKeys || k.overflow != nil {
		return
	}
	cut := meanTime(k.buckets)
	for key, b := range k.buckets {
		if !b.used.After(cut) {
			delete(k.buckets, key)
		}
	}
}

// meanTime is the mean last use of the buckets: a cheap cut that drops
// roughly the older half.
func meanTime(buckets map[string]*bucket) time.Time {
	var sum float64
	for _, b := range buckets {
		sum += float64(b.used.UnixNano())
	}
	return time.Unix(0, int64(sum/float64(len(buckets))))
}

// retryAfterSeconds is d rounded up to whole seconds, at least 1, as the
// Retry-After header carries it.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}
