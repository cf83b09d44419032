package directory

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
	"github.com/beamdir/beam/directory/registry"
	"github.com/beamdir/beam/internal/httpjson"
	"github.com/beamdir/beam/internal/replay"
	"github.com/beamdir/beam/internal/tricks"
	"github.com/beamdir/beam/internal/wscork"
	"github.com/beamdir/beam/internal/wspark"
)

// Authentication methods reported in the connected message.
const (
	authAPIKey    = "api_key"
	authSignature = "signature"
	authJWS       = "jws"
	authLegacy    = "legacy"
)

// connectAction is the action of a signed WebSocket connect token: the
// signature query parameter is Ed25519 by the agent's key over
// wire.CanonicalJSON of {"action":"ws.connect","beamId","nonce","timestamp"}.
const connectAction = "ws.connect"

// typConnectJWS is the JWS typ of a beam/2 connect token (token query
// parameter); its payload is the same object as a signed connect token.
const typConnectJWS = "beam-connect+jws"

// maxConnectNoncesPerAgent bounds the remembered connect-token nonces of
// one agent. Nonces are remembered only after the agent's signature
// verified, so an agent that fills its budget (more than this many signed
// connects within ten minutes) locks out only its own signed connects.
const maxConnectNoncesPerAgent = 1024

// maxCloseReason is the longest close reason a close frame carries.
const maxCloseReason = 120

// outMsg is one message queued for a session's writer. inf is set for an
// intent delivery: delivered is recorded once the message was written.
type outMsg struct {
	data []byte
	inf  *inflight
}

// session is an attached WebSocket session of one agent. An idle session
// has no goroutine where wspark's read poller runs (Linux; elsewhere one,
// on a short stack; with wspark off, one in the library's read): its
// reader, writer and workers run only while it has bytes to read, messages
// to write or messages to handle, and its keepalive is an entry on the directory's keepalive wheel. What an
// idle session does not need is made on first use: its context (for the
// intents it sends), its work queue and the channel that says it ended.
type session struct {
	d           *Directory
	beamID      string
	auth        string
	beam2       bool // announced beam/2 (protocol query parameter or a beam/2 connect token)
	conn        *websocket.Conn
	raw         *wspark.Conn // under conn's reads: holds a buffer only while bytes wait; nil with wspark off
	cork        *wscork.Cork // under conn's write buffer: the writer's batches go out in one write; nil with wscork off
	connectedAt time.Time

	mu          sync.Mutex
	closing     bool
	writing     bool // a writer goroutine (or the shutdown) runs
	pingDue     bool // on the keepalive wheel
	pingNow     bool // the writer is to send a ping
	pinged      bool // a ping was sent; pongsAtPing is the pong count then
	pongsAtPing uint32
	pongs       uint32 // pongs the library reported (libraryPing); the frame tracker counts them otherwise
	ended       uint8  // endRead and endShutdown, once each has finished
	closeCode   websocket.StatusCode
	closeReason string
	out         []outMsg           // queued for the writer, at most Config.SendQueue
	ctx         context.Context    // of the intents the session sent; nil until the first
	cancel      context.CancelFunc // cancels ctx; called by the shutdown
	done        chan struct{}      // see doneChan; nil until asked for

	work *sessionWork // messages read and their workers; nil until the first message
}

// The two halves of a session's teardown: the reader has ended, and the
// shutdown (close frame, queued intents failed) is complete.
const (
	endRead uint8 = 1 << iota
	endShutdown
)

// sessionWork holds the messages a session read for its workers. Only the
// session's reader makes it (on the first message) and dispatches.
type sessionWork struct {
	mu      sync.Mutex
	cond    sync.Cond // on mu: space in queue, or a worker exited
	queue   [][]byte
	workers int // running workers
}

// session returns the current session of beamID, or nil.
func (d *Directory) session(beamID string) *session {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sessions[beamID]
}

