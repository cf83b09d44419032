package tracing

import (
	"encoding/json"
	"time"
)

// Owner says which component drives an intent's lifecycle and therefore
// which recovery rule applies to it after a restart.
type Owner string

// The owners of an intent.
const (
	// OwnerDirectory marks intents relayed synchronously by the directory
	// (HTTP, WebSocket, federation). Interrupted ones fail as retryable.
	OwnerDirectory Owner = "directory"
	// OwnerBus marks messages accepted by the message bus. Interrupted ones
	// are requeued with the same nonce.
	OwnerBus Owner = "bus"
	// OwnerJobs marks intents of the Intent Protocol job bus (bus/jobs).
	// Nothing else recovers them; the job bus folds them with JobRow.Apply.
	OwnerJobs Owner = "jobs"
)

// Event is one row of the append-only log intent_trace_events: one step in
// the lifecycle of the intent identified by Nonce.
type Event struct {
	// Seq is the log position, assigned by the log on append.
	Seq int64 `json:"seq"`
	// Nonce identifies the intent; it is the idempotency key of the frame.
	Nonce string `json:"nonce"`
	// State is the lifecycle state the intent enters with this event.
	State State `json:"state"`
	// At is server time. The log sets it on append when it is zero.
	At time.Time `json:"at"`
	// From, To and IntentType describe the intent. The first event of a
	// nonce must carry them; later events may leave them empty.
	From       string `json:"from,omitempty"`
	To         string `json:"to,omitempty"`
	IntentType string `json:"intentType,omitempty"`
	// Transport names the path of this step: ws, http, direct-http,
	// federation, bus, poll, builtin-echo, recovery, import.
	Transport string `json:"transport,omitempty"`
	// Attempt is the delivery attempt this event belongs to, starting at 1.
	Attempt int `json:"attempt,omitempty"`
	// Details carries everything else; see the Details type for the keys the
	// projections read. Stored as a JSON object.
	Details Details `json:"details,omitempty"`
}

// Details holds the event details the projections and recovery read, plus
// any other keys a component wants to keep in the log (Extra). It is stored
// as one flat JSON object.
type Details struct {
	// Owner is set on the received event: who drives this intent.
	Owner Owner `json:"owner,omitempty"`
	// Frame is the intent frame as it arrived, compacted (received event).
	Frame json.RawMessage `json:"frame,omitempty"`
	// ClientTimestamp is the frame's own timestamp (received event).
	ClientTimestamp string `json:"clientTimestamp,omitempty"`
	// TimeoutMs is the result timeout of the current attempt; recovery uses
	// it to decide whether a delivered intent may still receive its result.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// ErrorCode and Error describe a failure (failed, dead_letter, queued
	// after a failed attempt).
	ErrorCode string `json:"errorCode,omitempty"`
	Error     string `json:"error,omitempty"`
	// Retryable marks a failure that a same-nonce retry may recover from.
	Retryable bool `json:"retryable,omitempty"`
	// LatencyMs is the round-trip latency reported on a final event.
	LatencyMs *int64 `json:"latencyMs,omitempty"`
	// Result is the result frame that finalizes the intent (acked, failed,
	// dead_letter). A replay of the nonce returns it.
	Result json.RawMessage `json:"result,omitempty"`
	// Bus is set on the received event of a message accepted by the bus.
	Bus *BusMessage `json:"bus,omitempty"`
	// Job is set on every event of an Intent Protocol job (owner jobs).
	Job *JobDetails `json:"job,omitempty"`
	// NextRetryAt is when a queued message becomes due (unix ms).
	NextRetryAt int64 `json:"nextRetryAt,omitempty"`
	// RetryCount is the number of failed delivery attempts so far (bus).
	RetryCount *int `json:"retryCount,omitempty"`
	// LeaseOwner and LeaseExpiresAt (unix ms) describe a poll lease on a
	// dispatched bus message.
	LeaseOwner     string `json:"leaseOwner,omitempty"`
	LeaseExpiresAt int64  `json:"leaseExpiresAt,omitempty"`
	// Response is the consumer's response recorded by a bus ack.
	Response json.RawMessage `json:"response,omitempty"`
	// Mesh is the step of a pipeline envelope (see MeshStep); the
	// beam_mesh projection folds it.
	Mesh json.RawMessage `json:"mesh,omitempty"`
	// LegacyStage and LegacyStatus keep the original labels of imported or
	// normalized legacy rows.
	LegacyStage  string `json:"legacyStage,omitempty"`
	LegacyStatus string `json:"legacyStatus,omitempty"`
	// Extra holds any other keys (peer, hopCount, lateResult,
	// recoveryAction, fallbackReason, ...). They are stored and shown in
	// traces but never read by the projections.
	Extra map[string]any `json:"-"`
}

// BusMessage is what the bus records about a message when it accepts it.
type BusMessage struct {
	MessageID  string          `json:"messageId"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	Priority   int             `json:"priority,omitempty"`
	MaxRetries int             `json:"maxRetries,omitempty"`
	TraceID    string          `json:"traceId,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
}
