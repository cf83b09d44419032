package tracing

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// OwnerMesh marks the envelopes of a pipeline (package bus/mesh). Their
// canonical lifecycle is one nonce per envelope; the envelope's own status
// (pending, running, retrying, unknown, paused, succeeded, failed,
// canceled) lives in the
// beam_mesh projection, folded from details.mesh.
const OwnerMesh Owner = "mesh"

// MeshStatus is the status of a pipeline envelope. It is not a canonical
// lifecycle state: it is folded from the mesh steps of the envelope's
// events by AdvanceMeshStatus.
type MeshStatus string

// The envelope statuses.
const (
	MeshPending MeshStatus = "pending"
	MeshRunning MeshStatus = "running"
	// MeshRetrying: a failed attempt's retry is scheduled by the actor's
	// policy (ranked as running).
	MeshRetrying MeshStatus = "retrying"
	// MeshUnknown: the outcome of the hop in flight cannot be determined
	// (a restart interrupted it; it is dispatched again). Ranked as
	// running.
	MeshUnknown   MeshStatus = "unknown"
	MeshPaused    MeshStatus = "paused"
	MeshSucceeded MeshStatus = "succeeded"
	MeshFailed    MeshStatus = "failed"
	MeshCanceled  MeshStatus = "canceled"
)

// MeshStatuses lists every envelope status.
var MeshStatuses = []MeshStatus{MeshPending, MeshRunning, MeshRetrying, MeshUnknown, MeshPaused, MeshSucceeded, MeshFailed, MeshCanceled}

// Order returns the rank of s in the status ordering (pending 0, running,
// retrying and unknown 1, paused 2, terminal 3), or -1 for a status that is
// not one of MeshStatuses.
func (s MeshStatus) Order() int {
	switch s {
	case MeshPending:
		return 0
	case MeshRunning, MeshRetrying, MeshUnknown:
		return 1
	case MeshPaused:
		return 2
	case MeshSucceeded, MeshFailed, MeshCanceled:
		return 3
	}
	return -1
}

// Terminal reports whether s is succeeded, failed or canceled.
func (s MeshStatus) Terminal() bool { return s.Order() == 3 }

// AdvanceMeshStatus returns the status after an update to next from cur and
// whether the update was applied. Status never moves backwards; a terminal
// status is final; paused moves back to running only through an explicit
// resume; an update to the same non-terminal status is accepted (it may
// carry fresh progress). A dropped update leaves cur.
func AdvanceMeshStatus(cur, next MeshStatus, resume bool) (MeshStatus, bool) {
	if next.Order() < 0 {
		return cur, false
	}
	if cur == "" {
		return next, true
	}
	if cur.Terminal() {
		return cur, false
	}
	if cur == MeshPaused && next == MeshRunning {
		if resume {
			return next, true
		}
		return cur, false
	}
	if resume {
		// A resume of anything but a paused envelope is stale.
		return cur, false
	}
	if next.Order() < cur.Order() {
		return cur, false
	}
	return next, true
}

// The points of a hop's share of the route progress reported before it
// completes: the actor received it (the relay's delivered event) and the
// actor started processing it (a processing step), as the seed's sidecar
// reports them.
const (
	meshReceivedShare   = 0.10
	MeshProcessingShare = 0.15
)

// MeshHopProgress returns the route progress in percent when the current
// hop of envelope (a stored envelope: its route member) has done share of
// its part: (len(prev)+share) / (len(prev)+1+len(next)) * 100. An envelope
// whose route cannot be read gives 0.
func MeshHopProgress(envelope []byte, share float64) float64 {
	var e struct {
		Route struct {
			Prev []json.RawMessage `json:"prev"`
			Next []json.RawMessage `json:"next"`
		} `json:"route"`
	}
	if json.Unmarshal(envelope, &e) != nil {
		return 0
	}
	prev := float64(len(e.Route.Prev))
	return (prev + share) / (prev + 1 + float64(len(e.Route.Next))) * 100
}

