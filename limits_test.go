package beam

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateLimitsGroupIPv6By64 registers from two addresses of one IPv6 /64
// through the server's handler, with a registration limit of one per hour:
// the second is refused as the same client, while an address of the next
// /64 and an IPv4 address each have their own allowance. (The test machine
// can bind only ::1, so the addresses are set on the requests; the
// connection caps use the same key, limits.AddrKey.)
func TestRateLimitsGroupIPv6By64(t *testing.T) {
	t.Parallel()
	l := startLive(t, Config{Limits: &Limits{Register: Rate{N: 1, Per: time.Hour}}})
	register := func(remote string) int {
		req := httptest.NewRequest(http.MethodPost, "/agents/register", strings.NewReader("{}"))
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		l.srv.httpSrv.Handler.ServeHTTP(rec, req)
		return rec.Code
	}
	require.NotEqual(t, http.StatusTooManyRequests, register("[2001:db8:1:2::1]:40000"))
	require.Equal(t, http.StatusTooManyRequests, register("[2001:db8:1:2:ffff:ffff:ffff:fffe]:40001"), "same /64, same client")
	require.NotEqual(t, http.StatusTooManyRequests, register("[2001:db8:1:3::1]:40000"), "another /64")
	require.NotEqual(t, http.StatusTooManyRequests, register("192.0.2.1:40000"))
	require.Equal(t, http.StatusTooManyRequests, register("[::ffff:192.0.2.1]:40000"), "an IPv4-mapped address is the IPv4 client")
}
