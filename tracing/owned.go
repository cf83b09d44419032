package tracing

import (
	"context"
	"database/sql"
	"encoding"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/jmoiron/sqlx"
)

// Projections registered by the owners of nonces.
//
// A system that folds its nonces' events into rows of its own (the job bus:
// one row per job) registers the fold with its lifecycle (Lifecycle.
// Projection) instead of reading the log itself. The log's writer then
// keeps the row next to the nonce's intent_log row: it folds every event of
// the nonce into it, writes it behind the log with the other projection
// rows (behind.go), folds the events after the high-water mark into it on
// Open (catchUp), and refolds it in Rebuild. The owner reads its rows with
// OwnedRows, after a read barrier, so a start reads its rows, not the log.
//
// The table has one row per nonce: (first_seq, nonce, last_seq, row), the
// row in the owner's stored form (MarshalBinary). It is keyed by the
// nonce's first seq, as intent_log is, so that new rows are appended at the
// end of the table rather than split into its middle.

// ProjectedRow is one row of an owner's projection.
type ProjectedRow interface {
	// Apply folds ev, the next event of the row's nonce in seq order (on a
	// new row, its first event). It must be a pure function of the events,
	// so that a refold of the log gives the same row.
	Apply(ev Event)
	// Clone returns a copy that no later Apply of either changes.
	Clone() ProjectedRow
	encoding.BinaryMarshaler
	encoding.BinaryUnmarshaler
}

// Projection is the table an owner folds from the events of its nonces.
type Projection struct {
	// Table names the table (lower case letters and underscores).
	Table string
	// New returns an empty row.
	New func() ProjectedRow
}

var tableName = regexp.MustCompile(`^[a-z][a-z_]*$`)

func (p *Projection) check() error {
	if p.New == nil || !tableName.MatchString(p.Table) {
		return fmt.Errorf("projection %q: a table name of lower case letters and a New function are required", p.Table)
	}
	return nil
}

func (p *Projection) schema() string {
	return `CREATE TABLE IF NOT EXISTS ` + p.Table +
		`(first_seq INTEGER PRIMARY KEY, nonce TEXT NOT NULL, last_seq INTEGER NOT NULL, row BLOB NOT NULL)`
}

func (p *Projection) selectSQL() string {
	return `SELECT row FROM ` + p.Table + ` WHERE first_seq = ?`
}

// ownedWidth is the number of values of a row of an owner's projection.
const ownedWidth = 4

// ownedLevels is how many multi-row upserts are prepared per projection:
// for 1, 2, 4, ... rows.
const ownedLevels = 7

// upsertSQL upserts n rows.
func (p *Projection) upsertSQL(n int) string {
	values := strings.TrimSuffix(strings.Repeat("(?,?,?,?),", n), ",")
	return `INSERT INTO ` + p.Table + `(first_seq, nonce, last_seq, row) VALUES` + values + `
  ON CONFLICT(first_seq) DO UPDATE SET last_seq = excluded.last_seq, row = excluded.row`
}

// projectionOf returns the projection registered for the nonces of owner.
func projectionOf(owner Owner) *Projection {
	if lc := LifecycleOf(owner); lc != nil {
		return lc.Projection
	}
	return nil
}

// projections returns every registered projection.
func projections() []*Projection {
	var out []*Projection
	for _, lc := range Lifecycles() {
		if lc.Projection != nil {
			out = append(out, lc.Projection)
		}
	}
	return out
}

// createOwned creates the tables of the registered projections and
// reports whether one of them is new on a log that has events (its rows
// must then be folded from the whole log once: a rebuild).
func (l *Log) createOwned(ctx context.Context) (bool, error) {
	var events int
	if err := l.wdb.GetContext(ctx, &events, `SELECT EXISTS (SELECT 1 FROM intent_trace_events)`); err != nil {
		return false, fmt.Errorf("create owner projections: %w", err)
	}
	fresh := false
	for _, p := range projections() {
		var n int
		if err := l.wdb.GetContext(ctx, &n, `SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?`, p.Table); err != nil {
			return false, fmt.Errorf("create owner projection %s: %w", p.Table, err)
		}
		if n > 0 {
			continue
		}
		if _, err := l.wdb.ExecContext(ctx, p.schema()); err != nil {
			return false, fmt.Errorf("create owner projection %s: %w", p.Table, err)
		}
		fresh = fresh || events > 0
	}
	return fresh, nil
}

// recreateOwned drops and creates the registered projections' tables
// (Rebuild).
func recreateOwned(ctx context.Context, ts *txStmts) error {
	for _, p := range projections() {
		for _, q := range []string{`DROP TABLE IF EXISTS ` + p.Table, p.schema()} {
			if _, err := ts.tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("recreate %s: %w", p.Table, err)
			}
		}
	}
	return nil
}

// prepareOwned prepares the statements on the registered projections'
// tables on the write connection (before the writer starts, when the
// connection is free).
func (w *writerState) prepareOwned(ctx context.Context, db *sqlx.DB) error {
	w.owned = make(map[string]*sql.Stmt)
	for _, p := range projections() {
		qs := []string{p.selectSQL()}
		for level := range ownedLevels {
			qs = append(qs, p.upsertSQL(1<<level))
		}
		for _, q := range qs {
			s, err := db.PrepareContext(ctx, q)
			if err != nil {
				w.closeOwned()
				return fmt.Errorf("prepare %s statements: %w", p.Table, err)
			}
			w.owned[q] = s
		}
	}
	return nil
}

