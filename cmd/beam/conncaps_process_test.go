package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/beamdir/beam/internal/beamtest"
)

// idleFlood opens n connections from the loopback address src to addr and
// sends nothing on them. The returned counter rises as the server closes
// them.
func idleFlood(t *testing.T, src, addr string, n int) *atomic.Int64 {
	t.Helper()
	var closed atomic.Int64
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	for range n {
		c, err := d.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		go func() {
			_, err := c.Read(make([]byte, 1))
			var ne net.Error
			if err != nil && !(errors.As(err, &ne) && ne.Timeout()) && !errors.Is(err, net.ErrClosed) {
				closed.Add(1)
			}
		}()
	}
	return &closed
}

// getFrom is an HTTP GET from the loopback address src, bounded by timeout.
func getFrom(src, u string, timeout time.Duration) (int, error) {
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}).DialContext}}
	resp, err := c.Get(u)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestIntentListenerFloodIsCapped floods the Intent Protocol listener with
// idle connections from two addresses. Its own caps close the excess at
// once (10 per address, and past three quarters of its 20 slots only
// addresses holding none get one), a third address and the main listener
// are served throughout, and the held connections end at the header
// timeout.
func TestIntentListenerFloodIsCapped(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--intent-max-conns", "20", "--intent-max-conns-per-addr", "10",
		"--intent-idle-timeout", "8s"}, Env: []string{"BUS_SECRET=flood-test-secret"}})
	addr := strings.TrimPrefix(p.IntentURL(), "http://")

	// The main listener answers /health throughout the flood.
	stop, healthDone := make(chan struct{}), make(chan error, 1)
	go func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			status, err := getFrom("127.0.0.1", p.URL()+"/health", 5*time.Second)
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("main /health answered %d", status)
			}
			if err != nil {
				healthDone <- err
				return
			}
			select {
			case <-stop:
				healthDone <- nil
				return
			case <-tick.C:
			}
		}
	}()
	a := idleFlood(t, "127.0.0.1", addr, 50)
	b := idleFlood(t, "127.0.0.2", addr, 50)
	// At most 15 are held (10 + 5); the rest are closed long before the
	// 8 s header timeout could have closed them.
	require.Eventually(t, func() bool { return a.Load()+b.Load() >= 85 }, 5*time.Second, 20*time.Millisecond,
		"the connections over the caps were not closed at once")

	status, err := getFrom("127.0.0.3", p.IntentURL()+"/health", 5*time.Second)
	require.NoError(t, err, "a third address reaches the intent listener")
	require.Equal(t, http.StatusOK, status)

	// The held ones are idle: the header timeout closes them.
	require.Eventually(t, func() bool { return a.Load()+b.Load() == 100 }, 30*time.Second, 50*time.Millisecond,
		"the held idle connections did not time out")
	close(stop)
	require.NoError(t, <-healthDone, "the main listener answered throughout")
}

// TestConnectionCapsKeepRoomForNewAddresses fills the main listener's
// 40-connection cap from four addresses at their 10-connection cap: the
// last quarter is kept for addresses holding no connection, so a fifth
// address is served at once instead of waiting for a slot.
func TestConnectionCapsKeepRoomForNewAddresses(t *testing.T) {
	t.Parallel()
	p := beamtest.Start(t, beamtest.Options{Args: []string{"--max-conns", "40", "--max-conns-per-addr", "10"}})
	addr := strings.TrimPrefix(p.URL(), "http://")
	floods := make([]*atomic.Int64, 0, 4)
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"} {
		floods = append(floods, idleFlood(t, src, addr, 10))
	}
	// The heavy addresses get 30 slots, and the one whose first
	// connection finds only the reserve left gets one more: at least nine
	// are closed.
	require.Eventually(t, func() bool {
		var closed int64
		for _, f := range floods {
			closed += f.Load()
		}
		return closed >= 9
	}, 5*time.Second, 20*time.Millisecond, "heavy connections past the reserve were not closed")
	for _, src := range []string{"127.0.0.6", "127.0.0.7"} {
		status, err := getFrom(src, p.URL()+"/health", 5*time.Second)
		require.NoError(t, err, "a new address is served while the heavy ones hold their slots")
		require.Equal(t, http.StatusOK, status)
	}
}
