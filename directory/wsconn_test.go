package directory

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/limits"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, ok := <-accepted
	require.True(t, ok, "accept failed")
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

func TestIdleConnReadsAheadBytesThenTheSocket(t *testing.T) {
	t.Parallel()
	srv, cli := tcpPair(t)
	c := newIdleConn(srv, []byte("ahead-"))
	require.NotNil(t, c.raw, "a TCP connection is read through its descriptor")

	_, err := cli.Write([]byte("from the socket"))
	require.NoError(t, err)
	var got []byte
	buf := make([]byte, 4) // smaller than what is waiting: handed out in pieces
	for len(got) < len("ahead-from the socket") {
		n, err := c.Read(buf)
		require.NoError(t, err)
		got = append(got, buf[:n]...)
	}
	require.Equal(t, "ahead-from the socket", string(got))
	require.False(t, c.holdsBuffer(), "a drained buffer goes back to the pool")

	// A read at least a chunk long goes straight into the caller's buffer.
	big := bytes.Repeat([]byte("y"), wsReadChunk+100)
	go func() { _, _ = cli.Write(big) }()
	p := make([]byte, len(big))
	_, err = io.ReadFull(c, p)
	require.NoError(t, err)
	require.Equal(t, big, p)
	require.False(t, c.holdsBuffer())

	require.NoError(t, cli.Close())
	_, err = c.Read(buf)
	require.ErrorIs(t, err, io.EOF)
}

func TestIdleConnWaitHoldsNoBuffer(t *testing.T) {
	t.Parallel()
	srv, cli := tcpPair(t)
	c := newIdleConn(srv, nil)
	woke := waiting(c)
	select {
	case <-woke:
		t.Fatal("wait returned before anything arrived")
	case <-time.After(50 * time.Millisecond):
	}
	require.False(t, c.holdsBuffer(), "waiting takes no buffer")
	_, err := cli.Write([]byte("x"))
	require.NoError(t, err)
	<-woke
	require.False(t, c.holdsBuffer(), "wait only peeks")
	b := make([]byte, 8)
	n, err := c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "x", string(b[:n]))

	// The end of the stream wakes a waiter too.
	done := waiting(c)
	require.NoError(t, cli.Close())
	<-done
	_, err = c.Read(b)
	require.ErrorIs(t, err, io.EOF)

	// Closing our end wakes a waiter as well.
	srv2, _ := tcpPair(t)
	c2 := newIdleConn(srv2, nil)
	done2 := waiting(c2)
	require.NoError(t, c2.Close())
	<-done2
}

// waiting runs c.wait and returns a channel closed when it returns.
func waiting(c *idleConn) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		c.wait()
		close(done)
	}()
	return done
}

func TestIdleConnWithoutDescriptorReadsThrough(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := newIdleConn(a, []byte("ab"))
	require.Nil(t, c.raw)
	go func() { _, _ = b.Write([]byte("cd")) }()
	c.wait() // returns at once: nothing to wait on
	got := make([]byte, 0, 4)
	p := make([]byte, 4)
	for len(got) < 4 {
		n, err := c.Read(p)
		require.NoError(t, err)
		got = append(got, p[:n]...)
	}
	require.Equal(t, "abcd", string(got))
}

// goroutinesIn counts the goroutines whose stack mentions fn.
func goroutinesIn(fn string) int {
	buf := make([]byte, 8<<20)
	n := runtime.Stack(buf, true)
	count := 0
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count
}

