package directory

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
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

// An idle session has no goroutine (it is parked in the read poller; where
// there is none, one goroutine on idleConn.wait's short stack) and no read
// buffer, also behind the server's connection limits; a message read later
// is handled and the buffer given back; a parked session notices its peer
// leaving and is torn down when the directory closes it.
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
	requireParked(t, sessions())
	for _, s := range sessions() {
		require.False(t, s.raw.holdsBuffer())
	}

	// Traffic still flows, and the session goes back to holding nothing.
	f := b.frame(agents[0], registry.EchoBeamID, "agent.ping", `{}`)
	clients[0].sendIntent(f)
	require.True(t, resultOf(t, clients[0].nextOf("result").Frame).Success)
	s := b.dir.session(agents[0].id)
	require.Eventually(t, func() bool { return !s.raw.holdsBuffer() }, 10*time.Second, 10*time.Millisecond)
	requireParked(t, sessions())

	// A parked session still notices its peer leaving, and one closed by
	// the directory is torn down.
	require.NoError(t, clients[1].conn.CloseNow())
	require.Eventually(t, func() bool { return !b.dir.Online(agents[1].id) }, 10*time.Second, 10*time.Millisecond)
	s2 := b.dir.session(agents[2].id)
	s2.closeWith(websocket.StatusGoingAway, "test")
	select {
	case <-s2.doneChan():
	case <-time.After(20 * time.Second):
		t.Fatal("a parked session closed by the directory was not torn down")
	}
	clients[2].closeStatus()
}

// requireParked waits until every one of sessions waits for its peer
// without a goroutine (in the read poller) or, where there is none, on the
// short stack of idleConn.wait — and no session has a goroutine elsewhere.
func requireParked(t *testing.T, sessions []*session) {
	t.Helper()
	n := len(sessions)
	if sharedReadPoller() == nil {
		require.Eventually(t, func() bool {
			return goroutinesIn("directory.(*idleConn).wait") == n && goroutinesIn("directory.(*session).") == n
		}, 10*time.Second, 10*time.Millisecond, "parked in wait: %d of %d", goroutinesIn("directory.(*idleConn).wait"), n)
		return
	}
	require.Eventually(t, func() bool {
		for _, s := range sessions {
			if !s.raw.parked.Load() {
				return false
			}
		}
		return goroutinesIn("directory.(*session).") == 0
	}, 10*time.Second, 10*time.Millisecond, "session goroutines: %d", goroutinesIn("directory.(*session)."))
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

// After a keepalive round the session's reader parks again: the library
// goes on reading after the pong, so without the injected message it would
// wait inside the library, on a goroutine with a deep stack.
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
		requirePingAnswered(t, s)
	}
	var parked []*session
	for _, a := range agents {
		parked = append(parked, b.dir.session(a.id))
	}
	requireParked(t, parked)

	// The injected messages never reach the session's handlers, and the
	// session still relays.
	f := b.frame(agents[0], registry.EchoBeamID, "agent.ping", `{}`)
	clients[0].sendIntent(f)
	m := clients[0].next()
	require.Equal(t, "result", m.Type, "no error answered an injected message first: %s", m.raw)
	require.True(t, resultOf(t, m.Frame).Success)
}

// A reader woken only by control frames (a keepalive's pong) parks at once
// instead of lingering for a next message it has no reason to expect: with
// a linger of an hour, only sessions that skip it after the pong are parked.
func TestKeepaliveWakeParksWithoutLinger(t *testing.T) {
	b := setup(t, func(o *setupOpts) { o.cfg = func(c *Config) { c.parkLinger = time.Hour } })
	const n = 4
	agents := make([]*agent, n)
	for i := range agents {
		agents[i] = b.register("linger" + string(rune('a'+i)))
		b.connect(agents[i]) // reads, so it answers pings
	}
	var sessions []*session
	for _, a := range agents {
		s := b.dir.session(a.id)
		require.NotNil(t, s)
		require.False(t, s.raw.parked.Load(), "a new session lingers for its first message")
		sessions = append(sessions, s)
	}
	for _, s := range sessions {
		requirePingAnswered(t, s)
	}
	requireParked(t, sessions)
}

// requirePingAnswered runs one keepalive round of s and waits until the
// peer's pong was read; a second round then finds it and keeps the session.
func requirePingAnswered(t *testing.T, s *session) {
	t.Helper()
	before := s.raw.pongCount()
	s.keepalive()
	require.Eventually(t, func() bool { return s.raw.pongCount() != before }, 10*time.Second, time.Millisecond, "no pong read")
	s.keepalive()
	require.False(t, s.isClosing(), "the ping was answered")
}

// A session whose peer answers no ping is closed at the next round, with
// 1001 "keepalive timeout"; one whose peer answers stays.
func TestKeepaliveRoundClosesWithoutPong(t *testing.T) {
	b := setup(t)
	alice, bob := b.register("alice"), b.register("bob")
	b.connect(alice) // reads, so it answers pings
	// bob never reads, so it never answers a ping.
	conn, err := b.dial("beamId="+url.QueryEscape(bob.id)+"&apiKey="+url.QueryEscape(bob.apiKey), false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return b.dir.Online(bob.id) }, 5*time.Second, 5*time.Millisecond)
	sa, sb := b.dir.session(alice.id), b.dir.session(bob.id)
	requirePingAnswered(t, sa)
	sb.keepalive()
	require.False(t, sb.isClosing(), "the first round only pings")
	sb.keepalive()
	require.Eventually(t, sb.isClosing, 10*time.Second, time.Millisecond, "no pong since the ping")
	select {
	case <-sb.doneChan():
	case <-time.After(20 * time.Second):
		t.Fatal("the unresponsive session was not torn down")
	}
	sa.keepalive()
	require.False(t, sa.isClosing())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for err == nil { // the connected message comes first
		_, _, err = conn.conn.Read(ctx)
	}
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, websocket.StatusGoingAway, ce.Code)
	require.Equal(t, "keepalive timeout", ce.Reason)
}
