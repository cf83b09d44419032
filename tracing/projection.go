package tracing

import (
	"bytes"
	"time"
)

// IntentRow is one row of the intent_log projection: the folded state of one
// nonce. Times are unix microseconds (server time). The fold is Apply; the
// appender and Rebuild both use it, which keeps the table equal to a refold
// of the log.
type IntentRow struct {
	Nonce      string `db:"nonce" json:"nonce"`
	From       string `db:"from_beam_id" json:"from"`
	To         string `db:"to_beam_id" json:"to"`
	IntentType string `db:"intent_type" json:"intentType"`
	// Owner is details.owner of the first event (default directory).
	Owner Owner `db:"owner" json:"owner"`
	// Status is the state of the latest event.
	Status State `db:"status" json:"status"`
	// RequestedAt is the server time of the first event.
	RequestedAt int64 `db:"requested_at" json:"requestedAt"`
	// ClientTimestamp is the frame's own timestamp from the first event.
	ClientTimestamp string `db:"client_timestamp" json:"clientTimestamp,omitempty"`
	Attempt         int    `db:"attempt" json:"attempt,omitempty"`
	Transport       string `db:"transport" json:"transport,omitempty"`
	TimeoutMs       int64  `db:"timeout_ms" json:"timeoutMs,omitempty"`
	ErrorCode       string `db:"error_code" json:"errorCode,omitempty"`
	// CompletedAt is set on entering acked, failed or dead_letter.
	CompletedAt *int64 `db:"completed_at" json:"completedAt,omitempty"`
	// RoundTripLatencyMs is set together with CompletedAt.
	RoundTripLatencyMs *int64 `db:"round_trip_latency_ms" json:"roundTripLatencyMs,omitempty"`
	// ResultJSON is the result frame recorded on entering a terminal state.
	ResultJSON RawJSON `db:"result_json" json:"result,omitempty"`
	UpdatedAt  int64   `db:"updated_at" json:"updatedAt"`
	LastSeq    int64   `db:"last_seq" json:"lastSeq"`
	// FirstSeq is the seq of the nonce's first event: the row's key in
	// intent_log and the intent id that groups the nonce's events in the log
	// (intent_trace_events.first_seq).
	FirstSeq int64 `db:"first_seq" json:"firstSeq"`
}

// Apply folds ev into the row. ev must be the next event of the row's nonce
// in seq order, with Seq and At set; on a zero row it must be the nonce's
// first event. Apply does not validate the transition and never mutates
// memory shared with an earlier copy of the row.
func (r *IntentRow) Apply(ev Event) {
	us := ev.At.UnixMicro()
	d := &ev.Details
	if r.Nonce == "" {
		r.Nonce = ev.Nonce
		r.FirstSeq = ev.Seq
		r.RequestedAt = us
		r.Owner = d.Owner
		if r.Owner == "" {
			r.Owner = OwnerDirectory
		}
		r.ClientTimestamp = d.ClientTimestamp
	}
	if r.From == "" {
		r.From = ev.From
	}
	if r.To == "" {
		r.To = ev.To
	}
	if r.IntentType == "" {
		r.IntentType = ev.IntentType
	}
	entering := r.Status != ev.State
	r.Status = ev.State
	if ev.Attempt != 0 {
		r.Attempt = ev.Attempt
	}
	if ev.Transport != "" {
		r.Transport = ev.Transport
	}
	if d.TimeoutMs != 0 {
		r.TimeoutMs = d.TimeoutMs
	}
	switch ev.State {
	case Failed, DeadLetter, Queued:
		if d.ErrorCode != "" {
			r.ErrorCode = d.ErrorCode
		}
	case Acked:
		r.ErrorCode = ""
	}
	if entering {
		if ev.State.Terminal() {
			done := us
			r.CompletedAt = &done
			var lat int64
			if d.LatencyMs != nil {
				lat = *d.LatencyMs
			} else {
				lat = (us - r.RequestedAt) / 1000
			}
			r.RoundTripLatencyMs = &lat
			r.ResultJSON = cloneRaw(d.Result)
		} else {
			r.CompletedAt = nil
			r.RoundTripLatencyMs = nil
			r.ResultJSON = nil
		}
	}
	r.UpdatedAt = us
	r.LastSeq = ev.Seq
}

// RequestedTime returns RequestedAt as a time.
func (r *IntentRow) RequestedTime() time.Time { return time.UnixMicro(r.RequestedAt).UTC() }

