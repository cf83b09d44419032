package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/coder/websocket"

	"github.com/beamdir/beam/agents/wire"
)

// IntentConversation is the intent type Talk sends and the directory's echo
// agent answers.
const IntentConversation = "conversation.message"

// errWriteFailed marks a Send whose frame could not be written to the
// session.
var errWriteFailed = errors.New("websocket write failed")

// pendingSend is a Send waiting for its result on one session.
type pendingSend struct {
	conn *websocket.Conn
	ch   chan wsAnswer // buffered 1
}

// wsAnswer is what arrived for a pending send: a result frame or an error.
type wsAnswer struct {
	frame json.RawMessage
	jws   string // the recipient's result JWS (beam/2), if any
	err   error
}

func (p *pendingSend) fail(err error) {
	select {
	case p.ch <- wsAnswer{err: err}:
	default:
	}
}

// complete hands a to the send waiting for nonce, if any.
func (c *Client) complete(nonce string, a wsAnswer) bool {
	c.mu.Lock()
	p, ok := c.pending[nonce]
	if ok {
		delete(c.pending, nonce)
	}
	c.mu.Unlock()
	if ok {
		p.ch <- a
	}
	return ok
}

// Send signs an intent from the client's agent to `to` and waits for its
// result: over the WebSocket session while it is up, otherwise with
// POST /intents/send. payload may be nil or empty (an empty object), a
// json.RawMessage or []byte holding a JSON object (sent byte for byte), or
// any value that encodes to a JSON object.
//
// A successful result is returned with a nil error; an asynchronous
// acceptance (wire.IsAsyncAcceptance) is a success too. A failure result is
// returned together with an *Error carrying its errorCode; a directory
// refusal (HTTP error body or WebSocket error frame) is an *Error with a nil
// frame. Without a deadline on ctx, Send waits at most
// ClientConfig.SendTimeout.
func (c *Client) Send(ctx context.Context, to, intent string, payload any) (*wire.ResultFrame, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	if to == "" || intent == "" {
		return nil, errors.New("send: recipient and intent are required")
	}
	raw, err := encodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("send %s to %s: %w", intent, to, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.cfg.SendTimeout)
		defer cancel()
	}
	f := wire.NewIntentFrame(c.id.BeamID, to, intent, raw, c.clock())
	var res *wire.ResultFrame
	if c.beam2() {
		res, err = c.sendBeam2(ctx, f)
		if ErrorCode(err) != CodeUnsupportedProtocol || c.cfg.StrictProtocol {
			return c.sendOutcome(f, res, err)
		}
		// The recipient speaks beam/1 only: the directory recorded the
		// beam/2 intent as failed; send the same intent as beam/1 under a
		// new nonce.
		c.log.Debug("beam: recipient speaks beam/1 only; sending as beam/1", "to", to, "nonce", f.Nonce)
		f = wire.NewIntentFrame(c.id.BeamID, to, intent, raw, c.clock())
	}
	if err := wire.SignIntent(f, c.id.Private); err != nil {
		return nil, fmt.Errorf("send %s to %s: %w", intent, to, err)
	}
	frame, err := f.DeliveryJSON()
	if err != nil {
		return nil, fmt.Errorf("send %s to %s: %w", intent, to, err)
	}
	if conn := c.session(); conn != nil {
		res, err = c.sendWS(ctx, conn, f.Nonce, frame)
		if errors.Is(err, errWriteFailed) && ctx.Err() == nil {
			// The session broke under us. The nonce makes a second attempt
			// safe: the directory answers a nonce it already has with its
			// cached result or IN_PROGRESS, never a second delivery.
			c.log.Debug("beam: websocket write failed; sending over HTTP", "nonce", f.Nonce, "err", err)
			res, err = c.sendHTTP(ctx, frame)
		}
	} else {
		res, err = c.sendHTTP(ctx, frame)
	}
	return c.sendOutcome(f, res, err)
}

// sendOutcome turns the answer to the intent f into Send's return values.
func (c *Client) sendOutcome(f *wire.IntentFrame, res *wire.ResultFrame, err error) (*wire.ResultFrame, error) {
	intent, to := f.Intent, f.To
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Nonce == "" {
			e.Nonce = f.Nonce
		}
		return nil, fmt.Errorf("send %s to %s: %w", intent, to, err)
	}
	if res.Nonce != f.Nonce {
		return nil, fmt.Errorf("send %s to %s: result is for nonce %q, sent %q", intent, to, res.Nonce, f.Nonce)
	}
	if !res.Success {
		e := &Error{Code: res.ErrorCode, Message: res.Error, Nonce: f.Nonce}
		if e.Code == "" {
			e.Code = "RESULT_ERROR"
		}
		return res, e
	}
	return res, nil
}

// Talk sends a conversation.message carrying message to `to` and returns
// the reply's payload.message.
func (c *Client) Talk(ctx context.Context, to, message string) (string, error) {
	if message == "" {
		return "", errors.New("talk: empty message")
	}
	res, err := c.Send(ctx, to, IntentConversation, map[string]string{"message": message})
	if err != nil {
		return "", err
	}
	var reply struct {
		Message string `json:"message"`
	}
	if len(res.Payload) > 0 {
		if err := json.Unmarshal(res.Payload, &reply); err != nil {
			return "", fmt.Errorf("talk to %s: reply payload: %w", to, err)
		}
	}
	return reply.Message, nil
}

// session returns the live session, or nil.
func (c *Client) session() *websocket.Conn {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// sendWS sends frame on conn and waits for the answer with its nonce.
func (c *Client) sendWS(ctx context.Context, conn *websocket.Conn, nonce string, frame []byte) (*wire.ResultFrame, error) {
	p := &pendingSend{conn: conn, ch: make(chan wsAnswer, 1)}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
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
	if err := writeFrame(ctx, conn, "intent", frame); err != nil {
		forget()
		return nil, fmt.Errorf("%w: %w", errWriteFailed, err)
	}
	select {
	case a := <-p.ch:
		if a.err != nil {
			return nil, a.err
		}
		res, err := wire.DecodeResultFrame(a.frame)
		if err != nil {
			return nil, fmt.Errorf("decode result: %w", err)
		}
		return res, nil
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("waiting for result: %w", ctx.Err())
	}
}

// sendHTTP posts frame to /intents/send.
func (c *Client) sendHTTP(ctx context.Context, frame []byte) (*wire.ResultFrame, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/intents/send", bytes.NewReader(frame))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBody+1))
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if len(b) > maxResponseBody {
		return nil, fmt.Errorf("response larger than %d bytes", maxResponseBody)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, ErrorFromResponse(resp, b)
	}
	res, err := wire.DecodeResultFrame(b)
	if err != nil {
		return nil, fmt.Errorf("decode result (HTTP %d): %w", resp.StatusCode, err)
	}
	return res, nil
}

// encodePayload turns a Send payload into JSON object bytes.
func encodePayload(payload any) (json.RawMessage, error) {
	var raw []byte
	switch p := payload.(type) {
	case nil:
		return json.RawMessage("{}"), nil
	case json.RawMessage:
		raw = p
	case []byte:
		raw = p
	default:
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(payload); err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		raw = bytes.TrimRight(buf.Bytes(), "\n")
	}
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return json.RawMessage("{}"), nil
	}
	if raw[0] != '{' || !json.Valid(raw) {
		return nil, errors.New("payload must be a JSON object")
	}
	return json.RawMessage(raw), nil
}
