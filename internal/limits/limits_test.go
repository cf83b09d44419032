package limits

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	r, err := ParseRate("60/1m")
	require.NoError(t, err)
	require.Equal(t, Rate{N: 60, Per: time.Minute}, r)
	again, err := ParseRate(r.String())
	require.NoError(t, err)
	require.Equal(t, r, again)
	for _, off := range []string{"off", "0", " OFF "} {
		r, err := ParseRate(off)
		require.NoError(t, err)
		require.Equal(t, Rate{}, r)
	}
	for _, bad := range []string{"", "60", "x/1m", "-1/1m", "5/0s", "5/soon"} {
		_, err := ParseRate(bad)
		require.Error(t, err, bad)
	}
}

func TestKeyedBucketsRefillPerKey(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	k := NewKeyed(Rate{N: 2, Per: time.Minute}, clock)
	for range 2 {
		ok, _ := k.Allow("a")
		require.True(t, ok)
	}
	ok, wait := k.Allow("a")
	require.False(t, ok)
	require.InDelta(t, 30*time.Second, wait, float64(time.Second))
	ok, _ = k.Allow("b")
	require.True(t, ok, "another key has its own bucket")

	mu.Lock()
	now = now.Add(31 * time.Second)
	mu.Unlock()
	ok, _ = k.Allow("a")
	require.True(t, ok, "a token came back")
	ok, _ = k.Allow("a")
	require.False(t, ok, "a refused request took nothing, and only one token came back")

	var none *Keyed
	ok, _ = none.Allow("x")
	require.True(t, ok, "no limit allows everything")
	require.Nil(t, NewKeyed(Rate{}, nil))
	require.Equal(t, 1, retryAfterSeconds(10*time.Millisecond))
	require.Equal(t, 3, retryAfterSeconds(2001*time.Millisecond))
}

// TestKeyedSharedFloodCannotResetALimitedKey: with the table full of
// buckets still refilling, new keys share one bucket, so a flood of new
// keys neither evicts a limited key nor gets buckets of its own.
func TestKeyedSharedFloodCannotResetALimitedKey(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	k := NewKeyedShared(Rate{N: 2, Per: time.Minute}, func() time.Time { return now }, 3)
	for range 2 {
		ok, _ := k.Allow("attacker")
		require.True(t, ok)
	}
	require.True(t, k.Blocked("attacker"))
	require.False(t, k.Blocked("fresh"), "a key without a bucket has a full one")
	for _, key := range []string{"f1", "f2", "f3", "f4"} {
		ok, _ := k.Allow(key)
		require.True(t, ok, key) // f3 and f4 take the overflow bucket's two tokens
	}
	require.True(t, k.Blocked("f5"), "new keys share the emptied overflow bucket")
	require.True(t, k.Blocked("attacker"), "the limited key kept its bucket")
	ok, _ := k.Allow("attacker")
	require.False(t, ok)

	now = now.Add(time.Minute)
	ok, _ = k.Allow("f5")
	require.True(t, ok, "refilled buckets make room again")
	require.False(t, k.Blocked("attacker"))
	var none *Keyed
	require.False(t, none.Blocked("x"))
}

func TestListenerCapsConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	inner, accepted := serveCapped(t, 0, 2)
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
	}
	first, second := <-accepted, <-accepted
	// The third is closed by the listener: its read ends.
	require.NoError(t, clients[2].SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := clients[2].Read(make([]byte, 1))
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the third connection was not closed")

	// Closing one frees its slot for the next.
	require.NoError(t, first.Close())
	c, err := net.Dial("tcp", inner.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	select {
	case got := <-accepted:
		got.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("a freed slot was not reused")
	}
	second.Close()
	for _, c := range clients {
		c.Close()
	}
}

// serveCapped listens on loopback with the caps and hands each accepted
// connection to the returned channel until the test ends.
func serveCapped(t *testing.T, total, perAddr int) (net.Listener, <-chan net.Conn) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := NewListener(inner, total, perAddr)
	t.Cleanup(func() { _ = ln.Close() })
	accepted := make(chan net.Conn, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	return inner, accepted
}

// dialFrom connects to ln from the loopback address src.
func dialFrom(t *testing.T, src string, ln net.Listener) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestListenerKeepsAReserveForLightAddresses(t *testing.T) {
	t.Parallel()
	inner, accepted := serveCapped(t, 8, 4) // reserve: the last 2 slots, for addresses holding none
	for range 4 {
		dialFrom(t, "127.0.0.2", inner)
	}
	for range 4 {
		<-accepted
	}
	heavy := make([]net.Conn, 0, 4)
	for range 4 {
		heavy = append(heavy, dialFrom(t, "127.0.0.3", inner))
	}
	for range 2 {
		<-accepted
	}
	// 127.0.0.3's third and fourth are closed: only the reserve is left.
	var closed atomic.Int32
	for _, c := range heavy {
		go func() {
			if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, net.ErrClosed) {
				closed.Add(1)
			}
		}()
	}
	require.Eventually(t, func() bool { return closed.Load() == 2 }, 10*time.Second, 10*time.Millisecond)
	// Two new addresses get the reserved slots.
	dialFrom(t, "127.0.0.4", inner)
	dialFrom(t, "127.0.0.5", inner)
	for range 2 {
		select {
		case <-accepted:
		case <-time.After(10 * time.Second):
			t.Fatal("a new address got no reserved slot")
		}
	}
}

func TestAddrKeyGroupsIPv6By64(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.7:443":                  "192.0.2.7",
		"[::ffff:192.0.2.7]:443":         "192.0.2.7",
		"[2001:db8:1:2:aaaa::1]:80":      "2001:db8:1:2::/64",
		"[2001:db8:1:2:ffff:ffff::9]:80": "2001:db8:1:2::/64",
		"[2001:db8:1:3::1]:80":           "2001:db8:1:3::/64",
		"[fe80::1%eth0]:80":              "fe80::/64",
		"[::1]:80":                       "::/64",
		"2001:db8:1:2::5":                "2001:db8:1:2::/64",
		"not an address":                 "not an address",
	} {
		require.Equal(t, want, HostKey(in), in)
	}
	a := &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2::1"), Port: 1}
	b := &net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:dead:beef::2"), Port: 2}
	require.Equal(t, addrKey(a), addrKey(b))
	require.Equal(t, "192.0.2.7", addrKey(&net.TCPAddr{IP: net.ParseIP("192.0.2.7")}))
}
