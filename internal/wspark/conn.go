package wspark

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// readChunk is the size of the pooled buffer a connection reads its socket
// into once bytes have arrived; a read that wants at least this much goes
// straight into the caller's buffer.
const readChunk = 4 << 10

var readChunks = sync.Pool{New: func() any { b := make([]byte, readChunk); return &b }}

// Conn is a hijacked server-side WebSocket connection that holds no read
// buffer while nothing has arrived. A read waits for the socket to become readable
// first and only then takes a buffer from a pool, reads what the kernel
// has, and hands it out until it is drained; the buffer then goes back to
// the pool. So an idle session costs its connection state, not a read
// buffer per connection, and (Park) no goroutine where the read poller runs.
//
// The library reads control frames (the keepalive's pongs) inside the
// call that waits for the next message and then goes on waiting there, on
// a deep stack. So that an idle session goes back to its short one, Conn
// follows the frames it hands out (frameTracker): when the library asks for
// more bytes right after a control frame, outside a fragmented message, and
// the socket has nothing, it hands out a synthetic empty binary message
// instead of waiting. The library returns it as a message; the session's
// reader recognises it (TakeInjected), drops it and parks again.
//
// Only one goroutine reads at a time (the WebSocket library's reader);
// Park may run beside it.
type Conn struct {
	net.Conn
	raw syscall.RawConn // nil when the connection exposes no descriptor: reads then go to Conn

	mu        sync.Mutex
	chunk     *[]byte // unread bytes are (*chunk)[r:w]; nil when there are none
	r, w      int
	synthetic bool // chunk is the injected message, not the peer's bytes
	injected  bool // an injected message was handed out and not yet taken
	frames    frameTracker
	token     uint64 // in the read poller; 0 when not registered
	closed    bool

	parked atomic.Bool // the reader is parked in the read poller
	resume func()      // starts the reader again (set by park)
}

// injectedMessage is an empty, final, masked binary frame (mask key 0).
var injectedMessage = []byte{0x82, 0x80, 0, 0, 0, 0}

// New wraps conn, the server's end of a hijacked WebSocket connection (the
// frames it reads are a client's, so masked); ahead are bytes already read
// from it (the HTTP server's read-ahead), returned first.
func New(conn net.Conn, ahead []byte) *Conn {
	c := &Conn{Conn: conn}
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil && canWaitReadable {
			c.raw = raw
		}
	}
	if len(ahead) > 0 {
		b := append([]byte(nil), ahead...)
		c.chunk, c.w = &b, len(b)
	}
	return c
}

// pending reports whether bytes are buffered.
func (c *Conn) pending() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chunk != nil
}

// Buffered reports whether the connection holds a read buffer: bytes were
// read from the socket and not yet handed out.
func (c *Conn) Buffered() bool { return c.pending() }

// takeBuffered copies buffered bytes into p and releases the buffer once
// it is drained; ok is false when nothing was buffered.
func (c *Conn) takeBuffered(p []byte) (n int, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.chunk == nil {
		return 0, false
	}
	n = copy(p, (*c.chunk)[c.r:c.w])
	c.r += n
	if !c.synthetic {
		c.frames.feed(p[:n])
	}
	if c.r == c.w {
		if cap(*c.chunk) == readChunk {
			readChunks.Put(c.chunk)
		}
		c.chunk, c.r, c.w, c.synthetic = nil, 0, 0, false
	}
	return n, true
}

// Pongs is how many pong frames the peer's stream has carried so far
// (wrapping), counted as the library reads them: a keepalive that wrote a
// ping knows its answer came without waiting for it.
func (c *Conn) Pongs() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frames.pongs
}

// idleAfterControl reports whether the library is asking for the next
// frame right after a control frame, outside a fragmented message, with
// nothing buffered.
func (c *Conn) idleAfterControl() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chunk == nil && c.frames.afterControl()
}

// inject buffers the synthetic message.
func (c *Conn) inject() {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := injectedMessage
	c.chunk, c.r, c.w, c.synthetic, c.injected = &b, 0, len(b), true, true
	c.frames.control = false // the library completes a data message next
}

// TakeInjected reports (once) whether the message the library returned
// last was the synthetic one, not the peer's: the reader drops it.
func (c *Conn) TakeInjected() bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	was := c.injected
	c.injected = false
	return was
}

// Read returns buffered bytes first; otherwise it waits for the socket to
// be readable without a buffer and then reads into a pooled one.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		if n, ok := c.takeBuffered(p); ok {
			return n, nil
		}
		if c.raw == nil || len(p) >= readChunk {
			n, err := c.Conn.Read(p)
			c.mu.Lock()
			c.frames.feed(p[:n])
			c.mu.Unlock()
			return n, err
		}
		idle := c.idleAfterControl()
		b, n, err := readWhenReady(c.raw, idle)
		if errors.Is(err, errWouldBlock) {
			c.inject()
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			readChunks.Put(b)
			return 0, io.EOF
		}
		c.mu.Lock()
		c.chunk, c.r, c.w = b, 0, n
		c.mu.Unlock()
	}
}

// wait blocks until the connection has something to read (bytes, the end
// of the stream or an error), holding no buffer. It returns at once when
// bytes are buffered or the connection cannot be waited on this way; the
// read that follows reports any error.
func (c *Conn) wait() {
	if c == nil || c.raw == nil || c.pending() {
		return
	}
	_ = waitReadable(c.raw)
}

