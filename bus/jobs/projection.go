package jobs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
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
	Key string
	At  int64
}

// Apply folds ev as loadJobs did when it read the log: events without
// details.job are not the job's, a job starts with its received event.
func (r *jobRow) Apply(ev tracing.Event) {
	j := ev.Details.Job
	if j == nil || !strings.HasPrefix(ev.Nonce, noncePrefix) {
		return
	}
	at := ev.At.UnixMilli()
	keep := at - (2 * signatureWindow).Milliseconds()
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

// rowFormat is the first byte of a stored jobRow.
const rowFormat = 1

// MarshalBinary implements tracing.ProjectedRow: a compact binary form
// (the row is written at every write of the job's projection rows, so
// reflection-based JSON would cost the writer more than the SQL).
func (r *jobRow) MarshalBinary() ([]byte, error) {
	j := &r.row
	b := make([]byte, 0, 256+len(j.Payload)+len(j.Result))
	b = append(b, rowFormat)
	for _, s := range [...]string{j.ID, j.Nonce, j.Namespace, j.Goal, j.Status, string(j.State), j.Visibility,
		j.TargetWorker, j.RequiredCapability, j.Publisher, j.ClaimedBy, j.TokenHash, j.LastError, j.ResultType,
		j.DeadReason} {
		b = putBytes(b, []byte(s), false)
	}
	b = putBytes(b, j.Payload, true)
	b = putBytes(b, j.Result, true)
	for _, v := range [...]int64{int64(j.Priority), int64(j.ClaimAttempts), int64(j.MaxAttempts), j.CreatedAt,
		j.ExpiresAt, j.RunAt, j.ClaimedAt, j.ClaimExpiresAt, j.FailedAt, j.CompletedAt, j.DeadAt, j.UpdatedAt,
		j.FirstSeq, j.LastSeq} {
		b = binary.AppendVarint(b, v)
	}
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(j.BackoffBase))
	purged := byte(0)
	if j.Purged {
		purged = 1
	}
	b = append(b, purged)
	b = binary.AppendUvarint(b, uint64(len(r.signed)))
	for _, u := range r.signed {
		b = putBytes(b, []byte(u.Key), false)
		b = binary.AppendVarint(b, u.At)
	}
	return b, nil
}

// putBytes appends v with its length; nullable keeps nil apart from
// empty (length+1, 0 for nil).
func putBytes(b, v []byte, nullable bool) []byte {
	n := uint64(len(v))
	if nullable {
		if v == nil {
			return binary.AppendUvarint(b, 0)
		}
		n++
	}
	return append(binary.AppendUvarint(b, n), v...)
}

// rowReader reads a stored jobRow; err is the first failure.
type rowReader struct {
	b   []byte
	err error
}

var errShortRow = errors.New("job row: truncated")

func (rd *rowReader) uvarint() uint64 {
	v, n := binary.Uvarint(rd.b)
	if n <= 0 {
		rd.fail()
		return 0
	}
	rd.b = rd.b[n:]
	return v
}

func (rd *rowReader) varint() int64 {
	v, n := binary.Varint(rd.b)
	if n <= 0 {
		rd.fail()
		return 0
	}
	rd.b = rd.b[n:]
	return v
}

func (rd *rowReader) bytes(nullable bool) []byte {
	n := rd.uvarint()
	if nullable {
		if n == 0 {
			return nil
		}
		n--
	}
	if rd.err != nil || n > uint64(len(rd.b)) {
		rd.fail()
		return nil
	}
	v := bytes.Clone(rd.b[:n])
	if v == nil {
		v = []byte{}
	}
	rd.b = rd.b[n:]
	return v
}

func (rd *rowReader) str() string { return string(rd.bytes(false)) }

func (rd *rowReader) fail() {
	if rd.err == nil {
		rd.err = errShortRow
	}
	rd.b = nil
}

// UnmarshalBinary implements tracing.ProjectedRow.
func (r *jobRow) UnmarshalBinary(b []byte) error {
	if len(b) == 0 || b[0] != rowFormat {
		return errors.New("job row: unknown format")
	}
	rd := &rowReader{b: b[1:]}
	var j tracing.JobRow
	for _, s := range [...]*string{&j.ID, &j.Nonce, &j.Namespace, &j.Goal, &j.Status, (*string)(&j.State),
		&j.Visibility, &j.TargetWorker, &j.RequiredCapability, &j.Publisher, &j.ClaimedBy, &j.TokenHash,
		&j.LastError, &j.ResultType, &j.DeadReason} {
		*s = rd.str()
	}
	j.Payload = rd.bytes(true)
	j.Result = rd.bytes(true)
	var prio, attempts, maxAttempts int64
	for _, v := range [...]*int64{&prio, &attempts, &maxAttempts, &j.CreatedAt, &j.ExpiresAt, &j.RunAt,
		&j.ClaimedAt, &j.ClaimExpiresAt, &j.FailedAt, &j.CompletedAt, &j.DeadAt, &j.UpdatedAt, &j.FirstSeq,
		&j.LastSeq} {
		*v = rd.varint()
	}
	j.Priority, j.ClaimAttempts, j.MaxAttempts = int(prio), int(attempts), int(maxAttempts)
	if len(rd.b) < 9 {
		rd.fail()
	} else {
		j.BackoffBase = math.Float64frombits(binary.LittleEndian.Uint64(rd.b))
		j.Purged = rd.b[8] == 1
		rd.b = rd.b[9:]
	}
	n := rd.uvarint()
	if n > uint64(len(rd.b)) {
		rd.fail()
	}
	var signed []signedUse
	for i := uint64(0); i < n && rd.err == nil; i++ {
		signed = append(signed, signedUse{Key: rd.str(), At: rd.varint()})
	}
	if rd.err == nil && len(rd.b) != 0 {
		rd.err = errors.New("job row: trailing bytes")
	}
	if rd.err != nil {
		return rd.err
	}
	r.row, r.signed = j, signed
	return nil
}

// usedAt returns when the signed use was recorded.
func (u signedUse) usedAt() time.Time { return time.UnixMilli(u.At) }
