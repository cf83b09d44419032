package directory

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// wsCoalesceBytes is how many bytes of frames a session writer collects
// before it writes them out; frames queued together beyond it go out in
// further writes.
const wsCoalesceBytes = 32 << 10

// corkBufMax is the largest collection buffer kept in the pool; a larger
// one (a batch that held a big frame) is left to the collector.
const corkBufMax = 64 << 10

var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// frameCork sits under a session's WebSocket write buffer. The session
// writer corks it for a batch of queued frames: the frames written
// meanwhile (including a ping or pong another goroutine writes) are
// collected in memory and go out in one write when the writer flushes,
// instead of one write per frame. Uncorked, writes pass straight through.
// Only the session writer corks, flushes and uncorks.
type frameCork struct {
	conn net.Conn

	mu     sync.Mutex
	corked bool
	buf    *[]byte // pooled while corked
}

// Write collects p while corked and writes it through otherwise.
func (c *frameCork) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		*c.buf = append(*c.buf, p...)
		return len(p), nil
	}
	return c.conn.Write(p)
}

// cork starts collecting.
func (c *frameCork) cork() {
	c.mu.Lock()
	c.corked = true
	c.buf = corkBufs.Get().(*[]byte)
	c.mu.Unlock()
}

// buffered is the number of bytes collected and not yet written.
func (c *frameCork) buffered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.buf == nil {
		return 0
	}
	return len(*c.buf)
}

// flush writes what was collected in one write, which must complete
// within timeout; it stays corked.
func (c *frameCork) flush(timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked(timeout)
}

func (c *frameCork) flushLocked(timeout time.Duration) error {
	if c.buf == nil || len(*c.buf) == 0 {
		return nil
	}
	if err := c.conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return fmt.Errorf("set write deadline: %w", err)
	}
	_, err := c.conn.Write(*c.buf)
	*c.buf = (*c.buf)[:0]
	if derr := c.conn.SetWriteDeadline(time.Time{}); err == nil && derr != nil {
		err = fmt.Errorf("clear write deadline: %w", derr)
	}
	return err
}

// uncork flushes what was collected and lets later writes pass through.
func (c *frameCork) uncork(timeout time.Duration) error {
	return c.release(true, timeout)
}

// discard drops what was collected (after a failed write: the connection
// is being closed) and lets later writes pass through.
func (c *frameCork) discard() {
	_ = c.release(false, 0)
}

func (c *frameCork) release(flush bool, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return nil
	}
	var err error
	if flush {
		err = c.flushLocked(timeout)
	}
	c.corked = false
	if cap(*c.buf) <= corkBufMax {
		*c.buf = (*c.buf)[:0]
		corkBufs.Put(c.buf)
	}
	c.buf = nil
	return err
}
