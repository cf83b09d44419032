package tracing

import (
	"context"
	"fmt"
	"strings"
)

// EachDetails calls fn with the nonce and the stored details (a JSON
// object) of every event of the log after afterSeq, in seq order, until
// fn's first error, which it returns; fn must not retain details. Owners
// that refold something of their own from the log (federation's
// RebuildOutbox) read it through here, so that the SQL on the log's tables
// stays in this package.
func (l *Log) EachDetails(ctx context.Context, afterSeq int64, fn func(nonce string, details []byte) error) error {
	rows, err := l.rdb.QueryContext(ctx, `SELECT nonce, details FROM intent_trace_events WHERE seq > ? ORDER BY seq`, afterSeq)
	if err != nil {
		return fmt.Errorf("read event details: %w", err)
	}
	defer rows.Close()
	var nonce string
	var details []byte
	for rows.Next() {
		if err := rows.Scan(&nonce, &details); err != nil {
			return fmt.Errorf("read event details: %w", err)
		}
		if err := fn(nonce, details); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read event details: %w", err)
	}
	return nil
}

// IntentNotIn returns an SQL condition, for a query of the read pool
// (ReadDB) on a table of another component, that holds for a row whose
// intent, named by the row's column nonceColumn, is not in one of states
// (or has no intent_log row), and its arguments. nonceColumn must be a
// column reference written by the caller, never input.
func IntentNotIn(nonceColumn string, states ...State) (string, []any) {
	marks := strings.TrimSuffix(strings.Repeat("?,", len(states)), ",")
	args := make([]any, len(states))
	for i, s := range states {
		args[i] = string(s)
	}
	return `NOT EXISTS (SELECT 1 FROM intent_log i WHERE i.nonce = ` + nonceColumn + ` AND i.status IN (` + marks + `))`, args
}
