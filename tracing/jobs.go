package tracing

import (
	"bytes"
	"encoding/json"
)

// JobDetails is what an event of an Intent Protocol job (owner jobs) records
// about the job, under details.job. Every field is optional; which ones an
// event carries depends on Op. Times are unix milliseconds.
type JobDetails struct {
	// Op names the protocol operation that produced the event: publish,
	// claim, accept, extend, fulfill, fail, expire, cancel, retry, purge.
	Op string `json:"op"`
	// The publisher-controlled fields, on the publish event.
	ID                 string          `json:"id,omitempty"`
	Namespace          string          `json:"namespace,omitempty"`
	Goal               string          `json:"goal,omitempty"`
	Payload            json.RawMessage `json:"payload,omitempty"`
	Priority           *int            `json:"priority,omitempty"`
	Visibility         string          `json:"visibility,omitempty"`
	TargetWorker       string          `json:"targetWorker,omitempty"`
	RequiredCapability string          `json:"requiredCapability,omitempty"`
	MaxAttempts        int             `json:"maxAttempts,omitempty"`
	BackoffBase        float64         `json:"backoffBase,omitempty"`
	ExpiresAt          int64           `json:"expiresAt,omitempty"`
	// Publisher and ClaimedBy identify API keys by a digest, never by the
	// key itself.
	Publisher string `json:"publisher,omitempty"`
	ClaimedBy string `json:"claimedBy,omitempty"`
	// RunAt is when an open job becomes claimable (publish and requeue).
	RunAt int64 `json:"runAt,omitempty"`
	// TokenHash is the SHA-256 (hex) of the claim token handed to the
	// worker; the token itself is never recorded.
	TokenHash string `json:"tokenHash,omitempty"`
	// LeaseExpiresAt is the end of the claim's lease (claim, extend).
	LeaseExpiresAt int64 `json:"leaseExpiresAt,omitempty"`
	// Attempts is claim_attempts after the event.
	Attempts *int `json:"attempts,omitempty"`
	// Error is the job's last error (fail, expire, cancel).
	Error string `json:"error,omitempty"`
	// Result and ResultType are the stored result of a fulfill.
	Result     json.RawMessage `json:"result,omitempty"`
	ResultType string          `json:"resultType,omitempty"`
	// Reason says why a job went dead.
	Reason string `json:"reason,omitempty"`
	// SignedNonce is the key digest and nonce ("digest:nonce") of the
	// signed request that made the change, so that the job bus refuses its
	// replay after a restart.
	SignedNonce string `json:"signedNonce,omitempty"`
}

// The job statuses of the Intent Protocol, as JobRow.Status holds them.
const (
	JobOpen      = "open"
	JobClaimed   = "claimed"
	JobFulfilled = "fulfilled"
	JobDead      = "dead"
)

// JobStatusOf maps a canonical state to the job status it stands for:
// received and queued are open, dispatched and delivered claimed, acked
// fulfilled, dead_letter and failed dead.
func JobStatusOf(s State) string {
	switch s {
	case Received, Validated, Queued:
		return JobOpen
	case Dispatched, Delivered:
		return JobClaimed
	case Acked:
		return JobFulfilled
	default:
		return JobDead
	}
}

