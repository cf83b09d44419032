package tracing

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/jmoiron/sqlx"
)

// stmtID names a prepared statement of the writer.
type stmtID int

// Single-row statements.
const (
	stSelIntent stmtID = iota
	stSelIntentSeq
	stSelMessage
	stSelMessageID
	stUpdIntent
	stUpdMessage
	stSelMesh
	stUpsMesh
	stSetProjSeq
	stSingles
)

// multiKind names a multi-row statement; each is prepared for every power of
// two up to multiMaxRows rows, so any number of rows takes at most
// multiLevels executions.
type multiKind int

const (
	mEvents multiKind = iota
	mIntentInsert
	mIntentUpsert
	mMessageInsert
	mIntentIn  // SELECT intent_log rows by a list of nonces
	mMessageIn // SELECT beam_messages rows by a list of nonces
	mIDIn      // SELECT the beam_messages ids among a list of ids
	multiKinds
)

const (
	multiLevels  = 8 // 1, 2, 4, ..., 128 rows
	multiMaxRows = 1 << (multiLevels - 1)
	stmtCount    = int(stSingles) + int(multiKinds)*multiLevels
)

func singleSQL(id stmtID) string {
	switch id {
	case stSelIntent:
		return selectIntent
	case stSelIntentSeq:
		return selectIntentSeq
	case stSelMessage:
		return selectMessage
	case stSelMessageID:
		return selectMessageID
	case stUpdIntent:
		return updateIntent
	case stSelMesh:
		return selectMesh
	case stUpsMesh:
		return upsertMesh
	case stSetProjSeq:
		return setProjSeq
	default:
		return updateMessage
	}
}

// intentUpsertSet rewrites, on conflict, the intent_log columns the fold may
// change after the first event (nonce, owner, requested_at and
// client_timestamp never change), so SQLite leaves the requested_at and
// nonce indexes alone.
const intentUpsertSet = ` ON CONFLICT(first_seq) DO UPDATE SET from_beam_id=excluded.from_beam_id,
  to_beam_id=excluded.to_beam_id, intent_type=excluded.intent_type, status=excluded.status,
  attempt=excluded.attempt, transport=excluded.transport, timeout_ms=excluded.timeout_ms,
  error_code=excluded.error_code, completed_at=excluded.completed_at,
  round_trip_latency_ms=excluded.round_trip_latency_ms, result_json=excluded.result_json,
  updated_at=excluded.updated_at, last_seq=excluded.last_seq`

func multiWidth(k multiKind) int {
	switch k {
	case mIntentIn, mMessageIn, mIDIn:
		return 1
	case mEvents:
		return eventInsertWidth
	case mIntentInsert, mIntentUpsert:
		return intentWidth
	default:
		return messageWidth
	}
}

func multiSQL(k multiKind, rows int) string {
	var head, tail string
	switch k {
	case mIDIn:
		return `SELECT id FROM beam_messages WHERE id IN (` + strings.Repeat("?,", rows-1) + `?)`
	case mIntentIn, mMessageIn:
		table, cols := "intent_log", intentCols
		if k == mMessageIn {
			table, cols = "beam_messages", messageCols
		}
		return `SELECT ` + cols + ` FROM ` + table + ` WHERE nonce IN (` + strings.Repeat("?,", rows-1) + `?)`
	// The plain inserts say OR ROLLBACK: a failing insert fails the whole
	// batch anyway (commitBatch rolls it back), and without the default
	// ABORT SQLite keeps no statement journal (a copy of every page the
	// statement changes that the transaction had changed before). The
	// upsert's DO UPDATE keeps ABORT, as SQLite requires.
	case mEvents:
		head = `INSERT OR ROLLBACK INTO intent_trace_events(` + eventInsertCols + `) VALUES`
	case mIntentInsert:
		head = `INSERT OR ROLLBACK INTO intent_log(` + intentCols + `) VALUES`
	case mIntentUpsert:
		head = `INSERT INTO intent_log(` + intentCols + `) VALUES`
		tail = intentUpsertSet
	default:
		head = `INSERT OR ROLLBACK INTO beam_messages(` + messageCols + `) VALUES`
	}
	row := "(" + strings.Repeat("?,", multiWidth(k)-1) + "?)"
	if k == mEvents {
		row = eventRowSQL
	}
	var sb strings.Builder
	sb.Grow(len(head) + rows*(len(row)+1) + len(tail))
	sb.WriteString(head)
	for i := range rows {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(row)
	}
	sb.WriteString(tail)
	return sb.String()
}

