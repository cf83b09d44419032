package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
)

const (
	// maxMessage bounds a WebSocket message the client reads.
	maxMessage = 1 << 20
	// handshakeTimeout bounds dialing plus waiting for "connected".
	handshakeTimeout = 15 * time.Second
	// stableSession is how long a session must have lasted for the next
	// reconnection to start again from ReconnectMin. Shorter sessions keep
	// growing the backoff, so two processes sharing one identity do not
	// replace each other in a tight loop.
	stableSession = 10 * time.Second
)

// envelope is any message on the WebSocket, both directions.
type envelope struct {
	Type            string          `json:"type"`
	Frame           json.RawMessage `json:"frame,omitempty"`
	SenderPublicKey string          `json:"senderPublicKey,omitempty"`
	ActingBeamID    string          `json:"actingBeamId,omitempty"`
	BeamID          string          `json:"beamId,omitempty"`
	Auth            string          `json:"auth,omitempty"`
	Nonce           string          `json:"nonce,omitempty"`
	ErrorCode       string          `json:"errorCode,omitempty"`
	Message         string          `json:"message,omitempty"`
	Bus             *busMark        `json:"bus,omitempty"`       // set on bus deliveries and outcomes (durable.go)
	JWS             string          `json:"jws,omitempty"`       // beam/2 envelope of an intent or result
	Protocols       []string        `json:"protocols,omitempty"` // connected: what the session speaks
	// Attestation marks an intent the directory signed for its sender (attest.go).
	Attestation *wire.Attestation `json:"attestation,omitempty"`
}

