package directory

import (
	"sync"
	"time"
)

// keepaliveSlotsPerInterval is how many ticks one keepalive interval is cut
// into: a session is pinged between PingInterval and PingInterval plus one
// tick after it was scheduled.
const keepaliveSlotsPerInterval = 16

// keepaliveWheel pings every session once per PingInterval from one ticker
// for the whole directory instead of a timer per session: a session waiting
// for its next ping costs one slot entry (a pointer), not a runtime timer and
// the closure it runs. Each tick takes the sessions due in the current slot
// and pings those still open on the wheel's own goroutine (a ping only
// queues a frame for the session's writer; the close of a session that
// missed its pong runs on its own); a session whose pong came is scheduled
// again. A session closed
// meanwhile stays in its slot until its tick (at most one interval) and is
// dropped then.
type keepaliveWheel struct {
	tick time.Duration

	mu    sync.Mutex
	slots [][]*session
	cur   int // the slot taken at the last tick
}

// newKeepaliveWheel returns a wheel for interval; run drives it.
func newKeepaliveWheel(interval time.Duration) *keepaliveWheel {
	tick := max(interval/keepaliveSlotsPerInterval, time.Millisecond)
	k := int((interval + tick - 1) / tick) // ticks per interval, rounded up
	// A session scheduled between two ticks goes k+1 slots ahead of the
	// current one, so at least a whole interval passes; k+2 slots keep that
	// slot apart from the current one.
	return &keepaliveWheel{tick: tick, slots: make([][]*session, k+2)}
}

// schedule makes s due for its next ping one interval from now.
func (w *keepaliveWheel) schedule(s *session) {
	w.mu.Lock()
	i := (w.cur + len(w.slots) - 1) % len(w.slots) // k+1 ahead of cur
	w.slots[i] = append(w.slots[i], s)
	w.mu.Unlock()
}

// advance moves to the next slot and returns the sessions due in it.
func (w *keepaliveWheel) advance() []*session {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = (w.cur + 1) % len(w.slots)
	due := w.slots[w.cur]
	w.slots[w.cur] = nil
	return due
}

// runKeepalives ticks the directory's keepalive wheel until the directory
// closes.
func (d *Directory) runKeepalives() {
	defer d.wg.Done()
	t := time.NewTicker(d.keepalives.tick)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		for _, s := range d.keepalives.advance() {
			s.mu.Lock()
			s.pingDue = false
			closing := s.closing
			s.mu.Unlock()
			if !closing {
				s.keepalive()
			}
		}
	}
}

// scheduleKeepalive puts s on the keepalive wheel unless it is closing or
// already there.
func (s *session) scheduleKeepalive() {
	s.mu.Lock()
	add := !s.closing && !s.pingDue
	s.pingDue = s.pingDue || add
	s.mu.Unlock()
	if add {
		s.d.keepalives.schedule(s)
	}
}
