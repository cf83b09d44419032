package tracing

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The log owns its tables (intent_trace_events, intent_log, beam_messages):
// every SQL text that reads them lives in this package, and other packages
// read through the methods below.

// IntentQuery selects intent_log rows. Zero fields do not filter.
type IntentQuery struct {
	// Search matches a substring of the nonce, sender, recipient, intent
	// type or error code.
	Search string
	// From, To, IntentType, ErrorCode and Nonce match exactly.
	From, To, IntentType, ErrorCode, Nonce string
	// Party matches intents from or to this Beam ID.
	Party string
	// Statuses keeps intents in one of these states.
	Statuses []State
	// Since and Until bound the request time (inclusive).
	Since, Until time.Time
	// Limit and Offset page the result of Intents (Limit 0: 100).
	Limit, Offset int
}

func (q *IntentQuery) where() (string, []any) {
	var w whereClause
	if q.Search != "" {
		p := likePattern(q.Search)
		w.add(`(nonce LIKE ? ESCAPE '\' OR from_beam_id LIKE ? ESCAPE '\' OR to_beam_id LIKE ? ESCAPE '\' OR intent_type LIKE ? ESCAPE '\' OR error_code LIKE ? ESCAPE '\')`,
			p, p, p, p, p)
	}
	w.eq("from_beam_id", q.From)
	w.eq("to_beam_id", q.To)
	w.eq("intent_type", q.IntentType)
	w.eq("error_code", q.ErrorCode)
	w.eq("nonce", q.Nonce)
	if q.Party != "" {
		w.add(`(from_beam_id = ? OR to_beam_id = ?)`, q.Party, q.Party)
	}
	w.states("status", q.Statuses)
	if !q.Since.IsZero() {
		w.add(`requested_at >= ?`, q.Since.UnixMicro())
	}
	if !q.Until.IsZero() {
		w.add(`requested_at <= ?`, q.Until.UnixMicro())
	}
	return w.String(), w.args
}

// CountIntents counts the intents q selects (ignoring its paging).
func (l *Log) CountIntents(ctx context.Context, q IntentQuery) (int64, error) {
	if err := l.sync(ctx); err != nil {
		return 0, err
	}
	cond, args := q.where()
	var n int64
	if err := l.rdb.QueryRowContext(ctx, `SELECT COUNT(*) FROM intent_log`+cond, args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("count intents: %w", err)
	}
	return n, nil
}

// Intents returns a page of the intents q selects, newest request first.
func (l *Log) Intents(ctx context.Context, q IntentQuery) ([]IntentRow, error) {
	cond, args := q.where()
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []IntentRow
	err := l.eachIntent(ctx, `SELECT `+intentCols+` FROM intent_log`+cond+` ORDER BY requested_at DESC, nonce LIMIT ? OFFSET ?`,
		append(args, limit, q.Offset), func(r *IntentRow) error {
			out = append(out, *r)
			return nil
		})
	return out, err
}

// EachIntent calls fn with every intent q selects (its paging ignored), in
// no particular order, stopping at fn's first error. The row is reused
// between calls.
func (l *Log) EachIntent(ctx context.Context, q IntentQuery, fn func(*IntentRow) error) error {
	cond, args := q.where()
	return l.eachIntent(ctx, `SELECT `+intentCols+` FROM intent_log`+cond, args, fn)
}

