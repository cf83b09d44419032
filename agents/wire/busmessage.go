package wire

import (
	"encoding/json"
	"time"
)

// BusMessage is a message of the durable bus as its HTTP API shows it
// (poll, history, dead letters, lookups): snake_case members, times in
// epoch seconds, JSON values as sent. The bus writes it and the Go SDK reads
// it, so both use this one type.
type BusMessage struct {
	ID string `json:"id"`
	// MessageID is ID again, under the name the send receipt, ack and
	// requeue use, so that a script may read either everywhere.
	MessageID   string          `json:"message_id"`
	Nonce       string          `json:"nonce"`
	Sender      string          `json:"sender"`
	Recipient   string          `json:"recipient"`
	Intent      string          `json:"intent"`
	Payload     json.RawMessage `json:"payload"`
	Status      string          `json:"status"`
	Priority    int             `json:"priority"`
	RetryCount  int             `json:"retry_count"`
	MaxRetries  int             `json:"max_retries"`
	NextRetryAt *float64        `json:"next_retry_at"`
	CreatedAt   float64         `json:"created_at"`
	DeliveredAt *float64        `json:"delivered_at"`
	AckedAt     *float64        `json:"acked_at"`
	FailedAt    *float64        `json:"failed_at"`
	Error       *string         `json:"error"`
	Response    json.RawMessage `json:"response"`
	TraceID     *string         `json:"trace_id"`
	Metadata    json.RawMessage `json:"metadata"`
	// LeaseExpiresAt and LeaseID are set on messages handed out under a
	// poll lease (poll with claim).
	LeaseExpiresAt *float64 `json:"lease_expires_at,omitempty"`
	LeaseID        string   `json:"lease_id,omitempty"`
	UpdatedAt      float64  `json:"updated_at"`
}

// LeaseExpiry returns when the message's poll lease runs out (zero when it
// has none).
func (m *BusMessage) LeaseExpiry() time.Time {
	if m.LeaseExpiresAt == nil {
		return time.Time{}
	}
	return time.UnixMicro(int64(*m.LeaseExpiresAt * 1e6))
}