// MessageRow is one row of the beam_messages projection: a message accepted
// by the bus (a nonce whose first event carries details.bus). Times are unix
// epoch seconds as REAL, like the bus's reference schema.
type MessageRow struct {
	ID         string  `db:"id" json:"id"`
	Nonce      string  `db:"nonce" json:"nonce"`
	Sender     string  `db:"sender" json:"sender"`
	Recipient  string  `db:"recipient" json:"recipient"`
	Intent     string  `db:"intent" json:"intent"`
	Payload    RawJSON `db:"payload" json:"payload"`
	Status     State   `db:"status" json:"status"`
	Priority   int     `db:"priority" json:"priority"`
	RetryCount int     `db:"retry_count" json:"retryCount"`
	MaxRetries int     `db:"max_retries" json:"maxRetries"`
	// NextRetryAt is set while queued (details.nextRetryAt).
	NextRetryAt *float64 `db:"next_retry_at" json:"nextRetryAt,omitempty"`
	CreatedAt   float64  `db:"created_at" json:"createdAt"`
	DeliveredAt *float64 `db:"delivered_at" json:"deliveredAt,omitempty"`
	AckedAt     *float64 `db:"acked_at" json:"ackedAt,omitempty"`
	FailedAt    *float64 `db:"failed_at" json:"failedAt,omitempty"`
	Error       string   `db:"error" json:"error,omitempty"`
	Response    RawJSON  `db:"response" json:"response,omitempty"`
	TraceID     string   `db:"trace_id" json:"traceId,omitempty"`
	Metadata    RawJSON  `db:"metadata" json:"metadata,omitempty"`
	// LeaseOwner and LeaseExpiresAt are set while dispatched under a poll
	// lease.
	LeaseOwner     string   `db:"lease_owner" json:"leaseOwner,omitempty"`
	LeaseExpiresAt *float64 `db:"lease_expires_at" json:"leaseExpiresAt,omitempty"`
	UpdatedAt      float64  `db:"updated_at" json:"updatedAt"`
	LastSeq        int64    `db:"last_seq" json:"lastSeq"`
}

// defaultMaxRetries is max_retries of a bus message that does not say.
const defaultMaxRetries = 5

// Apply folds ev into the message row. ev must be the next event of the
// row's nonce; on a zero row it must be the nonce's first event and carry
// details.bus (the caller decides whether a nonce has a message row at all).
func (m *MessageRow) Apply(ev Event) {
	us := ev.At.UnixMicro()
	secs := float64(us) / 1e6
	d := &ev.Details
	if m.Nonce == "" {
		m.Nonce = ev.Nonce
		m.Sender = ev.From
		m.Recipient = ev.To
		m.Intent = ev.IntentType
		m.CreatedAt = secs
		m.MaxRetries = defaultMaxRetries
		m.Payload = RawJSON("{}")
		if b := d.Bus; b != nil {
			m.ID = b.MessageID
			if len(b.Payload) > 0 {
				m.Payload = cloneRaw(b.Payload)
			}
			m.Priority = b.Priority
			if b.MaxRetries != 0 {
				m.MaxRetries = b.MaxRetries
			}
			m.TraceID = b.TraceID
			m.Metadata = cloneRaw(b.Metadata)
		}
	}
	m.Status = ev.State
	if d.RetryCount != nil {
		m.RetryCount = *d.RetryCount
	}
	if ev.State == Queued && d.NextRetryAt != 0 {
		v := float64(d.NextRetryAt) / 1000
		m.NextRetryAt = &v
	} else {
		m.NextRetryAt = nil
	}
	if ev.State == Dispatched {
		m.LeaseOwner = d.LeaseOwner
		if d.LeaseExpiresAt != 0 {
			v := float64(d.LeaseExpiresAt) / 1000
			m.LeaseExpiresAt = &v
		} else {
			m.LeaseExpiresAt = nil
		}
	} else {
		m.LeaseOwner = ""
		m.LeaseExpiresAt = nil
	}
	switch ev.State {
	case Delivered:
		v := secs
		m.DeliveredAt = &v
	case Acked:
		v := secs
		m.AckedAt = &v
	case Failed, DeadLetter:
		v := secs
		m.FailedAt = &v
	}
	switch ev.State {
	case Failed, DeadLetter, Queued:
		if d.Error != "" {
			m.Error = d.Error
		}
	}
	if (ev.State == Acked || ev.State == Failed) && len(d.Response) > 0 {
		m.Response = cloneRaw(d.Response)
	}
	m.UpdatedAt = secs
	m.LastSeq = ev.Seq
}

func cloneRaw(r []byte) RawJSON {
	if len(r) == 0 {
		return nil
	}
	return RawJSON(bytes.Clone(r))
}
