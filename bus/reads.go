package bus

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jmoiron/sqlx"

	"github.com/beamdir/beam/tracing"
)

// The bus's hot reads run as statements prepared once on the log's read
// pool: compiling the SQL text anew on every call cost more CPU than
// running it (the pure-Go SQLite parses each ad-hoc query).

// current is a message's beam_messages row together with the attempt and
// transport of its latest event (intent_log), read in one statement so that
// both come from the same commit.
type current struct {
	tracing.MessageRow
	Attempt   int    `db:"attempt"`
	Transport string `db:"transport"`
}

// currentColumns are beam_messages' columns (as MessageRow reads them) plus
// intent_log's attempt and transport.
const currentColumns = `m.id, m.nonce, m.sender, m.recipient, m.intent, m.payload, m.status, m.priority,
  m.retry_count, m.max_retries, m.next_retry_at, m.created_at, m.delivered_at, m.acked_at, m.failed_at, m.error,
  m.response, m.trace_id, m.metadata, m.lease_owner, m.lease_expires_at, m.updated_at, m.last_seq,
  i.attempt, i.transport`

// reads are the bus's prepared statements.
type reads struct {
	current   *sqlx.Stmt // nonce → current
	exists    *sqlx.Stmt // nonce → 1 when the log has the nonce
	first     *sqlx.Stmt // nonce → details of its first event
	last      *sqlx.Stmt // nonce → details of its latest event
	waiting   *sqlx.Stmt // recipient, now, limit → nonces of queued messages due or waiting for it
	nonceOfID *sqlx.Stmt // message id → nonce
}

func prepareReads(db *sqlx.DB) (*reads, error) {
	r := &reads{}
	for _, s := range []struct {
		dst   **sqlx.Stmt
		query string
	}{
		{&r.current, `SELECT ` + currentColumns + ` FROM beam_messages m JOIN intent_log i ON i.nonce = m.nonce WHERE m.nonce = ?`},
		{&r.exists, `SELECT 1 FROM intent_log WHERE nonce = ?`},
		{&r.first, `SELECT details FROM intent_trace_events WHERE seq = (SELECT first_seq FROM intent_log WHERE nonce = ?)`},
		{&r.last, `SELECT details FROM intent_trace_events WHERE seq = (SELECT last_seq FROM intent_log WHERE nonce = ?)`},
		{&r.waiting, `SELECT nonce FROM beam_messages WHERE recipient = ? AND status = 'queued'
			AND (next_retry_at IS NULL OR next_retry_at <= ?) AND created_at >= ? ORDER BY priority DESC, created_at LIMIT ?`},
		{&r.nonceOfID, `SELECT nonce FROM beam_messages WHERE id = ?`},
	} {
		st, err := db.Preparex(s.query)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("prepare bus query: %w", err)
		}
		*s.dst = st
	}
	return r, nil
}

func (r *reads) close() {
	for _, st := range []*sqlx.Stmt{r.current, r.exists, r.first, r.last, r.waiting, r.nonceOfID} {
		if st != nil {
			_ = st.Close()
		}
	}
}

// current reads nonce's message row with its latest attempt; false when the
// nonce is not a bus message.
func (b *Bus) current(ctx context.Context, nonce string) (current, bool, error) {
	var c current
	if err := b.rd.current.QueryRowxContext(ctx, nonce).StructScan(&c); err != nil {
		if isNoRows(err) {
			return current{}, false, nil
		}
		return current{}, false, fmt.Errorf("read message %q: %w", nonce, err)
	}
	return c, true, nil
}

// message reads the beam_messages row of nonce.
func (b *Bus) message(ctx context.Context, nonce string) (tracing.MessageRow, bool, error) {
	c, ok, err := b.current(ctx, nonce)
	return c.MessageRow, ok, err
}

// nonceExists reports whether the log has any event of nonce.
func (b *Bus) nonceExists(ctx context.Context, nonce string) (bool, error) {
	var one int
	if err := b.rd.exists.QueryRowContext(ctx, nonce).Scan(&one); err != nil {
		if isNoRows(err) {
			return false, nil
		}
		return false, fmt.Errorf("look up nonce %q: %w", nonce, err)
	}
	return true, nil
}

// nonceOfID returns the nonce of message id.
func (b *Bus) nonceOfID(ctx context.Context, id string) (string, bool, error) {
	var nonce string
	if err := b.rd.nonceOfID.QueryRowContext(ctx, id).Scan(&nonce); err != nil {
		if isNoRows(err) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("look up message %q: %w", id, err)
	}
	return nonce, true, nil
}

// firstDetails returns the details of the nonce's received event.
func (b *Bus) firstDetails(ctx context.Context, nonce string) (tracing.Details, error) {
	return b.details(ctx, b.rd.first, nonce, "received")
}

// lastDetails returns the details of the nonce's latest event.
func (b *Bus) lastDetails(ctx context.Context, nonce string) (tracing.Details, error) {
	return b.details(ctx, b.rd.last, nonce, "latest")
}

func (b *Bus) details(ctx context.Context, st *sqlx.Stmt, nonce, which string) (tracing.Details, error) {
	var raw string
	if err := st.QueryRowContext(ctx, nonce).Scan(&raw); err != nil {
		return tracing.Details{}, fmt.Errorf("read %s event of %q: %w", which, nonce, err)
	}
	var d tracing.Details
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		return tracing.Details{}, fmt.Errorf("decode %s event of %q: %w", which, nonce, err)
	}
	return d, nil
}

// waitingFor returns up to limit nonces of recipient's queued messages that
// are due or wait for it, highest priority and oldest first. Messages older
// than the recipient's registration were queued for a deleted agent of the
// same name and are never handed to a later registrant.
func (b *Bus) waitingFor(ctx context.Context, recipient string, nowSecs float64, limit int) ([]string, error) {
	var out []string
	if err := b.rd.waiting.SelectContext(ctx, &out, recipient, nowSecs, b.registeredSince(recipient), limit); err != nil {
		return nil, fmt.Errorf("select messages: %w", err)
	}
	return out, nil
}

// registeredSince is when beamID's current registration began, in the
// epoch seconds of beam_messages.created_at (0 when it is not registered
// here). An agent sees and receives only messages created since: a Beam ID
// that was deleted and released to a newcomer hands over none of the old
// agent's messages.
func (b *Bus) registeredSince(beamID string) float64 {
	a, ok := b.reg.Get(beamID)
	if !ok {
		return 0
	}
	// Whole milliseconds below the registration instant, so that a message
	// created in the same millisecond is not lost to rounding.
	return float64(a.CreatedAt.UnixMilli()-1) / 1e3
}