// Connect opens the WebSocket session and returns once the directory has
// confirmed it ("connected"). From then on the client keeps the session up:
// when it drops, the client reconnects with backoff until Close. A failure of
// this first attempt is returned (an *Error when the directory refused the
// upgrade with an error body). Calling Connect again while the session loop
// runs is a no-op.
func (c *Client) Connect(ctx context.Context) error {
	c.connectMu.Lock()
	defer c.connectMu.Unlock()
	c.mu.Lock()
	closed, started := c.closed, c.started
	c.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if started {
		return nil
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return fmt.Errorf("connect %s: %w", c.id.BeamID, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		_ = conn.Close(websocket.StatusNormalClosure, "client closed")
		return ErrClosed
	}
	c.conn, c.started = conn, true
	c.wg.Add(2)
	c.mu.Unlock()
	go c.sessionLoop(conn)
	go c.prefetchAttestationKeys()
	return nil
}

// dial opens one session and waits for the directory's "connected" message.
func (c *Client) dial(ctx context.Context) (*websocket.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, handshakeTimeout)
	defer cancel()
	q := url.Values{}
	q.Set("beamId", c.id.BeamID)
	if c.beam2() {
		q.Set("protocol", ProtocolBeam2)
	}
	h := http.Header{}
	if key := c.apiKeyValue(); key != "" {
		h.Set("x-api-key", key)
	} else {
		ts := wire.FormatTimestamp(c.clock())
		nonce := wire.NewNonce()
		proof, err := json.Marshal(map[string]string{
			"action": "ws.connect", "beamId": c.id.BeamID, "nonce": nonce, "timestamp": ts,
		})
		if err != nil {
			return nil, fmt.Errorf("connection proof: %w", err)
		}
		msg, err := wire.CanonicalJSON(proof)
		if err != nil {
			return nil, fmt.Errorf("connection proof: %w", err)
		}
		q.Set("timestamp", ts)
		q.Set("nonce", nonce)
		q.Set("signature", wire.Sign(msg, c.id.Private))
	}
	conn, resp, err := websocket.Dial(ctx, c.wsURL+"?"+q.Encode(), &websocket.DialOptions{
		HTTPClient: c.http,
		HTTPHeader: h,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols && resp.Body != nil {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
			return nil, ErrorFromResponse(resp, b)
		}
		return nil, err
	}
	conn.SetReadLimit(maxMessage)
	typ, data, err := conn.Read(ctx)
	if err != nil {
		_ = conn.CloseNow()
		if st := websocket.CloseStatus(err); st != -1 {
			var ce websocket.CloseError
			errors.As(err, &ce)
			return nil, &Error{Code: "CONNECT_REFUSED", Message: fmt.Sprintf("directory closed the session (%d): %s", st, ce.Reason)}
		}
		return nil, fmt.Errorf("waiting for connected: %w", err)
	}
	var env envelope
	if typ != websocket.MessageText || json.Unmarshal(data, &env) != nil || env.Type != "connected" {
		_ = conn.Close(websocket.StatusProtocolError, "expected connected")
		return nil, fmt.Errorf("waiting for connected: unexpected first message %.200q", data)
	}
	if c.beam2() && !slices.Contains(env.Protocols, ProtocolBeam2) {
		_ = conn.Close(websocket.StatusNormalClosure, "beam/2 not supported")
		return nil, fmt.Errorf("%w: the directory did not confirm %s for the session (protocols %v)", ErrProtocolUnsupported, ProtocolBeam2, env.Protocols)
	}
	c.log.Debug("beam session connected", "auth", env.Auth)
	return conn, nil
}

// sessionLoop serves conn, and after it drops, reconnects and serves the new
// session, until Close.
func (c *Client) sessionLoop(conn *websocket.Conn) {
	defer c.wg.Done()
	attempt := 0
	for {
		began := time.Now()
		err := c.serve(conn)
		c.dropSession(conn)
		if c.ctx.Err() != nil {
			return
		}
		if time.Since(began) >= stableSession {
			attempt = 0
		}
		c.log.Warn("beam session lost; reconnecting", "err", err)
		for {
			d := c.backoff(attempt)
			attempt++
			t := time.NewTimer(d)
			select {
			case <-c.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			next, err := c.dial(c.ctx)
			if err == nil {
				conn = next
				break
			}
			if c.ctx.Err() != nil {
				return
			}
			c.log.Warn("beam reconnect failed", "attempt", attempt, "err", err)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			_ = conn.Close(websocket.StatusNormalClosure, "client closed")
			return
		}
		c.conn = conn
		c.mu.Unlock()
		c.log.Info("beam session reconnected", "attempts", attempt)
	}
}

// dropSession forgets conn as the live session and fails the sends that
// were waiting on it.
func (c *Client) dropSession(conn *websocket.Conn) {
	_ = conn.CloseNow()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == conn {
		c.conn = nil
	}
	for nonce, p := range c.pending {
		if p.conn == conn {
			p.fail(ErrConnectionLost)
			delete(c.pending, nonce)
		}
	}
}

// serve reads conn until it fails, pinging it in the background.
func (c *Client) serve(conn *websocket.Conn) error {
	done := make(chan struct{})
	defer close(done)
	go c.pinger(conn, done)
	for {
		typ, data, err := conn.Read(c.ctx)
		if err != nil {
			return err
		}
		if typ != websocket.MessageText {
			c.log.Debug("beam session: ignoring binary message")
			continue
		}
		c.dispatch(data)
	}
}

// pinger pings conn every PingInterval and closes it when a ping fails.
func (c *Client) pinger(conn *websocket.Conn, done <-chan struct{}) {
	t := time.NewTicker(c.cfg.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.ctx, c.cfg.PingInterval)
		err := conn.Ping(ctx)
		cancel()
		if err != nil {
			if c.ctx.Err() == nil {
				c.log.Warn("beam session: ping failed", "err", err)
			}
			_ = conn.CloseNow()
			return
		}
	}
}

// dispatch handles one message from the directory.
func (c *Client) dispatch(data []byte) {
	var env envelope
	if err := json.Unmarshal(data, &env); err != nil {
		c.log.Warn("beam session: undecodable message", "err", err)
		return
	}
	switch env.Type {
	case "result":
		if env.Bus != nil {
			c.durableOutcome(env)
			return
		}
		var head struct {
			Nonce string `json:"nonce"`
		}
		if err := json.Unmarshal(env.Frame, &head); err != nil || head.Nonce == "" {
			c.log.Warn("beam session: result without nonce")
			return
		}
		if !c.complete(head.Nonce, wsAnswer{frame: env.Frame, jws: env.JWS}) {
			c.log.Debug("beam session: result for no pending send", "nonce", head.Nonce)
		}
	case "error":
		e := &Error{Code: env.ErrorCode, Message: env.Message}
		if e.Code == "" {
			e.Code = "UNKNOWN"
		}
		if env.Nonce == "" || !c.complete(env.Nonce, wsAnswer{err: e}) {
			c.log.Warn("beam session: error from directory", "nonce", env.Nonce, "errorCode", e.Code, "message", e.Message)
		}
	case "intent":
		c.receive(env)
	case "connected":
	default:
		c.log.Debug("beam session: ignoring message", "type", env.Type)
	}
}

// writeFrame sends {"type":typ,"frame":frame} on conn, keeping the frame
// bytes exactly as given.
func writeFrame(ctx context.Context, conn *websocket.Conn, typ string, frame []byte) error {
	b := make([]byte, 0, len(frame)+32)
	b = append(b, `{"type":`...)
	b, _ = appendJSONString(b, typ)
	b = append(b, `,"frame":`...)
	b = append(b, frame...)
	b = append(b, '}')
	return conn.Write(ctx, websocket.MessageText, b)
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) ([]byte, error) {
	q, err := json.Marshal(s)
	if err != nil {
		return b, err
	}
	return append(b, q...), nil
}