// handleWS serves the WebSocket endpoint.
func (d *Directory) handleWS(w http.ResponseWriter, r *http.Request) {
	lh := &leanHijack{ResponseWriter: w, park: tricks.On(trickPark), cork: tricks.On(trickCork), wrap: d.cfg.wrapConn}
	conn, err := websocket.Accept(lh, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		d.lg.Info("websocket upgrade failed", "err", err)
		return
	}
	conn.SetReadLimit(int64(d.cfg.MaxMessageBytes))
	beamID := r.URL.Query().Get("beamId")
	if beamID == "" {
		d.m.rejected.WithLabelValues("WS_MISSING_BEAM_ID").Inc()
		_ = conn.Close(websocket.StatusPolicyViolation, "Missing beamId query parameter")
		return
	}
	agent, ok := d.reg.Get(beamID)
	if !ok {
		agent, ok = d.reg.Get(strings.ToLower(beamID))
	}
	if !ok {
		d.m.rejected.WithLabelValues("WS_UNKNOWN_AGENT").Inc()
		_ = conn.Close(websocket.StatusPolicyViolation, closeReason(fmt.Sprintf("Agent %s is not registered", beamID)))
		return
	}
	auth, err := d.authenticate(r, agent)
	if err != nil {
		d.m.rejected.WithLabelValues("WS_UNAUTHENTICATED").Inc()
		d.lg.Info("websocket attach refused", "beamId", agent.BeamID, "err", err)
		_ = conn.Close(websocket.StatusPolicyViolation, closeReason(err.Error()))
		return
	}
	s := &session{
		d: d, beamID: agent.BeamID, auth: auth, conn: conn, raw: lh.idle, cork: lh.corked, connectedAt: d.clock(),
	}
	s.beam2, _ = sessionProtocols(r.URL.Query()["protocol"], auth)
	if !d.attach(s) {
		_ = conn.Close(websocket.StatusGoingAway, "going away")
		return
	}
	s.enqueue(outMsg{data: connectedMessage(s)})
	s.scheduleKeepalive()
	d.reg.Touch(s.beamID)
	d.ownersConnected(s.beamID)
	// The reader runs on its own goroutine so that the HTTP server's
	// connection state (request, response and their buffers) can be
	// collected: a hijacked connection needs none of it.
	go s.readLoop()
}

// Buffer sizes the WebSocket library gets for a connection. They are
// small on purpose: reads are buffered by wspark.Conn only while bytes are
// waiting, and a batch of frames is collected by the session's wscork.Cork,
// so the library's own buffers only need to hold a frame header or, for
// writes, a whole control frame (a 2-byte header and at most 125 bytes of
// payload, so a ping or a close frame is one write) — memory every idle
// session would otherwise keep.
const (
	wsReadBuffer  = 64
	wsWriteBuffer = 128
)

// leanHijack hands the WebSocket library small read and write buffers on
// Hijack instead of the HTTP server's, which would otherwise stay allocated
// for as long as the session lives. With wspark on, reads go through a
// wspark.Conn (kept in idle), which holds a buffer only while bytes are
// waiting; with wscork on, the write buffer writes to a wscork.Cork (kept in
// corked), so that the session writer can send the frames it has queued in
// one write. With a trick off, that side keeps the server's buffer.
type leanHijack struct {
	http.ResponseWriter
	park, cork bool                    // which tricks are on (tricks.On)
	wrap       func(net.Conn) net.Conn // Config.wrapConn

	idle   *wspark.Conn // set by Hijack when park is on
	corked *wscork.Cork // set by Hijack when cork is on
}

// The names of the tricks beneath coder/websocket, for BEAM_TRICKS_OFF.
const (
	trickPark = "wspark" // idle sessions hold no buffer or goroutine (internal/wspark)
	trickCork = "wscork" // a writer's batch of frames goes out in one write (internal/wscork)
)

// Hijack takes over the connection; bytes the server had read ahead are
// kept.
func (w *leanHijack) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("response writer cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if w.wrap != nil {
		conn = w.wrap(conn)
		brw.Writer.Reset(conn)
	}
	out := conn
	if w.park {
		var ahead []byte
		if n := brw.Reader.Buffered(); n > 0 {
			ahead, _ = brw.Reader.Peek(n)
		}
		w.idle = wspark.New(conn, ahead)
		out, brw.Reader = w.idle, bufio.NewReaderSize(w.idle, wsReadBuffer)
	}
	if w.cork {
		w.corked = wscork.New(conn)
		brw.Writer = bufio.NewWriterSize(w.corked, wsWriteBuffer)
	}
	return out, brw, nil
}