// waitFor waits up to d for something to read; false when d passed first.
func (c *Conn) waitFor(d time.Duration) bool {
	if err := c.Conn.SetReadDeadline(time.Now().Add(d)); err != nil {
		return true // let the read report it
	}
	err := waitReadable(c.raw)
	if derr := c.Conn.SetReadDeadline(time.Time{}); derr != nil {
		return true
	}
	return !errors.Is(err, os.ErrDeadlineExceeded)
}

// errWouldBlock is readWhenReady's answer when asked not to wait and the
// socket has nothing.
var errWouldBlock = errors.New("nothing to read")

// frameTracker follows the WebSocket frames of a client's byte stream (RFC
// 6455 §5.2; a client's frames are masked) as far as Conn needs: where
// a frame ends, whether the last one was a control frame, and whether a
// fragmented message is open. Anything it does not expect turns it off
// (broken); the library reports the error itself.
type frameTracker struct {
	hdr     [14]byte
	hn      int   // bytes of the current frame's header seen so far
	payload int64 // payload bytes of the current frame still to come
	fin     bool  // of the current frame
	op      byte  // of the current frame
	inMsg   bool  // a fragmented data message is open
	control bool  // the last complete frame was a control frame
	broken  bool
	pongs   uint32 // complete pong frames seen (wrapping)
}

// afterControl reports whether the stream so far ends right after a
// control frame, outside a fragmented message.
func (t *frameTracker) afterControl() bool {
	return !t.broken && t.hn == 0 && t.payload == 0 && t.control && !t.inMsg
}

// feed follows p, the next bytes of the stream.
func (t *frameTracker) feed(p []byte) {
	for len(p) > 0 && !t.broken {
		if t.payload > 0 {
			n := min(int64(len(p)), t.payload)
			t.payload -= n
			p = p[n:]
			if t.payload == 0 {
				t.frameDone()
			}
			continue
		}
		t.hdr[t.hn] = p[0]
		t.hn++
		p = p[1:]
		if t.hn < 2 {
			continue
		}
		need := 2 + 4 // a client's frames carry a mask key
		switch t.hdr[1] & 0x7f {
		case 126:
			need += 2
		case 127:
			need += 8
		}
		if t.hn < need {
			continue
		}
		if t.hdr[1]&0x80 == 0 {
			t.broken = true
			return
		}
		t.fin, t.op = t.hdr[0]&0x80 != 0, t.hdr[0]&0x0f
		switch l := t.hdr[1] & 0x7f; l {
		case 126:
			t.payload = int64(binary.BigEndian.Uint16(t.hdr[2:4]))
		case 127:
			t.payload = int64(binary.BigEndian.Uint64(t.hdr[2:10]))
		default:
			t.payload = int64(l)
		}
		t.hn = 0
		if t.payload < 0 || (t.op > 2 && t.op < 8) || t.op > 10 {
			t.broken = true
			return
		}
		if t.payload == 0 {
			t.frameDone()
		}
	}
}

// frameDone records the end of the current frame.
func (t *frameTracker) frameDone() {
	if t.op >= 8 {
		t.control = true
		if t.op == 0xA {
			t.pongs++
		}
		return
	}
	t.control = false
	if t.op == 0 {
		if t.fin {
			t.inMsg = false
		}
		return
	}
	t.inMsg = !t.fin
}

// Park stops the reader while nothing has arrived: with the read poller
// (Linux), once nothing came for linger (at once when linger is 0), the
// connection is armed and Park returns true, and resume runs on a new
// goroutine once the socket is readable or the connection closes (the
// caller returns and its goroutine ends). Without the poller, or when bytes
// are already buffered, it waits here, holding no buffer, and returns false.
// Either way the next read has something to read. A reader that lingers
// keeps its goroutine while busy (a wake-up through the poller costs a
// syscall and a hand-off per message).
func (c *Conn) Park(resume func(), linger time.Duration) bool {
	p := sharedReadPoller()
	if p == nil || c.raw == nil || c.pending() {
		c.wait()
		return false
	}
	if linger > 0 && c.waitFor(linger) {
		return false
	}
	c.resume = resume
	c.parked.Store(true)
	var armErr error
	if err := c.raw.Control(func(fd uintptr) { armErr = p.arm(c, int(fd)) }); err != nil {
		armErr = err
	}
	if armErr == nil {
		return true
	}
	if c.parked.CompareAndSwap(true, false) {
		c.wait() // not armed: wait on this goroutine
		return false
	}
	return true // woken meanwhile (closed): resume runs
}

// Parked reports whether the reader is parked in the read poller.
func (c *Conn) Parked() bool { return c.parked.Load() }

// wake starts the parked reader again, once per park.
func (c *Conn) wake() {
	if c.parked.CompareAndSwap(true, false) {
		go c.resume()
	}
}

// Close closes the connection and wakes a parked reader, which then sees
// the connection closed.
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.mu.Lock()
	token := c.token
	c.token, c.closed = 0, true
	c.mu.Unlock()
	if token != 0 {
		if p := sharedReadPoller(); p != nil {
			p.forget(token)
		}
	}
	c.wake()
	return err
}
