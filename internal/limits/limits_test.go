package limits

import (
	"errors"
	"net"
	"sync"
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
	require.Equal(t, 1, RetryAfterSeconds(10*time.Millisecond))
	require.Equal(t, 3, RetryAfterSeconds(2001*time.Millisecond))
}

func TestListenerCapsConnectionsPerAddress(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := NewListener(inner, 0, 2)
	defer ln.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		clients = append(clients, c)
	}
	first, second := <-accepted, <-accepted
	// The third is closed by the listener: its read ends.
	require.NoError(t, clients[2].SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = clients[2].Read(make([]byte, 1))
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