// authenticate checks the proof of identity of an upgrade request.
func (d *Directory) authenticate(r *http.Request, agent registry.Agent) (string, error) {
	q := r.URL.Query()
	if key := apiKeyOf(r); key != "" {
		a, ok := d.reg.AuthenticateAPIKey(key)
		if !ok || a.BeamID != agent.BeamID {
			return "", fmt.Errorf("invalid API key for %s", agent.BeamID)
		}
		return authAPIKey, nil
	}
	if tok := q.Get("token"); tok != "" {
		payload, kid, err := wire.VerifyJWS(tok, typConnectJWS, func(kid string) (ed25519.PublicKey, error) {
			if kid != agent.BeamID {
				return nil, fmt.Errorf("token signed by %s", kid)
			}
			return agent.PublicKey, nil
		})
		if err != nil || kid != agent.BeamID {
			return "", errors.New("invalid connect token")
		}
		var c struct {
			Action    string `json:"action"`
			BeamID    string `json:"beamId"`
			Nonce     string `json:"nonce"`
			Timestamp string `json:"timestamp"`
		}
		if err := json.Unmarshal(payload, &c); err != nil || c.Action != connectAction || c.BeamID != agent.BeamID {
			return "", errors.New("invalid connect token")
		}
		if err := d.checkConnectFreshness(agent.BeamID, c.Nonce, c.Timestamp); err != nil {
			return "", err
		}
		return authJWS, nil
	}
	if sig := q.Get("signature"); sig != "" {
		ts, nonce := q.Get("timestamp"), q.Get("nonce")
		if nonce == "" || ts == "" {
			return "", errors.New("signed connect needs timestamp, nonce and signature")
		}
		raw, err := json.Marshal(map[string]string{"action": connectAction, "beamId": agent.BeamID, "nonce": nonce, "timestamp": ts})
		if err != nil {
			return "", fmt.Errorf("encode connect token: %w", err)
		}
		if err := wire.VerifyCanonical(raw, sig, agent.PublicKey); err != nil {
			return "", errors.New("connect signature verification failed")
		}
		if err := d.checkConnectFreshness(agent.BeamID, nonce, ts); err != nil {
			return "", err
		}
		return authSignature, nil
	}
	if d.cfg.AllowLegacyWSIdentity {
		return authLegacy, nil
	}
	return "", errors.New("authentication required: API key or signed connect token")
}

// checkConnectFreshness applies the ±5 minute window and remembers the
// nonce for twice that long, per agent, so a captured connect URL cannot be
// replayed. Used nonces live in memory only; a token whose timestamp
// predates this process's start is refused, so a URL captured before a
// restart cannot be replayed after it either (a client signs a new token
// for every connect, so a reconnect after a restart is not affected).
func (d *Directory) checkConnectFreshness(beamID, nonce, ts string) error {
	if nonce == "" || len(nonce) > 128 {
		return errors.New("connect nonce must be 1-128 characters")
	}
	t, err := wire.ParseTimestamp(ts)
	if err != nil {
		return errors.New("invalid connect timestamp")
	}
	now := d.clock()
	if diff := now.Sub(t); diff > ReplayWindow || diff < -ReplayWindow {
		return errors.New("connect timestamp outside the 5 minute window")
	}
	if t.Before(d.started.Truncate(time.Millisecond)) {
		return errors.New("connect token was signed before the directory started; sign a new one")
	}
	d.connMu.Lock()
	defer d.connMu.Unlock()
	used := d.connNonces[beamID]
	if used != nil && used.Seen(nonce, now) {
		return errors.New("connect nonce already used")
	}
	if used != nil && used.Len() >= maxConnectNoncesPerAgent {
		used.Sweep(now, nil)
		if used.Len() >= maxConnectNoncesPerAgent {
			return errors.New("too many signed connects of this agent; try again later or connect with the API key")
		}
	}
	if used == nil {
		d.pruneConnNoncesLocked(now)
		used = &replay.Set{}
		d.connNonces[beamID] = used
	}
	used.Use(nonce, now, now.Add(2*ReplayWindow))
	return nil
}

// pruneConnNoncesLocked drops the expired nonces of every agent, and agents
// left without any, at most once per ReplayWindow. d.connMu is held.
func (d *Directory) pruneConnNoncesLocked(now time.Time) {
	if now.Before(d.connPruned.Add(ReplayWindow)) {
		return
	}
	d.connPruned = now
	for id, used := range d.connNonces {
		if used.Sweep(now, nil); used.Len() == 0 {
			delete(d.connNonces, id)
		}
	}
}