// ownedStmt returns the prepared statement q bound to the transaction of
// ts.
func (w *writerState) ownedStmt(ts *txStmts, q string) (*sql.Stmt, error) {
	if s := ts.owned[q]; s != nil {
		return s, nil
	}
	s := w.owned[q]
	if s == nil {
		return nil, fmt.Errorf("statement %q is not prepared", q)
	}
	s = ts.tx.StmtContext(ts.ctx, s)
	if ts.owned == nil {
		ts.owned = make(map[string]*sql.Stmt)
	}
	ts.owned[q] = s
	return s, nil
}

// closeOwned closes the statements ownedStmt prepared.
func (w *writerState) closeOwned() {
	for _, s := range w.owned {
		_ = s.Close()
	}
	w.owned = nil
}

// readOwned reads the owner's row of e's nonce into e.ext (nil when it
// has none).
func (w *writerState) readOwned(ts *txStmts, e *entry) error {
	p := projectionOf(e.row.Owner)
	if p == nil {
		return nil
	}
	s, err := w.ownedStmt(ts, p.selectSQL())
	if err != nil {
		return fmt.Errorf("read %s: %w", p.Table, err)
	}
	var b []byte
	err = s.QueryRowContext(ts.ctx, e.row.FirstSeq).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s %q: %w", p.Table, e.row.Nonce, err)
	}
	r := p.New()
	if err := r.UnmarshalBinary(b); err != nil {
		return fmt.Errorf("read %s %q: %w", p.Table, e.row.Nonce, err)
	}
	e.ext = r
	return nil
}

// queueOwned queues e.ext for writing by flushOwned.
func (w *writerState) queueOwned(e *entry) error {
	p := projectionOf(e.row.Owner)
	if p == nil || e.ext == nil {
		return nil
	}
	b, err := e.ext.MarshalBinary()
	if err != nil {
		return fmt.Errorf("write %s %q: %w", p.Table, e.row.Nonce, err)
	}
	if w.ownedArgs == nil {
		w.ownedArgs = make(map[*Projection][]any)
	}
	w.ownedArgs[p] = append(w.ownedArgs[p], e.row.FirstSeq, e.row.Nonce, e.row.LastSeq, b)
	return nil
}

// flushOwned upserts the queued rows, with as few statements as the
// prepared row counts allow.
func (w *writerState) flushOwned(ts *txStmts) error {
	for p, args := range w.ownedArgs {
		n, done := len(args)/ownedWidth, 0
		for level := ownedLevels - 1; level >= 0; level-- {
			size := 1 << level
			for n-done >= size {
				s, err := w.ownedStmt(ts, p.upsertSQL(size))
				if err != nil {
					return fmt.Errorf("write %s: %w", p.Table, err)
				}
				if _, err := s.ExecContext(ts.ctx, args[done*ownedWidth:(done+size)*ownedWidth]...); err != nil {
					return fmt.Errorf("write %s: %w", p.Table, err)
				}
				done += size
			}
		}
		clear(args)
		w.ownedArgs[p] = args[:0]
	}
	return nil
}

// loadOwnedCache reads the owner rows of the open intents in cache.
func loadOwnedCache(ctx context.Context, q queryer, cache map[string]*entry) error {
	for _, p := range projections() {
		rows, err := q.QueryContext(ctx, `SELECT nonce, row FROM `+p.Table+
			` WHERE first_seq IN (SELECT first_seq FROM intent_log WHERE status IN `+openList+`)`)
		if err != nil {
			return fmt.Errorf("load %s cache: %w", p.Table, err)
		}
		for rows.Next() {
			var nonce string
			var b []byte
			if err := rows.Scan(&nonce, &b); err != nil {
				rows.Close()
				return fmt.Errorf("load %s cache: %w", p.Table, err)
			}
			e := cache[nonce]
			if e == nil {
				continue
			}
			r := p.New()
			if err := r.UnmarshalBinary(b); err != nil {
				rows.Close()
				return fmt.Errorf("load %s cache %q: %w", p.Table, nonce, err)
			}
			e.ext = r
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("load %s cache: %w", p.Table, err)
		}
	}
	return nil
}

// OwnedRows calls fn with every row of the projection registered for the
// nonces of owner, once the rows hold every event committed before the
// call. fn must not retain b. It is what an owner reads at its start
// instead of the log.
func (l *Log) OwnedRows(ctx context.Context, owner Owner, fn func(nonce string, b []byte) error) error {
	p := projectionOf(owner)
	if p == nil {
		return fmt.Errorf("owned rows: no projection registered for owner %q", owner)
	}
	if err := l.sync(ctx); err != nil {
		return err
	}
	rows, err := l.rdb.QueryContext(ctx, `SELECT nonce, row FROM `+p.Table+` ORDER BY first_seq`)
	if err != nil {
		return fmt.Errorf("read %s: %w", p.Table, err)
	}
	defer rows.Close()
	for rows.Next() {
		var nonce string
		var b []byte
		if err := rows.Scan(&nonce, &b); err != nil {
			return fmt.Errorf("read %s: %w", p.Table, err)
		}
		if err := fn(nonce, b); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read %s: %w", p.Table, err)
	}
	return nil
}

// OwnedRow returns the row of nonce in the projection registered for the
// nonces of owner, once the rows hold every event committed before the
// call; ok false when nonce has none. It is what an owner reads for an
// item that arrives while it runs (a takeover's import).
func (l *Log) OwnedRow(ctx context.Context, owner Owner, nonce string) (b []byte, ok bool, err error) {
	p := projectionOf(owner)
	if p == nil {
		return nil, false, fmt.Errorf("owned row: no projection registered for owner %q", owner)
	}
	if err := l.sync(ctx); err != nil {
		return nil, false, err
	}
	err = l.rdb.QueryRowContext(ctx, `SELECT row FROM `+p.Table+
		` WHERE first_seq = (SELECT first_seq FROM intent_log WHERE nonce = ?)`, nonce).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("read %s row of %q: %w", p.Table, nonce, err)
	}
	return b, true, nil
}
