package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"
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
	env *env
	senderSessions

	accepted atomic.Int64 // sends the bus answered 201 or 200
	polled   atomic.Int64 // outcomes learned by polling
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

func newBusDriver(ctx context.Context, env *env) (driver, error) {
	d := &busDriver{env: env}
	if err := d.open(ctx, env, d.dispatch); err != nil {
		return nil, err
	}
	return d, nil
}

// Accepted returns how many sends the bus accepted (201 or 200).
func (d *busDriver) Accepted() int64 { return d.accepted.Load() }

// Polled returns how many outcomes were learned by polling.
func (d *busDriver) Polled() int64 { return d.polled.Load() }

func (d *busDriver) Send(ctx context.Context, from, to *agent) error {
	// The outcome may arrive before the send's answer: expect it first.
	p, frame, err := d.begin(d.env, from, to)
	if err != nil {
		return err
	}
	rec, err := d.post(ctx, from, frame)
	if err != nil {
		p.forget()
		return err
	}
	d.accepted.Add(1)
	switch rec.Status {
	case "acked":
		p.forget()
		return nil
	case "dead_letter", "failed":
		p.forget()
		code := rec.ErrorCode
		if code == "" {
			code = "DEAD_LETTER"
		}
		return failure(code, "message %s ended %s: %s", rec.MessageID, rec.Status, rec.Error)
	}
	t := time.NewTimer(busOutcomeWait)
	defer t.Stop()
	if done, err := p.await(ctx, "the ack", t.C); done {
		return err
	}
	// No notification yet: poll, still taking a late notification.
	tick := time.NewTicker(busPollInterval)
	defer tick.Stop()
	for {
		st, err := d.status(ctx, from, rec.MessageID)
		if err == nil {
			switch st.Status {
			case "acked":
				if p.forget() {
					d.polled.Add(1)
				}
				return nil
			case "dead_letter", "failed":
				p.forget()
				return failure("DEAD_LETTER", "message %s ended %s", rec.MessageID, st.Status)
			}
		}
		if done, err := p.await(ctx, "the ack", tick.C); done {
			return err
		}
	}
}

// post sends one signed frame to the bus and returns its receipt.
func (d *busDriver) post(ctx context.Context, from *agent, frame []byte) (*busReceipt, error) {
	body := make([]byte, 0, len(frame)+12)
	body = append(body, `{"frame":`...)
	body = append(body, frame...)
	body = append(body, '}')
	status, b, err := call(ctx, d.env.HTTP, http.MethodPost, from.Base+"/v1/beam/send", body, nil,
		http.StatusCreated, http.StatusOK)
	if err != nil {
		return nil, err
	}
	var rec busReceipt
	if err := json.Unmarshal(b, &rec); err != nil || rec.MessageID == "" {
		return nil, failure("BAD_RECEIPT", "send answered %d with %.200q", status, b)
	}
	return &rec, nil
}

// status reads a message with the sender's API key.
func (d *busDriver) status(ctx context.Context, from *agent, id string) (*busReceipt, error) {
	_, b, err := call(ctx, d.env.HTTP, http.MethodGet, from.Base+"/v1/beam/messages/"+url.PathEscape(id), nil,
		http.Header{"X-Api-Key": {from.APIKey}}, http.StatusOK)
	if err != nil {
		return nil, fmt.Errorf("message %s: %w", id, err)
	}
	var m busReceipt
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("message %s: %w", id, err)
	}
	return &m, nil
}

// dispatch hands a bus outcome notification that arrived on s to its
// sender. An acked message's recorded result is the recipient's signed
// result frame; its signature is checked here.
func (d *busDriver) dispatch(s *wsSession, data []byte) {
	var env busEnvelope
	if json.Unmarshal(data, &env) != nil || env.Type != "result" || env.Bus == nil {
		return
	}
	p := s.take(env.Bus.Nonce)
	if p == nil {
		return
	}
	switch env.Bus.Status {
	case "acked":
		p.done <- checkResult(env.Frame, env.Bus.Nonce, p.recipient)
	default:
		p.done <- failure("DEAD_LETTER", "message %s ended %s", env.Bus.MessageID, env.Bus.Status)
	}
}