// apiKeyOf returns the API key of a request: apiKey query parameter,
// x-api-key header or Authorization: Bearer bk_….
func apiKeyOf(r *http.Request) string {
	if k := r.URL.Query().Get("apiKey"); k != "" {
		return k
	}
	k, _ := httpjson.APIKey(r)
	return k
}

func closeReason(s string) string {
	if len(s) <= maxCloseReason {
		return s
	}
	return s[:maxCloseReason]
}

// attach makes s the agent's current session, replacing (1001) an older
// one. It returns false when the directory is closed.
func (d *Directory) attach(s *session) bool {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return false
	}
	old := d.sessions[s.beamID]
	d.sessions[s.beamID] = s
	d.mu.Unlock()
	d.m.sessions.Inc()
	if old != nil {
		old.closeWith(websocket.StatusGoingAway, "Replaced by new connection")
	}
	d.sessionChanged(s.beamID, true)
	d.lg.Info("agent connected", "beamId", s.beamID, "auth", s.auth)
	return true
}

// detach removes s if it is still the agent's current session.
func (d *Directory) detach(s *session) {
	d.mu.Lock()
	current := d.sessions[s.beamID] == s
	if current {
		delete(d.sessions, s.beamID)
	}
	d.mu.Unlock()
	if current {
		d.sessionChanged(s.beamID, false)
	}
}

// enqueue hands m to the writer without blocking, starting the writer when
// none runs. A full queue closes the session (1008 "too slow"); false means
// m was not queued.
func (s *session) enqueue(m outMsg) bool {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return false
	}
	if len(s.out) >= s.d.cfg.SendQueue {
		s.mu.Unlock()
		s.d.lg.Warn("session send queue full; closing", "beamId", s.beamID, "queue", s.d.cfg.SendQueue)
		s.d.m.rejected.WithLabelValues("WS_TOO_SLOW").Inc()
		s.closeWith(websocket.StatusPolicyViolation, "too slow")
		return false
	}
	s.out = append(s.out, m)
	start := !s.writing
	s.writing = true
	s.mu.Unlock()
	if start {
		go s.writer()
	}
	return true
}

// queued returns the number of messages waiting for the writer.
func (s *session) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.out)
}

// closeWith starts closing the session: it is detached at once (no new
// deliveries); the writer (started here when none runs) fails what is
// still queued and sends the close frame.
func (s *session) closeWith(code websocket.StatusCode, reason string) {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	s.closeCode, s.closeReason = code, reason
	start := !s.writing
	s.writing = true
	s.mu.Unlock()
	s.d.detach(s)
	if start {
		go s.shutdown()
	}
}

func (s *session) isClosing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closing
}

// readLoop reads messages until the connection ends, then tears the
// session down. Messages are handled by the session's workers, so that one
// session can have several intents in their log appends at once; a full
// work queue stops reading (backpressure on the agent's socket).
func (s *session) readLoop() { s.read(false) }

// read is readLoop's body; resumed says the read poller found the
// connection readable (or closed) after a park.
func (s *session) read(resumed bool) {
	linger := s.d.cfg.parkLinger
	for {
		// While the peer sends nothing the session parks (wspark): in the
		// read poller without a goroutine, or (without one) on a short
		// stack, holding no buffer either way. A reader that just handled a
		// message first lingers on its goroutine for the next.
		if !resumed && s.raw != nil && s.raw.Park(s.resumeRead, linger) {
			return
		}
		resumed = false
		linger = s.d.cfg.parkLinger
		// A context without Done: the library then arms no cancellation
		// per read. The read ends when the connection is closed, which
		// shutdown does before it cancels the session's context.
		_, data, err := s.conn.Read(context.Background())
		if err != nil {
			if st := websocket.CloseStatus(err); st == -1 && !s.isClosing() && !errors.Is(err, context.Canceled) {
				s.d.lg.Debug("websocket read ended", "beamId", s.beamID, "err", err)
			}
			break
		}
		if s.raw != nil && s.raw.TakeInjected() {
			// Not the peer's: only control frames (a keepalive's pong)
			// came, so the peer is as idle as before and the reader parks
			// at once instead of lingering.
			linger = 0
			continue
		}
		s.dispatch(data)
	}
	if w := s.work; w != nil {
		w.mu.Lock()
		for w.workers > 0 {
			w.cond.Wait()
		}
		w.mu.Unlock()
	}
	s.closeWith(websocket.StatusNormalClosure, "")
	s.end(endRead)
}

