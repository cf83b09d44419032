package federation

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
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

// outboxStates lists every outbox state.
var outboxStates = []OutboxState{Pending, Claimed, Published, Dead}

// outboxLifecycle is seed 001's table of an outbox row, as data; nothing
// else may happen. Every change of a row checks it inside the log's
// transaction that records the step (fenced, Replay).
var outboxLifecycle = tracing.Register(&tracing.Lifecycle{
	Name:    "outbox row",
	Package: "federation",
	Doc: "A row of `federation_outbox`: one message to publish to a peer directory (seed 001). Its steps ride " +
		"on the events of the intent it belongs to (`details.outbox`); the outbox checks the table in the " +
		"transaction that records each step.",
	Checked:  "federation, in the log's transaction that records the step",
	States:   tracing.Names(outboxStates),
	Terminal: []string{string(Published), string(Dead)},
	Transitions: []tracing.Transition{
		{From: "", To: string(Pending), On: "enqueue"},
		{From: string(Pending), To: string(Claimed), On: "claim"},
		{From: string(Claimed), To: string(Published), On: "publish"},
		{From: string(Claimed), To: string(Pending), On: "retry"},
		{From: string(Claimed), To: string(Pending), On: "reap"},
		{From: string(Claimed), To: string(Dead), On: "kill"},
		{From: string(Published), To: string(Pending), On: "replay"},
		{From: string(Dead), To: string(Pending), On: "replay"},
	},
})

// canTransitionOutbox reports whether seed 001 allows an outbox row to move
// from one state to another.
func canTransitionOutbox(from, to OutboxState) bool {
	return outboxLifecycle.Allows(string(from), string(to), "")
}

// errClaimLost is returned when a relay finalizes a row whose claim is no
// longer its own (it expired and was reaped, possibly claimed again).
var errClaimLost = errors.New("outbox: claim is no longer held")

// errRowNotFound is returned for an outbox id that does not exist.
var errRowNotFound = errors.New("outbox: no such row")

// outboxTransitionError rejects a transition seed 001 forbids.
type outboxTransitionError struct {
	ID       int64
	From, To OutboxState
}

