package directory

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/tracing"
)

// countingConn counts the writes that reach the socket; with fail set,
// every write fails as a broken connection would.
type countingConn struct {
	net.Conn
	mu     sync.Mutex
	writes int
	fail   bool
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.writes++
	fail := c.fail
	c.mu.Unlock()
	if fail {
		return 0, errors.New("connection broken")
	}
	return c.Conn.Write(p)
}

// SyscallConn hands out the socket's descriptor, so that wspark reads the
// socket beneath the count as it does without it.
func (c *countingConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("no descriptor")
	}
	return sc.SyscallConn()
}

func (c *countingConn) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// countedSession is a setup whose WebSocket connections are counted
// beneath everything that writes to them, with bob connected and his
// session's writer idle.
func countedSession(t *testing.T) (b *testBundle, bob *agent, bc *wsClient, s *session, cc *countingConn) {
	t.Helper()
	var (
		mu   sync.Mutex
		made []*countingConn
	)
	b = setup(t, func(o *setupOpts) {
		o.cfg = func(c *Config) {
			c.wrapConn = func(conn net.Conn) net.Conn {
				cc := &countingConn{Conn: conn}
				mu.Lock()
				made = append(made, cc)
				mu.Unlock()
				return cc
			}
		}
	})
	bob = b.register("bob")
	bc = b.connect(bob)
	s = b.dir.session(bob.id)
	require.NotNil(t, s)
	idleWriter(t, s)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, made, 1)
	return b, bob, bc, s, made[0]
}

// idleWriter waits until the session's writer has nothing left to write.
func idleWriter(t *testing.T, s *session) {
	t.Helper()
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.writing
	}, 5*time.Second, time.Millisecond)
}

func TestWriterSendsAQueuedBatchInOrderInFewWrites(t *testing.T) {
	t.Parallel()
	_, _, bc, s, cc := countedSession(t)
	before := cc.count()

	// Queue 40 messages as one batch (the writer is started after they
	// are all queued), 120 KiB in all: more than wscork flushes at once,
	// so with it on the batch goes out in a few writes, not in 40.
	const n = 40
	pad := strings.Repeat("x", 3000)
	total := 0
	s.mu.Lock()
	require.False(t, s.writing)
	s.writing = true
	for i := range n {
		m := []byte(fmt.Sprintf(`{"type":"seq","i":%d,"pad":%q}`, i, pad))
		total += len(m)
		s.out = append(s.out, outMsg{data: m})
	}
	s.mu.Unlock()
	go s.writer()

	for i := range n {
		m := bc.nextOf("seq")
		var v struct {
			I   int    `json:"i"`
			Pad string `json:"pad"`
		}
		require.NoError(t, json.Unmarshal(m.raw, &v))
		require.Equal(t, i, v.I, "frames arrive in the order they were queued")
		require.Equal(t, pad, v.Pad)
	}
	if s.cork != nil {
		require.Less(t, cc.count()-before, n/4, "frames queued together share writes (%d bytes)", total)
		// Once the queue is empty the session holds no collection buffer,
		// and frames written later (a keepalive ping) pass straight through.
		require.Eventually(t, func() bool { return !s.cork.Holding() }, 5*time.Second, time.Millisecond)
	}
	requirePingAnswered(t, s)
}

func TestFailedBatchWriteIsNotRecordedAsDelivered(t *testing.T) {
	t.Parallel()
	b, bob, bc, _, cc := countedSession(t)
	alice := b.register("alice")
	cc.mu.Lock()
	cc.fail = true
	cc.mu.Unlock()

	f := b.frame(alice, bob.id, "quote.request", `{"sku":"INV-240"}`)
	o := waitHTTP(t, b.sendAsync(f))
	require.Equal(t, http.StatusBadGateway, o.status, string(o.body))
	code, _ := errBody(t, o.body)
	require.Equal(t, CodeDeliveryFailed, code)
	require.Equal(t, []tracing.State{tracing.Received, tracing.Validated, tracing.Dispatched, tracing.Failed},
		b.states(f.Nonce), "a frame whose write failed never counts as delivered")
	bc.closeStatus()
	require.Eventually(t, func() bool { return !b.dir.Online(bob.id) }, 5*time.Second, time.Millisecond)
}
