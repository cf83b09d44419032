package federation

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/tracing"
)

// OutboxState is the processing state of an outbox row (seed 001).
type OutboxState string

// The outbox states.
const (
	Pending   OutboxState = "PENDING"
	Claimed   OutboxState = "CLAIMED"
	Published OutboxState = "PUBLISHED"
	Dead      OutboxState = "DEAD"
)

// OutboxStates lists every outbox state.
var OutboxStates = []OutboxState{Pending, Claimed, Published, Dead}

// outboxTransitions is seed 001's table; "" stands for a row not yet
// written. Nothing else may happen.
var outboxTransitions = map[OutboxState][]OutboxState{
	"":        {Pending},
	Pending:   {Claimed},
	Claimed:   {Published, Pending, Dead},
	Published: {Pending}, // replay
	Dead:      {Pending}, // replay
}

// CanTransitionOutbox reports whether seed 001 allows an outbox row to move
// from one state to another.
func CanTransitionOutbox(from, to OutboxState) bool {
	return slices.Contains(outboxTransitions[from], to)
}

// ErrClaimLost is returned when a relay finalizes a row whose claim is no
// longer its own (it expired and was reaped, possibly claimed again).
var ErrClaimLost = errors.New("outbox: claim is no longer held")

// ErrRowNotFound is returned for an outbox id that does not exist.
var ErrRowNotFound = errors.New("outbox: no such row")

// OutboxTransitionError rejects a transition seed 001 forbids.
type OutboxTransitionError struct {
	ID       int64
	From, To OutboxState
}

func (e *OutboxTransitionError) Error() string {
	return fmt.Sprintf("outbox row %d: transition %s → %s is not allowed", e.ID, e.From, e.To)
}

const createOutbox = `
CREATE TABLE IF NOT EXISTS federation_outbox(
  id           INTEGER PRIMARY KEY AUTOINCREMENT,
  event_id     TEXT NOT NULL UNIQUE,
  kind         TEXT NOT NULL,
  peer         TEXT NOT NULL,
  nonce        TEXT NOT NULL DEFAULT '',
  owner        TEXT NOT NULL DEFAULT '',
  payload      BLOB NOT NULL,
  status       TEXT NOT NULL,
  attempts     INTEGER NOT NULL DEFAULT 0,
  max_attempts INTEGER NOT NULL DEFAULT 0,
  available_at INTEGER NOT NULL,
  deadline     INTEGER,
  claimed_at   INTEGER,
  claimed_by   TEXT,
  claim_token  TEXT,
  published_at INTEGER,
  last_error   TEXT NOT NULL DEFAULT '',
  created_at   INTEGER NOT NULL,
  updated_at   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS federation_outbox_pending ON federation_outbox(status, available_at, id);
CREATE INDEX IF NOT EXISTS federation_outbox_nonce ON federation_outbox(nonce);
`

// NewRow is an outbox row to write in the transaction of the event that
// needs the publish.
type NewRow struct {
	// EventID is unique per row; the receiver deduplicates on it.
	EventID string
	// Kind is the message kind the row publishes.
	Kind string
	// Peer is the target directory's domain.
	Peer string
	// Nonce is the intent the row belongs to.
	Nonce string
	// Owner is the intent's owner (directory or bus).
	Owner tracing.Owner
	// Payload is what the relay needs to build the message.
	Payload []byte
	// MaxAttempts is the termination condition (0: unlimited).
	MaxAttempts int
	// AvailableAt is when the row may first be claimed (zero: now).
	AvailableAt time.Time
	// Deadline, when set, is the other termination condition: a row not
	// published by then is dead.
	Deadline time.Time
}

// Row is an outbox row.
type Row struct {
	ID          int64       `json:"id"`
	EventID     string      `json:"eventId"`
	Kind        string      `json:"kind"`
	Peer        string      `json:"peer"`
	Nonce       string      `json:"nonce"`
	Owner       string      `json:"owner"`
	Payload     []byte      `json:"-"`
	State       OutboxState `json:"state"`
	Attempts    int         `json:"attempts"`
	MaxAttempts int         `json:"maxAttempts"`
	AvailableAt time.Time   `json:"availableAt"`
	Deadline    time.Time   `json:"deadline,omitzero"`
	ClaimedAt   time.Time   `json:"claimedAt,omitzero"`
	ClaimedBy   string      `json:"claimedBy,omitempty"`
	PublishedAt time.Time   `json:"publishedAt,omitzero"`
	LastError   string      `json:"lastError,omitempty"`
	CreatedAt   time.Time   `json:"createdAt"`
	UpdatedAt   time.Time   `json:"updatedAt"`
	token       string
}