func (e *outboxTransitionError) Error() string {
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

// newRow is an outbox row to write in the transaction of the event that
// needs the publish.
type newRow struct {
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

// claim is a row a relay holds. Finalizing it checks that the claim is
// still the relay's (claimed_by, claimed_at and a per-claim token).
type claim struct {
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

// errIntentFinished is returned for a replay of a row whose intent is
// already acked: the peer's outcome is committed and nothing is left to
// publish (an acked intent takes no further event, so the step could not
// be logged either).
var errIntentFinished = errors.New("outbox: the intent is already acked; nothing to publish")

// errStale: the row changed between reading it and writing its step.
var errStale = errors.New("outbox: row changed meanwhile")

// insertRow writes a new row inside a Log.Do transaction.
func insertRow(tx *sqlx.Tx, r Row) error {
	if _, err := tx.Exec(`INSERT INTO federation_outbox(event_id, kind, peer, nonce, owner, payload, status, attempts,
  max_attempts, available_at, deadline, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		r.EventID, r.Kind, r.Peer, r.Nonce, r.Owner, r.Payload, string(r.State), r.Attempts, r.MaxAttempts,
		us(r.AvailableAt), nullUs(r.Deadline), us(r.CreatedAt), us(r.UpdatedAt)); err != nil {
		return fmt.Errorf("outbox insert %s: %w", r.EventID, err)
	}
	return nil
}

// Enqueue writes events and a PENDING row in one transaction; the row's
// step rides on the last event (normally the dispatched event of its
// nonce).
func (o *Outbox) Enqueue(ctx context.Context, r newRow, events ...tracing.Event) error {
	if r.EventID == "" || r.Kind == "" || r.Peer == "" {
		return errors.New("outbox insert: event id, kind and peer are required")
	}
	now := fromUs(us(o.clock()))
	avail := now
	if !r.AvailableAt.IsZero() {
		avail = fromUs(us(r.AvailableAt))
	}
	row := Row{EventID: r.EventID, Kind: r.Kind, Peer: r.Peer, Nonce: r.Nonce, Owner: string(r.Owner), Payload: r.Payload,
		State: Pending, MaxAttempts: r.MaxAttempts, AvailableAt: avail, Deadline: fromUs(usOrZero(r.Deadline)),
		CreatedAt: now, UpdatedAt: now}
	evs, err := o.withStep(ctx, r.Nonce, stepOf(row, true), events)
	if err != nil {
		return fmt.Errorf("enqueue %s: %w", r.EventID, err)
	}
	if _, err := o.log.Do(ctx, func(tx *sqlx.Tx) error { return insertRow(tx, row) }, evs...); err != nil {
		return fmt.Errorf("enqueue %s: %w", r.EventID, err)
	}
	return nil
}

// Claim moves up to limit PENDING rows whose available_at has come to
// CLAIMED by relayID (claimed_at now, a fresh claim token), oldest first,
// each with its CLAIMED step. Rows of acked intents are not claimed.
func (o *Outbox) Claim(ctx context.Context, relayID string, limit int) ([]claim, error) {
	if limit <= 0 {
		return nil, nil
	}
	if relayID == "" {
		return nil, errors.New("outbox claim: empty relay id")
	}
	now := fromUs(us(o.clock()))
	// Rows whose intent can take no step (acked, or queued by the bus) are
	// not candidates, so they never hold up the rows behind them.
	open, openArgs := tracing.IntentNotIn("federation_outbox.nonce", tracing.Acked, tracing.Queued)
	cands, err := o.query(ctx, `WHERE status = ? AND available_at <= ? AND `+open+` ORDER BY available_at, id LIMIT ?`,
		append(append([]any{string(Pending), us(now)}, openArgs...), limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox claim: %w", err)
	}
	var claims []claim
	var events []tracing.Event
	for _, r := range cands {
		c := claim{r}
		c.State, c.ClaimedAt, c.ClaimedBy, c.UpdatedAt, c.token = Claimed, now, relayID, now, newID()[:16]
		evs, err := o.withStep(ctx, r.Nonce, stepOf(c.Row, false), nil)
		if errors.Is(err, errUnrecordable) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("outbox claim: %w", err)
		}
		claims, events = append(claims, c), append(events, evs...)
	}
	if len(claims) == 0 {
		return nil, nil
	}
	if err := o.claimTx(ctx, claims, events); err == nil {
		return claims, nil
	}
	// An intent moved (or a row changed) meanwhile: claim one by one.
	var out []claim
	for _, c := range claims {
		evs, err := o.withStep(ctx, c.Nonce, stepOf(c.Row, false), nil)
		if err != nil {
			continue
		}
		if err := o.claimTx(ctx, []claim{c}, evs); err == nil {
			out = append(out, c)
		}
	}
	return out, nil
}

func (o *Outbox) claimTx(ctx context.Context, claims []claim, events []tracing.Event) error {
	_, err := o.log.Do(ctx, func(tx *sqlx.Tx) error {
		for _, c := range claims {
			res, err := tx.Exec(`UPDATE federation_outbox SET status = ?, claimed_at = ?, claimed_by = ?, claim_token = ?,
  updated_at = ? WHERE id = ? AND status = ?`, string(Claimed), us(c.ClaimedAt), c.ClaimedBy, c.token, us(c.UpdatedAt),
				c.ID, string(Pending))
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				return errStale
			}
		}
		return nil
	}, events...)
	return unwrapFn(err)
}

// fenced runs an update of c's row that must find it CLAIMED by c; it
// tells a lost claim from a forbidden transition.
func (o *Outbox) fenced(tx *sqlx.Tx, c claim, to OutboxState, query string, args ...any) error {
	// A claim refolded by RebuildOutbox has no token (tokens are not
	// logged): IS matches it as NULL.
	res, err := tx.Exec(query+` WHERE id = ? AND status = ? AND claimed_by = ? AND claimed_at = ? AND claim_token IS ?`,
		append(args, c.ID, string(Claimed), c.ClaimedBy, us(c.ClaimedAt), nullStr(c.token))...)
	if err != nil {
		return fmt.Errorf("outbox row %d → %s: %w", c.ID, to, err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	var cur string
	switch err := tx.Get(&cur, `SELECT status FROM federation_outbox WHERE id = ?`, c.ID); {
	case errors.Is(err, sql.ErrNoRows):
		return errRowNotFound
	case err != nil:
		return fmt.Errorf("outbox row %d: %w", c.ID, err)
	}
	// Only a claimed row may be finalized; a claimed row that is not c's
	// is a lost claim.
	if OutboxState(cur) != Claimed {
		return &outboxTransitionError{ID: c.ID, From: OutboxState(cur), To: to}
	}
	return errClaimLost
}

// release moves claimed row c to state to (claim cleared, updated now,
// then change applied) with its step and events in one transaction, only
// if the claim is still c's. It returns errUnrecordable, and moves
// nothing, when the intent can take no step (it is acked).
func (o *Outbox) release(ctx context.Context, c claim, to OutboxState, change func(r *Row), events []tracing.Event) error {
	cur, ok, err := o.Get(ctx, c.ID)
	switch {
	case err != nil:
		return err
	case !ok:
		return errRowNotFound
	case cur.State != Claimed:
		return &outboxTransitionError{ID: c.ID, From: cur.State, To: to}
	case cur.ClaimedBy != c.ClaimedBy || !cur.ClaimedAt.Equal(c.ClaimedAt) || cur.token != c.token:
		return errClaimLost
	}
	r := c.Row
	r.State, r.ClaimedAt, r.ClaimedBy, r.UpdatedAt = to, time.Time{}, "", fromUs(us(o.clock()))
	change(&r)
	// A step without events of its own is an annotation in the intent's
	// current state; when the intent moves between reading that state and
	// the commit (a sender's deadline fails it), read it again.
	for try := 0; ; try++ {
		evs, err := o.withStep(ctx, c.Nonce, stepOf(r, false), events)
		if err != nil {
			return err
		}
		_, err = o.log.Do(ctx, func(tx *sqlx.Tx) error {
			return o.fenced(tx, c, to, `UPDATE federation_outbox SET status = ?, attempts = ?, last_error = ?, available_at = ?,
  published_at = ?, claimed_at = NULL, claimed_by = NULL, claim_token = NULL, updated_at = ?`,
				string(to), r.Attempts, r.LastError, us(r.AvailableAt), nullUs(r.PublishedAt), us(r.UpdatedAt))
		}, evs...)
		var te *tracing.TransitionError
		if len(events) == 0 && try < 3 && errors.As(err, &te) {
			continue
		}
		return unwrapFn(err)
	}
}

// Publish records events and finalizes c as PUBLISHED in one transaction
// (the step rides on the last event); attempts+1, counting the publish. A
// lost claim rejects both (errClaimLost).
func (o *Outbox) Publish(ctx context.Context, c claim, events ...tracing.Event) error {
	return o.release(ctx, c, Published, func(r *Row) {
		r.Attempts++
		r.PublishedAt = r.UpdatedAt
	}, events)
}

// Retry returns c to PENDING after a failed attempt: attempts+1,
// last_error, available_at (the backoff), claim cleared.
func (o *Outbox) Retry(ctx context.Context, c claim, lastErr string, availableAt time.Time) error {
	return o.release(ctx, c, Pending, func(r *Row) {
		r.Attempts++
		r.LastError = bounded(lastErr)
		r.AvailableAt = fromUs(us(availableAt))
	}, nil)
}

// Kill moves c to DEAD (a termination condition was met) with events in
// the same transaction; it is never retried automatically.
func (o *Outbox) Kill(ctx context.Context, c claim, lastErr string, events ...tracing.Event) error {
	return o.release(ctx, c, Dead, func(r *Row) {
		r.Attempts++
		r.LastError = bounded(lastErr)
	}, events)
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
	rows, err := o.query(ctx, `WHERE status = ? AND `+cond+` ORDER BY id`, string(Claimed), arg)
	if err != nil {
		return 0, fmt.Errorf("outbox reap: %w", err)
	}
	n := 0
	for _, r := range rows {
		err := o.release(ctx, claim{r}, Pending, func(x *Row) {
			x.Attempts++
			x.LastError = "claim expired (" + r.ClaimedBy + ")"
			x.AvailableAt = x.UpdatedAt
		}, nil)
		switch {
		case err == nil:
			n++
		case errors.Is(err, errUnrecordable), errors.Is(err, errClaimLost):
		default:
			var te *outboxTransitionError
			if !errors.As(err, &te) {
				return n, fmt.Errorf("outbox reap: %w", err)
			}
		}
	}
	return n, nil
}

// Replay is the operator's replay: a PUBLISHED or DEAD row goes back to
// PENDING, available now, attempts and last_error reset. Any other state
// is an *outboxTransitionError; a row of an acked intent is
// errIntentFinished.
func (o *Outbox) Replay(ctx context.Context, id int64) error {
	cur, ok, err := o.Get(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return errRowNotFound
	}
	if cur.State != Published && cur.State != Dead {
		return &outboxTransitionError{ID: id, From: cur.State, To: Pending}
	}
	r := cur
	now := fromUs(us(o.clock()))
	r.State, r.Attempts, r.LastError, r.AvailableAt, r.Deadline, r.PublishedAt, r.UpdatedAt =
		Pending, 0, "", now, time.Time{}, time.Time{}, now
	st := stepOf(r, false)
	st.Replay = true
	evs, err := o.withStep(ctx, r.Nonce, st, nil)
	if errors.Is(err, errUnrecordable) {
		return errIntentFinished
	}
	if err != nil {
		return err
	}
	_, err = o.log.Do(ctx, func(tx *sqlx.Tx) error {
		res, err := tx.Exec(`UPDATE federation_outbox SET status = ?, attempts = 0, last_error = '', available_at = ?,
  deadline = NULL, published_at = NULL, updated_at = ? WHERE id = ? AND status = ? AND updated_at = ?`,
			string(Pending), us(now), us(now), id, string(cur.State), us(cur.UpdatedAt))
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n != 1 {
			return errStale
		}
		return nil
	}, evs...)
	return unwrapFn(err)
}

// query returns the rows matching a WHERE … clause.
func (o *Outbox) query(ctx context.Context, where string, args ...any) ([]Row, error) {
	rows, err := o.log.ReadDB().QueryContext(ctx, `SELECT `+rowColumns+` FROM federation_outbox `+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		r, err := scanRow(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
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
	where := ``
	var args []any
	if state != "" {
		where = `WHERE status = ? `
		args = append(args, string(state))
	}
	out, err := o.query(ctx, where+`ORDER BY id DESC LIMIT ?`, append(args, limit)...)
	if err != nil {
		return nil, fmt.Errorf("outbox rows: %w", err)
	}
	return out, nil
}

// backlog is what waits in the outbox for one peer.
type backlog struct {
	// Depth is the number of PENDING and CLAIMED rows.
	Depth int64 `json:"depth"`
	// Oldest is when the oldest waiting row was written (its lag is now
	// minus Oldest); zero when nothing waits.
	Oldest time.Time `json:"oldest,omitzero"`
	// LastError is the error of the most recently failed waiting row.
	LastError string `json:"lastError,omitempty"`
}

// Backlogs returns the backlog of every peer that has rows waiting.
func (o *Outbox) Backlogs(ctx context.Context) (map[string]backlog, error) {
	rows, err := o.log.ReadDB().QueryContext(ctx, `SELECT peer, count(*), min(created_at),
  coalesce((SELECT last_error FROM federation_outbox l WHERE l.peer = w.peer AND l.status IN (?, ?) AND l.last_error <> ''
            ORDER BY l.updated_at DESC LIMIT 1), '')
 FROM federation_outbox w WHERE status IN (?, ?) GROUP BY peer`,
		string(Pending), string(Claimed), string(Pending), string(Claimed))
	if err != nil {
		return nil, fmt.Errorf("outbox backlogs: %w", err)
	}
	defer rows.Close()
	out := map[string]backlog{}
	for rows.Next() {
		var peer string
		var b backlog
		var oldest int64
		if err := rows.Scan(&peer, &b.Depth, &oldest, &b.LastError); err != nil {
			return nil, fmt.Errorf("outbox backlogs: %w", err)
		}
		b.Oldest = fromUs(oldest)
		out[peer] = b
	}
	return out, rows.Err()
}

// Counts returns the number of rows in each state.
func (o *Outbox) Counts(ctx context.Context) (map[OutboxState]int64, error) {
	out := map[OutboxState]int64{}
	for _, s := range outboxStates {
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
