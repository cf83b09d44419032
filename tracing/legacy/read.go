package legacy

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// pageSize is how many rows are read per query when paging through a table.
const pageSize = 256

// source is an open legacy database and what it contains.
type source struct {
	db *sql.DB
	// tables maps each legacy table found to its column names.
	tables map[string]map[string]bool
}

// legacyTables are the tables Import reads.
var legacyTables = []string{"intent_log", "intent_trace_events", "beam_messages"}

// required lists the columns a legacy table must have to be read.
var required = map[string][]string{
	"intent_log":          {"id", "from_beam_id", "to_beam_id", "intent_type", "requested_at", "status"},
	"intent_trace_events": {"id", "nonce", "stage", "timestamp"},
	"beam_messages":       {"id", "sender", "recipient", "intent", "created_at"},
}

// openSource opens the database at path read-only and finds its legacy
// tables. It fails when the file is absent, is not a SQLite database, or has
// none of the legacy tables.
func openSource(ctx context.Context, path string) (*source, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("open legacy database: %w", err)
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("open legacy database: %s is a directory", path)
	}
	u := url.URL{Scheme: "file", OmitHost: true, Path: path, RawQuery: "mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(5000)"}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return nil, fmt.Errorf("open legacy database %s: %w", path, err)
	}
	db.SetMaxOpenConns(2)
	src := &source{db: db, tables: map[string]map[string]bool{}}
	if err := src.inspect(ctx); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open legacy database %s: %w", path, err)
	}
	return src, nil
}

// inspect fills s.tables and checks the required columns.
func (s *source) inspect(ctx context.Context) error {
	for _, t := range legacyTables {
		rows, err := s.db.QueryContext(ctx, "SELECT name FROM pragma_table_info(?)", t)
		if err != nil {
			return fmt.Errorf("read schema of %s: %w", t, err)
		}
		cols := map[string]bool{}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				_ = rows.Close()
				return fmt.Errorf("read schema of %s: %w", t, err)
			}
			cols[strings.ToLower(name)] = true
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return fmt.Errorf("read schema of %s: %w", t, err)
		}
		if len(cols) == 0 {
			continue
		}
		for _, c := range required[t] {
			if !cols[c] {
				return fmt.Errorf("table %s has no column %s", t, c)
			}
		}
		s.tables[t] = cols
	}
	if len(s.tables) == 0 {
		return errors.New("no legacy Beam tables (intent_log, intent_trace_events, beam_messages) found")
	}
	return nil
}

func (s *source) close() error { return s.db.Close() }

func (s *source) has(table string) bool { return s.tables[table] != nil }

// col returns the column expression for c in table, or NULL when the table
// lacks that optional column.
func (s *source) col(table, c string) string {
	if s.tables[table][c] {
		return c
	}
	return "NULL"
}

// intentRow is one row of the legacy intent_log.
type intentRow struct {
	ID          int64
	Nonce       sql.NullString
	From        sql.NullString
	To          sql.NullString
	IntentType  sql.NullString
	RequestedAt any
	CompletedAt any
	LatencyMs   any
	Status      sql.NullString
	ErrorCode   sql.NullString
	ResultJSON  sql.NullString
}

// nonce is the row's nonce, or legacy-intent-<id> when the table has no
// nonce (or the row's is NULL), as the reference migration names them.
func (r *intentRow) nonce() string {
	if r.Nonce.Valid && r.Nonce.String != "" {
		return r.Nonce.String
	}
	return fmt.Sprintf("legacy-intent-%d", r.ID)
}

