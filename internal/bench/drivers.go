package bench

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
)

// benchIntent is the intent type every bench frame carries.
const benchIntent = "bench.echo"

// signedFrame builds and signs an intent from → to with the configured
// payload and returns its nonce and wire JSON.
func signedFrame(env *Env, from, to *Agent) (string, []byte, error) {
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
	env *Env
}

func newHTTPDriver(_ context.Context, env *Env) (Driver, error) {
	return &httpDriver{env: env}, nil
}

func (d *httpDriver) Send(ctx context.Context, from, to *Agent) error {
	nonce, frame, err := signedFrame(d.env, from, to)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.env.URL+"/intents/send", bytes.NewReader(frame))
	if err != nil {
		return fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.env.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("send: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return fmt.Errorf("read result: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return readAPIError(resp.StatusCode, b)
	}
	return checkResult(b, nonce, to.Public)
}

func (d *httpDriver) Close() error { return nil }

// wsDriver sends over each sender's own WebSocket session and matches the
// results by nonce.
type wsDriver struct {
	env      *Env
	sessions map[string]*wsSession
	wg       sync.WaitGroup
	cancel   context.CancelFunc
}

// wsSession is one sender's session and its intents awaiting a result.
type wsSession struct {
	conn *websocket.Conn
	mu   sync.Mutex
	wait map[string]*wsPending
}

type wsPending struct {
	recipient ed25519.PublicKey
	done      chan error
}

func newWSDriver(ctx context.Context, env *Env) (Driver, error) {
	rctx, cancel := context.WithCancel(context.Background())
	d := &wsDriver{env: env, sessions: make(map[string]*wsSession, len(env.Fleet.Senders)), cancel: cancel}
	for _, a := range env.Fleet.Senders {
		conn, err := dial(ctx, env.HTTP, env.URL, a)
		if err != nil {
			_ = d.Close()
			return nil, err
		}
		s := &wsSession{conn: conn, wait: map[string]*wsPending{}}
		d.sessions[a.BeamID] = s
		d.wg.Add(1)
		go d.read(rctx, s)
	}
	return d, nil
}

func (d *wsDriver) Send(ctx context.Context, from, to *Agent) error {
	s, ok := d.sessions[from.BeamID]
	if !ok {
		return fmt.Errorf("%s has no session", from.BeamID)
	}
	nonce, frame, err := signedFrame(d.env, from, to)
	if err != nil {
		return err
	}
	p := &wsPending{recipient: to.Public, done: make(chan error, 1)}
	s.mu.Lock()
	s.wait[nonce] = p
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.wait, nonce)
		s.mu.Unlock()
	}
	if err := writeEnvelope(ctx, s.conn, "intent", frame); err != nil {
		forget()
		return fmt.Errorf("write intent: %w", err)
	}
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		forget()
		return fmt.Errorf("waiting for result: %w", ctx.Err())
	}
}

// read dispatches results and errors of one session to their senders. The
// result's signature is checked here, on the reader goroutine.
func (d *wsDriver) read(ctx context.Context, s *wsSession) {
	defer d.wg.Done()
	defer s.failAll(failure("CONNECTION_LOST", "session closed"))
	for {
		_, data, err := s.conn.Read(ctx)
		if err != nil {
			return
		}
		var env wsEnvelope
		if err := json.Unmarshal(data, &env); err != nil {
			continue
		}
		switch env.Type {
		case "result":
			var head struct {
				Nonce string `json:"nonce"`
			}
			if json.Unmarshal(env.Frame, &head) != nil {
				continue
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
}

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

func (s *wsSession) failAll(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, p := range s.wait {
		p.done <- err
		delete(s.wait, n)
	}
}

func (d *wsDriver) Close() error {
	for _, s := range d.sessions {
		_ = s.conn.Close(websocket.StatusNormalClosure, "bench done")
	}
	d.cancel()
	d.wg.Wait()
	return nil
}