// Mesh step kinds (details.mesh.kind).
const (
	MeshKindCreated  = "created"
	MeshKindDispatch = "dispatch"
	MeshKindHop      = "hop"
	MeshKindRetry    = "retry"
	MeshKindWait     = "wait"
	MeshKindPause    = "pause"
	MeshKindResume   = "resume"
	MeshKindCancel   = "cancel"
	MeshKindSink     = "sink"
	MeshKindFailed   = "failed"
	meshKindFanOut   = "fanout"
	// MeshKindProcessing: the hop's actor reports it started processing
	// the hop (progress only).
	MeshKindProcessing = "processing"
)

// MeshStep is what an event of a pipeline envelope carries in
// details.mesh. The beam_mesh fold reads only this (plus the event's state,
// time and seq).
type MeshStep struct {
	// Kind names the step (MeshKind*).
	Kind string `json:"kind"`
	// ID, ParentID, Creator and DeadlineAt (unix ms, 0 none) are set on the
	// created step.
	ID         string `json:"id,omitempty"`
	ParentID   string `json:"parentId,omitempty"`
	Creator    string `json:"creator,omitempty"`
	DeadlineAt int64  `json:"deadlineAt,omitempty"`
	// Status is the envelope status this step moves to ("" leaves it).
	Status MeshStatus `json:"status,omitempty"`
	// Envelope is the whole envelope after this step (route, headers,
	// payload), when the step changed it.
	Envelope json.RawMessage `json:"envelope,omitempty"`
	// Hop is the number of hops completed; Actor the actor of the current
	// hop; Attempt the attempt of the current hop.
	Hop     int    `json:"hop,omitempty"`
	Actor   string `json:"actor,omitempty"`
	Attempt int    `json:"attempt,omitempty"`
	// Progress is the route progress in percent after this step.
	Progress float64 `json:"progress,omitempty"`
	// FirstAttemptAt is when the current hop was first attempted (unix ms).
	FirstAttemptAt int64 `json:"firstAttemptAt,omitempty"`
	// NextAt is when the envelope is due for its next delivery (unix ms; 0
	// at once). Only meaningful while queued.
	NextAt int64 `json:"nextAt,omitempty"`
	// Reason and Error explain a failure, retry or reroute.
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
	// Sink and Sump say the envelope was recorded in x-sink (every
	// terminal envelope) and x-sump (dead letters).
	Sink bool `json:"sink,omitempty"`
	Sump bool `json:"sump,omitempty"`
	// Children are the ids of fan-out children created with this step.
	Children []string `json:"children,omitempty"`
}

// MeshRow is one row of the beam_mesh projection: the folded state of one
// pipeline envelope. Times are unix microseconds except the *At fields
// copied from steps, which are unix milliseconds.
type MeshRow struct {
	ID       string `db:"id" json:"id"`
	Nonce    string `db:"nonce" json:"nonce"`
	ParentID string `db:"parent_id" json:"parentId,omitempty"`
	Creator  string `db:"creator" json:"creator"`
	// State is the canonical lifecycle state of the envelope's nonce.
	State  State      `db:"state" json:"state"`
	Status MeshStatus `db:"status" json:"status"`
	Reason string     `db:"reason" json:"reason,omitempty"`
	Error  string     `db:"error" json:"error,omitempty"`
	// Progress never decreases.
	Progress       float64 `db:"progress" json:"progress"`
	Hop            int     `db:"hop" json:"hop"`
	Actor          string  `db:"actor" json:"actor,omitempty"`
	Attempt        int     `db:"attempt" json:"attempt"`
	Envelope       RawJSON `db:"envelope" json:"envelope"`
	DeadlineAt     int64   `db:"deadline_at" json:"deadlineAt,omitempty"`
	FirstAttemptAt int64   `db:"first_attempt_at" json:"firstAttemptAt,omitempty"`
	NextAt         int64   `db:"next_at" json:"nextAt,omitempty"`
	Sink           bool    `db:"sink" json:"sink"`
	Sump           bool    `db:"sump" json:"sump"`
	// Stale counts status updates the fold dropped.
	Stale       int    `db:"stale" json:"stale"`
	CreatedAt   int64  `db:"created_at" json:"createdAt"`
	UpdatedAt   int64  `db:"updated_at" json:"updatedAt"`
	CompletedAt *int64 `db:"completed_at" json:"completedAt,omitempty"`
	LastSeq     int64  `db:"last_seq" json:"lastSeq"`
}