// IntentsByNonce returns the intent_log rows of the given nonces (those
// that exist), in no particular order.
func (l *Log) IntentsByNonce(ctx context.Context, nonces []string) ([]IntentRow, error) {
	var out []IntentRow
	// Rows not written yet come from memory; the rest from the table, which
	// holds them (a row leaves memory only once it is written).
	if l.wdb != nil {
		rest := make([]string, 0, len(nonces))
		l.pmu.RLock()
		for _, n := range nonces {
			if p := l.w.pend[n]; p != nil {
				out = append(out, p.row)
			} else {
				rest = append(rest, n)
			}
		}
		l.pmu.RUnlock()
		nonces = rest
	}
	for len(nonces) > 0 {
		chunk := nonces[:min(len(nonces), 500)]
		nonces = nonces[len(chunk):]
		args := make([]any, len(chunk))
		for i, n := range chunk {
			args[i] = n
		}
		err := eachRow(ctx, l.rdb.DB, "read intents", `SELECT `+intentCols+` FROM intent_log WHERE nonce IN (`+placeholders(len(chunk))+`)`, args, scanIntent,
			func(r *IntentRow) error {
				out = append(out, *r)
				return nil
			})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (l *Log) eachIntent(ctx context.Context, query string, args []any, fn func(*IntentRow) error) error {
	if err := l.sync(ctx); err != nil {
		return err
	}
	return eachRow(ctx, l.rdb.DB, "read intents", query, args, scanIntent, fn)
}

// collectRows scans every row of rows (the result of a query that failed
// with qerr, or succeeded) into a slice, closing rows; errors are wrapped
// with what.
func collectRows[T any](rows *sql.Rows, qerr error, what string, scan func(scanner, *T) error) ([]T, error) {
	if qerr != nil {
		return nil, fmt.Errorf("%s: %w", what, qerr)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := scan(rows, &v); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// eachRow runs query and calls fn with each row scanned into a T (reused
// between calls), stopping at fn's first error, which it returns as is;
// database errors are wrapped with what.
func eachRow[T any](ctx context.Context, db *sql.DB, what, query string, args []any,
	scan func(scanner, *T) error, fn func(*T) error) error {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer rows.Close()
	var v T
	for rows.Next() {
		var zero T
		v = zero
		if err := scan(rows, &v); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if err := fn(&v); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// AverageAckedLatency is the mean round-trip latency in ms of acked intents
// (0 when there is none).
func (l *Log) AverageAckedLatency(ctx context.Context) (float64, error) {
	if err := l.sync(ctx); err != nil {
		return 0, err
	}
	var avg float64
	if err := l.rdb.QueryRowContext(ctx,
		`SELECT COALESCE(AVG(round_trip_latency_ms), 0) FROM intent_log WHERE status = 'acked'`).Scan(&avg); err != nil {
		return 0, fmt.Errorf("average latency: %w", err)
	}
	return avg, nil
}

// MessageOrder is the order of a message list.
type MessageOrder int

// The orders of MessageQuery.
const (
	// OldestFirst orders by creation, oldest first.
	OldestFirst MessageOrder = iota
	// NewestFirst orders by creation, newest first.
	NewestFirst
	// RecentlyFailedFirst orders by the time of failure (or last change),
	// newest first.
	RecentlyFailedFirst
)

// MessageQuery selects beam_messages rows. Zero fields do not filter.
type MessageQuery struct {
	// Sender, Recipient and Intent match exactly.
	Sender, Recipient, Intent string
	// Party matches messages from or to this Beam ID.
	Party string
	// Status keeps messages in this state.
	Status State
	// CreatedAfter (exclusive), CreatedSince and CreatedUntil (inclusive)
	// bound the creation time, in epoch seconds.
	CreatedAfter, CreatedSince, CreatedUntil *float64
	Order                                    MessageOrder
	// Limit and Offset page the result of Messages (Limit 0: 100).
	Limit, Offset int
}

func (q *MessageQuery) where() (string, []any) {
	var w whereClause
	w.eq("sender", q.Sender)
	w.eq("recipient", q.Recipient)
	w.eq("intent", q.Intent)
	if q.Party != "" {
		w.add(`(sender = ? OR recipient = ?)`, q.Party, q.Party)
	}
	if q.Status != "" {
		w.add(`status = ?`, string(q.Status))
	}
	if q.CreatedAfter != nil {
		w.add(`created_at > ?`, *q.CreatedAfter)
	}
	if q.CreatedSince != nil {
		w.add(`created_at >= ?`, *q.CreatedSince)
	}
	if q.CreatedUntil != nil {
		w.add(`created_at <= ?`, *q.CreatedUntil)
	}
	return w.String(), w.args
}

// Messages returns a page of the messages q selects, in q.Order.
func (l *Log) Messages(ctx context.Context, q MessageQuery) ([]MessageRow, error) {
	cond, args := q.where()
	order := `created_at ASC, id`
	switch q.Order {
	case NewestFirst:
		order = `created_at DESC, id`
	case RecentlyFailedFirst:
		order = `COALESCE(failed_at, updated_at) DESC, created_at DESC, id`
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	var out []MessageRow
	err := l.eachMessage(ctx, `SELECT `+messageCols+` FROM beam_messages`+cond+` ORDER BY `+order+` LIMIT ? OFFSET ?`,
		append(args, limit, q.Offset), func(m *MessageRow) error {
			out = append(out, *m)
			return nil
		})
	return out, err
}

// EachMessage calls fn with every message q selects (its paging and order
// ignored), stopping at fn's first error. The row is reused between calls.
func (l *Log) EachMessage(ctx context.Context, q MessageQuery, fn func(*MessageRow) error) error {
	cond, args := q.where()
	return l.eachMessage(ctx, `SELECT `+messageCols+` FROM beam_messages`+cond, args, fn)
}

func (l *Log) eachMessage(ctx context.Context, query string, args []any, fn func(*MessageRow) error) error {
	if err := l.sync(ctx); err != nil {
		return err
	}
	return eachRow(ctx, l.rdb.DB, "read messages", query, args, scanMessage, fn)
}

// MessageSummary counts the messages a query selects.
type MessageSummary struct {
	Total, Senders, Recipients, MaxRetryCount int64
}

// SummarizeMessages counts the messages q selects (its paging and order
// ignored), their distinct senders and recipients and the highest retry
// count among them.
func (l *Log) SummarizeMessages(ctx context.Context, q MessageQuery) (MessageSummary, error) {
	if err := l.sync(ctx); err != nil {
		return MessageSummary{}, err
	}
	cond, args := q.where()
	var s MessageSummary
	if err := l.rdb.QueryRowContext(ctx, `SELECT COUNT(*), COUNT(DISTINCT sender), COUNT(DISTINCT recipient),
		COALESCE(MAX(retry_count), 0) FROM beam_messages`+cond, args...).Scan(&s.Total, &s.Senders, &s.Recipients,
		&s.MaxRetryCount); err != nil {
		return s, fmt.Errorf("summarize messages: %w", err)
	}
	return s, nil
}

// MessageCountsByState counts the messages q selects (its paging, order
// and status ignored) by status.
func (l *Log) MessageCountsByState(ctx context.Context, q MessageQuery) (map[State]int64, error) {
	q.Status = ""
	cond, args := q.where()
	counts, err := l.groupCounts(ctx, `SELECT status, COUNT(*) FROM beam_messages`+cond+` GROUP BY status`, args)
	if err != nil {
		return nil, fmt.Errorf("count messages: %w", err)
	}
	out := make(map[State]int64, len(counts))
	for k, n := range counts {
		out[State(k)] = n
	}
	return out, nil
}

// MessageCountsByAgent counts the messages each agent sent (bySender) or
// received among the messages q selects (its paging and order ignored), at
// most limit agents, the busiest first.
func (l *Log) MessageCountsByAgent(ctx context.Context, bySender bool, q MessageQuery, limit int) (map[string]int64, error) {
	col := "recipient"
	if bySender {
		col = "sender"
	}
	cond, args := q.where()
	counts, err := l.groupCounts(ctx, `SELECT `+col+`, COUNT(*) FROM beam_messages`+cond+
		` GROUP BY `+col+` ORDER BY COUNT(*) DESC LIMIT ?`, append(args, limit))
	if err != nil {
		return nil, fmt.Errorf("count messages by %s: %w", col, err)
	}
	return counts, nil
}

func (l *Log) groupCounts(ctx context.Context, query string, args []any) (map[string]int64, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	rows, err := l.rdb.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var key string
		var n int64
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		out[key] = n
	}
	return out, rows.Err()
}

// MessageByID returns the beam_messages row with message id; false when
// there is none.
func (l *Log) MessageByID(ctx context.Context, id string) (MessageRow, bool, error) {
	if e := l.pendingMessage(id); e != nil {
		return *e.msg, true, nil
	}
	var m MessageRow
	err := scanMessage(l.reads.messageByID.QueryRowContext(ctx, id), &m)
	if errors.Is(err, sql.ErrNoRows) {
		return MessageRow{}, false, nil
	}
	if err != nil {
		return MessageRow{}, false, fmt.Errorf("read message %q: %w", id, err)
	}
	return m, true, nil
}

// MessageState is a message's row together with the attempt and transport
// of its latest event, read in one statement so both come from one commit.
type MessageState struct {
	MessageRow
	Attempt   int
	Transport string
}

// MessageState returns nonce's message with its latest attempt; false when
// the nonce is not a bus message.
func (l *Log) MessageState(ctx context.Context, nonce string) (MessageState, bool, error) {
	if e := l.pending(nonce); e != nil {
		if e.msg == nil {
			return MessageState{}, false, nil
		}
		return MessageState{MessageRow: *e.msg, Attempt: e.row.Attempt, Transport: e.row.Transport}, true, nil
	}
	var c MessageState
	m := &c.MessageRow
	err := l.reads.messageState.QueryRowContext(ctx, nonce).Scan(&m.ID, &m.Nonce, &m.Sender, &m.Recipient, &m.Intent,
		&m.Payload, &m.Status, &m.Priority, &m.RetryCount, &m.MaxRetries, &m.NextRetryAt, &m.CreatedAt, &m.DeliveredAt,
		&m.AckedAt, &m.FailedAt, &m.Error, &m.Response, &m.TraceID, &m.Metadata, &m.LeaseOwner, &m.LeaseExpiresAt,
		&m.UpdatedAt, &m.LastSeq, &c.Attempt, &c.Transport)
	if errors.Is(err, sql.ErrNoRows) {
		return MessageState{}, false, nil
	}
	if err != nil {
		return MessageState{}, false, fmt.Errorf("read message %q: %w", nonce, err)
	}
	return c, true, nil
}

// HasNonce reports whether the log has any event of nonce.
func (l *Log) HasNonce(ctx context.Context, nonce string) (bool, error) {
	if l.pending(nonce) != nil {
		return true, nil
	}
	var one int
	err := l.reads.hasNonce.QueryRowContext(ctx, nonce).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up nonce %q: %w", nonce, err)
	}
	return true, nil
}

// MessageNonce returns the nonce of message id.
func (l *Log) MessageNonce(ctx context.Context, id string) (string, bool, error) {
	if e := l.pendingMessage(id); e != nil {
		return e.msg.Nonce, true, nil
	}
	var nonce string
	err := l.reads.messageNonce.QueryRowContext(ctx, id).Scan(&nonce)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("look up message %q: %w", id, err)
	}
	return nonce, true, nil
}

// FirstDetails returns the details of nonce's first event.
func (l *Log) FirstDetails(ctx context.Context, nonce string) (Details, error) {
	if e := l.pending(nonce); e != nil {
		return l.detailsOf(ctx, l.reads.detailsBySeq, e.row.FirstSeq, nonce, "first")
	}
	return l.detailsOf(ctx, l.reads.firstDetails, nonce, nonce, "first")
}

// LastDetails returns the details of nonce's latest event.
func (l *Log) LastDetails(ctx context.Context, nonce string) (Details, error) {
	if e := l.pending(nonce); e != nil {
		return l.detailsOf(ctx, l.reads.detailsBySeq, e.row.LastSeq, nonce, "latest")
	}
	return l.detailsOf(ctx, l.reads.lastDetails, nonce, nonce, "latest")
}

// detailsOf reads the details of one event of nonce with st, which selects
// it by key (the nonce, or the event's seq).
func (l *Log) detailsOf(ctx context.Context, st *sql.Stmt, key any, nonce, which string) (Details, error) {
	var raw []byte
	if err := st.QueryRowContext(ctx, key).Scan(&raw); err != nil {
		return Details{}, fmt.Errorf("read %s event of %q: %w", which, nonce, err)
	}
	var d Details
	if err := json.Unmarshal(raw, &d); err != nil {
		return Details{}, fmt.Errorf("decode %s event of %q: %w", which, nonce, err)
	}
	return d, nil
}

// WaitingMessages returns up to limit nonces of recipient's queued messages
// created at or after since that are due at now (epoch seconds) or wait for
// it to connect, highest priority and oldest first.
func (l *Log) WaitingMessages(ctx context.Context, recipient string, now, since float64, limit int) ([]string, error) {
	return l.nonces(ctx, l.reads.waiting, recipient, now, since, limit)
}

// InterruptedMessages returns the nonces of messages a stopped process left
// in received, validated or dispatched, oldest first.
func (l *Log) InterruptedMessages(ctx context.Context) ([]string, error) {
	return l.nonces(ctx, l.reads.interrupted)
}

// ExpiredLeases returns up to limit nonces of dispatched messages whose
// poll lease ran out at now (epoch seconds), earliest expiry first.
func (l *Log) ExpiredLeases(ctx context.Context, now float64, limit int) ([]string, error) {
	return l.nonces(ctx, l.reads.expiredLeases, now, limit)
}

// DueMessages returns up to limit nonces of queued messages whose retry is
// due at now (epoch seconds), highest priority and oldest first.
func (l *Log) DueMessages(ctx context.Context, now float64, limit int) ([]string, error) {
	return l.nonces(ctx, l.reads.due, now, limit)
}

// DeliveredMessage is a message waiting in delivered.
type DeliveredMessage struct {
	Nonce string
	// At is when it was delivered (or last changed), epoch seconds.
	At float64
}

// DeliveredMessages returns every message in delivered.
func (l *Log) DeliveredMessages(ctx context.Context) ([]DeliveredMessage, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	rows, err := l.reads.delivered.QueryContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("read delivered messages: %w", err)
	}
	defer rows.Close()
	var out []DeliveredMessage
	for rows.Next() {
		var d DeliveredMessage
		if err := rows.Scan(&d.Nonce, &d.At); err != nil {
			return nil, fmt.Errorf("read delivered messages: %w", err)
		}
		out = append(out, d)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read delivered messages: %w", err)
	}
	return out, nil
}

// MessageDepth counts the messages waiting (queued or dispatched) and the
// dead letters.
func (l *Log) MessageDepth(ctx context.Context) (waiting, dead int64, err error) {
	if err := l.sync(ctx); err != nil {
		return 0, 0, err
	}
	if err := l.rdb.QueryRowContext(ctx, `SELECT COALESCE(SUM(status IN ('queued','dispatched')), 0),
		COALESCE(SUM(status = 'dead_letter'), 0) FROM beam_messages`).Scan(&waiting, &dead); err != nil {
		return 0, 0, fmt.Errorf("count bus messages: %w", err)
	}
	return waiting, dead, nil
}

func (l *Log) nonces(ctx context.Context, st *sql.Stmt, args ...any) ([]string, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, fmt.Errorf("select messages: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("select messages: %w", err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("select messages: %w", err)
	}
	return out, nil
}

// EachTransition calls fn with every event's nonce and state, grouped by
// nonce and in seq order within a nonce: a whole-log pass for checking that
// every trace is a legal path.
func (l *Log) EachTransition(ctx context.Context, fn func(nonce string, state State) error) error {
	rows, err := l.rdb.QueryContext(ctx, `SELECT nonce, state FROM intent_trace_events ORDER BY first_seq, seq`)
	if err != nil {
		return fmt.Errorf("read traces: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var n, s string
		if err := rows.Scan(&n, &s); err != nil {
			return fmt.Errorf("read traces: %w", err)
		}
		if err := fn(n, State(s)); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read traces: %w", err)
	}
	return nil
}

// ProjectionTables names the log's own tables that Rebuild derives from
// the log; Snapshot reads the owners' registered projections too.
var ProjectionTables = []string{"intent_log", "beam_messages", "beam_mesh"}

// Snapshot reads every row of every projection table, keyed by table, then
// by nonce, as a string of all its columns: two snapshots are equal exactly
// when the projections hold the same rows.
func (l *Log) Snapshot(ctx context.Context) (map[string]map[string]string, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	out := map[string]map[string]string{}
	tables := ProjectionTables
	for _, p := range projections() {
		tables = append(tables[:len(tables):len(tables)], p.Table)
	}
	for _, t := range tables {
		rows, err := l.rdb.QueryContext(ctx, "SELECT * FROM "+t)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", t, err)
		}
		m, err := snapshotRows(rows)
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", t, err)
		}
		out[t] = m
	}
	return out, nil
}

func snapshotRows(rows *sql.Rows) (map[string]string, error) {
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	m := map[string]string{}
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		var key string
		var sb strings.Builder
		for i, v := range vals {
			if bs, ok := v.([]byte); ok {
				v = string(bs)
			}
			if cols[i] == "nonce" {
				key = fmt.Sprint(v)
			}
			fmt.Fprintf(&sb, "%s=%v;", cols[i], v)
		}
		m[key] = sb.String()
	}
	return m, rows.Err()
}

// readStmts are the hot reads, prepared once on the read pool: the pure-Go
// SQLite compiles ad-hoc SQL text on every call, which cost more CPU than
// running it.
type readStmts struct {
	messageState, hasNonce, firstDetails, lastDetails, waiting, messageNonce, messageByID *sql.Stmt
	detailsBySeq                                                                          *sql.Stmt
	interrupted, expiredLeases, due, delivered                                            *sql.Stmt
	meshByID, meshDue, meshExpired                                                        *sql.Stmt
}

func prepareReads(ctx context.Context, db *sql.DB) (*readStmts, error) {
	r := &readStmts{}
	const stateCols = `m.id, m.nonce, m.sender, m.recipient, m.intent, m.payload, m.status, m.priority,
  m.retry_count, m.max_retries, m.next_retry_at, m.created_at, m.delivered_at, m.acked_at, m.failed_at, m.error,
  m.response, m.trace_id, m.metadata, m.lease_owner, m.lease_expires_at, m.updated_at, m.last_seq,
  i.attempt, i.transport`
	for _, s := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&r.messageState, `SELECT ` + stateCols + ` FROM beam_messages m JOIN intent_log i ON i.nonce = m.nonce WHERE m.nonce = ?`},
		{&r.hasNonce, `SELECT 1 FROM intent_log WHERE nonce = ?`},
		{&r.firstDetails, `SELECT details FROM intent_trace_events WHERE seq = (SELECT first_seq FROM intent_log WHERE nonce = ?)`},
		{&r.lastDetails, `SELECT details FROM intent_trace_events WHERE seq = (SELECT last_seq FROM intent_log WHERE nonce = ?)`},
		{&r.detailsBySeq, `SELECT details FROM intent_trace_events WHERE seq = ?`},
		{&r.waiting, `SELECT nonce FROM beam_messages WHERE recipient = ? AND status = 'queued'
			AND (next_retry_at IS NULL OR next_retry_at <= ?) AND created_at >= ? ORDER BY priority DESC, created_at LIMIT ?`},
		{&r.messageNonce, `SELECT nonce FROM beam_messages WHERE id = ?`},
		{&r.messageByID, `SELECT ` + messageCols + ` FROM beam_messages WHERE id = ?`},
		{&r.interrupted, `SELECT nonce FROM beam_messages WHERE status IN ('received','validated','dispatched') ORDER BY created_at`},
		{&r.expiredLeases, `SELECT nonce FROM beam_messages WHERE status = 'dispatched'
			AND lease_expires_at IS NOT NULL AND lease_expires_at <= ? ORDER BY lease_expires_at LIMIT ?`},
		{&r.due, `SELECT nonce FROM beam_messages WHERE status = 'queued'
			AND next_retry_at IS NOT NULL AND next_retry_at <= ? ORDER BY priority DESC, created_at LIMIT ?`},
		{&r.delivered, `SELECT nonce, COALESCE(delivered_at, updated_at) FROM beam_messages WHERE status = 'delivered'`},
		{&r.meshByID, selectMeshByID},
		{&r.meshDue, selectMeshDue},
		{&r.meshExpired, selectMeshExpired},
	} {
		st, err := db.PrepareContext(ctx, s.query)
		if err != nil {
			r.close()
			return nil, fmt.Errorf("prepare log query: %w", err)
		}
		*s.dst = st
	}
	return r, nil
}