// An idle session is one goroutine, parked in idleConn.wait (a short stack
// and no read buffer), also behind the server's connection limits; a
// message read later is handled and the buffer given back.
func TestIdleSessionsParkWithoutBuffers(t *testing.T) {
	b := setup(t, func(o *setupOpts) {
		o.listener = func(ln net.Listener) net.Listener { return limits.NewListener(ln, 1000, 0) }
	})
	const n = 8
	clients := make([]*wsClient, n)
	agents := make([]*agent, n)
	for i := range clients {
		agents[i] = b.register("park" + string(rune('a'+i)))
		clients[i] = b.connect(agents[i])
	}
	sessions := func() []*session {
		b.dir.mu.Lock()
		defer b.dir.mu.Unlock()
		var out []*session
		for _, s := range b.dir.sessions {
			out = append(out, s)
		}
		return out
	}
	require.Len(t, sessions(), n)
	for _, s := range sessions() {
		require.NotNil(t, s.raw.raw, "the limited listener's connections expose their descriptor")
	}
	require.Eventually(t, func() bool {
		return goroutinesIn("directory.(*idleConn).wait") == n &&
			goroutinesIn("directory.(*session).") == n
	}, 10*time.Second, 10*time.Millisecond, "session goroutines: %d, parked in wait: %d",
		goroutinesIn("directory.(*session)."), goroutinesIn("directory.(*idleConn).wait"))
	for _, s := range sessions() {
		require.False(t, s.raw.holdsBuffer())
	}

	// Traffic still flows, and the session goes back to holding nothing.
	f := b.frame(agents[0], registry.EchoBeamID, "agent.ping", `{}`)
	clients[0].sendIntent(f)
	require.True(t, resultOf(t, clients[0].nextOf("result").Frame).Success)
	s := b.dir.session(agents[0].id)
	require.Eventually(t, func() bool { return !s.raw.holdsBuffer() && goroutinesIn("directory.(*idleConn).wait") == n },
		10*time.Second, 10*time.Millisecond)
}

// clientFrame is a masked client frame.
func clientFrame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	f := []byte{b0}
	switch n := len(payload); {
	case n < 126:
		f = append(f, 0x80|byte(n))
	case n < 1<<16:
		f = append(f, 0x80|126, byte(n>>8), byte(n))
	default:
		f = append(f, 0x80|127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	f = append(f, 1, 2, 3, 4)
	return append(f, payload...) // the tracker does not unmask
}

func TestFrameTrackerFindsControlFrameBoundaries(t *testing.T) {
	t.Parallel()
	pong := clientFrame(true, 0xA, []byte("17"))
	text := clientFrame(true, 0x1, []byte(`{"type":"intent"}`))
	big := clientFrame(true, 0x2, bytes.Repeat([]byte("z"), 70000))
	first := clientFrame(false, 0x1, []byte("part one"))
	last := clientFrame(true, 0x0, []byte("part two"))
	cases := []struct {
		name   string
		stream [][]byte
		want   bool
	}{
		{"nothing yet", nil, false},
		{"after a pong", [][]byte{pong}, true},
		{"after a data message", [][]byte{pong, text}, false},
		{"after a long data message and a pong", [][]byte{big, pong}, true},
		{"inside a pong's header", [][]byte{pong[:3]}, false},
		{"inside a pong's payload", [][]byte{pong[:len(pong)-1]}, false},
		{"a pong inside a fragmented message", [][]byte{first, pong}, false},
		{"a pong after the fragmented message", [][]byte{first, pong, last, pong}, true},
		{"an unmasked frame", [][]byte{{0x8A, 0x00}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var whole []byte
			for _, f := range tc.stream {
				whole = append(whole, f...)
			}
			// Byte by byte and in one piece give the same answer.
			var one, each frameTracker
			one.feed(whole)
			for i := range whole {
				each.feed(whole[i : i+1])
			}
			require.Equal(t, tc.want, one.afterControl())
			require.Equal(t, tc.want, each.afterControl())
		})
	}
}

// After a keepalive round the session's reader returns to its short park:
// the library goes on reading after the pong, so without the injected
// message it would wait inside the library on a deep stack.
func TestIdleSessionParksAgainAfterKeepalive(t *testing.T) {
	b := setup(t)
	const n = 4
	clients := make([]*wsClient, n)
	agents := make([]*agent, n)
	for i := range clients {
		agents[i] = b.register("ka" + string(rune('a'+i)))
		clients[i] = b.connect(agents[i]) // reads, so it answers pings
	}
	for _, a := range agents {
		s := b.dir.session(a.id)
		require.NotNil(t, s)
		s.keepalive()
		require.False(t, s.isClosing(), "the ping was answered")
	}
	require.Eventually(t, func() bool {
		return goroutinesIn("directory.(*idleConn).wait") == n && goroutinesIn("directory.(*session).") == n
	}, 10*time.Second, 10*time.Millisecond, "parked in wait: %d of %d", goroutinesIn("directory.(*idleConn).wait"), n)

	// The injected messages never reach the session's handlers, and the
	// session still relays.
	f := b.frame(agents[0], registry.EchoBeamID, "agent.ping", `{}`)
	clients[0].sendIntent(f)
	m := clients[0].next()
	require.Equal(t, "result", m.Type, "no error answered an injected message first: %s", m.raw)
	require.True(t, resultOf(t, m.Frame).Success)
}