// Apply folds ev into the row. ev must be the next event of the envelope's
// nonce; on a zero row it must be the nonce's first event. Events without
// details.mesh (the directory's delivered event) change only the state.
// An undecodable step is folded as an empty one, identically in the
// appender and in Rebuild.
func (m *MeshRow) Apply(ev Event) {
	us := ev.At.UnixMicro()
	st, _ := DecodeMeshStep(ev.Details.Mesh)
	if m.Nonce == "" {
		m.Nonce = ev.Nonce
		m.ID = st.ID
		if m.ID == "" {
			m.ID = ev.Nonce
		}
		m.ParentID = st.ParentID
		m.Creator = st.Creator
		if m.Creator == "" {
			m.Creator = ev.From
		}
		m.DeadlineAt = st.DeadlineAt
		m.CreatedAt = us
		m.Envelope = RawJSON("{}")
	}
	m.State = ev.State
	wasTerminal := m.Status.Terminal()
	if st.Kind == "" && ev.State == Delivered && m.Status.Order() == 1 {
		// The relay's delivered event: the actor received the hop.
		m.Progress = max(m.Progress, MeshHopProgress(m.Envelope, meshReceivedShare))
	}
	if st.Status != "" {
		next, ok := AdvanceMeshStatus(m.Status, st.Status, st.Kind == MeshKindResume)
		if ok {
			m.Status = next
		} else {
			m.Stale++
		}
	}
	if !wasTerminal && st.Kind != "" {
		if len(st.Envelope) > 0 {
			m.Envelope = cloneRaw(st.Envelope)
		}
		if st.Progress > m.Progress {
			m.Progress = st.Progress
		}
		if st.Hop > m.Hop {
			m.Hop = st.Hop
		}
		if st.Actor != "" {
			m.Actor = st.Actor
		}
		if st.Attempt != 0 || st.Kind == MeshKindHop || st.Kind == MeshKindWait {
			m.Attempt = st.Attempt
		}
		if st.FirstAttemptAt != 0 || st.Kind == MeshKindHop {
			m.FirstAttemptAt = st.FirstAttemptAt
		}
		if st.Reason != "" || st.Kind == MeshKindDispatch {
			// A dispatch ends any wait or retry: its reason is the one
			// to keep ("" for none).
			m.Reason = st.Reason
		}
		if st.Error != "" {
			m.Error = st.Error
		}
		m.Sink = m.Sink || st.Sink
		m.Sump = m.Sump || st.Sump
	}
	if ev.State == Queued {
		m.NextAt = st.NextAt
	} else {
		m.NextAt = 0
	}
	if m.Status.Terminal() && m.CompletedAt == nil {
		done := us
		m.CompletedAt = &done
	}
	m.UpdatedAt = us
	m.LastSeq = ev.Seq
}

const createMesh = `
CREATE TABLE IF NOT EXISTS beam_mesh(
  id               TEXT PRIMARY KEY,
  nonce            TEXT NOT NULL UNIQUE,
  parent_id        TEXT NOT NULL DEFAULT '',
  creator          TEXT NOT NULL,
  state            TEXT NOT NULL,
  status           TEXT NOT NULL,
  reason           TEXT NOT NULL DEFAULT '',
  error            TEXT NOT NULL DEFAULT '',
  progress         REAL NOT NULL DEFAULT 0,
  hop              INTEGER NOT NULL DEFAULT 0,
  actor            TEXT NOT NULL DEFAULT '',
  attempt          INTEGER NOT NULL DEFAULT 0,
  envelope         TEXT NOT NULL DEFAULT '{}',
  deadline_at      INTEGER NOT NULL DEFAULT 0,
  first_attempt_at INTEGER NOT NULL DEFAULT 0,
  next_at          INTEGER NOT NULL DEFAULT 0,
  sink             INTEGER NOT NULL DEFAULT 0,
  sump             INTEGER NOT NULL DEFAULT 0,
  stale            INTEGER NOT NULL DEFAULT 0,
  created_at       INTEGER NOT NULL,
  updated_at       INTEGER NOT NULL,
  completed_at     INTEGER,
  last_seq         INTEGER NOT NULL
);
`