// end records that one half of the teardown (endRead, endShutdown) has
// finished; the second to finish completes it. The shutdown's half cancels
// the session's context.
func (s *session) end(half uint8) {
	s.mu.Lock()
	s.ended |= half
	complete := s.ended == endRead|endShutdown
	var cancel context.CancelFunc
	if half == endShutdown {
		cancel = s.cancel
	}
	done := s.done
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if !complete {
		return
	}
	s.d.m.sessions.Dec()
	s.d.lg.Info("agent disconnected", "beamId", s.beamID)
	if done != nil {
		close(done)
	}
}

// doneChan returns a channel that is closed once the session is torn down
// (made when first asked for: nothing waits for most sessions).
func (s *session) doneChan() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		s.done = make(chan struct{})
		if s.ended == endRead|endShutdown {
			close(s.done)
		}
	}
	return s.done
}

// context returns the context of the intents the session sends, made on
// first use; it is cancelled once the session is shut down.
func (s *session) context() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
		if s.ended&endShutdown != 0 {
			s.cancel()
		}
	}
	return s.ctx
}

// defaultParkLinger is how long a reader waits on its goroutine for the
// next message before it parks (Config.parkLinger): a busy session keeps
// its goroutine, an idle one gives it up.
const defaultParkLinger = time.Second

// resumeRead continues reading after a park (on the poller's new
// goroutine).
func (s *session) resumeRead() { s.read(true) }

// dispatch queues a message read for the workers, starting one when fewer
// than Config.SessionWorkers run (workers exit when nothing is queued). It
// waits while 4×SessionWorkers messages are queued. Only the reader calls
// it.
func (s *session) dispatch(data []byte) {
	w := s.work
	if w == nil {
		w = &sessionWork{}
		w.cond.L = &w.mu
		s.work = w
	}
	w.mu.Lock()
	for len(w.queue) >= 4*s.d.cfg.SessionWorkers {
		w.cond.Wait()
	}
	w.queue = append(w.queue, data)
	start := w.workers < s.d.cfg.SessionWorkers
	if start {
		w.workers++
	}
	w.mu.Unlock()
	if start {
		go s.worker(w)
	}
}

// worker handles queued messages until none is left.
func (s *session) worker(w *sessionWork) {
	growStack()
	for {
		w.mu.Lock()
		if len(w.queue) == 0 {
			w.workers--
			if w.workers == 0 {
				w.queue = nil
			}
			w.cond.Broadcast()
			w.mu.Unlock()
			return
		}
		data := w.queue[0]
		w.queue[0] = nil
		w.queue = w.queue[1:]
		w.cond.Broadcast()
		w.mu.Unlock()
		s.d.handleMessage(s, data)
	}
}

// writer writes queued messages in order until the queue is empty (then
// it exits) or the session closes (then it shuts the session down). The
// intents among the messages are handed to the delivered recorder once
// written.
func (s *session) writer() {
	var batch []outMsg
	for {
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			s.shutdown()
			return
		}
		ping := s.pingNow
		s.pingNow = false
		if len(s.out) == 0 && !ping {
			s.writing = false
			s.out = nil // an idle session keeps no buffer
			s.mu.Unlock()
			return
		}
		batch, s.out = s.out, batch[:0]
		s.mu.Unlock()
		var err error
		if s.cork != nil {
			err = s.writeBatch(batch, ping)
		} else {
			err = s.writeEach(batch)
		}
		clear(batch)
		if err != nil {
			s.d.lg.Info("websocket write failed", "beamId", s.beamID, "err", err)
			s.closeWith(websocket.StatusGoingAway, "write failed")
			s.shutdown()
			return
		}
	}
}

