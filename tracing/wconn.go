package tracing

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"

	"github.com/beamdir/beam/internal/tricks"
	"github.com/jmoiron/sqlx"
)

// writeConnector opens the write connection for database/sql and remembers
// the driver connection it handed out, so that the writer can run its
// insert statements on it directly, below database/sql: that skips
// database/sql's per-call locking, argument conversion and allocations.
//
// It is safe because one goroutine at a time writes (the writer, or a
// caller committing while the writer is idle: Log.writing), and only it
// uses the write pool (one connection): database/sql touches the
// connection only during calls that goroutine makes, never at the same
// time as a direct call.
type writeConnector struct {
	drv driver.Driver
	dsn string

	mu   sync.Mutex
	conn driver.Conn
	tc   *txConn // conn as database/sql holds it; nil once closed
	gen  uint64  // incremented for every new connection
}

// Connect implements driver.Connector.
func (c *writeConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	tc, err := newTxConn(ctx, dc)
	if err != nil {
		_ = dc.Close()
		return nil, err
	}
	tc.closed = func() {
		c.mu.Lock()
		if c.tc == tc {
			c.tc = nil
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	c.conn = dc
	c.tc = tc
	c.gen++
	c.mu.Unlock()
	return tc, nil
}

// errNoWriteConn is begin's error when no driver connection is open yet.
var errNoWriteConn = errors.New("no write connection open")

// begin starts a transaction on the write connection below database/sql,
// for a batch that needs no *sqlx.Tx (no Do function). database/sql
// starts a goroutine for every transaction it begins, to watch the
// context, and wakes it at the end: on a commit of one event that was a
// hand-off between cores per commit. It is safe for the reason the direct
// statements are: only the goroutine that writes uses the write pool, and while
// the transaction is open it does so only through calls that take the
// pool's one connection, which is this one. It fails with errNoWriteConn
// when database/sql has no connection open; the caller then begins through
// database/sql.
func (c *writeConnector) begin(ctx context.Context) (txEnd, error) {
	c.mu.Lock()
	tc := c.tc
	c.mu.Unlock()
	if tc == nil {
		return txEnd{}, errNoWriteConn
	}
	if _, err := tc.begin.ExecContext(ctx, nil); err != nil {
		return txEnd{}, err
	}
	return txEnd{tc}, nil
}

// Driver implements driver.Connector.
func (c *writeConnector) Driver() driver.Driver { return c.drv }

// current returns the latest connection and its generation.
func (c *writeConnector) current() (driver.Conn, uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn, c.gen
}

// execStmts are the writer's statements prepared on the driver connection
// (generation gen of the connector); nil entries are run through
// database/sql.
type execStmts struct {
	gen   uint64
	stmts [stmtCount]driver.StmtExecContext
	all   []driver.Stmt
}

func (d *execStmts) close() {
	for _, s := range d.all {
		_ = s.Close()
	}
	d.all = nil
	d.stmts = [stmtCount]driver.StmtExecContext{}
	d.gen = 0
}

// execOnDriver reports whether statement id is run on the driver directly.
func execOnDriver(id stmtID) bool {
	if id == stUpdIntent || id == stUpdMessage || id == stSetProjSeq {
		return true
	}
	if id < stSingles {
		return false
	}
	switch multiKind((id - stSingles) / multiLevels) {
	case mEvents, mIntentInsert, mIntentUpsert, mMessageInsert:
		return true
	}
	return false
}

// sqlOf returns the text of statement id.
func sqlOf(id stmtID) string {
	if id < stSingles {
		return singleSQL(id)
	}
	k := multiKind((id - stSingles) / multiLevels)
	level := int(id-stSingles) % multiLevels
	return multiSQL(k, 1<<level)
}

// ensure prepares the driver statements on the connector's current
// connection unless they already are. The caller holds a transaction on
// the write pool, so the current connection is the one in use.
func (d *execStmts) ensure(ctx context.Context, wc *writeConnector) error {
	conn, gen := wc.current()
	if gen == d.gen && gen != 0 {
		return nil
	}
	d.close()
	prep, ok := conn.(driver.ConnPrepareContext)
	if !ok {
		return fmt.Errorf("driver connection %T cannot prepare with a context", conn)
	}
	for id := stmtID(0); id < stmtID(stmtCount); id++ {
		if !execOnDriver(id) {
			continue
		}
		es, err := prepareExec(ctx, prep, sqlOf(id))
		if err != nil {
			d.close()
			return err
		}
		d.all = append(d.all, es)
		d.stmts[id] = es
	}
	d.gen = gen
	return nil
}

// execStmt is a driver statement that executes with a context.
type execStmt interface {
	driver.Stmt
	driver.StmtExecContext
}

// prepareExec prepares query on a driver connection as an execStmt.
func prepareExec(ctx context.Context, prep driver.ConnPrepareContext, query string) (execStmt, error) {
	s, err := prep.PrepareContext(ctx, query)
	if err != nil {
		return nil, fmt.Errorf("prepare %q: %w", query[:min(len(query), 40)], err)
	}
	es, ok := s.(execStmt)
	if !ok {
		_ = s.Close()
		return nil, fmt.Errorf("driver statement %T cannot execute with a context", s)
	}
	return es, nil
}

// exec runs statement id with args, numbering them first.
func (d *execStmts) exec(ctx context.Context, id stmtID, args []driver.NamedValue) error {
	_, err := d.execResult(ctx, id, args)
	return err
}

// execResult is exec returning the driver's result.
func (d *execStmts) execResult(ctx context.Context, id stmtID, args []driver.NamedValue) (driver.Result, error) {
	for i := range args {
		args[i].Ordinal = i + 1
	}
	return d.stmts[id].ExecContext(ctx, args)
}

// Helpers that append driver values (driver.Value types only: int64,
// float64, string, nil) to an argument list.

func nvText(a []driver.NamedValue, s string) []driver.NamedValue {
	return append(a, driver.NamedValue{Value: s})
}

// nvTextOrNull binds "" as NULL, for columns whose SQL turns NULL into the empty string
// (eventRowSQL).
func nvTextOrNull(a []driver.NamedValue, s string) []driver.NamedValue {
	if s == "" {
		return append(a, driver.NamedValue{})
	}
	return append(a, driver.NamedValue{Value: s})
}

func nvInt(a []driver.NamedValue, n int64) []driver.NamedValue {
	return append(a, driver.NamedValue{Value: n})
}

func nvIntPtr(a []driver.NamedValue, p *int64) []driver.NamedValue {
	if p == nil {
		return append(a, driver.NamedValue{})
	}
	return append(a, driver.NamedValue{Value: *p})
}

func nvFloat(a []driver.NamedValue, f float64) []driver.NamedValue {
	return append(a, driver.NamedValue{Value: f})
}

func nvFloatPtr(a []driver.NamedValue, p *float64) []driver.NamedValue {
	if p == nil {
		return append(a, driver.NamedValue{})
	}
	return append(a, driver.NamedValue{Value: *p})
}

func nvJSON(a []driver.NamedValue, r RawJSON) []driver.NamedValue {
	if r == nil {
		return append(a, driver.NamedValue{})
	}
	return append(a, driver.NamedValue{Value: string(r)})
}

// eventNV appends the row of one event (eventInsertCols: its seq becomes
// the rowid SQLite assigns).
func eventNV(a []driver.NamedValue, ev *Event, details string, first int64) []driver.NamedValue {
	a = nvText(a, ev.Nonce)
	a = nvText(a, string(ev.State))
	a = nvInt(a, ev.At.UnixMicro())
	a = nvTextOrNull(a, ev.From)
	a = nvTextOrNull(a, ev.To)
	a = nvTextOrNull(a, ev.IntentType)
	a = nvTextOrNull(a, ev.Transport)
	a = nvInt(a, int64(ev.Attempt))
	a = nvText(a, details)
	return nvInt(a, first)
}

// intentNV appends an intent_log row (intentCols).
func intentNV(a []driver.NamedValue, r *IntentRow) []driver.NamedValue {
	a = nvText(a, r.Nonce)
	a = nvText(a, r.From)
	a = nvText(a, r.To)
	a = nvText(a, r.IntentType)
	a = nvText(a, string(r.Owner))
	a = nvText(a, string(r.Status))
	a = nvInt(a, r.RequestedAt)
	a = nvText(a, r.ClientTimestamp)
	return intentProgressNV(a, r)
}

// intentProgressNV appends the intent_log columns from attempt on, which
// end both intentCols and the arguments of updateIntent.
func intentProgressNV(a []driver.NamedValue, r *IntentRow) []driver.NamedValue {
	a = nvInt(a, int64(r.Attempt))
	a = nvText(a, r.Transport)
	a = nvInt(a, r.TimeoutMs)
	a = nvText(a, r.ErrorCode)
	a = nvIntPtr(a, r.CompletedAt)
	a = nvIntPtr(a, r.RoundTripLatencyMs)
	a = nvJSON(a, r.ResultJSON)
	a = nvInt(a, r.UpdatedAt)
	a = nvInt(a, r.LastSeq)
	return nvInt(a, r.FirstSeq)
}

// intentUpdateNV appends the arguments of updateIntent.
func intentUpdateNV(a []driver.NamedValue, r *IntentRow) []driver.NamedValue {
	a = nvText(a, r.From)
	a = nvText(a, r.To)
	a = nvText(a, r.IntentType)
	a = nvText(a, string(r.Status))
	return intentProgressNV(a, r)
}

// messageNV appends a beam_messages row (messageCols).
func messageNV(a []driver.NamedValue, m *MessageRow) []driver.NamedValue {
	a = nvText(a, m.ID)
	a = nvText(a, m.Nonce)
	a = nvText(a, m.Sender)
	a = nvText(a, m.Recipient)
	a = nvText(a, m.Intent)
	a = nvJSON(a, m.Payload)
	a = nvText(a, string(m.Status))
	a = nvInt(a, int64(m.Priority))
	a = nvInt(a, int64(m.RetryCount))
	a = nvInt(a, int64(m.MaxRetries))
	a = nvFloatPtr(a, m.NextRetryAt)
	a = nvFloat(a, m.CreatedAt)
	a = nvFloatPtr(a, m.DeliveredAt)
	a = nvFloatPtr(a, m.AckedAt)
	a = nvFloatPtr(a, m.FailedAt)
	a = nvText(a, m.Error)
	a = nvJSON(a, m.Response)
	a = nvText(a, m.TraceID)
	a = nvJSON(a, m.Metadata)
	a = nvText(a, m.LeaseOwner)
	a = nvFloatPtr(a, m.LeaseExpiresAt)
	a = nvFloat(a, m.UpdatedAt)
	return nvInt(a, m.LastSeq)
}

// messageUpdateNV appends the arguments of updateMessage.
func messageUpdateNV(a []driver.NamedValue, m *MessageRow) []driver.NamedValue {
	a = nvText(a, string(m.Status))
	a = nvInt(a, int64(m.RetryCount))
	a = nvFloatPtr(a, m.NextRetryAt)
	a = nvFloatPtr(a, m.DeliveredAt)
	a = nvFloatPtr(a, m.AckedAt)
	a = nvFloatPtr(a, m.FailedAt)
	a = nvText(a, m.Error)
	a = nvJSON(a, m.Response)
	a = nvText(a, m.LeaseOwner)
	a = nvFloatPtr(a, m.LeaseExpiresAt)
	a = nvFloat(a, m.UpdatedAt)
	a = nvInt(a, m.LastSeq)
	return nvText(a, m.Nonce)
}

// openWriteDB opens the write pool on dsn. With the trick on it goes
// through a writeConnector, which it returns too; off
// (BEAM_TRICKS_OFF=sqlitedirect), the pool is database/sql's own and the
// connector is nil.
func openWriteDB(dsn string) (*sqlx.DB, *writeConnector, error) {
	if !tricks.On("sqlitedirect") {
		db, err := sqlx.Open("sqlite", dsn)
		return db, nil, err
	}
	wc, err := newWriteConnector(dsn)
	if err != nil {
		return nil, nil, err
	}
	return sqlx.NewDb(sql.OpenDB(wc), "sqlite"), wc, nil
}

// newWriteConnector returns a connector for dsn using the registered
// "sqlite" driver.
func newWriteConnector(dsn string) (*writeConnector, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	drv := db.Driver()
	if err := db.Close(); err != nil {
		return nil, err
	}
	return &writeConnector{drv: drv, dsn: dsn}, nil
}