const indexMesh = `
CREATE INDEX IF NOT EXISTS beam_mesh_creator_created ON beam_mesh(creator, created_at);
CREATE INDEX IF NOT EXISTS beam_mesh_creator_status ON beam_mesh(creator, status);
CREATE INDEX IF NOT EXISTS beam_mesh_status ON beam_mesh(status);
CREATE INDEX IF NOT EXISTS beam_mesh_parent ON beam_mesh(parent_id);
`

const meshCols = `id, nonce, parent_id, creator, state, status, reason, error, progress, hop, actor, attempt,
  envelope, deadline_at, first_attempt_at, next_at, sink, sump, stale, created_at, updated_at, completed_at, last_seq`

// upsertMesh inserts a row or, for an existing envelope, rewrites only the
// columns the fold changes after the first event (id, nonce, parent_id,
// creator, deadline_at and created_at never change), so SQLite leaves the
// creator and parent indexes alone; REPLACE deleted and reinserted the row
// and every index entry at each step.
const upsertMesh = `INSERT INTO beam_mesh(` + meshCols + `) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
  ON CONFLICT(id) DO UPDATE SET state=excluded.state, status=excluded.status, reason=excluded.reason,
  error=excluded.error, progress=excluded.progress, hop=excluded.hop, actor=excluded.actor, attempt=excluded.attempt,
  envelope=excluded.envelope, first_attempt_at=excluded.first_attempt_at, next_at=excluded.next_at,
  sink=excluded.sink, sump=excluded.sump, stale=excluded.stale, updated_at=excluded.updated_at,
  completed_at=excluded.completed_at, last_seq=excluded.last_seq`

func meshArgs(m *MeshRow) []any {
	return []any{m.ID, m.Nonce, m.ParentID, m.Creator, string(m.State), string(m.Status), m.Reason, m.Error,
		m.Progress, m.Hop, m.Actor, m.Attempt, string(m.Envelope), m.DeadlineAt, m.FirstAttemptAt, m.NextAt,
		m.Sink, m.Sump, m.Stale, m.CreatedAt, m.UpdatedAt, m.CompletedAt, m.LastSeq}
}

func scanMesh(s scanner, m *MeshRow) error {
	return s.Scan(&m.ID, &m.Nonce, &m.ParentID, &m.Creator, &m.State, &m.Status, &m.Reason, &m.Error,
		&m.Progress, &m.Hop, &m.Actor, &m.Attempt, &m.Envelope, &m.DeadlineAt, &m.FirstAttemptAt, &m.NextAt,
		&m.Sink, &m.Sump, &m.Stale, &m.CreatedAt, &m.UpdatedAt, &m.CompletedAt, &m.LastSeq)
}

const selectMesh = `SELECT ` + meshCols + ` FROM beam_mesh WHERE nonce = ?`

// readMesh returns the beam_mesh row of nonce, or nil when it has none
// (prepared statement of the writer's transaction).
func readMesh(ts *txStmts, nonce string) (*MeshRow, error) {
	m := &MeshRow{}
	err := scanMesh(ts.get(stSelMesh).QueryRow(nonce), m)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read beam_mesh %q: %w", nonce, err)
	}
	return m, nil
}

// writeMesh upserts m.
func writeMesh(ts *txStmts, m *MeshRow) error {
	if _, err := ts.get(stUpsMesh).Exec(meshArgs(m)...); err != nil {
		return fmt.Errorf("write beam_mesh %q: %w", m.Nonce, err)
	}
	return nil
}