// JobRow is the folded state of one Intent Protocol job: the projection the
// job bus serves from. Times are unix milliseconds (0: unset). The fold is
// Apply, a pure function of the job's events in seq order, so a refold of
// the log gives the same row.
type JobRow struct {
	ID                 string          `json:"id"`
	Nonce              string          `json:"nonce"`
	Namespace          string          `json:"namespace"`
	Goal               string          `json:"goal"`
	Payload            json.RawMessage `json:"payload"`
	Status             string          `json:"status"`
	State              State           `json:"state"`
	Priority           int             `json:"priority"`
	Visibility         string          `json:"visibility"`
	TargetWorker       string          `json:"targetWorker,omitempty"`
	RequiredCapability string          `json:"requiredCapability,omitempty"`
	Publisher          string          `json:"publisher"`
	ClaimedBy          string          `json:"claimedBy,omitempty"`
	TokenHash          string          `json:"-"`
	ClaimAttempts      int             `json:"claimAttempts"`
	MaxAttempts        int             `json:"maxAttempts"`
	BackoffBase        float64         `json:"backoffBase"`
	CreatedAt          int64           `json:"createdAt"`
	ExpiresAt          int64           `json:"expiresAt"`
	RunAt              int64           `json:"runAt"`
	ClaimedAt          int64           `json:"claimedAt,omitempty"`
	ClaimExpiresAt     int64           `json:"claimExpiresAt,omitempty"`
	LastError          string          `json:"lastError,omitempty"`
	FailedAt           int64           `json:"failedAt,omitempty"`
	Result             json.RawMessage `json:"result,omitempty"`
	ResultType         string          `json:"resultType,omitempty"`
	CompletedAt        int64           `json:"completedAt,omitempty"`
	DeadReason         string          `json:"deadReason,omitempty"`
	DeadAt             int64           `json:"deadAt,omitempty"`
	// Purged is set when an admin purge removed the job.
	Purged    bool  `json:"purged,omitempty"`
	UpdatedAt int64 `json:"updatedAt"`
	FirstSeq  int64 `json:"firstSeq"`
	LastSeq   int64 `json:"lastSeq"`
}

// Apply folds ev, the next event of the job's nonce, into the row; on a zero
// row ev must be the publish event. Apply does not validate the transition
// (the job bus does, before it appends) and never shares memory with ev.
func (r *JobRow) Apply(ev Event) {
	j := ev.Details.Job
	if j == nil {
		j = &JobDetails{}
	}
	ms := ev.At.UnixMilli()
	if r.ID == "" {
		r.ID = j.ID
		r.Nonce = ev.Nonce
		r.Namespace = j.Namespace
		r.Goal = j.Goal
		r.Payload = bytes.Clone(j.Payload)
		if j.Priority != nil {
			r.Priority = *j.Priority
		}
		r.Visibility = j.Visibility
		r.TargetWorker = j.TargetWorker
		r.RequiredCapability = j.RequiredCapability
		r.Publisher = j.Publisher
		r.MaxAttempts = j.MaxAttempts
		r.BackoffBase = j.BackoffBase
		r.CreatedAt = ms
		r.ExpiresAt = j.ExpiresAt
		r.RunAt = j.RunAt
		r.FirstSeq = ev.Seq
	}
	r.Status = JobStatusOf(ev.State)
	r.State = ev.State
	switch ev.State {
	case Queued:
		if j.RunAt != 0 {
			r.RunAt = j.RunAt
		}
		r.TokenHash, r.ClaimExpiresAt = "", 0
		if j.Op == "fail" || j.Op == "expire" {
			r.FailedAt = ms
		}
		if j.Op == "retry" {
			r.Result, r.ResultType, r.CompletedAt = nil, "", 0
			r.LastError, r.FailedAt, r.DeadReason, r.DeadAt = "", 0, "", 0
			r.TokenHash, r.ClaimedAt = "", 0
			r.ClaimAttempts = 0
		}
	case Dispatched:
		r.ClaimedBy = j.ClaimedBy
		r.TokenHash = j.TokenHash
		r.ClaimedAt = ms
		r.ClaimExpiresAt = j.LeaseExpiresAt
	case Delivered:
		if j.LeaseExpiresAt != 0 {
			r.ClaimExpiresAt = j.LeaseExpiresAt
		}
	case Acked:
		r.Result = bytes.Clone(j.Result)
		r.ResultType = j.ResultType
		r.CompletedAt = ms
		r.TokenHash, r.ClaimExpiresAt = "", 0
	case DeadLetter, Failed:
		r.DeadReason = j.Reason
		r.DeadAt = ms
		r.TokenHash, r.ClaimExpiresAt = "", 0
		if j.Op == "fail" || j.Op == "expire" {
			r.FailedAt = ms
		}
		if j.Op == "purge" {
			r.Purged = true
		}
	}
	if j.Error != "" {
		r.LastError = j.Error
	}
	if j.Attempts != nil {
		r.ClaimAttempts = *j.Attempts
	}
	r.UpdatedAt = ms
	r.LastSeq = ev.Seq
}
