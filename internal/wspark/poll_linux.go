//go:build linux

package wspark

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
)

// readPoller parks the readers of idle sessions without a goroutine each:
// a parked connection's descriptor is armed, one-shot, in an epoll set of
// its own, and one goroutine for the whole process waits on that set and
// starts a reader again when a connection becomes readable (or is hung
// up). The runtime's own poller still owns the descriptors; this set only
// says when to read.
type readPoller struct {
	epfd int
	dead atomic.Bool // run stopped: nothing is armed any more

	mu    sync.Mutex
	next  uint64
	conns map[uint64]*Conn // by token, while registered
}

// sharedReadPoller is started on first use; nil when epoll is unavailable
// (readers then wait on their own goroutines).
var sharedReadPoller = sync.OnceValue(func() *readPoller {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		slog.Default().Warn("idle sessions keep a goroutine each: epoll unavailable", "err", err)
		return nil
	}
	p := &readPoller{epfd: fd, conns: map[uint64]*Conn{}}
	go p.run()
	return p
})

// pollEvents are what wakes a parked reader: bytes, a hang-up or an error
// (the last two are always reported).
const pollEvents = syscall.EPOLLIN | syscall.EPOLLRDHUP | syscall.EPOLLONESHOT

// arm registers (or re-arms) c's descriptor fd. It runs inside the
// descriptor's RawConn.Control, so fd stays open meanwhile.
func (p *readPoller) arm(c *Conn, fd int) error {
	if p.dead.Load() {
		return errors.New("poller stopped")
	}
	c.mu.Lock()
	token, closed := c.token, c.closed
	if token == 0 && !closed {
		p.mu.Lock()
		p.next++
		token = p.next
		p.conns[token] = c
		p.mu.Unlock()
		c.token = token
	}
	c.mu.Unlock()
	if closed {
		return errors.New("connection closed")
	}
	ev := syscall.EpollEvent{Events: pollEvents, Fd: int32(token), Pad: int32(token >> 32)}
	err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_MOD, fd, &ev)
	if errors.Is(err, syscall.ENOENT) {
		err = syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev)
	}
	return err
}

// forget drops a closed connection's token (its descriptor left the set
// when it was closed).
func (p *readPoller) forget(token uint64) {
	p.mu.Lock()
	delete(p.conns, token)
	p.mu.Unlock()
}

// run waits for armed descriptors and wakes their readers.
func (p *readPoller) run() {
	events := make([]syscall.EpollEvent, 256)
	for {
		n, err := syscall.EpollWait(p.epfd, events, -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			slog.Default().Error("idle session poller stopped; idle sessions keep a goroutine each from now on", "err", err)
			p.dead.Store(true)
			p.mu.Lock()
			parked := make([]*Conn, 0, len(p.conns))
			for _, c := range p.conns {
				parked = append(parked, c)
			}
			p.mu.Unlock()
			for _, c := range parked {
				c.wake()
			}
			return
		}
		for _, ev := range events[:n] {
			token := uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
			p.mu.Lock()
			c := p.conns[token]
			p.mu.Unlock()
			if c != nil {
				c.wake()
			}
		}
	}
}