func (r *readStmts) close() {
	if r == nil {
		return
	}
	for _, st := range []*sql.Stmt{r.messageState, r.hasNonce, r.firstDetails, r.lastDetails, r.waiting,
		r.messageNonce, r.messageByID, r.interrupted, r.expiredLeases, r.due, r.delivered,
		r.meshByID, r.meshDue, r.meshExpired, r.detailsBySeq} {
		if st != nil {
			_ = st.Close()
		}
	}
}

// whereClause builds a WHERE clause from conditions joined by AND.
type whereClause struct {
	conds []string
	args  []any
}

func (w *whereClause) add(cond string, args ...any) {
	w.conds = append(w.conds, cond)
	w.args = append(w.args, args...)
}

func (w *whereClause) eq(col, v string) {
	if v != "" {
		w.add(col+` = ?`, v)
	}
}

func (w *whereClause) states(col string, states []State) {
	if len(states) == 0 {
		return
	}
	args := make([]any, len(states))
	for i, s := range states {
		args[i] = string(s)
	}
	w.add(col+` IN (`+placeholders(len(args))+`)`, args...)
}

func (w *whereClause) String() string {
	if len(w.conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(w.conds, " AND ")
}

// likePattern is a LIKE pattern matching s anywhere, with % _ \ escaped.
func likePattern(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(s) + "%"
}

func placeholders(n int) string {
	if n <= 0 {
		return ""
	}
	return strings.Repeat("?,", n-1) + "?"
}

// InboxDepth is how many bus messages wait for one recipient.
type InboxDepth struct {
	// Queued messages wait for a delivery attempt or a retry.
	Queued int64 `json:"queued"`
	// Dispatched messages are being delivered or are leased to a poller.
	Dispatched int64 `json:"dispatched"`
}

// InboxDepths counts the queued and dispatched bus messages of each of the
// recipients; recipients with none are left out of the map.
func (l *Log) InboxDepths(ctx context.Context, recipients []string) (map[string]InboxDepth, error) {
	if err := l.sync(ctx); err != nil {
		return nil, err
	}
	out := make(map[string]InboxDepth, len(recipients))
	const chunk = 500 // well under SQLite's bound-parameter limit
	for start := 0; start < len(recipients); start += chunk {
		part := recipients[start:min(start+chunk, len(recipients))]
		args := make([]any, len(part))
		for i, r := range part {
			args[i] = r
		}
		rows, err := l.rdb.QueryContext(ctx, `SELECT recipient, COALESCE(SUM(status = 'queued'), 0), COALESCE(SUM(status = 'dispatched'), 0)
			FROM beam_messages WHERE status IN ('queued','dispatched') AND recipient IN (?`+strings.Repeat(",?", len(part)-1)+`)
			GROUP BY recipient`, args...)
		if err != nil {
			return nil, fmt.Errorf("count inbox depths: %w", err)
		}
		for rows.Next() {
			var r string
			var d InboxDepth
			if err := rows.Scan(&r, &d.Queued, &d.Dispatched); err != nil {
				rows.Close()
				return nil, fmt.Errorf("count inbox depths: %w", err)
			}
			out[r] = d
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, fmt.Errorf("count inbox depths: %w", err)
		}
	}
	return out, nil
}

// OldestIntentSince returns the request time of the oldest intent
// requested at or after since; false when there is none.
func (l *Log) OldestIntentSince(ctx context.Context, since time.Time) (time.Time, bool, error) {
	if err := l.sync(ctx); err != nil {
		return time.Time{}, false, err
	}
	var us sql.NullInt64
	if err := l.rdb.QueryRowContext(ctx, `SELECT MIN(requested_at) FROM intent_log WHERE requested_at >= ?`, since.UnixMicro()).Scan(&us); err != nil {
		return time.Time{}, false, fmt.Errorf("oldest intent: %w", err)
	}
	if !us.Valid {
		return time.Time{}, false, nil
	}
	return time.UnixMicro(us.Int64).UTC(), true, nil
}
