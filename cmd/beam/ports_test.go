package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// Ports for servers a test starts later (NATS routes and clients, the
// README's listeners) are chosen below the kernel's ephemeral port range.
// A port found with a listener on port 0 and closed again is free only for
// a moment: the other tests' servers, which all listen on port 0, could be
// given it before the server it was chosen for binds it (a cluster route
// once answered "400 Bad Request" that way). A port below the ephemeral
// range is never handed to a listener on port 0, in this process or any
// other; each one is checked free when chosen and handed out once.
var testPorts struct {
	sync.Mutex
	lo, hi, next int
	used         map[int]bool
}

// freePort returns a free loopback port below the ephemeral range.
func freePort(t *testing.T) int {
	t.Helper()
	testPorts.Lock()
	defer testPorts.Unlock()
	if testPorts.used == nil {
		testPorts.used = map[int]bool{}
		testPorts.hi = ephemeralLow()
		testPorts.lo = max(testPorts.hi-10000, 1024)
		testPorts.next = testPorts.lo + rand.IntN(testPorts.hi-testPorts.lo)
	}
	for range testPorts.hi - testPorts.lo {
		p := testPorts.next
		testPorts.next++
		if testPorts.next >= testPorts.hi {
			testPorts.next = testPorts.lo
		}
		if testPorts.used[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		require.NoError(t, ln.Close())
		testPorts.used[p] = true
		return p
	}
	t.Fatalf("no free port in %d..%d", testPorts.lo, testPorts.hi-1)
	return 0
}

// freeAddr returns 127.0.0.1 with a free port (freePort).
func freeAddr(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("127.0.0.1:%d", freePort(t))
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux;
// 32768, the usual value, elsewhere).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil || lo < 2048 {
		return 32768
	}
	return lo
}

func TestFreePortsAreOutsideTheEphemeralRangeAndDistinct(t *testing.T) {
	t.Parallel()
	seen := map[int]bool{}
	for range 50 {
		p := freePort(t)
		require.Less(t, p, ephemeralLow())
		require.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
	}
}