// Claim is a row a relay holds. Finalizing it checks that the claim is
// still the relay's (claimed_by, claimed_at and a per-claim token).
type Claim struct {
	Row
}

const rowColumns = `id, event_id, kind, peer, nonce, owner, payload, status, attempts, max_attempts, available_at,
  deadline, claimed_at, claimed_by, claim_token, published_at, last_error, created_at, updated_at`

func scanRow(s interface{ Scan(...any) error }) (Row, error) {
	var r Row
	var status string
	var avail, created, updated int64
	var deadline, claimedAt, publishedAt sql.NullInt64
	var claimedBy, token sql.NullString
	if err := s.Scan(&r.ID, &r.EventID, &r.Kind, &r.Peer, &r.Nonce, &r.Owner, &r.Payload, &status, &r.Attempts,
		&r.MaxAttempts, &avail, &deadline, &claimedAt, &claimedBy, &token, &publishedAt, &r.LastError, &created, &updated); err != nil {
		return Row{}, err
	}
	r.State = OutboxState(status)
	r.AvailableAt = time.UnixMicro(avail).UTC()
	r.CreatedAt = time.UnixMicro(created).UTC()
	r.UpdatedAt = time.UnixMicro(updated).UTC()
	if deadline.Valid {
		r.Deadline = time.UnixMicro(deadline.Int64).UTC()
	}
	if claimedAt.Valid {
		r.ClaimedAt = time.UnixMicro(claimedAt.Int64).UTC()
	}
	if publishedAt.Valid {
		r.PublishedAt = time.UnixMicro(publishedAt.Int64).UTC()
	}
	r.ClaimedBy, r.token = claimedBy.String, token.String
	return r, nil
}

// Outbox is the transactional outbox of federation publishes, a table in
// the log's SQLite file written only through tracing.Log.Do.
type Outbox struct {
	log   *tracing.Log
	clock func() time.Time
}

