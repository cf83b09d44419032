package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/beamdir/beam/directory"
	"github.com/beamdir/beam/internal/httpjson"
)

// Forwarded event streams: an envelope's SSE stream read through a node
// that does not own the envelope is a node call (the same sealed token as
// busproxy.go's, on the owner's stream subject) whose answer is a stream
// of chunks, each published as the owner's handler flushes it: events
// reach the client as they happen. Every chunk carries a seal by the
// answering node over the call ID, the calling node, the chunk's index
// and the digest of its bytes (the first also the status and content
// type, the last an end mark); the caller writes a chunk only once its
// seal verifies and its index is the next one, and drops anything else
// (other NATS clients can publish to inboxes). The answering node asks the
// caller's inbox every streamPing whether it still listens (a NATS request
// it answers; no responders when the caller left) and ends the stream when
// it does not, so a client's disconnect ends the stream on both nodes.
// Each node serves at most maxStreams forwarded streams and forwards at
// most as many; more are answered 503.

const (
	typStreamChunk   = "beam-cluster-stream+jws"
	headerStream     = "Beam-Stream"      // the chunk's index, from 1
	headerStreamPing = "Beam-Stream-Ping" // the answering node's liveness question
	// maxStreams bounds the forwarded streams a node serves, and those it
	// forwards.
	maxStreams = 64
	// streamPing is how often the answering node asks whether the caller
	// still listens.
	streamPing = 2 * time.Second
	// streamIdle ends a forwarded stream whose answering node sent nothing
	// (not even the gateway's keepalive comment) for this long.
	streamIdle = 60 * time.Second
	// maxPeekBody bounds the local answer held while it may be a 404.
	maxPeekBody = 64 << 10
)

// streamSeal is the payload of a stream chunk's seal.
type streamSeal struct {
	Call        string `json:"call"` // the call's ID
	To          string `json:"to"`   // the calling node
	I           int    `json:"i"`
	Body        string `json:"body"`             // hex SHA-256 of the chunk
	Status      int    `json:"status,omitempty"` // first chunk
	ContentType string `json:"contentType,omitempty"`
	End         bool   `json:"end,omitempty"`
}

// streams is a node's part of forwarded streams.
type streams struct {
	sub     *nats.Subscription
	served  chan struct{} // streams this node answers
	calling chan struct{} // streams this node forwards
}

func (s *streams) close() {
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
}

func (n *Node) streamSubject(nodeID string) string {
	return "beam.cluster." + Token(n.cfg.Domain) + ".node." + nodeID + ".stream"
}

// startStreams answers the stream calls of other nodes until ctx ends.
func (n *Node) startStreams(ctx context.Context) error {
	n.streams.served, n.streams.calling = make(chan struct{}, maxStreams), make(chan struct{}, maxStreams)
	sub, err := n.nc.Subscribe(n.streamSubject(n.cfg.NodeID), func(m *nats.Msg) { n.onStream(ctx, m) })
	if err != nil {
		return fmt.Errorf("cluster: subscribe streams: %w", err)
	}
	n.streams.sub = sub
	return nil
}

// onStream serves a stream call another node sent, as the principal its
// token names, publishing each flushed part as a sealed chunk.
func (n *Node) onStream(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		return
	}
	from, c, err := n.verifyCall(m.Header.Get(headerSeal), m.Data, time.Now())
	next := n.callNext.Load()
	if err == nil && next == nil {
		err = errors.New("this node serves no gateway")
	}
	if err == nil && c.route() != meshEvents {
		err = errors.New("only an event stream is called on the stream subject")
	}
	sw := &streamWriter{n: n, reply: m.Reply, call: c.ID, to: from, header: http.Header{}}
	if err != nil {
		n.refuse("call", err, "path", c.Path)
		sw.fail(httpjson.New(http.StatusUnauthorized, "UNAUTHORIZED", "cluster request not signed by a member"))
		return
	}
	select {
	case n.streams.served <- struct{}{}:
	default:
		sw.fail(httpjson.New(http.StatusServiceUnavailable, "BUSY", "node serves too many forwarded streams"))
		return
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer func() { <-n.streams.served }()
		sctx, stop := context.WithCancel(directory.WithBusPrincipal(ctx, c.Principal))
		defer stop()
		go n.pingCaller(sctx, stop, m.Reply)
		r, err := c.request(sctx, nil)
		if err != nil {
			sw.fail(httpjson.New(http.StatusBadRequest, "INVALID_REQUEST", "bad call"))
			return
		}
		if c.LastEventID != "" {
			r.Header.Set("Last-Event-ID", c.LastEventID)
		}
		(*next).ServeHTTP(sw, r)
		sw.send(true)
	}()
}

