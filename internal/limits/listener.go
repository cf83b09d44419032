package limits

import (
	"errors"
	"net"
	"sync"
	"syscall"
)

// Listener caps the connections a net.Listener has open: at most total at
// once (Accept waits for one to close), and at most perAddr from one client
// IP address (further ones are closed as soon as they are accepted). Zero
// disables a cap.
type Listener struct {
	net.Listener
	perAddr int
	sem     chan struct{}

	mu    sync.Mutex
	count map[string]int
}

// NewListener wraps ln with the caps.
func NewListener(ln net.Listener, total, perAddr int) *Listener {
	l := &Listener{Listener: ln, perAddr: perAddr, count: make(map[string]int)}
	if total > 0 {
		l.sem = make(chan struct{}, total)
	}
	return l
}

// Accept waits for a free slot, then returns the next connection whose
// address is under its cap.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		if l.sem != nil {
			l.sem <- struct{}{}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.releaseSlot()
			return nil, err
		}
		host := hostOf(c.RemoteAddr())
		if !l.take(host) {
			_ = c.Close()
			l.releaseSlot()
			continue
		}
		return &limitedConn{Conn: c, l: l, host: host}, nil
	}
}

func (l *Listener) releaseSlot() {
	if l.sem != nil {
		<-l.sem
	}
}

func (l *Listener) take(host string) bool {
	if l.perAddr <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.count[host] >= l.perAddr {
		return false
	}
	l.count[host]++
	return true
}

func (l *Listener) put(host string) {
	if l.perAddr > 0 {
		l.mu.Lock()
		if l.count[host]--; l.count[host] <= 0 {
			delete(l.count, host)
		}
		l.mu.Unlock()
	}
	l.releaseSlot()
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// limitedConn gives its slot back once, on the first Close.
type limitedConn struct {
	net.Conn
	l    *Listener
	host string
	once sync.Once
}

// SyscallConn gives the underlying connection's descriptor, for readers
// that wait for data without holding a buffer.
func (c *limitedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("limits: connection has no descriptor")
	}
	return sc.SyscallConn()
}

// Close closes the connection and frees its slot.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.put(c.host) })
	return err
}
