package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/beamdir/beam/agents/wire"
)

// The durable message bus (/v1/beam/...) keeps a message until it is acked
// or visibly dead: an offline recipient gets it when it connects, a failing
// one on a retry schedule, an agent without a socket by polling with a
// lease.

// DurableOptions are the optional parts of SendDurable.
type DurableOptions struct {
	// Nonce is the message's idempotency key; a random one when empty.
	// Sending the same message with the same nonce again is deduplicated.
	Nonce string
	// Priority orders queued messages (higher first).
	Priority int
	// TraceID is stored with the message.
	TraceID string
}

// DurableReceipt is the bus's answer to SendDurable.
type DurableReceipt struct {
	// MessageID and ID are the message's id, under both names the bus
	// answers with.
	MessageID   string   `json:"message_id"`
	ID          string   `json:"id"`
	Nonce       string   `json:"nonce"`
	Status      string   `json:"status"`
	CreatedAt   float64  `json:"created_at"`
	RetryCount  int      `json:"retry_count"`
	NextRetryAt *float64 `json:"next_retry_at,omitempty"`
	Error       string   `json:"error,omitempty"`
	ErrorCode   string   `json:"error_code,omitempty"`
	// Deduped reports that the bus already had this message.
	Deduped bool `json:"deduped,omitempty"`
}

// DurableMessage is a bus message as poll, history and lookups return it
// (times in epoch seconds); LeaseExpiry tells when its poll lease runs out.
type DurableMessage = wire.BusMessage

// PollOptions select what Poll returns.
type PollOptions struct {
	// Claim hands out queued messages under a lease (for agents without a
	// WebSocket session): each must be acked before the lease runs out, or
	// it goes back to the queue with the attempt counted. Without Claim,
	// Poll lists the accepted, non-terminal deliveries (status delivered).
	Claim bool
	// Lease is the lease length of a claim; the bus default (60 s) when 0.
	Lease time.Duration
	// Limit caps the number of messages (bus default 10, at most 100).
	Limit int
	// Status lists messages in another state instead of delivered (not
	// with Claim).
	Status string
}

// AckStatus is the outcome POST /v1/beam/ack records.
type AckStatus string

// The outcomes of Ack.
const (
	AckAcked  AckStatus = "acked"
	AckFailed AckStatus = "failed"
)

// AckResult is the bus's answer to Ack.
type AckResult struct {
	// MessageID and ID are the message's id, under both names the bus
	// answers with.
	MessageID string  `json:"message_id"`
	ID        string  `json:"id"`
	Nonce     string  `json:"nonce"`
	Status    string  `json:"status"`
	UpdatedAt float64 `json:"updated_at"`
}

// DurableDelivery says that an incoming intent came from the message bus.
type DurableDelivery struct {
	// MessageID is the bus message id; Attempt counts delivery attempts
	// (a retry carries the same nonce with a higher attempt).
	MessageID string `json:"messageId"`
	Attempt   int    `json:"attempt"`
	// Auth is how the bus authenticated the sender: "signature" (the frame
	// is the sender's and verifies), "api_key", "bus_key" or "jws" (the
	// frame is attested by the directory: see Intent.Attested).
	Auth string `json:"auth"`
}

// DurableOutcome is how a message this client sent through the bus ended,
// as the directory reports it on the session.
type DurableOutcome struct {
	MessageID string
	Nonce     string
	// Status is acked, failed or dead_letter.
	Status string
	// Result is the recorded result frame.
	Result json.RawMessage
}

// busMark is the "bus" member of a message from the directory.
type busMark struct {
	DurableDelivery
	Nonce  string `json:"nonce,omitempty"`
	Status string `json:"status,omitempty"`
}

// OnDurableOutcome registers f to be called (on the session's reader; it
// must not block) when a message this client sent through the bus ends.
// nil removes it.
func (c *Client) OnDurableOutcome(f func(DurableOutcome)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.durableHook = f
}

func (c *Client) durableOutcome(env envelope) {
	c.mu.Lock()
	f := c.durableHook
	c.mu.Unlock()
	if f == nil || env.Bus == nil {
		return
	}
	f(DurableOutcome{MessageID: env.Bus.MessageID, Nonce: env.Bus.Nonce, Status: env.Bus.Status, Result: env.Frame})
}