// writeBatch writes batch in order. The frames are collected under the
// cork and go out in one write (or a few, for a large batch), bounded by
// WriteTimeout; an intent counts as written, and is handed to the delivered
// recorder, only once the write that carried its frame returned. On a write
// error the intents whose frames were not known to be written are failed as
// undelivered. With ping set, a ping goes out first, in the same write.
func (s *session) writeBatch(batch []outMsg, ping bool) error {
	var written, pending []*inflight
	defer func() {
		s.d.queueDelivered(written)
	}()
	timeout := s.d.cfg.WriteTimeout
	flush := func() error {
		if err := s.cork.Flush(timeout); err != nil {
			return err
		}
		written = append(written, pending...)
		pending = pending[:0]
		return nil
	}
	fail := func(err error, rest []outMsg) error {
		s.cork.Discard()
		s.failWritten(pending)
		s.failQueued(rest)
		return err
	}
	s.cork.Cork()
	if ping {
		s.cork.Ping() // between whole frames (wsWriteBuffer holds a control frame)
	}
	for i, m := range batch {
		if s.isClosing() {
			if err := flush(); err != nil {
				return fail(err, batch[i:])
			}
			_ = s.cork.Uncork(timeout)
			s.failQueued(batch[i:])
			return nil
		}
		if m.inf != nil && !s.d.beginDelivery(m.inf) {
			continue // settled (timed out) before it was written
		}
		// The cork bounds the socket write; the library's write only
		// copies the frame into memory here.
		err := s.conn.Write(context.Background(), websocket.MessageText, m.data)
		if err != nil {
			if m.inf != nil {
				s.failWritten([]*inflight{m.inf})
			}
			return fail(err, batch[i+1:])
		}
		if m.inf != nil {
			pending = append(pending, m.inf)
		}
		if s.cork.Full() {
			if err := flush(); err != nil {
				return fail(err, batch[i+1:])
			}
		}
	}
	if err := s.cork.Uncork(timeout); err != nil {
		return fail(err, nil)
	}
	written = append(written, pending...)
	return nil
}

// writeEach writes batch in order through the library, one write per
// frame, each bounded by WriteTimeout (wscork off). An intent is handed to
// the delivered recorder once its frame was written; on a write error the
// rest are failed as undelivered.
func (s *session) writeEach(batch []outMsg) error {
	var written []*inflight
	defer func() {
		s.d.queueDelivered(written)
	}()
	for i, m := range batch {
		if s.isClosing() {
			s.failQueued(batch[i:])
			return nil
		}
		if m.inf != nil && !s.d.beginDelivery(m.inf) {
			continue // settled (timed out) before it was written
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.d.cfg.WriteTimeout)
		err := s.conn.Write(ctx, websocket.MessageText, m.data)
		cancel()
		if err != nil {
			if m.inf != nil {
				s.failWritten([]*inflight{m.inf})
			}
			s.failQueued(batch[i+1:])
			return err
		}
		if m.inf != nil {
			written = append(written, m.inf)
		}
	}
	return nil
}

// failWritten fails intents whose delivery began but whose frames were not
// written.
func (s *session) failWritten(infs []*inflight) {
	if len(infs) == 0 {
		return
	}
	s.d.abandonDelivery(infs)
	for _, inf := range infs {
		s.d.undelivered(inf, fmt.Sprintf("write to %s failed", s.beamID))
	}
}

// failQueued fails the intents among msgs that were never written.
func (s *session) failQueued(msgs []outMsg) {
	for _, m := range msgs {
		if m.inf != nil {
			s.d.undelivered(m.inf, fmt.Sprintf("session of %s closed before delivery", s.beamID))
		}
	}
}

// shutdown fails what is still queued, sends the close frame and ends the
// connection. It runs once, on the writer's goroutine or (when no writer
// ran) on its own.
func (s *session) shutdown() {
	s.mu.Lock()
	queued := s.out
	s.out = nil
	code, reason := s.closeCode, s.closeReason
	s.mu.Unlock()
	s.failQueued(queued)
	_ = s.conn.Close(code, reason)
	s.end(endShutdown)
}

