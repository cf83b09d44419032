package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// busOutcomeWait is how long a bus send waits for the outcome notification
// on the sender's session before it starts polling the message instead.
const busOutcomeWait = 3 * time.Second

// busPollInterval is the pace of that fallback polling.
const busPollInterval = 500 * time.Millisecond

// busDriver sends durable messages with POST /v1/beam/send (signed beam/1
// frames) and waits until each is acked. The outcome comes as the bus's
// notification on the sender's own WebSocket session ({"type":"result",
// "bus":{"status":…}}); a message whose notification does not come within
// busOutcomeWait is polled with GET /v1/beam/messages/{id} under the
// sender's API key.
type busDriver struct {
	env      *Env
	sessions map[string]*busSession
	wg       sync.WaitGroup
	cancel   context.CancelFunc

	accepted atomic.Int64 // sends the bus answered 201 or 200
	polled   atomic.Int64 // outcomes learned by polling
}

// busSession is one sender's session and its messages awaiting an outcome.
type busSession struct {
	conn *websocket.Conn
	mu   sync.Mutex
	wait map[string]*wsPending
}

// busEnvelope is a message on a sender's session.
type busEnvelope struct {
	Type  string          `json:"type"`
	Frame json.RawMessage `json:"frame,omitempty"`
	Bus   *struct {
		MessageID string `json:"messageId"`
		Nonce     string `json:"nonce"`
		Status    string `json:"status"`
	} `json:"bus,omitempty"`
}

// busReceipt is the bus's answer to a send.
type busReceipt struct {
	MessageID string `json:"message_id"`
	Nonce     string `json:"nonce"`
	Status    string `json:"status"`
	Error     string `json:"error"`
	ErrorCode string `json:"error_code"`
}

func newBusDriver(ctx context.Context, env *Env) (Driver, error) {
	rctx, cancel := context.WithCancel(context.Background())
	d := &busDriver{env: env, sessions: make(map[string]*busSession, len(env.Fleet.Senders)), cancel: cancel}
	for _, a := range env.Fleet.Senders {
		conn, err := dial(ctx, env.HTTP, env.URL, a)
		if err != nil {
			_ = d.Close()
			return nil, err
		}
		s := &busSession{conn: conn, wait: map[string]*wsPending{}}
		d.sessions[a.BeamID] = s
		d.wg.Add(1)
		go d.read(rctx, s)
	}
	return d, nil
}

// Accepted returns how many sends the bus accepted (201 or 200).
func (d *busDriver) Accepted() int64 { return d.accepted.Load() }

// Polled returns how many outcomes were learned by polling.
func (d *busDriver) Polled() int64 { return d.polled.Load() }

func (d *busDriver) Send(ctx context.Context, from, to *Agent) error {
	s, ok := d.sessions[from.BeamID]
	if !ok {
		return fmt.Errorf("%s has no session", from.BeamID)
	}
	nonce, frame, err := signedFrame(d.env, from, to)
	if err != nil {
		return err
	}
	// The outcome may arrive before the send's answer: wait first.
	p := &wsPending{recipient: to.Public, done: make(chan error, 1)}
	s.mu.Lock()
	s.wait[nonce] = p
	s.mu.Unlock()
	rec, err := d.post(ctx, from, frame)
	if err != nil {
		s.take(nonce)
		return err
	}
	d.accepted.Add(1)
	switch rec.Status {
	case "acked":
		s.take(nonce)
		return nil
	case "dead_letter", "failed":
		s.take(nonce)
		code := rec.ErrorCode
		if code == "" {
			code = "DEAD_LETTER"
		}
		return failure(code, "message %s ended %s: %s", rec.MessageID, rec.Status, rec.Error)
	}
	t := time.NewTimer(busOutcomeWait)
	defer t.Stop()
	select {
	case err := <-p.done:
		return err
	case <-ctx.Done():
		s.take(nonce)
		return fmt.Errorf("waiting for the ack: %w", ctx.Err())
	case <-t.C:
	}
	// No notification yet: poll, still taking a late notification.
	tick := time.NewTicker(busPollInterval)
	defer tick.Stop()
	for {
		st, err := d.status(ctx, from, rec.MessageID)
		if err == nil {
			switch st.Status {
			case "acked":
				if s.take(nonce) != nil {
					d.polled.Add(1)
				}
				return nil
			case "dead_letter", "failed":
				s.take(nonce)
				return failure("DEAD_LETTER", "message %s ended %s", rec.MessageID, st.Status)
			}
		}
		select {
		case err := <-p.done:
			return err
		case <-ctx.Done():
			s.take(nonce)
			return fmt.Errorf("waiting for the ack: %w", ctx.Err())
		case <-tick.C:
		}
	}
}

// post sends one signed frame to the bus and returns its receipt.
func (d *busDriver) post(ctx context.Context, from *Agent, frame []byte) (*busReceipt, error) {
	body := make([]byte, 0, len(frame)+12)
	body = append(body, `{"frame":`...)
	body = append(body, frame...)
	body = append(body, '}')
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.env.URL+"/v1/beam/send", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.env.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("send: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("read receipt: %w", err)
	}
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return nil, readAPIError(resp.StatusCode, b)
	}
	var rec busReceipt
	if err := json.Unmarshal(b, &rec); err != nil || rec.MessageID == "" {
		return nil, failure("BAD_RECEIPT", "send answered %d with %.200q", resp.StatusCode, b)
	}
	return &rec, nil
}

// status reads a message with the sender's API key.
func (d *busDriver) status(ctx context.Context, from *Agent, id string) (*busReceipt, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.env.URL+"/v1/beam/messages/"+url.PathEscape(id), nil)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("x-api-key", from.APIKey)
	resp, err := d.env.HTTP.Do(req)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", id, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", id, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, readAPIError(resp.StatusCode, b)
	}
	var m busReceipt
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("message %s: %w", id, err)
	}
	return &m, nil
}

// read dispatches the bus's outcome notifications of one session. An acked
// message's recorded result is the recipient's signed result frame; its
// signature is checked here.
func (d *busDriver) read(ctx context.Context, s *busSession) {
	defer d.wg.Done()
	for {
		_, data, err := s.conn.Read(ctx)
		if err != nil {
			s.mu.Lock()
			for n, p := range s.wait {
				p.done <- failure("CONNECTION_LOST", "session closed")
				delete(s.wait, n)
			}
			s.mu.Unlock()
			return
		}
		var env busEnvelope
		if json.Unmarshal(data, &env) != nil || env.Type != "result" || env.Bus == nil {
			continue
		}
		p := s.take(env.Bus.Nonce)
		if p == nil {
			continue
		}
		switch env.Bus.Status {
		case "acked":
			p.done <- checkResult(env.Frame, env.Bus.Nonce, p.recipient)
		default:
			p.done <- failure("DEAD_LETTER", "message %s ended %s", env.Bus.MessageID, env.Bus.Status)
		}
	}
}

// take removes and returns the pending message of nonce, or nil.
func (s *busSession) take(nonce string) *wsPending {
	if nonce == "" {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.wait[nonce]
	delete(s.wait, nonce)
	return p
}

func (d *busDriver) Close() error {
	for _, s := range d.sessions {
		_ = s.conn.Close(websocket.StatusNormalClosure, "bench done")
	}
	d.cancel()
	d.wg.Wait()
	return nil
}