// pingCaller asks the caller's inbox every streamPing whether it still
// listens, and stops the stream when it does not answer.
func (n *Node) pingCaller(ctx context.Context, stop context.CancelFunc, inbox string) {
	t := time.NewTicker(streamPing)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, streamIdle/2)
		_, err := n.nc.RequestMsgWithContext(pctx, &nats.Msg{Subject: inbox, Header: nats.Header{headerStreamPing: {"1"}}})
		cancel()
		if err != nil && ctx.Err() == nil {
			stop()
			return
		}
	}
}

// streamWriter is the http.ResponseWriter of a stream call: what the
// handler writes is published, sealed, at each Flush and at the end.
type streamWriter struct {
	n        *Node
	reply    string
	call, to string
	header   http.Header
	status   int
	buf      []byte
	i        int
	err      error
	ended    bool
}

// Header implements http.ResponseWriter.
func (s *streamWriter) Header() http.Header { return s.header }

// WriteHeader implements http.ResponseWriter; only the first status counts.
func (s *streamWriter) WriteHeader(status int) {
	if s.status == 0 {
		s.status = status
	}
}

// Write implements http.ResponseWriter; the bytes go out at the next
// Flush, or once they fill a NATS message.
func (s *streamWriter) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	if s.err != nil {
		return 0, s.err
	}
	s.buf = append(s.buf, p...)
	if len(s.buf) >= s.chunkSize() {
		s.send(false)
	}
	return len(p), s.err
}

// Flush implements http.Flusher: it publishes what was written.
func (s *streamWriter) Flush() { s.send(false) }

func (s *streamWriter) chunkSize() int { return max(int(s.n.nc.MaxPayload())-callRoom, 1<<10) }

// fail answers the call with e and ends it.
func (s *streamWriter) fail(e *httpjson.Error) {
	s.header.Set("Content-Type", "application/json")
	s.WriteHeader(e.Status)
	s.buf = append(s.buf[:0], e.Marshal()...)
	s.send(true)
}

// send publishes what was written as sealed chunks; end marks the last.
func (s *streamWriter) send(end bool) {
	if s.err != nil || s.ended || (!end && len(s.buf) == 0 && s.i > 0) {
		return
	}
	s.WriteHeader(http.StatusOK)
	size := s.chunkSize()
	for first := true; first || len(s.buf) > 0; first = false {
		part := s.buf[:min(size, len(s.buf))]
		s.buf = s.buf[len(part):]
		s.i++
		seal := streamSeal{Call: s.call, To: s.to, I: s.i, Body: digest(part), End: end && len(s.buf) == 0}
		if s.i == 1 {
			seal.Status, seal.ContentType = s.status, s.header.Get("Content-Type")
		}
		tok, err := s.n.seal(typStreamChunk, seal)
		if err == nil {
			err = s.n.nc.PublishMsg(&nats.Msg{Subject: s.reply, Data: part,
				Header: nats.Header{headerSeal: {tok}, headerStream: {strconv.Itoa(s.i)}}})
		}
		if err != nil {
			s.err = fmt.Errorf("cluster: stream to %s: %w", s.to, err)
			return
		}
	}
	s.buf = s.buf[:0]
	s.ended = end
}

// meshStream serves an envelope's event stream from this node, or, when it
// does not know the envelope, forwards it from the first other node that
// does.
func (n *Node) meshStream(w http.ResponseWriter, r *http.Request, next http.Handler, p directory.BusPrincipal) {
	pw := &peekWriter{w: w, header: http.Header{}}
	next.ServeHTTP(pw, r)
	if !pw.held || !meshNotFound(pw.status, pw.body) {
		pw.release()
		return
	}
	select {
	case n.streams.calling <- struct{}{}:
		defer func() { <-n.streams.calling }()
	default:
		httpjson.WriteError(w, http.StatusServiceUnavailable, "BUSY", "this node forwards too many event streams; retry later")
		return
	}
	for _, node := range n.others(r.Context()) {
		served, err := n.streamFrom(w, r, node.NodeID, p)
		if served {
			return
		}
		if err != nil {
			n.lg.Warn("mesh: stream from another node", "node", node.NodeID, "err", err)
		}
	}
	pw.release()
}

