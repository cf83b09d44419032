package bench

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
)

// benchIntent is the intent type every bench frame carries.
const benchIntent = "bench.echo"

// signedFrame builds and signs an intent from → to with the configured
// payload and returns its nonce and wire JSON.
func signedFrame(env *env, from, to *agent) (string, []byte, error) {
	f := wire.NewIntentFrame(from.BeamID, to.BeamID, benchIntent, env.Config.payload(), env.Clock())
	if err := wire.SignIntent(f, from.Private); err != nil {
		return "", nil, fmt.Errorf("sign intent: %w", err)
	}
	b, err := f.DeliveryJSON()
	if err != nil {
		return "", nil, fmt.Errorf("encode intent: %w", err)
	}
	return f.Nonce, b, nil
}

// checkResult decodes a result frame and accepts it only when it succeeded
// and its signature verifies with the recipient's key.
func checkResult(raw []byte, nonce string, recipient ed25519.PublicKey) error {
	res, err := wire.DecodeResultFrame(raw)
	if err != nil {
		return failure("BAD_RESULT", "%v", err)
	}
	if res.Nonce != nonce {
		return failure("BAD_RESULT", "result for nonce %q, sent %q", res.Nonce, nonce)
	}
	if !res.Success {
		code := res.ErrorCode
		if code == "" {
			code = "RESULT_FAILED"
		}
		return failure(code, "%s", res.Error)
	}
	if err := res.Verify(recipient); err != nil {
		return failure("BAD_RESULT_SIGNATURE", "%v", err)
	}
	return nil
}

// httpDriver sends with POST /intents/send.
type httpDriver struct {
	env *env
}

func newHTTPDriver(_ context.Context, env *env) (driver, error) {
	return &httpDriver{env: env}, nil
}

func (d *httpDriver) Send(ctx context.Context, from, to *agent) error {
	nonce, frame, err := signedFrame(d.env, from, to)
	if err != nil {
		return err
	}
	_, b, err := call(ctx, d.env.HTTP, http.MethodPost, from.Base+"/intents/send", frame, nil, http.StatusOK)
	if err != nil {
		return err
	}
	return checkResult(b, nonce, to.Public)
}

func (d *httpDriver) Close() error { return nil }

// wsDriver sends over each sender's own WebSocket session and matches the
// results by nonce.
type wsDriver struct {
	env *env
	senderSessions
}

// wsSession is one sender's session and its intents awaiting an outcome,
// matched by nonce. The ws and bus drivers both use it.
type wsSession struct {
	conn *websocket.Conn
	mu   sync.Mutex
	wait map[string]*wsPending
}

// wsPending is an intent sent on a session and awaiting its outcome, which
// the session's reader delivers on done.
type wsPending struct {
	s         *wsSession
	nonce     string
	recipient ed25519.PublicKey // signs the result frame
	done      chan error
}

// senderSessions is one WebSocket session per sender of the fleet, each
// read by its own goroutine until Close. The ws and bus drivers embed it.
type senderSessions struct {
	sessions map[string]*wsSession
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

// open connects every sender of env's fleet and reads each session on its
// own goroutine, passing every message to handle; when a session's read
// fails, its pending intents fail with CONNECTION_LOST. When a sender cannot
// connect, the sessions already open are closed and the error is returned.
func (ss *senderSessions) open(ctx context.Context, env *env, handle func(s *wsSession, data []byte)) error {
	rctx, cancel := context.WithCancel(context.Background())
	ss.cancel = cancel
	ss.sessions = make(map[string]*wsSession, len(env.Fleet.Senders))
	for _, a := range env.Fleet.Senders {
		conn, err := dial(ctx, env.HTTP, a.Base, a)
		if err != nil {
			_ = ss.Close()
			return err
		}
		s := &wsSession{conn: conn, wait: map[string]*wsPending{}}
		ss.sessions[a.BeamID] = s
		ss.wg.Add(1)
		go func() {
			defer ss.wg.Done()
			defer s.failAll(failure("CONNECTION_LOST", "session closed"))
			for {
				_, data, err := s.conn.Read(rctx)
				if err != nil {
					return
				}
				handle(s, data)
			}
		}()
	}
	return nil
}

// begin signs an intent from → to and registers it on from's session as
// awaiting its outcome, before the caller sends frame, so an outcome that
// comes early is not missed.
func (ss *senderSessions) begin(env *env, from, to *agent) (*wsPending, []byte, error) {
	s, ok := ss.sessions[from.BeamID]
	if !ok {
		return nil, nil, fmt.Errorf("%s has no session", from.BeamID)
	}
	nonce, frame, err := signedFrame(env, from, to)
	if err != nil {
		return nil, nil, err
	}
	p := &wsPending{s: s, nonce: nonce, recipient: to.Public, done: make(chan error, 1)}
	s.mu.Lock()
	s.wait[nonce] = p
	s.mu.Unlock()
	return p, frame, nil
}

// Close closes every session and waits for their readers.
func (ss *senderSessions) Close() error {
	for _, s := range ss.sessions {
		_ = s.conn.Close(websocket.StatusNormalClosure, "bench done")
	}
	ss.cancel()
	ss.wg.Wait()
	return nil
}

func newWSDriver(ctx context.Context, env *env) (driver, error) {
	d := &wsDriver{env: env}
	if err := d.open(ctx, env, d.dispatch); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *wsDriver) Send(ctx context.Context, from, to *agent) error {
	p, frame, err := d.begin(d.env, from, to)
	if err != nil {
		return err
	}
	if err := writeEnvelope(ctx, p.s.conn, "intent", frame); err != nil {
		p.forget()
		return fmt.Errorf("write intent: %w", err)
	}
	_, err = p.await(ctx, "result", nil)
	return err
}

// dispatch hands a result or error that arrived on s to its sender. The
// result's signature is checked here, on the session's reader goroutine.
func (d *wsDriver) dispatch(s *wsSession, data []byte) {
	var env wsEnvelope
	if err := json.Unmarshal(data, &env); err != nil {
		return
	}
	switch env.Type {
	case "result":
		var head struct {
			Nonce string `json:"nonce"`
		}
		if json.Unmarshal(env.Frame, &head) != nil {
			return
		}
		if p := s.take(head.Nonce); p != nil {
			p.done <- checkResult(env.Frame, head.Nonce, p.recipient)
		}
	case "error":
		code := env.ErrorCode
		if code == "" {
			code = "DIRECTORY_ERROR"
		}
		if p := s.take(env.Nonce); p != nil {
			p.done <- failure(code, "%s", env.Message)
		}
	}
}

// await waits for p's outcome until ctx ends or stop fires (a nil stop
// never does). done is false only when stop fired first; when ctx ends, p is
// forgotten and the error says what was awaited.
func (p *wsPending) await(ctx context.Context, what string, stop <-chan time.Time) (done bool, err error) {
	select {
	case err := <-p.done:
		return true, err
	case <-ctx.Done():
		p.forget()
		return true, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	case <-stop:
		return false, nil
	}
}

// forget removes p from its session; it reports whether p was still
// awaiting its outcome.
func (p *wsPending) forget() bool { return p.s.take(p.nonce) != nil }

// take removes and returns the pending intent of nonce, or nil.
func (s *wsSession) take(nonce string) *wsPending {
	if nonce == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.wait[nonce]
	delete(s.wait, nonce)
	return p
}

// failAll ends every pending intent of the session with err.
func (s *wsSession) failAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, p := range s.wait {
		p.done <- err
		delete(s.wait, n)
	}
}
