package cluster

import (
	"net/http"

	"github.com/beamdir/beam/internal/httpjson"
)

// maxCapturedBody bounds the body of a local bus answer the proxy keeps in
// memory to merge or inspect; it matches the bound on a forwarded answer.
const maxCapturedBody = 16 << 20

// captured is the answer of the local bus handler, kept so the proxy can
// merge it with other nodes' answers (poll) or ask them instead (an unknown
// message). It keeps the headers, the status and at most maxCapturedBody
// bytes of body; overflow records that more was written.
type captured struct {
	header   http.Header
	status   int
	body     []byte
	overflow bool
}

func newCaptured() *captured { return &captured{header: http.Header{}} }

// Header implements http.ResponseWriter.
func (c *captured) Header() http.Header { return c.header }

// WriteHeader implements http.ResponseWriter; only the first status counts.
func (c *captured) WriteHeader(status int) {
	if c.status == 0 {
		c.status = status
	}
}

// Write implements http.ResponseWriter, keeping at most maxCapturedBody
// bytes.
func (c *captured) Write(p []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	if room := maxCapturedBody - len(c.body); len(p) > room {
		c.body = append(c.body, p[:max(room, 0)]...)
		c.overflow = true
		return len(p), nil
	}
	c.body = append(c.body, p...)
	return len(p), nil
}

// code is the status the handler answered (200 when it wrote without one).
func (c *captured) code() int {
	if c.status == 0 {
		return http.StatusOK
	}
	return c.status
}

// serveCaptured runs h for r and returns its captured answer.
func serveCaptured(h http.Handler, r *http.Request) *captured {
	c := newCaptured()
	h.ServeHTTP(c, r)
	return c
}

// copyTo writes the captured answer to w; an answer larger than the bound
// is replaced by a clear 502 instead of a truncated body.
func (c *captured) copyTo(w http.ResponseWriter) {
	if c.overflow {
		httpjson.WriteError(w, http.StatusBadGateway, "BUS_ANSWER_TOO_LARGE", "bus answer exceeds the proxy bound")
		return
	}
	for k, v := range c.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(c.code())
	_, _ = w.Write(c.body)
}