// eventRowSQL is one row of the event insert (eventInsertCols). The four
// party and transport columns are empty on most events after the first; an
// empty one is bound as NULL and stored as the empty string (eventNV),
// which spares the driver a C string per value.
const eventRowSQL = `(?,?,?,coalesce(?,''),coalesce(?,''),coalesce(?,''),coalesce(?,''),?,?,?)`

func multiID(k multiKind, level int) stmtID {
	return stSingles + stmtID(int(k)*multiLevels+level)
}

// prepareStmts prepares the writer's statements.
func prepareStmts(ctx context.Context, db *sqlx.DB) ([]*sql.Stmt, error) {
	stmts := make([]*sql.Stmt, stmtCount)
	fail := func(q string, err error) ([]*sql.Stmt, error) {
		closeStmts(stmts)
		return nil, fmt.Errorf("prepare %q: %w", q[:min(len(q), 40)], err)
	}
	for id := stmtID(0); id < stSingles; id++ {
		q := singleSQL(id)
		s, err := db.PrepareContext(ctx, q)
		if err != nil {
			return fail(q, err)
		}
		stmts[id] = s
	}
	for k := multiKind(0); k < multiKinds; k++ {
		for level := range multiLevels {
			q := multiSQL(k, 1<<level)
			s, err := db.PrepareContext(ctx, q)
			if err != nil {
				return fail(q, err)
			}
			stmts[multiID(k, level)] = s
		}
	}
	return stmts, nil
}

func closeStmts(stmts []*sql.Stmt) {
	for _, s := range stmts {
		if s != nil {
			_ = s.Close()
		}
	}
}

// txStmts binds the writer's prepared statements to one transaction, each
// on first use.
type txStmts struct {
	ctx   context.Context
	tx    *sqlx.Tx
	stmts []*sql.Stmt
	bound [stmtCount]*sql.Stmt
	// owned holds the statements on the owners' projections (owned.go).
	owned map[string]*sql.Stmt
}

// queryRow runs q, which is not prepared, in the transaction.
func (ts *txStmts) queryRow(q string, args ...any) *sql.Row {
	return ts.tx.QueryRowContext(ts.ctx, q, args...)
}

// exec runs statement id with args.
func (ts *txStmts) exec(id stmtID, args []any) error {
	_, err := ts.get(id).ExecContext(ts.ctx, args...)
	return err
}

func (ts *txStmts) get(id stmtID) *sql.Stmt {
	if s := ts.bound[id]; s != nil {
		return s
	}
	s := ts.tx.StmtContext(ts.ctx, ts.stmts[id])
	ts.bound[id] = s
	return s
}

// queryMulti runs a list query (mIntentIn, mMessageIn) for all of args,
// calling row for each result row.
func (ts *txStmts) queryMulti(k multiKind, args []any, row func(*sql.Rows) error) error {
	n, done := len(args), 0
	for level := multiLevels - 1; level >= 0; level-- {
		size := 1 << level
		for n-done >= size {
			rows, err := ts.get(multiID(k, level)).Query(args[done : done+size]...)
			if err != nil {
				return err
			}
			for rows.Next() {
				if err := row(rows); err != nil {
					rows.Close()
					return err
				}
			}
			err = rows.Err()
			rows.Close()
			if err != nil {
				return err
			}
			done += size
		}
	}
	return nil
}

// execMulti inserts the rows in args (multiWidth(k) values each) with as
// few statements as the prepared row counts allow, in their order. It
// returns the rowid of the last row inserted.
func (ts *txStmts) execMulti(k multiKind, args []any) (lastRowID int64, err error) {
	width := multiWidth(k)
	n := len(args) / width
	done := 0
	var res sql.Result
	for level := multiLevels - 1; level >= 0; level-- {
		size := 1 << level
		for n-done >= size {
			res, err = ts.get(multiID(k, level)).ExecContext(ts.ctx, args[done*width:(done+size)*width]...)
			if err != nil {
				return 0, err
			}
			done += size
		}
	}
	if res == nil {
		return 0, nil
	}
	return res.LastInsertId()
}
