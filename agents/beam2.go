package agents

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
)

// This file is the client's beam/2: intents and results as compact JWS
// (EdDSA, kid = the signer's Beam ID), over the same session and routes as
// beam/1.

// CodeUnsupportedProtocol is the errorCode the directory answers a beam/2
// intent with when the recipient's session speaks beam/1 only.
const CodeUnsupportedProtocol = "UNSUPPORTED_PROTOCOL"

// ErrResultNotVerified is wrapped by a Send whose result carried a beam/2
// JWS that does not verify against the recipient's key.
var ErrResultNotVerified = errors.New("beam client: result JWS does not verify")

// maxResultKeys bounds the recipient keys a client caches for verifying
// result JWS.
const maxResultKeys = 1024

// beam2State is the client's beam/2 bookkeeping.
type beam2State struct {
	mu   sync.Mutex
	keys map[string]ed25519.PublicKey // recipient Beam ID → key its results verified with
}

func (s *beam2State) key(id string) ed25519.PublicKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keys[id]
}

func (s *beam2State) remember(id string, k ed25519.PublicKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.keys == nil || len(s.keys) >= maxResultKeys {
		s.keys = map[string]ed25519.PublicKey{}
	}
	s.keys[id] = k
}

func (s *beam2State) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.keys, id)
}

// beam2 reports whether the client speaks beam/2.
func (c *Client) beam2() bool { return c.cfg.Protocol == ProtocolBeam2 }

// sendBeam2 sends f (unsigned by beam/1) as a beam/2 JWS and returns its
// result, verified when the recipient signed it as JWS.
func (c *Client) sendBeam2(ctx context.Context, f *wire.IntentFrame) (*wire.ResultFrame, error) {
	token, err := wire.SignIntentJWS(f, c.id.Private)
	if err != nil {
		return nil, err
	}
	var frame []byte
	var resultJWS string
	if conn := c.session(); conn != nil {
		frame, resultJWS, err = c.sendWSJWS(ctx, conn, f.Nonce, token)
		if errors.Is(err, errWriteFailed) && ctx.Err() == nil {
			c.log.Debug("beam: websocket write failed; sending over HTTP", "nonce", f.Nonce, "err", err)
			frame, resultJWS, err = c.sendHTTPJWS(ctx, token)
		}
	} else {
		frame, resultJWS, err = c.sendHTTPJWS(ctx, token)
	}
	if err != nil {
		return nil, err
	}
	if resultJWS != "" {
		return c.verifyResultJWS(ctx, f.To, resultJWS)
	}
	res, err := wire.DecodeResultFrame(frame)
	if err != nil {
		return nil, fmt.Errorf("decode result: %w", err)
	}
	return res, nil
}

// sendWSJWS writes {"type":"intent","jws":token} on conn and waits for the
// answer with nonce: the result frame and its JWS, if any.
func (c *Client) sendWSJWS(ctx context.Context, conn *websocket.Conn, nonce, token string) ([]byte, string, error) {
	p := &pendingSend{conn: conn, ch: make(chan wsAnswer, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, "", ErrClosed
	}
	c.pending[nonce] = p
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		if c.pending[nonce] == p {
			delete(c.pending, nonce)
		}
		c.mu.Unlock()
	}
	if err := writeJWS(ctx, conn, "intent", token); err != nil {
		forget()
		return nil, "", fmt.Errorf("%w: %w", errWriteFailed, err)
	}
	select {
	case a := <-p.ch:
		if a.err != nil {
			return nil, "", a.err
		}
		return a.frame, a.jws, nil
	case <-ctx.Done():
		forget()
		return nil, "", fmt.Errorf("waiting for result: %w", ctx.Err())
	}
}

// sendHTTPJWS posts token to /intents/send as application/jose. The result
// JWS, when the recipient signed one, comes in X-Beam-Result-JWS.
func (c *Client) sendHTTPJWS(ctx context.Context, token string) ([]byte, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/intents/send", bytes.NewReader([]byte(token)))
	if err != nil {
		return nil, "", fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/jose")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return nil, "", fmt.Errorf("read response: %w", err)
	}
	if len(b) > maxResponseBody {
		return nil, "", fmt.Errorf("response larger than %d bytes", maxResponseBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, "", ErrorFromResponse(resp, b)
	}
	return b, resp.Header.Get(wire.HeaderResultJWS), nil
}

// verifyResultJWS verifies a result JWS from `to` (kid must be to) against
// to's key as the directory lists it, and returns the frame inside it. A
// cached key that fails is looked up once more (the agent may have rotated
// its key).
func (c *Client) verifyResultJWS(ctx context.Context, to, token string) (*wire.ResultFrame, error) {
	for attempt := 0; attempt < 2; attempt++ {
		pub := c.b2.key(to)
		if pub == nil || attempt > 0 {
			a, err := c.Lookup(ctx, to)
			if err != nil {
				return nil, fmt.Errorf("%w: look up %s: %w", ErrResultNotVerified, to, err)
			}
			if pub, err = wire.ParsePublicKey(a.PublicKey); err != nil {
				return nil, fmt.Errorf("%w: key of %s: %w", ErrResultNotVerified, to, err)
			}
		}
		rf, _, err := wire.DecodeResultJWS(token, func(kid string) (ed25519.PublicKey, error) {
			if kid != to {
				return nil, fmt.Errorf("kid %q is not the recipient %q", kid, to)
			}
			return pub, nil
		})
		if err == nil {
			c.b2.remember(to, pub)
			return rf, nil
		}
		c.b2.forget(to)
		if !errors.Is(err, wire.ErrBadSignature) || attempt > 0 {
			return nil, fmt.Errorf("%w: %w", ErrResultNotVerified, err)
		}
	}
	return nil, ErrResultNotVerified // not reached
}

// verifyIncomingJWS checks a beam/2 delivery: the JWS (typ beam-intent+jws,
// kid = the frame's from) must verify with the senderPublicKey the directory
// attached, and the frame is taken from the JWS payload.
func verifyIncomingJWS(token string, pub ed25519.PublicKey) (*wire.IntentFrame, error) {
	return wire.DecodeIntentJWS(token, func(string) (ed25519.PublicKey, error) { return pub, nil })
}

// replyJWS signs a result frame as a beam/2 JWS and sends it.
func (c *Client) replyJWS(ctx context.Context, conn *websocket.Conn, nonce string, frame []byte) error {
	token, err := wire.SignResultJWS(frame, c.id.BeamID, c.id.Private)
	if err != nil {
		return fmt.Errorf("sign result %s: %w", nonce, err)
	}
	return writeJWS(ctx, conn, "result", token)
}

// writeJWS sends {"type":typ,"jws":token} on conn.
func writeJWS(ctx context.Context, conn *websocket.Conn, typ, token string) error {
	b := make([]byte, 0, len(token)+32)
	b = append(b, `{"type":`...)
	b, _ = appendJSONString(b, typ)
	b = append(b, `,"jws":`...)
	b, err := appendJSONString(b, token)
	if err != nil {
		return err
	}
	b = append(b, '}')
	return conn.Write(ctx, websocket.MessageText, b)
}