// SendDurable hands an intent to the directory's message bus and returns as
// soon as the bus has recorded it (status delivered when the recipient took
// it at once, queued otherwise). The frame is signed with the client's key,
// so the recipient can verify it. payload is encoded as for Send.
func (c *Client) SendDurable(ctx context.Context, to, intent string, payload any, opts *DurableOptions) (*DurableReceipt, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	if to == "" || intent == "" {
		return nil, errors.New("send durable: recipient and intent are required")
	}
	if opts == nil {
		opts = &DurableOptions{}
	}
	raw, err := encodePayload(payload)
	if err != nil {
		return nil, fmt.Errorf("send durable %s to %s: %w", intent, to, err)
	}
	f := wire.NewIntentFrame(c.id.BeamID, to, intent, raw, c.clock())
	if opts.Nonce != "" {
		f.Nonce = opts.Nonce
	}
	if err := wire.SignIntent(f, c.id.Private); err != nil {
		return nil, fmt.Errorf("send durable %s to %s: %w", intent, to, err)
	}
	frame, err := f.DeliveryJSON()
	if err != nil {
		return nil, fmt.Errorf("send durable %s to %s: %w", intent, to, err)
	}
	body := map[string]any{"frame": json.RawMessage(frame)}
	if opts.Priority != 0 {
		body["priority"] = opts.Priority
	}
	if opts.TraceID != "" {
		body["trace_id"] = opts.TraceID
	}
	var rec DurableReceipt
	if _, err := c.doJSON(ctx, http.MethodPost, "/v1/beam/send", nil, body, &rec, false); err != nil {
		return nil, fmt.Errorf("send durable %s to %s: %w", intent, to, err)
	}
	return &rec, nil
}

// Poll returns the client's bus messages (see PollOptions). It needs the
// client's API key.
func (c *Client) Poll(ctx context.Context, opts PollOptions) ([]DurableMessage, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	q := url.Values{"agent": {c.id.BeamID}}
	if opts.Claim {
		q.Set("claim", "true")
		if opts.Lease > 0 {
			q.Set("lease", strconv.FormatFloat(opts.Lease.Seconds(), 'f', -1, 64))
		}
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Status != "" {
		q.Set("status", opts.Status)
	}
	var out struct {
		Messages []DurableMessage `json:"messages"`
	}
	if _, err := c.doJSON(ctx, http.MethodGet, "/v1/beam/poll", q, nil, &out, true); err != nil {
		return nil, fmt.Errorf("poll: %w", err)
	}
	return out.Messages, nil
}

// Ack records the outcome of a bus message delivered to this client
// (delivered → acked|failed). For a message claimed under a lease, pass
// its LeaseID: an ack after the lease was lost is refused (INVALID_STATE).
// response, when not nil, must encode to a JSON object; it is stored and
// returned to the sender.
func (c *Client) Ack(ctx context.Context, m *DurableMessage, status AckStatus, response any) (*AckResult, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	if m == nil || (m.ID == "" && m.Nonce == "") {
		return nil, errors.New("ack: message id or nonce is required")
	}
	if status == "" {
		status = AckAcked
	}
	body := map[string]any{"status": status}
	if m.ID != "" {
		body["message_id"] = m.ID
	} else {
		body["nonce"] = m.Nonce
	}
	if m.LeaseID != "" {
		body["lease_id"] = m.LeaseID
	}
	if response != nil {
		raw, err := encodePayload(response)
		if err != nil {
			return nil, fmt.Errorf("ack %s: response: %w", m.ID, err)
		}
		body["response"] = raw
	}
	var out AckResult
	if _, err := c.doJSON(ctx, http.MethodPost, "/v1/beam/ack", nil, body, &out, true); err != nil {
		return nil, fmt.Errorf("ack %s: %w", m.ID, err)
	}
	return &out, nil
}

// RenewLease extends the lease on a claimed message to now + lease and
// updates m's expiry. It fails with INVALID_STATE once the lease is lost.
func (c *Client) RenewLease(ctx context.Context, m *DurableMessage, lease time.Duration) error {
	if err := c.alive(); err != nil {
		return err
	}
	if m == nil || m.LeaseID == "" {
		return errors.New("renew lease: message has no lease")
	}
	body := map[string]any{"message_id": m.ID, "lease_id": m.LeaseID}
	if lease > 0 {
		body["lease"] = lease.Seconds()
	}
	var out struct {
		LeaseExpiresAt *float64 `json:"lease_expires_at"`
	}
	if _, err := c.doJSON(ctx, http.MethodPost, "/v1/beam/lease", nil, body, &out, true); err != nil {
		return fmt.Errorf("renew lease on %s: %w", m.ID, err)
	}
	m.LeaseExpiresAt = out.LeaseExpiresAt
	return nil
}

// DurableMessageStatus returns a message this client sent or received, by
// message id or nonce.
func (c *Client) DurableMessageStatus(ctx context.Context, idOrNonce string) (*DurableMessage, error) {
	if err := c.alive(); err != nil {
		return nil, err
	}
	var m DurableMessage
	if _, err := c.doJSON(ctx, http.MethodGet, "/v1/beam/messages/"+url.PathEscape(idOrNonce), nil, nil, &m, true); err != nil {
		return nil, fmt.Errorf("message %s: %w", idOrNonce, err)
	}
	return &m, nil
}