// intentPage reads up to pageSize intent_log rows with id > after.
func (s *source) intentPage(ctx context.Context, after int64) ([]intentRow, error) {
	const t = "intent_log"
	q := fmt.Sprintf(`SELECT id, %s, from_beam_id, to_beam_id, intent_type, requested_at, %s, %s, status, %s, %s
		FROM intent_log WHERE id > ? ORDER BY id LIMIT %d`,
		s.col(t, "nonce"), s.col(t, "completed_at"), s.col(t, "round_trip_latency_ms"),
		s.col(t, "error_code"), s.col(t, "result_json"), pageSize)
	rows, err := s.db.QueryContext(ctx, q, after)
	if err != nil {
		return nil, fmt.Errorf("read intent_log: %w", err)
	}
	defer rows.Close()
	var out []intentRow
	for rows.Next() {
		var r intentRow
		if err := rows.Scan(&r.ID, &r.Nonce, &r.From, &r.To, &r.IntentType, &r.RequestedAt, &r.CompletedAt,
			&r.LatencyMs, &r.Status, &r.ErrorCode, &r.ResultJSON); err != nil {
			return nil, fmt.Errorf("read intent_log: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read intent_log: %w", err)
	}
	return out, nil
}

// traceRow is one row of the legacy intent_trace_events.
type traceRow struct {
	ID         int64
	Nonce      string
	From       sql.NullString
	To         sql.NullString
	IntentType sql.NullString
	Stage      sql.NullString
	Status     sql.NullString
	Timestamp  any
	Details    sql.NullString
}

// traces reads the trace events of nonce, at most limit+1 of them so that
// the caller can tell when a nonce has too many.
func (s *source) traces(ctx context.Context, nonce string, limit int) ([]traceRow, error) {
	if !s.has("intent_trace_events") {
		return nil, nil
	}
	const t = "intent_trace_events"
	q := fmt.Sprintf(`SELECT id, nonce, %s, %s, %s, stage, %s, timestamp, %s
		FROM intent_trace_events WHERE nonce = ? ORDER BY timestamp, id LIMIT %d`,
		s.col(t, "from_beam_id"), s.col(t, "to_beam_id"), s.col(t, "intent_type"),
		s.col(t, "status"), s.col(t, "details"), limit+1)
	rows, err := s.db.QueryContext(ctx, q, nonce)
	if err != nil {
		return nil, fmt.Errorf("read intent_trace_events: %w", err)
	}
	defer rows.Close()
	var out []traceRow
	for rows.Next() {
		var r traceRow
		if err := rows.Scan(&r.ID, &r.Nonce, &r.From, &r.To, &r.IntentType, &r.Stage, &r.Status,
			&r.Timestamp, &r.Details); err != nil {
			return nil, fmt.Errorf("read intent_trace_events: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read intent_trace_events: %w", err)
	}
	return out, nil
}

// orphanPage reads up to pageSize distinct nonces greater than after that
// have trace events but no intent_log row.
func (s *source) orphanPage(ctx context.Context, after string) ([]string, error) {
	if !s.has("intent_trace_events") {
		return nil, nil
	}
	filter := ""
	if s.has("intent_log") && s.tables["intent_log"]["nonce"] {
		filter = "AND nonce NOT IN (SELECT nonce FROM intent_log WHERE nonce IS NOT NULL)"
	}
	q := fmt.Sprintf(`SELECT DISTINCT nonce FROM intent_trace_events
		WHERE nonce IS NOT NULL AND nonce > ? %s ORDER BY nonce LIMIT %d`, filter, pageSize)
	rows, err := s.db.QueryContext(ctx, q, after)
	if err != nil {
		return nil, fmt.Errorf("read intent_trace_events: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, fmt.Errorf("read intent_trace_events: %w", err)
		}
		out = append(out, n)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read intent_trace_events: %w", err)
	}
	return out, nil
}

// busRow is one row of the legacy beam_messages.
type busRow struct {
	RowID       int64
	ID          string
	Nonce       sql.NullString
	Sender      sql.NullString
	Recipient   sql.NullString
	Intent      sql.NullString
	Payload     sql.NullString
	Status      sql.NullString
	Priority    any
	RetryCount  any
	MaxRetries  any
	NextRetryAt any
	CreatedAt   any
	DeliveredAt any
	AckedAt     any
	FailedAt    any
	Error       sql.NullString
	Response    sql.NullString
	TraceID     sql.NullString
	Metadata    sql.NullString
}

// nonce is the row's nonce, or its id when the nonce is NULL (as the bus
// migration fills it).
func (r *busRow) nonce() string {
	if r.Nonce.Valid && r.Nonce.String != "" {
		return r.Nonce.String
	}
	return r.ID
}

// busPage reads up to pageSize beam_messages rows with rowid > after, in
// insertion order.
func (s *source) busPage(ctx context.Context, after int64) ([]busRow, error) {
	const t = "beam_messages"
	c := func(name string) string { return s.col(t, name) }
	q := fmt.Sprintf(`SELECT rowid, CAST(id AS TEXT), %s, sender, recipient, intent, %s, %s, %s, %s, %s, %s,
		created_at, %s, %s, %s, %s, %s, %s, %s
		FROM beam_messages WHERE rowid > ? ORDER BY rowid LIMIT %d`,
		c("nonce"), c("payload"), c("status"), c("priority"), c("retry_count"), c("max_retries"),
		c("next_retry_at"), c("delivered_at"), c("acked_at"), c("failed_at"), c("error"), c("response"),
		c("trace_id"), c("metadata"), pageSize)
	rows, err := s.db.QueryContext(ctx, q, after)
	if err != nil {
		return nil, fmt.Errorf("read beam_messages: %w", err)
	}
	defer rows.Close()
	var out []busRow
	for rows.Next() {
		var r busRow
		var id sql.NullString
		if err := rows.Scan(&r.RowID, &id, &r.Nonce, &r.Sender, &r.Recipient, &r.Intent, &r.Payload, &r.Status,
			&r.Priority, &r.RetryCount, &r.MaxRetries, &r.NextRetryAt, &r.CreatedAt, &r.DeliveredAt, &r.AckedAt,
			&r.FailedAt, &r.Error, &r.Response, &r.TraceID, &r.Metadata); err != nil {
			return nil, fmt.Errorf("read beam_messages: %w", err)
		}
		r.ID = id.String
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read beam_messages: %w", err)
	}
	return out, nil
}