// keepalive runs once per PingInterval (from the keepalive wheel): it
// closes the session when the peer answered no pong since the last ping
// (so a ping goes unanswered for at most PingInterval plus a wheel tick),
// and otherwise has the writer send the next ping. The pongs are counted
// by the connection's frame tracker as the reader reads them, so no
// goroutine waits for one and the library keeps no record of the ping.
func (s *session) keepalive() {
	pongs := s.pongCount()
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	if s.pinged && pongs == s.pongsAtPing {
		s.mu.Unlock()
		s.d.lg.Info("websocket keepalive failed", "beamId", s.beamID, "err", "no pong within the ping interval")
		// Off the wheel's goroutine: detaching may tell the cluster.
		go s.closeWith(websocket.StatusGoingAway, "keepalive timeout")
		return
	}
	s.pinged, s.pongsAtPing = true, pongs
	if !s.framePings() {
		s.mu.Unlock()
		go s.libraryPing()
		s.scheduleKeepalive()
		return
	}
	s.pingNow = true
	start := !s.writing
	s.writing = true
	s.mu.Unlock()
	if start {
		go s.writer()
	}
	s.scheduleKeepalive()
}

// framePings reports whether the session's keepalive writes its ping as a
// frame in the writer's batch and counts the pongs as its reader reads them
// (wspark and wscork on); otherwise the library pings (libraryPing).
func (s *session) framePings() bool { return s.raw != nil && s.cork != nil }

// pongCount is how many pongs the peer sent so far (wrapping).
func (s *session) pongCount() uint32 {
	if s.framePings() {
		return s.raw.Pongs()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pongs
}

// libraryPing sends a ping through the library and counts its pong when it
// comes within two intervals (the keepalive round closes the session
// before that if it does not).
func (s *session) libraryPing() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.d.cfg.PingInterval)
	defer cancel()
	if s.conn.Ping(ctx) == nil {
		s.mu.Lock()
		s.pongs++
		s.mu.Unlock()
	}
}

// wsMessage is a decoded client → server message.
type wsMessage struct {
	Type  string
	Frame json.RawMessage
	JWS   string // beam/2 envelope of an intent or result
}

// errInvalidMessage is the reference's answer to a message that is not a
// JSON object.
//
//lint:ignore ST1005 the reference's wording, which clients match
var errInvalidMessage = errors.New("Invalid message format: must be valid JSON")

// handleMessage dispatches one client message. The message is scanned once
// (see scanWSMessage); a beam/1 intent or result frame is validated by its
// own decoder, every other frame before dispatch.
func (d *Directory) handleMessage(s *session, data []byte) {
	env, err := scanWSMessage(data)
	if err == nil && !framedMessage(&env) {
		err = env.validateFrame()
	}
	if err != nil {
		d.rejectMessage(s, err)
		return
	}
	switch env.Type {
	case "intent":
		if env.JWS != "" {
			d.handleWSIntentJWS(s, env.JWS)
			return
		}
		d.handleWSIntent(s, &env)
	case "result":
		if env.JWS != "" {
			d.handleResultJWS(s, env.JWS)
			return
		}
		if len(env.Frame) == 0 {
			s.sendError("", wire.CodeInvalidResult, "Invalid result frame: missing frame")
			return
		}
		d.handleWSResult(s, &env)
	default:
		d.m.rejected.WithLabelValues("UNKNOWN_MESSAGE_TYPE").Inc()
		s.sendError("", "", "Unknown message type: "+env.Type)
	}
}

// framedMessage reports whether env is a beam/1 intent or result with a
// frame, the messages whose frame is validated by its decoder.
func framedMessage(env *wsEnvelope) bool {
	return (env.Type == "intent" || env.Type == "result") && env.JWS == "" && len(env.Frame) > 0
}

// rejectMessage answers a message that is not a JSON object.
func (d *Directory) rejectMessage(s *session, err error) {
	d.m.rejected.WithLabelValues("INVALID_MESSAGE").Inc()
	s.sendError("", "", err.Error())
}

// handleWSIntent relays an intent a session sent; the outcome goes back
// to the same session.
func (d *Directory) handleWSIntent(s *session, env *wsEnvelope) {
	raw := env.Frame
	if len(raw) == 0 {
		rerr := relayErr(CodeInvalidIntent, "", "Invalid intent frame: missing frame")
		d.rejectFrame(rerr, s.beamID, originWS)
		s.sendOutcome("", nil, rerr)
		return
	}
	f, err := decodeEnvelopeFrame(env, wire.DecodeIntentFrame)
	if errors.Is(err, errInvalidMessage) {
		d.rejectMessage(s, err)
		return
	}
	if err != nil {
		nonce := peekNonce(raw)
		rerr := relayErr(CodeInvalidIntent, nonce, "Invalid intent frame: %s", frameErrMsg(err))
		d.rejectFrame(rerr, s.beamID, originWS)
		s.sendOutcome(nonce, nil, rerr)
		return
	}
	opts := RelayOptions{Origin: originWS, SessionBeamID: s.beamID, allowUnsigned: s.auth == authAPIKey}
	nonce := f.Nonce
	d.submit(s.context(), f, opts, func(res []byte, rerr *RelayError) { s.sendOutcome(nonce, res, rerr) })
}