// OpenOutbox creates the outbox tables if needed.
func OpenOutbox(ctx context.Context, log *tracing.Log, clock func() time.Time) (*Outbox, error) {
	if clock == nil {
		clock = time.Now
	}
	if _, err := log.Do(ctx, func(tx *sqlx.Tx) error {
		for _, q := range []string{createOutbox, createStore} {
			if _, err := tx.Exec(q); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("open outbox: %w", err)
	}
	return &Outbox{log: log, clock: clock}, nil
}

func us(t time.Time) int64 { return t.UnixMicro() }

func nullUs(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMicro()
}

// InsertTx writes a PENDING row inside a Log.Do transaction.
func (o *Outbox) InsertTx(tx *sqlx.Tx, r NewRow) error {
	if r.EventID == "" || r.Kind == "" || r.Peer == "" {
		return errors.New("outbox insert: event id, kind and peer are required")
	}
	now := o.clock()
	avail := r.AvailableAt
	if avail.IsZero() {
		avail = now
	}
	if _, err := tx.Exec(`INSERT INTO federation_outbox(event_id, kind, peer, nonce, owner, payload, status, attempts,
  max_attempts, available_at, deadline, created_at, updated_at) VALUES (?,?,?,?,?,?,?,0,?,?,?,?,?)`,
		r.EventID, r.Kind, r.Peer, r.Nonce, string(r.Owner), r.Payload, string(Pending), r.MaxAttempts,
		us(avail), nullUs(r.Deadline), us(now), us(now)); err != nil {
		return fmt.Errorf("outbox insert %s: %w", r.EventID, err)
	}
	return nil
}

// Enqueue writes events and a PENDING row in one transaction.
func (o *Outbox) Enqueue(ctx context.Context, r NewRow, events ...tracing.Event) error {
	if _, err := o.log.Do(ctx, func(tx *sqlx.Tx) error { return o.InsertTx(tx, r) }, events...); err != nil {
		return fmt.Errorf("enqueue %s: %w", r.EventID, err)
	}
	return nil
}

// Claim moves up to limit PENDING rows whose available_at has come to
// CLAIMED by relayID (claimed_at now, a fresh claim token), oldest first.
func (o *Outbox) Claim(ctx context.Context, relayID string, limit int) ([]Claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	if relayID == "" {
		return nil, errors.New("outbox claim: empty relay id")
	}
	var out []Claim
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		out = out[:0]
		now := us(o.clock())
		rows, err := tx.Query(`UPDATE federation_outbox
   SET status = ?, claimed_at = ?, claimed_by = ?, claim_token = lower(hex(randomblob(8))), updated_at = ?
 WHERE id IN (SELECT id FROM federation_outbox WHERE status = ? AND available_at <= ?
               ORDER BY available_at, id LIMIT ?)
 RETURNING `+rowColumns,
			string(Claimed), now, relayID, now, string(Pending), now, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			out = append(out, Claim{r})
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("outbox claim: %w", err)
	}
	slices.SortFunc(out, func(a, b Claim) int {
		if c := a.AvailableAt.Compare(b.AvailableAt); c != 0 {
			return c
		}
		return int(a.ID - b.ID)
	})
	return out, nil
}

// fenced runs an update of c's row that must find it CLAIMED by c; it
// tells a lost claim from a forbidden transition.
func (o *Outbox) fenced(tx *sqlx.Tx, c Claim, to OutboxState, query string, args ...any) error {
	res, err := tx.Exec(query+` WHERE id = ? AND status = ? AND claimed_by = ? AND claimed_at = ? AND claim_token = ?`,
		append(args, c.ID, string(Claimed), c.ClaimedBy, us(c.ClaimedAt), c.token)...)
	if err != nil {
		return fmt.Errorf("outbox row %d → %s: %w", c.ID, to, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var cur string
	switch err := tx.Get(&cur, `SELECT status FROM federation_outbox WHERE id = ?`, c.ID); {
	case errors.Is(err, sql.ErrNoRows):
		return ErrRowNotFound
	case err != nil:
		return fmt.Errorf("outbox row %d: %w", c.ID, err)
	}
	// Only a claimed row may be finalized; a claimed row that is not c's
	// is a lost claim.
	if OutboxState(cur) != Claimed {
		return &OutboxTransitionError{ID: c.ID, From: OutboxState(cur), To: to}
	}
	return ErrClaimLost
}

// PublishTx finalizes c as PUBLISHED inside a Log.Do transaction, only if
// the claim is still c's.
func (o *Outbox) PublishTx(tx *sqlx.Tx, c Claim) error {
	now := us(o.clock())
	return o.fenced(tx, c, Published, `UPDATE federation_outbox SET status = ?, published_at = ?, claimed_at = NULL,
  claimed_by = NULL, claim_token = NULL, updated_at = ?`, string(Published), now, now)
}

// Publish records events and finalizes c as PUBLISHED in one transaction.
// A lost claim rejects both (ErrClaimLost).
func (o *Outbox) Publish(ctx context.Context, c Claim, events ...tracing.Event) error {
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error { return o.PublishTx(tx, c) }, events...)
	return unwrapFn(err)
}

// Retry returns c to PENDING after a failed attempt: attempts+1,
// last_error, available_at (the backoff), claim cleared.
func (o *Outbox) Retry(ctx context.Context, c Claim, lastErr string, availableAt time.Time) error {
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		return o.fenced(tx, c, Pending, `UPDATE federation_outbox SET status = ?, attempts = attempts + 1, last_error = ?,
  available_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL, updated_at = ?`,
			string(Pending), bounded(lastErr), us(availableAt), us(o.clock()))
	})
	return unwrapFn(err)
}

// Kill moves c to DEAD (a termination condition was met) with events in
// the same transaction; it is never retried automatically.
func (o *Outbox) Kill(ctx context.Context, c Claim, lastErr string, events ...tracing.Event) error {
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		return o.fenced(tx, c, Dead, `UPDATE federation_outbox SET status = ?, attempts = attempts + 1, last_error = ?,
  claimed_at = NULL, claimed_by = NULL, claim_token = NULL, updated_at = ?`,
			string(Dead), bounded(lastErr), us(o.clock()))
	}, events...)
	return unwrapFn(err)
}