// MeshQuery selects beam_mesh rows. Zero fields do not filter.
type MeshQuery struct {
	// Creator keeps the envelopes created by this agent.
	Creator string
	// Statuses keeps envelopes in one of these statuses.
	Statuses []MeshStatus
	// ParentID keeps the fan-out children of this envelope.
	ParentID string
	// Sump keeps only dead letters (recorded in x-sump).
	Sump bool
	// Limit and Offset page the result, newest first (Limit 0: 100).
	Limit, Offset int
}

func (q *MeshQuery) where() (string, []any) {
	var w whereClause
	w.eq("creator", q.Creator)
	w.eq("parent_id", q.ParentID)
	if len(q.Statuses) > 0 {
		ph := make([]string, len(q.Statuses))
		for i, s := range q.Statuses {
			ph[i] = "?"
			w.args = append(w.args, string(s))
		}
		w.add(`status IN (` + strings.Join(ph, ",") + `)`)
	}
	if q.Sump {
		w.add(`sump = 1`)
	}
	return w.String(), w.args
}

// MeshEnvelopes returns the envelopes q selects, newest first, and how many
// match without paging.
func (l *Log) MeshEnvelopes(ctx context.Context, q MeshQuery) ([]MeshRow, int64, error) {
	if err := l.sync(ctx); err != nil {
		return nil, 0, err
	}
	where, args := q.where()
	var total int64
	if err := l.rdb.QueryRowContext(ctx, `SELECT COUNT(*) FROM beam_mesh`+where, args...).Scan(&total); err != nil {
		return nil, 0, fmt.Errorf("count envelopes: %w", err)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+meshCols+` FROM beam_mesh`+where+
		` ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?`, append(args, limit, max(q.Offset, 0))...)
	out, err := collectRows(rows, err, "list envelopes", scanMesh)
	return out, total, err
}

// MeshEnvelope returns the envelope with this id: from the rows kept in
// memory (meshLive) when it is there, otherwise from beam_mesh after the
// read barrier.
func (l *Log) MeshEnvelope(ctx context.Context, id string) (MeshRow, bool, error) {
	if m, ok := l.meshLive.get(id); ok {
		return m, true, nil
	}
	if err := l.sync(ctx); err != nil {
		return MeshRow{}, false, err
	}
	var m MeshRow
	err := scanMesh(l.reads.meshByID.QueryRowContext(ctx, id), &m)
	if errors.Is(err, sql.ErrNoRows) {
		return MeshRow{}, false, nil
	}
	if err != nil {
		return MeshRow{}, false, fmt.Errorf("read envelope %q: %w", id, err)
	}
	return m, true, nil
}

// MeshEnvelopeTrace returns the envelope with this id together with its
// trace (Trace: at most maxTraceEvents events), both as of the same point of
// the log. The row is read first and the trace after it, so the trace may
// end with events committed in between (the writer updates the rows kept in
// memory just after the commit that made the events readable); those are
// folded into the returned row, which is then the projection at the trace's
// last event. A reader that shows a row with the hops of its trace uses
// this rather than MeshEnvelope and Trace one after the other.
func (l *Log) MeshEnvelopeTrace(ctx context.Context, id string) (MeshRow, []Event, bool, error) {
	row, ok, err := l.MeshEnvelope(ctx, id)
	if err != nil || !ok {
		return row, nil, ok, err
	}
	trace, err := l.Trace(ctx, row.Nonce)
	if err != nil {
		return MeshRow{}, nil, false, err
	}
	return meshAt(row, trace), trace, true, nil
}

// meshAt returns row with the events of trace after row.LastSeq folded in:
// the row as of the trace's last event.
func meshAt(row MeshRow, trace []Event) MeshRow {
	for i := range trace {
		if trace[i].Seq > row.LastSeq {
			row.Apply(trace[i])
		}
	}
	return row
}