// handleWSResult takes the beam/1 result frame of a message: decoded once
// here, or, when it does not decode, answered by handleResult.
func (d *Directory) handleWSResult(s *session, env *wsEnvelope) {
	rf, err := decodeEnvelopeFrame(env, wire.DecodeResultFrame)
	switch {
	case errors.Is(err, errInvalidMessage):
		d.rejectMessage(s, err)
	case err != nil:
		d.handleResult(s, env.Frame) // reports the frame's error
	default:
		d.takeResult(s, rf, "")
	}
}

// peekNonce extracts a string nonce from a frame that failed decoding.
func peekNonce(raw []byte) string {
	var v struct {
		Nonce any `json:"nonce"`
	}
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	n, _ := v.Nonce.(string)
	if len(n) > 256 {
		return ""
	}
	return n
}

// sendOutcome sends the outcome of an intent to its sender: the result
// frame, or an error message plus an unsigned failure result (SDK 0.5.1
// ignores error messages and would otherwise wait for its timeout).
func (s *session) sendOutcome(nonce string, res []byte, rerr *RelayError) {
	if rerr == nil {
		s.enqueue(outMsg{data: resultMessage(res)})
		return
	}
	s.sendError(nonce, rerr.Code, rerr.Message)
	if nonce == "" {
		return
	}
	fr := rerr.Result
	if len(fr) == 0 {
		fr = wire.FailureResult(nonce, rerr.Code, rerr.Message, s.d.clock(), nil)
	}
	s.enqueue(outMsg{data: resultMessage(fr)})
}

// sendError sends {type:"error", nonce?, errorCode?, message}.
func (s *session) sendError(nonce, code, message string) {
	m := struct {
		Type      string `json:"type"`
		Nonce     string `json:"nonce,omitempty"`
		ErrorCode string `json:"errorCode,omitempty"`
		Message   string `json:"message"`
	}{"error", nonce, code, message}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(m); err != nil {
		return
	}
	s.enqueue(outMsg{data: bytes.TrimRight(buf.Bytes(), "\n")})
}

// resultMessage wraps a result frame verbatim: {"type":"result","frame":…}.
func resultMessage(frame []byte) []byte {
	b := make([]byte, 0, len(frame)+28)
	b = append(b, `{"type":"result","frame":`...)
	b = append(b, frame...)
	return append(b, '}')
}

// intentMessage builds the delivery {"type":"intent","frame":…,
// "senderPublicKey":…} with the frame's original payload bytes.
func intentMessage(f *wire.IntentFrame, senderKey string) ([]byte, error) {
	frame, err := f.DeliveryJSON()
	if err != nil {
		return nil, err
	}
	key, err := json.Marshal(senderKey)
	if err != nil {
		return nil, fmt.Errorf("encode sender key: %w", err)
	}
	b := make([]byte, 0, len(frame)+len(key)+64)
	b = append(b, `{"type":"intent","frame":`...)
	b = append(b, frame...)
	b = append(b, `,"senderPublicKey":`...)
	b = append(b, key...)
	return append(b, '}'), nil
}

// workerStackFrame is the frame growStack takes: with what the goroutine
// has used by then, the runtime grows a new worker's stack once, to 16 KB,
// which handling an intent (the Ed25519 verification's tables, SHA-512's
// state) fits in.
const workerStackFrame = 8 << 10

// growStack grows a new goroutine's stack, while it is still shallow, in
// one step to the size a message's handling needs. Otherwise the runtime
// doubles it two or three times in the middle of the handling, each time
// copying the deeper stack: 3.5 % of the server's CPU with 64 intents in
// flight, since a session's workers exit when its queue is empty.
//
//go:noinline
func growStack() {
	var frame [workerStackFrame]byte
	keepFrame(frame[:])
}

// keepFrame keeps growStack's frame from being optimised away.
//
//go:noinline
func keepFrame([]byte) {}
