package directory

import (
	"context"
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
	"github.com/beamdir/beam/internal/tricks"
)

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

// An idle session has no goroutine (it is parked in wspark's read poller;
// where there is none, one goroutine on a short stack) and no read buffer,
// also behind the server's connection limits; a message read later is
// handled and the buffer given back; a parked session notices its peer
// leaving and is torn down when the directory closes it. With wspark off
// the same traffic and teardown hold on the plain path.
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
	requireParked(t, sessions())

	// Traffic still flows, and the session goes back to holding nothing.
	f := b.frame(agents[0], registry.EchoBeamID, "agent.ping", `{}`)
	clients[0].sendIntent(f)
	require.True(t, resultOf(t, clients[0].nextOf("result").Frame).Success)
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

// requireParked waits, with wspark on, until every one of sessions waits
// for its peer holding no read buffer and without a goroutine (in the read
// poller) or, where there is none, on the short stack of wspark's wait —
// and no session has a goroutine elsewhere. With wspark off there is
// nothing to wait for: each reader blocks in the library.
func requireParked(t *testing.T, sessions []*session) {
	t.Helper()
	if !tricks.On(trickPark) {
		return
	}
	n := len(sessions)
	for _, s := range sessions {
		require.NotNil(t, s.raw, "wspark is on")
	}
	holding := func() bool {
		for _, s := range sessions {
			if s.raw.Buffered() {
				return true
			}
		}
		return false
	}
	if runtime.GOOS != "linux" {
		require.Eventually(t, func() bool {
			return !holding() && goroutinesIn("wspark.(*Conn).wait") == n && goroutinesIn("directory.(*session).") == n
		}, 10*time.Second, 10*time.Millisecond, "parked in wait: %d of %d", goroutinesIn("wspark.(*Conn).wait"), n)
		return
	}
	require.Eventually(t, func() bool {
		for _, s := range sessions {
			if !s.raw.Parked() {
				return false
			}
		}
		return !holding() && goroutinesIn("directory.(*session).") == 0
	}, 10*time.Second, 10*time.Millisecond, "session goroutines: %d", goroutinesIn("directory.(*session)."))
}

// clientFrame is a masked client frame.
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
		if s.raw != nil {
			require.False(t, s.raw.Parked(), "a new session lingers for its first message")
		}
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
	before := s.pongCount()
	s.keepalive()
	require.Eventually(t, func() bool { return s.pongCount() != before }, 10*time.Second, time.Millisecond, "no pong read")
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
