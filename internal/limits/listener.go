package limits

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

// Listener caps the connections a net.Listener has open: at most total at
// once (Accept waits for one to close), and at most perAddr from one client
// address (further ones are closed as soon as they are accepted). Zero
// disables a cap. Addresses are grouped as addrKey groups them.
//
// The total cap is shared fairly: the last quarter of it is a reserve that
// only addresses holding fewer than reserveShare(total) connections may
// use. Once fewer than total/4 slots are free, a connection from an
// address above that share is closed at once, so a few addresses at their
// per-address cap cannot take every slot and leave newcomers waiting.
type Listener struct {
	net.Listener
	total, perAddr int
	sem            chan struct{}

	mu    sync.Mutex
	open  int
	count map[string]int
}

// NewListener wraps ln with the caps.
func NewListener(ln net.Listener, total, perAddr int) *Listener {
	l := &Listener{Listener: ln, total: total, perAddr: perAddr, count: make(map[string]int)}
	if total > 0 {
		l.sem = make(chan struct{}, total)
	}
	return l
}

// reserveShare is how many connections an address may hold and still be
// let into the reserved last quarter of a total cap: total/256, at least 1.
func reserveShare(total int) int {
	return max(1, total/256)
}

// Accept waits for a free slot, then returns the next connection whose
// address is under its caps.
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
		host := addrKey(c.RemoteAddr())
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

// take counts a connection of host, or reports that host is over its cap
// or not allowed into the reserve.
func (l *Listener) take(host string) bool {
	if l.perAddr <= 0 && l.total <= 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	n := l.count[host]
	if l.perAddr > 0 && n >= l.perAddr {
		return false
	}
	if l.total > 0 && l.total-l.open <= l.total/4 && n >= reserveShare(l.total) {
		return false
	}
	l.count[host]++
	l.open++
	return true
}

func (l *Listener) put(host string) {
	if l.perAddr > 0 || l.total > 0 {
		l.mu.Lock()
		if l.count[host]--; l.count[host] <= 0 {
			delete(l.count, host)
		}
		l.open--
		l.mu.Unlock()
	}
	l.releaseSlot()
}

// addrKey is the key under which per-address limits count a client: its IP
// address, except that IPv6 addresses are grouped by their /64 prefix (one
// host or site usually holds a whole /64, so counting each address alone
// would give it billions of separate allowances). IPv4-mapped IPv6
// addresses count as IPv4. An address that does not parse is its own key.
func addrKey(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ipKey(ip)
		}
	}
	return HostKey(a.String())
}

// HostKey is addrKey for an address in "host:port" or plain host form, as
// http.Request.RemoteAddr carries it.
func HostKey(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	return ipKey(ip)
}

func ipKey(ip netip.Addr) string {
	ip = ip.Unmap()
	if ip.Is4() {
		return ip.String()
	}
	p, err := ip.WithZone("").Prefix(64)
	if err != nil {
		return ip.String()
	}
	return p.String()
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
