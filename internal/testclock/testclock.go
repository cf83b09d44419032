package testclock

import (
	"sync"
	"time"
)

// Clock is a clock that stands still until advanced. It is safe for
// concurrent use; pass its Now method as a package's clock.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New returns a clock reading start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// NewNow returns a clock reading the current UTC time, truncated to the
// millisecond (the log's and the wire's resolution).
func NewNow() *Clock { return New(time.Now().UTC().Truncate(time.Millisecond)) }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
