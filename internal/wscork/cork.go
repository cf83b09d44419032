package wscork

import (
	"fmt"
	"net"
	"sync"
	"time"
)

// fullAt is how many bytes of frames a corked Cork collects before Full
// says to flush; frames queued together beyond it go out in further writes.
const fullAt = 32 << 10

// bufMax is the largest collection buffer kept in the pool; a larger one
// (a batch that held a big frame) is left to the collector.
const bufMax = 64 << 10

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 8<<10); return &b }}

// pingFrame is a server's ping with no payload (FIN, opcode 9, length 0).
var pingFrame = []byte{0x89, 0x00}

// Cork sits under a session's WebSocket write buffer: hand it to the
// library as the writer its bufio.Writer writes to. The session writer
// corks it for a batch of queued frames: the frames written meanwhile
// (including a ping or pong another goroutine writes) are collected in
// memory and go out in one write when the writer flushes, instead of one
// write per frame. Uncorked, writes pass straight through. Only the
// session writer corks, flushes and uncorks.
type Cork struct {
	conn net.Conn

	mu     sync.Mutex
	corked bool
	buf    *[]byte // pooled while corked
}

// New returns an uncorked Cork writing to conn.
func New(conn net.Conn) *Cork { return &Cork{conn: conn} }

// Write collects p while corked and writes it through otherwise.
func (c *Cork) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		*c.buf = append(*c.buf, p...)
		return len(p), nil
	}
	return c.conn.Write(p)
}

// Cork starts collecting.
func (c *Cork) Cork() {
	c.mu.Lock()
	c.corked = true
	c.buf = bufs.Get().(*[]byte)
	c.mu.Unlock()
}

// Ping collects a server's empty ping frame. The caller writes it between
// whole frames: only the session writer writes data frames, and a control
// frame the library writes meanwhile (a pong) reaches the Cork in one piece
// when the library's write buffer holds a whole control frame (129 bytes).
// It does nothing when not corked.
func (c *Cork) Ping() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.corked {
		*c.buf = append(*c.buf, pingFrame...)
	}
}

// Full reports whether enough has been collected to flush it now.
func (c *Cork) Full() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf != nil && len(*c.buf) >= fullAt
}

// Flush writes what was collected in one write, which must complete within
// timeout; it stays corked.
func (c *Cork) Flush(timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flushLocked(timeout)
}

func (c *Cork) flushLocked(timeout time.Duration) error {
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

// Uncork flushes what was collected and lets later writes pass through.
func (c *Cork) Uncork(timeout time.Duration) error {
	return c.release(true, timeout)
}

// Discard drops what was collected (after a failed write: the connection
// is being closed) and lets later writes pass through.
func (c *Cork) Discard() {
	_ = c.release(false, 0)
}

// Holding reports whether the Cork holds a collection buffer (only while
// corked).
func (c *Cork) Holding() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf != nil
}

func (c *Cork) release(flush bool, timeout time.Duration) error {
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
	if cap(*c.buf) <= bufMax {
		*c.buf = (*c.buf)[:0]
		bufs.Put(c.buf)
	}
	c.buf = nil
	return err
}