// streamFrom asks node for r's stream and, unless node does not know the
// envelope, copies it to w as it comes. served reports that w was written.
func (n *Node) streamFrom(w http.ResponseWriter, r *http.Request, node string, p directory.BusPrincipal) (served bool, err error) {
	c, tok, err := n.newCall(r, node, p, r.URL.RawQuery, nil)
	if err != nil {
		return false, err
	}
	inbox := n.nc.NewRespInbox()
	sub, err := n.nc.SubscribeSync(inbox)
	if err != nil {
		return false, fmt.Errorf("stream from %s: %w", node, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg := &nats.Msg{Subject: n.streamSubject(node), Reply: inbox, Header: nats.Header{headerSeal: {tok}}}
	if err := n.nc.PublishMsg(msg); err != nil {
		return false, fmt.Errorf("stream from %s: %w", node, err)
	}
	ctx := r.Context()
	first, data, err := n.nextChunk(ctx, sub, node, c.ID, 1, forwardTimeout)
	if err != nil {
		return false, err
	}
	if first.End && meshNotFound(first.Status, data) {
		return false, nil
	}
	if first.ContentType != "" {
		w.Header().Set("Content-Type", first.ContentType)
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(first.Status)
	flusher, _ := w.(http.Flusher)
	for ch := first; ; {
		if _, err := w.Write(data); err != nil {
			return true, nil
		}
		if flusher != nil {
			flusher.Flush()
		}
		if ch.End {
			return true, nil
		}
		if ch, data, err = n.nextChunk(ctx, sub, node, c.ID, ch.I+1, streamIdle); err != nil {
			// The client left, or the answering node went silent: the
			// stream ends here (a client resumes with Last-Event-ID).
			return true, nil
		}
	}
}

// nextChunk returns chunk want of call from node's stream on sub, once its
// seal verifies; anything else on the inbox is dropped and counted, and
// the answering node's liveness questions are answered. It fails when ctx
// ends or nothing valid comes within idle.
func (n *Node) nextChunk(ctx context.Context, sub *nats.Subscription, node, call string, want int, idle time.Duration) (streamSeal, []byte, error) {
	timer := time.NewTimer(idle)
	defer timer.Stop()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-timer.C:
			cancel()
		case <-cctx.Done():
		}
	}()
	for {
		m, err := sub.NextMsgWithContext(cctx)
		if err != nil {
			return streamSeal{}, nil, fmt.Errorf("stream from %s: %w", node, err)
		}
		if m.Header.Get(headerStreamPing) != "" {
			_ = m.Respond(nil)
			continue
		}
		if m.Header.Get("Status") == "503" {
			return streamSeal{}, nil, fmt.Errorf("stream from %s: %w", node, nats.ErrNoResponders)
		}
		var s streamSeal
		err = n.openAs(typStreamChunk, []byte(m.Header.Get(headerSeal)), &s, func() string { return node })
		if err == nil && (s.Call != call || s.To != n.cfg.NodeID || s.I != want || s.Body != digest(m.Data)) {
			err = fmt.Errorf("%w: stream chunk of %s is another call's, out of place or altered", errUnsealed, node)
		}
		if err != nil {
			n.refuse("stream", err)
			continue
		}
		return s, m.Data, nil
	}
}

// peekWriter passes a handler's answer through to w unless its status is
// 404, which it holds (up to maxPeekBody) so that the caller may ask
// another node instead.
type peekWriter struct {
	w      http.ResponseWriter
	header http.Header
	status int
	held   bool
	body   []byte
}

// Header implements http.ResponseWriter.
func (p *peekWriter) Header() http.Header { return p.header }

// WriteHeader implements http.ResponseWriter.
func (p *peekWriter) WriteHeader(status int) {
	if p.status != 0 {
		return
	}
	p.status = status
	if status == http.StatusNotFound {
		p.held = true
		return
	}
	for k, v := range p.header {
		p.w.Header()[k] = v
	}
	p.w.WriteHeader(status)
}

// Write implements http.ResponseWriter.
func (p *peekWriter) Write(b []byte) (int, error) {
	p.WriteHeader(http.StatusOK)
	if !p.held {
		return p.w.Write(b)
	}
	p.body = append(p.body, b[:min(len(b), max(maxPeekBody-len(p.body), 0))]...)
	return len(b), nil
}

// Flush implements http.Flusher.
func (p *peekWriter) Flush() {
	if f, ok := p.w.(http.Flusher); ok && p.status != 0 && !p.held {
		f.Flush()
	}
}

// release writes a held answer to w.
func (p *peekWriter) release() {
	if !p.held {
		return
	}
	for k, v := range p.header {
		p.w.Header()[k] = v
	}
	p.w.Header().Del("Content-Length")
	p.w.WriteHeader(p.status)
	_, _ = p.w.Write(p.body)
}
