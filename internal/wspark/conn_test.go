package wspark

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
	c := New(srv, []byte("ahead-"))
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
	require.False(t, c.Buffered(), "a drained buffer goes back to the pool")

	// A read at least a chunk long goes straight into the caller's buffer.
	big := bytes.Repeat([]byte("y"), readChunk+100)
	go func() { _, _ = cli.Write(big) }()
	p := make([]byte, len(big))
	_, err = io.ReadFull(c, p)
	require.NoError(t, err)
	require.Equal(t, big, p)
	require.False(t, c.Buffered())

	require.NoError(t, cli.Close())
	_, err = c.Read(buf)
	require.ErrorIs(t, err, io.EOF)
}

func TestIdleConnWaitHoldsNoBuffer(t *testing.T) {
	t.Parallel()
	srv, cli := tcpPair(t)
	c := New(srv, nil)
	woke := waiting(c)
	select {
	case <-woke:
		t.Fatal("wait returned before anything arrived")
	case <-time.After(50 * time.Millisecond):
	}
	require.False(t, c.Buffered(), "waiting takes no buffer")
	_, err := cli.Write([]byte("x"))
	require.NoError(t, err)
	<-woke
	require.False(t, c.Buffered(), "wait only peeks")
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
	c2 := New(srv2, nil)
	done2 := waiting(c2)
	require.NoError(t, c2.Close())
	<-done2
}

// waiting runs c.wait and returns a channel closed when it returns.
func waiting(c *Conn) <-chan struct{} {
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
	c := New(a, []byte("ab"))
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

// Park arms the connection in the read poller and gives up the reader's
// goroutine; the reader is started again once bytes arrive, and Close wakes
// a parked reader too.
func TestParkResumesTheReaderWhenBytesArrive(t *testing.T) {
	t.Parallel()
	if sharedReadPoller() == nil {
		// No poller (not Linux): Park waits on the caller's goroutine.
		srv, cli := tcpPair(t)
		c := New(srv, nil)
		go func() { _, _ = cli.Write([]byte("x")) }()
		require.False(t, c.Park(func() {}, 0))
		return
	}
	srv, cli := tcpPair(t)
	c := New(srv, nil)
	resumed := make(chan struct{}, 1)
	require.True(t, c.Park(func() { resumed <- struct{}{} }, 0), "armed at once with no linger")
	require.True(t, c.Parked())
	require.False(t, c.Buffered(), "parking takes no buffer")
	_, err := cli.Write([]byte("hello"))
	require.NoError(t, err)
	<-resumed
	require.False(t, c.Parked())
	b := make([]byte, 8)
	n, err := c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "hello", string(b[:n]))

	// Re-armed, then closed: the reader is resumed to see the close.
	require.True(t, c.Park(func() { resumed <- struct{}{} }, 0))
	require.NoError(t, c.Close())
	<-resumed

	// With a linger, bytes that come within it keep the goroutine.
	srv2, cli2 := tcpPair(t)
	c2 := New(srv2, nil)
	go func() { _, _ = cli2.Write([]byte("y")) }()
	require.False(t, c2.Park(func() { t.Error("resumed after a linger that saw bytes") }, time.Minute))
}

// After a pong, with nothing more on the socket, the library's next read
// gets the synthetic empty message, which TakeInjected reports once; the
// pong is counted.
func TestPongThenNothingInjectsAnEmptyMessage(t *testing.T) {
	t.Parallel()
	srv, cli := tcpPair(t)
	c := New(srv, nil)
	pong := clientFrame(true, 0xA, nil)
	_, err := cli.Write(pong)
	require.NoError(t, err)
	b := make([]byte, 64)
	got := 0
	for got < len(pong) {
		n, err := c.Read(b[got:])
		require.NoError(t, err)
		got += n
	}
	require.Equal(t, uint32(1), c.Pongs())
	n, err := c.Read(b)
	require.NoError(t, err)
	require.Equal(t, injectedMessage, b[:n])
	require.True(t, c.TakeInjected())
	require.False(t, c.TakeInjected(), "reported once")
}
