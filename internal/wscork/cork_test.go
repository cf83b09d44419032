package wscork

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recordingConn records each write that reaches it.
type recordingConn struct {
	net.Conn
	mu     sync.Mutex
	writes [][]byte
	fail   bool
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail {
		return 0, errors.New("connection broken")
	}
	c.writes = append(c.writes, append([]byte(nil), p...))
	return len(p), nil
}

func (c *recordingConn) SetWriteDeadline(time.Time) error { return nil }

func (c *recordingConn) got() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([][]byte(nil), c.writes...)
}

func TestCorkedFramesGoOutInOneWrite(t *testing.T) {
	t.Parallel()
	rc := &recordingConn{}
	c := New(rc)

	_, err := c.Write([]byte("through"))
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("through")}, rc.got(), "uncorked writes pass through")
	require.False(t, c.Holding(), "uncorked, no buffer is held")

	c.Cork()
	c.Ping()
	for _, f := range []string{"one", "two", "three"} {
		_, err := c.Write([]byte(f))
		require.NoError(t, err)
	}
	require.Len(t, rc.got(), 1, "corked writes are collected")
	require.NoError(t, c.Uncork(time.Second))
	require.Equal(t, [][]byte{[]byte("through"), append(append([]byte(nil), pingFrame...), "onetwothree"...)}, rc.got())
	require.False(t, c.Holding(), "the buffer goes back once uncorked")
	c.Ping()
	require.Len(t, rc.got(), 2, "a ping is collected only while corked")
}

func TestCorkFlushesWhenFullAndDiscardsOnFailure(t *testing.T) {
	t.Parallel()
	rc := &recordingConn{}
	c := New(rc)
	c.Cork()
	frame := bytes.Repeat([]byte("x"), 1000)
	for !c.Full() {
		_, err := c.Write(frame)
		require.NoError(t, err)
	}
	require.NoError(t, c.Flush(time.Second))
	require.Len(t, rc.got(), 1)
	require.False(t, c.Full(), "a flush empties the collection")
	require.True(t, c.Holding(), "and stays corked")

	_, err := c.Write([]byte("lost"))
	require.NoError(t, err)
	rc.mu.Lock()
	rc.fail = true
	rc.mu.Unlock()
	require.Error(t, c.Flush(time.Second))
	c.Discard()
	require.False(t, c.Holding())
	_, err = c.Write([]byte("after"))
	require.Error(t, err, "uncorked again: writes reach the connection")
}

// Over a real connection, what a corked writer collected arrives whole.
func TestCorkOverTCP(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		s, err := ln.Accept()
		if err != nil {
			close(got)
			return
		}
		defer s.Close()
		b, _ := io.ReadAll(s)
		got <- b
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c := New(conn)
	c.Cork()
	_, err = c.Write([]byte("hello "))
	require.NoError(t, err)
	_, err = c.Write([]byte("world"))
	require.NoError(t, err)
	require.NoError(t, c.Uncork(time.Second))
	require.NoError(t, conn.Close())
	require.Equal(t, "hello world", string(<-got))
}
