package jobs

import (
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/beamdir/beam/tracing"
)

// projection is the job bus's table in the log (beam_jobs): one row per
// job, folded by the log's writer from the job's events, kept current by
// the log's catch-up on open. The service loads its jobs from it at start
// (loadJobs) instead of reading the log.
var projection = &tracing.Projection{Table: "beam_jobs", New: func() tracing.ProjectedRow { return &jobRow{} }}

// jobRow is a row of projection: the folded job, and the signed nonces of
// the job's requests young enough to be replayed (so that a replay stays
// refused after a restart).
type jobRow struct {
	row    tracing.JobRow
	signed []signedUse
}

// signedUse is a signed request's nonce ("digest:nonce") and when its
// event was written (unix ms).
type signedUse struct {
	Key string `json:"k"`
	At  int64  `json:"at"`
}

// storedJob is the stored form of a jobRow (JobRow leaves the token hash
// out of its JSON).
type storedJob struct {
	Row       tracing.JobRow `json:"row"`
	TokenHash string         `json:"tokenHash,omitempty"`
	Signed    []signedUse    `json:"signed,omitempty"`
}

// Apply folds ev as loadJobs did when it read the log: events without
// details.job are not the job's, a job starts with its received event.
func (r *jobRow) Apply(ev tracing.Event) {
	j := ev.Details.Job
	if j == nil || !strings.HasPrefix(ev.Nonce, noncePrefix) {
		return
	}
	at := ev.At.UnixMilli()
	keep := at - (2 * SignatureWindow).Milliseconds()
	i := 0
	for i < len(r.signed) && r.signed[i].At <= keep {
		i++
	}
	r.signed = r.signed[i:]
	if j.SignedNonce != "" {
		r.signed = append(slices.Clip(r.signed), signedUse{Key: j.SignedNonce, At: at})
	}
	if r.row.ID == "" && ev.State != tracing.Received {
		return
	}
	r.row.Apply(ev)
}

// Clone implements tracing.ProjectedRow.
func (r *jobRow) Clone() tracing.ProjectedRow {
	c := *r
	c.signed = slices.Clip(r.signed)
	return &c
}

// MarshalBinary implements tracing.ProjectedRow.
func (r *jobRow) MarshalBinary() ([]byte, error) {
	return json.Marshal(storedJob{Row: r.row, TokenHash: r.row.TokenHash, Signed: r.signed})
}

// UnmarshalBinary implements tracing.ProjectedRow.
func (r *jobRow) UnmarshalBinary(b []byte) error {
	var s storedJob
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	s.Row.TokenHash = s.TokenHash
	r.row, r.signed = s.Row, s.Signed
	return nil
}

// usedAt returns when the signed use was recorded.
func (u signedUse) usedAt() time.Time { return time.UnixMilli(u.At) }
