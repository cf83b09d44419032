package beam

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/limits"
)

// defaultReadHeaderTimeout is the header deadline when Limits sets none.
const defaultReadHeaderTimeout = 10 * time.Second

// rateLimits are the keyed buckets of one server.
type rateLimits struct {
	register, connect, intents, busSends *limits.Keyed
	meshCreates                          *limits.Keyed
}

func newRateLimits(l Limits, clock func() time.Time) *rateLimits {
	return &rateLimits{
		register:    limits.NewKeyed(limits.Rate(l.Register), clock),
		connect:     limits.NewKeyed(limits.Rate(l.Connect), clock),
		intents:     limits.NewKeyed(limits.Rate(l.Intents), clock),
		busSends:    limits.NewKeyed(limits.Rate(l.BusSends), clock),
		meshCreates: limits.NewKeyed(limits.Rate(l.MeshCreates), clock),
	}
}

// streaming reports whether r opens a long-lived stream (WebSocket, the
// dashboard's event stream, an envelope's SSE events), which the
// per-request deadlines must not cut.
func streaming(r *http.Request) bool {
	return webSocket(r) || r.URL.Path == "/observability/stream" ||
		strings.HasPrefix(r.URL.Path, "/api/v1/mesh/") && strings.HasSuffix(r.URL.Path, "/events")
}

// webSocket reports whether r is a WebSocket upgrade route, whose connects
// are rate limited per address.
func webSocket(r *http.Request) bool {
	return r.URL.Path == "/ws" || strings.HasPrefix(r.URL.Path, "/ws/")
}

// limit wraps the routes: per-address rate limits on registration and
// WebSocket connects, and no deadlines on streams.
func (s *Server) limit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var k *limits.Keyed
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/agents/register":
			k = s.rl.register
		case r.Method == http.MethodGet && webSocket(r):
			k = s.rl.connect
		}
		if ok, wait := k.Allow(clientIP(r)); !ok {
			e := httpjson.New(http.StatusTooManyRequests, "RATE_LIMITED", "too many requests from this address; retry later")
			e.RetryAfter = wait
			httpjson.Beam(w, e)
			return
		}
		rc := http.NewResponseController(w)
		switch {
		case streaming(r):
			_ = rc.SetWriteDeadline(time.Time{})
		case s.cfg.Limits.ReadTimeout > 0 && r.Body != nil && r.Body != http.NoBody:
			// The body must arrive within ReadTimeout. The deadline is
			// dropped once it has: a read deadline left on the connection
			// would cancel a handler still waiting for a result.
			if rc.SetReadDeadline(time.Now().Add(s.cfg.Limits.ReadTimeout)) == nil {
				r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the connection's read deadline once the body has
// been read to its end.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	once sync.Once
}

// Read reads the body and drops the deadline at its end.
func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(func() { _ = b.rc.SetReadDeadline(time.Time{}) })
	}
	return n, err
}

// clientIP is the key of the address the request came from (an IPv6
// address stands for its /64, see limits.HostKey). Forwarding headers are
// not trusted: behind a proxy, every client shares the proxy's limits.
func clientIP(r *http.Request) string {
	return limits.HostKey(r.RemoteAddr)
}

// writeTimeout is the configured WriteTimeout, or one long enough for the
// slowest ordinary response: POST /intents/send waiting for its result.
func (s *Server) writeTimeout() time.Duration {
	if s.cfg.Limits.WriteTimeout > 0 {
		return s.cfg.Limits.WriteTimeout
	}
	if *s.cfg.Limits == (Limits{}) {
		return 0
	}
	longest := max(s.cfg.Timeouts.HTTP, s.cfg.Timeouts.WebSocket, s.cfg.Bus.DeliveryTimeout, 60*time.Second)
	return longest + 30*time.Second
}