// MeshOpen returns the ids of envelopes whose status is not terminal, for
// recovery and the scheduler: due says only queued ones due at nowMs (and
// not paused), otherwise every open one. limit 0 means no limit.
func (l *Log) MeshOpen(ctx context.Context, due bool, nowMs int64, limit int) ([]MeshRow, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	if due && limit > 0 {
		rows, err := l.reads.meshDue.QueryContext(ctx, nowMs, limit)
		return collectRows(rows, err, "due envelopes", scanMesh)
	}
	q := `SELECT ` + meshCols + ` FROM beam_mesh WHERE status IN ` + meshOpenList
	var args []any
	if due {
		q += ` AND state = 'queued' AND status != 'paused' AND next_at <= ?`
		args = append(args, nowMs)
	}
	q += ` ORDER BY created_at`
	if limit > 0 {
		q += ` LIMIT ?`
		args = append(args, limit)
	}
	rows, err := l.rdb.QueryContext(ctx, q, args...)
	return collectRows(rows, err, "open envelopes", scanMesh)
}

const (
	selectMeshByID = `SELECT ` + meshCols + ` FROM beam_mesh WHERE id = ?`
	selectMeshDue  = `SELECT ` + meshCols + ` FROM beam_mesh WHERE status IN ` + meshOpenList + `
	  AND state = 'queued' AND status != 'paused' AND next_at <= ? ORDER BY created_at LIMIT ?`
	selectMeshExpired = `SELECT id FROM beam_mesh WHERE status IN ` + meshOpenList + `
	  AND deadline_at > 0 AND deadline_at <= ? ORDER BY deadline_at LIMIT ?`
)

// MeshOpenCount counts the open (pending, running or paused) envelopes
// of creator, fan-out children included, counting no further than limit.
func (l *Log) MeshOpenCount(ctx context.Context, creator string, limit int) (int, error) {
	if err := l.sync(ctx); err != nil {
		return 0, err
	}
	var n int
	if err := l.rdb.QueryRowContext(ctx, `SELECT COUNT(*) FROM (SELECT 1 FROM beam_mesh WHERE creator = ?
	  AND status IN `+meshOpenList+` LIMIT ?)`, creator, max(limit, 1)).Scan(&n); err != nil {
		return 0, fmt.Errorf("count open envelopes of %s: %w", creator, err)
	}
	return n, nil
}

// MeshExpired returns open envelopes whose deadline (unix ms) is at or
// before nowMs.
func (l *Log) MeshExpired(ctx context.Context, nowMs int64, limit int) ([]string, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	rows, err := l.reads.meshExpired.QueryContext(ctx, nowMs, max(limit, 1))
	if err != nil {
		return nil, fmt.Errorf("expired envelopes: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, fmt.Errorf("scan envelope id: %w", err)
		}
		out = append(out, id)
	}
	return out, rows.Err()
}

// MeshRows returns every beam_mesh row in id order (for tests and replay
// checks).
func (l *Log) MeshRows(ctx context.Context) ([]MeshRow, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	rows, err := l.rdb.QueryContext(ctx, `SELECT `+meshCols+` FROM beam_mesh ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("read beam_mesh: %w", err)
	}
	defer rows.Close()
	var out []MeshRow
	for rows.Next() {
		var m MeshRow
		if err := scanMesh(rows, &m); err != nil {
			return nil, fmt.Errorf("scan envelope: %w", err)
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// loadMeshCache attaches the beam_mesh rows of cached open nonces, so that
// the writer folds their next events into the projection. The open nonces
// come from intent_log's status index (beam_mesh.state, the same state,
// has no index of its own), so a start does not read every envelope ever
// finished.
func loadMeshCache(ctx context.Context, q queryer, cache map[string]*entry) error {
	rows, err := q.QueryContext(ctx, `SELECT `+meshCols+` FROM beam_mesh WHERE nonce IN (SELECT nonce FROM intent_log WHERE status IN `+openList+`)`)
	if err != nil {
		return fmt.Errorf("load mesh cache: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		m := &MeshRow{}
		if err := scanMesh(rows, m); err != nil {
			return fmt.Errorf("load mesh cache: %w", err)
		}
		if e := cache[m.Nonce]; e != nil {
			e.mesh = m
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load mesh cache: %w", err)
	}
	return nil
}

// meshOpenList is the SQL list of the statuses that are not terminal.
const meshOpenList = `('pending','running','retrying','unknown','paused')`