// Reap returns rows claimed longer ago than lease to PENDING (attempts+1,
// last_error "claim expired"), so another relay may process them.
func (o *Outbox) Reap(ctx context.Context, lease time.Duration) (int, error) {
	return o.reap(ctx, `claimed_at <= ?`, us(o.clock().Add(-lease)))
}

// ReapOthers returns every row claimed by a relay other than relayID to
// PENDING. Only one process writes a data directory, so at start every
// claim of an earlier process is expired.
func (o *Outbox) ReapOthers(ctx context.Context, relayID string) (int, error) {
	return o.reap(ctx, `claimed_by <> ?`, relayID)
}

func (o *Outbox) reap(ctx context.Context, cond string, arg any) (int, error) {
	var n int64
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		now := us(o.clock())
		res, err := tx.Exec(`UPDATE federation_outbox SET status = ?, attempts = attempts + 1,
  last_error = 'claim expired (' || coalesce(claimed_by, '') || ')', available_at = ?,
  claimed_at = NULL, claimed_by = NULL, claim_token = NULL, updated_at = ?
 WHERE status = ? AND `+cond, string(Pending), now, now, string(Claimed), arg)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("outbox reap: %w", err)
	}
	return int(n), nil
}

// Replay is the operator's replay: a PUBLISHED or DEAD row goes back to
// PENDING, available now, attempts and last_error reset. Any other state
// is an *OutboxTransitionError.
func (o *Outbox) Replay(ctx context.Context, id int64) error {
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		var cur string
		switch err := tx.Get(&cur, `SELECT status FROM federation_outbox WHERE id = ?`, id); {
		case errors.Is(err, sql.ErrNoRows):
			return ErrRowNotFound
		case err != nil:
			return err
		}
		if st := OutboxState(cur); st != Published && st != Dead {
			return &OutboxTransitionError{ID: id, From: OutboxState(cur), To: Pending}
		}
		now := us(o.clock())
		_, err := tx.Exec(`UPDATE federation_outbox SET status = ?, attempts = 0, last_error = '', available_at = ?,
  deadline = NULL, published_at = NULL, updated_at = ? WHERE id = ? AND status = ?`, string(Pending), now, now, id, cur)
		return err
	})
	return unwrapFn(err)
}

// Get returns one row.
func (o *Outbox) Get(ctx context.Context, id int64) (Row, bool, error) {
	r, err := scanRow(o.log.ReadDB().QueryRowContext(ctx, `SELECT `+rowColumns+` FROM federation_outbox WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("outbox get %d: %w", id, err)
	}
	return r, true, nil
}

// Rows returns up to limit rows in state (all states when empty), newest
// first.
func (o *Outbox) Rows(ctx context.Context, state OutboxState, limit int) ([]Row, error) {
	if limit <= 0 || limit > 1000 {
		limit = 1000
	}
	q := `SELECT ` + rowColumns + ` FROM federation_outbox`
	var args []any
	if state != "" {
		q += ` WHERE status = ?`
		args = append(args, string(state))
	}
	q += ` ORDER BY id DESC LIMIT ?`
	rows, err := o.log.ReadDB().QueryContext(ctx, q, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox rows: %w", err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("outbox rows: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Counts returns the number of rows in each state.
func (o *Outbox) Counts(ctx context.Context) (map[OutboxState]int64, error) {
	out := map[OutboxState]int64{}
	for _, s := range OutboxStates {
		out[s] = 0
	}
	rows, err := o.log.ReadDB().QueryContext(ctx, `SELECT status, count(*) FROM federation_outbox GROUP BY status`)
	if err != nil {
		return nil, fmt.Errorf("outbox counts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var s string
		var n int64
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("outbox counts: %w", err)
		}
		out[OutboxState(s)] = n
	}
	return out, rows.Err()
}

// unwrapFn turns the log's *FuncError back into the function's error.
func unwrapFn(err error) error {
	var fe *tracing.FuncError
	if errors.As(err, &fe) {
		return fe.Err
	}
	return err
}

func bounded(s string) string {
	if len(s) > 2000 {
		return s[:2000]
	}
	return s
}
